//! The network-tier prefetch of one request, the same for the agent's gRPC service, the tier tests and
//! `tier_reload`: the prefetch rule on a probe of the pool and host RAM ([`Probe::network_fetch`]), the
//! prefetch budget when there is one, and one fetch of the run from Redis.

use kvroute_proto::BlockHash;

use crate::engine::Prefetched;
use crate::engine::resident::Probe;
use crate::engine::tiering::PrefetchBudget;
use crate::tiers::network::NetworkTier;

/// Fetches from `network` the blocks of the chain `hashes` that follow those the pool and host RAM hold
/// (`probe`), when reloading them beats recomputing them. With a `budget` (the agent's
/// [`PrefetchBudget`] and the bytes of one block), only as many as it has room for, holding their share
/// until the request is admitted; the rest is recomputed. Nothing when the rule says recompute or the
/// budget has room for no block.
pub async fn from_network(
    network: &NetworkTier,
    hashes: &[BlockHash],
    probe: &Probe,
    budget: Option<(&PrefetchBudget, u64)>,
) -> Prefetched {
    let Some(wanted) = probe.network_fetch(hashes.len(), network.read_bandwidth()) else {
        return Prefetched::default();
    };
    let first = wanted.start;
    let (count, hold) = match budget {
        Some((budget, block_bytes)) => match budget.hold_up_to(wanted.len(), block_bytes) {
            Some((granted, hold)) => (granted, Some((hold, block_bytes))),
            None => return Prefetched::default(),
        },
        None => (wanted.len(), None),
    };
    let blocks = network.fetch_run(&hashes[first..first + count]).await;
    let hold = hold.map(|(mut hold, block_bytes)| {
        hold.shrink_to(blocks.len() as u64 * block_bytes);
        hold
    });
    Prefetched { first_block: first, blocks, hold }
}

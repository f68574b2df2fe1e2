//! What the pool and host RAM hold, as of the engine thread's last step.
//!
//! The publisher applies the engine's KV events here as it sends them (so a snapshot made from this view
//! agrees with the deltas that follow it), and the server can tell which of a
//! prompt's blocks to fetch from the network tier without waiting for the engine to finish a step (a wait
//! that would add a whole step to every request's time to first token while the engine is busy). The
//! view is a hint at most one step old: blocks evicted since then are recomputed, as any miss is.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::sync::RwLock;

use kvroute_proto::block_hash::{BlockHash, BlockHashHasher};
use kvroute_proto::domain::{KvEvent, Tier};

use super::tiering::reload_beats_recompute;

type BlockHashSet = HashSet<BlockHash, BuildHasherDefault<BlockHashHasher>>;

/// How much of a chain the pool and host RAM hold, and the rates that decide
/// whether fetching the rest from the network tier pays.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Probe {
    /// Leading blocks present in the pool or host RAM.
    pub resident_blocks: usize,
    pub bytes_per_token: f64,
    pub prefill_tokens_per_second: f64,
}

impl Probe {
    /// The prefetch rule, one for the agent, the simulator and the tests: of a prompt of `blocks` blocks,
    /// fetch from the network tier the ones after those the pool and host RAM hold, when reloading them at
    /// `network_bandwidth` beats recomputing them; `None` when there is nothing to fetch.
    pub fn network_fetch(&self, blocks: usize, network_bandwidth: f64) -> Option<Range<usize>> {
        let pays = reload_beats_recompute(network_bandwidth, self.bytes_per_token, self.prefill_tokens_per_second);
        (self.resident_blocks < blocks && pays).then_some(self.resident_blocks..blocks)
    }
}

#[derive(Default)]
struct Resident {
    gpu: BlockHashSet,
    host: BlockHashSet,
    bytes_per_token: f64,
    prefill_tokens_per_second: f64,
}

impl Resident {
    fn tier(&mut self, tier: Tier) -> Option<&mut BlockHashSet> {
        match tier {
            Tier::Gpu => Some(&mut self.gpu),
            Tier::Host => Some(&mut self.host),
            Tier::Network => None,
        }
    }
}

/// The shared view; the engine thread writes it, request handlers read it.
#[derive(Default)]
pub struct ResidentView(RwLock<Resident>);

impl ResidentView {
    /// Applies events in the order they happened (per tier) and the engine's current rates.
    pub fn apply(&self, events: &[KvEvent], bytes_per_token: f64, prefill_tokens_per_second: f64) {
        let Ok(mut resident) = self.0.write() else { return };
        resident.bytes_per_token = bytes_per_token;
        resident.prefill_tokens_per_second = prefill_tokens_per_second;
        for event in events {
            match event {
                KvEvent::Stored { tier, hashes } => {
                    if let Some(set) = resident.tier(*tier) {
                        set.extend(hashes.iter().copied());
                    }
                }
                KvEvent::Removed { tier, hashes } => {
                    if let Some(set) = resident.tier(*tier) {
                        hashes.iter().for_each(|hash| {
                            set.remove(hash);
                        });
                    }
                }
                KvEvent::Cleared { tier } => {
                    if let Some(set) = resident.tier(*tier) {
                        set.clear();
                    }
                }
            }
        }
    }

    /// Everything the pool and host RAM hold, as the events that store it (a snapshot).
    pub fn snapshot_events(&self) -> Vec<KvEvent> {
        let Ok(resident) = self.0.read() else { return Vec::new() };
        vec![
            KvEvent::Stored { tier: Tier::Gpu, hashes: resident.gpu.iter().copied().collect() },
            KvEvent::Stored { tier: Tier::Host, hashes: resident.host.iter().copied().collect() },
        ]
    }

    /// How many leading blocks of `hashes` the pool or host RAM held at the last step.
    pub fn probe(&self, hashes: &[BlockHash]) -> Probe {
        let Ok(resident) = self.0.read() else { return Probe::default() };
        let resident_blocks =
            hashes.iter().take_while(|hash| resident.gpu.contains(hash) || resident.host.contains(hash)).count();
        Probe {
            resident_blocks,
            bytes_per_token: resident.bytes_per_token,
            prefill_tokens_per_second: resident.prefill_tokens_per_second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> BlockHash {
        BlockHash([n; 16])
    }

    #[test]
    fn a_chain_counts_until_its_first_block_in_neither_tier() {
        let view = ResidentView::default();
        view.apply(
            &[
                KvEvent::Stored { tier: Tier::Gpu, hashes: vec![hash(1), hash(2)] },
                KvEvent::Stored { tier: Tier::Host, hashes: vec![hash(3)] },
                KvEvent::Stored { tier: Tier::Network, hashes: vec![hash(4)] },
            ],
            1024.0,
            500.0,
        );
        let probe = view.probe(&[hash(1), hash(2), hash(3), hash(4), hash(1)]);
        assert_eq!(probe, Probe { resident_blocks: 3, bytes_per_token: 1024.0, prefill_tokens_per_second: 500.0 });
        assert_eq!(view.probe(&[hash(4), hash(1)]).resident_blocks, 0, "the network tier is not resident");
    }

    #[test]
    fn the_prefetch_rule_fetches_the_rest_of_the_chain_only_when_reloading_pays() {
        // 1 KiB per token at 500 tokens/s: recomputing costs 512 KB/s of bandwidth.
        let probe = Probe { resident_blocks: 3, bytes_per_token: 1024.0, prefill_tokens_per_second: 500.0 };
        assert_eq!(probe.network_fetch(8, 1e6), Some(3..8));
        assert_eq!(probe.network_fetch(8, 1e5), None, "slower than recomputing");
        assert_eq!(probe.network_fetch(8, 0.0), Some(3..8), "an unmeasured tier is tried");
        assert_eq!(probe.network_fetch(3, 1e6), None, "nothing beyond what is resident");
        let cold = Probe { prefill_tokens_per_second: 0.0, ..probe };
        assert_eq!(cold.network_fetch(8, 1e5), Some(3..8), "an unmeasured engine tries the tier");
    }

    #[test]
    fn removals_and_clears_take_blocks_out_of_their_tier_only() {
        let view = ResidentView::default();
        view.apply(
            &[
                KvEvent::Stored { tier: Tier::Gpu, hashes: vec![hash(1), hash(2)] },
                KvEvent::Removed { tier: Tier::Gpu, hashes: vec![hash(2)] },
                KvEvent::Stored { tier: Tier::Host, hashes: vec![hash(2)] },
            ],
            1.0,
            1.0,
        );
        assert_eq!(view.probe(&[hash(1), hash(2)]).resident_blocks, 2, "evicted to host RAM: still resident");
        view.apply(&[KvEvent::Cleared { tier: Tier::Host }], 1.0, 1.0);
        assert_eq!(view.probe(&[hash(1), hash(2)]).resident_blocks, 1);
        view.apply(&[KvEvent::Removed { tier: Tier::Gpu, hashes: vec![hash(1)] }], 1.0, 1.0);
        assert_eq!(view.probe(&[hash(1)]).resident_blocks, 0);
    }
}

//! The prefix index as data: events in, per-replica tier runs out.
#![allow(clippy::unwrap_used)]

use kvroute_gateway::routing::cache_aware::cache_aware;
use kvroute_gateway::routing::{
    IndexConfig, IndexError, PrefixIndex, ReplicaId, ReplicaMatch, ReplicaView, RouteRequest, ScoringConfig, SplitMix64,
};
use kvroute_proto::domain::{KvEvent, KvEventBatch, LoadStats, Tier};
use kvroute_proto::{BlockHash, BlockHasher, DEFAULT_BLOCK_SIZE};

/// A chain of `blocks` block hashes; `variant` changes every block from `diverge_at` on.
fn chain(blocks: usize, diverge_at: usize, variant: u32) -> Vec<BlockHash> {
    let block = DEFAULT_BLOCK_SIZE as usize;
    let tokens: Vec<u32> = (0..blocks * block)
        .map(|i| if i / block >= diverge_at { i as u32 + 100_000 * variant } else { i as u32 })
        .collect();
    BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"").hashes(&tokens)
}

fn index() -> PrefixIndex {
    PrefixIndex::new(IndexConfig { max_entries: 10_000, max_replicas: 4, pending_slots: 1 << 10 }).unwrap()
}

fn stored(tier: Tier, hashes: &[BlockHash]) -> KvEvent {
    KvEvent::Stored { tier, hashes: hashes.to_vec() }
}

fn removed(tier: Tier, hashes: &[BlockHash]) -> KvEvent {
    KvEvent::Removed { tier, hashes: hashes.to_vec() }
}

fn runs(gpu: u32, host: u32, network: u32) -> ReplicaMatch {
    ReplicaMatch { gpu_blocks: gpu, host_blocks: host, network_blocks: network }
}

/// (replica, expected runs) after the events, for one lookup of `query` at time 0.
fn check(
    events: &[(ReplicaId, KvEvent)],
    network_up: &[ReplicaId],
    query: &[BlockHash],
    expected: &[(ReplicaId, ReplicaMatch)],
) {
    let index = index();
    for &replica in network_up {
        index.set_network_tier_up(replica, true).unwrap();
    }
    for (replica, event) in events {
        index.apply(*replica, event).unwrap();
    }
    let result = index.lookup(query, 0);
    assert_eq!(result.request_blocks as usize, query.len());
    for &(replica, want) in expected {
        assert_eq!(result.get(replica), want, "replica {replica}");
    }
}

#[test]
fn gpu_run_follows_the_chain_from_block_zero() {
    let a = chain(8, 8, 0);
    let b = chain(8, 3, 1); // shares blocks 0..3 with a
    check(&[(0, stored(Tier::Gpu, &a[..6]))], &[], &a, &[(0, runs(6, 0, 0)), (1, runs(0, 0, 0))]);
    check(&[(0, stored(Tier::Gpu, &a[..6]))], &[], &b, &[(0, runs(3, 0, 0))]);
    // A later block without its predecessor does not count.
    check(&[(0, stored(Tier::Gpu, &a[1..6]))], &[], &a, &[(0, runs(0, 0, 0))]);
}

#[test]
fn removal_breaks_the_run_where_it_happens() {
    let a = chain(8, 8, 0);
    check(&[(0, stored(Tier::Gpu, &a)), (0, removed(Tier::Gpu, &a[2..3]))], &[], &a, &[(0, runs(2, 0, 0))]);
    // Removing from another tier or another replica changes nothing.
    check(
        &[(0, stored(Tier::Gpu, &a)), (0, removed(Tier::Host, &a[2..3])), (1, removed(Tier::Gpu, &a[2..3]))],
        &[],
        &a,
        &[(0, runs(8, 0, 0))],
    );
}

#[test]
fn host_run_continues_the_gpu_run_over_local_blocks() {
    let a = chain(8, 8, 0);
    check(&[(0, stored(Tier::Gpu, &a[..2])), (0, stored(Tier::Host, &a[2..5]))], &[], &a, &[(0, runs(2, 3, 0))]);
    // Gpu blocks after the first host block count in the host run.
    check(
        &[(0, stored(Tier::Gpu, &[a[0], a[2], a[3]])), (0, stored(Tier::Host, &a[1..2]))],
        &[],
        &a,
        &[(0, runs(1, 3, 0))],
    );
    // Another replica's host tier is not this replica's.
    check(&[(0, stored(Tier::Gpu, &a[..2])), (1, stored(Tier::Host, &a[2..5]))], &[], &a, &[(0, runs(2, 0, 0))]);
}

#[test]
fn network_blocks_count_for_every_replica_whose_network_tier_is_up() {
    let a = chain(8, 8, 0);
    let events =
        [(0, stored(Tier::Gpu, &a[..2])), (0, stored(Tier::Host, &a[2..3])), (1, stored(Tier::Network, &a[..6]))];
    check(&events, &[0, 1, 2], &a, &[(0, runs(2, 1, 3)), (1, runs(0, 0, 6)), (2, runs(0, 0, 6)), (3, runs(0, 0, 0))]);
    // The reporter's network tier is down: nobody can count its reports.
    check(&events, &[0, 2], &a, &[(0, runs(2, 1, 0)), (2, runs(0, 0, 0))]);
}

#[test]
fn network_removal_is_global_and_clear_is_per_reporter() {
    let a = chain(6, 6, 0);
    let both_report = [(1, stored(Tier::Network, &a)), (2, stored(Tier::Network, &a))];
    let mut events = both_report.to_vec();
    events.push((1, removed(Tier::Network, &a[3..4])));
    check(&events, &[0, 1, 2], &a, &[(0, runs(0, 0, 3))]);
    let mut events = both_report.to_vec();
    events.push((1, KvEvent::Cleared { tier: Tier::Network }));
    check(&events, &[0, 1, 2], &a, &[(0, runs(0, 0, 6))]);
    events.push((2, KvEvent::Cleared { tier: Tier::Network }));
    check(&events, &[0, 1, 2], &a, &[(0, runs(0, 0, 0))]);
}

#[test]
fn cleared_tier_drops_only_that_replica_and_tier() {
    let a = chain(6, 6, 0);
    check(
        &[
            (0, stored(Tier::Gpu, &a)),
            (0, stored(Tier::Host, &a)),
            (1, stored(Tier::Gpu, &a)),
            (0, KvEvent::Cleared { tier: Tier::Gpu }),
        ],
        &[],
        &a,
        &[(0, runs(0, 6, 0)), (1, runs(6, 0, 0))],
    );
}

#[test]
fn snapshot_replaces_gpu_and_host_and_keeps_network_reports() {
    let a = chain(6, 6, 0);
    let b = chain(6, 0, 1);
    let index = index();
    index.set_network_tier_up(0, true).unwrap();
    index.apply_events(0, &[stored(Tier::Gpu, &a), stored(Tier::Host, &b[..2]), stored(Tier::Network, &b)]).unwrap();
    index.apply_snapshot(0, &[stored(Tier::Gpu, &b[..3])]).unwrap();
    assert_eq!(index.lookup(&a, 0).get(0), runs(0, 0, 0));
    assert_eq!(index.lookup(&b, 0).get(0), runs(3, 0, 3));
    // A snapshot that mentions the network tier replaces it too.
    index.apply_snapshot(0, &[stored(Tier::Gpu, &b[..3]), stored(Tier::Network, &b[..4])]).unwrap();
    assert_eq!(index.lookup(&b, 0).get(0), runs(3, 0, 1));
}

#[test]
fn apply_batch_honours_snapshot_and_network_flag() {
    let a = chain(4, 4, 0);
    let index = index();
    let batch = |snapshot: bool, events: Vec<KvEvent>, network_tier_up: bool| KvEventBatch {
        agent_id: "agent".into(),
        epoch: 1,
        seq: 1,
        snapshot,
        events,
        load: LoadStats { network_tier_up, ..LoadStats::default() },
        sent_unix_micros: 0,
        finished_request_ids: Vec::new(),
        next_request_id: 0,
    };
    index.apply_batch(0, &batch(false, vec![stored(Tier::Gpu, &a[..1]), stored(Tier::Network, &a)], true)).unwrap();
    assert_eq!(index.lookup(&a, 0).get(0), runs(1, 0, 3));
    index.apply_batch(0, &batch(true, vec![stored(Tier::Gpu, &a[..2])], false)).unwrap();
    assert_eq!(index.lookup(&a, 0).get(0), runs(2, 0, 0));
}

#[test]
fn remove_replica_forgets_it_and_keeps_the_others() {
    let a = chain(5, 5, 0);
    let index = index();
    index.apply(0, &stored(Tier::Gpu, &a)).unwrap();
    index.apply(1, &stored(Tier::Host, &a)).unwrap();
    index.add_pending(0, &a, 0, 1_000);
    index.remove_replica(0).unwrap();
    let result = index.lookup(&a, 0);
    assert_eq!(result.get(0), runs(0, 0, 0));
    assert_eq!(result.get(1), runs(0, 5, 0));
    index.remove_replica(1).unwrap();
    assert!(index.is_empty());
}

#[test]
fn pending_entries_count_as_gpu_until_they_expire() {
    let a = chain(6, 6, 0);
    let index = index();
    index.apply(1, &stored(Tier::Gpu, &a[..2])).unwrap();
    index.add_pending(0, &a[..4], 1_000, 3_000);
    assert_eq!(index.lookup(&a, 1_000).get(0), runs(4, 0, 0));
    assert_eq!(index.lookup(&a, 3_999).get(0), runs(4, 0, 0));
    assert_eq!(index.lookup(&a, 4_000).get(0), runs(0, 0, 0));
    assert_eq!(index.lookup(&a, 1_000).get(1), runs(2, 0, 0));
    // Pending blocks join confirmed ones: events confirm block 0..2, pending covers 2..4.
    index.apply(0, &stored(Tier::Gpu, &a[..2])).unwrap();
    index.add_pending(0, &a[2..4], 5_000, 3_000);
    assert_eq!(index.lookup(&a, 6_000).get(0), runs(4, 0, 0));
    // A later route of the same blocks elsewhere replaces the pending holder.
    index.add_pending(2, &a[2..4], 6_000, 3_000);
    assert_eq!(index.lookup(&a, 6_000).get(0), runs(2, 0, 0));
}

fn idle_view(id: ReplicaId) -> ReplicaView {
    ReplicaView {
        id,
        healthy: true,
        load: LoadStats {
            kv_blocks_total: 1_000,
            prefill_tokens_per_second: 10_000.0,
            decode_step_seconds: 0.02,
            host_bytes_per_second: 20e9,
            network_bytes_per_second: 2e9,
            network_tier_up: true,
            queue_capacity: 64,
            ..LoadStats::default()
        },
        block_size: DEFAULT_BLOCK_SIZE,
        bytes_per_block: 2 << 20,
        blocks_per_engine_block: 1,
        tracked: Default::default(),
    }
}

/// Routes `hashes` over two idle replicas with cache_aware and records what it sends as pending.
fn route_and_send(index: &PrefixIndex, hashes: &[BlockHash], now: u64) -> ReplicaId {
    let views = [idle_view(0), idle_view(1)];
    let request = RouteRequest { hashes, prompt_tokens: hashes.len() * DEFAULT_BLOCK_SIZE as usize, session_key: None };
    let decision =
        cache_aware(&request, &views, &index.lookup(hashes, now), &ScoringConfig::default(), &mut SplitMix64::new(1));
    let chosen = decision.chosen_candidate().unwrap();
    index.add_pending(chosen.replica, chosen.unreached(hashes), now, 3_000);
    chosen.replica
}

#[test]
fn pending_entries_cover_what_the_chosen_replica_computes_not_what_it_reloads() {
    // A new prefix: the whole chain becomes pending, so a burst sharing it follows the first request.
    let index = self::index();
    let fresh = chain(6, 6, 0);
    let first = route_and_send(&index, &fresh, 0);
    assert_eq!(index.lookup(&fresh, 1).get(first), runs(6, 0, 0));
    assert_eq!(route_and_send(&index, &fresh, 1), first);

    // A prefix the network tier holds: the chosen replica reloads blocks 0..4 and computes 4..6. Only
    // 4..6 become pending; blocks 0..4 stay priced as a reload on every replica, so the next request
    // does not take them for resident on the first one while that reload is still running.
    let index = self::index();
    index.set_network_tier_up(0, true).unwrap();
    index.set_network_tier_up(1, true).unwrap();
    let shared = chain(6, 6, 1);
    index.apply(1, &stored(Tier::Network, &shared[..4])).unwrap();
    let chosen = route_and_send(&index, &shared, 0);
    let other = 1 - chosen;
    let after = index.lookup(&shared, 1);
    assert_eq!(after.get(chosen), runs(0, 0, 6));
    assert_eq!(after.get(other), runs(0, 0, 4));
}

#[test]
fn cap_evicts_least_recently_touched_entries() {
    let index = PrefixIndex::new(IndexConfig { max_entries: 200, max_replicas: 4, pending_slots: 1 << 10 }).unwrap();
    let hot = chain(20, 20, 0);
    index.apply(0, &stored(Tier::Gpu, &hot)).unwrap();
    for i in 0..2_000u32 {
        let cold = chain(1, 0, i + 1);
        index.apply(1, &stored(Tier::Gpu, &cold)).unwrap();
        assert_eq!(index.lookup(&hot, 0).get(0), runs(20, 0, 0), "after {i} cold inserts");
        assert!(index.len() <= 200);
    }
    let stats = index.stats();
    assert_eq!(stats.entries, 200);
    assert!(stats.evictions >= 1_800);
}

#[test]
fn replica_ids_past_the_configured_range_are_refused() {
    let index = index();
    let error = index.apply(4, &KvEvent::Cleared { tier: Tier::Gpu }).unwrap_err();
    assert_eq!(error, IndexError::ReplicaOutOfRange { replica: 4, max_replicas: 4 });
    assert!(PrefixIndex::new(IndexConfig { max_replicas: 0, ..IndexConfig::default() }).is_err());
    assert!(PrefixIndex::new(IndexConfig { max_entries: 0, ..IndexConfig::default() }).is_err());
}

#[test]
fn memory_per_entry_at_the_cap_is_under_64_bytes_up_to_64_replicas_and_150_up_to_256() {
    for (max_replicas, bound) in [(64, 64.0), (256, 150.0)] {
        let config = IndexConfig { max_entries: 1_000_000, max_replicas, ..IndexConfig::default() };
        let index = PrefixIndex::new(config).unwrap();
        let per_entry = index.bytes_per_entry_at_cap();
        let slot = index.stats().slot_bytes;
        println!("{max_replicas} replicas: index memory per entry at the cap {per_entry:.1} bytes ({slot} per slot)");
        assert!(per_entry < bound, "{max_replicas} replicas: {per_entry}");
    }
}

#[test]
fn lookups_run_while_events_are_applied() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let index = Arc::new(
        PrefixIndex::new(IndexConfig { max_entries: 4_000, max_replicas: 4, pending_slots: 1 << 10 }).unwrap(),
    );
    let stable = chain(32, 32, 0);
    index.apply(0, &stored(Tier::Gpu, &stable)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (index, done) = (index.clone(), done.clone());
        std::thread::spawn(move || {
            // Churn below the cap: inserts and deletions that shift entries around.
            let mut round = 1;
            while !done.load(Ordering::Relaxed) {
                let other = chain(64, 0, round);
                index.apply(1, &stored(Tier::Gpu, &other)).unwrap();
                index.apply(1, &removed(Tier::Gpu, &other)).unwrap();
                round += 1;
            }
            round
        })
    };
    let mut complete = 0;
    let lookups = 20_000;
    for _ in 0..lookups {
        let result = index.lookup(&stable, 0);
        assert!(result.get(0).gpu_blocks <= 32);
        assert_eq!(result.get(2), runs(0, 0, 0), "nothing is reported for a replica that holds nothing");
        assert_eq!(result.get(1).gpu_blocks, 0);
        if result.get(0) == runs(32, 0, 0) {
            complete += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 1);
    assert!(complete * 100 >= lookups * 99, "{complete} of {lookups} lookups saw the whole stable chain");
}

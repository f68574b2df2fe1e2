//! The baseline policies as data, and the policy names.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use kvroute_gateway::routing::{
    Decision, LookupResult, Policy, PolicyKind, ReplicaId, ReplicaMatch, ReplicaView, RouteRequest, ScoringConfig,
    SplitMix64, TrackedLoad,
};
use kvroute_proto::domain::LoadStats;
use kvroute_proto::{BlockHash, BlockHasher, DEFAULT_BLOCK_SIZE};

#[derive(Clone, Copy)]
struct State {
    id: ReplicaId,
    healthy: bool,
    waiting: u32,
    running: u32,
    queued_tokens: u64,
    kv_used: u64,
    gpu: u32,
    host: u32,
    network: u32,
    /// What this router tracks: prompt tokens in prefill, active blocks, the request's blocks among them.
    tracked: TrackedLoad,
}

fn replica(id: ReplicaId) -> State {
    State {
        id,
        healthy: true,
        waiting: 0,
        running: 0,
        queued_tokens: 0,
        kv_used: 0,
        gpu: 0,
        host: 0,
        network: 0,
        tracked: TrackedLoad::default(),
    }
}

fn tracked(prefill_tokens: u64, active_blocks: u64, request_active_blocks: u64) -> TrackedLoad {
    TrackedLoad { prefill_tokens, active_blocks, request_active_blocks, ..TrackedLoad::default() }
}

fn views(states: &[State]) -> Vec<ReplicaView> {
    states
        .iter()
        .map(|state| ReplicaView {
            id: state.id,
            healthy: state.healthy,
            load: LoadStats {
                waiting_requests: state.waiting,
                running_requests: state.running,
                queued_prefill_tokens: state.queued_tokens,
                kv_blocks_used: state.kv_used,
                kv_blocks_total: 1_000,
                prefill_tokens_per_second: 10_000.0,
                network_tier_up: true,
                queue_capacity: 64,
                ..LoadStats::default()
            },
            block_size: DEFAULT_BLOCK_SIZE,
            bytes_per_block: 1 << 20,
            blocks_per_engine_block: 1,
            tracked: state.tracked,
        })
        .collect()
}

fn lookup(states: &[State], blocks: usize) -> LookupResult {
    let mut matches = vec![ReplicaMatch::default(); 64];
    for state in states {
        matches[usize::from(state.id)] =
            ReplicaMatch { gpu_blocks: state.gpu, host_blocks: state.host, network_blocks: state.network };
    }
    LookupResult { matches, request_blocks: blocks as u32 }
}

fn prompt(blocks: usize, variant: u32) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..blocks as u32 * DEFAULT_BLOCK_SIZE).map(|i| i + variant * 1_000_000).collect();
    BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"").hashes(&tokens)
}

fn route(policy: &mut Policy, hashes: &[BlockHash], states: &[State], rng: &mut SplitMix64) -> Decision {
    let request = RouteRequest { hashes, prompt_tokens: hashes.len() * DEFAULT_BLOCK_SIZE as usize, session_key: None };
    policy.decide(&request, &views(states), &lookup(states, hashes.len()), rng)
}

/// One decision per row on a 10-block prompt: (states, expected choice).
fn check(kind: PolicyKind, config: ScoringConfig, rows: &[(&[State], Option<ReplicaId>)]) {
    check_blocks(kind, config, 10, rows);
}

/// One decision per row on a prompt of `blocks` full blocks: (states, expected choice).
fn check_blocks(kind: PolicyKind, config: ScoringConfig, blocks: usize, rows: &[(&[State], Option<ReplicaId>)]) {
    let hashes = prompt(blocks, 0);
    for (row, (states, expected)) in rows.iter().enumerate() {
        let mut policy = Policy::new(kind, config.clone());
        let decision = route(&mut policy, &hashes, states, &mut SplitMix64::new(9));
        assert_eq!(decision.chosen, *expected, "{kind} row {row}: {decision:#?}");
        assert_eq!(decision.policy, kind.name());
    }
}

#[test]
fn names_round_trip_and_unknown_names_are_refused() {
    assert_eq!(
        PolicyKind::names(),
        ["cache_aware", "round_robin", "random", "least_loaded", "prefix_hash", "approx_radix", "dynamo", "llmd"]
    );
    for kind in PolicyKind::ALL {
        assert_eq!(PolicyKind::from_name(kind.name()), Some(kind));
        assert_eq!(Policy::from_name(kind.name()).unwrap().name(), kind.name());
    }
    let error = Policy::from_name("fastest").unwrap_err();
    assert!(error.to_string().contains("cache_aware, round_robin"), "{error}");
}

#[test]
fn every_policy_excludes_unavailable_replicas_and_may_choose_none() {
    for kind in PolicyKind::ALL {
        let only_one = [State { healthy: false, gpu: 10, ..replica(0) }, replica(1)];
        check(kind, ScoringConfig::default(), &[(&only_one, Some(1))]);
        let none = [State { healthy: false, ..replica(0) }, State { waiting: 64, ..replica(1) }];
        check(kind, ScoringConfig::default(), &[(&none, None), (&[], None)]);
    }
}

#[test]
fn round_robin_cycles_through_eligible_replicas_in_id_order() {
    let states = [replica(2), State { healthy: false, ..replica(1) }, replica(0), replica(5)];
    let mut policy = Policy::from_name("round_robin").unwrap();
    let hashes = prompt(2, 0);
    let mut rng = SplitMix64::new(0);
    let request = RouteRequest { hashes: &hashes, prompt_tokens: 32, session_key: None };
    let preview = policy.explain(&request, &views(&states), &lookup(&states, 2), &mut rng);
    let chosen: Vec<_> = (0..6).map(|_| route(&mut policy, &hashes, &states, &mut rng).chosen.unwrap()).collect();
    assert_eq!(preview.chosen, Some(0), "explaining does not advance the rotation");
    assert_eq!(chosen, [0, 2, 5, 0, 2, 5]);
}

#[test]
fn random_is_seeded_and_roughly_uniform() {
    let states = [replica(0), replica(1), State { healthy: false, ..replica(2) }, replica(3)];
    let mut policy = Policy::from_name("random").unwrap();
    let hashes = prompt(2, 0);
    let draw = |seed| {
        let mut rng = SplitMix64::new(seed);
        let mut policy = Policy::from_name("random").unwrap();
        (0..20).map(|_| route(&mut policy, &hashes, &states, &mut rng).chosen.unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(draw(4), draw(4));
    let mut counts: HashMap<ReplicaId, usize> = HashMap::new();
    let mut rng = SplitMix64::new(1);
    for _ in 0..3_000 {
        *counts.entry(route(&mut policy, &hashes, &states, &mut rng).chosen.unwrap()).or_default() += 1;
    }
    assert_eq!(counts.get(&2), None);
    for replica in [0, 1, 3] {
        assert!((850..1150).contains(&counts[&replica]), "{counts:?}");
    }
}

#[test]
fn least_loaded_choices() {
    check(
        PolicyKind::LeastLoaded,
        ScoringConfig::default(),
        &[
            (&[State { running: 3, gpu: 10, ..replica(0) }, State { running: 1, ..replica(1) }], Some(1)),
            (&[State { waiting: 2, ..replica(0) }, State { running: 1, ..replica(1) }], Some(1)),
            (
                &[
                    State { running: 1, queued_tokens: 900, ..replica(0) },
                    State { running: 1, queued_tokens: 100, ..replica(1) },
                ],
                Some(1),
            ),
        ],
    );
}

#[test]
fn dynamo_cost_is_prefill_blocks_plus_decode_blocks() {
    // 10 blocks requested. logit = max(0, (prefill tokens in flight + 160) / 16 - overlap) + active blocks
    // + the request's blocks not active yet.
    check(
        PolicyKind::Dynamo,
        ScoringConfig::default(),
        &[
            // Dynamo's own example (docs, router "Routing Concepts"): cached 2, 5 and 8 blocks, so prefill 8,
            // 5 and 2; decode 10, 5 and 9; costs 18, 10 and 11: worker 2.
            (
                &[
                    State { gpu: 2, ..replica(0) },
                    State { gpu: 5, tracked: tracked(0, 0, 5), ..replica(1) },
                    State { gpu: 8, tracked: tracked(0, 7, 8), ..replica(2) },
                ],
                Some(1),
            ),
            // The router's own in-flight prefill counts, the engine's reported queue does not: with 160 tokens
            // in flight the holder's prefill is (160 + 160) / 16 - 10 = 10 like the idle replica's, and its 5
            // active blocks tip it; with 80 it keeps the request, whatever the engine reports queued.
            (&[State { gpu: 10, tracked: tracked(160, 5, 0), ..replica(0) }, replica(1)], Some(1)),
            (
                &[State { gpu: 10, queued_tokens: 10_000, tracked: tracked(80, 0, 0), ..replica(0) }, replica(1)],
                Some(0),
            ),
            // Active blocks the request shares are not counted twice: 10 active, all of them its own.
            (&[State { gpu: 10, tracked: tracked(0, 10, 10), ..replica(0) }, replica(1)], Some(0)),
            // Host credit 0.5: 10 - 5 = 5 against 10 - 4 = 6.
            (&[State { host: 10, ..replica(0) }, State { gpu: 4, ..replica(1) }], Some(0)),
            // Network credit 0.25: 10 - 2.5 = 7.5 against 10 - 4 = 6.
            (&[State { network: 10, ..replica(0) }, State { gpu: 4, ..replica(1) }], Some(1)),
        ],
    );
}

#[test]
fn llmd_weighted_scorers() {
    check(
        PolicyKind::Llmd,
        ScoringConfig::default(),
        &[
            // Prefix 3*1 + queue 2*1 + kv 2*0.9 = 6.8 against 0 + 2 + 2*0.9 = 3.8.
            (&[State { gpu: 10, kv_used: 100, ..replica(0) }, State { kv_used: 100, ..replica(1) }], Some(0)),
            // The holder's queue is the longest (0) and its KV is full (0): 3 against 2 + 2 = 4.
            (&[State { gpu: 10, waiting: 9, kv_used: 1_000, ..replica(0) }, replica(1)], Some(1)),
            // Host blocks count as prefix hits: 3*0.5 + 2 + 2 = 5.5 against 2 + 2 = 4.
            (&[State { host: 5, ..replica(0) }, replica(1)], Some(0)),
        ],
    );
}

#[test]
fn llmd_on_the_peer_scorer_tests() {
    // The scorer tests of kubernetes-sigs/gateway-api-inference-extension (the plugins llm-d's scheduler runs;
    // `pkg/epp/scheduling/framework/plugins/scorer/`) under the inference-scheduling profile's weights: 3 prefix
    // + 2 queue + 2 kv, highest wins.
    check(
        PolicyKind::Llmd,
        ScoringConfig::default(),
        &[
            // scorer/queue_test.go "Different queue sizes": waiting 10, 5, 0 score 0, 0.5, 1 (totals 2, 3, 4).
            (&[State { waiting: 10, ..replica(0) }, State { waiting: 5, ..replica(1) }, replica(2)], Some(2)),
            // scorer/kvcache_utilization_test.go "Different KV cache utilization": 0.8, 0.5, 0 score 0.2, 0.5, 1.
            (&[State { kv_used: 800, ..replica(0) }, State { kv_used: 500, ..replica(1) }, replica(2)], Some(2)),
        ],
    );
    // `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin_test.go` TestPrefixPluginCompletion, fifth request
    // ("aaaabbbbcccc", 3 blocks): endpoint1 was sent 2 of its blocks before (score 2/3), endpoint3 1 (the test
    // asserts it for the third request, 1 of 2), endpoint2 none. The peer learns them from its own routing; here
    // the index holds them.
    check_blocks(
        PolicyKind::Llmd,
        ScoringConfig::default(),
        3,
        &[
            // 3 * 2/3 + 4 = 6 against 5 and 4.
            (&[State { gpu: 2, ..replica(0) }, replica(1), State { gpu: 1, ..replica(2) }], Some(0)),
            // With the queue test's waiting 5, 10, 0: 2 + 1 + 2 = 5 against 0 + 0 + 2 and 0 + 2 + 2.
            (&[State { gpu: 2, waiting: 5, ..replica(0) }, State { waiting: 10, ..replica(1) }, replica(2)], Some(0)),
            // The queue and KV tests' worst values on the holders: 2 + 0 + 0.4 = 2.4, 1 + 1 + 1 = 3, 0 + 2 + 2 = 4.
            (
                &[
                    State { gpu: 2, waiting: 10, kv_used: 800, ..replica(0) },
                    State { gpu: 1, waiting: 5, kv_used: 500, ..replica(1) },
                    replica(2),
                ],
                Some(2),
            ),
        ],
    );
}

#[test]
fn llmd_counts_at_most_256_prefix_blocks() {
    // gateway-api-inference-extension's prefix plugin matches at most maxPrefixBlocksToMatch = 256 blocks: a
    // 512-block prompt whose first 256 blocks replica 0 holds scores it 3 * 1 + 2 * 0 + 2 = 5 with 2 waiting
    // there, against 0 + 2 + 2 = 4 for the idle replica (over all 512 blocks it would be 1.5 + 0 + 2 = 3.5).
    check_blocks(
        PolicyKind::Llmd,
        ScoringConfig::default(),
        512,
        &[(&[State { gpu: 256, waiting: 2, ..replica(0) }, replica(1)], Some(0))],
    );
}

#[test]
fn prefix_hash_is_sticky_on_the_first_256_tokens_and_spreads() {
    let states: Vec<State> = (0..4).map(replica).collect();
    let mut policy = Policy::from_name("prefix_hash").unwrap();
    let mut rng = SplitMix64::new(3);
    let mut owners = HashMap::new();
    // 20-block prompts (320 tokens): their first 256 tokens are 16 whole blocks.
    for variant in 0..400 {
        let hashes = prompt(20, variant);
        let first = route(&mut policy, &hashes, &states, &mut rng).chosen.unwrap();
        assert_eq!(route(&mut policy, &hashes, &states, &mut rng).chosen, Some(first), "sticky");
        assert_eq!(route(&mut policy, &hashes[..16], &states, &mut rng).chosen, Some(first), "256 tokens decide");
        owners.insert(variant, first);
    }
    let mut counts = [0usize; 4];
    for owner in owners.values() {
        counts[usize::from(*owner)] += 1;
    }
    assert!(counts.iter().all(|&count| count > 50), "spread: {counts:?}");

    // Removing one replica moves only the prompts it owned.
    let three: Vec<State> = (0..3).map(replica).collect();
    for (variant, owner) in &owners {
        let now = route(&mut policy, &prompt(20, *variant), &three, &mut rng).chosen.unwrap();
        if *owner != 3 {
            assert_eq!(now, *owner, "prompt {variant} moved");
        }
    }
}

/// Routes a 20-block prompt once to 4 idle replicas to find its owner, then again with `owner_load` requests on
/// the owner and `others` on the other three, in id order. Returns the owner and the decision.
fn prefix_hash_with_loads(owner_load: u32, others: [u32; 3]) -> (ReplicaId, Decision) {
    let hashes = prompt(20, 0);
    let idle: Vec<State> = (0..4).map(replica).collect();
    let owner =
        route(&mut Policy::from_name("prefix_hash").unwrap(), &hashes, &idle, &mut SplitMix64::new(1)).chosen.unwrap();
    let mut loaded = idle.clone();
    let mut rest = others.into_iter();
    for state in &mut loaded {
        state.running = if state.id == owner { owner_load } else { rest.next().unwrap() };
    }
    (owner, route(&mut Policy::from_name("prefix_hash").unwrap(), &hashes, &loaded, &mut SplitMix64::new(1)))
}

/// The replica after `owner` in id order that got the `nth` of the other loads.
fn other(owner: ReplicaId, nth: usize) -> ReplicaId {
    (0..4).filter(|&id| id != owner).nth(nth).unwrap()
}

#[test]
fn prefix_hash_bounds_the_owners_load_as_sglang_router_does() {
    // sgl-project/sglang sgl-model-gateway src/policies/prefix_hash.rs, test_load_ok_calculation: load factor
    // 1.25, 100 in flight over 4 workers, bound 1.25 * 101 / 4 = 31.56: an owner with 30 keeps the request...
    let (owner, decision) = prefix_hash_with_loads(30, [30, 30, 10]);
    assert_eq!((decision.chosen, decision.rule), (Some(owner), "ring_owner"));
    // ...one with 35 does not: the least loaded replica within the bound takes it (the one with 5), not the
    // next on the ring.
    let (owner, decision) = prefix_hash_with_loads(35, [20, 40, 5]);
    assert_eq!((decision.chosen, decision.rule), (Some(other(owner, 2)), "bounded_load_overflow"));
    // The bound is inclusive: 15 in flight, 1.25 * 16 / 4 = 5, and an owner with 5 keeps it.
    let (owner, decision) = prefix_hash_with_loads(5, [5, 5, 0]);
    assert_eq!((decision.chosen, decision.rule), (Some(owner), "ring_owner"));
    // Among equals within the bound, the first in replica order.
    let (owner, decision) = prefix_hash_with_loads(40, [2, 2, 2]);
    assert_eq!((decision.chosen, decision.rule), (Some(other(owner, 0)), "bounded_load_overflow"));
}

#[test]
fn prefix_hash_on_the_peer_tests() {
    // test_shared_prefix_routes_same: with prefix_token_count 5, prompts that share their first 5 tokens and differ
    // after them go to the same worker; here 5 leading blocks.
    let config = ScoringConfig { prefix_hash_tokens: 5 * DEFAULT_BLOCK_SIZE as usize, ..Default::default() };
    let states: Vec<State> = (0..3).map(replica).collect();
    let block = DEFAULT_BLOCK_SIZE as usize;
    let head: Vec<u32> = (0..5 * block as u32).collect();
    let hashes_with_tail = |tail: u32| {
        let tokens: Vec<u32> = head.iter().copied().chain((0..3 * block as u32).map(|i| tail + i)).collect();
        BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"").hashes(&tokens)
    };
    let mut policy = Policy::new(PolicyKind::PrefixHash, config);
    let mut rng = SplitMix64::new(3);
    let first = route(&mut policy, &hashes_with_tail(100), &states, &mut rng).chosen;
    assert_eq!(route(&mut policy, &hashes_with_tail(999), &states, &mut rng).chosen, first);
}

#[test]
fn prefix_hash_uses_the_session_key_without_full_blocks() {
    let states: Vec<State> = (0..4).map(replica).collect();
    let mut policy = Policy::from_name("prefix_hash").unwrap();
    let mut rng = SplitMix64::new(3);
    let request = RouteRequest { hashes: &[], prompt_tokens: 5, session_key: Some(42) };
    let first = policy.decide(&request, &views(&states), &lookup(&states, 0), &mut rng);
    assert_eq!(first.rule, "ring_owner");
    for _ in 0..5 {
        assert_eq!(policy.decide(&request, &views(&states), &lookup(&states, 0), &mut rng).chosen, first.chosen);
    }
}

#[test]
fn approx_radix_follows_its_own_history_within_balance_thresholds() {
    let config =
        ScoringConfig { radix_balance_abs_threshold: 4, radix_balance_rel_threshold: 1.5, ..Default::default() };
    let states: Vec<State> = (0..3).map(replica).collect();
    let mut policy = Policy::new(PolicyKind::ApproxRadix, config);
    let mut rng = SplitMix64::new(5);
    let system = prompt(10, 7);
    // Empty history: nothing matches, so the least loaded (all equal, RNG); then the same prefix sticks.
    let first = route(&mut policy, &system, &states, &mut rng);
    assert_eq!(first.rule, "miss_least_loaded");
    let owner = first.chosen.unwrap();
    let again = route(&mut policy, &system, &states, &mut rng);
    assert_eq!((again.chosen, again.rule), (Some(owner), "history_match"));
    // Matching 2 of 10 blocks is under the 0.3 threshold: the least loaded replica, whatever its history
    // (sglang-router 0.3.2; the smallest tree before sgl-project/sglang#14650).
    let mut partial = system[..2].to_vec();
    partial.extend(prompt(8, 8));
    let mut uneven = states.clone();
    uneven[usize::from((owner + 1) % 3)].running = 2;
    uneven[usize::from((owner + 2) % 3)].running = 1;
    let miss = route(&mut policy, &partial, &uneven, &mut rng);
    assert_eq!((miss.chosen, miss.rule), (Some(owner), "miss_least_loaded"), "the owner is the least loaded");
    // Imbalanced (10 - 0 > 4 and 10 > 1.5 * 0): the least loaded, history or not.
    let mut busy = states.clone();
    busy[usize::from(owner)].running = 10;
    busy[(usize::from(owner) + 1) % 3].running = 3;
    let balanced = route(&mut policy, &system, &busy, &mut rng);
    assert_eq!(balanced.rule, "imbalanced_least_loaded");
    assert_eq!(balanced.chosen, Some((owner + 2) % 3));
    // Both replicas routed the prompt now hold it in the history; the index's
    // matches play no part, so the replica that holds it per events is not chosen.
    let mut indexed = states.clone();
    indexed[usize::from((owner + 1) % 3)].gpu = 10;
    let followed = route(&mut policy, &system, &indexed, &mut rng);
    assert_eq!(followed.rule, "history_match");
    assert_ne!(followed.chosen, Some((owner + 1) % 3));
}

#[test]
fn approx_radix_on_sglang_routers_tests() {
    // sgl-project/sglang sgl-model-gateway src/policies/cache_aware.rs tests; one block per character of their
    // prompts, the router's in-flight requests as the replicas' running requests.
    let mut rng = SplitMix64::new(5);

    // test_cache_aware_with_imbalanced_load: thresholds 0.5, 5 and 2.0, loads 20 and 0: "test" goes to worker 2,
    // five times over.
    let config = ScoringConfig {
        radix_cache_threshold: 0.5,
        radix_balance_abs_threshold: 5,
        radix_balance_rel_threshold: 2.0,
        ..Default::default()
    };
    let states = [State { running: 20, ..replica(0) }, replica(1)];
    let mut policy = Policy::new(PolicyKind::ApproxRadix, config);
    let test = prompt(4, 1);
    for _ in 0..5 {
        let decision = route(&mut policy, &test, &states, &mut rng);
        assert_eq!((decision.chosen, decision.rule), (Some(1), "imbalanced_least_loaded"));
    }

    // test_cache_aware_with_balanced_load: defaults; "hello world" twice, then "hello" (its prefix, match rate 1),
    // all to the same worker.
    let states = [replica(0), replica(1)];
    let mut policy = Policy::from_name("approx_radix").unwrap();
    let hello_world = prompt(11, 2);
    let first = route(&mut policy, &hello_world, &states, &mut rng).chosen;
    assert!(first.is_some());
    assert_eq!(route(&mut policy, &hello_world, &states, &mut rng).chosen, first);
    assert_eq!(route(&mut policy, &hello_world[..5], &states, &mut rng).chosen, first);

    // test_cache_aware_worker_removal: "test1" and "test2" routed, then worker 1 removed and unhealthy: "test1"
    // goes to worker 2.
    let mut policy = Policy::from_name("approx_radix").unwrap();
    let (test1, test2) = (prompt(5, 3), prompt(5, 4));
    route(&mut policy, &test1, &states, &mut rng);
    route(&mut policy, &test2, &states, &mut rng);
    policy.forget_replica(0);
    let without_first = [State { healthy: false, ..replica(0) }, replica(1)];
    assert_eq!(route(&mut policy, &test1, &without_first, &mut rng).chosen, Some(1));
}

#[test]
fn approx_radix_history_is_bounded() {
    let config = ScoringConfig { radix_max_blocks: 50, ..Default::default() };
    let states: Vec<State> = (0..3).map(replica).collect();
    let mut policy = Policy::new(PolicyKind::ApproxRadix, config);
    let mut rng = SplitMix64::new(5);
    for variant in 0..200 {
        route(&mut policy, &prompt(8, variant), &states, &mut rng);
        assert!(policy.history().unwrap().len() <= 50);
    }
    // The most recent prompt is still remembered whole.
    let last = prompt(8, 199);
    let history = policy.history().unwrap();
    assert!((0..3).any(|replica| history.matched(&last, replica) == 8));
    assert_eq!((0..3).map(|replica| history.matched(&prompt(8, 0), replica)).max(), Some(0));
}

//! `cache_aware` scoring as data: replica states in, expected choice out. The expected choices follow from
//! the model by hand: a 2,000-token prompt (125 blocks), 10,000 prefill tokens a second (a block costs
//! 1.6 ms to compute, the whole prompt 200 ms), 20 ms decode steps, pools of 10,000 blocks.
#![allow(clippy::unwrap_used)]

use kvroute_gateway::routing::cache_aware::cache_aware;
use kvroute_gateway::routing::scoring::{fleet_rates, predict, usable_match};
use kvroute_gateway::routing::{
    CostTerms, Decision, Exclusion, LookupResult, ReplicaId, ReplicaMatch, ReplicaView, RouteRequest, ScoringConfig,
    SplitMix64, TrackedLoad,
};
use kvroute_proto::domain::LoadStats;
use kvroute_proto::{BlockHash, DEFAULT_BLOCK_SIZE};

/// 2,000 tokens = 125 blocks of 16.
const PROMPT_TOKENS: usize = 2_000;
const BLOCKS: usize = 125;
/// 2 MiB per block (Llama-3-8B bf16).
const BLOCK_BYTES: u64 = 2 << 20;

/// One replica's state in a table row.
#[derive(Clone, Copy)]
struct State {
    id: ReplicaId,
    healthy: bool,
    draining: bool,
    waiting: u32,
    running: u32,
    queue_capacity: u32,
    queued_tokens: u64,
    kv_usage: f64,
    prefill_rate: f64,
    host_bandwidth: f64,
    network_bandwidth: f64,
    network_up: bool,
    gpu: u32,
    host: u32,
    network: u32,
    /// Requests this router sends it per second, and requests it finishes per second.
    send_rate: f64,
    finish_rate: f64,
    /// Leading blocks of the prompt this router's unfinished requests there hold.
    in_flight: u64,
    /// Decode steps until a running slot frees there.
    slot_wait_steps: u64,
    /// This router's unfinished requests there holding all of the prompt's blocks in flight there.
    sharers: u32,
}

const IDLE: State = State {
    id: 0,
    healthy: true,
    draining: false,
    waiting: 0,
    running: 0,
    queue_capacity: 64,
    queued_tokens: 0,
    kv_usage: 0.1,
    prefill_rate: 10_000.0,
    host_bandwidth: 20e9,
    network_bandwidth: 2e9,
    network_up: true,
    gpu: 0,
    host: 0,
    network: 0,
    send_rate: 0.0,
    finish_rate: 0.0,
    in_flight: 0,
    slot_wait_steps: 0,
    sharers: 0,
};

fn replica(id: ReplicaId) -> State {
    State { id, ..IDLE }
}

fn views(states: &[State]) -> (Vec<ReplicaView>, LookupResult) {
    let views = states
        .iter()
        .map(|state| ReplicaView {
            id: state.id,
            healthy: state.healthy,
            load: LoadStats {
                waiting_requests: state.waiting,
                running_requests: state.running,
                queued_prefill_tokens: state.queued_tokens,
                kv_blocks_used: (state.kv_usage * 10_000.0) as u64,
                kv_blocks_total: 10_000,
                prefill_tokens_per_second: state.prefill_rate,
                decode_step_seconds: 0.02,
                host_bytes_per_second: state.host_bandwidth,
                network_bytes_per_second: state.network_bandwidth,
                network_tier_up: state.network_up,
                draining: state.draining,
                queue_capacity: state.queue_capacity,
                ..LoadStats::default()
            },
            block_size: DEFAULT_BLOCK_SIZE,
            bytes_per_block: BLOCK_BYTES,
            blocks_per_engine_block: 1,
            tracked: TrackedLoad {
                send_rate: state.send_rate,
                finish_rate: state.finish_rate,
                request_active_blocks: state.in_flight,
                slot_wait_steps: state.slot_wait_steps,
                request_sharers: state.sharers,
                ..TrackedLoad::default()
            },
        })
        .collect();
    let mut matches = vec![ReplicaMatch::default(); 16];
    for state in states {
        matches[usize::from(state.id)] =
            ReplicaMatch { gpu_blocks: state.gpu, host_blocks: state.host, network_blocks: state.network };
    }
    (views, LookupResult { matches, request_blocks: BLOCKS as u32 })
}

fn decide(states: &[State], seed: u64) -> Decision {
    let hashes = vec![BlockHash::default(); BLOCKS];
    let request = RouteRequest { hashes: &hashes, prompt_tokens: PROMPT_TOKENS, session_key: None };
    let (views, lookup) = views(states);
    cache_aware(&request, &views, &lookup, &ScoringConfig::default(), &mut SplitMix64::new(seed))
}

fn check(name: &str, states: &[State], expected: Option<ReplicaId>) {
    let decision = decide(states, 1);
    assert_eq!(decision.chosen, expected, "{name}: {decision:#?}");
    assert_eq!(decision.candidates.len(), states.len());
}

#[test]
fn cache_aware_choices() {
    // Score = max(wait, mean wait) + own work + delay to others + eviction, the mean wait counting in full
    // for a replica that got a request over the last 10 s (send rate 0.1/s), in proportion below that (0 for
    // one that got none). An idle miss costs 0.02 (wait) +
    // 0.2 (compute) + 0.025 (125 new blocks evicting cache from a pool one tenth held: 0.2 * 1,125 / 8,875).
    let cases: Vec<(&str, Vec<State>, Option<ReplicaId>)> = vec![
        ("the prefix holder wins", vec![replica(0), State { gpu: 100, ..replica(1) }], Some(1)),
        (
            "the longer gpu prefix wins",
            vec![State { gpu: 60, ..replica(0) }, State { gpu: 100, ..replica(1) }],
            Some(1),
        ),
        (
            // Holder 0.52 against max(0.02, mean 0.27) + 0.225 = 0.495.
            "a holder whose wait exceeds the mean by more than locality saves loses",
            vec![State { gpu: 125, queued_tokens: 5_000, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            // Requests reach the idle replica (one a second): holder 0.32 against the mean 0.17 + 0.225 (+ 0.055
            // delay to those arriving) = 0.45, though the idle replica would answer sooner this once (0.245): an
            // idle moment is not the fleet's lasting state.
            "a holder whose wait exceeds the mean by less than locality saves keeps it",
            vec![State { gpu: 125, queued_tokens: 3_000, ..replica(0) }, State { send_rate: 1.0, ..replica(1) }],
            Some(0),
        ),
        (
            // The same, but this router sends the idle replica nothing: nothing will fill it, its own wait
            // counts (0.02 + 0.225 = 0.245 against 0.32), and it takes the request and a copy of the prefix.
            "a replica nothing reaches keeps its own wait and takes the request from a busier holder",
            vec![State { gpu: 125, queued_tokens: 3_000, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            // The same long queue, but 5 requests a second reach the other replica: its 0.2 s of work
            // delays the 5 * 0.22 of them arriving meanwhile: 0.495 + 0.22 against 0.52.
            "where requests keep arriving, a miss's work delays them too",
            vec![State { gpu: 125, queued_tokens: 5_000, ..replica(0) }, State { send_rate: 5.0, ..replica(1) }],
            Some(0),
        ),
        (
            // 250 blocks of queued prompts, 10 free, 50 running sequences holding 9,990 blocks and one
            // finishing a second: 240 blocks at 200 a second, a 1.2 s wait, against 0.61 + 0.225.
            "a holder whose pool cannot take the queued prompts for a while loses",
            vec![
                State { gpu: 125, queued_tokens: 4_000, running: 50, kv_usage: 0.999, finish_rate: 1.0, ..replica(0) },
                replica(1),
            ],
            Some(1),
        ),
        (
            // Nothing finishes there as far as this router knows: no memory wait, 0.42 against 0.445 (+ 0.055
            // delay to the requests reaching the other replica).
            "without a finishing rate the pool's wait is unknown and the holder keeps it",
            vec![
                State { gpu: 125, queued_tokens: 4_000, running: 50, kv_usage: 0.999, ..replica(0) },
                State { send_rate: 1.0, ..replica(1) },
            ],
            Some(0),
        ),
        (
            // 20 running sequences at each: the idle replica's extra 0.2 s of work delays each of its 20 next
            // tokens, 0.495 + 4 against the holder's 0.52.
            "with sequences running, a miss's extra work delays each of them: the holder keeps it",
            vec![
                State { gpu: 125, queued_tokens: 5_000, running: 20, ..replica(0) },
                State { running: 20, ..replica(1) },
            ],
            Some(0),
        ),
        (
            // Both need the whole prompt: no extra work anywhere, and the shorter wait (0.02 against 0.12)
            // decides, whatever runs there.
            "where nothing is cached, running sequences do not decide",
            vec![State { running: 40, ..replica(0) }, State { running: 5, queued_tokens: 1_000, ..replica(1) }],
            Some(0),
        ),
        (
            // Eviction 0.2 * 8,125 / 1,875 = 0.87 against 0.2 * 3,125 / 6,875 = 0.09.
            "a new prefix goes where running sequences leave more of the pool to the cache",
            vec![State { kv_usage: 0.8, ..replica(0) }, State { kv_usage: 0.3, ..replica(1) }],
            Some(1),
        ),
        (
            "a nearly full pool loses a miss even to a busier replica",
            vec![State { kv_usage: 0.9, ..replica(0) }, State { queued_tokens: 3_000, ..replica(1) }],
            Some(1),
        ),
        (
            "blocks of this router's unfinished requests there count as held",
            vec![replica(0), State { in_flight: 125, ..replica(1) }],
            Some(1),
        ),
        (
            // The holder waits 0.12 s; 10 requests there share the whole prompt, and as many will follow. A copy
            // on the idle replica saves each of the 10 / 2 that will use it 0.1 s: 0.245 - 0.5 against 0.12.
            "an idle replica takes a copy of a prefix many requests share from a busier holder",
            vec![
                State { gpu: 125, in_flight: 125, sharers: 10, running: 20, queued_tokens: 1_000, ..replica(0) },
                replica(1),
            ],
            Some(1),
        ),
        (
            "a prefix no request shares now stays on its holder",
            vec![State { gpu: 125, in_flight: 0, running: 20, queued_tokens: 1_000, ..replica(0) }, replica(1)],
            Some(0),
        ),
        (
            // The requests there share only the prompt's first 100 blocks: a copy of the holder's 125 serves none.
            "requests sharing less than the holder's prefix earn a copy nothing",
            vec![
                State { gpu: 125, in_flight: 100, sharers: 10, running: 20, queued_tokens: 1_000, ..replica(0) },
                replica(1),
            ],
            Some(0),
        ),
        (
            // A copy there would wait behind the running sequence's steps and delay it: no credit.
            "a copy goes only to a replica where nothing runs or waits",
            vec![
                State { gpu: 125, in_flight: 125, sharers: 10, running: 20, queued_tokens: 1_000, ..replica(0) },
                State { running: 1, ..replica(1) },
            ],
            Some(0),
        ),
        (
            "host hits beat recompute when host bandwidth is high",
            vec![State { host: 100, ..replica(0) }, State { gpu: 10, ..replica(1) }],
            Some(0),
        ),
        (
            "host hits lose when host bandwidth is low",
            vec![State { host: 100, host_bandwidth: 1e6, ..replica(0) }, State { gpu: 10, ..replica(1) }],
            Some(1),
        ),
        (
            "network hits beat recompute at network bandwidth",
            vec![replica(0), State { network: 100, ..replica(1) }],
            Some(1),
        ),
        (
            "network hits do not count where the network tier is down",
            vec![State { network: 100, network_up: false, ..replica(0) }, State { gpu: 20, ..replica(1) }],
            Some(1),
        ),
        (
            "gpu hits beat the same number of network hits",
            vec![State { network: 100, ..replica(0) }, State { gpu: 100, ..replica(1) }],
            Some(1),
        ),
        (
            // 0.021 against 0.0205: within 5%, and replica 1 waits less.
            "a near-tie goes to the shorter wait",
            vec![State { gpu: 125, queued_tokens: 10, ..replica(0) }, State { gpu: 125, ..replica(1) }],
            Some(1),
        ),
        (
            "outside the tolerance the lower score wins despite a longer wait",
            vec![State { gpu: 100, queued_tokens: 100, ..replica(0) }, replica(1)],
            Some(0),
        ),
        (
            "an unhealthy holder is excluded",
            vec![State { gpu: 125, healthy: false, ..replica(0) }, replica(1)],
            Some(1),
        ),
        ("a draining holder is excluded", vec![State { gpu: 125, draining: true, ..replica(0) }, replica(1)], Some(1)),
        (
            "a holder with a full queue is excluded",
            vec![State { gpu: 125, waiting: 64, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            "no healthy replica: no choice",
            vec![State { healthy: false, ..replica(0) }, State { draining: true, ..replica(1) }],
            None,
        ),
        ("no replica at all: no choice", vec![], None),
        (
            "an unmeasured prefill rate uses the default",
            vec![State { prefill_rate: 0.0, gpu: 100, ..replica(0) }, replica(1)],
            Some(0),
        ),
    ];
    for (name, states, expected) in cases {
        check(name, &states, expected);
    }
}

#[test]
fn exact_ties_break_by_the_injected_rng() {
    let states = [replica(0), replica(1), replica(2)];
    let mut seen = [false; 3];
    for seed in 0..64 {
        let first = decide(&states, seed);
        assert_eq!(first.chosen, decide(&states, seed).chosen, "the same seed makes the same choice");
        assert_eq!(first.rule, "near_tie_random");
        seen[usize::from(first.chosen.unwrap())] = true;
    }
    assert_eq!(seen, [true; 3]);
}

#[test]
fn the_decision_explains_every_replica() {
    let states = [
        State { gpu: 10, host: 20, network: 30, ..replica(0) },
        State { healthy: false, ..replica(1) },
        State { kv_usage: 0.97, ..replica(2) },
    ];
    let decision = decide(&states, 0);
    let first = &decision.candidates[0];
    assert_eq!((first.gpu_blocks, first.host_blocks, first.network_blocks), (10, 20, 30));
    assert_eq!(first.matched_blocks(), 60);
    assert!(first.predicted_ttft_s > 0.0 && first.predicted_ttft_s < 0.2);
    assert_eq!(decision.candidates[1].excluded, Some(Exclusion::Unhealthy));
    // 125 new blocks where running sequences hold 97% of the pool: 0.2 * 9,825 / 175.
    assert!((decision.candidates[2].prediction.eviction_s - 0.2 * 9_825.0 / 175.0).abs() < 1e-9);
    assert_eq!(decision.chosen, Some(0));
    assert_eq!(decision.ranked().iter().map(|candidate| candidate.replica).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(decision.predicted_cached_tokens(DEFAULT_BLOCK_SIZE), 960);
}

#[test]
fn the_ttft_model_adds_queue_compute_and_cheapest_reload() {
    let (views, _) = views(&[IDLE]);
    let config = ScoringConfig::default();
    let found = ReplicaMatch { gpu_blocks: 25, host_blocks: 50, network_blocks: 25 };
    let view =
        ReplicaView { load: LoadStats { queued_prefill_tokens: 1_000, ..views[0].load.clone() }, ..views[0].clone() };
    let prediction = predict(&view, found, PROMPT_TOKENS, &config);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // 1,000 queued tokens at 10,000 per second, plus one 20 ms decode step.
    assert!(close(prediction.queue_wait_s, 0.1 + 0.02));
    assert!(close(prediction.compute_s, 400.0 / 10_000.0));
    assert!(close(prediction.host_s, 50.0 * BLOCK_BYTES as f64 / 20e9));
    // Reloading 25 blocks at 2 GB/s (26 ms) costs less than recomputing 400 tokens (40 ms).
    assert!(close(prediction.network_s, 25.0 * BLOCK_BYTES as f64 / 2e9));
    let slow = ReplicaView { load: LoadStats { network_bytes_per_second: 1e8, ..view.load.clone() }, ..view };
    assert!(close(predict(&slow, found, PROMPT_TOKENS, &config).network_s, 0.04), "recompute when cheaper");
    assert!(close(
        prediction.ttft_s,
        prediction.queue_wait_s + prediction.compute_s + prediction.host_s + prediction.network_s
    ));
}

#[test]
fn the_costs_to_others_follow_the_send_rate_the_pool_and_its_turnover() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let config = ScoringConfig::default();
    let found = ReplicaMatch { gpu_blocks: 25, ..ReplicaMatch::default() };
    // 4 requests a second arrive while this one waits 0.02 s and computes its 1,600 tokens (0.16 s).
    let (busy, _) = views(&[State { send_rate: 4.0, kv_usage: 0.5, ..replica(0) }]);
    let prediction = predict(&busy[0], found, PROMPT_TOKENS, &config);
    assert!(close(prediction.delay_to_others_s, 0.16 * 4.0 * (0.02 + 0.16)), "{prediction:?}");
    // 100 new blocks at 1.6 ms each, times 5,100 held over 4,900 left.
    assert!(close(prediction.eviction_s, 0.16 * 5_100.0 / 4_900.0), "{prediction:?}");
    assert_eq!(prediction.memory_wait_s, 0.0);
    // 40 running sequences hold 9,900 blocks and 2 finish a second (495 blocks a second); 4,000 queued
    // tokens (250 blocks) and 100 new ones against 100 free: 250 blocks short, about half a second.
    let (full, _) =
        views(&[State { queued_tokens: 4_000, running: 40, kv_usage: 0.99, finish_rate: 2.0, ..replica(0) }]);
    let prediction = predict(&full[0], found, PROMPT_TOKENS, &config);
    assert!(close(prediction.memory_wait_s, 250.0 / (2.0 * 9_900.0 / 40.0)), "{prediction:?}");
    assert!(close(prediction.queue_wait_s, prediction.memory_wait_s), "the longer of the two waits");
    // A pool of unknown size costs nothing and never waits.
    let mut unknown = full[0].clone();
    unknown.load.kv_blocks_total = 0;
    let prediction = predict(&unknown, found, PROMPT_TOKENS, &config);
    assert_eq!((prediction.eviction_s, prediction.memory_wait_s), (0.0, 0.0));
}

#[test]
fn a_replica_running_all_the_sequences_it_may_is_as_slow_as_its_next_free_slot() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let config = ScoringConfig::default();
    // 100 decode steps of 20 ms until a running sequence finishes.
    let (full, lookup) = views(&[State { slot_wait_steps: 100, gpu: 125, ..replica(0) }, replica(1)]);
    let prediction = predict(&full[0], lookup.get(0), PROMPT_TOKENS, &config);
    assert!(close(prediction.slot_wait_s, 2.0), "{prediction:?}");
    assert!(close(prediction.queue_wait_s, 2.0), "the longest of the waits: {prediction:?}");
    // Holding the whole prompt saves its 0.2 s of compute, not the 2 s wait for a slot.
    check(
        "a holder without a free slot loses",
        &[State { slot_wait_steps: 100, gpu: 125, ..replica(0) }, replica(1)],
        Some(1),
    );
    check(
        "a holder a few steps from a free slot keeps it",
        &[State { slot_wait_steps: 2, gpu: 125, ..replica(0) }, replica(1)],
        Some(0),
    );
    let without = ScoringConfig { terms: CostTerms::ALL.without("slot-wait").unwrap(), ..config };
    assert_eq!(predict(&full[0], lookup.get(0), PROMPT_TOKENS, &without).slot_wait_s, 0.0);
}

#[test]
fn every_replica_predicts_with_the_fleets_prefill_rate_and_its_own_decode_step() {
    let (mut fleet, _) = views(&[replica(0), State { prefill_rate: 30_000.0, ..replica(1) }, replica(2)]);
    fleet[0].load.decode_step_seconds = 0.04;
    fleet[2].load.prefill_tokens_per_second = 0.0;
    fleet[2].load.decode_step_seconds = 0.0;
    fleet_rates(&mut fleet);
    // (10,000 + 30,000) / 2: the unmeasured replica and the measured ones alike.
    assert!(fleet.iter().all(|view| view.load.prefill_tokens_per_second == 20_000.0), "{fleet:?}");
    assert!((fleet[2].load.decode_step_seconds - 0.03).abs() < 1e-12, "an unmeasured step takes the mean");
    assert_eq!(fleet[0].load.decode_step_seconds, 0.04, "a measured step stays the replica's own");
    let (mut nobody, _) = views(&[State { prefill_rate: 0.0, ..replica(0) }]);
    fleet_rates(&mut nobody);
    assert_eq!(nobody[0].load.prefill_tokens_per_second, 0.0, "the scoring defaults apply");
}

#[test]
fn an_engine_with_larger_blocks_is_credited_only_its_whole_blocks_of_a_matched_prefix() {
    // vLLM-CPU caches 128-token blocks, 8 of kvroute's: a prompt matching 21 of kvroute's blocks there shares
    // 2 whole engine blocks (16), and the engine computes the rest.
    let (mut replicas, _) = views(&[replica(0)]);
    replicas[0].blocks_per_engine_block = 8;
    let found = ReplicaMatch { gpu_blocks: 19, host_blocks: 0, network_blocks: 2 };
    let usable = usable_match(&replicas[0], found);
    assert_eq!(usable, ReplicaMatch { gpu_blocks: 16, host_blocks: 0, network_blocks: 0 }, "trimmed from the end");
    let on_gpu = usable_match(&replicas[0], ReplicaMatch { gpu_blocks: 21, ..ReplicaMatch::default() });
    assert_eq!(on_gpu.gpu_blocks, 16);
    replicas[0].blocks_per_engine_block = 1;
    assert_eq!(usable_match(&replicas[0], found), found, "kvroute's own engine reuses every block");
}

#[test]
fn an_engine_with_larger_blocks_is_credited_only_its_whole_blocks_of_a_prefix_in_flight_there() {
    // The request shares its first 21 blocks with one this router sent to replica 1 and that has not finished;
    // replica 1's engine caches 8 of kvroute's blocks as one, so 16 of them count as held there.
    let hashes = vec![BlockHash::default(); BLOCKS];
    let request = RouteRequest { hashes: &hashes, prompt_tokens: PROMPT_TOKENS, session_key: None };
    let (mut replicas, lookup) = views(&[replica(0), State { in_flight: 21, ..replica(1) }]);
    let matched = |replicas: &[ReplicaView]| {
        let config = ScoringConfig::default();
        let decision = cache_aware(&request, replicas, &lookup, &config, &mut SplitMix64::new(1));
        decision.candidates[1].gpu_blocks
    };
    assert_eq!(matched(&replicas), 21, "kvroute's own engine reuses every block");
    replicas[1].blocks_per_engine_block = 8;
    assert_eq!(matched(&replicas), 16, "whole engine blocks only");
}

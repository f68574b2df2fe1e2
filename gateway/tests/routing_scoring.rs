//! `cache_aware` scoring as data: replica states in, expected choice out.
#![allow(clippy::unwrap_used)]

use kvroute_gateway::routing::scoring::{cache_aware, fill_unmeasured_rates, fleet_prefill_rate, predict};
use kvroute_gateway::routing::{
    Decision, Exclusion, LookupResult, ReplicaId, ReplicaMatch, ReplicaView, RouteRequest, ScoringConfig, SplitMix64,
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
            send_rate: 0.0,
            tracked: Default::default(),
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
    let cases: Vec<(&str, Vec<State>, Option<ReplicaId>)> = vec![
        ("the prefix holder wins", vec![replica(0), State { gpu: 100, ..replica(1) }], Some(1)),
        (
            "the longer gpu prefix wins",
            vec![State { gpu: 60, ..replica(0) }, State { gpu: 100, ..replica(1) }],
            Some(1),
        ),
        (
            "a holder above the KV watermark loses to an idle replica",
            vec![State { gpu: 125, kv_usage: 0.95, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            "below the watermark the same holder wins",
            vec![State { gpu: 125, kv_usage: 0.85, ..replica(0) }, replica(1)],
            Some(0),
        ),
        (
            "a holder with a long queue loses to an idle replica",
            vec![State { gpu: 125, queued_tokens: 5_000, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            "with requests waiting everywhere, a miss costs them all: the holder wins despite a longer queue",
            vec![
                State { gpu: 125, waiting: 20, queued_tokens: 20_000, ..replica(0) },
                State { waiting: 20, queued_tokens: 16_000, ..replica(1) },
            ],
            Some(0),
        ),
        (
            "with many requests running, a miss slows every one of them: the holder wins despite a longer queue",
            vec![
                State { gpu: 125, queued_tokens: 2_500, running: 50, ..replica(0) },
                State { running: 50, ..replica(1) },
            ],
            Some(0),
        ),
        (
            "a new prefix goes where running sequences leave more of the pool free",
            vec![
                State { running: 20, kv_usage: 0.8, ..replica(0) },
                State { running: 20, kv_usage: 0.3, ..replica(1) },
            ],
            Some(1),
        ),
        (
            "with nothing running the same miss is cheap: the idle replica wins",
            vec![State { gpu: 125, queued_tokens: 2_500, ..replica(0) }, replica(1)],
            Some(1),
        ),
        (
            "a holder with a short queue still wins",
            vec![State { gpu: 125, queued_tokens: 500, ..replica(0) }, replica(1)],
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
            "a near-tie goes to the lower load",
            vec![State { gpu: 125, running: 5, ..replica(0) }, State { gpu: 125, running: 2, ..replica(1) }],
            Some(1),
        ),
        (
            "outside the tolerance the lower score wins despite load",
            vec![State { gpu: 100, running: 5, ..replica(0) }, State { running: 2, ..replica(1) }],
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
    assert!(decision.candidates[2].over_kv_watermark);
    assert!(decision.candidates[2].prediction.kv_penalty_s > 0.0);
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
    let prediction = predict(&view, found, PROMPT_TOKENS, 0.0, &config);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // 1,000 queued tokens at 10,000 per second, plus one 20 ms decode step.
    assert!(close(prediction.queue_wait_s, 0.1 + 0.02));
    assert!(close(prediction.compute_s, 400.0 / 10_000.0));
    assert!(close(prediction.host_s, 50.0 * BLOCK_BYTES as f64 / 20e9));
    // Reloading 25 blocks at 2 GB/s (26 ms) costs less than recomputing 400 tokens (40 ms).
    assert!(close(prediction.network_s, 25.0 * BLOCK_BYTES as f64 / 2e9));
    let slow = ReplicaView { load: LoadStats { network_bytes_per_second: 1e8, ..view.load.clone() }, ..view };
    assert!(close(predict(&slow, found, PROMPT_TOKENS, 0.0, &config).network_s, 0.04), "recompute when cheaper");
    assert!(close(
        prediction.ttft_s,
        prediction.queue_wait_s + prediction.compute_s + prediction.host_s + prediction.network_s
    ));
}

#[test]
fn congestion_prices_the_work_at_the_fleets_rate_for_everyone_sharing_the_steps() {
    let states = [
        State { waiting: 2, running: 30, ..replica(0) },
        State { waiting: 2, running: 30, prefill_rate: 20_000.0, ..replica(1) },
    ];
    let (views, _) = views(&states);
    let fleet = fleet_prefill_rate(&views);
    assert_eq!(fleet, 15_000.0);
    let config = ScoringConfig::default();
    let found = ReplicaMatch { gpu_blocks: 25, ..ReplicaMatch::default() };
    let slow = predict(&views[0], found, PROMPT_TOKENS, fleet, &config);
    let fast = predict(&views[1], found, PROMPT_TOKENS, fleet, &config);
    // 1,600 unmatched tokens: the replica's own rate for its TTFT...
    assert!((slow.compute_s - 0.16).abs() < 1e-9 && (fast.compute_s - 0.08).abs() < 1e-9);
    // ...the fleet's for what the 32 requests sharing its steps pay, with a tenth of the pool in use.
    let expected = config.congestion_weight * 32.0 / 0.9 * 1_600.0 / 15_000.0;
    assert!((slow.congestion_s - expected).abs() < 1e-9, "{slow:?}");
    assert!((fast.congestion_s - expected).abs() < 1e-9, "{fast:?}");
    let idle = predict(&views[0], found, PROMPT_TOKENS, fleet, &ScoringConfig { congestion_weight: 0.0, ..config });
    assert_eq!(idle.congestion_s, 0.0);
}

#[test]
fn unmeasured_rates_take_the_mean_of_the_measured_replicas() {
    let (mut fleet, _) = views(&[replica(0), State { prefill_rate: 30_000.0, ..replica(1) }, replica(2)]);
    fleet[0].load.decode_step_seconds = 0.04;
    fleet[2].load.prefill_tokens_per_second = 0.0;
    fleet[2].load.decode_step_seconds = 0.0;
    fill_unmeasured_rates(&mut fleet);
    assert_eq!(fleet[2].load.prefill_tokens_per_second, 20_000.0);
    assert!((fleet[2].load.decode_step_seconds - 0.03).abs() < 1e-12);
    assert_eq!(fleet[0].load.prefill_tokens_per_second, 10_000.0, "measured rates stay");
    let (mut nobody, _) = views(&[State { prefill_rate: 0.0, ..replica(0) }]);
    fill_unmeasured_rates(&mut nobody);
    assert_eq!(nobody[0].load.prefill_tokens_per_second, 0.0, "the scoring defaults apply");
}

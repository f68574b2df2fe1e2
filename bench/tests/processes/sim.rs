//! The simulator runs kvroute's own code: a repeated prompt is served from the node-agent engine's
//! prefix cache exactly as the block manager computes it, the gateway's cache-aware policy sends the
//! repeat to the replica whose KV events announced the prefix (round robin does not), runs repeat for a
//! seed, and the command line from the docs works on a Mooncake trace.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;

use kvroute_bench::sim::fleet::DEFAULT_EVENT_LAG;
use kvroute_bench::sim::plan::{OpenRequest, Prompt};
use kvroute_bench::sim::{CostProfile, Fleet, FleetConfig, MODEL_ID, Plan, PolicyResult};
use kvroute_gateway::routing::{DEFAULT_PENDING_TTL_MS, PolicyKind, ScoringConfig};
use serde_json::Value;

fn profile() -> CostProfile {
    CostProfile::load("h100-llama3-8b").unwrap()
}

/// The same prompt sent `repeats` times, a second apart (each finishes before the next arrives).
fn repeated(prompt_len: usize, repeats: usize) -> Plan {
    let prompt = Arc::new((0..prompt_len as u32).map(|i| i * 7 % 1000 + 1).collect::<Vec<u32>>());
    let open = (0..repeats)
        .map(|i| OpenRequest { arrival_s: i as f64, prompt: Prompt::Tokens(prompt.clone()), output_tokens: 8 })
        .collect();
    Plan { open, vocab_size: 128_256, ..Plan::default() }
}

fn simulate(plan: &Plan, policy: PolicyKind, replicas: usize) -> PolicyResult {
    let config = FleetConfig {
        replicas,
        profile: profile(),
        policy,
        seed: 7,
        pending_ttl_ms: DEFAULT_PENDING_TTL_MS,
        scoring: ScoringConfig::default(),
        event_lag: DEFAULT_EVENT_LAG,
        record_requests: false,
    };
    Fleet::new(config, plan).unwrap().run()
}

#[test]
fn a_repeated_prompt_hits_the_engine_prefix_cache_on_the_replica_the_index_names() {
    let (prompt_len, repeats) = (1000, 4);
    let plan = repeated(prompt_len, repeats);
    // The engine's block manager reuses whole blocks, and never the prompt's last token.
    let cached_per_repeat = ((prompt_len - 1) / 16 * 16) as f64;
    let expected = cached_per_repeat * (repeats - 1) as f64 / (prompt_len * repeats) as f64;
    let aware = simulate(&plan, PolicyKind::CacheAware, 4);
    assert_eq!(aware.requests, repeats);
    assert!((aware.hit_ratio_gpu - expected).abs() < 1e-9, "{} vs {expected}", aware.hit_ratio_gpu);
    assert!((plan.bound_hit_ratio(16, MODEL_ID) - expected).abs() < 1e-9);
    // Round robin sends each repeat to a replica that has never seen the prompt.
    let rotating = simulate(&plan, PolicyKind::RoundRobin, 4);
    assert_eq!(rotating.hit_ratio, 0.0);
    assert!(aware.ttft_mean_s < rotating.ttft_mean_s, "hits skip prefill: {aware:?} {rotating:?}");
}

#[test]
fn evicted_blocks_come_back_from_host_ram() {
    // A pool of 100 blocks: three 1,000-token prompts in turn evict each other, and the host tier keeps them.
    let mut small = profile();
    small.kv_pool_bytes = 100.0 * small.block_bytes();
    let prompts: Vec<Arc<Vec<u32>>> =
        (0..3u32).map(|p| Arc::new((0..1000u32).map(|i| (i * 13 + p * 100_003) % 128_000 + 1).collect())).collect();
    let open = (0..6)
        .map(|i| OpenRequest { arrival_s: i as f64, prompt: Prompt::Tokens(prompts[i % 3].clone()), output_tokens: 4 })
        .collect();
    let plan = Plan { open, vocab_size: 128_256, ..Plan::default() };
    let config = FleetConfig {
        replicas: 1,
        profile: small.clone(),
        policy: PolicyKind::CacheAware,
        seed: 1,
        pending_ttl_ms: DEFAULT_PENDING_TTL_MS,
        scoring: ScoringConfig::default(),
        event_lag: DEFAULT_EVENT_LAG,
        record_requests: false,
    };
    let result = Fleet::new(config.clone(), &plan).unwrap().run();
    assert_eq!(result.hit_ratio_gpu, 0.0, "{result:?}");
    assert!(result.hit_ratio_host > 0.4, "{result:?}");
    small.host_bytes = 0.0;
    small.network_bytes = 0.0;
    let without = Fleet::new(FleetConfig { profile: small, ..config }, &plan).unwrap().run();
    assert_eq!(without.hit_ratio, 0.0, "{without:?}");
}

#[test]
fn a_run_repeats_for_its_seed() {
    let plan = Plan::from_workload(
        kvroute_bench::workload::WorkloadKind::Chat,
        &kvroute_bench::workload::WorkloadConfig { sessions: 12, turns: 3, ..Default::default() },
        1.0,
    );
    for policy in [PolicyKind::CacheAware, PolicyKind::Random] {
        let first = simulate(&plan, policy, 3);
        let again = simulate(&plan, policy, 3);
        assert_eq!(first, again);
        assert_eq!(first.requests, 36);
        // Turn 2 resends turn 1 and its reply: chat reuses most of its prompt tokens.
        if policy == PolicyKind::CacheAware {
            assert!(first.hit_ratio > 0.5, "{first:?}");
        }
    }
}

#[test]
fn the_documented_command_line_reports_every_policy() {
    let trace: String = std::fs::read_to_string(
        kvroute_test_support::repo_root().join("bench/testdata/mooncake_conversation_trace.jsonl"),
    )
    .unwrap()
    .lines()
    .take(150)
    .map(|line| format!("{line}\n"))
    .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), trace).unwrap();
    let plots = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .arg("--trace")
        .arg(file.path())
        .args(["--replicas", "8", "--policy", "all", "--profile", "h100-llama3-8b", "--rate-scale", "4", "--json"])
        .arg("--plot")
        .arg(plots.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let bound = report["bound_hit_ratio"].as_f64().unwrap();
    assert!(bound > 0.0 && bound < 1.0);
    let results = report["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, PolicyKind::names());
    for result in results {
        // At four times the trace's rate, replicas refuse what would wait past the agent's queue-delay limit.
        let served = result["requests"].as_u64().unwrap() + result["rejected"].as_u64().unwrap();
        assert_eq!(served, 150, "{result}");
        for key in ["hit_ratio", "hit_ratio_gpu", "hit_ratio_host", "hit_ratio_network", "ttft_mean_s", "ttft_p50_s"] {
            assert!(result[key].is_f64(), "{key} in {result}");
        }
        for key in ["ttft_p90_s", "ttft_p99_s", "e2e_p50_s", "output_tokens_per_s", "load_imbalance", "preemptions"] {
            assert!(result[key].is_number(), "{key} in {result}");
        }
        assert!(result["hit_ratio"].as_f64().unwrap() <= bound + 1e-9, "no policy beats one infinite cache: {result}");
    }
    for chart in ["ttft_cdf.svg", "hit_ratio.svg"] {
        let svg = std::fs::read_to_string(plots.path().join(chart)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("cache_aware"), "{chart}");
    }
    // Bad input: a clear error, not a panic.
    let bad = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["--workload", "chat", "--policy", "fastest"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown policy"));
}

//! Replica identity survives churn. A gateway discovers its replicas from an agents file that cycles
//! through over 300 distinct endpoints (TCP forwarders on fresh ports, half of them to one real agent that
//! holds a known prompt, half to another that does not), with room for only 16 replicas at once. Every live
//! replica keeps being indexed (and never with another replica's blocks) and routed to, a removed replica's
//! series disappear, and the gateway's memory stays flat. Discovery by DNS name finds an agent too.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kvroute_test_support::api::{debug_route, gpu_blocks_by_replica};
use kvroute_test_support::forwarder::Forwarder;
use kvroute_test_support::services::{AgentProcess, GatewayProcess, metric_series};
use kvroute_test_support::{http_request, wait_until};
use serde_json::json;

const ADMIN_KEY: &str = "churn-admin-key";
/// Replicas live at once, and replaced per round.
const LIVE: usize = 6;
const REPLACED: usize = 3;
const ROUNDS: usize = 100;

fn write_agents(path: &Path, live: &VecDeque<Forwarder>) {
    let text: String = live.iter().map(|forwarder| format!("{}\n", forwarder.addr)).collect();
    let staged = path.with_extension("new");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// `replica="ENDPOINT"` -> value, for one per-replica series.
fn per_replica(gateway: SocketAddr, name: &str) -> BTreeMap<String, f64> {
    metric_series(gateway, name)
        .into_iter()
        .filter_map(|(labels, value)| {
            let endpoint = labels.strip_prefix("replica=\"")?.strip_suffix('"')?;
            Some((endpoint.to_string(), value))
        })
        .collect()
}

fn complete(gateway: SocketAddr, prompt: &[u32]) {
    let body = serde_json::json!({ "prompt": prompt, "max_tokens": 1 }).to_string();
    let response =
        http_request(gateway, "POST", "/v1/completions", &[("Content-Type", "application/json")], body.as_bytes())
            .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn three_hundred_endpoints_over_time_keep_every_live_replica_indexed_and_routed() {
    let _serial = crate::serial();
    let agent = |id: &str| AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "256", "--agent-id", id]);
    let (holder, other) = (agent("holder"), agent("other"));
    let dir = tempfile::tempdir().unwrap();
    let agents_file = dir.path().join("agents");
    let mut live: VecDeque<Forwarder> = VecDeque::from([Forwarder::start(holder.grpc)]);
    write_agents(&agents_file, &live);
    let file = agents_file.to_str().unwrap();
    let gateway = GatewayProcess::spawn(
        &[],
        &[
            "--agents-file",
            file,
            "--dns-interval-secs",
            "0.05",
            "--index-max-replicas",
            "16",
            "--policy",
            "round_robin",
            "--admin-api-key",
            ADMIN_KEY,
        ],
    );
    gateway.wait_healthy(1, Duration::from_secs(60)).unwrap();
    let http = gateway.http;
    // The holder computes a known prompt of 4 blocks; the other agent never sees it.
    let known: Vec<u32> = (100..164).collect();
    complete(http, &known);

    let mut distinct: BTreeSet<SocketAddr> = live.iter().map(|forwarder| forwarder.addr).collect();
    let mut baseline_kib = None;
    for round in 0..ROUNDS {
        for new in 0..REPLACED {
            let target = if (round * REPLACED + new).is_multiple_of(2) { holder.grpc } else { other.grpc };
            let forwarder = Forwarder::start(target);
            distinct.insert(forwarder.addr);
            live.push_back(forwarder);
        }
        while live.len() > LIVE {
            live.pop_front();
        }
        write_agents(&agents_file, &live);
        let expected: BTreeSet<String> = live.iter().map(|forwarder| forwarder.addr.to_string()).collect();
        wait_until(&format!("round {round}: exactly the live replicas, all healthy"), Duration::from_secs(30), || {
            let healthy = per_replica(http, "kvroute_gateway_replica_healthy");
            let known: BTreeSet<String> = healthy.keys().cloned().collect();
            if known == expected && healthy.values().all(|&value| value == 1.0) {
                Ok(())
            } else {
                Err(format!("{healthy:?}"))
            }
        })
        .unwrap();

        // Indexed, each with its own agent's blocks: a reused id never carries an old replica's.
        let gpu_blocks = gpu_blocks_by_replica(&debug_route(http, ADMIN_KEY, &json!({ "prompt": known })));
        for forwarder in &live {
            let expected_blocks = if forwarder.target == holder.grpc { 4 } else { 0 };
            assert_eq!(
                gpu_blocks.get(&forwarder.addr.to_string()),
                Some(&expected_blocks),
                "round {round}: {gpu_blocks:?}"
            );
        }

        // Routed: one round of round-robin reaches every live replica once.
        let before = per_replica(http, "kvroute_gateway_replica_routed_requests_total");
        for request in 0..live.len() as u32 {
            complete(http, &[7, 8, 9, (round as u32) * 10 + request]);
        }
        let after = per_replica(http, "kvroute_gateway_replica_routed_requests_total");
        for endpoint in &expected {
            let routed = after[endpoint] - before.get(endpoint).copied().unwrap_or(0.0);
            assert_eq!(routed, 1.0, "round {round}: {endpoint} got {routed} requests: {before:?} -> {after:?}");
        }
        if round == ROUNDS / 4 {
            baseline_kib = Some(resident_kib(gateway.process.id()));
        }
    }
    assert!(distinct.len() >= 300, "{} endpoints", distinct.len());
    let (baseline, end) = (baseline_kib.unwrap(), resident_kib(gateway.process.id()));
    println!("gateway resident memory: {baseline} KiB after {} rounds, {end} KiB after {ROUNDS}", ROUNDS / 4);
    assert!(end < baseline + 16 * 1024, "the gateway grew from {baseline} KiB to {end} KiB");
}

#[test]
fn discovery_by_dns_name_finds_an_agent() {
    let agent = AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "64"]);
    let target = format!("localhost:{}", agent.grpc.port());
    let gateway = GatewayProcess::spawn(&[], &["--agents-dns", &target, "--dns-interval-secs", "0.05"]);
    // `localhost` may also name ::1, where nothing listens: one healthy replica is the agent.
    gateway.wait_healthy(1, Duration::from_secs(30)).unwrap();
    complete(gateway.http, &[1, 2, 3]);
}

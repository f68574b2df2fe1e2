//! The monitoring files against live services: a real node-agent (tiny-random, a small KV pool, a
//! host-RAM tier and a real Redis tier) and a real gateway on free loopback ports get traffic that
//! exercises every dashboard panel (cache hits, evictions, spills to and reloads from Redis,
//! write-through, a prefix-cache diagnosis: prompts varying near the top). Then every `kvroute_*` series name used in
//! `deploy/grafana/kvroute-dashboard.json` and `deploy/prometheus/alerts.yml` must appear in the
//! `/metrics` of the service it belongs to, and both `/metrics` bodies must pass
//! `promtool check metrics`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kvroute_test_support::services::{AgentProcess, GatewayProcess, PATIENCE};
use kvroute_test_support::{RedisServer, http_request, repo_root, wait_until};
use serde_json::json;

use crate::serial;

const MONITORING_FILES: [&str; 2] = ["deploy/grafana/kvroute-dashboard.json", "deploy/prometheus/alerts.yml"];

struct Services {
    _serial: std::sync::MutexGuard<'static, ()>,
    _redis: RedisServer,
    agent: AgentProcess,
    _gateway: GatewayProcess,
    http: SocketAddr,
    agent_metrics: SocketAddr,
}

/// Redis, one agent whose pool (24 blocks) and host tier (64 KiB, a few blocks) overflow quickly, a gateway.
fn start() -> Services {
    let serial = serial();
    let redis = RedisServer::start();
    let agent = AgentProcess::start_tiered(&redis.url(), "agent-0", &[]);
    let gateway = GatewayProcess::start(&[agent.grpc], &[]);
    let (http, agent_metrics) = (gateway.http, agent.metrics);
    Services { _serial: serial, _redis: redis, agent, _gateway: gateway, http, agent_metrics }
}

fn complete(services: &Services, prompt: &str) {
    let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0}).to_string();
    let response = http_request(
        services.http,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Prompts of `drive_traffic` with a ticket number at the top: enough for the doctor to diagnose it.
const TICKETS: usize = 8;

/// Requests `drive_traffic` sends.
const REQUESTS: usize = 3 + TICKETS + 1;

/// Traffic that makes every metric of the monitoring files appear.
fn drive_traffic(services: &Services) {
    let shared = "You are a careful assistant for accounting. ".repeat(14);
    // Repeats: prefix-cache hits, and hot blocks written through to Redis.
    for _ in 0..3 {
        complete(services, &shared);
    }
    // Prompts that differ at their first block while the rest recurs (the prefix-cache doctor diagnoses
    // content varying near the top) and overflow the pool and host RAM.
    for ticket in 0..TICKETS {
        complete(services, &format!("Ticket {ticket}: {}", "rivers and lakes of the northern region. ".repeat(12)));
    }
    // Spills reach Redis: the agent's write queue is empty and it has stored at least the hot blocks it
    // sent to the network tier first.
    wait_until("the spilled blocks in Redis", PATIENCE, || {
        let agent = &services.agent;
        let queued = agent.metric("kvroute_agent_tier_queue_depth{tier=\"network\"}");
        let stored = agent.metric("kvroute_agent_tier_stored_blocks_total{tier=\"network\"}");
        let written_through = agent.metric("kvroute_agent_write_through_blocks_total");
        if queued == 0.0 && written_through > 0.0 && stored >= written_through {
            Ok(stored)
        } else {
            Err(format!("{queued} queued, {stored} stored, {written_through} written through"))
        }
    })
    .unwrap();
    // The shared prefix left the pool: reloaded from a lower tier.
    complete(services, &shared);
}

fn scrape(addr: SocketAddr) -> String {
    let response = http_request(addr, "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(response.status, 200, "GET /metrics on {addr}");
    response.text()
}

/// Series names in a Prometheus text exposition (`name{labels} value` or `name value`).
fn series_names(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Every `kvroute_*` name a monitoring file uses, with the file.
fn referenced_names() -> Vec<(String, &'static str)> {
    let mut names = BTreeSet::new();
    for file in MONITORING_FILES {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        for (start, _) in text.match_indices("kvroute_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert((name, file));
        }
    }
    names.into_iter().collect()
}

/// Names used in the monitoring files that the service they belong to does not export.
fn missing(gateway: &BTreeSet<String>, agent: &BTreeSet<String>) -> Vec<String> {
    referenced_names()
        .into_iter()
        .filter(|(name, _)| {
            let exported = if name.starts_with("kvroute_gateway_") { gateway } else { agent };
            !exported.contains(name)
        })
        .map(|(name, file)| format!("{name} (in {file})"))
        .collect()
}

#[test]
fn monitoring_files_use_only_exported_series() {
    let referenced = referenced_names();
    assert!(referenced.iter().any(|(name, _)| name.starts_with("kvroute_gateway_")), "no gateway metric is used");
    assert!(referenced.iter().any(|(name, _)| name.starts_with("kvroute_agent_")), "no agent metric is used");
    let services = start();
    drive_traffic(&services);
    // Agents publish their engine's state at heartbeats: wait until the series are there.
    wait_until("every series the monitoring files use", Duration::from_secs(20), || {
        let gateway = series_names(&scrape(services.http));
        let agent = series_names(&scrape(services.agent_metrics));
        let missing = missing(&gateway, &agent);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "series used by the monitoring files but not exported:\n  {}\ngateway exports: {gateway:?}\nagent exports: {agent:?}",
                missing.join("\n  ")
            ))
        }
    })
    .unwrap_or_else(|message| panic!("{message}"));
}

/// `promtool`: `$PROMTOOL`, then `PATH`, then the Debian path.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .chain([PathBuf::from("/usr/bin/promtool")])
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool is not installed: this test checks /metrics with it. Install it with \
                 `apt-get install -y --no-install-recommends prometheus` (or run scripts/tools/promtool.sh, \
                 which does), or set PROMTOOL=/path/to/promtool"
            )
        })
}

fn promtool_check_metrics(promtool: &PathBuf, body: &str) -> Result<(), String> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)))
    }
}

#[test]
fn both_metrics_endpoints_pass_promtool_check_metrics() {
    let promtool = promtool();
    let services = start();
    drive_traffic(&services);
    // The agent publishes its engine's state after steps: wait until it counts every request finished.
    services.agent.wait_finished(REQUESTS).unwrap();
    let mut failures = Vec::new();
    for (service, addr) in [("gateway", services.http), ("node-agent", services.agent_metrics)] {
        let body = scrape(addr);
        assert!(body.contains("kvroute_"), "{service} /metrics has no kvroute series");
        if let Err(problems) = promtool_check_metrics(&promtool, &body) {
            failures.push(format!("{service} /metrics:\n{problems}"));
        }
    }
    assert!(failures.is_empty(), "promtool check metrics failed:\n{}", failures.join("\n"));
}

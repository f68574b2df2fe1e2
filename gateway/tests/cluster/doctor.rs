//! The prefix-cache doctor over real processes: two tiny-random node-agents and a gateway on loopback, driven
//! by `kvroute-load` with the workloads that reproduce each cause of a cold prefix cache (one session at a
//! time, so the requests arrive in a fixed order). Each is diagnosed as its cause in `/debug/prefix-report`
//! within the requests the test sends, with the right evidence (where prompts part, the differing text, the
//! variants' shares), and the ordinary workloads raise nothing. Every check first waits until the report has
//! seen every request the test sent and every reply finish.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use kvroute_test_support::services::{AgentProcess, GatewayProcess, PATIENCE, metric_series};
use kvroute_test_support::{http_request, project_binary, wait_until};
use serde_json::Value;

use crate::serial;

const ADMIN_KEY: &str = "sk-doctor-admin";

struct Cluster {
    _serial: std::sync::MutexGuard<'static, ()>,
    _agents: Vec<AgentProcess>,
    gateway: GatewayProcess,
    _logs: tempfile::TempDir,
    log: std::path::PathBuf,
}

/// Two agents and a gateway (with `gateway_args`) logging to a file of the cluster's.
fn start(gateway_args: &[&str]) -> Cluster {
    let serial = serial();
    let agents: Vec<AgentProcess> = (0..2)
        .map(|i| {
            AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "512", "--agent-id", &format!("agent-{i}")])
        })
        .collect();
    let grpcs: Vec<SocketAddr> = agents.iter().map(|agent| agent.grpc).collect();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("gateway.log");
    let args = [&["--admin-api-key", ADMIN_KEY], gateway_args].concat();
    let gateway = GatewayProcess::start_logging(&grpcs, &args, &log, "info");
    Cluster { _serial: serial, _agents: agents, gateway, _logs: logs, log }
}

/// Runs `kvroute-load --workload WORKLOAD` against the gateway, one session at a time; returns its report
/// after checking that every request succeeded.
fn load(http: SocketAddr, workload: &str, sessions: usize, turns: usize, api_key: Option<&str>) -> Value {
    let mut command = Command::new(project_binary("kvroute-bench", "kvroute-load"));
    command.args(["--url", &format!("http://{http}"), "--json", "--workload", workload, "--concurrency", "1"]);
    command.args(["--sessions", &sessions.to_string(), "--turns", &turns.to_string()]);
    // A short think time: timestamp-top stamps each turn with its own time.
    command.args(["--think-ms", "20", "--max-tokens", "4", "--seed", "7"]);
    if let Some(key) = api_key {
        command.args(["--api-key", key]);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "kvroute-load: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["succeeded"], report["requests"], "{workload}: {report}");
    report
}

fn get(http: SocketAddr, path: &str, key: Option<&str>) -> (u16, String, Option<String>) {
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|value| ("Authorization", value.as_str())).collect();
    let response = http_request(http, "GET", path, &headers, b"").unwrap();
    let content_type = response.header("content-type").map(str::to_string);
    (response.status, response.text(), content_type)
}

/// The report (JSON) with `query`.
fn fetch(http: SocketAddr, query: &str) -> Value {
    let (status, body, _) = get(http, &format!("/debug/prefix-report{query}"), Some(ADMIN_KEY));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until the report has observed `requests` prompts and seen their replies finish; returns it.
fn report_after(http: SocketAddr, requests: u64) -> Value {
    wait_until(&format!("the report to count {requests} requests"), PATIENCE, || {
        let report = fetch(http, "");
        let (observed, finished) = (report["observed_requests"].as_u64(), report["finished_requests"].as_u64());
        if observed == Some(requests) && finished == Some(requests) {
            Ok(report)
        } else {
            Err(format!("{observed:?} observed, {finished:?} finished"))
        }
    })
    .unwrap()
}

/// The tenant's entry of a report.
fn tenant<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["tenants"].as_array().unwrap().iter().find(|tenant| tenant["tenant"] == name).unwrap()
}

/// The kinds of a tenant's raised diagnoses.
fn kinds(tenant: &Value) -> Vec<String> {
    tenant["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|diagnosis| diagnosis["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The one diagnosis of the open gateway's tenant, which must be `kind`.
fn only_diagnosis(report: &Value, kind: &str) -> Value {
    let anonymous = tenant(report, "anonymous");
    assert_eq!(kinds(anonymous), [kind], "{report:#}");
    assert_eq!(anonymous["status"], "diagnosed");
    assert_eq!(report["active_diagnoses"][kind], 1, "{report:#}");
    anonymous["diagnoses"][0].clone()
}

/// The gateway's series of `name`, by their labels.
fn series(http: SocketAddr, name: &str) -> Vec<(String, f64)> {
    metric_series(http, name)
}

/// Log lines announcing a raised diagnosis.
fn raised_lines(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter(|line| line.contains("prefix-cache diagnosis:")).map(str::to_string).collect()
}

#[test]
fn timestamp_top_is_diagnosed_as_varying_content_at_block_0_with_the_time_shown() {
    let cluster = start(&[]);
    let http = cluster.gateway.http;
    // Twelve requests: six conversations of two turns, each prompt with a new time at the top.
    let sent = load(http, "timestamp-top", 6, 2, None)["requests"].as_u64().unwrap();
    assert_eq!(sent, 12);
    let report = report_after(http, sent);
    let diagnosis = only_diagnosis(&report, "varying_top");
    assert_eq!(diagnosis["block"], 0, "{diagnosis:#}");
    let example = &diagnosis["evidence"]["examples"][0];
    assert!(example["context"].as_str().unwrap().contains("Current time"), "{example}");
    for side in ["current", "previous"] {
        let text = example[side].as_str().unwrap();
        assert!(!text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || ":.".contains(c)), "{side}: {example}");
    }
    assert_ne!(example["current"], example["previous"]);
    assert!(diagnosis["evidence"]["recurring_tokens"].as_u64().unwrap() > 300, "the system prompt recurs: {diagnosis}");
    // Nearly nothing repeats, and the histogram has every request leaving at block 0.
    let traffic = &tenant(&report, "anonymous")["traffic"];
    assert!(traffic["repeated_prefix_ratio"].as_f64().unwrap() < 0.1, "{traffic}");
    assert_eq!(traffic["divergence"][0]["requests"], 12, "{traffic}");

    // Redacted: lengths and digests, never the time.
    let redacted = fetch(http, "?redact=true");
    let example = &only_diagnosis(&redacted, "varying_top")["evidence"]["examples"][0];
    assert!(example["current"].as_str().unwrap().starts_with('[') && !example.to_string().contains("Current time"));
    // Text, for a terminal.
    let (status, text, content_type) = get(http, "/debug/prefix-report?format=text", Some(ADMIN_KEY));
    assert_eq!(status, 200);
    assert!(content_type.is_some_and(|value| value.starts_with("text/plain")));
    assert!(text.contains("tenant anonymous: diagnosed") && text.contains("! varying_top at block 0"), "{text}");

    // Metrics: raised once, one tenant has it, and the churn counter counts the prompts since.
    assert_eq!(series(http, "kvroute_gateway_prefix_diagnoses_total"), [("kind=\"varying_top\"".into(), 1.0)]);
    let active = series(http, "kvroute_gateway_prefix_diagnoses_active");
    assert!(active.contains(&("kind=\"varying_top\"".into(), 1.0)) && active.iter().map(|s| s.1).sum::<f64>() == 1.0);
    assert!(cluster.gateway.metric("kvroute_gateway_prefix_churn_total") >= 1.0);
    // One log line for the new diagnosis, without the prompt's text.
    let lines = raised_lines(&cluster.log);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("varying_top") && !lines[0].contains("Harbourline"), "{}", lines[0]);
}

#[test]
fn shuffled_tools_are_diagnosed_as_unstable_ordering_unless_the_gateway_sorts_them() {
    let cluster = start(&["--tool-order", "as-sent"]);
    let http = cluster.gateway.http;
    let sent = load(http, "shuffled-tools", 6, 2, None)["requests"].as_u64().unwrap();
    let report = report_after(http, sent);
    let diagnosis = only_diagnosis(&report, "unstable_order");
    let evidence = &diagnosis["evidence"];
    assert!(evidence["reordered_tokens"].as_u64().unwrap() > 300, "the tools: {evidence}");
    let example = &evidence["examples"][0];
    assert_ne!(example["current"], example["previous"], "{example}");
    // The tools come after the system prompt (hundreds of tokens).
    assert!(diagnosis["block"].as_u64().unwrap() >= 20, "{diagnosis}");
    assert_eq!(raised_lines(&cluster.log).len(), 1);

    // The same requests through a gateway that sorts tools (the default): nothing to diagnose.
    let agents: Vec<SocketAddr> = cluster._agents.iter().map(|agent| agent.grpc).collect();
    let sorting = GatewayProcess::start(&agents, &["--admin-api-key", ADMIN_KEY]);
    let sent = load(sorting.http, "shuffled-tools", 6, 2, None)["requests"].as_u64().unwrap();
    let report = report_after(sorting.http, sent);
    assert!(kinds(tenant(&report, "anonymous")).is_empty(), "{report:#}");
}

#[test]
fn a_prompt_changed_mid_run_is_diagnosed_as_a_change_with_the_changed_word() {
    let cluster = start(&[]);
    let http = cluster.gateway.http;
    // Sixteen conversations of two turns; the last eight have one word of the system prompt changed.
    let sent = load(http, "prompt-change", 16, 2, None)["requests"].as_u64().unwrap();
    let report = report_after(http, sent);
    let diagnosis = only_diagnosis(&report, "prompt_changed");
    let evidence = &diagnosis["evidence"];
    assert_eq!(evidence["change"]["new"].as_str().map(str::trim), Some("revised"), "{evidence}");
    assert!(!evidence["change"]["old"].as_str().unwrap().contains("revised"), "{evidence}");
    assert_eq!(evidence["old_prompts"], 16, "{evidence}");
    assert_eq!(evidence["new_prompts"], 16, "{evidence}");
    // The first request of the new prompt found it cold; a later one found it cached.
    assert!(evidence["cold_requests"].as_u64().unwrap() >= 1, "{evidence}");
    assert!(evidence["warm_after_seconds"].is_number(), "{evidence}");
}

#[test]
fn an_ab_split_is_diagnosed_as_two_variants_with_their_shares() {
    let cluster = start(&[]);
    let http = cluster.gateway.http;
    let sent = load(http, "ab-split", 16, 2, None)["requests"].as_u64().unwrap();
    let report = report_after(http, sent);
    let diagnosis = only_diagnosis(&report, "variants");
    let variants = diagnosis["evidence"]["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2, "{diagnosis:#}");
    let shares: Vec<f64> = variants.iter().map(|variant| variant["share"].as_f64().unwrap()).collect();
    assert!(shares.iter().all(|share| (0.2..=0.8).contains(share)) && (shares[0] + shares[1] - 1.0).abs() < 1e-3);
    let prompts: u64 = variants.iter().map(|variant| variant["prompts"].as_u64().unwrap()).sum();
    assert_eq!(prompts, 32, "every request is on one of them: {diagnosis:#}");
    let texts: Vec<&str> = variants.iter().map(|variant| variant["text"].as_str().unwrap()).collect();
    assert!(texts.iter().any(|text| text.contains("Keep every answer")), "B's extra sentence: {texts:?}");
}

#[test]
fn per_user_content_is_diagnosed_as_personalised_not_as_varying_content() {
    let cluster = start(&[]);
    let http = cluster.gateway.http;
    // Twelve conversations of two turns from six users, two each; the profile follows the first sentence.
    let sent = load(http, "personalised", 12, 2, None)["requests"].as_u64().unwrap();
    let report = report_after(http, sent);
    let diagnosis = only_diagnosis(&report, "personalised");
    let evidence = &diagnosis["evidence"];
    assert!(evidence["users"].as_u64().unwrap() >= 3, "{evidence}");
    let example = &evidence["examples"][0];
    assert!(example["context"].as_str().unwrap().contains("helping"), "{example}");
    assert!(example["user"].as_str().unwrap().contains("customer"), "{example}");
    assert!(example["other_user"].as_str().unwrap().contains("customer"), "{example}");
    assert_ne!(example["user"], example["other_user"]);
    let shared = evidence["same_user_shared_tokens"].as_u64().unwrap();
    assert!(shared > 300 && shared > diagnosis["token"].as_u64().unwrap(), "{evidence}");
}

#[test]
fn ordinary_chat_agent_rag_and_fewshot_traffic_raises_nothing() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    let workloads = ["chat", "agent", "rag", "fewshot"];
    let lines: String = workloads.iter().map(|name| format!("sk-{name}-key {name}\n")).collect();
    std::fs::write(keys.path(), lines).unwrap();
    // Only `chat` gets metrics with its tenant label.
    let cluster = start(&["--api-keys", keys.path().to_str().unwrap(), "--doctor-tenant-metrics", "chat"]);
    let http = cluster.gateway.http;
    let mut sent = 0;
    for workload in workloads {
        let key = format!("sk-{workload}-key");
        sent += load(http, workload, 12, 3, Some(&key))["requests"].as_u64().unwrap();
    }
    assert_eq!(sent, 12 * 3 * 2 + 12 * 2);
    let report = report_after(http, sent);
    for workload in workloads {
        let entry = tenant(&report, workload);
        assert_eq!((entry["status"].as_str(), kinds(entry)), (Some("healthy"), Vec::new()), "{workload}: {entry:#}");
    }
    assert!(report["active_diagnoses"].as_object().unwrap().values().all(|count| count == 0), "{report:#}");
    assert!(series(http, "kvroute_gateway_prefix_diagnoses_total").is_empty());
    let labelled = series(http, "kvroute_gateway_tenant_prefix_ceiling_ratio");
    assert_eq!(labelled.iter().map(|(labels, _)| labels.as_str()).collect::<Vec<_>>(), ["tenant=\"chat\""]);
    assert!(labelled[0].1 > 0.5, "{labelled:?}");
    let active = series(http, "kvroute_gateway_tenant_prefix_diagnoses_active");
    assert_eq!(active.len(), 5, "one series a kind, chat's: {active:?}");
    assert!(active.iter().all(|(labels, value)| labels.contains("tenant=\"chat\"") && *value == 0.0), "{active:?}");
    assert!(raised_lines(&cluster.log).is_empty());
    // What the healthy traffic looks like: chat repeats most of its prompts, and the replicas found most.
    let chat = &tenant(&report, "chat")["traffic"];
    assert!(chat["repeated_prefix_ratio"].as_f64().unwrap() > 0.5, "{chat}");
    assert!(chat["hit_ratio"]["reported"].as_f64().unwrap() > 0.3, "{chat}");
    let requests: u64 =
        chat["divergence"].as_array().unwrap().iter().map(|bucket| bucket["requests"].as_u64().unwrap()).sum();
    assert_eq!(requests, 36, "{chat}");
}

#[test]
fn the_report_needs_the_admin_key_and_refuses_bad_queries_with_json_errors() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "sk-acme-key acme\n").unwrap();
    let cluster = start(&["--api-keys", keys.path().to_str().unwrap()]);
    let http = cluster.gateway.http;
    let error = |path: &str, key: Option<&str>| -> (u16, Value) {
        let (status, body, _) = get(http, path, key);
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    };
    for (key, status, kind) in [
        (None, 401, "authentication_error"),
        (Some("sk-acme-key"), 403, "permission_error"),
        (Some("sk-nobody"), 401, "authentication_error"),
    ] {
        let (got, body) = error("/debug/prefix-report", key);
        assert_eq!((got, body["error"]["type"].as_str()), (status, Some(kind)), "{key:?}: {body}");
    }
    for (query, param) in [("format=xml", "format"), ("redact=maybe", "redact"), ("tenant=", "tenant")] {
        let (status, body) = error(&format!("/debug/prefix-report?{query}"), Some(ADMIN_KEY));
        assert_eq!((status, body["error"]["param"].as_str()), (400, Some(param)), "{query}: {body}");
    }
    let (status, body) = error("/debug/prefix-report?verbose=1", Some(ADMIN_KEY));
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{body}");
    let (status, body) = error("/debug/prefix-report?tenant=globex", Some(ADMIN_KEY));
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_tenant")), "{body}");
    // Before any traffic: nothing observed, nothing diagnosed; after one request, its tenant is known.
    let empty = fetch(http, "");
    assert_eq!((empty["observed_requests"].as_u64(), empty["tenants"].as_array().map(Vec::len)), (Some(0), Some(0)));
    let sent = load(http, "chat", 1, 1, Some("sk-acme-key"))["requests"].as_u64().unwrap();
    let one = report_after(http, sent);
    assert_eq!(tenant(&one, "acme")["traffic"]["requests"], 1);
    assert_eq!(fetch(http, "?tenant=acme")["tenants"].as_array().map(Vec::len), Some(1));
    // A gateway without an admin key has the report off.
    let agents: Vec<SocketAddr> = cluster._agents.iter().map(|agent| agent.grpc).collect();
    let without = GatewayProcess::start(&agents, &[]);
    let (status, body, _) = get(without.http, "/debug/prefix-report", Some(ADMIN_KEY));
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("KVROUTE_ADMIN_API_KEY"), "{body}");
}

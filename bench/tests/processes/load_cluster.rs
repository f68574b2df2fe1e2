//! kvroute-load against a real gateway in front of a real node-agent, over loopback: a chat workload and a
//! trace replay complete without errors, and the multi-turn chat reports cached prompt tokens (each turn
//! resends a history whose prefix the agent already holds); a list of URLs gets the requests in turn.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use kvroute_test_support::project_binary;
use kvroute_test_support::services::{AgentProcess, GatewayProcess, metric_series};
use serde_json::Value;

#[test]
fn chat_and_trace_runs_report_what_they_measured() {
    let agent = AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "1024"]);
    let gateway = GatewayProcess::start(&[agent.grpc], &[]);
    let http = gateway.http;
    let load = project_binary("kvroute-bench", "kvroute-load");
    let run = |args: &[&str]| -> Value {
        let output =
            Command::new(&load).args(["--url", &format!("http://{http}"), "--json"]).args(args).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    };

    let chat = run(&["--workload", "chat", "--sessions", "3", "--turns", "3", "--rate", "20", "--think-ms", "10"]);
    assert_eq!(chat["requests"], 9, "{chat}");
    assert_eq!(chat["succeeded"], 9, "{chat}");
    assert!(chat["errors"].as_object().unwrap().is_empty(), "{chat}");
    assert!(chat["cached_fraction"].as_f64().unwrap() > 0.3, "turns resend a cached history: {chat}");
    assert!(chat["ttft"]["p50_ms"].as_f64().unwrap() > 0.0);
    assert!(chat["output_tokens_per_second"].as_f64().unwrap() > 0.0);

    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/mooncake_conversation_trace.jsonl");
    let replay = run(&[
        "--trace",
        trace.to_str().unwrap(),
        "--max-requests",
        "6",
        "--time-scale",
        "0",
        "--length-scale",
        "0.02",
        "--vocab-size",
        "50000",
        "--concurrency",
        "2",
    ]);
    assert_eq!(replay["requests"], 6, "{replay}");
    assert_eq!(replay["succeeded"], 6, "{replay}");
    // Every trace request starts with the shared system unit: later ones find its blocks cached.
    assert!(replay["cached_tokens"].as_u64().unwrap() > 0, "{replay}");
}

#[test]
fn a_url_list_sends_the_requests_to_each_in_turn() {
    let agent = AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "1024"]);
    let gateways = [GatewayProcess::start(&[agent.grpc], &[]), GatewayProcess::start(&[agent.grpc], &[])];
    let urls = format!("http://{},http://{}", gateways[0].http, gateways[1].http);
    let load = project_binary("kvroute-bench", "kvroute-load");
    let args = ["--workload", "chat", "--sessions", "3", "--turns", "2", "--rate", "20", "--think-ms", "10", "--json"];
    let output = Command::new(&load).args(["--url", &urls]).args(args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["succeeded"], 6, "{report}");
    let chats = |gateway: &GatewayProcess| -> f64 {
        metric_series(gateway.http, "kvroute_gateway_requests_total")
            .iter()
            .filter(|(labels, _)| labels.contains("route=\"chat_completions\""))
            .map(|(_, value)| value)
            .sum()
    };
    assert_eq!((chats(&gateways[0]), chats(&gateways[1])), (3.0, 3.0));
}

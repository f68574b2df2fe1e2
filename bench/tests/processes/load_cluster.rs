//! kvroute-load against a real gateway in front of a real node-agent, over loopback: a chat workload and a
//! trace replay complete without errors, and the multi-turn chat reports cached prompt tokens (each turn
//! resends a history whose prefix the agent already holds), and `--requests-out` writes one record per request
//! that adds up to the report; a list of URLs gets the requests in turn.

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

    let records_file = std::env::temp_dir().join(format!("kvroute-load-requests-{}.jsonl", std::process::id()));
    let records_path = records_file.to_str().unwrap();
    let chat = run(&[
        "--workload",
        "chat",
        "--sessions",
        "3",
        "--turns",
        "3",
        "--rate",
        "20",
        "--think-ms",
        "10",
        "--requests-out",
        records_path,
    ]);
    assert_eq!(chat["requests"], 9, "{chat}");
    assert_eq!(chat["succeeded"], 9, "{chat}");
    assert!(chat["errors"].as_object().unwrap().is_empty(), "{chat}");
    assert!(chat["cached_fraction"].as_f64().unwrap() > 0.3, "turns resend a cached history: {chat}");
    assert!(chat["ttft"]["p50_ms"].as_f64().unwrap() > 0.0);
    assert!(chat["output_tokens_per_second"].as_f64().unwrap() > 0.0);

    let text = std::fs::read_to_string(&records_file).unwrap();
    let _ = std::fs::remove_file(&records_file);
    let records: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 9, "{text}");
    let mut names: Vec<&str> = records.iter().map(|record| record["request"].as_str().unwrap()).collect();
    names.sort_unstable();
    let expected: Vec<String> = (0..3).flat_map(|s| (0..3).map(move |t| format!("s{s}t{t}"))).collect();
    assert_eq!(names, expected, "every turn of every session, once");
    let sum = |key: &str| records.iter().map(|record| record[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("prompt_tokens"), chat["prompt_tokens"].as_u64().unwrap(), "{text}");
    assert_eq!(sum("cached_tokens"), chat["cached_tokens"].as_u64().unwrap(), "{text}");
    for session in 0..3 {
        // A session's turns are sent one after another, each after the previous reply ended.
        let turn = |t: usize| records.iter().find(|r| r["request"] == format!("s{session}t{t}")).unwrap();
        for t in 1..3 {
            let (before, after) = (turn(t - 1), turn(t));
            let ended = before["sent_at"].as_f64().unwrap() + before["total"].as_f64().unwrap();
            assert!(after["sent_at"].as_f64().unwrap() >= ended - 1e-3, "{before} then {after}");
        }
        assert!(turn(0)["ttft"].as_f64().unwrap() > 0.0);
    }

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

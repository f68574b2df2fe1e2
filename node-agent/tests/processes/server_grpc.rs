//! The node-agent binary over real sockets: Info, streaming Generate with
//! usage, the event stream (snapshot, then deltas with increasing seq, and
//! heartbeats), INVALID_ARGUMENT and RESOURCE_EXHAUSTED, and /metrics.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use kvroute_proto::domain::{AgentInfo, KvEvent, KvEventBatch, Tier};
use kvroute_proto::pb::{self, agent_client::AgentClient};
use kvroute_test_support::services::AgentProcess;
use kvroute_test_support::{free_port, http_request};
use tonic::Code;

/// The agent these tests run: tiny-random in 64 blocks of 4 tokens, named `test-agent`, with `extra` arguments.
fn start_agent(extra: &[&str]) -> AgentProcess {
    let base = ["--model", "tiny-random", "--num-blocks", "64", "--block-size", "4", "--agent-id", "test-agent"];
    AgentProcess::start(&[&base[..], extra].concat())
}

async fn client(addr: SocketAddr) -> AgentClient<tonic::transport::Channel> {
    AgentClient::connect(format!("http://{addr}")).await.unwrap()
}

fn generate_request(prompt: Vec<u32>, max_tokens: u32) -> pb::AgentGenerateRequest {
    pb::AgentGenerateRequest { prompt_token_ids: prompt, max_tokens, ignore_eos: true, ..Default::default() }
}

async fn generate(
    client: &mut AgentClient<tonic::transport::Channel>,
    prompt: Vec<u32>,
    max_tokens: u32,
) -> (Vec<u32>, pb::Usage) {
    let mut stream = client.generate(generate_request(prompt, max_tokens)).await.unwrap().into_inner();
    let mut tokens = Vec::new();
    let mut usage = None;
    while let Some(message) = stream.message().await.unwrap() {
        tokens.extend(message.token_ids);
        if let Some(u) = message.usage {
            assert_eq!(message.finish_reason, pb::FinishReason::Length as i32);
            usage = Some(u);
        }
    }
    (tokens, usage.expect("the final message carries usage"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_info_events_and_metrics() {
    let agent = start_agent(&[]);
    let mut client = client(agent.grpc).await;

    let info = AgentInfo::try_from(client.info(pb::InfoRequest {}).await.unwrap().into_inner()).unwrap();
    assert_eq!(info.agent_id, "test-agent");
    assert_eq!(info.model_id, "tiny-random");
    assert_eq!(info.block_size, 4);
    assert_eq!(info.kv_blocks_total, 64);

    let mut events = client.subscribe_kv_events(pb::SubscribeKvEventsRequest::default()).await.unwrap().into_inner();
    let snapshot = KvEventBatch::try_from(events.message().await.unwrap().unwrap()).unwrap();
    assert!(snapshot.snapshot);
    assert_eq!(snapshot.seq, 0);
    assert_eq!(snapshot.epoch, info.epoch);
    assert_eq!(
        snapshot.events,
        vec![KvEvent::Stored { tier: Tier::Gpu, hashes: vec![] }, KvEvent::Stored { tier: Tier::Host, hashes: vec![] }]
    );

    let prompt: Vec<u32> = (100..118).collect();
    let (first, usage) = generate(&mut client, prompt.clone(), 5).await;
    assert_eq!(first.len(), 5);
    assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens), (18, 5, 0));
    let (second, usage) = generate(&mut client, prompt.clone(), 5).await;
    assert_eq!(second, first, "greedy decoding of a cached prefix gives the same tokens");
    assert_eq!(usage.cached_tokens, 16);

    // The deltas carry the prompt's 4 full blocks, with seq increasing by one.
    let expected = kvroute_proto::block_hashes(4, "tiny-random", b"", &prompt);
    let mut stored = Vec::new();
    let mut last_seq = 0;
    while stored.len() < expected.len() {
        let batch = tokio::time::timeout(Duration::from_secs(5), events.message()).await.unwrap().unwrap().unwrap();
        let batch = KvEventBatch::try_from(batch).unwrap();
        assert_eq!(batch.seq, last_seq + 1);
        last_seq = batch.seq;
        for event in batch.events {
            if let KvEvent::Stored { tier: Tier::Gpu, hashes } = event {
                stored.extend(hashes);
            }
        }
    }
    assert_eq!(stored[..4], expected[..]);
    // Heartbeats keep coming with load statistics.
    let heartbeat = tokio::time::timeout(Duration::from_secs(2), events.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(heartbeat.load.unwrap().kv_blocks_total, 64);

    // Metrics are published at heartbeats: wait for one after the second request's prefix hit.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut body = http_get(agent.metrics, "/metrics");
    while !body.contains("kvroute_agent_prefix_hit_tokens_total 16") && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        body = http_get(agent.metrics, "/metrics");
    }
    for name in [
        "kvroute_agent_kv_blocks ",
        "kvroute_agent_kv_blocks_used",
        "kvroute_agent_kv_blocks_cached",
        "kvroute_agent_prefix_hit_tokens_total",
        "kvroute_agent_prompt_tokens_total",
        "kvroute_agent_preemptions_total",
        "kvroute_agent_requests_waiting",
        "kvroute_agent_requests_running",
        "kvroute_agent_prefill_tokens_per_second",
        "kvroute_agent_decode_step_seconds",
    ] {
        assert!(body.contains(name), "/metrics lacks {name}");
    }
    assert!(body.contains("kvroute_agent_prefix_hit_tokens_total 16"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_invalid_argument() {
    let agent = start_agent(&[]);
    let mut client = client(agent.grpc).await;
    let cases = [
        (generate_request(vec![], 4), "prompt"),
        (generate_request(vec![1, 999_999], 4), "vocabulary"),
        (generate_request(vec![1, 2], 0), "max_tokens"),
        (generate_request(vec![1, 2], 1_000_000), "context"),
        (
            pb::AgentGenerateRequest {
                sampling: Some(pb::SamplingParams { temperature: -1.0, ..Default::default() }),
                ..generate_request(vec![1, 2], 4)
            },
            "temperature",
        ),
    ];
    for (request, needle) in cases {
        let status = client.generate(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{needle}: {status:?}");
        assert!(status.message().contains(needle), "{needle}: {}", status.message());
    }
    // The agent still serves after bad input.
    let (tokens, _) = generate(&mut client, vec![5, 6, 7], 2).await;
    assert_eq!(tokens.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_resource_exhausted() {
    let agent = start_agent(&["--max-waiting", "0"]);
    let mut client = client(agent.grpc).await;
    let status = client.generate(generate_request(vec![1, 2, 3], 2)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("queue is full"));
}

#[test]
fn check_config_and_capacity_commands() {
    let binary = env!("CARGO_BIN_EXE_node-agent");
    // `--check-config` with `args`: accepted, or refused with an error that mentions `named`.
    let accepted = |args: &[&str]| {
        let out = Command::new(binary).args(args).arg("--check-config").output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let refused = |args: &[&str], named: &str| {
        let out = Command::new(binary).args(args).arg("--check-config").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(named), "{args:?} should be refused naming {named}: {stderr}");
    };
    accepted(&["--kv-cache-bytes", "1GiB", "--kv-dtype", "fp8"]);
    refused(&["--kv-dtype", "int3"], "int3");
    accepted(&["--compute-threads", "1"]);
    refused(&["--compute-threads", "0"], "compute-threads");
    let external = |more: &[&'static str]| -> Vec<&'static str> {
        let base =
            ["--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--engine-kv-events", "tcp://127.0.0.1:2"];
        base.iter().chain(["--model-dir", "."].iter()).chain(more).copied().collect()
    };
    refused(&external(&["--step-log", "s"]), "--step-log");
    refused(&external(&["--block-size", "32"]), "--block-size 32");
    accepted(&external(&["--engine-max-running", "64"]));
    refused(&external(&["--engine-max-running", "0"]), "--engine-max-running");
    refused(&["--engine-max-running", "64"], "--max-running");
    let capacity = Command::new(binary)
        .args(["capacity", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--memory", "53GiB"])
        .args(["--reserved-tokens", "8192", "--used-tokens", "2270"])
        .output()
        .unwrap();
    let text = String::from_utf8(capacity.stdout).unwrap();
    assert!(text.contains("contiguous reservation: 13"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_log_records_every_computed_token_and_sample() {
    let path = std::env::temp_dir().join(format!("kvroute-steps-{}-{}.jsonl", std::process::id(), free_port()));
    let agent = start_agent(&["--step-log", path.to_str().unwrap()]);
    let mut client = client(agent.grpc).await;
    let (tokens, usage) = generate(&mut client, (1..40).collect(), 6).await;
    assert_eq!(tokens.len(), 6);
    // The prompt once, then each generated token but the last as the next step's input; one sample per token.
    let expected = (usage.prompt_tokens + usage.completion_tokens - 1) as u64;
    let totals =
        kvroute_test_support::wait_until("the step log to hold the request's steps", Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&path).map_err(|error| error.to_string())?;
            let (mut computed, mut sampled) = (0u64, 0u64);
            for line in text.lines() {
                let record: serde_json::Value =
                    serde_json::from_str(line).map_err(|error| format!("{line}: {error}"))?;
                computed += record["tokens"].as_u64().ok_or("tokens")?;
                sampled += record["sampled"].as_u64().ok_or("sampled")?;
                let seconds = record["step_seconds"].as_f64().ok_or("step_seconds")?;
                let forward = record["forward_seconds"].as_f64().ok_or("forward_seconds")?;
                if !(forward >= 0.0 && seconds >= forward) {
                    return Err(format!("a step shorter than its forward pass: {line}"));
                }
            }
            if (computed, sampled) == (expected, 6) {
                Ok((computed, sampled))
            } else {
                Err(format!("{computed} tokens, {sampled} samples"))
            }
        });
    std::fs::remove_file(&path).ok();
    totals.unwrap_or_else(|error| panic!("{error}\n{}", agent.process.log_tail()));
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    http_request(addr, "GET", path, &[], b"").unwrap().text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_work_tells_subscribers_and_exits() {
    let mut agent = start_agent(&[]);
    let mut events_client = client(agent.grpc).await;
    let mut events =
        events_client.subscribe_kv_events(pb::SubscribeKvEventsRequest::default()).await.unwrap().into_inner();
    let mut generate_client = client(agent.grpc).await;
    let mut stream = generate_client.generate(generate_request((1..40).collect(), 200)).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("the request is running");
    agent.process.signal(15).unwrap();
    // The running request finishes in full.
    let mut tokens = first.token_ids.len();
    let mut usage = None;
    while let Some(message) = stream.message().await.unwrap() {
        tokens += message.token_ids.len();
        usage = usage.or(message.usage);
    }
    assert_eq!(tokens, 200);
    assert_eq!(usage.expect("final usage").completion_tokens, 200);
    // Subscribers see `draining`, then their stream ends (a gateway stops routing here).
    let mut saw_draining = false;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(batch)) = events.message().await {
            saw_draining |= batch.load.is_some_and(|load| load.draining);
        }
    })
    .await;
    assert!(ended.is_ok(), "the event stream did not end after the drain");
    assert!(saw_draining, "no batch said the agent was draining");
    assert_eq!(agent.process.wait_exit(Duration::from_secs(10)), Some(0), "the agent exits 0 after draining");
}

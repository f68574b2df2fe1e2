//! A real gateway in front of real node-agents, over real sockets: a repeated
//! prefix goes to the replica that holds it (seen in cached tokens), unrelated
//! prompts spread, turn 2 of a chat hits the blocks of turn 1's answer, gRPC
//! works like HTTP, and errors have OpenAI's shape (faults are in `faults.rs`).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Command;

use kvroute_proto::pb::{self, generate_client::GenerateClient};
use kvroute_test_support::api::{cached_tokens, debug_route, gpu_blocks_by_replica, post_json};
use kvroute_test_support::services::{AgentProcess, GatewayProcess, PATIENCE, metric_sum, wait_finished_on};
use kvroute_test_support::{http_request, wait_until};
use serde_json::{Value, json};

use crate::{HEARTBEAT_TIMEOUT_MS, serial};

/// The admin key of the gateways here, for `/debug/route`.
const ADMIN_KEY: &str = "sk-cluster-admin";

struct Cluster {
    _serial: std::sync::MutexGuard<'static, ()>,
    agents: Vec<AgentProcess>,
    gateway: GatewayProcess,
    http: SocketAddr,
    grpc: SocketAddr,
}

fn start(agents: usize) -> Cluster {
    start_with(agents, &[])
}

/// [`start`] with extra gateway arguments.
fn start_with(agents: usize, gateway_args: &[&str]) -> Cluster {
    start_serving("tiny-random", agents, gateway_args)
}

/// [`start_with`] serving `model` (`tiny-random` or a GGUF file, whose tokenizer the gateway then uses);
/// returns once the gateway is ready with every agent healthy.
fn start_serving(model: &str, agents: usize, gateway_args: &[&str]) -> Cluster {
    let serial = serial();
    let started: Vec<AgentProcess> = (0..agents)
        .map(|i| AgentProcess::start(&["--model", model, "--num-blocks", "512", "--agent-id", &format!("agent-{i}")]))
        .collect();
    let grpcs: Vec<SocketAddr> = started.iter().map(|agent| agent.grpc).collect();
    let tokenizer = if model == "tiny-random" { vec![] } else { vec!["--tokenizer", model] };
    let heartbeat = ["--heartbeat-timeout-ms", HEARTBEAT_TIMEOUT_MS, "--admin-api-key", ADMIN_KEY];
    let args = [&heartbeat[..], gateway_args, &tokenizer[..]].concat();
    let gateway = GatewayProcess::start(&grpcs, &args);
    let (http, grpc) = (gateway.http, gateway.grpc);
    Cluster { _serial: serial, agents: started, gateway, http, grpc }
}

fn long_prompt(topic: &str) -> String {
    format!("You are a careful assistant for {topic}. ").repeat(12)
}

#[test]
fn repeated_prefix_goes_to_its_holder_and_unrelated_prompts_spread() {
    let cluster = start(2);
    let prompt = long_prompt("accounting");
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0});
    let (status, first) = post_json(cluster.http, "/v1/completions", &[], &body);
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "text_completion");
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens >= 64);
    // The holder's stored events reach the gateway: its index holds the prompt's full blocks.
    cluster.gateway.wait_indexed(prompt_tokens / 16).unwrap();
    for _ in 0..3 {
        let (status, again) = post_json(cluster.http, "/v1/completions", &[], &body);
        assert_eq!(status, 200);
        let cached = cached_tokens(&again);
        assert_eq!(cached, (prompt_tokens - 1) / 16 * 16, "the repeat lands on the replica holding the prefix");
        assert_eq!(again["choices"][0]["text"], first["choices"][0]["text"], "greedy: same text from cache");
    }
    // Unrelated prompts: both replicas get work.
    for i in 0..8 {
        let unrelated = json!({"prompt": long_prompt(&format!("topic {i}")), "max_tokens": 2});
        let (status, _) = post_json(cluster.http, "/v1/completions", &[], &unrelated);
        assert_eq!(status, 200);
    }
    // Agents publish their counters after steps: wait until they count all 12 requests as finished.
    wait_finished_on(&cluster.agents, 12).unwrap();
    for agent in &cluster.agents {
        assert!(metric_sum(agent.metrics, "kvroute_agent_prompt_tokens_total") > 0.0, "every replica served something");
    }
    // The explain endpoint shows the holder's GPU blocks.
    let explained = debug_route(cluster.http, ADMIN_KEY, &body);
    let best = gpu_blocks_by_replica(&explained).into_values().max();
    assert_eq!(best, Some(prompt_tokens / 16));
    // Event batches carry their send time: the gateway measures how far behind the agents its index is.
    assert!(metric_sum(cluster.http, "kvroute_gateway_event_lag_seconds_count") > 0.0, "event lag is measured");
}

#[test]
fn chat_turn_two_reuses_turn_one_answer() {
    let cluster = start(2);
    let system = json!({"role": "system", "content": "You are a terse assistant. Answer in one sentence."});
    let user1 = json!({"role": "user", "content": "Name three rivers of Europe and say something about each of them."});
    let (status, turn1) = post_json(
        cluster.http,
        "/v1/chat/completions",
        &[],
        &json!({"messages": [system, user1], "max_tokens": 40, "temperature": 0}),
    );
    assert_eq!(status, 200, "{turn1}");
    assert_eq!(turn1["object"], "chat.completion");
    let answer = turn1["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let p1 = turn1["usage"]["prompt_tokens"].as_u64().unwrap();
    let n1 = turn1["usage"]["completion_tokens"].as_u64().unwrap();
    // Turn 1's blocks, its answer's included, reach the gateway's index.
    cluster.gateway.wait_indexed((p1 + n1 - 1) / 16).unwrap();
    let assistant = json!({"role": "assistant", "content": answer});
    let user2 = json!({"role": "user", "content": "And one more?"});
    let (status, turn2) = post_json(
        cluster.http,
        "/v1/chat/completions",
        &[],
        &json!({"messages": [system, user1, assistant, user2], "max_tokens": 4}),
    );
    assert_eq!(status, 200, "{turn2}");
    let cached = cached_tokens(&turn2);
    // Turn 1's prompt and all but its last generated token are in the replica's blocks.
    assert!(cached >= (p1 + n1 - 1) / 16 * 16, "cached {cached}, turn 1 had {p1} prompt and {n1} answer tokens");
    assert!(cached > p1, "turn 2 hits blocks of turn 1's answer");
}

#[test]
fn streaming_grpc_and_errors() {
    let cluster = start(2);
    // Streaming chat over SSE ends with [DONE] and carries usage when asked.
    let response = http_request(
        cluster.http,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true,
               "stream_options": {"include_usage": true}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(response.status, 200);
    let data = response.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap()["usage"].clone();
    assert_eq!(usage["completion_tokens"], 5);

    // gRPC with the same semantics.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = GenerateClient::connect(format!("http://{}", cluster.grpc)).await.unwrap();
        let request = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text("The capital of France is".into())),
            max_tokens: 6,
            ..Default::default()
        };
        let mut stream = client.generate(request).await.unwrap().into_inner();
        let mut tokens = 0;
        let mut usage = None;
        while let Some(message) = stream.message().await.unwrap() {
            tokens += message.token_ids.len();
            if message.usage.is_some() {
                usage = message.usage;
            }
        }
        assert_eq!(tokens, 6);
        assert_eq!(usage.unwrap().completion_tokens, 6);
        let empty = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text(String::new())),
            ..Default::default()
        };
        assert_eq!(client.generate(empty).await.unwrap_err().code(), tonic::Code::InvalidArgument);
        let unknown = pb::GenerateRequest {
            model: "no-such-model".into(),
            prompt: Some(pb::generate_request::Prompt::Text("x".into())),
            ..Default::default()
        };
        assert_eq!(client.generate(unknown).await.unwrap_err().code(), tonic::Code::NotFound);
    });

    // OpenAI error shapes.
    let cases = [
        (json!({"prompt": "x", "model": "no-such-model"}), 404),
        (json!({"prompt": ""}), 400),
        (json!({"prompt": "x", "max_tokens": -3}), 400),
        (json!({"prompt": "x", "temperature": "hot"}), 400),
        (json!({"max_tokens": 3}), 400),
    ];
    for (body, status) in cases {
        let (got, error) = post_json(cluster.http, "/v1/completions", &[], &body);
        assert_eq!(got, status, "{body}: {error}");
        assert!(error["error"]["message"].is_string(), "{error}");
        assert!(error["error"]["type"].is_string(), "{error}");
    }
    let bad_json = http_request(cluster.http, "POST", "/v1/completions", &[], b"{not json").unwrap();
    assert_eq!(bad_json.status, 400);
}

#[test]
fn smollm2_answers_a_simple_question_through_the_gateway() {
    let smollm2 = kvroute_test_support::smollm2_path();
    let cluster = start_serving(smollm2.to_str().unwrap(), 1, &[]);
    let question = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    });
    let (status, answer) = post_json(cluster.http, "/v1/chat/completions", &[], &question);
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "SmolLM2 should name Paris: {text:?}");
    // Asked again, the prompt comes from the cache and greedy decoding gives the same answer.
    cluster.gateway.wait_indexed(answer["usage"]["prompt_tokens"].as_u64().unwrap() / 16).unwrap();
    let (status, again) = post_json(cluster.http, "/v1/chat/completions", &[], &question);
    assert_eq!(status, 200, "{again}");
    assert!(cached_tokens(&again) > 0, "{again}");
    assert_eq!(again["choices"][0]["message"]["content"], answer["choices"][0]["message"]["content"]);
}

#[test]
fn private_tenants_do_not_share_cached_prefixes() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "sk-alice alice private\nsk-bob bob private\nsk-carol carol off\n").unwrap();
    let alice = [("Authorization", "Bearer sk-alice")];
    let bob = [("Authorization", "Bearer sk-bob")];
    let carol = [("Authorization", "Bearer sk-carol")];
    // One replica: whatever is not shared is not shared by the cache itself, not by routing.
    let cluster = start_with(1, &["--api-keys", keys.path().to_str().unwrap()]);
    let body = json!({"prompt": long_prompt("a confidential merger"), "max_tokens": 4, "temperature": 0});
    let completions = "/v1/completions";
    let (status, first) = post_json(cluster.http, completions, &alice, &body);
    assert_eq!(status, 200, "{first}");
    assert_eq!(cached_tokens(&first), 0);
    let (_, alice_again) = post_json(cluster.http, completions, &alice, &body);
    assert!(cached_tokens(&alice_again) > 0, "a tenant reuses its own prefix: {alice_again}");
    let (status, bob_first) = post_json(cluster.http, completions, &bob, &body);
    assert_eq!(status, 200, "{bob_first}");
    assert_eq!(cached_tokens(&bob_first), 0, "bob must not hit alice's blocks: {bob_first}");
    assert_eq!(bob_first["choices"][0]["text"], first["choices"][0]["text"], "same prompt, same greedy text");
    let (_, bob_again) = post_json(cluster.http, completions, &bob, &body);
    assert!(cached_tokens(&bob_again) > 0, "bob reuses his own prefix: {bob_again}");
    for _ in 0..2 {
        let (status, carol_response) = post_json(cluster.http, completions, &carol, &body);
        assert_eq!(status, 200, "{carol_response}");
        assert_eq!(cached_tokens(&carol_response), 0, "scope off: no reuse at all: {carol_response}");
    }
}

#[test]
fn a_replica_whose_tokenizer_differs_is_refused() {
    let _serial = serial();
    // The agent serves tiny-random (the built-in tokenizer's vocabulary); the gateway tokenizes with SmolLM2's.
    let agent = AgentProcess::start(&["--model", "tiny-random", "--num-blocks", "64"]);
    let smollm2 = kvroute_test_support::smollm2_path();
    let gateway = GatewayProcess::spawn(&[agent.grpc], &["--tokenizer", smollm2.to_str().unwrap()]);
    let http = gateway.http;
    wait_until("the replica refused", PATIENCE, || {
        let refused = metric_sum(http, "kvroute_gateway_replicas_refused_total");
        if refused >= 1.0 { Ok(refused) } else { Err(format!("{refused} refused")) }
    })
    .unwrap();
    let ready = http_request(http, "GET", "/ready", &[], b"").unwrap();
    assert_eq!(ready.status, 503, "{}", ready.text());
    let body = serde_json::from_slice::<Value>(&ready.body).unwrap();
    assert_eq!(body["healthy_replicas"].as_u64(), Some(0));
}

/// What is wrong, request headers, raw body, expected status, a fragment of the expected message.
type BadRequest<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<u8>, u16, &'a str);

#[test]
fn bad_input_gets_its_status_and_message_over_http_and_grpc() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "sk-good acme private\n").unwrap();
    let keys_path = keys.path().to_str().unwrap();
    let auth = [("Authorization", "Bearer sk-good"), ("Content-Type", "application/json")];
    let cluster = start_with(1, &["--api-keys", keys_path, "--max-body-bytes", "65536"]);
    let huge_prompt = "word ".repeat(6000); // past tiny-random's context once tokenized, under the body limit
    let too_big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(70_000));
    let good = &auth[..];
    let cases: Vec<BadRequest<'_>> = vec![
        ("invalid JSON", good, b"{not json".to_vec(), 400, ""),
        ("invalid UTF-8", good, b"{\"prompt\": \"\xff\xfe\"}".to_vec(), 400, ""),
        ("wrong type", good, br#"{"prompt": "x", "max_tokens": "many"}"#.to_vec(), 400, "max_tokens"),
        ("missing prompt", good, br#"{"max_tokens": 3}"#.to_vec(), 400, "prompt"),
        ("empty prompt", good, br#"{"prompt": ""}"#.to_vec(), 400, "prompt"),
        ("negative max_tokens", good, br#"{"prompt": "x", "max_tokens": -1}"#.to_vec(), 400, "max_tokens"),
        ("huge max_tokens", good, br#"{"prompt": "x", "max_tokens": 100000000}"#.to_vec(), 400, "max_tokens"),
        ("token id outside the vocabulary", good, br#"{"prompt": [1, 2, 999999999]}"#.to_vec(), 400, "vocabulary"),
        ("prompt past the context", good, json!({"prompt": huge_prompt}).to_string().into_bytes(), 400, "context"),
        ("body past the limit", good, too_big.into_bytes(), 413, ""),
        ("unknown model", good, br#"{"prompt": "x", "model": "gpt-nope"}"#.to_vec(), 404, "gpt-nope"),
        ("missing API key", &[("Content-Type", "application/json")], br#"{"prompt": "x"}"#.to_vec(), 401, ""),
        ("wrong API key", &[("Authorization", "Bearer sk-bad")], br#"{"prompt": "x"}"#.to_vec(), 401, ""),
    ];
    for (what, headers, body, status, fragment) in cases {
        let response = http_request(cluster.http, "POST", "/v1/completions", headers, &body).unwrap();
        assert_eq!(response.status, status, "{what}: {}", response.text());
        let error: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        let message = error["error"]["message"].as_str().unwrap_or_else(|| panic!("{what}: {}", response.text()));
        assert!(error["error"]["type"].is_string(), "{what}: {error}");
        assert!(message.contains(fragment), "{what}: {message:?} lacks {fragment:?}");
        assert!(!message.contains("sk-"), "{what}: the key leaks into {message:?}");
    }

    // gRPC: the same mistakes, the matching codes.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let key = |request: pb::GenerateRequest, key: &str| {
            let mut request = tonic::Request::new(request);
            if !key.is_empty() {
                request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
            }
            request
        };
        let text = |text: &str| Some(pb::generate_request::Prompt::Text(text.into()));
        let ids = |ids: Vec<u32>| Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids }));
        let cases: Vec<(&str, pb::GenerateRequest, &str, tonic::Code)> = vec![
            (
                "empty prompt",
                pb::GenerateRequest { prompt: text(""), ..Default::default() },
                "sk-good",
                tonic::Code::InvalidArgument,
            ),
            ("no prompt", pb::GenerateRequest::default(), "sk-good", tonic::Code::InvalidArgument),
            (
                "token id outside the vocabulary",
                pb::GenerateRequest { prompt: ids(vec![1, 999_999_999]), ..Default::default() },
                "sk-good",
                tonic::Code::InvalidArgument,
            ),
            (
                "prompt past the context",
                pb::GenerateRequest { prompt: text(&huge_prompt), ..Default::default() },
                "sk-good",
                tonic::Code::InvalidArgument,
            ),
            (
                "huge max_tokens",
                pb::GenerateRequest { prompt: text("x"), max_tokens: 100_000_000, ..Default::default() },
                "sk-good",
                tonic::Code::InvalidArgument,
            ),
            (
                "unknown model",
                pb::GenerateRequest { prompt: text("x"), model: "gpt-nope".into(), ..Default::default() },
                "sk-good",
                tonic::Code::NotFound,
            ),
            (
                "missing API key",
                pb::GenerateRequest { prompt: text("x"), ..Default::default() },
                "",
                tonic::Code::Unauthenticated,
            ),
            (
                "wrong API key",
                pb::GenerateRequest { prompt: text("x"), ..Default::default() },
                "sk-bad",
                tonic::Code::Unauthenticated,
            ),
        ];
        for (what, request, api_key, code) in cases {
            let mut client = GenerateClient::new(channel.clone());
            let status = match client.generate(key(request, api_key)).await {
                Ok(response) => {
                    let mut stream = response.into_inner();
                    stream.message().await.expect_err(what)
                }
                Err(status) => status,
            };
            assert_eq!(status.code(), code, "{what}: {}", status.message());
            assert!(!status.message().is_empty(), "{what}: a message says what is wrong");
        }
    });
}

#[test]
fn the_official_openai_python_client_works_unchanged() {
    let python = kvroute_test_support::openai_python();
    let cluster = start(2);
    let script = kvroute_test_support::repo_root().join("gateway/tests/clients/openai_python.py");
    let output = Command::new(python).arg(script).arg(format!("http://{}/v1", cluster.http)).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["model"], "tiny-random");
    assert_eq!(seen["completion_again_text"], seen["completion_text"], "greedy: the same text from the cache");
    let prompt_tokens = seen["completion_prompt_tokens"].as_u64().unwrap();
    assert_eq!(seen["completion_again_cached"].as_u64().unwrap(), (prompt_tokens - 1) / 16 * 16, "{seen}");
    assert_eq!(seen["chat_role"], "assistant");
    assert_eq!(seen["chat_content_is_text"], true);
    assert_eq!(seen["chat_completion_tokens"], 6);
    assert!(seen["stream_chunks"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(seen["stream_completion_tokens"], 5);
    assert_eq!(seen["unknown_model"], 404);
    assert_eq!(seen["negative_max_tokens"], 400);
}

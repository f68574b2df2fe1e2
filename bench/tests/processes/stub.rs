//! kvroute-stub over loopback: its answers count the prompt's cached blocks as vLLM does (never the whole
//! prompt), streamed and not, for text, token-id and chat prompts; bad input is a 400 with a JSON error;
//! and kvroute's engine-mode agent fronts it as it fronts vLLM: the agent's start-up checks pass
//! (`/v1/models`, `/metrics`, `/tokenize` with the chat template), the stub's KV events reach the
//! gateway's index, and the gateway predicts exactly the hit the stub then reports; requests that finish
//! before their acknowledgement reaches the gateway stop counting; the agent reports the engine's cap on
//! running sequences it is given; a replica whose engine has larger blocks than kvroute's is credited
//! only the whole engine blocks of a prompt sent there, as the engine will cache it.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kvroute_test_support::api::{debug_route, gpu_blocks_by_replica};
use kvroute_test_support::services::{AgentProcess, GatewayProcess, StubProcess, metric_series};
use kvroute_test_support::{http_request, vllm};
use serde_json::{Value, json};

/// A text of about `words` tokens that no other test sends.
fn text(words: usize, tag: &str) -> String {
    (0..words).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
}

#[test]
fn the_stub_answers_with_usage_counting_cached_blocks_and_refuses_bad_input() {
    let stub = StubProcess::start(&vllm::model_dir());
    let prompt = text(60, "w");
    let first = stub.json("/v1/completions", &json!({"prompt": prompt, "max_tokens": 3}));
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 40, "{first}");
    assert_eq!(first["usage"]["completion_tokens"], 3, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{first}");
    assert!(!first["choices"][0]["text"].as_str().unwrap().is_empty(), "{first}");

    // The same prompt again, streamed: every whole block but the one holding the last token is reused.
    let body = json!({"prompt": prompt, "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true},
        "return_token_ids": true});
    let answer = http_request(stub.http, "POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    assert_eq!(answer.status, 200);
    let events = answer.sse_data();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|data| serde_json::from_str(data).unwrap()).collect();
    let tokens: Vec<&Value> = chunks.iter().filter_map(|chunk| chunk["choices"][0]["token_ids"].get(0)).collect();
    assert_eq!(tokens.len(), 3, "{chunks:?}");
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), (prompt_tokens - 1) / 16 * 16);

    // Token ids hit the same blocks.
    let ids = stub.json("/tokenize", &json!({"prompt": prompt}))["tokens"].clone();
    let by_ids = stub.json("/v1/completions", &json!({"prompt": ids, "max_tokens": 1}));
    assert_eq!(by_ids["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(by_ids["usage"]["prompt_tokens_details"], usage["prompt_tokens_details"], "{by_ids}");

    // A prompt of exactly four blocks: the last block is computed again, so three are reused.
    let blocks: Vec<u32> = (1000..1064).collect();
    stub.json("/v1/completions", &json!({"prompt": blocks, "max_tokens": 1}));
    let whole = stub.json("/v1/completions", &json!({"prompt": blocks, "max_tokens": 1}));
    assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 48, "{whole}");

    // A chat is rendered with the model's template (SmolLM2's is ChatML) and then tokenized.
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]);
    let chat = stub.json("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 2}));
    let chatml = format!(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    );
    let by_hand = stub.json("/tokenize", &json!({"prompt": chatml, "add_special_tokens": false}));
    assert_eq!(chat["usage"]["prompt_tokens"], by_hand["count"], "{chat} {by_hand}");
    assert_eq!(stub.json("/tokenize", &json!({"messages": messages}))["tokens"], by_hand["tokens"]);
    assert!(chat["choices"][0]["message"]["content"].is_string(), "{chat}");

    // After a reset nothing is cached.
    assert_eq!(stub.post("/reset_prefix_cache", &json!({})).0, 200);
    let after = stub.json("/v1/completions", &json!({"prompt": prompt, "max_tokens": 1}));
    assert_eq!(after["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{after}");

    for (path, body, says) in [
        ("/v1/completions", "not json".to_string(), "not JSON"),
        ("/v1/completions", json!({"max_tokens": 1}).to_string(), "`prompt` is required"),
        ("/v1/completions", json!({"prompt": [1, 99_999_999]}).to_string(), "not a token id"),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 0}).to_string(), "max_tokens"),
        ("/v1/completions", json!({"prompt": text(9000, "x")}).to_string(), "context"),
        ("/v1/completions", json!({"prompt": "hi", "cache_salt": ""}).to_string(), "cache_salt"),
        ("/v1/chat/completions", json!({"messages": "hi"}).to_string(), "messages"),
    ] {
        let answer = http_request(stub.http, "POST", path, &[], body.as_bytes()).unwrap();
        assert_eq!(answer.status, 400, "{body:.80}: {}", answer.text());
        let error: Value = serde_json::from_str(&answer.text()).unwrap();
        assert!(error["error"]["message"].as_str().unwrap().contains(says), "{body:.80}: {error}");
    }
    let metrics = http_request(stub.http, "GET", "/metrics", &[], b"").unwrap().text();
    assert!(metrics.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"65536\"} 1"), "{metrics}");
    assert!(
        metrics.contains("vllm:request_success_total{finished_reason=\"length\",model_name=\"stub-model\"} 7.0\n"),
        "{metrics}"
    );
}

#[test]
fn kvroute_fronts_the_stub_and_learns_its_blocks_from_its_kv_events() {
    let model_dir = vllm::model_dir();
    let stub = StubProcess::start(&model_dir);
    let agent = AgentProcess::start(&[
        "--engine",
        "vllm",
        "--engine-url",
        &format!("http://{}", stub.http),
        "--engine-kv-events",
        &format!("tcp://{}", stub.events),
        "--model-dir",
        model_dir.to_str().unwrap(),
    ]);
    let tokenizer = model_dir.join("tokenizer.json");
    let gateway = GatewayProcess::start(&[agent.grpc], &["--tokenizer", tokenizer.to_str().unwrap()]);
    let complete = |prompt: &str| -> Value {
        let body = json!({"model": "stub-model", "prompt": prompt, "max_tokens": 2});
        let answer = http_request(gateway.http, "POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
        assert_eq!(answer.status, 200, "{}\n{}", answer.text(), stub.process.log_tail());
        serde_json::from_str(&answer.text()).unwrap()
    };
    // The agent subscribes to the stub's events on a thread of its own, and a PUB socket keeps nothing for
    // subscribers that join later: fresh prompts until the gateway's index shows one, then a reset of the
    // stub's cache, whose event comes after every earlier one: once the index is empty, all have arrived.
    let mut warm_ups = 0;
    kvroute_test_support::wait_until("the stub's events indexed by the gateway", Duration::from_secs(60), || {
        warm_ups += 1;
        complete(&text(40, &format!("warm{warm_ups}-")));
        let entries = gateway.metric("kvroute_gateway_index_entries");
        if entries > 0.0 { Ok(entries) } else { Err("nothing indexed yet".into()) }
    })
    .unwrap_or_else(|message| panic!("{message}"));
    assert_eq!(stub.post("/reset_prefix_cache", &json!({})).0, 200);
    kvroute_test_support::wait_until("the reset reaching the gateway's index", Duration::from_secs(60), || {
        let entries = gateway.metric("kvroute_gateway_index_entries");
        if entries == 0.0 { Ok(()) } else { Err(format!("{entries} entries")) }
    })
    .unwrap_or_else(|message| panic!("{message}"));
    let prompt = text(120, "k");
    let first = complete(&prompt);
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{first}");
    gateway.wait_indexed(prompt_tokens / 16).unwrap_or_else(|message| panic!("{message}"));

    let predicted_before = gateway.metric("kvroute_gateway_predicted_cached_tokens_total");
    let second = complete(&prompt);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(cached, (prompt_tokens - 1) / 16 * 16, "{second}");
    let predicted = gateway.metric("kvroute_gateway_predicted_cached_tokens_total") - predicted_before;
    assert_eq!(predicted as u64, cached, "the gateway predicts the hit the stub reports");
}

#[test]
fn requests_that_finish_before_their_acknowledgement_reaches_the_gateway_stop_counting() {
    // The stub answers at once: the agent reports a request finished on its event stream about when it
    // acknowledges it on the request's own stream, so the report often comes first.
    let model_dir = vllm::model_dir();
    let stub = StubProcess::start(&model_dir);
    let agent = AgentProcess::start(&[
        "--engine",
        "vllm",
        "--engine-url",
        &format!("http://{}", stub.http),
        "--engine-kv-events",
        &format!("tcp://{}", stub.events),
        "--model-dir",
        model_dir.to_str().unwrap(),
    ]);
    let tokenizer = model_dir.join("tokenizer.json");
    let gateway = GatewayProcess::start(&[agent.grpc], &["--tokenizer", tokenizer.to_str().unwrap()]);
    for i in 0..30 {
        let body = json!({"model": "stub-model", "prompt": text(40, &format!("quick{i}-")), "max_tokens": 1});
        let answer = http_request(gateway.http, "POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
        assert_eq!(answer.status, 200, "{}\n{}", answer.text(), stub.process.log_tail());
    }
    // Every request has finished and been acknowledged; once the agent's next batches are in, every finish
    // has been reported too.
    gateway.wait_next_batches(1).unwrap_or_else(|message| panic!("{message}"));
    let in_flight = gateway.metric("kvroute_gateway_replica_requests_in_flight");
    assert_eq!(in_flight, 0.0, "finished requests still count on the replica\n{}", gateway.process.log_tail());
}

#[test]
fn the_agent_reports_the_engine_cap_on_running_sequences_it_is_given() {
    let model_dir = vllm::model_dir();
    let stub = StubProcess::start(&model_dir);
    let agent = |extra: &[&str]| {
        let (url, events, dir) = (
            format!("http://{}", stub.http),
            format!("tcp://{}", stub.events),
            model_dir.to_str().unwrap().to_string(),
        );
        let mut args =
            vec!["--engine", "vllm", "--engine-url", &url, "--engine-kv-events", &events, "--model-dir", &dir];
        args.extend_from_slice(extra);
        AgentProcess::start(&args)
    };
    // vLLM publishes no cap: unknown (0) unless the operator gives the one the engine runs with.
    let told = agent(&["--engine-max-running", "5"]);
    let untold = agent(&[]);
    for (agent, cap) in [(&told, 5.0), (&untold, 0.0)] {
        kvroute_test_support::wait_until("the agent's reported cap", Duration::from_secs(30), || match metric_series(
            agent.metrics,
            "kvroute_agent_max_running_requests",
        )
        .as_slice()
        {
            [(_, value)] if *value == cap => Ok(()),
            series => Err(format!("{series:?}, expected {cap}")),
        })
        .unwrap_or_else(|message| panic!("{message}\n{}", agent.process.log_tail()));
    }
}

#[test]
fn a_replica_whose_engine_has_larger_blocks_is_credited_only_whole_engine_blocks_of_a_prompt() {
    // The stub caches whole blocks of 64 tokens (4 of kvroute's 16): the last partial one never is.
    let model_dir = vllm::model_dir();
    let stub = StubProcess::start_with(&model_dir, &["--block-size", "64"]);
    let (url, events) = (format!("http://{}", stub.http), format!("tcp://{}", stub.events));
    let dir = model_dir.to_str().unwrap();
    let agent = AgentProcess::start(&[
        "--engine",
        "vllm",
        "--engine-url",
        &url,
        "--engine-kv-events",
        &events,
        "--model-dir",
        dir,
    ]);
    let tokenizer = model_dir.join("tokenizer.json");
    // Pending entries outlive the test, so the index shows what the gateway recorded at sending whether
    // or not the stub's events have arrived.
    let flags = ["--tokenizer", tokenizer.to_str().unwrap(), "--pending-ttl-ms", "600000", "--admin-api-key", "sk-a"];
    let gateway = GatewayProcess::start(&[agent.grpc], &flags);
    let prompt = text(100, "whole");
    let body = json!({"model": "stub-model", "prompt": prompt, "max_tokens": 1});
    let answer = http_request(gateway.http, "POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    assert_eq!(answer.status, 200, "{}\n{}", answer.text(), stub.process.log_tail());
    let answer: Value = serde_json::from_str(&answer.text()).unwrap();
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    // At least one of kvroute's blocks past the last whole engine block, so the two counts differ.
    assert!(prompt_tokens % 64 >= 16, "{prompt_tokens} tokens: choose a prompt that ends mid-block");

    let explained = debug_route(gateway.http, "sk-a", &json!({"prompt": format!("{prompt} and then some more")}));
    let held: Vec<u64> = gpu_blocks_by_replica(&explained).into_values().collect();
    assert_eq!(held, vec![prompt_tokens / 64 * 4], "whole 64-token blocks only: {explained}");
}

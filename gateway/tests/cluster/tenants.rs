//! Tenants over the real processes: a private tenant never receives cached
//! tokens from another tenant's prompt in any tier (GPU, host RAM, the shared
//! Redis tier), a tenant with caching off never reuses anything, and API keys
//! and prompt text never reach logs, metrics or error messages.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use kvroute_test_support::api::{cached_tokens, post_json};
use kvroute_test_support::services::{AgentProcess, EventStream, GatewayProcess, PATIENCE, metric_sum};
use kvroute_test_support::{RedisServer, http_request, wait_until};
use serde_json::{Value, json};

use crate::serial;

const KEYS: &str = "sk-alice-4f1c9e alice private\nsk-bob-77aa01 bob private\nsk-carol-0b3e52 carol off\n";

fn cached(http: SocketAddr, key: &str, prompt: &str) -> u64 {
    let bearer = format!("Bearer {key}");
    let body = json!({"prompt": prompt, "max_tokens": 2});
    let (status, response) = post_json(http, "/v1/completions", &[("Authorization", &bearer)], &body);
    assert_eq!(status, 200, "{response}");
    cached_tokens(&response)
}

#[test]
fn a_private_tenant_never_hits_another_tenants_blocks_in_any_tier_and_scope_off_never_reuses() {
    let _serial = serial();
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), KEYS).unwrap();
    let keys_arg = ["--api-keys", keys.path().to_str().unwrap()];
    let redis = RedisServer::start();
    let agents = [
        AgentProcess::start_tiered(&redis.url(), "agent-a", &[]),
        AgentProcess::start_tiered(&redis.url(), "agent-b", &[]),
    ];
    // One gateway per agent, so the test decides which replica serves.
    let on_a = GatewayProcess::start(&[agents[0].grpc], &keys_arg);
    let on_b = GatewayProcess::start(&[agents[1].grpc], &keys_arg);
    let secret = "The merger of Acme and Globex closes on the first of March. ".repeat(4);
    let alice = "sk-alice-4f1c9e";

    // Alice's prompt, reused twice on agent a, is written through to Redis; other prompts then push it out
    // of a's pool and host RAM.
    for _ in 0..3 {
        cached(on_a.http, alice, &secret);
    }
    wait_until("alice's blocks in Redis", PATIENCE, || {
        let stored = agents[0].metric("kvroute_agent_tier_stored_blocks_total{tier=\"network\"}");
        if stored > 0.0 { Ok(stored) } else { Err("nothing stored in the network tier".into()) }
    })
    .unwrap();
    for filler in 0..6 {
        cached(on_a.http, alice, &format!("Unrelated filler text number {filler}. ").repeat(8));
    }

    // Bob, on the agent that held it and on one that never did: nothing cached, in any tier.
    for gateway in [&on_a, &on_b] {
        assert_eq!(cached(gateway.http, "sk-bob-77aa01", &secret), 0, "bob must not reuse alice's blocks");
    }
    // Carol has caching off: not even her own repeat is reused, and she leaves nothing cached behind.
    // The agent publishes its gauges with its finished-request count: wait until they show bob's request
    // (the only one agent b served), and after carol's, until they show hers and the agent's next heartbeats
    // (which carry any network-tier store) reached the gateway.
    agents[1].wait_finished(1).unwrap();
    let cached_blocks = metric_sum(agents[1].metrics, "kvroute_agent_kv_blocks_cached");
    let network_stores = metric_sum(agents[1].metrics, "kvroute_agent_tier_stored_blocks_total");
    for _ in 0..3 {
        assert_eq!(cached(on_b.http, "sk-carol-0b3e52", &secret), 0, "scope off: no reuse at all");
    }
    agents[1].wait_finished(4).unwrap();
    on_b.wait_next_batches(1).unwrap();
    assert_eq!(metric_sum(agents[1].metrics, "kvroute_agent_kv_blocks_cached"), cached_blocks);
    assert_eq!(metric_sum(agents[1].metrics, "kvroute_agent_tier_stored_blocks_total"), network_stores);

    // Alice's blocks were there all along: agent b reloads them from Redis for her.
    let network_hits = metric_sum(agents[1].metrics, "kvroute_agent_tier_hit_tokens_total{tier=\"network\"}");
    assert!(cached(on_b.http, alice, &secret) > 0, "alice reuses her prompt from the shared tier");
    assert!(
        metric_sum(agents[1].metrics, "kvroute_agent_tier_hit_tokens_total{tier=\"network\"}") > network_hits,
        "the hit came from Redis"
    );
}

#[test]
fn api_keys_and_prompt_text_never_reach_logs_metrics_or_error_messages() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, KEYS).unwrap();
    let (gateway_log, agent_log) = (dir.path().join("gateway.log"), dir.path().join("agent.log"));
    let filter = "debug";
    let agent = AgentProcess::start_logging(&["--model", "tiny-random", "--num-blocks", "64"], &agent_log, filter);
    let gateway = GatewayProcess::start_logging(
        &[agent.grpc],
        &["--api-keys", keys.to_str().unwrap(), "--max-body-bytes", "20000"],
        &gateway_log,
        filter,
    );
    let alice = "sk-alice-4f1c9e";
    let secret = "quartz-pelican-8842 launch codes";
    let mut answers = String::new();
    let mut ask = |key: &str, path: &str, body: Value| {
        let bearer = format!("Bearer {key}");
        let (status, response) = post_json(gateway.http, path, &[("Authorization", &bearer)], &body);
        if status != 200 {
            answers.push_str(&response.to_string());
        }
        status
    };
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": secret, "max_tokens": 3})), 200);
    let chat = json!({"messages": [{"role": "user", "content": secret}], "max_tokens": 3});
    assert_eq!(ask(alice, "/v1/chat/completions", chat), 200);
    let mut stream = EventStream::post(gateway.http, "/v1/completions", "{}").unwrap();
    assert_eq!(stream.status, 401, "no key, no stream");
    while stream.next_data().is_some() {}
    // Failures around the secret: wrong key, wrong types, unknown model, too long, too large, bad chat.
    assert_eq!(ask("sk-wrong-9d8c7b", "/v1/completions", json!({"prompt": secret})), 401);
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": secret, "max_tokens": "lots"})), 400);
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": secret, "model": "gpt-nope"})), 404);
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": format!("{secret} ").repeat(600)})), 400);
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": format!("{secret} ").repeat(1200)})), 413);
    let bad_chat = json!({"messages": [{"role": "user", "content": secret, "tool_calls": 5}]});
    assert_eq!(ask(alice, "/v1/chat/completions", bad_chat), 400);
    assert_eq!(ask(alice, "/v1/completions", json!({"prompt": [secret]})), 200);

    let metrics = [gateway.http, agent.metrics]
        .iter()
        .map(|addr| http_request(*addr, "GET", "/metrics", &[], b"").unwrap().text())
        .collect::<Vec<_>>()
        .join("\n");
    drop(gateway);
    drop(agent);
    let logs = std::fs::read_to_string(&gateway_log).unwrap() + &std::fs::read_to_string(&agent_log).unwrap();
    assert!(logs.lines().count() > 5, "the processes logged at debug level: {logs}");
    assert!(!answers.is_empty() && metrics.contains("kvroute_gateway_requests_total"));
    for (place, text) in [("logs", &logs), ("metrics", &metrics), ("error messages", &answers)] {
        for needle in ["sk-alice-4f1c9e", "sk-wrong-9d8c7b", "4f1c9e", "quartz-pelican", "launch codes"] {
            assert!(!text.contains(needle), "{needle:?} appears in the {place}");
        }
    }
}

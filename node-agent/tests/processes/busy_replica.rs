//! A busy replica behind a real gateway: its engine held inside one step (by a gate in front of the model,
//! in this process) while the agent serves gRPC on a real socket and a gateway process routes to it.
//!
//! - The step outlasts the gateway's heartbeat timeout many times over, and the replica stays healthy with
//!   its index entries: the agent's heartbeats come from outside the engine loop and say a step is running.
//! - While the step runs, the gateway counts exactly the requests it sent there (the accepted one and those
//!   still queued for the engine), and none once the agent reports them finished.
//! - A stream whose replica stays inside one step past the gateway's inter-token timeout is kept (its replica
//!   is alive) and finishes; one silent past the longest wait (`--first-token-timeout-ms`) is cut.
//! - Callers that go away before their first token (HTTP clients that disconnect, gRPC clients that cancel)
//!   cost the engine no work: their requests are dropped at its next step, with their blocks. Callers that
//!   go away while their stream is quiet end its call on the replica without waiting for its next token.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::thread::{EngineHandle, SharedSink, StreamIdentity};
use kvroute_node_agent::engine::tiering::PrefetchBudget;
use kvroute_node_agent::engine::{ChunkSpec, Engine, EngineConfig};
use kvroute_node_agent::model::{KvStore, Model};
use kvroute_node_agent::server::AgentService;
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::domain::{AgentInfo, KvDtype, Tier, TierInfo};
use kvroute_test_support::services::{EventStream, GatewayProcess, metric_sum};
use kvroute_test_support::{free_port, http_request, wait_until};

use crate::hooked::Hooked;

/// Holds every forward pass while closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    /// Forward passes that reached the gate.
    entered: AtomicUsize,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }

    /// Closes the gate and waits until the engine is held inside its next forward pass.
    fn hold_next_step(&self) {
        let entered = self.entered.load(Ordering::SeqCst);
        self.set_closed(true);
        wait_until("the engine to enter the held step", Duration::from_secs(30), || {
            let now = self.entered.load(Ordering::SeqCst);
            if now > entered { Ok(now) } else { Err(format!("{now} forward passes")) }
        })
        .unwrap();
    }

    fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
    }
}

/// A tiny-random agent in this process behind `gate`, serving on a loopback port until dropped.
struct GatedAgent {
    addr: SocketAddr,
    service: AgentService,
    engine: EngineHandle,
    gate: Arc<Gate>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GatedAgent {
    fn start(gate: Arc<Gate>) -> GatedAgent {
        GatedAgent::start_with(gate, EngineConfig::default())
    }

    fn start_with(gate: Arc<Gate>, engine_config: EngineConfig) -> GatedAgent {
        const BLOCKS: usize = 256;
        let model = Model::load("tiny-random").unwrap();
        let config = model.config().clone();
        let geometry = config.kv_geometry(KvDtype::Bf16);
        let eos = model.eos_token_ids().to_vec();
        let kv = KvStore::new(geometry, BLOCKS, DEFAULT_BLOCK_SIZE as usize);
        let sink = SharedSink::default();
        let engine_config = EngineConfig { max_context: config.max_context, ..engine_config };
        // The real tiny-random model, each forward pass waiting at the gate first.
        let hook_gate = gate.clone();
        let executor = Hooked::new(ModelExecutor::new(model, kv), move |_: &[ChunkSpec<'_>]| {
            hook_gate.pass();
            None
        });
        let engine = Engine::new(engine_config, executor, eos.clone(), Box::new(sink.clone()));
        let identity = StreamIdentity { agent_id: "gated".into(), epoch: 1 };
        let handle = EngineHandle::spawn(engine, sink, identity, None).unwrap();
        let info = AgentInfo {
            agent_id: "gated".into(),
            epoch: 1,
            model_id: "tiny-random".into(),
            block_size: DEFAULT_BLOCK_SIZE,
            kv_geometry: geometry,
            vocab_size: config.vocab_size as u32,
            max_context_tokens: config.max_context as u32,
            tiers: vec![TierInfo { tier: Tier::Gpu, enabled: true, capacity_bytes: 0 }],
            tokenizer_fingerprint: kvroute_tokenizer::Tokenizer::builtin().fingerprint().to_string(),
            kv_blocks_total: BLOCKS as u64,
            eos_token_ids: eos,
            engine_block_size: DEFAULT_BLOCK_SIZE,
        };
        let service = AgentService::new(handle.clone(), info, None, PrefetchBudget::new(0));
        let (served, engine) = (service.clone(), handle.clone());
        let listener = std::net::TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let shutdown = async move {
                    let _ = stopped.await;
                };
                kvroute_node_agent::run::serve_agent(listener, served, None, shutdown).await.unwrap();
            });
        });
        GatedAgent { addr, service, engine, gate, stop: Some(stop), thread: Some(thread) }
    }

    fn stats(&self) -> kvroute_node_agent::engine::EngineStats {
        futures::executor::block_on(self.engine.stats()).unwrap()
    }
}

impl Drop for GatedAgent {
    fn drop(&mut self) {
        // A held step would keep the engine thread, and so the agent's shutdown, waiting forever.
        self.gate.set_closed(false);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A completion of `prompt` (token ids) through the gateway; the status and body.
fn complete(gateway: SocketAddr, prompt: &[u32]) -> (u16, String) {
    let body = serde_json::json!({ "prompt": prompt, "max_tokens": 2 }).to_string();
    let headers = [("Content-Type", "application/json")];
    let response = http_request(gateway, "POST", "/v1/completions", &headers, body.as_bytes()).unwrap();
    (response.status, response.text())
}

fn prompt(first: u32) -> Vec<u32> {
    (first..first + 64).collect()
}

#[test]
fn a_step_longer_than_the_heartbeat_timeout_leaves_the_replica_healthy_and_its_load_exact() {
    let gate = Arc::new(Gate::default());
    let agent = GatedAgent::start(gate.clone());
    let log = tempfile::NamedTempFile::new().unwrap();
    let timeout_ms = 300;
    let gateway = GatewayProcess::start_logging(
        &[agent.addr],
        &["--heartbeat-timeout-ms", &timeout_ms.to_string(), "--policy", "least_loaded"],
        log.path(),
        "info",
    );
    let http = gateway.http;
    let metric = |name: &str| metric_sum(http, name);

    // A first request leaves its prompt's four blocks in the pool and the index.
    let (status, body) = complete(gateway.http, &prompt(1_000));
    assert_eq!(status, 200, "{body}");
    let entries = wait_until("the index to hold the first prompt's blocks", Duration::from_secs(30), || {
        let entries = metric("kvroute_gateway_index_entries");
        if entries >= 4.0 { Ok(entries) } else { Err(format!("{entries} entries")) }
    })
    .unwrap();

    // The next request's first step is held at the gate.
    gate.set_closed(true);
    let entered = gate.entered.load(Ordering::SeqCst);
    let held = std::thread::spawn(move || complete(http, &prompt(2_000)));
    wait_until("the engine to enter the held step", Duration::from_secs(30), || {
        let now = gate.entered.load(Ordering::SeqCst);
        if now > entered { Ok(now) } else { Err(format!("{now} forward passes")) }
    })
    .unwrap();
    // Two more requests queue behind the step, not yet accepted by the engine.
    let queued: Vec<_> =
        [3_000, 4_000].into_iter().map(|first| std::thread::spawn(move || complete(http, &prompt(first)))).collect();
    wait_until("the gateway to count the three requests it sent", Duration::from_secs(30), || {
        let in_flight = metric("kvroute_gateway_replica_requests_in_flight");
        if in_flight == 3.0 { Ok(()) } else { Err(format!("{in_flight} in flight")) }
    })
    .unwrap();

    // Heartbeats keep coming and report the step: it has run for many heartbeat timeouts.
    let long = 4.0 * f64::from(timeout_ms) / 1000.0;
    wait_until("a heartbeat reporting the step running past four timeouts", Duration::from_secs(60), || {
        let step = metric("kvroute_gateway_replica_step_seconds");
        if step > long { Ok(step) } else { Err(format!("step running {step} s")) }
    })
    .unwrap();
    assert_eq!(metric("kvroute_gateway_resubscriptions_total"), 0.0, "the replica was declared dead");
    assert_eq!(metric("kvroute_gateway_replica_healthy"), 1.0);
    assert!(metric("kvroute_gateway_index_entries") >= entries, "the replica's index entries were dropped");
    assert_eq!(metric("kvroute_gateway_replica_requests_in_flight"), 3.0, "still exactly the three sent");

    gate.set_closed(false);
    let (status, body) = held.join().unwrap();
    assert_eq!(status, 200, "{body}");
    for request in queued {
        let (status, body) = request.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    wait_until("the agent to report the requests finished", Duration::from_secs(30), || {
        let in_flight = metric("kvroute_gateway_replica_requests_in_flight");
        if in_flight == 0.0 { Ok(()) } else { Err(format!("{in_flight} in flight")) }
    })
    .unwrap();
    let log = std::fs::read_to_string(log.path()).unwrap();
    assert!(!log.contains("replica unhealthy"), "{log}");
}

/// Sends a streaming completion and leaves the connection open without reading; dropping it disconnects.
fn send_and_hold(gateway: SocketAddr, prompt: &[u32]) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::json!({ "prompt": prompt, "max_tokens": 8, "stream": true }).to_string();
    let mut stream = std::net::TcpStream::connect(gateway).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {gateway}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    stream
}

#[test]
fn twenty_callers_that_go_away_before_their_first_token_cost_the_engine_no_step() {
    let gate = Arc::new(Gate::default());
    // No queue-delay limit: twenty 1,024-token prompts are more prefill than this engine does in 10 s, and
    // this test is about callers leaving, not about admission refusing them.
    let config = EngineConfig { max_batch_tokens: 64, max_queue_delay: None, ..EngineConfig::default() };
    let agent = GatedAgent::start_with(gate.clone(), config);
    let gateway = GatewayProcess::start(&[agent.addr], &[]);
    let http = gateway.http;
    let metric = |name: &str| metric_sum(http, name);

    // A request that stays holds the engine inside its first step (the engine answers nothing else then).
    gate.set_closed(true);
    let blocker = std::thread::spawn(move || complete(http, &prompt(1)));
    wait_until("the engine to enter the held step", Duration::from_secs(30), || {
        let entered = gate.entered.load(Ordering::SeqCst);
        if entered > 0 { Ok(entered) } else { Err("no forward pass yet".into()) }
    })
    .unwrap();

    // Twenty long prompts queue behind it: ten over HTTP, ten over gRPC.
    let long = |caller: u32| -> Vec<u32> { (0..1024).map(|i| 5_000 + caller * 1_024 + i).collect() };
    let connections: Vec<_> = (0..10).map(|caller| send_and_hold(http, &long(caller))).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let calls: Vec<_> = (10..20)
        .map(|caller| {
            let request = kvroute_proto::pb::GenerateRequest {
                prompt: Some(kvroute_proto::pb::generate_request::Prompt::TokenIds(kvroute_proto::pb::TokenIds {
                    ids: long(caller),
                })),
                max_tokens: 8,
                ..Default::default()
            };
            let url = format!("http://{}", gateway.grpc);
            runtime.spawn(async move {
                let mut client = kvroute_proto::pb::generate_client::GenerateClient::connect(url).await.unwrap();
                client.generate(request).await
            })
        })
        .collect();
    wait_until("the agent to hold all twenty calls and the blocker", Duration::from_secs(30), || {
        let open = agent.service.open_streams();
        if open == 21 { Ok(()) } else { Err(format!("{open} open Generate calls")) }
    })
    .unwrap();

    // The callers go away; the agent sees their calls end while the engine is still held.
    drop(connections);
    for call in &calls {
        call.abort();
    }
    wait_until("the agent to see the twenty calls dropped", Duration::from_secs(30), || {
        let open = agent.service.open_streams();
        if open == 1 { Ok(()) } else { Err(format!("{open} open Generate calls")) }
    })
    .unwrap();
    gate.set_closed(false);
    let (status, body) = blocker.join().unwrap();
    assert_eq!(status, 200, "{body}");

    let stats = wait_until("the engine to drop the twenty requests", Duration::from_secs(30), || {
        let stats = agent.stats();
        if stats.requests_cancelled == 20 { Ok(stats) } else { Err(format!("{stats:?}")) }
    })
    .unwrap();
    assert_eq!(stats.prompt_tokens_total, 64, "only the blocker's prompt was admitted: {stats:?}");
    assert_eq!(stats.generated_tokens_total, 2, "only the blocker's 2 tokens were computed: {stats:?}");
    // The gateway's next reports show an idle replica: nothing waiting or running, no block in use.
    let batches = metric("kvroute_gateway_event_batches_total");
    wait_until("two more reports", Duration::from_secs(30), || {
        let now = metric("kvroute_gateway_event_batches_total");
        if now >= batches + 2.0 { Ok(()) } else { Err(format!("{now} batches")) }
    })
    .unwrap();
    for gauge in [
        "kvroute_gateway_replica_waiting_requests",
        "kvroute_gateway_replica_running_requests",
        "kvroute_gateway_replica_kv_usage_ratio",
        "kvroute_gateway_replica_requests_in_flight",
    ] {
        assert_eq!(metric(gauge), 0.0, "{gauge}");
    }
}

#[test]
fn an_attempt_the_gateway_gives_up_on_is_dropped_by_its_replica_at_its_next_step() {
    // Replica `held` computes a prompt 16 tokens a step, and its first step is held; the gateway waits five
    // seconds for a first token (`open` needs one step for the whole prompt), then retries on `open`.
    let (held_gate, open_gate) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
    let held =
        GatedAgent::start_with(held_gate.clone(), EngineConfig { max_batch_tokens: 16, ..EngineConfig::default() });
    let open = GatedAgent::start(open_gate.clone());
    let gateway = GatewayProcess::start(
        &[held.addr, open.addr],
        &["--first-token-timeout-ms", "5000", "--policy", "round_robin"],
    );
    let http = gateway.http;
    held_gate.set_closed(true);
    let long: Vec<u32> = (0..256).map(|i| 20_000 + i).collect();
    // Round-robin reaches `held` within two requests; each is served in the end (by `open`, on retry).
    for _ in 0..2 {
        let (status, body) = complete(http, &long);
        assert_eq!(status, 200, "{body}");
        if held_gate.entered.load(Ordering::SeqCst) > 0 {
            break;
        }
    }
    assert_eq!(held_gate.entered.load(Ordering::SeqCst), 1, "one attempt reached the held replica");
    assert_eq!(metric_sum(http, "kvroute_gateway_retries_total"), 1.0);
    wait_until("the held replica to see the abandoned call end", Duration::from_secs(30), || {
        let streams = held.service.open_streams();
        if streams == 0 { Ok(()) } else { Err(format!("{streams} open Generate calls")) }
    })
    .unwrap();

    held_gate.set_closed(false);
    let stats = wait_until("the held replica to drop the abandoned request", Duration::from_secs(30), || {
        let stats = held.stats();
        if stats.requests_cancelled == 1 { Ok(stats) } else { Err(format!("{stats:?}")) }
    })
    .unwrap();
    assert_eq!(stats.generated_tokens_total, 0, "the abandoned request computed no token: {stats:?}");
    assert_eq!(held_gate.entered.load(Ordering::SeqCst), 1, "nor another step of its prompt: {stats:?}");
}

/// Starts a streaming completion of `max_tokens` through `gateway`, reads its first event, then closes
/// `gate` and waits until the engine is held inside its next forward pass: the stream is silent from then on.
fn stream_then_hold(gateway: SocketAddr, gate: &Gate, max_tokens: u32) -> EventStream {
    let body = serde_json::json!({ "prompt": prompt(7_000), "max_tokens": max_tokens, "stream": true });
    let mut stream = EventStream::post(gateway, "/v1/completions", &body.to_string()).unwrap();
    assert_eq!(stream.status, 200);
    let first = stream.next_data().unwrap();
    assert!(first.contains("\"text\""), "{first}");
    gate.hold_next_step();
    stream
}

/// Every event left on `stream`.
fn rest_of(mut stream: EventStream) -> Vec<String> {
    std::iter::from_fn(|| stream.next_data()).collect()
}

#[test]
fn a_stream_silent_past_the_inter_token_timeout_while_its_replica_is_busy_is_kept_and_finishes() {
    let gate = Arc::new(Gate::default());
    let agent = GatedAgent::start(gate.clone());
    let gateway =
        GatewayProcess::start(&[agent.addr], &["--heartbeat-timeout-ms", "1000", "--inter-token-timeout-ms", "300"]);
    let metric = |name: &str| metric_sum(gateway.http, name);
    let max_tokens = 1_000;
    let stream = stream_then_hold(gateway.http, &gate, max_tokens);

    // The gateway asks after each 300 ms of silence, finds the replica alive, and waits on: three times
    // is 0.9 s without a token, three inter-token timeouts.
    wait_until("the gateway to wait out three silences", Duration::from_secs(30), || {
        let waits = metric("kvroute_gateway_quiet_stream_waits_total");
        if waits >= 3.0 { Ok(waits) } else { Err(format!("{waits} waits")) }
    })
    .unwrap();
    assert_eq!(metric("kvroute_gateway_resubscriptions_total"), 0.0, "the replica was declared dead");
    gate.set_closed(false);

    let events = rest_of(stream);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "the stream finished: {:?}", events.last());
    assert!(!events.iter().any(|event| event.contains("\"error\"")), "{events:?}");
    let finished = events.iter().rev().find(|event| event.contains("finish_reason\":\"")).unwrap();
    assert!(finished.contains("\"finish_reason\":\"length\""), "all {max_tokens} tokens came: {finished}");
}

#[test]
fn a_stream_silent_past_the_longest_wait_is_cut_though_its_replica_is_alive() {
    let gate = Arc::new(Gate::default());
    let agent = GatedAgent::start(gate.clone());
    let gateway = GatewayProcess::start(
        &[agent.addr],
        &["--heartbeat-timeout-ms", "1000", "--inter-token-timeout-ms", "300", "--first-token-timeout-ms", "1500"],
    );
    let stream = stream_then_hold(gateway.http, &gate, 1_000);

    let events = rest_of(stream);
    let last = events.last().cloned().unwrap_or_default();
    let error: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
    assert_eq!(error["error"]["code"], "interrupted", "the last event is an error: {last}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the longest a stream waits"), "{message}");
    assert_eq!(metric_sum(gateway.http, "kvroute_gateway_replica_healthy"), 1.0, "the replica is alive");
    assert!(metric_sum(gateway.http, "kvroute_gateway_quiet_stream_waits_total") >= 4.0);
}

/// Waits until `agent` holds `open` Generate calls.
fn wait_for_open_calls(agent: &GatedAgent, open: usize, what: &str) {
    wait_until(what, Duration::from_secs(30), || {
        let now = agent.service.open_streams();
        if now == open { Ok(()) } else { Err(format!("{now} open Generate calls")) }
    })
    .unwrap();
}

/// Waits until the engine has ended `requests` requests, and checks that it stopped each long before its
/// 1,000 tokens: the held step's token finds its caller gone.
fn ended(agent: &GatedAgent, requests: u64, whose: &str) {
    let stats = wait_until(&format!("the engine to end {whose} request"), Duration::from_secs(30), || {
        let stats = agent.stats();
        let ended = stats.requests_finished + stats.requests_cancelled;
        if ended == requests { Ok(stats) } else { Err(format!("{stats:?}")) }
    })
    .unwrap();
    assert!(stats.generated_tokens_total < 100 * requests, "{whose} request was not stopped: {stats:?}");
}

#[test]
fn callers_that_leave_a_quiet_stream_end_its_call_on_the_replica_before_the_next_token() {
    let gate = Arc::new(Gate::default());
    let agent = GatedAgent::start(gate.clone());
    let gateway =
        GatewayProcess::start(&[agent.addr], &["--heartbeat-timeout-ms", "1000", "--inter-token-timeout-ms", "300"]);

    // Over HTTP: the client closes its connection while the engine is held inside a step of its reply.
    let stream = stream_then_hold(gateway.http, &gate, 1_000);
    wait_for_open_calls(&agent, 1, "the agent to hold the HTTP caller's call");
    drop(stream);
    wait_for_open_calls(&agent, 0, "the agent to see the HTTP caller's call end while the engine is held");
    gate.set_closed(false);
    ended(&agent, 1, "the HTTP caller's");

    // Over gRPC: the client cancels its call likewise.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = format!("http://{}", gateway.grpc);
    let mut call = runtime.block_on(async {
        let mut client = kvroute_proto::pb::generate_client::GenerateClient::connect(url).await.unwrap();
        let request = kvroute_proto::pb::GenerateRequest {
            prompt: Some(kvroute_proto::pb::generate_request::Prompt::TokenIds(kvroute_proto::pb::TokenIds {
                ids: prompt(9_000),
            })),
            max_tokens: 1_000,
            ..Default::default()
        };
        client.generate(request).await.unwrap().into_inner()
    });
    let first = runtime.block_on(call.message()).unwrap().unwrap();
    assert!(!first.token_ids.is_empty(), "{first:?}");
    gate.hold_next_step();
    wait_for_open_calls(&agent, 1, "the agent to hold the gRPC caller's call");
    drop(call);
    wait_for_open_calls(&agent, 0, "the agent to see the gRPC caller's call end while the engine is held");
    gate.set_closed(false);
    ended(&agent, 2, "the gRPC caller's");
}

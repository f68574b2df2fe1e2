//! Faults over the real processes: agents killed mid-stream, frozen and
//! resumed, restarted one by one under load; a gateway restarted (its index
//! comes back from the agents' snapshots) and stopped with SIGTERM while a
//! stream is in flight; clients that drip their headers or body (HTTP and gRPC); Redis killed,
//! full, or holding corrupted records. Each test says what the client sees.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvroute_test_support::api::{cached_tokens, debug_route, gpu_blocks_by_replica, post_json};
use kvroute_test_support::services::{AgentProcess, EventStream, GatewayProcess, PATIENCE, metric_sum};
use kvroute_test_support::{RedisServer, wait_until};
use serde_json::{Value, json};

use crate::{HEARTBEAT_TIMEOUT_MS, serial};

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;
/// The gateway flags of these tests: a short heartbeat timeout, and the admin key `explain` sends.
const HEARTBEAT: &[&str] = &["--heartbeat-timeout-ms", HEARTBEAT_TIMEOUT_MS, "--admin-api-key", ADMIN_KEY];
const ADMIN_KEY: &str = "sk-faults-admin";

fn agents(count: usize, extra: &[&str]) -> Vec<AgentProcess> {
    (0..count)
        .map(|i| {
            let id = format!("agent-{i}");
            AgentProcess::start(
                &[&["--model", "tiny-random", "--num-blocks", "512", "--agent-id", &id], extra].concat(),
            )
        })
        .collect()
}

fn grpc_addrs(agents: &[AgentProcess]) -> Vec<SocketAddr> {
    agents.iter().map(|agent| agent.grpc).collect()
}

fn complete(http: SocketAddr, prompt: &str, max_tokens: u32) -> Value {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens});
    let (status, response) = post_json(http, "/v1/completions", &[], &body);
    assert_eq!(status, 200, "{response}");
    response
}

fn prompt(topic: &str) -> String {
    format!("You are a careful assistant for {topic}. ").repeat(12)
}

/// The replica the gateway would choose for `prompt`, and the GPU blocks it holds of it, per replica.
fn explain(http: SocketAddr, prompt: &str) -> (String, BTreeMap<String, u64>) {
    let explained = debug_route(http, ADMIN_KEY, &json!({"prompt": prompt}));
    (explained["chosen"].as_str().unwrap_or_default().to_string(), gpu_blocks_by_replica(&explained))
}

fn gpu_blocks_on(held: &BTreeMap<String, u64>, replica: &str) -> u64 {
    held.get(replica).copied().unwrap_or(0)
}

/// What one request of a [`Load`] got: its status (0: no HTTP answer), the response, and when it was sent.
type Answer = (u16, String, Instant);

/// Sends completions from `threads` threads until stopped; keeps every answer, which the test can watch
/// arrive.
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(http: SocketAddr, threads: usize, topics: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
        let threads = (0..threads)
            .map(|thread| {
                let (stop, answers) = (stop.clone(), answers.clone());
                std::thread::spawn(move || {
                    let mut i = thread;
                    while !stop.load(Ordering::Relaxed) {
                        let body = json!({"prompt": prompt(&format!("topic {}", i % topics)), "max_tokens": 4});
                        let sent = Instant::now();
                        let (status, response) = post_json(http, "/v1/completions", &[], &body);
                        answers.lock().unwrap().push((status, response.to_string(), sent));
                        i += 1;
                    }
                })
            })
            .collect();
        Load { stop, answers, threads }
    }

    /// Waits until `count` more requests than now were answered (with anything): the load runs on.
    fn wait_for_more(&self, count: usize) {
        self.wait_for_sent_after(Instant::now(), count);
    }

    /// Waits until `count` requests sent after `since` were answered (with anything).
    fn wait_for_sent_after(&self, since: Instant, count: usize) {
        wait_until(&format!("{count} answers to requests sent after {since:?}"), PATIENCE, || {
            let answered = self.answers.lock().unwrap().iter().filter(|(.., sent)| *sent > since).count();
            if answered >= count { Ok(answered) } else { Err(format!("{answered} answered")) }
        })
        .unwrap();
    }

    fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        std::mem::take(&mut *self.answers.lock().unwrap())
    }
}

/// Waits until the gateway's index knows a replica holding `text`'s blocks: returns the replica it would
/// choose and the GPU blocks each holds.
fn wait_for_holder(http: SocketAddr, text: &str) -> (String, BTreeMap<String, u64>) {
    wait_until("the index to know who holds the prompt", PATIENCE, || {
        let (chosen, held) = explain(http, text);
        if gpu_blocks_on(&held, &chosen) > 0 { Ok((chosen, held)) } else { Err(format!("{chosen:?} {held:?}")) }
    })
    .unwrap()
}

fn assert_all_succeeded(seen: &[Answer], at_least: usize) {
    let failed: Vec<&Answer> = seen.iter().filter(|(status, ..)| *status != 200).collect();
    assert!(failed.is_empty(), "{} of {} requests failed, e.g. {:?}", failed.len(), seen.len(), failed.first());
    assert!(seen.len() >= at_least, "only {} requests ran", seen.len());
}

#[test]
fn an_agent_killed_mid_stream_ends_that_stream_cleanly_and_later_requests_fail_over() {
    let _serial = serial();
    let agents = agents(2, &[]);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let text = prompt("mid-stream failures");
    complete(gateway.http, &text, 1);
    let (holder, held) = wait_for_holder(gateway.http, &text);
    assert!(gpu_blocks_on(&held, &holder) > 0, "the index knows who holds the prompt: {held:?}");
    let index = agents.iter().position(|agent| agent.grpc.to_string() == holder).unwrap();

    let body = json!({"prompt": text, "max_tokens": 3000, "stream": true});
    let mut stream = EventStream::post(gateway.http, "/v1/completions", &body.to_string()).unwrap();
    assert_eq!(stream.status, 200);
    let first = stream.next_data().unwrap();
    assert!(first.contains("\"text\""), "{first}");
    agents[index].process.signal(SIGKILL).unwrap();
    let mut last = String::new();
    while let Some(data) = stream.next_data() {
        last = data;
    }
    assert_ne!(last, "[DONE]", "the stream cannot finish: its replica died");
    let error: Value = serde_json::from_str(&last).unwrap_or(Value::Null);
    assert_eq!(error["error"]["code"], "interrupted", "the last event is an error in OpenAI's shape: {last}");

    // At once (before the heartbeat timeout), and after it, requests succeed on the surviving replica.
    for _ in 0..3 {
        complete(gateway.http, &text, 2);
    }
    gateway.wait_healthy(1, Duration::from_secs(5)).unwrap();
    gateway.wait_next_batches(1).unwrap();
    let (chosen, held) = explain(gateway.http, &text);
    assert_ne!(chosen, holder);
    assert_eq!(gpu_blocks_on(&held, &holder), 0, "the dead replica's index entries are gone: {held:?}");
}

#[test]
fn a_stream_whose_agent_stops_heartbeating_is_cut_once_it_is_unhealthy_not_at_the_longest_wait() {
    let _serial = serial();
    let agents = agents(1, &[]);
    let flags = [HEARTBEAT, &["--inter-token-timeout-ms", "500"]].concat();
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), &flags);
    let body = json!({"prompt": prompt("frozen streams"), "max_tokens": 3000, "stream": true});
    let mut stream = EventStream::post(gateway.http, "/v1/completions", &body.to_string()).unwrap();
    assert_eq!(stream.status, 200);
    let first = stream.next_data().unwrap();
    assert!(first.contains("\"text\""), "{first}");

    agents[0].process.signal(SIGSTOP).unwrap();
    let mut last = String::new();
    while let Some(data) = stream.next_data() {
        last = data;
    }
    agents[0].process.signal(SIGCONT).unwrap();
    let error: Value = serde_json::from_str(&last).unwrap_or(Value::Null);
    assert_eq!(error["error"]["code"], "interrupted", "the last event is an error: {last}");
    // Not the 120 s a live replica is waited for: the stream ends at the first check after the heartbeats stop.
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("heartbeats stopped"), "{message}");
}

#[test]
fn a_frozen_agent_is_marked_unhealthy_then_readmitted_with_a_fresh_snapshot() {
    let _serial = serial();
    let agents = agents(2, &[]);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let text = prompt("frozen replicas");
    complete(gateway.http, &text, 1);
    let (holder, _) = wait_for_holder(gateway.http, &text);
    let frozen = agents.iter().find(|agent| agent.grpc.to_string() == holder).unwrap();
    let resubscriptions = metric_sum(gateway.http, "kvroute_gateway_resubscriptions_total");

    frozen.process.signal(SIGSTOP).unwrap();
    let frozen_at = Instant::now();
    gateway.wait_healthy(1, Duration::from_secs(5)).unwrap();
    assert!(frozen_at.elapsed() < Duration::from_secs(4), "marked unhealthy within the heartbeat timeout");
    let body = json!({"prompt": text, "max_tokens": 2});
    let (status, response) = post_json(gateway.http, "/v1/completions", &[], &body);
    assert_eq!(status, 200, "served by the other replica meanwhile: {response}");
    assert_eq!(cached_tokens(&response), 0, "the other replica never held the prompt");
    gateway.wait_next_batches(1).unwrap();
    let (_, held) = explain(gateway.http, &text);
    assert_eq!(gpu_blocks_on(&held, &holder), 0, "an unhealthy replica's entries are dropped: {held:?}");

    frozen.process.signal(SIGCONT).unwrap();
    gateway.wait_healthy(2, Duration::from_secs(15)).unwrap();
    assert!(metric_sum(gateway.http, "kvroute_gateway_resubscriptions_total") > resubscriptions);
    // Its fresh snapshot brought back what it holds (the other replica now holds the prompt too, so either
    // may be chosen), and the prompt is served from cache.
    let (_, held) = explain(gateway.http, &text);
    assert!(gpu_blocks_on(&held, &holder) > 0, "the readmitted replica's blocks are indexed again: {held:?}");
    assert!(cached_tokens(&complete(gateway.http, &text, 2)) > 0);
}

#[test]
fn a_restarted_gateway_rebuilds_its_index_from_snapshots() {
    let _serial = serial();
    let agents = agents(2, &[]);
    let mut gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let topics: Vec<String> = (0..6).map(|i| prompt(&format!("restart topic {i}"))).collect();
    for text in &topics {
        complete(gateway.http, text, 1);
    }
    let holders: Vec<String> = topics.iter().map(|text| wait_for_holder(gateway.http, text).0).collect();

    // Under load: requests sent while it is down fail to connect; every request sent once it is ready succeeds.
    let load = Load::start(gateway.http, 2, 6);
    load.wait_for_more(2);
    gateway.process.signal(SIGKILL).unwrap();
    gateway.restart();
    gateway.wait_healthy(2, Duration::from_secs(30)).unwrap();
    let ready_at = Instant::now();
    load.wait_for_sent_after(ready_at, 4);
    let seen = load.finish();
    let after: Vec<&Answer> = seen.iter().filter(|(.., sent)| *sent > ready_at).collect();
    assert!(after.len() >= 2 && after.iter().all(|(status, ..)| *status == 200), "after the restart: {after:?}");
    for (text, holder) in topics.iter().zip(&holders) {
        let (chosen, held) = explain(gateway.http, text);
        assert_eq!(&chosen, holder, "the new gateway routes to the holder: {held:?}");
        assert!(cached_tokens(&complete(gateway.http, text, 1)) > 0);
    }
}

#[test]
fn sigterm_on_the_gateway_finishes_the_stream_in_flight_then_exits_zero() {
    let _serial = serial();
    let agents = agents(1, &[]);
    // A grace long enough for the whole stream on a busy machine: the test is about draining, not the default.
    let args = [HEARTBEAT, &["--shutdown-grace-secs", "300"]].concat();
    let mut gateway = GatewayProcess::start(&grpc_addrs(&agents), &args);
    let body = json!({"prompt": prompt("shutdown"), "max_tokens": 1500, "stream": true});
    let mut stream = EventStream::post(gateway.http, "/v1/completions", &body.to_string()).unwrap();
    assert_eq!(stream.status, 200);
    assert!(stream.next_data().unwrap().contains("\"text\""));
    gateway.process.signal(SIGTERM).unwrap();
    wait_until("no new connection accepted after SIGTERM", PATIENCE, || match TcpStream::connect(gateway.http) {
        Err(_) => Ok(()),
        Ok(_) => Err("a connection was accepted".into()),
    })
    .unwrap();
    let mut after = Vec::new();
    while let Some(data) = stream.next_data() {
        after.push(data);
    }
    assert!(after.len() > 10, "the stream went on after SIGTERM ({} events)", after.len());
    assert_eq!(after.last().map(String::as_str), Some("[DONE]"), "and finished normally");
    assert_eq!(gateway.process.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn clients_that_drip_their_headers_or_body_are_cut_off() {
    let _serial = serial();
    let agents = agents(1, &[]);
    let args = [HEARTBEAT, &["--header-read-timeout-ms", "1000", "--body-read-timeout-ms", "1000"]].concat();
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), &args);

    // Headers, one line every 200 ms, never finished: the connection is closed.
    let mut slow = TcpStream::connect(gateway.http).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\n").unwrap();
    let started = Instant::now();
    let closed_after = loop {
        let mut buffer = [0u8; 512];
        match slow.read(&mut buffer) {
            Ok(0) => break started.elapsed(),
            Ok(read) => {
                // hyper may answer before closing; anything it says must not be a success.
                assert!(!String::from_utf8_lossy(&buffer[..read]).contains(" 200 "));
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break started.elapsed(),
        }
        if slow.write_all(b"X-Drip: 1\r\n").is_err() {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "a dripping client kept its connection");
    };
    assert!(closed_after >= Duration::from_millis(800), "closed after {closed_after:?}, before the timeout");

    // A body that stops halfway: 408 with an error body once the body timeout passes.
    let mut slow = TcpStream::connect(gateway.http).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\nConnection: close\r\n\r\n{\"prompt\": ",
    )
    .unwrap();
    let started = Instant::now();
    let mut response = Vec::new();
    let _ = slow.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(response.contains("\"code\":\"timeout\""), "{response}");
    assert!(started.elapsed() >= Duration::from_millis(900) && started.elapsed() < Duration::from_secs(5));

    // gRPC: a request message announced as 100 bytes, of which 5 arrive: DEADLINE_EXCEEDED, the stream freed.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (status, took) = runtime.block_on(grpc_with_a_stalled_message(gateway.grpc));
    assert_eq!(status.as_deref(), Some("4"), "grpc-status DEADLINE_EXCEEDED");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "answered after {took:?}");

    // Well-behaved clients are unaffected.
    complete(gateway.http, "hello", 2);
}

/// Calls Generate over a raw HTTP/2 connection, sending only the start of the request message; returns the
/// grpc-status the gateway answers with and how long that took.
async fn grpc_with_a_stalled_message(addr: SocketAddr) -> (Option<String>, Duration) {
    use http_body_util::BodyExt;
    type Chunk = Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(executor, hyper_util::rt::TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(connection);
    let (chunks, stream) = tokio::sync::mpsc::channel::<Chunk>(4);
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(stream));
    let request = hyper::Request::post(format!("http://{addr}/kvroute.v1.Generate/Generate"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    // The 5-byte gRPC prefix (uncompressed, 100 bytes long), then 5 of the 100 bytes, then silence.
    chunks.send(Ok(hyper::body::Frame::data(bytes::Bytes::from_static(&[0, 0, 0, 0, 100])))).await.unwrap();
    chunks.send(Ok(hyper::body::Frame::data(bytes::Bytes::from_static(&[10, 3, 97, 98, 99])))).await.unwrap();
    let started = Instant::now();
    let response = sender.send_request(request).await.unwrap();
    let header_status = response.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_string());
    let collected = response.into_body().collect().await.unwrap();
    let trailer_status =
        collected.trailers().and_then(|t| t.get("grpc-status")).map(|v| v.to_str().unwrap().to_string());
    drop(chunks);
    (header_status.or(trailer_status), started.elapsed())
}

#[test]
fn a_rolling_restart_of_the_agents_under_load_fails_no_request() {
    let _serial = serial();
    let mut agents = agents(2, &[]);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let load = Load::start(gateway.http, 2, 8);
    load.wait_for_more(4);
    for agent in &mut agents {
        agent.process.signal(SIGTERM).unwrap();
        assert_eq!(agent.process.wait_exit(Duration::from_secs(30)), Some(0), "the agent drains and exits");
        agent.restart();
        gateway.wait_healthy(2, Duration::from_secs(30)).unwrap();
        load.wait_for_more(4);
    }
    assert_all_succeeded(&load.finish(), 10);
}

/// Agents whose pools and host tiers overflow quickly, sharing `redis`.
fn tiered_agents(count: usize, redis: &RedisServer) -> Vec<AgentProcess> {
    (0..count)
        .map(|i| AgentProcess::start_tiered(&redis.url(), &format!("agent-{i}"), &["--redis-timeout-ms", "200"]))
        .collect()
}

#[test]
fn redis_killed_and_restarted_under_load_fails_no_request() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let agents = tiered_agents(2, &redis);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let load = Load::start(gateway.http, 2, 12);
    // The load runs, and its spills reach Redis.
    load.wait_for_more(4);
    wait_until("blocks stored in Redis", PATIENCE, || {
        let stored: f64 =
            agents.iter().map(|agent| agent.metric("kvroute_agent_tier_stored_blocks_total{tier=\"network\"}")).sum();
        if stored > 0.0 { Ok(stored) } else { Err("nothing stored".into()) }
    })
    .unwrap();
    redis.kill();
    let tier_up = |agents: &[AgentProcess], up: f64| {
        let states: Vec<f64> =
            agents.iter().map(|agent| agent.metric("kvroute_agent_tier_up{tier=\"network\"}")).collect();
        if states.iter().all(|state| *state == up) { Ok(()) } else { Err(format!("network tier up: {states:?}")) }
    };
    wait_until("the agents reporting the network tier down", Duration::from_secs(10), || tier_up(&agents, 0.0))
        .unwrap();
    // The load goes on while Redis is down, and after it is back.
    load.wait_for_more(4);
    redis.restart();
    wait_until("the agents reconnecting", Duration::from_secs(20), || tier_up(&agents, 1.0)).unwrap();
    load.wait_for_more(4);
    assert_all_succeeded(&load.finish(), 10);
}

/// The keys of a Redis `KEYS *` reply.
fn keys(redis: &RedisServer) -> Vec<Vec<u8>> {
    let reply = redis.command(&[b"KEYS", b"*"]).unwrap();
    let text = String::from_utf8_lossy(&reply).into_owned();
    let lines: Vec<&str> = text.split("\r\n").collect();
    lines
        .iter()
        .skip(1)
        .filter(|line| !line.starts_with('$') && !line.is_empty())
        .map(|key| key.as_bytes().to_vec())
        .collect()
}

fn info_field(redis: &RedisServer, field: &str) -> u64 {
    let reply = String::from_utf8_lossy(&redis.command(&[b"INFO"]).unwrap()).into_owned();
    reply
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {field}"))
}

#[test]
fn redis_at_maxmemory_with_allkeys_lru_keeps_serving() {
    let _serial = serial();
    let redis = RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
    let agents = tiered_agents(1, &redis);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let agent = agents[0].metrics;
    let mut round = 0;
    while info_field(&redis, "evicted_keys") == 0 {
        assert!(round < 200, "Redis never reached maxmemory");
        complete(gateway.http, &prompt(&format!("filler {round}")), 1);
        round += 1;
    }
    // Full and evicting: spills keep being written and requests keep succeeding.
    let stored = metric_sum(agent, "kvroute_agent_tier_stored_blocks_total{tier=\"network\"}");
    for more in 0..20 {
        complete(gateway.http, &prompt(&format!("filler {}", round + more)), 1);
    }
    wait_until("more blocks in Redis once it was full", Duration::from_secs(10), || {
        let now = metric_sum(agent, "kvroute_agent_tier_stored_blocks_total{tier=\"network\"}");
        if now > stored { Ok(now) } else { Err(format!("{now} stored, {stored} when it was full")) }
    })
    .unwrap();
    // Before the checks that nothing failed: the agent's next heartbeats, after any write still in flight.
    gateway.wait_next_batches(1).unwrap();
    assert_eq!(metric_sum(agent, "kvroute_agent_tier_up{tier=\"network\"}"), 1.0);
    assert_eq!(metric_sum(agent, "kvroute_agent_redis_errors_total"), 0.0, "allkeys-lru never refuses a write");
}

#[test]
fn corrupted_redis_records_are_detected_counted_and_recomputed() {
    let _serial = serial();
    let redis = RedisServer::start();
    let agents = tiered_agents(2, &redis);
    // One gateway per agent, so the test decides which replica serves.
    let on_a = GatewayProcess::start(&[agents[0].grpc], HEARTBEAT);
    let on_b = GatewayProcess::start(&[agents[1].grpc], HEARTBEAT);
    let text = prompt("corruption");
    let body = json!({"prompt": text, "max_tokens": 8});
    let (_, cold) = post_json(on_a.http, "/v1/completions", &[], &body);
    // Reused twice, the prompt's blocks are written through to Redis.
    for _ in 0..2 {
        complete(on_a.http, &text, 8);
    }
    let blocks = cold["usage"]["prompt_tokens"].as_u64().unwrap() as usize / 16;
    wait_until("the prompt's blocks in Redis", Duration::from_secs(10), || match keys(&redis).len() {
        held if held >= blocks => Ok(held),
        held => Err(format!("{held} keys")),
    })
    .unwrap();
    for key in keys(&redis) {
        let reply = redis.command(&[b"SETRANGE", &key, b"100", b"corrupted bytes"]).unwrap();
        assert!(reply.starts_with(b":"), "{}", String::from_utf8_lossy(&reply));
    }
    let (status, on_b_response) = post_json(on_b.http, "/v1/completions", &[], &body);
    assert_eq!(status, 200, "{on_b_response}");
    assert_eq!(on_b_response["choices"][0]["text"], cold["choices"][0]["text"], "recomputed: the same greedy text");
    assert_eq!(cached_tokens(&on_b_response), 0, "nothing corrupted was used");
    assert!(metric_sum(agents[1].metrics, "kvroute_agent_tier_corrupt_total") > 0.0);
}

#[test]
fn past_capacity_admission_answers_429_and_every_accepted_request_completes() {
    let _serial = serial();
    // Room for 2 running and 2 waiting requests; 12 arrive at once.
    let agents = agents(1, &["--max-running", "2", "--max-waiting", "2"]);
    let gateway = GatewayProcess::start(&grpc_addrs(&agents), HEARTBEAT);
    let http = gateway.http;
    let answers: Vec<(u16, Value, Duration)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..12)
            .map(|i| {
                scope.spawn(move || {
                    let started = Instant::now();
                    let body = json!({"prompt": prompt(&format!("overload {i}")), "max_tokens": 200});
                    let (status, response) = post_json(http, "/v1/completions", &[], &body);
                    (status, response, started.elapsed())
                })
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().unwrap()).collect()
    });
    let rejected: Vec<&(u16, Value, Duration)> = answers.iter().filter(|(status, ..)| *status == 429).collect();
    let accepted: Vec<&(u16, Value, Duration)> = answers.iter().filter(|(status, ..)| *status == 200).collect();
    assert_eq!(rejected.len() + accepted.len(), answers.len(), "only 200 or 429: {answers:?}");
    assert!(!rejected.is_empty(), "12 requests cannot all fit in 4 places");
    // The gateway counts requests it sent since the agent's last report as queued, so a burst that arrives
    // within one report is admitted up to the queue's size (here, the 2 that then run).
    assert!(accepted.len() >= 2, "the agent's capacity was used: {} accepted", accepted.len());
    for (_, response, _) in &rejected {
        assert_eq!(response["error"]["type"], "rate_limit_error", "{response}");
    }
    for (_, response, _) in &accepted {
        assert_eq!(response["usage"]["completion_tokens"], 200, "an accepted request runs to its end: {response}");
    }
    // Refusals do not wait for the work they were refused behind.
    let slowest_refusal = rejected.iter().map(|(.., took)| *took).max().unwrap();
    let slowest_accepted = accepted.iter().map(|(.., took)| *took).max().unwrap();
    assert!(slowest_refusal < slowest_accepted, "refused in {slowest_refusal:?}, served in {slowest_accepted:?}");
    // The agent's counters as of after the accepted requests finished.
    agents[0].wait_finished(accepted.len()).unwrap();
    assert_eq!(metric_sum(agents[0].metrics, "kvroute_agent_preemptions_total"), 0.0);
}

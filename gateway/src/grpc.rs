//! The gRPC ingress: `kvroute.v1.Generate` with the same semantics as the
//! HTTP API, and status codes from [`ServiceError::grpc_code`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use kvroute_proto::pb;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::cpu_pool::CpuPool;
use crate::metrics;
use crate::prompts::{PromptSource, Prompts};
use crate::request_checks::{self, Limits, Params};
use crate::service::{Gateway, ServiceError, StreamEvent, next_for_caller};
use crate::tenants::{AuthError, Tenants, bearer};

/// The client-facing gRPC service.
#[derive(Clone)]
pub struct GenerateService {
    gateway: Arc<Gateway>,
    tenants: Tenants,
    prompts: Arc<Prompts>,
    cpu: Arc<CpuPool>,
    limits: Limits,
}

impl GenerateService {
    pub fn new(
        gateway: Arc<Gateway>,
        tenants: Tenants,
        prompts: Arc<Prompts>,
        cpu: Arc<CpuPool>,
        limits: Limits,
    ) -> GenerateService {
        GenerateService { gateway, tenants, prompts, cpu, limits }
    }

    /// The server, refusing request messages over `max_request_bytes` (as HTTP refuses larger bodies).
    pub fn into_server(self, max_request_bytes: usize) -> pb::generate_server::GenerateServer<GenerateService> {
        pb::generate_server::GenerateServer::new(self).max_decoding_message_size(max_request_bytes)
    }
}

/// The parameters of a gRPC request, for [`request_checks::check`]. proto3 cannot leave a number unset,
/// so 0 `max_tokens` means the default, and a request without `sampling` is greedy.
pub fn params(request: &pb::GenerateRequest) -> Params {
    let sampling = request.sampling.unwrap_or(pb::SamplingParams { temperature: 0.0, top_p: 1.0, seed: None });
    Params {
        max_tokens: (request.max_tokens != 0).then_some(i64::from(request.max_tokens)),
        temperature: Some(sampling.temperature),
        top_p: Some(sampling.top_p),
        seed: sampling.seed,
        stop: request.stop.clone(),
        n: None,
        cache_salt: request.tenant.as_ref().map(|tenant| tenant.cache_salt.clone()),
        user: None,
    }
}

fn status_of(error: &ServiceError) -> Status {
    Status::new(error.grpc_code(), error.to_string())
}

fn fail(error: ServiceError) -> Status {
    metrics::record_request("grpc_generate", error.http_status());
    if matches!(error, ServiceError::Overloaded(_) | ServiceError::NoReplica(_)) {
        metrics::record_rejection(error.reason_label());
    }
    status_of(&error)
}

type GenerateStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::generate_server::Generate for GenerateService {
    type GenerateStream = GenerateStream;

    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<Self::GenerateStream>, Status> {
        let started = Instant::now();
        let key = request.metadata().get("authorization").and_then(|value| value.to_str().ok());
        let tenant = self.tenants.authenticate(bearer(key)).map_err(|error| {
            fail(match error {
                AuthError::Missing => {
                    ServiceError::Unauthorized("missing API key: send `authorization: Bearer KEY`".into())
                }
                AuthError::Invalid => ServiceError::Unauthorized("invalid API key".into()),
            })
        })?;
        let request = request.into_inner();
        let requested = (!request.model.is_empty()).then_some(request.model.as_str());
        self.gateway.check_model(requested).map_err(fail)?;
        let checked = request_checks::check(&params(&request), &self.limits).map_err(fail)?;
        let prompt = match request.prompt {
            Some(pb::generate_request::Prompt::Text(text)) => {
                let source = PromptSource::Text(text);
                let prompts = self.prompts.clone();
                self.cpu.run(source.input_bytes(), move || prompts.tokens(source)).await.and_then(|ids| ids)
            }
            Some(pb::generate_request::Prompt::TokenIds(ids)) => Ok(ids.ids),
            None => Ok(Vec::new()),
        }
        .map_err(fail)?;
        request_checks::check_prompt(&prompt).map_err(fail)?;
        let spec = checked.into_spec(tenant, prompt);
        let mut receiver = self.gateway.generate(spec).await.map_err(fail)?;
        metrics::record_ttft("grpc_generate", started.elapsed());
        metrics::record_request("grpc_generate", 200);
        let (sender, out) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            while let Some(event) = next_for_caller(&mut receiver, &sender).await {
                let message = match event {
                    Ok(StreamEvent::Delta { token_ids, text }) => Ok(pb::GenerateResponse {
                        token_ids,
                        text,
                        usage: None,
                        finish_reason: pb::FinishReason::Unspecified as i32,
                    }),
                    Ok(StreamEvent::Finished { reason, usage }) => {
                        metrics::record_e2e("grpc_generate", started.elapsed());
                        Ok(pb::GenerateResponse {
                            token_ids: Vec::new(),
                            text: String::new(),
                            usage: Some(usage.into()),
                            finish_reason: pb::FinishReason::from(reason) as i32,
                        })
                    }
                    Err(error) => Err(status_of(&error)),
                };
                if sender.send(message).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }
}

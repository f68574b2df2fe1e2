//! The gRPC ingress: `kvroute.v1.Generate` with the same semantics as the
//! HTTP API, and status codes from [`ServiceError::grpc_code`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use kvroute_proto::domain::SamplingParams;
use kvroute_proto::pb;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::metrics;
use crate::service::{Gateway, GenerateSpec, ServiceError, StreamEvent};
use crate::tenants::{AuthError, Tenants, bearer};

/// The client-facing gRPC service.
#[derive(Clone)]
pub struct GenerateService {
    gateway: Arc<Gateway>,
    tenants: Tenants,
}

impl GenerateService {
    pub fn new(gateway: Arc<Gateway>, tenants: Tenants) -> GenerateService {
        GenerateService { gateway, tenants }
    }

    pub fn into_server(self) -> pb::generate_server::GenerateServer<GenerateService> {
        pb::generate_server::GenerateServer::new(self)
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
        let prompt = match request.prompt {
            Some(pb::generate_request::Prompt::Text(text)) => self.gateway.tokenizer.encode(&text),
            Some(pb::generate_request::Prompt::TokenIds(ids)) => ids.ids,
            None => Vec::new(),
        };
        if prompt.is_empty() {
            return Err(fail(ServiceError::bad_request("the prompt is empty", Some("prompt"))));
        }
        let sampling = match request.sampling {
            Some(wire) => SamplingParams::new(wire.temperature, wire.top_p, wire.seed)
                .map_err(|error| fail(ServiceError::bad_request(error.to_string(), None)))?,
            None => SamplingParams::GREEDY,
        };
        let tenant_meta = request.tenant.unwrap_or_default();
        let spec = GenerateSpec {
            prompt,
            tenant,
            cache_salt: (!tenant_meta.cache_salt.is_empty()).then_some(tenant_meta.cache_salt),
            sampling,
            max_tokens: if request.max_tokens == 0 {
                self.gateway.config.default_max_tokens
            } else {
                request.max_tokens
            },
            stop: request.stop,
        };
        let mut receiver = self.gateway.generate(spec).await.map_err(fail)?;
        metrics::record_ttft("grpc_generate", started.elapsed());
        metrics::record_request("grpc_generate", 200);
        let (sender, out) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            while let Some(event) = receiver.recv().await {
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
                            usage: Some(pb::Usage {
                                prompt_tokens: usage.prompt_tokens,
                                completion_tokens: usage.completion_tokens,
                                cached_tokens: usage.cached_tokens,
                            }),
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

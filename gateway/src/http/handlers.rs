//! HTTP handlers: parse and validate, build a [`GenerateSpec`], run it through
//! the [`Gateway`], and answer in OpenAI's shapes (JSON or SSE).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvroute_proto::domain::{FinishReason, SamplingParams};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::openai::*;
use super::{AppState, error_response, response_id, unix_now};
use crate::metrics;
use crate::service::{GenerateSpec, ServiceError, StreamEvent, Usage};
use crate::tenants::{AuthError, Tenant, bearer};

type Shared = State<Arc<AppState>>;

const OPENAPI: &str = include_str!("../../openapi.json");

/// Records the request's status and builds the error response.
fn fail(route: &'static str, error: ServiceError) -> Response {
    metrics::record_request(route, error.http_status());
    if matches!(error, ServiceError::Overloaded(_) | ServiceError::NoReplica(_)) {
        metrics::record_rejection(error.reason_label());
    }
    error_response(&error)
}

fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Tenant, ServiceError> {
    let value = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    state.tenants.authenticate(bearer(value)).map_err(|error| match error {
        AuthError::Missing => ServiceError::Unauthorized("missing API key: send `Authorization: Bearer KEY`".into()),
        AuthError::Invalid => ServiceError::Unauthorized("invalid API key".into()),
    })
}

/// Reads the body within the size limit and parses it as JSON.
async fn parse_body<T: DeserializeOwned>(state: &AppState, body: Body) -> Result<T, ServiceError> {
    let read = tokio::time::timeout(state.body_read_timeout, axum::body::to_bytes(body, state.max_body_bytes));
    let bytes: Bytes = read
        .await
        .map_err(|_| {
            ServiceError::Timeout(format!(
                "the request body did not arrive within {} ms",
                state.body_read_timeout.as_millis()
            ))
        })?
        .map_err(|_| ServiceError::TooLarge(format!("the request body exceeds {} bytes", state.max_body_bytes)))?;
    parse_json(&bytes)
}

/// Parses a request body as JSON into `T`, naming the offending field on error. Outside bytes: fuzzed.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ServiceError> {
    if std::str::from_utf8(bytes).is_err() {
        return Err(ServiceError::bad_request("the request body is not valid UTF-8", None));
    }
    let mut json = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut json) {
        Ok(request) => json.end().map(|()| request).map_err(|error| bad_body(&error)),
        Err(error) => Err(explain(error, serde_json::from_slice(bytes).ok().as_ref())),
    }
}

/// Deserializes a request from parsed JSON, naming the offending field on error.
fn from_json<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ServiceError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|error| explain(error, Some(value)))
}

/// The error of a body that did not deserialize. A flattened struct hides which of its fields failed, so
/// when the error has no path, the shared parameters are checked on their own to name the field.
fn explain<E: std::fmt::Display>(
    error: serde_path_to_error::Error<E>,
    value: Option<&serde_json::Value>,
) -> ServiceError {
    if error.path().to_string() == "."
        && let Some(value) = value.filter(|value| value.is_object())
        && let Err(common) = serde_path_to_error::deserialize::<_, CommonParams>(value)
    {
        return invalid_body(common);
    }
    invalid_body(error)
}

fn bad_body(error: &dyn std::fmt::Display) -> ServiceError {
    ServiceError::bad_request(format!("invalid request body: {error}"), None)
}

fn invalid_body<E: std::fmt::Display>(error: serde_path_to_error::Error<E>) -> ServiceError {
    let path = error.path().to_string();
    if path == "." { bad_body(error.inner()) } else { bad_body(&format!("{path}: {}", error.inner())) }
}

/// Validates the fields both endpoints share and builds the spec of a request for `prompt`.
pub fn spec_from(
    common: &CommonParams,
    tenant: Tenant,
    prompt: Vec<u32>,
    default_max_tokens: u32,
) -> Result<GenerateSpec, ServiceError> {
    if prompt.is_empty() {
        return Err(ServiceError::bad_request("the prompt is empty", Some("prompt")));
    }
    if common.n.is_some_and(|n| n != 1) {
        return Err(ServiceError::bad_request("only n = 1 is supported", Some("n")));
    }
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => default_max_tokens,
        Some(value) if value < 1 => {
            return Err(ServiceError::bad_request(
                format!("max_tokens must be at least 1, got {value}"),
                Some("max_tokens"),
            ));
        }
        Some(value) => u32::try_from(value)
            .map_err(|_| ServiceError::bad_request(format!("max_tokens {value} is too large"), Some("max_tokens")))?,
    };
    let sampling = SamplingParams::new(common.temperature.unwrap_or(1.0), common.top_p.unwrap_or(1.0), common.seed)
        .map_err(|error| {
            let param = if error.field.ends_with("top_p") { "top_p" } else { "temperature" };
            ServiceError::bad_request(error.to_string(), Some(param))
        })?;
    let stop = common.stop.clone().map(StringOrList::into_vec).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ServiceError::bad_request("at most 4 stop sequences", Some("stop")));
    }
    Ok(GenerateSpec { prompt, tenant, cache_salt: common.cache_salt.clone(), sampling, max_tokens, stop })
}

/// POST /v1/completions
pub async fn completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "completions";
    let started = Instant::now();
    let tenant = match authenticate(&state, &headers) {
        Ok(tenant) => tenant,
        Err(error) => return fail(ROUTE, error),
    };
    let request: CompletionRequest = match parse_body(&state, body).await {
        Ok(request) => request,
        Err(error) => return fail(ROUTE, error),
    };
    let model = match state.gateway.check_model(request.common.model.as_deref()) {
        Ok(model) => model,
        Err(error) => return fail(ROUTE, error),
    };
    let prompt = match request.prompt {
        PromptInput::Text(text) => state.gateway.tokenizer.encode(&text),
        PromptInput::Tokens(ids) => ids,
        PromptInput::Texts(texts) if texts.len() == 1 => state.gateway.tokenizer.encode(&texts[0]),
        PromptInput::TokenLists(mut lists) if lists.len() == 1 => lists.remove(0),
        _ => return fail(ROUTE, ServiceError::bad_request("batched prompts are not supported", Some("prompt"))),
    };
    let spec = match spec_from(&request.common, tenant, prompt, state.gateway.config.default_max_tokens) {
        Ok(spec) => spec,
        Err(error) => return fail(ROUTE, error),
    };
    let receiver = match state.gateway.generate(spec).await {
        Ok(receiver) => receiver,
        Err(error) => return fail(ROUTE, error),
    };
    metrics::record_ttft(ROUTE, started.elapsed());
    let id = response_id("cmpl");
    let created = unix_now();
    if request.common.stream {
        let include_usage = request.common.stream_options.is_some_and(|o| o.include_usage);
        let chunk = move |text: String, finish: Option<&'static str>, usage: Option<UsageBody>| CompletionBody {
            id: id.clone(),
            object: "text_completion",
            created,
            model: model.clone(),
            choices: if usage.is_some() && finish.is_none() && text.is_empty() {
                Vec::new()
            } else {
                vec![CompletionChoice { index: 0, text, logprobs: None, finish_reason: finish }]
            },
            usage,
        };
        return stream_response(ROUTE, started, receiver, include_usage, None, move |event| {
            chunk(event.0, event.1, event.2)
        });
    }
    match collect(receiver).await {
        Ok((text, _ids, reason, usage)) => {
            metrics::record_request(ROUTE, 200);
            metrics::record_e2e(ROUTE, started.elapsed());
            Json(CompletionBody {
                id,
                object: "text_completion",
                created,
                model,
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: Some(reason.as_openai()),
                }],
                usage: Some(usage_body(usage)),
            })
            .into_response()
        }
        Err(error) => fail(ROUTE, error),
    }
}

/// POST /v1/chat/completions
pub async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "chat_completions";
    let started = Instant::now();
    let tenant = match authenticate(&state, &headers) {
        Ok(tenant) => tenant,
        Err(error) => return fail(ROUTE, error),
    };
    let request: ChatCompletionRequest = match parse_body(&state, body).await {
        Ok(request) => request,
        Err(error) => return fail(ROUTE, error),
    };
    let model = match state.gateway.check_model(request.common.model.as_deref()) {
        Ok(model) => model,
        Err(error) => return fail(ROUTE, error),
    };
    if request.messages.is_empty() {
        return fail(ROUTE, ServiceError::bad_request("messages must not be empty", Some("messages")));
    }
    let replies = state.replies.clone();
    let recall = move |text: &str| replies.recall(text);
    let prompt = match state.renderer.render_tokens_with_replies(&request.messages, &request.tools, true, &recall) {
        Ok(prompt) => prompt,
        Err(error) => {
            return fail(
                ROUTE,
                ServiceError::bad_request(format!("cannot render the conversation: {error}"), Some("messages")),
            );
        }
    };
    let spec = match spec_from(&request.common, tenant, prompt, state.gateway.config.default_max_tokens) {
        Ok(spec) => spec,
        Err(error) => return fail(ROUTE, error),
    };
    let receiver = match state.gateway.generate(spec).await {
        Ok(receiver) => receiver,
        Err(error) => return fail(ROUTE, error),
    };
    metrics::record_ttft(ROUTE, started.elapsed());
    let id = response_id("chatcmpl");
    let created = unix_now();
    if request.common.stream {
        let include_usage = request.common.stream_options.is_some_and(|o| o.include_usage);
        let mut first = true;
        let chunk = move |(text, finish, usage): (String, Option<&'static str>, Option<UsageBody>)| {
            let choices = if usage.is_some() && finish.is_none() && text.is_empty() {
                Vec::new()
            } else {
                let delta = ChatDelta {
                    role: first.then_some("assistant"),
                    content: (!text.is_empty() || first).then_some(text),
                };
                first = false;
                vec![ChatChunkChoice { index: 0, delta, logprobs: None, finish_reason: finish }]
            };
            ChatChunk { id: id.clone(), object: "chat.completion.chunk", created, model: model.clone(), choices, usage }
        };
        return stream_response(ROUTE, started, receiver, include_usage, Some(state.replies.clone()), chunk);
    }
    match collect(receiver).await {
        Ok((text, ids, reason, usage)) => {
            remember_reply(&state.replies, &text, &ids, reason);
            metrics::record_request(ROUTE, 200);
            metrics::record_e2e(ROUTE, started.elapsed());
            Json(ChatBody {
                id,
                object: "chat.completion",
                created,
                model,
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage { role: "assistant", content: text },
                    logprobs: None,
                    finish_reason: Some(reason.as_openai()),
                }],
                usage: usage_body(usage),
            })
            .into_response()
        }
        Err(error) => fail(ROUTE, error),
    }
}

/// Keeps a finished reply's ids, without the end-of-turn token the template adds itself.
fn remember_reply(replies: &crate::replies::ReplyMemory, text: &str, ids: &[u32], reason: FinishReason) {
    let ids = if reason == FinishReason::Stop && !ids.is_empty() { &ids[..ids.len() - 1] } else { ids };
    replies.remember(text, ids);
}

fn usage_body(usage: Usage) -> UsageBody {
    UsageBody::new(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
}

type Collected = (String, Vec<u32>, FinishReason, Usage);

/// Gathers a whole response.
async fn collect(mut receiver: mpsc::Receiver<Result<StreamEvent, ServiceError>>) -> Result<Collected, ServiceError> {
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(event) = receiver.recv().await {
        match event? {
            StreamEvent::Delta { token_ids, text: piece } => {
                text.push_str(&piece);
                ids.extend(token_ids);
            }
            StreamEvent::Finished { reason, usage } => return Ok((text, ids, reason, usage)),
        }
    }
    Err(ServiceError::Interrupted("the response ended early".into()))
}

/// Streams chunks as server-sent events, ending with `data: [DONE]`.
fn stream_response<C, T>(
    route: &'static str,
    started: Instant,
    receiver: mpsc::Receiver<Result<StreamEvent, ServiceError>>,
    include_usage: bool,
    replies: Option<Arc<crate::replies::ReplyMemory>>,
    mut chunk: C,
) -> Response
where
    C: FnMut((String, Option<&'static str>, Option<UsageBody>)) -> T + Send + 'static,
    T: serde::Serialize + Send + 'static,
{
    metrics::record_request(route, 200);
    let (sender, events) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut receiver = receiver;
        let mut text = String::new();
        let mut ids = Vec::new();
        let json = |value: &T| Event::default().data(serde_json::to_string(value).unwrap_or_default());
        while let Some(event) = receiver.recv().await {
            match event {
                Ok(StreamEvent::Delta { token_ids, text: piece }) => {
                    ids.extend(token_ids);
                    text.push_str(&piece);
                    if !piece.is_empty() && sender.send(json(&chunk((piece, None, None)))).await.is_err() {
                        return;
                    }
                }
                Ok(StreamEvent::Finished { reason, usage }) => {
                    if let Some(replies) = &replies {
                        remember_reply(replies, &text, &ids, reason);
                    }
                    let _ = sender.send(json(&chunk((String::new(), Some(reason.as_openai()), None)))).await;
                    if include_usage {
                        let _ = sender.send(json(&chunk((String::new(), None, Some(usage_body(usage)))))).await;
                    }
                    let _ = sender.send(Event::default().data("[DONE]")).await;
                    metrics::record_e2e(route, started.elapsed());
                    return;
                }
                Err(error) => {
                    let body = ErrorBody {
                        error: ErrorDetail {
                            message: error.to_string(),
                            kind: error.openai_type(),
                            param: None,
                            code: Some(error.reason_label()),
                        },
                    };
                    let _ = sender.send(Event::default().data(serde_json::to_string(&body).unwrap_or_default())).await;
                    return;
                }
            }
        }
    });
    let stream = ReceiverStream::new(events).map(Ok::<Event, Infallible>);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// GET /v1/models
pub async fn models(State(state): Shared, headers: HeaderMap) -> Response {
    if let Err(error) = authenticate(&state, &headers) {
        return fail("models", error);
    }
    let data = state
        .gateway
        .model_id()
        .map(|id| vec![ModelCard { id, object: "model", created: 0, owned_by: "kvroute" }])
        .unwrap_or_default();
    Json(ModelList { object: "list", data }).into_response()
}

/// GET /health: the process is up.
pub async fn health() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// GET /ready: at least one healthy replica and a known model.
pub async fn ready(State(state): Shared) -> Response {
    let healthy = state.gateway.pool.healthy_count();
    let body = serde_json::json!({"healthy_replicas": healthy, "model": state.gateway.model_id()});
    if healthy > 0 && state.gateway.model_id().is_some() {
        (StatusCode::OK, Json(body)).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}

/// GET /metrics: Prometheus text format.
pub async fn metrics(State(state): Shared) -> Response {
    state.gateway.router.publish_metrics();
    match &state.metrics {
        Some(handle) => {
            let text = metrics::render(handle, &state.gateway.replica_gauges());
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// GET /openapi.json
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// POST /debug/route: how a request would be routed, without running it.
pub async fn explain_route(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "debug_route";
    let tenant = match authenticate(&state, &headers) {
        Ok(tenant) => tenant,
        Err(error) => return fail(ROUTE, error),
    };
    let value: serde_json::Value = match parse_body(&state, body).await {
        Ok(value) => value,
        Err(error) => return fail(ROUTE, error),
    };
    let common: CommonParams = CommonParams::deserialize(&value).unwrap_or_default();
    let prompt = if value.get("messages").is_some() {
        match from_json::<ChatCompletionRequest>(&value) {
            Ok(request) => state.renderer.render_tokens(&request.messages, &request.tools, true),
            Err(error) => return fail(ROUTE, error),
        }
        .map_err(|error| ServiceError::bad_request(error.to_string(), Some("messages")))
    } else {
        match from_json::<CompletionRequest>(&value) {
            Ok(CompletionRequest { prompt: PromptInput::Text(text), .. }) => Ok(state.gateway.tokenizer.encode(&text)),
            Ok(CompletionRequest { prompt: PromptInput::Tokens(ids), .. }) => Ok(ids),
            Ok(_) => Err(ServiceError::bad_request("batched prompts are not supported", Some("prompt"))),
            Err(error) => Err(error),
        }
    };
    let prompt = match prompt {
        Ok(prompt) => prompt,
        Err(error) => return fail(ROUTE, error),
    };
    let spec = match spec_from(&common, tenant, prompt, state.gateway.config.default_max_tokens) {
        Ok(spec) => spec,
        Err(error) => return fail(ROUTE, error),
    };
    let (hashes, _) = state.gateway.hashes(&spec);
    Json(state.gateway.router.explain(&hashes, spec.prompt.len(), &state.gateway.pool)).into_response()
}

pub async fn not_found() -> Response {
    error_response(&ServiceError::UnknownModel("no such route".into()))
}

pub async fn method_not_allowed() -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            message: "method not allowed".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        },
    };
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

//! HTTP handlers: authenticate, read the body, have [`super::prepare`] turn it into a
//! [`crate::service::GenerateSpec`] off the async workers, run it through the
//! [`crate::service::Gateway`], and answer in OpenAI's shapes (JSON or SSE).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use kvroute_proto::domain::FinishReason;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::openai::*;
use super::prepare::{self, Prepared};
pub use super::prepare::{parse_json, spec_from};
use super::{AppState, error_response, response_id, unix_now};
use crate::admin::AdminDenied;
use crate::doctor::ReportOptions;
use crate::metrics;
use crate::prompts::Prompts;
use crate::service::{ServiceError, StreamEvent, Usage, next_for_caller};
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

/// Reads the body within the size limit and the read deadline.
async fn read_body(state: &AppState, body: Body) -> Result<Bytes, ServiceError> {
    let read = tokio::time::timeout(state.body_read_timeout, axum::body::to_bytes(body, state.max_body_bytes));
    read.await
        .map_err(|_| {
            ServiceError::Timeout(format!(
                "the request body did not arrive within {} ms",
                state.body_read_timeout.as_millis()
            ))
        })?
        .map_err(|_| ServiceError::TooLarge(format!("the request body exceeds {} bytes", state.max_body_bytes)))
}

type PrepareFn = fn(&AppState, Tenant, &[u8]) -> Result<Prepared, ServiceError>;

/// Reads the body, then parses, checks, renders and tokenizes it off the async workers.
async fn prepare_request(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Body,
    prepare: PrepareFn,
) -> Result<Prepared, ServiceError> {
    let bytes = read_body(state, body).await?;
    let job_state = state.clone();
    state.cpu.run(bytes.len(), move || prepare(&job_state, tenant, &bytes)).await?
}

/// POST /v1/completions
pub async fn completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "completions";
    let started = Instant::now();
    let tenant = match authenticate(&state, &headers) {
        Ok(tenant) => tenant,
        Err(error) => return fail(ROUTE, error),
    };
    let Prepared { spec, model, stream, include_usage } =
        match prepare_request(&state, tenant, body, prepare::completion_body).await {
            Ok(prepared) => prepared,
            Err(error) => return fail(ROUTE, error),
        };
    let receiver = match state.gateway.generate(spec).await {
        Ok(receiver) => receiver,
        Err(error) => return fail(ROUTE, error),
    };
    metrics::record_ttft(ROUTE, started.elapsed());
    let id = response_id("cmpl");
    let created = unix_now();
    if stream {
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
    let Prepared { spec, model, stream, include_usage } =
        match prepare_request(&state, tenant, body, prepare::chat_body).await {
            Ok(prepared) => prepared,
            Err(error) => return fail(ROUTE, error),
        };
    let receiver = match state.gateway.generate(spec).await {
        Ok(receiver) => receiver,
        Err(error) => return fail(ROUTE, error),
    };
    metrics::record_ttft(ROUTE, started.elapsed());
    let id = response_id("chatcmpl");
    let created = unix_now();
    if stream {
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
        return stream_response(ROUTE, started, receiver, include_usage, Some(state.prompts.clone()), chunk);
    }
    match collect(receiver).await {
        Ok((text, ids, reason, usage)) => {
            state.prompts.remember_reply(&text, &ids);
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
    prompts: Option<Arc<Prompts>>,
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
        while let Some(event) = next_for_caller(&mut receiver, &sender).await {
            match event {
                Ok(StreamEvent::Delta { token_ids, text: piece }) => {
                    ids.extend(token_ids);
                    text.push_str(&piece);
                    if !piece.is_empty() && sender.send(json(&chunk((piece, None, None)))).await.is_err() {
                        return;
                    }
                }
                Ok(StreamEvent::Finished { reason, usage }) => {
                    if let Some(prompts) = &prompts {
                        prompts.remember_reply(&text, &ids);
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

/// POST /debug/route: how a request would be routed, without running it. Needs the admin key.
pub async fn explain_route(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    const ROUTE: &str = "debug_route";
    let key = bearer(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    if let Err(denied) = state.admin.check(key, &state.tenants) {
        return admin_denied(ROUTE, "/debug/route", denied);
    }
    let prepared =
        prepare_request(&state, Tenant::anonymous(), body, |state, _, bytes| prepare::explain_body(state, bytes));
    let spec = match prepared.await {
        Ok(prepared) => prepared.spec,
        Err(error) => return fail(ROUTE, error),
    };
    let (hashes, _) = state.gateway.hashes(&spec);
    metrics::record_request(ROUTE, 200);
    Json(state.gateway.router.explain(&hashes, spec.prompt.len(), &state.gateway.pool)).into_response()
}

/// GET /debug/prefix-report: the prefix-cache doctor's report, JSON or (`?format=text`) plain text;
/// `?redact=true` shows token text as lengths and digests, `?tenant=NAME` one tenant. Needs the admin key.
pub async fn prefix_report(State(state): Shared, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    const ROUTE: &str = "debug_prefix_report";
    let key = bearer(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    if let Err(denied) = state.admin.check(key, &state.tenants) {
        return admin_denied(ROUTE, "/debug/prefix-report", denied);
    }
    let query = match ReportQuery::parse(query.as_deref().unwrap_or_default()) {
        Ok(query) => query,
        Err(error) => return fail(ROUTE, error),
    };
    let router = &state.gateway.router;
    if let Some(tenant) = query.tenant.as_deref().filter(|tenant| !router.doctor_knows(tenant)) {
        let message = format!("the prefix-cache doctor tracks no tenant named {tenant:?} (none of its recent ones)");
        return debug_error(ROUTE, StatusCode::NOT_FOUND, "not_found_error", "unknown_tenant", message, Some("tenant"));
    }
    let options = ReportOptions {
        redact: query.redact || state.redact_prefix_report,
        tenant: query.tenant,
        ..Default::default()
    };
    let tokenizer = &state.gateway.tokenizer;
    let decode = |ids: &[u32]| {
        tokenizer.decode_bytes(ids).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
    };
    let report = router.prefix_report(&options, &decode);
    metrics::record_request(ROUTE, 200);
    if query.text {
        ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], report.to_text()).into_response()
    } else {
        Json(report).into_response()
    }
}

/// The query of `/debug/prefix-report`.
#[derive(Debug, Default, PartialEq)]
struct ReportQuery {
    text: bool,
    redact: bool,
    tenant: Option<String>,
}

impl ReportQuery {
    /// Parses `format=json|text`, `redact=true|false` and `tenant=NAME`; anything else is a 400.
    fn parse(query: &str) -> Result<ReportQuery, ServiceError> {
        let mut parsed = ReportQuery::default();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decoded(value)
                .ok_or_else(|| ServiceError::bad_request(format!("{name}: not percent-encoded UTF-8"), None))?;
            match name {
                "format" => {
                    parsed.text = match value.as_str() {
                        "json" => false,
                        "text" => true,
                        _ => return Err(ServiceError::bad_request("format must be json or text", Some("format"))),
                    }
                }
                "redact" => {
                    parsed.redact = match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(ServiceError::bad_request("redact must be true or false", Some("redact"))),
                    }
                }
                "tenant" if !value.is_empty() => parsed.tenant = Some(value),
                "tenant" => return Err(ServiceError::bad_request("tenant must name a tenant", Some("tenant"))),
                _ => {
                    return Err(ServiceError::bad_request(
                        format!("unknown query parameter {name:?}: use format, redact or tenant"),
                        None,
                    ));
                }
            }
        }
        Ok(parsed)
    }
}

/// A query value with `+` and `%XX` decoded; None when that is not UTF-8 or a `%` is not followed by two
/// hexadecimal digits.
fn percent_decoded(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// An error of a debug endpoint in OpenAI's error shape, counted under `route`.
fn debug_error(
    route: &'static str,
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
    param: Option<&str>,
) -> Response {
    metrics::record_request(route, status.as_u16());
    let body = ErrorBody { error: ErrorDetail { message, kind, param: param.map(str::to_string), code: Some(code) } };
    (status, Json(body)).into_response()
}

/// The answer to a refused request to the admin endpoint `path`, in OpenAI's error shape.
fn admin_denied(route: &'static str, path: &str, denied: AdminDenied) -> Response {
    let (status, kind, code, message) = match denied {
        AdminDenied::Off => (
            StatusCode::NOT_FOUND,
            "not_found_error",
            "admin_disabled",
            format!("{path} is off: it needs an admin key (--admin-api-key or KVROUTE_ADMIN_API_KEY)"),
        ),
        AdminDenied::Missing => (
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "unauthorized",
            "missing admin key: send `Authorization: Bearer ADMIN_KEY`".to_string(),
        ),
        AdminDenied::Invalid => {
            (StatusCode::UNAUTHORIZED, "authentication_error", "unauthorized", "invalid admin key".to_string())
        }
        AdminDenied::TenantKey => (
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            format!("{path} needs the admin key; tenant API keys cannot use it"),
        ),
    };
    debug_error(route, status, kind, code, message, None)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_queries() {
        assert_eq!(ReportQuery::parse(""), Ok(ReportQuery::default()));
        let query = ReportQuery::parse("format=text&redact=true&tenant=acme%2Dwest").unwrap();
        assert_eq!(query, ReportQuery { text: true, redact: true, tenant: Some("acme-west".into()) });
        assert_eq!(ReportQuery::parse("format=json&redact=0").unwrap(), ReportQuery::default());
        for (bad, param) in [
            ("format=xml", Some("format")),
            ("redact=maybe", Some("redact")),
            ("tenant=", Some("tenant")),
            ("verbose=1", None),
            ("tenant=%zz", None),
            ("tenant=%ff", None),
        ] {
            let error = ReportQuery::parse(bad).unwrap_err();
            assert_eq!((error.http_status(), error.param()), (400, param), "{bad}: {error}");
        }
    }
}

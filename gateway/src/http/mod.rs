//! The HTTP ingress (axum on hyper): OpenAI-compatible completions and chat
//! completions (streaming with SSE and not), models, health, readiness,
//! metrics, the OpenAPI document, and the operator's debug endpoints (the routing explain endpoint and the
//! prefix-cache doctor's report).
//!
//! Every error is OpenAI's JSON error shape with the status from
//! [`ServiceError::http_status`], the one mapping of failures to statuses.

pub mod handlers;
pub mod listener;
pub mod openai;
pub mod prepare;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::admin::AdminKey;
use crate::cpu_pool::CpuPool;
use crate::prompts::Prompts;
use crate::request_checks::Limits;
use crate::service::{Gateway, ServiceError};
use crate::tenants::Tenants;
use openai::{ErrorBody, ErrorDetail};

/// Shared state of the HTTP handlers.
pub struct AppState {
    pub gateway: Arc<Gateway>,
    /// Tokenizer, chat renderer and the memory of generated replies.
    pub prompts: Arc<Prompts>,
    /// Where parsing, rendering and tokenizing run, off the async workers.
    pub cpu: Arc<CpuPool>,
    /// The request limits shared with the gRPC ingress.
    pub limits: Limits,
    pub tenants: Tenants,
    /// What `/debug/route` and `/debug/prefix-report` require.
    pub admin: AdminKey,
    /// `/debug/prefix-report` shows no token text, whatever the request asks.
    pub redact_prefix_report: bool,
    pub metrics: Option<PrometheusHandle>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// How long a client may take to send its request body.
    pub body_read_timeout: std::time::Duration,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("max_body_bytes", &self.max_body_bytes).finish()
    }
}

/// The routes of the HTTP API.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/ready", get(handlers::ready))
        .route("/metrics", get(handlers::metrics))
        .route("/openapi.json", get(handlers::openapi))
        .route("/debug/route", post(handlers::explain_route))
        .route("/debug/prefix-report", get(handlers::prefix_report))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(state)
}

/// An error response in OpenAI's shape.
pub fn error_response(error: &ServiceError) -> Response {
    let status = StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorBody {
        error: ErrorDetail {
            message: error.to_string(),
            kind: error.openai_type(),
            param: error.param().map(str::to_string),
            code: Some(error.reason_label()),
        },
    };
    (status, axum::Json(body)).into_response()
}

/// Seconds since the Unix epoch, for `created` fields.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fresh response id with the given prefix (`cmpl`, `chatcmpl`).
pub fn response_id(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&count.to_le_bytes());
    hasher.update(&nanos.to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    let hex = hasher.finalize().to_hex();
    format!("{prefix}-{}", &hex[..24])
}

//! kvroute's gateway.
//!
//! Layout:
//! - [`tokenizer`]: the `kvroute-tokenizer` crate (byte-level BPE tokenizers), re-exported.
//! - [`chat`]: the `kvroute-chat` crate (deterministic chat rendering with the model's template), re-exported.
//! - [`routing`]: the synchronous routing core: prefix index, scoring policies, traffic sketches.
//! - [`router`]: glue between the async shell and the routing core.
//! - [`doctor`]: the prefix-cache doctor's synchronous core (why the hit ratio is what it is);
//!   [`doctor_thread`] runs it off the request path.
//! - [`upstream`]: the replicas: clients, event subscriptions, health, discovery.
//! - [`service`]: the request path shared by HTTP and gRPC: route, call, retry, stream text.
//! - [`http`], [`grpc`]: the ingress; [`request_checks`]: the checks and limits both apply;
//!   [`prompts`]: prompts to token ids, run in the [`cpu_pool`] off the async workers; [`admin`]: the
//!   operator's key for `/debug/route`.
//! - [`tenants`]: API keys and cache scopes; [`replies`]: exact ids of generated replies.
//! - [`metrics`]: the exported metrics (the prompt-job gauge is [`cpu_pool`]'s); [`config`], [`cli`],
//!   [`run`]: the binary.

pub mod admin;
pub mod body_deadline;
pub mod cli;
pub mod config;
pub mod cpu_pool;
pub mod doctor;
pub mod doctor_thread;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod prompts;
pub mod replies;
pub mod request_checks;
pub mod router;
pub mod routing;
pub mod run;
pub mod service;
pub mod tenants;
pub mod tls;
pub use kvroute_chat as chat;
pub use kvroute_tokenizer as tokenizer;
pub mod upstream;

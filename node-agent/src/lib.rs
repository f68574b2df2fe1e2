//! kvroute's node-agent: the paged KV-cache engine of one replica, or the agent of an engine server beside it.
//!
//! Layout:
//! - [`block_manager`]: which pool block holds what (ref counts, prefix cache, LRU eviction). Synchronous.
//! - [`engine`]: continuous batching, admission, preemption over an [`engine::Executor`]; its thread.
//! - [`model`]: a Llama-architecture transformer on the CPU with paged attention.
//! - [`server`]: the gRPC service, a thin shell over the engine thread.
//! - [`status`]: the one mapping from engine errors to gRPC status codes.
//! - [`metrics`]: every exported metric, in one place.
//! - [`prometheus_sink`]: the engine core's counters into those metrics, its step costs into `--step-log`.
//! - [`lru`]: the least-recently-used order the pool and the host tier evict by.
//! - [`tiers`]: host RAM (G2) and the shared Redis tier (G3) below the pool.
//! - [`prefetch`]: one request's prefetch from the Redis tier, when reloading beats recomputing.
//! - [`capacity`]: the capacity calculator (`node-agent capacity`).
//! - [`engine_events`]: an external engine's (vLLM, SGLang) ZeroMQ KV events, translated into kvroute's.
//! - [`external`]: engine mode, the agent beside a vLLM or SGLang server that it presents as a replica.

pub mod block_manager;
pub mod capacity;
pub mod config;
pub mod engine;
pub mod engine_events;
pub mod external;
pub mod lru;
pub mod metrics;
pub mod model;
pub mod prefetch;
pub mod prometheus_sink;
pub mod run;
pub mod server;
pub mod status;
pub mod step_log;
pub mod tiers;

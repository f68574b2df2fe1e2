//! The node-agent's tests that start processes (the node-agent binary, redis-servers, a gateway), or
//! serve an agent on a real socket, in one test binary: linking one binary instead of four saves build
//! time. Each module was a test file of its own and keeps its name (`busy_replica::...`,
//! `server_grpc::...`, ...).

mod busy_replica;
mod engine_events_zmq;
#[path = "../support/hooked.rs"]
mod hooked;
mod prefetch_budget;
mod server_grpc;
mod tiers_redis;

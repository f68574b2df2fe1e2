//! The node-agent's tests that start processes (the node-agent binary, redis-servers), in one test
//! binary: linking one binary instead of two saves build time. Each module was a test file of its own and
//! keeps its name (`server_grpc::...`, `tiers_redis::...`).

mod server_grpc;
mod tiers_redis;

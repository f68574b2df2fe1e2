//! The gateway's tests that start processes (node-agents, gateways, redis-servers, the `gateway hash`
//! command), in one test binary: linking one binary instead of eight saves most of their build time. Each
//! module was a test file of its own and keeps its name, so a test is named `faults::...`,
//! `gateway_cluster::...`, and so on.

mod cli_hash;
mod doctor;
mod faults;
mod gateway_cluster;
mod ingress;
mod observability;
mod replica_churn;
mod tenants;
mod tls;

/// The gateways' `--heartbeat-timeout-ms` in these tests: short, so that a replica that stops answering is
/// noticed well within a test's patience.
const HEARTBEAT_TIMEOUT_MS: &str = "1500";

/// Tests that start a cluster take this lock and run one at a time: each is several processes on a small
/// machine, and heartbeats must not starve.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

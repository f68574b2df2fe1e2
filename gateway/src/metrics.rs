//! Every metric the gateway exports, declared in one place with typed record
//! functions. Labels are bounded: route, status class, reason, tier, diagnosis kind,
//! and the replica endpoint (one per agent); never prompt text or keys, and tenant
//! names only for the tenants the operator lists (`--doctor-tenant-metrics`).
//!
//! Per-replica gauges are not kept in the recorder: [`render`] writes them at each scrape from the replicas
//! known then, so the series of a removed replica disappear with it.

use std::time::Duration;

use kvroute_proto::domain::LoadStats;
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::doctor::{Counters, Kind, TIERS};

pub const REQUESTS: &str = "kvroute_gateway_requests_total";
pub const TTFT: &str = "kvroute_gateway_ttft_seconds";
pub const E2E: &str = "kvroute_gateway_request_seconds";
pub const ROUTING_DECISION: &str = "kvroute_gateway_routing_decision_seconds";
pub const PREDICTED_CACHED: &str = "kvroute_gateway_predicted_cached_tokens_total";
pub const ACTUAL_CACHED: &str = "kvroute_gateway_cached_tokens_total";
pub const PROMPT_TOKENS: &str = "kvroute_gateway_prompt_tokens_total";
pub const REPLICA_HEALTHY: &str = "kvroute_gateway_replica_healthy";
pub const REPLICA_WAITING: &str = "kvroute_gateway_replica_waiting_requests";
pub const REPLICA_RUNNING: &str = "kvroute_gateway_replica_running_requests";
pub const REPLICA_KV_USAGE: &str = "kvroute_gateway_replica_kv_usage_ratio";
pub const REPLICA_QUEUED_PREFILL: &str = "kvroute_gateway_replica_queued_prefill_tokens";
pub const INDEX_ENTRIES: &str = "kvroute_gateway_index_entries";
pub const INDEX_BYTES: &str = "kvroute_gateway_index_bytes";
pub const EVENTS: &str = "kvroute_gateway_kv_events_total";
pub const EVENT_INGEST: &str = "kvroute_gateway_event_ingest_seconds";
pub const EVENT_LAG: &str = "kvroute_gateway_event_lag_seconds";
pub const EVENT_BATCHES: &str = "kvroute_gateway_event_batches_total";
pub const REPLICA_STEP_SECONDS: &str = "kvroute_gateway_replica_step_seconds";
pub const REPLICA_IN_FLIGHT: &str = "kvroute_gateway_replica_requests_in_flight";
pub const REPLICA_ROUTED: &str = "kvroute_gateway_replica_routed_requests_total";
pub const RESUBSCRIPTIONS: &str = "kvroute_gateway_resubscriptions_total";
pub const REFUSED_REPLICAS: &str = "kvroute_gateway_replicas_refused_total";
pub const RETRIES: &str = "kvroute_gateway_retries_total";
pub const QUIET_STREAMS: &str = "kvroute_gateway_quiet_stream_waits_total";
pub const REJECTIONS: &str = "kvroute_gateway_rejections_total";
pub const REPEATED_PREFIX_RATIO: &str = "kvroute_gateway_repeated_prefix_ratio";
pub const PREFIX_CHURN: &str = "kvroute_gateway_prefix_churn_total";
pub const PREFIX_DIAGNOSES: &str = "kvroute_gateway_prefix_diagnoses_total";
pub const PREFIX_DIAGNOSES_ACTIVE: &str = "kvroute_gateway_prefix_diagnoses_active";
pub const PREFIX_CEILING: &str = "kvroute_gateway_prefix_ceiling_ratio";
pub const PREFIX_HIT: &str = "kvroute_gateway_prefix_hit_ratio";
pub const PREFIX_DIVERGENCE: &str = "kvroute_gateway_prefix_divergence_block";
pub const PREFIX_DOCTOR_DROPPED: &str = "kvroute_gateway_prefix_doctor_dropped_total";
pub const TENANT_PREFIX_DIAGNOSES_ACTIVE: &str = "kvroute_gateway_tenant_prefix_diagnoses_active";
pub const TENANT_PREFIX_CEILING: &str = "kvroute_gateway_tenant_prefix_ceiling_ratio";
pub const TENANT_PREFIX_HIT: &str = "kvroute_gateway_tenant_prefix_hit_ratio";

/// Upper bounds of the divergence-block histogram's buckets: block 0, 1, 2-3, 4-7, ... as the report's.
const DIVERGENCE_BUCKETS: [f64; 8] = [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 127.0];

/// Installs the recorder; the handle renders `/metrics`.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])?
        .set_buckets_for_metric(Matcher::Full(PREFIX_DIVERGENCE.to_string()), &DIVERGENCE_BUCKETS)?
        .install_recorder()?;
    describe();
    Ok(handle)
}

fn describe() {
    describe_counter!(REQUESTS, "Requests by route and status code.");
    describe_histogram!(TTFT, Unit::Seconds, "Time from request arrival to the first token.");
    describe_histogram!(E2E, Unit::Seconds, "Time from request arrival to the last token.");
    describe_histogram!(ROUTING_DECISION, Unit::Seconds, "Time to hash, look up and score one request.");
    describe_counter!(PREDICTED_CACHED, "Prompt tokens the routing decision expected to find cached.");
    describe_counter!(ACTUAL_CACHED, "Prompt tokens the replicas reported as cached.");
    describe_counter!(PROMPT_TOKENS, "Prompt tokens routed.");
    describe_gauge!(INDEX_ENTRIES, "Block hashes in the prefix index.");
    describe_gauge!(INDEX_BYTES, "Approximate memory of the prefix index.");
    describe_counter!(EVENTS, "KV events ingested from replicas.");
    describe_histogram!(EVENT_INGEST, Unit::Seconds, "Time to apply one event batch to the index.");
    describe_counter!(EVENT_BATCHES, "Event batches received from replicas (heartbeats included).");
    describe_histogram!(
        EVENT_LAG,
        Unit::Seconds,
        "Time from an agent sending an event batch to its application to the index (wall clocks; skew included)."
    );
    describe_counter!(RESUBSCRIPTIONS, "Event-stream resubscriptions (gap, new epoch, timeout, error).");
    describe_counter!(
        REFUSED_REPLICAS,
        "Replicas refused for a mismatched model, block size, vocabulary or tokenizer."
    );
    describe_counter!(RETRIES, "Requests retried on another replica before their first token.");
    describe_counter!(REJECTIONS, "Requests rejected, by reason.");
    describe_counter!(
        QUIET_STREAMS,
        "Times a stream went --inter-token-timeout-ms without a token while its replica was alive, and waited on."
    );
    describe_gauge!(REPEATED_PREFIX_RATIO, "Fraction of incoming prompt blocks seen recently.");
    describe_counter!(
        PREFIX_CHURN,
        "Prompts that vary near the top (a timestamp, a request id) while their tenant is diagnosed so."
    );
    describe_counter!(PREFIX_DIAGNOSES, "Prefix-cache diagnoses raised, by kind (GET /debug/prefix-report).");
    describe_gauge!(PREFIX_DIAGNOSES_ACTIVE, "Tenants with a prefix-cache diagnosis raised, by kind.");
    describe_gauge!(
        PREFIX_CEILING,
        "Share of prompt tokens in a prefix their tenant sent before, over the doctor's window: the hit ratio's ceiling."
    );
    describe_gauge!(
        PREFIX_HIT,
        "Share of prompt tokens found cached over the doctor's window: by the routing decisions per tier and in all \
         (gpu, host, network, total), and by the replicas' reports (reported)."
    );
    describe_histogram!(
        PREFIX_DIVERGENCE,
        "The block at which a prompt first leaves its tenant's longest previously seen prefix."
    );
    describe_counter!(PREFIX_DOCTOR_DROPPED, "Prompts the prefix-cache doctor did not see: its queue was full.");
    describe_gauge!(TENANT_PREFIX_DIAGNOSES_ACTIVE, "1 when a listed tenant has the prefix-cache diagnosis raised.");
    describe_gauge!(TENANT_PREFIX_CEILING, "A listed tenant's repeated-prefix fraction over the doctor's window.");
    describe_gauge!(TENANT_PREFIX_HIT, "A listed tenant's share of prompt tokens the routing decisions found cached.");
}

pub fn record_request(route: &'static str, status: u16) {
    counter!(REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
}

pub fn record_ttft(route: &'static str, elapsed: Duration) {
    histogram!(TTFT, "route" => route).record(elapsed.as_secs_f64());
}

pub fn record_e2e(route: &'static str, elapsed: Duration) {
    histogram!(E2E, "route" => route).record(elapsed.as_secs_f64());
}

pub fn record_decision(elapsed: Duration, prompt_tokens: usize, predicted_cached_tokens: usize) {
    histogram!(ROUTING_DECISION).record(elapsed.as_secs_f64());
    counter!(PROMPT_TOKENS).increment(prompt_tokens as u64);
    counter!(PREDICTED_CACHED).increment(predicted_cached_tokens as u64);
}

pub fn record_cached(tokens: u32) {
    counter!(ACTUAL_CACHED).increment(u64::from(tokens));
}

/// One replica's gauges at a scrape.
#[derive(Clone, Debug)]
pub struct ReplicaGauges {
    pub endpoint: String,
    pub healthy: bool,
    /// The replica's latest report.
    pub load: LoadStats,
    /// Requests this gateway has on it (sent and not reported finished).
    pub in_flight: usize,
    /// Requests this gateway sent it since it was added (attempts included).
    pub routed: u64,
}

/// The recorder's metrics, then the per-replica gauges of `replicas`, in Prometheus' text format.
pub fn render(handle: &PrometheusHandle, replicas: &[ReplicaGauges]) -> String {
    let mut text = handle.render();
    type Value = fn(&ReplicaGauges) -> f64;
    let series: [(&str, &str, &str, Value); 8] = [
        (REPLICA_ROUTED, "counter", "Requests sent to the replica since it was added (retries included).", |r| {
            r.routed as f64
        }),
        (REPLICA_HEALTHY, "gauge", "1 when the replica is healthy and routable.", |r| f64::from(u8::from(r.healthy))),
        (REPLICA_WAITING, "gauge", "Requests waiting on the replica (its latest report).", |r| {
            f64::from(r.load.waiting_requests)
        }),
        (REPLICA_RUNNING, "gauge", "Requests running on the replica (its latest report).", |r| {
            f64::from(r.load.running_requests)
        }),
        (REPLICA_KV_USAGE, "gauge", "Fraction of the replica's KV blocks in use.", |r| r.load.kv_usage()),
        (REPLICA_QUEUED_PREFILL, "gauge", "Prompt tokens queued for prefill on the replica.", |r| {
            r.load.queued_prefill_tokens as f64
        }),
        (
            REPLICA_STEP_SECONDS,
            "gauge",
            "How long the replica's engine step in progress had run at its latest report.",
            |r| {
                if r.load.step_in_progress { r.load.step_seconds } else { 0.0 }
            },
        ),
        (
            REPLICA_IN_FLIGHT,
            "gauge",
            "Requests this gateway sent to the replica that it has not reported finished.",
            |r| r.in_flight as f64,
        ),
    ];
    for (name, kind, help, value) in series {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for replica in replicas {
            let label = replica.endpoint.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            text.push_str(&format!("{name}{{replica=\"{label}\"}} {}\n", value(replica)));
        }
    }
    text
}

pub fn record_index(entries: usize, bytes: usize) {
    gauge!(INDEX_ENTRIES).set(entries as f64);
    gauge!(INDEX_BYTES).set(bytes as f64);
}

pub fn record_event_ingest(events: usize, elapsed: Duration) {
    counter!(EVENTS).increment(events as u64);
    histogram!(EVENT_INGEST).record(elapsed.as_secs_f64());
}

/// Lag of a batch the agent sent at `sent_unix_micros` (0: unknown, not recorded), measured now.
pub fn record_event_lag(sent_unix_micros: u64) {
    if sent_unix_micros == 0 {
        return;
    }
    let now = kvroute_proto::domain::KvEventBatch::now_unix_micros();
    histogram!(EVENT_LAG).record(now.saturating_sub(sent_unix_micros) as f64 / 1e6);
}

pub fn record_event_batch() {
    counter!(EVENT_BATCHES).increment(1);
}

pub fn record_resubscription() {
    counter!(RESUBSCRIPTIONS).increment(1);
}

pub fn record_replica_refused() {
    counter!(REFUSED_REPLICAS).increment(1);
}

pub fn record_retry() {
    counter!(RETRIES).increment(1);
}

pub fn record_quiet_stream() {
    counter!(QUIET_STREAMS).increment(1);
}

pub fn record_rejection(reason: &'static str) {
    counter!(REJECTIONS, "reason" => reason).increment(1);
}

pub fn record_repeated_prefix_ratio(ratio: f64) {
    gauge!(REPEATED_PREFIX_RATIO).set(ratio);
}

pub fn record_prefix_churn() {
    counter!(PREFIX_CHURN).increment(1);
}

pub fn record_prefix_diagnosis(kind: &'static str) {
    counter!(PREFIX_DIAGNOSES, "kind" => kind).increment(1);
}

pub fn record_prefix_diagnoses_active(kind: &'static str, tenants: usize) {
    gauge!(PREFIX_DIAGNOSES_ACTIVE, "kind" => kind).set(tenants as f64);
}

/// The fleet's repeated-prefix fraction and hit ratios over the doctor's window.
pub fn record_prefix_ratios(counters: &Counters) {
    gauge!(PREFIX_CEILING).set(counters.repeated_ratio());
    for (index, tier) in TIERS.iter().enumerate() {
        gauge!(PREFIX_HIT, "tier" => *tier).set(counters.matched_ratio(index));
    }
    gauge!(PREFIX_HIT, "tier" => "total").set(counters.matched_total_ratio());
    gauge!(PREFIX_HIT, "tier" => "reported").set(counters.reported_ratio());
}

pub fn record_prefix_divergence(block: u32) {
    histogram!(PREFIX_DIVERGENCE).record(f64::from(block));
}

pub fn record_prefix_doctor_dropped() {
    counter!(PREFIX_DOCTOR_DROPPED).increment(1);
}

/// A listed tenant's gauges: each diagnosis (1 raised, 0 not) and its ratios.
pub fn record_tenant_prefix(tenant: &str, counters: &Counters, raised: &[Kind]) {
    for kind in Kind::ALL {
        let value = f64::from(u8::from(raised.contains(&kind)));
        gauge!(TENANT_PREFIX_DIAGNOSES_ACTIVE, "tenant" => tenant.to_string(), "kind" => kind.as_str()).set(value);
    }
    gauge!(TENANT_PREFIX_CEILING, "tenant" => tenant.to_string()).set(counters.repeated_ratio());
    gauge!(TENANT_PREFIX_HIT, "tenant" => tenant.to_string()).set(counters.matched_total_ratio());
}

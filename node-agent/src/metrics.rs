//! Every metric the node-agent exports, declared in one place with typed
//! record functions; label values are bounded (tier, mode, reason).

use std::net::SocketAddr;

use metrics::{counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;

use kvroute_proto::domain::{LoadStats, Tier};

use crate::engine_events::Counters;

pub const KV_BLOCKS_TOTAL: &str = "kvroute_agent_kv_blocks";
pub const KV_BLOCKS_USED: &str = "kvroute_agent_kv_blocks_used";
pub const KV_BLOCKS_CACHED: &str = "kvroute_agent_kv_blocks_cached";
pub const KV_BLOCKS_FREE: &str = "kvroute_agent_kv_blocks_free";
pub const PREFIX_HIT_TOKENS: &str = "kvroute_agent_prefix_hit_tokens_total";
pub const PROMPT_TOKENS: &str = "kvroute_agent_prompt_tokens_total";
pub const GENERATED_TOKENS: &str = "kvroute_agent_generated_tokens_total";
pub const PREEMPTIONS: &str = "kvroute_agent_preemptions_total";
pub const REQUESTS_WAITING: &str = "kvroute_agent_requests_waiting";
pub const REQUESTS_RUNNING: &str = "kvroute_agent_requests_running";
pub const MAX_RUNNING_REQUESTS: &str = "kvroute_agent_max_running_requests";
pub const REQUESTS_FINISHED: &str = "kvroute_agent_requests_finished_total";
pub const REQUESTS_REJECTED: &str = "kvroute_agent_requests_rejected_total";
pub const REQUESTS_CANCELLED: &str = "kvroute_agent_requests_cancelled_total";
pub const PREFETCH_BYTES_HELD: &str = "kvroute_agent_prefetch_bytes_held";
pub const GENERATE_STREAMS: &str = "kvroute_agent_generate_streams";
pub const PREFILL_TOKENS_PER_SECOND: &str = "kvroute_agent_prefill_tokens_per_second";
pub const DECODE_STEP_SECONDS: &str = "kvroute_agent_decode_step_seconds";
/// Engine mode: whether the engine beside the agent answers its health and metrics polls.
pub const ENGINE_UP: &str = "kvroute_agent_engine_up";
/// Engine mode: the engine's KV-event batches, by what became of them.
pub const ENGINE_EVENT_BATCHES: &str = "kvroute_agent_engine_event_batches_total";
/// Engine mode: engine events and blocks not turned into index entries, by reason.
pub const ENGINE_EVENTS_NOT_INDEXED: &str = "kvroute_agent_engine_events_not_indexed_total";
/// Engine mode: engine blocks parked under a salt the agent does not know yet.
pub const ENGINE_PARKED_BLOCKS: &str = "kvroute_agent_engine_parked_blocks";
/// Engine mode: parked engine blocks indexed once a request registered their salt.
pub const ENGINE_UNPARKED_BLOCKS: &str = "kvroute_agent_engine_unparked_blocks_total";

/// Installs the Prometheus exporter with its HTTP listener on `addr`
/// (`GET /metrics`, text format).
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new().with_http_listener(addr).install()?;
    describe();
    describe_tiers();
    Ok(())
}

fn describe() {
    describe_gauge!(KV_BLOCKS_TOTAL, "KV blocks in the engine's pool.");
    describe_gauge!(KV_BLOCKS_USED, "KV blocks referenced by running sequences.");
    describe_gauge!(KV_BLOCKS_CACHED, "KV blocks holding cached prefixes that no sequence uses (evictable).");
    describe_gauge!(KV_BLOCKS_FREE, "KV blocks holding nothing.");
    describe_counter!(PREFIX_HIT_TOKENS, "Prompt tokens served from the prefix cache instead of computed.");
    describe_counter!(PROMPT_TOKENS, "Prompt tokens of admitted requests.");
    describe_counter!(GENERATED_TOKENS, "Tokens sampled.");
    describe_counter!(PREEMPTIONS, "Running sequences preempted for lack of KV blocks, by mode.");
    describe_gauge!(REQUESTS_WAITING, "Requests queued for admission.");
    describe_gauge!(REQUESTS_RUNNING, "Requests in the running batch.");
    describe_gauge!(
        MAX_RUNNING_REQUESTS,
        "Sequences the engine runs at once at most, as reported to gateways (0: unknown)."
    );
    describe_counter!(REQUESTS_FINISHED, "Requests that finished or were dropped by their client.");
    describe_counter!(REQUESTS_REJECTED, "Requests refused at submission, by reason.");
    describe_counter!(
        REQUESTS_CANCELLED,
        "Requests dropped before finishing because their caller went away (disconnected, cancelled, or a retry \
         abandoned them)."
    );
    describe_gauge!(
        GENERATE_STREAMS,
        "Generate calls in progress: from arrival until their stream ends or is dropped."
    );
    describe_gauge!(
        PREFETCH_BYTES_HELD,
        "Bytes of network-tier blocks fetched for requests not yet admitted (bounded by --prefetch-budget-bytes)."
    );
    describe_gauge!(
        PREFILL_TOKENS_PER_SECOND,
        "Marginal prefill throughput: prompt tokens per second of step time beyond a decode-only step (moving average)."
    );
    describe_gauge!(DECODE_STEP_SECONDS, "Moving average of one decode-only step.");
    describe_gauge!(
        ENGINE_UP,
        "Engine mode: 1 while the engine beside the agent answers its health and metrics polls."
    );
    describe_counter!(
        ENGINE_EVENT_BATCHES,
        "Engine mode: the engine's KV-event batches: applied, duplicate (seen before), skipped (lost before the \
         agent knew anything, or undecodable), and the gaps and engine restarts found in their sequence."
    );
    describe_counter!(
        ENGINE_EVENTS_NOT_INDEXED,
        "Engine mode: engine events and blocks the gateways' index does not learn, by reason (unknown_parent: \
         stored before the agent listened; unknown_salt; lora_or_extra_keys; malformed_store; tokenless_unknown; \
         over_capacity; over_parking_capacity; unknown_removed; unknown_event; other_group)."
    );
    describe_gauge!(
        ENGINE_PARKED_BLOCKS,
        "Engine mode: engine blocks cached under a private scope's salt the agent has not seen since it started \
         (it restarted beside a running engine); indexed when a request of that scope arrives."
    );
    describe_counter!(ENGINE_UNPARKED_BLOCKS, "Engine mode: parked engine blocks indexed once their scope was seen.");
}

/// The built-in engine at one heartbeat, beyond the load it reports: its pool's cached and free blocks, host
/// RAM's blocks, and its running totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineState {
    pub kv_blocks_cached: usize,
    pub kv_blocks_free: usize,
    /// Blocks held in host RAM; None without a host tier.
    pub host_tier_blocks: Option<usize>,
    pub prefix_hit_tokens: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub preemptions_recompute: u64,
    pub preemptions_swap: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
}

/// Publishes the built-in engine's load and state (called at every heartbeat).
pub fn record_engine(load: &LoadStats, state: &EngineState) {
    record_load(load);
    gauge!(KV_BLOCKS_CACHED).set(state.kv_blocks_cached as f64);
    gauge!(KV_BLOCKS_FREE).set(state.kv_blocks_free as f64);
    counter!(PREFIX_HIT_TOKENS).absolute(state.prefix_hit_tokens);
    counter!(PROMPT_TOKENS).absolute(state.prompt_tokens);
    counter!(GENERATED_TOKENS).absolute(state.generated_tokens);
    counter!(PREEMPTIONS, "mode" => "recompute").absolute(state.preemptions_recompute);
    counter!(PREEMPTIONS, "mode" => "swap").absolute(state.preemptions_swap);
    counter!(REQUESTS_FINISHED).absolute(state.requests_finished);
    counter!(REQUESTS_CANCELLED).absolute(state.requests_cancelled);
    if let Some(blocks) = state.host_tier_blocks {
        record_tier_blocks(Tier::Host, blocks);
    }
}

/// Engine mode: the load the agent reports for its engine, and whether the engine answers (every poll).
pub fn record_external_load(load: &LoadStats, engine_up: bool) {
    gauge!(ENGINE_UP).set(if engine_up { 1.0 } else { 0.0 });
    record_load(load);
}

/// The load an agent reports to gateways, in either mode.
fn record_load(load: &LoadStats) {
    gauge!(KV_BLOCKS_TOTAL).set(load.kv_blocks_total as f64);
    gauge!(KV_BLOCKS_USED).set(load.kv_blocks_used as f64);
    gauge!(REQUESTS_WAITING).set(f64::from(load.waiting_requests));
    gauge!(REQUESTS_RUNNING).set(f64::from(load.running_requests));
    gauge!(MAX_RUNNING_REQUESTS).set(f64::from(load.max_running_requests));
    gauge!(PREFILL_TOKENS_PER_SECOND).set(load.prefill_tokens_per_second);
    gauge!(DECODE_STEP_SECONDS).set(load.decode_step_seconds);
}

/// Engine mode: what the event translator has applied, skipped and parked so far.
pub fn record_engine_events(counters: &Counters, parked_blocks: usize) {
    gauge!(ENGINE_PARKED_BLOCKS).set(parked_blocks as f64);
    counter!(ENGINE_UNPARKED_BLOCKS).absolute(counters.unparked_blocks);
    let batches = [
        ("applied", counters.batches_applied),
        ("duplicate", counters.duplicate_batches),
        ("skipped", counters.batches_skipped),
        ("gap", counters.gaps),
        ("restart", counters.restarts),
    ];
    for (outcome, value) in batches {
        counter!(ENGINE_EVENT_BATCHES, "outcome" => outcome).absolute(value);
    }
    let not_indexed = [
        ("unknown_parent", counters.unknown_parent_blocks),
        ("unknown_salt", counters.unknown_salt_roots),
        ("lora_or_extra_keys", counters.unindexable_blocks),
        ("malformed_store", counters.malformed_stores),
        ("tokenless_unknown", counters.tokenless_unknown_blocks),
        ("over_capacity", counters.over_capacity_blocks),
        ("over_parking_capacity", counters.over_parking_capacity_blocks),
        ("unknown_removed", counters.unknown_removed_blocks),
        ("unknown_event", counters.unknown_events),
        ("other_group", counters.other_group_events),
    ];
    for (reason, value) in not_indexed {
        counter!(ENGINE_EVENTS_NOT_INDEXED, "reason" => reason).absolute(value);
    }
}

pub fn record_open_streams(streams: usize) {
    gauge!(GENERATE_STREAMS).set(streams as f64);
}

pub fn record_prefetch_held(bytes: u64) {
    gauge!(PREFETCH_BYTES_HELD).set(bytes as f64);
}

/// A request refused at submission, by the refusal's `GenerateError::reason_label`.
pub fn record_rejection(reason: &'static str) {
    counter!(REQUESTS_REJECTED, "reason" => reason).increment(1);
}

pub const TIER_HIT_TOKENS: &str = "kvroute_agent_tier_hit_tokens_total";
pub const TIER_STORED_BLOCKS: &str = "kvroute_agent_tier_stored_blocks_total";
pub const TIER_EVICTED_BLOCKS: &str = "kvroute_agent_tier_evicted_blocks_total";
pub const TIER_BYTES: &str = "kvroute_agent_tier_bytes_total";
pub const TIER_RELOAD_SECONDS: &str = "kvroute_agent_tier_reload_seconds";
pub const TIER_RELOADED_BLOCKS: &str = "kvroute_agent_tier_reloaded_blocks_total";
pub const TIER_QUEUE_DEPTH: &str = "kvroute_agent_tier_queue_depth";
pub const TIER_DROPPED: &str = "kvroute_agent_tier_dropped_total";
pub const TIER_CORRUPT: &str = "kvroute_agent_tier_corrupt_total";
pub const TIER_UP: &str = "kvroute_agent_tier_up";
pub const TIER_BLOCKS: &str = "kvroute_agent_tier_blocks";
pub const WRITE_THROUGH_BLOCKS: &str = "kvroute_agent_write_through_blocks_total";
pub const REDIS_ERRORS: &str = "kvroute_agent_redis_errors_total";

pub fn describe_tiers() {
    describe_counter!(TIER_HIT_TOKENS, "Prompt tokens reloaded from a lower tier instead of computed, by tier.");
    describe_counter!(TIER_STORED_BLOCKS, "Blocks stored into a tier, by tier.");
    describe_counter!(TIER_EVICTED_BLOCKS, "Blocks evicted from a tier, by tier.");
    describe_counter!(TIER_BYTES, "Bytes moved to or from a tier, by tier and direction.");
    metrics::describe_histogram!(TIER_RELOAD_SECONDS, metrics::Unit::Seconds, "Time to reload a run of blocks.");
    describe_counter!(TIER_RELOADED_BLOCKS, "Blocks reloaded from a tier into the pool, by tier.");
    describe_gauge!(TIER_QUEUE_DEPTH, "Blocks queued for writing to a tier.");
    describe_counter!(TIER_DROPPED, "Spills dropped because the write queue was full or the tier down.");
    describe_counter!(TIER_CORRUPT, "Records that failed verification, were deleted and recomputed.");
    describe_gauge!(TIER_UP, "1 when the tier is reachable.");
    describe_gauge!(TIER_BLOCKS, "Blocks held by a tier (host).");
    describe_counter!(WRITE_THROUGH_BLOCKS, "Hot pool blocks sent to the network tier before any eviction.");
    describe_counter!(REDIS_ERRORS, "Redis operations that failed or timed out.");
}

pub fn record_tier_hit(tier: Tier, tokens: usize, blocks: usize) {
    counter!(TIER_HIT_TOKENS, "tier" => tier.as_str()).increment(tokens as u64);
    counter!(TIER_RELOADED_BLOCKS, "tier" => tier.as_str()).increment(blocks as u64);
}

pub fn record_tier_stored(tier: Tier, blocks: usize) {
    counter!(TIER_STORED_BLOCKS, "tier" => tier.as_str()).increment(blocks as u64);
}

pub fn record_tier_evicted(tier: Tier, blocks: usize) {
    counter!(TIER_EVICTED_BLOCKS, "tier" => tier.as_str()).increment(blocks as u64);
}

pub fn record_tier_blocks(tier: Tier, blocks: usize) {
    gauge!(TIER_BLOCKS, "tier" => tier.as_str()).set(blocks as f64);
}

/// A reload of `bytes` from `tier` that took `seconds` (the blocks it brought are counted by
/// [`record_tier_hit`] once the engine places them).
pub fn record_tier_reload(tier: Tier, bytes: usize, seconds: f64) {
    counter!(TIER_BYTES, "tier" => tier.as_str(), "direction" => "read").increment(bytes as u64);
    metrics::histogram!(TIER_RELOAD_SECONDS, "tier" => tier.as_str()).record(seconds);
}

/// `blocks` blocks of `bytes` in all written to `tier`.
pub fn record_tier_write(tier: Tier, blocks: usize, bytes: usize) {
    counter!(TIER_BYTES, "tier" => tier.as_str(), "direction" => "write").increment(bytes as u64);
    record_tier_stored(tier, blocks);
}

pub fn record_write_through(blocks: usize) {
    counter!(WRITE_THROUGH_BLOCKS).increment(blocks as u64);
}

pub fn record_tier_queue(tier: Tier, depth: usize) {
    gauge!(TIER_QUEUE_DEPTH, "tier" => tier.as_str()).set(depth as f64);
}

pub fn record_tier_drop(tier: Tier) {
    record_tier_drops(tier, 1);
}

pub fn record_tier_drops(tier: Tier, blocks: usize) {
    counter!(TIER_DROPPED, "tier" => tier.as_str()).increment(blocks as u64);
}

pub fn record_tier_corrupt(tier: Tier) {
    counter!(TIER_CORRUPT, "tier" => tier.as_str()).increment(1);
}

pub fn record_tier_up(tier: Tier, up: bool) {
    gauge!(TIER_UP, "tier" => tier.as_str()).set(if up { 1.0 } else { 0.0 });
}

pub fn record_redis_error() {
    counter!(REDIS_ERRORS).increment(1);
}

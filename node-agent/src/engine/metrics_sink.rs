//! What the engine core counts while it works (tier hits, stores, evictions, reload times, prefetch
//! bytes held, each step's cost), reported through a sink its caller supplies: the agent's Prometheus recorder
//! (`prometheus_sink.rs`), or [`NoMetrics`] in the simulator and in tests. The core itself touches no global
//! recorder.

use kvroute_proto::domain::Tier;

/// What one engine step computed and how long it took: the records a simulator cost profile of this
/// machine is fitted to (`node-agent --step-log`, `bench/fit-step-profile.py`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    /// New tokens the step computed (prefill and decode).
    pub tokens: usize,
    /// Sequences that sampled a token.
    pub sampled: usize,
    /// Attention work: the sum over computed tokens of the positions each attends to.
    pub attended: f64,
    /// Seconds of the forward pass.
    pub forward_seconds: f64,
    /// Seconds of the whole step (scheduling, tier reloads, sampling included).
    pub step_seconds: f64,
}

/// Receives the engine core's counters and gauges.
pub trait MetricsSink: Send + Sync + std::fmt::Debug {
    /// Pool blocks queued for the network tier by write-through.
    fn write_through(&self, blocks: usize);
    /// Prompt tokens (in `blocks` blocks) reloaded from `tier` instead of computed.
    fn tier_hit(&self, tier: Tier, tokens: usize, blocks: usize);
    fn tier_stored(&self, tier: Tier, blocks: usize);
    fn tier_evicted(&self, tier: Tier, blocks: usize);
    /// A copy of `bytes` from `tier` into the pool that took `seconds`.
    fn tier_reload(&self, tier: Tier, bytes: usize, seconds: f64);
    /// Bytes of prefetched network-tier blocks held now.
    fn prefetch_held(&self, bytes: u64);
    /// One step that computed tokens.
    fn step(&self, cost: &StepCost);
}

/// A sink that drops everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMetrics;

impl MetricsSink for NoMetrics {
    fn write_through(&self, _blocks: usize) {}
    fn tier_hit(&self, _tier: Tier, _tokens: usize, _blocks: usize) {}
    fn tier_stored(&self, _tier: Tier, _blocks: usize) {}
    fn tier_evicted(&self, _tier: Tier, _blocks: usize) {}
    fn tier_reload(&self, _tier: Tier, _bytes: usize, _seconds: f64) {}
    fn prefetch_held(&self, _bytes: u64) {}
    fn step(&self, _cost: &StepCost) {}
}

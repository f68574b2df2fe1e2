//! The engine core's [`MetricsSink`] in the agent: its counters go to the agent's Prometheus registry
//! (through [`crate::metrics`]' record functions), its step costs to the `--step-log` file when there is one.

use std::sync::Arc;

use kvroute_proto::domain::Tier;

use crate::engine::{MetricsSink, StepCost};
use crate::metrics;
use crate::step_log::StepLog;

/// The engine core's counters, recorded in the agent's Prometheus registry; its step costs go to the
/// `--step-log` file when there is one.
#[derive(Clone, Debug, Default)]
pub struct Prometheus {
    step_log: Option<Arc<StepLog>>,
}

impl Prometheus {
    pub fn with_step_log(step_log: Option<Arc<StepLog>>) -> Prometheus {
        Prometheus { step_log }
    }
}

impl MetricsSink for Prometheus {
    fn write_through(&self, blocks: usize) {
        metrics::record_write_through(blocks);
    }
    fn tier_hit(&self, tier: Tier, tokens: usize, blocks: usize) {
        metrics::record_tier_hit(tier, tokens, blocks);
    }
    fn tier_stored(&self, tier: Tier, blocks: usize) {
        metrics::record_tier_stored(tier, blocks);
    }
    fn tier_evicted(&self, tier: Tier, blocks: usize) {
        metrics::record_tier_evicted(tier, blocks);
    }
    fn tier_reload(&self, tier: Tier, bytes: usize, seconds: f64) {
        metrics::record_tier_reload(tier, bytes, seconds);
    }
    fn prefetch_held(&self, bytes: u64) {
        metrics::record_prefetch_held(bytes);
    }
    fn step(&self, cost: &StepCost) {
        if let Some(log) = &self.step_log {
            log.record(cost);
        }
    }
}

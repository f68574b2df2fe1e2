//! The engine's side of the tiers: blocks evicted from the pool go to host
//! RAM, blocks evicted from host RAM (and hot blocks, when write-through is on)
//! go to the network tier's write queue, and admission extends a prompt's pool
//! match from host RAM and from prefetched network blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvroute_proto::block_hash::BlockHash;
use kvroute_proto::domain::{KvEvent, Tier};

use super::metrics_sink::{MetricsSink, NoMetrics};
use crate::tiers::host::{BlockBytes, HostTier};

/// Reuses by new requests after which a pool block is also written to the network tier, unless configured
/// otherwise (the agent's `--redis-write-through-hits`, and the simulator's replicas).
pub const DEFAULT_WRITE_THROUGH_HITS: u32 = 2;

/// Queues a block for the network tier; returns false when it was dropped.
pub type SpillFn = Box<dyn FnMut(BlockHash, BlockBytes) -> bool + Send>;

/// Blocks fetched from the network tier for one request, by chain position.
#[derive(Debug, Default)]
pub struct Prefetched {
    /// Index of the first fetched block in the prompt's chain.
    pub first_block: usize,
    pub blocks: Vec<BlockBytes>,
    /// The share of the [`PrefetchBudget`] the blocks hold, returned when they are dropped.
    pub hold: Option<BudgetHold>,
}

impl Prefetched {
    pub fn get(&self, block_index: usize) -> Option<&BlockBytes> {
        block_index.checked_sub(self.first_block).and_then(|i| self.blocks.get(i))
    }
}

/// Bytes of fetched network-tier blocks that requests waiting for admission may hold at once, so that a
/// burst of long prompts cannot fill the agent's memory with blocks it has not placed yet.
#[derive(Clone, Debug)]
pub struct PrefetchBudget {
    limit: u64,
    held: Arc<AtomicU64>,
    metrics: Arc<dyn MetricsSink>,
}

/// A share of a [`PrefetchBudget`]; dropping it returns the bytes.
#[derive(Debug)]
pub struct BudgetHold {
    bytes: u64,
    held: Arc<AtomicU64>,
    metrics: Arc<dyn MetricsSink>,
}

impl PrefetchBudget {
    pub fn new(limit_bytes: u64) -> PrefetchBudget {
        PrefetchBudget { limit: limit_bytes, held: Arc::default(), metrics: Arc::new(NoMetrics) }
    }

    /// Reports the bytes held to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<dyn MetricsSink>) -> PrefetchBudget {
        self.metrics = metrics;
        self
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Holds as many whole `unit`s as fit, at most `wanted`; None when not one fits.
    pub fn hold_up_to(&self, wanted: usize, unit: u64) -> Option<(usize, BudgetHold)> {
        if wanted == 0 || unit == 0 {
            return None;
        }
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            let fits = (self.limit.saturating_sub(held) / unit).min(wanted as u64);
            if fits == 0 {
                return None;
            }
            let bytes = fits * unit;
            match self.held.compare_exchange_weak(held, held + bytes, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.metrics.prefetch_held(held + bytes);
                    let hold = BudgetHold { bytes, held: self.held.clone(), metrics: self.metrics.clone() };
                    return Some((fits as usize, hold));
                }
                Err(now) => held = now,
            }
        }
    }
}

impl BudgetHold {
    /// Returns all but `bytes` of the hold (the fetch brought back fewer blocks than were asked for).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            let before = self.held.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.metrics.prefetch_held(before - (self.bytes - bytes));
            self.bytes = bytes;
        }
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        let before = self.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.metrics.prefetch_held(before - self.bytes);
    }
}

/// Host tier, network spill, and the tier events they produce.
pub struct Tiering {
    pub host: Option<HostTier>,
    pub spill: Option<SpillFn>,
    events: Vec<KvEvent>,
    /// Moving average of host-to-pool copy bandwidth, bytes per second.
    host_bandwidth: f64,
    /// Reuses after which a pool block is also written to the network tier (0: only on eviction).
    write_through_after: u32,
    metrics: Arc<dyn MetricsSink>,
}

impl Default for Tiering {
    fn default() -> Self {
        Tiering::new(None, None)
    }
}

impl Tiering {
    pub fn new(host: Option<HostTier>, spill: Option<SpillFn>) -> Tiering {
        Tiering {
            host,
            spill,
            events: Vec::new(),
            host_bandwidth: 0.0,
            write_through_after: 0,
            metrics: Arc::new(NoMetrics),
        }
    }

    /// Reports the tiers' counters to `metrics` (the engine passes its own sink on).
    pub fn with_metrics(mut self, metrics: Arc<dyn MetricsSink>) -> Tiering {
        self.metrics = metrics;
        self
    }

    /// Writes a pool block to the network tier as soon as new requests have reused it `hits` times, so a hot
    /// prefix reaches the other replicas before it is ever evicted (0: off).
    pub fn with_write_through(mut self, hits: u32) -> Tiering {
        self.write_through_after = hits;
        self
    }

    /// The reuse count that triggers a write-through, 0 when off or when there is no network tier.
    pub fn write_through_after(&self) -> u32 {
        if self.spill.is_some() { self.write_through_after } else { 0 }
    }

    /// Tier events since the last call.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    pub fn host_bandwidth(&self) -> f64 {
        self.host_bandwidth
    }

    /// A block left the pool: keep it in host RAM (or send it on to the
    /// network tier when there is no host tier).
    pub fn accept_evicted(&mut self, hash: BlockHash, bytes: BlockBytes) {
        match self.host.as_mut() {
            Some(host) => {
                let evicted = host.insert(hash, bytes);
                if host.contains(&hash) {
                    // Consecutive stores share one event.
                    match self.events.last_mut() {
                        Some(KvEvent::Stored { tier: Tier::Host, hashes }) => hashes.push(hash),
                        _ => self.events.push(KvEvent::Stored { tier: Tier::Host, hashes: vec![hash] }),
                    }
                    self.metrics.tier_stored(Tier::Host, 1);
                }
                self.host_evicted(evicted);
            }
            None => self.spill(hash, bytes),
        }
    }

    /// Sends a block to the network tier (write-through or host eviction).
    pub fn spill(&mut self, hash: BlockHash, bytes: BlockBytes) {
        if let Some(spill) = self.spill.as_mut() {
            spill(hash, bytes);
        }
    }

    fn host_evicted(&mut self, evicted: Vec<(BlockHash, BlockBytes)>) {
        if evicted.is_empty() {
            return;
        }
        self.metrics.tier_evicted(Tier::Host, evicted.len());
        self.events.push(KvEvent::Removed { tier: Tier::Host, hashes: evicted.iter().map(|(h, _)| *h).collect() });
        for (hash, bytes) in evicted {
            self.spill(hash, bytes);
        }
    }

    /// Charges swapped-out bytes to host memory; false when they cannot fit.
    pub fn reserve_swap(&mut self, bytes: u64) -> bool {
        let Some(host) = self.host.as_mut() else { return true };
        match host.reserve(bytes) {
            Ok(evicted) => {
                self.host_evicted(evicted);
                true
            }
            Err(_) => false,
        }
    }

    pub fn release_swap(&mut self, bytes: u64) {
        if let Some(host) = self.host.as_mut() {
            host.unreserve(bytes);
        }
    }

    /// The host tier's copy of a block, if it holds one.
    pub fn host_block(&mut self, hash: &BlockHash) -> Option<BlockBytes> {
        self.host.as_mut()?.get(hash)
    }

    /// Records a host-to-pool copy for the bandwidth estimate.
    pub fn record_host_copy(&mut self, bytes: usize, seconds: f64) {
        const ALPHA: f64 = 0.2;
        let seconds = seconds.max(1e-7);
        let rate = bytes as f64 / seconds;
        self.host_bandwidth =
            if self.host_bandwidth == 0.0 { rate } else { self.host_bandwidth + ALPHA * (rate - self.host_bandwidth) };
        self.metrics.tier_reload(Tier::Host, bytes, seconds);
    }

    /// Hashes held in host RAM (for a snapshot).
    pub fn host_hashes(&self) -> Vec<BlockHash> {
        self.host.as_ref().map(HostTier::hashes).unwrap_or_default()
    }
}

/// The reload rule: reloading a block beats recomputing it when the tier's
/// bandwidth exceeds KV bytes per token times prefill tokens per second.
/// Unknown rates (0) favour reloading, so the first measurement can happen.
pub fn reload_beats_recompute(bandwidth: f64, bytes_per_token: f64, prefill_tokens_per_second: f64) -> bool {
    bandwidth == 0.0 || prefill_tokens_per_second == 0.0 || bandwidth > bytes_per_token * prefill_tokens_per_second
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reload_rule() {
        // 23 KiB per token at 2,000 tokens/s needs 46 MB/s to pay off.
        assert!(reload_beats_recompute(1e9, 23_040.0, 2_000.0));
        assert!(!reload_beats_recompute(1e7, 23_040.0, 2_000.0));
        assert!(reload_beats_recompute(0.0, 23_040.0, 2_000.0));
    }

    #[test]
    fn the_prefetch_budget_grants_whole_blocks_and_takes_them_back_when_dropped() {
        let budget = PrefetchBudget::new(10);
        let (granted, mut first) = budget.hold_up_to(8, 3).expect("three blocks of 3 bytes fit in 10");
        assert_eq!((granted, budget.held()), (3, 9));
        assert!(budget.hold_up_to(1, 3).is_none(), "1 byte left holds no block");
        first.shrink_to(3);
        assert_eq!(budget.held(), 3);
        let (granted, second) = budget.hold_up_to(5, 3).expect("7 bytes left");
        assert_eq!((granted, budget.held()), (2, 9));
        drop(first);
        drop(second);
        assert_eq!(budget.held(), 0);
    }
}

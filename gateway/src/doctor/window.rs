//! Sliding windows of traffic counters (a ring of time buckets), and the buckets of the divergence
//! histogram: the block at which a prompt first leaves the longest prefix its tenant sent before.

use crate::routing::Millis;

/// Lower bounds of the divergence histogram's buckets, in blocks; one more bucket counts prompts whose every
/// tracked block was seen before.
pub const DIVERGENCE_LOWER: [u32; 9] = [0, 1, 2, 4, 8, 16, 32, 64, 128];

/// Buckets of the divergence histogram: [`DIVERGENCE_LOWER`], then "none" (nothing new).
pub const DIVERGENCE_BUCKETS: usize = DIVERGENCE_LOWER.len() + 1;

/// The bucket of a prompt that diverges at `block` (None: it diverges nowhere in its tracked blocks).
pub fn divergence_bucket(block: Option<u32>) -> usize {
    match block {
        None => DIVERGENCE_BUCKETS - 1,
        Some(block) => DIVERGENCE_LOWER.iter().rposition(|&lower| block >= lower).unwrap_or(0),
    }
}

/// The blocks a bucket covers: `0`, `2-3`, `128+`, or `none`.
pub fn divergence_label(bucket: usize) -> String {
    match (DIVERGENCE_LOWER.get(bucket), DIVERGENCE_LOWER.get(bucket + 1)) {
        (Some(lower), Some(next)) if next - lower == 1 => lower.to_string(),
        (Some(lower), Some(next)) => format!("{lower}-{}", next - 1),
        (Some(lower), None) => format!("{lower}+"),
        (None, _) => "none".to_string(),
    }
}

/// Tiers the routing decision can match blocks in, in the order of [`Counters::matched`].
pub const TIERS: [&str; 3] = ["gpu", "host", "network"];

/// Counts over some stretch of traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens within the tracked depth...
    pub tracked_tokens: u64,
    /// ...and of those, the ones in a prefix the tenant sent before (the repeated-prefix fraction's numerator).
    pub repeated_tokens: u64,
    /// Prompt tokens the routing decision found cached on the chosen replica, per tier ([`TIERS`]).
    pub matched: [u64; 3],
    /// Requests whose replica reported their usage, their prompt tokens, and the tokens it reported cached.
    pub finished: u64,
    pub finished_prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Requests per divergence bucket ([`divergence_bucket`]).
    pub divergence: [u64; DIVERGENCE_BUCKETS],
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.tracked_tokens += other.tracked_tokens;
        self.repeated_tokens += other.repeated_tokens;
        for (mine, theirs) in self.matched.iter_mut().zip(other.matched) {
            *mine += theirs;
        }
        self.finished += other.finished;
        self.finished_prompt_tokens += other.finished_prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        for (mine, theirs) in self.divergence.iter_mut().zip(other.divergence) {
            *mine += theirs;
        }
    }

    /// The repeated-prefix fraction: the share of tracked prompt tokens in a prefix seen before, the ceiling
    /// of any router's hit ratio on this traffic.
    pub fn repeated_ratio(&self) -> f64 {
        ratio(self.repeated_tokens, self.tracked_tokens)
    }

    /// The share of prompt tokens the routing decisions matched in `tier` ([`TIERS`] index).
    pub fn matched_ratio(&self, tier: usize) -> f64 {
        ratio(self.matched.get(tier).copied().unwrap_or(0), self.prompt_tokens)
    }

    /// The share of prompt tokens the routing decisions matched in any tier.
    pub fn matched_total_ratio(&self) -> f64 {
        ratio(self.matched.iter().sum(), self.prompt_tokens)
    }

    /// The share of prompt tokens the replicas reported cached (of the requests that finished).
    pub fn reported_ratio(&self) -> f64 {
        ratio(self.cached_tokens, self.finished_prompt_tokens)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

/// Counters over the last `window` milliseconds, in `slots` buckets: a bucket's counts leave the window
/// whole, so the window covers between `window - window / slots` and `window`.
#[derive(Clone, Debug)]
pub struct Window {
    width: Millis,
    slots: Vec<(u64, Counters)>,
}

impl Window {
    pub fn new(window: Millis, slots: usize) -> Window {
        let slots = slots.max(1);
        let width = (window / slots as u64).max(1);
        Window { width, slots: vec![(u64::MAX, Counters::default()); slots] }
    }

    /// The window's length.
    pub fn length(&self) -> Millis {
        self.width * self.slots.len() as u64
    }

    /// Counts something that happened at `now`.
    pub fn record(&mut self, now: Millis, update: impl FnOnce(&mut Counters)) {
        let epoch = now / self.width;
        let index = (epoch % self.slots.len() as u64) as usize;
        let slot = &mut self.slots[index];
        if slot.0 != epoch {
            *slot = (epoch, Counters::default());
        }
        update(&mut slot.1);
    }

    /// The counts of the window ending at `now`.
    pub fn total(&self, now: Millis) -> Counters {
        let epoch = now / self.width;
        let oldest = epoch.saturating_sub(self.slots.len() as u64 - 1);
        let mut total = Counters::default();
        for (slot_epoch, counters) in &self.slots {
            if (oldest..=epoch).contains(slot_epoch) {
                total.add(counters);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_buckets_and_labels() {
        let cases = [(Some(0), 0, "0"), (Some(1), 1, "1"), (Some(3), 2, "2-3"), (Some(20), 5, "16-31")];
        for (block, bucket, label) in cases {
            assert_eq!(divergence_bucket(block), bucket, "{block:?}");
            assert_eq!(divergence_label(bucket), label);
        }
        assert_eq!(divergence_bucket(Some(5_000)), 8);
        assert_eq!(divergence_label(8), "128+");
        assert_eq!(divergence_bucket(None), 9);
        assert_eq!(divergence_label(9), "none");
    }

    #[test]
    fn counts_leave_the_window_a_bucket_at_a_time() {
        let mut window = Window::new(10_000, 10);
        assert_eq!(window.length(), 10_000);
        window.record(500, |c| c.requests += 1);
        window.record(4_200, |c| c.requests += 2);
        assert_eq!(window.total(4_200).requests, 3);
        assert_eq!(window.total(9_999).requests, 3);
        assert_eq!(window.total(10_500).requests, 2, "the first second left");
        window.record(12_000, |c| c.requests += 4);
        assert_eq!(window.total(13_999).requests, 6);
        assert_eq!(window.total(14_000).requests, 4, "the fifth second left");
        assert_eq!(window.total(30_000).requests, 0);
        // A slot reused after a full turn (the 12th second's, in the 22nd) starts from zero.
        window.record(22_100, |c| c.requests += 1);
        assert_eq!(window.total(22_100).requests, 1);
    }

    #[test]
    fn ratios() {
        let counters = Counters {
            prompt_tokens: 200,
            tracked_tokens: 100,
            repeated_tokens: 80,
            matched: [100, 20, 0],
            finished_prompt_tokens: 100,
            cached_tokens: 50,
            ..Counters::default()
        };
        assert_eq!(counters.repeated_ratio(), 0.8);
        assert_eq!(counters.matched_ratio(0), 0.5);
        assert_eq!(counters.matched_ratio(1), 0.1);
        assert_eq!(counters.matched_total_ratio(), 0.6);
        assert_eq!(counters.reported_ratio(), 0.5);
        assert_eq!(Counters::default().repeated_ratio(), 0.0);
    }
}

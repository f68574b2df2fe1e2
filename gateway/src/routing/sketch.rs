//! The repeated-prefix sketch: how many of a prompt's blocks were seen in
//! recent traffic, in bounded memory, for the
//! `kvroute_gateway_repeated_prefix_ratio` gauge.
//!
//! Two Bloom filters take turns: blocks are checked against both and added to
//! the current one; after `window_blocks` insertions the older filter is
//! cleared and becomes current. A block therefore counts as seen when it was
//! observed within the last one to two windows of traffic. With the default
//! 10 bits per block and 7 probes the false-positive rate is about 1%.
//! Every method takes `&self` and no lock; during a rotation a concurrent
//! observation may miss a few bits, which only nudges the ratio.

use std::sync::atomic::{AtomicU64, Ordering};

use kvroute_proto::BlockHash;

/// Sizes of a [`PrefixSketch`].
#[derive(Clone, Debug, PartialEq)]
pub struct SketchConfig {
    /// Block observations per window.
    pub window_blocks: usize,
    /// Filter bits per block of a window.
    pub bits_per_block: usize,
    /// Bits probed per block.
    pub probes: u32,
}

impl Default for SketchConfig {
    fn default() -> Self {
        SketchConfig { window_blocks: 1 << 20, bits_per_block: 10, probes: 7 }
    }
}

pub struct PrefixSketch {
    filters: [Box<[AtomicU64]>; 2],
    bit_mask: u64,
    probes: u32,
    window: u64,
    generation: AtomicU64,
    inserted: AtomicU64,
    /// Seen and total blocks of the current and previous windows, by generation parity.
    seen: [AtomicU64; 2],
    total: [AtomicU64; 2],
    seen_all: AtomicU64,
    total_all: AtomicU64,
}

impl PrefixSketch {
    pub fn new(config: &SketchConfig) -> PrefixSketch {
        let bits = (config.window_blocks.max(1) * config.bits_per_block.max(1)).next_power_of_two().max(64);
        let words = bits / 64;
        let filter = || (0..words).map(|_| AtomicU64::new(0)).collect::<Box<[AtomicU64]>>();
        PrefixSketch {
            filters: [filter(), filter()],
            bit_mask: bits as u64 - 1,
            probes: config.probes.max(1),
            window: config.window_blocks.max(1) as u64,
            generation: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            seen: Default::default(),
            total: Default::default(),
            seen_all: AtomicU64::new(0),
            total_all: AtomicU64::new(0),
        }
    }

    pub fn memory_bytes(&self) -> usize {
        2 * self.filters[0].len() * std::mem::size_of::<AtomicU64>()
    }

    fn positions(&self, hash: &BlockHash) -> impl Iterator<Item = u64> + use<'_> {
        let mut high = [0u8; 8];
        high.copy_from_slice(&hash.0[8..]);
        let first = hash.low_u64();
        let step = u64::from_le_bytes(high) | 1;
        (0..u64::from(self.probes)).map(move |i| first.wrapping_add(i.wrapping_mul(step)) & self.bit_mask)
    }

    fn contains(&self, filter: usize, hash: &BlockHash) -> bool {
        let words = &self.filters[filter];
        self.positions(hash).all(|bit| words[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0)
    }

    fn insert(&self, filter: usize, hash: &BlockHash) {
        let words = &self.filters[filter];
        for bit in self.positions(hash) {
            let cell = &words[(bit / 64) as usize];
            let mask = 1 << (bit % 64);
            if cell.load(Ordering::Relaxed) & mask == 0 {
                cell.fetch_or(mask, Ordering::Relaxed);
            }
        }
    }

    /// Records a prompt's blocks; returns (blocks seen recently, blocks).
    pub fn observe(&self, hashes: &[BlockHash]) -> (usize, usize) {
        let generation = self.generation.load(Ordering::Acquire);
        let current = (generation % 2) as usize;
        let previous = 1 - current;
        let mut seen = 0;
        for hash in hashes {
            if self.contains(current, hash) || self.contains(previous, hash) {
                seen += 1;
            }
            self.insert(current, hash);
        }
        let total = hashes.len();
        self.seen[current].fetch_add(seen as u64, Ordering::Relaxed);
        self.total[current].fetch_add(total as u64, Ordering::Relaxed);
        self.seen_all.fetch_add(seen as u64, Ordering::Relaxed);
        self.total_all.fetch_add(total as u64, Ordering::Relaxed);
        let inserted = self.inserted.fetch_add(total as u64, Ordering::Relaxed) + total as u64;
        if inserted >= self.window
            && self.inserted.compare_exchange(inserted, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            self.rotate(generation);
        }
        (seen, total)
    }

    /// Clears the older filter and makes it current.
    fn rotate(&self, generation: u64) {
        let next = ((generation + 1) % 2) as usize;
        for word in self.filters[next].iter() {
            word.store(0, Ordering::Relaxed);
        }
        self.seen[next].store(0, Ordering::Relaxed);
        self.total[next].store(0, Ordering::Relaxed);
        self.generation.store(generation + 1, Ordering::Release);
    }

    /// Fraction of blocks seen recently over the current and previous windows
    /// (0 before any traffic): the repeated-prefix ratio gauge.
    pub fn ratio(&self) -> f64 {
        let seen: u64 = self.seen.iter().map(|count| count.load(Ordering::Relaxed)).sum();
        let total: u64 = self.total.iter().map(|count| count.load(Ordering::Relaxed)).sum();
        if total == 0 { 0.0 } else { seen as f64 / total as f64 }
    }

    /// (seen, total) blocks since creation, for counters.
    pub fn totals(&self) -> (u64, u64) {
        (self.seen_all.load(Ordering::Relaxed), self.total_all.load(Ordering::Relaxed))
    }
}

impl std::fmt::Debug for PrefixSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixSketch").field("window", &self.window).field("ratio", &self.ratio()).finish()
    }
}

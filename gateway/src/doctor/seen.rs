//! The block hashes a tenant sent recently, in bounded memory: two generations take turns, like the
//! repeated-prefix sketch's filters. A hash is seen when it is in either; new ones go to the current one,
//! which becomes the previous one when it is full or older than half the window. A hash therefore counts as
//! seen for between half a window (or one generation of distinct blocks) and twice that.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use kvroute_proto::block_hash::BlockHashHasher;

use crate::routing::Millis;

type Set = HashSet<u64, BuildHasherDefault<BlockHashHasher>>;

#[derive(Clone, Debug)]
pub struct SeenBlocks {
    current: Set,
    previous: Set,
    capacity: usize,
    max_age: Millis,
    started: Millis,
}

impl SeenBlocks {
    /// At most `capacity` hashes per generation; a generation lasts at most `max_age`.
    pub fn new(capacity: usize, max_age: Millis, now: Millis) -> SeenBlocks {
        let capacity = capacity.max(1);
        SeenBlocks {
            current: Set::with_capacity_and_hasher(capacity, Default::default()),
            previous: Set::default(),
            capacity,
            max_age: max_age.max(1),
            started: now,
        }
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.current.contains(&hash) || self.previous.contains(&hash)
    }

    /// How many leading hashes of `chain` were seen. A chain names prefixes, so once one is missing the
    /// rest are too (or were inserted by an older chain whose prefix has since been forgotten).
    pub fn seen_prefix(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|&&hash| self.contains(hash)).count()
    }

    /// Remembers `chain` (all of it: seen hashes move to the current generation, so a prefix in use stays).
    pub fn insert(&mut self, now: Millis, chain: &[u64]) {
        if now.saturating_sub(self.started) >= self.max_age / 2 {
            self.rotate(now);
        }
        for &hash in chain {
            if self.current.len() >= self.capacity {
                self.rotate(now);
            }
            self.current.insert(hash);
        }
    }

    fn rotate(&mut self, now: Millis) {
        self.previous = std::mem::replace(&mut self.current, Set::with_capacity_and_hasher(0, Default::default()));
        self.current.reserve(self.capacity.min(self.previous.len().max(16)));
        self.started = now;
    }

    /// Bytes of its tables, roughly.
    pub fn memory_bytes(&self) -> usize {
        (self.current.capacity() + self.previous.capacity()) * (std::mem::size_of::<u64>() + 1)
    }

    /// The most bytes it can take: two full generations.
    pub fn max_memory_bytes(capacity: usize) -> usize {
        // hashbrown keeps at most 7/8 of its buckets full and rounds buckets up to a power of two.
        2 * (capacity.max(1) * 8 / 7 + 1).next_power_of_two() * (std::mem::size_of::<u64>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_stays_while_it_is_used_and_leaves_when_it_is_not() {
        let mut seen = SeenBlocks::new(4, 1_000, 0);
        seen.insert(0, &[1, 2, 3]);
        assert_eq!(seen.seen_prefix(&[1, 2, 9, 3]), 2);
        // The current generation fills: 1, 2, 3 move to the previous one and stay seen.
        seen.insert(10, &[4, 5]);
        assert!([1, 2, 3, 4, 5].iter().all(|&hash| seen.contains(hash)));
        // Reused, 1 and 2 come back to the current generation; 3 is forgotten at the next rotation.
        seen.insert(20, &[1, 2, 6, 7]);
        seen.insert(30, &[8]);
        assert!(seen.contains(1) && seen.contains(2) && seen.contains(8));
        assert!(!seen.contains(3));
        // Half a window later the generation turns over even if it is not full, and again later.
        seen.insert(600, &[10]);
        seen.insert(1_200, &[11]);
        assert!(!seen.contains(1) && seen.contains(10) && seen.contains(11));
        assert!(seen.memory_bytes() <= SeenBlocks::max_memory_bytes(4));
    }
}

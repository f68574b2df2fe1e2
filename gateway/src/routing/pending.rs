//! Pending entries: where the gateway just sent a prefix, before the replica's
//! events confirm it. A small lossy table that any request thread may write
//! and read without locks.
//!
//! Buckets of two slots are addressed by the key's low bits (above the 16
//! that are always clear). A slot holds one
//! (block, replica, expiry); a new entry replaces the slot with the same block,
//! else an empty or expired slot, else the one expiring first. Writers take a
//! slot with a compare-and-swap and give up when another writer holds it:
//! a pending entry is a hint, and losing one only means a burst may scatter a
//! little. Readers use the same per-slot sequence lock as the main table.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use super::huge_pages::zeroed_words;
use super::table::Key;
use super::{Millis, ReplicaId};

const WRITING: u64 = 1;
/// Words of a slot: lock, key, value.
const STRIDE: usize = 3;
const SLOT_ATTEMPTS: usize = 8;
/// A value word: bit 63 marks an entry, bits 47..63 the replica, the low 47
/// bits the expiry time (about 4,400 years of milliseconds).
const LIVE: u64 = 1 << 63;
const EXPIRY_BITS: u32 = 47;
const EXPIRY_MASK: u64 = (1 << EXPIRY_BITS) - 1;

pub(crate) struct PendingTable {
    words: Box<[AtomicU64]>,
    buckets: usize,
    /// The latest expiry ever recorded: no entry is live at or after it.
    horizon: AtomicU64,
}

fn pack(replica: ReplicaId, expiry: Millis) -> u64 {
    LIVE | (u64::from(replica) << EXPIRY_BITS) | expiry.min(EXPIRY_MASK)
}

fn unpack(value: u64) -> Option<(ReplicaId, Millis)> {
    if value & LIVE == 0 {
        return None;
    }
    let replica = ReplicaId::try_from((value & !LIVE) >> EXPIRY_BITS).ok()?;
    Some((replica, value & EXPIRY_MASK))
}

impl PendingTable {
    /// A table of at least `slots` slots (rounded up to a power of two, at least 2).
    pub fn new(slots: usize) -> PendingTable {
        let slots = slots.max(2).next_power_of_two();
        PendingTable { words: zeroed_words(slots * STRIDE), buckets: slots / 2, horizon: AtomicU64::new(0) }
    }

    pub fn memory_bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<AtomicU64>()
    }

    fn bucket(&self, key: Key) -> usize {
        // The key's low bits: independent of the main table's home slot,
        // which comes from the high bits.
        ((key.0 >> 16) as usize) & (self.buckets - 1)
    }

    /// Whether any entry may still be live at `now` (lookups skip the table otherwise).
    pub fn any_live(&self, now: Millis) -> bool {
        now < self.horizon.load(Ordering::Relaxed)
    }

    /// Loads the first word of `key`'s bucket, ahead of a lookup that reads it.
    pub fn warm(&self, key: Key) -> u64 {
        self.words[self.bucket(key) * 2 * STRIDE].load(Ordering::Relaxed)
    }

    /// Records `key` as pending on `replica` until `expiry`.
    pub fn add(&self, key: Key, replica: ReplicaId, now: Millis, expiry: Millis) {
        if self.horizon.load(Ordering::Relaxed) < expiry {
            self.horizon.fetch_max(expiry, Ordering::Relaxed);
        }
        let first = self.bucket(key) * 2;
        let mut target = first;
        let mut target_rank = u64::MAX;
        for slot in [first, first + 1] {
            let base = slot * STRIDE;
            let value = self.words[base + 2].load(Ordering::Relaxed);
            let same = self.words[base + 1].load(Ordering::Relaxed) == key.0;
            // Lower rank is a better slot to take.
            let rank = match unpack(value) {
                _ if same => 0,
                None => 1,
                Some((_, old_expiry)) if old_expiry <= now => 1,
                Some((_, old_expiry)) => 2 + old_expiry,
            };
            if rank < target_rank {
                target = slot;
                target_rank = rank;
            }
        }
        let base = target * STRIDE;
        let meta = &self.words[base];
        let current = meta.load(Ordering::Relaxed);
        if current & WRITING != 0
            || meta.compare_exchange(current, current | WRITING, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            return;
        }
        fence(Ordering::Release);
        self.words[base + 1].store(key.0, Ordering::Relaxed);
        self.words[base + 2].store(pack(replica, expiry), Ordering::Relaxed);
        meta.fetch_add(WRITING, Ordering::Release);
    }

    /// The replica `key` is pending on, if an entry is live at `now`.
    pub fn holder(&self, key: Key, now: Millis) -> Option<ReplicaId> {
        let first = self.bucket(key) * 2;
        let mut best: Option<(ReplicaId, Millis)> = None;
        for slot in [first, first + 1] {
            if let Some((replica, expiry)) = self.read(slot, key)
                && expiry > now
                && best.is_none_or(|(_, best_expiry)| expiry > best_expiry)
            {
                best = Some((replica, expiry));
            }
        }
        best.map(|(replica, _)| replica)
    }

    fn read(&self, slot: usize, key: Key) -> Option<(ReplicaId, Millis)> {
        let base = slot * STRIDE;
        for _ in 0..SLOT_ATTEMPTS {
            let before = self.words[base].load(Ordering::Acquire);
            if before & WRITING != 0 {
                spin_loop();
                continue;
            }
            let stored = self.words[base + 1].load(Ordering::Relaxed);
            let value = self.words[base + 2].load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.words[base].load(Ordering::Relaxed) == before {
                return if stored == key.0 { unpack(value) } else { None };
            }
        }
        None
    }

    /// Forgets every entry of `replica`.
    pub fn remove_replica(&self, replica: ReplicaId) {
        for slot in 0..self.buckets * 2 {
            let base = slot * STRIDE;
            let value = self.words[base + 2].load(Ordering::Relaxed);
            if unpack(value).is_some_and(|(holder, _)| holder == replica) {
                // Compare-and-swap: an entry rewritten meanwhile is left alone.
                let _ = self.words[base + 2].compare_exchange(value, 0, Ordering::Release, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_are_replaced() {
        let table = PendingTable::new(16);
        let key = Key(2 << 16);
        assert_eq!(table.holder(key, 0), None);
        table.add(key, 3, 0, 100);
        assert_eq!(table.holder(key, 99), Some(3));
        assert_eq!(table.holder(key, 100), None);
        table.add(key, 4, 50, 200);
        assert_eq!(table.holder(key, 60), Some(4));
        table.remove_replica(4);
        assert_eq!(table.holder(key, 60), None);
    }

    #[test]
    fn pack_round_trips() {
        assert_eq!(unpack(pack(0, 5)), Some((0, 5)));
        assert_eq!(unpack(pack(ReplicaId::MAX, EXPIRY_MASK)), Some((ReplicaId::MAX, EXPIRY_MASK)));
        assert_eq!(unpack(0), None);
    }
}

//! The prefix index's storage: a fixed-capacity open-addressing hash table of
//! atomic words that one writer at a time mutates while any number of readers
//! probe it without locks.
//!
//! # Layout
//! Slot `i` occupies `stride = 1 + 3W` consecutive `AtomicU64` words:
//! `tag, gpu[W], host[W], network[W]`, where `W` is the number of 64-bit
//! words of a replica set: with up to 64 replicas a slot is 32 bytes, two to a
//! cache line (slot 0 starts on a line boundary), so that a probe of a few
//! slots reads one or two lines. The tag's high 48 bits are the key, 48 bits
//! of the block hash; its low 16 bits are not: bits 0-1 hold the entry's
//! recency (for eviction), bit 2 is set while the writer rewrites the slot,
//! bits 3-15 are the slot's version. Two blocks that share 48 bits share an
//! entry: at a million entries about one table in 560 holds such a pair, and
//! it costs a routing hint, never data. A slot is empty when all its replica
//! sets are empty: the writer deletes an entry as its last holder goes. Keys
//! are placed by linear probing from `home(key)` with Robin Hood ordering;
//! deletion shifts later entries of the run backwards (no tombstones).
//!
//! # Reads never wait
//! The tag is a sequence lock for its slot: a reader reads it, the rest of
//! the slot, and it again, and retries the slot when it was being written or
//! changed. Replica bits of a live entry change in place with single atomic
//! RMWs and no version change: each word a reader sees is a value the entry
//! really had. Insertion moves entries forward, last first, which a forward
//! probe cannot miss. A backward shift may move an entry past a probing reader, so a
//! probe that ends without finding its key is repeated with the sequence
//! counters of every region of [`REGION_SLOTS`] slots it crosses, which a
//! shift makes odd while it moves entries there. Readers never wait for the
//! writer: a slot that stays busy is skipped, and a miss that cannot be
//! confirmed after [`FIND_ATTEMPTS`] attempts is reported as a miss. The only
//! effect of a racing writer on a lookup is, rarely, a block under-reported.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use kvroute_proto::BlockHash;

use super::huge_pages::zeroed_words;

/// Slots per relocation counter.
pub(crate) const REGION_SLOTS: usize = 64;
/// Region-checked probes before a miss is reported unconfirmed.
pub(crate) const FIND_ATTEMPTS: usize = 16;
/// Consistent-read attempts of one slot before the probe skips it.
const SLOT_ATTEMPTS: usize = 16;
/// Regions a single probe may cross and still be confirmed.
const MAX_PROBE_REGIONS: usize = 4;

/// Slots a lookup touches ahead of its probe: two cache lines with up to 64
/// replicas, wherever in its line the home slot sits. At the load
/// cap (0.7) a probe ends within the first three slots from home for 85% of
/// keys: each probe past the touched lines is a cache miss nothing overlaps.
pub(crate) const WARM_SLOTS: usize = 3;
/// Words of a 64-byte cache line.
const LINE_WORDS: usize = 8;

/// Words of the tag (key and lock) before a slot's replica sets.
const TAG_WORDS: usize = 1;
/// Bits 0-1 of the tag: the recency counter.
const RECENCY: u64 = 0b11;
/// Recency after a lookup hit (the counter's maximum).
const RECENCY_MAX: u64 = 3;
/// Recency after an insert or a new holder, at least.
const RECENCY_STORED: u64 = 1;
/// Bit 2 of the tag: the writer is rewriting the slot.
const WRITING: u64 = 0b100;
/// Bits 3-15 of the tag: the slot's version.
const VERSION_ONE: u64 = 0b1000;
const VERSION: u64 = 0xFFF8;
/// Bits 16-63 of the tag: key.
const KEY_BITS: u64 = !0xFFFF;

/// The 48 bits of a block hash the index keys on (its last six bytes), as the
/// high bits of a word whose low 16 bits are clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key(pub u64);

impl Key {
    pub fn of(hash: &BlockHash) -> Key {
        let mut high = [0u8; 8];
        high.copy_from_slice(&hash.0[8..]);
        Key(u64::from_le_bytes(high) & KEY_BITS)
    }
}

/// Outcome of reading one slot.
enum SlotRead {
    Empty,
    Other,
    Match,
    /// The writer kept the slot busy.
    Busy,
}

pub(crate) struct Table {
    words: Box<[AtomicU64]>,
    /// Index in `words` of slot 0's first word: the first on a line boundary.
    first: usize,
    regions: Box<[AtomicU64]>,
    slots: usize,
    set_words: usize,
    stride: usize,
}

impl Table {
    /// A table of `slots` slots whose replica sets have `set_words` words.
    pub fn new(slots: usize, set_words: usize) -> Table {
        let slots = slots.max(2);
        let stride = TAG_WORDS + 3 * set_words;
        let words = zeroed_words(slots * stride + LINE_WORDS - 1);
        let word_bytes = std::mem::size_of::<AtomicU64>();
        let misaligned = (words.as_ptr().addr() / word_bytes) % LINE_WORDS;
        let first = (LINE_WORDS - misaligned) % LINE_WORDS;
        Table {
            words,
            first,
            regions: (0..slots.div_ceil(REGION_SLOTS)).map(|_| AtomicU64::new(0)).collect(),
            slots,
            set_words,
            stride,
        }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn set_words(&self) -> usize {
        self.set_words
    }

    /// Words of one entry's replica sets: gpu, host and network, `W` each.
    pub fn holder_words(&self) -> usize {
        3 * self.set_words
    }

    pub fn memory_bytes(&self) -> usize {
        (self.words.len() + self.regions.len()) * std::mem::size_of::<AtomicU64>()
    }

    pub fn slot_bytes(&self) -> usize {
        self.stride * std::mem::size_of::<AtomicU64>()
    }

    fn home(&self, key: Key) -> usize {
        // Keys are blake3 output: the high bits of `key * slots` are uniform.
        ((u128::from(key.0) * self.slots as u128) >> 64) as usize
    }

    /// Index in `words` of `slot`'s tag.
    fn base(&self, slot: usize) -> usize {
        self.first + slot * self.stride
    }

    fn next(&self, slot: usize) -> usize {
        if slot + 1 == self.slots { 0 } else { slot + 1 }
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        &self.words[index]
    }

    fn tag(&self, slot: usize) -> &AtomicU64 {
        self.word(self.base(slot))
    }

    fn holder(&self, slot: usize, set: usize, word: usize) -> &AtomicU64 {
        self.word(self.base(slot) + TAG_WORDS + set * self.set_words + word)
    }

    /// The first word of `key`'s home slot: where its probe starts reading.
    pub fn probe_start(&self, key: Key) -> usize {
        self.base(self.home(key))
    }

    /// Loads one word of every cache line of the [`WARM_SLOTS`] slots from
    /// word `start` (a [`Table::probe_start`]), so that the probe that follows
    /// finds its lines present. Callers touch a run of blocks before probing
    /// any, in a loop that does nothing else, so that the memory system
    /// overlaps the misses.
    pub fn warm(&self, start: usize) -> u64 {
        let end = (start + WARM_SLOTS * self.stride).min(self.base(self.slots));
        let Some(words) = self.words.get(start..end) else { return 0 };
        // A word every line length, and the last: no line of the span is skipped.
        let last = words.last().map_or(0, |word| word.load(Ordering::Relaxed));
        words.iter().step_by(LINE_WORDS).fold(last, |warm, word| warm ^ word.load(Ordering::Relaxed))
    }

    // ----- readers -------------------------------------------------------

    /// Copies the holder sets of `key` into `out` (`3W` words) and marks the
    /// entry recently used when `touch`. Returns false when the key is absent
    /// (then `out` is unspecified).
    pub fn find(&self, key: Key, out: &mut [u64], touch: bool) -> bool {
        let mut slot = self.home(key);
        for _ in 0..self.slots {
            match self.read_slot(slot, key, out) {
                SlotRead::Match => {
                    if touch {
                        self.touch(slot);
                    }
                    return true;
                }
                SlotRead::Empty => break,
                SlotRead::Other | SlotRead::Busy => slot = self.next(slot),
            }
        }
        self.confirm_miss(key, out, touch)
    }

    /// Probes again with the relocation counters of the regions crossed, so
    /// that an entry a concurrent shift moved past the first probe is found.
    fn confirm_miss(&self, key: Key, out: &mut [u64], touch: bool) -> bool {
        for attempt in 0..FIND_ATTEMPTS {
            let mut seen = [(usize::MAX, 0u64); MAX_PROBE_REGIONS];
            let mut seen_len = 0;
            let mut confirmable = true;
            let mut slot = self.home(key);
            for _ in 0..self.slots {
                let region = slot / REGION_SLOTS;
                if seen_len == 0 || seen[seen_len - 1].0 != region {
                    if seen_len < MAX_PROBE_REGIONS {
                        seen[seen_len] = (region, self.regions[region].load(Ordering::Acquire));
                        seen_len += 1;
                    } else {
                        confirmable = false;
                    }
                }
                match self.read_slot(slot, key, out) {
                    SlotRead::Match => {
                        if touch {
                            self.touch(slot);
                        }
                        return true;
                    }
                    SlotRead::Empty => break,
                    SlotRead::Other => slot = self.next(slot),
                    SlotRead::Busy => {
                        confirmable = false;
                        slot = self.next(slot);
                    }
                }
            }
            fence(Ordering::Acquire);
            let stable = seen[..seen_len]
                .iter()
                .all(|&(region, before)| before & 1 == 0 && self.regions[region].load(Ordering::Relaxed) == before);
            if stable && confirmable {
                return false;
            }
            // A short, bounded backoff: a shift moves a handful of slots.
            for _ in 0..=attempt {
                spin_loop();
            }
        }
        false
    }

    #[inline]
    fn read_slot(&self, slot: usize, key: Key, out: &mut [u64]) -> SlotRead {
        let base = self.base(slot);
        // One bounds check for the slot's words instead of one per word.
        let Some(words) = self.words.get(base..base + self.stride) else { return SlotRead::Busy };
        let (tag, holders) = words.split_at(TAG_WORDS);
        for _ in 0..SLOT_ATTEMPTS {
            let before = tag[0].load(Ordering::Acquire);
            if before & WRITING != 0 {
                spin_loop();
                continue;
            }
            let mut held = 0;
            for (value, word) in out.iter_mut().zip(holders) {
                *value = word.load(Ordering::Relaxed);
                held |= *value;
            }
            fence(Ordering::Acquire);
            let after = tag[0].load(Ordering::Relaxed);
            if (before | RECENCY) != (after | RECENCY) {
                continue;
            }
            return if held == 0 {
                SlotRead::Empty
            } else if before & KEY_BITS == key.0 {
                SlotRead::Match
            } else {
                SlotRead::Other
            };
        }
        SlotRead::Busy
    }

    fn touch(&self, slot: usize) {
        let tag = self.tag(slot);
        // Test first: a hot entry's line stays shared instead of bouncing.
        if tag.load(Ordering::Relaxed) & RECENCY != RECENCY_MAX {
            tag.fetch_or(RECENCY_MAX, Ordering::Relaxed);
        }
    }

    // ----- the writer (callers hold the index's writer lock) -------------

    /// Whether `slot` holds an entry (some holder bit is set).
    pub fn is_occupied(&self, slot: usize) -> bool {
        let base = self.base(slot) + TAG_WORDS;
        (0..self.holder_words()).any(|i| self.word(base + i).load(Ordering::Relaxed) != 0)
    }

    pub fn key_at(&self, slot: usize) -> Key {
        Key(self.tag(slot).load(Ordering::Relaxed) & KEY_BITS)
    }

    /// The slot holding `key`, if any.
    pub fn locate(&self, key: Key) -> Option<usize> {
        let mut slot = self.home(key);
        // The index keeps the load factor below 1, so an empty slot exists.
        while self.is_occupied(slot) {
            if self.key_at(slot) == key {
                return Some(slot);
            }
            slot = self.next(slot);
        }
        None
    }

    /// Marks `slot` as being rewritten.
    fn begin_write(&self, slot: usize) {
        self.tag(slot).fetch_or(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Publishes a rewritten slot: its key bits, a new version, a recency.
    fn end_write(&self, slot: usize, key: u64, recency: u64) {
        let tag = self.tag(slot);
        let version = (tag.load(Ordering::Relaxed) & VERSION).wrapping_add(VERSION_ONE) & VERSION;
        tag.store((key & KEY_BITS) | version | (recency & RECENCY), Ordering::Release);
    }

    /// Inserts `key`, absent from the table, with one replica bit in `set`;
    /// returns its slot. Robin Hood placement: the key goes before the first
    /// entry of its run that sits closer to its own home than the key would,
    /// and the entries from there to the next empty slot move one slot on
    /// (last first, so a probing reader finds each of them at its old slot or
    /// its new one). Every entry thus ends up near the average probe length,
    /// new ones included, instead of new entries trailing long runs.
    pub fn insert(&self, key: Key, set: usize, word: usize, mask: u64) -> usize {
        let home = self.home(key);
        let mut slot = home;
        let mut distance = 0;
        while self.is_occupied(slot) {
            if self.distance(self.key_at(slot), slot) < distance {
                break;
            }
            slot = self.next(slot);
            distance += 1;
        }
        let mut empty = slot;
        while self.is_occupied(empty) {
            empty = self.next(empty);
        }
        while empty != slot {
            let previous = if empty == 0 { self.slots - 1 } else { empty - 1 };
            self.copy_slot(previous, empty);
            empty = previous;
        }
        self.begin_write(slot);
        let base = self.base(slot);
        for i in 0..self.holder_words() {
            let value = if i == set * self.set_words + word { mask } else { 0 };
            self.word(base + TAG_WORDS + i).store(value, Ordering::Relaxed);
        }
        self.end_write(slot, key.0, RECENCY_STORED);
        slot
    }

    /// How far `slot` is from `key`'s home.
    fn distance(&self, key: Key, slot: usize) -> usize {
        let home = self.home(key);
        if slot >= home { slot - home } else { slot + self.slots - home }
    }

    /// Adds replica bits `mask` to word `word` of holder set `set`
    /// (0 gpu, 1 host, 2 network) of a live entry.
    pub fn add_bits(&self, slot: usize, set: usize, word: usize, mask: u64) {
        self.holder(slot, set, word).fetch_or(mask, Ordering::Release);
        self.tag(slot).fetch_or(RECENCY_STORED, Ordering::Relaxed);
    }

    /// Removes replica bits `mask` from word `word` of every holder set
    /// selected in `sets`. An entry left without holders is deleted; returns
    /// true then.
    pub fn remove_bits(&self, slot: usize, sets: [bool; 3], word: usize, mask: u64) -> bool {
        let mut touched = false;
        let mut held = 0;
        for (set, selected) in sets.into_iter().enumerate() {
            for other in 0..self.set_words {
                let mut value = self.holder(slot, set, other).load(Ordering::Relaxed);
                if selected && other == word {
                    touched |= value & mask != 0;
                    value &= !mask;
                }
                held |= value;
            }
        }
        if !touched {
            return false;
        }
        if held == 0 {
            // Clearing the last bits in place would make the slot look empty
            // to readers before the shift: delete it properly instead.
            self.delete(slot);
            return true;
        }
        for (set, selected) in sets.into_iter().enumerate() {
            if selected {
                self.holder(slot, set, word).fetch_and(!mask, Ordering::Release);
            }
        }
        false
    }

    /// Empties holder set `set` of an entry, deleting it when nothing else
    /// holds it; returns true then.
    pub fn remove_set(&self, slot: usize, set: usize) -> bool {
        let mut held = 0;
        for other_set in (0..3).filter(|&other_set| other_set != set) {
            for word in 0..self.set_words {
                held |= self.holder(slot, other_set, word).load(Ordering::Relaxed);
            }
        }
        if held == 0 {
            self.delete(slot);
            return true;
        }
        for word in 0..self.set_words {
            self.holder(slot, set, word).store(0, Ordering::Release);
        }
        false
    }

    fn recency_of(&self, slot: usize) -> u64 {
        self.tag(slot).load(Ordering::Relaxed) & RECENCY
    }

    /// The entry to evict for room near `key`: sweeping the first `window`
    /// entries from `key`'s home slot (other than `key`) and decrementing
    /// their recency, the first one found at zero. A lookup hit sets the
    /// counter to 3 and a store to at least 1, so entries read since the last
    /// sweeps outlive those only written. At most four sweeps.
    pub fn eviction_candidate(&self, key: Key, window: usize) -> Option<usize> {
        for _ in 0..=RECENCY_MAX {
            let mut slot = self.home(key);
            let mut examined = 0;
            for _ in 0..self.slots {
                if examined == window {
                    break;
                }
                if self.is_occupied(slot) && self.key_at(slot) != key {
                    if self.recency_of(slot) == 0 {
                        return Some(slot);
                    }
                    // A reader may raise the counter meanwhile: that wins.
                    let _ = self.tag(slot).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tag| {
                        (tag & RECENCY != 0).then(|| tag - 1)
                    });
                    examined += 1;
                }
                slot = self.next(slot);
            }
            if examined == 0 {
                return None;
            }
        }
        None
    }

    /// Deletes the entry in `slot` and shifts the rest of its probe run back
    /// so that no later key becomes unreachable.
    pub fn delete(&self, slot: usize) {
        let mut regions = Regions::default();
        let mut hole = slot;
        let mut next = self.next(slot);
        while next != slot && self.is_occupied(next) {
            let home = self.home(self.key_at(next));
            // The entry at `next` may fill the hole unless its home lies
            // cyclically in (hole, next]: then it would sit before its home.
            let stays = if hole <= next { hole < home && home <= next } else { hole < home || home <= next };
            if !stays {
                regions.enter(self, hole);
                self.copy_slot(next, hole);
                hole = next;
            }
            next = self.next(next);
        }
        regions.enter(self, hole);
        self.begin_write(hole);
        let base = self.base(hole);
        for i in TAG_WORDS..self.stride {
            self.word(base + i).store(0, Ordering::Relaxed);
        }
        self.end_write(hole, 0, 0);
        regions.leave(self);
    }

    fn copy_slot(&self, from: usize, to: usize) {
        let (source, target) = (self.base(from), self.base(to));
        let tag = self.tag(from).load(Ordering::Relaxed);
        self.begin_write(to);
        for i in TAG_WORDS..self.stride {
            self.word(target + i).store(self.word(source + i).load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.end_write(to, tag & KEY_BITS, tag & RECENCY);
    }
}

/// The relocation counters a shift has made odd, as a cyclic run of regions.
#[derive(Default)]
struct Regions {
    first: usize,
    count: usize,
}

impl Regions {
    /// Makes the counter of `slot`'s region odd before the first move there.
    fn enter(&mut self, table: &Table, slot: usize) {
        let region = slot / REGION_SLOTS;
        if self.count > 0 && (self.first + self.count - 1) % table.regions.len() == region {
            return;
        }
        if self.count == 0 {
            self.first = region;
        }
        self.count += 1;
        table.regions[region].fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Makes every entered counter even again, publishing the moves.
    fn leave(&mut self, table: &Table) {
        for i in 0..self.count {
            table.regions[(self.first + i) % table.regions.len()].fetch_add(1, Ordering::Release);
        }
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> Key {
        Key(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & KEY_BITS)
    }

    #[test]
    fn insert_find_delete_keeps_runs_reachable() {
        let table = Table::new(64, 1);
        let keys: Vec<Key> = (0..48).map(key).collect();
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(table.locate(k), None);
            let slot = table.insert(k, i % 3, 0, 1 << (i % 64));
            assert_eq!(table.locate(k), Some(slot));
        }
        let mut out = [0u64; 3];
        for (i, &k) in keys.iter().enumerate() {
            assert!(table.find(k, &mut out, true));
            assert_eq!(out[i % 3], 1 << (i % 64));
        }
        for &k in keys.iter().step_by(2) {
            table.delete(table.locate(k).unwrap());
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(table.find(k, &mut out, false), i % 2 == 1, "key {i}");
        }
    }

    #[test]
    fn removing_the_last_holder_deletes_the_entry() {
        let table = Table::new(16, 1);
        let slot = table.insert(key(1), 0, 0, 0b11);
        assert!(!table.remove_bits(slot, [true, false, false], 0, 0b01));
        assert!(!table.remove_bits(slot, [false, true, true], 0, 0b10), "not held there: nothing changes");
        assert!(table.remove_bits(slot, [true, true, true], 0, 0b10));
        assert_eq!(table.locate(key(1)), None);
    }

    #[test]
    fn versions_change_on_every_rewrite_and_keep_the_key() {
        let table = Table::new(16, 1);
        let slot = table.insert(key(7), 1, 0, 1);
        let first = table.tag(slot).load(Ordering::Relaxed);
        table.touch(slot);
        assert_eq!(table.recency_of(slot), RECENCY_MAX);
        table.delete(slot);
        let slot = table.insert(key(7), 1, 0, 1);
        let again = table.tag(slot).load(Ordering::Relaxed);
        assert_eq!(first & KEY_BITS, again & KEY_BITS);
        assert_ne!(first & VERSION, again & VERSION);
        assert_eq!(table.key_at(slot), key(7));
    }

    #[test]
    fn a_slot_is_32_bytes_for_64_replicas_and_slot_0_starts_a_line() {
        let table = Table::new(16, 1);
        assert_eq!(table.slot_bytes(), 32);
        let start: *const AtomicU64 = table.tag(0);
        assert_eq!(start.addr() % 64, 0);
    }
}

//! The prefix index: per block hash, which replicas hold it in which tier,
//! fed by the agents' event streams and read by every routing decision.
//!
//! # Tiers
//! - **gpu** and **host** are per replica: a bit per (block, replica, tier).
//! - **network** is the Redis tier shared by all agents. An entry records which
//!   agents *reported* the block. The block counts as present in the network
//!   tier while at least one reporter's network tier is up (from its
//!   heartbeat), and then every replica whose own network tier is up can
//!   reload it. `Cleared{Network}` from an agent (its Redis went away) drops
//!   that agent's reports; `Removed{Network}` from any agent drops the block
//!   for everyone, since the agent deleted it from the shared store.
//!
//! # Lookup
//! For each replica, from block 0: the *gpu run* (blocks in its gpu tier or
//! pending on it), then the *host run* (blocks in its gpu or host tier), then
//! the *network run* (blocks in the shared network tier, or still local). The
//! walk keeps three replica sets and stops when all are empty: O(blocks x
//! set words), allocating only the per-replica result.
//!
//! # Concurrency
//! Lookups and pending writes take `&self` and no lock; they never wait for
//! event ingestion (see [`super::table`] for the exact guarantee). Event
//! ingestion is serialised by a writer mutex that readers never touch.
//! `Cleared`, snapshots and [`PrefixIndex::remove_replica`] scan the whole
//! table (tens of milliseconds at a million entries): run them off latency-
//! sensitive threads.
//!
//! # Memory
//! The table is sized once: `max_entries / 0.7` slots of `8 + 24W` bytes
//! (W = set words, ceil(max_replicas / 64)) and a relocation counter per 64
//! slots: 45.9 bytes per entry at the cap with up to 64 replicas, 149 with up
//! to 256 (the default) ([`PrefixIndex::bytes_per_entry_at_cap`]).
//!
//! Past the cap, each insert evicts one entry, an approximate LRU: every
//! entry has a 2-bit recency counter, set to 3 by a lookup hit and to at least
//! 1 by a store, swept CLOCK-style over a local sample. The eviction sweeps the
//! entries following the new entry's home slot, decrementing their counters,
//! and evicts the first one found at zero. Keys are uniform hashes, so that
//! neighbourhood is a random sample of the table, and evicting where the
//! insert happened keeps the load even: a CLOCK hand sweeping slot order
//! would leave the table nearly full just ahead of it, where linear probing
//! degrades badly, and a scattered hand costs a cache miss per step.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use kvroute_proto::BlockHash;
use kvroute_proto::domain::{KvEvent, KvEventBatch, Tier};

use super::pending::PendingTable;
use super::table::{Key, Table};
use super::{Millis, ReplicaId};

/// How long a routed prefix counts as pending on its replica before its events confirm it, ms: the
/// default of the gateway's `--pending-ttl-ms` and the simulator's.
pub const DEFAULT_PENDING_TTL_MS: Millis = 3_000;

/// Most replicas one index can track.
pub const MAX_REPLICAS: usize = 1024;
const MAX_SET_WORDS: usize = MAX_REPLICAS / 64;
/// Entries per slot at the cap.
const MAX_LOAD_FACTOR: f64 = 0.7;
/// Blocks whose slots a lookup touches ahead of probing them.
const WARM_AHEAD: usize = 32;
/// Entries an eviction considers around the new entry's home slot.
const EVICTION_WINDOW: usize = 8;

/// Sizes of a [`PrefixIndex`].
#[derive(Clone, Debug, PartialEq)]
pub struct IndexConfig {
    /// Distinct block hashes kept; older ones are evicted past this.
    pub max_entries: usize,
    /// Replica ids run from 0 to `max_replicas - 1` (at most [`MAX_REPLICAS`]).
    pub max_replicas: usize,
    /// Slots of the pending table (rounded up to a power of two).
    pub pending_slots: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { max_entries: 1 << 20, max_replicas: 256, pending_slots: 1 << 16 }
    }
}

/// Why the index refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("replica id {replica} is outside the index's 0..{max_replicas}")]
    ReplicaOutOfRange { replica: ReplicaId, max_replicas: usize },
    #[error("invalid index config: {0}")]
    InvalidConfig(&'static str),
}

/// Matched blocks of one replica, from block 0, per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaMatch {
    pub gpu_blocks: u32,
    pub host_blocks: u32,
    pub network_blocks: u32,
}

impl ReplicaMatch {
    pub fn total_blocks(&self) -> u32 {
        self.gpu_blocks + self.host_blocks + self.network_blocks
    }
}

/// The per-replica result of [`PrefixIndex::lookup`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupResult {
    /// Indexed by replica id.
    pub matches: Vec<ReplicaMatch>,
    /// Blocks in the request.
    pub request_blocks: u32,
}

impl LookupResult {
    /// The match of `replica` (zero for a replica the index does not know).
    pub fn get(&self, replica: ReplicaId) -> ReplicaMatch {
        self.matches.get(usize::from(replica)).copied().unwrap_or_default()
    }

    /// A result with no matches, for policies run without an index.
    pub fn empty(request_blocks: usize) -> LookupResult {
        LookupResult { matches: Vec::new(), request_blocks: u32::try_from(request_blocks).unwrap_or(u32::MAX) }
    }
}

/// Sizes and counters for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexStats {
    pub entries: usize,
    pub max_entries: usize,
    pub slots: usize,
    /// Bytes of one table slot (`8 + 24W`).
    pub slot_bytes: usize,
    /// Bytes of the table, its counters and the pending table.
    pub memory_bytes: usize,
    pub evictions: u64,
}

/// The prefix index. Share it with `Arc`; every method takes `&self`.
pub struct PrefixIndex {
    config: IndexConfig,
    table: Table,
    pending: PendingTable,
    /// Replicas whose network tier is up, `W` words.
    network_up: Box<[AtomicU64]>,
    entries: AtomicUsize,
    evictions: AtomicU64,
    /// Serialises ingestion; readers never take it.
    writer: Mutex<()>,
}

const GPU: usize = 0;
const HOST: usize = 1;
const NETWORK: usize = 2;

/// A selection of exactly one holder set.
fn only(set: usize) -> [bool; 3] {
    [set == GPU, set == HOST, set == NETWORK]
}

fn set_of(tier: Tier) -> usize {
    match tier {
        Tier::Gpu => GPU,
        Tier::Host => HOST,
        Tier::Network => NETWORK,
    }
}

impl PrefixIndex {
    pub fn new(config: IndexConfig) -> Result<PrefixIndex, IndexError> {
        if config.max_entries == 0 {
            return Err(IndexError::InvalidConfig("max_entries must be positive"));
        }
        if config.max_replicas == 0 || config.max_replicas > MAX_REPLICAS {
            return Err(IndexError::InvalidConfig("max_replicas must be between 1 and 1024"));
        }
        let set_words = config.max_replicas.div_ceil(64);
        let slots = ((config.max_entries as f64 / MAX_LOAD_FACTOR).ceil() as usize).max(config.max_entries + 1);
        Ok(PrefixIndex {
            table: Table::new(slots, set_words),
            pending: PendingTable::new(config.pending_slots),
            network_up: (0..set_words).map(|_| AtomicU64::new(0)).collect(),
            entries: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            writer: Mutex::new(()),
            config,
        })
    }

    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// Distinct block hashes indexed.
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.len(),
            max_entries: self.config.max_entries,
            slots: self.table.slots(),
            slot_bytes: self.table.slot_bytes(),
            memory_bytes: self.table.memory_bytes() + self.pending.memory_bytes() + self.network_up.len() * 8,
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// Table bytes per entry when the index is full (what the cap costs).
    pub fn bytes_per_entry_at_cap(&self) -> f64 {
        self.table.memory_bytes() as f64 / self.config.max_entries as f64
    }

    fn check(&self, replica: ReplicaId) -> Result<(usize, u64), IndexError> {
        let index = usize::from(replica);
        if index >= self.config.max_replicas {
            return Err(IndexError::ReplicaOutOfRange { replica, max_replicas: self.config.max_replicas });
        }
        Ok((index / 64, 1u64 << (index % 64)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // The lock guards no data of its own: a panic mid-apply leaves the
        // table consistent, so a poisoned lock is simply taken.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    // ----- ingestion ------------------------------------------------------

    /// Applies one event of `replica`'s stream.
    pub fn apply(&self, replica: ReplicaId, event: &KvEvent) -> Result<(), IndexError> {
        self.apply_events(replica, std::slice::from_ref(event))
    }

    /// Applies a run of delta events of `replica`, in order.
    pub fn apply_events(&self, replica: ReplicaId, events: &[KvEvent]) -> Result<(), IndexError> {
        let (word, mask) = self.check(replica)?;
        let _writer = self.lock();
        for event in events {
            self.apply_locked(word, mask, event);
        }
        Ok(())
    }

    /// Replaces what the index knows of `replica` with a snapshot: its gpu and
    /// host tiers always, and its network reports when the snapshot carries
    /// network events. Entries the snapshot keeps are never absent in between.
    pub fn apply_snapshot(&self, replica: ReplicaId, events: &[KvEvent]) -> Result<(), IndexError> {
        let (word, mask) = self.check(replica)?;
        // The state the events describe when applied to nothing.
        let mut keep: [HashSet<Key>; 3] = Default::default();
        let mut replaced = [true, true, false];
        for event in events {
            match event {
                KvEvent::Stored { tier, hashes } => {
                    replaced[set_of(*tier)] = true;
                    keep[set_of(*tier)].extend(hashes.iter().map(Key::of));
                }
                KvEvent::Removed { tier, hashes } => {
                    replaced[set_of(*tier)] = true;
                    for hash in hashes {
                        keep[set_of(*tier)].remove(&Key::of(hash));
                    }
                }
                KvEvent::Cleared { tier } => {
                    replaced[set_of(*tier)] = true;
                    keep[set_of(*tier)].clear();
                }
            }
        }
        let _writer = self.lock();
        self.scan_filtered_locked(replaced, word, mask, |key, set| !keep[set].contains(&key));
        for event in events {
            self.apply_locked(word, mask, event);
        }
        Ok(())
    }

    /// Applies a batch of `replica`'s stream: a snapshot replaces its state,
    /// deltas apply in order, and the batch's load says whether its network
    /// tier is up. Sequence and epoch checks are the caller's.
    pub fn apply_batch(&self, replica: ReplicaId, batch: &KvEventBatch) -> Result<(), IndexError> {
        if batch.snapshot {
            self.apply_snapshot(replica, &batch.events)?;
        } else {
            self.apply_events(replica, &batch.events)?;
        }
        self.set_network_tier_up(replica, batch.load.network_tier_up)
    }

    /// Whether `replica` reaches the network tier (from its heartbeat). Its
    /// reports count, and it may reload network blocks, only while up.
    pub fn set_network_tier_up(&self, replica: ReplicaId, up: bool) -> Result<(), IndexError> {
        let (word, mask) = self.check(replica)?;
        if up {
            self.network_up[word].fetch_or(mask, Ordering::Release);
        } else {
            self.network_up[word].fetch_and(!mask, Ordering::Release);
        }
        Ok(())
    }

    /// Forgets everything `replica` reported, including its network reports
    /// and pending entries, and marks its network tier down.
    pub fn remove_replica(&self, replica: ReplicaId) -> Result<(), IndexError> {
        let (word, mask) = self.check(replica)?;
        self.set_network_tier_up(replica, false)?;
        {
            let _writer = self.lock();
            self.scan_locked([true; 3], word, mask);
        }
        self.pending.remove_replica(replica);
        Ok(())
    }

    fn apply_locked(&self, word: usize, mask: u64, event: &KvEvent) {
        match event {
            KvEvent::Stored { tier, hashes } => {
                for (position, hash) in hashes.iter().enumerate() {
                    self.warm_ahead(hashes, position);
                    self.store_locked(Key::of(hash), set_of(*tier), word, mask);
                }
            }
            KvEvent::Removed { tier, hashes } => {
                for (position, hash) in hashes.iter().enumerate() {
                    self.warm_ahead(hashes, position);
                    let Some(slot) = self.table.locate(Key::of(hash)) else { continue };
                    let deleted = match tier {
                        Tier::Network => self.table.remove_set(slot, NETWORK),
                        _ => self.table.remove_bits(slot, only(set_of(*tier)), word, mask),
                    };
                    if deleted {
                        self.entries.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            KvEvent::Cleared { tier } => self.scan_locked(only(set_of(*tier)), word, mask),
        }
    }

    /// Every [`WARM_AHEAD`] blocks, touches the slots of the next run.
    fn warm_ahead(&self, hashes: &[BlockHash], position: usize) {
        if position.is_multiple_of(WARM_AHEAD) {
            std::hint::black_box(self.warm(&hashes[position..], false));
        }
    }

    /// Touches the slots that probes of the first [`WARM_AHEAD`] of `hashes`
    /// will read, and their pending buckets when `pending`. The probe starts
    /// are computed first, so that the loop of loads is short enough for all
    /// of its cache misses to be in flight at once.
    fn warm(&self, hashes: &[BlockHash], pending: bool) -> u64 {
        let hashes = &hashes[..hashes.len().min(WARM_AHEAD)];
        let mut starts = [0usize; WARM_AHEAD];
        for (start, hash) in starts.iter_mut().zip(hashes) {
            *start = self.table.probe_start(Key::of(hash));
        }
        let mut warm = starts[..hashes.len()].iter().fold(0, |warm, &start| warm ^ self.table.warm(start));
        if pending {
            warm = hashes.iter().fold(warm, |warm, hash| warm ^ self.pending.warm(Key::of(hash)));
        }
        warm
    }

    fn store_locked(&self, key: Key, set: usize, word: usize, mask: u64) {
        match self.table.locate(key) {
            Some(slot) => self.table.add_bits(slot, set, word, mask),
            None => {
                self.table.insert(key, set, word, mask);
                let entries = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
                if entries > self.config.max_entries {
                    self.evict_near_locked(key);
                }
            }
        }
    }

    /// Evicts one entry near `key`, the entry just inserted (see the module
    /// docs on why eviction stays local).
    fn evict_near_locked(&self, key: Key) {
        if let Some(slot) = self.table.eviction_candidate(key, EVICTION_WINDOW) {
            self.table.delete(slot);
            self.entries.fetch_sub(1, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes the replica bit from the selected sets of every entry.
    fn scan_locked(&self, sets: [bool; 3], word: usize, mask: u64) {
        self.scan_filtered_locked(sets, word, mask, |_, _| true);
    }

    /// Removes the replica bit from set `s` of every entry for which
    /// `remove(key, s)` is true (and `sets[s]`), deleting entries left unheld.
    fn scan_filtered_locked(&self, sets: [bool; 3], word: usize, mask: u64, remove: impl Fn(Key, usize) -> bool) {
        let mut slot = 0;
        while slot < self.table.slots() {
            if self.table.is_occupied(slot) {
                let key = self.table.key_at(slot);
                let selected = [0, 1, 2].map(|set| sets[set] && remove(key, set));
                if self.table.remove_bits(slot, selected, word, mask) {
                    self.entries.fetch_sub(1, Ordering::Relaxed);
                    // A later entry may have shifted into `slot`: look at it again.
                    continue;
                }
            }
            slot += 1;
        }
    }

    // ----- reads ----------------------------------------------------------

    /// Records that `hashes` were just routed to `replica`: until `now + ttl`
    /// they count as gpu-resident there, unless a later route replaces them.
    pub fn add_pending(&self, replica: ReplicaId, hashes: &[BlockHash], now: Millis, ttl: Millis) {
        if usize::from(replica) >= self.config.max_replicas {
            return;
        }
        let expiry = now.saturating_add(ttl);
        for hash in hashes {
            self.pending.add(Key::of(hash), replica, now, expiry);
        }
    }

    /// Per replica, the contiguous blocks of `hashes` it holds from block 0,
    /// split into gpu, host and network runs. `now` decides which pending
    /// entries still count.
    pub fn lookup(&self, hashes: &[BlockHash], now: Millis) -> LookupResult {
        let words = self.table.set_words();
        let replicas = self.config.max_replicas;
        let mut network_up = [0u64; MAX_SET_WORDS];
        for (value, cell) in network_up.iter_mut().zip(self.network_up.iter()) {
            *value = cell.load(Ordering::Acquire);
        }
        // Replicas still inside their gpu, local (gpu or host) and any-tier runs.
        let mut in_gpu = [0u64; MAX_SET_WORDS];
        for (word, value) in in_gpu.iter_mut().enumerate().take(words) {
            let remaining = replicas - word * 64;
            *value = if remaining >= 64 { u64::MAX } else { (1u64 << remaining) - 1 };
        }
        let mut in_local = in_gpu;
        let mut in_any = in_gpu;
        let mut ends = vec![[0u32; 3]; replicas];
        let mut holders = [0u64; 3 * MAX_SET_WORDS];
        let mut processed = 0;
        let pending_live = self.pending.any_live(now);
        let mut warm = 0u64;
        for (block, hash) in hashes.iter().enumerate() {
            if block.is_multiple_of(WARM_AHEAD) {
                // Touch the next run of slots with independent loads first:
                // their cache misses overlap instead of following one another.
                warm ^= self.warm(&hashes[block..], pending_live);
            }
            let key = Key::of(hash);
            if !self.table.find(key, &mut holders, true) {
                holders[..3 * words].fill(0);
            }
            let pending = if pending_live { self.pending.holder(key, now) } else { None };
            if let Some(replica) = pending {
                let index = usize::from(replica);
                if index < replicas {
                    holders[GPU * words + index / 64] |= 1 << (index % 64);
                }
            }
            let network_present = (0..words).any(|word| holders[NETWORK * words + word] & network_up[word] != 0);
            let position = u32::try_from(block).unwrap_or(u32::MAX);
            let mut alive = false;
            for word in 0..words {
                let gpu = holders[GPU * words + word];
                let local = gpu | holders[HOST * words + word];
                let reachable = local | if network_present { network_up[word] } else { 0 };
                let runs = [(&mut in_gpu[word], gpu), (&mut in_local[word], local), (&mut in_any[word], reachable)];
                for (run, (set, held)) in runs.into_iter().enumerate() {
                    let mut ended = *set & !held;
                    *set &= held;
                    while ended != 0 {
                        let bit = ended.trailing_zeros() as usize;
                        ends[word * 64 + bit][run] = position;
                        ended &= ended - 1;
                    }
                }
                alive |= in_any[word] != 0;
            }
            processed = block + 1;
            if !alive {
                break;
            }
        }
        std::hint::black_box(warm);
        let end = u32::try_from(processed).unwrap_or(u32::MAX);
        for word in 0..words {
            for (run, set) in [in_gpu[word], in_local[word], in_any[word]].into_iter().enumerate() {
                let mut open = set;
                while open != 0 {
                    let bit = open.trailing_zeros() as usize;
                    ends[word * 64 + bit][run] = end;
                    open &= open - 1;
                }
            }
        }
        let matches = ends
            .into_iter()
            .map(|[gpu, local, any]| ReplicaMatch {
                gpu_blocks: gpu,
                host_blocks: local - gpu,
                network_blocks: any - local,
            })
            .collect();
        LookupResult { matches, request_blocks: u32::try_from(hashes.len()).unwrap_or(u32::MAX) }
    }
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex").field("config", &self.config).field("stats", &self.stats()).finish()
    }
}

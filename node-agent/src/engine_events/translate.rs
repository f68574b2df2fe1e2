//! [`Translator`]: an engine's decoded KV events, batch after batch, into kvroute's own
//! [`KvEvent`]s, named by kvroute's block hashes.
//!
//! Synchronous and total: no clock, no I/O; everything it cannot use is counted in [`Counters`].
//!
//! - **Hashes.** kvroute names 16-token blocks (`ChainKey::root(16, model, scope)`, then `next` per
//!   block); an engine block of `k x 16` tokens is `k` kvroute blocks. A `BlockStored` is re-hashed from
//!   its tokens, continuing the chain of its parent engine block; no parent starts a chain. The map
//!   engine key -> (its kvroute hashes, the chain state after them, the tiers holding it) is what makes
//!   a child, a removal or a lower tier's copy (sent without tokens) translatable.
//! - **Scopes.** A chain's scope comes from the salt of its first block (vLLM: a bare string in the
//!   block's `extra_keys`; SGLang: the event's `cache_salt`). No salt is the global scope. A child
//!   inherits its parent's scope. A kvroute salt ([`SALT_PREFIX`]) the [`SaltRegistry`] does not know
//!   yet (the agent restarted beside a running engine, or the registry forgot it) is *parked*: the block
//!   and those below it keep their tokens (at most `max_parked_tokens`) and are indexed, announced as
//!   new, when a request registers that salt's scope ([`Translator::register_scope`]). Any other unknown
//!   salt (a one-off salt, a salt of another client) is not indexed, and neither is anything below it.
//!   A parked block whose parent is gone by then stays unindexed. LoRA blocks and blocks whose hash covers
//!   more than tokens and the salt (multimodal inputs, prompt embeddings) are not indexed either: their
//!   kvroute name would claim a plain-token prefix they do not hold.
//! - **Set semantics.** A tier holds an engine key or not: storing a held key again (vLLM re-announces
//!   prefix-cache hits, and caches duplicate blocks) changes nothing, and one removal removes it. When an
//!   engine holds two copies of a block and evicts one, kvroute forgets a block the engine still has, a
//!   miss at worst, never a block announced that is not there. A kvroute block is held while any held
//!   engine block covers it: two engine keys can cover the same 16 tokens (vLLM 0.32 announces 16-token
//!   prefixes inside a larger engine block), and it is removed only when the last of them goes.
//! - **Tiers.** `medium` "GPU" or none is [`Tier::Gpu`], "CPU" and "CPU_PINNED" are [`Tier::Host`],
//!   anything else ("DISK", "STORAGE", "EXTERNAL", ...) [`Tier::Network`]. `AllBlocksCleared` without a
//!   medium clears every tier; with one, that tier.
//! - **Sequence numbers** ([`Translator::apply`]): batches apply strictly in order. One past the last
//!   applies; a later one is a [`Step::Gap`] (not applied: replay the missing ones, or
//!   [`Translator::skip_to`]); an earlier or equal one is a duplicate, except that a live batch is an
//!   engine restart ([`Step::Restart`]: everything forgotten, not applied) when its seq is lower than the
//!   last one and below [`RESTART_BELOW`] (a restarted engine counts from 0 again, and the agent may miss
//!   its first batches while it reconnects), or when it is seq 0 again and starts with
//!   `AllBlocksCleared` (SGLang's first batch). Replayed batches are never a restart.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use kvroute_proto::block_hash::{BlockHash, BlockHashMap, ChainKey, DEFAULT_BLOCK_SIZE};
use kvroute_proto::domain::{KvEvent, Tier};
use thiserror::Error;

use super::decode::{AllBlocksCleared, BlockRemoved, BlockStored, EngineBatch, EngineEvent, EngineKey, ExtraKey};
use super::salt::{DEFAULT_SALT_CAPACITY, SALT_PREFIX, SaltRegistry};

/// A live batch with a seq below this, after a higher one, is a restarted engine (see the module doc).
pub const RESTART_BELOW: u64 = 4096;
/// Engine blocks tracked at most by default.
pub const DEFAULT_MAX_BLOCKS: usize = 1 << 21;
/// Tokens of parked blocks (under a kvroute salt not registered yet) kept at most by default: 16 MiB.
pub const DEFAULT_MAX_PARKED_TOKENS: usize = 1 << 22;

/// What a translator is built for.
#[derive(Clone, Debug)]
pub struct TranslatorConfig {
    /// The model id kvroute's chains are rooted at (as the gateway names it).
    pub model: String,
    /// The engine's KV block size in tokens: a positive multiple of [`DEFAULT_BLOCK_SIZE`].
    pub engine_block_size: u32,
    /// The engine's KV-cache group whose events count (a hybrid model sends one set per group; only the
    /// full-attention group names prefixes). Events without a group always count.
    pub kv_group: i64,
    /// Engine blocks tracked at most; stores beyond are skipped (counted).
    pub max_blocks: usize,
    /// Salts remembered at most.
    pub max_salts: usize,
    /// Tokens of parked blocks kept at most; blocks beyond are not indexed (counted).
    pub max_parked_tokens: usize,
}

impl TranslatorConfig {
    pub fn new(model: impl Into<String>, engine_block_size: u32) -> TranslatorConfig {
        TranslatorConfig {
            model: model.into(),
            engine_block_size,
            kv_group: 0,
            max_blocks: DEFAULT_MAX_BLOCKS,
            max_salts: DEFAULT_SALT_CAPACITY,
            max_parked_tokens: DEFAULT_MAX_PARKED_TOKENS,
        }
    }
}

/// A configuration a translator cannot work with.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error(
        "engine block size {0} is not a positive multiple of {DEFAULT_BLOCK_SIZE} tokens (kvroute's block): \
         start the engine with --block-size 16, 32, 48, ..."
    )]
    BlockSize(u32),
    #[error("max_blocks must be at least 1")]
    MaxBlocks,
}

/// Where a batch came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The publisher's live stream.
    Live,
    /// An answer of the replay socket: never taken for a restart.
    Replay,
}

/// What [`Translator::apply`] did with a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Applied, in order: the kvroute events it gives (possibly none).
    Events(Vec<KvEvent>),
    /// Already applied: nothing to do.
    Duplicate,
    /// Batches `missing` never arrived; this one was not applied. Fetch them from the replay socket and
    /// apply them (then this one again), or [`Translator::skip_to`] this batch's seq to go on without.
    Gap { missing: Range<u64> },
    /// The engine restarted: all its blocks are forgotten and this batch was not applied. Start a new
    /// epoch (kvroute's subscribers then take a fresh snapshot), then apply the batch again.
    Restart,
}

/// What a translator has skipped or refused, for metrics. Every field only grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub batches_applied: u64,
    pub duplicate_batches: u64,
    pub gaps: u64,
    /// Batches given up by [`Translator::skip_to`].
    pub batches_skipped: u64,
    pub restarts: u64,
    /// Events of a type the decoder did not know.
    pub unknown_events: u64,
    /// Events of another KV-cache group than the configured one.
    pub other_group_events: u64,
    /// `BlockStored` events whose tokens do not fill their blocks, or whose block size is no multiple
    /// of 16.
    pub malformed_stores: u64,
    /// Stored blocks whose parent is unknown (stored before the agent listened, or lost).
    pub unknown_parent_blocks: u64,
    /// Chain roots with a salt the registry does not know and that is not parked.
    pub unknown_salt_roots: u64,
    /// Blocks parked under a kvroute salt the registry did not know yet.
    pub parked_blocks: u64,
    /// Parked blocks indexed once their salt was registered.
    pub unparked_blocks: u64,
    /// Blocks under an unregistered kvroute salt not parked because `max_parked_tokens` were.
    pub over_parking_capacity_blocks: u64,
    /// Blocks not indexed because of LoRA or extra hash keys (multimodal, prompt embeddings).
    pub unindexable_blocks: u64,
    /// Blocks stored without tokens whose engine key is unknown.
    pub tokenless_unknown_blocks: u64,
    /// Blocks removed that the tier did not hold.
    pub unknown_removed_blocks: u64,
    /// Blocks not tracked because `max_blocks` were.
    pub over_capacity_blocks: u64,
}

/// The translator of one engine's event stream.
#[derive(Debug)]
pub struct Translator {
    config: TranslatorConfig,
    salts: SaltRegistry,
    blocks: HashMap<EngineKey, Entry>,
    /// Per kvroute block, how many held engine blocks of each tier cover it.
    held: BlockHashMap<[u32; 3]>,
    /// Per salt not registered yet, the keys of the blocks parked under it, in the order parked (a key
    /// may be stale: its entry is gone or no longer parked).
    parked: HashMap<Arc<str>, ParkedKeys>,
    /// Tokens the parked entries keep.
    parked_tokens: usize,
    next_serial: u64,
    last_seq: Option<u64>,
    counters: Counters,
}

#[derive(Debug, Default)]
struct ParkedKeys {
    keys: Vec<EngineKey>,
    /// Entries still parked under the salt.
    live: usize,
}

/// What [`Translator::register_scope`] gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registered {
    /// The salt to send to the engine with the request; `None` for the global scope (send none).
    pub salt: Option<String>,
    /// Blocks parked under that salt, now indexed: publish them before the engine's next events.
    pub events: Vec<KvEvent>,
}

/// One engine block as the translator knows it.
#[derive(Debug)]
struct Entry {
    parent: Option<EngineKey>,
    /// Order of first insertion (snapshots list parents first).
    serial: u64,
    /// `None`: not indexed (yet, when parked), and neither is anything below it.
    chain: Option<Chain>,
    /// Waiting for its salt to be registered.
    parked: Option<Parked>,
    /// A bit per [`Tier::index`].
    tiers: u8,
}

#[derive(Debug)]
struct Chain {
    hashes: Vec<BlockHash>,
    end: ChainKey,
}

impl Chain {
    /// `tokens` (whole kvroute blocks) continuing the chain at `start`.
    fn rehash(start: ChainKey, tokens: &[u32]) -> Chain {
        let mut end = start;
        let hashes = tokens
            .chunks_exact(DEFAULT_BLOCK_SIZE as usize)
            .map(|block| {
                end = end.next(block);
                end.block_hash()
            })
            .collect();
        Chain { hashes, end }
    }
}

/// A block under a salt not registered yet: what indexing it later needs.
#[derive(Debug)]
struct Parked {
    salt: Arc<str>,
    tokens: Box<[u32]>,
}

/// Where a new block's chain starts.
enum Start {
    Chain(ChainKey),
    Park(Arc<str>),
    /// Not indexed.
    Skip,
}

/// What a block continues from.
#[derive(Clone)]
enum Parent {
    /// The start of a chain.
    Root,
    /// A known, indexed block whose chain ends here.
    Chain(ChainKey),
    /// A known block parked under this salt.
    Parked(Arc<str>),
    /// A known block that is not indexed.
    Unindexed,
    /// Nothing known.
    Unknown,
}

impl Translator {
    pub fn new(config: TranslatorConfig) -> Result<Translator, ConfigError> {
        if config.engine_block_size == 0 || !config.engine_block_size.is_multiple_of(DEFAULT_BLOCK_SIZE) {
            return Err(ConfigError::BlockSize(config.engine_block_size));
        }
        if config.max_blocks == 0 {
            return Err(ConfigError::MaxBlocks);
        }
        Ok(Translator {
            salts: SaltRegistry::new(config.max_salts),
            config,
            blocks: HashMap::new(),
            held: BlockHashMap::default(),
            parked: HashMap::new(),
            parked_tokens: 0,
            next_serial: 0,
            last_seq: None,
            counters: Counters::default(),
        })
    }

    /// Registers a request's cache scope: the salt to send to the engine with it, and the events of the
    /// blocks parked under that salt, now indexed.
    pub fn register_scope(&mut self, scope: &[u8]) -> Registered {
        let salt = self.salts.register(scope);
        let events = salt.as_deref().map_or_else(Vec::new, |salt| self.unpark(salt, scope));
        Registered { salt, events }
    }

    /// Registers `salt` as `scope`'s for a salt [`salt_for_scope`](super::salt::salt_for_scope) did not
    /// make.
    pub fn register_salt(&mut self, salt: &str, scope: &[u8]) {
        self.salts.insert(salt, scope);
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The seq of the last batch applied.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Engine blocks tracked (indexed or not, in any tier).
    pub fn tracked_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Engine blocks parked now, waiting for their salt.
    pub fn parked_blocks(&self) -> usize {
        self.parked.values().map(|parked| parked.live).sum()
    }

    /// Forgets every engine block and the sequence (the agent restarted the engine, or connects to a
    /// new one). Registered salts stay.
    pub fn reset(&mut self) {
        self.forget_all();
        self.last_seq = None;
    }

    fn forget_all(&mut self) {
        self.blocks.clear();
        self.held.clear();
        self.parked.clear();
        self.parked_tokens = 0;
    }

    /// Goes on from batch `seq` without the batches before it that never arrived: the next batch
    /// applied is `seq`.
    pub fn skip_to(&mut self, seq: u64) {
        let expected = self.expected();
        if seq > expected {
            self.counters.batches_skipped += seq - expected;
            self.last_seq = seq.checked_sub(1);
        }
    }

    fn expected(&self) -> u64 {
        self.last_seq.map_or(0, |last| last.saturating_add(1))
    }

    /// Applies batch `seq` (see the module doc for the order rules).
    pub fn apply(&mut self, seq: u64, batch: &EngineBatch, source: Source) -> Step {
        let expected = self.expected();
        if seq > expected {
            self.counters.gaps += 1;
            return Step::Gap { missing: expected..seq };
        }
        if seq < expected {
            let last = expected - 1;
            let restarted = source == Source::Live
                && ((seq < last && seq < RESTART_BELOW)
                    || (seq == 0 && matches!(batch.events.first(), Some(EngineEvent::Cleared(_)))));
            if restarted {
                self.counters.restarts += 1;
                self.reset();
                return Step::Restart;
            }
            self.counters.duplicate_batches += 1;
            return Step::Duplicate;
        }
        self.last_seq = Some(seq);
        self.counters.batches_applied += 1;
        self.counters.unknown_events += batch.unknown_events;
        let mut out = Vec::new();
        for event in &batch.events {
            match event {
                EngineEvent::Stored(stored) => self.stored(stored, &mut out),
                EngineEvent::Removed(removed) => self.removed(removed, &mut out),
                EngineEvent::Cleared(cleared) => self.cleared(cleared, &mut out),
            }
        }
        Step::Events(out)
    }

    /// How many leading tokens of `prompt` the engine holds in its pool under `scope`, as far as the events
    /// applied so far say: whole kvroute blocks, counted until the first the pool does not hold.
    pub fn pool_prefix_tokens(&self, scope: &[u8], prompt: &[u32]) -> u32 {
        let mut key = ChainKey::root(DEFAULT_BLOCK_SIZE, &self.config.model, scope);
        let mut blocks = 0u32;
        for block in prompt.chunks_exact(DEFAULT_BLOCK_SIZE as usize) {
            key = key.next(block);
            let in_pool = self.held.get(&key.block_hash()).is_some_and(|counts| counts[Tier::Gpu.index()] > 0);
            if !in_pool {
                break;
            }
            blocks += 1;
        }
        blocks * DEFAULT_BLOCK_SIZE
    }

    /// What every tier holds now, as one `Stored` event per non-empty tier, each in chain order (a
    /// block after the block it continues): the start of a new kvroute subscriber's stream.
    pub fn snapshot(&self) -> Vec<KvEvent> {
        let mut order: Vec<(&EngineKey, &Entry)> = self.blocks.iter().collect();
        order.sort_unstable_by_key(|(_, entry)| entry.serial);
        let mut out = Vec::new();
        for tier in Tier::ALL {
            let bit = tier_bit(tier);
            let held = |entry: &Entry| entry.tiers & bit != 0 && entry.chain.is_some();
            let mut done: HashSet<&EngineKey> = HashSet::new();
            let mut listed: HashSet<BlockHash> = HashSet::new();
            let mut hashes = Vec::new();
            let mut pending = Vec::new();
            for &(key, entry) in &order {
                if !held(entry) || done.contains(key) {
                    continue;
                }
                // This block's not yet listed ancestors in the tier first, oldest first.
                let mut cursor = Some((key, entry));
                while let Some((key, entry)) = cursor {
                    if !done.insert(key) {
                        break;
                    }
                    pending.push(entry);
                    cursor = entry
                        .parent
                        .as_ref()
                        .and_then(|parent| self.blocks.get_key_value(parent))
                        .filter(|(_, parent)| held(parent));
                }
                for entry in pending.drain(..).rev() {
                    if let Some(chain) = &entry.chain {
                        hashes.extend(chain.hashes.iter().filter(|hash| listed.insert(**hash)));
                    }
                }
            }
            if !hashes.is_empty() {
                out.push(KvEvent::Stored { tier, hashes });
            }
        }
        out
    }

    fn group_counts(&mut self, group_idx: Option<i64>) -> bool {
        let counts = group_idx.is_none_or(|group| group == self.config.kv_group);
        if !counts {
            self.counters.other_group_events += 1;
        }
        counts
    }

    fn stored(&mut self, event: &BlockStored, out: &mut Vec<KvEvent>) {
        if !self.group_counts(event.group_idx) {
            return;
        }
        let tier = tier_of(event.medium.as_deref());
        let bit = tier_bit(tier);
        let block_size = event.block_size as usize;
        let has_tokens = !event.token_ids.is_empty();
        if has_tokens
            && (block_size == 0
                || !event.block_size.is_multiple_of(DEFAULT_BLOCK_SIZE)
                || event.block_hashes.len().checked_mul(block_size) != Some(event.token_ids.len()))
        {
            self.counters.malformed_stores += 1;
            return;
        }
        let lora = event.lora_id.is_some() || event.lora_name.is_some();
        let mut parent = match &event.parent_block_hash {
            None => Parent::Root,
            Some(key) => self.parent_of(key),
        };
        let mut parent_key = event.parent_block_hash.clone();
        let mut new_hashes = Vec::new();
        for (index, key) in event.block_hashes.iter().enumerate() {
            if let Some(entry) = self.blocks.get_mut(key) {
                // Known: its content (and so its kvroute name) is fixed by its key.
                if entry.tiers & bit == 0 {
                    entry.tiers |= bit;
                    if let Some(chain) = &entry.chain {
                        hold(&mut self.held, tier, &chain.hashes, &mut new_hashes);
                    }
                }
                parent = Parent::of(entry);
                parent_key = Some(key.clone());
                continue;
            }
            if !has_tokens {
                self.counters.tokenless_unknown_blocks += 1;
                parent = Parent::Unknown;
                continue;
            }
            if matches!(parent, Parent::Unknown) {
                self.counters.unknown_parent_blocks += 1;
                continue;
            }
            if self.blocks.len() >= self.config.max_blocks {
                self.counters.over_capacity_blocks += 1;
                parent = Parent::Unknown;
                continue;
            }
            let extra = event.extra_keys.as_ref().and_then(|keys| keys.get(index)).and_then(Option::as_deref);
            let start = match parent {
                Parent::Unknown | Parent::Unindexed => Start::Skip,
                _ if lora => {
                    self.counters.unindexable_blocks += 1;
                    Start::Skip
                }
                Parent::Root => self.root_of(extra, event.cache_salt.as_deref()),
                Parent::Chain(_) | Parent::Parked(_) if extra.is_some_and(|keys| !keys.is_empty()) => {
                    self.counters.unindexable_blocks += 1;
                    Start::Skip
                }
                Parent::Chain(end) => Start::Chain(end),
                Parent::Parked(ref salt) => Start::Park(salt.clone()),
            };
            let tokens = &event.token_ids[index * block_size..(index + 1) * block_size];
            let (chain, parked) = match start {
                Start::Chain(start) => (Some(Chain::rehash(start, tokens)), None),
                Start::Park(salt) if self.parked_tokens + tokens.len() <= self.config.max_parked_tokens => {
                    self.park(&salt, key);
                    self.parked_tokens += tokens.len();
                    (None, Some(Parked { salt, tokens: tokens.into() }))
                }
                Start::Park(_) => {
                    self.counters.over_parking_capacity_blocks += 1;
                    (None, None)
                }
                Start::Skip => (None, None),
            };
            if let Some(chain) = &chain {
                hold(&mut self.held, tier, &chain.hashes, &mut new_hashes);
            }
            let serial = self.next_serial;
            self.next_serial += 1;
            let entry = Entry { parent: parent_key.take(), serial, chain, parked, tiers: bit };
            parent = Parent::of(&entry);
            self.blocks.insert(key.clone(), entry);
            parent_key = Some(key.clone());
        }
        push_hashes(out, tier, new_hashes, true);
    }

    fn parent_of(&self, key: &EngineKey) -> Parent {
        self.blocks.get(key).map_or(Parent::Unknown, Parent::of)
    }

    /// Where a root block with these extra keys and event salt starts (counted when it is not indexed).
    fn root_of(&mut self, extra: Option<&[ExtraKey]>, event_salt: Option<&str>) -> Start {
        let salt = match extra {
            None | Some([]) => event_salt,
            Some([ExtraKey::Text(salt)]) => Some(salt.as_str()),
            Some(_) => {
                self.counters.unindexable_blocks += 1;
                return Start::Skip;
            }
        };
        let scope: &[u8] = match salt {
            None => b"",
            Some(salt) => match self.salts.scope(salt) {
                Some(scope) => scope,
                None if salt.starts_with(SALT_PREFIX) => {
                    let salt =
                        self.parked.get_key_value(salt).map_or_else(|| Arc::from(salt), |(salt, _)| salt.clone());
                    return Start::Park(salt);
                }
                None => {
                    self.counters.unknown_salt_roots += 1;
                    return Start::Skip;
                }
            },
        };
        Start::Chain(ChainKey::root(DEFAULT_BLOCK_SIZE, &self.config.model, scope))
    }

    /// Records `key` as parked under `salt`.
    fn park(&mut self, salt: &Arc<str>, key: &EngineKey) {
        let parked = self.parked.entry(salt.clone()).or_default();
        parked.keys.push(key.clone());
        parked.live += 1;
        self.counters.parked_blocks += 1;
    }

    /// Forgets a parked entry that left the engine.
    fn unpark_gone(&mut self, gone: &Parked) {
        self.parked_tokens -= gone.tokens.len();
        let Some(parked) = self.parked.get_mut(&gone.salt) else { return };
        parked.live -= 1;
        if parked.live == 0 {
            self.parked.remove(&gone.salt);
        } else if parked.keys.len() > 2 * parked.live + 16 {
            let blocks = &self.blocks;
            let mut seen = HashSet::new();
            parked.keys.retain(|key| {
                let still =
                    blocks.get(key).and_then(|entry| entry.parked.as_ref()).is_some_and(|p| p.salt == gone.salt);
                still && seen.insert(key.clone())
            });
        }
    }

    /// Indexes the blocks parked under `salt`, now known as `scope`'s, in the order they were parked (a
    /// parent before its children): the events announcing them, per tier.
    fn unpark(&mut self, salt: &str, scope: &[u8]) -> Vec<KvEvent> {
        let Some(waiting) = self.parked.remove(salt) else { return Vec::new() };
        let root = ChainKey::root(DEFAULT_BLOCK_SIZE, &self.config.model, scope);
        let mut new: [Vec<BlockHash>; 3] = Default::default();
        for key in waiting.keys {
            let Some(entry) = self.blocks.get(&key) else { continue };
            if entry.parked.as_ref().is_none_or(|parked| &*parked.salt != salt) {
                continue;
            }
            let start = match &entry.parent {
                None => Some(root),
                Some(parent) => self.blocks.get(parent).and_then(|parent| parent.chain.as_ref()).map(|chain| chain.end),
            };
            let Some(entry) = self.blocks.get_mut(&key) else { continue };
            let Some(parked) = entry.parked.take() else { continue };
            self.parked_tokens -= parked.tokens.len();
            let Some(start) = start else { continue };
            let chain = Chain::rehash(start, &parked.tokens);
            for tier in Tier::ALL {
                if entry.tiers & tier_bit(tier) != 0 {
                    hold(&mut self.held, tier, &chain.hashes, &mut new[tier.index()]);
                }
            }
            entry.chain = Some(chain);
            self.counters.unparked_blocks += 1;
        }
        let mut out = Vec::new();
        for (tier, hashes) in Tier::ALL.into_iter().zip(new) {
            push_hashes(&mut out, tier, hashes, true);
        }
        out
    }

    /// Rebuilds the parked keys from the entries (after many left at once).
    fn reindex_parked(&mut self) {
        self.parked.clear();
        self.parked_tokens = 0;
        let mut parked: Vec<(&EngineKey, &Entry)> =
            self.blocks.iter().filter(|(_, entry)| entry.parked.is_some()).collect();
        parked.sort_unstable_by_key(|(_, entry)| entry.serial);
        for (key, entry) in parked {
            let Some(block) = &entry.parked else { continue };
            let keys = self.parked.entry(block.salt.clone()).or_default();
            keys.keys.push(key.clone());
            keys.live += 1;
            self.parked_tokens += block.tokens.len();
        }
    }

    fn removed(&mut self, event: &BlockRemoved, out: &mut Vec<KvEvent>) {
        if !self.group_counts(event.group_idx) {
            return;
        }
        let tier = tier_of(event.medium.as_deref());
        let bit = tier_bit(tier);
        let mut gone = Vec::new();
        for key in &event.block_hashes {
            let Some(entry) = self.blocks.get_mut(key) else {
                self.counters.unknown_removed_blocks += 1;
                continue;
            };
            if entry.tiers & bit == 0 {
                self.counters.unknown_removed_blocks += 1;
                continue;
            }
            entry.tiers &= !bit;
            if let Some(chain) = &entry.chain {
                release(&mut self.held, tier, &chain.hashes, &mut gone);
            }
            if entry.tiers == 0
                && let Some(Entry { parked: Some(parked), .. }) = self.blocks.remove(key)
            {
                self.unpark_gone(&parked);
            }
        }
        push_hashes(out, tier, gone, false);
    }

    fn cleared(&mut self, event: &AllBlocksCleared, out: &mut Vec<KvEvent>) {
        match event.medium.as_deref() {
            None => {
                self.forget_all();
                out.extend(Tier::ALL.map(|tier| KvEvent::Cleared { tier }));
            }
            Some(medium) => {
                let tier = tier_of(Some(medium));
                let bit = tier_bit(tier);
                self.blocks.retain(|_, entry| {
                    entry.tiers &= !bit;
                    entry.tiers != 0
                });
                self.held.retain(|_, counts| {
                    counts[tier.index()] = 0;
                    counts.iter().any(|&count| count > 0)
                });
                self.reindex_parked();
                out.push(KvEvent::Cleared { tier });
            }
        }
    }
}

impl Parent {
    /// What a block continues from when its parent is `entry`.
    fn of(entry: &Entry) -> Parent {
        match (&entry.chain, &entry.parked) {
            (Some(chain), _) => Parent::Chain(chain.end),
            (None, Some(parked)) => Parent::Parked(parked.salt.clone()),
            (None, None) => Parent::Unindexed,
        }
    }
}

/// The kvroute tier of an engine's `medium`.
pub fn tier_of(medium: Option<&str>) -> Tier {
    match medium {
        None | Some("GPU") => Tier::Gpu,
        Some("CPU" | "CPU_PINNED") => Tier::Host,
        Some(_) => Tier::Network,
    }
}

fn tier_bit(tier: Tier) -> u8 {
    1 << tier.index()
}

/// Counts `hashes` held once more in `tier`, appending those it newly holds to `new`.
fn hold(held: &mut BlockHashMap<[u32; 3]>, tier: Tier, hashes: &[BlockHash], new: &mut Vec<BlockHash>) {
    for hash in hashes {
        let count = &mut held.entry(*hash).or_default()[tier.index()];
        *count = count.saturating_add(1);
        if *count == 1 {
            new.push(*hash);
        }
    }
}

/// Counts `hashes` held once less in `tier`, appending those it no longer holds to `gone`.
fn release(held: &mut BlockHashMap<[u32; 3]>, tier: Tier, hashes: &[BlockHash], gone: &mut Vec<BlockHash>) {
    for hash in hashes {
        let Some(counts) = held.get_mut(hash) else { continue };
        let count = &mut counts[tier.index()];
        if *count == 0 {
            continue;
        }
        *count -= 1;
        if *count == 0 {
            gone.push(*hash);
            if counts.iter().all(|&count| count == 0) {
                held.remove(hash);
            }
        }
    }
}

/// Appends hashes to `out`, into its last event when that is the same kind in the same tier.
fn push_hashes(out: &mut Vec<KvEvent>, tier: Tier, hashes: Vec<BlockHash>, stored: bool) {
    if hashes.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(KvEvent::Stored { tier: last, hashes: held }) if stored && *last == tier => held.extend(hashes),
        Some(KvEvent::Removed { tier: last, hashes: held }) if !stored && *last == tier => held.extend(hashes),
        _ if stored => out.push(KvEvent::Stored { tier, hashes }),
        _ => out.push(KvEvent::Removed { tier, hashes }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kvroute_proto::block_hash::BlockHasher;
    use proptest::prelude::*;

    use super::*;
    use crate::engine_events::decode::decode_batch;
    use crate::engine_events::salt::salt_for_scope;

    const MODEL: &str = "m";

    fn translator(engine_block_size: u32) -> Translator {
        Translator::new(TranslatorConfig::new(MODEL, engine_block_size)).unwrap()
    }

    fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    fn hashes(scope: &[u8], tokens: &[u32]) -> Vec<BlockHash> {
        BlockHasher::new(16, MODEL, scope).hashes(tokens)
    }

    fn key(value: u64) -> EngineKey {
        EngineKey::Int(value)
    }

    fn stored(keys: &[u64], parent: Option<u64>, tokens: Vec<u32>, block_size: u32) -> EngineEvent {
        EngineEvent::Stored(BlockStored {
            block_hashes: keys.iter().copied().map(key).collect(),
            parent_block_hash: parent.map(key),
            token_ids: tokens,
            block_size,
            medium: Some("GPU".into()),
            ..BlockStored::default()
        })
    }

    fn with(event: EngineEvent, change: impl FnOnce(&mut BlockStored)) -> EngineEvent {
        let EngineEvent::Stored(mut stored) = event else { panic!("not a store") };
        change(&mut stored);
        EngineEvent::Stored(stored)
    }

    fn removed(keys: &[u64], medium: Option<&str>) -> EngineEvent {
        EngineEvent::Removed(BlockRemoved {
            block_hashes: keys.iter().copied().map(key).collect(),
            medium: medium.map(str::to_string),
            group_idx: None,
        })
    }

    fn batch(events: Vec<EngineEvent>) -> EngineBatch {
        EngineBatch { ts: 0.0, events, data_parallel_rank: None, unknown_events: 0 }
    }

    /// Applies `events` as the next batch and returns what it gave.
    fn apply(translator: &mut Translator, events: Vec<EngineEvent>) -> Vec<KvEvent> {
        let seq = translator.last_seq().map_or(0, |last| last + 1);
        match translator.apply(seq, &batch(events), Source::Live) {
            Step::Events(events) => events,
            other => panic!("batch {seq}: {other:?}"),
        }
    }

    fn gpu_stored(hashes: Vec<BlockHash>) -> KvEvent {
        KvEvent::Stored { tier: Tier::Gpu, hashes }
    }

    #[test]
    fn block_sizes_that_are_not_multiples_of_16_are_refused() {
        for size in [0, 8, 24, 100] {
            let error = Translator::new(TranslatorConfig::new(MODEL, size)).unwrap_err();
            assert_eq!(error, ConfigError::BlockSize(size));
            assert!(error.to_string().contains("multiple of 16"), "{error}");
        }
        assert!(Translator::new(TranslatorConfig { max_blocks: 0, ..TranslatorConfig::new(MODEL, 16) }).is_err());
        assert!(Translator::new(TranslatorConfig::new(MODEL, 32)).is_ok());
    }

    #[test]
    fn chains_are_rehashed_in_16_token_blocks() {
        let prompt = tokens(0..144);
        for engine_block in [16u32, 32, 48] {
            let mut translator = translator(engine_block);
            let size = engine_block as usize;
            let first = [1u64, 2];
            let out = apply(&mut translator, vec![stored(&first, None, prompt[..2 * size].to_vec(), engine_block)]);
            let expected = hashes(b"", &prompt);
            assert_eq!(out, vec![gpu_stored(expected[..2 * size / 16].to_vec())], "block size {engine_block}");
            // A child continues its parent's chain.
            let out =
                apply(&mut translator, vec![stored(&[3], Some(2), prompt[2 * size..3 * size].to_vec(), engine_block)]);
            assert_eq!(out, vec![gpu_stored(expected[2 * size / 16..3 * size / 16].to_vec())]);
            assert_eq!(translator.tracked_blocks(), 3);
        }
    }

    #[test]
    fn partial_blocks_of_a_smaller_size_continue_the_same_chain() {
        // vLLM's hybrid allocator announces 16-token prefixes inside a 32-token engine block.
        let prompt = tokens(0..48);
        let expected = hashes(b"", &prompt);
        let mut translator = translator(32);
        apply(&mut translator, vec![stored(&[1], None, prompt[..32].to_vec(), 32)]);
        let out = apply(&mut translator, vec![stored(&[2], Some(1), prompt[32..48].to_vec(), 16)]);
        assert_eq!(out, vec![gpu_stored(vec![expected[2]])]);
        // The whole engine block over the same tokens: only its second half is new to kvroute.
        let prompt = tokens(0..64);
        let expected = hashes(b"", &prompt);
        let out = apply(&mut translator, vec![stored(&[3], Some(1), prompt[32..64].to_vec(), 32)]);
        assert_eq!(out, vec![gpu_stored(vec![expected[3]])]);
        // A kvroute block goes when the last engine block covering it does.
        assert_eq!(apply(&mut translator, vec![removed(&[2], None)]), vec![]);
        let out = apply(&mut translator, vec![removed(&[3], None)]);
        assert_eq!(out, vec![KvEvent::Removed { tier: Tier::Gpu, hashes: expected[2..4].to_vec() }]);
        assert_eq!(translator.snapshot(), vec![gpu_stored(expected[..2].to_vec())]);
    }

    #[test]
    fn the_salt_of_the_first_block_gives_the_scope() {
        let prompt = tokens(0..48);
        let mut translator = translator(16);
        let salt = translator.register_scope(b"t:acme").salt.unwrap();
        assert_eq!(translator.register_scope(b"").salt, None, "the global scope has no salt");
        let vllm = with(stored(&[1, 2], None, prompt[..32].to_vec(), 16), |stored| {
            stored.extra_keys = Some(vec![Some(vec![ExtraKey::Text(salt.clone())]), None]);
        });
        let out = apply(&mut translator, vec![vllm, stored(&[3], Some(2), prompt[32..].to_vec(), 16)]);
        assert_eq!(out, vec![gpu_stored(hashes(b"t:acme", &prompt))], "the child inherits the scope");

        // SGLang: the salt is a field of the event.
        let mut translator = self::translator(16);
        translator.register_scope(b"t:acme");
        let sglang = with(stored(&[9], None, prompt[..16].to_vec(), 16), |stored| {
            stored.cache_salt = Some(salt.clone());
        });
        assert_eq!(apply(&mut translator, vec![sglang]), vec![gpu_stored(hashes(b"t:acme", &prompt[..16]))]);
    }

    #[test]
    fn the_pool_prefix_of_a_prompt_is_what_the_engine_holds_in_its_pool_under_its_scope() {
        let prompt = tokens(0..100);
        let mut translator = translator(32);
        assert_eq!(translator.pool_prefix_tokens(b"", &prompt), 0, "nothing held yet");
        apply(&mut translator, vec![stored(&[1, 2], None, prompt[..64].to_vec(), 32)]);
        assert_eq!(translator.pool_prefix_tokens(b"", &prompt), 64);
        assert_eq!(translator.pool_prefix_tokens(b"", &prompt[..40]), 32, "whole blocks of the prompt only");
        assert_eq!(translator.pool_prefix_tokens(b"t:acme", &prompt), 0, "another scope's chain");
        let mut other = prompt.clone();
        other[20] += 1;
        assert_eq!(translator.pool_prefix_tokens(b"", &other), 16, "up to where the prompts part");
        // A copy in host RAM is not in the pool; the pool prefix ends where the pool's copy went.
        let host =
            with(stored(&[2], Some(1), prompt[32..64].to_vec(), 32), |stored| stored.medium = Some("CPU".into()));
        apply(&mut translator, vec![host, removed(&[2], None)]);
        assert_eq!(translator.pool_prefix_tokens(b"", &prompt), 32);
        let salt = translator.register_scope(b"t:acme").salt.unwrap();
        apply(&mut translator, vec![salted(&[5], prompt[..16].to_vec(), &salt)]);
        assert_eq!(translator.pool_prefix_tokens(b"t:acme", &prompt), 16);
    }

    fn salted(keys: &[u64], tokens: Vec<u32>, salt: &str) -> EngineEvent {
        with(stored(keys, None, tokens, 16), |stored| {
            stored.extra_keys = Some(
                std::iter::once(Some(vec![ExtraKey::Text(salt.into())]))
                    .chain(std::iter::repeat_n(None, keys.len() - 1))
                    .collect(),
            );
        })
    }

    #[test]
    fn unknown_salts_and_what_hangs_below_them_are_not_indexed() {
        let prompt = tokens(0..48);
        let mut translator = translator(16);
        let out = apply(
            &mut translator,
            vec![
                salted(&[1], prompt[..16].to_vec(), "another-clients-salt"),
                salted(&[2], prompt[..16].to_vec(), &crate::engine_events::salt::one_off_salt([7; 16])),
                stored(&[3], Some(1), prompt[16..32].to_vec(), 16),
                stored(&[4], Some(3), prompt[32..48].to_vec(), 16),
            ],
        );
        assert_eq!(out, vec![]);
        let counters = translator.counters();
        assert_eq!((counters.unknown_salt_roots, counters.parked_blocks), (2, 0));
        assert_eq!(counters.unknown_parent_blocks, 0, "children of an unindexed block are known, just not indexed");
        // Their removal is quiet too.
        assert_eq!(apply(&mut translator, vec![removed(&[4, 3, 1, 2], None)]), vec![]);
        assert_eq!(translator.counters().unknown_removed_blocks, 0);
        assert_eq!(translator.tracked_blocks(), 0);
    }

    #[test]
    fn chains_under_a_kvroute_salt_not_registered_yet_are_indexed_once_it_is() {
        // The agent restarted beside an engine that still holds a private scope's chain.
        let prompt = tokens(0..64);
        let expected = hashes(b"t:acme", &prompt);
        let salt = salt_for_scope(b"t:acme").unwrap();
        let mut translator = translator(16);
        let host_copy = with(stored(&[2], None, Vec::new(), 16), |stored| stored.medium = Some("CPU".into()));
        let out = apply(
            &mut translator,
            vec![salted(&[1, 2], prompt[..32].to_vec(), &salt), stored(&[3], Some(2), prompt[32..48].to_vec(), 16)],
        );
        assert_eq!(out, vec![]);
        assert_eq!(apply(&mut translator, vec![host_copy]), vec![]);
        // A child parked and gone again before the scope is seen: never announced.
        assert_eq!(apply(&mut translator, vec![stored(&[4], Some(3), prompt[48..].to_vec(), 16)]), vec![]);
        assert_eq!(apply(&mut translator, vec![removed(&[4], None)]), vec![]);
        assert_eq!((translator.counters().parked_blocks, translator.parked_blocks()), (4, 3));
        assert_eq!(translator.snapshot(), vec![]);

        let registered = translator.register_scope(b"t:acme");
        assert_eq!(registered.salt.as_deref(), Some(salt.as_str()));
        let host = KvEvent::Stored { tier: Tier::Host, hashes: vec![expected[1]] };
        assert_eq!(registered.events, vec![gpu_stored(expected[..3].to_vec()), host.clone()]);
        assert_eq!(translator.snapshot(), registered.events);
        assert_eq!((translator.counters().unparked_blocks, translator.parked_blocks()), (3, 0));
        assert_eq!(translator.register_scope(b"t:acme").events, vec![], "announced once");
        // Indexed like any other chain from here on: children continue it, removals name it.
        let out = apply(&mut translator, vec![stored(&[5], Some(3), prompt[48..].to_vec(), 16)]);
        assert_eq!(out, vec![gpu_stored(vec![expected[3]])]);
        let out = apply(&mut translator, vec![removed(&[2], Some("CPU"))]);
        assert_eq!(out, vec![KvEvent::Removed { tier: Tier::Host, hashes: vec![expected[1]] }]);
        // Another scope's registration unparks nothing of this one.
        let other = salt_for_scope(b"t:other").unwrap();
        apply(&mut translator, vec![salted(&[6], tokens(100..116), &other)]);
        assert_eq!(translator.register_scope(b"t:third").events, vec![]);
        assert_eq!(
            translator.register_scope(b"t:other").events,
            vec![gpu_stored(hashes(b"t:other", &tokens(100..116)))]
        );
    }

    #[test]
    fn parked_tokens_are_bounded_and_forgotten_with_their_blocks() {
        let config = TranslatorConfig { max_parked_tokens: 32, ..TranslatorConfig::new(MODEL, 16) };
        let mut translator = Translator::new(config).unwrap();
        let salt = salt_for_scope(b"t:acme").unwrap();
        apply(&mut translator, vec![salted(&[1, 2, 3], tokens(0..48), &salt)]);
        let counters = translator.counters();
        assert_eq!((counters.parked_blocks, counters.over_parking_capacity_blocks), (2, 1));
        // The engine clears its cache: nothing parked is left, and the room is free again.
        apply(&mut translator, vec![EngineEvent::Cleared(AllBlocksCleared::default())]);
        assert_eq!(translator.parked_blocks(), 0);
        apply(&mut translator, vec![salted(&[7, 8], tokens(200..232), &salt)]);
        assert_eq!(translator.parked_blocks(), 2);
        let out = translator.register_scope(b"t:acme").events;
        assert_eq!(out, vec![gpu_stored(hashes(b"t:acme", &tokens(200..232)))]);
    }

    #[test]
    fn lora_and_multimodal_blocks_are_not_indexed() {
        let prompt = tokens(0..32);
        let mut translator = translator(16);
        let lora = with(stored(&[1], None, prompt[..16].to_vec(), 16), |stored| stored.lora_name = Some("a".into()));
        let lora_child = stored(&[2], Some(1), prompt[16..].to_vec(), 16);
        let image = with(stored(&[3, 4], None, prompt.clone(), 16), |stored| {
            stored.extra_keys = Some(vec![None, Some(vec![ExtraKey::Other])]);
        });
        let salt_and_image = with(stored(&[5], None, prompt[..16].to_vec(), 16), |stored| {
            stored.extra_keys = Some(vec![Some(vec![ExtraKey::Text("s".into()), ExtraKey::Other])]);
        });
        let out = apply(&mut translator, vec![lora, lora_child, image, salt_and_image]);
        // Block 3 (plain tokens, no extra keys) is indexed; block 4 (an image) is not.
        assert_eq!(out, vec![gpu_stored(hashes(b"", &prompt[..16]))]);
        assert_eq!(translator.counters().unindexable_blocks, 3);
    }

    #[test]
    fn unknown_parents_are_skipped_and_counted() {
        let mut translator = translator(16);
        let out = apply(&mut translator, vec![stored(&[5, 6], Some(99), tokens(0..32), 16)]);
        assert_eq!(out, vec![]);
        assert_eq!(translator.counters().unknown_parent_blocks, 2);
        assert_eq!(translator.tracked_blocks(), 0);
    }

    #[test]
    fn malformed_and_other_group_stores_are_skipped() {
        let mut translator = translator(16);
        let out = apply(
            &mut translator,
            vec![
                stored(&[1], None, tokens(0..17), 16),
                stored(&[2], None, tokens(0..8), 8),
                stored(&[3], None, tokens(0..32), 16),
                with(stored(&[4], None, tokens(0..16), 16), |stored| stored.group_idx = Some(1)),
                EngineEvent::Removed(BlockRemoved { block_hashes: vec![key(9)], medium: None, group_idx: Some(2) }),
            ],
        );
        assert_eq!(out, vec![]);
        let counters = translator.counters();
        assert_eq!((counters.malformed_stores, counters.other_group_events), (3, 2));
        assert_eq!(counters.unknown_removed_blocks, 0, "another group's removal is not looked at");
    }

    #[test]
    fn removals_name_exactly_the_known_blocks() {
        let prompt = tokens(0..64);
        let expected = hashes(b"", &prompt);
        let mut translator = translator(32);
        apply(&mut translator, vec![stored(&[1, 2], None, prompt.clone(), 32)]);
        let out = apply(&mut translator, vec![removed(&[2, 77], Some("GPU"))]);
        assert_eq!(out, vec![KvEvent::Removed { tier: Tier::Gpu, hashes: expected[2..].to_vec() }]);
        assert_eq!(translator.counters().unknown_removed_blocks, 1);
        // Removed from a tier that does not hold it: nothing.
        assert_eq!(apply(&mut translator, vec![removed(&[1], Some("CPU"))]), vec![]);
        assert_eq!(translator.counters().unknown_removed_blocks, 2);
        assert_eq!(translator.tracked_blocks(), 1);
    }

    #[test]
    fn lower_tiers_reuse_what_the_gpu_announced() {
        let prompt = tokens(0..32);
        let expected = hashes(b"", &prompt);
        let mut translator = translator(16);
        apply(&mut translator, vec![stored(&[1, 2], None, prompt.clone(), 16)]);
        // vLLM's CPU offload announces the copy by hash alone.
        let copy = |medium: &str, keys: &[u64]| {
            with(stored(keys, None, Vec::new(), 16), |stored| stored.medium = Some(medium.into()))
        };
        let out = apply(&mut translator, vec![copy("CPU", &[1, 2]), copy("DISK", &[2, 3])]);
        assert_eq!(
            out,
            vec![
                KvEvent::Stored { tier: Tier::Host, hashes: expected.clone() },
                KvEvent::Stored { tier: Tier::Network, hashes: expected[1..].to_vec() },
            ]
        );
        assert_eq!(translator.counters().tokenless_unknown_blocks, 1);
        // The GPU copy goes; the host copy stays, and still continues chains.
        let out = apply(&mut translator, vec![removed(&[1, 2], None)]);
        assert_eq!(out, vec![KvEvent::Removed { tier: Tier::Gpu, hashes: expected.clone() }]);
        let more = tokens(32..48);
        let out = apply(&mut translator, vec![stored(&[4], Some(2), more.clone(), 16)]);
        let all: Vec<u32> = prompt.iter().copied().chain(more).collect();
        assert_eq!(out, vec![gpu_stored(hashes(b"", &all)[2..].to_vec())]);
        // Stored again in a tier that holds it: nothing new.
        assert_eq!(apply(&mut translator, vec![copy("CPU_PINNED", &[1])]), vec![]);
    }

    #[test]
    fn media_map_to_tiers() {
        assert_eq!(tier_of(None), Tier::Gpu);
        assert_eq!(tier_of(Some("GPU")), Tier::Gpu);
        assert_eq!(tier_of(Some("CPU")), Tier::Host);
        assert_eq!(tier_of(Some("CPU_PINNED")), Tier::Host);
        for other in ["DISK", "EXTERNAL", "STORAGE", "gpu", ""] {
            assert_eq!(tier_of(Some(other)), Tier::Network, "{other}");
        }
    }

    #[test]
    fn clearing_forgets_blocks() {
        let prompt = tokens(0..16);
        let mut translator = translator(16);
        let on_cpu = with(stored(&[2], None, prompt.clone(), 16), |stored| stored.medium = Some("CPU".into()));
        apply(&mut translator, vec![stored(&[1], None, prompt.clone(), 16), on_cpu]);
        let cleared = |medium: Option<&str>| EngineEvent::Cleared(AllBlocksCleared { medium: medium.map(Into::into) });
        let out = apply(&mut translator, vec![cleared(Some("GPU"))]);
        assert_eq!(out, vec![KvEvent::Cleared { tier: Tier::Gpu }]);
        assert_eq!(translator.tracked_blocks(), 1);
        let out = apply(&mut translator, vec![cleared(None)]);
        assert_eq!(out, Tier::ALL.map(|tier| KvEvent::Cleared { tier }).to_vec());
        assert_eq!(translator.tracked_blocks(), 0);
        assert_eq!(translator.snapshot(), vec![]);
    }

    #[test]
    fn sequence_numbers_gaps_duplicates_and_restarts() {
        let mut translator = translator(16);
        let empty = batch(vec![]);
        assert_eq!(translator.apply(3, &empty, Source::Live), Step::Gap { missing: 0..3 });
        assert_eq!(translator.last_seq(), None, "a gap applies nothing");
        translator.skip_to(3);
        assert_eq!(translator.apply(3, &empty, Source::Live), Step::Events(vec![]));
        assert_eq!(translator.apply(3, &empty, Source::Live), Step::Duplicate);
        assert_eq!(translator.apply(6, &empty, Source::Live), Step::Gap { missing: 4..6 });
        // The replay answers, from the first missing one on; then the live batch again.
        assert_eq!(translator.apply(4, &empty, Source::Replay), Step::Events(vec![]));
        assert_eq!(translator.apply(5, &empty, Source::Replay), Step::Events(vec![]));
        assert_eq!(translator.apply(6, &empty, Source::Replay), Step::Events(vec![]));
        assert_eq!(translator.apply(6, &empty, Source::Live), Step::Duplicate);
        assert_eq!(translator.apply(2, &empty, Source::Replay), Step::Duplicate, "a replay is never a restart");
        let counters = translator.counters();
        assert_eq!((counters.gaps, counters.batches_skipped, counters.duplicate_batches), (2, 3, 3));

        // A live batch lower than the last one: the engine started again.
        apply(&mut translator, vec![stored(&[1], None, tokens(0..16), 16)]);
        assert_eq!(translator.apply(0, &empty, Source::Live), Step::Restart);
        assert_eq!((translator.last_seq(), translator.tracked_blocks()), (None, 0));
        assert_eq!(translator.apply(0, &empty, Source::Live), Step::Events(vec![]));
        // Missed the first batches of a restarted engine: a restart, then a gap.
        for seq in 1..10 {
            assert_eq!(translator.apply(seq, &empty, Source::Live), Step::Events(vec![]));
        }
        assert_eq!(translator.apply(2, &empty, Source::Live), Step::Restart);
        assert_eq!(translator.apply(2, &empty, Source::Live), Step::Gap { missing: 0..2 });
        // Far past the restart window, a lower seq is a stray duplicate.
        translator.skip_to(RESTART_BELOW + 10);
        assert!(matches!(translator.apply(RESTART_BELOW + 10, &empty, Source::Live), Step::Events(_)));
        assert_eq!(translator.apply(RESTART_BELOW + 1, &empty, Source::Live), Step::Duplicate);
        assert_eq!(translator.counters().restarts, 2);
    }

    #[test]
    fn sglang_starts_with_all_blocks_cleared_at_seq_0() {
        let mut translator = translator(16);
        let start = batch(vec![EngineEvent::Cleared(AllBlocksCleared::default())]);
        assert!(matches!(translator.apply(0, &start, Source::Live), Step::Events(_)));
        assert_eq!(translator.apply(0, &batch(vec![]), Source::Live), Step::Duplicate);
        assert_eq!(translator.apply(0, &start, Source::Live), Step::Restart, "seq 0 again, starting afresh");
        assert_eq!(
            translator.apply(0, &start, Source::Replay),
            Step::Events(Tier::ALL.map(|tier| KvEvent::Cleared { tier }).to_vec())
        );
    }

    #[test]
    fn snapshots_list_parents_before_children() {
        let prompt = tokens(0..64);
        let expected = hashes(b"", &prompt);
        let mut translator = translator(16);
        apply(&mut translator, vec![stored(&[1, 2, 3, 4], None, prompt.clone(), 16)]);
        // The parent leaves the GPU and comes back: newer than its child, still listed first.
        apply(&mut translator, vec![with(stored(&[2], None, Vec::new(), 16), |s| s.medium = Some("CPU".into()))]);
        apply(&mut translator, vec![removed(&[2], None)]);
        apply(&mut translator, vec![stored(&[2], Some(1), prompt[16..32].to_vec(), 16)]);
        assert_eq!(
            translator.snapshot(),
            vec![gpu_stored(expected.clone()), KvEvent::Stored { tier: Tier::Host, hashes: vec![expected[1]] }]
        );
    }

    #[test]
    fn capacity_bounds_the_tracked_blocks() {
        let config = TranslatorConfig { max_blocks: 2, ..TranslatorConfig::new(MODEL, 16) };
        let mut translator = Translator::new(config).unwrap();
        let out = apply(&mut translator, vec![stored(&[1, 2, 3, 4], None, tokens(0..64), 16)]);
        assert_eq!(out, vec![gpu_stored(hashes(b"", &tokens(0..32)))]);
        let counters = translator.counters();
        assert_eq!((counters.over_capacity_blocks, counters.unknown_parent_blocks), (1, 1));
    }

    #[test]
    fn a_vllm_0_32_payload_end_to_end() {
        let path = format!("{}/tests/fixtures/engine_events/vllm_0_32_stored.msgpack", env!("CARGO_MANIFEST_DIR"));
        let decoded = decode_batch(&std::fs::read(path).unwrap()).unwrap();
        let mut translator = translator(16);
        translator.register_scope(b"t:acme");
        let Step::Events(out) = translator.apply(0, &decoded, Source::Live) else { panic!() };
        assert_eq!(out, vec![gpu_stored(hashes(b"t:acme", &tokens(1000..1048)))]);
    }

    /// The engine side of the property test: blocks keyed as an engine keys them (by parent and tokens).
    #[derive(Clone, Debug)]
    enum Op {
        Store {
            parent: usize,
            len: usize,
            seed: u32,
            tier: usize,
            salt: bool,
            wide: bool,
        },
        /// A request of the salted scope arrives (the salt is unknown until the first).
        Register,
        Copy {
            block: usize,
            tier: usize,
        },
        Remove {
            block: usize,
            tier: usize,
        },
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..8, 1usize..4, 0u32..3, 0usize..3, any::<bool>(), any::<bool>())
                .prop_map(|(parent, len, seed, tier, salt, wide)| Op::Store { parent, len, seed, tier, salt, wide }),
            2 => (0usize..16, 0usize..3).prop_map(|(block, tier)| Op::Copy { block, tier }),
            3 => (0usize..16, 0usize..3).prop_map(|(block, tier)| Op::Remove { block, tier }),
            1 => Just(Op::Clear),
            1 => Just(Op::Register),
        ]
    }

    proptest! {
        /// Whatever the engine does, the events out, applied to sets, give exactly the snapshot; every
        /// hash stored names a prefix that was really stored; and once the salt is registered, what was
        /// parked is indexed as if it had been registered all along (unless a parent left meanwhile).
        #[test]
        fn events_and_snapshot_agree(ops in proptest::collection::vec(op(), 1..60)) {
            const MEDIA: [&str; 3] = ["GPU", "CPU", "DISK"];
            let mut translator = translator(16);
            let mut registered_all_along = self::translator(16);
            registered_all_along.register_scope(b"s");
            let any_removal = ops.iter().any(|op| matches!(op, Op::Remove { .. }));
            // Not registered yet: salted chains are parked until the first Register.
            let salt = salt_for_scope(b"s").unwrap();
            // Engine blocks known to the test: key -> the whole token prefix up to its end, and its scope.
            let mut blocks: Vec<(u64, Vec<u32>, &[u8])> = Vec::new();
            let mut shadow: [BTreeSet<BlockHash>; 3] = Default::default();
            let mut named: HashMap<BlockHash, ()> = HashMap::new();
            for op in ops {
                let event = match op {
                    Op::Store { parent, len, seed, tier, salt: salted, wide } => {
                        // Engine blocks of 16 or 32 tokens, whose keys differ even over the same tokens.
                        let size: u32 = if wide { 32 } else { 16 };
                        let parent = blocks.get(parent).cloned().filter(|_| !salted);
                        let mut prefix = parent.as_ref().map(|(_, prefix, _)| prefix.clone()).unwrap_or_default();
                        let scope: &[u8] = match &parent { Some((_, _, scope)) => scope, None if salted => b"s", None => b"" };
                        let start = prefix.len();
                        let mut keys = Vec::new();
                        for _ in 0..len {
                            let at = prefix.len() as u32;
                            prefix.extend((at..at + size).map(|position| seed * 1000 + position));
                            let key = blake3::hash(&prefix.iter().flat_map(|t| t.to_le_bytes()).chain(scope.iter().copied()).chain([size as u8]).collect::<Vec<_>>());
                            let key = u64::from_le_bytes(key.as_bytes()[..8].try_into().unwrap());
                            keys.push(key);
                            blocks.push((key, prefix.clone(), scope));
                        }
                        for hash in hashes(scope, &prefix) { named.insert(hash, ()); }
                        with(stored(&keys, parent.map(|(key, _, _)| key), prefix[start..].to_vec(), size), |stored| {
                            stored.medium = Some(MEDIA[tier].into());
                            if salted { stored.extra_keys = Some(std::iter::once(Some(vec![ExtraKey::Text(salt.clone())])).chain(std::iter::repeat_n(None, len - 1)).collect()); }
                        })
                    }
                    Op::Copy { block, tier } => match blocks.get(block) {
                        Some((key, _, _)) => with(stored(&[*key], None, Vec::new(), 16), |stored| stored.medium = Some(MEDIA[tier].into())),
                        None => continue,
                    },
                    Op::Remove { block, tier } => match blocks.get(block) {
                        Some((key, _, _)) => removed(&[*key], Some(MEDIA[tier])),
                        None => continue,
                    },
                    Op::Clear => EngineEvent::Cleared(AllBlocksCleared::default()),
                    Op::Register => EngineEvent::Stored(BlockStored::default()),
                };
                let events = match event {
                    EngineEvent::Stored(stored) if stored.block_hashes.is_empty() => translator.register_scope(b"s").events,
                    event => {
                        apply(&mut registered_all_along, vec![event.clone()]);
                        apply(&mut translator, vec![event])
                    }
                };
                for event in events {
                    match event {
                        KvEvent::Stored { tier, hashes } => {
                            for hash in hashes {
                                prop_assert!(named.contains_key(&hash), "a hash no stored prefix has");
                                shadow[tier.index()].insert(hash);
                            }
                        }
                        KvEvent::Removed { tier, hashes } => hashes.iter().for_each(|hash| { shadow[tier.index()].remove(hash); }),
                        KvEvent::Cleared { tier } => shadow[tier.index()].clear(),
                    }
                }
            }
            let mut from_snapshot: [BTreeSet<BlockHash>; 3] = Default::default();
            for event in translator.snapshot() {
                let KvEvent::Stored { tier, hashes } = event else { panic!("a snapshot only stores") };
                let before = from_snapshot[tier.index()].len();
                from_snapshot[tier.index()].extend(hashes.iter().copied());
                prop_assert_eq!(from_snapshot[tier.index()].len(), before + hashes.len(), "a hash listed twice");
            }
            prop_assert_eq!(&from_snapshot, &shadow);
            translator.register_scope(b"s");
            let indexed = |translator: &Translator| translator.snapshot().into_iter().map(|event| match event {
                KvEvent::Stored { tier, hashes } => (tier, hashes.into_iter().collect::<BTreeSet<_>>()),
                other => panic!("a snapshot only stores: {other:?}"),
            }).collect::<Vec<_>>();
            let (late, all_along) = (indexed(&translator), indexed(&registered_all_along));
            if any_removal {
                for (tier, hashes) in &late {
                    let along = all_along.iter().find(|(other, _)| other == tier).map(|(_, hashes)| hashes);
                    prop_assert!(along.is_some_and(|along| hashes.is_subset(along)), "late registration indexed more");
                }
            } else {
                prop_assert_eq!(late, all_along);
            }
        }
    }
}

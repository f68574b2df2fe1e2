//! The block manager: which KV block of the pool holds what, for whom.
//!
//! A synchronous state machine driven by calls, with an injected event sink and
//! no I/O. It owns the bookkeeping only; the K/V values live in the model's
//! `KvStore`, indexed by the same block ids.
//!
//! Every block is in exactly one state:
//! - **free**: holds nothing useful, on the free list;
//! - **cached**: holds a registered full block (by its v1 hash) that no running
//!   sequence uses; evictable, ordered least recently used first;
//! - **in use**: referenced by one or more sequences' block tables (ref count > 0),
//!   registered or not.
//!
//! Eviction takes the cached block released longest ago. A sequence
//! releases its blocks tail first, so among blocks freed together the chain's
//! tail goes before its prefix. Every registration and every eviction is
//! reported to the [`EventSink`]; evicted blocks are also queued for the caller
//! ([`BlockManager::take_evicted`]) so a lower tier can copy their data before
//! the block is overwritten.

use std::collections::HashMap;

use kvroute_proto::block_hash::{BlockHash, BlockHashMap, BlockHasher, ChainKey};
use kvroute_proto::domain::{KvEvent, Tier};

use crate::lru::LruOrder;

/// Index of a block in the pool.
pub type BlockId = u32;

/// Receives every change of the pool's registered blocks.
pub trait EventSink: Send {
    fn emit(&mut self, event: KvEvent);
}

/// A sink that keeps the events in memory (tests, the simulator).
#[derive(Debug, Default)]
pub struct VecSink(pub Vec<KvEvent>);

impl EventSink for VecSink {
    fn emit(&mut self, event: KvEvent) {
        self.0.push(event);
    }
}

impl<F: FnMut(KvEvent) + Send> EventSink for F {
    fn emit(&mut self, event: KvEvent) {
        self(event)
    }
}

/// Not enough free or evictable blocks for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: need {needed}, {available} available")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub available: usize,
}

/// A pool block and the hash it holds (after an eviction, the id still holds the data until its next write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBlock {
    pub block: BlockId,
    pub hash: BlockHash,
}

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_count: u32,
    hash: Option<BlockHash>,
    /// Times a new sequence reused this block from the prefix cache since it was filled.
    hits: u32,
}

/// What the pool knows about one sequence.
#[derive(Debug, Clone)]
struct SeqState {
    blocks: Vec<BlockId>,
    /// `None` when caching is disabled for this sequence.
    hasher: Option<BlockHasher>,
    /// Chain state after the last registered full block.
    chain: ChainKey,
    /// Full blocks already registered (hashed) from the start of the table.
    registered: usize,
}

/// Result of placing a prompt in the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Leading full blocks found in the prefix cache.
    pub cached_blocks: usize,
    /// Prompt tokens whose K/V need no computation (at most `prompt - 1`, so
    /// the last token is always computed and has logits to sample from).
    pub cached_tokens: usize,
    /// Hashes of the prompt's full blocks, in chain order.
    pub prompt_hashes: Vec<BlockHash>,
    /// Reused blocks that became hot with this placement (reached the write-through threshold).
    pub hot: Vec<PoolBlock>,
}

/// The pool's bookkeeping.
pub struct BlockManager {
    block_size: usize,
    model_id: String,
    blocks: Vec<BlockMeta>,
    free: Vec<BlockId>,
    /// Cached (evictable) blocks, least recently released first.
    evictable: LruOrder,
    by_hash: BlockHashMap<BlockId>,
    seqs: HashMap<u64, SeqState>,
    evicted: Vec<PoolBlock>,
    /// Reuses after which a block is reported hot (0: never).
    hot_after: u32,
    sink: Box<dyn EventSink>,
}

impl std::fmt::Debug for BlockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockManager")
            .field("blocks", &self.blocks.len())
            .field("free", &self.free.len())
            .field("cached", &self.evictable.len())
            .field("sequences", &self.seqs.len())
            .finish()
    }
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, model_id: &str, sink: Box<dyn EventSink>) -> BlockManager {
        let num_blocks = num_blocks.min(u32::MAX as usize);
        BlockManager {
            block_size: block_size.max(1),
            model_id: model_id.to_string(),
            blocks: vec![BlockMeta::default(); num_blocks],
            // Pop from the end: hand out low ids first.
            free: (0..num_blocks as BlockId).rev().collect(),
            evictable: LruOrder::new(num_blocks),
            by_hash: BlockHashMap::default(),
            seqs: HashMap::new(),
            evicted: Vec::new(),
            hot_after: 0,
            sink,
        }
    }

    /// Reports a cached block as hot (in [`Placement::hot`]) when new sequences have reused it `hits` times
    /// since it was filled; 0 turns this off.
    pub fn set_hot_after(&mut self, hits: u32) {
        self.hot_after = hits;
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.free.len() - self.evictable.len()
    }

    /// Registered blocks that no sequence uses (evictable).
    pub fn num_cached(&self) -> usize {
        self.evictable.len()
    }

    /// Blocks that can be handed out now (free or evictable).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// A hasher for this pool's model and the given scope.
    pub fn hasher(&self, scope: &[u8]) -> BlockHasher {
        BlockHasher::new(self.block_size as u32, &self.model_id, scope)
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Leading blocks of `hashes` present in the pool, and how many of them are
    /// cached (evictable) rather than in use; changes nothing.
    pub fn probe(&self, hashes: &[BlockHash]) -> (usize, usize) {
        let mut matched = 0;
        let mut evictable = 0;
        for hash in hashes {
            let Some(&block) = self.by_hash.get(hash) else { break };
            matched += 1;
            if self.blocks[block as usize].ref_count == 0 {
                evictable += 1;
            }
        }
        (matched, evictable)
    }

    /// Available blocks (free or evictable) a prompt would take: new blocks beyond its cache hits, and the
    /// cached ones it hits that no sequence holds (they stop being evictable).
    pub fn blocks_taken(&self, hashes: &[BlockHash], prompt_tokens: usize) -> usize {
        let (matched, matched_evictable) = self.probe(hashes);
        self.blocks_for_tokens(prompt_tokens).saturating_sub(matched) + matched_evictable
    }

    /// Whether a prompt fits while keeping `reserve` blocks available afterwards.
    pub fn fits(&self, hashes: &[BlockHash], prompt_tokens: usize, reserve: usize) -> bool {
        self.num_available() >= self.blocks_taken(hashes, prompt_tokens) + reserve
    }

    /// Places a new sequence: reuses the longest cached prefix of the prompt's
    /// full blocks and allocates blocks for the rest of the prompt. With
    /// `hasher` None (caching disabled) nothing is reused or registered.
    pub fn place(&mut self, seq: u64, prompt: &[u32], hasher: Option<BlockHasher>) -> Result<Placement, OutOfBlocks> {
        let prompt_hashes = hasher.as_ref().map(|h| h.hashes(prompt)).unwrap_or_default();
        self.place_hashed(seq, prompt, hasher, prompt_hashes)
    }

    /// [`BlockManager::place`] given the prompt's full-block hashes under `hasher` (empty without one).
    pub fn place_hashed(
        &mut self,
        seq: u64,
        prompt: &[u32],
        hasher: Option<BlockHasher>,
        prompt_hashes: Vec<BlockHash>,
    ) -> Result<Placement, OutOfBlocks> {
        debug_assert_eq!(prompt_hashes.len(), hasher.as_ref().map_or(0, |_| prompt.len() / self.block_size));
        let (matched, matched_evictable) = self.probe(&prompt_hashes);
        let total = self.blocks_for_tokens(prompt.len());
        let needed = total.saturating_sub(matched);
        let available = self.num_available() - matched_evictable;
        if needed > available {
            return Err(OutOfBlocks { needed, available });
        }
        let mut table = Vec::with_capacity(total);
        let mut hot = Vec::new();
        for hash in &prompt_hashes[..matched] {
            let block = self.by_hash[hash];
            self.acquire(block);
            let meta = &mut self.blocks[block as usize];
            meta.hits = meta.hits.saturating_add(1);
            if meta.hits == self.hot_after {
                hot.push(PoolBlock { block, hash: *hash });
            }
            table.push(block);
        }
        for _ in matched..total {
            table.push(self.allocate_one()?);
        }
        let chain = match (&hasher, matched) {
            (Some(h), 0) => h.root(),
            (Some(h), n) => h.extend(h.root(), &prompt[..n * self.block_size]).1,
            (None, _) => ChainKey::root(0, "", b""),
        };
        self.seqs.insert(seq, SeqState { blocks: table, hasher, chain, registered: matched });
        let cached_tokens = (matched * self.block_size).min(prompt.len().saturating_sub(1));
        Ok(Placement { cached_blocks: matched, cached_tokens, prompt_hashes, hot })
    }

    /// Makes room for the sequence to hold `tokens` tokens (decode growth).
    pub fn grow(&mut self, seq: u64, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed_total = self.blocks_for_tokens(tokens);
        let have = self.seqs.get(&seq).map_or(0, |state| state.blocks.len());
        let needed = needed_total.saturating_sub(have);
        if needed > self.num_available() {
            return Err(OutOfBlocks { needed, available: self.num_available() });
        }
        for _ in 0..needed {
            let block = self.allocate_one()?;
            if let Some(state) = self.seqs.get_mut(&seq) {
                state.blocks.push(block);
            }
        }
        Ok(())
    }

    /// The sequence's block table.
    pub fn block_table(&self, seq: u64) -> &[BlockId] {
        self.seqs.get(&seq).map_or(&[], |state| &state.blocks)
    }

    /// How many of the sequence's blocks no other sequence holds: what its release gives back to the pool.
    pub fn sole_blocks(&self, seq: u64) -> usize {
        self.block_table(seq).iter().filter(|&&block| self.blocks[block as usize].ref_count == 1).count()
    }

    /// Registers the sequence's newly full blocks, given all its tokens whose
    /// K/V are now computed. A block whose hash another block already holds
    /// stays unregistered (it is freed, not cached, when released).
    pub fn register_computed(&mut self, seq: u64, computed_tokens: &[u32]) {
        let Some(state) = self.seqs.get_mut(&seq) else { return };
        let Some(hasher) = state.hasher.clone() else { return };
        let full = (computed_tokens.len() / self.block_size).min(state.blocks.len());
        if full <= state.registered {
            return;
        }
        let start = state.registered * self.block_size;
        let (hashes, chain) = hasher.extend(state.chain, &computed_tokens[start..full * self.block_size]);
        let blocks: Vec<BlockId> = state.blocks[state.registered..full].to_vec();
        state.chain = chain;
        state.registered = full;
        let mut stored = Vec::with_capacity(hashes.len());
        for (block, hash) in blocks.into_iter().zip(hashes) {
            if self.by_hash.contains_key(&hash) || self.blocks[block as usize].hash.is_some() {
                continue;
            }
            self.blocks[block as usize].hash = Some(hash);
            self.by_hash.insert(hash, block);
            stored.push(hash);
        }
        if !stored.is_empty() {
            self.sink.emit(KvEvent::Stored { tier: Tier::Gpu, hashes: stored });
        }
    }

    /// Releases every block of the sequence: registered blocks become cached
    /// (tail first in eviction order), the others free.
    pub fn release(&mut self, seq: u64) {
        let Some(state) = self.seqs.remove(&seq) else { return };
        for &block in state.blocks.iter().rev() {
            let meta = &mut self.blocks[block as usize];
            meta.ref_count = meta.ref_count.saturating_sub(1);
            if meta.ref_count > 0 {
                continue;
            }
            if meta.hash.is_some() {
                self.evictable.push_back(block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// Blocks evicted since the last call, oldest first.
    pub fn take_evicted(&mut self) -> Vec<PoolBlock> {
        std::mem::take(&mut self.evicted)
    }

    /// Every registered hash (for a snapshot of the GPU tier).
    pub fn registered_hashes(&self) -> Vec<BlockHash> {
        self.by_hash.keys().copied().collect()
    }

    /// The block holding `hash`, if registered.
    pub fn lookup(&self, hash: &BlockHash) -> Option<BlockId> {
        self.by_hash.get(hash).copied()
    }

    /// Whether a sequence is placed.
    pub fn contains(&self, seq: u64) -> bool {
        self.seqs.contains_key(&seq)
    }

    fn acquire(&mut self, block: BlockId) {
        let meta = &mut self.blocks[block as usize];
        if meta.ref_count == 0 {
            self.evictable.remove(block);
        }
        meta.ref_count += 1;
    }

    fn allocate_one(&mut self) -> Result<BlockId, OutOfBlocks> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let Some(block) = self.evictable.pop_front() else {
                    return Err(OutOfBlocks { needed: 1, available: 0 });
                };
                if let Some(hash) = self.blocks[block as usize].hash.take() {
                    self.by_hash.remove(&hash);
                    self.evicted.push(PoolBlock { block, hash });
                    self.sink.emit(KvEvent::Removed { tier: Tier::Gpu, hashes: vec![hash] });
                }
                block
            }
        };
        self.blocks[block as usize].ref_count = 1;
        self.blocks[block as usize].hits = 0;
        Ok(block)
    }

    /// Checks every invariant; returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs = vec![0u32; self.blocks.len()];
        for state in self.seqs.values() {
            for &block in &state.blocks {
                refs[block as usize] += 1;
            }
        }
        let free: std::collections::HashSet<_> = self.free.iter().copied().collect();
        if free.len() != self.free.len() {
            return Err("a block is twice on the free list".into());
        }
        for (id, meta) in self.blocks.iter().enumerate() {
            let id = id as BlockId;
            if meta.ref_count != refs[id as usize] {
                return Err(format!(
                    "block {id}: ref count {} but {} table entries",
                    meta.ref_count, refs[id as usize]
                ));
            }
            let in_free = free.contains(&id);
            let in_evictable = self.evictable.contains(id);
            let in_use = meta.ref_count > 0;
            if usize::from(in_free) + usize::from(in_evictable) + usize::from(in_use) != 1 {
                return Err(format!("block {id}: free={in_free} cached={in_evictable} in_use={in_use}"));
            }
            if in_free && meta.hash.is_some() {
                return Err(format!("block {id}: free but registered"));
            }
            if in_evictable && meta.hash.is_none() {
                return Err(format!("block {id}: cached but not registered"));
            }
            if let Some(hash) = meta.hash
                && self.by_hash.get(&hash) != Some(&id)
            {
                return Err(format!("block {id}: hash map does not point back"));
            }
        }
        if self.evictable.len() + self.free.len() + self.num_used() != self.blocks.len() {
            return Err("block counts do not add up".into());
        }
        for (hash, &block) in &self.by_hash {
            if self.blocks[block as usize].hash != Some(*hash) {
                return Err(format!("hash map entry for block {block} is stale"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn manager(blocks: usize) -> (BlockManager, Arc<Mutex<Vec<KvEvent>>>) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let manager = BlockManager::new(blocks, 4, "m", Box::new(move |event| sink.lock().unwrap().push(event)));
        (manager, events)
    }

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn shared_prefix_shares_blocks() {
        let (mut bm, _) = manager(16);
        let hasher = bm.hasher(b"");
        let tokens = prompt(1, 10);
        bm.place(1, &tokens, Some(hasher.clone())).unwrap();
        bm.register_computed(1, &tokens);
        let placement = bm.place(2, &tokens, Some(hasher)).unwrap();
        assert_eq!(placement.cached_blocks, 2);
        assert_eq!(placement.cached_tokens, 8);
        assert_eq!(bm.block_table(1)[..2], bm.block_table(2)[..2]);
        assert_ne!(bm.block_table(1)[2], bm.block_table(2)[2]);
        assert_eq!((bm.sole_blocks(1), bm.sole_blocks(2)), (1, 1), "only the last, unshared block is each one's own");
        bm.release(1);
        assert_eq!(bm.sole_blocks(2), 3, "the other's release leaves it the only holder");
        bm.check_invariants().unwrap();
    }

    #[test]
    fn full_prompt_hit_still_computes_the_last_token() {
        let (mut bm, _) = manager(16);
        let hasher = bm.hasher(b"");
        let tokens = prompt(1, 8);
        bm.place(1, &tokens, Some(hasher.clone())).unwrap();
        bm.register_computed(1, &tokens);
        bm.release(1);
        let placement = bm.place(2, &tokens, Some(hasher)).unwrap();
        assert_eq!(placement.cached_blocks, 2);
        assert_eq!(placement.cached_tokens, 7);
    }

    #[test]
    fn scopes_do_not_share() {
        let (mut bm, _) = manager(16);
        let tokens = prompt(1, 8);
        bm.place(1, &tokens, Some(bm.hasher(b"t:a"))).unwrap();
        bm.register_computed(1, &tokens);
        let placement = bm.place(2, &tokens, Some(bm.hasher(b"t:b"))).unwrap();
        assert_eq!(placement.cached_blocks, 0);
    }

    #[test]
    fn disabled_caching_neither_reuses_nor_registers() {
        let (mut bm, events) = manager(16);
        let tokens = prompt(1, 8);
        bm.place(1, &tokens, None).unwrap();
        bm.register_computed(1, &tokens);
        bm.release(1);
        assert_eq!(bm.num_cached(), 0);
        assert!(events.lock().unwrap().is_empty());
        bm.check_invariants().unwrap();
    }

    #[test]
    fn eviction_is_lru_and_tail_first() {
        let (mut bm, events) = manager(4);
        let hasher = bm.hasher(b"");
        let a = prompt(1, 8);
        let b = prompt(2, 8);
        bm.place(1, &a, Some(hasher.clone())).unwrap();
        bm.register_computed(1, &a);
        bm.release(1);
        bm.place(2, &b, Some(hasher.clone())).unwrap();
        bm.register_computed(2, &b);
        bm.release(2);
        assert_eq!(bm.num_cached(), 4);
        let a_hashes = hasher.hashes(&a);
        events.lock().unwrap().clear();
        // One new block evicts a's tail, the next a's head; b stays.
        bm.place(3, &prompt(3, 4), Some(hasher.clone())).unwrap();
        bm.place(4, &prompt(4, 4), Some(hasher.clone())).unwrap();
        let evicted: Vec<_> = bm.take_evicted().into_iter().map(|e| e.hash).collect();
        assert_eq!(evicted, vec![a_hashes[1], a_hashes[0]]);
        let removed: Vec<_> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                KvEvent::Removed { hashes, .. } => Some(hashes[0]),
                _ => None,
            })
            .collect();
        assert_eq!(removed, evicted);
        assert_eq!(bm.probe(&hasher.hashes(&b)).0, 2);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn blocks_become_hot_once_after_enough_reuses() {
        let (mut bm, _) = manager(8);
        bm.set_hot_after(2);
        let hasher = bm.hasher(b"");
        let tokens = prompt(1, 9); // two full blocks and a partial one
        let hashes = hasher.hashes(&tokens);
        let mut hot_per_placement = Vec::new();
        for seq in 1..=4 {
            let placement = bm.place(seq, &tokens, Some(hasher.clone())).unwrap();
            bm.register_computed(seq, &tokens);
            bm.release(seq);
            hot_per_placement.push(placement.hot.iter().map(|b| b.hash).collect::<Vec<_>>());
        }
        // Placed cold, reused once, reused twice (hot), reused again (already reported).
        assert_eq!(hot_per_placement, vec![vec![], vec![], hashes.clone(), vec![]]);
        let (mut off, _) = manager(8);
        let placement = off.place(1, &tokens, Some(hasher.clone())).unwrap();
        assert!(placement.hot.is_empty(), "off by default");
        bm.check_invariants().unwrap();
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let (mut bm, _) = manager(2);
        let err = bm.place(1, &prompt(1, 12), Some(bm.hasher(b""))).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 3, available: 2 });
        assert_eq!(bm.num_available(), 2);
        assert!(!bm.contains(1));
        bm.check_invariants().unwrap();
    }
}

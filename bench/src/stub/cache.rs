//! The stub engine's prefix cache: a prompt's full blocks chained by hash (each block's hash covers its
//! parent's, its tokens and, on a root, the request's cache salt), kept in least-recently-used order up to
//! a capacity. Serving a prompt says how many of its tokens were cached, as vLLM counts them, and which
//! blocks were stored and evicted, as the engine events vLLM would publish. No clock, no I/O.

use std::collections::{BTreeMap, HashMap};

/// What an engine reports about its cache, in the order it happened.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheEvent {
    /// Consecutive blocks of one prompt: `tokens` holds `hashes.len()` blocks; `salt` is the request's
    /// cache salt when the first of them is a root.
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        salt: Option<String>,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

/// What serving one prompt did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    /// Prompt tokens found cached (whole blocks; never the whole prompt: its last token is always computed).
    pub cached_tokens: usize,
    pub events: Vec<CacheEvent>,
}

/// A block-granular LRU prefix cache.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    /// Block hash to its last use.
    last_use: HashMap<u64, u64>,
    /// Last use to block hash, oldest first.
    by_age: BTreeMap<u64, u64>,
    clock: u64,
}

impl PrefixCache {
    /// A cache of at most `capacity` blocks of `block_size` tokens (both at least 1).
    pub fn new(block_size: usize, capacity: usize) -> PrefixCache {
        PrefixCache {
            block_size: block_size.max(1),
            capacity: capacity.max(1),
            last_use: HashMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    /// Serves `tokens`: the longest cached prefix of whole blocks is reused (and becomes the most recently
    /// used), the prompt's other full blocks are stored, and the least recently used blocks of other
    /// prompts are evicted to make room.
    pub fn serve(&mut self, tokens: &[u32], salt: Option<&str>) -> Served {
        let chain = block_hashes(tokens, self.block_size, salt);
        // vLLM always computes a prompt's last token, so a fully cached prompt reuses one block less.
        let reusable = tokens.len().saturating_sub(1) / self.block_size;
        let hits = chain.iter().take(reusable).take_while(|hash| self.last_use.contains_key(hash)).count();
        let stored_from = chain.iter().take_while(|hash| self.last_use.contains_key(hash)).count();
        // Last block first, so that a prompt's tail is older than its head and is evicted before it, as
        // vLLM frees a request's blocks: a chain loses its leaves, never a block its cached children need.
        for &hash in chain.iter().rev() {
            self.touch(hash);
        }
        let mut events = Vec::new();
        if stored_from < chain.len() {
            events.push(CacheEvent::Stored {
                hashes: chain[stored_from..].to_vec(),
                parent: stored_from.checked_sub(1).map(|index| chain[index]),
                tokens: tokens[stored_from * self.block_size..chain.len() * self.block_size].to_vec(),
                salt: if stored_from == 0 { salt.map(str::to_string) } else { None },
            });
        }
        let mut evicted = Vec::new();
        while self.last_use.len() > self.capacity {
            let Some((_, hash)) = self.by_age.pop_first() else { break };
            self.last_use.remove(&hash);
            evicted.push(hash);
        }
        if !evicted.is_empty() {
            events.push(CacheEvent::Removed { hashes: evicted });
        }
        Served { cached_tokens: hits * self.block_size, events }
    }

    /// Empties the cache.
    pub fn clear(&mut self) -> CacheEvent {
        self.last_use.clear();
        self.by_age.clear();
        CacheEvent::Cleared
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        if let Some(previous) = self.last_use.insert(hash, self.clock) {
            self.by_age.remove(&previous);
        }
        self.by_age.insert(self.clock, hash);
    }
}

/// The chained hashes of the full blocks of `tokens` (64-bit FNV-1a over the parent's hash, the salt on a
/// root, and the block's tokens).
pub fn block_hashes(tokens: &[u32], block_size: usize, salt: Option<&str>) -> Vec<u64> {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mix =
        |hash: u64, bytes: &[u8]| bytes.iter().fold(hash, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME));
    let mut parent: Option<u64> = None;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|block| {
            let mut hash = match parent {
                Some(parent) => mix(OFFSET, &parent.to_le_bytes()),
                None => mix(OFFSET, salt.unwrap_or_default().as_bytes()),
            };
            for token in block {
                hash = mix(hash, &token.to_le_bytes());
            }
            parent = Some(hash);
            hash
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(blocks: u32, first: u32) -> Vec<u32> {
        (first..first + blocks * 4).collect()
    }

    #[test]
    fn a_repeated_prompt_reuses_its_blocks_but_its_last_token() {
        let mut cache = PrefixCache::new(4, 100);
        let tokens = prompt(3, 0);
        let first = cache.serve(&tokens, None);
        assert_eq!(first.cached_tokens, 0);
        let hashes = block_hashes(&tokens, 4, None);
        assert_eq!(
            first.events,
            vec![CacheEvent::Stored { hashes: hashes.clone(), parent: None, tokens: tokens.clone(), salt: None }]
        );
        // 12 tokens, all cached: the last block is computed again, as vLLM does.
        let again = cache.serve(&tokens, None);
        assert_eq!(again.cached_tokens, 8);
        assert!(again.events.is_empty());
        // One more token: every whole block is reused, and nothing new is stored (the tail is partial).
        let mut longer = tokens.clone();
        longer.push(99);
        assert_eq!(cache.serve(&longer, None).cached_tokens, 12);
    }

    #[test]
    fn a_longer_prompt_stores_only_its_new_blocks_under_the_last_shared_one() {
        let mut cache = PrefixCache::new(4, 100);
        let base = prompt(2, 0);
        cache.serve(&base, None);
        let mut longer = base.clone();
        longer.extend(100..108);
        let served = cache.serve(&longer, None);
        assert_eq!(served.cached_tokens, 8);
        let hashes = block_hashes(&longer, 4, None);
        assert_eq!(
            served.events,
            vec![CacheEvent::Stored {
                hashes: hashes[2..].to_vec(),
                parent: Some(hashes[1]),
                tokens: (100..108).collect(),
                salt: None
            }]
        );
    }

    #[test]
    fn salts_keep_chains_apart_and_travel_on_the_root() {
        let mut cache = PrefixCache::new(4, 100);
        let tokens = prompt(2, 0);
        cache.serve(&tokens, Some("a"));
        let other = cache.serve(&tokens, Some("b"));
        assert_eq!(other.cached_tokens, 0);
        assert!(matches!(&other.events[0], CacheEvent::Stored { salt: Some(salt), parent: None, .. } if salt == "b"));
        assert_eq!(cache.serve(&tokens, Some("a")).cached_tokens, 4);
        assert_ne!(block_hashes(&tokens, 4, Some("a")), block_hashes(&tokens, 4, None));
    }

    #[test]
    fn the_least_recently_used_blocks_are_evicted_and_reported() {
        let mut cache = PrefixCache::new(4, 4);
        let old = prompt(2, 0);
        let warm = prompt(2, 1000);
        cache.serve(&old, None);
        cache.serve(&warm, None);
        cache.serve(&warm, None);
        let fresh = prompt(2, 2000);
        let served = cache.serve(&fresh, None);
        // Tail first, as a request frees its blocks.
        let old_blocks: Vec<u64> = block_hashes(&old, 4, None).into_iter().rev().collect();
        assert_eq!(served.events[1], CacheEvent::Removed { hashes: old_blocks });
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.serve(&warm, None).cached_tokens, 4);
        assert_eq!(cache.serve(&old, None).cached_tokens, 0);
    }

    #[test]
    fn a_prompt_that_does_not_fit_loses_its_tail_and_keeps_its_head() {
        let mut cache = PrefixCache::new(4, 3);
        let first = prompt(2, 0);
        cache.serve(&first, None);
        let second = prompt(2, 1000);
        let served = cache.serve(&second, None);
        // One block must go: the first prompt's tail, not the head its tail hangs from.
        let first_hashes = block_hashes(&first, 4, None);
        assert_eq!(served.events[1], CacheEvent::Removed { hashes: vec![first_hashes[1]] });
        let mut longer = first.clone();
        longer.push(7);
        assert_eq!(cache.serve(&longer, None).cached_tokens, 4, "the head is still reachable");
    }

    #[test]
    fn clearing_forgets_everything() {
        let mut cache = PrefixCache::new(4, 10);
        let tokens = prompt(2, 0);
        cache.serve(&tokens, None);
        assert_eq!(cache.clear(), CacheEvent::Cleared);
        assert!(cache.is_empty());
        assert_eq!(cache.serve(&tokens, None).cached_tokens, 0);
    }
}

//! Tokenized text pieces, cached by the renderer so resent history is not re-tokenized.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// A cache of tokenized text pieces, shared by renderers. Keys are blake3
/// digests of the tokenizer fingerprint and the piece text.
pub trait TokenRunCache: Send + Sync {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<[u32]>>;
    fn insert(&self, key: [u8; 32], tokens: Arc<[u32]>);
}

/// A [`TokenRunCache`] holding the most recently used pieces, bounded by the
/// total number of tokens held.
pub struct LruTokenCache {
    max_tokens: usize,
    state: Mutex<LruState>,
}

#[derive(Default)]
struct LruState {
    entries: HashMap<[u8; 32], (Arc<[u32]>, u64)>,
    by_age: BTreeMap<u64, [u8; 32]>,
    clock: u64,
    tokens: usize,
}

impl LruTokenCache {
    /// A cache holding at most `max_tokens` tokens in all.
    pub fn new(max_tokens: usize) -> LruTokenCache {
        LruTokenCache { max_tokens, state: Mutex::new(LruState::default()) }
    }

    /// The number of pieces held.
    pub fn len(&self) -> usize {
        self.state.lock().map_or(0, |state| state.entries.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TokenRunCache for LruTokenCache {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<[u32]>> {
        let mut state = self.state.lock().ok()?;
        let state = &mut *state;
        state.clock += 1;
        let clock = state.clock;
        let (tokens, age) = state.entries.get_mut(key)?;
        state.by_age.remove(age);
        *age = clock;
        state.by_age.insert(clock, *key);
        Some(tokens.clone())
    }

    fn insert(&self, key: [u8; 32], tokens: Arc<[u32]>) {
        if tokens.len() > self.max_tokens {
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let state = &mut *state;
        state.clock += 1;
        let clock = state.clock;
        state.tokens += tokens.len();
        if let Some((old, age)) = state.entries.insert(key, (tokens, clock)) {
            state.tokens -= old.len();
            state.by_age.remove(&age);
        }
        state.by_age.insert(clock, key);
        while state.tokens > self.max_tokens {
            let Some((_, oldest)) = state.by_age.pop_first() else {
                break;
            };
            if let Some((old, _)) = state.entries.remove(&oldest) {
                state.tokens -= old.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_cache_evicts_least_recently_used() {
        let cache = LruTokenCache::new(4);
        cache.insert([1; 32], Arc::from(vec![1, 1]));
        cache.insert([2; 32], Arc::from(vec![2, 2]));
        assert!(cache.get(&[1; 32]).is_some());
        cache.insert([3; 32], Arc::from(vec![3]));
        // 5 tokens > 4: the least recently used entry (2) goes.
        assert!(cache.get(&[2; 32]).is_none());
        assert_eq!(cache.get(&[1; 32]).as_deref(), Some([1, 1].as_slice()));
        assert_eq!(cache.len(), 2);
        cache.insert([4; 32], Arc::from(vec![0; 10]));
        assert_eq!(cache.len(), 2);
    }
}

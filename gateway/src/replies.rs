//! Remembers the exact token ids of assistant replies this gateway generated.
//!
//! Multi-turn chat resends its history. Re-tokenizing generated text can give
//! other ids than the ones generated (and already cached by the replica), so a
//! reply that comes back in a later turn is rendered with the ids it was
//! generated as. Bounded by total tokens; least recently used replies go first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Reply text -> generated token ids.
pub struct ReplyMemory {
    max_tokens: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<[u8; 32], (Arc<[u32]>, u64)>,
    order: BTreeMap<u64, [u8; 32]>,
    tokens: usize,
    clock: u64,
}

impl std::fmt::Debug for ReplyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyMemory").field("max_tokens", &self.max_tokens).finish()
    }
}

fn key(text: &str) -> [u8; 32] {
    *blake3::hash(text.as_bytes()).as_bytes()
}

impl ReplyMemory {
    pub fn new(max_tokens: usize) -> ReplyMemory {
        ReplyMemory { max_tokens, inner: Mutex::new(Inner::default()) }
    }

    /// Records that `text` was generated as `ids`.
    pub fn remember(&self, text: &str, ids: &[u32]) {
        if ids.is_empty() || ids.len() > self.max_tokens {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        let k = key(text);
        inner.clock += 1;
        let stamp = inner.clock;
        if let Some((old, old_stamp)) = inner.entries.remove(&k) {
            inner.order.remove(&old_stamp);
            inner.tokens -= old.len();
        }
        inner.entries.insert(k, (ids.into(), stamp));
        inner.order.insert(stamp, k);
        inner.tokens += ids.len();
        while inner.tokens > self.max_tokens {
            let Some((_, oldest)) = inner.order.pop_first() else { break };
            if let Some((ids, _)) = inner.entries.remove(&oldest) {
                inner.tokens -= ids.len();
            }
        }
    }

    /// The ids `text` was generated as, if this gateway generated it.
    pub fn recall(&self, text: &str) -> Option<Arc<[u32]>> {
        let Ok(mut inner) = self.inner.lock() else { return None };
        let k = key(text);
        inner.clock += 1;
        let stamp = inner.clock;
        let (ids, old_stamp) = inner.entries.get(&k).cloned()?;
        inner.order.remove(&old_stamp);
        inner.order.insert(stamp, k);
        if let Some(entry) = inner.entries.get_mut(&k) {
            entry.1 = stamp;
        }
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_bounds() {
        let memory = ReplyMemory::new(5);
        memory.remember("a", &[1, 2, 3]);
        memory.remember("b", &[4, 5]);
        assert_eq!(memory.recall("a").as_deref(), Some(&[1, 2, 3][..]));
        memory.remember("c", &[6, 7]); // evicts b, the least recently used
        assert!(memory.recall("b").is_none());
        assert!(memory.recall("a").is_some() && memory.recall("c").is_some());
    }
}

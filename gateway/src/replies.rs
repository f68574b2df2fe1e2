//! Remembers the exact token ids of assistant replies this gateway generated.
//!
//! Multi-turn chat resends its history. Re-tokenizing generated text can give
//! other ids than the ones generated (and already cached by the replica), so a
//! reply that comes back in a later turn is rendered with the ids it was
//! generated as. Bounded by total tokens; least recently used replies go first.
//!
//! Only ids that decode back to exactly the reply's text are kept ([`exact_ids`]): a reply cut by a stop
//! string, or ending in an end-of-turn token, keeps the longest prefix of its ids that spells the text,
//! or nothing when the text ends inside a token (its next turn is then tokenized from text).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::tokenizer::Tokenizer;

/// The shortest prefix of `ids` whose bytes are exactly `text` (with the gateway's tokenizer), or
/// `None` when no prefix is: the ids of a reply whose text ends inside a token, or that differ from it.
pub fn exact_ids<'a>(tokenizer: &Tokenizer, text: &str, ids: &'a [u32]) -> Option<&'a [u32]> {
    let target = text.as_bytes();
    if target.is_empty() {
        return None;
    }
    let mut matched = 0;
    for (count, &id) in ids.iter().enumerate() {
        if matched == target.len() {
            return Some(&ids[..count]);
        }
        let bytes = tokenizer.token_bytes(id).ok()?;
        if !target[matched..].starts_with(bytes) {
            return None;
        }
        matched += bytes.len();
    }
    (matched == target.len()).then_some(ids)
}

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
    fn only_ids_that_spell_the_text_exactly() {
        let tokenizer = Tokenizer::builtin();
        let ids = tokenizer.encode("Hello world. Goodbye now<|endoftext|>");
        let hello = tokenizer.encode("Hello world.");
        assert_eq!(exact_ids(&tokenizer, "Hello world.", &ids), Some(&hello[..]));
        let all = &ids[..ids.len() - 1];
        assert_eq!(exact_ids(&tokenizer, "Hello world. Goodbye now", &ids), Some(all));
        assert_eq!(exact_ids(&tokenizer, "Hello world. Goodbye now", all), Some(all));
        // The text ends inside a token, or is not what the ids spell.
        assert_eq!(exact_ids(&tokenizer, "Hello wor", &ids), None);
        assert_eq!(exact_ids(&tokenizer, "Hello there", &ids), None);
        assert_eq!(exact_ids(&tokenizer, "Hello world. Goodbye now and more", all), None);
        assert_eq!(exact_ids(&tokenizer, "", &ids), None);
        assert_eq!(exact_ids(&tokenizer, "x", &[u32::MAX]), None);
    }

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

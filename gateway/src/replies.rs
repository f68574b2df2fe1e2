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

use std::sync::Arc;

use crate::chat::{LruTokenCache, TokenRunCache};
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

/// Token ids a gateway's [`ReplyMemory`] holds at most: 1 Mi ids, 4 MiB.
pub const DEFAULT_REPLY_MEMORY_TOKENS: usize = 1 << 20;

/// Reply text -> generated token ids: an LRU bounded by total tokens, keyed by the text's digest.
pub struct ReplyMemory {
    cache: LruTokenCache,
}

impl std::fmt::Debug for ReplyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyMemory").field("replies", &self.cache.len()).finish()
    }
}

fn key(text: &str) -> [u8; 32] {
    *blake3::hash(text.as_bytes()).as_bytes()
}

impl ReplyMemory {
    pub fn new(max_tokens: usize) -> ReplyMemory {
        ReplyMemory { cache: LruTokenCache::new(max_tokens) }
    }

    /// Records that `text` was generated as `ids`.
    pub fn remember(&self, text: &str, ids: &[u32]) {
        if !ids.is_empty() {
            self.cache.insert(key(text), ids.into());
        }
    }

    /// The ids `text` was generated as, if this gateway generated it.
    pub fn recall(&self, text: &str) -> Option<Arc<[u32]>> {
        self.cache.get(&key(text))
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

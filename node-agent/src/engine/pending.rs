//! Blocks the engine has been asked to compute and has not computed yet: the prompt blocks of queued
//! sequences and of running ones still in prefill. A request that arrives behind another with the same
//! prefix will find that prefix computed by the time its turn comes, so the work queued ahead of a new
//! request counts each such block once ([`super::Engine::admission_refusal`]).

use kvroute_proto::BlockHash;
use kvroute_proto::block_hash::BlockHashMap;

/// A multiset of block hashes (a prefix two queued requests share counts twice until both are done).
#[derive(Debug, Default)]
pub struct PendingBlocks {
    counts: BlockHashMap<u32>,
}

impl PendingBlocks {
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.counts.contains_key(hash)
    }

    pub fn add(&mut self, hashes: &[BlockHash]) {
        for hash in hashes {
            *self.counts.entry(*hash).or_insert(0) += 1;
        }
    }

    /// Takes back what [`PendingBlocks::add`] added.
    pub fn remove(&mut self, hashes: &[BlockHash]) {
        for hash in hashes {
            if let Some(count) = self.counts.get_mut(hash) {
                *count -= 1;
                if *count == 0 {
                    self.counts.remove(hash);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(byte: u8) -> BlockHash {
        BlockHash([byte; 16])
    }

    #[test]
    fn a_block_stays_pending_until_every_sequence_that_added_it_removed_it() {
        let mut pending = PendingBlocks::default();
        pending.add(&[hash(1), hash(2)]);
        pending.add(&[hash(1)]);
        pending.remove(&[hash(1), hash(2)]);
        assert!(pending.contains(&hash(1)) && !pending.contains(&hash(2)));
        pending.remove(&[hash(1)]);
        assert!(pending.is_empty());
        pending.remove(&[hash(3)]);
        assert!(pending.is_empty(), "removing what was never added changes nothing");
    }
}

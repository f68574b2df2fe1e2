//! G2: a byte-bounded host-RAM tier of KV blocks, least recently used first out.
//!
//! Synchronous and deterministic (the engine thread owns it, the simulator
//! replays it). Blocks swapped out by preemption are charged to the same byte
//! budget through [`HostTier::reserve`], so host memory has one bound.

use std::sync::Arc;

use kvroute_proto::block_hash::{BlockHash, BlockHashMap};

use crate::lru::LruOrder;

/// A block's stored bytes, shared without copying between tiers.
pub type BlockBytes = Arc<Vec<u8>>;

/// Host-RAM block cache with an exact byte bound.
pub struct HostTier {
    capacity: u64,
    used: u64,
    reserved: u64,
    /// Each stored block's slot.
    entries: BlockHashMap<u32>,
    /// Stored blocks by slot; `None` for a vacant slot.
    slots: Vec<Option<(BlockHash, BlockBytes)>>,
    vacant: Vec<u32>,
    /// Occupied slots, least recently used first.
    order: LruOrder,
}

impl std::fmt::Debug for HostTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTier")
            .field("capacity", &self.capacity)
            .field("used", &self.used)
            .field("reserved", &self.reserved)
            .field("blocks", &self.entries.len())
            .finish()
    }
}

impl HostTier {
    pub fn new(capacity_bytes: u64) -> HostTier {
        HostTier {
            capacity: capacity_bytes,
            used: 0,
            reserved: 0,
            entries: BlockHashMap::default(),
            slots: Vec::new(),
            vacant: Vec::new(),
            order: LruOrder::new(0),
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by cached blocks.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Bytes held by swapped-out sequences.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.entries.contains_key(hash)
    }

    /// Every cached hash (for a snapshot).
    pub fn hashes(&self) -> Vec<BlockHash> {
        self.entries.keys().copied().collect()
    }

    /// Stores a block, evicting least recently used blocks to make room;
    /// returns the evicted blocks (oldest first). A block larger than the
    /// whole budget is not stored.
    pub fn insert(&mut self, hash: BlockHash, bytes: BlockBytes) -> Vec<(BlockHash, BlockBytes)> {
        let size = bytes.len() as u64;
        if size + self.reserved > self.capacity {
            return Vec::new();
        }
        self.remove(&hash);
        let evicted = self.make_room(size);
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some((hash, bytes));
                slot
            }
            None => {
                self.slots.push(Some((hash, bytes)));
                (self.slots.len() - 1) as u32
            }
        };
        self.order.push_back(slot);
        self.entries.insert(hash, slot);
        self.used += size;
        evicted
    }

    /// A block's bytes, marking it most recently used.
    pub fn get(&mut self, hash: &BlockHash) -> Option<BlockBytes> {
        let slot = *self.entries.get(hash)?;
        self.order.push_back(slot);
        self.slots[slot as usize].as_ref().map(|(_, bytes)| bytes.clone())
    }

    pub fn remove(&mut self, hash: &BlockHash) -> bool {
        let Some(slot) = self.entries.remove(hash) else { return false };
        self.order.remove(slot);
        if let Some((_, bytes)) = self.slots[slot as usize].take() {
            self.used -= bytes.len() as u64;
        }
        self.vacant.push(slot);
        true
    }

    /// Charges `bytes` of swapped-out data to the budget, evicting cached
    /// blocks as needed; fails (changing nothing) when it cannot fit at all.
    pub fn reserve(&mut self, bytes: u64) -> Result<Vec<(BlockHash, BlockBytes)>, u64> {
        if self.reserved + bytes > self.capacity {
            return Err(self.capacity - self.reserved);
        }
        self.reserved += bytes;
        Ok(self.make_room(0))
    }

    /// Returns swapped-out bytes to the budget.
    pub fn unreserve(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_sub(bytes);
    }

    /// Removes every cached block; returns their hashes.
    pub fn clear(&mut self) -> Vec<BlockHash> {
        self.order.clear();
        self.slots.clear();
        self.vacant.clear();
        self.used = 0;
        self.entries.drain().map(|(hash, _)| hash).collect()
    }

    fn make_room(&mut self, incoming: u64) -> Vec<(BlockHash, BlockBytes)> {
        let mut evicted = Vec::new();
        while self.used + self.reserved + incoming > self.capacity {
            let Some(slot) = self.order.pop_front() else { break };
            if let Some((hash, bytes)) = self.slots[slot as usize].take() {
                self.entries.remove(&hash);
                self.used -= bytes.len() as u64;
                self.vacant.push(slot);
                evicted.push((hash, bytes));
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u32) -> BlockHash {
        kvroute_proto::block_hashes(1, "m", b"", &[i])[0]
    }

    fn bytes(len: usize) -> BlockBytes {
        Arc::new(vec![7; len])
    }

    #[test]
    fn byte_bound_holds_and_lru_goes_first() {
        let mut tier = HostTier::new(300);
        assert!(tier.insert(hash(1), bytes(100)).is_empty());
        assert!(tier.insert(hash(2), bytes(100)).is_empty());
        assert!(tier.insert(hash(3), bytes(100)).is_empty());
        assert!(tier.get(&hash(1)).is_some()); // 2 is now the least recent
        let evicted = tier.insert(hash(4), bytes(100));
        assert_eq!(evicted.iter().map(|(h, _)| *h).collect::<Vec<_>>(), vec![hash(2)]);
        assert_eq!(tier.used_bytes(), 300);
        assert!(tier.contains(&hash(1)) && !tier.contains(&hash(2)));
    }

    #[test]
    fn swap_reservations_share_the_budget() {
        let mut tier = HostTier::new(300);
        tier.insert(hash(1), bytes(100));
        tier.insert(hash(2), bytes(100));
        let evicted = tier.reserve(200).unwrap();
        assert_eq!(evicted.len(), 1);
        assert_eq!(tier.used_bytes() + tier.reserved_bytes(), 300);
        assert!(tier.reserve(200).is_err());
        assert!(tier.insert(hash(3), bytes(101)).is_empty());
        assert!(!tier.contains(&hash(3)), "a block that cannot fit beside the reservation is not stored");
        let evicted = tier.insert(hash(4), bytes(100));
        assert_eq!(evicted.len(), 1, "the last cached block makes room");
        tier.unreserve(200);
        assert_eq!(tier.reserved_bytes(), 0);
    }

    #[test]
    fn oversized_blocks_are_not_stored() {
        let mut tier = HostTier::new(50);
        assert!(tier.insert(hash(1), bytes(60)).is_empty());
        assert!(tier.is_empty());
    }
}

//! The shared network tier of a simulated fleet: a byte-bounded store of blocks with Redis's
//! `allkeys-lru` behaviour, and the events the agents would publish about it.

use std::sync::Arc;

use kvroute_node_agent::tiers::host::{BlockBytes, HostTier};
use kvroute_proto::BlockHash;
use kvroute_proto::domain::{KvEvent, Tier};

/// Blocks every replica can reload, least recently used first out: the node-agent's own byte-bounded LRU
/// ([`HostTier`]) holding a one-byte stand-in per block, so its byte budget counts blocks.
#[derive(Debug)]
pub struct NetworkStore {
    blocks: HostTier,
    stand_in: BlockBytes,
    /// Events to publish, by the replica that caused them.
    events: Vec<(u16, KvEvent)>,
}

impl NetworkStore {
    pub fn new(capacity_blocks: usize) -> NetworkStore {
        NetworkStore { blocks: HostTier::new(capacity_blocks as u64), stand_in: Arc::new(vec![0]), events: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// A replica writes a block (a spill from its host tier, or a write-through).
    pub fn put(&mut self, replica: u16, hash: BlockHash) {
        if self.blocks.capacity_bytes() == 0 {
            return;
        }
        let evicted = self.blocks.insert(hash, self.stand_in.clone());
        self.record(replica, Tier::Network, hash, true);
        for (oldest, _) in evicted {
            self.record(replica, Tier::Network, oldest, false);
        }
    }

    /// Leading blocks of `hashes` present, each read (and so made recent).
    pub fn fetch_run(&mut self, hashes: &[BlockHash]) -> usize {
        hashes.iter().take_while(|hash| self.blocks.get(hash).is_some()).count()
    }

    pub fn take_events(&mut self) -> Vec<(u16, KvEvent)> {
        std::mem::take(&mut self.events)
    }

    /// Appends to the last event when it is of the same kind and replica (fewer, larger events).
    fn record(&mut self, replica: u16, tier: Tier, hash: BlockHash, stored: bool) {
        match self.events.last_mut() {
            Some((last, KvEvent::Stored { hashes, .. })) if *last == replica && stored => hashes.push(hash),
            Some((last, KvEvent::Removed { hashes, .. })) if *last == replica && !stored => hashes.push(hash),
            _ if stored => self.events.push((replica, KvEvent::Stored { tier, hashes: vec![hash] })),
            _ => self.events.push((replica, KvEvent::Removed { tier, hashes: vec![hash] })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u8) -> BlockHash {
        BlockHash([i; 16])
    }

    #[test]
    fn least_recently_used_goes_first_and_reads_refresh() {
        let mut store = NetworkStore::new(2);
        store.put(0, hash(1));
        store.put(1, hash(2));
        assert_eq!(store.fetch_run(&[hash(1)]), 1); // 1 is now newer than 2
        store.put(0, hash(3));
        assert_eq!(store.fetch_run(&[hash(1), hash(3)]), 2);
        assert_eq!(store.fetch_run(&[hash(2)]), 0);
        let removed: Vec<KvEvent> = store.take_events().into_iter().map(|(_, event)| event).collect();
        assert!(removed.contains(&KvEvent::Removed { tier: Tier::Network, hashes: vec![hash(2)] }));
    }

    #[test]
    fn a_run_stops_at_the_first_miss_and_an_empty_store_holds_nothing() {
        let mut store = NetworkStore::new(8);
        store.put(0, hash(1));
        store.put(0, hash(3));
        assert_eq!(store.fetch_run(&[hash(1), hash(2), hash(3)]), 1);
        let mut off = NetworkStore::new(0);
        off.put(0, hash(1));
        assert!(off.is_empty() && off.take_events().is_empty());
    }
}

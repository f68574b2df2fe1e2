//! Property: the index's lookup equals a naive reference model over random
//! event sequences (below the cap, so nothing is evicted).
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use kvroute_gateway::routing::{IndexConfig, PrefixIndex, ReplicaId, ReplicaMatch};
use kvroute_proto::domain::{KvEvent, Tier};
use kvroute_proto::{BlockHash, BlockHasher, DEFAULT_BLOCK_SIZE};
use proptest::prelude::*;

/// Ids on both sides of a 64-bit word boundary.
const REPLICAS: [ReplicaId; 5] = [0, 1, 63, 64, 69];
const CHAINS: usize = 6;
const CHAIN_BLOCKS: usize = 8;

fn universe() -> Vec<Vec<BlockHash>> {
    let hasher = BlockHasher::new(DEFAULT_BLOCK_SIZE, "m", b"");
    let block = DEFAULT_BLOCK_SIZE as usize;
    (0..CHAINS)
        .map(|chain| {
            // Chains share their first `chain / 2` blocks pairwise.
            let tokens: Vec<u32> = (0..CHAIN_BLOCKS * block)
                .map(|i| if i / block < chain / 2 { i as u32 } else { (i + 1000 * chain) as u32 })
                .collect();
            hasher.hashes(&tokens)
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Events(usize, Vec<KvEvent>),
    Snapshot(usize, Vec<KvEvent>),
    Remove(usize),
    NetworkUp(usize, bool),
    Pending(usize, usize, usize, u64),
    Lookup(usize, u64),
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Gpu), Just(Tier::Host), Just(Tier::Network)]
}

fn event() -> impl Strategy<Value = KvEvent> {
    let hashes = (0..CHAINS, 0..CHAIN_BLOCKS, 1..=CHAIN_BLOCKS);
    prop_oneof![
        4 => (tier(), hashes.clone()).prop_map(|(tier, (c, s, n))| KvEvent::Stored { tier, hashes: pick(c, s, n) }),
        2 => (tier(), hashes).prop_map(|(tier, (c, s, n))| KvEvent::Removed { tier, hashes: pick(c, s, n) }),
        1 => tier().prop_map(|tier| KvEvent::Cleared { tier }),
    ]
}

fn pick(chain: usize, start: usize, len: usize) -> Vec<BlockHash> {
    let all = &universe()[chain];
    all[start..(start + len).min(CHAIN_BLOCKS)].to_vec()
}

fn op() -> impl Strategy<Value = Op> {
    let replica = 0..REPLICAS.len();
    prop_oneof![
        6 => (replica.clone(), prop::collection::vec(event(), 1..4)).prop_map(|(r, e)| Op::Events(r, e)),
        1 => (replica.clone(), prop::collection::vec(event(), 0..4)).prop_map(|(r, e)| Op::Snapshot(r, e)),
        1 => replica.clone().prop_map(Op::Remove),
        2 => (replica.clone(), any::<bool>()).prop_map(|(r, up)| Op::NetworkUp(r, up)),
        2 => (replica, 0..CHAINS, 1..=CHAIN_BLOCKS, 0..20u64).prop_map(|(r, c, n, t)| Op::Pending(r, c, n, t)),
        4 => (0..CHAINS, 0..25u64).prop_map(|(c, t)| Op::Lookup(c, t)),
    ]
}

/// The reference: sets per replica and tier, reporters per network block.
#[derive(Default)]
struct Model {
    local: HashMap<(ReplicaId, usize), HashSet<BlockHash>>,
    reporters: HashMap<BlockHash, HashSet<ReplicaId>>,
    network_up: HashSet<ReplicaId>,
    pending: HashMap<BlockHash, (ReplicaId, u64)>,
}

impl Model {
    fn apply(&mut self, replica: ReplicaId, event: &KvEvent) {
        match event {
            KvEvent::Stored { tier: Tier::Network, hashes } => {
                for hash in hashes {
                    self.reporters.entry(*hash).or_default().insert(replica);
                }
            }
            KvEvent::Stored { tier, hashes } => {
                self.local.entry((replica, tier.index())).or_default().extend(hashes.iter().copied());
            }
            KvEvent::Removed { tier: Tier::Network, hashes } => {
                for hash in hashes {
                    self.reporters.remove(hash);
                }
            }
            KvEvent::Removed { tier, hashes } => {
                let set = self.local.entry((replica, tier.index())).or_default();
                for hash in hashes {
                    set.remove(hash);
                }
            }
            KvEvent::Cleared { tier: Tier::Network } => self.forget_reports(replica),
            KvEvent::Cleared { tier } => {
                self.local.remove(&(replica, tier.index()));
            }
        }
    }

    fn forget_reports(&mut self, replica: ReplicaId) {
        for reporters in self.reporters.values_mut() {
            reporters.remove(&replica);
        }
    }

    fn snapshot(&mut self, replica: ReplicaId, events: &[KvEvent]) {
        self.local.remove(&(replica, Tier::Gpu.index()));
        self.local.remove(&(replica, Tier::Host.index()));
        let mentions_network = events.iter().any(|event| match event {
            KvEvent::Stored { tier, .. } | KvEvent::Removed { tier, .. } | KvEvent::Cleared { tier } => {
                *tier == Tier::Network
            }
        });
        if mentions_network {
            self.forget_reports(replica);
        }
        for event in events {
            self.apply(replica, event);
        }
    }

    fn remove(&mut self, replica: ReplicaId) {
        self.local.remove(&(replica, Tier::Gpu.index()));
        self.local.remove(&(replica, Tier::Host.index()));
        self.forget_reports(replica);
        self.network_up.remove(&replica);
        self.pending.retain(|_, (holder, _)| *holder != replica);
    }

    fn has(&self, replica: ReplicaId, tier: Tier, hash: &BlockHash) -> bool {
        self.local.get(&(replica, tier.index())).is_some_and(|set| set.contains(hash))
    }

    fn lookup(&self, replica: ReplicaId, hashes: &[BlockHash], now: u64) -> ReplicaMatch {
        let gpu = |hash: &BlockHash| {
            self.has(replica, Tier::Gpu, hash)
                || self.pending.get(hash).is_some_and(|&(holder, expiry)| holder == replica && expiry > now)
        };
        let local = |hash: &BlockHash| gpu(hash) || self.has(replica, Tier::Host, hash);
        let network = |hash: &BlockHash| {
            self.network_up.contains(&replica)
                && self.reporters.get(hash).is_some_and(|set| set.iter().any(|r| self.network_up.contains(r)))
        };
        let g = hashes.iter().take_while(|h| gpu(h)).count();
        let l = g + hashes[g..].iter().take_while(|h| local(h)).count();
        let n = l + hashes[l..].iter().take_while(|h| local(h) || network(h)).count();
        ReplicaMatch { gpu_blocks: g as u32, host_blocks: (l - g) as u32, network_blocks: (n - l) as u32 }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lookup_matches_the_reference(ops in prop::collection::vec(op(), 1..40)) {
        let chains = universe();
        let index =
            PrefixIndex::new(IndexConfig { max_entries: 4_096, max_replicas: 70, pending_slots: 1 << 16 }).unwrap();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Events(r, events) => {
                    index.apply_events(REPLICAS[r], &events).unwrap();
                    for event in &events {
                        model.apply(REPLICAS[r], event);
                    }
                }
                Op::Snapshot(r, events) => {
                    index.apply_snapshot(REPLICAS[r], &events).unwrap();
                    model.snapshot(REPLICAS[r], &events);
                }
                Op::Remove(r) => {
                    index.remove_replica(REPLICAS[r]).unwrap();
                    model.remove(REPLICAS[r]);
                }
                Op::NetworkUp(r, up) => {
                    index.set_network_tier_up(REPLICAS[r], up).unwrap();
                    if up { model.network_up.insert(REPLICAS[r]); } else { model.network_up.remove(&REPLICAS[r]); }
                }
                Op::Pending(r, c, n, now) => {
                    index.add_pending(REPLICAS[r], &chains[c][..n], now, 5);
                    for hash in &chains[c][..n] {
                        model.pending.insert(*hash, (REPLICAS[r], now + 5));
                    }
                }
                Op::Lookup(c, now) => {
                    let result = index.lookup(&chains[c], now);
                    for replica in REPLICAS {
                        prop_assert_eq!(result.get(replica), model.lookup(replica, &chains[c], now), "replica {}", replica);
                    }
                }
            }
        }
        // Entries without any holder are deleted, so the count matches too.
        let held: HashSet<BlockHash> = model
            .local
            .values()
            .flatten()
            .copied()
            .chain(model.reporters.iter().filter(|(_, set)| !set.is_empty()).map(|(hash, _)| *hash))
            .collect();
        prop_assert_eq!(index.len(), held.len());
    }
}

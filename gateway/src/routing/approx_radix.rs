//! `approx_radix`: SGLang's cache-aware router as a baseline: the `cache_aware` policy of sglang-router 0.3.2
//! (PyPI; the `smg` gateway, sgl-project/sglang `sgl-model-gateway/src/policies/cache_aware.rs`, its approximate
//! tree in `policies/tree.rs`), with the defaults `smg launch --help` prints: cache threshold 0.3, balance
//! thresholds 64 and 1.5 (see `ScoringConfig`); the peer also trims each worker's tree to 2^26 characters every
//! 60 s. It guesses what each replica holds from this gateway's own routing history, not from events. When loads
//! are imbalanced (`max - min > abs` and `max > rel * min`) it takes the least loaded replica; otherwise the
//! replica with the longest remembered prefix when that prefix's share of the prompt exceeds the cache threshold,
//! else the least loaded replica (0.3.2's rule since sgl-project/sglang#14650, December 2025; before it, the
//! worker with the smallest tree). The peer matches characters of the request text where this matches blocks,
//! and counts its own in-flight requests as a worker's load where this reads waiting plus running.
//!
//! The tree is keyed by chained block hashes: a block's hash names its whole
//! prefix, so the map from hash to holders is exactly a trie of blocks. It is
//! bounded to `max_blocks` (block, replica) pairs, evicting the least recently
//! routed first.

use std::collections::{HashMap, VecDeque};

use kvroute_proto::{BlockHash, BlockHashMap};

use super::ReplicaId;
use super::index::LookupResult;
use super::policy_kind::PolicyKind;
use super::rng::RandomSource;
use super::scoring::{Decision, ReplicaView, RouteRequest, ScoringConfig, candidates, least_loaded_index};

/// The routing history: which replica each prefix block was sent to, and when.
#[derive(Clone, Debug, Default)]
pub struct RadixHistory {
    /// Block -> (replica, tick of its last routing).
    nodes: BlockHashMap<Vec<(ReplicaId, u64)>>,
    /// Blocks attributed to each replica.
    sizes: HashMap<ReplicaId, usize>,
    /// Touches in tick order; records made stale by a later touch are skipped.
    recency: VecDeque<(BlockHash, ReplicaId, u64)>,
    tick: u64,
    pairs: usize,
    max_blocks: usize,
}

impl RadixHistory {
    pub fn new(max_blocks: usize) -> RadixHistory {
        RadixHistory { max_blocks, ..RadixHistory::default() }
    }

    /// (block, replica) pairs held.
    pub fn len(&self) -> usize {
        self.pairs
    }

    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }

    /// Blocks attributed to `replica`.
    pub fn size_of(&self, replica: ReplicaId) -> usize {
        self.sizes.get(&replica).copied().unwrap_or(0)
    }

    /// Leading blocks of `hashes` remembered for `replica`.
    pub fn matched(&self, hashes: &[BlockHash], replica: ReplicaId) -> usize {
        hashes
            .iter()
            .take_while(|hash| {
                self.nodes.get(hash).is_some_and(|holders| holders.iter().any(|&(holder, _)| holder == replica))
            })
            .count()
    }

    /// Records that `hashes` were routed to `replica`.
    pub fn insert(&mut self, hashes: &[BlockHash], replica: ReplicaId) {
        if self.max_blocks == 0 {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        for hash in hashes {
            let holders = self.nodes.entry(*hash).or_default();
            match holders.iter_mut().find(|(holder, _)| *holder == replica) {
                Some(entry) => entry.1 = tick,
                None => {
                    holders.push((replica, tick));
                    *self.sizes.entry(replica).or_default() += 1;
                    self.pairs += 1;
                }
            }
            self.recency.push_back((*hash, replica, tick));
        }
        while self.pairs > self.max_blocks {
            let Some((hash, replica, tick)) = self.recency.pop_front() else { break };
            self.evict_if_current(hash, replica, tick);
        }
        if self.recency.len() > 2 * self.pairs.max(1024) {
            self.compact();
        }
    }

    /// Forgets everything routed to `replica` (it left; its id may name another replica later).
    pub fn remove_replica(&mut self, replica: ReplicaId) {
        let mut removed = 0;
        self.nodes.retain(|_, holders| {
            let before = holders.len();
            holders.retain(|&(holder, _)| holder != replica);
            removed += before - holders.len();
            !holders.is_empty()
        });
        self.pairs -= removed;
        self.sizes.remove(&replica);
        self.compact();
    }

    /// Removes (hash, replica) when `tick` is still its latest touch.
    fn evict_if_current(&mut self, hash: BlockHash, replica: ReplicaId, tick: u64) {
        let Some(holders) = self.nodes.get_mut(&hash) else { return };
        let Some(position) = holders.iter().position(|&(holder, last)| holder == replica && last == tick) else {
            return;
        };
        holders.swap_remove(position);
        if holders.is_empty() {
            self.nodes.remove(&hash);
        }
        if let Some(size) = self.sizes.get_mut(&replica) {
            *size = size.saturating_sub(1);
        }
        self.pairs -= 1;
    }

    /// Rebuilds the recency queue from the live pairs.
    fn compact(&mut self) {
        let mut live: Vec<(BlockHash, ReplicaId, u64)> = self
            .nodes
            .iter()
            .flat_map(|(hash, holders)| holders.iter().map(move |&(replica, tick)| (*hash, replica, tick)))
            .collect();
        live.sort_unstable_by_key(|&(hash, replica, tick)| (tick, hash, replica));
        self.recency = live.into();
    }

    pub fn decide(
        &self,
        request: &RouteRequest<'_>,
        replicas: &[ReplicaView],
        lookup: &LookupResult,
        config: &ScoringConfig,
        rng: &mut dyn RandomSource,
    ) -> Decision {
        let mut lines = candidates(request, replicas, lookup, config);
        let eligible: Vec<usize> = (0..replicas.len()).filter(|&index| lines[index].excluded.is_none()).collect();
        let mut decision = Decision {
            policy: PolicyKind::ApproxRadix.name(),
            chosen: None,
            rule: "no_eligible_replica",
            candidates: Vec::new(),
        };
        let loads: Vec<u64> = eligible.iter().map(|&index| replicas[index].requests()).collect();
        let (Some(&most), Some(&least)) = (loads.iter().max(), loads.iter().min()) else {
            decision.candidates = lines;
            return decision;
        };
        let imbalanced = most - least > config.radix_balance_abs_threshold
            && most as f64 > config.radix_balance_rel_threshold * least as f64;
        let (chosen, rule) = if imbalanced {
            for (line, view) in lines.iter_mut().zip(replicas) {
                line.policy_score = view.requests() as f64;
            }
            (least_loaded_index(&eligible, replicas, rng), "imbalanced_least_loaded")
        } else {
            let blocks = request.hashes.len();
            let matched: Vec<usize> =
                eligible.iter().map(|&index| self.matched(request.hashes, replicas[index].id)).collect();
            let best = matched.iter().copied().max().unwrap_or(0);
            let ratio = if blocks == 0 { 0.0 } else { best as f64 / blocks as f64 };
            if ratio > config.radix_cache_threshold {
                for (&index, &count) in eligible.iter().zip(&matched) {
                    lines[index].policy_score = -(count as f64);
                }
                let holders: Vec<usize> = eligible
                    .iter()
                    .zip(&matched)
                    .filter(|&(_, &count)| count == best)
                    .map(|(&index, _)| index)
                    .collect();
                (least_loaded_index(&holders, replicas, rng), "history_match")
            } else {
                for (line, view) in lines.iter_mut().zip(replicas) {
                    line.policy_score = view.requests() as f64;
                }
                (least_loaded_index(&eligible, replicas, rng), "miss_least_loaded")
            }
        };
        decision.chosen = chosen.map(|index| replicas[index].id);
        decision.rule = if decision.chosen.is_some() { rule } else { "no_eligible_replica" };
        decision.candidates = lines;
        decision
    }
}

//! `prefix_hash`: consistent hashing of the prompt's leading blocks with bounded loads (Mirrokni, Thorup and
//! Zadimoghaddam, SODA 2018): walk the ring from the key and take the first eligible replica whose in-flight
//! requests (waiting plus running) are below `ceil(c * (total + 1) / replicas)`, else the least loaded. The key is
//! the chain hash of the last of the first `prefix_hash_blocks` (4) full blocks; each replica has
//! `prefix_hash_virtual_nodes` (160, as vllm-router's `consistent_hash`) ring points; c is
//! `prefix_hash_load_factor` (1.25). Routers with this policy: KubeAI's `PrefixHash` strategy
//! (substratusai/kubeai `internal/loadbalancer/balance_chwbl.go`, defaults in `api/v1/model_types.go`: 125 %, 256
//! ring points, the first 100 characters) walks the ring the same way but admits a load `L` only when
//! `L + 1 <= c * (total + 1) / n`, and keeps the owner when none qualifies; sglang-router 0.3.2's `prefix_hash`
//! (sgl-project/sglang `sgl-model-gateway/src/policies/prefix_hash.rs`: the first 256 tokens, 1.25, 150 ring
//! points) admits `L <= c * (total + 1) / n` and past the owner takes the least loaded worker within the bound
//! instead of walking on.

use super::ReplicaId;
use super::index::LookupResult;
use super::policy_kind::PolicyKind;
use super::rng::{RandomSource, mix64};
use super::scoring::{Decision, ReplicaView, RouteRequest, ScoringConfig, candidates, least_loaded_index};

/// Ring points of a set of replicas.
#[derive(Clone, Debug)]
pub struct HashRing {
    /// The sorted ids the ring was built for.
    members: Vec<ReplicaId>,
    /// (position, replica), sorted by position.
    points: Vec<(u64, ReplicaId)>,
}

impl HashRing {
    pub fn new(replicas: &[ReplicaView], virtual_nodes: usize) -> HashRing {
        let mut members: Vec<ReplicaId> = replicas.iter().map(|view| view.id).collect();
        members.sort_unstable();
        members.dedup();
        let per_replica = virtual_nodes.max(1);
        let mut points = Vec::with_capacity(members.len() * per_replica);
        for &id in &members {
            let base = mix64(u64::from(id) ^ 0x6B76_726F_7574_6531);
            for node in 0..per_replica {
                points.push((mix64(base ^ mix64(node as u64)), id));
            }
        }
        points.sort_unstable();
        HashRing { members, points }
    }

    /// Whether the ring was built for exactly these replica ids.
    pub fn serves(&self, replicas: &[ReplicaView]) -> bool {
        replicas.len() == self.members.len() && replicas.iter().all(|view| self.members.binary_search(&view.id).is_ok())
    }

    /// The ring key of a request: the hash of its last leading block (a chain
    /// hash names the whole prefix), else its session key.
    fn key(request: &RouteRequest<'_>, config: &ScoringConfig) -> Option<u64> {
        let leading = request.hashes.len().min(config.prefix_hash_blocks.max(1));
        match leading.checked_sub(1) {
            Some(last) => Some(request.hashes[last].low_u64()),
            None => request.session_key.map(mix64),
        }
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
            policy: PolicyKind::PrefixHash.name(),
            chosen: None,
            rule: "no_eligible_replica",
            candidates: Vec::new(),
        };
        if eligible.is_empty() {
            decision.candidates = lines;
            return decision;
        }
        let Some(key) = HashRing::key(request, config) else {
            let chosen = least_loaded_index(&eligible, replicas, rng);
            for line in &mut lines {
                line.policy_score = 0.0;
            }
            decision.chosen = chosen.map(|index| replicas[index].id);
            decision.rule = "no_key_least_loaded";
            decision.candidates = lines;
            return decision;
        };
        let total: u64 = eligible.iter().map(|&index| replicas[index].requests()).sum();
        let capacity = (config.prefix_hash_load_factor * (total + 1) as f64 / eligible.len() as f64).ceil() as u64;
        let start = self.points.partition_point(|&(position, _)| position < key);
        // Walk order of distinct eligible replicas from the key.
        let mut order: Vec<usize> = Vec::with_capacity(eligible.len());
        for step in 0..self.points.len() {
            let (_, id) = self.points[(start + step) % self.points.len()];
            if let Some(&index) = eligible.iter().find(|&&index| replicas[index].id == id)
                && !order.contains(&index)
            {
                order.push(index);
                if order.len() == eligible.len() {
                    break;
                }
            }
        }
        let first_fit = order.iter().position(|&index| replicas[index].requests() < capacity);
        for line in &mut lines {
            line.policy_score = f64::INFINITY;
        }
        for (rank, &index) in order.iter().enumerate() {
            let over = replicas[index].requests() >= capacity;
            lines[index].policy_score = rank as f64 + if over { order.len() as f64 } else { 0.0 };
        }
        let (chosen, rule) = match first_fit {
            Some(0) => (Some(order[0]), "ring_owner"),
            Some(rank) => (Some(order[rank]), "bounded_load_overflow"),
            None => (least_loaded_index(&eligible, replicas, rng), "all_over_capacity_least_loaded"),
        };
        decision.chosen = chosen.map(|index| replicas[index].id);
        decision.rule = rule;
        decision.candidates = lines;
        decision
    }
}

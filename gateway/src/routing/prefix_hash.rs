//! `prefix_hash`: sglang-router 0.3.2's `prefix_hash` policy (sgl-project/sglang
//! `sgl-model-gateway/src/policies/prefix_hash.rs`, its ring in `core/`): consistent hashing of the prompt's
//! first `prefix_hash_tokens` (256) tokens with bounded loads. The key's owner on the ring (150 points per
//! replica) takes the request while its load `L` is at most `c * (total + 1) / replicas` (c =
//! `prefix_hash_load_factor`, 1.25; no load at all is always within); otherwise the least loaded replica within
//! that bound (the first of equals, in replica order); when none is within it, the owner anyway. Load is a
//! replica's waiting plus running requests (the peer counts its own in-flight requests). The peer hashes the
//! first 256 tokens with xxh3, partial blocks included; here the key is the chain hash of the last whole block
//! among them, which names the same prefix, and a prompt without a whole block uses its session key (the peer
//! routes a request without tokens nowhere). KubeAI's `PrefixHash` (substratusai/kubeai
//! `internal/loadbalancer/balance_chwbl.go`: 125%, 256 ring points, the first 100 characters) bounds the load
//! the same way but walks the ring past an overloaded owner.

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

    /// The ring key of a request: the hash of the last whole block within its first `prefix_hash_tokens`
    /// tokens (a chain hash names the whole prefix), else its session key.
    fn key(request: &RouteRequest<'_>, block_size: u32, config: &ScoringConfig) -> Option<u64> {
        let leading = request.hashes.len().min((config.prefix_hash_tokens / block_size.max(1) as usize).max(1));
        match leading.checked_sub(1) {
            Some(last) => Some(request.hashes[last].low_u64()),
            None => request.session_key.map(mix64),
        }
    }

    /// The ring's owner of `key` among the `eligible` indices of `replicas`.
    fn owner(&self, key: u64, replicas: &[ReplicaView], eligible: &[usize]) -> Option<usize> {
        let start = self.points.partition_point(|&(position, _)| position < key);
        (0..self.points.len()).find_map(|step| {
            let (_, id) = self.points[(start + step) % self.points.len()];
            eligible.iter().copied().find(|&index| replicas[index].id == id)
        })
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
        let block_size = replicas[eligible[0]].block_size;
        let key = HashRing::key(request, block_size, config);
        let Some(owner) = key.and_then(|key| self.owner(key, replicas, &eligible)) else {
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
        let bound = config.prefix_hash_load_factor * (total + 1) as f64 / eligible.len() as f64;
        let within = |index: usize| total == 0 || replicas[index].requests() as f64 <= bound;
        for line in &mut lines {
            line.policy_score = f64::INFINITY;
        }
        for &index in &eligible {
            lines[index].policy_score = if index == owner { 0.0 } else { 1.0 + replicas[index].requests() as f64 }
                + if within(index) { 0.0 } else { 1e12 };
        }
        let (chosen, rule) = if within(owner) {
            (owner, "ring_owner")
        } else {
            match eligible
                .iter()
                .copied()
                .filter(|&index| within(index))
                .min_by_key(|&index| replicas[index].requests())
            {
                Some(index) => (index, "bounded_load_overflow"),
                None => (owner, "all_over_the_bound_owner"),
            }
        };
        let chosen = Some(chosen);
        decision.chosen = chosen.map(|index| replicas[index].id);
        decision.rule = rule;
        decision.candidates = lines;
        decision
    }
}

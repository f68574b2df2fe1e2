//! One tenant's state: the block hashes it sent recently (for where each prompt diverges and the
//! repeated-prefix fraction), its recent prompts (for the detectors), its traffic window and its diagnoses.

use std::collections::VecDeque;

use super::chain::{Chainer, digest, tokens_digest};
use super::compare::{Divergence, common_prefix, compare_from};
use super::diagnosis::{Change, Diagnoses, Difference, Kind};
use super::seen::SeenBlocks;
use super::window::{Counters, Window, divergence_bucket};
use super::{DoctorConfig, Observation, detect};
use crate::routing::Millis;

/// Tokens of context shown before a difference, and tokens shown of content that does not realign.
pub const CONTEXT_TOKENS: usize = 16;
pub const SHOWN_TOKENS: usize = 24;

/// How a prompt compared with the tenant's recent prompts.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Against the recent prompt it shares the longest prefix with (None: the first prompt).
    pub best: Option<Divergence>,
    pub best_text: Option<Difference>,
    /// For a [`Divergence::Span`]: a digest of the prompt up to the span's end (the varying content and all
    /// before it), which tells the values of the varying content apart.
    pub best_variant: Option<u64>,
    /// For a prompt with a `user`: against the closest prompt of another user...
    pub cross_user: Option<Divergence>,
    pub cross_user_text: Option<Difference>,
    /// ...and the tokens it shares with the closest earlier prompt of the same user.
    pub same_user_prefix: Option<usize>,
}

/// A recent prompt.
#[derive(Clone, Debug)]
pub struct Recent {
    pub seq: u64,
    pub at: Millis,
    pub user: Option<u64>,
    /// Its first `head_tokens` tokens...
    pub head: Vec<u32>,
    /// ...and their blocks' chain hashes.
    pub chain: Vec<u64>,
    /// Tokens the routing decision found cached for it.
    pub matched_tokens: u64,
    pub outcome: Outcome,
}

/// A tenant's state.
#[derive(Debug)]
pub struct TenantState {
    pub name: String,
    seen: SeenBlocks,
    pub window: Window,
    pub recent: VecDeque<Recent>,
    pub diagnoses: Diagnoses,
    /// When its last prompt arrived (for evicting the least recently seen tenant).
    pub last_seen: Millis,
    seq: u64,
}

/// What observing one prompt gave.
#[derive(Debug, Default)]
pub struct Observed {
    /// Where the prompt left the tenant's longest previously seen prefix (None: nowhere in its tracked blocks).
    pub divergence_block: Option<u32>,
    /// The prompt varies near the top while its tenant is diagnosed so (the prefix-churn counter).
    pub churned: bool,
    pub changes: Vec<Change>,
    /// The chain, ready to go on with the reply.
    pub chainer: Option<Chainer>,
}

impl TenantState {
    pub fn new(name: &str, config: &DoctorConfig, now: Millis) -> TenantState {
        TenantState {
            name: name.to_string(),
            seen: SeenBlocks::new(config.seen_blocks, config.window_ms, now),
            window: Window::new(config.window_ms, config.window_slots),
            recent: VecDeque::with_capacity(config.recent_prompts),
            diagnoses: Diagnoses::default(),
            last_seen: now,
            seq: 0,
        }
    }

    /// Observes one prompt: where it diverges, how it compares with the recent prompts, what the detectors
    /// find. `fleet` gets the same counts as the tenant's window.
    pub fn observe(
        &mut self,
        now: Millis,
        observation: &Observation<'_>,
        config: &DoctorConfig,
        fleet: &mut Window,
    ) -> Observed {
        self.last_seen = now;
        self.seq += 1;
        let tokens = observation.tokens;
        let block_size = config.block_size.max(1);
        let mut chainer = Chainer::new(observation.scope, block_size, config.tracked_blocks);
        let mut chain = Vec::with_capacity(tokens.len() / block_size);
        chainer.push(tokens, &mut chain);
        let seen = self.seen.seen_prefix(&chain);
        let divergence_block = (seen < chain.len() || chain.is_empty()).then_some(seen as u32);
        self.seen.insert(now, &chain);
        let prompt_len = observation.prompt_len.max(tokens.len());
        let tracked = prompt_len.min(config.tracked_blocks * block_size) as u64;
        let counters = Counters {
            requests: 1,
            prompt_tokens: prompt_len as u64,
            tracked_tokens: tracked,
            repeated_tokens: ((seen * block_size) as u64).min(tracked),
            matched: observation.matched.map(|tokens| tokens.min(prompt_len as u64)),
            ..Counters::default()
        };
        let bucket = divergence_bucket(divergence_block);
        for window in [&mut self.window, fleet] {
            window.record(now, |total| {
                total.add(&counters);
                total.divergence[bucket] += 1;
            });
        }

        while self.recent.front().is_some_and(|oldest| {
            self.recent.len() >= config.recent_prompts || oldest.at.saturating_add(config.window_ms) < now
        }) {
            self.recent.pop_front();
        }
        let head = &tokens[..tokens.len().min(config.head_tokens)];
        let head_chain = &chain[..(head.len() / block_size).min(chain.len())];
        let user = observation.user.map(|user| digest(user.as_bytes()));
        let outcome = compare_with_recent(head, head_chain, user, &self.recent, config);
        self.recent.push_back(Recent {
            seq: self.seq,
            at: now,
            user,
            head: head.to_vec(),
            chain: head_chain.to_vec(),
            matched_tokens: counters.matched.iter().sum(),
            outcome,
        });

        let found = detect::all(&self.recent, config);
        let changes =
            self.diagnoses.update(&self.name, now, found, config.thresholds.resolve_after, config.change_hold_ms);
        let churned = self.diagnoses.get(Kind::VaryingTop).is_some_and(|active| {
            matches!(self.recent.back().and_then(|recent| recent.outcome.best), Some(Divergence::Span { at, .. })
                if at / block_size == active.finding.block as usize)
        });
        Observed { divergence_block, churned, changes, chainer: Some(chainer) }
    }

    /// Remembers the blocks of a reply (the replica caches them: the next turn reuses them).
    pub fn remember(&mut self, now: Millis, chain: &[u64]) {
        self.seen.insert(now, chain);
    }

    /// Bytes it holds, roughly.
    pub fn memory_bytes(&self) -> usize {
        let recent: usize = self
            .recent
            .iter()
            .map(|recent| {
                let texts = [&recent.outcome.best_text, &recent.outcome.cross_user_text];
                let text: usize = texts
                    .iter()
                    .filter_map(|text| text.as_ref())
                    .map(|text| text.context.len() + text.current.len() + text.previous.len())
                    .sum();
                std::mem::size_of::<Recent>() + 4 * (recent.head.capacity() + text) + 8 * recent.chain.capacity()
            })
            .sum();
        std::mem::size_of::<TenantState>() + self.name.len() + self.seen.memory_bytes() + recent
    }

    /// The most bytes a tenant can take under `config` (its name aside).
    pub fn max_memory_bytes(config: &DoctorConfig) -> usize {
        let head_blocks = config.head_tokens / config.block_size.max(1);
        let text = 2 * (CONTEXT_TOKENS + 2 * config.compare.max_span.max(SHOWN_TOKENS));
        let recent = std::mem::size_of::<Recent>() + 4 * (config.head_tokens + text) + 8 * head_blocks;
        std::mem::size_of::<TenantState>()
            + SeenBlocks::max_memory_bytes(config.seen_blocks)
            + config.recent_prompts * recent
    }
}

/// Compares a prompt's head (and its blocks' `chain`) with the recent prompts: the closest overall, and for a
/// prompt with a user the closest of another user and of the same user. Closest: the longest common prefix,
/// the newest on ties; equal chain hashes skip whole blocks of the comparison.
fn compare_with_recent(
    head: &[u32],
    chain: &[u64],
    user: Option<u64>,
    recent: &VecDeque<Recent>,
    config: &DoctorConfig,
) -> Outcome {
    let block_size = config.block_size.max(1);
    let mut best: Option<(usize, &Recent)> = None;
    let mut same: Option<usize> = None;
    let mut other: Option<(usize, &Recent)> = None;
    for earlier in recent.iter().rev() {
        let blocks = chain.iter().zip(&earlier.chain).take_while(|(a, b)| a == b).count();
        let from = (blocks * block_size).min(head.len()).min(earlier.head.len());
        let shared = from + common_prefix(&head[from..], &earlier.head[from..]);
        if best.is_none_or(|(longest, _)| shared > longest) {
            best = Some((shared, earlier));
        }
        if user.is_some() {
            if earlier.user == user {
                same = Some(same.map_or(shared, |longest| longest.max(shared)));
            } else if other.is_none_or(|(longest, _)| shared > longest) {
                other = Some((shared, earlier));
            }
        }
    }
    let against = |(shared, earlier): (usize, &Recent)| {
        let divergence = compare_from(head, &earlier.head, shared, &config.compare);
        (divergence, difference(head, &earlier.head, &divergence))
    };
    let (best, best_text) = best.map(against).map_or((None, None), |(d, text)| (Some(d), text));
    let best_variant = match best {
        Some(Divergence::Span { at, current, .. }) => head.get(..at + current).map(tokens_digest),
        _ => None,
    };
    let (cross_user, cross_user_text) = other.map(against).map_or((None, None), |(d, text)| (Some(d), text));
    Outcome { best, best_text, best_variant, cross_user, cross_user_text, same_user_prefix: same }
}

/// The tokens behind a divergence: the context before it and how each prompt goes on (the differing spans
/// of a [`Divergence::Span`], else their first tokens).
pub fn difference(current: &[u32], previous: &[u32], divergence: &Divergence) -> Option<Difference> {
    let (at, current_len, previous_len) = match *divergence {
        Divergence::None => return None,
        Divergence::Span { at, current, previous, .. } => (at, current, previous),
        Divergence::Reordered { at, .. } | Divergence::New { at } => (at, SHOWN_TOKENS, SHOWN_TOKENS),
    };
    let slice = |tokens: &[u32], len: usize| tokens.get(at..).map(|rest| rest[..len.min(rest.len())].to_vec());
    Some(Difference {
        context: current.get(at.saturating_sub(CONTEXT_TOKENS)..at).map(<[u32]>::to_vec).unwrap_or_default(),
        current: slice(current, current_len).unwrap_or_default(),
        previous: slice(previous, previous_len).unwrap_or_default(),
    })
}

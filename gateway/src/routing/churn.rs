//! The prefix-churn detector: flags a tenant whose consecutive prompts keep
//! differing inside block 0 while the rest stays alike, the signature of a
//! timestamp (or request id) at the top of a system prompt, which defeats
//! every prefix cache.
//!
//! Per tenant (a bounded number, least recently seen evicted) it keeps the
//! previous prompt's leading tokens. A prompt *churns* when it first differs
//! from the previous one inside block 0 and, after that point, at least
//! `min_similarity` of the leading window still agrees (allowing a shift of a
//! few tokens, as a timestamp's length varies). `streak` churning prompts in a
//! row raise a [`ChurnAlarm`]; any other prompt resets the streak.

use std::collections::HashMap;

use super::Millis;

/// Tunables of a [`ChurnDetector`].
#[derive(Clone, Debug, PartialEq)]
pub struct ChurnConfig {
    pub max_tenants: usize,
    /// Leading tokens remembered per tenant.
    pub leading_tokens: usize,
    pub block_size: usize,
    /// Churning prompts in a row that raise an alarm.
    pub streak: u32,
    /// Share of the window after the difference that must still agree.
    pub min_similarity: f64,
    /// Tokens by which the rest may be shifted and still agree.
    pub max_shift: usize,
    /// At most one log line per this interval ([`ChurnDetector::should_log`]).
    pub log_interval_ms: Millis,
}

impl Default for ChurnConfig {
    fn default() -> Self {
        ChurnConfig {
            max_tenants: 1024,
            leading_tokens: 256,
            block_size: kvroute_proto::DEFAULT_BLOCK_SIZE as usize,
            streak: 3,
            min_similarity: 0.5,
            max_shift: 4,
            log_interval_ms: 60_000,
        }
    }
}

/// A tenant whose prompts keep diverging at block 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChurnAlarm {
    pub tenant: String,
    /// Position of the first token that differs from the previous prompt.
    pub first_differing_token: usize,
    /// Churning prompts in a row so far.
    pub streak: u32,
}

#[derive(Clone, Debug)]
struct TenantState {
    leading: Vec<u32>,
    streak: u32,
    last_seen: u64,
}

#[derive(Debug)]
pub struct ChurnDetector {
    config: ChurnConfig,
    tenants: HashMap<String, TenantState>,
    clock: u64,
    last_log: Option<Millis>,
}

impl ChurnDetector {
    pub fn new(config: ChurnConfig) -> ChurnDetector {
        ChurnDetector { config, tenants: HashMap::new(), clock: 0, last_log: None }
    }

    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Compares `tokens` with the tenant's previous prompt and remembers it.
    pub fn observe(&mut self, tenant: &str, tokens: &[u32]) -> Option<ChurnAlarm> {
        let block = self.config.block_size.max(1);
        if tokens.len() < block {
            return None;
        }
        self.clock += 1;
        let leading = &tokens[..tokens.len().min(self.config.leading_tokens.max(block))];
        let Some(state) = self.tenants.get_mut(tenant) else {
            self.admit(tenant, leading);
            return None;
        };
        state.last_seen = self.clock;
        let previous = std::mem::replace(&mut state.leading, leading.to_vec());
        let differs_at = previous.iter().zip(leading).position(|(a, b)| a != b);
        let churned = match differs_at {
            Some(at) if at < block => {
                similarity(&previous, leading, at, self.config.max_shift) >= self.config.min_similarity
            }
            _ => false,
        };
        if !churned {
            state.streak = 0;
            return None;
        }
        state.streak += 1;
        (state.streak >= self.config.streak).then(|| ChurnAlarm {
            tenant: tenant.to_string(),
            first_differing_token: differs_at.unwrap_or(0),
            streak: state.streak,
        })
    }

    fn admit(&mut self, tenant: &str, leading: &[u32]) {
        if self.tenants.len() >= self.config.max_tenants.max(1) {
            let oldest = self.tenants.iter().min_by_key(|(_, state)| state.last_seen).map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.tenants.remove(&oldest);
            }
        }
        let state = TenantState { leading: leading.to_vec(), streak: 0, last_seen: self.clock };
        self.tenants.insert(tenant.to_string(), state);
    }

    /// True at most once per `log_interval_ms`: the caller logs an alarm then.
    pub fn should_log(&mut self, now: Millis) -> bool {
        let due = self.last_log.is_none_or(|last| now >= last.saturating_add(self.config.log_interval_ms));
        if due {
            self.last_log = Some(now);
        }
        due
    }
}

/// Best share, over shifts up to `max_shift`, of positions after `differs_at`
/// where the two windows agree. Needs a window of at least 16 positions.
fn similarity(previous: &[u32], current: &[u32], differs_at: usize, max_shift: usize) -> f64 {
    const MIN_COMPARED: usize = 16;
    let mut best = 0.0f64;
    for shift in 0..=2 * max_shift {
        // Shift `current` left (shift > max_shift) or `previous` left.
        let (a, b) = if shift <= max_shift {
            (previous.get(differs_at + shift..).unwrap_or(&[]), current.get(differs_at..).unwrap_or(&[]))
        } else {
            (previous.get(differs_at..).unwrap_or(&[]), current.get(differs_at + shift - max_shift..).unwrap_or(&[]))
        };
        let compared = a.len().min(b.len());
        if compared < MIN_COMPARED {
            continue;
        }
        let agree = a.iter().zip(b).filter(|(x, y)| x == y).count();
        best = best.max(agree as f64 / compared as f64);
    }
    best
}

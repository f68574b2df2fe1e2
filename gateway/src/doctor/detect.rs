//! The detectors' shared thresholds and helpers, and [`all`], which runs every detector over a tenant's
//! recent prompts. Each detector has a file of its own: [`super::varying`], [`super::ordering`],
//! [`super::variants`] (a prompt change and a steady split), [`super::personalised`].

use std::collections::{HashMap, VecDeque};

use super::DoctorConfig;
use super::diagnosis::Finding;
use super::tenant::Recent;
use super::{ordering, personalised, variants, varying};

/// When a detector speaks up. Shares are of the tenant's recent prompts (at most `recent_prompts`, within
/// the window).
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// Prompts that must show a pattern before it is diagnosed...
    pub min_prompts: usize,
    /// ...and their least share of the recent prompts (of those with a `user`, for personalisation).
    pub min_share: f64,
    /// Share of them that must part at the same block (a stable position).
    pub stable_share: f64,
    /// Share of distinct differing spans above which they vary (a timestamp), below which they are variants.
    pub distinct_share: f64,
    /// Users that must part from each other at the same block for personalisation.
    pub min_users: usize,
    /// Recent prompts a split of the prefix is looked for in.
    pub min_split_prompts: usize,
    /// The split is below the deepest block this share of the recent prompts has in common.
    pub trunk_share: f64,
    /// A variant: at least this many prompts...
    pub variant_min_prompts: usize,
    /// ...and this share of the prompts through the split...
    pub variant_share: f64,
    /// ...of at least this many different continuations (not one conversation's turns).
    pub variant_min_leaves: usize,
    /// The variants together hold at least this share of the prompts through the split.
    pub split_coverage: f64,
    /// More variants than this is not a split of the prompt (it is per-user or per-request content).
    pub max_variants: usize,
    /// A prompt change: the old prompt came back at most this share of the new one's prompts since.
    pub change_tolerance: f64,
    /// A diagnosis is resolved after this many prompts in a row without it.
    pub resolve_after: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_prompts: 6,
            min_share: 0.5,
            stable_share: 0.6,
            distinct_share: 0.5,
            min_users: 3,
            min_split_prompts: 12,
            trunk_share: 0.85,
            variant_min_prompts: 3,
            variant_share: 0.12,
            variant_min_leaves: 2,
            split_coverage: 0.8,
            max_variants: 4,
            change_tolerance: 0.2,
            resolve_after: 8,
        }
    }
}

/// What every detector finds in `recent` (the newest prompt last). Personalisation explains a varying span
/// that follows the `user` field, so it silences the varying-top detector; unstable ordering explains
/// branches that hold the same content in other orders, so it silences the variants detector (not a prompt
/// change).
pub fn all(recent: &VecDeque<Recent>, config: &DoctorConfig) -> Vec<Finding> {
    let mut found = Vec::new();
    let personal = personalised::detect(recent, config);
    if personal.is_none() {
        found.extend(varying::detect(recent, config));
    }
    let order = ordering::detect(recent, config);
    let split = variants::detect(recent, config)
        .filter(|finding| order.is_none() || finding.kind == super::diagnosis::Kind::PromptChanged);
    found.extend(order);
    found.extend(split);
    found.extend(personal);
    found.sort_by_key(|finding| finding.kind);
    found
}

/// The most common value and how often it occurs (the smallest value on ties).
pub fn mode(values: impl Iterator<Item = usize>) -> Option<(usize, usize)> {
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for value in values {
        *counts.entry(value).or_default() += 1;
    }
    counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
}

/// The median (the upper one of an even count), 0 for none.
pub fn median(mut values: Vec<usize>) -> usize {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Whether `count` of `total` reaches both the least count and the least share.
pub fn enough(count: usize, total: usize, min_count: usize, min_share: f64) -> bool {
    count >= min_count.max(1) && count as f64 >= min_share * total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(mode([3, 1, 3, 1, 2].into_iter()), Some((1, 2)), "ties: the smallest value");
        assert_eq!(mode([0, 0, 5].into_iter()), Some((0, 2)));
        assert_eq!(mode(std::iter::empty()), None);
        assert_eq!(median(vec![5, 1, 3]), 3);
        assert_eq!(median(vec![]), 0);
        assert!(enough(6, 12, 6, 0.5));
        assert!(!enough(5, 10, 6, 0.5));
        assert!(!enough(6, 13, 6, 0.5));
    }
}

//! *Varying content near the top*: a timestamp, a request id or a variant header early in the prompt. Most
//! recent prompts part from the earlier prompt closest to them in a short span (the varying content) that
//! ends at the same block, and then agree with it again for a while: the rest recurs, but the prefix cache
//! can reuse nothing after the span. The values are mostly distinct (a few values that recur would be
//! variants).

use std::collections::{HashSet, VecDeque};

use super::DoctorConfig;
use super::compare::Divergence;
use super::detect::{enough, median, mode};
use super::diagnosis::{Evidence, Finding, Kind};
use super::tenant::Recent;

/// Examples a finding keeps.
const EXAMPLES: usize = 3;

pub fn detect(recent: &VecDeque<Recent>, config: &DoctorConfig) -> Option<Finding> {
    let thresholds = &config.thresholds;
    let block_size = config.block_size.max(1);
    // (prompt, where it parts, where the varying span ends, tokens agreeing after it)
    let spans: Vec<(&Recent, usize, usize, usize)> = recent
        .iter()
        .filter_map(|prompt| match prompt.outcome.best {
            Some(Divergence::Span { at, current, recurring, .. }) => Some((prompt, at, at + current, recurring)),
            _ => None,
        })
        .collect();
    if !enough(spans.len(), recent.len(), thresholds.min_prompts, thresholds.min_share) {
        return None;
    }
    // Where two prompts part depends on how much of the varying content they share (two times of the same
    // minute share its digits), where it ends does not: the stable position is the end's block.
    let (end_block, _) = mode(spans.iter().map(|&(_, _, end, _)| end / block_size))?;
    let site: Vec<&(&Recent, usize, usize, usize)> =
        spans.iter().filter(|&&(_, _, end, _)| end / block_size == end_block).collect();
    if !enough(site.len(), spans.len(), thresholds.min_prompts, thresholds.stable_share) {
        return None;
    }
    let distinct: HashSet<u64> = site.iter().filter_map(|(prompt, ..)| prompt.outcome.best_variant).collect();
    if (distinct.len() as f64) < thresholds.distinct_share * site.len() as f64 {
        return None;
    }
    let token = site.iter().map(|&&(_, at, _, _)| at).min().unwrap_or(end_block * block_size);
    let examples =
        site.iter().rev().filter_map(|(prompt, ..)| prompt.outcome.best_text.clone()).take(EXAMPLES).collect();
    Some(Finding {
        kind: Kind::VaryingTop,
        block: (token / block_size) as u32,
        token,
        share: site.len() as f64 / recent.len() as f64,
        evidence: Evidence::VaryingTop {
            prompts: site.len(),
            distinct: distinct.len(),
            recurring_tokens: median(site.iter().map(|&&(_, _, _, recurring)| recurring).collect()),
            examples,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Feed, join, words};
    use super::*;

    /// A prompt whose block 0 carries the time of request `request`, 1 to 3 tokens long (a formatted time's
    /// length varies), then a system prompt and a question.
    fn stamped(request: u32, system: &[u32]) -> (Vec<u32>, Vec<u32>) {
        let stamp: Vec<u32> = (0..1 + request % 3).map(|i| 30_000 + request * 3 + i).collect();
        (join(&[&[1, 2, 3], &stamp, system, &words(100 + request, 20)]), stamp)
    }

    #[test]
    fn a_timestamp_at_the_top_is_diagnosed_within_eight_prompts_with_its_block_and_text() {
        let mut feed = Feed::new();
        let system = words(1, 400);
        let (mut raised_at, mut churned) = (None, 0);
        let mut last_stamp = Vec::new();
        for request in 0..16 {
            let (prompt, stamp) = stamped(request, &system);
            let observed = feed.send("acme", None, &prompt, &words(200 + request, 10));
            if observed.changes.iter().any(|change| change.kind == Kind::VaryingTop && change.raised) {
                raised_at.get_or_insert(request + 1);
            }
            churned += usize::from(observed.churned);
            last_stamp = stamp;
        }
        assert!(raised_at.is_some_and(|at| at <= 8), "raised after {raised_at:?} prompts");
        assert_eq!(feed.raised("acme"), [Kind::VaryingTop]);
        assert!(churned >= 8, "every prompt since counts as churn: {churned}");
        let finding = feed.doctor.finding("acme", Kind::VaryingTop).unwrap();
        assert_eq!((finding.block, finding.token), (0, 3));
        let Evidence::VaryingTop { prompts, distinct, recurring_tokens, examples } = &finding.evidence else {
            panic!("{finding:?}")
        };
        assert!(*prompts >= 14 && *distinct == *prompts, "{prompts} prompts, {distinct} distinct");
        assert!(*recurring_tokens >= 400, "the system prompt recurs: {recurring_tokens}");
        assert_eq!(examples[0].context, [1, 2, 3]);
        assert_eq!(examples[0].current, last_stamp, "the newest prompt's time");
        assert!(examples[0].previous.iter().all(|&token| (30_000..30_100).contains(&token)), "{examples:?}");
    }

    #[test]
    fn the_same_time_at_the_end_is_healthy() {
        let mut feed = Feed::new();
        let system = words(1, 400);
        for request in 0..16 {
            let prompt = join(&[&system, &words(100 + request, 20), &[30_000 + request]]);
            let observed = feed.send("acme", None, &prompt, &words(200 + request, 10));
            assert!(!observed.churned);
        }
        assert_eq!(feed.raised("acme"), []);
    }

    #[test]
    fn a_few_recurring_values_are_not_varying_content() {
        // Two header values taking turns: variants, not a timestamp (too few distinct spans).
        let mut feed = Feed::new();
        let system = words(1, 400);
        for request in 0..16u32 {
            let prompt = join(&[&[1, 2, 3], &[40_000 + request % 2], &system, &words(100 + request, 20)]);
            feed.send("acme", None, &prompt, &words(200 + request, 10));
        }
        assert!(!feed.raised("acme").contains(&Kind::VaryingTop), "{:?}", feed.raised("acme"));
    }
}

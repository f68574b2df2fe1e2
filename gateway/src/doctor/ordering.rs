//! *Unstable ordering*: tools or JSON keys serialised in varying order. Most recent prompts part from the
//! earlier prompt closest to them and then hold the same content in another order (the same multiset of
//! content-defined segments). Where they part varies a little (two orders may share their first items), so
//! the finding names the lowest and highest block.

use std::collections::VecDeque;

use super::DoctorConfig;
use super::compare::Divergence;
use super::detect::{enough, median};
use super::diagnosis::{Evidence, Finding, Kind};
use super::tenant::Recent;

const EXAMPLES: usize = 3;

pub fn detect(recent: &VecDeque<Recent>, config: &DoctorConfig) -> Option<Finding> {
    let thresholds = &config.thresholds;
    let block_size = config.block_size.max(1);
    let reordered: Vec<(&Recent, usize, usize)> = recent
        .iter()
        .filter_map(|prompt| match prompt.outcome.best {
            Some(Divergence::Reordered { at, length, .. }) => Some((prompt, at, length)),
            _ => None,
        })
        .collect();
    if !enough(reordered.len(), recent.len(), thresholds.min_prompts, thresholds.min_share) {
        return None;
    }
    let first = reordered.iter().map(|&(_, at, _)| at).min()?;
    let last = reordered.iter().map(|&(_, at, _)| at).max()?;
    let examples =
        reordered.iter().rev().filter_map(|(prompt, _, _)| prompt.outcome.best_text.clone()).take(EXAMPLES).collect();
    Some(Finding {
        kind: Kind::UnstableOrder,
        block: (first / block_size) as u32,
        token: first,
        share: reordered.len() as f64 / recent.len() as f64,
        evidence: Evidence::UnstableOrder {
            prompts: reordered.len(),
            blocks: ((first / block_size) as u32, (last / block_size) as u32),
            reordered_tokens: median(reordered.iter().map(|&(_, _, length)| length).collect()),
            examples,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Feed, join, words};
    use super::*;

    /// Six tool definitions of 150 tokens each, in `order`.
    fn tools(order: &[usize]) -> Vec<u32> {
        order.iter().flat_map(|&tool| words(300 + tool as u32, 150)).collect()
    }

    /// The `n`th permutation of six tools (a fixed pseudo-random one).
    fn shuffled(n: u32) -> Vec<usize> {
        let mut order: Vec<usize> = (0..6).collect();
        let mut state = n.wrapping_mul(2_654_435_761) | 1;
        for i in (1..6).rev() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            order.swap(i, state as usize % (i + 1));
        }
        order
    }

    #[test]
    fn tools_in_varying_order_are_diagnosed_where_they_start() {
        let mut feed = Feed::new();
        let system = words(1, 200);
        let mut raised_at = None;
        for request in 0..16 {
            let prompt = join(&[&system, &tools(&shuffled(request)), &words(100 + request, 20)]);
            feed.send("agents", None, &prompt, &words(200 + request, 10));
            if raised_at.is_none() && feed.raised("agents").contains(&Kind::UnstableOrder) {
                raised_at = Some(request + 1);
            }
        }
        assert!(raised_at.is_some_and(|at| at <= 10), "raised after {raised_at:?} prompts");
        assert_eq!(feed.raised("agents"), [Kind::UnstableOrder]);
        let finding = feed.doctor.finding("agents", Kind::UnstableOrder).unwrap();
        assert!(finding.token >= 200 && finding.block == (finding.token / 16) as u32, "{finding:?}");
        let Evidence::UnstableOrder { prompts, reordered_tokens, examples, .. } = &finding.evidence else {
            panic!("{finding:?}")
        };
        assert!(*prompts >= 8 && *reordered_tokens >= 300, "{prompts} prompts, {reordered_tokens} tokens");
        assert_ne!(examples[0].current, examples[0].previous);
    }

    #[test]
    fn the_same_tools_in_one_order_are_healthy() {
        let mut feed = Feed::new();
        let system = words(1, 200);
        for request in 0..16 {
            let prompt = join(&[&system, &tools(&[0, 1, 2, 3, 4, 5]), &words(100 + request, 20)]);
            feed.send("agents", None, &prompt, &words(200 + request, 10));
        }
        assert_eq!(feed.raised("agents"), []);
    }
}

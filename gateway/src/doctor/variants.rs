//! *Prompt changed* and *N variants of the prompt*. Below the deepest prefix nearly all recent prompts share
//! (the trunk), their block chains split into 2 to `max_variants` heavy branches that together hold most of
//! the prompts through the split, each a prefix of several different prompts (not the turns of one
//! conversation). When the oldest branch stopped as the newest started, the prompt changed (a deploy): its
//! cache is cold until the new prefix is cached, and the finding counts the requests that found it cold.
//! When the branches interleave, variants are served side by side (an A/B test): each caches its own prefix
//! tree, with its share of the cache. Branches that each belong to one user are personalisation instead.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use kvroute_proto::block_hash::BlockHashHasher;

use super::DoctorConfig;
use super::compare::{common_prefix, compare_from};
use super::diagnosis::{Difference, Evidence, Finding, Kind, Variant};
use super::tenant::{CONTEXT_TOKENS, Recent, difference};

type Map<V> = HashMap<u64, V, BuildHasherDefault<BlockHashHasher>>;
type Set = HashSet<u64, BuildHasherDefault<BlockHashHasher>>;

pub fn detect(recent: &VecDeque<Recent>, config: &DoctorConfig) -> Option<Finding> {
    let thresholds = &config.thresholds;
    let block_size = config.block_size.max(1);
    if recent.len() < thresholds.min_split_prompts {
        return None;
    }
    let (depth, trunk) = trunk(recent, thresholds.trunk_share);
    let through: Vec<&Recent> =
        recent.iter().filter(|prompt| depth == 0 || prompt.chain.get(depth - 1) == trunk.as_ref()).collect();
    let mut groups: Map<Vec<&Recent>> = Map::default();
    for prompt in &through {
        if let Some(&hash) = prompt.chain.get(depth) {
            groups.entry(hash).or_default().push(prompt);
        }
    }
    let least = thresholds.variant_min_prompts.max((thresholds.variant_share * through.len() as f64).ceil() as usize);
    let mut branches: Vec<Vec<&Recent>> = groups.into_values().filter(|members| members.len() >= least).collect();
    if !(2..=thresholds.max_variants.max(2)).contains(&branches.len()) {
        return None;
    }
    let covered: usize = branches.iter().map(Vec::len).sum();
    if (covered as f64) < thresholds.split_coverage * through.len() as f64
        || branches.iter().any(|members| leaves(members) < thresholds.variant_min_leaves)
        || per_user(&branches)
    {
        return None;
    }
    // Members are in arrival order; branches by when they first appeared.
    branches.sort_by_key(|members| members[0].seq);
    let newest = |members: &[&Recent]| members.last().map(|prompt| prompt.head.clone()).unwrap_or_default();
    let token = common_prefix(&newest(&branches[0]), &newest(&branches[1]));
    let share = through.len() as f64 / recent.len() as f64;
    if let [old, new] = branches.as_slice()
        && changed(old, new, &through, thresholds.change_tolerance, thresholds.variant_min_prompts)
    {
        let cached_from = ((depth + 1) * block_size) as u64;
        let cold_requests = new.iter().take_while(|prompt| prompt.matched_tokens < cached_from).count();
        let (old_head, new_head) = (newest(old), newest(new));
        let divergence = compare_from(&new_head, &old_head, token, &config.compare);
        return Some(Finding {
            kind: Kind::PromptChanged,
            block: depth as u32,
            token,
            share,
            evidence: Evidence::PromptChanged {
                changed_at: new[0].at,
                old_last_seen: old.last().map_or(0, |prompt| prompt.at),
                old_prompts: old.len(),
                new_prompts: new.len(),
                cold_requests,
                warm_at: new.get(cold_requests).map(|prompt| prompt.at),
                example: difference(&new_head, &old_head, &divergence).unwrap_or_default(),
            },
        });
    }
    let heads: Vec<Vec<u32>> = branches.iter().map(|members| newest(members)).collect();
    let mut context = Vec::new();
    let variants = branches
        .iter()
        .enumerate()
        .map(|(index, members)| {
            let (own, other) = (&heads[index], &heads[(index + 1) % heads.len()]);
            let at = common_prefix(own, other);
            let divergence = compare_from(own, other, at, &config.compare);
            let Difference { context: shared, current, .. } = difference(own, other, &divergence).unwrap_or_default();
            if index == 0 {
                context = shared;
            }
            // Its differing span, or (where the other variant inserted something) what follows.
            let shown = current.len().max(CONTEXT_TOKENS);
            let text = own.get(at..).map(|rest| rest[..shown.min(rest.len())].to_vec()).unwrap_or_default();
            Variant { prompts: members.len(), share: members.len() as f64 / through.len() as f64, text }
        })
        .collect();
    Some(Finding {
        kind: Kind::Variants,
        block: depth as u32,
        token,
        share,
        evidence: Evidence::Variants { variants, context },
    })
}

/// The deepest block count `depth` such that one chain hash at block `depth - 1` is shared by at least
/// `share` of `recent`, and that hash (None for depth 0: the split is at the first block). A shared hash at
/// a block implies one at every block before it, so a binary search finds it.
fn trunk(recent: &VecDeque<Recent>, share: f64) -> (usize, Option<u64>) {
    let needed = (share * recent.len() as f64).ceil().max(1.0) as usize;
    let shared_at = |depth: usize| -> Option<u64> {
        let mut counts: Map<usize> = Map::default();
        for prompt in recent {
            if let Some(&hash) = prompt.chain.get(depth - 1) {
                *counts.entry(hash).or_default() += 1;
            }
        }
        counts.into_iter().find(|&(_, count)| count >= needed).map(|(hash, _)| hash)
    };
    let (mut low, mut high) = (0, recent.iter().map(|prompt| prompt.chain.len()).max().unwrap_or(0) + 1);
    let mut trunk = None;
    while high - low > 1 {
        let middle = (low + high) / 2;
        match shared_at(middle) {
            Some(hash) => {
                low = middle;
                trunk = Some(hash);
            }
            None => high = middle,
        }
    }
    // Only a successful probe moves `low`, so `trunk` is the hash at `low` (None while `low` is 0).
    (low, trunk)
}

/// Distinct continuations among a branch's prompts: chains that are not the beginning of another (a
/// conversation's turns make one).
fn leaves(members: &[&Recent]) -> usize {
    let inner: Set = members
        .iter()
        .flat_map(|prompt| prompt.chain[..prompt.chain.len().saturating_sub(1)].iter().copied())
        .collect();
    let ends: Set =
        members.iter().filter_map(|prompt| prompt.chain.last().copied()).filter(|end| !inner.contains(end)).collect();
    ends.len()
}

/// Whether each branch is one user's (and no two the same user's).
fn per_user(branches: &[Vec<&Recent>]) -> bool {
    let mut owners = HashSet::new();
    branches.iter().all(|members| {
        let users: HashSet<Option<u64>> = members.iter().map(|prompt| prompt.user).collect();
        users.len() == 1 && members[0].user.is_some() && owners.insert(members[0].user)
    })
}

/// Whether `new` replaced `old`: since `new` first appeared, `old` came back for at most `tolerance` of
/// `new`'s prompts, and the newest `latest` prompts through the split are all `new`'s.
fn changed(old: &[&Recent], new: &[&Recent], through: &[&Recent], tolerance: f64, latest: usize) -> bool {
    let started = new[0].seq;
    let came_back = old.iter().filter(|prompt| prompt.seq > started).count();
    let new_seqs: Set = new.iter().map(|prompt| prompt.seq).collect();
    let old_seqs: Set = old.iter().map(|prompt| prompt.seq).collect();
    let newest_are_new = through
        .iter()
        .rev()
        .filter(|prompt| new_seqs.contains(&prompt.seq) || old_seqs.contains(&prompt.seq))
        .take(latest)
        .all(|prompt| new_seqs.contains(&prompt.seq));
    came_back as f64 <= tolerance * new.len() as f64 && newest_are_new
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Feed, chat, join, raised_after, words};
    use super::*;

    #[test]
    fn a_changed_prompt_is_diagnosed_as_a_change_with_its_text_and_cold_requests() {
        let mut feed = Feed::new();
        let old = words(1, 400);
        let mut new = old.clone();
        new[150] = 19_999;
        // Eight conversations on the old prompt, then eight on the new one, two turns each.
        let history =
            chat(&mut feed, "acme", 16, 2, |session| if session < 8 { old.clone() } else { new.clone() }, |_| None);
        let raised = raised_after(&history, Kind::PromptChanged);
        assert!(raised.is_some_and(|at| (17..=24).contains(&at)), "raised after {raised:?} prompts");
        assert_eq!(feed.raised("acme"), [Kind::PromptChanged]);
        let finding = feed.doctor.finding("acme", Kind::PromptChanged).unwrap();
        assert_eq!((finding.block, finding.token), (9, 150));
        let Evidence::PromptChanged { new_prompts, old_prompts, cold_requests, warm_at, example, changed_at, .. } =
            &finding.evidence
        else {
            panic!("{finding:?}")
        };
        assert_eq!(example.current.first(), Some(&19_999), "{example:?}");
        assert_eq!(example.previous.first(), Some(&old[150]));
        assert_eq!(example.context, old[134..150]);
        assert!(*new_prompts >= 5 && *old_prompts >= 8, "{new_prompts} new, {old_prompts} old");
        // Nothing was found cached in this feed: every request of the new prompt was cold.
        assert_eq!((*cold_requests, *warm_at), (*new_prompts, None));
        assert_eq!(*changed_at, 1_000 + 17 * 1_000, "the 17th prompt was the new one's first");
    }

    #[test]
    fn two_prompts_served_side_by_side_are_variants_with_their_shares() {
        let mut feed = Feed::new();
        let a = words(1, 400);
        let b = join(&[&a[..40], &words(9, 12), &a[40..]]);
        let variant_b =
            [false, true, true, false, true, false, false, true, true, false, false, true, false, true, true, false];
        let history = chat(
            &mut feed,
            "acme",
            16,
            2,
            |session| if variant_b[session as usize] { b.clone() } else { a.clone() },
            |_| None,
        );
        let raised = raised_after(&history, Kind::Variants);
        assert!(raised.is_some_and(|at| at <= 24), "raised after {raised:?} prompts");
        assert_eq!(feed.raised("acme"), [Kind::Variants]);
        let finding = feed.doctor.finding("acme", Kind::Variants).unwrap();
        assert_eq!((finding.block, finding.token), (2, 40));
        let Evidence::Variants { variants, context } = &finding.evidence else { panic!("{finding:?}") };
        assert_eq!(variants.len(), 2);
        assert!(variants.iter().all(|variant| (0.3..=0.7).contains(&variant.share)), "{variants:?}");
        assert!((variants[0].share + variants[1].share - 1.0).abs() < 1e-9);
        assert_eq!(context, &a[24..40]);
        let texts: Vec<u32> = variants.iter().filter_map(|variant| variant.text.first().copied()).collect();
        assert!(texts.contains(&a[40]) && texts.contains(&words(9, 12)[0]), "{variants:?}");
    }

    #[test]
    fn one_conversation_at_a_time_is_not_a_split() {
        // Long conversations, one after the other: their turns form one chain each, not variants.
        let mut feed = Feed::new();
        let system = words(1, 400);
        chat(&mut feed, "acme", 4, 8, |_| system.clone(), |_| None);
        assert_eq!(feed.raised("acme"), []);
    }
}

//! *Personalised early*: per-user content near the top of the prompt, following the request's `user`
//! field. A prompt parts from the closest prompt of another user at a stable block and then agrees with it
//! again (the rest is shared), while it shares more than that with the same user's earlier prompts: the
//! prefix cache is shared per user instead of across users.

use std::collections::{HashSet, VecDeque};

use super::DoctorConfig;
use super::compare::Divergence;
use super::detect::{enough, median, mode};
use super::diagnosis::{Evidence, Finding, Kind};
use super::tenant::Recent;

const EXAMPLES: usize = 3;

pub fn detect(recent: &VecDeque<Recent>, config: &DoctorConfig) -> Option<Finding> {
    let thresholds = &config.thresholds;
    let block_size = config.block_size.max(1);
    let with_user: Vec<&Recent> = recent.iter().filter(|prompt| prompt.user.is_some()).collect();
    // (prompt, where it parts from another user's, where the per-user span ends)
    let crossing: Vec<(&Recent, usize, usize)> = with_user
        .iter()
        .filter_map(|prompt| match prompt.outcome.cross_user {
            Some(Divergence::Span { at, current, .. }) => Some((*prompt, at, at + current)),
            _ => None,
        })
        .collect();
    if !enough(crossing.len(), with_user.len(), thresholds.min_prompts, thresholds.min_share) {
        return None;
    }
    // As for varying content, the stable position is where the per-user span ends.
    let (end_block, _) = mode(crossing.iter().map(|&(_, _, end)| end / block_size))?;
    let at_block: Vec<&(&Recent, usize, usize)> =
        crossing.iter().filter(|&&(_, _, end)| end / block_size == end_block).collect();
    if !enough(at_block.len(), crossing.len(), thresholds.min_prompts, thresholds.stable_share) {
        return None;
    }
    let users: HashSet<u64> = at_block.iter().filter_map(|(prompt, ..)| prompt.user).collect();
    if users.len() < thresholds.min_users {
        return None;
    }
    let token = at_block.iter().map(|&&(_, at, _)| at).min().unwrap_or(end_block * block_size);
    // Prompts of one user share more than the span where users part.
    let same_user: Vec<usize> = with_user.iter().filter_map(|prompt| prompt.outcome.same_user_prefix).collect();
    let past = same_user.iter().filter(|&&shared| shared >= (end_block + 1) * block_size).count();
    if !enough(past, same_user.len(), 2, thresholds.stable_share) {
        return None;
    }
    let examples = at_block
        .iter()
        .rev()
        .filter_map(|(prompt, ..)| prompt.outcome.cross_user_text.clone())
        .take(EXAMPLES)
        .collect();
    Some(Finding {
        kind: Kind::Personalised,
        block: (token / block_size) as u32,
        token,
        share: at_block.len() as f64 / with_user.len() as f64,
        evidence: Evidence::Personalised {
            users: users.len(),
            prompts: at_block.len(),
            same_user_tokens: median(same_user),
            examples,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Feed, chat, raised_after, words};
    use super::*;

    /// A system prompt naming user `user` after 20 tokens.
    fn system(user: u32) -> Vec<u32> {
        [words(1, 20), words(700 + user, 6), words(2, 380)].concat()
    }

    #[test]
    fn per_user_content_after_the_user_field_is_diagnosed_not_as_varying_or_variants() {
        let mut feed = Feed::new();
        // Six users, each with two conversations of two turns.
        let history = chat(
            &mut feed,
            "shop",
            12,
            2,
            |session| system(session % 6),
            |session| Some(format!("user-{}", session % 6)),
        );
        let raised = raised_after(&history, Kind::Personalised);
        assert!(raised.is_some_and(|at| at <= 20), "raised after {raised:?} prompts");
        assert_eq!(feed.raised("shop"), [Kind::Personalised]);
        let finding = feed.doctor.finding("shop", Kind::Personalised).unwrap();
        assert_eq!((finding.block, finding.token), (1, 20));
        let Evidence::Personalised { users, same_user_tokens, examples, .. } = &finding.evidence else {
            panic!("{finding:?}")
        };
        assert!(*users >= 3, "{users}");
        assert!(*same_user_tokens > 400, "one user's prompts share the system prompt: {same_user_tokens}");
        assert_eq!(examples[0].current.len(), 6, "the user's own span: {examples:?}");
        assert_ne!(examples[0].current, examples[0].previous);
    }

    #[test]
    fn without_the_user_field_it_is_not_personalisation() {
        let mut feed = Feed::new();
        chat(&mut feed, "shop", 12, 2, |session| system(session % 6), |_| None);
        assert!(!feed.raised("shop").contains(&Kind::Personalised));
    }

    #[test]
    fn users_of_one_shared_prompt_are_healthy() {
        let mut feed = Feed::new();
        chat(&mut feed, "shop", 12, 2, |_| system(0), |session| Some(format!("user-{}", session % 6)));
        assert_eq!(feed.raised("shop"), []);
    }
}

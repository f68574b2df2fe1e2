//! Where a prompt parts from an earlier prompt of its tenant, and what follows: the same content again
//! after a short differing span (something varying near the top: a timestamp, a request id, a variant
//! header), the same content in another order (tools or JSON keys serialised in varying order), or new
//! content (a different question: ordinary traffic). Pure functions over token ids.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

use kvroute_proto::block_hash::BlockHashHasher;

use super::chain::segments;

/// Tunables of [`compare`].
#[derive(Clone, Debug, PartialEq)]
pub struct CompareConfig {
    /// Longest differing span, in tokens of either prompt, after which the rest may agree again.
    pub max_span: usize,
    /// Tokens that must agree right after the span for the prompts to count as realigned...
    pub min_run: usize,
    /// ...and tokens that must agree from there for the rest to count as recurring.
    pub min_recurring: usize,
    /// Tokens of the same content, in another order, that make a reordering.
    pub min_reordered: usize,
    /// Share of that content that may differ (pieces cut where two reordered items meet).
    pub max_reorder_mismatch: f64,
}

impl Default for CompareConfig {
    fn default() -> Self {
        CompareConfig { max_span: 64, min_run: 16, min_recurring: 32, min_reordered: 128, max_reorder_mismatch: 0.2 }
    }
}

/// How a prompt relates to the earlier one it is compared with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Divergence {
    /// One repeats or extends the other (a conversation's next turn), as far as they were compared.
    None,
    /// They part at token `at`; after `current` tokens of this prompt and `previous` of the other, the next
    /// `recurring` tokens agree again.
    Span { at: usize, current: usize, previous: usize, recurring: usize },
    /// They part at token `at`; the next `length` tokens of both hold the same content in another order
    /// (`mismatch`: the share of it that did not match).
    Reordered { at: usize, length: usize, mismatch: f64 },
    /// They part at token `at` and go on with different content.
    New { at: usize },
}

impl Divergence {
    /// The token at which the prompts part, if they do.
    pub fn at(&self) -> Option<usize> {
        match *self {
            Divergence::None => None,
            Divergence::Span { at, .. } | Divergence::Reordered { at, .. } | Divergence::New { at } => Some(at),
        }
    }
}

/// Tokens the two share from the start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How `current` relates to `previous`.
pub fn compare(current: &[u32], previous: &[u32], config: &CompareConfig) -> Divergence {
    compare_from(current, previous, common_prefix(current, previous), config)
}

/// [`compare`] when their common prefix, `at` tokens, is known.
pub fn compare_from(current: &[u32], previous: &[u32], at: usize, config: &CompareConfig) -> Divergence {
    if at >= current.len() || at >= previous.len() {
        return Divergence::None;
    }
    let (current_rest, previous_rest) = (&current[at..], &previous[at..]);
    if let Some((current, previous, recurring)) = realign(current_rest, previous_rest, config) {
        return Divergence::Span { at, current, previous, recurring };
    }
    match reordered(current_rest, previous_rest, config) {
        Some((length, mismatch)) => Divergence::Reordered { at, length, mismatch },
        None => Divergence::New { at },
    }
}

/// The shortest spans (by their total length) to skip in each for the two to agree again on at least
/// `min_recurring` tokens: (skipped in `current`, skipped in `previous`, tokens agreeing).
fn realign(current: &[u32], previous: &[u32], config: &CompareConfig) -> Option<(usize, usize, usize)> {
    let run = config.min_run.max(1);
    for total in 1..=2 * config.max_span {
        for skip_current in total.saturating_sub(config.max_span)..=total.min(config.max_span) {
            let skip_previous = total - skip_current;
            let (Some(a), Some(b)) = (current.get(skip_current..), previous.get(skip_previous..)) else {
                continue;
            };
            if a.len() < run || b.len() < run || a[0] != b[0] || a[..run] != b[..run] {
                continue;
            }
            let recurring = common_prefix(a, b);
            if recurring >= config.min_recurring {
                return Some((skip_current, skip_previous, recurring));
            }
        }
    }
    None
}

/// The longest stretch at the start of both whose content-defined segments are the same multiset, bar
/// `max_reorder_mismatch` of it, if it reaches `min_reordered` tokens: (its length, the share that did not
/// match). The two are walked together by token position, counting the tokens of segments one side has
/// that the other has not had yet.
fn reordered(current: &[u32], previous: &[u32], config: &CompareConfig) -> Option<(usize, f64)> {
    if current.len().min(previous.len()) < config.min_reordered {
        return None;
    }
    let mut balance: HashMap<u64, i32, BuildHasherDefault<BlockHashHasher>> = HashMap::default();
    let (mut a, mut b) = (segments(current).peekable(), segments(previous).peekable());
    let (mut position_a, mut position_b, mut unmatched) = (0usize, 0usize, 0usize);
    let mut best = None;
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(_), Some(_)) => position_a <= position_b,
        };
        let ((hash, len), sign) = if take_a { (a.next()?, 1) } else { (b.next()?, -1) };
        if take_a {
            position_a += len;
        } else {
            position_b += len;
        }
        let count = balance.entry(hash).or_default();
        if *count * sign < 0 {
            unmatched = unmatched.saturating_sub(len);
        } else {
            unmatched += len;
        }
        *count += sign;
        let length = position_a.min(position_b);
        let consumed = position_a + position_b;
        if length >= config.min_reordered && unmatched as f64 <= config.max_reorder_mismatch * consumed as f64 {
            best = Some((length, unmatched as f64 / consumed as f64));
        }
    }
    // The same content in the same order is a shift (a long span), not a reordering.
    best.filter(|&(length, _)| !same_order(&current[..length], &previous[..length]))
}

/// Whether the segments the two have in common come in the same order in both.
fn same_order(current: &[u32], previous: &[u32]) -> bool {
    type Set = HashSet<u64, BuildHasherDefault<BlockHashHasher>>;
    let a: Vec<u64> = segments(current).map(|(hash, _)| hash).collect();
    let b: Vec<u64> = segments(previous).map(|(hash, _)| hash).collect();
    let (in_a, in_b): (Set, Set) = (a.iter().copied().collect(), b.iter().copied().collect());
    a.iter().filter(|hash| in_b.contains(hash)).eq(b.iter().filter(|hash| in_a.contains(hash)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic "text": `n` tokens from `seed`.
    fn text(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| (seed.wrapping_mul(7_919) ^ i.wrapping_mul(104_729)) % 50_000).collect()
    }

    fn join(parts: &[&[u32]]) -> Vec<u32> {
        parts.concat()
    }

    fn check(current: &[u32], previous: &[u32], expected: Divergence) {
        assert_eq!(compare(current, previous, &CompareConfig::default()), expected);
    }

    #[test]
    fn repeats_and_extensions_do_not_diverge() {
        let system = text(1, 300);
        check(&system, &system, Divergence::None);
        check(&join(&[&system, &text(2, 40)]), &system, Divergence::None);
        check(&system, &join(&[&system, &text(2, 40)]), Divergence::None);
    }

    #[test]
    fn a_varying_span_near_the_top_realigns() {
        let rest = text(3, 300);
        let current = join(&[&[1, 2, 3], &[50_001, 50_002], &rest]);
        let previous = join(&[&[1, 2, 3], &[50_011], &rest]);
        check(&current, &previous, Divergence::Span { at: 3, current: 2, previous: 1, recurring: 300 });
        // A span longer than max_span is not a span; nor is a short agreeing tail.
        // (The same content shifted by a longer span keeps its order: not a reordering either.)
        let long = join(&[&[1, 2, 3], &text(4, 70), &rest]);
        assert!(matches!(compare(&long, &previous, &CompareConfig::default()), Divergence::New { at: 3 }));
        let short_tail = join(&[&[1, 2, 3], &[9], &rest[..20]]);
        let short_previous = join(&[&[1, 2, 3], &[8], &rest[..20]]);
        check(&short_tail, &short_previous, Divergence::New { at: 3 });
    }

    #[test]
    fn different_questions_are_new_content() {
        let system = text(5, 200);
        let current = join(&[&system, &text(6, 30), &[7, 7, 7]]);
        let previous = join(&[&system, &text(8, 25), &[7, 7, 7]]);
        check(&current, &previous, Divergence::New { at: 200 });
    }

    #[test]
    fn the_same_items_in_another_order_are_reordered() {
        let system = text(9, 100);
        let items: Vec<Vec<u32>> = (0..6).map(|i| text(20 + i, 150)).collect();
        let order = |order: [usize; 6]| -> Vec<u32> {
            let mut prompt = system.clone();
            for i in order {
                prompt.extend(&items[i]);
            }
            prompt.extend(text(99, 40));
            prompt
        };
        let current = order([3, 1, 0, 5, 2, 4]);
        let previous = order([0, 1, 2, 3, 4, 5]);
        let Divergence::Reordered { at, length, mismatch } = compare(&current, &previous, &CompareConfig::default())
        else {
            panic!("{:?}", compare(&current, &previous, &CompareConfig::default()));
        };
        assert_eq!(at, 100);
        assert!(length >= 850, "the six items: {length}");
        assert!(mismatch < 0.2);
        // Different items are not a reordering, nor is sharing one of them.
        let mut other = system.clone();
        for i in 30..36 {
            other.extend(text(i, 150));
        }
        assert!(matches!(compare(&other, &previous, &CompareConfig::default()), Divergence::New { at: 100 }));
        let mut one_shared = system.clone();
        one_shared.extend(&items[2]);
        for i in 40..45 {
            one_shared.extend(text(i, 150));
        }
        assert!(matches!(compare(&one_shared, &previous, &CompareConfig::default()), Divergence::New { .. }));
    }
}

//! When the running batch makes room: a request waits for the pool blocks and the running slot the
//! requests ahead of it and it need, and those come back when running sequences finish. The engine knows
//! how far each running sequence is, and how long the sequences it finished lately ran, so it can say
//! about how many decode steps that takes ([`super::Engine::admission_refusal`] turns them into seconds).

use std::collections::VecDeque;

/// Finished sequences whose lengths [`FinishedLengths`] keeps.
const LENGTHS_KEPT: usize = 64;

/// What one running sequence gives back when it finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Releases {
    /// Decode steps until it has generated its `max_tokens` (it may stop sooner, at an end of sequence).
    pub steps_left: usize,
    /// Pool blocks only it holds (its prompt beyond the cached prefix it matched, and what it generated).
    pub blocks: usize,
}

/// How many tokens the latest finished sequences generated.
#[derive(Debug, Default)]
pub struct FinishedLengths {
    recent: VecDeque<usize>,
    sum: usize,
}

impl FinishedLengths {
    pub fn record(&mut self, generated: usize) {
        if self.recent.len() == LENGTHS_KEPT
            && let Some(oldest) = self.recent.pop_front()
        {
            self.sum -= oldest;
        }
        self.recent.push_back(generated);
        self.sum += generated;
    }

    /// Decode steps until a sequence that has generated `generated` of at most `max_tokens` tokens
    /// finishes: it runs to `max_tokens` at most, and is expected to stop near the mean length of the
    /// sequences that finished lately (most stop at an end of sequence long before `max_tokens`); one
    /// already past that mean is taken to be about to finish. Until one has finished, `max_tokens`.
    pub fn steps_left(&self, max_tokens: usize, generated: usize) -> usize {
        let expected = match self.recent.len() {
            0 => max_tokens,
            n => max_tokens.min((self.sum / n).max(generated + 1)),
        };
        expected.saturating_sub(generated)
    }
}

/// Decode steps until the running sequences, finishing in order of `steps_left`, have given back at
/// least `blocks` pool blocks and `slots` running slots. When all of them together give back less, the
/// steps until the last finishes.
pub fn steps_until_room(mut running: Vec<Releases>, blocks: usize, slots: usize) -> usize {
    if blocks == 0 && slots == 0 {
        return 0;
    }
    running.sort_unstable_by_key(|sequence| sequence.steps_left);
    let (mut freed, mut finished, mut steps) = (0, 0, 0);
    for sequence in running {
        freed += sequence.blocks;
        finished += 1;
        steps = sequence.steps_left;
        if freed >= blocks && finished >= slots {
            break;
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn releases(steps_left: usize, blocks: usize) -> Releases {
        Releases { steps_left, blocks }
    }

    #[test]
    fn a_sequence_is_expected_to_run_about_as_long_as_the_latest_finished_ones() {
        let mut lengths = FinishedLengths::default();
        assert_eq!(lengths.steps_left(500, 100), 400, "nothing finished yet: to its max_tokens");
        lengths.record(100);
        lengths.record(300);
        assert_eq!(lengths.steps_left(500, 50), 150, "to the mean of 200");
        assert_eq!(lengths.steps_left(120, 50), 70, "never past its max_tokens");
        assert_eq!(lengths.steps_left(500, 250), 1, "past the mean: about to finish");
        for _ in 0..LENGTHS_KEPT {
            lengths.record(10);
        }
        assert_eq!(lengths.steps_left(500, 0), 10, "only the latest count");
    }

    #[test]
    fn room_comes_when_enough_sequences_have_finished_in_the_order_they_finish() {
        let running = vec![releases(90, 10), releases(10, 2), releases(40, 5)];
        assert_eq!(steps_until_room(running.clone(), 0, 0), 0, "nothing needed: no wait");
        assert_eq!(steps_until_room(running.clone(), 2, 0), 10, "the first to finish frees enough");
        assert_eq!(steps_until_room(running.clone(), 3, 0), 40, "the first two together");
        assert_eq!(steps_until_room(running.clone(), 0, 3), 90, "three slots: all three must finish");
        assert_eq!(steps_until_room(running.clone(), 1, 2), 40, "blocks and slots both");
        assert_eq!(steps_until_room(running, 100, 0), 90, "more than they hold: until the last finishes");
        assert_eq!(steps_until_room(Vec::new(), 5, 1), 0, "nothing running: nothing to wait for");
    }
}

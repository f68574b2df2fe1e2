//! When the running batch makes room: a request waits for the pool blocks and the running slot the
//! requests ahead of it and it need. Running sequences give blocks back when they finish, and take more as
//! they grow, one token a step; when growth runs the pool dry the engine preempts its newest sequences,
//! which queue again ahead of everything waiting. [`steps_until_admitted`] plays that forward, step by step,
//! from what the engine knows (how far each running sequence is, and how long the sequences it finished
//! lately ran), so a request is promised a wait the pool can keep ([`super::Engine::admission_refusal`]
//! turns the steps into seconds).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Finished sequences whose lengths [`FinishedLengths`] keeps.
const LENGTHS_KEPT: usize = 64;

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

/// A sequence in the pool, or waiting to enter it: how long it runs on and what it holds of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resident {
    /// Its place in the engine's order of arrival: the engine preempts the latest first.
    pub order: u64,
    /// Decode steps until it has generated its `max_tokens` (it may stop sooner, at an end of sequence).
    pub steps_left: usize,
    /// Pool blocks only it holds (its prompt beyond what others share, and what it generated), which it
    /// gives back when it leaves; for a waiting one, the available blocks it takes when it enters.
    pub blocks: usize,
    /// Decode steps until it needs its next block (counted from its admission, for a waiting one): its
    /// last block fills one token a step.
    pub next_block: usize,
}

/// The pool as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pool {
    /// Blocks free or holding only cached data (evictable).
    pub available: usize,
    /// Blocks kept free when admitting beside running sequences (the watermark).
    pub reserve: usize,
    pub block_size: usize,
    pub max_running: usize,
}

/// Decode steps until a request queued behind `waiting` (in queue order) is admitted, taking `blocks`
/// itself, when at most `horizon` steps are looked at; `None` when it is not admitted within them.
///
/// Each step every running sequence grows by one token, taking a block when its last one is full; while
/// the pool is short the newest running sequence is preempted, gives back its blocks and queues again at the
/// front (to be recomputed: it needs them all again); sequences that reach their `steps_left` finish and
/// give back theirs; then the queue is admitted first come first served while the pool, above the reserve,
/// and the running slots have room, as the engine's scheduler does. So the least it waits is one step.
pub fn steps_until_admitted(
    running: &[Resident],
    waiting: &[Resident],
    blocks: usize,
    pool: Pool,
    horizon: usize,
) -> Option<usize> {
    let mut batch = Batch::new(pool);
    for &sequence in running {
        batch.enter(sequence, 0);
    }
    let mut queue: VecDeque<Option<Resident>> = waiting.iter().copied().map(Some).collect();
    queue.push_back(None);
    // A request queued now is first looked at in the next step, after that step's decodes have grown.
    for step in 1..=horizon {
        batch.grow(step, &mut queue);
        batch.finish(step);
        while let Some(&front) = queue.front() {
            if !batch.fits(front.map_or(blocks, |sequence| sequence.blocks)) {
                break;
            }
            queue.pop_front();
            let Some(sequence) = front else { return Some(step) };
            batch.available -= sequence.blocks as i64;
            batch.enter(sequence, step);
        }
    }
    None
}

/// One sequence in the batch played forward.
struct Entry {
    sequence: Resident,
    /// The step it entered the batch.
    entered: usize,
    /// The step it takes its first new block, and one every `block_size` steps after.
    first_block: usize,
    present: bool,
    /// Whether it is counted in [`Batch::growing`] (from its first new block on).
    growing: bool,
}

/// The running batch played forward by [`steps_until_admitted`].
struct Batch {
    pool: Pool,
    available: i64,
    entries: Vec<Entry>,
    running: usize,
    /// Sequences present and past their first new block, by the remainder (modulo the block size) of the
    /// steps at which they take one.
    growing: Vec<usize>,
    /// Sequences not yet past their first new block, by the step they take it.
    starting: BinaryHeap<Reverse<(usize, usize)>>,
    newest: BinaryHeap<(u64, usize)>,
    finishing: BinaryHeap<Reverse<(usize, usize)>>,
}

impl Batch {
    fn new(pool: Pool) -> Self {
        Batch {
            pool,
            available: pool.available as i64,
            entries: Vec::new(),
            running: 0,
            growing: vec![0; pool.block_size.max(1)],
            starting: BinaryHeap::new(),
            newest: BinaryHeap::new(),
            finishing: BinaryHeap::new(),
        }
    }

    fn fits(&self, blocks: usize) -> bool {
        let reserve = if self.running == 0 { 0 } else { self.pool.reserve as i64 };
        self.running < self.pool.max_running && self.available - blocks as i64 >= reserve
    }

    /// Counts `sequence` in the batch from `step` on (the blocks it holds are already taken).
    fn enter(&mut self, sequence: Resident, step: usize) {
        let index = self.entries.len();
        let first_block = step + sequence.next_block.max(1);
        self.running += 1;
        self.starting.push(Reverse((first_block, index)));
        self.newest.push((sequence.order, index));
        self.finishing.push(Reverse((step + sequence.steps_left, index)));
        self.entries.push(Entry { sequence, entered: step, first_block, present: true, growing: false });
    }

    /// Blocks sequence `index` holds after `step`'s growth.
    fn holding(&self, index: usize, step: usize) -> usize {
        let entry = &self.entries[index];
        let grown = if step < entry.first_block { 0 } else { (step - entry.first_block) / self.growing.len() + 1 };
        entry.sequence.blocks + grown
    }

    /// Takes sequence `index` out of the pool after `step`: what it holds comes back.
    fn leave(&mut self, index: usize, step: usize) -> Option<usize> {
        if !self.entries[index].present {
            return None;
        }
        let held = self.holding(index, step);
        let entry = &mut self.entries[index];
        entry.present = false;
        if entry.growing {
            let remainder = entry.first_block % self.growing.len();
            self.growing[remainder] -= 1;
        }
        self.running -= 1;
        self.available += held as i64;
        Some(held)
    }

    /// One decode step's growth: every sequence whose last block is full takes one, preempting the newest
    /// sequences (to the front of `queue`) while the pool is short.
    fn grow(&mut self, step: usize, queue: &mut VecDeque<Option<Resident>>) {
        while let Some(&Reverse((at, index))) = self.starting.peek() {
            if at > step {
                break;
            }
            self.starting.pop();
            let cycle = self.growing.len();
            let entry = &mut self.entries[index];
            if entry.present {
                entry.growing = true;
                self.growing[entry.first_block % cycle] += 1;
            }
        }
        self.available -= self.growing[step % self.growing.len()] as i64;
        while self.available < 0 {
            let Some((_, index)) = self.newest.pop() else { break };
            let Some(held) = self.leave(index, step) else { continue };
            let Entry { sequence, entered, .. } = self.entries[index];
            let steps_left = (entered + sequence.steps_left).saturating_sub(step).max(1);
            queue.push_front(Some(Resident { blocks: held, steps_left, next_block: 1, ..sequence }));
        }
    }

    /// The sequences that have run their course by `step` give back their blocks.
    fn finish(&mut self, step: usize) {
        while let Some(&Reverse((at, index))) = self.finishing.peek() {
            if at > step {
                break;
            }
            self.finishing.pop();
            self.leave(index, step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident(order: u64, steps_left: usize, blocks: usize, next_block: usize) -> Resident {
        Resident { order, steps_left, blocks, next_block }
    }

    fn pool(available: usize, max_running: usize) -> Pool {
        Pool { available, reserve: 0, block_size: 16, max_running }
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
        // Sequences that take no new block within the horizon.
        let running = [resident(1, 15, 10, 1000), resident(2, 5, 2, 1000), resident(3, 10, 5, 1000)];
        assert_eq!(steps_until_admitted(&running, &[], 1, pool(1, 8), 100), Some(1), "room now: the next step");
        assert_eq!(
            steps_until_admitted(&running, &[], 3, pool(1, 8), 100),
            Some(5),
            "the first to finish frees enough"
        );
        assert_eq!(steps_until_admitted(&running, &[], 8, pool(1, 8), 100), Some(10), "the first two together");
        assert_eq!(steps_until_admitted(&running, &[], 1, pool(1, 3), 100), Some(5), "a slot: the first to finish");
        let waiting = [resident(4, 50, 1, 1000), resident(5, 50, 1, 1000)];
        assert_eq!(
            steps_until_admitted(&running, &waiting, 1, pool(100, 4), 100),
            Some(10),
            "the two ahead of it take the free slot and the first that frees"
        );
        assert_eq!(steps_until_admitted(&running, &[], 100, pool(1, 8), 100), None, "more than the pool will have");
        assert_eq!(steps_until_admitted(&running, &[], 8, pool(1, 8), 9), None, "not within the horizon");
        assert_eq!(steps_until_admitted(&[], &[], 5, pool(5, 1), 10), Some(1), "nothing running: the next step");
    }

    #[test]
    fn running_sequences_grow_into_the_pool_while_it_waits() {
        // Four sequences whose last blocks fill 4 steps apart: a block every 4 steps between them. The
        // first finishes at step 20 (having taken blocks at steps 1 and 17), the second at step 40 (at 5,
        // 21 and 37).
        let running =
            [resident(0, 20, 10, 1), resident(1, 40, 10, 5), resident(2, 200, 10, 9), resident(3, 200, 10, 13)];
        // 10 free: 5 left at step 20, 17 after the first finish.
        assert_eq!(steps_until_admitted(&running, &[], 17, pool(10, 8), 100), Some(20));
        // Counting the finishes alone, 18 would be there at step 20 (10 + 10); with the growth, only after
        // the second finish: 17 - 4 taken + 13 given back.
        assert_eq!(steps_until_admitted(&running, &[], 18, pool(10, 8), 100), Some(40));
        assert_eq!(steps_until_admitted(&running, &[], 27, pool(10, 8), 100), None);
    }

    #[test]
    fn a_pool_growing_dry_preempts_the_newest_which_queue_again_ahead() {
        // Four sequences of 16 blocks whose last blocks are full, 2 blocks free: the first step's growth
        // takes 4 and preempts the newest, which gives back its 17 and queues ahead of the request. The
        // request would fit in the 15 then free; the preempted sequence needs 17 and holds the queue.
        let running: Vec<Resident> = (0..4).map(|order| resident(order, 1000, 16, 1)).collect();
        assert_eq!(steps_until_admitted(&running, &[], 2, pool(2, 8), 10), None);
        // A request queued ahead waits the same way.
        let waiting = [resident(9, 100, 1, 1)];
        assert_eq!(steps_until_admitted(&running, &waiting, 1, pool(2, 8), 10), None);
        // With room to grow, nothing is preempted and the request is admitted in the next step.
        assert_eq!(steps_until_admitted(&running, &[], 4, pool(40, 8), 50), Some(1));
    }
}

//! Each replica's load as routing sees it: what the replica last reported, corrected by what this router
//! has seen since. Synchronous and clock-free (time comes in as [`Millis`]); the gateway and the simulator
//! both feed it, so a change to load accounting can be measured in virtual time first.
//!
//! An agent numbers the requests its engine accepts (0, 1, 2, ...), acknowledges each Generate with that
//! number, and every batch of its event stream carries `next_request_id`: the batch's load counts every
//! unfinished request below it and none above, and the numbers of the requests that finished since the
//! previous batch. So a request this router sent adds to the replica's load from the send until a batch's
//! `next_request_id` passes its number (from then on the agent's own figures count it, until the agent
//! reports it finished) or it fails, and is tracked until the agent reports it finished. Nothing is
//! counted twice and nothing is missed, however the acknowledgement and the batches interleave: the two come
//! on different streams, so a short request can be reported finished before its acknowledgement arrives,
//! and the ledger keeps the numbers of the latest finished requests it could not match for that.
//!
//! The router also sees each request's first token the moment it streams back, which is when the replica
//! finished computing its prompt: from then on its prompt tokens are no longer queued there, even while the
//! latest report (taken earlier) still counts them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use kvroute_proto::BlockHash;
use kvroute_proto::block_hash::BlockHashMap;
use kvroute_proto::domain::LoadStats;

use super::{Millis, ReplicaId};

/// The window of the send-rate average: a rate is the sends of about the last this many milliseconds.
pub const RATE_WINDOW_MS: f64 = 10_000.0;

/// Finished request numbers a replica's ledger keeps when none of this router's acknowledged requests had
/// them: other senders' requests, or this router's whose acknowledgement is still on its way.
const UNMATCHED_FINISHES: usize = 1024;

/// One request sent to a replica, from the send until the ledger no longer needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SendTicket {
    replica: ReplicaId,
    serial: u64,
}

impl SendTicket {
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }
}

/// A request this router sent, until the agent reports it finished.
#[derive(Clone, Debug)]
struct Sent {
    /// Its prompt's full blocks, active on the replica while it runs.
    blocks: Arc<[BlockHash]>,
    /// The engine's id, once the agent acknowledged the request.
    engine_id: Option<u64>,
    /// Prompt tokens it brings that the replica is not expected to hold.
    uncached_tokens: u64,
    /// Tokens it may generate at most (its `max_tokens`): how long it holds a running slot.
    output_tokens: u32,
    /// When its first token came back: its prompt is computed.
    prefilled_at: Option<Millis>,
}

#[derive(Clone, Debug, Default)]
struct ReplicaLoad {
    reported: LoadStats,
    /// When `reported` was true at the replica.
    reported_at: Millis,
    /// Requests this router sent it.
    sends: Rate,
    /// Requests it reported finished.
    finishes: Rate,
    /// Epoch of the stream that sent `reported` (engine ids count within one epoch).
    epoch: u64,
    /// `next_request_id` of the latest report.
    next_request_id: u64,
    /// This router's requests the agent has not reported finished, by ticket serial.
    sent: HashMap<u64, Sent>,
    /// The distinct prompt blocks of `sent`, each with the number of those requests that hold it.
    active: BlockHashMap<u32>,
    /// The latest finished request numbers (this epoch) that matched no acknowledged request, oldest first.
    unmatched_finishes: VecDeque<u64>,
}

impl ReplicaLoad {
    fn hold(&mut self, request: Sent, serial: u64) {
        for block in request.blocks.iter() {
            *self.active.entry(*block).or_default() += 1;
        }
        self.sent.insert(serial, request);
    }

    /// Drops the requests `gone` says are gone, releasing their blocks.
    fn release(&mut self, mut gone: impl FnMut(u64, &Sent) -> bool) {
        let active = &mut self.active;
        self.sent.retain(|serial, request| {
            if !gone(*serial, request) {
                return true;
            }
            for block in request.blocks.iter() {
                if let Some(count) = active.get_mut(block) {
                    *count -= 1;
                    if *count == 0 {
                        active.remove(block);
                    }
                }
            }
            false
        });
    }

    /// Whether the latest report counts `request`.
    fn counts(&self, request: &Sent) -> bool {
        request.engine_id.is_some_and(|id| id < self.next_request_id)
    }

    /// Requests waiting and running there: the latest report's, plus the sent requests it does not count
    /// (waiting until their first token, running after it).
    fn requests(&self) -> (u32, u32) {
        let (mut waiting, mut running) = (self.reported.waiting_requests, self.reported.running_requests);
        for request in self.sent.values().filter(|request| !self.counts(request)) {
            if request.prefilled_at.is_some() {
                running = running.saturating_add(1);
            } else {
                waiting = waiting.saturating_add(1);
            }
        }
        (waiting, running)
    }

    /// Decode steps until a running slot frees for one more request ([`TrackedLoad::slot_wait_steps`]).
    fn slot_wait_steps(&self, now: Millis) -> u64 {
        let cap = self.reported.max_running_requests as usize;
        let (waiting, running) = self.requests();
        let ahead = waiting as usize + running as usize;
        if cap == 0 || ahead < cap || self.sent.is_empty() {
            return 0;
        }
        let step_ms = self.reported.decode_step_seconds * 1000.0;
        // A running request has generated about one token per decode step since its first; it holds its slot
        // until it has generated its `max_tokens` (at least one step more).
        let left = |request: &Sent| -> u64 {
            let generated = match request.prefilled_at {
                Some(at) if step_ms > 0.0 => (now.saturating_sub(at) as f64 / step_ms) as u64,
                _ => 0,
            };
            u64::from(request.output_tokens).saturating_sub(generated).max(1)
        };
        let mut frees: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(ahead.max(cap));
        let mut queued: Vec<(u64, u64)> = Vec::new();
        for (serial, request) in &self.sent {
            if request.prefilled_at.is_some() {
                frees.push(Reverse(left(request)));
            } else {
                queued.push((*serial, left(request)));
            }
        }
        // Requests of other senders: they hold their slots as long as this router's do, on average.
        let known = self.sent.len();
        if ahead > known {
            let mean = self.sent.values().map(left).sum::<u64>() / known as u64;
            frees.extend(std::iter::repeat_n(Reverse(mean), ahead - known));
        }
        // The queued requests take slots in the order they were sent, each as the earliest one frees.
        queued.sort_unstable();
        let mut free_at = 0;
        for (_, steps) in queued {
            free_at = next_free_slot(&mut frees, cap, free_at);
            frees.push(Reverse(free_at + steps));
        }
        next_free_slot(&mut frees, cap, free_at)
    }
}

/// When a slot frees for one more request among `frees` (the steps at which taken slots free) with `cap`
/// slots: pops the earliest until fewer than `cap` are taken, returning the last popped (`after` if none).
fn next_free_slot(frees: &mut BinaryHeap<Reverse<u64>>, cap: usize, after: u64) -> u64 {
    let mut at = after;
    while frees.len() >= cap.max(1) {
        let Some(Reverse(free)) = frees.pop() else { break };
        at = free;
    }
    at
}

/// The load of every replica a router sends to.
#[derive(Clone, Debug, Default)]
pub struct LoadLedger {
    replicas: HashMap<ReplicaId, ReplicaLoad>,
    next_serial: u64,
}

impl LoadLedger {
    pub fn new() -> LoadLedger {
        LoadLedger::default()
    }

    /// Counts a request sent to `replica` at `now` with `uncached_tokens` prompt tokens to compute there, at
    /// most `output_tokens` to generate, and the prompt's full `blocks`.
    pub fn sent(
        &mut self,
        replica: ReplicaId,
        uncached_tokens: u64,
        output_tokens: u32,
        blocks: Arc<[BlockHash]>,
        now: Millis,
    ) -> SendTicket {
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.replicas.entry(replica).or_default();
        entry.hold(Sent { blocks, engine_id: None, uncached_tokens, output_tokens, prefilled_at: None }, serial);
        entry.sends.add(1, now);
        SendTicket { replica, serial }
    }

    /// The agent accepted the request as `engine_id` (in the stream epoch of the latest report).
    pub fn accepted(&mut self, ticket: SendTicket, engine_id: u64) {
        // A ticket the ledger dropped (its replica was forgotten since) counts nowhere.
        let Some(entry) = self.replicas.get_mut(&ticket.replica) else { return };
        if let Some(at) = entry.unmatched_finishes.iter().rposition(|&id| id == engine_id) {
            // Reported finished before this acknowledgement came: it is gone already.
            entry.unmatched_finishes.remove(at);
            entry.release(|serial, _| serial == ticket.serial);
        } else if let Some(request) = entry.sent.get_mut(&ticket.serial) {
            request.engine_id = Some(engine_id);
        }
    }

    /// The request's first token came back at `now`: the replica has computed its prompt.
    pub fn prefilled(&mut self, ticket: SendTicket, now: Millis) {
        if let Some(request) = self.request(ticket) {
            request.prefilled_at.get_or_insert(now);
        }
    }

    /// The request failed, or was never acknowledged: stop counting it.
    pub fn abandoned(&mut self, ticket: SendTicket) {
        if let Some(replica) = self.replicas.get_mut(&ticket.replica) {
            replica.release(|serial, _| serial == ticket.serial);
        }
    }

    fn request(&mut self, ticket: SendTicket) -> Option<&mut Sent> {
        self.replicas.get_mut(&ticket.replica)?.sent.get_mut(&ticket.serial)
    }

    /// A batch of `replica`'s event stream: its load as of `at`, counting the requests below
    /// `next_request_id`, and the requests that finished since the previous batch.
    pub fn reported(
        &mut self,
        replica: ReplicaId,
        epoch: u64,
        load: &LoadStats,
        next_request_id: u64,
        finished: &[u64],
        at: Millis,
    ) {
        let entry = self.replicas.entry(replica).or_default();
        if entry.epoch != epoch {
            // A restarted engine numbers from 0 again, and lost whatever the old one had accepted.
            entry.release(|_, request| request.engine_id.is_some());
            entry.unmatched_finishes.clear();
            entry.epoch = epoch;
        }
        if !finished.is_empty() {
            let mut matched = Vec::new();
            entry.release(|_, request| {
                let gone = request.engine_id.filter(|id| finished.contains(id));
                matched.extend(gone);
                gone.is_some()
            });
            for id in finished.iter().filter(|id| !matched.contains(id)) {
                if entry.unmatched_finishes.len() == UNMATCHED_FINISHES {
                    entry.unmatched_finishes.pop_front();
                }
                entry.unmatched_finishes.push_back(*id);
            }
        }
        entry.finishes.add(finished.len(), at);
        entry.reported = load.clone();
        entry.reported_at = at;
        entry.next_request_id = next_request_id;
    }

    /// Forgets a replica (removed, or its stream broke): its next report starts afresh.
    pub fn forget(&mut self, replica: ReplicaId) {
        self.replicas.remove(&replica);
    }

    /// The load to route on: the latest report, less the prompts of requests it counts that have streamed
    /// their first token since, plus the sent requests it does not count (waiting, with their uncached
    /// prompt tokens queued, until their first token; running after it), whose prompts take blocks of
    /// `block_size` tokens there.
    pub fn load(&self, replica: ReplicaId, block_size: u32) -> LoadStats {
        let Some(entry) = self.replicas.get(&replica) else { return LoadStats::default() };
        let mut load = entry.reported.clone();
        let (mut added, mut computed_since, mut new_blocks) = (0u64, 0u64, 0u64);
        for request in entry.sent.values() {
            if entry.counts(request) {
                if request.prefilled_at.is_some_and(|at| at > entry.reported_at) {
                    computed_since += request.uncached_tokens;
                }
            } else if request.prefilled_at.is_none() {
                added += request.uncached_tokens;
            }
            if !entry.counts(request) {
                // Its prompt takes blocks there from its admission on; the report shows them once it counts it.
                new_blocks += request.uncached_tokens.div_ceil(u64::from(block_size.max(1)));
            }
        }
        load.kv_blocks_used = load.kv_blocks_used.saturating_add(new_blocks).min(load.kv_blocks_total);
        (load.waiting_requests, load.running_requests) = entry.requests();
        load.queued_prefill_tokens = load.queued_prefill_tokens.saturating_sub(computed_since).saturating_add(added);
        load
    }

    /// What this router alone knows of `replica`, as Dynamo's router tracks a worker: the uncached prompt
    /// tokens of its requests there that have not streamed a first token yet, the distinct prompt blocks of
    /// its unfinished requests there, and how many of `blocks` are among them.
    pub fn tracked(&self, replica: ReplicaId, blocks: &[BlockHash], now: Millis) -> TrackedLoad {
        let Some(entry) = self.replicas.get(&replica) else { return TrackedLoad::default() };
        // One walk down the request's chain: how many of its leading blocks are active, and how many requests
        // hold the deepest of them.
        let (request_active_blocks, request_sharers) = blocks
            .iter()
            .map_while(|block| entry.active.get(block))
            .fold((0, 0), |(depth, _), &held| (depth + 1, held));
        TrackedLoad {
            send_rate: entry.sends.per_second(now),
            finish_rate: entry.finishes.per_second(now),
            prefill_tokens: entry
                .sent
                .values()
                .filter(|request| request.prefilled_at.is_none())
                .map(|request| request.uncached_tokens)
                .sum(),
            active_blocks: entry.active.len() as u64,
            request_active_blocks,
            request_sharers,
            slot_wait_steps: entry.slot_wait_steps(now),
        }
    }

    /// Sent requests of `replica` its latest report does not count.
    pub fn unreported(&self, replica: ReplicaId) -> usize {
        self.replicas.get(&replica).map_or(0, |entry| entry.sent.values().filter(|r| !entry.counts(r)).count())
    }

    /// This router's requests on `replica`: sent and not yet reported finished.
    pub fn in_flight(&self, replica: ReplicaId) -> usize {
        self.replicas.get(&replica).map_or(0, |entry| entry.sent.len())
    }
}

/// A replica's load as this router's own requests make it ([`LoadLedger::tracked`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TrackedLoad {
    /// Requests this router sent it per second, lately.
    pub send_rate: f64,
    /// Requests it reported finished per second, lately (whoever sent them).
    pub finish_rate: f64,
    pub prefill_tokens: u64,
    pub active_blocks: u64,
    /// Of the request being routed, the leading full blocks already active there (a request holds its
    /// whole chain, so these are all of its blocks that are).
    pub request_active_blocks: u64,
    /// This router's unfinished requests there that hold all of those blocks: the requests now sharing the
    /// prefix the request shares with them there.
    pub request_sharers: u32,
    /// Decode steps until one more request gets a running slot there, when the engine runs as many
    /// sequences as it may (its `max_running_requests`) and more wait: the requests ahead hold their slots
    /// until they have generated their `max_tokens` (the running ones counted from their first token, at
    /// one token per reported decode step), and the waiting ones take slots in the order they were sent.
    /// 0 while a slot is free or the cap is unknown.
    pub slot_wait_steps: u64,
}

/// Events per second, an exponential moving average over about [`RATE_WINDOW_MS`].
#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    per_second: f64,
    at: Millis,
}

impl Rate {
    fn add(&mut self, events: usize, now: Millis) {
        self.per_second = self.per_second(now) + events as f64 * 1000.0 / RATE_WINDOW_MS;
        self.at = self.at.max(now);
    }

    fn per_second(&self, now: Millis) -> f64 {
        self.per_second * (-(now.saturating_sub(self.at) as f64) / RATE_WINDOW_MS).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(waiting: u32, queued: u64) -> LoadStats {
        LoadStats { waiting_requests: waiting, queued_prefill_tokens: queued, ..LoadStats::default() }
    }

    fn blocks(ids: &[u8]) -> Arc<[BlockHash]> {
        ids.iter().map(|&id| BlockHash([id; 16])).collect()
    }

    fn counted(ledger: &LoadLedger, replica: ReplicaId) -> (u32, u64) {
        let load = ledger.load(replica, 16);
        (load.waiting_requests, load.queued_prefill_tokens)
    }

    #[test]
    fn a_request_counts_from_the_send_until_a_report_includes_it() {
        let mut ledger = LoadLedger::new();
        ledger.reported(0, 1, &load(0, 0), 5, &[], 0);
        let ticket = ledger.sent(0, 100, 1, blocks(&[]), 0);
        assert_eq!(counted(&ledger, 0), (1, 100), "sent, not acknowledged");
        ledger.accepted(ticket, 5);
        assert_eq!(counted(&ledger, 0), (1, 100), "acknowledged, not reported");
        ledger.reported(0, 1, &load(0, 0), 5, &[], 0);
        assert_eq!(counted(&ledger, 0), (1, 100), "a report from before its acceptance");
        ledger.reported(0, 1, &load(1, 90), 6, &[], 0);
        assert_eq!(counted(&ledger, 0), (1, 90), "the agent's figures count it now, and only they do");
        assert_eq!(ledger.in_flight(0), 1);
        ledger.reported(0, 1, &load(0, 0), 6, &[5], 0);
        assert_eq!(counted(&ledger, 0), (0, 0), "finished");
        assert_eq!(ledger.in_flight(0), 0);
    }

    #[test]
    fn a_request_reported_finished_before_its_acknowledgement_stops_counting_when_it_comes() {
        let mut ledger = LoadLedger::new();
        ledger.reported(4, 1, &load(0, 0), 0, &[], 0);
        let quick = ledger.sent(4, 50, 1, blocks(&[1, 2]), 0);
        let other = ledger.sent(4, 60, 1, blocks(&[3]), 0);
        // Another sender's request 0 and this router's 1 finish; the acknowledgement of 1 is still on its way.
        ledger.reported(4, 1, &load(0, 0), 2, &[0, 1], 5);
        assert_eq!(ledger.in_flight(4), 2);
        ledger.accepted(quick, 1);
        assert_eq!(ledger.in_flight(4), 1, "finished already: released at its acknowledgement");
        assert_eq!(ledger.tracked(4, &blocks(&[1, 2, 3]), 5).active_blocks, 1, "its blocks with it");
        // Request 2 is not among the finished: it counts until reported finished.
        ledger.accepted(other, 2);
        assert_eq!(ledger.in_flight(4), 1);
        ledger.reported(4, 1, &load(0, 0), 3, &[2], 6);
        assert_eq!(ledger.in_flight(4), 0);
        // The finished numbers are forgotten with their epoch: a new engine numbers from 0 again.
        let next = ledger.sent(4, 70, 1, blocks(&[]), 7);
        ledger.reported(4, 2, &load(0, 0), 0, &[], 7);
        ledger.accepted(next, 0);
        assert_eq!(ledger.in_flight(4), 1, "request 0 of the new epoch is not the old epoch's 0");
    }

    #[test]
    fn an_acknowledgement_after_the_report_that_counts_it_is_not_counted_twice() {
        let mut ledger = LoadLedger::new();
        let ticket = ledger.sent(3, 40, 1, blocks(&[]), 0);
        ledger.reported(3, 1, &load(1, 40), 1, &[], 0);
        assert_eq!(counted(&ledger, 3), (2, 80), "the ledger cannot tell yet that the report counts it");
        ledger.accepted(ticket, 0);
        assert_eq!(counted(&ledger, 3), (1, 40));
    }

    #[test]
    fn failed_requests_and_restarted_engines_stop_counting() {
        let mut ledger = LoadLedger::new();
        ledger.reported(1, 7, &load(0, 0), 10, &[], 0);
        let failed = ledger.sent(1, 10, 1, blocks(&[]), 0);
        let accepted = ledger.sent(1, 20, 1, blocks(&[]), 0);
        let in_flight = ledger.sent(1, 30, 1, blocks(&[]), 0);
        ledger.accepted(accepted, 12);
        ledger.abandoned(failed);
        assert_eq!(counted(&ledger, 1), (2, 50));
        ledger.reported(1, 8, &load(0, 0), 0, &[], 0);
        assert_eq!(counted(&ledger, 1), (1, 30), "the new epoch lost request 12; the unacknowledged one stays");
        ledger.accepted(in_flight, 0);
        assert_eq!(counted(&ledger, 1), (1, 30));
        ledger.forget(1);
        assert_eq!(counted(&ledger, 1), (0, 0));
        assert_eq!(ledger.unreported(1), 0);
    }

    #[test]
    fn a_first_token_takes_the_prompt_off_the_queue_before_any_report_does() {
        let mut ledger = LoadLedger::new();
        ledger.reported(2, 1, &load(0, 0), 0, &[], 0);
        let early = ledger.sent(2, 300, 1, blocks(&[]), 10);
        let late = ledger.sent(2, 200, 1, blocks(&[]), 10);
        ledger.accepted(early, 0);
        ledger.accepted(late, 1);
        ledger.prefilled(early, 20);
        let seen = ledger.load(2, 16);
        assert_eq!((seen.waiting_requests, seen.running_requests, seen.queued_prefill_tokens), (1, 1, 200));
        // A report from before the first token still counts the prompt: its tokens come off.
        ledger.reported(2, 1, &load(2, 480), 2, &[], 15);
        assert_eq!(counted(&ledger, 2), (2, 180));
        // A report from after it does not count it any more: nothing comes off twice.
        ledger.reported(2, 1, &load(1, 200), 2, &[], 25);
        assert_eq!(counted(&ledger, 2), (1, 200));
        ledger.prefilled(late, 30);
        assert_eq!(counted(&ledger, 2), (1, 0), "the report still counts one waiting request; its tokens are computed");
    }

    #[test]
    fn tracked_load_counts_prompts_in_prefill_and_each_active_block_once() {
        let mut ledger = LoadLedger::new();
        ledger.reported(4, 1, &load(0, 0), 0, &[], 0);
        let first = ledger.sent(4, 48, 1, blocks(&[1, 2, 3]), 0);
        let second = ledger.sent(4, 16, 1, blocks(&[1, 2, 4]), 0);
        ledger.accepted(first, 0);
        ledger.accepted(second, 1);
        let tracked = ledger.tracked(4, &blocks(&[1, 2, 3, 9]), 0);
        assert_eq!((tracked.prefill_tokens, tracked.active_blocks, tracked.request_active_blocks), (64, 4, 3));
        ledger.prefilled(first, 5);
        assert_eq!(ledger.tracked(4, &[], 5).prefill_tokens, 16);
        ledger.reported(4, 1, &load(0, 0), 2, &[0], 6);
        let tracked = ledger.tracked(4, &blocks(&[1, 2, 3, 9]), 6);
        assert_eq!(
            (tracked.active_blocks, tracked.request_active_blocks),
            (3, 2),
            "blocks 1 and 2 stay with the second"
        );
        ledger.abandoned(second);
        let tracked = ledger.tracked(4, &blocks(&[1]), 6);
        assert_eq!((tracked.prefill_tokens, tracked.active_blocks, tracked.request_active_blocks), (0, 0, 0));
    }

    #[test]
    fn the_requests_sharing_a_prompts_prefix_are_those_holding_its_deepest_active_block() {
        let mut ledger = LoadLedger::new();
        ledger.reported(4, 1, &load(0, 0), 0, &[], 0);
        let first = ledger.sent(4, 48, 1, blocks(&[1, 2, 3]), 0);
        let second = ledger.sent(4, 16, 1, blocks(&[1, 2, 4]), 0);
        let sharers = |ledger: &LoadLedger, prompt: &[u8]| ledger.tracked(4, &blocks(prompt), 0).request_sharers;
        assert_eq!(sharers(&ledger, &[1, 2, 3, 9]), 1, "only the first holds block 3");
        assert_eq!(sharers(&ledger, &[1, 2, 7]), 2, "both hold blocks 1 and 2");
        assert_eq!(sharers(&ledger, &[5, 1, 2]), 0, "a chain that starts elsewhere shares nothing");
        ledger.abandoned(first);
        assert_eq!(sharers(&ledger, &[1, 2, 3, 9]), 1, "the second still holds blocks 1 and 2");
        ledger.abandoned(second);
        assert_eq!(sharers(&ledger, &[1, 2, 3, 9]), 0);
    }

    /// A replica running at most `cap` sequences with 10 ms decode steps, as of `at`.
    fn capped(cap: u32, waiting: u32, running: u32) -> LoadStats {
        LoadStats {
            waiting_requests: waiting,
            running_requests: running,
            max_running_requests: cap,
            decode_step_seconds: 0.01,
            ..LoadStats::default()
        }
    }

    #[test]
    fn a_full_replica_frees_a_slot_when_its_earliest_running_request_reaches_max_tokens() {
        let mut ledger = LoadLedger::new();
        ledger.reported(6, 1, &capped(2, 0, 0), 0, &[], 0);
        let long = ledger.sent(6, 10, 100, blocks(&[]), 0);
        assert_eq!(ledger.tracked(6, &[], 0).slot_wait_steps, 0, "a slot is free");
        let short = ledger.sent(6, 10, 60, blocks(&[]), 0);
        ledger.accepted(long, 0);
        ledger.accepted(short, 1);
        ledger.prefilled(long, 100);
        ledger.prefilled(short, 100);
        ledger.reported(6, 1, &capped(2, 0, 2), 2, &[], 100);
        // 500 ms after their first tokens both have generated 50 tokens: the short one has 10 to go.
        assert_eq!(ledger.tracked(6, &[], 600).slot_wait_steps, 10);
        // A request sent before this one takes that slot and holds it for its 30 tokens; the long one's
        // slot frees at 50.
        let queued = ledger.sent(6, 10, 30, blocks(&[]), 600);
        assert_eq!(ledger.tracked(6, &[], 600).slot_wait_steps, 40);
        ledger.reported(6, 1, &capped(2, 1, 2), 3, &[], 600);
        ledger.accepted(queued, 2);
        assert_eq!(ledger.tracked(6, &[], 600).slot_wait_steps, 40, "counted once, reported or not");
        // An engine of unknown cap, or one that has not measured a decode step, never makes it wait longer
        // than its requests' whole outputs.
        ledger.reported(6, 1, &capped(0, 1, 2), 3, &[], 600);
        assert_eq!(ledger.tracked(6, &[], 600).slot_wait_steps, 0);
        ledger.reported(6, 1, &LoadStats { decode_step_seconds: 0.0, ..capped(2, 1, 2) }, 3, &[], 600);
        assert_eq!(ledger.tracked(6, &[], 600).slot_wait_steps, 60 + 30);
    }

    #[test]
    fn requests_of_other_senders_hold_their_slots_as_long_as_this_routers_on_average() {
        let mut ledger = LoadLedger::new();
        ledger.reported(7, 1, &capped(3, 0, 0), 0, &[], 0);
        let mine = ledger.sent(7, 10, 40, blocks(&[]), 0);
        ledger.accepted(mine, 0);
        ledger.prefilled(mine, 0);
        // Three running, two of them another router's; the cap is three.
        ledger.reported(7, 1, &capped(3, 0, 3), 3, &[], 0);
        assert_eq!(ledger.tracked(7, &[], 0).slot_wait_steps, 40);
        ledger.reported(7, 1, &capped(3, 0, 2), 3, &[], 0);
        assert_eq!(ledger.tracked(7, &[], 0).slot_wait_steps, 0, "a slot is free");
    }

    #[test]
    fn send_and_finish_rates_average_over_the_window() {
        let mut ledger = LoadLedger::new();
        for second in 0..100 {
            ledger.sent(5, 1, 1, blocks(&[]), second * 1000);
        }
        let rate = ledger.tracked(5, &[], 99_000).send_rate;
        // The average of whole events over a 10 s window reads one a second 5% high.
        assert!((rate - 1.05).abs() < 0.01, "one request a second reads as {rate}");
        let later = ledger.tracked(5, &[], 99_000 + RATE_WINDOW_MS as u64).send_rate;
        assert!((later - rate / std::f64::consts::E).abs() < 1e-9, "a window later it has decayed by e: {later}");
        ledger.reported(5, 1, &load(0, 0), 0, &[0, 1, 2, 3, 4], 0);
        let finishes = ledger.tracked(5, &[], 0).finish_rate;
        assert!((finishes - 5.0 * 1000.0 / RATE_WINDOW_MS).abs() < 1e-9);
    }
}

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
//! counted twice and nothing is missed, however the acknowledgement and the batches interleave.
//!
//! The router also sees each request's first token the moment it streams back, which is when the replica
//! finished computing its prompt: from then on its prompt tokens are no longer queued there, even while the
//! latest report (taken earlier) still counts them.

use std::collections::HashMap;
use std::sync::Arc;

use kvroute_proto::block_hash::BlockHashMap;
use kvroute_proto::BlockHash;
use kvroute_proto::domain::LoadStats;

use super::{Millis, ReplicaId};

/// The window of the send-rate average: a rate is the sends of about the last this many milliseconds.
const RATE_WINDOW_MS: f64 = 10_000.0;

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
    /// When its first token came back: its prompt is computed.
    prefilled_at: Option<Millis>,
}

#[derive(Clone, Debug, Default)]
struct ReplicaLoad {
    reported: LoadStats,
    /// When `reported` was true at the replica.
    reported_at: Millis,
    /// Requests this router sent per second, a moving average over [`RATE_WINDOW_MS`], as of `rate_at`.
    send_rate: f64,
    rate_at: Millis,
    /// Epoch of the stream that sent `reported` (engine ids count within one epoch).
    epoch: u64,
    /// `next_request_id` of the latest report.
    next_request_id: u64,
    /// This router's requests the agent has not reported finished, by ticket serial.
    sent: HashMap<u64, Sent>,
    /// The distinct prompt blocks of `sent`, each with the number of those requests that hold it.
    active: BlockHashMap<u32>,
}

impl ReplicaLoad {
    fn hold(&mut self, request: Sent, serial: u64) {
        for block in request.blocks.iter() {
            *self.active.entry(*block).or_default() += 1;
        }
        self.sent.insert(serial, request);
    }

    /// Drops the requests `gone` says are gone, releasing their blocks.
    fn release(&mut self, gone: impl Fn(u64, &Sent) -> bool) {
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

    /// Counts a request sent to `replica` at `now` with `uncached_tokens` prompt tokens to compute there and
    /// the prompt's full `blocks`.
    pub fn sent(&mut self, replica: ReplicaId, uncached_tokens: u64, blocks: Arc<[BlockHash]>, now: Millis) -> SendTicket {
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.replicas.entry(replica).or_default();
        entry.hold(Sent { blocks, engine_id: None, uncached_tokens, prefilled_at: None }, serial);
        entry.send_rate = decayed(entry.send_rate, entry.rate_at, now) + 1000.0 / RATE_WINDOW_MS;
        entry.rate_at = entry.rate_at.max(now);
        SendTicket { replica, serial }
    }

    /// The agent accepted the request as `engine_id` (in the stream epoch of the latest report).
    pub fn accepted(&mut self, ticket: SendTicket, engine_id: u64) {
        // A ticket the ledger dropped (its replica was forgotten since) counts nowhere.
        if let Some(request) = self.request(ticket) {
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
            entry.epoch = epoch;
        }
        if !finished.is_empty() {
            entry.release(|_, request| request.engine_id.is_some_and(|id| finished.contains(&id)));
        }
        entry.reported = load.clone();
        entry.reported_at = at;
        entry.next_request_id = next_request_id;
    }

    /// Forgets a replica (removed, or its stream broke): its next report starts afresh.
    pub fn forget(&mut self, replica: ReplicaId) {
        self.replicas.remove(&replica);
    }

    /// The load to route on at `now`: the latest report, less the prompts of requests it counts that have
    /// streamed their first token since, plus the sent requests it does not count (as waiting requests with
    /// their uncached prompt tokens queued until their first token).
    pub fn load(&self, replica: ReplicaId, now: Millis) -> LoadStats {
        let _ = now;
        let Some(entry) = self.replicas.get(&replica) else { return LoadStats::default() };
        let mut load = entry.reported.clone();
        let (mut unreported, mut added, mut computed_since) = (0u32, 0u64, 0u64);
        for request in entry.sent.values() {
            if entry.counts(request) {
                if request.prefilled_at.is_some_and(|at| at > entry.reported_at) {
                    computed_since += request.uncached_tokens;
                }
            } else {
                unreported += 1;
                if request.prefilled_at.is_none() {
                    added += request.uncached_tokens;
                }
            }
        }
        load.waiting_requests = load.waiting_requests.saturating_add(unreported);
        load.queued_prefill_tokens = load.queued_prefill_tokens.saturating_sub(computed_since).saturating_add(added);
        load
    }

    /// What this router alone knows of `replica`, as Dynamo's router tracks a worker: the uncached prompt
    /// tokens of its requests there that have not streamed a first token yet, the distinct prompt blocks of
    /// its unfinished requests there, and how many of `blocks` are among them.
    pub fn tracked(&self, replica: ReplicaId, blocks: &[BlockHash]) -> TrackedLoad {
        let Some(entry) = self.replicas.get(&replica) else { return TrackedLoad::default() };
        TrackedLoad {
            prefill_tokens: entry
                .sent
                .values()
                .filter(|request| request.prefilled_at.is_none())
                .map(|request| request.uncached_tokens)
                .sum(),
            active_blocks: entry.active.len() as u64,
            request_active_blocks: blocks.iter().filter(|block| entry.active.contains_key(*block)).count() as u64,
        }
    }

    /// Requests this router sent to `replica` per second, averaged over about the last
    /// [`RATE_WINDOW_MS`].
    pub fn send_rate(&self, replica: ReplicaId, now: Millis) -> f64 {
        self.replicas.get(&replica).map_or(0.0, |entry| decayed(entry.send_rate, entry.rate_at, now))
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
    pub prefill_tokens: u64,
    pub active_blocks: u64,
    /// Of the request being routed, the full blocks already active there.
    pub request_active_blocks: u64,
}

/// An exponentially averaged rate set at `at`, as of `now`.
fn decayed(rate: f64, at: Millis, now: Millis) -> f64 {
    rate * (-(now.saturating_sub(at) as f64) / RATE_WINDOW_MS).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(waiting: u32, queued: u64) -> LoadStats {
        LoadStats { waiting_requests: waiting, queued_prefill_tokens: queued, ..LoadStats::default() }
    }

    fn counted(ledger: &LoadLedger, replica: ReplicaId) -> (u32, u64) {
        let load = ledger.load(replica, 0);
        (load.waiting_requests, load.queued_prefill_tokens)
    }

    #[test]
    fn a_request_counts_from_the_send_until_a_report_includes_it() {
        let mut ledger = LoadLedger::new();
        ledger.reported(0, 1, &load(0, 0), 5, &[], 0);
        let ticket = ledger.sent(0, 100, 0);
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
    fn an_acknowledgement_after_the_report_that_counts_it_is_not_counted_twice() {
        let mut ledger = LoadLedger::new();
        let ticket = ledger.sent(3, 40, 0);
        ledger.reported(3, 1, &load(1, 40), 1, &[], 0);
        assert_eq!(counted(&ledger, 3), (2, 80), "the ledger cannot tell yet that the report counts it");
        ledger.accepted(ticket, 0);
        assert_eq!(counted(&ledger, 3), (1, 40));
    }

    #[test]
    fn failed_requests_and_restarted_engines_stop_counting() {
        let mut ledger = LoadLedger::new();
        ledger.reported(1, 7, &load(0, 0), 10, &[], 0);
        let failed = ledger.sent(1, 10, 0);
        let accepted = ledger.sent(1, 20, 0);
        let in_flight = ledger.sent(1, 30, 0);
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
}

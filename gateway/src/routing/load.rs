//! Each replica's load as routing sees it: what the replica last reported, plus the requests this router
//! sent that the report does not count yet. Synchronous and clock-free; the gateway and the simulator both
//! feed it, so a change to load accounting can be measured in virtual time first.
//!
//! An agent numbers the requests its engine accepts (0, 1, 2, ...), acknowledges each Generate with that
//! number, and every batch of its event stream carries `next_request_id`: the batch's load counts every
//! unfinished request below it and none above, and the numbers of the requests that finished since the
//! previous batch. So a request this router sent adds to the replica's load from the send until a batch's
//! `next_request_id` passes its number (from then on the agent's own figures count it, until the agent
//! reports it finished) or it fails, and is tracked until the agent reports it finished. Nothing is
//! counted twice and nothing is missed, however the acknowledgement and the batches interleave.

use std::collections::{HashMap, HashSet};

use kvroute_proto::domain::LoadStats;

use super::ReplicaId;

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

/// A sent request the latest report does not count.
#[derive(Clone, Copy, Debug)]
struct Unreported {
    /// The engine's id, once the agent acknowledged the request.
    engine_id: Option<u64>,
    /// Prompt tokens it brings that the replica is not expected to hold.
    uncached_tokens: u64,
}

#[derive(Clone, Debug, Default)]
struct ReplicaLoad {
    reported: LoadStats,
    /// Epoch of the stream that sent `reported` (engine ids count within one epoch).
    epoch: u64,
    /// `next_request_id` of the latest report.
    next_request_id: u64,
    unreported: HashMap<u64, Unreported>,
    /// Engine ids of this router's acknowledged requests the agent has not reported finished.
    in_engine: HashSet<u64>,
}

impl ReplicaLoad {
    /// Whether the latest report counts the request with this engine id.
    fn counts(&self, engine_id: u64) -> bool {
        engine_id < self.next_request_id
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

    /// Counts a request sent to `replica` with `uncached_tokens` prompt tokens to compute there.
    pub fn sent(&mut self, replica: ReplicaId, uncached_tokens: u64) -> SendTicket {
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.replicas.entry(replica).or_default();
        entry.unreported.insert(serial, Unreported { engine_id: None, uncached_tokens });
        SendTicket { replica, serial }
    }

    /// The agent accepted the request as `engine_id` (in the stream epoch of the latest report).
    pub fn accepted(&mut self, ticket: SendTicket, engine_id: u64) {
        let Some(replica) = self.replicas.get_mut(&ticket.replica) else { return };
        // A ticket the ledger dropped (its replica was forgotten since) counts nowhere.
        if !replica.unreported.contains_key(&ticket.serial) {
            return;
        }
        replica.in_engine.insert(engine_id);
        if replica.counts(engine_id) {
            // The latest report already counts it.
            replica.unreported.remove(&ticket.serial);
        } else if let Some(request) = replica.unreported.get_mut(&ticket.serial) {
            request.engine_id = Some(engine_id);
        }
    }

    /// The request failed, or was never acknowledged: stop counting it.
    pub fn abandoned(&mut self, ticket: SendTicket) {
        if let Some(replica) = self.replicas.get_mut(&ticket.replica) {
            replica.unreported.remove(&ticket.serial);
        }
    }

    /// A batch of `replica`'s event stream: its load, counting the requests below `next_request_id`, and
    /// the requests that finished since the previous batch.
    pub fn reported(
        &mut self,
        replica: ReplicaId,
        epoch: u64,
        load: &LoadStats,
        next_request_id: u64,
        finished: &[u64],
    ) {
        let entry = self.replicas.entry(replica).or_default();
        if entry.epoch != epoch {
            // A restarted engine numbers from 0 again, and lost whatever the old one had accepted.
            entry.unreported.retain(|_, request| request.engine_id.is_none());
            entry.in_engine.clear();
            entry.epoch = epoch;
        }
        for id in finished {
            entry.in_engine.remove(id);
        }
        entry.reported = load.clone();
        entry.next_request_id = next_request_id;
        entry.unreported.retain(|_, request| request.engine_id.is_none_or(|id| id >= next_request_id));
    }

    /// Forgets a replica (removed, or its stream broke): its next report starts afresh.
    pub fn forget(&mut self, replica: ReplicaId) {
        self.replicas.remove(&replica);
    }

    /// The load to route on: the latest report plus the sent requests it does not count, as waiting
    /// requests with their uncached prompt tokens queued.
    pub fn load(&self, replica: ReplicaId) -> LoadStats {
        let Some(entry) = self.replicas.get(&replica) else { return LoadStats::default() };
        let mut load = entry.reported.clone();
        let unreported = entry.unreported.len();
        let tokens: u64 = entry.unreported.values().map(|request| request.uncached_tokens).sum();
        load.waiting_requests = load.waiting_requests.saturating_add(u32::try_from(unreported).unwrap_or(u32::MAX));
        load.queued_prefill_tokens = load.queued_prefill_tokens.saturating_add(tokens);
        load
    }

    /// Sent requests of `replica` its latest report does not count.
    pub fn unreported(&self, replica: ReplicaId) -> usize {
        self.replicas.get(&replica).map_or(0, |entry| entry.unreported.len())
    }

    /// This router's requests on `replica`: sent and not yet acknowledged, or acknowledged and not yet
    /// reported finished.
    pub fn in_flight(&self, replica: ReplicaId) -> usize {
        self.replicas.get(&replica).map_or(0, |entry| {
            entry.in_engine.len() + entry.unreported.values().filter(|request| request.engine_id.is_none()).count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(waiting: u32, queued: u64) -> LoadStats {
        LoadStats { waiting_requests: waiting, queued_prefill_tokens: queued, ..LoadStats::default() }
    }

    fn counted(ledger: &LoadLedger, replica: ReplicaId) -> (u32, u64) {
        let load = ledger.load(replica);
        (load.waiting_requests, load.queued_prefill_tokens)
    }

    #[test]
    fn a_request_counts_from_the_send_until_a_report_includes_it() {
        let mut ledger = LoadLedger::new();
        ledger.reported(0, 1, &load(0, 0), 5, &[]);
        let ticket = ledger.sent(0, 100);
        assert_eq!(counted(&ledger, 0), (1, 100), "sent, not acknowledged");
        ledger.accepted(ticket, 5);
        assert_eq!(counted(&ledger, 0), (1, 100), "acknowledged, not reported");
        ledger.reported(0, 1, &load(0, 0), 5, &[]);
        assert_eq!(counted(&ledger, 0), (1, 100), "a report from before its acceptance");
        ledger.reported(0, 1, &load(1, 90), 6, &[]);
        assert_eq!(counted(&ledger, 0), (1, 90), "the agent's figures count it now, and only they do");
        assert_eq!(ledger.in_flight(0), 1);
        ledger.reported(0, 1, &load(0, 0), 6, &[5]);
        assert_eq!(counted(&ledger, 0), (0, 0), "finished");
        assert_eq!(ledger.in_flight(0), 0);
    }

    #[test]
    fn an_acknowledgement_after_the_report_that_counts_it_is_not_counted_twice() {
        let mut ledger = LoadLedger::new();
        let ticket = ledger.sent(3, 40);
        ledger.reported(3, 1, &load(1, 40), 1, &[]);
        assert_eq!(counted(&ledger, 3), (2, 80), "the ledger cannot tell yet that the report counts it");
        ledger.accepted(ticket, 0);
        assert_eq!(counted(&ledger, 3), (1, 40));
    }

    #[test]
    fn failed_requests_and_restarted_engines_stop_counting() {
        let mut ledger = LoadLedger::new();
        ledger.reported(1, 7, &load(0, 0), 10, &[]);
        let failed = ledger.sent(1, 10);
        let accepted = ledger.sent(1, 20);
        let in_flight = ledger.sent(1, 30);
        ledger.accepted(accepted, 12);
        ledger.abandoned(failed);
        assert_eq!(counted(&ledger, 1), (2, 50));
        ledger.reported(1, 8, &load(0, 0), 0, &[]);
        assert_eq!(counted(&ledger, 1), (1, 30), "the new epoch lost request 12; the unacknowledged one stays");
        ledger.accepted(in_flight, 0);
        assert_eq!(counted(&ledger, 1), (1, 30));
        ledger.forget(1);
        assert_eq!(counted(&ledger, 1), (0, 0));
        assert_eq!(ledger.unreported(1), 0);
    }
}

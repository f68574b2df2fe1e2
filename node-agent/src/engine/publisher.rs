//! The event stream's sender, on a thread of its own: heartbeats keep coming while the engine thread is
//! inside a long step.
//!
//! After every step (and, while idle, every [`HEARTBEAT`]) the engine thread hands over what changed: its
//! KV events, the requests that finished, and its load at that moment ([`Handover`]). The publisher applies
//! the events to the [`ResidentView`], which is also what a new subscriber's snapshot is made from, so a
//! snapshot and the deltas after it always agree. It sends a batch at once when a hand-over carries events
//! or finished requests, and a heartbeat every [`HEARTBEAT`] in any case; a heartbeat sent during a step
//! says so, and for how long the step has run ([`StepProgress`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvroute_proto::domain::{KvEvent, KvEventBatch, LoadStats, Tier};
use tokio::sync::mpsc as tokio_mpsc;

use super::resident::ResidentView;

/// Interval of heartbeats on the event stream.
pub const HEARTBEAT: Duration = Duration::from_millis(100);

/// Capacity of one subscriber's queue; a subscriber that falls this far behind is dropped and must
/// resubscribe (it gets a fresh snapshot).
const SUBSCRIBER_QUEUE: usize = 1024;

/// Hand-overs queued between the engine thread and the publisher before the engine waits.
const HANDOVER_QUEUE: usize = 64;

/// Identity stamped on every event batch.
#[derive(Clone, Debug)]
pub struct StreamIdentity {
    pub agent_id: String,
    pub epoch: u64,
}

/// A fresh epoch for a [`StreamIdentity`]: nanoseconds since the Unix epoch, so a restarted agent (or an
/// engine restart in engine mode) starts a stream that gateways cannot mistake for the previous one.
pub fn fresh_epoch() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}

/// What the engine thread tells the publisher after a step.
#[derive(Clone, Debug, Default)]
pub struct Handover {
    pub events: Vec<KvEvent>,
    /// Engine request ids that finished, failed or were cancelled since the previous hand-over.
    pub finished_request_ids: Vec<u64>,
    /// The id the engine gives its next request: `load` counts every earlier one not finished.
    pub next_request_id: u64,
    pub load: LoadStats,
    /// KV bytes of one token, and the measured prefill rate (for the resident view's probes).
    pub bytes_per_token: f64,
    pub prefill_tokens_per_second: f64,
}

/// Whether the engine thread is inside a step, and since when: written by the engine thread around each
/// step, read by the publisher for every heartbeat.
#[derive(Debug)]
pub struct StepProgress {
    origin: Instant,
    /// Microseconds from `origin` to the start of the running step, plus one; 0 while no step runs.
    started: AtomicU64,
}

impl Default for StepProgress {
    fn default() -> Self {
        StepProgress { origin: Instant::now(), started: AtomicU64::new(0) }
    }
}

impl StepProgress {
    pub fn begin(&self) {
        let micros = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.started.store(micros + 1, Ordering::Release);
    }

    pub fn end(&self) {
        self.started.store(0, Ordering::Release);
    }

    /// How long the running step has run, or None between steps.
    pub fn running_for(&self) -> Option<Duration> {
        let started = self.started.load(Ordering::Acquire);
        let since = Duration::from_micros(started.checked_sub(1)?);
        Some(self.origin.elapsed().saturating_sub(since))
    }
}

enum Notice {
    Handover(Handover),
    Subscribe(tokio_mpsc::Sender<KvEventBatch>),
    /// The agent drained: end every stream (after its snapshot, for a subscriber that comes later).
    Drained,
    /// What the replica held is gone (its engine restarted): a new epoch, with nothing resident, and
    /// every stream ends so its subscriber comes back for the new epoch's snapshot.
    NewEpoch(u64),
    Shutdown,
}

/// The engine thread's and the server's end of the publisher.
#[derive(Clone)]
pub struct PublisherHandle {
    notices: mpsc::SyncSender<Notice>,
}

impl std::fmt::Debug for PublisherHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherHandle").finish()
    }
}

impl PublisherHandle {
    /// Starts the publisher thread. `resident` is kept current from the handed-over events.
    pub fn spawn(
        identity: StreamIdentity,
        resident: Arc<ResidentView>,
        progress: Arc<StepProgress>,
        initial: Handover,
    ) -> std::io::Result<PublisherHandle> {
        let (notices, receiver) = mpsc::sync_channel(HANDOVER_QUEUE);
        let mut publisher = Publisher {
            identity,
            resident,
            progress,
            subscribers: Vec::new(),
            load: LoadStats::default(),
            next_request_id: 0,
            drained: false,
        };
        publisher.absorb(initial);
        std::thread::Builder::new().name("kv-events".into()).spawn(move || publisher.run(receiver))?;
        Ok(PublisherHandle { notices })
    }

    /// Hands over a step's outcome; waits only when the publisher is [`HANDOVER_QUEUE`] hand-overs behind.
    pub fn hand_over(&self, handover: Handover) {
        let _ = self.notices.send(Notice::Handover(handover));
    }

    /// A stream of event batches: a snapshot first, then deltas and heartbeats. None when the publisher
    /// has stopped.
    pub fn subscribe(&self) -> Option<tokio_mpsc::Receiver<KvEventBatch>> {
        let (sender, receiver) = tokio_mpsc::channel(SUBSCRIBER_QUEUE);
        self.notices.send(Notice::Subscribe(sender)).ok()?;
        Some(receiver)
    }

    /// Ends every stream: the agent drained and will stop.
    pub fn drained(&self) {
        let _ = self.notices.send(Notice::Drained);
    }

    /// Starts epoch `epoch` with nothing resident (see [`Notice::NewEpoch`]).
    pub fn new_epoch(&self, epoch: u64) {
        let _ = self.notices.send(Notice::NewEpoch(epoch));
    }

    pub fn shutdown(&self) {
        let _ = self.notices.send(Notice::Shutdown);
    }
}

struct Subscriber {
    sender: tokio_mpsc::Sender<KvEventBatch>,
    seq: u64,
}

struct Publisher {
    identity: StreamIdentity,
    resident: Arc<ResidentView>,
    progress: Arc<StepProgress>,
    subscribers: Vec<Subscriber>,
    /// The engine's load at the latest hand-over.
    load: LoadStats,
    next_request_id: u64,
    drained: bool,
}

impl Publisher {
    fn run(mut self, notices: mpsc::Receiver<Notice>) {
        let mut next_heartbeat = Instant::now();
        loop {
            let wait = next_heartbeat.saturating_duration_since(Instant::now());
            match notices.recv_timeout(wait) {
                Ok(Notice::Handover(handover)) => {
                    let urgent = !handover.events.is_empty()
                        || !handover.finished_request_ids.is_empty()
                        || handover.load.draining != self.load.draining;
                    let (events, finished) = self.absorb(handover);
                    if urgent {
                        self.publish(events, finished);
                    }
                }
                Ok(Notice::Subscribe(sender)) => self.add_subscriber(sender),
                Ok(Notice::Drained) => {
                    self.drained = true;
                    // Subscribers were told (`draining` in every batch since the drain began); ending their
                    // streams lets the server's graceful shutdown finish instead of waiting on them forever.
                    self.subscribers.clear();
                }
                Ok(Notice::NewEpoch(epoch)) => {
                    self.identity.epoch = epoch;
                    let cleared = [KvEvent::Cleared { tier: Tier::Gpu }, KvEvent::Cleared { tier: Tier::Host }];
                    self.resident.apply(&cleared, 0.0, 0.0);
                    self.subscribers.clear();
                }
                Ok(Notice::Shutdown) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= next_heartbeat {
                self.publish(Vec::new(), Vec::new());
                next_heartbeat = Instant::now() + HEARTBEAT;
            }
        }
    }

    /// Takes a hand-over's state; returns its events and finished ids for publishing.
    fn absorb(&mut self, handover: Handover) -> (Vec<KvEvent>, Vec<u64>) {
        self.resident.apply(&handover.events, handover.bytes_per_token, handover.prefill_tokens_per_second);
        self.load = handover.load;
        self.next_request_id = handover.next_request_id;
        (handover.events, handover.finished_request_ids)
    }

    /// The latest load, with the running step (if any) as of now.
    fn load_now(&self) -> LoadStats {
        let mut load = self.load.clone();
        if let Some(running) = self.progress.running_for() {
            load.step_in_progress = true;
            load.step_seconds = running.as_secs_f64();
        }
        load
    }

    fn batch(&self, seq: u64, snapshot: bool, events: Vec<KvEvent>, finished: Vec<u64>) -> KvEventBatch {
        KvEventBatch {
            agent_id: self.identity.agent_id.clone(),
            epoch: self.identity.epoch,
            seq,
            snapshot,
            events,
            load: self.load_now(),
            sent_unix_micros: KvEventBatch::now_unix_micros(),
            finished_request_ids: finished,
            next_request_id: self.next_request_id,
        }
    }

    fn add_subscriber(&mut self, sender: tokio_mpsc::Sender<KvEventBatch>) {
        let snapshot = self.batch(0, true, self.resident.snapshot_events(), Vec::new());
        if sender.try_send(snapshot).is_ok() && !self.drained {
            self.subscribers.push(Subscriber { sender, seq: 1 });
        }
    }

    fn publish(&mut self, events: Vec<KvEvent>, finished: Vec<u64>) {
        if self.subscribers.is_empty() {
            return;
        }
        let template = self.batch(0, false, events, finished);
        self.subscribers.retain_mut(|subscriber| {
            let batch = KvEventBatch { seq: subscriber.seq, ..template.clone() };
            subscriber.seq += 1;
            // A full or closed queue ends the subscription; the subscriber sees the stream end and
            // resubscribes for a fresh snapshot.
            subscriber.sender.try_send(batch).is_ok()
        });
    }
}

//! Runs an [`Engine`] in its own thread and connects it to async callers.
//!
//! The thread owns the engine; callers talk to it through [`EngineHandle`]
//! (commands over a channel). It steps while there is work, publishes the
//! block manager's events to every subscriber right after each step, and a
//! heartbeat with load statistics every [`HEARTBEAT`]. It keeps a [`ResidentView`]
//! of the pool and host RAM that callers read without waiting for a step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvroute_proto::block_hash::BlockHash;
use kvroute_proto::domain::{AgentGenerateRequest, KvEvent, KvEventBatch, LoadStats};
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use super::resident::{Probe, ResidentView};
use super::{Engine, EngineStats, Executor, GenerateError, OutputSink, Prefetched};
use crate::block_manager::EventSink;
use crate::metrics;
use crate::tiers::network::NetworkTier;

/// Interval of load heartbeats on the event stream.
pub const HEARTBEAT: Duration = Duration::from_millis(100);

/// Events buffered between the block manager and the publisher.
#[derive(Clone, Default)]
pub struct SharedSink(Arc<Mutex<Vec<KvEvent>>>);

impl SharedSink {
    /// Adds an event from outside the engine (the network tier's writer).
    pub fn push(&self, event: KvEvent) {
        if let Ok(mut events) = self.0.lock() {
            events.push(event);
        }
    }

    /// Events buffered since the last call.
    pub fn take(&self) -> Vec<KvEvent> {
        self.0.lock().map(|mut events| std::mem::take(&mut *events)).unwrap_or_default()
    }
}

impl EventSink for SharedSink {
    fn emit(&mut self, event: KvEvent) {
        if let Ok(mut events) = self.0.lock() {
            events.push(event);
        }
    }
}

enum Command {
    Submit {
        request: AgentGenerateRequest,
        output: Box<dyn OutputSink>,
        prefetched: Prefetched,
        reply: oneshot::Sender<Result<u64, GenerateError>>,
    },
    Cancel(u64),
    Subscribe(tokio_mpsc::Sender<KvEventBatch>),
    Stats(oneshot::Sender<EngineStats>),
    Drain,
    Shutdown,
}

/// Capacity of one subscriber's queue; a subscriber that falls this far
/// behind is dropped and must resubscribe (it gets a fresh snapshot).
const SUBSCRIBER_QUEUE: usize = 1024;

struct Subscriber {
    sender: tokio_mpsc::Sender<KvEventBatch>,
    seq: u64,
}

/// Identity stamped on every event batch.
#[derive(Clone, Debug)]
pub struct StreamIdentity {
    pub agent_id: String,
    pub epoch: u64,
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Set by the engine thread after every step while it would refuse new requests as overloaded.
    refusing: Arc<AtomicBool>,
    resident: Arc<ResidentView>,
}

impl EngineHandle {
    /// Starts the engine thread. `sink` must be the sink the engine's block
    /// manager was built with.
    pub fn spawn<E: Executor + Send + 'static>(
        engine: Engine<E>,
        sink: SharedSink,
        identity: StreamIdentity,
        network: Option<NetworkTier>,
    ) -> EngineHandle {
        let (commands, receiver) = mpsc::channel();
        let refusing = Arc::new(AtomicBool::new(false));
        let resident = Arc::new(ResidentView::default());
        let engine_loop = EngineLoop::new(engine, sink, identity, network, refusing.clone(), resident.clone());
        let thread = std::thread::Builder::new().name("engine".into()).spawn(move || engine_loop.run(receiver)).ok();
        EngineHandle { commands, thread: Arc::new(Mutex::new(thread)), refusing, resident }
    }

    /// Whether the engine refuses new requests as overloaded (as of its last step): the server answers
    /// those at once, without waiting for the engine thread to finish its step.
    pub fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    /// Queues a request whose outputs go to `output`; resolves once the engine
    /// accepted or refused it.
    pub async fn submit(
        &self,
        request: AgentGenerateRequest,
        output: Box<dyn OutputSink>,
        prefetched: Prefetched,
    ) -> Result<u64, GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Submit { request, output, prefetched, reply })?;
        answer.await.map_err(|_| GenerateError::Unavailable("the engine stopped".into()))?
    }

    /// How many leading blocks of a chain the pool and host RAM held at the engine's last step.
    pub fn probe(&self, hashes: &[BlockHash]) -> Probe {
        self.resident.probe(hashes)
    }

    pub fn cancel(&self, id: u64) {
        let _ = self.send(Command::Cancel(id));
    }

    /// A stream of event batches: a snapshot first, then deltas and heartbeats.
    pub fn subscribe(&self) -> Result<tokio_mpsc::Receiver<KvEventBatch>, GenerateError> {
        let (sender, receiver) = tokio_mpsc::channel(SUBSCRIBER_QUEUE);
        self.send(Command::Subscribe(sender))?;
        Ok(receiver)
    }

    pub async fn stats(&self) -> Result<EngineStats, GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Stats(reply))?;
        answer.await.map_err(|_| GenerateError::Unavailable("the engine stopped".into()))
    }

    /// Stops admitting new requests; running and queued ones finish.
    pub fn drain(&self) {
        let _ = self.send(Command::Drain);
    }

    /// Stops the thread and waits for it.
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
        if let Ok(mut thread) = self.thread.lock()
            && let Some(thread) = thread.take()
        {
            let _ = thread.join();
        }
    }

    fn send(&self, command: Command) -> Result<(), GenerateError> {
        self.commands.send(command).map_err(|_| GenerateError::Unavailable("the engine stopped".into()))
    }
}

struct EngineLoop<E: Executor> {
    engine: Engine<E>,
    sink: SharedSink,
    identity: StreamIdentity,
    subscribers: Vec<Subscriber>,
    draining: bool,
    next_heartbeat: Instant,
    network: Option<NetworkTier>,
    refusing: Arc<AtomicBool>,
    resident: Arc<ResidentView>,
}

impl<E: Executor> EngineLoop<E> {
    fn new(
        engine: Engine<E>,
        sink: SharedSink,
        identity: StreamIdentity,
        network: Option<NetworkTier>,
        refusing: Arc<AtomicBool>,
        resident: Arc<ResidentView>,
    ) -> Self {
        resident.apply(&engine.snapshot_events(), engine.bytes_per_token(), engine.stats().prefill_tokens_per_second);
        EngineLoop {
            engine,
            sink,
            identity,
            subscribers: Vec::new(),
            draining: false,
            next_heartbeat: Instant::now(),
            network,
            refusing,
            resident,
        }
    }

    /// Block-manager events, then tier events, in the order they happened per tier.
    fn take_events(&mut self) -> Vec<KvEvent> {
        let mut events = self.sink.take();
        events.extend(self.engine.take_tier_events());
        events
    }

    fn run(mut self, commands: mpsc::Receiver<Command>) {
        loop {
            let wait = if self.engine.has_work() {
                Duration::ZERO
            } else {
                self.next_heartbeat.saturating_duration_since(Instant::now())
            };
            match commands.recv_timeout(wait) {
                Ok(command) => {
                    if !self.handle(command) {
                        return;
                    }
                    while let Ok(command) = commands.try_recv() {
                        if !self.handle(command) {
                            return;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if self.engine.has_work() {
                self.engine.step();
            }
            self.refusing.store(self.engine.admission_refusal().is_some(), Ordering::Relaxed);
            let events = self.take_events();
            let engine = &self.engine;
            self.resident.apply(&events, engine.bytes_per_token(), engine.stats().prefill_tokens_per_second);
            if !events.is_empty() {
                self.publish(events);
            }
            if Instant::now() >= self.next_heartbeat {
                metrics::record_engine(&self.engine);
                self.publish(Vec::new());
                self.next_heartbeat = Instant::now() + HEARTBEAT;
            }
            // Drained: subscribers were told (`draining` in every batch since the drain began); ending their
            // streams lets the server's graceful shutdown finish instead of waiting on them forever.
            if self.draining && !self.engine.has_work() {
                self.subscribers.clear();
            }
        }
    }

    /// Returns false to stop the loop.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit { request, output, prefetched, reply } => {
                let result = if self.draining {
                    Err(GenerateError::Unavailable("the agent is draining".into()))
                } else {
                    self.engine.submit_prefetched(request, output, prefetched)
                };
                if let Err(error) = &result {
                    metrics::record_rejection(error);
                }
                let _ = reply.send(result);
            }
            Command::Cancel(id) => self.engine.cancel(id),
            Command::Subscribe(sender) => self.add_subscriber(sender),
            Command::Stats(reply) => {
                let _ = reply.send(self.engine.stats().clone());
            }
            Command::Drain => {
                self.draining = true;
                self.publish(Vec::new());
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn load(&self) -> LoadStats {
        let stats = self.engine.stats();
        let blocks = self.engine.blocks();
        LoadStats {
            waiting_requests: self.engine.num_waiting() as u32,
            running_requests: self.engine.num_running() as u32,
            queued_prefill_tokens: self.engine.queued_prefill_tokens(),
            kv_blocks_used: blocks.num_used() as u64,
            kv_blocks_total: blocks.num_blocks() as u64,
            prefill_tokens_per_second: stats.prefill_tokens_per_second,
            decode_step_seconds: stats.decode_step_seconds,
            host_bytes_per_second: self.engine.tiering().host_bandwidth(),
            network_bytes_per_second: self.network.as_ref().map_or(0.0, NetworkTier::read_bandwidth),
            network_tier_up: self.network.as_ref().is_some_and(NetworkTier::is_up),
            draining: self.draining,
            queue_capacity: self.engine.config().max_waiting as u32,
        }
    }

    fn add_subscriber(&mut self, sender: tokio_mpsc::Sender<KvEventBatch>) {
        // Deliver pending deltas to existing subscribers first, so the new
        // subscriber's snapshot and everyone's later deltas agree.
        let pending = self.take_events();
        if !pending.is_empty() {
            self.publish(pending);
        }
        let snapshot = KvEventBatch {
            agent_id: self.identity.agent_id.clone(),
            epoch: self.identity.epoch,
            seq: 0,
            snapshot: true,
            events: self.engine.snapshot_events(),
            load: self.load(),
            sent_unix_micros: KvEventBatch::now_unix_micros(),
        };
        if sender.try_send(snapshot).is_ok() {
            self.subscribers.push(Subscriber { sender, seq: 1 });
        }
    }

    fn publish(&mut self, events: Vec<KvEvent>) {
        if self.subscribers.is_empty() {
            return;
        }
        let load = self.load();
        let identity = &self.identity;
        let sent_unix_micros = KvEventBatch::now_unix_micros();
        self.subscribers.retain_mut(|subscriber| {
            let batch = KvEventBatch {
                agent_id: identity.agent_id.clone(),
                epoch: identity.epoch,
                seq: subscriber.seq,
                snapshot: false,
                events: events.clone(),
                load: load.clone(),
                sent_unix_micros,
            };
            subscriber.seq += 1;
            // A full or closed queue ends the subscription; the subscriber
            // sees the stream end and resubscribes for a fresh snapshot.
            subscriber.sender.try_send(batch).is_ok()
        });
    }
}

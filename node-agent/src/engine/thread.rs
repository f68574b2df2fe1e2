//! Runs an [`Engine`] in its own thread and connects it to async callers.
//!
//! The thread owns the engine; callers talk to it through [`EngineHandle`] (commands over a bounded
//! channel: past [`COMMAND_QUEUE`] unread commands a new request is refused as overloaded). It steps while
//! there is work and, after every step, hands its KV events, finished requests and load to the
//! [`publisher`](super::publisher), which sends them and the heartbeats from a thread of its own. The
//! publisher keeps a [`ResidentView`] of the pool and host RAM that callers read without waiting for a step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvroute_proto::block_hash::BlockHash;
use kvroute_proto::domain::{AgentGenerateRequest, KvEvent, KvEventBatch, LoadStats};
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

pub use super::publisher::{HEARTBEAT, StreamIdentity};
use super::publisher::{Handover, PublisherHandle, StepProgress};
use super::resident::{Probe, ResidentView};
use super::{Engine, EngineStats, Executor, GenerateError, OutputSink, Prefetched};
use crate::block_manager::EventSink;
use crate::metrics;
use crate::tiers::host::HostTier;
use crate::tiers::network::NetworkTier;

/// Commands queued for the engine thread at most; a request arriving past that is refused as overloaded.
pub const COMMAND_QUEUE: usize = 1024;

/// How long the engine thread waits for a command when it has requests but none could make progress in its
/// last step (every one is waiting for its caller to read its earlier tokens).
const STALLED_POLL: Duration = Duration::from_millis(2);

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
        request: Box<AgentGenerateRequest>,
        output: Box<dyn OutputSink>,
        prefetched: Prefetched,
        reply: oneshot::Sender<Result<u64, GenerateError>>,
    },
    Stats(oneshot::Sender<EngineStats>),
    Drain,
    Shutdown,
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::SyncSender<Command>,
    publisher: PublisherHandle,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Set by the engine thread after every step while it would refuse new requests as overloaded.
    refusing: Arc<AtomicBool>,
    resident: Arc<ResidentView>,
}

impl EngineHandle {
    /// Starts the engine thread and its publisher. `sink` must be the sink the engine's block manager was
    /// built with.
    pub fn spawn<E: Executor + Send + 'static>(
        engine: Engine<E>,
        sink: SharedSink,
        identity: StreamIdentity,
        network: Option<NetworkTier>,
    ) -> std::io::Result<EngineHandle> {
        let (commands, receiver) = mpsc::sync_channel(COMMAND_QUEUE);
        let refusing = Arc::new(AtomicBool::new(false));
        let resident = Arc::new(ResidentView::default());
        let progress = Arc::new(StepProgress::default());
        let engine_loop = EngineLoop {
            engine,
            sink,
            network,
            refusing: refusing.clone(),
            progress: progress.clone(),
            draining: false,
        };
        let initial = Handover { events: engine_loop.engine.snapshot_events(), ..engine_loop.handover(Vec::new()) };
        let publisher = PublisherHandle::spawn(identity, resident.clone(), progress, initial)?;
        let loop_publisher = publisher.clone();
        let thread =
            std::thread::Builder::new().name("engine".into()).spawn(move || engine_loop.run(receiver, loop_publisher));
        let thread = match thread {
            Ok(thread) => thread,
            Err(error) => {
                publisher.shutdown();
                return Err(error);
            }
        };
        Ok(EngineHandle { commands, publisher, thread: Arc::new(Mutex::new(Some(thread))), refusing, resident })
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
        match self.commands.try_send(Command::Submit { request: Box::new(request), output, prefetched, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(GenerateError::Overloaded(format!(
                    "the agent is overloaded: {COMMAND_QUEUE} requests are queued for its engine"
                )));
            }
            Err(TrySendError::Disconnected(_)) => return Err(stopped()),
        }
        answer.await.map_err(|_| stopped())?
    }

    /// How many leading blocks of a chain the pool and host RAM held at the engine's last step.
    pub fn probe(&self, hashes: &[BlockHash]) -> Probe {
        self.resident.probe(hashes)
    }

    /// A stream of event batches: a snapshot first, then deltas and heartbeats.
    pub fn subscribe(&self) -> Result<tokio_mpsc::Receiver<KvEventBatch>, GenerateError> {
        self.publisher.subscribe().ok_or_else(stopped)
    }

    pub async fn stats(&self) -> Result<EngineStats, GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Stats(reply))?;
        answer.await.map_err(|_| stopped())
    }

    /// Stops admitting new requests; running and queued ones finish.
    pub fn drain(&self) {
        let _ = self.send(Command::Drain);
    }

    /// Stops the threads and waits for the engine's.
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
        if let Ok(mut thread) = self.thread.lock()
            && let Some(thread) = thread.take()
        {
            let _ = thread.join();
        }
        self.publisher.shutdown();
    }

    /// Sends a command the engine must see (not a request: those are refused when the queue is full).
    fn send(&self, command: Command) -> Result<(), GenerateError> {
        self.commands.send(command).map_err(|_| stopped())
    }
}

fn stopped() -> GenerateError {
    GenerateError::Unavailable("the engine stopped".into())
}

struct EngineLoop<E: Executor> {
    engine: Engine<E>,
    sink: SharedSink,
    network: Option<NetworkTier>,
    refusing: Arc<AtomicBool>,
    progress: Arc<StepProgress>,
    draining: bool,
}

impl<E: Executor> EngineLoop<E> {
    fn run(mut self, commands: mpsc::Receiver<Command>, publisher: PublisherHandle) {
        let mut progressed = false;
        let mut next_metrics = Instant::now();
        loop {
            // Idle, the thread still wakes every heartbeat: the network tier's writer adds events to the
            // sink from outside the engine, and they are handed over from here, in order.
            let wait = match (self.engine.has_work(), progressed) {
                (true, true) => Duration::ZERO,
                (true, false) => STALLED_POLL,
                (false, _) => HEARTBEAT,
            };
            match commands.recv_timeout(wait) {
                Ok(command) => {
                    if !self.handle(command, &publisher) {
                        return;
                    }
                    while let Ok(command) = commands.try_recv() {
                        if !self.handle(command, &publisher) {
                            return;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            progressed = false;
            if self.engine.has_work() {
                self.progress.begin();
                progressed = !self.engine.step().is_idle();
                self.progress.end();
            }
            self.refusing.store(self.engine.admission_refusal().is_some(), Ordering::Relaxed);
            let events = self.take_events();
            let finished = self.engine.take_finished_ids();
            publisher.hand_over(Handover { events, ..self.handover(finished) });
            if Instant::now() >= next_metrics {
                self.record_metrics();
                next_metrics = Instant::now() + HEARTBEAT;
            }
            if self.draining && !self.engine.has_work() {
                publisher.drained();
            }
        }
    }

    /// Block-manager events, then tier events, in the order they happened per tier.
    fn take_events(&mut self) -> Vec<KvEvent> {
        let mut events = self.sink.take();
        events.extend(self.engine.take_tier_events());
        events
    }

    /// A hand-over of the engine's current load, with `finished` and no events.
    fn handover(&self, finished: Vec<u64>) -> Handover {
        let engine = &self.engine;
        Handover {
            events: Vec::new(),
            finished_request_ids: finished,
            next_request_id: engine.next_request_id(),
            load: self.load(),
            bytes_per_token: engine.bytes_per_token(),
            prefill_tokens_per_second: engine.stats().prefill_tokens_per_second,
        }
    }

    /// Returns false to stop the loop.
    fn handle(&mut self, command: Command, publisher: &PublisherHandle) -> bool {
        match command {
            Command::Submit { request, output, prefetched, reply } => {
                let result = if self.draining {
                    Err(GenerateError::Unavailable("the agent is draining".into()))
                } else {
                    self.engine.submit_prefetched(*request, output, prefetched)
                };
                if let Err(error) = &result {
                    metrics::record_rejection(error.reason_label());
                }
                let _ = reply.send(result);
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.engine.stats().clone());
            }
            Command::Drain => {
                self.draining = true;
                publisher.hand_over(self.handover(Vec::new()));
            }
            Command::Shutdown => return false,
        }
        true
    }

    /// Publishes the engine's load and state to the agent's metrics.
    fn record_metrics(&self) {
        let (blocks, stats) = (self.engine.blocks(), self.engine.stats());
        let state = metrics::EngineState {
            kv_blocks_cached: blocks.num_cached(),
            kv_blocks_free: blocks.num_available() - blocks.num_cached(),
            host_tier_blocks: self.engine.tiering().host.as_ref().map(HostTier::len),
            prefix_hit_tokens: stats.prefix_hit_tokens_total,
            prompt_tokens: stats.prompt_tokens_total,
            generated_tokens: stats.generated_tokens_total,
            preemptions_recompute: stats.preemptions_recompute,
            preemptions_swap: stats.preemptions_swap,
            requests_finished: stats.requests_finished,
            requests_cancelled: stats.requests_cancelled,
        };
        metrics::record_engine(&self.load(), &state);
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
            max_running_requests: self.engine.config().max_running as u32,
            step_in_progress: false,
            step_seconds: 0.0,
        }
    }
}

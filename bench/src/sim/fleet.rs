//! One simulated run: N replicas, each the node-agent's own [`Engine`] (scheduler, admission with its
//! queue-delay limit, block manager, host tier, write-through) on a [`CostExecutor`] and a virtual
//! [`ManualClock`], a shared [`NetworkStore`], and the gateway's own [`PrefixIndex`], [`LoadLedger`] and
//! [`Policy`], all stepped in virtual time.
//!
//! The router knows a replica only from its event batches, as the gateway does: each replica publishes a
//! batch (KV events, load, finished request ids, next request id) after every step that changed something,
//! and a heartbeat every [`HEARTBEAT`] while busy; a batch reaches the router `event_lag` after it was
//! published. Requests the router sent count in the replica's load through the ledger until a batch counts
//! them. Deterministic: one thread, a seeded random source, events ordered by (time, sequence number).

use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvroute_gateway::routing::{
    CandidateScore, IndexConfig, LoadLedger, Policy, PolicyKind, PrefixIndex, ReplicaView, RouteRequest, ScoringConfig,
    SendTicket, SplitMix64, fleet_rates,
};
use kvroute_gateway::service::ServiceConfig;
use kvroute_node_agent::engine::publisher::HEARTBEAT;
use kvroute_node_agent::engine::resident::Probe;
use kvroute_node_agent::engine::thread::SharedSink;
use kvroute_node_agent::engine::tiering::DEFAULT_WRITE_THROUGH_HITS;
use kvroute_node_agent::engine::{
    Engine, EngineConfig, Executor, ManualClock, Output, PreemptionMode, Prefetched, Tiering,
};
use kvroute_node_agent::tiers::host::HostTier;
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvEvent, LoadStats, SamplingParams};
use kvroute_proto::{BlockHash, BlockHasher};

use super::executor::{CostExecutor, STAND_IN_BYTES};
use super::network::NetworkStore;
use super::plan::{Plan, session_prompt};
use super::profile::CostProfile;
use super::report::{PolicyResult, RequestRecord, Samples};

/// The model id every simulated replica serves (part of every block hash).
pub const MODEL_ID: &str = "kvroute-sim";

#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub replicas: usize,
    pub profile: CostProfile,
    pub policy: PolicyKind,
    pub seed: u64,
    /// How long a routed prefix counts as pending on its replica.
    pub pending_ttl_ms: u64,
    /// The routing tunables (the gateway's defaults unless an experiment changes them).
    pub scoring: ScoringConfig,
    /// Time from a replica publishing an event batch to the router applying it.
    pub event_lag: Duration,
    /// Keep a [`RequestRecord`] per request in the result.
    pub record_requests: bool,
}

/// The default event lag: the agent's heartbeat interval.
pub const DEFAULT_EVENT_LAG: Duration = HEARTBEAT;

type Outputs = Arc<Mutex<Vec<(usize, Output)>>>;

struct Replica {
    engine: Engine<CostExecutor>,
    events: SharedSink,
    outputs: Outputs,
    busy: bool,
    /// A heartbeat is scheduled.
    heartbeat: bool,
    /// What the running step produced, published when it ends.
    step_events: Vec<KvEvent>,
    step_outputs: Vec<(usize, Output)>,
    prefill_tokens: u64,
    /// While a step runs: what the agent knew when it began (its load and next request id) and when it
    /// began. The agent learns a step's results when it ends; a heartbeat meanwhile says a step is running.
    step_start: Option<(LoadStats, u64, f64)>,
}

/// A routed request on its way: the replicas to try, best first, and the attempt under way.
struct Route {
    live: usize,
    request: AgentGenerateRequest,
    hashes: Vec<BlockHash>,
    candidates: Vec<CandidateScore>,
    attempt: usize,
    /// Prompt tokens the first candidate was predicted to hold.
    predicted_cached: usize,
}

/// What a replica's event batch tells the router.
struct Batch {
    events: Vec<KvEvent>,
    /// Network-tier events, by the replica that caused them.
    network: Vec<(u16, KvEvent)>,
    load: LoadStats,
    next_request_id: u64,
    finished: Vec<u64>,
    /// When the replica published it.
    published_ms: u64,
}

/// A request in flight.
struct Live {
    arrival_s: f64,
    first_token_s: Option<f64>,
    /// What routing predicted and what happened, for `kvroute-sim --requests-out`.
    record: RequestRecord,
    /// The ledger's ticket once a replica took it.
    ticket: Option<SendTicket>,
    /// (session, turn) of a closed-loop request.
    turn: Option<(usize, usize)>,
    generated: Vec<u32>,
}

/// An event at a virtual time; ordered by (time, sequence number) alone, earliest first in the heap.
struct Scheduled {
    at_ns: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ns, self.seq) == (other.at_ns, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at_ns, other.seq).cmp(&(self.at_ns, self.seq))
    }
}

enum Event {
    Open(usize),
    Turn {
        session: usize,
        turn: usize,
    },
    Submit {
        route: Box<Route>,
        prefetched: Prefetched,
        ticket: SendTicket,
    },
    StepDone(usize),
    Heartbeat(usize),
    /// A batch reaches the router.
    Arrive {
        replica: usize,
        batch: Box<Batch>,
    },
}

pub struct Fleet<'a> {
    config: FleetConfig,
    plan: &'a Plan,
    replicas: Vec<Replica>,
    store: Option<Arc<Mutex<NetworkStore>>>,
    index: PrefixIndex,
    ledger: LoadLedger,
    clock: ManualClock,
    /// Replicas tried per request (the gateway's default).
    max_attempts: usize,
    policy: Policy,
    rng: SplitMix64,
    hasher: BlockHasher,
    queue: BinaryHeap<Scheduled>,
    next_event: u64,
    now: f64,
    live: Vec<Live>,
    histories: Vec<Vec<u32>>,
    samples: Samples,
}

impl<'a> Fleet<'a> {
    pub fn new(config: FleetConfig, plan: &'a Plan) -> anyhow::Result<Fleet<'a>> {
        let profile = &config.profile;
        let store = (profile.network_bytes > 0.0)
            .then(|| Arc::new(Mutex::new(NetworkStore::new((profile.network_bytes / profile.block_bytes()) as usize))));
        let clock = ManualClock::default();
        let replicas = (0..config.replicas).map(|id| replica(id, profile, store.clone(), &clock)).collect();
        let host_blocks = (profile.host_bytes / profile.block_bytes()) as usize;
        let held = config.replicas * (profile.num_blocks() + host_blocks)
            + (profile.network_bytes / profile.block_bytes()) as usize;
        let index = PrefixIndex::new(IndexConfig {
            max_entries: (held + held / 4).clamp(1 << 16, 1 << 23),
            max_replicas: config.replicas,
            ..IndexConfig::default()
        })?;
        if store.is_some() {
            for id in 0..config.replicas {
                index.set_network_tier_up(id as u16, true)?;
            }
        }
        let mut fleet = Fleet {
            policy: Policy::new(config.policy, config.scoring.clone()),
            rng: SplitMix64::new(config.seed),
            hasher: BlockHasher::new(profile.block_size as u32, MODEL_ID, b""),
            config,
            plan,
            replicas,
            store,
            index,
            ledger: LoadLedger::new(),
            clock,
            max_attempts: ServiceConfig::default().max_attempts,
            queue: BinaryHeap::new(),
            next_event: 0,
            now: 0.0,
            live: Vec::new(),
            histories: vec![Vec::new(); plan.sessions.len()],
            samples: Samples::default(),
        };
        for (index, request) in plan.open.iter().enumerate() {
            fleet.schedule(request.arrival_s, Event::Open(index));
        }
        for (session, state) in plan.sessions.iter().enumerate() {
            fleet.schedule(state.start_s, Event::Turn { session, turn: 0 });
        }
        // The subscription's first batch: the router learns each replica's capacity.
        for replica in 0..fleet.replicas.len() {
            fleet.publish_batch(replica);
        }
        Ok(fleet)
    }

    /// Runs until every request has finished or been refused.
    pub fn run(mut self) -> PolicyResult {
        while let Some(Scheduled { at_ns, event, .. }) = self.queue.pop() {
            self.now = at_ns as f64 / 1e9;
            self.clock.set(Duration::from_nanos(at_ns));
            match event {
                Event::Open(index) => {
                    let request = &self.plan.open[index];
                    let prompt = Arc::unwrap_or_clone(self.plan.prompt(&request.prompt));
                    self.arrive(prompt, request.output_tokens, None);
                }
                Event::Turn { session, turn } => {
                    let state = &self.plan.sessions[session];
                    let prompt = session_prompt(state, &state.turns[turn], &self.histories[session]);
                    self.arrive(prompt, state.turns[turn].output_tokens, Some((session, turn)));
                }
                Event::Submit { route, prefetched, ticket } => self.submit(*route, prefetched, ticket),
                Event::StepDone(replica) => self.step_done(replica),
                Event::Heartbeat(replica) => self.heartbeat(replica),
                Event::Arrive { replica, batch } => self.arrive_batch(replica, *batch),
            }
        }
        let stats: Vec<_> = self.replicas.iter().map(|replica| replica.engine.stats().clone()).collect();
        let prefill: Vec<u64> = self.replicas.iter().map(|replica| replica.prefill_tokens).collect();
        if self.config.record_requests {
            self.samples.records = self.live.iter().map(|live| live.record.clone()).collect();
        }
        let limit = EngineConfig::default().max_queue_delay.map_or(f64::INFINITY, |limit| limit.as_secs_f64());
        self.samples.finish(self.config.policy.name(), &stats, &prefill, limit)
    }

    fn schedule(&mut self, at_s: f64, event: Event) {
        let seq = self.next_event;
        self.next_event += 1;
        self.queue.push(Scheduled { at_ns: (at_s.max(0.0) * 1e9) as u64, seq, event });
    }

    fn now_ms(&self) -> u64 {
        (self.now * 1000.0) as u64
    }

    /// Routes a new request with the gateway's index and policy, then sends it to the best replica.
    fn arrive(&mut self, prompt: Vec<u32>, output_tokens: u32, turn: Option<(usize, usize)>) {
        let live = self.live.len();
        let record = RequestRecord { arrival_s: self.now, prompt_tokens: prompt.len(), ..RequestRecord::default() };
        self.live.push(Live {
            arrival_s: self.now,
            first_token_s: None,
            record,
            ticket: None,
            turn,
            generated: Vec::new(),
        });
        let hashes = self.hasher.hashes(&prompt);
        let lookup = self.index.lookup(&hashes, self.now_ms());
        let mut views: Vec<ReplicaView> = (0..self.replicas.len()).map(|id| self.view(id, &hashes)).collect();
        fleet_rates(&mut views);
        let request = RouteRequest {
            hashes: &hashes,
            prompt_tokens: prompt.len(),
            session_key: turn.map(|(session, _)| session as u64),
        };
        let decision = self.policy.decide(&request, &views, &lookup, &mut self.rng);
        let candidates: Vec<CandidateScore> =
            decision.ranked().into_iter().take(self.max_attempts.max(1)).cloned().collect();
        if candidates.is_empty() {
            self.samples.rejected += 1;
            return;
        }
        let predicted_cached = decision.predicted_cached_tokens(self.config.profile.block_size as u32) as usize;
        if let Some(chosen) = decision.chosen_candidate() {
            let record = &mut self.live[live].record;
            record.predicted_cached_tokens = predicted_cached;
            record.predicted_ttft_s = chosen.predicted_ttft_s;
            record.predicted_queue_s = chosen.prediction.queue_wait_s;
            if let Some(view) = views.iter().find(|view| view.id == chosen.replica) {
                record.seen_waiting = view.load.waiting_requests;
                record.seen_running = view.load.running_requests;
                record.seen_queued_tokens = view.load.queued_prefill_tokens;
                record.seen_kv_usage = view.load.kv_usage();
            }
            record.chosen_score = chosen.policy_score;
            if let Some(holder) = decision.candidates.iter().max_by_key(|candidate| candidate.matched_blocks()) {
                record.holder_score = holder.policy_score;
                record.holder_wait_s = holder.prediction.queue_wait_s;
                if let Some(view) = views.iter().find(|view| view.id == holder.replica) {
                    record.holder_kv_usage = view.load.kv_usage();
                    let load = &view.load;
                    record.holder_seen = (
                        load.waiting_requests,
                        load.running_requests,
                        load.queued_prefill_tokens,
                        load.prefill_tokens_per_second,
                    );
                }
            }
            record.best_cached_tokens = decision
                .candidates
                .iter()
                .map(|candidate| candidate.matched_blocks() as usize * self.config.profile.block_size)
                .max()
                .unwrap_or(0);
        }
        let request = AgentGenerateRequest {
            request_id: String::new(),
            prompt,
            cache_scope: Vec::new(),
            cache_mode: CacheMode::Shared,
            sampling: SamplingParams { temperature: 0.0, top_p: 1.0, seed: None },
            max_tokens: output_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: true,
        };
        self.dispatch(Route { live, request, hashes, candidates, attempt: 0, predicted_cached });
    }

    /// Sends a routed request to its current candidate, as the gateway does: its blocks count as pending
    /// there and the request in that replica's load; the agent fetches what the network tier holds beyond
    /// its own blocks before submitting.
    fn dispatch(&mut self, route: Route) {
        let candidate = &route.candidates[route.attempt];
        let chosen = candidate.replica;
        let replica = usize::from(chosen);
        let now_ms = self.now_ms();
        self.index.add_pending(chosen, candidate.unreached(&route.hashes), now_ms, self.config.pending_ttl_ms);
        let cached = if route.attempt == 0 { route.predicted_cached } else { 0 };
        let uncached = route.request.prompt.len().saturating_sub(cached) as u64;
        let output_tokens = route.request.max_tokens;
        let ticket = self.ledger.sent(chosen, uncached, output_tokens, route.hashes.as_slice().into(), now_ms);
        let profile = &self.config.profile;
        let hashes = &route.hashes;
        let mut prefetched = Prefetched::default();
        let mut delay = 0.0;
        if let Some(store) = &self.store {
            let engine = &self.replicas[replica].engine;
            // The agent's rule, with the modelled KV bytes per token (the simulated pool holds stand-ins).
            let probe = Probe { bytes_per_token: profile.kv_bytes_per_token, ..engine.probe(hashes) };
            if let Some(wanted) = probe.network_fetch(hashes.len(), profile.network_bandwidth) {
                let first = wanted.start;
                let run = store.lock().map(|mut store| store.fetch_run(&hashes[wanted])).unwrap_or(0);
                if run > 0 {
                    delay = profile.network_latency_seconds
                        + run as f64 * profile.block_bytes() / profile.network_bandwidth;
                    // One shared stand-in payload serves every fetched block.
                    let payload = Arc::new(vec![0; STAND_IN_BYTES]);
                    let blocks = std::iter::repeat_n(payload, run).collect();
                    prefetched = Prefetched { first_block: first, blocks, hold: None };
                }
            }
        }
        if delay > 0.0 {
            self.schedule(self.now + delay, Event::Submit { route: Box::new(route), prefetched, ticket });
        } else {
            self.submit(route, prefetched, ticket);
        }
    }

    /// Submits a routed request; the router learns the engine's id at once (as the acknowledgement). A
    /// replica refusing it as overloaded (the agent's admission rule) sends it on to the next candidate.
    fn submit(&mut self, mut route: Route, prefetched: Prefetched, ticket: SendTicket) {
        let replica = usize::from(route.candidates[route.attempt].replica);
        if self.replicas[replica].engine.refusal_for(&route.request).is_some() {
            self.ledger.abandoned(ticket);
            if route.attempt + 1 < route.candidates.len() {
                route.attempt += 1;
                self.dispatch(route);
            } else {
                self.samples.rejected += 1;
            }
            return;
        }
        let live = route.live;
        let state = &mut self.replicas[replica];
        let outputs = state.outputs.clone();
        let sink = Box::new(move |output: Output| {
            if let Ok(mut outputs) = outputs.lock() {
                outputs.push((live, output));
            }
            true
        });
        match state.engine.submit_prefetched(route.request, sink, prefetched) {
            Ok(id) => {
                self.ledger.accepted(ticket, id);
                self.live[live].ticket = Some(ticket);
                let record = &mut self.live[live].record;
                record.replica = Some(replica);
                record.attempt = route.attempt;
            }
            Err(_) => {
                self.ledger.abandoned(ticket);
                self.samples.rejected += 1;
                return;
            }
        }
        if !self.replicas[replica].busy {
            self.start_step(replica);
        }
    }

    /// Runs the replica's next engine step now; its results are published when its modelled time is up.
    fn start_step(&mut self, replica: usize) {
        let before = (self.replica_load(replica), self.replicas[replica].engine.next_request_id(), self.now);
        let state = &mut self.replicas[replica];
        state.step_start = Some(before);
        let report = state.engine.step();
        state.step_events.extend(state.events.take());
        state.step_events.extend(state.engine.take_tier_events());
        if let Ok(mut outputs) = state.outputs.lock() {
            state.step_outputs.append(&mut outputs);
        }
        if report.is_idle() {
            state.busy = false;
            state.step_start = None;
            self.step_finished(replica);
            return;
        }
        state.prefill_tokens += report.prefill_tokens as u64;
        state.busy = true;
        let seconds = state.engine.executor().modelled_seconds().unwrap_or(0.0);
        self.schedule(self.now + seconds, Event::StepDone(replica));
        if !self.replicas[replica].heartbeat {
            self.replicas[replica].heartbeat = true;
            self.schedule(self.now + HEARTBEAT.as_secs_f64(), Event::Heartbeat(replica));
        }
    }

    fn step_done(&mut self, replica: usize) {
        self.replicas[replica].step_start = None;
        self.step_finished(replica);
        if self.replicas[replica].engine.has_work() {
            self.start_step(replica);
        } else {
            self.replicas[replica].busy = false;
        }
    }

    /// A step's outputs reach their requests; its events, finished requests and the replica's load are
    /// published when they changed something (as the agent does).
    fn step_finished(&mut self, replica: usize) {
        let outputs = std::mem::take(&mut self.replicas[replica].step_outputs);
        for (live, output) in outputs {
            self.deliver(live, output);
        }
        self.publish_batch(replica);
    }

    /// The agent's heartbeat: its load, whatever changed; sent every [`HEARTBEAT`] while it is busy.
    fn heartbeat(&mut self, replica: usize) {
        self.publish_batch(replica);
        if self.replicas[replica].busy {
            self.schedule(self.now + HEARTBEAT.as_secs_f64(), Event::Heartbeat(replica));
        } else {
            self.replicas[replica].heartbeat = false;
        }
    }

    /// Publishes a batch of everything that changed at `replica` since its last one, to reach the router
    /// after the event lag.
    fn publish_batch(&mut self, replica: usize) {
        if let Some((load, next_request_id, started)) = self.replicas[replica].step_start.clone() {
            // Inside a step: what the agent's publisher has, the load before the step and its progress.
            let load = LoadStats { step_in_progress: true, step_seconds: self.now - started, ..load };
            let batch = Batch {
                events: Vec::new(),
                network: Vec::new(),
                load,
                next_request_id,
                finished: Vec::new(),
                published_ms: self.now_ms(),
            };
            let lag = self.config.event_lag.as_secs_f64();
            self.schedule(self.now + lag, Event::Arrive { replica, batch: Box::new(batch) });
            return;
        }
        let events = std::mem::take(&mut self.replicas[replica].step_events);
        let network = self.store.as_ref().and_then(|store| store.lock().ok().map(|mut store| store.take_events()));
        let batch = Batch {
            events,
            network: network.unwrap_or_default(),
            load: self.replica_load(replica),
            next_request_id: self.replicas[replica].engine.next_request_id(),
            finished: self.replicas[replica].engine.take_finished_ids(),
            published_ms: self.now_ms(),
        };
        let lag = self.config.event_lag.as_secs_f64();
        self.schedule(self.now + lag, Event::Arrive { replica, batch: Box::new(batch) });
    }

    /// A batch reaches the router: the index takes its events (network-tier ones under the replica that
    /// caused them), the ledger its load.
    fn arrive_batch(&mut self, replica: usize, batch: Batch) {
        let id = replica as u16;
        if !batch.events.is_empty() {
            let _ = self.index.apply_events(id, &batch.events);
        }
        for (source, event) in &batch.network {
            let _ = self.index.apply_events(*source, std::slice::from_ref(event));
        }
        self.ledger.reported(id, 0, &batch.load, batch.next_request_id, &batch.finished, batch.published_ms);
    }

    fn deliver(&mut self, live: usize, output: Output) {
        let now = self.now;
        let request = &mut self.live[live];
        if let Some(cached) = output.cached_tokens {
            request.record.cached_tokens = cached as usize;
        }
        if request.first_token_s.is_none() && !output.tokens.is_empty() {
            request.first_token_s = Some(now);
            if let Some(ticket) = request.ticket {
                self.ledger.prefilled(ticket, (now * 1000.0) as u64);
            }
            request.record.ttft_s = Some(now - request.arrival_s);
            self.samples.ttft.push(now - request.arrival_s);
        }
        request.generated.extend(&output.tokens);
        let Some((_, usage)) = output.finished else { return };
        self.samples.e2e.push(now - request.arrival_s);
        self.samples.output_tokens += u64::from(usage.completion_tokens);
        self.samples.finished += 1;
        self.samples.last_finish_s = self.samples.last_finish_s.max(now);
        let Some((session, turn)) = request.turn else { return };
        let generated = std::mem::take(&mut request.generated);
        let state = &self.plan.sessions[session];
        self.histories[session].extend(&state.turns[turn].user);
        self.histories[session].extend(generated);
        if let Some(next) = state.turns.get(turn + 1) {
            self.schedule(now + next.think_s, Event::Turn { session, turn: turn + 1 });
        }
    }

    /// What the router knows of a replica: its latest batch, and the requests sent since (the ledger).
    fn view(&self, id: usize, hashes: &[BlockHash]) -> ReplicaView {
        let profile = &self.config.profile;
        ReplicaView {
            id: id as u16,
            healthy: true,
            load: self.ledger.load(id as u16, profile.block_size as u32),
            tracked: self.ledger.tracked(id as u16, hashes, self.now_ms()),
            block_size: profile.block_size as u32,
            bytes_per_block: profile.block_bytes() as u64,
            blocks_per_engine_block: 1,
        }
    }

    /// A replica's load as its agent would report it now.
    fn replica_load(&self, replica: usize) -> LoadStats {
        let profile = &self.config.profile;
        let engine = &self.replicas[replica].engine;
        let stand_in_scale = profile.block_bytes() / STAND_IN_BYTES as f64;
        let network = self.store.is_some();
        LoadStats {
            waiting_requests: engine.num_waiting() as u32,
            running_requests: engine.num_running() as u32,
            queued_prefill_tokens: engine.queued_prefill_tokens(),
            kv_blocks_used: engine.blocks().num_used() as u64,
            kv_blocks_total: engine.blocks().num_blocks() as u64,
            prefill_tokens_per_second: engine.stats().prefill_tokens_per_second,
            decode_step_seconds: engine.stats().decode_step_seconds,
            host_bytes_per_second: engine.tiering().host_bandwidth() * stand_in_scale,
            network_bytes_per_second: if network { profile.network_bandwidth } else { 0.0 },
            network_tier_up: network,
            draining: false,
            queue_capacity: profile.max_waiting as u32,
            max_running_requests: profile.max_running as u32,
            step_in_progress: false,
            step_seconds: 0.0,
        }
    }
}

fn replica(id: usize, profile: &CostProfile, store: Option<Arc<Mutex<NetworkStore>>>, clock: &ManualClock) -> Replica {
    let host =
        (profile.host_bytes > 0.0).then(|| HostTier::new(CostExecutor::stand_in_bytes(profile, profile.host_bytes)));
    let spill = store.map(|store| {
        let spill: kvroute_node_agent::engine::tiering::SpillFn = Box::new(move |hash, _bytes| {
            if let Ok(mut store) = store.lock() {
                store.put(id as u16, hash);
            }
            true
        });
        spill
    });
    let write_through = if spill.is_some() { DEFAULT_WRITE_THROUGH_HITS } else { 0 };
    let tiering = Tiering::new(host, spill).with_write_through(write_through);
    let config = EngineConfig {
        max_batch_tokens: profile.max_batch_tokens,
        max_running: profile.max_running,
        max_waiting: profile.max_waiting,
        // The binary's admission rule, on the virtual clock.
        max_queue_delay: EngineConfig::default().max_queue_delay,
        watermark: EngineConfig::default().watermark,
        preemption: PreemptionMode::Recompute,
        max_context: profile.max_context,
        capture_logits: false,
    };
    let events = SharedSink::default();
    let executor = CostExecutor::new(profile, MODEL_ID);
    let engine = Engine::new(config, executor, Vec::new(), Box::new(events.clone()))
        .with_tiering(tiering)
        .with_clock(Box::new(clock.clone()));
    Replica {
        engine,
        events,
        outputs: Arc::default(),
        busy: false,
        heartbeat: false,
        step_events: Vec::new(),
        step_outputs: Vec::new(),
        prefill_tokens: 0,
        step_start: None,
    }
}

//! The engine of one replica: continuous batching over the block manager and
//! an [`Executor`] (the model, or a cost model in the simulator).
//!
//! [`Engine`] is synchronous and driven by calls: `submit`, `cancel`, `step`.
//! Each step schedules, within a per-step token budget, one token for every
//! decoding sequence, then prefill chunks of running sequences, then admits
//! waiting requests whose prompt blocks fit above a watermark. When a decoding
//! sequence needs a block and none is free, the newest running sequence is
//! preempted (recompute or swap). Every step first drops the requests whose caller went away. The engine
//! reads time only through its injected [`Clock`] and reports counters only through its injected
//! [`MetricsSink`]. [`thread`] runs an engine in its own thread and
//! [`publisher`] sends its events.

pub mod admission;
pub mod clock;
pub mod executor;
pub mod metrics_sink;
pub mod model_executor;
pub mod pending;
pub mod publisher;
pub mod rates;
pub mod request;
pub mod resident;
pub mod thread;
pub mod tiering;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use admission::{FinishedLengths, Pool, Resident};
use kvroute_proto::BlockHash;
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, FinishReason, KvEvent, Tier};
use pending::PendingBlocks;

use crate::block_manager::{BlockId, BlockManager, EventSink, Placement, PoolBlock};
use crate::model::sampling::Sampler;
use crate::tiers::host::BlockBytes;
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use executor::{ChunkSpec, Executor};
pub use metrics_sink::{MetricsSink, NoMetrics, StepCost};
use rates::StepRates;
pub use request::{GenerateError, Output, OutputSink, Usage};
pub use tiering::{DEFAULT_WRITE_THROUGH_HITS, Prefetched, Tiering};

/// How a preempted sequence gets its KV back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PreemptionMode {
    /// Free its blocks; recompute them when it runs again.
    #[default]
    Recompute,
    /// Copy its blocks to host memory, and back when it runs again.
    Swap,
}

impl PreemptionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionMode::Recompute => "recompute",
            PreemptionMode::Swap => "swap",
        }
    }
}

/// Engine settings (one place for their defaults: [`EngineConfig::default`]).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens computed per step across the batch (chunked prefill budget).
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    pub max_running: usize,
    /// Requests waiting before new ones are refused.
    pub max_waiting: usize,
    /// New requests are refused while a waiting request has waited longer than this (None: never), so that
    /// past capacity the queue answers "overloaded" at once instead of growing into minutes of delay.
    pub max_queue_delay: Option<Duration>,
    /// Fraction of the pool kept free at admission for decode growth.
    pub watermark: f64,
    pub preemption: PreemptionMode,
    /// Longest sequence (prompt + generated).
    pub max_context: usize,
    /// Attach each sampled step's logits to the outputs (tests, debugging).
    pub capture_logits: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 512,
            max_running: 32,
            max_waiting: 256,
            max_queue_delay: Some(Duration::from_secs(10)),
            watermark: 0.01,
            preemption: PreemptionMode::Recompute,
            max_context: 4096,
            capture_logits: false,
        }
    }
}

/// Counters and moving averages the engine keeps about itself.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    pub prompt_tokens_total: u64,
    pub prefix_hit_tokens_total: u64,
    /// Prompt tokens reloaded from host RAM and from the network tier.
    pub host_hit_tokens_total: u64,
    pub network_hit_tokens_total: u64,
    pub generated_tokens_total: u64,
    pub preemptions_recompute: u64,
    pub preemptions_swap: u64,
    pub requests_finished: u64,
    /// Requests dropped before they finished because their caller went away.
    pub requests_cancelled: u64,
    pub rejected_total: u64,
    /// Marginal prefill tokens per second: what a step absorbs beyond its decodes ([`rates`]).
    pub prefill_tokens_per_second: f64,
    /// Moving average of one decode-only step, in seconds.
    pub decode_step_seconds: f64,
}

struct Sequence {
    id: u64,
    request: AgentGenerateRequest,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose K/V are in the pool.
    computed: usize,
    cached_tokens: Option<usize>,
    sampler: Sampler,
    output: Box<dyn OutputSink>,
    stop_ids: Vec<u32>,
    /// Block contents saved by a swap preemption.
    swapped: Option<Vec<BlockBytes>>,
    /// Blocks fetched from the network tier before admission.
    prefetched: Prefetched,
    /// Full-block hashes of the first `.0` tokens, kept while the sequence waits for admission.
    hashes: Option<(usize, Vec<BlockHash>)>,
    /// When it joined the waiting queue (on arrival, or when preempted), on the engine's clock.
    queued_at: Duration,
    /// Prompt tokens it is expected to compute, estimated when it joins the waiting queue: those beyond the
    /// prefix the pool, host RAM, its prefetched blocks or a sequence ahead of it holds or will hold.
    expected_work: usize,
    /// The prompt blocks it added to the engine's [`PendingBlocks`], until its prefill is done.
    pending: Vec<BlockHash>,
}

impl Sequence {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub finished: usize,
    pub preempted: usize,
}

impl StepReport {
    pub fn is_idle(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_tokens == 0
    }
}

/// One step's plan while it is built: (sequence id, tokens computed this step) and the tokens left.
struct Batch {
    plan: Vec<(u64, usize)>,
    budget: usize,
}

impl Batch {
    fn add(&mut self, id: u64, tokens: usize) {
        self.plan.push((id, tokens));
        self.budget -= tokens;
    }
}

/// The engine: queue, running batch, block manager, executor.
pub struct Engine<E: Executor> {
    config: EngineConfig,
    executor: E,
    blocks: BlockManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    eos_ids: Vec<u32>,
    next_id: u64,
    stats: EngineStats,
    rates: StepRates,
    tiering: Tiering,
    /// When the latest requests left the waiting queue (at most [`DEPARTURES_KEPT`]), for its drain rate.
    departures: VecDeque<Duration>,
    clock: Box<dyn Clock>,
    metrics: Arc<dyn MetricsSink>,
    /// Ids of requests that finished or were dropped since the last [`Engine::take_finished_ids`].
    finished_ids: Vec<u64>,
    /// Prompt blocks queued and running sequences are still to compute.
    pending: PendingBlocks,
    /// How long the latest finished sequences ran, for [`Engine::room_wait`].
    finished_lengths: FinishedLengths,
}

/// Departures from the waiting queue kept to measure its drain rate.
const DEPARTURES_KEPT: usize = 64;

impl<E: Executor> Engine<E> {
    pub fn new(config: EngineConfig, executor: E, eos_ids: Vec<u32>, sink: Box<dyn EventSink>) -> Engine<E> {
        let blocks = BlockManager::new(executor.num_blocks(), executor.block_size(), executor.model_id(), sink);
        Engine {
            config,
            executor,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            eos_ids,
            next_id: 0,
            stats: EngineStats::default(),
            rates: StepRates::default(),
            tiering: Tiering::default(),
            departures: VecDeque::new(),
            clock: Box::new(MonotonicClock::default()),
            metrics: Arc::new(NoMetrics),
            finished_ids: Vec::new(),
            pending: PendingBlocks::default(),
            finished_lengths: FinishedLengths::default(),
        }
    }

    /// Reads time from `clock` instead of the machine's monotonic clock.
    pub fn with_clock(mut self, clock: Box<dyn Clock>) -> Engine<E> {
        self.clock = clock;
        self
    }

    /// The id the next accepted request gets (ids increase by one per accepted request).
    pub fn next_request_id(&self) -> u64 {
        self.next_id
    }

    /// Ids of the requests that finished, or were dropped, since the last call.
    pub fn take_finished_ids(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.finished_ids)
    }

    /// Adds the host and network tiers below the pool.
    pub fn with_tiering(mut self, tiering: Tiering) -> Engine<E> {
        self.blocks.set_hot_after(tiering.write_through_after());
        self.tiering = tiering.with_metrics(self.metrics.clone());
        self
    }

    /// Reports the engine's and its tiers' counters to `metrics` instead of dropping them.
    pub fn with_metrics(mut self, metrics: Arc<dyn MetricsSink>) -> Engine<E> {
        self.tiering = std::mem::take(&mut self.tiering).with_metrics(metrics.clone());
        self.metrics = metrics;
        self
    }

    pub fn tiering(&self) -> &Tiering {
        &self.tiering
    }

    /// Tier events (host and network spills) since the last call.
    pub fn take_tier_events(&mut self) -> Vec<KvEvent> {
        self.tiering.take_events()
    }

    /// KV bytes of one token in the pool.
    pub fn bytes_per_token(&self) -> f64 {
        self.executor.bytes_per_block() as f64 / self.blocks.block_size() as f64
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    pub fn executor(&self) -> &E {
        &self.executor
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Prompt tokens of waiting and running sequences not yet computed.
    pub fn queued_prefill_tokens(&self) -> u64 {
        let pending = |seq: &Sequence| seq.tokens.len().saturating_sub(seq.computed.max(1)) as u64;
        self.waiting.iter().map(pending).sum::<u64>() + self.running.iter().map(pending).sum::<u64>()
    }

    /// Prompt tokens the engine expects to compute before a request queued now gets its turn: what each
    /// waiting sequence was expected to compute when it joined the queue, and the rest of the prompts of
    /// running sequences still in prefill.
    pub fn work_ahead(&self) -> u64 {
        let waiting = self.waiting.iter().map(|seq| seq.expected_work as u64).sum::<u64>();
        let running = self.running.iter().map(|seq| seq.tokens.len().saturating_sub(seq.computed + 1) as u64);
        waiting + running.sum::<u64>()
    }

    /// A prompt's full-block hashes (none unless its cache is shared), how many leading ones the pool or
    /// host RAM holds, and the tokens of it the engine expects to compute: those beyond the leading blocks
    /// the pool or host RAM holds, `prefetched` holds, or a sequence already queued or running will have
    /// computed by then.
    fn expected_work(
        &self,
        request: &AgentGenerateRequest,
        tokens: &[u32],
        prefetched: &Prefetched,
    ) -> (Vec<BlockHash>, usize, usize) {
        if request.cache_mode != CacheMode::Shared {
            return (Vec::new(), 0, tokens.len());
        }
        let hashes = self.blocks.hasher(&request.cache_scope).hashes(tokens);
        let resident = self.resident_blocks(&hashes);
        let ahead = hashes[resident..]
            .iter()
            .enumerate()
            .take_while(|(index, hash)| prefetched.get(resident + index).is_some() || self.pending.contains(hash))
            .count();
        let held = ((resident + ahead) * self.blocks.block_size()).min(tokens.len().saturating_sub(1));
        (hashes, resident, tokens.len() - held)
    }

    /// Checks a request against the model and the pool without queuing it.
    pub fn validate(&self, request: &AgentGenerateRequest) -> Result<(), GenerateError> {
        let vocab = self.executor.vocab_size();
        if let Some(bad) = request.prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if let Some(bad) = request.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::InvalidArgument(format!("stop token id {bad} is outside the vocabulary")));
        }
        let context = self.config.max_context;
        if request.prompt.len() >= context {
            return Err(GenerateError::InvalidArgument(format!(
                "the prompt has {} tokens; the context holds {context}",
                request.prompt.len()
            )));
        }
        if request.prompt.len() + request.max_tokens as usize > context {
            return Err(GenerateError::InvalidArgument(format!(
                "prompt ({} tokens) plus max_tokens ({}) exceeds the context of {context} tokens",
                request.prompt.len(),
                request.max_tokens
            )));
        }
        let blocks = self.blocks.blocks_for_tokens(request.prompt.len() + 1);
        if blocks > self.blocks.num_blocks() {
            return Err(GenerateError::InvalidArgument(format!(
                "the prompt needs {blocks} KV blocks; the pool has {}",
                self.blocks.num_blocks()
            )));
        }
        Ok(())
    }

    /// Why a new request would be refused now, if it would: the queue is full, or a request queued now
    /// would wait longer than `max_queue_delay`. That wait is the longest of
    /// - how long the oldest waiting request has waited, and the queue's length over its drain rate;
    /// - the prompt work ahead ([`Engine::work_ahead`]) at the measured prefill rate: sequences admitted
    ///   into the running batch still queue for prefill there, so the waiting queue can look short while
    ///   the wait is long;
    /// - the wait for room ([`Engine::room_wait`]): when the pool or the running slots are full, the queue
    ///   moves only as running sequences finish, and running sequences growing into a full pool preempt
    ///   the newest of them, which queue again ahead of it.
    ///
    /// Not knowing the request, it is taken to need one pool block: whether any request would be refused
    /// ([`Engine::refusal_for`] knows its prompt).
    pub fn admission_refusal(&self) -> Option<String> {
        self.refusal_needing(1)
    }

    /// Why `request` would be refused now, if it would ([`Engine::admission_refusal`]), counting the pool
    /// blocks its prompt would take: all but those running sequences hold.
    pub fn refusal_for(&self, request: &AgentGenerateRequest) -> Option<String> {
        let hashes = match request.cache_mode {
            CacheMode::Shared => self.blocks.hasher(&request.cache_scope).hashes(&request.prompt),
            CacheMode::Disabled => Vec::new(),
        };
        self.refusal_needing(self.blocks.blocks_taken(&hashes, request.prompt.len()))
    }

    fn refusal_needing(&self, blocks: usize) -> Option<String> {
        if self.waiting.len() >= self.config.max_waiting {
            return Some(format!("the agent's queue is full ({} waiting)", self.config.max_waiting));
        }
        let limit = self.config.max_queue_delay?;
        let now = self.clock.now();
        let rate = self.rates.prefill_tokens_per_second();
        let prefill =
            if rate > 0.0 { Duration::from_secs_f64(self.work_ahead() as f64 / rate) } else { Duration::ZERO };
        let oldest = self.waiting.iter().map(|seq| now.saturating_sub(seq.queued_at)).max().unwrap_or_default();
        // The drain rate up to now: while the queue is stalled (no departure since `last`), it falls.
        let drained = match self.departures.front() {
            Some(first) if self.departures.len() > 1 && now > *first && !self.waiting.is_empty() => {
                let rate = (self.departures.len() - 1) as f64 / (now - *first).as_secs_f64();
                Duration::from_secs_f64(self.waiting.len() as f64 / rate)
            }
            _ => Duration::ZERO,
        };
        let wait = oldest.max(drained).max(prefill).max(self.room_wait(blocks, limit));
        (wait > limit).then(|| {
            format!(
                "the agent's queue is too slow: a new request would wait about {:.1} s (limit {:.1} s)",
                wait.as_secs_f64(),
                limit.as_secs_f64()
            )
        })
    }

    /// How long until a request needing `blocks` pool blocks, queued now, is admitted into the running
    /// batch, looked at up to `limit` ahead: the running sequences grow, finish and are preempted, and the
    /// waiting ones are admitted, as this engine's scheduler does ([`admission::steps_until_admitted`];
    /// each sequence expected to run as long as the latest finished ones, [`FinishedLengths::steps_left`]),
    /// each step as long as the measured steps that decoded. Past `limit`, a little more than `limit`.
    fn room_wait(&self, blocks: usize, limit: Duration) -> Duration {
        let step = self.rates.token_interval_seconds();
        if step <= 0.0 || self.running.is_empty() {
            return Duration::ZERO;
        }
        let block = self.blocks.block_size();
        let steps_left = |seq: &Sequence| {
            self.finished_lengths
                .steps_left(seq.request.max_tokens as usize, seq.generated())
                .min(self.config.max_context.saturating_sub(seq.tokens.len()))
                .max(1)
        };
        let running: Vec<Resident> = self
            .running
            .iter()
            .map(|seq| Resident {
                order: seq.id,
                steps_left: steps_left(seq),
                blocks: self.blocks.sole_blocks(seq.id),
                // The next decode needs room for every token it has; its block table covers the ones before.
                next_block: (self.blocks.block_table(seq.id).len() * block + 2).saturating_sub(seq.tokens.len()),
            })
            .collect();
        let waiting: Vec<Resident> = self
            .waiting
            .iter()
            .map(|seq| Resident {
                order: seq.id,
                steps_left: steps_left(seq),
                blocks: match &seq.hashes {
                    Some((known, hashes)) if *known == seq.tokens.len() => self.blocks.blocks_taken(hashes, *known),
                    _ => self.blocks.blocks_for_tokens(seq.expected_work) + 1,
                },
                // Placed, it holds blocks for its tokens, and its first token is one more.
                next_block: (self.blocks.blocks_for_tokens(seq.tokens.len()) * block + 1)
                    .saturating_sub(seq.tokens.len()),
            })
            .collect();
        let pool = Pool {
            available: self.blocks.num_available(),
            reserve: self.watermark_blocks(),
            block_size: block,
            max_running: self.config.max_running,
        };
        let horizon = (limit.as_secs_f64() / step).ceil() as usize + 1;
        let steps = admission::steps_until_admitted(&running, &waiting, blocks, pool, horizon).unwrap_or(horizon + 1);
        Duration::from_secs_f64(steps as f64 * step)
    }

    /// Blocks admission keeps free beside running sequences, for their growth.
    fn watermark_blocks(&self) -> usize {
        (self.config.watermark * self.blocks.num_blocks() as f64).ceil() as usize
    }

    /// Queues a request; refuses it at once when invalid or when the queue is full.
    pub fn submit(&mut self, request: AgentGenerateRequest, output: Box<dyn OutputSink>) -> Result<u64, GenerateError> {
        self.submit_prefetched(request, output, Prefetched::default())
    }

    /// Queues a request with blocks already fetched from the network tier; tells `output` its id
    /// ([`OutputSink::accepted`]) before anything else.
    pub fn submit_prefetched(
        &mut self,
        request: AgentGenerateRequest,
        mut output: Box<dyn OutputSink>,
        prefetched: Prefetched,
    ) -> Result<u64, GenerateError> {
        self.validate(&request)?;
        if let Some(reason) = self.refusal_for(&request) {
            self.stats.rejected_total += 1;
            return Err(GenerateError::Overloaded(reason));
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut stop_ids = request.stop_token_ids.clone();
        if !request.ignore_eos {
            stop_ids.extend(&self.eos_ids);
        }
        let sampler = Sampler::new(request.sampling, id);
        let (hashes, resident, expected_work) = self.expected_work(&request, &request.prompt, &prefetched);
        let pending = hashes[resident..].to_vec();
        self.pending.add(&pending);
        let hashes = (request.cache_mode == CacheMode::Shared).then_some((request.prompt.len(), hashes));
        output.accepted(id);
        self.waiting.push_back(Sequence {
            id,
            tokens: request.prompt.clone(),
            prompt_len: request.prompt.len(),
            request,
            computed: 0,
            cached_tokens: None,
            sampler,
            output,
            stop_ids,
            swapped: None,
            prefetched,
            hashes,
            queued_at: self.clock.now(),
            expected_work,
            pending,
        });
        Ok(id)
    }

    /// Drops a request wherever it is (its caller went away): its pool blocks, the host memory its swapped
    /// blocks hold, and its prefetched blocks are freed at once.
    pub fn cancel(&mut self, id: u64) {
        let seq = if let Some(pos) = self.waiting.iter().position(|seq| seq.id == id) {
            self.waiting.remove(pos)
        } else if let Some(pos) = self.running.iter().position(|seq| seq.id == id) {
            Some(self.running.remove(pos))
        } else {
            None
        };
        let Some(seq) = seq else { return };
        self.pending.remove(&seq.pending);
        self.blocks.release(seq.id);
        if let Some(saved) = &seq.swapped {
            self.tiering.release_swap((saved.len() * self.executor.bytes_per_block()) as u64);
        }
        self.stats.requests_cancelled += 1;
        self.finished_ids.push(seq.id);
    }

    /// Cancels every request whose caller is gone ([`OutputSink::is_closed`]).
    fn drop_abandoned(&mut self) {
        let abandoned: Vec<u64> =
            self.waiting.iter().chain(&self.running).filter(|seq| seq.output.is_closed()).map(|seq| seq.id).collect();
        for id in abandoned {
            self.cancel(id);
        }
    }

    /// Runs one scheduling step and one forward pass. The order of the steps is the scheduling policy:
    /// running decodes first (they hold blocks and a caller waiting token by token), then the prefill
    /// chunks of running sequences, then admission from the queue into what budget is left; blocks evicted
    /// by any of them are saved to the tiers before the forward pass writes over them.
    pub fn step(&mut self) -> StepReport {
        self.drop_abandoned();
        let mut report = StepReport::default();
        let mut batch = Batch { plan: Vec::new(), budget: self.config.max_batch_tokens.max(1) };
        self.plan_decodes(&mut batch, &mut report);
        self.plan_prefill_chunks(&mut batch);
        self.admit_waiting(&mut batch);
        self.collect_evicted();
        if !batch.plan.is_empty() {
            self.execute(batch.plan, &mut report);
        }
        report
    }

    /// Decodes: one token each; preempts the newest sequence when the pool is full. A sequence whose caller
    /// has not taken its earlier tokens yet waits (back-pressure), keeping its blocks.
    fn plan_decodes(&mut self, batch: &mut Batch, report: &mut StepReport) {
        let decode_ids: Vec<u64> = self
            .running
            .iter()
            .filter(|s| s.computed + 1 == s.tokens.len() && s.output.has_room())
            .map(|s| s.id)
            .collect();
        for id in decode_ids {
            if batch.budget == 0 {
                break;
            }
            while let Some(seq) = self.running.iter().find(|s| s.id == id) {
                let needed = seq.tokens.len();
                if self.blocks.grow(id, needed).is_ok() {
                    batch.add(id, 1);
                    break;
                }
                let Some(victim) = self.running.iter().map(|s| s.id).max() else { break };
                self.preempt(victim);
                batch.plan.retain(|(planned, _)| *planned != victim);
                report.preempted += 1;
                if victim == id {
                    break;
                }
            }
        }
    }

    /// Prefill chunks of running sequences (and re-prefills after a recompute preemption).
    fn plan_prefill_chunks(&self, batch: &mut Batch) {
        for seq in &self.running {
            if batch.budget == 0 {
                break;
            }
            let pending = seq.tokens.len() - seq.computed;
            let samples = pending <= batch.budget;
            if pending > 0 && !batch.plan.iter().any(|(id, _)| *id == seq.id) && (!samples || seq.output.has_room()) {
                let chunk = pending.min(batch.budget);
                batch.add(seq.id, chunk);
            }
        }
    }

    /// Admission, first come first served, while the budget, the batch slots and the pool (above the
    /// watermark) have room.
    fn admit_waiting(&mut self, batch: &mut Batch) {
        let watermark = self.watermark_blocks();
        while batch.budget > 0 && self.running.len() < self.config.max_running {
            let Some(seq) = self.waiting.front_mut() else { break };
            let hasher =
                (seq.request.cache_mode == CacheMode::Shared).then(|| self.blocks.hasher(&seq.request.cache_scope));
            let known = if seq.swapped.is_some() { seq.computed } else { seq.tokens.len() };
            // A sequence waiting at the head is checked every step: hash its tokens once.
            let hashes = match (&hasher, seq.hashes.take()) {
                (Some(_), Some((len, hashes))) if len == known => hashes,
                (Some(h), _) => h.hashes(&seq.tokens[..known]),
                (None, _) => Vec::new(),
            };
            // Admitting into an empty engine must never deadlock on the watermark.
            let reserve = if self.running.is_empty() { 0 } else { watermark };
            if !self.blocks.fits(&hashes, seq.tokens.len(), reserve) {
                seq.hashes = Some((known, hashes));
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            let placed = if known == seq.tokens.len() {
                self.blocks.place_hashed(seq.id, &seq.tokens, hasher, hashes)
            } else {
                self.blocks.place(seq.id, &seq.tokens, hasher)
            };
            let Ok(placement) = placed else {
                self.waiting.push_front(seq);
                break;
            };
            // Blocks just evicted still hold their data: save it before any write.
            self.collect_evicted();
            self.write_through(&placement.hot);
            self.restore_cached(&mut seq, &placement);
            let chunk = (seq.tokens.len() - seq.computed).min(batch.budget);
            if chunk > 0 {
                batch.add(seq.id, chunk);
            }
            if self.departures.len() == DEPARTURES_KEPT {
                self.departures.pop_front();
            }
            self.departures.push_back(self.clock.now());
            self.running.push(seq);
        }
    }

    /// What an admitted sequence need not compute: the K/V it saved when swapped out, or its prompt's
    /// cached blocks plus what the host and network tiers reload (counted in the hit statistics once, on
    /// first admission).
    fn restore_cached(&mut self, seq: &mut Sequence, placement: &Placement) {
        if let Some(saved) = seq.swapped.take() {
            self.swap_in(seq, saved, placement.cached_blocks);
            return;
        }
        let (host, network) = self.reload_from_tiers(seq, &placement.prompt_hashes, placement.cached_blocks);
        let reloaded = (placement.cached_blocks + host + network) * self.blocks.block_size();
        seq.computed = placement.cached_tokens.max(reloaded.min(seq.tokens.len() - 1));
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(seq.computed);
            self.stats.prompt_tokens_total += seq.prompt_len as u64;
            self.stats.prefix_hit_tokens_total += placement.cached_tokens as u64;
            let block = self.blocks.block_size() as u64;
            self.stats.host_hit_tokens_total += host as u64 * block;
            self.stats.network_hit_tokens_total += network as u64 * block;
        }
    }

    fn execute(&mut self, plan: Vec<(u64, usize)>, report: &mut StepReport) {
        let started = self.clock.now();
        let mut chunks = Vec::with_capacity(plan.len());
        for &(id, len) in &plan {
            let Some(seq) = self.running.iter().find(|s| s.id == id) else { continue };
            let end = seq.computed + len;
            chunks.push((id, seq.computed, end, end == seq.tokens.len()));
        }
        let logits = {
            let specs: Vec<ChunkSpec<'_>> = chunks
                .iter()
                .filter_map(|&(id, start, end, want_logits)| {
                    let seq = self.running.iter().find(|s| s.id == id)?;
                    Some(ChunkSpec {
                        tokens: &seq.tokens[start..end],
                        start_pos: start,
                        block_table: self.blocks.block_table(id),
                        want_logits,
                    })
                })
                .collect();
            self.executor.execute(&specs)
        };
        let elapsed =
            self.executor.modelled_seconds().unwrap_or_else(|| self.clock.now().saturating_sub(started).as_secs_f64());
        let mut prefill = 0;
        let mut decode = 0;
        let mut sampled = 0;
        // Token-context products of the step (its attention work), for the step log below.
        let mut attended = 0.0;
        let mut finished = Vec::new();
        for ((id, start, end, _), logits) in chunks.into_iter().zip(logits) {
            attended += (end - start) as f64 * (start + end) as f64 / 2.0;
            let Some(seq) = self.running.iter_mut().find(|s| s.id == id) else { continue };
            if seq.generated() == 0 || end - start > 1 {
                prefill += end - start
            } else {
                decode += 1
            }
            seq.computed = end;
            self.blocks.register_computed(id, &seq.tokens[..end]);
            if end >= seq.prompt_len && !seq.pending.is_empty() {
                self.pending.remove(&std::mem::take(&mut seq.pending));
            }
            let Some(logits) = logits else { continue };
            sampled += 1;
            let token = seq.sampler.sample(&logits);
            seq.tokens.push(token);
            self.stats.generated_tokens_total += 1;
            let finish = if seq.stop_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else if seq.generated() >= seq.request.max_tokens as usize {
                Some(FinishReason::Length)
            } else if seq.tokens.len() >= self.config.max_context {
                Some(FinishReason::Context)
            } else {
                None
            };
            let usage = finish.map(|reason| {
                (
                    reason,
                    Usage {
                        prompt_tokens: seq.prompt_len as u32,
                        completion_tokens: seq.generated() as u32,
                        cached_tokens: seq.cached_tokens.unwrap_or(0) as u32,
                    },
                )
            });
            let logits = self.config.capture_logits.then_some(logits);
            let cached_tokens = (seq.generated() == 1).then(|| seq.cached_tokens.unwrap_or(0) as u32);
            let alive = seq.output.send(Output { tokens: vec![token], finished: usage, cached_tokens, logits });
            if finish.is_some() || !alive {
                finished.push(id);
            }
        }
        for id in finished {
            if let Some(pos) = self.running.iter().position(|s| s.id == id) {
                let seq = self.running.remove(pos);
                self.blocks.release(seq.id);
                self.finished_lengths.record(seq.generated());
                self.stats.requests_finished += 1;
                self.finished_ids.push(seq.id);
                report.finished += 1;
            }
        }
        self.metrics.step(&StepCost {
            tokens: prefill + decode,
            sampled,
            attended,
            forward_seconds: elapsed,
            step_seconds: self.clock.now().saturating_sub(started).as_secs_f64(),
        });
        self.update_rates(prefill, decode, elapsed);
        report.prefill_tokens = prefill;
        report.decode_tokens = decode;
    }

    fn update_rates(&mut self, prefill: usize, decode: usize, elapsed: f64) {
        self.rates.record(prefill, decode, elapsed);
        self.stats.prefill_tokens_per_second = self.rates.prefill_tokens_per_second();
        self.stats.decode_step_seconds = self.rates.decode_step_seconds();
    }

    fn preempt(&mut self, id: u64) {
        let Some(pos) = self.running.iter().position(|s| s.id == id) else { return };
        let mut seq = self.running.remove(pos);
        let table: Vec<BlockId> = self.blocks.block_table(id).to_vec();
        let used = seq.computed.div_ceil(self.blocks.block_size()).min(table.len());
        let swap_bytes = (used * self.executor.bytes_per_block()) as u64;
        // Swapped bytes are charged to host memory; when they do not fit, recompute.
        if self.config.preemption == PreemptionMode::Swap && self.tiering.reserve_swap(swap_bytes) {
            seq.swapped = Some(table[..used].iter().map(|&block| self.executor.read_block(block)).collect());
            self.stats.preemptions_swap += 1;
        } else {
            seq.computed = 0;
            self.stats.preemptions_recompute += 1;
        }
        self.blocks.release(id);
        seq.queued_at = self.clock.now();
        // Its computed blocks are cached now: what it recomputes is what the pool no longer holds.
        seq.expected_work = if seq.swapped.is_some() {
            0
        } else {
            // Not counting its own unfinished blocks as computed by a sequence ahead of it.
            self.pending.remove(&seq.pending);
            let (hashes, _, work) = self.expected_work(&seq.request, &seq.tokens, &seq.prefetched);
            self.pending.add(&seq.pending);
            seq.hashes = (seq.request.cache_mode == CacheMode::Shared).then_some((seq.tokens.len(), hashes));
            work
        };
        self.waiting.push_front(seq);
    }

    /// Restores a swapped sequence into freshly placed blocks.
    fn swap_in(&mut self, seq: &mut Sequence, saved: Vec<BlockBytes>, cached_blocks: usize) {
        self.tiering.release_swap((saved.len() * self.executor.bytes_per_block()) as u64);
        let table: Vec<BlockId> = self.blocks.block_table(seq.id).to_vec();
        for (index, bytes) in saved.iter().enumerate().skip(cached_blocks) {
            if let Some(&block) = table.get(index)
                && self.executor.write_block(block, bytes).is_err()
            {
                // The saved bytes do not fit the pool: recompute from here on.
                seq.computed = seq.computed.min(index * self.blocks.block_size());
                return;
            }
        }
        self.blocks.register_computed(seq.id, &seq.tokens[..seq.computed]);
    }

    /// Sends blocks that just became hot to the network tier (they stay in the pool).
    fn write_through(&mut self, hot: &[PoolBlock]) {
        for block in hot {
            let bytes = self.executor.read_block(block.block);
            self.tiering.spill(block.hash, bytes);
        }
        if !hot.is_empty() {
            self.metrics.write_through(hot.len());
        }
    }

    /// Hands blocks evicted from the pool, with their bytes, to the tiers.
    fn collect_evicted(&mut self) {
        for evicted in self.blocks.take_evicted() {
            let bytes = self.executor.read_block(evicted.block);
            self.tiering.accept_evicted(evicted.hash, bytes);
        }
    }

    /// Extends a placed sequence's pool match from host RAM, then from its
    /// prefetched network blocks, copying hits into its pool blocks; returns
    /// the blocks reloaded from each. Stops at the first miss, and does not
    /// reload from a tier slower than recomputing.
    fn reload_from_tiers(&mut self, seq: &mut Sequence, hashes: &[BlockHash], matched: usize) -> (usize, usize) {
        if seq.request.cache_mode == CacheMode::Disabled {
            return (0, 0);
        }
        let table: Vec<BlockId> = self.blocks.block_table(seq.id).to_vec();
        let (per_token, prefill) = (self.bytes_per_token(), self.stats.prefill_tokens_per_second);
        let use_host = tiering::reload_beats_recompute(self.tiering.host_bandwidth(), per_token, prefill);
        let mut index = matched;
        let (mut host, mut network) = (0, 0);
        let started = self.clock.now();
        while use_host && index < hashes.len() {
            let Some(bytes) = self.tiering.host_block(&hashes[index]) else { break };
            if self.executor.write_block(table[index], &bytes).is_err() {
                break;
            }
            index += 1;
            host += 1;
        }
        if host > 0 {
            let bytes = host * self.executor.bytes_per_block();
            let seconds = self
                .executor
                .modelled_copy_seconds(bytes)
                .unwrap_or_else(|| self.clock.now().saturating_sub(started).as_secs_f64());
            self.tiering.record_host_copy(bytes, seconds);
            self.metrics.tier_hit(Tier::Host, host * self.blocks.block_size(), host);
        }
        while index < hashes.len() {
            let Some(bytes) = seq.prefetched.get(index) else { break };
            if self.executor.write_block(table[index], bytes).is_err() {
                break;
            }
            index += 1;
            network += 1;
        }
        if network > 0 {
            self.metrics.tier_hit(Tier::Network, network * self.blocks.block_size(), network);
        }
        seq.prefetched = Prefetched::default();
        if index > matched {
            self.blocks.register_computed(seq.id, &seq.tokens[..index * self.blocks.block_size()]);
        }
        (host, network)
    }

    /// How much of a chain the pool and host RAM hold, and the rates of the prefetch rule
    /// ([`Probe::network_fetch`]); the engine thread's callers probe its [`resident::ResidentView`] instead.
    pub fn probe(&self, hashes: &[BlockHash]) -> resident::Probe {
        resident::Probe {
            resident_blocks: self.resident_blocks(hashes),
            bytes_per_token: self.bytes_per_token(),
            prefill_tokens_per_second: self.stats.prefill_tokens_per_second,
        }
    }

    /// Leading blocks of a chain held by the pool or host RAM.
    fn resident_blocks(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|hash| {
                self.blocks.lookup(hash).is_some() || self.tiering.host.as_ref().is_some_and(|host| host.contains(hash))
            })
            .count()
    }

    /// Everything the pool and host RAM hold, as events (for a snapshot).
    pub fn snapshot_events(&self) -> Vec<KvEvent> {
        vec![
            KvEvent::Stored { tier: Tier::Gpu, hashes: self.blocks.registered_hashes() },
            KvEvent::Stored { tier: Tier::Host, hashes: self.tiering.host_hashes() },
        ]
    }
}

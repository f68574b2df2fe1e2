//! The engine's admission rule over the real tiny-random model, with each forward pass timed by a fixed
//! cost (10 ms plus 1 ms a token) on a clock the test moves: a request is refused when the engine
//! predicts it would wait longer than `max_queue_delay`, counting the prompts queued behind the waiting
//! line (running sequences still in prefill, a shared prefix once), the wait for a running slot, and the
//! running sequences growing into the pool and preempting one another.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kvroute_node_agent::block_manager::VecSink;
use kvroute_node_agent::engine::executor::{ChunkSpec, Executor};
use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::{Engine, EngineConfig, GenerateError, ManualClock, Output};
use kvroute_node_agent::model::{KvStore, Model};
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvDtype, SamplingParams};

#[path = "support/hooked.rs"]
mod hooked;
use hooked::Hooked;

/// The model's arithmetic, with each pass costing 10 ms plus 1 ms per token it computes.
type Timed = Hooked<fn(&[ChunkSpec<'_>]) -> Option<f64>>;

fn modelled_seconds(batch: &[ChunkSpec<'_>]) -> Option<f64> {
    Some(0.010 + 0.001 * batch.iter().map(|chunk| chunk.tokens.len()).sum::<usize>() as f64)
}

/// An engine whose clock advances by each step's modelled time.
struct Timeline {
    engine: Engine<Timed>,
    clock: ManualClock,
    now: Duration,
}

impl Timeline {
    fn new(config: EngineConfig) -> Timeline {
        Timeline::with_pool(config, 1024)
    }

    /// A pool of `blocks` blocks of 4 tokens.
    fn with_pool(config: EngineConfig, blocks: usize) -> Timeline {
        let model = Model::load("tiny-random").unwrap();
        let geometry = model.config().kv_geometry(KvDtype::Bf16);
        let kv = KvStore::new(geometry, blocks, 4);
        let clock = ManualClock::default();
        let executor: Timed = Hooked::new(ModelExecutor::new(model, kv), modelled_seconds);
        let engine =
            Engine::new(config, executor, Vec::new(), Box::new(VecSink::default())).with_clock(Box::new(clock.clone()));
        Timeline { engine, clock, now: Duration::ZERO }
    }

    fn step(&mut self) {
        self.engine.step();
        self.now += Duration::from_secs_f64(self.engine.executor().modelled_seconds().unwrap_or(0.0));
        self.clock.set(self.now);
    }

    fn submit(&mut self, prompt: &[u32], max_tokens: u32) -> Result<u64, GenerateError> {
        self.submit_to(prompt, max_tokens, Box::new(|_: Output| true))
    }

    /// Submits and counts the tokens that come back.
    fn submit_counted(&mut self, prompt: &[u32], max_tokens: u32) -> (Result<u64, GenerateError>, Arc<AtomicUsize>) {
        let tokens = Arc::new(AtomicUsize::new(0));
        let counter = tokens.clone();
        let sink = Box::new(move |output: Output| {
            counter.fetch_add(output.tokens.len(), Ordering::Relaxed);
            true
        });
        (self.submit_to(prompt, max_tokens, sink), tokens)
    }

    fn submit_to(
        &mut self,
        prompt: &[u32],
        max_tokens: u32,
        output: Box<dyn kvroute_node_agent::engine::OutputSink>,
    ) -> Result<u64, GenerateError> {
        let request = AgentGenerateRequest {
            request_id: String::new(),
            prompt: prompt.to_vec(),
            cache_scope: Vec::new(),
            cache_mode: CacheMode::Shared,
            sampling: SamplingParams::GREEDY,
            max_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        };
        self.engine.submit(request, output)
    }

    fn run_to_end(&mut self) {
        for _ in 0..10_000 {
            if !self.engine.has_work() {
                return;
            }
            self.step();
        }
        panic!("the engine did not finish");
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 7919 + i * 104_729) % 100_000).collect()
}

fn refused(result: Result<u64, GenerateError>) -> bool {
    match result {
        Err(GenerateError::Overloaded(message)) => {
            assert!(message.contains("would wait"), "{message}");
            true
        }
        Err(other) => panic!("refused for another reason: {other:?}"),
        Ok(_) => false,
    }
}

#[test]
fn a_queue_that_waited_too_long_refuses_new_requests_until_it_drains() {
    let config = EngineConfig { max_queue_delay: Some(Duration::from_millis(50)), ..EngineConfig::default() };
    let mut timeline = Timeline::new(config);
    timeline.submit(&[1, 2], 2).unwrap();
    timeline.submit(&[3, 4], 2).unwrap();
    timeline.clock.set(Duration::from_millis(80));
    assert!(refused(timeline.submit(&[5, 6], 2)));
    timeline.run_to_end();
    timeline.submit(&[5, 6], 2).expect("an empty queue accepts again");
}

#[test]
fn a_long_prompt_in_prefill_in_the_running_batch_refuses_new_requests() {
    // 32 tokens a step: a 1,000-token prompt takes 32 steps of 42 ms, about 1.3 s.
    let config = EngineConfig {
        max_batch_tokens: 32,
        max_queue_delay: Some(Duration::from_millis(200)),
        ..EngineConfig::default()
    };
    let mut timeline = Timeline::new(config);
    timeline.submit(&prompt(1, 1000), 4).unwrap();
    timeline.step();
    assert_eq!(timeline.engine.num_waiting(), 0, "the prompt left the waiting queue for the running batch");
    assert!(refused(timeline.submit(&prompt(2, 8), 4)), "968 tokens are still to compute ahead of it");
    while timeline.engine.work_ahead() > 100 {
        timeline.step();
    }
    timeline.submit(&prompt(2, 8), 4).expect("accepted once little prefill is left ahead");
}

#[test]
fn a_prefix_queued_ahead_is_counted_once_in_the_work_ahead() {
    let config = EngineConfig { max_batch_tokens: 32, max_queue_delay: None, ..EngineConfig::default() };
    let mut timeline = Timeline::new(config);
    let document = prompt(1, 1000);
    timeline.submit(&document, 4).unwrap();
    timeline.step();
    let ahead = timeline.engine.work_ahead();
    assert!((960..1000).contains(&ahead), "{ahead}");
    // The same document and 8 tokens more: its first 1,000 tokens will be computed by the time its turn comes.
    let follow_up: Vec<u32> = document.iter().copied().chain(prompt(3, 8)).collect();
    timeline.submit(&follow_up, 4).unwrap();
    assert_eq!(timeline.engine.work_ahead(), ahead + 8);
    timeline.submit(&prompt(2, 1000), 4).unwrap();
    assert_eq!(timeline.engine.work_ahead(), ahead + 8 + 1000, "another document is all work");
    timeline.run_to_end();
    assert_eq!(timeline.engine.work_ahead(), 0);
}

#[test]
fn a_full_running_batch_refuses_until_a_sequence_is_close_to_finishing() {
    // One running slot; the sequence in it generates 400 tokens at 11 ms each.
    let config =
        EngineConfig { max_running: 1, max_queue_delay: Some(Duration::from_millis(200)), ..EngineConfig::default() };
    let mut timeline = Timeline::new(config);
    timeline.submit(&prompt(1, 8), 400).unwrap();
    for _ in 0..3 {
        timeline.step();
    }
    assert!(refused(timeline.submit(&prompt(2, 8), 4)), "the slot frees in about 4 s");
    // 200 ms is about 18 of its steps: with 10 tokens left, a request waits about 110 ms.
    for _ in 0..387 {
        timeline.step();
    }
    timeline.submit(&prompt(2, 8), 4).expect("accepted once the running sequence is about to finish");
    timeline.run_to_end();
}

#[test]
fn a_pool_that_running_sequences_grow_into_refuses_what_would_wait_behind_their_preemptions() {
    // 256 blocks of 4 tokens. Six 40-token prompts (10 blocks each) each generate a token a step, a
    // block every 4 steps: between them 1.5 blocks a step, so the pool runs dry after about 130 steps,
    // before the first of them (200 tokens) finishes, and from then on the engine preempts the newest,
    // which queue again ahead of anything new.
    let limit = Duration::from_secs(2);
    let config = EngineConfig { max_queue_delay: Some(limit), ..EngineConfig::default() };
    let reserve = (config.watermark * 256.0).ceil() as usize;
    let mut refusing = Timeline::with_pool(config.clone(), 256);
    let mut unlimited = Timeline::with_pool(EngineConfig { max_queue_delay: None, ..config }, 256);
    for timeline in [&mut refusing, &mut unlimited] {
        timeline.submit(&prompt(1, 40), 200).unwrap();
        for seed in 2..=6 {
            timeline.submit(&prompt(seed, 40), 600).unwrap();
        }
        while timeline.engine.blocks().num_available() >= 2 + reserve {
            timeline.step();
        }
    }
    assert_eq!(refusing.engine.stats().preemptions_recompute, 0, "nothing preempted yet");
    assert!(refused(refusing.submit(&prompt(9, 8), 4)), "it would wait behind the preempted sequences");

    // The same request, accepted where nothing refuses: it waits longer than the limit.
    let submitted = unlimited.now;
    let (accepted, tokens) = unlimited.submit_counted(&prompt(9, 8), 4);
    accepted.unwrap();
    while tokens.load(Ordering::Relaxed) == 0 {
        unlimited.step();
    }
    let waited = unlimited.now - submitted;
    assert!(waited > limit, "its first token came after {waited:?}");
    assert!(unlimited.engine.stats().preemptions_recompute > 0, "sequences were preempted while it waited");
}

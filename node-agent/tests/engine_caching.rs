//! The engine over the real tiny-random model: greedy decoding gives identical
//! tokens and bit-identical logits whether a prompt's prefix was computed now,
//! came from the prefix cache, was shared with a concurrent sequence, was
//! preempted and recomputed, or swapped out and back, whatever else was in the
//! batch and however prefill was chunked.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use kvroute_node_agent::block_manager::VecSink;
use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::{Engine, EngineConfig, GenerateError, Output, PreemptionMode};
use kvroute_node_agent::model::{KvStore, Model};
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, FinishReason, KvDtype, SamplingParams};

/// Everything one request received.
#[derive(Clone, Debug, Default)]
struct Received {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
    finish: Option<FinishReason>,
    cached_tokens: u32,
}

type Shared = Arc<Mutex<Received>>;

fn engine(num_blocks: usize, block_size: usize, config: EngineConfig) -> Engine<ModelExecutor> {
    let model = Model::load("tiny-random").unwrap();
    let geometry = model.config().kv_geometry(KvDtype::Bf16);
    let kv = KvStore::new(geometry, num_blocks, block_size);
    let eos = Vec::new(); // random weights: run every request to max_tokens
    Engine::new(
        EngineConfig { capture_logits: true, ..config },
        ModelExecutor::new(model, kv),
        eos,
        Box::new(VecSink::default()),
    )
}

fn request(prompt: &[u32], max_tokens: u32) -> AgentGenerateRequest {
    AgentGenerateRequest {
        request_id: String::new(),
        prompt: prompt.to_vec(),
        cache_scope: Vec::new(),
        cache_mode: CacheMode::Shared,
        sampling: SamplingParams::GREEDY,
        max_tokens,
        stop_token_ids: Vec::new(),
        ignore_eos: false,
    }
}

fn submit(engine: &mut Engine<ModelExecutor>, request: AgentGenerateRequest) -> Shared {
    let shared: Shared = Arc::default();
    let sink = shared.clone();
    engine
        .submit(
            request,
            Box::new(move |output: Output| {
                let mut received = sink.lock().unwrap();
                received.tokens.extend(&output.tokens);
                if let Some(logits) = output.logits {
                    received.logits.push(logits.iter().map(|x| x.to_bits()).collect());
                }
                if let Some((reason, usage)) = output.finished {
                    received.finish = Some(reason);
                    received.cached_tokens = usage.cached_tokens;
                }
                true
            }),
        )
        .unwrap();
    shared
}

fn run_to_end(engine: &mut Engine<ModelExecutor>) {
    let mut steps = 0;
    while engine.has_work() {
        engine.step();
        steps += 1;
        assert!(steps < 10_000, "engine did not finish");
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 7919 + i * 104_729) % 100_000).collect()
}

fn cold(prompt: &[u32], max_tokens: u32) -> Received {
    let mut engine = engine(64, 4, EngineConfig::default());
    let out = submit(&mut engine, request(prompt, max_tokens));
    run_to_end(&mut engine);
    let received = out.lock().unwrap().clone();
    assert_eq!(received.tokens.len(), max_tokens as usize);
    assert_eq!(received.finish, Some(FinishReason::Length));
    assert_eq!(received.cached_tokens, 0);
    received
}

fn assert_same(a: &Received, b: &Received, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens differ");
    assert_eq!(a.logits.len(), b.logits.len(), "{what}: step counts differ");
    for (step, (x, y)) in a.logits.iter().zip(&b.logits).enumerate() {
        assert!(x == y, "{what}: logits of step {step} are not bit-identical");
    }
}

#[test]
fn prefix_cache_hit_is_bit_identical() {
    let p = prompt(1, 22);
    let reference = cold(&p, 10);
    let mut engine = engine(64, 4, EngineConfig::default());
    let first = submit(&mut engine, request(&p, 10));
    run_to_end(&mut engine);
    let second = submit(&mut engine, request(&p, 10));
    run_to_end(&mut engine);
    assert_same(&reference, &first.lock().unwrap(), "first run");
    let second = second.lock().unwrap();
    assert_eq!(second.cached_tokens, 20, "5 full blocks of 4 come from the cache");
    assert_same(&reference, &second, "cached run");
    assert_eq!(engine.stats().prefix_hit_tokens_total, 20);
}

#[test]
fn full_prompt_hit_recomputes_only_the_last_token() {
    let p = prompt(2, 16);
    let reference = cold(&p, 6);
    let mut engine = engine(64, 4, EngineConfig::default());
    submit(&mut engine, request(&p, 6));
    run_to_end(&mut engine);
    let again = submit(&mut engine, request(&p, 6));
    run_to_end(&mut engine);
    let again = again.lock().unwrap();
    assert_eq!(again.cached_tokens, 15);
    assert_same(&reference, &again, "full hit");
}

#[test]
fn concurrent_sharing_and_batch_composition_do_not_change_results() {
    let p = prompt(3, 19);
    let reference = cold(&p, 8);
    let mut engine = engine(128, 4, EngineConfig::default());
    let a = submit(&mut engine, request(&p, 8));
    let noise1 = submit(&mut engine, request(&prompt(4, 5), 11));
    let b = submit(&mut engine, request(&p, 8));
    let noise2 = submit(&mut engine, request(&prompt(5, 37), 3));
    run_to_end(&mut engine);
    assert_same(&reference, &a.lock().unwrap(), "first concurrent copy");
    assert_same(&reference, &b.lock().unwrap(), "second concurrent copy");
    assert_eq!(noise1.lock().unwrap().tokens.len(), 11);
    assert_eq!(noise2.lock().unwrap().tokens.len(), 3);
    // Alone, the noise requests give the same tokens as in the batch.
    assert_same(&cold(&prompt(4, 5), 11), &noise1.lock().unwrap(), "noise request");
}

#[test]
fn chunked_prefill_is_bit_identical() {
    let p = prompt(6, 45);
    let reference = cold(&p, 5);
    for budget in [1, 7, 16] {
        let mut engine = engine(64, 4, EngineConfig { max_batch_tokens: budget, ..EngineConfig::default() });
        let out = submit(&mut engine, request(&p, 5));
        run_to_end(&mut engine);
        assert_same(&reference, &out.lock().unwrap(), &format!("budget {budget}"));
    }
}

fn preemption_run(mode: PreemptionMode) {
    let prompts: Vec<Vec<u32>> = (10..13).map(|seed| prompt(seed, 10)).collect();
    let references: Vec<Received> = prompts.iter().map(|p| cold(p, 14)).collect();
    // 12 blocks of 4 tokens: three 24-token sequences (18 blocks) cannot all fit.
    let mut engine = engine(12, 4, EngineConfig { preemption: mode, ..EngineConfig::default() });
    let outs: Vec<Shared> = prompts.iter().map(|p| submit(&mut engine, request(p, 14))).collect();
    run_to_end(&mut engine);
    let stats = engine.stats();
    let preemptions = match mode {
        PreemptionMode::Recompute => stats.preemptions_recompute,
        PreemptionMode::Swap => stats.preemptions_swap,
    };
    assert!(preemptions > 0, "the pool was sized to force preemption");
    for (reference, out) in references.iter().zip(&outs) {
        assert_same(reference, &out.lock().unwrap(), mode.as_str());
    }
    engine.blocks().check_invariants().unwrap();
}

#[test]
fn recompute_preemption_is_bit_identical() {
    preemption_run(PreemptionMode::Recompute);
}

#[test]
fn swap_preemption_is_bit_identical() {
    preemption_run(PreemptionMode::Swap);
}

#[test]
fn disabled_cache_mode_never_reuses() {
    let p = prompt(7, 24);
    let mut engine = engine(64, 4, EngineConfig::default());
    for _ in 0..2 {
        let mut r = request(&p, 2);
        r.cache_mode = CacheMode::Disabled;
        let out = submit(&mut engine, r);
        run_to_end(&mut engine);
        assert_eq!(out.lock().unwrap().cached_tokens, 0);
    }
    assert_eq!(engine.blocks().num_cached(), 0);
}

#[test]
fn scopes_do_not_share_cached_blocks() {
    let p = prompt(8, 24);
    let mut engine = engine(64, 4, EngineConfig::default());
    let mut a = request(&p, 2);
    a.cache_scope = b"t:a".to_vec();
    submit(&mut engine, a.clone());
    run_to_end(&mut engine);
    let mut b = request(&p, 2);
    b.cache_scope = b"t:b".to_vec();
    let out_b = submit(&mut engine, b);
    run_to_end(&mut engine);
    assert_eq!(out_b.lock().unwrap().cached_tokens, 0);
    let out_a = submit(&mut engine, a);
    run_to_end(&mut engine);
    assert_eq!(out_a.lock().unwrap().cached_tokens, 23, "all six blocks hit; the last token is recomputed");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let p = prompt(9, 12);
    let sampled = |seed: u64| {
        let mut engine = engine(64, 4, EngineConfig::default());
        let mut r = request(&p, 12);
        r.sampling = SamplingParams::new(1.0, 0.9, Some(seed)).unwrap();
        let out = submit(&mut engine, r);
        run_to_end(&mut engine);
        out.lock().unwrap().tokens.clone()
    };
    assert_eq!(sampled(42), sampled(42));
    assert_ne!(sampled(42), sampled(43));
}

#[test]
fn bad_requests_and_a_full_queue_are_refused() {
    let mut engine = engine(64, 4, EngineConfig { max_waiting: 2, max_context: 64, ..EngineConfig::default() });
    let sink = || Box::new(|_: Output| true);
    let bad_token = engine.submit(request(&[1, 200_000], 2), sink());
    assert!(matches!(bad_token, Err(GenerateError::InvalidArgument(m)) if m.contains("outside the vocabulary")));
    let too_long = engine.submit(request(&prompt(1, 60), 10), sink());
    assert!(matches!(too_long, Err(GenerateError::InvalidArgument(m)) if m.contains("context")));
    engine.submit(request(&[1, 2], 2), sink()).unwrap();
    engine.submit(request(&[1, 2], 2), sink()).unwrap();
    let full = engine.submit(request(&[1, 2], 2), sink());
    assert!(matches!(full, Err(GenerateError::Overloaded(_))));
}

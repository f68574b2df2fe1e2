//! The prefill time a prefix-cache hit saves: time to first token of a long prompt computed cold, then the
//! same prompt again (served from the prefix cache, only its last token computed), then a prompt sharing all
//! but its last block. Runs the engine as the agent does (chunked prefill with the default token budget).
//!
//! cargo run --release -p kvroute-node-agent --example ttft_cache -- [MODEL.gguf|tiny-random] [prompt tokens]

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvroute_node_agent::block_manager::VecSink;
use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::engine::{Engine, EngineConfig, Output};
use kvroute_node_agent::model::Model;
use kvroute_proto::domain::{AgentGenerateRequest, CacheMode, KvDtype, SamplingParams};

const BLOCK_SIZE: usize = kvroute_proto::DEFAULT_BLOCK_SIZE as usize;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).cloned().unwrap_or_else(|| "tiny-random".into());
    let length: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let model = Model::load(&spec)?;
    let vocab = model.config().vocab_size;
    println!("model {} ({} threads), prompt {length} tokens", model.model_id(), model.threads());
    let blocks = 4 * length.div_ceil(BLOCK_SIZE) + 8;
    let kv = model.new_kv_store(KvDtype::Bf16, blocks, BLOCK_SIZE);
    let config = EngineConfig { max_context: length + 16, ..EngineConfig::default() };
    let mut engine = Engine::new(config, ModelExecutor::new(model, kv), Vec::new(), Box::new(VecSink::default()));

    let prompt: Vec<u32> = (0..length).map(|i| ((i * 7919) % (vocab - 300) + 100) as u32).collect();
    let mut sibling = prompt.clone();
    let last_block = (length - 1) / BLOCK_SIZE * BLOCK_SIZE;
    let wrap = (vocab - 300) as u32;
    sibling[last_block..].iter_mut().for_each(|t| *t = (*t + 1) % wrap + 100);

    let (cold, _) = time_to_first_token(&mut engine, &prompt);
    let (cached, cached_tokens) = time_to_first_token(&mut engine, &prompt);
    let (partial, partial_tokens) = time_to_first_token(&mut engine, &sibling);
    println!("cold:                    {:>8.1} ms", ms(cold));
    println!("same prompt again:       {:>8.1} ms ({cached_tokens} tokens from the prefix cache)", ms(cached));
    println!("all but the last block:  {:>8.1} ms ({partial_tokens} tokens from the prefix cache)", ms(partial));
    println!("saved by the full hit:   {:>8.1}% of the cold prefill", 100.0 * (1.0 - ms(cached) / ms(cold)));
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Submits `prompt` for one token and steps the engine until it arrives.
fn time_to_first_token(engine: &mut Engine<ModelExecutor>, prompt: &[u32]) -> (Duration, u32) {
    let request = AgentGenerateRequest {
        request_id: String::new(),
        prompt: prompt.to_vec(),
        cache_scope: Vec::new(),
        cache_mode: CacheMode::Shared,
        sampling: SamplingParams::GREEDY,
        max_tokens: 1,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    };
    let cached = Arc::new(Mutex::new(None));
    let sink = cached.clone();
    let start = Instant::now();
    engine
        .submit(
            request,
            Box::new(move |output: Output| {
                if let Some((_, usage)) = output.finished {
                    *sink.lock().unwrap() = Some(usage.cached_tokens);
                }
                true
            }),
        )
        .unwrap();
    while cached.lock().unwrap().is_none() {
        engine.step();
    }
    let elapsed = start.elapsed();
    let cached_tokens = cached.lock().unwrap().unwrap_or(0);
    (elapsed, cached_tokens)
}

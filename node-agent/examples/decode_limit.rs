//! Decode against its limit: a decode step reads every weight once (plus the KV cache of the context),
//! so its floor is those bytes divided by the machine's memory bandwidth. This example measures the
//! streaming read bandwidth of this machine, times batch-1 decode steps, and prints both.
//!
//! cargo run --release -p kvroute-node-agent --example decode_limit -- [MODEL.gguf|tiny-random] [context] [threads]

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use kvroute_node_agent::model::{Model, ModelConfig, SeqChunk};
use kvroute_proto::domain::KvDtype;

const BLOCK_SIZE: usize = 16;
const STEPS: usize = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).cloned().unwrap_or_else(|| "tiny-random".into());
    let context: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(256);
    let mut model = Model::load(&spec)?;
    if let Some(threads) = args.get(3).and_then(|a| a.parse().ok()) {
        model.set_threads(threads);
    }
    let config = model.config().clone();

    let weight_bytes = decode_weight_bytes(&config);
    let kv_bytes = context * config.kv_geometry(KvDtype::Bf16).bytes_per_token() as usize;
    println!("model {} ({} threads)", model.model_id(), model.threads());
    println!(
        "bytes read per batch-1 decode step: weights {:.1} MB (f32) + KV {:.1} MB (bf16, {context} tokens)",
        weight_bytes as f64 / 1e6,
        kv_bytes as f64 / 1e6
    );

    for threads in [1, 2] {
        println!("memory read bandwidth, {threads} thread(s): {:.1} GB/s", read_bandwidth(threads) / 1e9);
    }

    let step = decode_step_seconds(&model, context);
    let moved = (weight_bytes + kv_bytes) as f64;
    println!(
        "decode step, batch 1: {:.1} ms = {:.1} tok/s, {:.1} GB/s of weights and KV",
        step * 1e3,
        1.0 / step,
        moved / step / 1e9
    );
    Ok(())
}

/// Bytes of weights a decode step reads: every layer matrix, the LM head and one embedding row.
fn decode_weight_bytes(c: &ModelConfig) -> usize {
    let per_layer = c.d_model * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.d_model + 3 * c.d_model * c.ffn_dim;
    let norms = (2 * c.n_layers + 1) * c.d_model;
    let elems = c.n_layers * per_layer + norms + c.vocab_size * c.d_model + c.d_model;
    elems * std::mem::size_of::<f32>()
}

/// Streaming read bandwidth over a buffer much larger than the caches, best of a few passes.
fn read_bandwidth(threads: usize) -> f64 {
    let len: usize = 256 << 20; // 1 GiB of f32
    let data: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect::<Vec<f32>>();
    let chunk = len.div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for part in data.chunks(chunk) {
                scope.spawn(move || black_box(sum(part)));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (len * 4) as f64 / best
}

/// Eight independent accumulators so the loop is bound by loads, not by the add latency.
fn sum(values: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut lanes = values.chunks_exact(8);
    for lane in &mut lanes {
        for (a, v) in acc.iter_mut().zip(lane) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + lanes.remainder().iter().sum::<f32>()
}

/// Median time of a batch-1 decode step after `context` tokens of prefill.
fn decode_step_seconds(model: &Model, context: usize) -> f64 {
    let vocab = model.config().vocab_size;
    let tokens: Vec<u32> = (0..context + STEPS).map(|i| ((i * 7919) % (vocab - 300) + 100) as u32).collect();
    let blocks = (context + STEPS).div_ceil(BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut kv = model.new_kv_store(KvDtype::Bf16, blocks, BLOCK_SIZE);
    let prefill = SeqChunk { tokens: &tokens[..context], start_pos: 0, block_table: &table, want_logits: false };
    model.forward(&mut kv, &[prefill]);
    let mut times = Vec::with_capacity(STEPS);
    for position in context..context + STEPS {
        let chunk = SeqChunk {
            tokens: &tokens[position..=position],
            start_pos: position,
            block_table: &table,
            want_logits: true,
        };
        let start = Instant::now();
        black_box(model.forward(&mut kv, &[chunk]));
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[STEPS / 2]
}

//! Prefill and decode against their limits on this machine.
//!
//! Prefill is compute-bound: its limit is the FLOP rate of sgemm itself on the model's own product shapes,
//! so this times a 512-token prefill and the same dense products run bare through sgemm (split over the same
//! threads), and prints both rates. Decode is memory-bound: a batch-1 step reads every weight once plus the KV
//! of its context, so its floor is those bytes over the machine's streaming read bandwidth, measured here too.
//!
//! cargo run --release -p kvroute-node-agent --example model_limits -- [MODEL.gguf|tiny-random] [context] [threads]

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use kvroute_node_agent::model::{Model, ModelConfig, SeqChunk};
use kvroute_proto::domain::KvDtype;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

const BLOCK_SIZE: usize = kvroute_proto::DEFAULT_BLOCK_SIZE as usize;
const STEPS: usize = 20;
const PREFILL: usize = 512;

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

    let (prefill, dense_flops, attention_flops) = prefill_seconds(&model);
    let reference = sgemm_seconds(&config, model.threads());
    println!(
        "prefill of {PREFILL} tokens: {:.1} ms = {:.0} tok/s; dense products {:.1} GFLOP + attention {:.1} GFLOP \
         = {:.1} GFLOP/s",
        prefill * 1e3,
        PREFILL as f64 / prefill,
        dense_flops / 1e9,
        attention_flops / 1e9,
        (dense_flops + attention_flops) / prefill / 1e9
    );
    println!(
        "the same dense products bare through sgemm: {:.1} ms = {:.1} GFLOP/s; prefill reaches {:.0}% of it",
        reference * 1e3,
        dense_flops / reference / 1e9,
        100.0 * ((dense_flops + attention_flops) / prefill) / (dense_flops / reference)
    );

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

/// Multiply-adds of one token through every layer's dense products (the LM head runs for one token only).
fn dense_flops_per_token(c: &ModelConfig) -> f64 {
    let per_layer = c.d_model * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.d_model + 3 * c.d_model * c.ffn_dim;
    2.0 * (c.n_layers * per_layer) as f64
}

/// Median time of a 512-token prefill, with its dense and attention FLOPs.
fn prefill_seconds(model: &Model) -> (f64, f64, f64) {
    let c = model.config();
    let tokens: Vec<u32> = (0..PREFILL).map(|i| ((i * 7919) % (c.vocab_size - 300) + 100) as u32).collect();
    let blocks = PREFILL.div_ceil(BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut kv = model.new_kv_store(KvDtype::Bf16, blocks, BLOCK_SIZE);
    let mut times = Vec::new();
    for _ in 0..3 {
        let chunk = SeqChunk { tokens: &tokens, start_pos: 0, block_table: &table, want_logits: true };
        let start = Instant::now();
        black_box(model.forward(&mut kv, &[chunk]));
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let dense = PREFILL as f64 * dense_flops_per_token(c) + 2.0 * (c.vocab_size * c.d_model) as f64;
    // Scores and weighted values: 2 x 2 x head_dim FLOPs per query head per visible position, causal.
    let visible = (PREFILL * (PREFILL + 1) / 2) as f64;
    let attention = 4.0 * (c.n_layers * c.n_heads * c.head_dim) as f64 * visible;
    (times[1], dense, attention)
}

/// Time of the prefill's dense products for 512 tokens run bare through sgemm, rows split over `threads`.
fn sgemm_seconds(c: &ModelConfig, threads: usize) -> f64 {
    let shapes = [
        (c.d_model, c.q_dim() + 2 * c.kv_dim()),
        (c.q_dim(), c.d_model),
        (c.d_model, 2 * c.ffn_dim),
        (c.ffn_dim, c.d_model),
    ];
    let widest = shapes.iter().map(|&(k, n)| k.max(n)).max().unwrap_or(1);
    let x: Vec<f32> = (0..PREFILL * widest).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
    let weights: Vec<Vec<f32>> =
        shapes.iter().map(|&(k, n)| (0..k * n).map(|i| ((i % 89) as f32 - 44.0) * 0.01).collect()).collect();
    let mut out = vec![0.0f32; PREFILL * widest];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..c.n_layers {
            for (&(k, n), w) in shapes.iter().zip(&weights) {
                let rows = PREFILL.div_ceil(threads);
                std::thread::scope(|scope| {
                    for (xs, outs) in x[..PREFILL * k].chunks(rows * k).zip(out[..PREFILL * n].chunks_mut(rows * n)) {
                        let w = &w[..];
                        scope.spawn(move || {
                            let m = xs.len() / k;
                            let a = ArrayView2::from_shape((m, k), xs).unwrap();
                            let b = ArrayView2::from_shape((k, n), w).unwrap();
                            let mut o = ArrayViewMut2::from_shape((m, n), outs).unwrap();
                            general_mat_mul(1.0, &a, &b, 0.0, &mut o);
                        });
                    }
                });
            }
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

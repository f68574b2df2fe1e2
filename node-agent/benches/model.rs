//! Model throughput: prefill of a 512-token prompt, decode steps at batch 1 and 8 (tiny-random and
//! SmolLM2-135M), and the single-thread sgemm rate of a prefill-shaped product for reference.
//!
//! `cargo bench -p kvroute-node-agent --bench model -- --warm-up-time 1 --measurement-time 5`
//!
//! The model uses all available cores unless `KVROUTE_BENCH_THREADS` says how many threads to use.

#![allow(clippy::unwrap_used)]
// A benchmark has no one to report an error to: setup failures abort it.
#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvroute_node_agent::model::{KvStore, Model, SeqChunk};
use kvroute_proto::domain::KvDtype;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

const BLOCK_SIZE: usize = kvroute_proto::block_hash::DEFAULT_BLOCK_SIZE as usize;
const PROMPT: usize = 512;
/// Context already cached when a decode step runs.
const DECODE_CONTEXT: usize = 256;

fn prompt(len: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + seed * 104_729) % (vocab - 300) + 100) as u32).collect()
}

fn models() -> Vec<(&'static str, Model)> {
    let tiny = Model::load("tiny-random").expect("tiny-random");
    let path = kvroute_test_support::smollm2_path();
    let smol = Model::load(path.to_str().expect("UTF-8 path")).expect("SmolLM2");
    let threads = std::env::var("KVROUTE_BENCH_THREADS").ok().and_then(|v| v.parse().ok());
    let mut models = vec![("tiny-random", tiny), ("smollm2-135m", smol)];
    for (_, model) in &mut models {
        model.set_threads(threads.unwrap_or(model.threads()));
    }
    models
}

fn bench_prefill(c: &mut Criterion, name: &str, model: &Model) {
    let tokens = prompt(PROMPT, model.config().vocab_size, 0);
    let blocks = PROMPT.div_ceil(BLOCK_SIZE);
    let mut kv = model.new_kv_store(KvDtype::Bf16, blocks, BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut group = c.benchmark_group("prefill_512");
    group.sample_size(10).throughput(Throughput::Elements(PROMPT as u64));
    group.bench_function(name, |b| {
        b.iter(|| {
            let chunk = SeqChunk { tokens: &tokens, start_pos: 0, block_table: &table, want_logits: true };
            black_box(model.forward(&mut kv, &[chunk]))
        })
    });
    group.finish();
}

fn bench_decode(c: &mut Criterion, name: &str, model: &Model) {
    let mut group = c.benchmark_group(format!("decode_step/{name}"));
    group.sample_size(10);
    for batch in [1usize, 8] {
        let per_seq = (DECODE_CONTEXT + 1).div_ceil(BLOCK_SIZE);
        let mut kv: KvStore = model.new_kv_store(KvDtype::Bf16, per_seq * batch, BLOCK_SIZE);
        let tables: Vec<Vec<u32>> =
            (0..batch).map(|s| (0..per_seq as u32).map(|b| b + (s * per_seq) as u32).collect()).collect();
        let prompts: Vec<Vec<u32>> =
            (0..batch).map(|s| prompt(DECODE_CONTEXT + 1, model.config().vocab_size, s)).collect();
        for (tokens, table) in prompts.iter().zip(&tables) {
            let chunk =
                SeqChunk { tokens: &tokens[..DECODE_CONTEXT], start_pos: 0, block_table: table, want_logits: false };
            model.forward(&mut kv, &[chunk]);
        }
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::new("batch", batch), &batch, |b, _| {
            b.iter(|| {
                let chunks: Vec<SeqChunk<'_>> = prompts
                    .iter()
                    .zip(&tables)
                    .map(|(tokens, table)| SeqChunk {
                        tokens: &tokens[DECODE_CONTEXT..],
                        start_pos: DECODE_CONTEXT,
                        block_table: table,
                        want_logits: true,
                    })
                    .collect();
                black_box(model.forward(&mut kv, &chunks))
            })
        });
    }
    group.finish();
}

/// One `[512][576] · [576][1536]` product (SmolLM2's gate/up shape), single-threaded, as GFLOP/s.
fn bench_sgemm(c: &mut Criterion) {
    let (m, k, n) = (512usize, 576usize, 1536usize);
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 89) as f32 - 44.0) * 0.01).collect();
    let mut out = vec![0.0f32; m * n];
    let mut group = c.benchmark_group("sgemm");
    group.sample_size(20).throughput(Throughput::Elements((2 * m * k * n) as u64));
    group.bench_function("512x576x1536_flops", |b| {
        b.iter(|| {
            let a = ArrayView2::from_shape((m, k), &x[..]).expect("shape");
            let bw = ArrayView2::from_shape((k, n).strides((n, 1)), &w[..]).expect("shape");
            let mut cv = ArrayViewMut2::from_shape((m, n), &mut out[..]).expect("shape");
            general_mat_mul(1.0, &a, &bw, 0.0, &mut cv);
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_sgemm(c);
    for (name, model) in models() {
        bench_prefill(c, name, &model);
        bench_decode(c, name, &model);
    }
}

criterion_group!(model_benches, benches);
criterion_main!(model_benches);

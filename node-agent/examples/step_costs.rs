//! What one engine step costs on this machine, by shape: the numbers a simulator cost profile of this CPU
//! is fitted to (`bench/profiles/cpu-tiny-random.profile`). Times the model's batched forward pass for
//! prefill chunks of several lengths after a cached context, with and without the LM head (the logits of
//! the chunk's last token), decode batches of several sequences, and the sampling of one token. Medians
//! over repeated steps.
//!
//! cargo run --release -p kvroute-node-agent --example step_costs -- [MODEL.gguf|tiny-random] [context]

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use kvroute_node_agent::model::sampling::Sampler;
use kvroute_node_agent::model::{KvStore, Model, SeqChunk};
use kvroute_proto::domain::{KvDtype, SamplingParams};

const BLOCK_SIZE: usize = kvroute_proto::DEFAULT_BLOCK_SIZE as usize;
const REPEATS: usize = 15;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).cloned().unwrap_or_else(|| "tiny-random".into());
    let context: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(400);
    let model = Model::load(&spec)?;
    println!("model {} ({} threads), context {context} tokens before each chunk", model.model_id(), model.threads());
    let mut bench = Bench::new(&model, context, 8);

    println!("\nprefill chunk of n new tokens, one sequence:");
    println!("{:>6} {:>14} {:>14} {:>12}", "n", "with head ms", "no head ms", "head ms");
    for n in [1, 16, 32, 64, 128, 256, 512] {
        let with_head = bench.median(&[n], true);
        let without = bench.median(&[n], false);
        println!("{n:>6} {:>14.2} {:>14.2} {:>12.2}", with_head * 1e3, without * 1e3, (with_head - without) * 1e3);
    }

    println!("\ndecode batch of b sequences (one token each, with head):");
    println!("{:>6} {:>10}", "b", "step ms");
    for b in [1, 2, 3, 4, 5, 8] {
        println!("{b:>6} {:>10.2}", bench.median(&vec![1; b], true) * 1e3);
    }

    // What the engine does with each sequence's logits after the step: sampling at temperature 1.
    let logits = bench.logits();
    let params = SamplingParams::new(1.0, 1.0, Some(7)).map_err(|error| format!("{error:?}"))?;
    let mut sampler = Sampler::new(params, 7);
    let mut times: Vec<f64> = (0..REPEATS)
        .map(|_| {
            let start = Instant::now();
            black_box(sampler.sample(black_box(&logits)));
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!("\nsampling one token at temperature 1 over {} logits: {:.2} ms", logits.len(), times[REPEATS / 2] * 1e3);
    Ok(())
}

/// `sequences` sequences, each with `context` tokens already in its own blocks of one KV store.
struct Bench<'a> {
    model: &'a Model,
    context: usize,
    tokens: Vec<u32>,
    tables: Vec<Vec<u32>>,
    kv: KvStore,
}

impl<'a> Bench<'a> {
    fn new(model: &'a Model, context: usize, sequences: usize) -> Bench<'a> {
        let vocab = model.config().vocab_size;
        let longest = context + 512;
        let tokens: Vec<u32> = (0..longest).map(|i| ((i * 7919) % (vocab - 300) + 100) as u32).collect();
        let per_sequence = longest.div_ceil(BLOCK_SIZE);
        let mut kv = model.new_kv_store(KvDtype::Bf16, per_sequence * sequences, BLOCK_SIZE);
        let tables: Vec<Vec<u32>> =
            (0..sequences).map(|s| ((s * per_sequence) as u32..((s + 1) * per_sequence) as u32).collect()).collect();
        for table in &tables {
            let chunk = SeqChunk { tokens: &tokens[..context], start_pos: 0, block_table: table, want_logits: false };
            model.forward(&mut kv, &[chunk]);
        }
        Bench { model, context, tokens, tables, kv }
    }

    /// Median seconds of one forward pass with a chunk of `lengths[i]` new tokens for sequence `i`.
    fn median(&mut self, lengths: &[usize], want_logits: bool) -> f64 {
        let batch: Vec<SeqChunk<'_>> = lengths
            .iter()
            .zip(&self.tables)
            .map(|(&n, table)| SeqChunk {
                tokens: &self.tokens[self.context..self.context + n],
                start_pos: self.context,
                block_table: table,
                want_logits,
            })
            .collect();
        black_box(self.model.forward(&mut self.kv, &batch));
        let mut times: Vec<f64> = (0..REPEATS)
            .map(|_| {
                let start = Instant::now();
                black_box(self.model.forward(&mut self.kv, &batch));
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[REPEATS / 2]
    }

    /// The logits of one decode step of the first sequence.
    fn logits(&mut self) -> Vec<f32> {
        let chunk = SeqChunk {
            tokens: &self.tokens[self.context..=self.context],
            start_pos: self.context,
            block_table: &self.tables[0],
            want_logits: true,
        };
        self.model.forward(&mut self.kv, &[chunk]).remove(0).unwrap_or_default()
    }
}

//! A Llama-architecture transformer computed on the CPU in f32, with paged attention over a [`KvStore`].
//!
//! - [`config`]: hyper-parameters ([`ModelConfig`]) and the KV geometry they imply.
//! - [`kv_store`]: the paged K/V pool ([`KvStore`]) in f32, bf16 or fp8 (e4m3).
//! - [`gguf_loader`] and [`tiny_random`]: the two sources of weights.
//! - [`forward`]: one batched forward pass over sequence chunks ([`SeqChunk`]).
//! - [`sampling`]: greedy and temperature/top-p sampling ([`Sampler`]).
//!
//! Logits are bit-identical for a sequence however its positions were split into chunks, whatever else was
//! in the batch, and whether its earlier K/V were computed now, found in the store, or copied in as bytes:
//! every row's arithmetic is independent of the batch, and attention always reads K/V back from the store.

mod attention;
pub mod config;
mod error;
pub mod forward;
mod gemm;
mod gemv;
pub mod gguf_loader;
pub mod kv_store;
mod ops;
mod prng;
mod quant;
pub mod sampling;
mod sgemm;
pub mod tiny_random;
mod weights;

use std::path::Path;

pub use config::ModelConfig;
pub use error::{KvStoreError, ModelError};
pub use forward::SeqChunk;
pub use kv_store::KvStore;
pub use sampling::Sampler;

use ops::RopeTable;
use weights::Weights;

/// The model spec that selects the built-in random model.
pub const TINY_RANDOM: &str = "tiny-random";

/// A loaded model: hyper-parameters, f32 weights, and the facts the agent advertises.
pub struct Model {
    config: ModelConfig,
    weights: Weights,
    rope: RopeTable,
    model_id: String,
    eos_token_ids: Vec<u32>,
    threads: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("model_id", &self.model_id).field("config", &self.config).finish()
    }
}

impl Model {
    /// Loads `"tiny-random"` or a llama-architecture `.gguf` file.
    pub fn load(spec: &str) -> Result<Model, ModelError> {
        if spec == TINY_RANDOM {
            return Ok(tiny_random::model());
        }
        gguf_loader::load_path(Path::new(spec))
    }

    fn from_parts(config: ModelConfig, weights: Weights, model_id: String, eos_token_ids: Vec<u32>) -> Model {
        let rope = RopeTable::new(&config);
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        Model { config, weights, rope, model_id, eos_token_ids, threads }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// `"tiny-random"`, the GGUF file's `general.name`, or else the file's stem.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Token ids that end generation (the file's EOS id and, for chat models, `<|im_end|>`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Threads a forward pass may use (default: the machine's available parallelism). Results are
    /// bit-identical for every thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// A KV store shaped for this model.
    pub fn new_kv_store(&self, dtype: kvroute_proto::domain::KvDtype, num_blocks: usize, block_size: usize) -> KvStore {
        KvStore::new(self.config.kv_geometry(dtype), num_blocks, block_size)
    }
}

//! The real [`Executor`]: the model's forward pass over its paged [`KvStore`].

use std::sync::Arc;

use crate::block_manager::BlockId;
use crate::engine::{ChunkSpec, Executor};
use crate::model::{KvStore, Model, SeqChunk};
use crate::tiers::host::BlockBytes;

/// A model and the KV pool it computes into.
pub struct ModelExecutor {
    model: Model,
    kv: KvStore,
}

impl ModelExecutor {
    pub fn new(model: Model, kv: KvStore) -> ModelExecutor {
        ModelExecutor { model, kv }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn kv(&self) -> &KvStore {
        &self.kv
    }
}

impl Executor for ModelExecutor {
    fn execute(&mut self, batch: &[ChunkSpec<'_>]) -> Vec<Option<Vec<f32>>> {
        let chunks: Vec<SeqChunk<'_>> = batch
            .iter()
            .map(|chunk| SeqChunk {
                tokens: chunk.tokens,
                start_pos: chunk.start_pos,
                block_table: chunk.block_table,
                want_logits: chunk.want_logits,
            })
            .collect();
        self.model.forward(&mut self.kv, &chunks)
    }

    fn read_block(&self, block: BlockId) -> BlockBytes {
        Arc::new(self.kv.block_to_bytes(block))
    }

    fn write_block(&mut self, block: BlockId, bytes: &[u8]) -> Result<(), String> {
        self.kv.block_from_bytes(block, bytes).map_err(|error| error.to_string())
    }

    fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    fn bytes_per_block(&self) -> usize {
        self.kv.bytes_per_block()
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn model_id(&self) -> &str {
        self.model.model_id()
    }
}

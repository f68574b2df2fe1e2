//! The real model's executor with a hook that runs before each forward pass: the hook may hold the pass
//! (a gate a test opens) or give the pass a modelled duration (a clock a test moves by it).

use kvroute_node_agent::block_manager::BlockId;
use kvroute_node_agent::engine::executor::{ChunkSpec, Executor};
use kvroute_node_agent::engine::model_executor::ModelExecutor;
use kvroute_node_agent::tiers::host::BlockBytes;

pub struct Hooked<H> {
    inner: ModelExecutor,
    hook: H,
    modelled: Option<f64>,
}

impl<H: FnMut(&[ChunkSpec<'_>]) -> Option<f64>> Hooked<H> {
    /// `hook` sees each batch before the model computes it and returns the pass's modelled seconds, if any.
    pub fn new(inner: ModelExecutor, hook: H) -> Hooked<H> {
        Hooked { inner, hook, modelled: None }
    }
}

impl<H: FnMut(&[ChunkSpec<'_>]) -> Option<f64>> Executor for Hooked<H> {
    fn execute(&mut self, batch: &[ChunkSpec<'_>]) -> Vec<Option<Vec<f32>>> {
        self.modelled = (self.hook)(batch);
        self.inner.execute(batch)
    }
    fn read_block(&self, block: BlockId) -> BlockBytes {
        self.inner.read_block(block)
    }
    fn write_block(&mut self, block: BlockId, bytes: &[u8]) -> Result<(), String> {
        self.inner.write_block(block, bytes)
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn bytes_per_block(&self) -> usize {
        self.inner.bytes_per_block()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn modelled_seconds(&self) -> Option<f64> {
        self.modelled
    }
}

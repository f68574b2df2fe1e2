//! The boundary between scheduling and arithmetic: an [`Executor`] computes a
//! batch of sequence chunks against the KV pool and moves block contents.
//!
//! The model implements it for real; a cost model can implement it for the
//! simulator, so both drive the same scheduler and block manager.

use crate::block_manager::BlockId;
use crate::tiers::host::BlockBytes;

/// One sequence's share of a step: `tokens` at positions `start_pos..`, with
/// earlier positions already in the pool through `block_table`.
#[derive(Clone, Copy, Debug)]
pub struct ChunkSpec<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub block_table: &'a [BlockId],
    /// Return the logits of the chunk's last token.
    pub want_logits: bool,
}

/// Computes batches and owns the KV values of the pool.
pub trait Executor {
    /// Computes every chunk, writing their K/V into the pool; returns the last
    /// token's logits of each chunk that wants them.
    fn execute(&mut self, batch: &[ChunkSpec<'_>]) -> Vec<Option<Vec<f32>>>;
    /// The exact stored bytes of a block (all layers, K and V), in the form the tiers keep.
    fn read_block(&self, block: BlockId) -> BlockBytes;
    /// Overwrites a block with bytes from [`Executor::read_block`].
    fn write_block(&mut self, block: BlockId, bytes: &[u8]) -> Result<(), String>;
    fn num_blocks(&self) -> usize;
    /// Bytes of one block as [`Executor::read_block`] returns them.
    fn bytes_per_block(&self) -> usize;
    fn block_size(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// The served model id, part of every block hash.
    fn model_id(&self) -> &str;
    /// Seconds the last [`Executor::execute`] took in a cost model's virtual time; None when the
    /// arithmetic is real and the engine times it with the wall clock.
    fn modelled_seconds(&self) -> Option<f64> {
        None
    }
    /// Seconds a cost model charges for writing `bytes` into the pool; None: timed with the wall clock.
    fn modelled_copy_seconds(&self, _bytes: usize) -> Option<f64> {
        None
    }
}

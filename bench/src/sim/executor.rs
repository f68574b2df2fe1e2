//! The simulated replica's [`Executor`]: the node-agent's engine (scheduler, block manager, tiers) runs
//! unchanged on top of it, and instead of arithmetic each batch costs the time the [`CostProfile`] gives.
//!
//! Blocks carry a small stand-in payload instead of their real K/V bytes, so that a fleet of simulated
//! 80 GB pools fits in this machine's memory. Every byte count the engine sees (host-tier capacity,
//! measured copy bandwidth, KV bytes per token) is scaled by the same factor, which leaves its decisions
//! (what fits in host RAM, whether reloading beats recomputing) as they would be with real sizes; the
//! times this executor reports are computed from the real sizes.

use kvroute_node_agent::block_manager::BlockId;
use std::sync::Arc;

use kvroute_node_agent::engine::{ChunkSpec, Executor};
use kvroute_node_agent::tiers::host::BlockBytes;

use super::profile::CostProfile;

/// Bytes a simulated block carries.
pub const STAND_IN_BYTES: usize = 16;

pub struct CostExecutor {
    profile: CostProfile,
    model_id: String,
    num_blocks: usize,
    /// Seconds of the last execute, including the block writes since the one before.
    last_seconds: f64,
    pending_copy_seconds: f64,
    stand_in: BlockBytes,
}

impl CostExecutor {
    pub fn new(profile: &CostProfile, model_id: &str) -> CostExecutor {
        CostExecutor {
            profile: profile.clone(),
            model_id: model_id.to_string(),
            num_blocks: profile.num_blocks(),
            last_seconds: 0.0,
            pending_copy_seconds: 0.0,
            stand_in: Arc::new(vec![0; STAND_IN_BYTES]),
        }
    }

    /// Real bytes a stand-in byte count stands for.
    pub fn real_bytes(&self, stand_in: usize) -> f64 {
        stand_in as f64 / STAND_IN_BYTES as f64 * self.profile.block_bytes()
    }

    /// Stand-in bytes of a real byte budget (for the host tier's capacity).
    pub fn stand_in_bytes(profile: &CostProfile, real: f64) -> u64 {
        ((real / profile.block_bytes()).floor() as u64) * STAND_IN_BYTES as u64
    }
}

impl Executor for CostExecutor {
    fn execute(&mut self, batch: &[ChunkSpec<'_>]) -> Vec<Option<Vec<f32>>> {
        let chunks = batch.iter().map(|chunk| (chunk.tokens.len(), chunk.start_pos, chunk.want_logits));
        let compute = self.profile.step_seconds(chunks);
        self.last_seconds = compute + std::mem::take(&mut self.pending_copy_seconds);
        // One logit: greedy sampling picks token 0, a valid id that is not end-of-sequence here.
        batch.iter().map(|chunk| chunk.want_logits.then(|| vec![0.0])).collect()
    }

    fn read_block(&self, _block: BlockId) -> BlockBytes {
        // Every block's stand-in is the same bytes: share one allocation.
        self.stand_in.clone()
    }

    fn write_block(&mut self, _block: BlockId, bytes: &[u8]) -> Result<(), String> {
        self.pending_copy_seconds += self.real_bytes(bytes.len()) / self.profile.host_bandwidth;
        Ok(())
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn bytes_per_block(&self) -> usize {
        STAND_IN_BYTES
    }

    fn block_size(&self) -> usize {
        self.profile.block_size
    }

    fn vocab_size(&self) -> usize {
        self.profile.vocab_size
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn modelled_seconds(&self) -> Option<f64> {
        Some(self.last_seconds)
    }

    fn modelled_copy_seconds(&self, bytes: usize) -> Option<f64> {
        Some(self.real_bytes(bytes) / self.profile.host_bandwidth)
    }
}

//! One batched forward pass: the tokens of every chunk stacked into one activation matrix, dense products
//! through sgemm, attention per chunk through the KV store.

use super::attention::{self, ChunkQueries};
use super::gemm::matmul_rows_parallel;
use super::ops::{rms_norm, swiglu};
use super::{KvStore, Model, ModelError};

/// One sequence's share of a batch: `tokens` at positions `start_pos..start_pos + tokens.len()`.
///
/// Positions before `start_pos` must already be in the store. Position `p` lives in block
/// `block_table[p / block_size]`, slot `p % block_size`; the table must cover every position of the chunk.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub block_table: &'a [u32],
    /// Return the logits of the chunk's last token.
    pub want_logits: bool,
}

impl Model {
    /// Checks that a chunk fits this model and store (what [`Model::forward`] would otherwise panic on).
    pub fn check_chunk(&self, kv: &KvStore, chunk: &SeqChunk<'_>) -> Result<(), ModelError> {
        let invalid = |reason: String| Err(ModelError::InvalidChunk(reason));
        if kv.geometry() != self.config.kv_geometry(kv.geometry().dtype) {
            return invalid(format!("the KV store's geometry {:?} is not this model's", kv.geometry()));
        }
        if let Some(token) = chunk.tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return invalid(format!("token id {token} is outside the vocabulary of {}", self.config.vocab_size));
        }
        let end = chunk.start_pos + chunk.tokens.len();
        let needed = end.div_ceil(kv.block_size());
        if chunk.block_table.len() < needed {
            return invalid(format!("{} blocks cover fewer than {end} positions", chunk.block_table.len()));
        }
        if let Some(block) = chunk.block_table[..needed].iter().find(|&&b| b as usize >= kv.num_blocks()) {
            return invalid(format!("block {block} is outside the store of {} blocks", kv.num_blocks()));
        }
        Ok(())
    }

    /// Computes every chunk, writing its K/V into `kv`; returns, per chunk, the logits of its last token
    /// when `want_logits` (and the chunk is not empty).
    ///
    /// A chunk's logits are bit-identical however its sequence was split into chunks, whatever else is in
    /// the batch, and however its earlier positions reached the store. Panics on a chunk that
    /// [`Model::check_chunk`] rejects.
    pub fn forward(&self, kv: &mut KvStore, batch: &[SeqChunk<'_>]) -> Vec<Option<Vec<f32>>> {
        let config = &self.config;
        assert_eq!(kv.geometry(), config.kv_geometry(kv.geometry().dtype), "KV store of another model");
        let (d, q_dim, kv_dim, ffn) = (config.d_model, config.q_dim(), config.kv_dim(), config.ffn_dim);
        let qkv_width = q_dim + 2 * kv_dim;
        let rows: usize = batch.iter().map(|chunk| chunk.tokens.len()).sum();
        let mut x = Vec::with_capacity(rows * d);
        for &token in batch.iter().flat_map(|chunk| chunk.tokens) {
            let token = token as usize;
            x.extend_from_slice(&self.weights.token_embd[token * d..(token + 1) * d]);
        }
        let mut normed = vec![0.0f32; rows * d];
        let mut qkv = vec![0.0f32; rows * qkv_width];
        let mut attn = vec![0.0f32; rows * q_dim];
        let mut projected = vec![0.0f32; rows * d];
        let mut gate_up = vec![0.0f32; rows * 2 * ffn];
        let mut hidden = vec![0.0f32; rows * ffn];
        for (layer, weights) in self.weights.layers.iter().enumerate() {
            for (row, out) in x.chunks_exact(d).zip(normed.chunks_exact_mut(d)) {
                rms_norm(row, &weights.attn_norm, config.rms_eps, out);
            }
            matmul_rows_parallel(&normed, rows, weights.wqkv.view(), &mut qkv, self.threads);
            self.rotate_and_store(kv, layer, batch, &mut qkv);
            self.attention(kv, layer, batch, &qkv, &mut attn);
            matmul_rows_parallel(&attn, rows, weights.wo.view(), &mut projected, self.threads);
            x.iter_mut().zip(&projected).for_each(|(x, p)| *x += p);
            for (row, out) in x.chunks_exact(d).zip(normed.chunks_exact_mut(d)) {
                rms_norm(row, &weights.ffn_norm, config.rms_eps, out);
            }
            matmul_rows_parallel(&normed, rows, weights.w_gate_up.view(), &mut gate_up, self.threads);
            for (row, out) in gate_up.chunks_exact(2 * ffn).zip(hidden.chunks_exact_mut(ffn)) {
                let (gate, up) = row.split_at(ffn);
                swiglu(gate, up, out);
            }
            matmul_rows_parallel(&hidden, rows, weights.w_down.view(), &mut projected, self.threads);
            x.iter_mut().zip(&projected).for_each(|(x, p)| *x += p);
        }
        self.logits(&x, batch)
    }

    /// Attention of every chunk's queries (in `qkv`) over its sequence's K/V in the store, into `attn`.
    fn attention(&self, kv: &KvStore, layer: usize, batch: &[SeqChunk<'_>], qkv: &[f32], attn: &mut [f32]) {
        let (q_dim, qkv_width) = (self.config.q_dim(), self.config.q_dim() + 2 * self.config.kv_dim());
        let mut queries = Vec::with_capacity(batch.len());
        let mut outputs: Vec<&mut [f32]> = Vec::with_capacity(batch.len());
        let (mut qkv_rest, mut attn_rest) = (qkv, attn);
        for chunk in batch {
            let n = chunk.tokens.len();
            let (q, qkv_tail) = qkv_rest.split_at(n * qkv_width);
            let (out, attn_tail) = attn_rest.split_at_mut(n * q_dim);
            queries.push(ChunkQueries {
                q,
                stride: qkv_width,
                tokens: n,
                start_pos: chunk.start_pos,
                block_table: chunk.block_table,
            });
            outputs.push(out);
            (qkv_rest, attn_rest) = (qkv_tail, attn_tail);
        }
        attention::attend_all(&self.config, kv, layer, &queries, &mut outputs, self.threads);
    }

    /// Applies RoPE to the Q and K of every row and writes K and V into the store.
    fn rotate_and_store(&self, kv: &mut KvStore, layer: usize, batch: &[SeqChunk<'_>], qkv: &mut [f32]) {
        let (q_dim, kv_dim) = (self.config.q_dim(), self.config.kv_dim());
        let block_size = kv.block_size();
        let positions = batch
            .iter()
            .flat_map(|chunk| (0..chunk.tokens.len()).map(move |t| (chunk.start_pos + t, chunk.block_table)));
        for (row, (pos, table)) in qkv.chunks_exact_mut(q_dim + 2 * kv_dim).zip(positions) {
            let (q, kv_part) = row.split_at_mut(q_dim);
            let (k, v) = kv_part.split_at_mut(kv_dim);
            self.rope.apply(q, pos);
            self.rope.apply(k, pos);
            kv.write(layer, table[pos / block_size] as usize, pos % block_size, k, v);
        }
    }

    /// Final norm and LM head for the last row of every chunk that wants logits.
    fn logits(&self, x: &[f32], batch: &[SeqChunk<'_>]) -> Vec<Option<Vec<f32>>> {
        let (d, vocab) = (self.config.d_model, self.config.vocab_size);
        let mut wanted = Vec::new();
        let mut end = 0;
        for chunk in batch {
            end += chunk.tokens.len();
            if chunk.want_logits && !chunk.tokens.is_empty() {
                wanted.push(end - 1);
            }
        }
        let mut normed = vec![0.0f32; wanted.len() * d];
        for (&row, out) in wanted.iter().zip(normed.chunks_exact_mut(d)) {
            rms_norm(&x[row * d..(row + 1) * d], &self.weights.output_norm, self.config.rms_eps, out);
        }
        let mut logits = vec![0.0f32; wanted.len() * vocab];
        matmul_rows_parallel(&normed, wanted.len(), self.weights.lm_head.view(), &mut logits, self.threads);
        let mut rows = logits.chunks_exact(vocab).map(<[f32]>::to_vec);
        batch
            .iter()
            .map(|chunk| if chunk.want_logits && !chunk.tokens.is_empty() { rows.next() } else { None })
            .collect()
    }
}

//! Paged grouped-query attention: a chunk's queries attend over K/V read back from the store through
//! the sequence's block table.
//!
//! For each KV head and each tile of queries: scores = Q · Kᵀ (sgemm, a `head_dim`-long sum per score),
//! a causal softmax per row (max subtracted, sums in position order), then out = P · V (sgemm), where a
//! query's probabilities past its own position are exact zeros. Adding zero terms leaves an sgemm sum
//! unchanged, so a query's output does not depend on how many later positions share its tile, its
//! chunk, or the batch.

use super::KvStore;
use super::ModelConfig;
use super::gemm::{Mat, matmul};

/// Queries per tile: bounds the score buffer to `TILE * group * positions` values.
const TILE: usize = 64;

/// Score-matrix entries below which a layer's attention stays on one thread.
const PARALLEL_MIN_SCORES: usize = 1 << 16;

/// One sequence chunk's view of a layer's attention.
pub(crate) struct ChunkQueries<'a> {
    /// Rows of the chunk's tokens; row `t` starts at `t * stride` and begins with its `q_dim` query values.
    pub q: &'a [f32],
    pub stride: usize,
    pub tokens: usize,
    pub start_pos: usize,
    pub block_table: &'a [u32],
}

/// A chunk with its K and V of positions `0..start_pos + tokens`, `[position][kv_head][head_dim]`.
struct Gathered<'a> {
    chunk: &'a ChunkQueries<'a>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// One unit of work: the queries of one tile of one chunk against one KV head.
#[derive(Clone, Copy)]
struct Tile {
    chunk: usize,
    kv_head: usize,
    start: usize,
    end: usize,
}

/// Buffers of one tile computation.
#[derive(Default)]
struct TileScratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

/// Computes the attention of every chunk's queries in one layer; `outputs[i]` receives chunk `i`'s
/// `tokens` rows of `q_dim` values. Tiles run on up to `threads` threads; each tile's arithmetic is the
/// same whichever thread runs it.
pub(crate) fn attend_all(
    config: &ModelConfig,
    kv: &KvStore,
    layer: usize,
    chunks: &[ChunkQueries<'_>],
    outputs: &mut [&mut [f32]],
    threads: usize,
) {
    let gathered: Vec<Gathered<'_>> = chunks.iter().map(|chunk| gather(kv, layer, chunk)).collect();
    let mut tiles = Vec::new();
    for (index, chunk) in chunks.iter().enumerate() {
        for kv_head in 0..config.n_kv_heads {
            for start in (0..chunk.tokens).step_by(TILE) {
                tiles.push(Tile { chunk: index, kv_head, start, end: (start + TILE).min(chunk.tokens) });
            }
        }
    }
    let cost = |tile: &Tile| (tile.end - tile.start) * (chunks[tile.chunk].start_pos + tile.end);
    let total: usize = tiles.iter().map(cost).sum::<usize>() * config.group_size();
    let threads = if total < PARALLEL_MIN_SCORES { 1 } else { threads.clamp(1, tiles.len().max(1)) };
    let width = kv.token_elems();
    let run = |share: &[Tile]| -> Vec<Vec<f32>> {
        let mut scratch = TileScratch::default();
        share
            .iter()
            .map(|tile| {
                compute_tile(config, &gathered[tile.chunk], width, tile, &mut scratch);
                std::mem::take(&mut scratch.out)
            })
            .collect()
    };
    // Balance by cost: each thread takes every `threads`-th tile of the tiles sorted by cost.
    let mut order: Vec<usize> = (0..tiles.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(&tiles[i])));
    let shares: Vec<Vec<Tile>> =
        (0..threads).map(|t| order.iter().skip(t).step_by(threads).map(|&i| tiles[i]).collect()).collect();
    let results: Vec<Vec<Vec<f32>>> = if threads == 1 {
        vec![run(&shares[0])]
    } else {
        std::thread::scope(|scope| {
            let run = &run;
            let handles: Vec<_> = shares[1..].iter().map(|share| scope.spawn(move || run(share))).collect();
            let mut results = vec![run(&shares[0])];
            for handle in handles {
                results.push(match handle.join() {
                    Ok(result) => result,
                    Err(payload) => std::panic::resume_unwind(payload),
                });
            }
            results
        })
    };
    let (head_dim, group, q_dim) = (config.head_dim, config.group_size(), config.q_dim());
    for (share, outs) in shares.iter().zip(results) {
        for (tile, tile_out) in share.iter().zip(outs) {
            let out = &mut outputs[tile.chunk];
            for (r, head_out) in tile_out.chunks_exact(head_dim).enumerate() {
                let (t, g) = (tile.start + r / group, r % group);
                let first = t * q_dim + (tile.kv_head * group + g) * head_dim;
                out[first..first + head_dim].copy_from_slice(head_out);
            }
        }
    }
}

/// Scores, causal softmax and weighted values of one tile; the result is left in `scratch.out`,
/// row `(t - tile.start) * group + g` for query head `kv_head * group + g` of token `t`.
fn compute_tile(config: &ModelConfig, gathered: &Gathered<'_>, width: usize, tile: &Tile, scratch: &mut TileScratch) {
    let chunk = gathered.chunk;
    let (head_dim, group) = (config.head_dim, config.group_size());
    let scale = 1.0 / (head_dim as f32).sqrt();
    let rows = (tile.end - tile.start) * group;
    let visible = chunk.start_pos + tile.end;
    scratch.q.clear();
    for t in tile.start..tile.end {
        let first = t * chunk.stride + tile.kv_head * group * head_dim;
        scratch.q.extend_from_slice(&chunk.q[first..first + group * head_dim]);
    }
    scratch.scores.resize(rows * visible, 0.0);
    let queries = Mat::rows(&scratch.q, rows, head_dim);
    let keys = Mat::transposed(&gathered.k[tile.kv_head * head_dim..], visible, head_dim, width);
    matmul(queries, keys, &mut scratch.scores, visible);
    for (r, row) in scratch.scores.chunks_exact_mut(visible).enumerate() {
        let pos = chunk.start_pos + tile.start + r / group;
        softmax_prefix(row, pos + 1, scale);
    }
    scratch.out.resize(rows * head_dim, 0.0);
    let probs = Mat::rows(&scratch.scores, rows, visible);
    let values = Mat {
        data: &gathered.v[tile.kv_head * head_dim..],
        rows: visible,
        cols: head_dim,
        row_stride: width,
        col_stride: 1,
    };
    matmul(probs, values, &mut scratch.out, head_dim);
}

/// Dequantizes a chunk's K and V of positions `0..start_pos + tokens` from the store.
fn gather<'a>(kv: &KvStore, layer: usize, chunk: &'a ChunkQueries<'a>) -> Gathered<'a> {
    let positions = chunk.start_pos + chunk.tokens;
    let (block_size, width) = (kv.block_size(), kv.token_elems());
    let mut k = vec![0.0; positions * width];
    let mut v = vec![0.0; positions * width];
    for (i, &block) in chunk.block_table.iter().enumerate() {
        let first = i * block_size;
        if first >= positions {
            break;
        }
        let slots = block_size.min(positions - first);
        let range = first * width..(first + slots) * width;
        kv.read(layer, block as usize, slots, &mut k[range.clone()], &mut v[range]);
    }
    Gathered { chunk, k, v }
}

/// In place: `row[j] = softmax(row[..valid] * scale)[j]` for `j < valid`, and exact zeros after.
fn softmax_prefix(row: &mut [f32], valid: usize, scale: f32) {
    let (live, masked) = row.split_at_mut(valid);
    let mut max = f32::NEG_INFINITY;
    for s in live.iter_mut() {
        *s *= scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f32;
    for s in live.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|s| *s *= inv);
    masked.fill(0.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_prefix_masks_and_normalizes() {
        let mut row = vec![1.0, 2.0, 3.0, 100.0, -5.0];
        softmax_prefix(&mut row, 3, 1.0);
        let total: f32 = row[..3].iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(row[2] > row[1] && row[1] > row[0]);
        assert_eq!(&row[3..], &[0.0, 0.0]);
        assert!(row[3].is_sign_positive());
    }
}

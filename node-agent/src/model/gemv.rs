//! Products with a few rows (decode steps), computed in the same arithmetic order as sgemm.
//!
//! sgemm pads a one-row product to an 8-row micro-tile and packs the weights before using them, so a decode
//! step would cost several times the time it takes to stream the weights from memory. This kernel streams each
//! weight row once and reuses it for every row of the product. It reproduces sgemm's order exactly: each
//! element is summed over k with fused multiply-adds in blocks of [`KC`] starting from zero, and the blocks
//! are added in order, so a row computed here is bit-identical to the same row computed by sgemm in a
//! prefill. [`matches_sgemm`] checks that once per process on this CPU (which kernel sgemm picks depends on
//! the CPU features); when it does not hold, callers keep using sgemm.

use std::ops::Range;
use std::sync::OnceLock;

use pulp::{Arch, Simd, WithSimd};

use super::sgemm::{Mat, matmul};

/// sgemm's depth block (matrixmultiply's `S_KC`).
pub(crate) const KC: usize = 256;
/// Output columns computed together: long contiguous runs of each weight row keep the hardware prefetcher
/// streaming, while the accumulators of a few rows stay in L2.
const TILE: usize = 4096;
/// Rows up to which this kernel is used; from 8 rows on, sgemm's 8-row micro-tiles carry no padding.
pub(crate) const MAX_ROWS: usize = 4;

/// Whether this kernel reproduces sgemm's results bit for bit on this CPU (checked once).
pub(crate) fn matches_sgemm() -> bool {
    static MATCHES: OnceLock<bool> = OnceLock::new();
    *MATCHES.get_or_init(|| {
        // Depths across several blocks with ragged edges; values with cancellation and signed zeros.
        [(1usize, 600usize, 70usize), (3, 256, 33), (2, 257, 1030)].iter().all(|&(m, k, n)| {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 997.0).collect();
            let w: Vec<f32> = (0..k * n).map(|i| ((i * 104_729 % 3001) as f32 - 1500.0) / 1499.0).collect();
            let (a, b) = (Mat::rows(&x, m, k), Mat::rows(&w, k, n));
            let (mut expected, mut got) = (vec![0.0; m * n], vec![1.0; m * n]);
            matmul(a, b, &mut expected, n);
            gemv(a, b, &mut got, n) && expected.iter().zip(&got).all(|(e, g)| e.to_bits() == g.to_bits())
        })
    })
}

/// `c[i * ldc + j] = sum_k a(i, k) * b(k, j)` like [`matmul`], for operands with contiguous rows.
/// Returns false (and leaves `c` alone) when an operand's layout is not supported.
///
/// Panics if the shapes disagree or a matrix does not fit in its slice.
pub(crate) fn gemv(a: Mat<'_>, b: Mat<'_>, c: &mut [f32], ldc: usize) -> bool {
    gemv_parallel(a, b, c, ldc, 1)
}

/// [`gemv`] on up to `threads` threads, each streaming a contiguous run of whole depth blocks (weight rows);
/// the block sums are then added in order, exactly as on one thread.
pub(crate) fn gemv_parallel(a: Mat<'_>, b: Mat<'_>, c: &mut [f32], ldc: usize, threads: usize) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if a.col_stride != 1 || b.col_stride != 1 || m > MAX_ROWS {
        return false;
    }
    assert!(b.rows == k, "gemv: inconsistent operands");
    assert!(m == 0 || (m - 1) * a.row_stride + k <= a.data.len(), "gemv: left operand does not fit");
    assert!(k == 0 || n == 0 || (k - 1) * b.row_stride + n <= b.data.len(), "gemv: weights do not fit");
    assert!(m == 0 || n == 0 || (m - 1) * ldc + n <= c.len(), "gemv: output does not fit");
    let ranges = block_ranges(k, threads);
    let sums: Vec<Vec<f32>> = match ranges.as_slice() {
        [] => Vec::new(),
        [only] => vec![block_sums(a, b, only.clone())],
        [first, rest @ ..] => std::thread::scope(|scope| {
            let handles: Vec<_> =
                rest.iter().map(|range| scope.spawn(move || block_sums(a, b, range.clone()))).collect();
            let mut sums = vec![block_sums(a, b, first.clone())];
            for handle in handles {
                match handle.join() {
                    Ok(part) => sums.push(part),
                    Err(payload) => std::panic::resume_unwind(payload),
                }
            }
            sums
        }),
    };
    for i in 0..m {
        let out = &mut c[i * ldc..i * ldc + n];
        // sgemm stores the first block as 0 + sum, which turns -0 into +0 (and a product with k = 0 is 0).
        out.fill(0.0);
        for block in sums.iter().flat_map(|part| part.chunks_exact(m * n)) {
            out.iter_mut().zip(&block[i * n..(i + 1) * n]).for_each(|(o, s)| *o += *s);
        }
    }
    true
}

/// Splits the depth blocks of a `k`-deep product into up to `threads` contiguous runs of about equal depth.
fn block_ranges(k: usize, threads: usize) -> Vec<Range<usize>> {
    let blocks = k.div_ceil(KC);
    let mut bounds: Vec<usize> = (0..=threads.max(1))
        .map(|t| ((t * k) as f64 / threads.max(1) as f64 / KC as f64).round() as usize)
        .map(|b| b.min(blocks))
        .collect();
    if let Some(last) = bounds.last_mut() {
        *last = blocks;
    }
    bounds.dedup();
    bounds.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The sums of depth blocks `blocks`, laid out `[block][row][column]`.
fn block_sums(a: Mat<'_>, b: Mat<'_>, blocks: Range<usize>) -> Vec<f32> {
    let mut sums = vec![0.0f32; blocks.len() * a.rows * b.cols];
    Arch::new().dispatch(Kernel { a, b, blocks, sums: &mut sums });
    sums
}

struct Kernel<'a, 's> {
    a: Mat<'a>,
    b: Mat<'a>,
    blocks: Range<usize>,
    sums: &'s mut [f32],
}

impl WithSimd for Kernel<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Kernel { a, b, blocks, sums } = self;
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut acc = vec![0.0f32; m * TILE];
        for j0 in (0..n).step_by(TILE) {
            let width = TILE.min(n - j0);
            for (slot, block) in blocks.clone().enumerate() {
                acc.fill(0.0);
                for kk in block * KC..((block + 1) * KC).min(k) {
                    let row = &b.data[kk * b.row_stride + j0..kk * b.row_stride + j0 + width];
                    let (row_simd, row_tail) = S::as_simd_f32s(row);
                    for i in 0..m {
                        let x = a.data[i * a.row_stride + kk];
                        let xs = simd.splat_f32s(x);
                        let (acc_simd, acc_tail) = S::as_mut_simd_f32s(&mut acc[i * TILE..i * TILE + width]);
                        for (s, w) in acc_simd.iter_mut().zip(row_simd) {
                            *s = simd.mul_add_f32s(xs, *w, *s);
                        }
                        for (s, w) in acc_tail.iter_mut().zip(row_tail) {
                            *s = x.mul_add(*w, *s);
                        }
                    }
                }
                for i in 0..m {
                    let at = (slot * m + i) * n + j0;
                    sums[at..at + width].copy_from_slice(&acc[i * TILE..i * TILE + width]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::prng::SplitMix64;

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        (0..len).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
    }

    #[test]
    fn reproduces_sgemm_bit_for_bit() {
        assert!(matches_sgemm(), "the decode kernel does not reproduce sgemm on this CPU");
        for (m, k, n, stride) in [(1, 576, 1536, 1536), (4, 1536, 576, 592), (2, 513, 49, 49), (3, 64, 2100, 2101)] {
            let x = random(m * k, 1);
            let w = random(k * stride, 2);
            let b = Mat { data: &w, rows: k, cols: n, row_stride: stride, col_stride: 1 };
            let (mut expected, mut got) = (vec![0.0; m * n], vec![0.0; m * n]);
            matmul(Mat::rows(&x, m, k), b, &mut expected, n);
            assert!(gemv(Mat::rows(&x, m, k), b, &mut got, n));
            assert!(expected.iter().zip(&got).all(|(e, g)| e.to_bits() == g.to_bits()), "{m}x{k}x{n}");
            for threads in [2, 3, 8] {
                let mut parallel = vec![0.0; m * n];
                assert!(gemv_parallel(Mat::rows(&x, m, k), b, &mut parallel, n, threads));
                assert!(expected.iter().zip(&parallel).all(|(e, g)| e.to_bits() == g.to_bits()), "{threads} threads");
            }
        }
    }

    #[test]
    fn depth_is_split_into_balanced_runs_of_whole_blocks() {
        assert_eq!(block_ranges(576, 2), vec![0..1, 1..3]);
        assert_eq!(block_ranges(1536, 2), vec![0..3, 3..6]);
        assert_eq!(block_ranges(256, 2), vec![0..1]);
        assert_eq!(block_ranges(600, 8).len(), 3, "never more runs than blocks");
        assert_eq!(block_ranges(0, 2), Vec::<Range<usize>>::new());
    }

    #[test]
    fn declines_layouts_it_does_not_handle() {
        let (x, w) = (random(8 * 4, 3), random(4 * 4, 4));
        let mut out = vec![0.0; 8 * 4];
        assert!(!gemv(Mat::rows(&x, 8, 4), Mat::rows(&w, 4, 4), &mut out, 4), "too many rows");
        let transposed = Mat::transposed(&w, 4, 4, 4);
        assert!(!gemv(Mat::rows(&x, 1, 4), transposed, &mut out, 4), "strided columns");
    }
}

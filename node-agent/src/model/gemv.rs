//! Products with a few rows (decode steps), computed in the same arithmetic order as sgemm.
//!
//! sgemm pads a one-row product to an 8-row micro-tile and packs the weights before using them, so a decode
//! step would cost several times the time it takes to stream the weights from memory. This kernel streams each
//! weight row once and reuses it for every row of the product. It reproduces sgemm's order exactly: each
//! element is summed over k with fused multiply-adds in blocks of [`KC`] starting from zero, and the blocks
//! are added in order, so a row computed here is bit-identical to the same row computed by sgemm in a
//! prefill. [`matches_sgemm`] checks that once per process on this CPU (which kernel sgemm picks depends on
//! the CPU features); when it does not hold, callers keep using sgemm.

use std::sync::OnceLock;

use pulp::{Arch, Simd, WithSimd};

use super::gemm::{Mat, matmul};

/// sgemm's depth block (matrixmultiply's `S_KC`).
const KC: usize = 256;
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
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if a.col_stride != 1 || b.col_stride != 1 || m > MAX_ROWS {
        return false;
    }
    assert!(b.rows == k, "gemv: inconsistent operands");
    assert!(m == 0 || (m - 1) * a.row_stride + k <= a.data.len(), "gemv: left operand does not fit");
    assert!(k == 0 || n == 0 || (k - 1) * b.row_stride + n <= b.data.len(), "gemv: weights do not fit");
    assert!(m == 0 || n == 0 || (m - 1) * ldc + n <= c.len(), "gemv: output does not fit");
    if k == 0 {
        for i in 0..m {
            c[i * ldc..i * ldc + n].fill(0.0);
        }
        return true;
    }
    Arch::new().dispatch(Kernel { a, b, c, ldc });
    true
}

struct Kernel<'a, 'c> {
    a: Mat<'a>,
    b: Mat<'a>,
    c: &'c mut [f32],
    ldc: usize,
}

impl WithSimd for Kernel<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Kernel { a, b, c, ldc } = self;
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut acc = vec![0.0f32; m * TILE];
        for j0 in (0..n).step_by(TILE) {
            let width = TILE.min(n - j0);
            for k0 in (0..k).step_by(KC) {
                acc.fill(0.0);
                for kk in k0..(k0 + KC).min(k) {
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
                    let out = &mut c[i * ldc + j0..i * ldc + j0 + width];
                    let block = &acc[i * TILE..i * TILE + width];
                    if k0 == 0 {
                        // sgemm stores the first block as 0 + sum, which turns -0 into +0.
                        out.iter_mut().zip(block).for_each(|(o, s)| *o = 0.0 + *s);
                    } else {
                        out.iter_mut().zip(block).for_each(|(o, s)| *o += *s);
                    }
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
        }
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

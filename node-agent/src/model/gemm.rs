//! Weight products: the dispatch of products with a few rows to the decode kernel in `gemv` when it
//! reproduces sgemm bit for bit on this CPU, to sgemm ([`super::sgemm`]) otherwise, and their parallel
//! form; every path gives each element the same value.

use super::gemv;
pub(crate) use super::sgemm::{Mat, matmul};

/// `out[m][n] = x[m][k] · w[k][n]`: `x` and `out` row-major with contiguous rows, `w` a row-major view.
/// Weights are kept in this `[in][out]` layout because sgemm packs a right-hand factor whose rows are
/// contiguous with plain copies.
pub(crate) fn matmul_rows(x: &[f32], m: usize, w: Mat<'_>, out: &mut [f32]) {
    weight_product(Mat::rows(x, m, w.rows), w, out, w.cols);
}

/// A product with a weight matrix: the streaming decode kernel for a few rows when it reproduces sgemm on
/// this CPU, sgemm otherwise. Either way every element has the same value.
fn weight_product(a: Mat<'_>, w: Mat<'_>, c: &mut [f32], ldc: usize) {
    if a.rows > gemv::MAX_ROWS || !gemv::matches_sgemm() || !gemv::gemv(a, w, c, ldc) {
        matmul(a, w, c, ldc);
    }
}

/// Work below which a product stays on one thread (spawning costs tens of microseconds). Work counts
/// multiply-adds, but at least 16 rows' worth: short products are bound by streaming the weights.
const PARALLEL_MIN_WORK: usize = 1 << 22;

/// A decode product only one depth block deep and narrower than this stays on one thread: split by columns,
/// its short weight rows stream worse than one thread streams the whole rows (`--example model_limits`).
const NARROW_COLUMNS: usize = 4096;

/// [`matmul_rows`] on up to `threads` threads: tall products are split by rows; decode products by depth
/// blocks (each thread streams whole weight rows), or by columns when they are one block deep. No split
/// changes any element's arithmetic, so the result is bit-identical to one thread.
pub(crate) fn matmul_rows_parallel(x: &[f32], m: usize, w: Mat<'_>, out: &mut [f32], threads: usize) {
    let (k, n) = (w.rows, w.cols);
    let threads = threads.min(n.div_ceil(64)).max(1);
    if threads == 1 || m.max(16) * k * n < PARALLEL_MIN_WORK {
        return matmul_rows(x, m, w, out);
    }
    if m <= gemv::MAX_ROWS && gemv::matches_sgemm() {
        let a = Mat::rows(x, m, k);
        if k > gemv::KC && gemv::gemv_parallel(a, w, out, n, threads) {
            return;
        }
        if n < NARROW_COLUMNS {
            return matmul_rows(x, m, w, out);
        }
    }
    if m >= 32 * threads {
        // Whole 8-row micro-panels per thread.
        let rows_per = m.div_ceil(threads).div_ceil(8) * 8;
        std::thread::scope(|scope| {
            let mut parts = x[..m * k].chunks(rows_per * k).zip(out[..m * n].chunks_mut(rows_per * n));
            let first = parts.next();
            for (xs, outs) in parts {
                scope.spawn(move || matmul_rows(xs, xs.len() / k, w, outs));
            }
            if let Some((xs, outs)) = first {
                matmul_rows(xs, xs.len() / k, w, outs);
            }
        });
        return;
    }
    let cols_per = n.div_ceil(threads).div_ceil(16) * 16;
    let ranges: Vec<(usize, usize)> = (0..n).step_by(cols_per).map(|lo| (lo, (lo + cols_per).min(n))).collect();
    let a = Mat::rows(x, m, k);
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranges[1..]
            .iter()
            .map(|&(lo, hi)| {
                scope.spawn(move || {
                    let mut part = vec![0.0f32; m * (hi - lo)];
                    weight_product(a, w.columns(lo, hi), &mut part, hi - lo);
                    part
                })
            })
            .collect();
        let (lo, hi) = ranges[0];
        weight_product(a, w.columns(lo, hi), out, n);
        for (handle, &(lo, hi)) in handles.into_iter().zip(&ranges[1..]) {
            let part = match handle.join() {
                Ok(part) => part,
                Err(payload) => std::panic::resume_unwind(payload),
            };
            for (row, values) in out.chunks_exact_mut(n).zip(part.chunks_exact(hi - lo)) {
                row[lo..hi].copy_from_slice(values);
            }
        }
    });
}

/// Writes the transpose of `src` (`rows` rows of `cols` values) into columns `first_col..first_col + rows`
/// of `dst`, whose rows are `dst_stride` long: `dst[c][first_col + r] = src[r][c]`.
pub(crate) fn transpose_into(
    src: &[f32],
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_stride: usize,
    first_col: usize,
) {
    const TILE: usize = 32;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * dst_stride + first_col + r] = src[r * cols + c];
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
    fn matches_a_naive_product() {
        let (m, k, n) = (3, 5, 4);
        let (x, w) = (random(m * k, 1), random(n * k, 2));
        let mut out = vec![0.0; m * n];
        matmul_rows(&x, m, Mat::rows(&w, k, n), &mut out);
        for i in 0..m {
            for j in 0..n {
                let expected: f32 = (0..k).map(|t| x[i * k + t] * w[t * n + j]).sum();
                assert!((out[i * n + j] - expected).abs() < 1e-5);
            }
        }
        // The same product with the weights given transposed.
        let mut transposed = vec![0.0; n * k];
        transpose_into(&w, k, n, &mut transposed, k, 0);
        let mut again = vec![0.0; m * n];
        matmul(Mat::rows(&x, m, k), Mat::transposed(&transposed, n, k, k), &mut again, n);
        assert_eq!(out, again);
    }

    #[test]
    fn rows_are_independent_of_batch_size() {
        // k spans several 256-wide blocks and n several 1024-wide panels, with ragged edges.
        for (k, n) in [(576, 1536), (1536, 576), (300, 1031), (64, 33)] {
            let w = random(k * n, 3);
            let x = random(100 * k, 4);
            let mut single = vec![0.0; 100 * n];
            for row in 0..100 {
                matmul_rows(&x[row * k..(row + 1) * k], 1, Mat::rows(&w, k, n), &mut single[row * n..(row + 1) * n]);
            }
            for m in [2, 3, 5, 7, 8, 9, 16, 17, 33, 64, 65, 100] {
                let mut batch = vec![0.0; m * n];
                matmul_rows(&x[..m * k], m, Mat::rows(&w, k, n), &mut batch);
                let same = batch.iter().zip(&single).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "k {k} n {n}: rows of an {m}-row product differ from single-row products");
            }
            // Columns are independent too: a product over a column range equals that slice.
            let (lo, hi) = (n / 3, n / 3 + n / 2);
            let mut part = vec![0.0; 7 * (hi - lo)];
            let columns = Mat { data: &w[lo..], rows: k, cols: hi - lo, row_stride: n, col_stride: 1 };
            matmul(Mat::rows(&x[..7 * k], 7, k), columns, &mut part, hi - lo);
            for row in 0..7 {
                let expected = &single[row * n + lo..row * n + hi];
                let got = &part[row * (hi - lo)..(row + 1) * (hi - lo)];
                assert!(expected.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn parallel_products_are_bit_identical() {
        for (m, k, n) in [(1, 576, 4100), (3, 700, 1552), (100, 300, 520), (257, 64, 300)] {
            let (x, w) = (random(m * k, 7), random(k * n, 8));
            let mut single = vec![0.0; m * n];
            matmul_rows(&x, m, Mat::rows(&w, k, n), &mut single);
            for threads in [2, 3] {
                let mut parallel = vec![1.0; m * n];
                matmul_rows_parallel(&x, m, Mat::rows(&w, k, n), &mut parallel, threads);
                assert!(single.iter().zip(&parallel).all(|(a, b)| a.to_bits() == b.to_bits()), "{m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn trailing_zero_terms_do_not_change_a_sum() {
        // Attention pads probabilities with zeros past a query's position: extending k with zero terms
        // must leave every element unchanged, across the 256-wide block boundary too.
        let n = 64;
        for valid in [1usize, 5, 255, 256, 257, 300] {
            let a = random(valid, 5);
            let b = random(600 * n, 6);
            let mut short = vec![0.0; n];
            matmul(Mat::rows(&a, 1, valid), Mat::rows(&b[..valid * n], valid, n), &mut short, n);
            for total in [valid + 1, valid + 17, 600] {
                let mut padded = a.clone();
                padded.resize(total, 0.0);
                let mut long = vec![0.0; n];
                matmul(Mat::rows(&padded, 1, total), Mat::rows(&b[..total * n], total, n), &mut long, n);
                assert!(short.iter().zip(&long).all(|(x, y)| x.to_bits() == y.to_bits()), "{valid} -> {total}");
            }
        }
    }
}

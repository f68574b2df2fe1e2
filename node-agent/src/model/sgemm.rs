//! Dense products through matrixmultiply's sgemm, reached through ndarray's safe views, over [`Mat`]:
//! strided read-only matrices over slices.
//!
//! Every product is `C = A · B` with α = 1 and β = 0. sgemm sums each element of C over k in one fixed
//! order (sequential FMA within blocks of 256, blocks added in order) that depends neither on the number of
//! rows nor on the number of columns, so a row of C is bit-identical however many other rows are computed
//! with it; `gemm`'s `rows_are_independent_of_batch_size` checks this.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

/// A read-only strided matrix over a slice: element (i, j) is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with contiguous rows.
    pub(crate) fn rows(data: &'a [f32], rows: usize, cols: usize) -> Mat<'a> {
        Mat { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// The transpose of a row-major `[rows][cols]` matrix, seen as `cols x rows` (weights stored as
    /// `out` rows of `in` values become the `in x out` right-hand factor).
    pub(crate) fn transposed(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Mat<'a> {
        Mat { data, rows: cols, cols: rows, row_stride: 1, col_stride: row_stride }
    }

    /// Columns `lo..hi` of this matrix.
    pub(crate) fn columns(self, lo: usize, hi: usize) -> Mat<'a> {
        Mat { data: &self.data[(lo * self.col_stride).min(self.data.len())..], cols: hi - lo, ..self }
    }

    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride < self.data.len()
    }
}

/// `c[i * ldc + j] = sum_k a(i, k) * b(k, j)` for an `a.rows x b.cols` result.
///
/// Panics if the shapes disagree or a matrix does not fit in its slice.
pub(crate) fn matmul(a: Mat<'_>, b: Mat<'_>, c: &mut [f32], ldc: usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k && a.fits() && b.fits(), "gemm: inconsistent operands");
    assert!(m == 0 || n == 0 || (m - 1) * ldc + n <= c.len(), "gemm: output does not fit");
    if m == 0 || n == 0 {
        return;
    }
    let a_view = ArrayView2::from_shape((m, k).strides((a.row_stride, a.col_stride)), a.data);
    let b_view = ArrayView2::from_shape((k, n).strides((b.row_stride, b.col_stride)), b.data);
    let c_view = ArrayViewMut2::from_shape((m, n).strides((ldc, 1)), c);
    let (Ok(a_view), Ok(b_view), Ok(mut c_view)) = (a_view, b_view, c_view) else {
        unreachable!("gemm: operand bounds were checked above");
    };
    general_mat_mul(1.0, &a_view, &b_view, 0.0, &mut c_view);
}

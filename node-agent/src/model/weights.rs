//! The model's weights in f32. Every matrix is kept as `[in][out]` (the transpose of GGUF's `out` rows of
//! `in` values), the right-hand factor of `activations · weight`, and the products of one input are fused
//! into one matrix: Q, K and V side by side, and so gate and up. Fusing columns changes no element's
//! arithmetic.

use super::gemm::{Mat, transpose_into};
use super::prng::SplitMix64;
use super::{ModelConfig, ModelError};

/// A row-major `[in][out]` weight matrix whose rows are padded to an odd number of 64-byte lines, so
/// that sgemm's packing, which walks down 256 rows at a time, does not keep hitting the same cache sets.
pub(crate) struct Weight {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
    stride: usize,
}

/// Row length in floats: a whole number of 16-float lines, and an odd number of them.
fn padded_stride(cols: usize) -> usize {
    let lines = cols.div_ceil(16);
    16 * (if lines.is_multiple_of(2) { lines + 1 } else { lines })
}

impl Weight {
    /// Stacks matrices given GGUF-style (`out` rows of `inputs` values) side by side as one
    /// `[inputs][sum of outs]` matrix.
    pub(crate) fn from_out_rows(parts: &[(&[f32], usize)], inputs: usize) -> Weight {
        let cols: usize = parts.iter().map(|&(_, outputs)| outputs).sum();
        let stride = padded_stride(cols);
        let mut data = vec![0.0; inputs * stride];
        let mut first_col = 0;
        for &(matrix, outputs) in parts {
            transpose_into(matrix, outputs, inputs, &mut data, stride, first_col);
            first_col += outputs;
        }
        Weight { data, rows: inputs, cols, stride }
    }

    /// Uniform values in `[-half_range, half_range]`, drawn row by row.
    pub(crate) fn random(rng: &mut SplitMix64, rows: usize, cols: usize, half_range: f32) -> Weight {
        let stride = padded_stride(cols);
        let mut data = vec![0.0; rows * stride];
        for row in data.chunks_exact_mut(stride) {
            row[..cols].iter_mut().for_each(|v| *v = (rng.next_f32() * 2.0 - 1.0) * half_range);
        }
        Weight { data, rows, cols, stride }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn view(&self) -> Mat<'_> {
        Mat { data: &self.data, rows: self.rows, cols: self.cols, row_stride: self.stride, col_stride: 1 }
    }
}

/// One transformer block.
pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `[d_model][q_dim + 2 * kv_dim]`: Q columns, then K columns, then V columns.
    pub wqkv: Weight,
    /// `[q_dim][d_model]`.
    pub wo: Weight,
    pub ffn_norm: Vec<f32>,
    /// `[d_model][2 * ffn_dim]`: gate columns, then up columns.
    pub w_gate_up: Weight,
    /// `[ffn_dim][d_model]`.
    pub w_down: Weight,
}

/// All weights of a model.
pub(crate) struct Weights {
    /// `[vocab][d_model]`: one row per token.
    pub token_embd: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `[d_model][vocab]` (a transposed copy of the embedding when the model ties them).
    pub lm_head: Weight,
}

impl Weights {
    /// Checks every shape against the configuration.
    pub(crate) fn check(&self, config: &ModelConfig) -> Result<(), ModelError> {
        let d = config.d_model;
        if self.layers.len() != config.n_layers {
            return Err(ModelError::Config(format!("{} layers, expected {}", self.layers.len(), config.n_layers)));
        }
        let mut vectors = vec![("token_embd", self.token_embd.len(), config.vocab_size * d)];
        vectors.push(("output_norm", self.output_norm.len(), d));
        let mut matrices = vec![("lm_head", &self.lm_head, (d, config.vocab_size))];
        for layer in &self.layers {
            vectors.extend([("attn_norm", layer.attn_norm.len(), d), ("ffn_norm", layer.ffn_norm.len(), d)]);
            matrices.extend([
                ("wqkv", &layer.wqkv, (d, config.q_dim() + 2 * config.kv_dim())),
                ("wo", &layer.wo, (config.q_dim(), d)),
                ("w_gate_up", &layer.w_gate_up, (d, 2 * config.ffn_dim)),
                ("w_down", &layer.w_down, (config.ffn_dim, d)),
            ]);
        }
        if let Some((name, found, want)) = vectors.iter().find(|(_, found, want)| found != want) {
            return Err(ModelError::Config(format!("weight {name} has {found} values, expected {want}")));
        }
        let shape = |w: &Weight| (w.rows(), w.cols());
        if let Some((name, w, want)) = matrices.iter().find(|(_, w, want)| shape(w) != *want) {
            return Err(ModelError::Config(format!("weight {name} is {:?}, expected {want:?}", shape(w))));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_padded_to_odd_line_counts() {
        assert_eq!(padded_stride(1536), 1552);
        assert_eq!(padded_stride(576), 592);
        assert_eq!(padded_stride(960), 976);
        assert_eq!(padded_stride(688), 688);
        assert_eq!(padded_stride(1), 16);
    }

    #[test]
    fn fused_transpose() {
        // Two GGUF-style matrices with 2 inputs: [[1, 2], [3, 4]] (2 outputs) and [[5, 6]] (1 output).
        let w = Weight::from_out_rows(&[(&[1.0, 2.0, 3.0, 4.0], 2), (&[5.0, 6.0], 1)], 2);
        let view = w.view();
        let at = |i: usize, j: usize| view.data[i * view.row_stride + j];
        assert_eq!((view.rows, view.cols), (2, 3));
        assert_eq!([at(0, 0), at(0, 1), at(0, 2)], [1.0, 3.0, 5.0]);
        assert_eq!([at(1, 0), at(1, 1), at(1, 2)], [2.0, 4.0, 6.0]);
    }
}

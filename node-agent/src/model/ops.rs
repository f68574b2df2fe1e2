//! Row-wise operations of the transformer: RMSNorm, rotary position embedding, SwiGLU.
//!
//! Each works on one row at a time in a fixed order, so a row's result never depends on its neighbours.

use super::ModelConfig;

/// `out = x / sqrt(mean(x^2) + eps) * weight`, the sum of squares taken in a fixed order.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mut lanes = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v * v;
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for &v in chunks.remainder() {
        sum += v * v;
    }
    let inv = 1.0 / (sum / x.len() as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

/// `out[i] = silu(gate[i]) * up[i]` with `silu(g) = g / (1 + exp(-g))`.
pub(crate) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// Cosines and sines of the rotary embedding, precomputed for the model's context length.
pub(crate) struct RopeTable {
    half_dim: usize,
    inv_freq: Vec<f64>,
    /// `[position][pair]` interleaved as (cos, sin).
    table: Vec<(f32, f32)>,
}

impl RopeTable {
    pub(crate) fn new(config: &ModelConfig) -> RopeTable {
        let half_dim = config.head_dim / 2;
        let theta = f64::from(config.rope_theta);
        let inv_freq: Vec<f64> =
            (0..half_dim).map(|i| theta.powf(-((2 * i) as f64) / config.head_dim as f64)).collect();
        let mut rope = RopeTable { half_dim, inv_freq, table: Vec::new() };
        let table = (0..config.max_context).flat_map(|pos| (0..half_dim).map(move |i| (pos, i)));
        rope.table = table.map(|(pos, i)| rope.angle(pos, i)).collect();
        rope
    }

    fn angle(&self, pos: usize, pair: usize) -> (f32, f32) {
        let angle = pos as f64 * self.inv_freq[pair];
        (angle.cos() as f32, angle.sin() as f32)
    }

    /// Rotates adjacent pairs `(x[2i], x[2i+1])` of every head in `x` (heads of `2 * half_dim` values,
    /// back to back) by the angles of position `pos` (the convention of llama GGUF files).
    pub(crate) fn apply(&self, x: &mut [f32], pos: usize) {
        let start = pos * self.half_dim;
        let computed: Vec<(f32, f32)>;
        let angles = match self.table.get(start..start + self.half_dim) {
            Some(angles) => angles,
            None => {
                computed = (0..self.half_dim).map(|i| self.angle(pos, i)).collect();
                &computed
            }
        };
        for head in x.chunks_exact_mut(2 * self.half_dim) {
            for (pair, &(cos, sin)) in head.chunks_exact_mut(2).zip(angles) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos - b * sin;
                pair[1] = a * sin + b * cos;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row() {
        let x = vec![2.0f32; 13];
        let mut out = vec![0.0; 13];
        rms_norm(&x, &[0.5; 13], 0.0, &mut out);
        assert!(out.iter().all(|&v| (v - 0.5).abs() < 1e-6));
    }

    #[test]
    fn rope_rotates_adjacent_pairs_and_keeps_norms() {
        let config = ModelConfig { head_dim: 4, max_context: 8, ..crate::model::tiny_random::config() };
        let rope = RopeTable::new(&config);
        let mut x = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        rope.apply(&mut x, 0);
        assert_eq!(x, vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
        rope.apply(&mut x, 1);
        // Pair 0 turns by 1 radian; pair 1 by 1/sqrt(theta) radians.
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let slow = 1.0 / f64::from(config.rope_theta).sqrt();
        assert!((x[2] + slow.sin() as f32).abs() < 1e-6 && (x[3] - slow.cos() as f32).abs() < 1e-6);
        // Past the table the same function gives the same values.
        let (mut a, mut b) = (vec![0.3, -0.2, 0.7, 0.1], vec![0.3, -0.2, 0.7, 0.1]);
        rope.apply(&mut a, 7);
        let far = RopeTable::new(&ModelConfig { max_context: 2, ..config });
        far.apply(&mut b, 7);
        assert_eq!(a, b);
    }
}

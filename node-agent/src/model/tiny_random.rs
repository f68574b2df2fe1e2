//! `tiny-random`: a small Llama-shaped model with seeded random weights, for fast tests.
//!
//! Its outputs are meaningless but fully deterministic: the same build on the same machine always gives
//! the same logits. Its vocabulary is the size of the gateway's built-in `cl100k_base` tokenizer with the
//! ChatML special tokens, so any id that tokenizer produces is valid here.

use super::prng::SplitMix64;
use super::weights::{LayerWeights, Weight, Weights};
use super::{Model, ModelConfig, TINY_RANDOM};

/// The seed of the weights.
const SEED: u64 = 0x6b76_726f_7574_6531;

/// Weights are uniform in [-a, a] with a = 0.02 * sqrt(3): standard deviation 0.02.
const WEIGHT_HALF_RANGE: f32 = 0.034_641_016;

/// `<|endoftext|>` and `<|im_end|>` in cl100k_base with ChatML.
pub const EOS_TOKEN_IDS: [u32; 2] = [100_257, 100_265];

/// The shape of `tiny-random`.
pub fn config() -> ModelConfig {
    ModelConfig {
        vocab_size: 100_277,
        d_model: 256,
        n_layers: 4,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 32,
        ffn_dim: 688,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        max_context: 4096,
        tied_embeddings: true,
    }
}

fn random(rng: &mut SplitMix64, len: usize) -> Vec<f32> {
    (0..len).map(|_| (rng.next_f32() * 2.0 - 1.0) * WEIGHT_HALF_RANGE).collect()
}

/// Builds `tiny-random` (215 MB of f32 weights, mostly the embedding and its transposed copy for the
/// LM head). Layer matrices are drawn directly in the `[in][out]` layout.
pub fn model() -> Model {
    let config = config();
    let d = config.d_model;
    let mut rng = SplitMix64::new(SEED);
    let token_embd = random(&mut rng, config.vocab_size * d);
    let layers = (0..config.n_layers)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; d],
            wqkv: Weight::random(&mut rng, d, config.q_dim() + 2 * config.kv_dim(), WEIGHT_HALF_RANGE),
            wo: Weight::random(&mut rng, config.q_dim(), d, WEIGHT_HALF_RANGE),
            ffn_norm: vec![1.0; d],
            w_gate_up: Weight::random(&mut rng, d, 2 * config.ffn_dim, WEIGHT_HALF_RANGE),
            w_down: Weight::random(&mut rng, config.ffn_dim, d, WEIGHT_HALF_RANGE),
        })
        .collect();
    let lm_head = Weight::from_out_rows(&[(&token_embd, config.vocab_size)], d);
    let weights = Weights { token_embd, layers, output_norm: vec![1.0; d], lm_head };
    Model::from_parts(config, weights, TINY_RANDOM.to_string(), EOS_TOKEN_IDS.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_consistent_and_deterministic() {
        let config = config();
        let model = model();
        model.weights.check(&config).unwrap();
        assert_eq!(model.model_id(), "tiny-random");
        assert_eq!(model.eos_token_ids(), &[100_257, 100_265]);
        let again = super::model();
        assert_eq!(model.weights.layers[3].w_down.view().data, again.weights.layers[3].w_down.view().data);
        let embd = &model.weights.token_embd;
        let mean_square = embd.iter().map(|&v| f64::from(v * v)).sum::<f64>() / embd.len() as f64;
        assert!((mean_square.sqrt() - 0.02).abs() < 0.001);
    }
}

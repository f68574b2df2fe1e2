//! Hyper-parameters of a Llama-architecture model.

use kvroute_proto::domain::{KvDtype, KvGeometry};

use super::ModelError;

/// The shape of a Llama-architecture model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward block.
    pub ffn_dim: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// Longest context the model was trained for.
    pub max_context: usize,
    /// The LM head reuses the token embedding matrix.
    pub tied_embeddings: bool,
}

impl ModelConfig {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads that share one key/value head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }

    /// The KV cache geometry of this model with elements of `dtype`.
    pub fn kv_geometry(&self, dtype: KvDtype) -> KvGeometry {
        KvGeometry {
            num_layers: self.n_layers as u32,
            num_kv_heads: self.n_kv_heads as u32,
            head_dim: self.head_dim as u32,
            dtype,
        }
    }

    /// Checks that the numbers describe a model this engine can run.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |reason: String| Err(ModelError::Config(reason));
        let positive = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("ffn_dim", self.ffn_dim),
            ("max_context", self.max_context),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return bad(format!("{name} must be positive"));
        }
        if self.vocab_size > u32::MAX as usize || self.n_layers > u32::MAX as usize {
            return bad("vocab_size and n_layers must fit in 32 bits".into());
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} query heads are not a multiple of {} KV heads", self.n_heads, self.n_kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} is odd, RoPE needs pairs", self.head_dim));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad(format!("rms_eps {} must not be negative", self.rms_eps));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_random_geometry() {
        let config = crate::model::tiny_random::config();
        config.validate().unwrap();
        let geometry = config.kv_geometry(KvDtype::Bf16);
        assert_eq!(geometry.bytes_per_token(), 2 * 4 * 2 * 32 * 2);
        assert_eq!(config.group_size(), 4);
    }

    #[test]
    fn invalid_head_split_is_rejected() {
        let config = ModelConfig { n_kv_heads: 3, ..crate::model::tiny_random::config() };
        assert!(config.validate().unwrap_err().to_string().contains("multiple"));
    }
}

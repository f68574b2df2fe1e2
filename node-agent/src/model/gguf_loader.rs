//! Loads a llama-architecture GGUF file: hyper-parameters from `llama.*` metadata, weights dequantized
//! to f32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
//!
//! Llama GGUF files store the Q and K projections permuted so that RoPE rotates adjacent element pairs,
//! which is the convention [`super::forward`] uses.

use std::path::Path;

use kvroute_proto::gguf::GgufFile;

use super::weights::{LayerWeights, Weight, Weights};
use super::{Model, ModelConfig, ModelError};

/// Reads and loads a GGUF file; the model id falls back to the file's stem.
pub fn load_path(path: &Path) -> Result<Model, ModelError> {
    let file = GgufFile::open(path)?;
    let stem = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    from_gguf(&file, &stem)
}

/// Loads a parsed GGUF file; `fallback_id` is the model id when the file has no `general.name`.
pub fn from_gguf(file: &GgufFile, fallback_id: &str) -> Result<Model, ModelError> {
    let config = config_from_gguf(file)?;
    let weights = load_weights(file, &config)?;
    weights.check(&config)?;
    let model_id = match file.get_str("general.name").map(str::trim) {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => fallback_id.to_string(),
    };
    let eos = eos_token_ids(file);
    Ok(Model::from_parts(config, weights, model_id, eos))
}

fn metadata_error(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Metadata { key: key.to_string(), reason: reason.into() }
}

fn required(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    let value = file.get_u64(key).ok_or_else(|| metadata_error(key, "missing or not an integer"))?;
    usize::try_from(value).map_err(|_| metadata_error(key, "too large"))
}

fn optional(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
    if file.get(key).is_none() { Ok(None) } else { required(file, key).map(Some) }
}

fn optional_f32(file: &GgufFile, key: &str, default: f32) -> Result<f32, ModelError> {
    match file.get(key) {
        None => Ok(default),
        Some(_) => file.get_f64(key).map(|v| v as f32).ok_or_else(|| metadata_error(key, "not a number")),
    }
}

/// The hyper-parameters of a llama GGUF file.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    match file.get_str("general.architecture") {
        Some("llama") => {}
        Some(other) => return Err(ModelError::Architecture { found: other.to_string() }),
        None => return Err(metadata_error("general.architecture", "missing")),
    }
    if optional(file, "llama.expert_count")?.unwrap_or(0) > 0 {
        return Err(ModelError::Unsupported("mixture-of-experts layers".into()));
    }
    if let Some(kind) = file.get_str("llama.rope.scaling.type").filter(|kind| *kind != "none") {
        return Err(ModelError::Unsupported(format!("RoPE scaling {kind:?}")));
    }
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(ModelError::Unsupported("RoPE frequency factors (rope_freqs.weight)".into()));
    }
    let d_model = required(file, "llama.embedding_length")?;
    let n_heads = required(file, "llama.attention.head_count")?;
    let n_kv_heads = optional(file, "llama.attention.head_count_kv")?.unwrap_or(n_heads);
    let head_dim = match optional(file, "llama.attention.key_length")? {
        Some(dim) => dim,
        None if n_heads > 0 && d_model % n_heads == 0 => d_model / n_heads,
        None => return Err(metadata_error("llama.attention.head_count", "does not divide embedding_length")),
    };
    for key in ["llama.attention.value_length", "llama.rope.dimension_count"] {
        if let Some(dim) = optional(file, key)?.filter(|&dim| dim != head_dim) {
            return Err(ModelError::Unsupported(format!("{key} {dim} differs from the head size {head_dim}")));
        }
    }
    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| metadata_error("tokenizer.ggml.tokens", "missing or not an array of strings"))?;
    let vocab_size = tokens.len();
    if let Some(declared) = optional(file, "llama.vocab_size")?.filter(|&n| n != vocab_size) {
        return Err(metadata_error(
            "llama.vocab_size",
            format!("{declared} but the tokenizer has {vocab_size} tokens"),
        ));
    }
    let config = ModelConfig {
        vocab_size,
        d_model,
        n_layers: required(file, "llama.block_count")?,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn_dim: required(file, "llama.feed_forward_length")?,
        rope_theta: optional_f32(file, "llama.rope.freq_base", 10_000.0)?,
        rms_eps: optional_f32(file, "llama.attention.layer_norm_rms_epsilon", 1e-5)?,
        max_context: required(file, "llama.context_length")?,
        tied_embeddings: file.tensor("output.weight").is_none(),
    };
    config.validate()?;
    Ok(config)
}

/// A tensor's values as f32, after checking its GGUF dims (`dims[0]` is the row length).
fn tensor(file: &GgufFile, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
    let info = file.tensor(name).ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
    let expected: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if info.dims != expected {
        return Err(ModelError::TensorShape { name: name.to_string(), expected, found: info.dims.clone() });
    }
    Ok(file.tensor_f32(info)?)
}

fn load_weights(file: &GgufFile, config: &ModelConfig) -> Result<Weights, ModelError> {
    let (d, q_dim, kv_dim, ffn) = (config.d_model, config.q_dim(), config.kv_dim(), config.ffn_dim);
    let token_embd = tensor(file, "token_embd.weight", &[d, config.vocab_size])?;
    let mut layers = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let name = |part: &str| format!("blk.{i}.{part}.weight");
        let q = tensor(file, &name("attn_q"), &[d, q_dim])?;
        let k = tensor(file, &name("attn_k"), &[d, kv_dim])?;
        let v = tensor(file, &name("attn_v"), &[d, kv_dim])?;
        let gate = tensor(file, &name("ffn_gate"), &[d, ffn])?;
        let up = tensor(file, &name("ffn_up"), &[d, ffn])?;
        layers.push(LayerWeights {
            attn_norm: tensor(file, &name("attn_norm"), &[d])?,
            wqkv: Weight::from_out_rows(&[(&q, q_dim), (&k, kv_dim), (&v, kv_dim)], d),
            wo: Weight::from_out_rows(&[(&tensor(file, &name("attn_output"), &[q_dim, d])?, d)], q_dim),
            ffn_norm: tensor(file, &name("ffn_norm"), &[d])?,
            w_gate_up: Weight::from_out_rows(&[(&gate, ffn), (&up, ffn)], d),
            w_down: Weight::from_out_rows(&[(&tensor(file, &name("ffn_down"), &[ffn, d])?, d)], ffn),
        });
    }
    let output_norm = tensor(file, "output_norm.weight", &[d])?;
    let lm_head = if config.tied_embeddings {
        Weight::from_out_rows(&[(&token_embd, config.vocab_size)], d)
    } else {
        Weight::from_out_rows(&[(&tensor(file, "output.weight", &[d, config.vocab_size])?, config.vocab_size)], d)
    };
    Ok(Weights { token_embd, layers, output_norm, lm_head })
}

/// `tokenizer.ggml.eos_token_id` and, for ChatML models, the id of `<|im_end|>`.
fn eos_token_ids(file: &GgufFile) -> Vec<u32> {
    let mut ids = Vec::new();
    if let Some(id) = file.get_u64("tokenizer.ggml.eos_token_id").and_then(|id| u32::try_from(id).ok()) {
        ids.push(id);
    }
    let tokens = file.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
    let im_end = tokens.iter().position(|token| *token == "<|im_end|>").and_then(|id| u32::try_from(id).ok());
    if let Some(id) = im_end.filter(|id| !ids.contains(id)) {
        ids.push(id);
    }
    ids
}

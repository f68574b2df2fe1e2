//! The GGUF loader on small synthetic files: a complete llama model in several tensor types, and the
//! errors for files it cannot serve.

// Helpers of these tests panic on failure, like the tests themselves.
#![allow(clippy::unwrap_used)]

use kvroute_node_agent::model::{KvStore, Model, ModelError, SeqChunk};
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::domain::KvDtype;
use kvroute_proto::gguf::GgufFile;

const D: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const FFN: usize = 64;
const LAYERS: usize = 2;
const VOCAB: usize = 40;

enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
    Strings(Vec<String>),
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    F32,
    F16,
    Q8_0,
}

struct Tensor {
    name: String,
    dims: Vec<usize>,
    values: Vec<f32>,
    kind: Kind,
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn encode(kind: Kind, values: &[f32]) -> (u32, Vec<u8>) {
    match kind {
        Kind::F32 => (0, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        Kind::F16 => (1, values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect()),
        Kind::Q8_0 => {
            let mut out = Vec::new();
            for block in values.chunks(32) {
                let max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = half::f16::from_f32(max / 127.0);
                let inv = if scale.to_f32() == 0.0 { 0.0 } else { 1.0 / scale.to_f32() };
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend(block.iter().map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8));
            }
            (8, out)
        }
    }
}

/// A GGUF v3 file with the given metadata and tensors (alignment 32).
fn gguf(meta: &[(&str, Meta)], tensors: &[Tensor]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        put_str(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::Str(text) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut out, text);
            }
            Meta::Strings(items) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                items.iter().for_each(|item| put_str(&mut out, item));
            }
        }
    }
    let mut data = Vec::new();
    for tensor in tensors {
        let (code, bytes) = encode(tensor.kind, &tensor.values);
        put_str(&mut out, &tensor.name);
        out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
        tensor.dims.iter().for_each(|&d| out.extend_from_slice(&(d as u64).to_le_bytes()));
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        data.extend_from_slice(&bytes);
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    out.extend_from_slice(&data);
    out
}

fn metadata(architecture: &'static str) -> Vec<(&'static str, Meta)> {
    let mut tokens: Vec<String> = (0..VOCAB).map(|i| format!("t{i}")).collect();
    tokens[7] = "<|im_end|>".into();
    vec![
        ("general.architecture", Meta::Str(architecture)),
        ("general.name", Meta::Str("Synthetic Llama")),
        ("llama.block_count", Meta::U32(LAYERS as u32)),
        ("llama.embedding_length", Meta::U32(D as u32)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.attention.head_count", Meta::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Meta::U32(KV_HEADS as u32)),
        ("llama.rope.freq_base", Meta::F32(10_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.context_length", Meta::U32(64)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(3)),
        ("tokenizer.ggml.tokens", Meta::Strings(tokens)),
    ]
}

fn values(len: usize, seed: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| (((i * 2654435761 + seed * 97) % 1000) as f32 / 500.0 - 1.0) * scale).collect()
}

/// Every tensor of the synthetic model; matrices in `kind`, norms in F32.
fn tensors(kind: Kind, tied: bool) -> Vec<Tensor> {
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<usize>, scale: f32, kind: Kind| {
        let len = dims.iter().product();
        let seed = out.len();
        let values = if scale == 0.0 { vec![1.0; len] } else { values(len, seed, scale) };
        out.push(Tensor { name, dims, values, kind });
    };
    add("token_embd.weight".into(), vec![D, VOCAB], 0.5, kind);
    for i in 0..LAYERS {
        add(format!("blk.{i}.attn_norm.weight"), vec![D], 0.0, Kind::F32);
        add(format!("blk.{i}.attn_q.weight"), vec![D, HEADS * HEAD_DIM], 0.3, kind);
        add(format!("blk.{i}.attn_k.weight"), vec![D, KV_HEADS * HEAD_DIM], 0.3, kind);
        add(format!("blk.{i}.attn_v.weight"), vec![D, KV_HEADS * HEAD_DIM], 0.3, kind);
        add(format!("blk.{i}.attn_output.weight"), vec![HEADS * HEAD_DIM, D], 0.2, kind);
        add(format!("blk.{i}.ffn_norm.weight"), vec![D], 0.0, Kind::F32);
        add(format!("blk.{i}.ffn_gate.weight"), vec![D, FFN], 0.3, kind);
        add(format!("blk.{i}.ffn_up.weight"), vec![D, FFN], 0.3, kind);
        add(format!("blk.{i}.ffn_down.weight"), vec![FFN, D], 0.2, kind);
    }
    add("output_norm.weight".into(), vec![D], 0.0, Kind::F32);
    if !tied {
        add("output.weight".into(), vec![D, VOCAB], 0.5, kind);
    }
    out
}

fn load(bytes: Vec<u8>) -> Result<Model, ModelError> {
    let file = GgufFile::parse(bytes).map_err(ModelError::from)?;
    kvroute_node_agent::model::gguf_loader::from_gguf(&file, "synthetic-file")
}

fn last_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut kv = KvStore::new(model.config().kv_geometry(KvDtype::F32), 2, DEFAULT_BLOCK_SIZE as usize);
    let chunk = SeqChunk { tokens, start_pos: 0, block_table: &[0, 1], want_logits: true };
    model.forward(&mut kv, &[chunk]).remove(0).unwrap()
}

#[test]
fn loads_a_complete_model_in_every_tensor_type() {
    let reference = load(gguf(&metadata("llama"), &tensors(Kind::F32, false))).unwrap();
    let config = reference.config();
    assert_eq!((config.n_layers, config.d_model, config.head_dim, config.vocab_size), (LAYERS, D, HEAD_DIM, VOCAB));
    assert!(!config.tied_embeddings);
    assert_eq!(reference.model_id(), "Synthetic Llama");
    assert_eq!(reference.eos_token_ids(), &[3, 7]);
    let prompt = [1u32, 5, 9, 30, 2, 17];
    let expected = last_logits(&reference, &prompt);
    assert_eq!(expected.len(), VOCAB);
    assert!(expected.iter().all(|v| v.is_finite()));
    for (kind, tolerance) in [(Kind::F16, 0.02), (Kind::Q8_0, 0.1)] {
        let model = load(gguf(&metadata("llama"), &tensors(kind, false))).unwrap();
        let logits = last_logits(&model, &prompt);
        let max_diff = logits.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max_diff < tolerance, "max logit difference {max_diff}");
    }
    let tied = load(gguf(&metadata("llama"), &tensors(Kind::F32, true))).unwrap();
    assert!(tied.config().tied_embeddings);
    assert_eq!(last_logits(&tied, &prompt).len(), VOCAB);
}

#[test]
fn file_without_a_name_uses_the_fallback_id() {
    let meta: Vec<_> = metadata("llama").into_iter().filter(|(key, _)| *key != "general.name").collect();
    assert_eq!(load(gguf(&meta, &tensors(Kind::F32, true))).unwrap().model_id(), "synthetic-file");
}

#[test]
fn wrong_architecture_is_a_clear_error() {
    let error = load(gguf(&metadata("gpt2"), &tensors(Kind::F32, true))).unwrap_err();
    assert!(matches!(error, ModelError::Architecture { ref found } if found == "gpt2"), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("\"gpt2\"") && message.contains("llama"), "{message}");
}

#[test]
fn missing_tensor_is_a_clear_error() {
    let tensors: Vec<Tensor> =
        tensors(Kind::F32, true).into_iter().filter(|t| t.name != "blk.1.ffn_down.weight").collect();
    let error = load(gguf(&metadata("llama"), &tensors)).unwrap_err();
    assert!(error.to_string().contains("blk.1.ffn_down.weight"), "{error}");
    assert!(matches!(error, ModelError::MissingTensor { .. }));
}

#[test]
fn wrong_tensor_shape_is_a_clear_error() {
    let mut tensors = tensors(Kind::F32, true);
    let q = tensors.iter_mut().find(|t| t.name == "blk.0.attn_k.weight").unwrap();
    q.dims = vec![D, HEADS * HEAD_DIM];
    q.values = values(D * HEADS * HEAD_DIM, 1, 0.1);
    let error = load(gguf(&metadata("llama"), &tensors)).unwrap_err();
    assert!(matches!(error, ModelError::TensorShape { ref name, .. } if name == "blk.0.attn_k.weight"), "{error}");
}

#[test]
fn missing_hyper_parameter_is_a_clear_error() {
    let meta: Vec<_> = metadata("llama").into_iter().filter(|(key, _)| *key != "llama.block_count").collect();
    let error = load(gguf(&meta, &tensors(Kind::F32, true))).unwrap_err();
    assert!(error.to_string().contains("llama.block_count"), "{error}");
}

#[test]
fn unreadable_paths_are_errors() {
    let error = Model::load("/nonexistent/model.gguf").unwrap_err();
    assert!(error.to_string().contains("/nonexistent/model.gguf"), "{error}");
    let dir = std::env::temp_dir().join(format!("kvroute-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("not-gguf.gguf");
    std::fs::write(&path, b"not a gguf file at all").unwrap();
    assert!(Model::load(path.to_str().unwrap()).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

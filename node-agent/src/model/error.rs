//! Errors of model loading and of the KV store.

use kvroute_proto::gguf::GgufError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture {found:?}: only \"llama\" GGUF files can be served")]
    Architecture { found: String },
    #[error("GGUF metadata {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("the GGUF file has no tensor {name:?}")]
    MissingTensor { name: String },
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("invalid chunk: {0}")]
    InvalidChunk(String),
}

/// Why a KV store operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvStoreError {
    #[error("block {block} is out of range (the store has {num_blocks} blocks)")]
    BlockOutOfRange { block: u32, num_blocks: usize },
    #[error("a block holds {expected} bytes, got {found}")]
    ByteLength { expected: usize, found: usize },
}

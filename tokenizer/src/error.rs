//! Why a tokenizer could not be loaded, or ids could not be decoded.

use kvroute_proto::gguf::GgufError;

/// A tokenizer error.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot read the GGUF file: {0}")]
    Gguf(#[from] GgufError),
    #[error("{path} is not valid JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{source_name}: missing {key}")]
    Missing { source_name: &'static str, key: String },
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    #[error("invalid tokenizer data: {0}")]
    Invalid(String),
    #[error("unknown token id {id} (vocabulary size {vocab_size})")]
    UnknownId { id: u32, vocab_size: u32 },
    #[error("the decoded bytes are not valid UTF-8 (valid up to byte {valid_up_to}); decode_bytes gives the raw bytes")]
    InvalidUtf8 { valid_up_to: usize },
}

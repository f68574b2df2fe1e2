//! kvroute's gateway.
//!
//! Layout:
//! - [`tokenizer`]: byte-level BPE tokenizers (built-in cl100k_base, GGUF, tokenizer.json).
//! - [`chat`]: deterministic chat rendering with the model's template.
//! - [`cli`]: the command-line interface of the `gateway` binary.

pub mod chat;
pub mod cli;
pub mod tokenizer;

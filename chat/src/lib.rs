//! Deterministic chat rendering: messages and tools to prompt text and tokens.
//!
//! A [`ChatRenderer`] renders with the model's own Jinja chat template (run
//! by minijinja with the Hugging Face conventions: `trim_blocks`,
//! `lstrip_blocks`, Python string and dict methods, `raise_exception`,
//! `strftime_now`, and a Python-compatible `tojson`), or with ChatML when the
//! model has no template.
//!
//! # Canonical form
//! The same request always renders to the same tokens:
//! - tools are sorted by function name (ties by their canonical JSON), so the
//!   order a client lists them in does not matter (unless the renderer is told
//!   to keep their order, [`ToolOrder::AsSent`]);
//! - every JSON object in tools and tool-call arguments has its keys sorted;
//!   ChatML writes them without insignificant whitespace;
//! - tool-call arguments given as a JSON string are parsed first, so
//!   `"{\"b\":1, \"a\":2}"` and `{"a":2,"b":1}` are the same.
//!
//! # Token prefixes
//! [`ChatRenderer::render_tokens`] tokenizes a conversation piece by piece:
//! the text each message adds to the rendering (and the generation prompt
//! apart from the assistant reply that follows it) is tokenized on its own
//! and the pieces are concatenated. So the tokens of a conversation rendered
//! with a generation prompt are a prefix of the tokens of the same
//! conversation continued with the assistant's reply and further messages,
//! and multi-turn chat reuses the KV blocks of its history. When a template
//! does not render prefixes of a conversation as prefixes of its text (for
//! example one that rewrites earlier turns), the whole text is tokenized at
//! once instead and the prefix guarantee does not hold for that template.
//! Pieces are looked up in a [`TokenRunCache`] (keyed by the tokenizer
//! fingerprint and the piece text), so resent history is not re-tokenized.
//!
//! Modules: [`message`] (the OpenAI message shape), [`renderer`] (the renderer and its piece cutting),
//! `template` (compiling a Hugging Face template for minijinja), `pyjson` (Python's `json.dumps` as
//! `tojson`), `strftime` (`strftime_now`), `canonical` (canonical JSON and tool order), `chatml` (the
//! rendering for models without a template), [`token_cache`] (tokenized pieces).

mod canonical;
mod chatml;
pub mod message;
mod pyjson;
pub mod renderer;
mod strftime;
mod template;
pub mod token_cache;

pub use canonical::ToolOrder;
pub use message::{ChatMessage, ToolCall};
pub use renderer::{ChatRenderer, ReplyLookup};
pub use token_cache::{LruTokenCache, TokenRunCache};

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the chat template does not compile: {0}")]
    Template(String),
    #[error("the chat template rejected the conversation: {0}")]
    Raised(String),
    #[error("the chat template failed: {0}")]
    Render(String),
}

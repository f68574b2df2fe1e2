//! A request's prompt to token ids: text through the gateway's tokenizer, a chat through the chat
//! renderer with the exact ids of replies this gateway generated ([`ReplyMemory`]), ids as given. This
//! is the one way every path does it (HTTP, gRPC and `/debug/route`), so the explain endpoint routes
//! exactly the tokens the real request would send. Synchronous and CPU-heavy for large prompts: callers
//! run it in the [`crate::cpu_pool::CpuPool`].

use std::sync::Arc;

use serde_json::Value;

use crate::chat::{ChatMessage, ChatRenderer};
use crate::replies::ReplyMemory;
use crate::service::ServiceError;
use crate::tokenizer::Tokenizer;

/// A prompt as a client gives it.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptSource {
    Text(String),
    Tokens(Vec<u32>),
    Chat { messages: Vec<ChatMessage>, tools: Vec<Value> },
}

impl PromptSource {
    /// Roughly how much work tokenizing it is, in bytes of input.
    pub fn input_bytes(&self) -> usize {
        match self {
            PromptSource::Text(text) => text.len(),
            PromptSource::Tokens(ids) => ids.len() * 4,
            PromptSource::Chat { messages, tools } => {
                let content: usize =
                    messages.iter().map(|message| message.content.as_ref().map_or(0, String::len)).sum();
                content + messages.len() * 16 + tools.iter().map(|tool| tool.to_string().len()).sum::<usize>()
            }
        }
    }
}

/// Tokenizer, chat renderer and reply memory: everything a prompt needs to become token ids.
pub struct Prompts {
    pub tokenizer: Arc<Tokenizer>,
    pub renderer: Arc<ChatRenderer>,
    pub replies: Arc<ReplyMemory>,
}

impl std::fmt::Debug for Prompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompts").field("renderer", &self.renderer).finish()
    }
}

impl Prompts {
    /// The token ids of `source`.
    pub fn tokens(&self, source: PromptSource) -> Result<Vec<u32>, ServiceError> {
        match source {
            PromptSource::Text(text) => Ok(self.tokenizer.encode(&text)),
            PromptSource::Tokens(ids) => Ok(ids),
            PromptSource::Chat { messages, tools } => {
                let recall = |text: &str| self.replies.recall(text);
                self.renderer.render_tokens_with_replies(&messages, &tools, true, &recall).map_err(|error| {
                    ServiceError::bad_request(format!("cannot render the conversation: {error}"), Some("messages"))
                })
            }
        }
    }

    /// Remembers the ids a finished reply was generated as, when they are exactly its text.
    pub fn remember_reply(&self, text: &str, ids: &[u32]) {
        if let Some(exact) = crate::replies::exact_ids(&self.tokenizer, text, ids) {
            self.replies.remember(text, exact);
        }
    }
}

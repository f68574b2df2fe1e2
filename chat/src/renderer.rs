//! [`ChatRenderer`]: conversations to text and to tokens cut into per-message pieces (see the crate
//! documentation for the prefix guarantee).

use std::sync::Arc;

use kvroute_tokenizer::Tokenizer;
use minijinja::{Environment, Value as JinjaValue};
use serde_json::Value;

use crate::ChatError;
use crate::canonical::ToolOrder;
use crate::chatml::render_chatml;
use crate::message::{ChatMessage, message_value};
use crate::template::{TEMPLATE_NAME, compile, render_error};
use crate::token_cache::{LruTokenCache, TokenRunCache};

mod layout;

/// The default cache size of a renderer, in tokens (the gateway's).
const DEFAULT_CACHE_TOKENS: usize = 4 << 20;

/// Renders conversations to text and tokens, deterministically.
pub struct ChatRenderer {
    template: Option<Environment<'static>>,
    tokenizer: Arc<Tokenizer>,
    bos_token: String,
    eos_token: String,
    cache: Option<Arc<dyn TokenRunCache>>,
    tool_order: ToolOrder,
}

impl std::fmt::Debug for ChatRenderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatRenderer")
            .field("template", &if self.template.is_some() { "model" } else { "chatml" })
            .field("tokenizer", &self.tokenizer.name())
            .finish()
    }
}

/// A piece of the rendering, tokenized on its own.
#[derive(Debug, PartialEq)]
enum Rendering {
    Pieces(Vec<Piece>),
    Whole(String),
}

/// One message's share of the rendered text.
#[derive(Debug, PartialEq)]
struct Piece {
    text: String,
    /// The content of the assistant message this piece renders, if any.
    reply: Option<String>,
}

/// Looks up the exact token ids a reply was generated as.
pub type ReplyLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<[u32]>>;

impl ChatRenderer {
    /// A renderer with the given Jinja template (usually the tokenizer's
    /// [`chat_template`](Tokenizer::chat_template)), or ChatML for `None`.
    pub fn new(template: Option<&str>, tokenizer: Arc<Tokenizer>) -> Result<ChatRenderer, ChatError> {
        let token_text = |id: Option<u32>| id.and_then(|id| tokenizer.decode(&[id]).ok()).unwrap_or_default();
        let bos_token = token_text(tokenizer.bos_token_id());
        let eos_token = token_text(tokenizer.eos_token_ids().first().copied());
        let template = template.map(compile).transpose()?;
        let cache: Arc<dyn TokenRunCache> = Arc::new(LruTokenCache::new(DEFAULT_CACHE_TOKENS));
        Ok(ChatRenderer {
            template,
            tokenizer,
            bos_token,
            eos_token,
            cache: Some(cache),
            tool_order: ToolOrder::default(),
        })
    }

    /// Renders tools in `order` (canonical by default).
    pub fn with_tool_order(mut self, order: ToolOrder) -> ChatRenderer {
        self.tool_order = order;
        self
    }

    /// Uses `cache` for tokenized pieces (`None`: no caching).
    pub fn with_cache(mut self, cache: Option<Arc<dyn TokenRunCache>>) -> ChatRenderer {
        self.cache = cache;
        self
    }

    /// Whether the model's own template is used (otherwise ChatML).
    pub fn uses_model_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Renders the conversation to prompt text.
    pub fn render_text(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tools = self.tool_order.apply(tools);
        self.render_canonical(messages, &tools, add_generation_prompt)
    }

    /// Renders and tokenizes the conversation so that its tokens extend those
    /// of every earlier turn (see the module documentation).
    pub fn render_tokens(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        self.render_tokens_with_replies(messages, tools, add_generation_prompt, &|_| None)
    }

    /// Like [`ChatRenderer::render_tokens`], but an assistant message whose
    /// content `replies` knows is rendered with the exact ids it was generated
    /// as (re-tokenizing generated text can give other ids, and break the
    /// prefix a replica already holds).
    pub fn render_tokens_with_replies(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
        replies: ReplyLookup<'_>,
    ) -> Result<Vec<u32>, ChatError> {
        let tools = self.tool_order.apply(tools);
        Ok(match self.pieces(messages, &tools, add_generation_prompt)? {
            Rendering::Pieces(pieces) => {
                let mut out = Vec::new();
                for piece in &pieces {
                    let known = piece.reply.as_deref().filter(|reply| !reply.is_empty()).and_then(|reply| {
                        let ids = replies(reply)?;
                        piece.text.strip_prefix(reply).map(|rest| (ids, rest))
                    });
                    match known {
                        Some((ids, rest)) => {
                            out.extend_from_slice(&ids);
                            out.extend_from_slice(&self.tokenize_piece(rest));
                        }
                        None => out.extend_from_slice(&self.tokenize_piece(&piece.text)),
                    }
                }
                out
            }
            Rendering::Whole(text) => self.tokenizer.encode(&text),
        })
    }

    /// The rendering cut into per-message pieces, or the whole text when the
    /// template's renderings of the growing conversation are not prefixes of
    /// each other. Short conversations are cut by rendering each prefix of
    /// them; longer ones from one rendering of the whole ([`layout`]), so the
    /// work grows linearly with the number of messages.
    fn pieces(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Rendering, ChatError> {
        if messages.len() <= layout::RENDER_PREFIXES_UP_TO {
            self.pieces_by_prefixes(messages, tools, add_generation_prompt)
        } else {
            self.pieces_by_layout(messages, tools, add_generation_prompt)
        }
    }

    /// [`ChatRenderer::pieces`] by rendering every prefix of the conversation:
    /// the definition of the cut, quadratic in the number of messages.
    fn pieces_by_prefixes(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Rendering, ChatError> {
        let whole = |renderer: &ChatRenderer| {
            renderer.render_canonical(messages, tools, add_generation_prompt).map(Rendering::Whole)
        };
        let mut pieces = Vec::with_capacity(messages.len() * 2 + 1);
        let mut done = String::new();
        for end in 1..=messages.len() {
            if messages[end - 1].role == "assistant" {
                // Tokenize the generation prompt apart from the reply, exactly
                // as it was when the reply was requested.
                if let Ok(prompt) = self.render_canonical(&messages[..end - 1], tools, true)
                    && prompt.len() > done.len()
                    && prompt.starts_with(done.as_str())
                {
                    pieces.push(Piece { text: prompt[done.len()..].to_string(), reply: None });
                    done = prompt;
                }
            }
            let Ok(text) = self.render_canonical(&messages[..end], tools, false) else {
                return whole(self);
            };
            if !text.starts_with(done.as_str()) {
                return whole(self);
            }
            if text.len() > done.len() {
                let message = &messages[end - 1];
                let reply = (message.role == "assistant" && message.tool_calls.is_empty())
                    .then(|| message.content.clone())
                    .flatten();
                pieces.push(Piece { text: text[done.len()..].to_string(), reply });
            }
            done = text;
        }
        if add_generation_prompt {
            let text = self.render_canonical(messages, tools, true)?;
            if !text.starts_with(done.as_str()) {
                return Ok(Rendering::Whole(text));
            }
            if text.len() > done.len() {
                pieces.push(Piece { text: text[done.len()..].to_string(), reply: None });
            }
        } else if messages.is_empty() {
            return whole(self);
        }
        Ok(Rendering::Pieces(pieces))
    }

    fn tokenize_piece(&self, piece: &str) -> Arc<[u32]> {
        let Some(cache) = &self.cache else {
            return self.tokenizer.encode(piece).into();
        };
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.tokenizer.fingerprint().as_bytes());
        hasher.update(&[0]);
        hasher.update(piece.as_bytes());
        let key = *hasher.finalize().as_bytes();
        if let Some(tokens) = cache.get(&key) {
            return tokens;
        }
        let tokens: Arc<[u32]> = self.tokenizer.encode(piece).into();
        cache.insert(key, tokens.clone());
        tokens
    }

    fn render_canonical(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        #[cfg(test)]
        layout::count_rendering();
        match &self.template {
            Some(env) => self.render_template(env, messages, tools, add_generation_prompt),
            None => Ok(render_chatml(messages, tools, add_generation_prompt)),
        }
    }

    fn render_template(
        &self,
        env: &Environment<'static>,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let context = self.context(JinjaValue::from_serialize(&messages), tools, add_generation_prompt);
        let template = env.get_template(TEMPLATE_NAME).map_err(|err| ChatError::Template(err.to_string()))?;
        template.render(context).map_err(render_error)
    }

    /// The variables a chat template sees.
    fn context(&self, messages: JinjaValue, tools: &[Value], add_generation_prompt: bool) -> JinjaValue {
        let tools = if tools.is_empty() { JinjaValue::from(()) } else { JinjaValue::from_serialize(tools) };
        minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        }
    }
}

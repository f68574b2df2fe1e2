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
//!   order a client lists them in does not matter;
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value as JinjaValue};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::tokenizer::Tokenizer;

mod layout;

/// A chat message in OpenAI's shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// The text; in JSON either a string, `null`, or a list of text parts
    /// (`[{"type": "text", "text": "..."}]`), which are joined with `\n`.
    #[serde(default, deserialize_with = "content_text")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: Some(content.to_string()), ..ChatMessage::default() }
    }
}

/// A function call made by the assistant.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments; a JSON string holding JSON is parsed when rendering.
    pub arguments: Value,
}

/// OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`,
/// or the flat `{"id", "name", "arguments"}`.
#[derive(Deserialize)]
struct ToolCallWire {
    #[serde(default)]
    id: String,
    #[serde(default)]
    function: Option<FunctionWire>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct FunctionWire {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ToolCall, D::Error> {
        let wire = ToolCallWire::deserialize(deserializer)?;
        let (name, arguments) = match (wire.function, wire.name) {
            (Some(function), _) => (function.name, function.arguments),
            (None, Some(name)) => (name, wire.arguments),
            (None, None) => return Err(D::Error::custom("tool call without a function name")),
        };
        Ok(ToolCall { id: wire.id, name, arguments: arguments.unwrap_or_else(|| Value::Object(Map::new())) })
    }
}

impl Serialize for ToolCall {
    /// OpenAI's shape, the arguments as a canonical JSON string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value = serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": canonical_json(&parsed_arguments(&self.arguments))},
        });
        value.serialize(serializer)
    }
}

fn content_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in &parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("text", Some(text)) => texts.push(text),
                    ("text", None) => return Err(D::Error::custom("text content part without text")),
                    (other, _) => {
                        return Err(D::Error::custom(format!(
                            "content part of type {other:?} is not supported (text only)"
                        )));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
        Some(_) => Err(D::Error::custom("content must be a string, null or a list of text parts")),
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(Option::<Vec<ToolCall>>::deserialize(deserializer)?.unwrap_or_default())
}

/// Why a chat could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the chat template does not compile: {0}")]
    Template(String),
    #[error("the chat template rejected the conversation: {0}")]
    Raised(String),
    #[error("the chat template failed: {0}")]
    Render(String),
}

/// A cache of tokenized text pieces, shared by renderers. Keys are blake3
/// digests of the tokenizer fingerprint and the piece text.
pub trait TokenRunCache: Send + Sync {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<[u32]>>;
    fn insert(&self, key: [u8; 32], tokens: Arc<[u32]>);
}

/// A [`TokenRunCache`] holding the most recently used pieces, bounded by the
/// total number of tokens held.
pub struct LruTokenCache {
    max_tokens: usize,
    state: Mutex<LruState>,
}

#[derive(Default)]
struct LruState {
    entries: HashMap<[u8; 32], (Arc<[u32]>, u64)>,
    by_age: BTreeMap<u64, [u8; 32]>,
    clock: u64,
    tokens: usize,
}

impl LruTokenCache {
    /// A cache holding at most `max_tokens` tokens in all.
    pub fn new(max_tokens: usize) -> LruTokenCache {
        LruTokenCache { max_tokens, state: Mutex::new(LruState::default()) }
    }

    /// The number of pieces held.
    pub fn len(&self) -> usize {
        self.state.lock().map_or(0, |state| state.entries.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TokenRunCache for LruTokenCache {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<[u32]>> {
        let mut state = self.state.lock().ok()?;
        let state = &mut *state;
        state.clock += 1;
        let clock = state.clock;
        let (tokens, age) = state.entries.get_mut(key)?;
        state.by_age.remove(age);
        *age = clock;
        state.by_age.insert(clock, *key);
        Some(tokens.clone())
    }

    fn insert(&self, key: [u8; 32], tokens: Arc<[u32]>) {
        if tokens.len() > self.max_tokens {
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let state = &mut *state;
        state.clock += 1;
        let clock = state.clock;
        state.tokens += tokens.len();
        if let Some((old, age)) = state.entries.insert(key, (tokens, clock)) {
            state.tokens -= old.len();
            state.by_age.remove(&age);
        }
        state.by_age.insert(clock, key);
        while state.tokens > self.max_tokens {
            let Some((_, oldest)) = state.by_age.pop_first() else {
                break;
            };
            if let Some((old, _)) = state.entries.remove(&oldest) {
                state.tokens -= old.len();
            }
        }
    }
}

/// The default cache size of a renderer, in tokens.
const DEFAULT_CACHE_TOKENS: usize = 1 << 20;

const TEMPLATE_NAME: &str = "chat_template";

/// Renders conversations to text and tokens, deterministically.
pub struct ChatRenderer {
    template: Option<Environment<'static>>,
    tokenizer: Arc<Tokenizer>,
    bos_token: String,
    eos_token: String,
    cache: Option<Arc<dyn TokenRunCache>>,
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
        Ok(ChatRenderer { template, tokenizer, bos_token, eos_token, cache: Some(cache) })
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
        let tools = canonical_tools(tools);
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
        let tools = canonical_tools(tools);
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

/// Marks an error raised by the template's `raise_exception`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

fn render_error(err: minijinja::Error) -> ChatError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<Raised>() {
            return ChatError::Raised(raised.0.clone());
        }
        source = cause.source();
    }
    ChatError::Render(err.to_string())
}

/// Compiles a Hugging Face chat template.
fn compile(source: &str) -> Result<Environment<'static>, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_function("raise_exception", |message: String| -> Result<JinjaValue, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(source))
        .map_err(|err| ChatError::Template(err.to_string()))?;
    Ok(env)
}

/// Turns Hugging Face's `{% generation %}` / `{% endgeneration %}` markers
/// (which only mark assistant text for training masks) into a no-op block.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches('-').trim();
        let left = if tag.starts_with("{%-") { "-" } else { "" };
        let right = if tag.ends_with("-%}") { "-" } else { "" };
        match inner {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(tag),
        }
        rest = &rest[start + tag.len()..];
    }
    out.push_str(rest);
    out
}

/// `tojson` as Hugging Face defines it for chat templates: Python's
/// `json.dumps(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|err| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {err}")))?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = PyJson {
        indent,
        item,
        key,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

/// Python `json.dumps` formatting.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(indent) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * depth));
        }
    }

    fn write(&self, value: &Value, depth: usize, out: &mut String) {
        match value {
            Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Value::Object(map) if !map.is_empty() => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.string(key, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            Value::String(text) => self.string(text, out),
            other => out.push_str(&other.to_string()),
        }
    }

    fn string(&self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// `strftime_now(format)`: the current UTC time, for templates that put
/// today's date into the system prompt (such prompts change once a day).
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs() as i64);
    format_time(&format, seconds)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

fn format_time(format: &str, unix_seconds: i64) -> Result<String, minijinja::Error> {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{}", other.map(String::from).unwrap_or_default()),
                ));
            }
        }
    }
    Ok(out)
}

/// A JSON value with every object's keys in sorted order (whatever map type
/// serde_json was built with).
fn canonical_value(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut sorted = Map::new();
            for key in keys {
                sorted.insert(key.clone(), canonical_value(&map[key]));
            }
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical_value).collect()),
        other => other.clone(),
    }
}

/// Compact JSON with sorted keys.
fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// Tool-call arguments as JSON: a string holding JSON is parsed.
fn parsed_arguments(arguments: &Value) -> Value {
    match arguments {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| arguments.clone()),
        other => other.clone(),
    }
}

fn tool_name(tool: &Value) -> &str {
    tool.get("function")
        .and_then(|function| function.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The tools in canonical order and key order.
fn canonical_tools(tools: &[Value]) -> Vec<Value> {
    let mut keyed: Vec<(String, String, Value)> = tools
        .iter()
        .map(|tool| {
            let tool = canonical_value(tool);
            (tool_name(&tool).to_string(), canonical_json(&tool), tool)
        })
        .collect();
    keyed.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    keyed.into_iter().map(|(_, _, tool)| tool).collect()
}

/// A message as the template sees it (OpenAI's shape, canonical arguments).
fn message_value(message: &ChatMessage) -> Value {
    let mut object = Map::new();
    object.insert("role".into(), Value::String(message.role.clone()));
    object.insert("content".into(), message.content.clone().map_or(Value::Null, Value::String));
    if !message.tool_calls.is_empty() {
        let calls = message
            .tool_calls
            .iter()
            .map(|call| {
                serde_json::json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": canonical_value(&parsed_arguments(&call.arguments))},
                })
            })
            .collect();
        object.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        object.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    if let Some(name) = &message.name {
        object.insert("name".into(), Value::String(name.clone()));
    }
    Value::Object(object)
}

/// The tool section ChatML puts into the system message.
fn chatml_tools_section(tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        out.push('\n');
        out.push_str(&canonical_json(tool));
    }
    out.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    out
}

/// ChatML, the rendering for models without a template:
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message and
/// `<|im_start|>assistant\n` as the generation prompt. With tools, the
/// system message (one is added first if there is none) ends with a tool
/// section listing each tool as canonical JSON on its own line; assistant
/// tool calls follow the content as `<tool_call>\n{"name":..,"arguments":..}\n</tool_call>`
/// and tool results are wrapped in `<tool_response>\n..\n</tool_response>`.
fn render_chatml(messages: &[ChatMessage], tools: &[Value], add_generation_prompt: bool) -> String {
    render_chatml_marking(messages, tools, add_generation_prompt, &mut Vec::new())
}

/// [`render_chatml`], pushing onto `ends` where each message's text ends: the length of the rendering
/// of the messages up to it.
fn render_chatml_marking(
    messages: &[ChatMessage],
    tools: &[Value],
    add_generation_prompt: bool,
    ends: &mut Vec<usize>,
) -> String {
    let mut out = String::new();
    let mut rest = messages;
    if !tools.is_empty() {
        out.push_str("<|im_start|>system\n");
        if let Some((first, tail)) = messages.split_first().filter(|(first, _)| first.role == "system") {
            let content = first.content.as_deref().unwrap_or_default();
            if !content.is_empty() {
                out.push_str(content);
                out.push_str("\n\n");
            }
            rest = tail;
        }
        out.push_str(&chatml_tools_section(tools));
        out.push_str("<|im_end|>\n");
        if rest.len() < messages.len() {
            ends.push(out.len());
        }
    }
    for message in rest {
        out.push_str("<|im_start|>");
        out.push_str(&message.role);
        out.push('\n');
        let content = message.content.as_deref().unwrap_or_default();
        if message.role == "tool" {
            out.push_str("<tool_response>\n");
            out.push_str(content);
            out.push_str("\n</tool_response>");
        } else {
            out.push_str(content);
        }
        for (i, call) in message.tool_calls.iter().enumerate() {
            if i > 0 || !content.is_empty() {
                out.push('\n');
            }
            out.push_str("<tool_call>\n{\"name\":");
            out.push_str(&Value::String(call.name.clone()).to_string());
            out.push_str(",\"arguments\":");
            out.push_str(&canonical_json(&parsed_arguments(&call.arguments)));
            out.push_str("}\n</tool_call>");
        }
        out.push_str("<|im_end|>\n");
        ends.push(out.len());
    }
    if add_generation_prompt {
        out.push_str(CHATML_GENERATION_PROMPT);
    }
    out
}

/// What ChatML adds for the assistant's reply.
const CHATML_GENERATION_PROMPT: &str = "<|im_start|>assistant\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formatting() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(format_time("%Y-%m-%d %H:%M:%S", t).unwrap(), "2024-02-29 13:05:09");
        assert_eq!(format_time("%d %b %Y, %A %B %a %y %%", t).unwrap(), "29 Feb 2024, Thursday February Thu 24 %");
        assert_eq!(format_time("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert!(format_time("%Q", t).is_err());
    }

    #[test]
    fn generation_tags_become_no_ops() {
        assert_eq!(strip_generation_tags("a{% generation %}b{%- endgeneration -%}c"), "a{% if true %}b{%- endif -%}c");
        assert_eq!(strip_generation_tags("{{ x }}{% if y %}z{% endif %}"), "{{ x }}{% if y %}z{% endif %}");
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let value = serde_json::json!({"b": [1, {"d": null, "c": "x"}], "a": true});
        assert_eq!(canonical_json(&value), r#"{"a":true,"b":[1,{"c":"x","d":null}]}"#);
    }

    #[test]
    fn lru_cache_evicts_least_recently_used() {
        let cache = LruTokenCache::new(4);
        cache.insert([1; 32], Arc::from(vec![1, 1]));
        cache.insert([2; 32], Arc::from(vec![2, 2]));
        assert!(cache.get(&[1; 32]).is_some());
        cache.insert([3; 32], Arc::from(vec![3]));
        // 5 tokens > 4: the least recently used entry (2) goes.
        assert!(cache.get(&[2; 32]).is_none());
        assert_eq!(cache.get(&[1; 32]).as_deref(), Some([1, 1].as_slice()));
        assert_eq!(cache.len(), 2);
        cache.insert([4; 32], Arc::from(vec![0; 10]));
        assert_eq!(cache.len(), 2);
    }
}

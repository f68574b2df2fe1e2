//! The stub engine's HTTP API, as much of vLLM's OpenAI-compatible server as routers and kvroute's agent
//! use: `/v1/completions` and `/v1/chat/completions` (streamed or not; a text, token-id or chat prompt;
//! usage with the cached prompt tokens), `/v1/models`, `/health`, `/metrics` (vLLM's names: block size and
//! blocks, requests finished, process start time; none is ever running or waiting: answers are instant), `/tokenize` (text or a chat, rendered with
//! the model's template), the render endpoints of vLLM's scale-out mode, and `/reset_prefix_cache`. Every answer is immediate and
//! canned: the reply is the same tokens for every request, as many as it asks for. Bad input is a 400 with
//! an OpenAI-shaped JSON error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvroute_chat::{ChatMessage, ChatRenderer};
use kvroute_tokenizer::Tokenizer;
use serde_json::{Value, json};

use super::cache::PrefixCache;
use super::events::batch_payload;
use super::publisher::Publisher;

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Output tokens of a request that does not say.
const DEFAULT_MAX_TOKENS: u64 = 16;
/// The canned reply, repeated as needed.
const REPLY: &str = " The stub engine answers every request at once with this same canned reply.";

/// How the stub presents itself.
#[derive(Clone, Debug)]
pub struct StubConfig {
    pub model: String,
    pub max_model_len: u32,
    pub block_size: usize,
    pub blocks: usize,
}

/// The stub's state, shared by its handlers.
pub struct Stub {
    config: StubConfig,
    tokenizer: Arc<Tokenizer>,
    renderer: ChatRenderer,
    /// The canned reply's token ids and each one's text.
    reply: Vec<(u32, String)>,
    started_unix: f64,
    publisher: Option<Publisher>,
    ids: AtomicU64,
    state: Mutex<Counted>,
}

/// Changed together, under one lock: the cache, the events' seq, and the totals `/metrics` shows.
struct Counted {
    cache: PrefixCache,
    seq: u64,
    finished: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
}

impl Stub {
    /// A stub serving `config`, tokenizing with `tokenizer` (and rendering chats with its template, or
    /// ChatML when it has none), publishing its cache events through `publisher` when given.
    pub fn new(config: StubConfig, tokenizer: Tokenizer, publisher: Option<Publisher>) -> anyhow::Result<Stub> {
        let tokenizer = Arc::new(tokenizer);
        let renderer = ChatRenderer::new(tokenizer.chat_template(), tokenizer.clone())
            .map_err(|error| anyhow::anyhow!("the chat template: {error}"))?;
        let reply =
            tokenizer.encode(REPLY).into_iter().map(|id| (id, tokenizer.decode(&[id]).unwrap_or_default())).collect();
        let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Ok(Stub {
            state: Mutex::new(Counted {
                cache: PrefixCache::new(config.block_size, config.blocks),
                seq: 0,
                finished: 0,
                prompt_tokens: 0,
                cached_tokens: 0,
            }),
            config,
            tokenizer,
            renderer,
            reply,
            started_unix,
            publisher,
            ids: AtomicU64::new(0),
        })
    }

    fn counted(&self) -> MutexGuard<'_, Counted> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `tokens` through the cache (publishing what changed, in order) and returns the cached count.
    fn serve_prompt(&self, tokens: &[u32], salt: Option<&str>) -> usize {
        let mut counted = self.counted();
        let served = counted.cache.serve(tokens, salt);
        if let Some(publisher) = &self.publisher
            && !served.events.is_empty()
        {
            publisher.publish(counted.seq, &batch_payload(unix_now(), &served.events, self.config.block_size));
            counted.seq += 1;
        }
        counted.finished += 1;
        counted.prompt_tokens += tokens.len() as u64;
        counted.cached_tokens += served.cached_tokens as u64;
        served.cached_tokens
    }

    fn reset(&self) {
        let mut counted = self.counted();
        let cleared = counted.cache.clear();
        if let Some(publisher) = &self.publisher {
            publisher.publish(counted.seq, &batch_payload(unix_now(), &[cleared], self.config.block_size));
            counted.seq += 1;
        }
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}-stub-{}", self.ids.fetch_add(1, Ordering::Relaxed))
    }
}

/// The routes.
pub fn router(stub: Arc<Stub>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/tokenize", post(tokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(stub)
}

/// A request the stub refuses: its status and message.
type Refusal = (StatusCode, String);

fn error(status: StatusCode, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

fn refused((status, message): Refusal) -> Response {
    error(status, message)
}

fn bad(message: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, message.into())
}

fn parse_body(body: &Bytes) -> Result<Value, Refusal> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad("the body is not a JSON object"));
    }
    Ok(value)
}

/// A completion's prompt: text (tokenized, with the tokenizer's BOS unless `add_special_tokens` is false),
/// token ids, or a list holding one of either.
fn completion_prompt(stub: &Stub, body: &Value) -> Result<Vec<u32>, Refusal> {
    let add_special = body.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
    let prompt = match body.get("prompt") {
        Some(Value::Array(items)) if items.len() == 1 && (items[0].is_string() || items[0].is_array()) => &items[0],
        Some(prompt) => prompt,
        None => return Err(bad("`prompt` is required")),
    };
    match prompt {
        Value::String(text) => {
            let mut tokens = Vec::new();
            if add_special && stub.tokenizer.add_bos_token() {
                tokens.extend(stub.tokenizer.bos_token_id());
            }
            tokens.extend(stub.tokenizer.encode(text));
            Ok(tokens)
        }
        Value::Array(ids) => ids
            .iter()
            .map(|id| {
                id.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .filter(|&id| id < stub.tokenizer.vocab_size())
                    .ok_or_else(|| bad(format!("`prompt` holds {id}, not a token id of the model")))
            })
            .collect(),
        _ => Err(bad("`prompt` is neither text nor a list of token ids")),
    }
}

/// A chat's prompt: the messages (and tools) rendered with the chat template, then tokenized.
fn chat_prompt(stub: &Stub, body: &Value) -> Result<Vec<u32>, Refusal> {
    let messages = body.get("messages").ok_or_else(|| bad("`messages` is required"))?;
    let messages: Vec<ChatMessage> =
        serde_json::from_value(messages.clone()).map_err(|e| bad(format!("`messages`: {e}")))?;
    let tools: Vec<Value> = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(_) => return Err(bad("`tools` is not a list")),
    };
    let generation_prompt = body.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true);
    let text = stub
        .renderer
        .render_text(&messages, &tools, generation_prompt)
        .map_err(|e| bad(format!("rendering the chat: {e}")))?;
    Ok(stub.tokenizer.encode(&text))
}

/// What a generation request asks for besides its prompt.
struct Asked {
    max_tokens: usize,
    stream: bool,
    usage_in_stream: bool,
    token_ids: bool,
    salt: Option<String>,
}

fn asked(stub: &Stub, body: &Value, prompt_tokens: usize) -> Result<Asked, Refusal> {
    let asked_tokens =
        ["max_completion_tokens", "max_tokens"].iter().find_map(|name| body.get(*name).filter(|v| !v.is_null()));
    let max_tokens = match asked_tokens {
        None => DEFAULT_MAX_TOKENS,
        Some(value) => {
            value.as_u64().filter(|&n| n >= 1).ok_or_else(|| bad("`max_tokens` is not a positive integer"))?
        }
    };
    let limit = stub.config.max_model_len as usize;
    if prompt_tokens == 0 {
        return Err(bad("the prompt is empty"));
    }
    if prompt_tokens as u64 + max_tokens > limit as u64 {
        return Err(bad(format!(
            "the prompt has {prompt_tokens} tokens and asks for {max_tokens} more; this model's context is {limit}"
        )));
    }
    let salt = match body.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(salt)) if !salt.is_empty() => Some(salt.clone()),
        Some(_) => return Err(bad("`cache_salt` is not a non-empty string")),
    };
    Ok(Asked {
        max_tokens: max_tokens as usize,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        usage_in_stream: body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
        token_ids: body.get("return_token_ids").and_then(Value::as_bool).unwrap_or(false),
        salt,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Completion,
    Chat,
}

async fn completions(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    generate(&stub, &body, Api::Completion).unwrap_or_else(refused)
}

async fn chat_completions(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    generate(&stub, &body, Api::Chat).unwrap_or_else(refused)
}

fn generate(stub: &Stub, body: &Bytes, api: Api) -> Result<Response, Refusal> {
    let body = parse_body(body)?;
    let prompt = match api {
        Api::Completion => completion_prompt(stub, &body)?,
        Api::Chat => chat_prompt(stub, &body)?,
    };
    let asked = asked(stub, &body, prompt.len())?;
    let cached = stub.serve_prompt(&prompt, asked.salt.as_deref());
    let reply: Vec<&(u32, String)> = stub.reply.iter().cycle().take(asked.max_tokens).collect();
    let usage = json!({
        "prompt_tokens": prompt.len(),
        "completion_tokens": reply.len(),
        "total_tokens": prompt.len() + reply.len(),
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    let (id, object) = match (api, asked.stream) {
        (Api::Completion, _) => (stub.next_id("cmpl"), "text_completion"),
        (Api::Chat, false) => (stub.next_id("chatcmpl"), "chat.completion"),
        (Api::Chat, true) => (stub.next_id("chatcmpl"), "chat.completion.chunk"),
    };
    let created = unix_now() as u64;
    let model = &stub.config.model;
    let answer =
        |choices: Value| json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
    let ids = |tokens: &[&(u32, String)]| asked.token_ids.then(|| tokens.iter().map(|(id, _)| *id).collect());
    if !asked.stream {
        let text: String = reply.iter().map(|(_, text)| text.as_str()).collect();
        let mut whole = answer(json!([choice(api, false, &text, ids(&reply), json!("length"))]));
        whole["usage"] = usage;
        return Ok(axum::Json(whole).into_response());
    }
    let mut stream = String::new();
    let mut push = |chunk: Value| {
        stream.push_str("data: ");
        stream.push_str(&chunk.to_string());
        stream.push_str("\n\n");
    };
    if api == Api::Chat {
        push(answer(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}])));
    }
    for (at, piece) in reply.iter().enumerate() {
        let finish = if at + 1 == reply.len() { json!("length") } else { Value::Null };
        push(answer(json!([choice(api, true, &piece.1, ids(std::slice::from_ref(piece)), finish)])));
    }
    if asked.usage_in_stream {
        let mut last = answer(json!([]));
        last["usage"] = usage;
        push(last);
    }
    stream.push_str("data: [DONE]\n\n");
    Ok(([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], Body::from(stream))
        .into_response())
}

/// One choice of an answer: the whole reply, or (`streamed`) one piece of it; with its token ids when asked.
fn choice(api: Api, streamed: bool, text: &str, token_ids: Option<Vec<u32>>, finish: Value) -> Value {
    let mut choice = match (api, streamed) {
        (Api::Completion, _) => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
        (Api::Chat, false) => {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
        }
        (Api::Chat, true) => json!({"index": 0, "delta": {"content": text}, "finish_reason": finish}),
    };
    if let Some(ids) = token_ids {
        choice["token_ids"] = json!(ids);
    }
    choice
}

/// `POST /tokenize`: `{"prompt": text}` or `{"messages": [...]}`, answered as vLLM does.
async fn tokenize(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    let tokens = parse_body(&body).and_then(|body| match body.get("messages") {
        Some(_) => chat_prompt(&stub, &body),
        None if body.get("prompt").is_some_and(Value::is_string) => completion_prompt(&stub, &body),
        None => Err(bad("`prompt` (text) or `messages` is required")),
    });
    match tokens {
        Ok(tokens) => {
            axum::Json(json!({"count": tokens.len(), "max_model_len": stub.config.max_model_len, "tokens": tokens}))
                .into_response()
        }
        Err(refusal) => refused(refusal),
    }
}

/// `POST /v1/completions/render` and `/v1/chat/completions/render`: the prompt's token ids without
/// generating, as vLLM's scale-out mode answers them (`{"request_id", "token_ids", "model"}`; a list of
/// them for completions).
async fn render_completion(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    match parse_body(&body).and_then(|body| completion_prompt(&stub, &body)) {
        Ok(tokens) => axum::Json(json!([rendered(&stub, tokens)])).into_response(),
        Err(refusal) => refused(refusal),
    }
}

async fn render_chat(State(stub): State<Arc<Stub>>, body: Bytes) -> Response {
    match parse_body(&body).and_then(|body| chat_prompt(&stub, &body)) {
        Ok(tokens) => axum::Json(rendered(&stub, tokens)).into_response(),
        Err(refusal) => refused(refusal),
    }
}

fn rendered(stub: &Stub, tokens: Vec<u32>) -> Value {
    json!({"request_id": stub.next_id("render"), "token_ids": tokens, "model": stub.config.model})
}

async fn reset_prefix_cache(State(stub): State<Arc<Stub>>) -> StatusCode {
    stub.reset();
    StatusCode::OK
}

async fn models(State(stub): State<Arc<Stub>>) -> Response {
    let model = json!({"id": stub.config.model, "object": "model", "created": stub.started_unix as u64,
        "owned_by": "kvroute-stub", "root": stub.config.model, "max_model_len": stub.config.max_model_len});
    axum::Json(json!({"object": "list", "data": [model]})).into_response()
}

async fn metrics(State(stub): State<Arc<Stub>>) -> Response {
    let (finished, prompt, cached, held) = {
        let counted = stub.counted();
        (counted.finished, counted.prompt_tokens, counted.cached_tokens, counted.cache.len())
    };
    let config = &stub.config;
    let model = &config.model;
    let usage = held as f64 / config.blocks.max(1) as f64;
    let text = format!(
        "# TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1.0\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{model}\"}} 0.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{model}\"}} 0.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"{model}\"}} {usage}\n\
         # TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{finished_reason=\"length\",model_name=\"{model}\"}} {finished}.0\n\
         # TYPE vllm:prompt_tokens_total counter\n\
         vllm:prompt_tokens_total{{model_name=\"{model}\"}} {prompt}.0\n\
         # TYPE vllm:prefix_cache_hits_total counter\n\
         vllm:prefix_cache_hits_total{{model_name=\"{model}\"}} {cached}.0\n\
         # TYPE process_start_time_seconds gauge\n\
         process_start_time_seconds {}\n",
        config.block_size, config.blocks, stub.started_unix,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Seconds since the Unix epoch (event timestamps, `created` fields).
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

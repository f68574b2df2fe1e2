//! The engine's OpenAI-compatible `/v1/completions`, as the agent speaks it: the request body built from an
//! agent request (the prompt as token ids, so the engine computes exactly the tokens the gateway hashed),
//! the server-sent events of its streamed answer decoded into token ids, a finish reason and usage, and its
//! error answers mapped to the agent's errors. Pure functions over bytes and JSON.

use kvroute_proto::domain::{AgentGenerateRequest, FinishReason};
use serde_json::{Value, json};

use crate::engine::{GenerateError, Usage};

/// The body of a streamed completion of `request` under `model`, with `cache_salt` when the request has
/// one (vLLM and SGLang keep cached blocks of different salts apart).
pub fn completion_body(model: &str, request: &AgentGenerateRequest, cache_salt: Option<&str>) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": request.sampling.temperature,
        "top_p": request.sampling.top_p,
        "stream": true,
        "stream_options": {"include_usage": true},
        // Token ids of every streamed piece (vLLM: `token_ids` in each choice); text is not what the
        // gateway streams on: it decodes the ids with its own tokenizer.
        "return_token_ids": true,
        "ignore_eos": request.ignore_eos,
        "skip_special_tokens": false,
        "spaces_between_special_tokens": false,
    });
    if let Some(seed) = request.sampling.seed {
        body["seed"] = json!(seed);
    }
    if !request.stop_token_ids.is_empty() {
        body["stop_token_ids"] = json!(request.stop_token_ids);
    }
    if let Some(salt) = cache_salt {
        body["cache_salt"] = json!(salt);
    }
    body
}

/// Splits a server-sent event stream into the payloads of its `data:` lines, across arbitrary chunk
/// boundaries. Bounded: an event longer than [`MAX_EVENT_BYTES`] is an error.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
}

/// Longest server-sent event accepted.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

impl SseDecoder {
    /// Feeds `chunk`; returns the data payloads of the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<String>, String> {
        self.pending.extend_from_slice(chunk);
        let mut payloads = Vec::new();
        while let Some((end, separator)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + separator).take(end).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            if !data.is_empty() {
                payloads.push(data.join("\n"));
            }
        }
        if self.pending.len() > MAX_EVENT_BYTES {
            return Err(format!("a server-sent event is longer than {MAX_EVENT_BYTES} bytes"));
        }
        Ok(payloads)
    }
}

/// Where the first event in `buffer` ends (the index of its blank line) and the separator's length.
fn event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|pair| pair == b"\n\n").map(|at| (at, 2));
    let crlf = buffer.windows(4).position(|quad| quad == b"\r\n\r\n").map(|at| (at, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// What one streamed chunk of a completion says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<Usage>,
    /// `[DONE]`: the stream is over.
    pub done: bool,
}

/// Decodes one `data:` payload of the completion stream. An error payload (`{"error": ...}`, which vLLM
/// sends mid-stream) is returned as the error it maps to.
pub fn decode_chunk(payload: &str) -> Result<Chunk, GenerateError> {
    if payload.trim() == "[DONE]" {
        return Ok(Chunk { done: true, ..Chunk::default() });
    }
    let value: Value = serde_json::from_str(payload).map_err(|error| {
        GenerateError::Unavailable(format!("the engine streamed a chunk that is not JSON: {error}"))
    })?;
    if let Some(error) = value.get("error") {
        let status = error.get("code").and_then(Value::as_u64).unwrap_or(500) as u16;
        return Err(error_of(status, &value));
    }
    let mut chunk = Chunk::default();
    if let Some(choice) = value.get("choices").and_then(Value::as_array).and_then(|choices| choices.first()) {
        if let Some(ids) = choice.get("token_ids").and_then(Value::as_array) {
            for id in ids {
                let id = id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                    GenerateError::Unavailable(format!("the engine streamed a token id that is not one: {id}"))
                })?;
                chunk.token_ids.push(id);
            }
        }
        chunk.finish_reason = match choice.get("finish_reason").and_then(Value::as_str) {
            Some("length") => Some(FinishReason::Length),
            Some(_) => Some(FinishReason::Stop),
            None => None,
        };
        // SGLang streams the stop token it matched (`matched_stop`, its id) as the last id; vLLM leaves
        // it out, and so does the agent: a stop token is not part of the reply.
        let matched_stop = choice.get("matched_stop").and_then(Value::as_u64);
        if chunk.finish_reason == Some(FinishReason::Stop)
            && matched_stop.is_some()
            && chunk.token_ids.last().map(|&id| u64::from(id)) == matched_stop
        {
            chunk.token_ids.pop();
        }
    }
    if let Some(usage) = value.get("usage").filter(|usage| !usage.is_null()) {
        let count = |field: &str| usage.get(field).and_then(Value::as_u64).unwrap_or(0).min(u32::MAX as u64) as u32;
        let cached = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .or_else(|| usage.get("cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(u32::MAX as u64) as u32;
        chunk.usage = Some(Usage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
            cached_tokens: cached,
        });
    }
    Ok(chunk)
}

/// The agent error an engine's error answer (`status`, JSON `body`) maps to: a request that can never run
/// (too long for the context, a bad parameter) is INVALID_ARGUMENT and not retried elsewhere; overload
/// (429, 503) is RESOURCE_EXHAUSTED, which the gateway retries on another replica; anything else is
/// UNAVAILABLE.
pub fn error_of(status: u16, body: &Value) -> GenerateError {
    let message = body
        .pointer("/error/message")
        .or_else(|| body.get("message"))
        .or_else(|| body.get("detail"))
        .map(|message| match message {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| body.to_string());
    let message: String = message.chars().take(500).collect();
    match status {
        400 | 404 | 413 | 422 => GenerateError::InvalidArgument(format!("the engine refused the request: {message}")),
        429 | 503 => GenerateError::Overloaded(format!("the engine is overloaded: {message}")),
        _ => GenerateError::Unavailable(format!("the engine answered {status}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use kvroute_proto::domain::{CacheMode, SamplingParams};

    use super::*;

    fn request() -> AgentGenerateRequest {
        AgentGenerateRequest {
            request_id: String::new(),
            prompt: vec![1, 2, 3],
            cache_scope: Vec::new(),
            cache_mode: CacheMode::Shared,
            sampling: SamplingParams { temperature: 0.5, top_p: 0.9, seed: Some(7) },
            max_tokens: 4,
            stop_token_ids: vec![9],
            ignore_eos: false,
        }
    }

    #[test]
    fn the_body_carries_the_token_ids_sampling_stop_and_salt() {
        let body = completion_body("m", &request(), Some("kvr-abc"));
        assert_eq!(body["prompt"], json!([1, 2, 3]));
        assert_eq!(body["max_tokens"], 4);
        assert_eq!(body["seed"], 7);
        assert_eq!(body["stop_token_ids"], json!([9]));
        assert_eq!(body["cache_salt"], "kvr-abc");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        let unsalted = completion_body("m", &request(), None);
        assert!(unsalted.get("cache_salt").is_none());
    }

    #[test]
    fn events_are_split_across_any_chunking() {
        let stream = b"data: {\"a\":1}\n\ndata: [DONE]\r\n\r\n: comment\n\n";
        for cut in 0..stream.len() {
            let mut decoder = SseDecoder::default();
            let mut payloads = decoder.feed(&stream[..cut]).unwrap();
            payloads.extend(decoder.feed(&stream[cut..]).unwrap());
            assert_eq!(payloads, ["{\"a\":1}", "[DONE]"], "cut at {cut}");
        }
    }

    #[test]
    fn chunks_give_ids_finish_and_usage() {
        let piece = r#"{"choices":[{"index":0,"text":" Paris","token_ids":[7042],"finish_reason":null}],"usage":null}"#;
        assert_eq!(decode_chunk(piece).unwrap(), Chunk { token_ids: vec![7042], ..Chunk::default() });
        let last = r#"{"choices":[{"index":0,"text":"","token_ids":[2],"finish_reason":"length"}]}"#;
        assert_eq!(decode_chunk(last).unwrap().finish_reason, Some(FinishReason::Length));
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":256}}}"#;
        let usage = decode_chunk(usage).unwrap().usage.unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens), (300, 5, 256));
        assert!(decode_chunk("[DONE]").unwrap().done);
        assert!(matches!(decode_chunk("{"), Err(GenerateError::Unavailable(_))));
        assert!(matches!(decode_chunk(r#"{"choices":[{"token_ids":[-1]}]}"#), Err(GenerateError::Unavailable(_))));
    }

    #[test]
    fn a_stop_token_sglang_streams_is_not_part_of_the_reply() {
        let last = r#"{"choices":[{"index":0,"text":"","finish_reason":"stop","matched_stop":2,"token_ids":[2]}]}"#;
        let chunk = decode_chunk(last).unwrap();
        assert_eq!((chunk.token_ids, chunk.finish_reason), (vec![], Some(FinishReason::Stop)));
        // A stop string (SGLang's matched_stop is then the string) keeps the ids.
        let text = r#"{"choices":[{"index":0,"finish_reason":"stop","matched_stop":"\n","token_ids":[198]}]}"#;
        assert_eq!(decode_chunk(text).unwrap().token_ids, vec![198]);
    }

    #[test]
    fn a_captured_vllm_stream_gives_its_five_token_ids_the_finish_and_the_cached_tokens() {
        let stream = include_bytes!("../../tests/fixtures/vllm/http/completions-stream-repeat.body");
        let mut decoder = SseDecoder::default();
        let chunks: Vec<Chunk> = stream
            .chunks(97)
            .flat_map(|piece| decoder.feed(piece).unwrap())
            .map(|payload| decode_chunk(&payload).unwrap())
            .collect();
        let ids: Vec<u32> = chunks.iter().flat_map(|chunk| chunk.token_ids.clone()).collect();
        assert_eq!(ids.len(), 5, "{chunks:?}");
        assert_eq!(ids[0], 7042, "\" Paris\" first");
        assert_eq!(chunks.iter().filter_map(|chunk| chunk.finish_reason).collect::<Vec<_>>(), [FinishReason::Length]);
        let usage = chunks.iter().find_map(|chunk| chunk.usage).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens), (295, 5, 256));
        assert!(chunks.last().unwrap().done);
    }

    #[test]
    fn captured_vllm_errors_map_to_invalid_argument() {
        for name in ["error-prompt-too-long", "error-cache-salt-slash", "error-unknown-model", "error-temperature"] {
            let path = format!("{}/tests/fixtures/vllm/http/{name}.json", env!("CARGO_MANIFEST_DIR"));
            let exchange: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let status = exchange["status"].as_u64().unwrap() as u16;
            let body_path = format!("{}/tests/fixtures/vllm/http/{name}.body", env!("CARGO_MANIFEST_DIR"));
            let body: Value = serde_json::from_slice(&std::fs::read(&body_path).unwrap()).unwrap();
            assert!(matches!(error_of(status, &body), GenerateError::InvalidArgument(_)), "{name}: {status} {body}");
        }
    }

    #[test]
    fn errors_map_to_what_the_gateway_does_with_them() {
        let too_long = json!({"error": {"message": "This model's maximum context length is 2048 tokens", "code": 400}});
        assert!(matches!(error_of(400, &too_long), GenerateError::InvalidArgument(m) if m.contains("2048")));
        assert!(matches!(error_of(503, &json!({"detail": "busy"})), GenerateError::Overloaded(_)));
        assert!(matches!(error_of(429, &json!({})), GenerateError::Overloaded(_)));
        assert!(matches!(error_of(500, &json!({})), GenerateError::Unavailable(_)));
        let streamed = r#"{"error":{"message":"overloaded","code":503}}"#;
        assert!(matches!(decode_chunk(streamed), Err(GenerateError::Overloaded(_))));
    }
}

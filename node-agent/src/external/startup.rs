//! What the agent checks before it serves an engine, each failure a clear error: the engine answers (it is
//! waited for, as it may still be loading), it serves the expected model, its block size is a multiple of
//! kvroute's 16 tokens, and it tokenizes exactly as the model directory's `tokenizer.json` does, text and
//! chats rendered with its chat template alike (a silent tokenizer or template mismatch makes every
//! routing decision score zero).

use std::path::Path;
use std::time::{Duration, Instant};

use std::sync::Arc;

use kvroute_chat::{ChatMessage, ChatRenderer};
use kvroute_proto::DEFAULT_BLOCK_SIZE;
use kvroute_proto::domain::{KvDtype, KvGeometry};
use kvroute_tokenizer::Tokenizer;
use serde_json::{Value, json};

use super::engine_metrics;
use super::http::Endpoint;
use super::{EngineFacts, EngineKind};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Strings whose token ids the engine and the agent must agree on: plain text, whitespace runs, digits,
/// non-ASCII, code, and the model's special tokens written out.
const PROBES: &[&str] = &[
    "The capital of France is",
    "  two  spaces,\ttabs\tand\nnew lines\n\n",
    "1234567890 3.14159 -42",
    "Grüße aus Köln, 東京 and naïve café ☕",
    "fn main() { println!(\"{}\", 1 + 1); }",
];

/// Conversations whose rendering (with a generation prompt) the engine and the agent must agree on: a
/// first turn, one with a system prompt and a reply, and non-ASCII text.
fn chat_probes() -> Vec<(&'static str, Vec<ChatMessage>)> {
    vec![
        ("a first user turn", vec![ChatMessage::new("user", "What is the capital of France?")]),
        (
            "a system prompt, a reply and a second turn",
            vec![
                ChatMessage::new("system", "You are a terse assistant."),
                ChatMessage::new("user", "Name a colour."),
                ChatMessage::new("assistant", "Blue."),
                ChatMessage::new("user", "  Another one,\n please. "),
            ],
        ),
        ("non-ASCII text", vec![ChatMessage::new("user", "Grüße aus Köln, 東京 ☕")]),
    ]
}

/// Waits up to `wait` for the engine to answer `GET /v1/models`.
pub async fn wait_for_engine(endpoint: &Endpoint, wait: Duration) -> anyhow::Result<Value> {
    let deadline = Instant::now() + wait;
    let mut last_log = Instant::now();
    loop {
        match endpoint.get_json("/v1/models", CALL_TIMEOUT).await {
            Ok(models) => return Ok(models),
            Err(error) if Instant::now() >= deadline => {
                anyhow::bail!("the engine at {} did not answer within {wait:?}: {error}", endpoint.url(""))
            }
            Err(error) => {
                if last_log.elapsed() >= Duration::from_secs(10) {
                    tracing::info!(url = %endpoint.url(""), %error, "waiting for the engine to answer");
                    last_log = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// The served model (its name and context length) out of `/v1/models`: `expected` when given, which must
/// be listed, else the only one listed.
pub fn served_model(models: &Value, expected: Option<&str>) -> anyhow::Result<(String, u32)> {
    let listed: Vec<&Value> =
        models.get("data").and_then(Value::as_array).map(|data| data.iter().collect()).unwrap_or_default();
    let names: Vec<&str> = listed.iter().filter_map(|model| model.get("id").and_then(Value::as_str)).collect();
    let chosen = match expected {
        Some(name) => listed
            .iter()
            .find(|model| model.get("id").and_then(Value::as_str) == Some(name))
            .ok_or_else(|| anyhow::anyhow!("the engine serves {names:?}, not the model {name:?} (--engine-model)"))?,
        None => match listed.as_slice() {
            [only] => only,
            _ => anyhow::bail!("the engine serves {names:?}: name the one to use with --engine-model"),
        },
    };
    let name = chosen.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    let max_model_len = chosen.get("max_model_len").and_then(Value::as_u64).unwrap_or(0).min(u32::MAX as u64) as u32;
    anyhow::ensure!(!name.is_empty(), "the engine's /v1/models lists a model without an id");
    Ok((name, max_model_len))
}

/// What the engine says of its KV cache and batch: the block size, the KV blocks (kvroute's, of 16 tokens)
/// and the sequences it runs at once at most (0: it does not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLimits {
    pub block_size: u32,
    pub kv_blocks: u64,
    pub max_running_requests: u32,
}

/// The engine's [`EngineLimits`]: vLLM's `cache_config_info` metric (vLLM publishes no cap on running
/// sequences), SGLang's `/server_info`. Refused unless the block size is a multiple of
/// [`DEFAULT_BLOCK_SIZE`].
pub async fn engine_limits(kind: EngineKind, endpoint: &Endpoint) -> anyhow::Result<EngineLimits> {
    let (block_size, blocks, max_running_requests) = match kind {
        EngineKind::Sglang => {
            let info = endpoint.get_json("/server_info", CALL_TIMEOUT).await.map_err(anyhow::Error::msg)?;
            let page = info.get("page_size").and_then(Value::as_u64).unwrap_or(1);
            let tokens = info.get("max_total_num_tokens").and_then(Value::as_u64).unwrap_or(0);
            (page as u32, tokens / page.max(1), sglang_max_running(&info))
        }
        _ => {
            let (status, body) = endpoint
                .call(hyper::Method::GET, "/metrics", None, CALL_TIMEOUT)
                .await
                .map_err(|error| anyhow::anyhow!("reading the engine's /metrics: {error}"))?;
            anyhow::ensure!(status == 200, "the engine's /metrics answered {status}");
            let gauges = engine_metrics::parse(&String::from_utf8_lossy(&body));
            let block_size = gauges.block_size.ok_or_else(|| {
                anyhow::anyhow!("the engine's /metrics has no vllm:cache_config_info with its block size")
            })?;
            (block_size, gauges.num_blocks.unwrap_or(0), 0)
        }
    };
    anyhow::ensure!(
        block_size > 0 && block_size % DEFAULT_BLOCK_SIZE == 0,
        "unsupported engine block size {block_size}: kvroute hashes blocks of {DEFAULT_BLOCK_SIZE} tokens, so the \
         engine's must be a multiple of {DEFAULT_BLOCK_SIZE} (vLLM --block-size, SGLang --page-size)"
    );
    Ok(EngineLimits {
        block_size,
        kv_blocks: blocks * u64::from(block_size / DEFAULT_BLOCK_SIZE),
        max_running_requests,
    })
}

/// SGLang's cap on running requests from its `/server_info`: `max_running_requests` when set, else what
/// its scheduler derived (`internal_states[0].effective_max_running_requests_per_dp`, per data-parallel
/// rank, times `dp_size`); 0 when neither is there.
fn sglang_max_running(info: &Value) -> u32 {
    let number = |value: Option<&Value>| value.and_then(Value::as_u64).filter(|n| *n > 0);
    let per_rank = number(info.get("max_running_requests")).map(|cap| (cap, 1)).or_else(|| {
        let state = info.get("internal_states").and_then(|states| states.get(0))?;
        let per_rank = number(state.get("effective_max_running_requests_per_dp"))?;
        Some((per_rank, number(info.get("dp_size")).unwrap_or(1)))
    });
    per_rank.map_or(0, |(cap, ranks)| cap.saturating_mul(ranks).min(u64::from(u32::MAX)) as u32)
}

/// The model directory's tokenizer (`tokenizer.json`, with `tokenizer_config.json` beside it).
pub fn load_tokenizer(model_dir: &Path) -> anyhow::Result<Tokenizer> {
    let path = model_dir.join("tokenizer.json");
    Tokenizer::from_tokenizer_json(&path).map_err(|error| anyhow::anyhow!("loading {}: {error}", path.display()))
}

/// Asks the engine to tokenize every probe and compares with `tokenizer`; the first difference is an
/// error naming the probe and both answers.
pub async fn check_tokenizer(endpoint: &Endpoint, model: &str, tokenizer: &Tokenizer) -> anyhow::Result<()> {
    let specials: Vec<String> = [tokenizer.bos_token_id()]
        .into_iter()
        .flatten()
        .chain(tokenizer.eos_token_ids().iter().copied())
        .filter_map(|id| tokenizer.decode(&[id]).ok().map(|text| format!("{text}user\nhello{text}")))
        .collect();
    for probe in PROBES.iter().copied().map(str::to_string).chain(specials) {
        let body = json!({"model": model, "prompt": probe, "add_special_tokens": false});
        let theirs = engine_tokens(endpoint, &body).await?;
        let ours: Vec<u64> = tokenizer.encode(&probe).into_iter().map(u64::from).collect();
        anyhow::ensure!(
            theirs == ours,
            "the engine tokenizes {probe:?} as {theirs:?}, the model directory's tokenizer as {ours:?}: gateways \
             would hash prompts into blocks the engine never holds (serve the same tokenizer on both)"
        );
    }
    Ok(())
}

/// Asks the engine to render and tokenize every chat probe with its chat template and compares with the
/// model directory's template, rendered as the gateway renders it; the first difference is an error
/// naming the conversation and where the two renderings part. Skipped (with a warning) when the model
/// directory has no chat template: the gateway then renders ChatML and sends the engine token ids.
pub async fn check_chat_template(endpoint: &Endpoint, model: &str, tokenizer: &Tokenizer) -> anyhow::Result<()> {
    let Some(template) = tokenizer.chat_template() else {
        tracing::warn!("the model directory has no chat template: gateways render chats as ChatML");
        return Ok(());
    };
    let renderer = ChatRenderer::new(Some(template), Arc::new(tokenizer.clone()))
        .map_err(|error| anyhow::anyhow!("the model directory's chat template: {error}"))?;
    for (name, messages) in chat_probes() {
        let text = renderer
            .render_text(&messages, &[], true)
            .map_err(|error| anyhow::anyhow!("rendering {name} with the model directory's chat template: {error}"))?;
        let ours: Vec<u64> = tokenizer.encode(&text).into_iter().map(u64::from).collect();
        let body =
            json!({"model": model, "messages": messages, "add_generation_prompt": true, "add_special_tokens": false});
        let theirs = engine_tokens(endpoint, &body).await?;
        if theirs != ours {
            let at = theirs.iter().zip(&ours).take_while(|(a, b)| a == b).count();
            let text_of = |ids: &[u64]| {
                let ids: Vec<u32> = ids.iter().skip(at).take(12).map(|&id| id as u32).collect();
                tokenizer.decode(&ids).unwrap_or_else(|_| format!("{ids:?}"))
            };
            anyhow::bail!(
                "the engine renders the chat probe \"{name}\" into {} tokens, the model directory's chat template \
                 into {}; they part at token {at}: the engine goes on {:?}, the model directory {:?} (serve the \
                 same chat template on both: tokenizer_config.json's chat_template, or vLLM --chat-template)",
                theirs.len(),
                ours.len(),
                text_of(&theirs),
                text_of(&ours),
            );
        }
    }
    Ok(())
}

/// The token ids the engine's `POST /tokenize` answers for `body`.
async fn engine_tokens(endpoint: &Endpoint, body: &Value) -> anyhow::Result<Vec<u64>> {
    let (status, answer) = endpoint
        .call(hyper::Method::POST, "/tokenize", Some(body), CALL_TIMEOUT)
        .await
        .map_err(|error| anyhow::anyhow!("asking the engine to tokenize: {error}"))?;
    anyhow::ensure!(status == 200, "the engine's /tokenize answered {status}: {}", super::http::lossy(&answer, 300));
    let answer: Value = serde_json::from_slice(&answer).map_err(|error| anyhow::anyhow!("/tokenize: {error}"))?;
    Ok(answer
        .get("tokens")
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default())
}

/// The KV geometry from the model directory's `config.json` (what a block costs to move between tiers);
/// zeros when it is not there.
pub fn kv_geometry(model_dir: &Path) -> KvGeometry {
    let config: Value = std::fs::read(model_dir.join("config.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null);
    let field = |name: &str| config.get(name).and_then(Value::as_u64).unwrap_or(0) as u32;
    let heads = field("num_attention_heads");
    let head_dim = match field("head_dim") {
        0 if heads > 0 => field("hidden_size") / heads,
        dim => dim,
    };
    let kv_heads = match field("num_key_value_heads") {
        0 => heads,
        kv => kv,
    };
    KvGeometry { num_layers: field("num_hidden_layers"), num_kv_heads: kv_heads, head_dim, dtype: KvDtype::Bf16 }
}

/// Everything above, in order: the facts the agent serves the engine with, and the tokenizer.
pub async fn discover(
    kind: EngineKind,
    endpoint: Endpoint,
    expected_model: Option<&str>,
    model_dir: &Path,
    wait: Duration,
) -> anyhow::Result<(EngineFacts, Tokenizer)> {
    let tokenizer = load_tokenizer(model_dir)?;
    let models = wait_for_engine(&endpoint, wait).await?;
    let (model, max_model_len) = served_model(&models, expected_model)?;
    let limits = engine_limits(kind, &endpoint).await?;
    check_tokenizer(&endpoint, &model, &tokenizer).await?;
    check_chat_template(&endpoint, &model, &tokenizer).await?;
    let facts = EngineFacts {
        kind,
        endpoint,
        model,
        max_model_len,
        engine_block_size: limits.block_size,
        kv_blocks_total: limits.kv_blocks,
        max_running_requests: limits.max_running_requests,
    };
    Ok((facts, tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_model_is_the_named_or_the_only_one() {
        let one = json!({"data": [{"id": "smollm2", "max_model_len": 2048}]});
        assert_eq!(served_model(&one, None).unwrap(), ("smollm2".into(), 2048));
        assert_eq!(served_model(&one, Some("smollm2")).unwrap().0, "smollm2");
        let error = served_model(&one, Some("llama")).unwrap_err().to_string();
        assert!(error.contains("not the model \"llama\""), "{error}");
        let two = json!({"data": [{"id": "a"}, {"id": "b"}]});
        assert!(served_model(&two, None).unwrap_err().to_string().contains("--engine-model"));
        assert_eq!(served_model(&two, Some("b")).unwrap(), ("b".into(), 0));
        assert!(served_model(&json!({}), None).is_err());
    }

    #[test]
    fn geometry_comes_from_config_json() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            json!({"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576});
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let geometry = kv_geometry(dir.path());
        assert_eq!((geometry.num_layers, geometry.num_kv_heads, geometry.head_dim), (30, 3, 64));
        assert_eq!(kv_geometry(Path::new("/nonexistent")).num_layers, 0);
    }

    #[test]
    fn sglangs_cap_on_running_requests_comes_from_its_server_info() {
        // A real SGLang 0.5.23 server's answer: no --max-running-requests given, its scheduler derived 2048.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sglang/http/server_info.json");
        let recorded: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(recorded["max_running_requests"], Value::Null);
        assert_eq!(sglang_max_running(&recorded), 2048);
        // Two data-parallel ranks run twice as many; a cap the operator set is the server's whole cap.
        let mut two_ranks = recorded.clone();
        two_ranks["dp_size"] = json!(2);
        assert_eq!(sglang_max_running(&two_ranks), 4096);
        let mut set = two_ranks;
        set["max_running_requests"] = json!(48);
        assert_eq!(sglang_max_running(&set), 48);
        assert_eq!(sglang_max_running(&json!({"page_size": 16})), 0);
        assert_eq!(sglang_max_running(&json!({"max_running_requests": "many", "internal_states": []})), 0);
    }
}

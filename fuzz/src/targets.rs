//! The fuzz targets: each feeds arbitrary bytes to one parser of outside bytes
//! exactly as the services call it, checks what must hold of the result, and
//! returns a short label of the outcome (the fuzzer keeps inputs whose label it
//! has not seen, a cheap stand-in for coverage). A panic is a finding.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use kvroute_gateway::chat::ChatRenderer;
use kvroute_gateway::http::handlers::{parse_json, spec_from};
use kvroute_gateway::http::openai::{ChatCompletionRequest, CompletionRequest, PromptInput};
use kvroute_gateway::routing::{IndexConfig, PrefixIndex, ReplicaId};
use kvroute_gateway::tenants::Tenant;
use kvroute_gateway::tokenizer::Tokenizer;
use kvroute_gateway::upstream::subscription::StreamCheck;
use kvroute_node_agent::engine_events::frames::{self, ReplayReply};
use kvroute_node_agent::engine_events::zmtp::{self, Codec, Limits, SocketType};
use kvroute_node_agent::engine_events::{EngineEvent, Source, Step, Translator, TranslatorConfig, decode_batch};
use kvroute_node_agent::tiers::resp::{Reply, parse_reply};
use kvroute_node_agent::tiers::resp_cluster;
use kvroute_proto::block_record::{self, Expected, ModelFingerprint};
use kvroute_proto::domain::{AgentGenerateRequest, AgentInfo, KvDtype, KvEvent, KvEventBatch, KvGeometry, LoadStats};
use kvroute_proto::gguf::GgufFile;
use kvroute_proto::{BlockHash, BlockHasher, pb};
use prost::Message;

/// A named target and the valid inputs its fuzzing starts from.
#[derive(Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]) -> String,
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Strings worth splicing into this target's inputs.
    pub dictionary: &'static [&'static str],
}

impl Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Every target.
pub fn all() -> Vec<Target> {
    vec![
        Target { name: "request_json", run: request_json, seeds: request_json_seeds, dictionary: JSON_WORDS },
        Target { name: "wire_messages", run: wire_messages, seeds: wire_message_seeds, dictionary: &[] },
        Target { name: "event_stream", run: event_stream, seeds: event_stream_seeds, dictionary: &[] },
        Target { name: "block_record", run: block_record, seeds: block_record_seeds, dictionary: &["KVRB"] },
        Target { name: "redis_reply", run: redis_reply, seeds: redis_reply_seeds, dictionary: RESP_WORDS },
        Target { name: "gguf", run: gguf, seeds: gguf_seeds, dictionary: &["GGUF", "tokenizer.ggml.tokens"] },
        Target { name: "engine_events", run: engine_events, seeds: engine_events_seeds, dictionary: ENGINE_WORDS },
        Target { name: "engine_http", run: engine_http, seeds: engine_http_seeds, dictionary: ENGINE_HTTP_WORDS },
    ]
}

/// The target called `name`.
pub fn by_name(name: &str) -> Option<Target> {
    all().into_iter().find(|target| target.name == name)
}

/// A label from an error message: the first words of its first and last `: ` parts (serde puts the field path
/// between them), plain words before any quote only, so one kind of error is one label whatever the input.
fn label(prefix: &str, message: &str) -> String {
    let message = message.split(['"', '\'', '`']).next().unwrap_or("");
    let words = |text: &str| -> String {
        let plain: Vec<&str> = text
            .split_whitespace()
            .filter(|word| word.len() <= 10 && word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .take(3)
            .collect();
        plain.join(" ")
    };
    let first = message.split(": ").next().unwrap_or(message);
    let last = message.rsplit(": ").next().unwrap_or(message);
    format!("{prefix}: {} | {}", words(first), words(last))
}

// ---------------------------------------------------------------------------------------------------------
// request_json: the body of POST /v1/completions and /v1/chat/completions, then chat rendering, tokenizing,
// validation and block hashing, as the HTTP handlers run them.

const JSON_WORDS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "4294967296",
    "18446744073709551616",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "\"prompt\"",
    "\"messages\"",
    "\"role\"",
    "\"content\"",
    "\"tools\"",
    "\"tool_calls\"",
    "\"function\"",
    "\"max_tokens\"",
    "\"max_completion_tokens\"",
    "\"temperature\"",
    "\"top_p\"",
    "\"seed\"",
    "\"stop\"",
    "\"stream\"",
    "\"stream_options\"",
    "\"include_usage\"",
    "\"user\"",
    "\"model\"",
    "\"n\"",
    "\"cache_salt\"",
    "\"assistant\"",
    "\"system\"",
    "\"tool\"",
    "{{",
    "{%",
    "<|im_start|>",
    "<|endoftext|>",
];

fn tokenizer() -> &'static Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER.get_or_init(|| Arc::new(Tokenizer::builtin()))
}

fn renderer() -> &'static ChatRenderer {
    static RENDERER: OnceLock<ChatRenderer> = OnceLock::new();
    RENDERER.get_or_init(|| {
        ChatRenderer::new(tokenizer().chat_template(), tokenizer().clone()).expect("the built-in template compiles")
    })
}

/// Validates, hashes and labels a prompt as the handlers do after parsing.
fn finish_request(kind: &str, common: &kvroute_gateway::http::openai::CommonParams, prompt: Vec<u32>) -> String {
    match spec_from(common, Tenant::anonymous(), prompt, 16) {
        Ok(spec) => {
            if let Some(scope) = spec.tenant.scope(spec.cache_salt.as_deref()) {
                let hashes = BlockHasher::new(16, "fuzz", &scope).hashes(&spec.prompt);
                assert_eq!(hashes.len(), spec.prompt.len() / 16, "one hash per full block");
            }
            format!("{kind} ok")
        }
        Err(error) => label(kind, &error.to_string()),
    }
}

fn request_json(data: &[u8]) -> String {
    let completion = match parse_json::<CompletionRequest>(data) {
        Ok(request) => {
            let prompt = match request.prompt {
                PromptInput::Text(text) => tokenizer().encode(&text),
                PromptInput::Tokens(ids) => ids,
                PromptInput::Texts(texts) => texts.first().map(|text| tokenizer().encode(text)).unwrap_or_default(),
                PromptInput::TokenLists(lists) => lists.into_iter().next().unwrap_or_default(),
            };
            finish_request("completion", &request.common, prompt)
        }
        Err(error) => label("completion", &error.to_string()),
    };
    let chat = match parse_json::<ChatCompletionRequest>(data) {
        Ok(request) => match renderer().render_tokens(&request.messages, &request.tools, true) {
            Ok(prompt) => {
                let text = tokenizer().decode(&prompt);
                assert!(text.is_ok() || prompt.iter().any(|&id| id >= tokenizer().vocab_size()));
                finish_request("chat", &request.common, prompt)
            }
            Err(error) => label("chat render", &error.to_string()),
        },
        Err(error) => label("chat", &error.to_string()),
    };
    format!("{completion} | {chat}")
}

fn request_json_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}"#,
        r#"{"prompt": [1, 2, 3, 4], "max_tokens": 1, "stop": ["\n", "."], "seed": 7, "user": "u"}"#,
        r#"{"model": "m", "prompt": ["one"], "stream": true, "stream_options": {"include_usage": true}}"#,
        r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 4, "top_p": 0.5, "cache_salt": "s"}"#,
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}"#,
    ]
    .iter()
    .map(|text| text.as_bytes().to_vec())
    .collect()
}

// ---------------------------------------------------------------------------------------------------------
// wire_messages: protobuf bytes of the agent's messages into domain types; a message that converts must
// convert back to the same value.

fn round_trip<W, D>(kind: &str, bytes: &[u8]) -> String
where
    W: Message + Default + From<D>,
    D: TryFrom<W> + Clone + Debug,
    <D as TryFrom<W>>::Error: std::fmt::Display,
{
    let wire = match W::decode(bytes) {
        Ok(wire) => wire,
        Err(error) => return label(kind, &error.to_string()),
    };
    match D::try_from(wire) {
        Ok(domain) => {
            let again = D::try_from(W::from(domain.clone()))
                .unwrap_or_else(|error| panic!("{kind}: a converted message does not convert back: {error}"));
            assert_eq!(format!("{domain:?}"), format!("{again:?}"), "{kind}: the round trip changed the value");
            format!("{kind} ok")
        }
        Err(error) => label(kind, &error.to_string()),
    }
}

fn wire_messages(data: &[u8]) -> String {
    let Some((&kind, bytes)) = data.split_first() else { return "empty".into() };
    match kind % 6 {
        0 => round_trip::<pb::AgentGenerateRequest, AgentGenerateRequest>("generate request", bytes),
        1 => round_trip::<pb::KvEventBatch, KvEventBatch>("event batch", bytes),
        2 => round_trip::<pb::InfoResponse, AgentInfo>("info", bytes),
        3 => round_trip::<pb::LoadStats, LoadStats>("load", bytes),
        4 => round_trip::<pb::KvEvent, KvEvent>("event", bytes),
        _ => round_trip::<pb::KvGeometry, KvGeometry>("geometry", bytes),
    }
}

fn sample_batch(epoch: u64, seq: u64, events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        agent_id: "agent-0".into(),
        epoch,
        seq,
        snapshot: seq == 0,
        events,
        load: LoadStats { kv_blocks_total: 512, prefill_tokens_per_second: 2000.0, ..LoadStats::default() },
        sent_unix_micros: 1,
        finished_request_ids: Vec::new(),
        next_request_id: seq,
    }
}

fn chain(len: usize, variant: u32) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..len as u32 * 16).map(|i| i * 31 + variant).collect();
    BlockHasher::new(16, "fuzz", b"").hashes(&tokens)
}

fn wire_message_seeds() -> Vec<Vec<u8>> {
    let request = pb::AgentGenerateRequest {
        request_id: "r1".into(),
        prompt_token_ids: vec![1, 2, 3],
        cache_scope: b"tenant".to_vec(),
        max_tokens: 4,
        stop_token_ids: vec![2],
        sampling: Some(pb::SamplingParams { temperature: 0.7, top_p: 0.9, seed: Some(3) }),
        ..Default::default()
    };
    let batch = pb::KvEventBatch::from(sample_batch(
        3,
        0,
        vec![KvEvent::Stored { tier: kvroute_proto::domain::Tier::Gpu, hashes: chain(3, 1) }],
    ));
    let geometry = KvGeometry { num_layers: 4, num_kv_heads: 2, head_dim: 32, dtype: KvDtype::F32 };
    let info = pb::InfoResponse {
        agent_id: "agent-0".into(),
        epoch: 9,
        model_id: "tiny-random".into(),
        block_size: 16,
        kv_geometry: Some(pb::KvGeometry::from(geometry)),
        vocab_size: 100,
        max_context_tokens: 4096,
        kv_blocks_total: 512,
        ..Default::default()
    };
    let mut seeds = Vec::new();
    for (kind, bytes) in [
        (0u8, request.encode_to_vec()),
        (1, batch.encode_to_vec()),
        (2, info.encode_to_vec()),
        (3, pb::LoadStats::from(sample_batch(0, 0, vec![]).load).encode_to_vec()),
        (4, batch.events[0].encode_to_vec()),
        (5, pb::KvGeometry::from(geometry).encode_to_vec()),
    ] {
        seeds.push([vec![kind], bytes].concat());
    }
    seeds
}

// ---------------------------------------------------------------------------------------------------------
// event_stream: length-prefixed KvEventBatch messages of two agents' streams, checked as the gateway's
// subscription checks them and applied to a small prefix index; lookups stay within the request.

fn event_stream(data: &[u8]) -> String {
    let index = PrefixIndex::new(IndexConfig { max_entries: 64, max_replicas: 2, pending_slots: 16 })
        .expect("a valid index configuration");
    let mut checks = [StreamCheck::new(7), StreamCheck::new(7)];
    let mut broken = [false, false];
    let mut seen: Vec<BlockHash> = Vec::new();
    let mut rest = data;
    let mut kinds = std::collections::BTreeSet::new();
    while rest.len() >= 3 {
        let replica = usize::from(rest[0] & 1);
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let (frame, tail) = rest[3..].split_at(len);
        rest = tail;
        let Ok(message) = pb::KvEventBatch::decode(frame) else {
            kinds.insert("undecodable");
            continue;
        };
        if broken[replica] {
            // A broken stream is resubscribed: a fresh check, and its snapshot replaces the replica's state.
            checks[replica] = StreamCheck::new(7);
            broken[replica] = false;
        }
        match checks[replica].accept(message) {
            Ok(batch) => {
                for event in &batch.events {
                    if let KvEvent::Stored { hashes, .. } | KvEvent::Removed { hashes, .. } = event {
                        seen.extend(hashes.iter().take(32));
                    }
                }
                index.apply_batch(replica as ReplicaId, &batch).expect("replica ids 0 and 1 are in range");
                kinds.insert(if batch.snapshot { "snapshot" } else { "delta" });
            }
            Err(reason) => {
                broken[replica] = true;
                kinds.insert(if reason.starts_with("invalid") { "invalid" } else { "out of order" });
            }
        }
    }
    seen.truncate(256);
    let result = index.lookup(&seen, 0);
    for replica in 0..2 {
        let found = result.get(replica);
        assert!(found.total_blocks() as usize <= seen.len(), "a lookup matches at most the blocks asked: {found:?}");
    }
    let kinds: Vec<&str> = kinds.into_iter().collect();
    format!("stream: {}", kinds.join(" "))
}

fn frame(replica: u8, message: &pb::KvEventBatch) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let len = u16::try_from(bytes.len()).expect("seed frames are small");
    [vec![replica], len.to_le_bytes().to_vec(), bytes].concat()
}

fn event_stream_seeds() -> Vec<Vec<u8>> {
    use kvroute_proto::domain::Tier;
    let a = chain(4, 1);
    let b = chain(4, 2);
    let stream = [
        frame(0, &sample_batch(7, 0, vec![KvEvent::Stored { tier: Tier::Gpu, hashes: a.clone() }]).into()),
        frame(1, &sample_batch(7, 0, vec![KvEvent::Stored { tier: Tier::Host, hashes: b.clone() }]).into()),
        frame(0, &sample_batch(7, 1, vec![KvEvent::Removed { tier: Tier::Gpu, hashes: a[2..].to_vec() }]).into()),
        frame(0, &sample_batch(7, 2, vec![KvEvent::Stored { tier: Tier::Host, hashes: a[2..].to_vec() }]).into()),
        frame(1, &sample_batch(7, 1, vec![KvEvent::Stored { tier: Tier::Network, hashes: a.clone() }]).into()),
        frame(1, &sample_batch(7, 2, vec![KvEvent::Cleared { tier: Tier::Host }]).into()),
    ];
    vec![stream.concat(), stream[..2].concat()]
}

// ---------------------------------------------------------------------------------------------------------
// block_record: a record read from the shared tier. Any bytes either verify or are refused; a record
// written by `encode` always verifies and gives back its payload.

fn record_fingerprint() -> ModelFingerprint {
    let geometry = KvGeometry { num_layers: 4, num_kv_heads: 2, head_dim: 32, dtype: KvDtype::F32 };
    ModelFingerprint::new("tiny-random", &geometry, 16)
}

fn block_record(data: &[u8]) -> String {
    let fingerprint = record_fingerprint();
    let hash = BlockHash([7; 16]);
    let payload_len = data.len().saturating_sub(block_record::HEADER_LEN) as u64;
    let expected = Expected { fingerprint: &fingerprint, block_size: 16, hash: &hash, payload_len };
    let outcome = match block_record::decode(data, &expected) {
        Ok(payload) => {
            assert_eq!(block_record::encode(&fingerprint, 16, &hash, payload), data, "a verified record is canonical");
            "record ok".to_string()
        }
        Err(error) => label("record", &error.to_string()),
    };
    let written = block_record::encode(&fingerprint, 16, &hash, data);
    let expected = Expected { payload_len: data.len() as u64, ..expected };
    assert_eq!(block_record::decode(&written, &expected).ok(), Some(data), "an encoded record verifies");
    outcome
}

fn block_record_seeds() -> Vec<Vec<u8>> {
    let fingerprint = record_fingerprint();
    vec![
        block_record::encode(&fingerprint, 16, &BlockHash([7; 16]), &[1, 2, 3, 4, 5, 6, 7, 8]),
        block_record::encode(&fingerprint, 16, &BlockHash([7; 16]), &[]),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// redis_reply: bytes from a Redis server, parsed reply after reply as the agent's client does; error
// replies also as a cluster's redirections, and the bytes as a key to find the slot of.

const RESP_WORDS: &[&str] = &[
    "\r\n",
    "+OK",
    "-ERR",
    ":",
    "$",
    "$-1",
    "*",
    "-1",
    "9223372036854775807",
    "$99999999",
    "-MOVED ",
    "-ASK ",
    "{",
    "}",
];

fn redis_reply(data: &[u8]) -> String {
    assert!(resp_cluster::key_slot(data) < resp_cluster::SLOTS);
    let mut rest = data;
    let mut replies = 0;
    loop {
        match parse_reply(rest, 1 << 16) {
            Ok(Some((reply, used))) => {
                if let Reply::Error(text) = &reply {
                    resp_cluster::redirect_of(text);
                }
                assert!(used > 0 && used <= rest.len(), "a reply takes between 1 and all of the bytes: {used}");
                rest = &rest[used..];
                replies += 1;
            }
            Ok(None) if rest.is_empty() => return format!("{} replies, ok", replies.min(3)),
            Ok(None) => return format!("{} replies, incomplete", replies.min(3)),
            Err(error) => return label(&format!("{} replies", replies.min(3)), &error.to_string()),
        }
    }
}

fn redis_reply_seeds() -> Vec<Vec<u8>> {
    vec![
        b"+OK\r\n:42\r\n$5\r\nhello\r\n$-1\r\n-ERR wrong\r\n".to_vec(),
        b"$3\r\nab".to_vec(),
        b"-MOVED 3999 127.0.0.1:6381\r\n-ASK 1 [::1]:7000\r\n".to_vec(),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// gguf: a model file's header, metadata and tensor table, then the tokenizer built from it.

fn gguf(data: &[u8]) -> String {
    match GgufFile::parse(data.to_vec()) {
        Ok(file) => match Tokenizer::from_gguf(&file) {
            Ok(_) => "tokenizer ok".into(),
            Err(error) => label("tokenizer", &error.to_string()),
        },
        Err(error) => label("gguf", &error.to_string()),
    }
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    // GGUF v3 with two metadata entries and no tensors.
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes());
    let string = |out: &mut Vec<u8>, text: &str| {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    };
    string(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes());
    string(&mut out, "llama");
    string(&mut out, "tokenizer.ggml.tokens");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes());
    string(&mut out, "a");
    string(&mut out, "b");
    vec![out]
}

// ---------------------------------------------------------------------------------------------------------
// engine_events: bytes from an engine's ZeroMQ sockets. The same input goes to the ZMTP codec (as a PUB's
// stream, cut into chunks whose size the first byte picks; each whole message read as a published batch
// and as a replay answer, its payload decoded and translated) and, whole, to the payload decoder and a
// translator. What the translator emits, applied to sets, must equal its snapshot.

const ENGINE_WORDS: &[&str] = &[
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_name",
    "medium",
    "extra_keys",
    "cache_salt",
    "metadata",
    "group_idx",
    "GPU",
    "CPU_PINNED",
    "NULL",
    "READY",
    "Socket-Type",
    "PUB",
    "PING",
];

const ENGINE_FIXTURES: [&[u8]; 5] = [
    include_bytes!("../../node-agent/tests/fixtures/engine_events/vllm_0_32_stored.msgpack"),
    include_bytes!("../../node-agent/tests/fixtures/engine_events/vllm_0_32_mixed.msgpack"),
    include_bytes!("../../node-agent/tests/fixtures/engine_events/vllm_positional.msgpack"),
    include_bytes!("../../node-agent/tests/fixtures/engine_events/sglang_positional.msgpack"),
    include_bytes!("../../node-agent/tests/fixtures/engine_events/sglang_map.msgpack"),
];

fn engine_translator() -> Translator {
    let mut translator = Translator::new(TranslatorConfig::new("fuzz", 16)).expect("a valid configuration");
    // The scope of the fixtures' salt.
    translator.register_scope(b"t:acme");
    translator
}

/// Applies `payload` as batch `seq`, checking the emitted events against the translator's snapshot.
fn translate(translator: &mut Translator, shadow: &mut [HashSet<BlockHash>; 3], seq: u64, payload: &[u8]) -> String {
    let batch = match decode_batch(payload) {
        Ok(batch) => batch,
        Err(error) => return label("payload", &error.to_string()),
    };
    let events = match translator.apply(seq, &batch, Source::Live) {
        Step::Events(events) => events,
        Step::Gap { .. } => return "payload gap".into(),
        Step::Duplicate => return "payload duplicate".into(),
        Step::Restart => return "payload restart".into(),
    };
    for event in events {
        match event {
            KvEvent::Stored { tier, hashes } => shadow[tier.index()].extend(hashes),
            KvEvent::Removed { tier, hashes } => hashes.iter().for_each(|hash| {
                shadow[tier.index()].remove(hash);
            }),
            KvEvent::Cleared { tier } => shadow[tier.index()].clear(),
        }
    }
    let mut snapshot: [HashSet<BlockHash>; 3] = Default::default();
    for event in translator.snapshot() {
        let KvEvent::Stored { tier, hashes } = event else { panic!("a snapshot only stores") };
        for hash in hashes {
            assert!(snapshot[tier.index()].insert(hash), "a snapshot lists a block twice");
        }
    }
    assert_eq!(&snapshot, shadow, "the events and the snapshot disagree");
    "payload ok".into()
}

fn engine_events(data: &[u8]) -> String {
    // The ZMTP path.
    let chunk = usize::from(data.first().copied().unwrap_or(0) % 64) + 1;
    let limits = Limits { max_message_bytes: 1 << 16, max_frames: 8, max_command_bytes: 1 << 10 };
    let mut codec = Codec::new(SocketType::Sub, limits);
    let mut translator = engine_translator();
    let mut shadow: [HashSet<BlockHash>; 3] = Default::default();
    let mut stream = "zmtp ok".to_string();
    let mut payloads = BTreeSet::new();
    for piece in data.get(1..).unwrap_or_default().chunks(chunk) {
        if let Err(error) = codec.feed(piece) {
            stream = label("zmtp", &error.to_string());
            break;
        }
        while let Some(message) = codec.next_message() {
            assert!(message.len() <= limits.max_frames, "a message over the frame limit");
            let bytes: usize = message.iter().map(Vec::len).sum();
            assert!(bytes <= limits.max_message_bytes, "a message over the size limit");
            if let Ok(ReplayReply::Batch(published)) = frames::replay_reply(&message) {
                assert!(published.seq != u64::MAX, "the end marker is no batch");
            }
            if let Ok(published) = frames::published(&message) {
                payloads.insert(translate(&mut translator, &mut shadow, published.seq, published.payload));
            }
        }
    }
    if stream == "zmtp ok" && !codec.is_ready() {
        stream = "zmtp handshaking".into();
    }
    // The payload path: the input twice, the second time as the next batch (storing again changes nothing).
    let mut translator = engine_translator();
    let mut shadow: [HashSet<BlockHash>; 3] = Default::default();
    let first = translate(&mut translator, &mut shadow, 0, data);
    let held = shadow.clone();
    let again = translate(&mut translator, &mut shadow, 1, data);
    if first == "payload ok" {
        assert_eq!(again, "payload ok", "a batch that applied once applies again");
        // Storing what is held changes nothing.
        let only_stores = decode_batch(data)
            .is_ok_and(|batch| batch.events.iter().all(|event| matches!(event, EngineEvent::Stored(_))));
        if only_stores {
            assert_eq!(shadow, held, "a batch of stores applied twice holds more than once");
        }
    }
    let payloads: Vec<String> = payloads.into_iter().take(2).collect();
    format!("{stream} [{}] | {first}", payloads.join(", "))
}

fn engine_events_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = ENGINE_FIXTURES.iter().map(|payload| payload.to_vec()).collect();
    // A PUB's stream: greeting and READY, a PING, then published batches (after the chunk-size byte).
    let mut stream = vec![7];
    stream.extend(zmtp::peer_handshake((3, 1), "PUB"));
    stream.extend([0x04, 0x07, 0x04, b'P', b'I', b'N', b'G', 0x00, 0x0a]);
    for (seq, payload) in ENGINE_FIXTURES[..2].iter().enumerate() {
        stream.extend(zmtp::message_bytes(&[b"kv", &(seq as u64).to_be_bytes(), payload]));
    }
    seeds.push(stream);
    // A ROUTER's replay answers, as a DEALER reads them.
    let mut replay = vec![0];
    replay.extend(zmtp::peer_handshake((3, 0), "PUB"));
    replay.extend(zmtp::message_bytes(&[b"", b"kv", &0u64.to_be_bytes(), ENGINE_FIXTURES[3]]));
    replay.extend(zmtp::message_bytes(&[b"", b"", &frames::END_SEQ, b""]));
    seeds.push(replay);
    // Payloads a real vLLM 0.32 server published (the fixture files' frames: a 4-byte length, then the bytes).
    for capture in VLLM_CAPTURES {
        let mut frames = Vec::new();
        let mut rest = capture;
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = (u32::from_be_bytes(*len) as usize).min(tail.len());
            frames.push(&tail[..len]);
            rest = &tail[len..];
        }
        if let Some(payload) = frames.last() {
            seeds.push(payload.to_vec());
        }
    }
    seeds
}

const VLLM_CAPTURES: [&[u8]; 3] = [
    include_bytes!("../../node-agent/tests/fixtures/vllm/events/01-stored-fresh.zmq"),
    include_bytes!("../../node-agent/tests/fixtures/vllm/events/02-stored-with-parent.zmq"),
    include_bytes!("../../node-agent/tests/fixtures/vllm/events/08-cleared.zmq"),
];

// ---------------------------------------------------------------------------------------------------------
// engine_http: what an engine server beside an agent answers over HTTP: a completion's server-sent events
// (split into chunks whose size the first byte picks, each payload decoded) and its Prometheus metrics.

const ENGINE_HTTP_WORDS: &[&str] = &[
    "data: ",
    "[DONE]",
    "\n\n",
    "choices",
    "token_ids",
    "finish_reason",
    "usage",
    "prompt_tokens_details",
    "cached_tokens",
    "error",
    "vllm:num_requests_running",
    "vllm:cache_config_info",
    "block_size=\"",
    "process_start_time_seconds",
];

fn engine_http_seeds() -> Vec<Vec<u8>> {
    vec![
        include_bytes!("../../node-agent/tests/fixtures/vllm/http/completions-stream-repeat.body").to_vec(),
        include_bytes!("../../node-agent/tests/fixtures/vllm/http/metrics.body").to_vec(),
        b"data: {\"error\":{\"message\":\"x\",\"code\":503}}\n\n".to_vec(),
    ]
}

fn engine_http(input: &[u8]) -> String {
    use kvroute_node_agent::external::{engine_metrics, openai};
    let chunk = usize::from(input.first().copied().unwrap_or(1).max(1));
    let mut decoder = openai::SseDecoder::default();
    let mut outcome = String::from("sse");
    for piece in input.chunks(chunk) {
        match decoder.feed(piece) {
            Ok(payloads) => {
                for payload in payloads {
                    match openai::decode_chunk(&payload) {
                        Ok(decoded) if decoded.done => outcome.push_str(" done"),
                        Ok(decoded) if decoded.usage.is_some() => outcome.push_str(" usage ok"),
                        Ok(_) => outcome.push_str(" ok"),
                        Err(_) => outcome.push_str(" error"),
                    }
                }
            }
            Err(_) => return "sse too long".into(),
        }
    }
    let gauges = engine_metrics::parse(&String::from_utf8_lossy(input));
    if let Some(usage) = gauges.kv_usage {
        assert!((0.0..=1.0).contains(&usage), "kv usage {usage} outside [0, 1]");
    }
    format!("{outcome} gauges {}", u8::from(gauges.running.is_some()) + u8::from(gauges.block_size.is_some()))
}

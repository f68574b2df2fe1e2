//! Decoding of an engine's KV-event payload (the last frame of each published message) into
//! [`EngineBatch`]: vLLM's and SGLang's layouts, old and new.
//!
//! The batch is `[ts, [event, ...], data_parallel_rank]` (the rank optional; newer vLLM main may send
//! it as a map with those keys). Each event is either positional, `["BlockStored", field, ...]` (msgspec
//! `array_like=True, tag=True`: vLLM before 0.26-ish and SGLang), or a map whose `type` names it (vLLM
//! 0.26 on, SGLang after its map change). Positional `BlockStored` fields, in vLLM's order:
//!
//! ```text
//! 1 block_hashes  2 parent_block_hash  3 token_ids  4 block_size  5 lora_id  6 medium
//! 7 lora_name (vLLM) or metadata {"cache_salt": ..} (SGLang)  8 extra_keys  9 group_idx  (more ignored)
//! ```
//!
//! `BlockRemoved` is `block_hashes, medium, group_idx`; `AllBlocksCleared` has no fields (a `medium`, if
//! any, is read). Missing trailing fields and nil mean absent. Unknown fields and unknown event types are
//! ignored (unknown types are counted); a field this module reads that has the wrong type makes the whole
//! payload an error, never a panic.

use thiserror::Error;

use super::msgpack::{self, MsgpackError, Value};

/// An engine's name for one of its blocks: opaque, compared for equality only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineKey {
    /// An integer hash. vLLM sends the low 64 bits unsigned, SGLang a signed 64-bit value; a negative one
    /// is kept as its two's-complement bits.
    Int(u64),
    /// A hash sent as bytes (vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: the whole digest).
    Bytes(Box<[u8]>),
}

/// One decoded payload.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineBatch {
    pub ts: f64,
    pub events: Vec<EngineEvent>,
    pub data_parallel_rank: Option<i64>,
    /// Events of a type this module does not know, skipped.
    pub unknown_events: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    Stored(BlockStored),
    Removed(BlockRemoved),
    Cleared(AllBlocksCleared),
}

/// Blocks the engine cached: `block_hashes[i]` holds `token_ids[i * block_size..][..block_size]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    pub block_hashes: Vec<EngineKey>,
    /// The block before the first one here; `None` starts a chain.
    pub parent_block_hash: Option<EngineKey>,
    /// Empty when the engine does not send them (a lower tier's copy of blocks it already announced).
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    pub medium: Option<String>,
    /// vLLM: one entry per block, what its hash covers besides the tokens (LoRA name, multimodal
    /// identifiers, the cache salt on a request's first block, prompt-embedding digests).
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
    /// SGLang: the request's cache salt (an event field of its own, or in the event's metadata).
    pub cache_salt: Option<String>,
    pub group_idx: Option<i64>,
}

/// One element of a block's extra keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string: a LoRA name or a cache salt (vLLM sends both bare).
    Text(String),
    /// Anything else: a multimodal `(identifier, offset)` pair, a digest.
    Other,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<EngineKey>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllBlocksCleared {
    pub medium: Option<String>,
}

/// A payload that is not an event batch.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error(transparent)]
    Msgpack(#[from] MsgpackError),
    #[error("event batch: {0}")]
    Batch(&'static str),
    #[error("event {index}: {reason}")]
    Event { index: usize, reason: &'static str },
    #[error("event {index} ({kind}): field {field}: {reason}")]
    Field { index: usize, kind: &'static str, field: &'static str, reason: &'static str },
}

/// Decodes one payload.
pub fn decode_batch(payload: &[u8]) -> Result<EngineBatch, DecodeError> {
    let value = msgpack::parse(payload)?;
    let (ts, events, rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            value.get("ts"),
            value.get("events"),
            value.get("data_parallel_rank").or_else(|| value.get("attn_dp_rank")),
        ),
        _ => return Err(DecodeError::Batch("neither an array nor a map")),
    };
    let ts = match ts {
        Some(Value::Float(ts)) => *ts,
        Some(Value::Uint(ts)) => *ts as f64,
        Some(Value::Int(ts)) => *ts as f64,
        _ => return Err(DecodeError::Batch("ts is not a number")),
    };
    let Some(events) = events.and_then(Value::as_array) else {
        return Err(DecodeError::Batch("events is not an array"));
    };
    let data_parallel_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(value) => Some(integer(value).ok_or(DecodeError::Batch("data_parallel_rank is not an integer"))?),
    };
    let mut batch = EngineBatch { ts, events: Vec::with_capacity(events.len()), data_parallel_rank, unknown_events: 0 };
    for (index, event) in events.iter().enumerate() {
        match decode_event(index, event)? {
            Some(event) => batch.events.push(event),
            None => batch.unknown_events += 1,
        }
    }
    Ok(batch)
}

/// An event's fields, by position or by name.
enum Fields<'v, 'a> {
    Positional(&'v [Value<'a>]),
    Named(&'v Value<'a>),
}

impl<'v, 'a> Fields<'v, 'a> {
    /// Field `position` of a positional event or `name` of a map; nil counts as absent.
    fn get(&self, position: usize, name: &str) -> Option<&'v Value<'a>> {
        let value = match self {
            Fields::Positional(items) => items.get(position),
            Fields::Named(map) => map.get(name),
        };
        value.filter(|value| !value.is_nil())
    }
}

/// One event: `None` for a type this module does not know.
fn decode_event(index: usize, event: &Value<'_>) -> Result<Option<EngineEvent>, DecodeError> {
    let (tag, fields) = match event {
        Value::Array(items) => (items.first().and_then(Value::as_str), Fields::Positional(items)),
        Value::Map(_) => (event.get("type").and_then(Value::as_str), Fields::Named(event)),
        _ => return Err(DecodeError::Event { index, reason: "neither an array nor a map" }),
    };
    let Some(tag) = tag else { return Err(DecodeError::Event { index, reason: "no type tag" }) };
    let field = |kind: &'static str| {
        move |field: &'static str, reason: &'static str| DecodeError::Field { index, kind, field, reason }
    };
    Ok(Some(match tag {
        "BlockStored" => EngineEvent::Stored(block_stored(&fields, field("BlockStored"))?),
        "BlockRemoved" => {
            let error = field("BlockRemoved");
            let Some(hashes) = fields.get(1, "block_hashes") else {
                return Err(error("block_hashes", "missing"));
            };
            EngineEvent::Removed(BlockRemoved {
                block_hashes: keys(hashes).ok_or_else(|| error("block_hashes", "not a list of hashes"))?,
                medium: optional_text(fields.get(2, "medium")).ok_or_else(|| error("medium", "not a string"))?,
                group_idx: optional_integer(fields.get(3, "group_idx"))
                    .ok_or_else(|| error("group_idx", "not an integer"))?,
            })
        }
        "AllBlocksCleared" => EngineEvent::Cleared(AllBlocksCleared {
            medium: optional_text(fields.get(1, "medium"))
                .ok_or_else(|| field("AllBlocksCleared")("medium", "not a string"))?,
        }),
        _ => return Ok(None),
    }))
}

fn block_stored(
    fields: &Fields<'_, '_>,
    error: impl Fn(&'static str, &'static str) -> DecodeError,
) -> Result<BlockStored, DecodeError> {
    let Some(hashes) = fields.get(1, "block_hashes") else { return Err(error("block_hashes", "missing")) };
    let block_hashes = keys(hashes).ok_or_else(|| error("block_hashes", "not a list of hashes"))?;
    let parent_block_hash = match fields.get(2, "parent_block_hash") {
        None => None,
        Some(value) => Some(key(value).ok_or_else(|| error("parent_block_hash", "not a hash"))?),
    };
    let token_ids = match fields.get(3, "token_ids") {
        None => Vec::new(),
        Some(value) => tokens(value).ok_or_else(|| error("token_ids", "not a list of 32-bit token ids"))?,
    };
    let block_size = match fields.get(4, "block_size") {
        None => 0,
        Some(value) => integer(value)
            .and_then(|size| u32::try_from(size).ok())
            .ok_or_else(|| error("block_size", "not a 32-bit size"))?,
    };
    let lora_id = optional_integer(fields.get(5, "lora_id")).ok_or_else(|| error("lora_id", "not an integer"))?;
    let medium = optional_text(fields.get(6, "medium")).ok_or_else(|| error("medium", "not a string"))?;
    // Position 7 is vLLM's lora_name, or the map SGLang appends with the salt.
    let (lora_name, metadata) = match (fields, fields.get(7, "lora_name")) {
        (Fields::Positional(_), Some(value @ Value::Map(_))) => (None, Some(value)),
        (Fields::Named(map), lora_name) => (lora_name, map.get("metadata").filter(|value| !value.is_nil())),
        (_, lora_name) => (lora_name, None),
    };
    let lora_name = optional_text(lora_name).ok_or_else(|| error("lora_name", "not a string"))?;
    let named_salt = match fields {
        Fields::Named(map) => map.get("cache_salt").filter(|value| !value.is_nil()),
        Fields::Positional(_) => None,
    };
    let metadata_salt = match metadata {
        None => None,
        Some(metadata @ Value::Map(_)) => metadata.get("cache_salt").filter(|value| !value.is_nil()),
        Some(_) => return Err(error("metadata", "not a map")),
    };
    let cache_salt = optional_text(named_salt.or(metadata_salt)).ok_or_else(|| error("cache_salt", "not a string"))?;
    let extra_keys = match fields.get(8, "extra_keys") {
        None => None,
        Some(value) => Some(extra_keys(value).ok_or_else(|| error("extra_keys", "not a list of key lists"))?),
    };
    let group_idx = optional_integer(fields.get(9, "group_idx")).ok_or_else(|| error("group_idx", "not an integer"))?;
    Ok(BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        lora_name,
        medium,
        extra_keys,
        cache_salt,
        group_idx,
    })
}

fn key(value: &Value<'_>) -> Option<EngineKey> {
    match value {
        Value::Uint(hash) => Some(EngineKey::Int(*hash)),
        Value::Int(hash) => Some(EngineKey::Int(*hash as u64)),
        Value::Bin(bytes) => Some(EngineKey::Bytes((*bytes).into())),
        _ => None,
    }
}

fn keys(value: &Value<'_>) -> Option<Vec<EngineKey>> {
    value.as_array()?.iter().map(key).collect()
}

fn tokens(value: &Value<'_>) -> Option<Vec<u32>> {
    value
        .as_array()?
        .iter()
        .map(|token| match token {
            Value::Uint(token) => u32::try_from(*token).ok(),
            _ => None,
        })
        .collect()
}

fn integer(value: &Value<'_>) -> Option<i64> {
    match value {
        Value::Uint(value) => i64::try_from(*value).ok(),
        Value::Int(value) => Some(*value),
        _ => None,
    }
}

/// `Some(None)` for an absent field, `Some(Some(..))` for an integer, `None` for anything else.
fn optional_integer(value: Option<&Value<'_>>) -> Option<Option<i64>> {
    match value {
        None => Some(None),
        Some(value) => integer(value).map(Some),
    }
}

/// `Some(None)` for an absent field, `Some(Some(..))` for a string, `None` for anything else.
fn optional_text(value: Option<&Value<'_>>) -> Option<Option<String>> {
    match value {
        None => Some(None),
        Some(value) => value.as_str().map(|text| Some(text.to_string())),
    }
}

fn extra_keys(value: &Value<'_>) -> Option<Vec<Option<Vec<ExtraKey>>>> {
    value
        .as_array()?
        .iter()
        .map(|block| match block {
            Value::Nil => Some(None),
            Value::Array(keys) => Some(Some(
                keys.iter()
                    .map(|key| match key.as_str() {
                        Some(text) => ExtraKey::Text(text.to_string()),
                        None => ExtraKey::Other,
                    })
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_events::msgpack::{Value, to_vec};

    const SALT: &str = "kvr1-52581a798dc988cb66a108aff42a700c";

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/engine_events/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
    }

    fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    fn salted(salt: &str) -> Option<Vec<Option<Vec<ExtraKey>>>> {
        Some(vec![Some(vec![ExtraKey::Text(salt.into())]), None])
    }

    #[test]
    fn vllm_0_32_map_events_in_a_positional_batch() {
        // Encoded by vLLM 0.32's own structs (gen.py).
        let batch = decode_batch(&fixture("vllm_0_32_stored.msgpack")).unwrap();
        assert_eq!(batch.ts, 1757500000.25);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.unknown_events, 0);
        assert_eq!(
            batch.events,
            vec![
                EngineEvent::Stored(BlockStored {
                    block_hashes: vec![EngineKey::Int(0xDEAD_BEEF_1234_5678), EngineKey::Int(u64::MAX)],
                    parent_block_hash: None,
                    token_ids: tokens(1000..1032),
                    block_size: 16,
                    medium: Some("GPU".into()),
                    extra_keys: salted(SALT),
                    group_idx: Some(0),
                    ..BlockStored::default()
                }),
                EngineEvent::Stored(BlockStored {
                    block_hashes: vec![EngineKey::Int(7)],
                    parent_block_hash: Some(EngineKey::Int(u64::MAX)),
                    token_ids: tokens(1032..1048),
                    block_size: 16,
                    medium: Some("GPU".into()),
                    group_idx: Some(0),
                    ..BlockStored::default()
                }),
            ]
        );
        let mixed = decode_batch(&fixture("vllm_0_32_mixed.msgpack")).unwrap();
        assert_eq!(mixed.data_parallel_rank, Some(1));
        assert_eq!(mixed.events.len(), 4);
        assert!(matches!(&mixed.events[0], EngineEvent::Stored(s) if s.medium.as_deref() == Some("CPU")
            && s.extra_keys == Some(vec![None])));
        assert_eq!(
            mixed.events[1],
            EngineEvent::Removed(BlockRemoved {
                block_hashes: vec![EngineKey::Int(7)],
                medium: Some("GPU".into()),
                group_idx: Some(0)
            })
        );
        let bytes_key = EngineKey::Bytes((0..32u8).collect::<Vec<_>>().into());
        assert!(matches!(&mixed.events[2], EngineEvent::Stored(s) if s.block_hashes == vec![bytes_key.clone()]
            && s.group_idx == Some(1)));
        assert_eq!(mixed.events[3], EngineEvent::Cleared(AllBlocksCleared { medium: None }));
    }

    #[test]
    fn vllm_positional_events() {
        let batch = decode_batch(&fixture("vllm_positional.msgpack")).unwrap();
        assert_eq!(batch.data_parallel_rank, None, "a trailing nil rank");
        assert_eq!(
            batch.events,
            vec![
                EngineEvent::Stored(BlockStored {
                    block_hashes: vec![EngineKey::Int(11), EngineKey::Int(12)],
                    token_ids: tokens(1000..1032),
                    block_size: 16,
                    medium: Some("GPU".into()),
                    extra_keys: salted(SALT),
                    group_idx: Some(0),
                    ..BlockStored::default()
                }),
                EngineEvent::Removed(BlockRemoved {
                    block_hashes: vec![EngineKey::Int(12)],
                    medium: Some("GPU".into()),
                    group_idx: Some(0)
                }),
                EngineEvent::Cleared(AllBlocksCleared::default()),
            ]
        );
    }

    #[test]
    fn sglang_positional_and_map_events_carry_the_salt() {
        let negative = |value: i64| EngineKey::Int(value as u64);
        let batch = decode_batch(&fixture("sglang_positional.msgpack")).unwrap();
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(
            batch.events,
            vec![
                EngineEvent::Cleared(AllBlocksCleared::default()),
                EngineEvent::Stored(BlockStored {
                    block_hashes: vec![negative(-5)],
                    token_ids: tokens(1000..1016),
                    block_size: 16,
                    medium: Some("GPU".into()),
                    cache_salt: Some(SALT.into()),
                    ..BlockStored::default()
                }),
                EngineEvent::Stored(BlockStored {
                    block_hashes: vec![negative(-6), EngineKey::Int(9)],
                    parent_block_hash: Some(negative(-5)),
                    token_ids: tokens(1016..1048),
                    block_size: 16,
                    medium: Some("CPU_PINNED".into()),
                    ..BlockStored::default()
                }),
                EngineEvent::Removed(BlockRemoved {
                    block_hashes: vec![EngineKey::Int(9)],
                    medium: Some("CPU_PINNED".into()),
                    group_idx: None
                }),
            ]
        );
        let map = decode_batch(&fixture("sglang_map.msgpack")).unwrap();
        assert!(matches!(&map.events[0], EngineEvent::Stored(s) if s.cache_salt.as_deref() == Some(SALT)));
        assert!(matches!(&map.events[1], EngineEvent::Stored(s) if s.cache_salt.is_none()
            && s.parent_block_hash == Some(negative(-5))));
    }

    fn stored_map(extra: Vec<(Value<'static>, Value<'static>)>) -> Value<'static> {
        let mut fields = vec![
            (Value::Str(b"type"), Value::Str(b"BlockStored")),
            (Value::Str(b"block_hashes"), Value::Array(vec![Value::Uint(1)])),
            (Value::Str(b"token_ids"), Value::Array((0..16).map(Value::Uint).collect())),
            (Value::Str(b"block_size"), Value::Uint(16)),
        ];
        for (name, value) in extra {
            match fields.iter_mut().find(|(existing, _)| *existing == name) {
                Some(field) => field.1 = value,
                None => fields.push((name, value)),
            }
        }
        Value::Map(fields)
    }

    fn batch_of(events: Vec<Value<'static>>) -> Vec<u8> {
        to_vec(&Value::Array(vec![Value::Float(1.0), Value::Array(events)]))
    }

    #[test]
    fn unknown_fields_and_types_are_ignored() {
        let bytes = batch_of(vec![
            stored_map(vec![
                (Value::Str(b"future_field"), Value::Map(vec![])),
                (Value::Str(b"cache_salt"), Value::Str(b"s")),
                (Value::Str(b"kv_cache_spec_sliding_window"), Value::Uint(4096)),
            ]),
            Value::Map(vec![(Value::Str(b"type"), Value::Str(b"BlockPinned"))]),
            Value::Array(vec![Value::Str(b"SomethingNew"), Value::Uint(1)]),
            Value::Array(vec![Value::Str(b"AllBlocksCleared"), Value::Str(b"CPU"), Value::Uint(9)]),
        ]);
        let batch = decode_batch(&bytes).unwrap();
        assert_eq!(batch.unknown_events, 2);
        assert_eq!(batch.data_parallel_rank, None, "an absent rank");
        assert!(matches!(&batch.events[0], EngineEvent::Stored(s) if s.cache_salt.as_deref() == Some("s")));
        assert_eq!(batch.events[1], EngineEvent::Cleared(AllBlocksCleared { medium: Some("CPU".into()) }));
    }

    #[test]
    fn a_map_batch_and_integer_timestamps_decode() {
        let bytes = to_vec(&Value::Map(vec![
            (Value::Str(b"ts"), Value::Uint(3)),
            (Value::Str(b"events"), Value::Array(vec![])),
            (Value::Str(b"data_parallel_rank"), Value::Uint(2)),
        ]));
        let batch = decode_batch(&bytes).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank, batch.events.len()), (3.0, Some(2), 0));
    }

    #[test]
    fn malformed_payloads_are_errors() {
        fn kind(error: &DecodeError) -> String {
            match error {
                DecodeError::Msgpack(_) => "msgpack".into(),
                DecodeError::Batch(_) => "batch".into(),
                DecodeError::Event { .. } => "event".into(),
                DecodeError::Field { field, .. } => format!("field {field}"),
            }
        }
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0xc1], "msgpack"),
            (to_vec(&Value::Uint(1)), "batch"),
            (to_vec(&Value::Array(vec![Value::Str(b"x"), Value::Array(vec![])])), "batch"),
            (to_vec(&Value::Array(vec![Value::Float(1.0), Value::Nil])), "batch"),
            (batch_of(vec![Value::Uint(5)]), "event"),
            (batch_of(vec![Value::Array(vec![Value::Uint(5)])]), "event"),
            (batch_of(vec![Value::Array(vec![Value::Str(b"BlockStored")])]), "field block_hashes"),
            (
                batch_of(vec![stored_map(vec![(Value::Str(b"token_ids"), Value::Array(vec![Value::Int(-1)]))])]),
                "field token_ids",
            ),
            (
                batch_of(vec![stored_map(vec![(Value::Str(b"token_ids"), Value::Array(vec![Value::Uint(1 << 40)]))])]),
                "field token_ids",
            ),
            (
                batch_of(vec![stored_map(vec![(Value::Str(b"parent_block_hash"), Value::Str(b"h"))])]),
                "field parent_block_hash",
            ),
            (batch_of(vec![stored_map(vec![(Value::Str(b"medium"), Value::Uint(1))])]), "field medium"),
            (
                batch_of(vec![stored_map(vec![(Value::Str(b"extra_keys"), Value::Array(vec![Value::Uint(1)]))])]),
                "field extra_keys",
            ),
            (batch_of(vec![stored_map(vec![(Value::Str(b"metadata"), Value::Uint(1))])]), "field metadata"),
            (
                batch_of(vec![Value::Array(vec![Value::Str(b"BlockRemoved"), Value::Array(vec![Value::Nil])])]),
                "field block_hashes",
            ),
        ];
        for (index, (bytes, expected)) in cases.into_iter().enumerate() {
            let result = decode_batch(&bytes);
            assert_eq!(result.as_ref().map_err(kind).err().as_deref(), Some(expected), "case {index}: {result:?}");
        }
    }

    #[test]
    fn nil_fields_are_absent_and_hashes_normalise() {
        let bytes = batch_of(vec![stored_map(vec![
            (Value::Str(b"block_hashes"), Value::Array(vec![Value::Int(-1), Value::Bin(&[1, 2])])),
            (Value::Str(b"token_ids"), Value::Array(vec![])),
            (Value::Str(b"lora_name"), Value::Nil),
            (Value::Str(b"extra_keys"), Value::Nil),
        ])]);
        let batch = decode_batch(&bytes).unwrap();
        let EngineEvent::Stored(stored) = &batch.events[0] else { panic!("{batch:?}") };
        assert_eq!(stored.block_hashes, vec![EngineKey::Int(u64::MAX), EngineKey::Bytes(vec![1, 2].into())]);
        assert!(stored.token_ids.is_empty() && stored.lora_name.is_none() && stored.extra_keys.is_none());
        // A repeated key (msgspec never writes one): the first counts.
        let mut repeated = stored_map(vec![]);
        if let Value::Map(fields) = &mut repeated {
            fields.push((Value::Str(b"block_size"), Value::Str(b"x")));
        }
        let batch = decode_batch(&batch_of(vec![repeated])).unwrap();
        assert!(matches!(&batch.events[0], EngineEvent::Stored(s) if s.block_size == 16));
        let bytes = batch_of(vec![Value::Array(vec![
            Value::Str(b"BlockStored"),
            Value::Array(vec![Value::Int(-1), Value::Bin(&[1, 2])]),
            Value::Nil,
            Value::Array(vec![]),
            Value::Uint(16),
            Value::Nil,
            Value::Nil,
            Value::Str(b"adapter"),
            Value::Array(vec![Value::Nil, Value::Array(vec![Value::Array(vec![Value::Str(b"mm"), Value::Uint(0)])])]),
        ])]);
        let batch = decode_batch(&bytes).unwrap();
        let EngineEvent::Stored(stored) = &batch.events[0] else { panic!("{batch:?}") };
        assert_eq!(stored.block_hashes, vec![EngineKey::Int(u64::MAX), EngineKey::Bytes(vec![1, 2].into())]);
        assert_eq!(stored.lora_name.as_deref(), Some("adapter"));
        assert_eq!(stored.extra_keys, Some(vec![None, Some(vec![ExtraKey::Other])]));
        assert_eq!((stored.medium.clone(), stored.lora_id, stored.group_idx), (None, None, None));
    }
}

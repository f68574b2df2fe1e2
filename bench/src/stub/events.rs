//! The stub's cache events as vLLM 0.32 publishes them: a MessagePack batch `[ts, [event, ...], 0]` whose
//! events are maps named by `type` (`BlockStored` with `block_hashes`, `parent_block_hash`, `token_ids`,
//! `block_size`, `lora_id`, `medium`, `lora_name`, `extra_keys`, `group_idx`, `kv_cache_spec_kind`;
//! `BlockRemoved` with `block_hashes`, `medium`, `group_idx`; `AllBlocksCleared`), a salted root's salt in
//! its first block's extra keys, as vLLM sends it.

use kvroute_node_agent::engine_events::msgpack::{self, Value};

use super::cache::CacheEvent;

const MEDIUM: &[u8] = b"GPU";

/// The payload of one published batch.
pub fn batch_payload(ts: f64, events: &[CacheEvent], block_size: usize) -> Vec<u8> {
    let events: Vec<Value<'_>> = events.iter().map(|event| event_value(event, block_size)).collect();
    msgpack::to_vec(&Value::Array(vec![Value::Float(ts), Value::Array(events), Value::Uint(0)]))
}

fn event_value(event: &CacheEvent, block_size: usize) -> Value<'_> {
    let hashes = |hashes: &[u64]| Value::Array(hashes.iter().map(|&hash| Value::Uint(hash)).collect());
    let fields = match event {
        CacheEvent::Stored { hashes: stored, parent, tokens, salt } => {
            let mut fields = vec![
                field("type", Value::Str(b"BlockStored")),
                field("block_hashes", hashes(stored)),
                field("parent_block_hash", parent.map_or(Value::Nil, Value::Uint)),
                field("token_ids", Value::Array(tokens.iter().map(|&token| Value::Uint(u64::from(token))).collect())),
                field("block_size", Value::Uint(block_size as u64)),
                field("lora_id", Value::Nil),
                field("medium", Value::Str(MEDIUM)),
                field("lora_name", Value::Nil),
            ];
            if let Some(salt) = salt {
                let first = Value::Array(vec![Value::Str(salt.as_bytes())]);
                let rest = std::iter::repeat_n(Value::Nil, stored.len().saturating_sub(1));
                fields.push(field("extra_keys", Value::Array(std::iter::once(first).chain(rest).collect())));
            }
            fields.push(field("group_idx", Value::Uint(0)));
            fields.push(field("kv_cache_spec_kind", Value::Str(b"full_attention")));
            fields
        }
        CacheEvent::Removed { hashes: removed } => vec![
            field("type", Value::Str(b"BlockRemoved")),
            field("block_hashes", hashes(removed)),
            field("medium", Value::Str(MEDIUM)),
            field("group_idx", Value::Uint(0)),
        ],
        CacheEvent::Cleared => vec![field("type", Value::Str(b"AllBlocksCleared"))],
    };
    Value::Map(fields)
}

fn field<'a>(name: &'static str, value: Value<'a>) -> (Value<'a>, Value<'a>) {
    (Value::Str(name.as_bytes()), value)
}

#[cfg(test)]
mod tests {
    use kvroute_node_agent::engine_events::decode::ExtraKey;
    use kvroute_node_agent::engine_events::{EngineEvent, EngineKey, decode_batch};

    use super::*;

    #[test]
    fn the_agent_decodes_what_the_stub_publishes() {
        let events = vec![
            CacheEvent::Stored {
                hashes: vec![1, 2],
                parent: None,
                tokens: (0..32).collect(),
                salt: Some("kvr1-x".into()),
            },
            CacheEvent::Stored { hashes: vec![3], parent: Some(2), tokens: (32..48).collect(), salt: None },
            CacheEvent::Removed { hashes: vec![1] },
            CacheEvent::Cleared,
        ];
        let batch = decode_batch(&batch_payload(12.5, &events, 16)).expect("a batch the agent reads");
        assert_eq!(batch.ts, 12.5);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.events.len(), 4);
        let EngineEvent::Stored(root) = &batch.events[0] else { panic!("{:?}", batch.events[0]) };
        assert_eq!(root.block_hashes, vec![EngineKey::Int(1), EngineKey::Int(2)]);
        assert_eq!(root.parent_block_hash, None);
        assert_eq!(root.token_ids, (0..32).collect::<Vec<u32>>());
        assert_eq!(root.block_size, 16);
        assert_eq!(root.extra_keys, Some(vec![Some(vec![ExtraKey::Text("kvr1-x".into())]), None]));
        let EngineEvent::Stored(child) = &batch.events[1] else { panic!("{:?}", batch.events[1]) };
        assert_eq!(child.parent_block_hash, Some(EngineKey::Int(2)));
        assert_eq!(child.extra_keys, None);
        assert!(
            matches!(&batch.events[2], EngineEvent::Removed(removed) if removed.block_hashes == vec![EngineKey::Int(1)])
        );
        assert!(matches!(batch.events[3], EngineEvent::Cleared(_)));
    }
}

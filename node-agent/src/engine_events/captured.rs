//! What the tests over captured engine bytes (`vllm_captures`, `sglang_captures`) share.

use super::decode::{EngineEvent, decode_batch};

/// The tokens of the first `BlockStored` of a payload.
pub fn stored_tokens(payload: &[u8]) -> Vec<u32> {
    decode_batch(payload)
        .unwrap()
        .events
        .iter()
        .find_map(|event| match event {
            EngineEvent::Stored(stored) => Some(stored.token_ids.clone()),
            _ => None,
        })
        .unwrap()
}

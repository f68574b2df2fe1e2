//! Checks the block-hash implementation against golden vectors computed by an
//! independent implementation (`testdata/gen_block_hash_v1.py`).

#![allow(clippy::unwrap_used)]

use kvroute_proto::block_hash::block_hashes;
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    contract: String,
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    block_size: u32,
    model: String,
    scope_hex: String,
    tokens: Vec<u32>,
    hashes: Vec<String>,
}

fn decode_hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

#[test]
fn golden_vectors_match() {
    let raw = include_str!("../testdata/block_hash_v1.json");
    let vectors: Vectors = serde_json::from_str(raw).expect("golden vector file parses");
    assert_eq!(vectors.contract, "kvroute/block-hash/v1");
    assert!(vectors.vectors.len() >= 8);
    for vector in &vectors.vectors {
        let scope = decode_hex(&vector.scope_hex);
        let got: Vec<String> = block_hashes(vector.block_size, &vector.model, &scope, &vector.tokens)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, vector.hashes, "vector {:?}", vector.name);
        assert_eq!(got.len(), vector.tokens.len() / vector.block_size as usize);
    }
}

//! Hugging Face `tokenizer.json` files: small ones written here, SmolLM2's
//! vocabulary re-expressed as one, and unsupported variants.

// Test helpers fail loudly on bad fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use kvroute_gateway::tokenizer::{Tokenizer, TokenizerError};
use kvroute_proto::gguf::GgufFile;
use serde_json::{Value, json};

/// The 256 byte tokens in GPT-2's byte-level alphabet, by byte value.
fn byte_alphabet() -> Vec<String> {
    let direct = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if direct(b) {
                char::from(b).to_string()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c.to_string()
            }
        })
        .collect()
}

fn write(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(value).unwrap()).unwrap();
    path
}

/// A small byte-level BPE: 256 byte tokens (id = byte value), "Ġh" (256), "Ġhi" (257), "12" (258),
/// and the added tokens "<s>" (259, special) and "[tool]" (260, not special).
fn small(pre_tokenizer: Value, merges: Value) -> Value {
    let mut vocab = serde_json::Map::new();
    for (id, text) in byte_alphabet().into_iter().enumerate() {
        vocab.insert(text, json!(id));
    }
    vocab.insert("Ġh".into(), json!(256));
    vocab.insert("Ġhi".into(), json!(257));
    vocab.insert("12".into(), json!(258));
    json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 259, "content": "<s>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
            {"id": 260, "content": "[tool]", "special": false, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}
        ],
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

fn byte_level() -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
}

#[test]
fn small_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let string_merges = json!(["Ġ h", "Ġh i", "1 2"]);
    let path = write(dir.path(), "tokenizer.json", &small(byte_level(), string_merges));
    let tokenizer = Tokenizer::from_tokenizer_json(&path).unwrap();
    assert_eq!(tokenizer.name(), "tokenizer.json");
    assert_eq!(tokenizer.vocab_size(), 261);
    assert_eq!(tokenizer.encode(" hi"), vec![257]);
    assert_eq!(tokenizer.encode(" hi 12"), vec![257, u32::from(b' '), 258]);
    assert_eq!(tokenizer.encode("<s> hi[tool]"), vec![259, 257, 260]);
    // Special tokens are plain text for encode_ordinary; added tokens are still matched.
    assert_eq!(tokenizer.encode_ordinary("<s>[tool]"), vec![60, 115, 62, 260]);
    assert_eq!(tokenizer.token_id("<s>"), Some(259));
    assert_eq!(tokenizer.token_id("[tool]"), Some(260));
    assert!(tokenizer.is_special(259));
    assert_eq!(tokenizer.decode(&[259, 257, 260]).unwrap(), "<s> hi[tool]");
    assert_eq!(tokenizer.bos_token_id(), None);
    assert_eq!(tokenizer.chat_template(), None);

    // Merges written as pairs give the same tokenizer.
    let dir2 = tempfile::tempdir().unwrap();
    let pair_merges = json!([["Ġ", "h"], ["Ġh", "i"], ["1", "2"]]);
    let path2 = write(dir2.path(), "tokenizer.json", &small(byte_level(), pair_merges));
    let same = Tokenizer::from_tokenizer_json(&path2).unwrap();
    assert_eq!(same.fingerprint(), tokenizer.fingerprint());
    assert_eq!(same.encode(" hi 12 hi"), tokenizer.encode(" hi 12 hi"));
}

#[test]
fn digits_and_whole_piece_variants() {
    let dir = tempfile::tempdir().unwrap();
    let merges = json!(["Ġ h", "Ġh i", "1 2"]);
    let plain =
        Tokenizer::from_tokenizer_json(&write(dir.path(), "a.json", &small(byte_level(), merges.clone()))).unwrap();
    let digits =
        json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level()]});
    let split = Tokenizer::from_tokenizer_json(&write(dir.path(), "b.json", &small(digits, merges.clone()))).unwrap();
    assert_eq!(plain.encode("12"), vec![258]);
    assert_eq!(split.encode("12"), vec![u32::from(b'1'), u32::from(b'2')]);
    assert_ne!(plain.fingerprint(), split.fingerprint());

    // ignore_merges: a piece that is a token is taken whole.
    let mut doc = small(byte_level(), json!(["Ġ h", "1 2"]));
    doc["model"]["vocab"]["Ġhi"] = json!(257);
    let without = Tokenizer::from_tokenizer_json(&write(dir.path(), "c.json", &doc)).unwrap();
    doc["model"]["ignore_merges"] = json!(true);
    let with = Tokenizer::from_tokenizer_json(&write(dir.path(), "d.json", &doc)).unwrap();
    assert_eq!(without.encode(" hi"), vec![256, u32::from(b'i')]);
    assert_eq!(with.encode(" hi"), vec![257]);
    assert_ne!(with.fingerprint(), without.fingerprint());
}

/// SmolLM2's vocabulary and merges, written as tokenizer.json and
/// tokenizer_config.json, load to the same tokenizer as the GGUF file.
#[test]
fn smollm2_as_tokenizer_json() {
    let file = GgufFile::open(&kvroute_test_support::smollm2_path()).unwrap();
    let from_gguf = Tokenizer::from_gguf(&file).unwrap();
    let tokens = file.get_str_array("tokenizer.ggml.tokens").unwrap();
    let merges = file.get_str_array("tokenizer.ggml.merges").unwrap();
    let types = file.get("tokenizer.ggml.token_type").unwrap().as_array().unwrap();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, text) in tokens.iter().enumerate() {
        vocab.insert(text.to_string(), json!(id));
        if types[id].as_u64() == Some(3) {
            added.push(json!({"id": id, "content": text, "special": true, "normalized": false}));
        }
    }
    let doc = json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": vocab, "merges": merges},
    });
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "tokenizer.json", &doc);
    let template = file.get_str("tokenizer.chat_template").unwrap();
    write(
        dir.path(),
        "tokenizer_config.json",
        &json!({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "chat_template": template}),
    );
    let from_json = Tokenizer::from_tokenizer_json(&path).unwrap();
    assert_eq!(from_json.fingerprint(), from_gguf.fingerprint());
    assert_eq!(from_json.bos_token_id(), Some(1));
    assert_eq!(from_json.eos_token_ids(), &[2]);
    assert_eq!(from_json.chat_template(), Some(template));
    for text in ["The capital of France is", "<|im_start|>user\nHi 2024!<|im_end|>", "日本語 🦀 x  y\n\n"] {
        assert_eq!(from_json.encode(text), from_gguf.encode(text));
    }
    assert_eq!(from_json.encode("The capital of France is"), vec![504, 3575, 282, 4649, 314]);
}

fn load_err(doc: &Value) -> TokenizerError {
    let dir = tempfile::tempdir().unwrap();
    Tokenizer::from_tokenizer_json(&write(dir.path(), "tokenizer.json", doc)).unwrap_err()
}

#[test]
fn unsupported_files_are_clear_errors() {
    let merges = json!(["Ġ h"]);
    let cases: Vec<(Value, &str)> = vec![
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["model"]["type"] = json!("WordPiece");
                d
            },
            "model type \"WordPiece\"",
        ),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["normalizer"] = json!({"type": "NFC"});
                d
            },
            "normalizer \"NFC\"",
        ),
        (small(json!({"type": "Metaspace", "replacement": "▁"}), merges.clone()), "pre-tokenizer \"Metaspace\""),
        (
            small(
                json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}),
                merges.clone(),
            ),
            "[\"Split\", \"ByteLevel\"]",
        ),
        (small(json!({"type": "ByteLevel", "add_prefix_space": true}), merges.clone()), "add_prefix_space"),
        (small(json!(null), merges.clone()), "no pre_tokenizer"),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["model"]["byte_fallback"] = json!(true);
                d
            },
            "byte_fallback",
        ),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["model"]["continuing_subword_prefix"] = json!("##");
                d
            },
            "continuing_subword_prefix",
        ),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["model"]["vocab"]["▁the"] = json!(300);
                d
            },
            "not in the byte-level alphabet",
        ),
        (small(byte_level(), json!(["Ġ"])), "merges[0] is neither"),
        (small(byte_level(), json!(["Ġ zz"])), "\"zz\" is not in the vocab"),
        (small(byte_level(), json!(["h i"])), "not in the vocabulary"),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["model"].as_object_mut().unwrap().remove("merges");
                d
            },
            "missing model.merges",
        ),
        (
            {
                let mut d = small(byte_level(), merges.clone());
                d["added_tokens"] = json!([{"content": "x"}]);
                d
            },
            "added_tokens[0]",
        ),
    ];
    for (doc, expected) in cases {
        let err = load_err(&doc);
        assert!(err.to_string().contains(expected), "expected {expected:?} in: {err}");
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, b"{ not json").unwrap();
    assert!(matches!(Tokenizer::from_tokenizer_json(&path), Err(TokenizerError::Json { .. })));
    let missing = dir.path().join("nope.json");
    assert!(matches!(Tokenizer::from_tokenizer_json(&missing), Err(TokenizerError::Io { .. })));

    // A broken tokenizer_config.json beside the file is reported too.
    let path = write(dir.path(), "tokenizer.json", &small(byte_level(), merges.clone()));
    write(dir.path(), "tokenizer_config.json", &json!({"eos_token": "<nope>"}));
    let err = Tokenizer::from_tokenizer_json(&path).unwrap_err();
    assert!(err.to_string().contains("eos_token \"<nope>\""), "{err}");
}

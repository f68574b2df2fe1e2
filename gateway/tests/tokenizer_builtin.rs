//! The built-in cl100k_base tokenizer against reference encodings from
//! OpenAI's `tiktoken` (see `testdata/gen_cl100k_golden.py`).

// Test helpers fail loudly on bad fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use kvroute_gateway::tokenizer::{Detokenizer, Tokenizer, TokenizerError};
use proptest::prelude::*;
use serde_json::Value;

fn golden_cases() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/cl100k_golden.json");
    let json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let ids = |value: &Value| -> Vec<u32> {
        value.as_array().unwrap().iter().map(|id| u32::try_from(id.as_u64().unwrap()).unwrap()).collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| (case["text"].as_str().unwrap().to_string(), ids(&case["ids"]), ids(&case["ordinary_ids"])))
        .collect()
}

#[test]
fn matches_tiktoken_goldens() {
    let tokenizer = Tokenizer::builtin();
    let cases = golden_cases();
    assert!(cases.len() > 300);
    for (text, ids, ordinary_ids) in &cases {
        assert_eq!(&tokenizer.encode(text), ids, "encode({text:?})");
        assert_eq!(&tokenizer.encode_ordinary(text), ordinary_ids, "encode_ordinary({text:?})");
        assert_eq!(&tokenizer.decode(ids).unwrap(), text);
        assert_eq!(&tokenizer.decode(ordinary_ids).unwrap(), text);
    }
}

#[test]
fn identity_and_specials() {
    let tokenizer = Tokenizer::builtin();
    assert_eq!(tokenizer.name(), "cl100k_base");
    assert_eq!(tokenizer.vocab_size(), 100_277);
    assert_eq!(tokenizer.bos_token_id(), None);
    assert_eq!(tokenizer.eos_token_ids(), &[100_265, 100_257]);
    assert_eq!(tokenizer.chat_template(), None);
    for (text, id) in [
        ("<|endoftext|>", 100_257),
        ("<|fim_prefix|>", 100_258),
        ("<|fim_middle|>", 100_259),
        ("<|fim_suffix|>", 100_260),
        ("<|im_start|>", 100_264),
        ("<|im_end|>", 100_265),
        ("<|endofprompt|>", 100_276),
    ] {
        assert_eq!(tokenizer.token_id(text), Some(id));
        assert_eq!(tokenizer.encode(text), vec![id]);
        assert!(tokenizer.encode_ordinary(text).len() > 1);
        assert_eq!(tokenizer.decode(&[id]).unwrap(), text);
        assert!(tokenizer.is_special(id));
    }
    assert_eq!(tokenizer.token_id("hello"), None);
    assert!(!tokenizer.is_special(15339));
    // The same tables are shared, and the fingerprint is a stable blake3 hex digest.
    let again = Tokenizer::builtin();
    assert_eq!(again.fingerprint(), tokenizer.fingerprint());
    assert_eq!(tokenizer.fingerprint().len(), 64);
    assert!(tokenizer.fingerprint().bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn round_trips() {
    let tokenizer = Tokenizer::builtin();
    let texts = [
        "plain English text with punctuation, numbers (1234567) and symbols!",
        "emoji 🦀🔥 and ZWJ 👩‍💻 sequences",
        "多语言 текст ελληνικά עברית",
        "    indented\n\t\tcode {\n}\r\n\r\n",
        "                                                      ",
        &"xyz".repeat(2000),
        &"🦀".repeat(500),
        "<|im_start|>user\nhi<|im_end|>",
    ];
    for text in texts {
        assert_eq!(tokenizer.decode(&tokenizer.encode(text)).unwrap(), text);
        assert_eq!(tokenizer.decode(&tokenizer.encode_ordinary(text)).unwrap(), text);
    }
}

#[test]
fn decode_errors() {
    let tokenizer = Tokenizer::builtin();
    // 100256 is past the ranks and before the first special token: unassigned.
    for id in [100_256, 100_261, 100_277, u32::MAX] {
        assert!(matches!(tokenizer.decode(&[id]), Err(TokenizerError::UnknownId { .. })), "id {id}");
    }
    // "🦀" is four bytes; its tokens split it, so a prefix of them is not UTF-8.
    let ids = tokenizer.encode("🦀");
    assert!(ids.len() > 1);
    let err = tokenizer.decode(&ids[..1]).unwrap_err();
    assert!(matches!(err, TokenizerError::InvalidUtf8 { valid_up_to: 0 }), "{err}");
    assert!(err.to_string().contains("decode_bytes"));
    assert_eq!(tokenizer.decode_bytes(&ids).unwrap(), "🦀".as_bytes());
}

#[test]
fn detokenizer_streams_whole_characters() {
    let tokenizer = Tokenizer::builtin();
    let text = "Crabs 🦀 like 日本語 and émigré words.";
    let ids = tokenizer.encode(text);
    let mut detokenizer = Detokenizer::new(&tokenizer);
    let mut streamed = String::new();
    for &id in &ids {
        let piece = detokenizer.push(id).unwrap();
        // Every piece is valid text on its own (it is a String), and nothing is lost.
        streamed.push_str(&piece);
        assert!(text.starts_with(&streamed));
    }
    assert!(detokenizer.pending_bytes().is_empty());
    streamed.push_str(&detokenizer.finish());
    assert_eq!(streamed, text);

    // An incomplete character is held back, then replaced at the end.
    let crab = tokenizer.encode("🦀");
    let mut detokenizer = Detokenizer::new(&tokenizer);
    assert_eq!(detokenizer.push(crab[0]).unwrap(), "");
    assert!(!detokenizer.pending_bytes().is_empty());
    assert_eq!(detokenizer.finish(), "\u{fffd}");
    assert!(detokenizer.push(100_256).is_err());
}

proptest! {
    #[test]
    fn encode_ordinary_round_trips(text in any::<String>()) {
        let tokenizer = Tokenizer::builtin();
        let ids = tokenizer.encode_ordinary(&text);
        prop_assert_eq!(tokenizer.decode(&ids).unwrap(), text.clone());
        prop_assert!(ids.iter().all(|&id| id < 100_256));
        let mut detokenizer = Detokenizer::new(&tokenizer);
        let mut streamed = detokenizer.push_all(&ids).unwrap();
        streamed.push_str(&detokenizer.finish());
        prop_assert_eq!(streamed, text);
    }

    #[test]
    fn encode_round_trips_with_specials(parts in proptest::collection::vec(prop_oneof![
        any::<String>(),
        Just("<|im_start|>".to_string()),
        Just("<|endoftext|>".to_string()),
        Just("<|".to_string()),
        Just(" \n ".to_string()),
    ], 0..8)) {
        let tokenizer = Tokenizer::builtin();
        let text = parts.concat();
        prop_assert_eq!(tokenizer.decode(&tokenizer.encode(&text)).unwrap(), text);
    }
}

//! Loading a Hugging Face `tokenizer.json` (byte-level BPE).
//!
//! Supported: `model.type` = `BPE` with merges given as `"a b"` strings or
//! `["a", "b"]` pairs; no normalizer; pre-tokenizer `ByteLevel` (with
//! `add_prefix_space: false`), optionally preceded by
//! `Digits { individual_digits: true }` in a `Sequence`. `added_tokens` with
//! `special: true` are special tokens, the others added tokens (both matched
//! literally in text). Anything else is an error naming what is unsupported.
//! The post-processor is not applied: prompts get no BOS/EOS added here.
//!
//! A `tokenizer_config.json` next to the file, when present, supplies
//! `chat_template`, `bos_token` and `eos_token`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::pretokenize::PreTokenizer;
use super::specials::Literal;
use super::{MergeRule, Parts, TokenizerError, bytelevel};

const SOURCE: &str = "tokenizer.json";

fn unsupported(what: String) -> TokenizerError {
    TokenizerError::Unsupported(format!("tokenizer.json: {what}"))
}

fn invalid(what: String) -> TokenizerError {
    TokenizerError::Invalid(format!("tokenizer.json: {what}"))
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::Missing { source_name: SOURCE, key: key.to_string() }
}

fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    let text = std::fs::read(path).map_err(|source| TokenizerError::Io { path: path.display().to_string(), source })?;
    serde_json::from_slice(&text).map_err(|source| TokenizerError::Json { path: path.display().to_string(), source })
}

fn is_null_or_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::String(text)) => text.is_empty(),
        _ => false,
    }
}

fn type_of(value: &Value) -> &str {
    value.get("type").and_then(Value::as_str).unwrap_or("(no type)")
}

/// The pre-tokenizer: `ByteLevel`, or `Sequence[Digits(individual), ByteLevel]`.
fn pre_tokenizer(value: Option<&Value>) -> Result<PreTokenizer, TokenizerError> {
    let Some(value) = value.filter(|value| !value.is_null()) else {
        return Err(unsupported("no pre_tokenizer (a ByteLevel pre-tokenizer is required)".to_string()));
    };
    let byte_level = |value: &Value| -> Result<PreTokenizer, TokenizerError> {
        if type_of(value) != "ByteLevel" {
            return Err(unsupported(format!("pre-tokenizer {:?} (supported: ByteLevel, Digits)", type_of(value))));
        }
        if value.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported("ByteLevel with add_prefix_space: true".to_string()));
        }
        Ok(if value.get("use_regex").and_then(Value::as_bool) == Some(false) {
            PreTokenizer::Whole
        } else {
            PreTokenizer::Gpt2
        })
    };
    match type_of(value) {
        "ByteLevel" => byte_level(value),
        "Sequence" => {
            let steps = value.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            match steps {
                [single] => byte_level(single),
                [digits, last] if type_of(digits) == "Digits" => {
                    if digits.get("individual_digits").and_then(Value::as_bool) != Some(true) {
                        return Err(unsupported("Digits without individual_digits: true".to_string()));
                    }
                    match byte_level(last)? {
                        PreTokenizer::Gpt2 => Ok(PreTokenizer::DigitsThenGpt2),
                        _ => Err(unsupported("Digits followed by ByteLevel with use_regex: false".to_string())),
                    }
                }
                _ => {
                    let names: Vec<&str> = steps.iter().map(type_of).collect();
                    Err(unsupported(format!(
                        "pre-tokenizer sequence {names:?} (supported: [ByteLevel], [Digits, ByteLevel])"
                    )))
                }
            }
        }
        other => Err(unsupported(format!("pre-tokenizer {other:?} (supported: ByteLevel, Digits)"))),
    }
}

fn merge_parts(merge: &Value, rank: usize) -> Result<(&str, &str), TokenizerError> {
    let parts = match merge {
        Value::String(text) => text.split_once(' '),
        Value::Array(items) => match items.as_slice() {
            [Value::String(a), Value::String(b)] => Some((a.as_str(), b.as_str())),
            _ => None,
        },
        _ => None,
    };
    parts.ok_or_else(|| invalid(format!("merges[{rank}] is neither \"a b\" nor [\"a\", \"b\"]")))
}

pub(crate) fn parts(path: &Path) -> Result<Parts, TokenizerError> {
    let root = read_json(path)?;
    let model = root.get("model").ok_or_else(|| missing("model"))?;
    let model_type = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    if model_type != "BPE" {
        return Err(unsupported(format!("model type {model_type:?} (only BPE is supported)")));
    }
    if !is_null_or_empty(root.get("normalizer")) {
        return Err(unsupported(format!("normalizer {:?}", type_of(&root["normalizer"]))));
    }
    for key in ["dropout", "continuing_subword_prefix", "end_of_word_suffix"] {
        if !is_null_or_empty(model.get(key)) {
            return Err(unsupported(format!("BPE option {key}")));
        }
    }
    if model.get("byte_fallback").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported("BPE byte_fallback (not a byte-level vocabulary)".to_string()));
    }
    let ignore_merges = model.get("ignore_merges").and_then(Value::as_bool).unwrap_or(false);
    let pre = pre_tokenizer(root.get("pre_tokenizer"))?;

    let vocab_map = model.get("vocab").and_then(Value::as_object).ok_or_else(|| missing("model.vocab"))?;
    let mut vocab: Vec<Option<Vec<u8>>> = Vec::new();
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(vocab_map.len());
    for (text, id) in vocab_map {
        let id = id
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .filter(|&id| id < 1 << 24)
            .ok_or_else(|| invalid(format!("vocab entry {text:?} has a bad id")))?;
        let bytes = bytelevel::decode(text)
            .ok_or_else(|| unsupported(format!("vocab entry {text:?} is not in the byte-level alphabet")))?;
        if vocab.len() <= id as usize {
            vocab.resize(id as usize + 1, None);
        }
        if vocab[id as usize].replace(bytes).is_some() {
            return Err(invalid(format!("two vocab entries have id {id}")));
        }
        ids.insert(text.as_str(), id);
    }

    let merges = model.get("merges").and_then(Value::as_array).ok_or_else(|| missing("model.merges"))?;
    let mut pairs = Vec::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        let (left, right) = merge_parts(merge, rank)?;
        let lookup = |part: &str| {
            ids.get(part).copied().ok_or_else(|| invalid(format!("merges[{rank}]: {part:?} is not in the vocab")))
        };
        pairs.push((lookup(left)?, lookup(right)?));
    }

    let mut literals = Vec::new();
    let mut by_text: HashMap<String, u32> = HashMap::new();
    for (index, added) in
        root.get("added_tokens").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default().iter().enumerate()
    {
        let text = added.get("content").and_then(Value::as_str);
        let id =
            added.get("id").and_then(Value::as_u64).and_then(|id| u32::try_from(id).ok()).filter(|&id| id < 1 << 24);
        let (Some(text), Some(id)) = (text, id) else {
            return Err(invalid(format!("added_tokens[{index}] needs a string content and an id")));
        };
        let special = added.get("special").and_then(Value::as_bool).unwrap_or(false);
        by_text.insert(text.to_string(), id);
        literals.push(Literal { text: text.to_string(), id, special });
    }

    let mut parts = Parts {
        name: "tokenizer.json".to_string(),
        pre,
        vocab,
        rule: MergeRule::Merges { pairs, ignore_merges },
        literals,
        bos: None,
        eos: Vec::new(),
        add_bos: false,
        chat_template: None,
    };
    if let Some(config) = path.parent().map(|dir| dir.join("tokenizer_config.json")).filter(|config| config.is_file()) {
        apply_config(&read_json(&config)?, &by_text, &mut parts)?;
    }
    Ok(parts)
}

/// Takes the chat template and BOS/EOS tokens from `tokenizer_config.json`.
fn apply_config(config: &Value, by_text: &HashMap<String, u32>, parts: &mut Parts) -> Result<(), TokenizerError> {
    let token = |key: &str| -> Result<Option<u32>, TokenizerError> {
        let text = match config.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(text)) => text.as_str(),
            Some(value) => value.get("content").and_then(Value::as_str).unwrap_or_default(),
        };
        by_text.get(text).copied().map(Some).ok_or_else(|| {
            TokenizerError::Invalid(format!("tokenizer_config.json: {key} {text:?} is not an added token"))
        })
    };
    parts.bos = token("bos_token")?;
    parts.eos = token("eos_token")?.into_iter().collect();
    parts.add_bos = config.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false);
    parts.chat_template = match config.get("chat_template") {
        Some(Value::String(template)) => Some(template.clone()),
        // A list of named templates: take the one named "default".
        Some(Value::Array(named)) => named
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template").and_then(Value::as_str))
            .map(str::to_string),
        _ => None,
    };
    Ok(())
}

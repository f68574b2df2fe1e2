//! Loading a tokenizer from a GGUF model file's `tokenizer.*` metadata.
//!
//! Supported: byte-level BPE (`tokenizer.ggml.model` = `gpt2`). Tokens are
//! written in GPT-2's byte-level alphabet; control (type 3) tokens become
//! special tokens and user-defined (type 4) tokens added tokens, both matched
//! literally in text. The merge rank is the merge's index in
//! `tokenizer.ggml.merges`.
//!
//! The pre-tokenizer follows `tokenizer.ggml.pre` as llama.cpp does: the
//! STARCODER group (`smollm`, `starcoder`, `refact`, `command-r`,
//! `codeshell`, `exaone`, `minerva-7b`) splits every digit off and then
//! applies GPT-2's pattern; `gpt2`, `default` and every other name use GPT-2's
//! pattern alone. An unrecognized name therefore still loads, with GPT-2's
//! pattern as the documented best guess.

use std::collections::HashMap;

use kvroute_proto::gguf::{GgufFile, MetaValue};

use super::pretokenize::PreTokenizer;
use super::specials::Literal;
use super::{MergeRule, Parts, TokenizerError, bytelevel};

const SOURCE: &str = "GGUF tokenizer metadata";

const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;

/// Names of llama.cpp's STARCODER pre-tokenizer group.
const DIGITS_THEN_GPT2: [&str; 7] = ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"];

/// The pre-tokenizer for a `tokenizer.ggml.pre` name.
pub(crate) fn pre_tokenizer_for(name: &str) -> PreTokenizer {
    if DIGITS_THEN_GPT2.contains(&name) { PreTokenizer::DigitsThenGpt2 } else { PreTokenizer::Gpt2 }
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::Missing { source_name: SOURCE, key: key.to_string() }
}

fn token_id(file: &GgufFile, key: &str, count: usize) -> Result<Option<u32>, TokenizerError> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    // llama.cpp writes -1 (as a signed or wrapped value) for "none".
    match value.as_u64() {
        Some(id) if (id as usize) < count => Ok(Some(id as u32)),
        Some(id) if id >= u64::from(u32::MAX) => Ok(None),
        _ if matches!(value, MetaValue::I32(-1) | MetaValue::I64(-1)) => Ok(None),
        _ => Err(TokenizerError::Invalid(format!("{key} = {value:?} is not a token id of the vocabulary"))),
    }
}

pub(crate) fn parts(file: &GgufFile) -> Result<Parts, TokenizerError> {
    let model = file.get_str("tokenizer.ggml.model").ok_or_else(|| missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(TokenizerError::Unsupported(format!(
            "GGUF tokenizer.ggml.model is {model:?}; only \"gpt2\" (byte-level BPE) is supported"
        )));
    }
    let tokens =
        file.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| missing("tokenizer.ggml.tokens (strings)"))?;
    let merges =
        file.get_str_array("tokenizer.ggml.merges").ok_or_else(|| missing("tokenizer.ggml.merges (strings)"))?;
    let types: Option<Vec<u64>> = match file.get("tokenizer.ggml.token_type") {
        None => None,
        Some(value) => Some(
            value
                .as_array()
                .and_then(|items| items.iter().map(MetaValue::as_u64).collect::<Option<Vec<u64>>>())
                .filter(|types| types.len() == tokens.len())
                .ok_or_else(|| {
                    TokenizerError::Invalid("tokenizer.ggml.token_type is not one integer per token".to_string())
                })?,
        ),
    };
    if u32::try_from(tokens.len()).is_err() {
        return Err(TokenizerError::Invalid("too many tokens".to_string()));
    }

    let mut vocab = Vec::with_capacity(tokens.len());
    let mut literals = Vec::new();
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    for (id, &text) in tokens.iter().enumerate() {
        let id = id as u32;
        let token_type = types.as_ref().map_or(1, |types| types[id as usize]);
        if token_type == TYPE_CONTROL || token_type == TYPE_USER_DEFINED {
            literals.push(Literal { text: text.to_string(), id, special: token_type == TYPE_CONTROL });
            vocab.push(Some(text.as_bytes().to_vec()));
        } else {
            // A token outside the byte-level alphabet cannot come out of a
            // merge; keep its text as it is so that it still decodes.
            vocab.push(Some(bytelevel::decode(text).unwrap_or_else(|| text.as_bytes().to_vec())));
            ids.entry(text).or_insert(id);
        }
    }

    let mut pairs = Vec::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        let (left, right) = merge.split_once(' ').ok_or_else(|| {
            TokenizerError::Invalid(format!("tokenizer.ggml.merges[{rank}] = {merge:?} is not two tokens"))
        })?;
        let lookup = |part: &str| {
            ids.get(part).copied().ok_or_else(|| {
                TokenizerError::Invalid(format!("tokenizer.ggml.merges[{rank}] = {merge:?}: {part:?} is not a token"))
            })
        };
        pairs.push((lookup(left)?, lookup(right)?));
    }

    let pre_name = file.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let bos = token_id(file, "tokenizer.ggml.bos_token_id", tokens.len())?;
    let mut eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(file, key, tokens.len())?
            && !eos.contains(&id)
        {
            eos.push(id);
        }
    }
    let add_bos = matches!(file.get("tokenizer.ggml.add_bos_token"), Some(MetaValue::Bool(true)));
    Ok(Parts {
        name: format!("gguf:{pre_name}"),
        pre: pre_tokenizer_for(pre_name),
        vocab,
        rule: MergeRule::Merges { pairs, ignore_merges: false },
        literals,
        bos,
        eos,
        add_bos,
        chat_template: file.get_str("tokenizer.chat_template").map(str::to_string),
    })
}

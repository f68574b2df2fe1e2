//! The built-in tokenizer: OpenAI's cl100k_base, embedded in the binary.
//!
//! The rank file (`tokenizer/assets/cl100k_base.tiktoken`, see the README
//! there) holds one `base64(token bytes) rank` pair per line; the rank is the
//! token id. Special tokens are fixed here, as tiktoken defines them.

use std::sync::OnceLock;

use base64::Engine as _;

use super::pretokenize::PreTokenizer;
use super::specials::Literal;
use super::{MergeRule, Parts, Tokenizer, TokenizerError};

const RANKS: &str = include_str!("../assets/cl100k_base.tiktoken");

const ENDOFTEXT: u32 = 100_257;
const IM_END: u32 = 100_265;

/// cl100k_base's special tokens.
const SPECIALS: [(&str, u32); 7] = [
    ("<|endoftext|>", ENDOFTEXT),
    ("<|fim_prefix|>", 100_258),
    ("<|fim_middle|>", 100_259),
    ("<|fim_suffix|>", 100_260),
    ("<|im_start|>", 100_264),
    ("<|im_end|>", IM_END),
    ("<|endofprompt|>", 100_276),
];

/// The shared built-in tokenizer, parsed on first use.
pub(crate) fn cl100k_base() -> Tokenizer {
    static CELL: OnceLock<Tokenizer> = OnceLock::new();
    CELL.get_or_init(|| {
        // The embedded file is fixed at build time and a unit test loads it,
        // so a failure here is a build defect, not bad input.
        #[allow(clippy::expect_used)]
        parse(RANKS).and_then(Tokenizer::assemble).expect("the embedded cl100k_base ranks load")
    })
    .clone()
}

/// Parses a tiktoken rank file into tokenizer parts.
pub(crate) fn parse(ranks: &str) -> Result<Parts, TokenizerError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut vocab: Vec<Option<Vec<u8>>> = Vec::with_capacity(100_300);
    for (number, line) in ranks.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| TokenizerError::Invalid(format!("tiktoken ranks line {}: {what}", number + 1));
        let (token, rank) = line.split_once(' ').ok_or_else(|| bad("expected `base64 rank`"))?;
        let bytes = engine.decode(token).map_err(|_| bad("bad base64"))?;
        let rank: usize = rank.parse().map_err(|_| bad("bad rank"))?;
        if rank >= 1 << 24 {
            return Err(bad("rank too large"));
        }
        if vocab.len() <= rank {
            vocab.resize(rank + 1, None);
        }
        if vocab[rank].replace(bytes).is_some() {
            return Err(bad("duplicate rank"));
        }
    }
    let literals = SPECIALS.iter().map(|&(text, id)| Literal { text: text.to_string(), id, special: true }).collect();
    Ok(Parts {
        name: "cl100k_base".to_string(),
        pre: PreTokenizer::Cl100k,
        vocab,
        rule: MergeRule::Ranks,
        literals,
        bos: None,
        eos: vec![IM_END, ENDOFTEXT],
        add_bos: false,
        chat_template: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_ranks_load() {
        let tokenizer = cl100k_base();
        assert_eq!(tokenizer.vocab_size(), 100_277);
        assert_eq!(tokenizer.token_id("<|im_end|>"), Some(IM_END));
        assert_eq!(tokenizer.encode("hello world"), vec![15339, 1917]);
    }

    #[test]
    fn bad_rank_files_are_errors() {
        assert!(parse("aGk= x\n").is_err());
        assert!(parse("!!! 0\n").is_err());
        assert!(parse("aGk=\n").is_err());
        assert!(parse("aGk= 0\naGk= 0\n").is_err());
    }
}

//! Byte-level BPE tokenizers: the built-in cl100k_base, GGUF model files and
//! Hugging Face `tokenizer.json` files, all on one merge engine.
//!
//! Encoding runs in three stages: literal tokens (special and added tokens)
//! are cut out of the text (`specials`), the remaining text is split into
//! pieces by the pre-tokenizer (`pretokenize`), and each piece is merged into
//! tokens by byte-pair merging (`bpe`). Decoding concatenates the bytes of
//! each token; [`Detokenizer`] does it incrementally for streams.
//!
//! Sources: [`Tokenizer::builtin`] (cl100k_base, embedded),
//! [`Tokenizer::from_gguf`] (`tokenizer.ggml.model` = `gpt2`) and
//! [`Tokenizer::from_tokenizer_json`] (byte-level BPE). Each module's
//! documentation states what it accepts; anything else is a
//! [`TokenizerError`] naming what is unsupported.

mod ascii_pieces;
mod bpe;
mod builtin;
mod bytelevel;
mod detokenizer;
mod error;
mod gguf;
mod hash;
mod hf_json;
mod pretokenize;
mod specials;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use detokenizer::Detokenizer;
pub use error::TokenizerError;

use bpe::{BpeModel, Scratch};
use pretokenize::PreTokenizer;
use specials::{Literal, LiteralMatcher, Segment};

/// A tokenizer. Cloning is cheap (the tables are shared behind an `Arc`).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &self.inner.name)
            .field("vocab_size", &self.inner.vocab_size)
            .field("fingerprint", &self.inner.fingerprint)
            .finish()
    }
}

struct Inner {
    name: String,
    pre: PreTokenizer,
    model: BpeModel,
    literals: LiteralMatcher,
    literal_ids: HashMap<String, u32>,
    /// All token bytes, back to back; `spans[id]` locates token `id`.
    token_bytes: Vec<u8>,
    spans: Vec<Span>,
    vocab_size: u32,
    bos: Option<u32>,
    eos: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    fingerprint: String,
}

#[derive(Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

const NO_SPAN: Span = Span { start: u32::MAX, len: 0 };

/// How pieces merge, as loaded from the source.
pub(crate) enum MergeRule {
    /// tiktoken: the rank of a merge is the id of the token it produces.
    Ranks,
    /// An explicit merge list, in rank order, as (left, right) token ids.
    Merges { pairs: Vec<(u32, u32)>, ignore_merges: bool },
}

/// Everything a source yields; [`Tokenizer::assemble`] builds the tables.
pub(crate) struct Parts {
    pub name: String,
    pub pre: PreTokenizer,
    /// The bytes of each ordinary token, indexed by id; `None` for unassigned ids.
    pub vocab: Vec<Option<Vec<u8>>>,
    pub rule: MergeRule,
    pub literals: Vec<Literal>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

impl Tokenizer {
    /// The built-in cl100k_base tokenizer (parsed once per process).
    pub fn builtin() -> Tokenizer {
        builtin::cl100k_base()
    }

    /// A tokenizer from a GGUF model's `tokenizer.*` metadata. Only byte-level
    /// BPE (`tokenizer.ggml.model` = `gpt2`) is supported.
    pub fn from_gguf(file: &kvroute_proto::gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::assemble(gguf::parts(file)?)
    }

    /// Reads a GGUF file and takes its tokenizer.
    pub fn from_gguf_path(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let file = kvroute_proto::gguf::GgufFile::open(path)?;
        Tokenizer::from_gguf(&file)
    }

    /// A tokenizer from a Hugging Face `tokenizer.json` (byte-level BPE). A
    /// `tokenizer_config.json` next to it, if present, supplies the chat
    /// template and the BOS/EOS tokens.
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::assemble(hf_json::parts(path)?)
    }

    pub(crate) fn assemble(parts: Parts) -> Result<Tokenizer, TokenizerError> {
        let Parts { name, pre, mut vocab, rule, literals, bos, eos, add_bos, chat_template } = parts;
        let max_literal = literals.iter().map(|literal| literal.id).max();
        let vocab_len = vocab.len().max(max_literal.map_or(0, |id| id as usize + 1));
        let vocab_size = u32::try_from(vocab_len)
            .map_err(|_| TokenizerError::Invalid(format!("vocabulary of {vocab_len} tokens is too large")))?;
        vocab.resize(vocab_len, None);
        let mut literal_ids = HashMap::new();
        for literal in &literals {
            vocab[literal.id as usize] = Some(literal.text.as_bytes().to_vec());
            literal_ids.entry(literal.text.clone()).or_insert(literal.id);
        }
        for id in bos.iter().chain(&eos) {
            if *id >= vocab_size || vocab[*id as usize].is_none() {
                return Err(TokenizerError::Invalid(format!("BOS/EOS token id {id} is not in the vocabulary")));
            }
        }

        let model = match &rule {
            MergeRule::Ranks => {
                let ranks: Vec<Option<&[u8]>> = vocab.iter().map(|bytes| bytes.as_deref()).collect();
                // Literal tokens are not part of the rank table.
                let mut ranks = ranks;
                for literal in &literals {
                    ranks[literal.id as usize] = None;
                }
                BpeModel::from_ranks(&ranks)
            }
            MergeRule::Merges { pairs, ignore_merges } => {
                let byte_tokens = byte_tokens(&vocab, &literals);
                let mut index: hash::FastMap<&[u8], u32> = hash::fast_map_with_capacity(vocab.len());
                for (bytes, id) in ordinary_tokens(&vocab, &literals) {
                    index.entry(bytes).or_insert(id);
                }
                let mut merges = Vec::with_capacity(pairs.len());
                for &(left, right) in pairs {
                    let (Some(Some(a)), Some(Some(b))) = (vocab.get(left as usize), vocab.get(right as usize)) else {
                        return Err(TokenizerError::Invalid(format!("merge ({left}, {right}) names an unknown token")));
                    };
                    let joined = [a.as_slice(), b.as_slice()].concat();
                    let Some(&id) = index.get(joined.as_slice()) else {
                        return Err(TokenizerError::Invalid(format!(
                            "merge of tokens {left} and {right} gives {:?}, which is not in the vocabulary",
                            String::from_utf8_lossy(&joined)
                        )));
                    };
                    merges.push((left, right, id));
                }
                let model = BpeModel::from_merges(byte_tokens, &merges);
                if *ignore_merges {
                    model.with_whole_piece_lookup(
                        ordinary_tokens(&vocab, &literals).map(|(bytes, id)| (Box::from(bytes), id)),
                    )
                } else {
                    model
                }
            }
        };
        let fingerprint = fingerprint(pre, &vocab, &rule, &literals);
        let mut token_bytes = Vec::new();
        let mut spans = Vec::with_capacity(vocab.len());
        for bytes in &vocab {
            spans.push(match bytes {
                Some(bytes) => {
                    let span = Span { start: token_bytes.len() as u32, len: bytes.len() as u32 };
                    token_bytes.extend_from_slice(bytes);
                    span
                }
                None => NO_SPAN,
            });
        }
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                name,
                pre,
                model,
                literals: LiteralMatcher::new(literals),
                literal_ids,
                token_bytes,
                spans,
                vocab_size,
                bos,
                eos,
                add_bos,
                chat_template,
                fingerprint,
            }),
        })
    }

    /// Encodes text; special tokens written in the text (such as
    /// `<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, true)
    }

    /// Encodes text with special-token strings treated as plain text. Added
    /// (non-special) tokens are still recognized, as in llama.cpp and
    /// Hugging Face.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, false)
    }

    fn encode_with(&self, text: &str, include_special: bool) -> Vec<u32> {
        let inner = &*self.inner;
        let mut out = Vec::with_capacity(text.len() / 4 + 4);
        let mut scratch = Scratch::default();
        // Without the whole-piece shortcut, merging is the main cost; a piece
        // seen earlier in this text copies its earlier tokens instead.
        let mut seen: Option<hash::FastMap<&str, (usize, usize)>> =
            (!inner.model.has_whole_piece_lookup()).then(hash::FastMap::default);
        inner.literals.split(text, include_special, |segment| match segment {
            Segment::Token(id) => out.push(id),
            Segment::Text(text) => {
                inner.pre.split(text, &mut |piece| match seen.as_mut() {
                    Some(seen) if piece.len() > 1 => {
                        if let Some(&(start, end)) = seen.get(piece) {
                            out.extend_from_within(start..end);
                        } else {
                            let start = out.len();
                            inner.model.encode_piece(piece.as_bytes(), &mut scratch, &mut out);
                            seen.insert(piece, (start, out.len()));
                        }
                    }
                    _ => inner.model.encode_piece(piece.as_bytes(), &mut scratch, &mut out),
                });
            }
        });
        out
    }

    /// The bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let inner = &*self.inner;
        let span = inner.spans.get(id as usize).copied().unwrap_or(NO_SPAN);
        if span.start == u32::MAX {
            return Err(TokenizerError::UnknownId { id, vocab_size: inner.vocab_size });
        }
        Ok(&inner.token_bytes[span.start as usize..(span.start + span.len) as usize])
    }

    /// Decodes ids to text. Special tokens decode to their text. Errors on an
    /// unknown id, and on bytes that are not valid UTF-8 (see
    /// [`decode_bytes`](Self::decode_bytes) and [`Detokenizer`]).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let bytes = self.decode_bytes(ids)?;
        String::from_utf8(bytes)
            .map_err(|err| TokenizerError::InvalidUtf8 { valid_up_to: err.utf8_error().valid_up_to() })
    }

    /// Decodes ids to raw bytes.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// The number of token ids: the largest id plus one, special tokens included.
    pub fn vocab_size(&self) -> u32 {
        self.inner.vocab_size
    }

    /// The id of a special or added token, by its text.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.literal_ids.get(token).copied()
    }

    /// Whether `id` is a special or added token (one matched literally).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.literals.literals().iter().any(|literal| literal.id == id)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos
    }

    /// The tokens that end generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos
    }

    /// Whether the model expects the BOS token before a prompt that does not
    /// already carry it (GGUF `tokenizer.ggml.add_bos_token`). Chat templates
    /// usually write the BOS token themselves.
    pub fn add_bos_token(&self) -> bool {
        self.inner.add_bos
    }

    /// The model's own chat template (Jinja), if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// A blake3 hex digest identifying how this tokenizer maps text to ids:
    /// two tokenizers with the same fingerprint give the same ids, whichever
    /// file they came from.
    pub fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    /// `cl100k_base`, `gguf:<pre-tokenizer>` or `tokenizer.json`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

/// The single-byte token for each byte among the ordinary tokens.
fn byte_tokens(vocab: &[Option<Vec<u8>>], literals: &[Literal]) -> [u32; 256] {
    let mut out = [u32::MAX; 256];
    for (id, bytes) in vocab.iter().enumerate() {
        if let Some([b]) = bytes.as_deref()
            && out[usize::from(*b)] == u32::MAX
            && !literals.iter().any(|literal| literal.id as usize == id)
        {
            out[usize::from(*b)] = id as u32;
        }
    }
    out
}

/// The ordinary tokens as (bytes, id), literal tokens left out.
fn ordinary_tokens<'a>(vocab: &'a [Option<Vec<u8>>], literals: &[Literal]) -> impl Iterator<Item = (&'a [u8], u32)> {
    let is_literal: Vec<bool> = {
        let mut flags = vec![false; vocab.len()];
        for literal in literals {
            flags[literal.id as usize] = true;
        }
        flags
    };
    vocab.iter().enumerate().filter_map(move |(id, bytes)| match bytes {
        Some(bytes) if !is_literal[id] => Some((bytes.as_slice(), id as u32)),
        _ => None,
    })
}

/// blake3 over a canonical serialization of everything that decides the ids.
fn fingerprint(pre: PreTokenizer, vocab: &[Option<Vec<u8>>], rule: &MergeRule, literals: &[Literal]) -> String {
    let mut hasher = blake3::Hasher::new();
    let mut put = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    put(b"kvroute-tokenizer-fingerprint-v1");
    put(pre.name().as_bytes());
    put(&(vocab.len() as u64).to_le_bytes());
    for bytes in vocab {
        match bytes {
            Some(bytes) => {
                put(b"+");
                put(bytes);
            }
            None => put(b"-"),
        }
    }
    match rule {
        MergeRule::Ranks => put(b"rule:ranks"),
        MergeRule::Merges { pairs, ignore_merges } => {
            put(if *ignore_merges { b"rule:merges+whole" } else { b"rule:merges" });
            put(&(pairs.len() as u64).to_le_bytes());
            for (left, right) in pairs {
                put(&left.to_le_bytes());
                put(&right.to_le_bytes());
            }
        }
    }
    let mut sorted: Vec<&Literal> = literals.iter().collect();
    sorted.sort_by_key(|literal| literal.id);
    put(&(sorted.len() as u64).to_le_bytes());
    for literal in sorted {
        put(&literal.id.to_le_bytes());
        put(if literal.special { b"special" } else { b"added" });
        put(literal.text.as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

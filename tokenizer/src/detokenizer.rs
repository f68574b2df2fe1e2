//! Streaming decoding: text out as token ids come in, one complete character
//! at a time.

use super::{Tokenizer, TokenizerError};

/// An incremental decoder for one generated sequence.
///
/// A token can end in the middle of a multi-byte UTF-8 character; such a tail
/// is held back until the bytes that complete it arrive. Bytes that can never
/// become valid UTF-8 are replaced by U+FFFD (a stream must keep flowing), and
/// [`finish`](Self::finish) does the same for an incomplete tail.
#[derive(Clone, Debug)]
pub struct Detokenizer {
    tokenizer: Tokenizer,
    pending: Vec<u8>,
}

impl Detokenizer {
    pub fn new(tokenizer: &Tokenizer) -> Detokenizer {
        Detokenizer { tokenizer: tokenizer.clone(), pending: Vec::new() }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.pending.extend_from_slice(self.tokenizer.token_bytes(id)?);
        Ok(self.take_complete())
    }

    /// Adds several tokens; returns the text they complete.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String, TokenizerError> {
        for &id in ids {
            self.pending.extend_from_slice(self.tokenizer.token_bytes(id)?);
        }
        Ok(self.take_complete())
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the sequence: returns what is held back, an incomplete character
    /// replaced by U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    consumed = self.pending.len();
                    break;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match err.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            consumed += valid;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}

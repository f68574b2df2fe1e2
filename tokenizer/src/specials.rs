//! Finding special and added tokens in text before pre-tokenization.
//!
//! Two kinds of literal tokens exist:
//! - *special* tokens (control tokens such as `<|im_start|>`) are recognized
//!   by [`Tokenizer::encode`](super::Tokenizer::encode) only;
//! - *added* tokens (GGUF user-defined tokens, Hugging Face added tokens with
//!   `special: false`) are recognized by both `encode` and `encode_ordinary`,
//!   as llama.cpp and Hugging Face do.
//!
//! Matching is leftmost-longest: at the first position where any token
//! starts, the longest token that starts there wins.

/// One literal token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Literal {
    pub text: String,
    pub id: u32,
    pub special: bool,
}

/// A piece of text: either plain text or a literal token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment<'t> {
    Text(&'t str),
    Token(u32),
}

/// The literal tokens, indexed by their first byte.
#[derive(Clone, Default)]
pub(crate) struct LiteralMatcher {
    literals: Vec<Literal>,
    /// For each first byte, indices into `literals`, longest first.
    by_first_byte: Vec<Vec<u32>>,
}

impl LiteralMatcher {
    pub(crate) fn new(mut literals: Vec<Literal>) -> LiteralMatcher {
        literals.retain(|literal| !literal.text.is_empty());
        literals.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let mut by_first_byte = vec![Vec::new(); 256];
        for (index, literal) in literals.iter().enumerate() {
            let first = literal.text.as_bytes()[0];
            by_first_byte[usize::from(first)].push(index as u32);
        }
        LiteralMatcher { literals, by_first_byte }
    }

    pub(crate) fn literals(&self) -> &[Literal] {
        &self.literals
    }

    /// Splits `text` into plain text and literal tokens. With
    /// `include_special` false, special tokens are left in the plain text.
    pub(crate) fn split<'t>(&self, text: &'t str, include_special: bool, mut segment: impl FnMut(Segment<'t>)) {
        if self.literals.is_empty() {
            if !text.is_empty() {
                segment(Segment::Text(text));
            }
            return;
        }
        let bytes = text.as_bytes();
        let mut plain_start = 0;
        let mut at = 0;
        while at < bytes.len() {
            let candidates = &self.by_first_byte[usize::from(bytes[at])];
            let found = candidates.iter().map(|&index| &self.literals[index as usize]).find(|literal| {
                (include_special || !literal.special) && bytes[at..].starts_with(literal.text.as_bytes())
            });
            match found {
                Some(literal) => {
                    if plain_start < at {
                        segment(Segment::Text(&text[plain_start..at]));
                    }
                    segment(Segment::Token(literal.id));
                    at += literal.text.len();
                    plain_start = at;
                }
                None => at += 1,
            }
        }
        if plain_start < bytes.len() {
            segment(Segment::Text(&text[plain_start..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(matcher: &LiteralMatcher, text: &str, include_special: bool) -> Vec<String> {
        let mut out = Vec::new();
        matcher.split(text, include_special, |segment| match segment {
            Segment::Text(text) => out.push(format!("[{text}]")),
            Segment::Token(id) => out.push(format!("#{id}")),
        });
        out
    }

    #[test]
    fn leftmost_longest() {
        let literal = |text: &str, id, special| Literal { text: text.to_string(), id, special };
        let matcher = LiteralMatcher::new(vec![
            literal("<|a|>", 1, true),
            literal("<|a|><|b|>", 2, true),
            literal("<x>", 3, false),
        ]);
        assert_eq!(collect(&matcher, "hi<|a|><|b|>!<|a|>", true), ["[hi]", "#2", "[!]", "#1"]);
        assert_eq!(collect(&matcher, "<x>é<|a|>", false), ["#3", "[é<|a|>]"]);
        assert_eq!(collect(&matcher, "", true), Vec::<String>::new());
    }
}

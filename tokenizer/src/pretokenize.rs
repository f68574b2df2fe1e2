//! Pre-tokenization: splitting text into the pieces that BPE merges within.
//!
//! The reference patterns end in `\s+(?!\S)|\s+`: a run of whitespace gives up
//! its last character to the next piece when non-whitespace follows. The
//! lookahead forces a backtracking engine, which is slow, so each pattern is
//! run without the `\s+(?!\S)` alternative, on the DFA-based engine, and the
//! lookahead is applied afterwards: a whitespace match from the final `\s+`
//! alternative that is at least two characters long and followed by a
//! non-whitespace character is shortened by one character. This gives the
//! same pieces as the reference pattern; a property test compares the two.
//! Pieces of ASCII text come from hand-written scanners instead
//! ([`crate::ascii_pieces`]), which hand back to the regex where a non-ASCII
//! character decides the piece.

use std::sync::OnceLock;

use fancy_regex::Regex;

/// cl100k_base's pattern (tiktoken).
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2's pattern.
pub(crate) const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The lookahead alternative removed for the fast form.
const LOOKAHEAD_ALTERNATIVE: &str = r"|\s+(?!\S)";

/// How a tokenizer splits text before merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// cl100k_base's pattern.
    Cl100k,
    /// GPT-2's pattern.
    Gpt2,
    /// Every number character on its own, then GPT-2's pattern on the rest
    /// (llama.cpp's STARCODER group, e.g. `smollm`; Hugging Face's
    /// `Digits(individual_digits)` followed by `ByteLevel`).
    DigitsThenGpt2,
    /// No splitting: each stretch of text between special tokens is one piece
    /// (Hugging Face `ByteLevel` with `use_regex: false`).
    Whole,
}

struct Compiled {
    regex: Regex,
    /// The pattern's piece at a position of ASCII text, when ASCII decides it.
    ascii: fn(&[u8], usize) -> Option<usize>,
    /// Whether the pattern has a `\s*[\r\n]+` alternative before the final
    /// `\s+`: then whitespace matches containing a line break came from it and
    /// are not shortened.
    newline_alternative: bool,
}

fn compile(pattern: &str, newline_alternative: bool, ascii: fn(&[u8], usize) -> Option<usize>) -> Compiled {
    let fast = pattern.replacen(LOOKAHEAD_ALTERNATIVE, "", 1);
    // The patterns are constants; a unit test compiles each one.
    #[allow(clippy::expect_used)]
    let regex = Regex::new(&fast).expect("built-in pre-tokenizer pattern compiles");
    Compiled { regex, ascii, newline_alternative }
}

fn cl100k() -> &'static Compiled {
    static CELL: OnceLock<Compiled> = OnceLock::new();
    CELL.get_or_init(|| compile(CL100K_PATTERN, true, crate::ascii_pieces::cl100k))
}

fn gpt2() -> &'static Compiled {
    static CELL: OnceLock<Compiled> = OnceLock::new();
    CELL.get_or_init(|| compile(GPT2_PATTERN, false, crate::ascii_pieces::gpt2))
}

impl PreTokenizer {
    /// A stable name, part of the tokenizer fingerprint.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PreTokenizer::Cl100k => "cl100k",
            PreTokenizer::Gpt2 => "gpt2",
            PreTokenizer::DigitsThenGpt2 => "digits+gpt2",
            PreTokenizer::Whole => "whole",
        }
    }

    /// Calls `piece` for each piece of `text`, in order; the pieces
    /// concatenate to `text`.
    pub(crate) fn split<'t>(self, text: &'t str, piece: &mut impl FnMut(&'t str)) {
        match self {
            PreTokenizer::Cl100k => split_with(cl100k(), text, piece),
            PreTokenizer::Gpt2 => split_with(gpt2(), text, piece),
            PreTokenizer::DigitsThenGpt2 => split_digits_then(gpt2(), text, piece),
            PreTokenizer::Whole => {
                if !text.is_empty() {
                    piece(text);
                }
            }
        }
    }
}

fn split_digits_then<'t>(compiled: &Compiled, text: &'t str, piece: &mut impl FnMut(&'t str)) {
    let mut segment_start = 0;
    for (at, c) in text.char_indices() {
        let is_number = if c.is_ascii() { c.is_ascii_digit() } else { c.is_numeric() };
        if is_number {
            split_with(compiled, &text[segment_start..at], piece);
            let end = at + c.len_utf8();
            piece(&text[at..end]);
            segment_start = end;
        }
    }
    split_with(compiled, &text[segment_start..], piece);
}

fn split_with<'t>(compiled: &Compiled, text: &'t str, piece: &mut impl FnMut(&'t str)) {
    let mut pos = 0;
    while pos < text.len() {
        if let Some(end) = (compiled.ascii)(text.as_bytes(), pos)
            && end > pos
            && text.is_char_boundary(end)
        {
            piece(&text[pos..end]);
            pos = end;
            continue;
        }
        // The fast patterns have no lookaround, so the engine cannot fail;
        // treat a failure like "no match" and keep the rest as one piece.
        let found = compiled.regex.find_from_pos(text, pos).ok().flatten();
        let Some(found) = found else {
            piece(&text[pos..]);
            return;
        };
        if found.start() > pos {
            // Every character matches some alternative of the built-in
            // patterns, so this does not happen; never drop text if it does.
            piece(&text[pos..found.start()]);
        }
        let start = found.start();
        let mut end = found.end();
        if end == start {
            // An empty match cannot come from these patterns; step one
            // character to guarantee progress.
            end = start + text[start..].chars().next().map_or(1, char::len_utf8);
        }
        // `\s+(?!\S)`: a run of two or more whitespace characters followed by
        // non-whitespace leaves its last character to the next piece.
        if end < text.len()
            && is_shortenable_whitespace(compiled, &text[start..end])
            && !text[end..].chars().next().is_some_and(char::is_whitespace)
            && let Some((last, _)) = text[start..end].char_indices().next_back()
            && last > 0
        {
            end = start + last;
        }
        piece(&text[start..end]);
        pos = end;
    }
}

/// Whether a match came from the final `\s+` alternative.
fn is_shortenable_whitespace(compiled: &Compiled, matched: &str) -> bool {
    matched.chars().all(char::is_whitespace)
        && !(compiled.newline_alternative && matched.bytes().any(|b| b == b'\r' || b == b'\n'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pieces from the reference pattern, lookahead included.
    fn reference(pattern: &str, text: &str) -> Vec<String> {
        static CL100K: OnceLock<Regex> = OnceLock::new();
        static GPT2: OnceLock<Regex> = OnceLock::new();
        let cell = if pattern == CL100K_PATTERN { &CL100K } else { &GPT2 };
        let regex = cell.get_or_init(|| Regex::new(pattern).unwrap());
        regex.find_iter(text).map(|m| m.unwrap().as_str().to_string()).collect()
    }

    fn fast(pre: PreTokenizer, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        pre.split(text, &mut |p: &str| out.push(p.to_string()));
        out
    }

    fn reference_digits(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut segment = String::new();
        for c in text.chars() {
            if c.is_numeric() {
                out.extend(reference(GPT2_PATTERN, &segment));
                segment.clear();
                out.push(c.to_string());
            } else {
                segment.push(c);
            }
        }
        out.extend(reference(GPT2_PATTERN, &segment));
        out
    }

    #[test]
    fn known_splits() {
        assert_eq!(fast(PreTokenizer::Cl100k, "Hello  world\n\n  x"), ["Hello", " ", " world", "\n\n", " ", " x"]);
        assert_eq!(fast(PreTokenizer::Cl100k, "I'm 12345 ok  "), ["I", "'m", " ", "123", "45", " ok", "  "]);
        assert_eq!(fast(PreTokenizer::Gpt2, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(fast(PreTokenizer::DigitsThenGpt2, "is 2018!"), ["is", " ", "2", "0", "1", "8", "!"]);
        assert_eq!(fast(PreTokenizer::Whole, "a b"), ["a b"]);
    }

    fn text_strategy() -> impl Strategy<Value = String> {
        let atoms = prop_oneof![
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("\t".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("\u{a0}".to_string()),
            Just("\u{3000}".to_string()),
            Just("'s".to_string()),
            Just("'LL".to_string()),
            Just("'ſ".to_string()),
            Just("abc".to_string()),
            Just("É".to_string()),
            Just("日本".to_string()),
            Just("123".to_string()),
            Just("٣".to_string()),
            Just("½".to_string()),
            Just("!?".to_string()),
            Just("😀".to_string()),
            Just("\u{301}".to_string()),
            any::<char>().prop_map(|c| c.to_string()),
        ];
        proptest::collection::vec(atoms, 0..24).prop_map(|parts| parts.concat())
    }

    /// Mostly ASCII, so the hand-written scanners decide most pieces, with a non-ASCII character now and
    /// then where it changes the piece before it (a letter, a digit, a space, a symbol, `ſ` after `'`).
    fn ascii_strategy() -> impl Strategy<Value = String> {
        let atoms = prop_oneof![
            8 => (0u8..128).prop_map(|b| char::from(b).to_string()),
            2 => Just(" ".to_string()),
            1 => Just("   ".to_string()),
            1 => Just("\r\n".to_string()),
            1 => Just("'".to_string()),
            1 => prop::sample::select(vec!["s", "S", "t", "re", "rE", "Ve", "m", "ll", "lL", "d", "D", "r", "l", "v"])
                .prop_map(|c| format!("'{c}")),
            2 => "[a-zA-Z]{1,6}",
            1 => "[0-9]{1,7}",
            1 => prop::sample::select(vec!["é", "٣", "\u{a0}", "€", "ſ", "\u{2028}"]).prop_map(str::to_string),
        ];
        proptest::collection::vec(atoms, 0..32).prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn cl100k_ascii_scanner_matches_reference(text in ascii_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::Cl100k, &text), reference(CL100K_PATTERN, &text));
        }

        #[test]
        fn gpt2_ascii_scanner_matches_reference(text in ascii_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::Gpt2, &text), reference(GPT2_PATTERN, &text));
        }

        #[test]
        fn digits_ascii_scanner_matches_reference(text in ascii_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::DigitsThenGpt2, &text), reference_digits(&text));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn cl100k_fast_form_matches_reference(text in text_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::Cl100k, &text), reference(CL100K_PATTERN, &text));
        }

        #[test]
        fn gpt2_fast_form_matches_reference(text in text_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::Gpt2, &text), reference(GPT2_PATTERN, &text));
        }

        #[test]
        fn digits_fast_form_matches_reference(text in text_strategy()) {
            prop_assert_eq!(fast(PreTokenizer::DigitsThenGpt2, &text), reference_digits(&text));
        }
    }
}

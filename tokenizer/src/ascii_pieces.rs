//! Hand-written pre-tokenizers for ASCII text: the piece cl100k_base's or GPT-2's pattern matches at a
//! position, found by scanning bytes instead of running the regex engine (several times faster on
//! English text, where pre-tokenization was most of tokenization).
//!
//! Each function returns the end of the piece that starts at `at`, or `None` when the answer depends on a
//! non-ASCII character (one inside the piece, or the one that would end it): a non-ASCII letter, digit or
//! space can extend a run, and `ſ` matches `'s` case-insensitively. The caller then asks the regex for that
//! piece, so the pieces are always the pattern's. A property test compares both with the reference
//! patterns.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    /// `\r` or `\n`.
    Newline,
    /// Whitespace other than a line break: space, tab, vertical tab, form feed.
    Space,
    /// Anything else ASCII: punctuation, symbols, control characters.
    Other,
    NonAscii,
}

fn class(byte: u8) -> Class {
    match byte {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        b'\r' | b'\n' => Class::Newline,
        b' ' | b'\t' | 0x0b | 0x0c => Class::Space,
        0x80.. => Class::NonAscii,
        _ => Class::Other,
    }
}

fn class_at(bytes: &[u8], at: usize) -> Option<Class> {
    bytes.get(at).map(|&byte| class(byte))
}

/// The end of the run of `wanted` starting at `at`; `None` when a non-ASCII byte ends it.
fn run_end(bytes: &[u8], at: usize, wanted: impl Fn(Class) -> bool) -> Option<usize> {
    let mut end = at;
    while let Some(c) = class_at(bytes, end) {
        if c == Class::NonAscii {
            return None;
        }
        if !wanted(c) {
            break;
        }
        end += 1;
    }
    Some(end)
}

fn is_whitespace(c: Class) -> bool {
    matches!(c, Class::Space | Class::Newline)
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `at`: `Some(Some(end))` for a match, `Some(None)` for none, `None` when a
/// non-ASCII character decides.
fn contraction(bytes: &[u8], at: usize, ignore_case: bool) -> Option<Option<usize>> {
    if bytes.get(at) != Some(&b'\'') {
        return Some(None);
    }
    let lower = |i: usize| -> Option<Option<u8>> {
        match bytes.get(i) {
            None => Some(None),
            Some(&b) if b >= 0x80 => {
                // Case-insensitively a non-ASCII letter may fold to an ASCII one (`ſ` to `s`).
                if ignore_case { None } else { Some(Some(b)) }
            }
            Some(&b) => Some(Some(if ignore_case { b.to_ascii_lowercase() } else { b })),
        }
    };
    Some(match lower(at + 1)? {
        Some(b's' | b't' | b'm' | b'd') => Some(at + 2),
        Some(first @ (b'r' | b'v' | b'l')) => {
            let second = if first == b'l' { b'l' } else { b'e' };
            (lower(at + 2)? == Some(second)).then_some(at + 3)
        }
        _ => None,
    })
}

/// The maximal whitespace run from `at` (`None` when a non-ASCII byte ends it) and whether the text ends
/// there.
fn whitespace_run(bytes: &[u8], at: usize) -> Option<(usize, bool)> {
    let end = run_end(bytes, at, is_whitespace)?;
    Some((end, end == bytes.len()))
}

/// `\s+(?!\S)|\s+` on the whitespace run `at..end`: a run followed by non-whitespace leaves its last
/// character to the next piece, unless it is the only one.
fn trailing_whitespace(at: usize, end: usize, text_ends: bool) -> usize {
    if !text_ends && end - at >= 2 { end - 1 } else { end }
}

/// cl100k_base: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
pub(crate) fn cl100k(bytes: &[u8], at: usize) -> Option<usize> {
    let first = class_at(bytes, at)?;
    if let Some(end) = contraction(bytes, at, true)? {
        return Some(end);
    }
    match first {
        Class::NonAscii => return None,
        Class::Letter => return run_end(bytes, at, |c| c == Class::Letter),
        Class::Digit => {
            // At most three digits: a non-ASCII digit can only extend a shorter run.
            let mut end = at;
            while end < at + 3 {
                match class_at(bytes, end) {
                    Some(Class::Digit) => end += 1,
                    Some(Class::NonAscii) => return None,
                    _ => break,
                }
            }
            return Some(end);
        }
        Class::Space | Class::Other => match class_at(bytes, at + 1) {
            Some(Class::NonAscii) => return None,
            Some(Class::Letter) => return run_end(bytes, at + 1, |c| c == Class::Letter),
            _ => {}
        },
        Class::Newline => {}
    }
    let punctuation_from = if first == Class::Other {
        Some(at)
    } else if bytes[at] == b' ' && class_at(bytes, at + 1) == Some(Class::Other) {
        Some(at + 1)
    } else {
        None
    };
    if let Some(from) = punctuation_from {
        let end = run_end(bytes, from, |c| c == Class::Other)?;
        // `[\r\n]*` stops at anything else, ASCII or not.
        let breaks = bytes[end..].iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        return Some(end + breaks);
    }
    let (end, text_ends) = whitespace_run(bytes, at)?;
    if let Some(last_break) = bytes[at..end].iter().rposition(|&b| b == b'\r' || b == b'\n') {
        return Some(at + last_break + 1);
    }
    Some(trailing_whitespace(at, end, text_ends))
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
pub(crate) fn gpt2(bytes: &[u8], at: usize) -> Option<usize> {
    let first = class_at(bytes, at)?;
    if let Some(end) = contraction(bytes, at, false)? {
        return Some(end);
    }
    let (class, from) = match first {
        Class::NonAscii => return None,
        Class::Letter | Class::Digit | Class::Other => (first, at),
        Class::Space | Class::Newline => match class_at(bytes, at + 1) {
            Some(Class::NonAscii) if bytes[at] == b' ' => return None,
            Some(next @ (Class::Letter | Class::Digit | Class::Other)) if bytes[at] == b' ' => (next, at + 1),
            _ => {
                let (end, text_ends) = whitespace_run(bytes, at)?;
                return Some(trailing_whitespace(at, end, text_ends));
            }
        },
    };
    run_end(bytes, from, |c| c == class)
}

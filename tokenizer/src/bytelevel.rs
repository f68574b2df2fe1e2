//! GPT-2's byte-level alphabet: the reversible map between the 256 byte values
//! and printable characters that byte-level BPE vocabularies are written in.
//!
//! Bytes that are printable Latin-1 characters (`!`..=`~`, `¡`..=`¬`,
//! `®`..=`ÿ`) stand for themselves; the other 68 bytes map, in increasing
//! order, to U+0100, U+0101, and so on. So a space (0x20) is written `Ġ`
//! (U+0120) and a newline (0x0A) `Ċ` (U+010A).

/// Whether byte `b` is written as the character with the same code point.
const fn is_direct(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character that stands for each byte.
const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next_indirect = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let code = if is_direct(b as u8) {
            b as u32
        } else {
            next_indirect += 1;
            255 + next_indirect
        };
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
};

/// The highest code point in the alphabet (U+0143).
const MAX_CODE: usize = 0x143;

/// The byte each alphabet character stands for, indexed by code point; -1 if none.
const CHAR_TO_BYTE: [i16; MAX_CODE + 1] = {
    let mut table = [-1i16; MAX_CODE + 1];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// The alphabet character for a byte.
#[cfg(test)]
fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[usize::from(b)]
}

/// Decodes a vocabulary string written in the byte-level alphabet into raw
/// bytes; `None` if it contains a character outside the alphabet.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    text.chars()
        .map(|c| {
            let byte = CHAR_TO_BYTE.get(c as usize).copied().unwrap_or(-1);
            u8::try_from(byte).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        for b in 0..=255u8 {
            assert_eq!(decode(&byte_to_char(b).to_string()), Some(vec![b]));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(decode("Ġthe"), Some(b" the".to_vec()));
        assert_eq!(decode("日本"), None);
    }
}

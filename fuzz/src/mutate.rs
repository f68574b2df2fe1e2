//! Byte-level mutations of a corpus input: bit flips, interesting bytes and
//! numbers, deletions, duplications, dictionary words, splices with another
//! input and truncation, stacked one to four at a time. Deterministic for a seed.

/// A small, fast, seeded generator (xorshift64*).
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next_u64() % n as u64) as usize }
    }
}

const INTERESTING_BYTES: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'[', b']', b'0', b'-', b'\n'];
const INTERESTING_NUMBERS: &[&str] =
    &["0", "-1", "1", "65535", "4294967295", "4294967296", "-9223372036854775808", "1e309", "0.5", "NaN"];

/// One to four mutations of `base` (with `other` for splicing), at most `max_len` bytes long.
pub fn mutate(rng: &mut Rng, base: &[u8], other: &[u8], dictionary: &[&str], max_len: usize) -> Vec<u8> {
    let mut data = base.to_vec();
    for _ in 0..=rng.below(4) {
        mutate_once(rng, &mut data, other, dictionary);
    }
    data.truncate(max_len);
    data
}

fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], dictionary: &[&str]) {
    let len = data.len();
    match rng.below(9) {
        0 if len > 0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            data[at] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())];
        }
        2 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(16)).min(len);
            data.drain(start..end);
        }
        3 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(32)).min(len);
            let copy = data[start..end].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, copy);
        }
        4 if !dictionary.is_empty() => {
            let word = dictionary[rng.below(dictionary.len())].as_bytes();
            let at = rng.below(len + 1);
            data.splice(at..at, word.iter().copied());
        }
        5 => replace_number(rng, data),
        6 if !other.is_empty() => {
            let cut = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        7 if len > 0 => data.truncate(rng.below(len)),
        _ => {
            let at = rng.below(len + 1);
            let byte = (rng.next_u64() & 0xff) as u8;
            data.insert(at, byte);
        }
    }
}

/// Replaces a run of ASCII digits with an interesting number (or inserts one when there is none).
fn replace_number(rng: &mut Rng, data: &mut Vec<u8>) {
    let number = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())].as_bytes();
    let digits: Vec<usize> = data.iter().enumerate().filter(|(_, b)| b.is_ascii_digit()).map(|(i, _)| i).collect();
    if digits.is_empty() {
        let at = rng.below(data.len() + 1);
        data.splice(at..at, number.iter().copied());
        return;
    }
    let start = digits[rng.below(digits.len())];
    let end = data[start..].iter().position(|b| !b.is_ascii_digit()).map_or(data.len(), |offset| start + offset);
    data.splice(start..end, number.iter().copied());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutation_is_deterministic_for_a_seed_and_bounded() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..200).map(|_| mutate(&mut rng, b"{\"prompt\": 12}", b"[1,2]", &["null"], 64)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert!(run(3).iter().all(|input| input.len() <= 64));
        assert!(run(3).iter().any(|input| input != b"{\"prompt\": 12}"), "mutations change the input");
    }
}

//! The doctor's own names for token runs: a chain of 64-bit block hashes per prompt (block `i` names the
//! prompt's first `i + 1` blocks, as the v1 block hash does, but cheaply and with no cryptographic claim:
//! the doctor only compares a tenant's prompts with each other), content-defined segments whose hashes do
//! not depend on where the segment sits, and digests of short strings (scopes, users).

/// The SplitMix64 finalizer: a well-mixed 64-bit value from any input.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn absorb(state: u64, token: u32) -> u64 {
    (state.rotate_left(23) ^ u64::from(token)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A digest of bytes (a cache scope, a `user` value): FNV-1a, mixed.
pub fn digest(bytes: &[u8]) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64;
    for &byte in bytes {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(hash)
}

/// A digest of a run of tokens.
pub fn tokens_digest(tokens: &[u32]) -> u64 {
    mix(tokens.iter().fold(tokens.len() as u64, |state, &token| absorb(state, token)))
}

/// Hashes a token sequence block by block, and can go on with more tokens later (a reply).
#[derive(Clone, Debug)]
pub struct Chainer {
    block_size: usize,
    max_blocks: usize,
    state: u64,
    blocks: usize,
    tail: Vec<u32>,
}

impl Chainer {
    /// A chain seeded with `seed` (the request's cache scope: prompts of two scopes share no block),
    /// hashing at most `max_blocks` blocks.
    pub fn new(seed: u64, block_size: usize, max_blocks: usize) -> Chainer {
        let block_size = block_size.max(1);
        Chainer { block_size, max_blocks, state: mix(seed), blocks: 0, tail: Vec::with_capacity(block_size) }
    }

    /// Blocks hashed so far.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Appends `tokens`, pushing the hash of every block they complete onto `out`.
    pub fn push(&mut self, tokens: &[u32], out: &mut Vec<u64>) {
        for &token in tokens {
            if self.blocks >= self.max_blocks {
                return;
            }
            self.tail.push(token);
            if self.tail.len() == self.block_size {
                let state = self.tail.iter().fold(self.state, |state, &token| absorb(state, token));
                self.state = mix(state);
                self.tail.clear();
                self.blocks += 1;
                out.push(self.state);
            }
        }
    }
}

/// The content-defined segments of `tokens`: a segment ends after a token whose mixed value is 0 modulo 8
/// (or after 64 tokens), so the same text cut into segments gives the same segments wherever it sits.
/// Yields each segment's digest and length.
pub fn segments(tokens: &[u32]) -> impl Iterator<Item = (u64, usize)> + '_ {
    const MAX_SEGMENT: usize = 64;
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= tokens.len() {
            return None;
        }
        let rest = &tokens[start..];
        let len = rest
            .iter()
            .take(MAX_SEGMENT)
            .position(|&token| mix(u64::from(token)) & 7 == 0)
            .map_or(rest.len().min(MAX_SEGMENT), |end| end + 1);
        let segment = &rest[..len];
        start += len;
        Some((tokens_digest(segment), len))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_prefixes_and_goes_on_where_it_stopped() {
        let tokens: Vec<u32> = (0..100).collect();
        let mut whole = Vec::new();
        Chainer::new(7, 16, 100).push(&tokens, &mut whole);
        assert_eq!(whole.len(), 6);
        let mut parts = Chainer::new(7, 16, 100);
        let mut split = Vec::new();
        parts.push(&tokens[..21], &mut split);
        parts.push(&tokens[21..], &mut split);
        assert_eq!(split, whole, "pushed in two parts, the same chain");
        let mut other_scope = Vec::new();
        Chainer::new(8, 16, 100).push(&tokens, &mut other_scope);
        assert!(other_scope.iter().all(|hash| !whole.contains(hash)), "another seed shares no block");
        let mut changed = tokens.clone();
        changed[40] = 999;
        let mut different = Vec::new();
        Chainer::new(7, 16, 100).push(&changed, &mut different);
        assert_eq!(different[..2], whole[..2]);
        assert!(different[2..].iter().zip(&whole[2..]).all(|(a, b)| a != b), "a change renames every later block");
        let mut capped = Vec::new();
        Chainer::new(7, 16, 3).push(&tokens, &mut capped);
        assert_eq!(capped, whole[..3]);
    }

    #[test]
    fn segments_do_not_depend_on_where_the_text_sits() {
        let text: Vec<u32> = (0..400).map(|i| (i * 7919) % 5000).collect();
        let shifted: Vec<u32> = [&[1, 2, 3][..], &text].concat();
        let own: Vec<(u64, usize)> = segments(&text).collect();
        let later: Vec<(u64, usize)> = segments(&shifted).collect();
        assert_eq!(own.iter().map(|s| s.1).sum::<usize>(), 400);
        // After the first boundary, the shifted text is cut exactly as the text.
        let common = own.iter().filter(|segment| later.contains(segment)).count();
        assert!(common + 1 >= own.len(), "{common} of {} segments", own.len());
        assert!(own.iter().all(|&(_, len)| (1..=64).contains(&len)));
    }
}

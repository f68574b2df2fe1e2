//! The v1 block-hash contract (BRIEF §3): one definition, used by the gateway
//! to name a prompt's blocks and by the agents to register them.
//!
//! ```text
//! K[-1] = blake3::derive_key("kvroute/block-hash/v1",
//!           u32le(B) ‖ u32le(len(model)) ‖ model ‖ u32le(len(scope)) ‖ scope)
//! K[i]  = blake3::keyed_hash(K[i-1], u32le(t[iB]) ‖ … ‖ u32le(t[iB+B-1]))
//! hash(i) = first 16 bytes of K[i]
//! ```
//! Only full blocks are hashed; golden vectors in `testdata/` pin the contract.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::str::FromStr;

/// Tokens per block unless configured otherwise: the default of every component's `--block-size`.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// The largest block size the command lines accept (`--block-size`).
pub const MAX_BLOCK_SIZE: u32 = 1024;

/// The blake3 key-derivation context of contract version 1.
pub const CONTEXT_V1: &str = "kvroute/block-hash/v1";

/// The name of one full block of tokens: the first 16 bytes of its chain key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct BlockHash(pub [u8; 16]);

/// Hashes as its low 64 bits: a blake3 output is uniform already.
impl Hash for BlockHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.low_u64());
    }
}

/// A map keyed by block hashes that uses the key's own bits instead of hashing it again.
pub type BlockHashMap<V> = HashMap<BlockHash, V, BuildHasherDefault<BlockHashHasher>>;

/// The [`Hasher`] of [`BlockHashMap`]: passes a block hash's low 64 bits through.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }

    /// Other keys (not expected): FNV-1a, so the map still works.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl BlockHash {
    pub const LEN: usize = 16;

    /// Reads a hash from exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<BlockHash> {
        <[u8; 16]>::try_from(bytes).ok().map(BlockHash)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The first 8 bytes as a little-endian integer: a well-mixed key for
    /// hash maps that already know the value is a blake3 output.
    #[inline]
    pub fn low_u64(&self) -> u64 {
        let mut low = [0u8; 8];
        low.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(low)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({self})")
    }
}

/// Error parsing a [`BlockHash`] from hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a block hash is 32 hexadecimal characters")]
pub struct ParseBlockHashError;

impl FromStr for BlockHash {
    type Err = ParseBlockHashError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bytes = text.as_bytes();
        if bytes.len() != 32 {
            return Err(ParseBlockHashError);
        }
        let mut out = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let high = hex_value(pair[0]).ok_or(ParseBlockHashError)?;
            let low = hex_value(pair[1]).ok_or(ParseBlockHashError)?;
            out[i] = (high << 4) | low;
        }
        Ok(BlockHash(out))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// The 32-byte chain state `K[i]`: the key that hashes block `i + 1`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ChainKey([u8; 32]);

impl fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainKey({})", BlockHash(self.block_hash().0))
    }
}

impl ChainKey {
    /// `K[-1]`: the root of every chain for this block size, model and scope.
    pub fn root(block_size: u32, model: &str, scope: &[u8]) -> ChainKey {
        let mut material = Vec::with_capacity(12 + model.len() + scope.len());
        material.extend_from_slice(&block_size.to_le_bytes());
        material.extend_from_slice(&len_u32(model.len()).to_le_bytes());
        material.extend_from_slice(model.as_bytes());
        material.extend_from_slice(&len_u32(scope.len()).to_le_bytes());
        material.extend_from_slice(scope);
        ChainKey(blake3::derive_key(CONTEXT_V1, &material))
    }

    /// `K[i]` from `K[i-1]` and the tokens of block `i` (a full block).
    pub fn next(&self, block: &[u32]) -> ChainKey {
        // 16 tokens make exactly one 64-byte blake3 block; larger block sizes
        // fall back to a heap buffer.
        let mut stack = [0u8; 64];
        let mut heap;
        let bytes: &mut [u8] = if block.len() * 4 <= stack.len() {
            &mut stack[..block.len() * 4]
        } else {
            heap = vec![0u8; block.len() * 4];
            &mut heap
        };
        for (chunk, token) in bytes.chunks_exact_mut(4).zip(block) {
            chunk.copy_from_slice(&token.to_le_bytes());
        }
        ChainKey(*blake3::keyed_hash(&self.0, bytes).as_bytes())
    }

    /// The block hash named by this chain state (its first 16 bytes).
    pub fn block_hash(&self) -> BlockHash {
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.0[..16]);
        BlockHash(out)
    }
}

fn len_u32(len: usize) -> u32 {
    // Model ids and scopes are short strings; a length past u32 cannot be a
    // real input, so saturating keeps the function total without a panic.
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Hashes the full blocks of token sequences for one model, scope and block size.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    root: ChainKey,
    block_size: usize,
}

impl BlockHasher {
    /// A hasher for `block_size`-token blocks; `block_size` must be at least 1.
    pub fn new(block_size: u32, model: &str, scope: &[u8]) -> BlockHasher {
        BlockHasher { root: ChainKey::root(block_size, model, scope), block_size: block_size.max(1) as usize }
    }

    pub fn root(&self) -> ChainKey {
        self.root
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The hash of every full block of `tokens`, in chain order.
    pub fn hashes(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        let mut key = self.root;
        for block in tokens.chunks_exact(self.block_size) {
            key = key.next(block);
            out.push(key.block_hash());
        }
        out
    }

    /// Continues a chain: hashes the full blocks of `tokens` starting from the
    /// state `from`, returning the hashes and the final state.
    pub fn extend(&self, from: ChainKey, tokens: &[u32]) -> (Vec<BlockHash>, ChainKey) {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        let mut key = from;
        for block in tokens.chunks_exact(self.block_size) {
            key = key.next(block);
            out.push(key.block_hash());
        }
        (out, key)
    }
}

/// The hash of every full block of `tokens` (convenience for one-off use).
pub fn block_hashes(block_size: u32, model: &str, scope: &[u8], tokens: &[u32]) -> Vec<BlockHash> {
    BlockHasher::new(block_size, model, scope).hashes(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_blocks_are_hashed() {
        let tokens: Vec<u32> = (0..2003).collect();
        assert_eq!(block_hashes(16, "m", b"", &tokens).len(), 125);
    }

    #[test]
    fn hashes_are_a_chain() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[20] = 9999; // block 1 differs
        let ha = block_hashes(16, "m", b"", &a);
        let hb = block_hashes(16, "m", b"", &b);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[2], hb[2], "a change propagates to every later block");
    }

    #[test]
    fn model_scope_and_block_size_separate_chains() {
        let tokens: Vec<u32> = (0..32).collect();
        let base = block_hashes(16, "m", b"", &tokens);
        assert_ne!(base, block_hashes(16, "other", b"", &tokens));
        assert_ne!(base, block_hashes(16, "m", b"t:acme", &tokens));
        assert_ne!(base[0], block_hashes(8, "m", b"", &tokens)[1]);
    }

    #[test]
    fn extend_continues_the_same_chain() {
        let tokens: Vec<u32> = (0..80).collect();
        let hasher = BlockHasher::new(16, "m", b"s");
        let (first, state) = hasher.extend(hasher.root(), &tokens[..32]);
        let (rest, _) = hasher.extend(state, &tokens[32..]);
        let joined: Vec<_> = first.into_iter().chain(rest).collect();
        assert_eq!(joined, hasher.hashes(&tokens));
    }

    #[test]
    fn hex_round_trip() {
        let hash = block_hashes(16, "m", b"", &[7; 16])[0];
        let text = hash.to_string();
        assert_eq!(text.len(), 32);
        assert!(text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(text.parse::<BlockHash>(), Ok(hash));
        assert!("zz".parse::<BlockHash>().is_err());
        assert!("g".repeat(32).parse::<BlockHash>().is_err());
    }
}

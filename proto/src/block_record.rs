//! The KV block wire format: one self-describing record per block, as stored
//! in the shared network tier.
//!
//! ```text
//! offset size field
//!      0    4 magic "KVRB"
//!      4    2 format version (1), little-endian
//!      6    2 flags (0; no flag is defined, so any other value is refused)
//!      8   32 model fingerprint (model id + KV geometry + dtype + block size)
//!     40    4 block size in tokens
//!     44   16 block hash (v1)
//!     60    8 payload length in bytes
//!     68   32 blake3 checksum of the payload
//!    100    … payload: the block's stored K/V bytes, all layers
//! ```
//! A record that does not verify in every field is rejected: a reader treats
//! it as a miss and never uses its payload.

use crate::block_hash::BlockHash;
use crate::domain::KvGeometry;

pub const MAGIC: &[u8; 4] = b"KVRB";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 100;

/// Names a model and its KV layout: records of another fingerprint never load.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelFingerprint(pub [u8; 32]);

impl std::fmt::Debug for ModelFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelFingerprint({})", self.short_hex())
    }
}

impl ModelFingerprint {
    pub fn new(model_id: &str, geometry: &KvGeometry, block_size: u32) -> ModelFingerprint {
        let mut hasher = blake3::Hasher::new_derive_key("kvroute/model-fingerprint/v1");
        hasher.update(&(model_id.len() as u64).to_le_bytes());
        hasher.update(model_id.as_bytes());
        for value in [geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, block_size] {
            hasher.update(&value.to_le_bytes());
        }
        hasher.update(geometry.dtype.as_str().as_bytes());
        ModelFingerprint(*hasher.finalize().as_bytes())
    }

    /// The first 8 bytes in hex: enough to keep models apart in key names.
    pub fn short_hex(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Why a record was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record shorter than its header")]
    Truncated,
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version {0}")]
    BadVersion(u16),
    #[error("unknown flags {0:#06x}")]
    BadFlags(u16),
    #[error("record of another model or KV layout")]
    FingerprintMismatch,
    #[error("record of block size {0}")]
    BlockSizeMismatch(u32),
    #[error("record of another block")]
    HashMismatch,
    #[error("payload length {found} where {expected} was expected")]
    LengthMismatch { expected: u64, found: u64 },
    #[error("payload checksum does not match")]
    ChecksumMismatch,
}

/// Encodes one block's record.
pub fn encode(fingerprint: &ModelFingerprint, block_size: u32, hash: &BlockHash, payload: &[u8]) -> Vec<u8> {
    let mut out = encode_header(fingerprint, block_size, hash, payload);
    out.extend_from_slice(payload);
    out
}

/// The record's header alone: the record is this followed by `payload` (for writers that send the two
/// parts without joining them first).
pub fn encode_header(fingerprint: &ModelFingerprint, block_size: u32, hash: &BlockHash, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&fingerprint.0);
    out.extend_from_slice(&block_size.to_le_bytes());
    out.extend_from_slice(&hash.0);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(payload).as_bytes());
    out
}

/// What a reader expects of a record.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    pub fingerprint: &'a ModelFingerprint,
    pub block_size: u32,
    pub hash: &'a BlockHash,
    pub payload_len: u64,
}

/// Verifies every field of a record and returns its payload.
pub fn decode<'a>(record: &'a [u8], expected: &Expected<'_>) -> Result<&'a [u8], RecordError> {
    if record.len() < HEADER_LEN {
        return Err(RecordError::Truncated);
    }
    let (header, payload) = record.split_at(HEADER_LEN);
    verify_parts(header, payload, expected)?;
    Ok(payload)
}

/// Verifies a record held as its first [`HEADER_LEN`] bytes and the rest, as [`decode`] verifies it whole.
pub fn verify_parts(header: &[u8], payload: &[u8], expected: &Expected<'_>) -> Result<(), RecordError> {
    if header.len() != HEADER_LEN {
        return Err(RecordError::Truncated);
    }
    if &header[0..4] != MAGIC {
        return Err(RecordError::BadMagic);
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != VERSION {
        return Err(RecordError::BadVersion(version));
    }
    let flags = u16::from_le_bytes([header[6], header[7]]);
    if flags != 0 {
        return Err(RecordError::BadFlags(flags));
    }
    if header[8..40] != expected.fingerprint.0 {
        return Err(RecordError::FingerprintMismatch);
    }
    let block_size = u32::from_le_bytes([header[40], header[41], header[42], header[43]]);
    if block_size != expected.block_size {
        return Err(RecordError::BlockSizeMismatch(block_size));
    }
    if header[44..60] != expected.hash.0 {
        return Err(RecordError::HashMismatch);
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[60..68]);
    let declared = u64::from_le_bytes(len);
    if declared != expected.payload_len || payload.len() as u64 != declared {
        return Err(RecordError::LengthMismatch { expected: expected.payload_len, found: payload.len() as u64 });
    }
    if header[68..100] != *blake3::hash(payload).as_bytes() {
        return Err(RecordError::ChecksumMismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::KvDtype;

    fn fixture() -> (ModelFingerprint, BlockHash, Vec<u8>) {
        let geometry = KvGeometry { num_layers: 2, num_kv_heads: 1, head_dim: 4, dtype: KvDtype::Bf16 };
        let fingerprint = ModelFingerprint::new("m", &geometry, 16);
        let hash = crate::block_hashes(16, "m", b"", &[3; 16])[0];
        (fingerprint, hash, (0..64u8).collect())
    }

    #[test]
    fn round_trip() {
        let (fingerprint, hash, payload) = fixture();
        let record = encode(&fingerprint, 16, &hash, &payload);
        let expected = Expected { fingerprint: &fingerprint, block_size: 16, hash: &hash, payload_len: 64 };
        assert_eq!(decode(&record, &expected), Ok(&payload[..]));
    }

    #[test]
    fn a_record_split_after_its_header_verifies_as_a_whole_one_does() {
        let (fingerprint, hash, payload) = fixture();
        let mut record = encode(&fingerprint, 16, &hash, &payload);
        let expected = Expected { fingerprint: &fingerprint, block_size: 16, hash: &hash, payload_len: 64 };
        let (header, body) = record.split_at(HEADER_LEN);
        assert_eq!(verify_parts(header, body, &expected), Ok(()));
        assert_eq!(verify_parts(&header[..HEADER_LEN - 1], body, &expected), Err(RecordError::Truncated));
        let last = record.len() - 1;
        record[last] ^= 1;
        let (header, body) = record.split_at(HEADER_LEN);
        assert_eq!(verify_parts(header, body, &expected), Err(RecordError::ChecksumMismatch));
    }

    #[test]
    fn every_single_byte_corruption_is_detected() {
        let (fingerprint, hash, payload) = fixture();
        let record = encode(&fingerprint, 16, &hash, &payload);
        let expected = Expected { fingerprint: &fingerprint, block_size: 16, hash: &hash, payload_len: 64 };
        for index in 0..record.len() {
            let mut bad = record.clone();
            bad[index] ^= 0x40;
            assert!(decode(&bad, &expected).is_err(), "flipping byte {index} went unnoticed");
        }
        for len in 0..record.len() {
            assert!(decode(&record[..len], &expected).is_err());
        }
    }

    #[test]
    fn other_models_and_layouts_do_not_verify() {
        let (fingerprint, hash, payload) = fixture();
        let record = encode(&fingerprint, 16, &hash, &payload);
        let geometry = KvGeometry { num_layers: 2, num_kv_heads: 1, head_dim: 4, dtype: KvDtype::Fp8E4m3 };
        let other = ModelFingerprint::new("m", &geometry, 16);
        let expected = Expected { fingerprint: &other, block_size: 16, hash: &hash, payload_len: 64 };
        assert_eq!(decode(&record, &expected), Err(RecordError::FingerprintMismatch));
    }
}

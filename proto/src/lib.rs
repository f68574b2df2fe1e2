//! The contract between kvroute's gateway and its node-agents.
//!
//! Layout:
//! - [`pb`]: the generated gRPC code (`kvroute.v1`); the only place that knows prost.
//! - [`domain`]: validated types that wire messages convert into with `TryFrom`.
//! - [`block_hash`]: THE v1 block-hash function (BRIEF §3), used by both sides.
//! - [`block_record`]: the self-describing KV block record of the network tier.
//! - [`gguf`]: a reader for GGUF model files (metadata and tensors).
//!
//! Everything outside this crate works with domain types; a wire message that
//! does not validate is rejected with a precise [`domain::WireError`].

pub mod block_hash;
pub mod block_record;
pub mod domain;
pub mod gguf;

/// Generated protobuf and gRPC code for the `kvroute.v1` package.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pb {
    tonic::include_proto!("kvroute.v1");
}

/// Encoded `FileDescriptorSet` of every kvroute `.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kvroute_descriptor.bin"));

pub use block_hash::{BlockHash, BlockHashMap, BlockHasher, DEFAULT_BLOCK_SIZE, block_hashes};

//! kvroute's node-agent: the paged KV-cache engine of one replica.
//!
//! Layout:
//! - [`block_manager`]: which pool block holds what (ref counts, prefix cache, LRU eviction).
//! - [`model`]: a Llama-architecture transformer on the CPU with paged attention.

pub mod block_manager;
pub mod model;

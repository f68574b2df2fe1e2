//! kvroute's node-agent: the paged KV-cache engine of one replica.
//!
//! Layout:
//! - [`model`]: a Llama-architecture transformer on the CPU with paged attention.

pub mod model;

//! The engine's KV events: the agent subscribes to the ZeroMQ publisher of the engine it fronts (vLLM,
//! SGLang) and turns what the engine caches into kvroute's own [`KvEvent`](kvroute_proto::domain::KvEvent)s.
//!
//! Layout, from the wire up (all synchronous; only [`socket`] does I/O):
//! - [`zmtp`]: a sans-I/O ZMTP 3.x codec (NULL mechanism) for a SUB and a DEALER.
//! - [`socket`]: that codec over a blocking TCP stream with read timeouts, for the agent's event thread.
//! - [`frames`]: the engine's message shapes (published `[topic, seq, payload]`, the replay protocol).
//! - [`msgpack`]: a bounded MessagePack reader for the payloads.
//! - [`decode`]: a payload into an [`EngineBatch`](decode::EngineBatch), vLLM's and SGLang's layouts.
//! - [`salt`]: the `cache_salt` of a cache scope, and the registry mapping salts back to scopes.
//! - [`translate`]: the [`Translator`](translate::Translator), engine events into kvroute events.

pub mod decode;
pub mod frames;
pub mod msgpack;
pub mod salt;
pub mod socket;
pub mod translate;
pub mod zmtp;

#[cfg(test)]
mod captured;
#[cfg(test)]
mod sglang_captures;
#[cfg(test)]
mod vllm_captures;

pub use decode::{DecodeError, EngineBatch, EngineEvent, EngineKey, decode_batch};
pub use salt::{one_off_salt, salt_for_scope};
pub use translate::{Counters, Source, Step, Translator, TranslatorConfig};

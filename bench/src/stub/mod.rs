//! kvroute-stub: an OpenAI-compatible engine that answers at once with a canned reply, for measuring what
//! a router itself costs (on a real engine the router's milliseconds drown in the engine's noise). It keeps
//! a real prefix cache of the prompts it is sent ([`cache`]), reports the cached tokens in each answer's
//! usage as vLLM does, and publishes its cache events on a ZeroMQ PUB socket in vLLM's format ([`events`],
//! [`publisher`]), so kvroute's agent (`--engine vllm`) and vllm-router's `kv_aware` can front it as they
//! front vLLM. The HTTP API is in [`server`].

pub mod cache;
pub mod events;
pub mod publisher;
pub mod server;

//! `kvroute-sim`: routing quality at fleet scale, in virtual time, with kvroute's own code.
//!
//! Each simulated replica is the node-agent's [`Engine`](kvroute_node_agent::engine::Engine) (continuous
//! batching, admission, preemption, block manager, host tier, write-through) on a cost-model executor;
//! the gateway's prefix index and routing policies decide where each request goes from the replicas'
//! own KV events. Only the arithmetic (replaced by [`profile`] costs) and Redis (a shared LRU store,
//! [`network`]) are modelled.
//!
//! - [`profile`]: cost profiles; [`executor`]: the cost-model executor;
//! - [`plan`]: traces, synthetic sessions and the shared-prefix experiment as token ids;
//! - [`fleet`]: one run of one policy; [`report`]: results, table and JSON; [`plot`]: SVG charts.

pub mod executor;
pub mod fleet;
pub mod network;
pub mod plan;
pub mod plot;
pub mod profile;
pub mod report;

pub use fleet::{Fleet, FleetConfig, MODEL_ID};
pub use plan::{Plan, SharedPrefix};
pub use profile::CostProfile;
pub use report::{PolicyResult, SimReport};

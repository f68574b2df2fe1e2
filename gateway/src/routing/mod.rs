//! The routing core: the prefix index, the policies that score replicas, and
//! the traffic sketches behind two metrics. Synchronous and free of I/O: the
//! async shell feeds it events and load, passes time in as [`Millis`] and
//! randomness as a [`RandomSource`], and the simulator replays it.
//!
//! - [`index`]: which replica holds which block in which tier; lock-free reads.
//! - [`load`]: each replica's load: its latest report plus the requests sent that it does not count yet.
//! - [`scoring`]: request and replica inputs, the decision, the TTFT model.
//! - [`cache_aware`]: the default policy; [`policy`]: every policy by name, the baselines.
//! - [`prefix_hash`], [`approx_radix`]: the two stateful baselines.
//! - [`sketch`]: the repeated-prefix ratio (the prefix-cache doctor, `crate::doctor`, says why it is what
//!   it is).
//! - [`rng`]: the injected random source.

pub mod approx_radix;
pub mod cache_aware;
mod huge_pages;
pub mod index;
pub mod load;
mod pending;
pub mod policy;
pub mod policy_kind;
pub mod prefix_hash;
pub mod rng;
pub mod scoring;
pub mod sketch;
mod table;

/// A replica's dense id, assigned by the caller (below the index's `max_replicas`).
pub type ReplicaId = u16;

/// Milliseconds from an origin the caller chooses (monotonic in practice).
pub type Millis = u64;

pub use index::{DEFAULT_PENDING_TTL_MS, IndexConfig, IndexError, IndexStats, LookupResult, PrefixIndex, ReplicaMatch};
pub use load::{LoadLedger, SendTicket, TrackedLoad};
pub use policy::Policy;
pub use policy_kind::{PolicyKind, UnknownPolicy};
pub use rng::{RandomSource, SplitMix64};
pub use scoring::{
    CandidateScore, CostTerms, Decision, Exclusion, Prediction, ReplicaView, RouteRequest, ScoringConfig, fleet_rates,
};
pub use sketch::{PrefixSketch, SketchConfig};

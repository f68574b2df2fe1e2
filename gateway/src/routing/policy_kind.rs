//! The routing policies' names: which policy, without its state, as the command line and the metrics
//! spell it.

use std::fmt;

/// Which policy, without its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Minimum predicted TTFT from tiered matches, queue and rates.
    CacheAware,
    RoundRobin,
    Random,
    /// Fewest queued plus running requests.
    LeastLoaded,
    /// Consistent hashing of the leading blocks with bounded loads.
    PrefixHash,
    /// SGLang-style: a tree built from this gateway's own routing history.
    ApproxRadix,
    /// Dynamo's KV router cost: weighted prefill blocks plus decode blocks.
    Dynamo,
    /// llm-d's default scorers: prefix 3, queue 2, KV utilisation 2.
    Llmd,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::CacheAware,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::LeastLoaded,
        PolicyKind::PrefixHash,
        PolicyKind::ApproxRadix,
        PolicyKind::Dynamo,
        PolicyKind::Llmd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::LeastLoaded => "least_loaded",
            PolicyKind::PrefixHash => "prefix_hash",
            PolicyKind::ApproxRadix => "approx_radix",
            PolicyKind::Dynamo => "dynamo",
            PolicyKind::Llmd => "llmd",
        }
    }

    pub fn from_name(name: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Every policy name, the default first.
    pub fn names() -> [&'static str; 8] {
        PolicyKind::ALL.map(PolicyKind::name)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not one of [`PolicyKind::names`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown routing policy {name:?}; expected one of {}", PolicyKind::names().join(", "))]
pub struct UnknownPolicy {
    pub name: String,
}

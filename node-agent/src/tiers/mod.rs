//! The tiers below the engine's pool: G2 host RAM ([`host`]) and the G3
//! network tier shared by all agents ([`network`]).

pub mod host;
pub mod network;
pub mod resp;
pub mod resp_client;
pub mod resp_cluster;

//! Workloads for measuring kvroute, shared by the load generator and the simulator: Mooncake-format request
//! traces ([`trace`]) and synthetic application workloads ([`workload`]).

pub mod trace;
pub mod workload;

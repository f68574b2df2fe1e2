//! Workloads for measuring kvroute: Mooncake-format request traces ([`trace`]), shared by the load generator
//! and the simulator.

pub mod trace;

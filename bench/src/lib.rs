//! Measuring kvroute: workloads shared by the load generator and the simulator (Mooncake-format request
//! traces in [`trace`], synthetic application workloads in [`workload`]), the HTTP [`driver`] of the load
//! generator `kvroute-load`, and its [`report`].

pub mod driver;
pub mod report;
pub mod trace;
pub mod workload;

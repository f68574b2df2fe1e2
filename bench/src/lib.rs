//! Measuring kvroute: workloads shared by the load generator and the simulator (Mooncake-format request
//! traces in [`trace`], synthetic application workloads in [`workload`]), the HTTP [`driver`] of the load
//! generator `kvroute-load`, and its [`report`]; the fleet simulator `kvroute-sim` in [`sim`]; the stub engine
//! `kvroute-stub` that routers' own costs are measured against, in [`stub`].

pub mod driver;
pub mod report;
pub mod sim;
pub mod stub;
pub mod trace;
pub mod workload;

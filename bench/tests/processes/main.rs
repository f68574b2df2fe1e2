//! kvroute-bench's tests that start processes (a gateway and a node-agent for kvroute-load, the
//! kvroute-sim command), in one test binary. Each module was a test file of its own and keeps its name
//! (`load_cluster::...`, `sim::...`).

mod load_cluster;
mod sim;
mod stub;

//! app: what the `hindsight` binary serves, apart from the tree: the daemon (the HTTP API and the
//! tree behind it per tenant), the main job, the benchmarks, the HTML report, metrics and
//! logging. The binary itself is `main.rs` and `cli/` in this folder. Nothing in the tree (the
//! actors, the supervisor, the run interpreter, chaos) depends on this module.

pub mod adaptive;
pub mod api;
pub mod backend;
pub mod bench;
pub mod demo;
pub mod drift;
pub mod metrics;
pub mod overhead;
pub mod report;
pub mod telemetry;
pub mod workload;

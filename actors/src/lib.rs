//! hindsight-actors: the imperative shell of hindsight on ractor: the supervision tree, the
//! actors that own state, the ReflectRetry plugin, fault injection and the HTTP API.

pub mod api;
pub mod metrics;
pub mod report;
pub mod telemetry;

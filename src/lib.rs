//! hindsight: the functional core of a runtime for tool-using agents that learn from their own
//! experience.
//!
//! Everything that decides lives here as plain functions and structs, deterministic given its
//! inputs and a seeded [`fastrand::Rng`]: classifying failures ([`triage`]), storing records
//! durably ([`store`]), remembering ([`memory`]), learning ([`learn`]), calling tools ([`tools`])
//! and models ([`model`]), guarding inputs ([`guard`]) and configuration ([`config`]). The actors
//! that run it live in the `hindsight-actors` crate; this crate never depends on them.

pub mod config;
pub mod guard;
pub mod learn;
pub mod memory;
pub mod model;
pub mod record;
pub mod run;
pub mod store;
pub mod taxonomy;
pub mod tools;
pub mod triage;

pub use record::*;
pub use taxonomy::*;

/// The text of a caught panic's payload (`panic!` with a literal or a formatted message).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("no message")
}

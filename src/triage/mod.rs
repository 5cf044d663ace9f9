//! Failure triage: the error classifier, the trajectory classifier, failure policies and their
//! strategies, and the recovery loop.

pub mod error;

pub use error::classify_error;

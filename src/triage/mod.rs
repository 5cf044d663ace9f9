//! Failure triage: the error classifier, the trajectory classifier, failure policies and their
//! strategies, and the recovery loop.

use crate::taxonomy::{ErrorClass, ErrorClassification, FailureCategory};

/// Classifies one error by its type name and message.
///
/// Interim rules; the triage issue replaces this with the full rule set (same signature).
pub fn classify_error(error_type: Option<&str>, message: &str) -> ErrorClassification {
    let m = message.to_ascii_lowercase();
    let t = error_type.unwrap_or("").to_ascii_lowercase();
    let (category, error_class, rule) = if t.contains("timeout") || m.contains("timed out") {
        (FailureCategory::Infrastructure, ErrorClass::Timeout, "timeout")
    } else if m.contains("429") || m.contains("rate limit") {
        (FailureCategory::Infrastructure, ErrorClass::RateLimit, "rate_limit")
    } else if m.contains("503") || m.contains("502") || m.contains("connection") {
        (FailureCategory::Infrastructure, ErrorClass::TransientNetwork, "network")
    } else if m.contains("not found") {
        (FailureCategory::Strategy, ErrorClass::NotFound, "not_found")
    } else if m.contains("invalid") || m.contains("validation") {
        (FailureCategory::Strategy, ErrorClass::SchemaMismatch, "validation")
    } else {
        (FailureCategory::Unknown, ErrorClass::DeterministicFailure, "unknown")
    };
    ErrorClassification {
        category,
        error_class,
        confidence: 0.5,
        rule: rule.to_string(),
    }
}

//! report: what happens during a run as plugins see it (events, the round's report) and their
//! verdict on it; and ReflectRetry's judgement of a round, which sends a run back with a
//! reflection message while it has retries left.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ErrorClass;
use crate::config::ReflectRetryConfig;

/// Something that happened during a run, as plugins see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// A stage's tool call finished well.
    StepSucceeded {
        /// The stage.
        stage: String,
        /// The tool.
        tool: String,
    },
    /// A stage's tool call failed.
    Error {
        /// The stage.
        stage: String,
        /// The tool.
        tool: String,
        /// The class of the error.
        class: ErrorClass,
        /// The message.
        message: String,
    },
    /// Validation passed or failed.
    Validation {
        /// Whether the output passed.
        passed: bool,
        /// Why not, when it did not.
        reason: Option<String>,
    },
    /// The triage loop chose a recovery.
    Recovery {
        /// The failure type.
        failure: String,
        /// The action kind.
        action: String,
    },
}

/// What a run looks like to `after_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run.
    pub run_id: String,
    /// The 1-based round of ReflectRetry this report closes.
    pub round: u32,
    /// Whether the run passed validation.
    pub passed: bool,
    /// Everything that happened in this round.
    pub events: Vec<RunEvent>,
}

/// A plugin's answer to a finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    /// Let the result stand.
    Accept,
    /// Send the run back to the orchestrator with this reflection in its context.
    Retry {
        /// Which retry this is (1-based).
        attempt: u32,
        /// The reflection message.
        reflection: String,
    },
}

/// Judges a finished run by its events: `Ok(())` or `Err(reason)`.
pub type RunValidator = Arc<dyn Fn(&[RunEvent]) -> Result<(), String> + Send + Sync>;

/// The default validator: the run's last validation, if it failed, is an error with its reason
/// (an earlier failure that a recovery fixed is not).
pub fn default_validator() -> RunValidator {
    Arc::new(|events: &[RunEvent]| {
        let last = events.iter().rev().find_map(|e| match e {
            RunEvent::Validation { passed, reason } => Some((*passed, reason.clone())),
            _ => None,
        });
        match last {
            Some((false, reason)) => {
                Err(reason.unwrap_or_else(|| "the output failed validation".to_string()))
            }
            _ => Ok(()),
        }
    })
}

/// Fills the template.
pub fn render_reflection(template: &str, attempt: u32, max: u32, reason: &str) -> String {
    template
        .replace("{attempt}", &attempt.to_string())
        .replace("{max}", &max.to_string())
        .replace("{reason}", reason)
}

/// Why ReflectRetry would send a round back: the validator's reason, or (for a round that did
/// not pass) its last error; `None` when the round stands.
fn reflect_reason(validator: &RunValidator, passed: bool, events: &[RunEvent]) -> Option<String> {
    if let Err(reason) = validator(events) {
        return Some(reason);
    }
    if passed {
        return None;
    }
    events.iter().rev().find_map(|e| match e {
        RunEvent::Error {
            stage,
            tool,
            class,
            message,
        } => Some(format!("{stage}: {tool} failed ({class}): {message}")),
        _ => None,
    })
}

/// ReflectRetry's verdict on `report` given the retries the run already had (`done`): the
/// verdict and the run's retry count after it. A report handled twice (re-sent after a crash) is
/// recognised by its round and gets the same retry again.
pub fn reflect_verdict(
    config: &ReflectRetryConfig,
    validator: &RunValidator,
    report: &RunReport,
    done: u32,
) -> (Verdict, u32) {
    let Some(reason) = reflect_reason(validator, report.passed, &report.events) else {
        return (Verdict::Accept, done);
    };
    let attempt = if report.round <= done {
        report.round
    } else {
        done + 1
    };
    if attempt > config.max_retries {
        return (Verdict::Accept, done);
    }
    let verdict = Verdict::Retry {
        attempt,
        reflection: render_reflection(&config.template, attempt, config.max_retries, &reason),
    };
    (verdict, done.max(attempt))
}

//! The ReflectRetry plugin: validates every finished run and, when the run had error events or
//! its validator says `Err(reason)`, sends it back to the orchestrator with a reflection message,
//! up to `max_retries` times per run. Retry counts are persisted before each verdict.

use std::sync::Arc;

use hindsight::store::{KvTable, Store};

use crate::plugin::{Plugin, PluginError, RunEvent, RunReport, Verdict};

/// The table holding each run's retry count.
pub const RETRY_COUNTS: KvTable = KvTable::new("reflect_retry_counts");

pub use hindsight::config::{DEFAULT_REFLECT_TEMPLATE as DEFAULT_TEMPLATE, ReflectRetryConfig};

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

/// The ReflectRetry plugin.
pub struct ReflectRetry {
    config: ReflectRetryConfig,
    validator: RunValidator,
    store: Store,
}

impl ReflectRetry {
    /// A plugin judging runs with `validator` that persists its retry counts in `store`.
    pub fn new(config: ReflectRetryConfig, validator: RunValidator, store: Store) -> ReflectRetry {
        ReflectRetry {
            config,
            validator,
            store,
        }
    }

    /// Why the run should be retried, if it should: the validator's reason; else, for a run that
    /// did not pass, its last error event (error events alone trigger a reflection). A run that
    /// passed after recovering from errors is not sent back.
    fn reason(&self, passed: bool, events: &[RunEvent]) -> Option<String> {
        if let Err(reason) = (self.validator)(events) {
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
}

impl Plugin for ReflectRetry {
    fn name(&self) -> &str {
        "reflect_retry"
    }

    async fn after_run(&mut self, report: &RunReport) -> Result<Verdict, PluginError> {
        let Some(reason) = self.reason(report.passed, &report.events) else {
            return Ok(Verdict::Accept);
        };
        // The count is keyed by run and persisted before the verdict, so a restart of this actor
        // (or of the process) never grants a run more than `max_retries` retries. A message
        // handled twice (the caller re-sends after a crash) is recognised by its round.
        let done: u32 = self.store.get(RETRY_COUNTS, &report.run_id)?.unwrap_or(0);
        let attempt = if report.round <= done {
            report.round
        } else {
            done + 1
        };
        if attempt > self.config.max_retries {
            return Ok(Verdict::Accept);
        }
        if attempt > done {
            self.store
                .put(RETRY_COUNTS, &report.run_id, &attempt)
                .await?;
        }
        Ok(Verdict::Retry {
            attempt,
            reflection: render_reflection(
                &self.config.template,
                attempt,
                self.config.max_retries,
                &reason,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight::ErrorClass;

    fn error() -> RunEvent {
        RunEvent::Error {
            stage: "extract".into(),
            tool: "ocr".into(),
            class: ErrorClass::Timeout,
            message: "timed out".into(),
        }
    }

    #[test]
    fn the_template_is_filled() {
        assert_eq!(
            render_reflection(DEFAULT_TEMPLATE, 1, 2, "no header"),
            "[Reflect & Retry - Attempt 1/2] no header\n\nPlease try again, adjusting your approach."
        );
    }

    #[test]
    fn only_the_last_validation_counts() {
        let v = default_validator();
        let fixed = [
            RunEvent::Validation {
                passed: false,
                reason: Some("bad".into()),
            },
            RunEvent::Validation {
                passed: true,
                reason: None,
            },
        ];
        assert_eq!(v(&fixed), Ok(()));
        let broken = [RunEvent::Validation {
            passed: false,
            reason: Some("bad".into()),
        }];
        assert_eq!(v(&broken), Err("bad".to_string()));
    }

    #[tokio::test]
    async fn error_events_trigger_only_runs_that_did_not_pass() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let mut rr = ReflectRetry::new(ReflectRetryConfig::default(), default_validator(), store);
        let failed = RunReport {
            run_id: "r1".into(),
            round: 1,
            passed: false,
            events: vec![error()],
        };
        assert!(matches!(
            rr.after_run(&failed).await.unwrap(),
            Verdict::Retry { attempt: 1, .. }
        ));
        let passed = RunReport {
            run_id: "r2".into(),
            round: 1,
            passed: true,
            events: vec![error()],
        };
        assert_eq!(rr.after_run(&passed).await.unwrap(), Verdict::Accept);
        // Rounds beyond max_retries stand.
        let second = RunReport {
            run_id: "r1".into(),
            round: 2,
            passed: false,
            events: vec![error()],
        };
        assert!(matches!(
            rr.after_run(&second).await.unwrap(),
            Verdict::Retry { attempt: 2, .. }
        ));
        let third = RunReport {
            round: 3,
            ..second.clone()
        };
        assert_eq!(rr.after_run(&third).await.unwrap(), Verdict::Accept);
    }
}

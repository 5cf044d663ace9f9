//! The ReflectRetry plugin: validates every finished run and, when the run had error events or
//! its validator says `Err(reason)`, sends it back to the orchestrator with a reflection message,
//! up to `max_retries` times per run. Retry counts are persisted before each verdict.

use hindsight::store::{KvTable, Store};

use crate::plugin::{Plugin, PluginError, RunReport, Verdict};

/// The table holding each run's retry count.
pub const RETRY_COUNTS: KvTable = KvTable::new("reflect_retry_counts");

pub use hindsight::config::{DEFAULT_REFLECT_TEMPLATE as DEFAULT_TEMPLATE, ReflectRetryConfig};

pub use hindsight::run::{RunValidator, default_validator, render_reflection};

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
}

impl Plugin for ReflectRetry {
    fn name(&self) -> &str {
        "reflect_retry"
    }

    async fn after_run(&mut self, report: &RunReport) -> Result<Verdict, PluginError> {
        // The count is keyed by run and persisted before the verdict, so a restart of this actor
        // (or of the process) never grants a run more than `max_retries` retries.
        let done: u32 = self.store.get(RETRY_COUNTS, &report.run_id)?.unwrap_or(0);
        let (verdict, now) =
            hindsight::run::reflect_verdict(&self.config, &self.validator, report, done);
        if now > done {
            self.store.put(RETRY_COUNTS, &report.run_id, &now).await?;
        }
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hindsight::ErrorClass;
    use hindsight::run::RunEvent;

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

//! How the tree turns a failed attempt into a recovery, through the core's triage: the attempt's
//! trajectory is classified by the [`RulesClassifier`] into a [`FailureType`] and the
//! [`FailurePolicy`] (per-run counters kept in the run's checkpoint) picks a [`RecoveryAction`].

use std::path::Path;

use crate::triage::classify::{Classification, Classifier, FailureInput, RulesClassifier};
use crate::triage::config::{PolicyError, PolicyFile};
use crate::triage::context::RunError;
use crate::triage::policy::{FailureContext, FailurePolicy, PolicyState};
use crate::{ErrorClass, FailureCategory, FailureType, RecoveryAction, Task, Trajectory};

/// The tree's failure policy, embedded (see `config/tree_policy.toml`).
pub const TREE_POLICY: &str = include_str!("../../config/tree_policy.toml");

/// A failed attempt, as the failure policy sees it.
#[derive(Debug, Clone)]
pub struct AttemptFailure {
    /// The steps of the attempt.
    pub trajectory: Trajectory,
    /// The index of the stage that failed.
    pub stage: usize,
    /// What happened.
    pub message: String,
    /// The error's type name.
    pub error_type: Option<String>,
    /// The error's class, when the tool or the validator said it.
    pub class: Option<ErrorClass>,
    /// Whose fault it was.
    pub category: FailureCategory,
    /// How long the tool asked to wait, if it did.
    pub retry_after_ms: Option<u64>,
    /// The failure type and rule, when the machine already judged them (an agent's answer
    /// found to cite a value no tool returned, say); the classifier is then not asked.
    pub classified: Option<(FailureType, String)>,
}

/// The failure type of an attempt and the action chosen for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The failure type.
    pub failure: FailureType,
    /// The rule of the classifier that decided.
    pub rule: String,
    /// The recovery.
    pub action: RecoveryAction,
}

/// The tree's classifier and failure policy.
#[derive(Debug, Clone)]
pub struct TriageSetup {
    classifier: RulesClassifier,
    policy: FailurePolicy,
    manifest: String,
    /// Whether a recovery's words (hint, tool manifest, subgoal) reach an agent's model.
    hints: bool,
}

impl Default for TriageSetup {
    fn default() -> Self {
        match TriageSetup::parse(TREE_POLICY, "(embedded) config/tree_policy.toml") {
            Ok(t) => t,
            // The embedded file is checked by a test; should it ever fail, every failure
            // escalates rather than the tree refusing to start.
            Err(e) => {
                tracing::error!(error = %e, "the embedded tree policy is invalid; failures escalate");
                TriageSetup {
                    classifier: RulesClassifier::default(),
                    policy: FailurePolicy::new(),
                    manifest: String::new(),
                    hints: true,
                }
            }
        }
    }
}

impl TriageSetup {
    /// A setup from a policy file's text; errors name the file and the key.
    pub fn parse(text: &str, file: &str) -> Result<TriageSetup, PolicyError> {
        let pf = PolicyFile::parse(text, file)?;
        TriageSetup::from_file(pf)
    }

    /// A setup from a parsed policy file; its `[limits] tool_manifest`, if any, is the manifest.
    fn from_file(pf: PolicyFile) -> Result<TriageSetup, PolicyError> {
        Ok(TriageSetup {
            classifier: pf.rules_classifier()?,
            manifest: pf.limits.tool_manifest.unwrap_or_default(),
            policy: pf.policy,
            hints: true,
        })
    }

    /// A setup from a policy file.
    pub fn load(path: &Path) -> Result<TriageSetup, PolicyError> {
        TriageSetup::from_file(PolicyFile::load(path)?)
    }

    /// The tool manifest injected on `retry_with_tool_manifest`.
    pub fn with_manifest(mut self, manifest: String) -> TriageSetup {
        self.manifest = manifest;
        self
    }

    /// The same setup whose recoveries reach an agent's model without words: the recovery
    /// (retry, replan, resume) still happens, but no hint, manifest or subgoal is said (to
    /// measure what the words contribute; see [`crate::learn::Mechanism::Hints`]).
    pub fn without_hints(mut self) -> TriageSetup {
        self.hints = false;
        self
    }

    /// Whether a recovery's words reach an agent's model.
    pub fn hints(&self) -> bool {
        self.hints
    }

    /// Whether a tool manifest is set. Without one, `retry_with_tool_manifest` retries the
    /// same arm (there is nothing to inject), which is why the tree sets its workflow's.
    pub fn has_manifest(&self) -> bool {
        !self.manifest.is_empty()
    }

    /// Classifies a failed attempt. The trajectory classifier decides (loops, plan incomplete,
    /// context overflow, ...); where the tool or the validator already said the error's class,
    /// that class is trusted over a re-reading of the message.
    pub fn classify(&self, task: &Task, failure: &AttemptFailure) -> (FailureType, String) {
        if let Some(judged) = &failure.classified {
            return judged.clone();
        }
        let error = RunError {
            message: failure.message.clone(),
            error_type: failure.error_type.clone(),
            retry_after_ms: failure.retry_after_ms,
        };
        let input = FailureInput {
            trajectory: &failure.trajectory,
            error: Some(&error),
            claims: &[],
            goal: Some(&task.goal),
            output: None,
        };
        let verdict = self.classifier.classify(&input);
        let (ft, rule) = verdict
            .map(|c| (c.failure_type, c.rule))
            .unwrap_or((FailureType::Unknown, "none".to_string()));
        let structural = matches!(
            ft,
            FailureType::LoopDetected
                | FailureType::ContextOverflow
                | FailureType::PlanIncomplete
                | FailureType::HallucinatedState
                | FailureType::ConstraintIgnored
        );
        if structural {
            return (ft, rule);
        }
        let by_class = match (failure.category, failure.class) {
            (FailureCategory::Infrastructure, Some(ErrorClass::Timeout)) => {
                Some(FailureType::Timeout)
            }
            (FailureCategory::Infrastructure, _) => Some(FailureType::ExternalFault),
            (_, Some(ErrorClass::ToolNotFit | ErrorClass::NotFound)) => {
                Some(FailureType::WrongToolCalled)
            }
            (_, Some(ErrorClass::SchemaMismatch)) => Some(FailureType::SchemaMismatch),
            (_, Some(ErrorClass::Timeout)) => Some(FailureType::Timeout),
            (_, Some(ErrorClass::DeterministicFailure | ErrorClass::Auth)) => {
                Some(FailureType::Unknown)
            }
            _ => None,
        };
        match by_class {
            Some(t) if t != ft => (
                t,
                format!(
                    "error_class_{}",
                    failure.class.map(|c| c.as_str()).unwrap_or("unknown")
                ),
            ),
            _ => (ft, rule),
        }
    }

    /// The loop the end of `trajectory` shows, if any: the classifier's `loop_window` last tool
    /// calls with the same tool and arguments, or the same tool failing the same way.
    pub fn loop_in(&self, trajectory: &Trajectory) -> Option<Classification> {
        self.classifier.loop_detected(trajectory)
    }

    /// The classifier's verdict on an agent's answer `output` (plan incomplete, a constraint
    /// broken, the goal drifted from), `None` when it is fine.
    pub fn judge_answer(
        &self,
        task: &Task,
        trajectory: &Trajectory,
        output: &serde_json::Value,
    ) -> Option<Classification> {
        self.classifier.classify(&FailureInput {
            trajectory,
            error: None,
            claims: &[],
            goal: Some(&task.goal),
            output: Some(output),
        })
    }

    /// Classifies the failure and asks the policy for the recovery. `state` holds the run's
    /// per-failure-type counters; `occurrence` is how many failures of this type the run has had.
    pub fn decide(
        &self,
        task: &Task,
        failure: &AttemptFailure,
        state: &mut PolicyState,
        occurrence: impl Fn(FailureType) -> u32,
        rng: &mut fastrand::Rng,
    ) -> Decision {
        let (ft, rule) = self.classify(task, failure);
        if failure.error_type.as_deref() == Some("InDoubt") {
            return Decision {
                failure: ft,
                rule: "in_doubt".to_string(),
                action: RecoveryAction::Escalate {
                    message: failure.message.clone(),
                },
            };
        }
        let classification = crate::triage::classify::Classification {
            failure_type: ft,
            error: None,
            rule: rule.clone(),
            step_index: failure.trajectory.last().map(|s| s.index),
            message: failure.message.clone(),
        };
        let ctx = FailureContext {
            failure: &classification,
            trajectory: &failure.trajectory,
            occurrence: occurrence(ft) + 1,
            retry_after_ms: failure.retry_after_ms,
            manifest: (!self.manifest.is_empty()).then_some(self.manifest.as_str()),
        };
        let action = self.policy.decide(&ctx, state, rng);
        Decision {
            failure: ft,
            rule,
            action,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_tree_policy_parses() {
        TriageSetup::parse(TREE_POLICY, "tree_policy.toml").unwrap();
    }

    #[test]
    fn a_policy_files_own_manifest_is_kept_and_the_embedded_one_has_none() {
        // The tree gives a setup without a manifest its workflow's (see `tree::build`).
        assert!(!TriageSetup::default().has_manifest());
        let own = format!("{TREE_POLICY}\n").replace(
            "[limits]\n",
            "[limits]\ntool_manifest = \"search: web_search\"\n",
        );
        assert!(TriageSetup::parse(&own, "own.toml").unwrap().has_manifest());
    }
}

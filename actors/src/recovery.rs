//! How the tree turns a failed attempt into a recovery: the attempt's trajectory is classified
//! into a [`FailureType`] and the failure policy picks a [`RecoveryAction`].

use std::collections::BTreeMap;

use hindsight::{ErrorClass, FailureCategory, FailureType, RecoveryAction, Task, Trajectory};

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
    /// The error's class, when known.
    pub class: Option<ErrorClass>,
    /// Whose fault it was.
    pub category: FailureCategory,
}

/// The failure type of an attempt and the action chosen for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The failure type.
    pub failure: FailureType,
    /// The recovery.
    pub action: RecoveryAction,
}

/// The tree's failure classifier and policy.
#[derive(Debug, Clone)]
pub struct TriageSetup {
    actions: BTreeMap<FailureType, RecoveryAction>,
}

impl Default for TriageSetup {
    fn default() -> Self {
        let replan = |hint: &str| RecoveryAction::Replan {
            hint: hint.to_string(),
        };
        let mut actions = BTreeMap::new();
        actions.insert(
            FailureType::ExternalFault,
            RecoveryAction::Retry {
                hint: None,
                inject: None,
                delay_ms: 0,
            },
        );
        actions.insert(
            FailureType::WrongToolCalled,
            replan("Re-run using only tools in the current manifest that fit this input."),
        );
        actions.insert(
            FailureType::SchemaMismatch,
            replan("The output broke the data contract: use another strategy for this stage."),
        );
        actions.insert(
            FailureType::Timeout,
            replan("The stage timed out: use a faster strategy."),
        );
        actions.insert(
            FailureType::Unknown,
            replan("The stage failed: try another strategy."),
        );
        TriageSetup { actions }
    }
}

impl TriageSetup {
    /// Classifies a failed attempt.
    pub fn classify(&self, failure: &AttemptFailure) -> FailureType {
        if failure.error_type.as_deref() == Some("InDoubt") {
            return FailureType::Unknown;
        }
        match (failure.category, failure.class) {
            (FailureCategory::Infrastructure, Some(ErrorClass::Timeout)) => FailureType::Timeout,
            (FailureCategory::Infrastructure, _) => FailureType::ExternalFault,
            (_, Some(ErrorClass::ToolNotFit | ErrorClass::NotFound)) => FailureType::WrongToolCalled,
            (_, Some(ErrorClass::SchemaMismatch)) => FailureType::SchemaMismatch,
            (_, Some(ErrorClass::Timeout)) => FailureType::Timeout,
            _ => FailureType::Unknown,
        }
    }

    /// Classifies the failure and picks the recovery; a type with no action escalates.
    pub fn decide(&self, _task: &Task, failure: &AttemptFailure, _recoveries: u32) -> Decision {
        let kind = self.classify(failure);
        let action = if failure.error_type.as_deref() == Some("InDoubt") {
            RecoveryAction::Escalate {
                message: failure.message.clone(),
            }
        } else {
            self.actions
                .get(&kind)
                .cloned()
                .unwrap_or_else(|| RecoveryAction::Escalate {
                    message: format!("No strategy registered for {kind}: {}", failure.message),
                })
        };
        Decision {
            failure: kind,
            action,
        }
    }
}

//! The trajectory classifier: the `Classifier` trait and the `RulesClassifier`, which gives one of
//! the eleven failure types to an attempt (or clears a successful one).

use std::sync::Arc;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::taxonomy::{
    ErrorClass, ErrorClassification, FailureCategory, FailureType, Step, Trajectory,
};

use super::context::{ARTIFACT_KEY, Claim, RunError, first_incomplete_subgoal};
use super::error::classify_error;

/// Everything the classifier may look at for one attempt.
#[derive(Debug, Clone, Copy)]
pub struct FailureInput<'a> {
    /// The steps of the attempt.
    pub trajectory: &'a Trajectory,
    /// The error the attempt ended with (`None` when it returned a result).
    pub error: Option<&'a RunError>,
    /// What the run claims it did.
    pub claims: &'a [Claim],
    /// The run's goal, for the goal validator.
    pub goal: Option<&'a str>,
    /// The run's result as JSON, when it returned one and a validator wants it.
    pub output: Option<&'a Value>,
}

/// The classifier's verdict on a failed attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classification {
    /// The failure type.
    pub failure_type: FailureType,
    /// The verdict on the error that ended the attempt, if there was one.
    pub error: Option<ErrorClassification>,
    /// The rule that decided.
    pub rule: String,
    /// The step the verdict points at, if any.
    pub step_index: Option<u32>,
    /// A human-readable account.
    pub message: String,
}

/// Decides what went wrong with an attempt.
pub trait Classifier: Send + Sync {
    /// The verdict for a failed attempt (`input.error` is set), or for a returned result that
    /// is still a failure (hallucinated state, plan incomplete, constraint, goal drift); `None`
    /// when a returned result is fine. A failed attempt always gets `Some`.
    fn classify(&self, input: &FailureInput<'_>) -> Option<Classification>;

    /// Whether [`FailureInput::output`] should be filled in for results (a validator is set).
    fn wants_output(&self) -> bool {
        false
    }
}

/// Judges whether a run's output serves its goal (the goal-drift hook).
pub trait GoalValidator: Send + Sync {
    /// `Err(reason)` when the output is unrelated to the goal.
    fn judge(&self, goal: &str, output: &Value) -> Result<(), String>;
}

impl<F> GoalValidator for F
where
    F: Fn(&str, &Value) -> Result<(), String> + Send + Sync,
{
    fn judge(&self, goal: &str, output: &Value) -> Result<(), String> {
        self(goal, output)
    }
}

/// Settings of the rules classifier (the `[classifier]` table of `config/policy.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifierConfig {
    /// How many trailing tool calls make a loop (same tool and input, or same tool and error).
    pub loop_window: usize,
    /// Regular expressions the model's output must not match (constraint violations).
    pub constraints: Vec<String>,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            loop_window: 3,
            constraints: Vec::new(),
        }
    }
}

/// A constraint pattern did not compile.
#[derive(Debug, thiserror::Error)]
#[error("classifier.constraints[{index}]: {source}")]
pub struct ConstraintError {
    /// Which pattern.
    pub index: usize,
    /// Why.
    pub source: regex::Error,
}

/// The rule-based trajectory classifier.
///
/// Failed attempt, first match wins: an infrastructure error that ended the attempt (timeout or
/// external fault) > loop (last `loop_window` tool calls with the same tool and input, or the
/// same tool and the same non-infrastructure error) > context overflow > constraint pattern in
/// the model's output > wrong tool (unknown tool, method not found, tool does not fit) > schema
/// mismatch > hallucinated state > plan incomplete > unknown. The error that ended the attempt
/// is the raised one, else the last step's: older, handled step errors never decide.
/// Returned result: hallucinated state > plan incomplete > constraint > goal drift > fine.
#[derive(Clone, Default)]
pub struct RulesClassifier {
    loop_window: usize,
    constraints: Vec<Regex>,
    validator: Option<Arc<dyn GoalValidator>>,
}

impl std::fmt::Debug for RulesClassifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RulesClassifier")
            .field("loop_window", &self.loop_window)
            .field("constraints", &self.constraints)
            .field("validator", &self.validator.is_some())
            .finish()
    }
}

fn verdict(
    failure_type: FailureType,
    rule: &str,
    error: Option<ErrorClassification>,
    step_index: Option<u32>,
    message: String,
) -> Classification {
    Classification {
        failure_type,
        error,
        rule: rule.to_string(),
        step_index,
        message,
    }
}

impl RulesClassifier {
    /// A classifier from its configuration; a bad constraint pattern is an error naming it.
    pub fn new(config: &ClassifierConfig) -> Result<RulesClassifier, ConstraintError> {
        let constraints = config
            .constraints
            .iter()
            .enumerate()
            .map(|(index, p)| Regex::new(p).map_err(|source| ConstraintError { index, source }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RulesClassifier {
            loop_window: config.loop_window.max(2),
            constraints,
            validator: None,
        })
    }

    /// Sets the goal validator (the goal-drift signal).
    pub fn with_validator(mut self, v: Arc<dyn GoalValidator>) -> RulesClassifier {
        self.validator = Some(v);
        self
    }

    /// A loop at the end of `t`: the last `loop_window` tool calls with the same tool and
    /// input, or the same tool and the same error that is not the environment's.
    pub fn loop_detected(&self, t: &Trajectory) -> Option<Classification> {
        let calls: Vec<&Step> = t.steps.iter().filter(|s| s.tool_called.is_some()).collect();
        if calls.len() < self.loop_window {
            return None;
        }
        let tail = &calls[calls.len() - self.loop_window..];
        let first = tail[0];
        let same_tool = tail.iter().all(|s| s.tool_called == first.tool_called);
        if !same_tool {
            return None;
        }
        let tool = first.tool_called.as_deref().unwrap_or("");
        if tail.iter().all(|s| s.tool_input == first.tool_input) {
            return Some(verdict(
                FailureType::LoopDetected,
                "loop_same_call",
                None,
                Some(tail[tail.len() - 1].index),
                format!("{} identical calls of {tool}", self.loop_window),
            ));
        }
        if let Some(err) = first.error.as_deref()
            && tail.iter().all(|s| s.error.as_deref() == Some(err))
        {
            let ec = classify_error(first.exception_type.as_deref(), err);
            if ec.category != FailureCategory::Infrastructure {
                return Some(verdict(
                    FailureType::LoopDetected,
                    "loop_same_error",
                    Some(ec),
                    Some(tail[tail.len() - 1].index),
                    format!("{tool} failed {} times with: {err}", self.loop_window),
                ));
            }
        }
        None
    }

    fn constraint(&self, t: &Trajectory, output: Option<&Value>) -> Option<Classification> {
        if self.constraints.is_empty() {
            return None;
        }
        for s in t.steps.iter().rev() {
            if let Some(text) = s.llm_output.as_deref()
                && let Some(re) = self.constraints.iter().find(|re| re.is_match(text))
            {
                return Some(verdict(
                    FailureType::ConstraintIgnored,
                    "constraint_pattern",
                    None,
                    Some(s.index),
                    format!("model output at step {} matches constraint {re}", s.index),
                ));
            }
        }
        if let Some(Value::String(text)) = output
            && let Some(re) = self.constraints.iter().find(|re| re.is_match(text))
        {
            return Some(verdict(
                FailureType::ConstraintIgnored,
                "constraint_pattern",
                None,
                None,
                format!("output matches constraint {re}"),
            ));
        }
        None
    }

    fn hallucinated(&self, t: &Trajectory, claims: &[Claim]) -> Option<Classification> {
        let backed = |c: &Claim| {
            t.steps.iter().any(|s| {
                s.error.is_none()
                    && (s.tool_called.as_deref() == Some(c.name.as_str())
                        || (c.kind != "artifact" && s.action == c.name)
                        || s.metadata.get(ARTIFACT_KEY).and_then(Value::as_str)
                            == Some(c.name.as_str()))
            })
        };
        claims.iter().find(|c| !backed(c)).map(|c| {
            verdict(
                FailureType::HallucinatedState,
                "unbacked_claim",
                None,
                None,
                format!(
                    "the run claims {} {:?} but the trajectory has no such step",
                    c.kind, c.name
                ),
            )
        })
    }

    fn plan_incomplete(&self, t: &Trajectory) -> Option<Classification> {
        first_incomplete_subgoal(t).map(|g| {
            verdict(
                FailureType::PlanIncomplete,
                "subgoal_not_done",
                None,
                None,
                format!("subgoal {g:?} was declared but not done"),
            )
        })
    }
}

impl Classifier for RulesClassifier {
    fn wants_output(&self) -> bool {
        self.validator.is_some() || !self.constraints.is_empty()
    }

    fn classify(&self, input: &FailureInput<'_>) -> Option<Classification> {
        let t = input.trajectory;
        let Some(raised) = input.error else {
            return self
                .hallucinated(t, input.claims)
                .or_else(|| self.plan_incomplete(t))
                .or_else(|| self.constraint(t, input.output))
                .or_else(|| {
                    let (v, out) = (self.validator.as_ref()?, input.output?);
                    let reason = v.judge(input.goal.unwrap_or(""), out).err()?;
                    Some(verdict(
                        FailureType::GoalDrift,
                        "goal_validator",
                        None,
                        None,
                        format!("output judged unrelated to the goal: {reason}"),
                    ))
                });
        };
        // The error that ended the attempt: the raised one; if it says nothing, the last
        // step's error (never an older, handled one).
        let last_err = t.last().filter(|s| s.error.is_some());
        let (msg, ty, step_index) = if raised.message.trim().is_empty()
            && raised.error_type.is_none()
            && let Some(s) = last_err
        {
            (
                s.error.clone().unwrap_or_default(),
                s.exception_type.clone(),
                Some(s.index),
            )
        } else {
            (
                raised.message.clone(),
                raised.error_type.clone(),
                Some(t.last().map_or(0, |s| s.index)),
            )
        };
        let ec = classify_error(ty.as_deref(), &msg);
        let with = |ft: FailureType, rule: &str| {
            Some(verdict(ft, rule, Some(ec.clone()), step_index, msg.clone()))
        };
        if ec.category == FailureCategory::Infrastructure {
            return if ec.error_class == ErrorClass::Timeout {
                with(FailureType::Timeout, "error_timeout")
            } else {
                with(FailureType::ExternalFault, "error_infrastructure")
            };
        }
        if let Some(mut l) = self.loop_detected(t) {
            l.error.get_or_insert(ec.clone());
            return Some(l);
        }
        if ec.rule.ends_with("context_overflow") {
            return with(FailureType::ContextOverflow, "error_context_overflow");
        }
        if let Some(mut c) = self.constraint(t, None) {
            c.error = Some(ec.clone());
            return Some(c);
        }
        let tool_rule = ec.rule.ends_with("unknown_tool") || ec.rule == "jsonrpc_method_not_found";
        if tool_rule || ec.error_class == ErrorClass::ToolNotFit {
            return with(FailureType::WrongToolCalled, "error_wrong_tool");
        }
        if ec.error_class == ErrorClass::SchemaMismatch {
            return with(FailureType::SchemaMismatch, "error_schema");
        }
        if let Some(mut h) = self.hallucinated(t, input.claims) {
            h.error = Some(ec.clone());
            return Some(h);
        }
        if let Some(mut p) = self.plan_incomplete(t) {
            p.error = Some(ec.clone());
            return Some(p);
        }
        with(FailureType::Unknown, "error_unclassified")
    }
}

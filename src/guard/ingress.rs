//! Task ingress: budget ceilings, tool permission scopes (global, per tenant), goal limits,
//! injection rejection and PII redaction of every text of a task that will be stored.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::injection::{InjectionFinding, scan_injection};
use super::pii::{PiiKind, redact};
use crate::record::Task;

/// The feature of a task that lists the tools it asks for (comma-separated).
pub const TOOLS_FEATURE: &str = "tools";

/// What a task may ask for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardConfig {
    /// Ceiling on a task's `max_latency_ms`; a task without one gets this one.
    pub max_latency_ms: Option<f64>,
    /// Ceiling on a task's `max_cost`; a task without one gets this one.
    pub max_cost: Option<f64>,
    /// Tools any task may use; `None` permits every tool.
    pub permitted_tools: Option<BTreeSet<String>>,
    /// Per-tenant tool scopes; when a tenant has an entry, it replaces `permitted_tools`.
    pub tenant_tools: BTreeMap<String, BTreeSet<String>>,
    /// Longest goal accepted, in characters.
    pub max_goal_chars: usize,
    /// Most features accepted.
    pub max_features: usize,
    /// Reject tasks whose goal or features carry prompt-injection patterns.
    pub reject_injection: bool,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            max_latency_ms: None,
            max_cost: None,
            permitted_tools: None,
            tenant_tools: BTreeMap::new(),
            max_goal_chars: 8_000,
            max_features: 64,
            reject_injection: true,
        }
    }
}

/// Why a task was refused at ingress.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GuardError {
    /// A budget asked for is above the ceiling (or not a finite non-negative number).
    #[error("task {task_id}: constraints.{field} = {requested} exceeds the ceiling {ceiling}")]
    OverBudget {
        /// The task.
        task_id: String,
        /// `max_latency_ms` or `max_cost`.
        field: &'static str,
        /// What the task asked for.
        requested: f64,
        /// The ceiling.
        ceiling: f64,
    },
    /// A budget is negative or not a number.
    #[error("task {task_id}: constraints.{field} = {value} is not a finite non-negative number")]
    InvalidBudget {
        /// The task.
        task_id: String,
        /// `max_latency_ms` or `max_cost`.
        field: &'static str,
        /// The value.
        value: f64,
    },
    /// A tool outside the permitted scope was asked for.
    #[error("task {task_id}: tool {tool:?} is not permitted in scope {scope}")]
    ToolNotPermitted {
        /// The task.
        task_id: String,
        /// The tool.
        tool: String,
        /// `global` or `tenant:<name>`.
        scope: String,
    },
    /// The goal is empty or too long.
    #[error("task {task_id}: goal has {chars} characters (allowed 1..={max})")]
    GoalLength {
        /// The task.
        task_id: String,
        /// Its length.
        chars: usize,
        /// The limit.
        max: usize,
    },
    /// Too many features.
    #[error("task {task_id}: {count} features (at most {max})")]
    TooManyFeatures {
        /// The task.
        task_id: String,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A prompt-injection pattern was found.
    #[error(
        "task {task_id}: field {field} carries a prompt-injection pattern ({rule}: {excerpt:?})"
    )]
    Injection {
        /// The task.
        task_id: String,
        /// `goal` or `features.<name>`.
        field: String,
        /// The rule.
        rule: String,
        /// What matched.
        excerpt: String,
    },
}

impl GuardError {
    /// The task field at fault (`goal`, `features`, `features.<name>`, `constraints.<budget>`).
    pub fn field(&self) -> String {
        match self {
            GuardError::OverBudget { field, .. } | GuardError::InvalidBudget { field, .. } => {
                format!("constraints.{field}")
            }
            GuardError::ToolNotPermitted { .. } => format!("features.{TOOLS_FEATURE}"),
            GuardError::GoalLength { .. } => "goal".to_string(),
            GuardError::TooManyFeatures { .. } => "features".to_string(),
            GuardError::Injection { field, .. } => field.clone(),
        }
    }
}

/// A task that passed ingress, with the PII redacted from every stored text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RedactedTask {
    /// The task as it may be stored: goal and feature values redacted, budgets clamped to the
    /// ceilings.
    pub task: Task,
    /// The tools it asks for (from the `tools` feature), all permitted.
    pub tools: Vec<String>,
    /// What was redacted, per field (`goal`, `features.<name>`).
    pub redactions: BTreeMap<String, Vec<PiiKind>>,
}

/// The ingress guard (stateless: patterns are compiled once per process).
#[derive(Debug, Clone, Copy, Default)]
pub struct Guard;

impl Guard {
    /// A guard.
    pub fn new() -> Guard {
        Guard
    }

    /// Checks a task against the configuration: rejects it (typed error) when it exceeds a
    /// budget ceiling, asks for a tool outside its scope, has an empty or overlong goal, too
    /// many features or an injection pattern; otherwise returns it with PII redacted.
    pub fn check_task(
        &self,
        task: &Task,
        config: &GuardConfig,
    ) -> Result<RedactedTask, GuardError> {
        let id = task.task_id.clone();
        let chars = task.goal.chars().count();
        if task.goal.trim().is_empty() || chars > config.max_goal_chars {
            return Err(GuardError::GoalLength {
                task_id: id,
                chars,
                max: config.max_goal_chars,
            });
        }
        if task.features.len() > config.max_features {
            return Err(GuardError::TooManyFeatures {
                task_id: id,
                count: task.features.len(),
                max: config.max_features,
            });
        }
        let max_latency_ms = check_budget(
            &id,
            "max_latency_ms",
            task.constraints.max_latency_ms,
            config.max_latency_ms,
        )?;
        let max_cost = check_budget(&id, "max_cost", task.constraints.max_cost, config.max_cost)?;
        let tools = requested_tools(task);
        self.check_tools(&id, task.tenant.as_deref(), &tools, config)?;
        if config.reject_injection {
            let mut fields: Vec<(String, &str)> = vec![("goal".to_string(), task.goal.as_str())];
            for (k, v) in &task.features {
                fields.push((format!("features.{k}"), v.as_str()));
            }
            for (field, text) in fields {
                if let Some(InjectionFinding { rule, excerpt }) =
                    scan_injection(text).into_iter().next()
                {
                    return Err(GuardError::Injection {
                        task_id: id,
                        field,
                        rule,
                        excerpt,
                    });
                }
            }
        }
        let mut redactions = BTreeMap::new();
        let mut out = task.clone();
        let goal = redact(&task.goal);
        if !goal.is_clean() {
            redactions.insert("goal".to_string(), goal.found.clone());
        }
        out.goal = goal.text;
        for (k, v) in out.features.iter_mut() {
            let r = redact(v);
            if !r.is_clean() {
                redactions.insert(format!("features.{k}"), r.found.clone());
            }
            *v = r.text;
        }
        out.constraints.max_latency_ms = max_latency_ms;
        out.constraints.max_cost = max_cost;
        Ok(RedactedTask {
            task: out,
            tools,
            redactions,
        })
    }

    /// Checks that every tool is permitted for the tenant (its own scope when it has one,
    /// otherwise the global one).
    pub fn check_tools(
        &self,
        task_id: &str,
        tenant: Option<&str>,
        tools: &[String],
        config: &GuardConfig,
    ) -> Result<(), GuardError> {
        let (scope, allowed) = match tenant.and_then(|t| config.tenant_tools.get(t).map(|s| (t, s)))
        {
            Some((t, set)) => (format!("tenant:{t}"), Some(set)),
            None => ("global".to_string(), config.permitted_tools.as_ref()),
        };
        if let Some(allowed) = allowed
            && let Some(bad) = tools.iter().find(|t| !allowed.contains(*t))
        {
            return Err(GuardError::ToolNotPermitted {
                task_id: task_id.to_string(),
                tool: bad.clone(),
                scope,
            });
        }
        Ok(())
    }
}

/// The tools a task asks for: its `tools` feature split on commas, trimmed, deduplicated.
pub fn requested_tools(task: &Task) -> Vec<String> {
    let mut seen = BTreeSet::new();
    task.features
        .get(TOOLS_FEATURE)
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty() && seen.insert(t.to_string()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Validates one budget against its ceiling and returns the effective value.
fn check_budget(
    task_id: &str,
    field: &'static str,
    requested: Option<f64>,
    ceiling: Option<f64>,
) -> Result<Option<f64>, GuardError> {
    if let Some(v) = requested
        && (!v.is_finite() || v < 0.0)
    {
        return Err(GuardError::InvalidBudget {
            task_id: task_id.to_string(),
            field,
            value: v,
        });
    }
    match (requested, ceiling) {
        (Some(r), Some(c)) if r > c => Err(GuardError::OverBudget {
            task_id: task_id.to_string(),
            field,
            requested: r,
            ceiling: c,
        }),
        (Some(r), _) => Ok(Some(r)),
        (None, c) => Ok(c),
    }
}

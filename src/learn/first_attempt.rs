//! first_attempt: a run's first attempt is learned when that attempt ends, not when the run does.
//!
//! A run whose first attempt fails goes on through recoveries, replans and ReflectRetry before
//! its experience is logged, while a clean run is logged at once. With several tasks in flight
//! the policy would hear of the successes before the failures of tasks started at the same time,
//! and judge arms on a sample leaning toward success while it waits (measured on web research at
//! four in flight: a run with one tool error reached the policy about 1.3 tasks after a clean run
//! started with it, one with three or more about 4.5 tasks after). So the driver sends the first
//! attempt's settled stage outcomes as soon as that attempt ends; the policy learns them and
//! keeps, in [`FirstAttempts`], which steps of which run it learned, and learns only the rest from
//! the logged experience. That record is persisted with the policy's snapshot, so a restart
//! neither loses a step nor learns one twice.

use std::collections::{BTreeMap, BTreeSet};

use crate::learn::bandit::{Arm, StageObservation, StageOutcome};
use crate::{FailureCategory, Step};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Runs remembered at most; beyond it the oldest are forgotten (a run that never ends).
pub const MAX_RUNS: usize = 65_536;

/// The outcome a step's `outcome` mark settles: `valid`, `invalid`, or a failure category.
/// `None` for a call whose output was not validated (yet): it says nothing about validity.
fn settled_outcome(step: &Step) -> Option<StageOutcome> {
    match step.metadata.get("outcome").and_then(Value::as_str) {
        Some("valid") => Some(StageOutcome::Valid),
        Some("invalid") => Some(StageOutcome::Invalid),
        Some("strategy") => Some(StageOutcome::Failed(FailureCategory::Strategy)),
        Some("unknown") => Some(StageOutcome::Failed(FailureCategory::Unknown)),
        Some("infrastructure") => Some(StageOutcome::Failed(FailureCategory::Infrastructure)),
        _ => None,
    }
}

/// The stage observations one step gives: the infrastructure faults retried inside the call,
/// then the call's own outcome if it is settled. Empty for a step that is not a stage call.
pub fn step_observations(step: &Step) -> Vec<StageObservation> {
    let (Some(stage), Some(strategy), Some(tool)) = (
        step.metadata.get("stage").and_then(Value::as_str),
        step.metadata.get("strategy").and_then(Value::as_str),
        step.tool_called.as_deref(),
    ) else {
        return Vec::new();
    };
    let arm = Arm::new(tool, strategy);
    let infra = step
        .metadata
        .get("infra_errors")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let mut out: Vec<StageObservation> = (0..infra)
        .map(|_| StageObservation {
            stage: stage.to_string(),
            arm: arm.clone(),
            outcome: StageOutcome::Failed(FailureCategory::Infrastructure),
            latency_ms: 0.0,
            cost: 0.0,
        })
        .collect();
    if let Some(outcome) = settled_outcome(step) {
        // The arm's own latency and cost, never the infrastructure retries inside the call.
        let (latency_ms, cost) = step.own_latency_cost();
        out.push(StageObservation {
            stage: stage.to_string(),
            arm,
            outcome,
            latency_ms,
            cost,
        });
    }
    out
}

/// The stage calls of attempt `attempt` (0-based over the run) whose outcome is settled:
/// `(index in the run's steps, observations)`.
pub fn settled_steps(steps: &[Step], attempt: u32) -> Vec<(u32, Vec<StageObservation>)> {
    steps
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.metadata.get("attempt").and_then(Value::as_u64) == Some(u64::from(attempt))
        })
        .filter(|(_, s)| settled_outcome(s).is_some())
        .filter_map(|(i, s)| Some((u32::try_from(i).ok()?, step_observations(s))))
        .collect()
}

/// What the policy learned of one run before its experience was logged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedRun {
    /// Indices of the run's steps learned.
    pub steps: BTreeSet<u32>,
    /// Whether the learning counted the run's clusters as visited (it learned some outcome).
    pub visited: bool,
    /// Order of arrival (the oldest is forgotten first).
    pub order: u64,
}

/// The runs whose first attempt the policy learned ahead of their experience.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstAttempts {
    runs: BTreeMap<String, LearnedRun>,
    next: u64,
}

impl FirstAttempts {
    /// Records `steps` of `run_id` as learned and returns the observations of those not learned
    /// before, with whether the run's clusters were counted as visited already.
    pub fn admit(
        &mut self,
        run_id: &str,
        steps: Vec<(u32, Vec<StageObservation>)>,
    ) -> (Vec<StageObservation>, bool) {
        if !self.runs.contains_key(run_id) && self.runs.len() >= MAX_RUNS {
            let oldest = self
                .runs
                .iter()
                .min_by_key(|(_, r)| r.order)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.runs.remove(&k);
            }
        }
        let order = self.next;
        let run = self
            .runs
            .entry(run_id.to_string())
            .or_insert_with(|| LearnedRun {
                order,
                ..LearnedRun::default()
            });
        self.next += 1;
        let fresh = steps
            .into_iter()
            .filter(|(i, _)| run.steps.insert(*i))
            .flat_map(|(_, obs)| obs)
            .collect();
        (fresh, run.visited)
    }

    /// Notes that learning `run_id`'s steps counted its clusters as visited.
    pub fn visited(&mut self, run_id: &str) {
        if let Some(r) = self.runs.get_mut(run_id) {
            r.visited = true;
        }
    }

    /// Forgets `run_id` (its experience is being learned) and returns what was learned of it.
    pub fn take(&mut self, run_id: &str) -> Option<LearnedRun> {
        self.runs.remove(run_id)
    }

    /// Whether no run is remembered.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(attempt: u32, outcome: &str, infra: u64) -> Step {
        let mut s = Step {
            tool_called: Some("ocr".into()),
            ..Step::default()
        };
        s.metadata.insert("stage".into(), Value::from("extract"));
        s.metadata.insert("strategy".into(), Value::from("fast"));
        s.metadata.insert("attempt".into(), Value::from(attempt));
        s.metadata.insert("outcome".into(), Value::from(outcome));
        s.metadata.insert("infra_errors".into(), Value::from(infra));
        s
    }

    #[test]
    fn only_settled_steps_of_the_attempt_are_taken_with_their_infrastructure_faults() {
        let steps = vec![
            step(0, "success", 0),
            step(0, "strategy", 2),
            step(1, "valid", 0),
        ];
        let settled = settled_steps(&steps, 0);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].0, 1);
        let outcomes: Vec<StageOutcome> = settled[0].1.iter().map(|o| o.outcome).collect();
        assert_eq!(
            outcomes,
            vec![
                StageOutcome::Failed(FailureCategory::Infrastructure),
                StageOutcome::Failed(FailureCategory::Infrastructure),
                StageOutcome::Failed(FailureCategory::Strategy),
            ]
        );
    }

    #[test]
    fn a_step_is_admitted_once_and_the_record_ends_with_the_run() {
        let mut f = FirstAttempts::default();
        let steps = settled_steps(&[step(0, "invalid", 0), step(0, "valid", 1)], 0);
        let (fresh, visited) = f.admit("r", steps.clone());
        assert_eq!(fresh.len(), 3);
        assert!(!visited);
        f.visited("r");
        let (again, visited) = f.admit("r", steps);
        assert!(again.is_empty());
        assert!(visited);
        let run = f.take("r").unwrap();
        assert_eq!(run.steps, BTreeSet::from([0, 1]));
        assert!(f.is_empty());
    }
}

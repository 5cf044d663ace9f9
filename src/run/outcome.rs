//! outcome: how a run ended, with its provenance (what the caller gets).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::learn::bandit::Arm;
use crate::{ArmChoice, ErrorClass, FailureType, Run, RunState};

/// A recovery the triage loop chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// The failure type.
    pub failure: FailureType,
    /// The action kind (`retry`, `replan`, ...).
    pub action: String,
}

/// How a run ended, with its provenance: what the caller gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: String,
    /// The task.
    pub task_id: String,
    /// The terminal state.
    pub state: RunState,
    /// Whether the output passed validation.
    pub passed: bool,
    /// Attempts made (all rounds).
    pub attempts: u32,
    /// ReflectRetry rounds that sent the run back.
    pub reflect_retries: u32,
    /// The plan of the last attempt.
    pub plan_id: Option<String>,
    /// The SOP used, if any.
    pub sop_id: Option<String>,
    /// The arms of the first attempt, with propensities.
    pub arms: Vec<ArmChoice>,
    /// The arms of the last attempt.
    pub final_arms: Vec<ArmChoice>,
    /// The reward.
    pub reward: f64,
    /// Latency summed over every call.
    pub latency_ms: f64,
    /// Cost summed over every call.
    pub cost: f64,
    /// The final output, stage by stage.
    pub output: Option<Value>,
    /// Why it did not succeed, if it did not.
    pub reason: Option<String>,
    /// The recoveries made.
    pub recoveries: Vec<RecoveryRecord>,
    /// Tool calls made (retries included; replays excluded).
    pub tool_calls: u32,
    /// Tool errors by class.
    pub tool_errors: BTreeMap<ErrorClass, u32>,
    /// Whether the run was resumed after a crash.
    pub resumed: bool,
    /// Whether the first plan was an exploration (not the policy's greedy choice).
    pub explored: bool,
    /// Citations of the memory items retrieved for the run.
    #[serde(default)]
    pub citations: Vec<String>,
    /// The policy's greedy plan when it chose the first plan (empty when the plan was given):
    /// what its beliefs alone would have planned.
    #[serde(default)]
    pub greedy_arms: Vec<Arm>,
}

impl RunOutcome {
    /// The outcome of a run that could not even be recorded.
    pub fn rejected(run: &Run, reason: String) -> RunOutcome {
        RunOutcome {
            run_id: run.run_id.clone(),
            task_id: run.task_id.clone(),
            state: RunState::Failed,
            passed: false,
            attempts: 0,
            reflect_retries: 0,
            plan_id: None,
            sop_id: None,
            arms: Vec::new(),
            final_arms: Vec::new(),
            reward: 0.0,
            latency_ms: 0.0,
            cost: 0.0,
            output: None,
            reason: Some(reason),
            recoveries: Vec::new(),
            tool_calls: 0,
            tool_errors: BTreeMap::new(),
            resumed: false,
            explored: false,
            citations: Vec::new(),
            greedy_arms: Vec::new(),
        }
    }
}

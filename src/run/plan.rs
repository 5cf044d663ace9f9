//! plan: the plan of one attempt (an arm per stage with its propensity), and the plan ids of runs
//! that followed an SOP.

use serde::{Deserialize, Serialize};

use crate::ArmChoice;
use crate::learn::bandit::Arm;

/// A plan chosen for one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanChoice {
    /// Identifies the plan (its arms, joined).
    pub plan_id: String,
    /// The SOP followed, if any.
    pub sop_id: Option<String>,
    /// One arm per stage, with the propensity of its choice.
    pub arms: Vec<ArmChoice>,
    /// Whether the plan is the policy's greedy choice (not an exploration).
    pub greedy: bool,
    /// The SOP's version, when the plan follows an SOP.
    #[serde(default)]
    pub sop_version: Option<u32>,
    /// The policy's greedy plan for the task when it chose (empty for a plan it did not
    /// choose): what its beliefs alone would have planned, against which the bench splits the
    /// regret into ignorance and exploration.
    #[serde(default)]
    pub greedy_arms: Vec<Arm>,
    /// The calls that replace the model in the plan's agent stages, when it follows a
    /// procedure SOP (one per stage that has one).
    #[serde(default)]
    pub procedure: Vec<crate::learn::procedure::Procedure>,
}

impl PlanChoice {
    /// A plan from its arms.
    pub fn new(arms: Vec<ArmChoice>, sop_id: Option<String>, greedy: bool) -> PlanChoice {
        let plan_id = arms
            .iter()
            .map(|a| format!("{}/{}", a.tool, a.strategy))
            .collect::<Vec<_>>()
            .join("+");
        PlanChoice {
            plan_id,
            sop_id,
            arms,
            greedy,
            sop_version: None,
            greedy_arms: Vec::new(),
            procedure: Vec::new(),
        }
    }
}

/// The plan id of a run that followed an SOP.
pub fn sop_plan_id(sop_id: &str, version: u32) -> String {
    format!("sop:{sop_id}@{version}")
}

/// The SOP (id, version) a plan id names, if it names one.
pub fn parse_sop_plan_id(plan_id: &str) -> Option<(&str, u32)> {
    let rest = plan_id.strip_prefix("sop:")?;
    let (id, v) = rest.rsplit_once('@')?;
    Some((id, v.parse().ok()?))
}

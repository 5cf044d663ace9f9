//! run: one run of a task, decided in the core. [`RunMachine`] carries a run through its
//! lifecycle as plain data, `(state, event) -> (state, commands)`; its interpreters perform the
//! commands: the tree's run drivers (crate `hindsight-actors`) and [`local::LocalRunner`], which
//! runs tasks one after another without actors, for benchmarks and sweeps. With one task in
//! flight and the same seed both take the same decisions, so a figure measured on the core is a
//! figure of what ships.
//!
//! The pieces the machine decides with live here too: the [`workflow`] a task is planned from,
//! the [`recovery`] triage of a failed attempt, the stage [`call`] and its measurement, the
//! plugins' [`report`] and ReflectRetry's verdict, and the run's [`outcome`].

pub mod agent;
pub mod call;
pub mod local;
pub mod machine;
pub mod outcome;
pub mod plan;
pub mod recovery;
pub mod report;
pub mod workflow;

pub use agent::{ModelTurn, TurnOutcome};
pub use call::{Budget, CallOutcome, StageCall, execute};
pub use machine::{
    Command, Event, Finished, PluginAnswer, RunError, RunMachine, RunPatch, RunProgress, RunRules,
};
pub use outcome::{RecoveryRecord, RunOutcome};
pub use plan::{PlanChoice, parse_sop_plan_id, sop_plan_id};
pub use recovery::{AttemptFailure, Decision, TREE_POLICY, TriageSetup};
pub use report::{
    RunEvent, RunReport, RunValidator, Verdict, default_validator, reflect_verdict,
    render_reflection,
};
pub use workflow::{AgentStage, AgentVariant, Toolset, Workflow, WorkflowArm, WorkflowStage};

#[cfg(test)]
mod agent_tests;
#[cfg(test)]
mod tests;

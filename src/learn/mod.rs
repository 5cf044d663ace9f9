//! learn: the learning algorithms of hindsight: the contextual bandit policy over `(tool,
//! strategy)` arms (information-directed sampling, `ids`, or Thompson sampling), its posteriors,
//! task clusters and drift detection, off-policy evaluation, distillation into a stable ranker,
//! SOP promotion with its statistics, and the core-level learning simulation.

pub mod adaptive;
pub mod bandit;
pub mod cluster;
pub mod distill;
pub mod drift;
pub mod first_attempt;
pub mod fit_window;
pub mod ids;
pub mod mechanism;
pub mod ope;
pub mod planner;
pub mod posterior;
pub mod procedure;
pub mod reflector;
pub mod sop;
pub mod sop_index;
pub mod stats;

pub use mechanism::Mechanism;

pub use bandit::{
    Arm, Choice, ChosenArm, Observation, Policy, PolicyConfig, PolicyError, PolicySnapshot,
    RewardParams, StageArms, StageObservation, StageOutcome, UpdateSummary,
};

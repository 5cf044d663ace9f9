//! Failure triage: the error classifier, the trajectory classifier, failure policies and their
//! strategies, and the recovery loop.

pub mod agent;
pub mod checkpoint;
pub mod classify;
pub mod clock;
pub mod config;
pub mod context;
pub mod error;
pub mod policy;

pub use agent::{
    Agent, AgentConfig, FailureRecord, FailureReport, RunReport, SuspendedRun, TriageError,
};
pub use checkpoint::{CheckpointError, CheckpointStore, MemoryCheckpoints};
pub use classify::{
    Classification, Classifier, ClassifierConfig, FailureInput, GoalValidator, RulesClassifier,
};
pub use clock::{Clock, TokioClock, VirtualClock};
pub use config::{PolicyError, PolicyFile};
pub use context::{RunContext, RunError, TriageContext};
pub use error::classify_error;
pub use policy::{Backoff, FailureContext, FailurePolicy, PolicyState, Strategy};

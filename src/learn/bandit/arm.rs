//! arm: the arms a policy chooses among: `(tool, strategy)` pairs, per stage.

use serde::{Deserialize, Serialize};

/// A `(tool, strategy)` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arm {
    /// The tool (the registry's name).
    pub tool: String,
    /// The strategy (a parameterised way of using it).
    pub strategy: String,
}

impl Arm {
    /// A new arm.
    pub fn new(tool: impl Into<String>, strategy: impl Into<String>) -> Arm {
        Arm {
            tool: tool.into(),
            strategy: strategy.into(),
        }
    }
}

/// The candidate arms of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageArms {
    /// The stage's name.
    pub stage: String,
    /// Its arms (at least one).
    pub arms: Vec<Arm>,
}

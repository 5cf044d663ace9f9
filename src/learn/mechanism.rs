//! mechanism: the ways the system learns in words and in procedures, named so that one can be
//! switched off to measure what it contributes (`hindsight bench adaptive --ablate`).

use serde::{Deserialize, Serialize};

/// A learning mechanism that can be switched off for an ablation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Lessons synthesised from a scope's failures (human corrections are lessons too, but
    /// they are the `Corrections` mechanism).
    Lessons,
    /// ReflectRetry sending a finished run back with a reflection.
    Reflect,
    /// The words of triage's recoveries reaching the model (hint, tool manifest, subgoal).
    Hints,
    /// Human corrections accepted through the API.
    Corrections,
    /// Standard operating procedures promoted and routed to.
    Sops,
}

impl Mechanism {
    /// Every mechanism, in order.
    pub const ALL: [Mechanism; 5] = [
        Mechanism::Lessons,
        Mechanism::Reflect,
        Mechanism::Hints,
        Mechanism::Corrections,
        Mechanism::Sops,
    ];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Lessons => "lessons",
            Mechanism::Reflect => "reflect",
            Mechanism::Hints => "hints",
            Mechanism::Corrections => "corrections",
            Mechanism::Sops => "sops",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a mechanism.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a learning mechanism: give lessons, reflect, hints, corrections or sops")]
pub struct UnknownMechanism(pub String);

impl std::str::FromStr for Mechanism {
    type Err = UnknownMechanism;

    fn from_str(s: &str) -> Result<Mechanism, UnknownMechanism> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMechanism(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_a_stranger_is_refused() {
        for m in Mechanism::ALL {
            assert_eq!(m.as_str().parse::<Mechanism>(), Ok(m));
            assert_eq!(
                serde_json::to_value(m).ok(),
                Some(serde_json::Value::from(m.as_str()))
            );
        }
        let err = "lesson".parse::<Mechanism>().unwrap_err();
        assert!(err.to_string().contains("lessons, reflect"), "{err}");
    }
}

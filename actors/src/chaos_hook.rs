//! The one line every actor of the tree runs first in `handle`: ask the installed fault plan
//! whether this message is to crash the actor, and do so.

use std::sync::Arc;

/// What the fault plan wants done to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// Panic inside `handle` (the supervisor sees `ActorFailed` and restarts the actor).
    Panic,
}

/// Decides, per actor and message, whether to inject a fault.
pub type FaultDecider = Arc<dyn Fn(&'static str) -> Option<InjectedFault> + Send + Sync>;

/// A fault hook bound to one actor role.
#[derive(Clone)]
pub struct ChaosHook {
    actor: &'static str,
    decide: FaultDecider,
}

impl ChaosHook {
    /// Binds `decide` to the actor named `actor`.
    pub fn new(actor: &'static str, decide: FaultDecider) -> ChaosHook {
        ChaosHook { actor, decide }
    }

    /// Called at the top of `handle`: panics when the plan says so.
    pub fn on_message(&self) {
        if let Some(InjectedFault::Panic) = (self.decide)(self.actor) {
            panic!("chaos: injected panic in the {} actor", self.actor);
        }
    }
}

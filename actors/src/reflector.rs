//! The Reflector actor: consolidates finished runs into lessons and SOP candidates.

use std::sync::Arc;

use hindsight::ExperienceTuple;
use hindsight::store::Store;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::workflow::Workflow;

/// Messages of the reflector.
pub enum ReflectorMsg {
    /// A run finished and its experience is logged at `seq`.
    Consolidate {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
    },
}

/// The reflector actor.
pub struct ReflectorActor;

/// Start-up arguments.
pub struct ReflectorArgs {
    /// The store.
    pub store: Store,
    /// The workflow (its tools bound what lessons may name).
    pub workflow: Arc<Workflow>,
    /// Where it publishes itself.
    pub slot: Arc<Slot<ReflectorMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// The reflector's state.
pub struct ReflectorState {
    _store: Store,
    chaos: Option<ChaosHook>,
    consolidated: u64,
}

impl Actor for ReflectorActor {
    type Msg = ReflectorMsg;
    type State = ReflectorState;
    type Arguments = ReflectorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.slot.publish(myself);
        Ok(ReflectorState {
            _store: args.store,
            chaos: args.chaos,
            consolidated: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        match msg {
            ReflectorMsg::Consolidate {
                seq: _,
                experience: _,
            } => {
                state.consolidated += 1;
            }
        }
        Ok(())
    }
}

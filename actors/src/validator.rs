//! The Validator actor: checks a finished attempt's outputs against the workflow's success
//! criteria and names the stage at fault and why.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use hindsight::run::workflow::Workflow;

/// The verdict per stage, in plan order: `Err(reason)` says why the stage's output failed.
pub type Validation = Vec<(String, Result<(), String>)>;

/// Messages of the validator.
pub enum ValidatorMsg {
    /// Validate the outputs of an attempt, stage by stage, in plan order.
    Validate {
        /// The task they are outputs of.
        task: Arc<hindsight::Task>,
        /// `(stage, output)` pairs (shared: a call re-sent to a restarted validator sends them
        /// again).
        outputs: Arc<[(String, Value)]>,
        /// The verdict.
        reply: RpcReplyPort<Validation>,
    },
}

/// The validator actor.
pub struct Validator;

/// Start-up arguments.
pub struct ValidatorArgs {
    /// The success criteria.
    pub workflow: Arc<Workflow>,
    /// Where it publishes itself.
    pub slot: Arc<Slot<ValidatorMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// State: the workflow whose criteria it applies.
pub struct ValidatorState {
    workflow: Arc<Workflow>,
    chaos: Option<ChaosHook>,
}

impl Actor for Validator {
    type Msg = ValidatorMsg;
    type State = ValidatorState;
    type Arguments = ValidatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.slot.publish(myself);
        Ok(ValidatorState {
            workflow: args.workflow,
            chaos: args.chaos,
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
            ValidatorMsg::Validate {
                task,
                outputs,
                reply,
            } => {
                let verdict = outputs
                    .iter()
                    .map(|(stage, output)| {
                        (stage.clone(), state.workflow.validate(&task, stage, output))
                    })
                    .collect();
                let _ = reply.send(verdict);
            }
        }
        Ok(())
    }
}

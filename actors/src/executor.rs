//! The Executor actor: runs one tool call or model turn per message, each on a worker task of
//! its own, which outlives a restart of the actor and is dropped as the tree stops. A tool call
//! goes through the tool layer's resilience (validation, timeout, backoff, circuit breaker,
//! bulkhead, budget, idempotency keys) and reports every attempt's latency, cost and error
//! class; a model turn goes to the agent's model endpoint.

use std::sync::Arc;

use hindsight::model::Models;
use hindsight::run::{ModelTurn, TurnOutcome};
use hindsight::tools::ToolRunner;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;

pub use hindsight::run::{Budget, CallOutcome, StageCall, execute};

/// Messages of the executor.
pub enum ExecutorMsg {
    /// Run one stage's call.
    Execute {
        /// The call.
        call: Box<StageCall>,
        /// What came of it.
        reply: RpcReplyPort<CallOutcome>,
    },
    /// Ask an agent's model for its next turn.
    Turn {
        /// The turn.
        turn: Box<ModelTurn>,
        /// What the model did.
        reply: RpcReplyPort<TurnOutcome>,
    },
}

/// The executor actor.
pub struct Executor;

/// Start-up arguments.
pub struct ExecutorArgs {
    /// The call journal, if one is kept.
    pub journal: Option<crate::journal::CallJournal>,
    /// The resilient tool caller.
    pub runner: Arc<ToolRunner>,
    /// The model endpoints of the agent stages.
    pub models: Models,
    /// Where it publishes itself.
    pub slot: Arc<Slot<ExecutorMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// State: the tool caller.
pub struct ExecutorState {
    /// Its slot, closed as the tree stops: the calls in flight are then dropped.
    slot: Arc<Slot<ExecutorMsg>>,
    journal: Option<crate::journal::CallJournal>,
    runner: Arc<ToolRunner>,
    models: Models,
    chaos: Option<ChaosHook>,
}

impl Actor for Executor {
    type Msg = ExecutorMsg;
    type State = ExecutorState;
    type Arguments = ExecutorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.slot.publish(myself);
        Ok(ExecutorState {
            slot: args.slot,
            journal: args.journal,
            runner: args.runner,
            models: args.models,
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
            ExecutorMsg::Execute { call, reply } => {
                // A worker per call: the actor stays free, and a call in flight survives a
                // restart of the actor (its reply goes straight to the run's driver). As the
                // tree stops it is dropped, as a crash would: the run resumes at the next start.
                let runner = state.runner.clone();
                let journal = state.journal.clone();
                let slot = state.slot.clone();
                tokio::spawn(async move {
                    let key = call.idempotency_key.clone();
                    let outcome = tokio::select! {
                        outcome = execute(&runner, *call) => outcome,
                        () = slot.closed() => return,
                    };
                    if let (Some(j), Ok(_), false) = (&journal, &outcome.result, outcome.replayed) {
                        // The runner records the result before it returns.
                        j.line("recorded", &key);
                    }
                    let _ = reply.send(outcome);
                });
            }
            ExecutorMsg::Turn { turn, reply } => {
                let (models, runner) = (state.models.clone(), state.runner.clone());
                let slot = state.slot.clone();
                tokio::spawn(async move {
                    let outcome = tokio::select! {
                        outcome = hindsight::run::agent::perform(&models, &turn, runner.clock().as_ref()) => outcome,
                        () = slot.closed() => return,
                    };
                    let _ = reply.send(outcome);
                });
            }
        }
        Ok(())
    }
}

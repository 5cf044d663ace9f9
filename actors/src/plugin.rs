//! The plugin behaviour: callbacks around every run (`before_run`, `after_run`, `on_event`),
//! hosted in an actor of its own so that a crashing plugin is restarted and never fails a run.

use std::sync::Arc;
use std::time::Duration;

use hindsight::{ErrorClass, Task};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::directory::Slot;

/// Something that happened during a run, as plugins see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// A stage's tool call finished well.
    StepSucceeded {
        /// The stage.
        stage: String,
        /// The tool.
        tool: String,
    },
    /// A stage's tool call failed.
    Error {
        /// The stage.
        stage: String,
        /// The tool.
        tool: String,
        /// The class of the error.
        class: ErrorClass,
        /// The message.
        message: String,
    },
    /// Validation passed or failed.
    Validation {
        /// Whether the output passed.
        passed: bool,
        /// Why not, when it did not.
        reason: Option<String>,
    },
    /// The triage loop chose a recovery.
    Recovery {
        /// The failure type.
        failure: String,
        /// The action kind.
        action: String,
    },
}

/// What a run looks like to `after_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run.
    pub run_id: String,
    /// The 1-based round of ReflectRetry this report closes.
    pub round: u32,
    /// Whether the run passed validation.
    pub passed: bool,
    /// Everything that happened in this round.
    pub events: Vec<RunEvent>,
}

/// A plugin's answer to a finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    /// Let the result stand.
    Accept,
    /// Send the run back to the orchestrator with this reflection in its context.
    Retry {
        /// Which retry this is (1-based).
        attempt: u32,
        /// The reflection message.
        reflection: String,
    },
}

/// Error a plugin callback may return; it is logged, never fails the run.
pub type PluginError = Box<dyn std::error::Error + Send + Sync>;

/// The plugin behaviour. Every callback has a default that does nothing.
pub trait Plugin: Send + Sync + 'static {
    /// A short name, used in configuration and logs.
    fn name(&self) -> &str;

    /// Called before a run starts.
    fn before_run(&mut self, _task: &Task) -> Result<(), PluginError> {
        Ok(())
    }

    /// Called for every event of a run.
    fn on_event(&mut self, _run_id: &str, _event: &RunEvent) -> Result<(), PluginError> {
        Ok(())
    }

    /// Called when a run (or a round of it) finished; may ask for a retry.
    fn after_run(
        &mut self,
        _report: &RunReport,
    ) -> impl std::future::Future<Output = Result<Verdict, PluginError>> + Send {
        async { Ok(Verdict::Accept) }
    }
}

/// Messages of a plugin host actor.
pub enum PluginMsg {
    /// `before_run`.
    BeforeRun(Box<Task>),
    /// `on_event`.
    Event(String, RunEvent),
    /// `after_run`, answered with the verdict.
    AfterRun(Box<RunReport>, RpcReplyPort<Verdict>),
}

/// Builds a plugin afresh on every (re)start of its host, reloading whatever it persisted.
pub type PluginFactory<P> = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<P, PluginError>> + Send>>
        + Send
        + Sync,
>;

/// The actor that hosts one plugin.
pub struct PluginHost<P: Plugin> {
    _plugin: std::marker::PhantomData<fn() -> P>,
}

impl<P: Plugin> Default for PluginHost<P> {
    fn default() -> Self {
        PluginHost {
            _plugin: std::marker::PhantomData,
        }
    }
}

/// Start-up arguments of a plugin host.
pub struct PluginArgs<P: Plugin> {
    /// Builds the plugin.
    pub factory: PluginFactory<P>,
    /// Where the host publishes itself.
    pub slot: Arc<Slot<PluginMsg>>,
    /// Fault injection, if any.
    pub chaos: Option<crate::chaos_hook::ChaosHook>,
}

/// State of a plugin host.
pub struct PluginState<P: Plugin> {
    plugin: P,
    chaos: Option<crate::chaos_hook::ChaosHook>,
}

impl<P: Plugin> Actor for PluginHost<P> {
    type Msg = PluginMsg;
    type State = PluginState<P>;
    type Arguments = PluginArgs<P>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let plugin = (args.factory)().await?;
        args.slot.publish(myself);
        Ok(PluginState {
            plugin,
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
        let name = state.plugin.name().to_string();
        match msg {
            PluginMsg::BeforeRun(task) => {
                if let Err(e) = state.plugin.before_run(&task) {
                    tracing::warn!(plugin = %name, error = %e, "before_run failed");
                }
            }
            PluginMsg::Event(run_id, event) => {
                if let Err(e) = state.plugin.on_event(&run_id, &event) {
                    tracing::warn!(plugin = %name, error = %e, "on_event failed");
                }
            }
            PluginMsg::AfterRun(report, reply) => {
                let verdict = match state.plugin.after_run(&report).await {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!(plugin = %name, error = %e, "after_run failed");
                        Verdict::Accept
                    }
                };
                let _ = reply.send(verdict);
            }
        }
        Ok(())
    }
}

/// How long a run waits for a plugin's verdict before it goes on without it.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(10);

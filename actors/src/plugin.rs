//! The plugin behaviour: callbacks around every run (`before_run`, `after_run`, `on_event`),
//! hosted in an actor of its own so that a crashing plugin is restarted and never fails a run.
//!
//! The tree hosts ReflectRetry and the plugins an embedder adds with [`PluginSpec`]
//! (`TreeSpec::plugins`, `RuntimeOptions::plugins`): each gets its own host under the root
//! supervisor, sees every run's start, every event as it happens and every round's report, and
//! may ask for a retry within the `max_retries` it was given. A plugin that errs is logged; one
//! that panics while observing is built afresh; one that panics in `after_run` is restarted by
//! the supervisor. None of it fails a run.

use std::sync::Arc;
use std::time::Duration;

use hindsight::Task;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::supervisor::ChildSpec;

pub use hindsight::run::{RunEvent, RunReport, Verdict};

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
    /// `before_run` (the task shared with the run and the other plugins).
    BeforeRun(Arc<Task>),
    /// `on_event`.
    Event(String, RunEvent),
    /// `after_run`, answered with the verdict (the report shared with the other plugins).
    AfterRun(Arc<RunReport>, RpcReplyPort<Verdict>),
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
    factory: PluginFactory<P>,
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
            factory: args.factory,
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
        // A panic in `before_run` or `on_event` (casts nobody waits for) is caught: it is logged
        // and the plugin is built afresh, without spending the supervisor's restart intensity
        // (a plugin that panics on every event would otherwise take the whole tree down). A
        // panic in `after_run` crashes the host as any actor's would: the supervisor restarts
        // it, and a caller that re-sends the report (`Slot::call`) reaches the successor.
        let plugin = &mut state.plugin;
        let (callback, outcome) = match msg {
            PluginMsg::BeforeRun(task) => (
                "before_run",
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plugin.before_run(&task))),
            ),
            PluginMsg::Event(run_id, event) => (
                "on_event",
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    plugin.on_event(&run_id, &event)
                })),
            ),
            PluginMsg::AfterRun(report, reply) => {
                let verdict = match plugin.after_run(&report).await {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!(plugin = %name, error = %e, "after_run failed");
                        Verdict::Accept
                    }
                };
                let _ = reply.send(verdict);
                return Ok(());
            }
        };
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(plugin = %name, error = %e, "{callback} failed"),
            Err(_) => {
                tracing::warn!(plugin = %name, "{callback} panicked; the plugin is built afresh");
                state.plugin = (state.factory)().await?;
            }
        }
        Ok(())
    }
}

/// How long a run waits for a plugin's verdict before it goes on without it.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The child spec of a host of the plugin `factory` builds, publishing itself in `slot`.
pub(crate) fn host_child<P: Plugin>(
    id: String,
    factory: PluginFactory<P>,
    slot: Arc<Slot<PluginMsg>>,
    chaos: Option<ChaosHook>,
) -> ChildSpec {
    ChildSpec::actor(id, None, move || {
        (
            PluginHost::<P>::default(),
            PluginArgs {
                factory: factory.clone(),
                slot: slot.clone(),
                chaos: chaos.clone(),
            },
        )
    })
}

/// Starts a plugin's host under a supervisor, publishing it in the given slot.
type StartHost = Arc<dyn Fn(Arc<Slot<PluginMsg>>, Option<ChaosHook>) -> ChildSpec + Send + Sync>;

/// A plugin an embedder adds to the tree: its name, how to build it, and how many retries of a
/// run it may ask for.
#[derive(Clone)]
pub struct PluginSpec {
    name: String,
    max_retries: u32,
    start: StartHost,
}

impl std::fmt::Debug for PluginSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSpec")
            .field("name", &self.name)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

impl PluginSpec {
    /// A plugin built by `factory` on every (re)start of its host (reload what it persisted
    /// there). Its `Retry` verdicts are ignored until [`PluginSpec::max_retries`] allows some.
    pub fn new<P: Plugin>(name: impl Into<String>, factory: PluginFactory<P>) -> PluginSpec {
        let name = name.into();
        let id = format!("plugin:{name}");
        let start: StartHost =
            Arc::new(move |slot, chaos| host_child(id.clone(), factory.clone(), slot, chaos));
        PluginSpec {
            name,
            max_retries: 0,
            start,
        }
    }

    /// A plugin made by a plain function on every (re)start of its host.
    pub fn from_fn<P: Plugin>(
        name: impl Into<String>,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> PluginSpec {
        let make = Arc::new(make);
        let factory: PluginFactory<P> = Arc::new(move || {
            let plugin = make();
            Box::pin(async move { Ok(plugin) })
        });
        PluginSpec::new(name, factory)
    }

    /// Lets the plugin send a run back (a `Retry` verdict) up to `n` times per run.
    pub fn max_retries(mut self, n: u32) -> PluginSpec {
        self.max_retries = n;
        self
    }

    /// The plugin's name (its host's child id is `plugin:<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the runs find the plugin: an empty slot its host will publish itself in.
    pub(crate) fn slot(&self) -> PluginSlot {
        PluginSlot {
            name: self.name.clone(),
            max_retries: self.max_retries,
            slot: Arc::new(Slot::new("plugin")),
        }
    }

    /// The host's child spec, publishing the host in `slot`.
    pub(crate) fn child(&self, slot: Arc<Slot<PluginMsg>>, chaos: Option<ChaosHook>) -> ChildSpec {
        (self.start)(slot, chaos)
    }
}

/// An embedder's plugin as the runs see it: where its host is, and its retry allowance.
#[derive(Clone)]
pub struct PluginSlot {
    /// The plugin's name.
    pub name: String,
    /// How many retries per run it may ask for.
    pub max_retries: u32,
    /// Its host.
    pub slot: Arc<Slot<PluginMsg>>,
}

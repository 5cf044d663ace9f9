//! Child specifications: an id, a restart type, a shutdown policy and a start function.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorName, ActorProcessingErr};

/// When a child is restarted after it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Restart {
    /// Always restarted.
    Permanent,
    /// Restarted only after an abnormal exit (panic, error, kill).
    Transient,
    /// Never restarted; removed from the supervisor when it exits.
    Temporary,
}

/// How a child is stopped when the supervisor shuts it down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Killed at once (no `post_stop`).
    BrutalKill,
    /// Asked to stop (its `post_stop` runs); killed if it has not stopped within the duration.
    Timeout(Duration),
    /// Asked to stop and waited for without limit (the default for supervisors).
    Infinity,
}

/// Whether a child is a worker or itself a supervisor (informational, and picks the default
/// shutdown: 5 s for workers, infinity for supervisors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildKind {
    /// An ordinary actor.
    Worker,
    /// A nested supervisor.
    Supervisor,
}

/// The future a start function returns: the started child's cell, linked to the supervisor.
pub type StartFuture = Pin<Box<dyn Future<Output = Result<ActorCell, ActorProcessingErr>> + Send>>;

/// Starts a child: receives the supervisor's cell, must spawn the child linked to it
/// (`Actor::spawn_linked(.., supervisor)`) and return the child's cell once it has started.
pub type StartFn = Arc<dyn Fn(ActorCell) -> StartFuture + Send + Sync>;

/// What a supervisor needs to start, restart and stop one child.
#[derive(Clone)]
pub struct ChildSpec {
    /// Unique within its supervisor; not used as a registry name.
    pub id: String,
    /// When to restart.
    pub restart: Restart,
    /// How to stop.
    pub shutdown: Shutdown,
    /// Worker or supervisor.
    pub kind: ChildKind,
    /// The start function.
    pub start: StartFn,
}

impl std::fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .field("kind", &self.kind)
            .finish()
    }
}

/// The default per-child shutdown timeout of workers.
pub const DEFAULT_WORKER_SHUTDOWN: Duration = Duration::from_secs(5);

impl ChildSpec {
    /// A permanent worker with a 5 s shutdown timeout, started by `start`.
    pub fn new<F, Fut>(id: impl Into<String>, start: F) -> Self
    where
        F: Fn(ActorCell) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ActorCell, ActorProcessingErr>> + Send + 'static,
    {
        ChildSpec {
            id: id.into(),
            restart: Restart::Permanent,
            shutdown: Shutdown::Timeout(DEFAULT_WORKER_SHUTDOWN),
            kind: ChildKind::Worker,
            start: Arc::new(move |sup| Box::pin(start(sup))),
        }
    }

    /// A permanent worker running the ractor actor built by `make` (called at every (re)start,
    /// returning the handler and its arguments), spawned linked under the optional registry
    /// `name` (an actor name must be unique process-wide; `None` leaves it unnamed).
    pub fn actor<A, F>(id: impl Into<String>, name: Option<ActorName>, make: F) -> Self
    where
        A: Actor,
        F: Fn() -> (A, A::Arguments) + Send + Sync + 'static,
    {
        let make = Arc::new(make);
        Self::new(id, move |sup: ActorCell| {
            let make = Arc::clone(&make);
            let name = name.clone();
            async move {
                let (handler, args) = make();
                let (actor, _join) = A::spawn_linked(name, handler, args, sup).await?;
                Ok(actor.get_cell())
            }
        })
    }

    /// Sets the restart type.
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Sets the shutdown policy.
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Sets the kind (a supervisor kind also defaults the shutdown to infinity).
    pub fn kind(mut self, kind: ChildKind) -> Self {
        if kind == ChildKind::Supervisor && self.kind == ChildKind::Worker {
            self.shutdown = Shutdown::Infinity;
        }
        self.kind = kind;
        self
    }
}

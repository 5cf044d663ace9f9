//! The supervisor actor: starts its children in order, restarts them by strategy and restart
//! type within the restart intensity, shuts them down in reverse order, and answers run-time
//! requests (start, terminate, which children).

use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{
    Actor, ActorCell, ActorName, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr,
    SupervisionEvent,
};
use tokio::time::Instant;

use super::error::SupervisorError;
use super::event::{ExitReason, SupervisorEvent};
use super::intensity::RestartWindow;
use super::options::{Strategy, SupervisorOptions};
use super::spec::{ChildKind, ChildSpec, Restart, Shutdown};
use crate::call::{CallError, CallExt};

/// The supervisor's one message type.
pub enum SupervisorMsg {
    /// Starts a new child (appended last in start order) and replies with its cell.
    StartChild(ChildSpec, RpcReplyPort<Result<ActorCell, SupervisorError>>),
    /// Stops the child with this id (by its shutdown policy) and removes its spec.
    TerminateChild(String, RpcReplyPort<Result<(), SupervisorError>>),
    /// Replies with every child, in start order.
    WhichChildren(RpcReplyPort<Vec<ChildInfo>>),
    /// Internal: a delayed (backoff) restart is due.
    #[doc(hidden)]
    RestartDue(u64),
}

/// The run state of one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildState {
    /// Running; its cell is known.
    Running,
    /// Exited and waiting to be started again (backoff or a failed start).
    Restarting,
    /// Exited and not restarted (a transient child that exited normally).
    Terminated,
}

/// One child as reported by [`SupervisorMsg::WhichChildren`].
#[derive(Debug, Clone)]
pub struct ChildInfo {
    /// The child id.
    pub id: String,
    /// The running actor, if any.
    pub cell: Option<ActorCell>,
    /// Its restart type.
    pub restart: Restart,
    /// Worker or supervisor.
    pub kind: ChildKind,
    /// Its run state.
    pub state: ChildState,
    /// How many times it was restarted by this supervisor.
    pub restarts: u64,
}

/// The start-up arguments of a [`Supervisor`].
pub struct SupervisorArgs {
    /// The configuration.
    pub options: SupervisorOptions,
    /// The initial children, started in this order.
    pub children: Vec<ChildSpec>,
}

struct Child {
    spec: ChildSpec,
    cell: Option<ActorCell>,
    state: ChildState,
    restarts: u64,
    recent: RestartWindow,
    pending: Option<u64>,
}

impl Child {
    fn new(spec: ChildSpec, cell: ActorCell, period: Duration) -> Self {
        Child {
            spec,
            cell: Some(cell),
            state: ChildState::Running,
            restarts: 0,
            recent: RestartWindow::new(u32::MAX, period),
            pending: None,
        }
    }

    fn info(&self) -> ChildInfo {
        ChildInfo {
            id: self.spec.id.clone(),
            cell: self.cell.clone(),
            restart: self.spec.restart,
            kind: self.spec.kind,
            state: self.state,
            restarts: self.restarts,
        }
    }
}

/// The supervisor's state (opaque).
pub struct SupervisorState {
    options: SupervisorOptions,
    children: Vec<Child>,
    window: RestartWindow,
    next_token: u64,
}

/// The OTP-style supervisor actor. Spawn it with [`Supervisor::spawn`] or
/// [`Supervisor::spawn_linked`], or nest it with [`Supervisor::child_spec`].
pub struct Supervisor;

impl Supervisor {
    /// Spawns an unsupervised (root) supervisor; returns once every child has started in order.
    /// A child that fails to start stops the ones already started (reverse order) and the spawn
    /// fails.
    pub async fn spawn(
        name: Option<ActorName>,
        options: SupervisorOptions,
        children: Vec<ChildSpec>,
    ) -> Result<(ActorRef<SupervisorMsg>, JoinHandle<()>), SpawnErr> {
        <Supervisor as Actor>::spawn(name, Supervisor, SupervisorArgs { options, children }).await
    }

    /// Spawns a supervisor linked to `parent`.
    pub async fn spawn_linked(
        name: Option<ActorName>,
        options: SupervisorOptions,
        children: Vec<ChildSpec>,
        parent: ActorCell,
    ) -> Result<(ActorRef<SupervisorMsg>, JoinHandle<()>), SpawnErr> {
        <Supervisor as Actor>::spawn_linked(
            name,
            Supervisor,
            SupervisorArgs { options, children },
            parent,
        )
        .await
    }

    /// A child spec running a nested supervisor with these options and children (permanent,
    /// shutdown infinity, kind supervisor, unnamed).
    pub fn child_spec(
        id: impl Into<String>,
        options: SupervisorOptions,
        children: Vec<ChildSpec>,
    ) -> ChildSpec {
        ChildSpec::new(id, move |parent: ActorCell| {
            let options = options.clone();
            let children = children.clone();
            async move {
                let (sup, _join) =
                    Supervisor::spawn_linked(None, options, children, parent).await?;
                Ok(sup.get_cell())
            }
        })
        .kind(ChildKind::Supervisor)
    }

    /// Asks `sup` to start `spec` (default call timeout).
    pub async fn start_child(
        sup: &ActorRef<SupervisorMsg>,
        spec: ChildSpec,
    ) -> Result<Result<ActorCell, SupervisorError>, CallError> {
        sup.call_bounded(|tx| SupervisorMsg::StartChild(spec, tx))
            .await
    }

    /// Asks `sup` to stop and remove the child `id`. No call timeout: a child may take its
    /// whole shutdown policy to stop.
    pub async fn terminate_child(
        sup: &ActorRef<SupervisorMsg>,
        id: &str,
    ) -> Result<Result<(), SupervisorError>, CallError> {
        let id = id.to_string();
        sup.call_within(
            |tx| SupervisorMsg::TerminateChild(id, tx),
            Duration::from_secs(24 * 3600),
        )
        .await
    }

    /// Asks `sup` for its children (default call timeout).
    pub async fn which_children(
        sup: &ActorRef<SupervisorMsg>,
    ) -> Result<Vec<ChildInfo>, CallError> {
        sup.call_bounded(SupervisorMsg::WhichChildren).await
    }
}

/// Stops one child by its shutdown policy and waits until it has stopped.
async fn shutdown_child(cell: &ActorCell, shutdown: Shutdown) {
    match shutdown {
        Shutdown::BrutalKill => {
            let _ = cell.kill_and_wait(None).await;
        }
        Shutdown::Timeout(limit) => {
            cell.stop(Some("shutdown".to_string()));
            if cell.wait(Some(limit)).await.is_err() {
                tracing::warn!(actor = ?cell, ?limit, "child did not stop in time: killed");
                let _ = cell.kill_and_wait(None).await;
            }
        }
        Shutdown::Infinity => {
            cell.stop(Some("shutdown".to_string()));
            let _ = cell.wait(None).await;
        }
    }
}

/// Calls a child's start function and links the result to the supervisor if the start function
/// did not.
async fn start_one(spec: &ChildSpec, myself: &ActorCell) -> Result<ActorCell, String> {
    match (spec.start)(myself.clone()).await {
        Ok(cell) => {
            let linked = cell
                .try_get_supervisor()
                .is_some_and(|s| s.get_id() == myself.get_id());
            if !linked {
                cell.link(myself.clone());
            }
            Ok(cell)
        }
        Err(err) => Err(err.to_string()),
    }
}

impl SupervisorState {
    fn label(&self) -> &str {
        &self.options.label
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.children.iter().position(|c| c.spec.id == id)
    }

    /// Stops every running child in reverse start order.
    async fn shutdown_all(&mut self) {
        for child in self.children.iter_mut().rev() {
            if let Some(cell) = child.cell.take() {
                shutdown_child(&cell, child.spec.shutdown).await;
            }
        }
    }

    /// Gives up: stops the children and returns the error the supervisor fails with.
    async fn escalate(&mut self, child: &str, reason: String) -> ActorProcessingErr {
        let err = SupervisorError::IntensityExceeded {
            supervisor: self.label().to_string(),
            child: child.to_string(),
            max_restarts: self.options.intensity.max_restarts,
            period: self.options.intensity.period,
            reason,
        };
        self.options.stats.record_escalation();
        self.options.emit(SupervisorEvent::Escalated {
            supervisor: self.label().to_string(),
            reason: err.to_string(),
        });
        self.shutdown_all().await;
        Box::new(err)
    }

    /// Marks the children with these ids as waiting for restart under a new token, and starts
    /// them now or after the backoff delay.
    async fn schedule(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        ids: &[String],
        trigger: usize,
    ) -> Result<(), ActorProcessingErr> {
        let token = self.next_token;
        self.next_token += 1;
        for child in self.children.iter_mut() {
            if ids.contains(&child.spec.id) {
                child.state = ChildState::Restarting;
                child.pending = Some(token);
            }
        }
        let delay = match (&self.options.backoff, self.children.get(trigger)) {
            (Some(backoff), Some(child)) => backoff.delay(child.recent.len().max(1) as u32),
            _ => Duration::ZERO,
        };
        if delay.is_zero() {
            return self.start_pending(myself, token).await;
        }
        self.options.emit(SupervisorEvent::RestartScheduled {
            supervisor: self.label().to_string(),
            children: ids.to_vec(),
            delay,
        });
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = me.cast(SupervisorMsg::RestartDue(token));
        });
        Ok(())
    }

    /// Starts, in order, the children waiting under `token`. A failed start counts as another
    /// restart (intensity) and is retried, with the remaining children, under a new token.
    async fn start_pending(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        token: u64,
    ) -> Result<(), ActorProcessingErr> {
        let me = myself.get_cell();
        let mut index = 0;
        while index < self.children.len() {
            if self.children[index].pending != Some(token) {
                index += 1;
                continue;
            }
            match start_one(&self.children[index].spec, &me).await {
                Ok(cell) => {
                    let label = self.options.label.clone();
                    let child = &mut self.children[index];
                    child.cell = Some(cell);
                    child.state = ChildState::Running;
                    child.pending = None;
                    child.restarts += 1;
                    self.options.stats.record_restart(&label, &child.spec.id);
                    self.options.emit(SupervisorEvent::ChildStarted {
                        supervisor: label,
                        child: child.spec.id.clone(),
                        restart: true,
                    });
                    index += 1;
                }
                Err(reason) => {
                    let id = self.children[index].spec.id.clone();
                    self.options.emit(SupervisorEvent::RestartFailed {
                        supervisor: self.label().to_string(),
                        child: id.clone(),
                        reason: reason.clone(),
                    });
                    let now = Instant::now();
                    self.children[index].recent.record(now);
                    if !self.window.record(now) {
                        return Err(self.escalate(&id, reason).await);
                    }
                    let rest: Vec<String> = self.children[index..]
                        .iter()
                        .filter(|c| c.pending == Some(token))
                        .map(|c| c.spec.id.clone())
                        .collect();
                    return Box::pin(self.schedule(myself, &rest, index)).await;
                }
            }
        }
        Ok(())
    }

    /// Handles the exit of the child at `index`.
    async fn on_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        index: usize,
        reason: ExitReason,
    ) -> Result<(), ActorProcessingErr> {
        let child = &mut self.children[index];
        child.cell = None;
        let restart_type = child.spec.restart;
        let will_restart = match restart_type {
            Restart::Permanent => true,
            Restart::Transient => reason.is_abnormal(),
            Restart::Temporary => false,
        };
        let id = child.spec.id.clone();
        self.options.emit(SupervisorEvent::ChildExited {
            supervisor: self.label().to_string(),
            child: id.clone(),
            restart_type,
            reason: reason.clone(),
            will_restart,
        });
        if !will_restart {
            if restart_type == Restart::Temporary {
                self.children.remove(index);
            } else {
                self.children[index].state = ChildState::Terminated;
            }
            return Ok(());
        }
        let now = Instant::now();
        self.children[index].recent.record(now);
        if !self.window.record(now) {
            return Err(self.escalate(&id, reason.to_string()).await);
        }
        // The siblings this strategy restarts along with the child, in start order.
        let range = match self.options.strategy {
            Strategy::OneForOne => index..index + 1,
            Strategy::OneForAll => 0..self.children.len(),
            Strategy::RestForOne => index..self.children.len(),
        };
        let mut ids = Vec::new();
        for (j, sibling) in self.children.iter().enumerate() {
            if range.contains(&j) && (j == index || sibling.cell.is_some()) {
                ids.push(sibling.spec.id.clone());
            }
        }
        // Stop the running siblings in reverse order; temporary ones are not restarted.
        for j in range.rev() {
            if j == index {
                continue;
            }
            let sibling = &mut self.children[j];
            if let Some(cell) = sibling.cell.take() {
                shutdown_child(&cell, sibling.spec.shutdown).await;
                sibling.state = ChildState::Restarting;
            }
        }
        let temporary: Vec<String> = self
            .children
            .iter()
            .filter(|c| c.spec.restart == Restart::Temporary && ids.contains(&c.spec.id))
            .map(|c| c.spec.id.clone())
            .collect();
        self.children.retain(|c| !temporary.contains(&c.spec.id));
        ids.retain(|id| !temporary.contains(id));
        let trigger = self.position(&id).unwrap_or(0);
        self.schedule(myself, &ids, trigger).await
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let SupervisorArgs { options, children } = args;
        let period = options.intensity.period;
        let mut state = SupervisorState {
            window: RestartWindow::new(options.intensity.max_restarts, period),
            options,
            children: Vec::with_capacity(children.len()),
            next_token: 0,
        };
        let me = myself.get_cell();
        for spec in children {
            if state.position(&spec.id).is_some() {
                state.shutdown_all().await;
                return Err(Box::new(SupervisorError::DuplicateChild {
                    supervisor: state.label().to_string(),
                    child: spec.id,
                }));
            }
            match start_one(&spec, &me).await {
                Ok(cell) => {
                    state.options.emit(SupervisorEvent::ChildStarted {
                        supervisor: state.label().to_string(),
                        child: spec.id.clone(),
                        restart: false,
                    });
                    state.children.push(Child::new(spec, cell, period));
                }
                Err(reason) => {
                    state.shutdown_all().await;
                    return Err(Box::new(SupervisorError::StartFailed {
                        supervisor: state.label().to_string(),
                        child: spec.id,
                        reason,
                    }));
                }
            }
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.shutdown_all().await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::StartChild(spec, reply) => {
                if state.position(&spec.id).is_some() {
                    let _ = reply.send(Err(SupervisorError::DuplicateChild {
                        supervisor: state.label().to_string(),
                        child: spec.id,
                    }));
                    return Ok(());
                }
                let result = match start_one(&spec, &myself.get_cell()).await {
                    Ok(cell) => {
                        state.options.emit(SupervisorEvent::ChildStarted {
                            supervisor: state.label().to_string(),
                            child: spec.id.clone(),
                            restart: false,
                        });
                        let period = state.options.intensity.period;
                        state.children.push(Child::new(spec, cell.clone(), period));
                        Ok(cell)
                    }
                    Err(reason) => Err(SupervisorError::StartFailed {
                        supervisor: state.label().to_string(),
                        child: spec.id,
                        reason,
                    }),
                };
                let _ = reply.send(result);
            }
            SupervisorMsg::TerminateChild(id, reply) => match state.position(&id) {
                Some(index) => {
                    let child = state.children.remove(index);
                    if let Some(cell) = &child.cell {
                        shutdown_child(cell, child.spec.shutdown).await;
                    }
                    let _ = reply.send(Ok(()));
                }
                None => {
                    let _ = reply.send(Err(SupervisorError::UnknownChild {
                        supervisor: state.label().to_string(),
                        child: id,
                    }));
                }
            },
            SupervisorMsg::WhichChildren(reply) => {
                let _ = reply.send(state.children.iter().map(Child::info).collect());
            }
            SupervisorMsg::RestartDue(token) => {
                state.start_pending(&myself, token).await?;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(reason) = ExitReason::from_event(&event) else {
            return Ok(());
        };
        let Some(actor) = event.actor_id() else {
            return Ok(());
        };
        // Exits of children the supervisor stopped itself, or of old incarnations, are ignored.
        let Some(index) = state
            .children
            .iter()
            .position(|c| c.cell.as_ref().is_some_and(|cell| cell.get_id() == actor))
        else {
            return Ok(());
        };
        state.on_exit(&myself, index, reason).await
    }
}

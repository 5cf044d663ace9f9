//! Where the live actors of one tree are: a slot per role holding the current `ActorRef`, updated
//! by each actor as it (re)starts, and calls that survive a restart of the callee.
//!
//! ractor gives a restarted actor a new `ActorRef`, and a call whose callee dies mid-message ends
//! with its reply port dropped. A [`Slot`] lets callers wait for the successor instead of failing
//! the run, and bounds every call with a timeout (ractor's `call` has none by default). A slot
//! closed as its tree stops ([`Slot::close`]) has no successor to wait for: a caller of an actor
//! that stopped fails at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorId, ActorRef, Message, MessagingErr, RpcReplyPort};
use tokio::sync::watch;

/// The default time a call waits for its reply.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a caller waits for a dead actor's successor before it gives up.
pub const DEFAULT_RESTART_WAIT: Duration = Duration::from_secs(10);

/// How many times a call is re-sent to a restarted actor.
pub const MAX_CALL_ATTEMPTS: u32 = 20;

/// Why a call to an actor of the tree failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The role has no live actor and none came back in time.
    #[error("the {role} actor is not running and was not restarted within {waited_ms} ms")]
    Unavailable {
        /// The role.
        role: &'static str,
        /// How long the caller waited.
        waited_ms: u64,
    },
    /// The actor did not answer in time.
    #[error("the {role} actor did not answer within {timeout_ms} ms")]
    Timeout {
        /// The role.
        role: &'static str,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The actor kept dying while handling the message.
    #[error("the {role} actor failed {attempts} times while handling the message")]
    Exhausted {
        /// The role.
        role: &'static str,
        /// Attempts made.
        attempts: u32,
    },
}

/// The current actor of one role.
pub struct Slot<M: Message> {
    role: &'static str,
    tx: watch::Sender<Option<ActorRef<M>>>,
    /// Set as the tree stops: no actor will be published again.
    closed: AtomicBool,
}

impl<M: Message> Slot<M> {
    /// An empty slot for `role`.
    pub fn new(role: &'static str) -> Slot<M> {
        let (tx, _rx) = watch::channel(None);
        Slot {
            role,
            tx,
            closed: AtomicBool::new(false),
        }
    }

    /// The role's name.
    pub fn role(&self) -> &'static str {
        self.role
    }

    /// Makes `actor` the current actor of the role (called by the actor in `pre_start`).
    pub fn publish(&self, actor: ActorRef<M>) {
        self.tx.send_replace(Some(actor));
    }

    /// Closes the slot as its tree stops: a caller no longer waits for a successor of an actor
    /// that stopped (nor for a first actor), and those waiting give up now; a running actor is
    /// still called.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wakes the callers waiting for a successor, which then see the slot closed.
        self.tx.send_modify(|_| {});
    }

    /// Resolves once the slot is closed ([`Slot::close`]).
    pub async fn closed(&self) {
        let mut rx = self.tx.subscribe();
        while !self.closed.load(Ordering::SeqCst) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The current actor, if one is running.
    pub fn current(&self) -> Option<ActorRef<M>> {
        self.tx.borrow().clone()
    }

    /// Waits until the slot holds an actor other than `dead` (or any actor when `dead` is None);
    /// a closed slot's caller waits for none.
    async fn successor(
        &self,
        dead: Option<ActorId>,
        wait: Duration,
    ) -> Result<ActorRef<M>, CallError> {
        let mut rx = self.tx.subscribe();
        let found = tokio::time::timeout(wait, async {
            loop {
                {
                    let cur = rx.borrow_and_update();
                    if let Some(actor) = cur.as_ref() {
                        let same = dead == Some(actor.get_id());
                        if !same && actor.get_status() != ractor::ActorStatus::Stopped {
                            return Some(actor.clone());
                        }
                    }
                }
                if self.closed.load(Ordering::SeqCst) {
                    return None;
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(actor)) => Ok(actor),
            _ => Err(CallError::Unavailable {
                role: self.role,
                waited_ms: wait.as_millis() as u64,
            }),
        }
    }

    /// Sends a message to the current actor, if one is running, without waiting for anything:
    /// for news the recipient can do without (or recovers by itself when it starts again).
    pub fn tell(&self, msg: M) {
        if let Some(actor) = self.current() {
            let _ = actor.cast(msg);
        }
    }

    /// Sends a message without waiting for an answer; if the actor is dead, waits for its
    /// successor and sends it there.
    pub async fn cast(&self, msg: M) -> Result<(), CallError> {
        let mut msg = msg;
        let mut dead: Option<ActorId> = None;
        for _ in 0..MAX_CALL_ATTEMPTS {
            let actor = self.successor(dead, DEFAULT_RESTART_WAIT).await?;
            match actor.cast(msg) {
                Ok(()) => return Ok(()),
                Err(MessagingErr::SendErr(back)) => {
                    msg = back;
                    dead = Some(actor.get_id());
                }
                Err(_) => {
                    return Err(CallError::Unavailable {
                        role: self.role,
                        waited_ms: 0,
                    });
                }
            }
        }
        Err(CallError::Exhausted {
            role: self.role,
            attempts: MAX_CALL_ATTEMPTS,
        })
    }

    /// Calls the actor with the default timeout, re-sending to its successor when it dies.
    pub async fn call<R, F>(&self, build: F) -> Result<R, CallError>
    where
        R: Send + 'static,
        F: Fn(RpcReplyPort<R>) -> M,
    {
        self.call_with_timeout(build, DEFAULT_CALL_TIMEOUT).await
    }

    /// Calls the actor with `timeout`, re-sending to its successor when it dies mid-message.
    ///
    /// The message may therefore be handled more than once when the actor dies after acting on
    /// it and before answering: every message of the tree is idempotent for that reason.
    pub async fn call_with_timeout<R, F>(&self, build: F, timeout: Duration) -> Result<R, CallError>
    where
        R: Send + 'static,
        F: Fn(RpcReplyPort<R>) -> M,
    {
        self.call_with(build, timeout, MAX_CALL_ATTEMPTS).await
    }

    /// Like [`Slot::call_with_timeout`], following up to `attempts` restarts of the callee. A
    /// caller whose answer comes only at the end of a long run (a task submission) follows
    /// every restart that happens meanwhile.
    pub async fn call_with<R, F>(
        &self,
        build: F,
        timeout: Duration,
        attempts: u32,
    ) -> Result<R, CallError>
    where
        R: Send + 'static,
        F: Fn(RpcReplyPort<R>) -> M,
    {
        let mut dead: Option<ActorId> = None;
        for _ in 0..attempts {
            let actor = self.successor(dead, DEFAULT_RESTART_WAIT).await?;
            let id = actor.get_id();
            match call_letting_go(actor, &build, timeout).await {
                Ok(CallResult::Success(reply)) => return Ok(reply),
                Ok(CallResult::Timeout) => {
                    return Err(CallError::Timeout {
                        role: self.role,
                        timeout_ms: timeout.as_millis() as u64,
                    });
                }
                Ok(CallResult::SenderError) | Err(_) => dead = Some(id),
            }
        }
        Err(CallError::Exhausted {
            role: self.role,
            attempts: MAX_CALL_ATTEMPTS,
        })
    }
}

/// Sends one request to `actor` and waits for its reply (or the timeout) without holding on to
/// `actor` meanwhile.
///
/// A reply port must not be kept alive by its own caller. ractor 0.16 admits a message and
/// enqueues it in two steps, so a message sent while its callee dies can land in a mailbox that
/// was already drained; the message, and the reply port in it, then live as long as any
/// `ActorRef` to the dead actor does. A caller that kept its `ActorRef` while waiting would wait
/// out its whole timeout (an hour, for a task submission). Letting go of it means that once the
/// slot has moved on to the successor the dead mailbox is freed, the port is dropped, and the
/// caller re-sends; while a reply the dead callee handed off to other work still arrives.
async fn call_letting_go<M, R, F>(
    actor: ActorRef<M>,
    build: F,
    timeout: Duration,
) -> Result<CallResult<R>, MessagingErr<M>>
where
    M: Message,
    R: Send + 'static,
    F: FnOnce(RpcReplyPort<R>) -> M,
{
    let (tx, rx) = ractor::concurrency::oneshot();
    let port: RpcReplyPort<R> = (tx, timeout).into();
    actor.cast(build(port))?;
    drop(actor);
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(reply)) => Ok(CallResult::Success(reply)),
        Ok(Err(_)) => Ok(CallResult::SenderError),
        Err(_) => Ok(CallResult::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::Arc;

    struct Echo;

    impl Actor for Echo {
        type Msg = RpcReplyPort<u32>;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<Self::Msg>,
            _args: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _myself: ActorRef<Self::Msg>,
            reply: Self::Msg,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            let _ = reply.send(7);
            Ok(())
        }
    }

    /// A caller waiting for a successor gives up as the slot closes, without waiting out the
    /// restart wait (the clock is tokio's paused one: it moves only when every task waits on
    /// it), while a running actor is still called through a closed slot.
    #[tokio::test(start_paused = true)]
    async fn a_closed_slot_has_no_successor_to_wait_for_and_still_calls_a_running_actor() {
        let slot: Arc<Slot<RpcReplyPort<u32>>> = Arc::new(Slot::new("echo"));
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let slot = slot.clone();
            async move { slot.call(|reply| reply).await }
        });
        tokio::task::yield_now().await;
        slot.close();
        let answer = waiting.await.unwrap();
        assert!(
            matches!(answer, Err(CallError::Unavailable { role: "echo", .. })),
            "{answer:?}"
        );
        assert!(
            started.elapsed() < DEFAULT_RESTART_WAIT,
            "it waited for a successor"
        );
        let (actor, handle) = Actor::spawn(None, Echo, ()).await.unwrap();
        slot.publish(actor.clone());
        assert_eq!(slot.call(|reply| reply).await.unwrap(), 7);
        actor.stop(None);
        handle.await.unwrap();
        let gone = slot.call(|reply| reply).await;
        assert!(
            matches!(gone, Err(CallError::Unavailable { .. })),
            "{gone:?}"
        );
        assert!(
            started.elapsed() < DEFAULT_RESTART_WAIT,
            "it waited for a successor"
        );
    }
}

//! Calls (request/reply) to actors, always bounded by a timeout: ractor's `call!` waits forever,
//! so every call in hindsight goes through [`call`] (default timeout) or [`call_with_timeout`].

use std::future::Future;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};

/// The timeout of [`call`] and [`call_default!`](crate::call_default): 5 seconds.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The actor is not running (stopped, or never started): the request was not delivered.
    #[error("call to actor {actor}: not delivered, the actor is not running")]
    NotDelivered {
        /// The actor's name or id.
        actor: String,
    },
    /// The actor dropped the reply port without answering (it died while handling the request or
    /// before reaching it).
    #[error("call to actor {actor}: no reply, the actor dropped the request (it may have died)")]
    Dropped {
        /// The actor's name or id.
        actor: String,
    },
    /// No reply within the timeout.
    #[error("call to actor {actor}: no reply within {timeout:?}")]
    Timeout {
        /// The actor's name or id.
        actor: String,
        /// The timeout that passed.
        timeout: Duration,
    },
}

impl CallError {
    /// Whether the failure may go away by calling again (the actor died or was restarting).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CallError::NotDelivered { .. } | CallError::Dropped { .. }
        )
    }
}

fn actor_label<M: Message>(actor: &ActorRef<M>) -> String {
    actor
        .get_name()
        .unwrap_or_else(|| actor.get_id().to_string())
}

/// Sends the request built by `build` (given the reply port) and waits at most `timeout` for the
/// reply.
pub async fn call_with_timeout<M, R, F>(
    actor: &ActorRef<M>,
    build: F,
    timeout: Duration,
) -> Result<R, CallError>
where
    M: Message,
    R: Send + 'static,
    F: FnOnce(RpcReplyPort<R>) -> M,
{
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(reply)) => Ok(reply),
        Ok(CallResult::Timeout) => Err(CallError::Timeout {
            actor: actor_label(actor),
            timeout,
        }),
        Ok(CallResult::SenderError) => Err(CallError::Dropped {
            actor: actor_label(actor),
        }),
        Err(_) => Err(CallError::NotDelivered {
            actor: actor_label(actor),
        }),
    }
}

/// [`call_with_timeout`] with [`DEFAULT_CALL_TIMEOUT`].
pub async fn call<M, R, F>(actor: &ActorRef<M>, build: F) -> Result<R, CallError>
where
    M: Message,
    R: Send + 'static,
    F: FnOnce(RpcReplyPort<R>) -> M,
{
    call_with_timeout(actor, build, DEFAULT_CALL_TIMEOUT).await
}

/// Method syntax for bounded calls on an [`ActorRef`] (works on values and references alike).
pub trait CallExt<M: Message> {
    /// [`call`]: the default timeout.
    fn call_bounded<R, F>(&self, build: F) -> impl Future<Output = Result<R, CallError>> + Send
    where
        R: Send + 'static,
        F: FnOnce(RpcReplyPort<R>) -> M + Send;

    /// [`call_with_timeout`].
    fn call_within<R, F>(
        &self,
        build: F,
        timeout: Duration,
    ) -> impl Future<Output = Result<R, CallError>> + Send
    where
        R: Send + 'static,
        F: FnOnce(RpcReplyPort<R>) -> M + Send;
}

impl<M: Message> CallExt<M> for ActorRef<M> {
    fn call_bounded<R, F>(&self, build: F) -> impl Future<Output = Result<R, CallError>> + Send
    where
        R: Send + 'static,
        F: FnOnce(RpcReplyPort<R>) -> M + Send,
    {
        call_with_timeout(self, build, DEFAULT_CALL_TIMEOUT)
    }

    fn call_within<R, F>(
        &self,
        build: F,
        timeout: Duration,
    ) -> impl Future<Output = Result<R, CallError>> + Send
    where
        R: Send + 'static,
        F: FnOnce(RpcReplyPort<R>) -> M + Send,
    {
        call_with_timeout(self, build, timeout)
    }
}

/// Like ractor's `call!`, but bounded by [`DEFAULT_CALL_TIMEOUT`] and returning
/// `Result<_, CallError>`: `call_default!(actor, Msg::Variant, arg1, arg2)` sends
/// `Msg::Variant(arg1, arg2, reply_port)`.
#[macro_export]
macro_rules! call_default {
    ($actor:expr, $msg:expr) => {
        {
            use $crate::call::CallExt as _;
            ($actor).call_bounded(|tx| $msg(tx))
        }
    };
    ($actor:expr, $msg:expr, $($args:expr),+ $(,)?) => {
        {
            use $crate::call::CallExt as _;
            ($actor).call_bounded(|tx| $msg($($args),+, tx))
        }
    };
}

//! The bounded call helper: a reply, a timeout (paused clock), a dropped request when the actor
//! dies, and a request to a stopped actor.

use std::time::Duration;

use hindsight_actors::call::{CallError, CallExt, DEFAULT_CALL_TIMEOUT, call, call_with_timeout};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

enum Msg {
    Echo(u32, RpcReplyPort<u32>),
    Hold(RpcReplyPort<u32>),
    Die(RpcReplyPort<u32>),
}

struct Holder;

impl Actor for Holder {
    type Msg = Msg;
    type State = Vec<RpcReplyPort<u32>>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Vec::new())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Msg>,
        message: Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            Msg::Echo(n, reply) => {
                let _ = reply.send(n);
            }
            Msg::Hold(reply) => state.push(reply),
            Msg::Die(_reply) => panic!("dies holding the reply port"),
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn calls_reply_time_out_or_report_a_dead_actor() {
    let (actor, join) = Actor::spawn(None, Holder, ()).await.unwrap();
    assert_eq!(call(&actor, |tx| Msg::Echo(7, tx)).await, Ok(7));
    assert_eq!(
        hindsight_actors::call_default!(actor, Msg::Echo, 8).await,
        Ok(8)
    );
    let t0 = tokio::time::Instant::now();
    let err = actor.call_bounded(Msg::Hold).await.unwrap_err();
    assert!(matches!(err, CallError::Timeout { timeout, .. } if timeout == DEFAULT_CALL_TIMEOUT));
    assert_eq!(t0.elapsed(), DEFAULT_CALL_TIMEOUT);
    let err = call_with_timeout(&actor, Msg::Hold, Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(!err.is_retryable());

    let err = call(&actor, Msg::Die).await.unwrap_err();
    assert!(matches!(err, CallError::Dropped { .. }), "{err:?}");
    assert!(err.is_retryable());
    join.await.unwrap();
    let err = call(&actor, |tx| Msg::Echo(1, tx)).await.unwrap_err();
    assert!(matches!(err, CallError::NotDelivered { .. }), "{err:?}");
}

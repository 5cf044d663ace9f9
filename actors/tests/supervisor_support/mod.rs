//! Shared test actors for the supervisor tests: a probe that records its start and stop into a
//! shared log and announces each start on a channel.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight_actors::supervisor::{ChildSpec, SupervisorEvent, SupervisorOptions};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

pub type Log = Arc<Mutex<Vec<String>>>;

pub fn new_log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

pub fn log_of(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

pub enum ProbeMsg {
    Panic,
    Fail,
    Exit,
    Ping(RpcReplyPort<String>),
}

pub struct Probe;

pub struct ProbeArgs {
    pub id: String,
    pub log: Log,
    pub started: UnboundedSender<(String, ActorCell)>,
    pub slow_stop: Option<Duration>,
    pub fail_start: bool,
}

impl Actor for Probe {
    type Msg = ProbeMsg;
    type State = ProbeArgs;
    type Arguments = ProbeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ProbeMsg>,
        args: ProbeArgs,
    ) -> Result<ProbeArgs, ActorProcessingErr> {
        if args.fail_start {
            return Err(format!("{} refuses to start", args.id).into());
        }
        args.log.lock().unwrap().push(format!("start:{}", args.id));
        let _ = args.started.send((args.id.clone(), myself.get_cell()));
        Ok(args)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ProbeMsg>,
        state: &mut ProbeArgs,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(delay) = state.slow_stop {
            tokio::time::sleep(delay).await;
        }
        state.log.lock().unwrap().push(format!("stop:{}", state.id));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ProbeMsg>,
        message: ProbeMsg,
        state: &mut ProbeArgs,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProbeMsg::Panic => panic!("probe {} told to panic", state.id),
            ProbeMsg::Fail => return Err(format!("probe {} told to fail", state.id).into()),
            ProbeMsg::Exit => myself.stop(None),
            ProbeMsg::Ping(reply) => {
                let _ = reply.send(state.id.clone());
            }
        }
        Ok(())
    }
}

/// Everything a test needs to watch probes.
pub struct Probes {
    pub log: Log,
    pub tx: UnboundedSender<(String, ActorCell)>,
    pub rx: UnboundedReceiver<(String, ActorCell)>,
}

impl Probes {
    pub fn new() -> Self {
        let (tx, rx) = unbounded_channel();
        Probes {
            log: new_log(),
            tx,
            rx,
        }
    }

    pub fn spec(&self, id: &str) -> ChildSpec {
        self.spec_with(id, None, false)
    }

    pub fn spec_with(&self, id: &str, slow_stop: Option<Duration>, fail_start: bool) -> ChildSpec {
        let log = self.log.clone();
        let tx = self.tx.clone();
        let id_owned = id.to_string();
        ChildSpec::actor(id, None, move || {
            (
                Probe,
                ProbeArgs {
                    id: id_owned.clone(),
                    log: log.clone(),
                    started: tx.clone(),
                    slow_stop,
                    fail_start,
                },
            )
        })
    }

    /// Waits for the next probe start; returns (id, cell).
    pub async fn next_start(&mut self) -> (String, ActorCell) {
        tokio::time::timeout(Duration::from_secs(30), self.rx.recv())
            .await
            .expect("a probe start within 30 s")
            .expect("probe channel open")
    }

    /// Drains the starts already announced (the initial ones).
    pub async fn starts(&mut self, n: usize) -> Vec<(String, ActorCell)> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.next_start().await);
        }
        out
    }

    pub fn log(&self) -> Vec<String> {
        log_of(&self.log)
    }
}

/// Options whose hook forwards every event to the returned channel.
pub fn with_events(
    options: SupervisorOptions,
) -> (SupervisorOptions, UnboundedReceiver<SupervisorEvent>) {
    let (tx, rx) = unbounded_channel();
    (
        options.hook(move |e| {
            let _ = tx.send(e.clone());
        }),
        rx,
    )
}

/// Waits for the first event matching `pred`, skipping the others.
pub async fn wait_event(
    rx: &mut UnboundedReceiver<SupervisorEvent>,
    pred: impl Fn(&SupervisorEvent) -> bool,
) -> SupervisorEvent {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a supervisor event within 30 s")
            .expect("event channel open");
        if pred(&e) {
            return e;
        }
    }
}

pub fn send(cell: &ActorCell, msg: ProbeMsg) {
    cell.send_message(msg).expect("probe is running");
}

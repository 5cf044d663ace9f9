//! OTP-style supervision on ractor's own primitives: child specs, restart strategies
//! (one_for_one, one_for_all, rest_for_one), restart types, restart intensity with escalation,
//! optional backoff, ordered start and reverse-order graceful shutdown, run-time child management
//! and nested supervisors.
//!
//! A [`Supervisor`] is an ordinary ractor actor whose `handle_supervisor_evt` implements the
//! restart policy (ractor's default would stop the parent on any child exit). Children are spawned
//! by their [`ChildSpec`]'s start function, linked to the supervisor with `spawn_linked`.
//!
//! ```no_run
//! # use hindsight_actors::supervisor::*;
//! # async fn demo(worker: ChildSpec) -> Result<(), ractor::SpawnErr> {
//! let options = SupervisorOptions::new(Strategy::OneForOne).label("root");
//! let (sup, _join) = Supervisor::spawn(None, options, vec![worker]).await?;
//! let children = hindsight_actors::call::call(&sup, SupervisorMsg::WhichChildren).await;
//! # let _ = children; Ok(()) }
//! ```

mod error;
mod event;
mod intensity;
mod options;
mod server;
mod spec;
mod stats;

pub use error::SupervisorError;
pub use event::{ExitReason, SupervisorEvent};
pub use intensity::RestartWindow;
pub use options::{Backoff, EventHook, Intensity, Strategy, SupervisorOptions};
pub use server::{ChildInfo, ChildState, Supervisor, SupervisorArgs, SupervisorMsg};
pub use spec::{ChildKind, ChildSpec, Restart, Shutdown, StartFn, StartFuture};
pub use stats::RestartStats;

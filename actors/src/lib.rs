//! hindsight-actors: the imperative shell of hindsight on ractor: the supervision tree, the
//! actors that own state, the ReflectRetry plugin, fault injection and the HTTP API.
//!
//! Start a tree with [`runtime::Runtime::start`] and submit tasks with
//! [`runtime::Runtime::orchestrate`]; or build its children with [`tree::build`] and start them
//! under a supervisor of your own ([`supervisor::Supervisor`]).

pub mod agent_tool;
pub mod app;
pub mod applied;
pub mod call;
pub mod chaos;
pub mod chaos_hook;
pub mod chaos_tools;
pub mod directory;
pub mod executor;
pub mod idempotency;
pub mod journal;
pub mod lesson_board;
pub mod memory;
pub mod orchestrator;
pub mod plugin;
pub mod policy;
pub mod reflect_retry;
pub mod reflector;
pub mod run;
pub mod runtime;
pub mod scope_rows;
pub mod supervisor;
pub mod tenancy;
pub mod tree;
pub mod validator;

pub use runtime::{Runtime, RuntimeError, RuntimeOptions};

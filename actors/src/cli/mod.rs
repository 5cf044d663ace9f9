//! Subcommands of the `hindsight` binary, one module each.

pub mod classify;

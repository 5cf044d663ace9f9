//! Shared by the CLI tests: runs the `hindsight` binary on a data directory.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `hindsight --data DATA ARGS...` and returns its output.
pub fn hindsight(data: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hindsight"))
        .arg("--data")
        .arg(data)
        .args(args)
        .output()
        .unwrap()
}

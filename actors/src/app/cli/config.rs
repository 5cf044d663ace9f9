//! `hindsight config hash-key|show|check`: the API token digest, the effective configuration, and
//! its validation (see [`hindsight_actors::app::api::command`]).

use hindsight_actors::app::api::command::{ConfigArgs, run_config};

use super::Failure;

/// Runs `hindsight config ...` on the process's stdin and stdout.
pub fn run(args: ConfigArgs) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run_config(args, &mut input, &mut out).map_err(Failure::new)
}

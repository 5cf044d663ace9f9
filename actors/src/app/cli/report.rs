//! `hindsight report [--out DIR] [--env FILE]`: the self-contained HTML report (SVG charts) of
//! everything the store under `--data` holds for a simulated environment.

use std::path::PathBuf;

use hindsight::store::StoreOptions;
use hindsight_actors::app::demo;

use super::{Failure, Global};

/// `hindsight report [--out DIR] [--env FILE]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the report goes (default: DATA/report).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The simulated environment the runs came from (default: config/envs/bank_statements.toml,
    /// else the embedded copy).
    #[arg(long, value_name = "FILE")]
    pub env: Option<PathBuf>,
}

/// Writes the report and prints its path.
pub async fn run(global: &Global, args: Args) -> Result<(), Failure> {
    let env = demo::load_env(args.env.as_deref()).map_err(|e| Failure::new(e.to_string()))?;
    let store = super::data::open_existing(&global.data, StoreOptions::default())?;
    let data = demo::report_data(&store, &env, hindsight::now_ms())
        .map_err(|e| Failure::new(e.to_string()))?;
    let dir = args.out.unwrap_or_else(|| global.data.join("report"));
    let path = hindsight_actors::app::report::write_report(&dir, &data)
        .map_err(|e| Failure::new(e.to_string()))?;
    outln!("{}", path.display())
}

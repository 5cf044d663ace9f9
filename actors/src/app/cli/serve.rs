//! `hindsight serve`: the daemon. Starts the supervision tree described by the configuration,
//! serves the HTTP API over it until ctrl-c or SIGTERM, then stops accepting, lets in-flight
//! requests finish (within `api.shutdown_grace_secs`) and shuts the tree down, which checkpoints
//! the runs still in flight so that they resume at the next start.

use std::sync::Arc;

use hindsight_actors::app::api::command::ServeArgs;
use hindsight_actors::app::api::{self, shutdown_signal};
use hindsight_actors::app::backend::Daemon;
use tokio::net::TcpListener;

use super::{Failure, Global};

/// Runs the daemon until it is told to stop. Prints `listening on http://ADDR` on stdout once the
/// tree is up and the address is bound (with port 0, ADDR has the port the system chose).
/// `--data DIR` other than the default overrides `data_dir` of the configuration.
pub async fn run(global: &Global, args: ServeArgs) -> Result<(), Failure> {
    let mut config = args.load().map_err(Failure::new)?;
    if global.data != hindsight_actors::runtime::default_data_dir() {
        config.data_dir = global.data.clone();
    }
    hindsight_actors::app::telemetry::init(config.log.format, &config.log.level)
        .map_err(|e| Failure::new(e.to_string()))?;
    let addr = config
        .api
        .listen_addr()
        .map_err(|e| Failure::new(e.to_string()))?;
    // Checked before the tree starts, so that a bad key costs nothing.
    api::KeyTable::new(&config.api.tenants).map_err(|e| Failure::new(e.to_string()))?;
    if config.api.tenants.is_empty() {
        tracing::warn!(
            "api.tenants is empty: every route that needs a key answers 401 (see `hindsight config hash-key`)"
        );
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(format!("api.listen: cannot listen on `{addr}`: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("api.listen: the bound address is unknown: {e}")))?;
    let backend = Arc::new(
        Daemon::start(&config)
            .await
            .map_err(|e| Failure::new(e.to_string()))?,
    );
    outln!("listening on http://{bound}")?;
    let served = api::serve(
        listener,
        Arc::clone(&backend),
        &config.api,
        shutdown_signal(),
    )
    .await;
    tracing::info!("stopping the tree");
    backend.shutdown().await;
    tracing::info!("stopped");
    served.map_err(|e| Failure::new(e.to_string()))
}

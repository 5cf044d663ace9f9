//! The HTTP API of the daemon (axum): routes over a [`Backend`], per-tenant bearer keys, strict
//! JSON bodies with field-naming errors, body limits, an OpenAPI document and graceful shutdown.
//!
//! `/healthz`, `/metrics` and `/openapi.json` need no key (probes and scrapers); every other route
//! needs `Authorization: Bearer <key>` of a tenant from `[[api.tenants]]`, and sees only that
//! tenant's data: another tenant's run or SOP is answered 404, as if it did not exist. The policy
//! is shared by every tenant: `/policy/update` needs a key with `policy_update` and
//! `/policy/suggest` needs that or `api.shared_learning` (403 otherwise; docs/operations.md).

mod auth;
mod backend;
pub mod command;
pub mod document;
mod error;
mod routes;
pub mod types;

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use hindsight::config::ApiConfig;
use tokio::net::TcpListener;

pub use auth::{BadKey, KeyTable, require_key};
pub use backend::{Backend, BackendError, BackendResult, Principal};
pub use error::{ApiError, ApiJson, ErrorBody, decode};
pub use routes::{AppState, MAX_ID_CHARS, OPENAPI_JSON, ROUTES, RouteSpec, handler_for};

/// Why the server could not be built or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configured key is malformed.
    #[error(transparent)]
    BadKey(#[from] BadKey),
    /// A route of [`ROUTES`] has no handler (a programming error caught at start).
    #[error("route {method} {path} has no handler")]
    NoHandler {
        /// The method.
        method: &'static str,
        /// The path.
        path: &'static str,
    },
    /// The listen address could not be bound.
    #[error("api.listen: cannot listen on `{addr}`: {source}")]
    Bind {
        /// The configured address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Accepting or serving failed.
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
}

/// The router of every route in [`ROUTES`] over `backend`, with authentication, the body limit
/// and JSON fallbacks.
pub fn router<B: Backend>(backend: Arc<B>, config: &ApiConfig) -> Result<Router, ServeError> {
    let keys = KeyTable::new(&config.tenants)?.sharing_learning(config.shared_learning);
    let mut authed: Router<AppState<B>> = Router::new();
    let mut public: Router<AppState<B>> = Router::new();
    for spec in ROUTES {
        let handler = handler_for::<B>(spec).ok_or(ServeError::NoHandler {
            method: spec.method,
            path: spec.path,
        })?;
        if spec.auth {
            authed = authed.route(spec.path, handler);
        } else {
            public = public.route(spec.path, handler);
        }
    }
    let authed = authed.route_layer(axum::middleware::from_fn_with_state(keys, require_key));
    let limit =
        (config.request_timeout_secs > 0).then(|| Duration::from_secs(config.request_timeout_secs));
    let app = Router::new()
        .merge(authed)
        .merge(public)
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(config.body_limit_bytes))
        .layer(axum::middleware::from_fn_with_state(
            config.body_limit_bytes,
            routes::declared_length,
        ))
        .layer(axum::middleware::from_fn_with_state(
            limit,
            routes::time_limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            AppState {
                backend: Arc::clone(&backend),
            },
            routes::trace_request::<B>,
        ))
        .with_state(AppState { backend });
    Ok(app)
}

/// Serves the API on `listener` until `shutdown` resolves; then stops accepting and gives
/// in-flight requests `config.shutdown_grace_secs` to finish. The caller then shuts the tree down
/// (which finishes or checkpoints the runs in flight).
pub async fn serve<B, F>(
    listener: TcpListener,
    backend: Arc<B>,
    config: &ApiConfig,
    shutdown: F,
) -> Result<(), ServeError>
where
    B: Backend,
    F: Future<Output = ()> + Send + 'static,
{
    let app = router(backend, config)?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "API listening");
    }
    let (fired_tx, fired_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutdown requested: no longer accepting connections");
        let _ = fired_tx.send(());
    };
    let grace = Duration::from_secs(config.shutdown_grace_secs);
    let deadline = async move {
        match fired_rx.await {
            Ok(()) => tokio::time::sleep(grace).await,
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::select! {
        result = server => result.map_err(ServeError::Io),
        () = deadline => {
            tracing::warn!(grace_secs = grace.as_secs(), "in-flight requests did not finish within the grace period");
            Ok(())
        }
    }
}

/// Binds `config.listen` and serves until ctrl-c or SIGTERM ([`shutdown_signal`]): the body of
/// `hindsight serve`. The caller shuts the tree down after it returns.
pub async fn serve_config<B: Backend>(
    backend: Arc<B>,
    config: &ApiConfig,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
    serve(listener, backend, config, shutdown_signal()).await
}

/// Resolves on ctrl-c or (on Unix) SIGTERM: the daemon's shutdown signal for [`serve`].
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

//! Logging and tracing setup: a `tracing-subscriber` on stderr in text or JSON, filtered by
//! `RUST_LOG` or the configured level, and the spans the actors open for runs and steps.

use hindsight::ErrorClass;
use hindsight::config::LogFormat;
use tracing::Span;
use tracing_subscriber::EnvFilter;

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter (`log.level` or `RUST_LOG`) does not parse.
    #[error("{origin}: invalid log filter `{filter}`: {reason}")]
    BadFilter {
        /// `log.level` or `RUST_LOG`.
        origin: &'static str,
        /// The filter.
        filter: String,
        /// Why.
        reason: String,
    },
    /// A global subscriber is already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadySet(String),
}

/// Parses `--log-format` (`text` or `json`).
pub fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("expected `text` or `json`, found `{other}`")),
    }
}

/// The filter: `RUST_LOG` when set and non-empty, else `level` (the `log.level` key).
pub fn filter(level: &str) -> Result<EnvFilter, TelemetryError> {
    let (origin, spec) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => ("RUST_LOG", v),
        _ => ("log.level", level.to_string()),
    };
    EnvFilter::try_new(&spec).map_err(|e| TelemetryError::BadFilter {
        origin,
        filter: spec,
        reason: e.to_string(),
    })
}

/// Installs the global subscriber: logs on stderr (stdout stays free for `--json` output), in
/// `format`, filtered by [`filter`].
pub fn init(format: LogFormat, level: &str) -> Result<(), TelemetryError> {
    let filter = filter(level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    result.map_err(|e| TelemetryError::AlreadySet(e.to_string()))
}

/// The span of one run; every log line inside carries its `run_id`.
pub fn run_span(run_id: &str) -> Span {
    tracing::info_span!("run", run_id = %run_id)
}

/// The span of one step of a run; record its error class with [`record_error_class`].
pub fn step_span(run_id: &str, stage: &str, tool: &str, attempt: u32) -> Span {
    tracing::info_span!(
        "step",
        run_id = %run_id,
        stage = %stage,
        tool = %tool,
        attempt,
        error_class = tracing::field::Empty
    )
}

/// Records the error class of a failed step on its span.
pub fn record_error_class(span: &Span, class: ErrorClass) {
    span.record("error_class", class.as_str());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_formats_and_filters() {
        assert_eq!(parse_log_format("JSON"), Ok(LogFormat::Json));
        assert_eq!(parse_log_format("text"), Ok(LogFormat::Text));
        assert!(parse_log_format("xml").is_err());
        assert!(EnvFilter::try_new("hindsight=debug,warn").is_ok());
        assert!(EnvFilter::try_new("[[[").is_err());
    }
}

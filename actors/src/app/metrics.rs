//! Prometheus metrics of the daemon: one [`Metrics`] handle (cheap to clone) that the actors call
//! on runs, recoveries, tool calls, circuit changes, restarts and store commits, and that the API
//! encodes for `GET /metrics` in the OpenMetrics text format.

use std::sync::Arc;
use std::time::Duration;

use hindsight::{ErrorClass, FailureType, RunState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// State of a tool's circuit breaker, as the `hindsight_circuit_state` gauge encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CircuitState {
    /// Calls flow (0).
    Closed,
    /// One probe call is allowed (1).
    HalfOpen,
    /// Calls are refused (2).
    Open,
}

impl CircuitState {
    /// The gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge_value(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::HalfOpen => 1,
            CircuitState::Open => 2,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    failure_type: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolOutcomeLabel {
    tool: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LearningLabel {
    figure: String,
}

/// What the learners report at a scrape (read from the policy actor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearningFigures {
    /// Stage observations the policy learned from.
    pub learned: u64,
    /// Infrastructure failures it saw and ignored.
    pub infra_ignored: u64,
    /// Infrastructure failures it learned from (0 unless something is wrong).
    pub infra_learned: u64,
    /// Changes (drift) it detected.
    pub changes_detected: u64,
    /// Rankers distilled and evaluated.
    pub ranker_fits: u64,
    /// Distillations that put the ranker in force.
    pub ranker_promotions: u64,
    /// Whether a ranker plans the exploit share now.
    pub ranker_in_force: bool,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabel {
    method: String,
    route: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActorLabel {
    actor: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn tool_histogram() -> Histogram {
    // 1 ms .. ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn http_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
}

fn commit_histogram() -> Histogram {
    // 50 us .. ~1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

struct Inner {
    registry: Registry,
    runs_started: Counter,
    runs_in_flight: Gauge,
    runs_finished: Family<StateLabel, Counter>,
    recoveries: Family<FailureLabel, Counter>,
    tool_calls: Family<ToolOutcomeLabel, Counter>,
    tool_latency: HistogramFamily<ToolLabel>,
    circuit_state: Family<ToolLabel, Gauge>,
    actor_restarts: Family<ActorLabel, Counter>,
    store_commit: Histogram,
    reflect_retries: Counter,
    learning: Family<LearningLabel, Gauge>,
    http_requests: Family<HttpLabel, Counter>,
    http_latency: HistogramFamily<RouteLabel>,
}

/// The daemon's metrics. Clone it into every actor; all clones share one registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero, names prefixed `hindsight_`.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("hindsight");
        let runs_started = Counter::default();
        let runs_in_flight = Gauge::default();
        let runs_finished = Family::<StateLabel, Counter>::default();
        let recoveries = Family::<FailureLabel, Counter>::default();
        let tool_calls = Family::<ToolOutcomeLabel, Counter>::default();
        let tool_latency: HistogramFamily<ToolLabel> =
            Family::new_with_constructor(tool_histogram as fn() -> Histogram);
        let circuit_state = Family::<ToolLabel, Gauge>::default();
        let actor_restarts = Family::<ActorLabel, Counter>::default();
        let store_commit = commit_histogram();
        let reflect_retries = Counter::default();
        let learning = Family::<LearningLabel, Gauge>::default();
        let http_requests = Family::<HttpLabel, Counter>::default();
        let http_latency: HistogramFamily<RouteLabel> =
            Family::new_with_constructor(http_histogram as fn() -> Histogram);
        registry.register("runs_started", "Runs accepted", runs_started.clone());
        registry.register(
            "runs_in_flight",
            "Runs started and not yet finished",
            runs_in_flight.clone(),
        );
        registry.register(
            "runs_finished",
            "Runs ended, by terminal state",
            runs_finished.clone(),
        );
        registry.register(
            "recoveries",
            "Recoveries started, by failure type",
            recoveries.clone(),
        );
        registry.register(
            "tool_calls",
            "Tool calls, by tool and outcome (ok or the error class)",
            tool_calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Tool call latency (virtual for simulated tools), by tool",
            tool_latency.clone(),
        );
        registry.register(
            "circuit_state",
            "Circuit breaker per tool: 0 closed, 1 half-open, 2 open",
            circuit_state.clone(),
        );
        registry.register(
            "actor_restarts",
            "Actor restarts by the supervisor, by actor",
            actor_restarts.clone(),
        );
        registry.register(
            "store_commit_duration_seconds",
            "Latency of a store group-commit transaction",
            store_commit.clone(),
        );
        registry.register(
            "reflect_retries",
            "Runs sent back by ReflectRetry",
            reflect_retries.clone(),
        );
        registry.register(
            "learning",
            "What the policy has learned, by figure (learned, infra_ignored, infra_learned, changes_detected, ranker_fits, ranker_promotions, ranker_in_force), read at the scrape",
            learning.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency, by route template",
            http_latency.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                runs_started,
                runs_in_flight,
                runs_finished,
                recoveries,
                tool_calls,
                tool_latency,
                circuit_state,
                actor_restarts,
                store_commit,
                reflect_retries,
                learning,
                http_requests,
                http_latency,
            }),
        }
    }

    /// A run was accepted.
    pub fn run_started(&self) {
        self.inner.runs_started.inc();
        self.inner.runs_in_flight.inc();
    }

    /// A run ended in `state` (call once per run, with a terminal state).
    pub fn run_finished(&self, state: RunState) {
        self.inner
            .runs_finished
            .get_or_create(&StateLabel {
                state: state.as_str().to_string(),
            })
            .inc();
        self.inner.runs_in_flight.dec();
    }

    /// A recovery of a failure of type `kind` started.
    pub fn recovery(&self, kind: FailureType) {
        self.inner
            .recoveries
            .get_or_create(&FailureLabel {
                failure_type: kind.as_str().to_string(),
            })
            .inc();
    }

    /// A tool call ended after `latency_ms` (virtual or real), with `error_class` when it failed.
    pub fn tool_call(&self, tool: &str, latency_ms: f64, error_class: Option<ErrorClass>) {
        let outcome = error_class.map_or("ok", |c| c.as_str()).to_string();
        self.inner
            .tool_calls
            .get_or_create(&ToolOutcomeLabel {
                tool: tool.to_string(),
                outcome,
            })
            .inc();
        let seconds = if latency_ms.is_finite() && latency_ms > 0.0 {
            latency_ms / 1000.0
        } else {
            0.0
        };
        self.inner
            .tool_latency
            .get_or_create(&ToolLabel {
                tool: tool.to_string(),
            })
            .observe(seconds);
    }

    /// A tool's circuit breaker changed state.
    pub fn circuit_state(&self, tool: &str, state: CircuitState) {
        self.inner
            .circuit_state
            .get_or_create(&ToolLabel {
                tool: tool.to_string(),
            })
            .set(state.gauge_value());
    }

    /// The supervisor restarted the actor `name`.
    pub fn actor_restarted(&self, name: &str) {
        self.inner
            .actor_restarts
            .get_or_create(&ActorLabel {
                actor: name.to_string(),
            })
            .inc();
    }

    /// Sets the learning figures (the `hindsight_learning` gauges).
    pub fn learning(&self, f: &LearningFigures) {
        for (figure, value) in [
            ("learned", f.learned),
            ("infra_ignored", f.infra_ignored),
            ("infra_learned", f.infra_learned),
            ("changes_detected", f.changes_detected),
            ("ranker_fits", f.ranker_fits),
            ("ranker_promotions", f.ranker_promotions),
            ("ranker_in_force", u64::from(f.ranker_in_force)),
        ] {
            self.inner
                .learning
                .get_or_create(&LearningLabel {
                    figure: figure.to_string(),
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// A store transaction committed after `latency`.
    pub fn store_commit(&self, latency: Duration) {
        self.inner.store_commit.observe(latency.as_secs_f64());
    }

    /// ReflectRetry sent a run back.
    pub fn reflect_retry(&self) {
        self.inner.reflect_retries.inc();
    }

    /// The API answered a request on `route` (the route template, `/runs/{id}`, never the raw
    /// path) with `status` after `latency`.
    pub fn http_request(&self, method: &str, route: &str, status: u16, latency: Duration) {
        self.inner
            .http_requests
            .get_or_create(&HttpLabel {
                method: method.to_string(),
                route: route.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.inner
            .http_latency
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .observe(latency.as_secs_f64());
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix} in\n{text}"))
    }

    #[test]
    fn records_and_encodes() {
        let m = Metrics::new();
        let m2 = m.clone();
        m.run_started();
        m.run_started();
        m2.run_finished(RunState::Succeeded);
        m.recovery(FailureType::Timeout);
        m.recovery(FailureType::Timeout);
        m.tool_call("ocr", 3.0, None);
        m.tool_call("ocr", 1500.0, Some(ErrorClass::Timeout));
        m.circuit_state("ocr", CircuitState::Open);
        m.actor_restarted("executor");
        m.store_commit(Duration::from_micros(200));
        m.reflect_retry();
        m.http_request("GET", "/runs/{id}", 404, Duration::from_millis(2));
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(
            line(&text, "hindsight_runs_started_total"),
            "hindsight_runs_started_total 2"
        );
        assert_eq!(
            line(&text, "hindsight_runs_in_flight"),
            "hindsight_runs_in_flight 1"
        );
        assert_eq!(
            line(&text, "hindsight_runs_finished_total"),
            "hindsight_runs_finished_total{state=\"succeeded\"} 1"
        );
        assert!(line(&text, "hindsight_recoveries_total").ends_with("} 2"));
        assert!(text.contains("hindsight_tool_calls_total{tool=\"ocr\",outcome=\"ok\"} 1"));
        assert!(text.contains(&format!(
            "hindsight_tool_calls_total{{tool=\"ocr\",outcome=\"{}\"}} 1",
            ErrorClass::Timeout.as_str()
        )));
        assert!(text.contains("hindsight_tool_call_duration_seconds_count{tool=\"ocr\"} 2"));
        assert!(text.contains("hindsight_tool_call_duration_seconds_sum{tool=\"ocr\"} 1.503"));
        assert!(text.contains("hindsight_circuit_state{tool=\"ocr\"} 2"));
        assert!(text.contains("hindsight_actor_restarts_total{actor=\"executor\"} 1"));
        assert!(text.contains("hindsight_store_commit_duration_seconds_count 1"));
        assert!(text.contains("hindsight_reflect_retries_total 1"));
        assert!(text.contains(
            "hindsight_http_requests_total{method=\"GET\",route=\"/runs/{id}\",status=\"404\"} 1"
        ));
        assert!(
            text.contains("hindsight_http_request_duration_seconds_count{route=\"/runs/{id}\"} 1")
        );
    }
}

//! Supervisor configuration: strategy, restart intensity, backoff, label, counters, event hook.

use std::sync::Arc;
use std::time::Duration;

use super::event::SupervisorEvent;
use super::stats::RestartStats;

/// Which children are restarted when one exits and must be restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Only the child that exited.
    OneForOne,
    /// All running children: the others are stopped (reverse order) and all started again.
    OneForAll,
    /// The child that exited and the running children started after it.
    RestForOne,
}

/// At most `max_restarts` restarts within `period`; one more and the supervisor gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intensity {
    /// Restarts allowed within the period.
    pub max_restarts: u32,
    /// The sliding period.
    pub period: Duration,
}

impl Default for Intensity {
    /// 3 restarts within 5 seconds.
    fn default() -> Self {
        Intensity {
            max_restarts: 3,
            period: Duration::from_secs(5),
        }
    }
}

/// Exponential restart delay: `min(initial * factor^(n-1), max)` where `n` counts this child's
/// restarts inside the current intensity period. Measured with tokio time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay of the first restart.
    pub initial: Duration,
    /// Multiplier per further restart.
    pub factor: f64,
    /// Upper bound.
    pub max: Duration,
}

impl Backoff {
    /// The delay before the `n`-th restart (1-based) inside the period.
    pub fn delay(&self, n: u32) -> Duration {
        let exp = n.saturating_sub(1).min(64) as i32;
        let factor = if self.factor.is_finite() && self.factor >= 1.0 {
            self.factor
        } else {
            1.0
        };
        let secs = self.initial.as_secs_f64() * factor.powi(exp);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }
}

/// A callback told of every [`SupervisorEvent`]; it runs inside the supervisor, keep it short
/// (send to a channel, bump a counter).
pub type EventHook = Arc<dyn Fn(&SupervisorEvent) + Send + Sync>;

/// Everything that configures a supervisor (cheap to clone: a nested supervisor's spec keeps one
/// to restart it).
#[derive(Clone)]
pub struct SupervisorOptions {
    /// Restart strategy.
    pub strategy: Strategy,
    /// Restart intensity.
    pub intensity: Intensity,
    /// Optional restart backoff (none by default: restarts are immediate).
    pub backoff: Option<Backoff>,
    /// A label for errors, events and counter keys (not a registry name).
    pub label: String,
    /// Restart counters (share one across a tree to count all of it).
    pub stats: Arc<RestartStats>,
    /// Optional event hook.
    pub hook: Option<EventHook>,
}

impl std::fmt::Debug for SupervisorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorOptions")
            .field("strategy", &self.strategy)
            .field("intensity", &self.intensity)
            .field("backoff", &self.backoff)
            .field("label", &self.label)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl SupervisorOptions {
    /// Options with the given strategy, default intensity (3 in 5 s), no backoff, label
    /// `"supervisor"`, fresh counters and no hook.
    pub fn new(strategy: Strategy) -> Self {
        SupervisorOptions {
            strategy,
            intensity: Intensity::default(),
            backoff: None,
            label: "supervisor".to_string(),
            stats: Arc::new(RestartStats::new()),
            hook: None,
        }
    }

    /// Sets the restart intensity.
    pub fn intensity(mut self, max_restarts: u32, period: Duration) -> Self {
        self.intensity = Intensity {
            max_restarts,
            period,
        };
        self
    }

    /// Sets a restart backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Sets the label.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Uses these (possibly shared) counters.
    pub fn stats(mut self, stats: Arc<RestartStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Sets the event hook.
    pub fn hook(mut self, hook: impl Fn(&SupervisorEvent) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    pub(crate) fn emit(&self, event: SupervisorEvent) {
        if let Some(hook) = &self.hook {
            hook(&event);
        }
    }
}

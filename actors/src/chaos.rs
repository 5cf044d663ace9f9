//! Seeded fault injection into tools and actors: a [`ChaosPlan`] (TOML) that makes tools fail
//! with a given error class and probability, adds virtual latency, panics named actors with a
//! probability per message or every N messages, and delays messages; a thread-safe
//! [`ChaosHandle`] that actors share (deterministic per actor and message index, counting what it
//! injected); and [`run_under_chaos`], which runs a user workload under a plan and reports what
//! was injected and how many restarts the supervisors observed.
//!
//! ```no_run
//! # use hindsight_actors::chaos::*;
//! # async fn demo() -> Result<(), ChaosError> {
//! let plan = ChaosPlan::load(std::path::Path::new("config/chaos.toml"))?;
//! let report = run_under_chaos(plan, |ctx| async move {
//!     // build supervisors with ctx.supervisor_options(..), give ctx.chaos to the actors,
//!     // and call `ctx.chaos.inject("my_actor").await` first thing in their `handle`.
//! })
//! .await;
//! println!("{} panics injected, {} restarts", report.counts.panics, report.restarts);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight::ErrorClass;
use serde::{Deserialize, Serialize};

use crate::supervisor::{RestartStats, Strategy, SupervisorOptions};

/// A plan that could not be read or is invalid; names the file and the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// The file could not be read.
    #[error("chaos plan {file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or mistyped keys (the message names the key).
    #[error("chaos plan {file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// The parser's message.
        message: String,
    },
    /// A value is out of range.
    #[error("chaos plan {file}: key `{key}`: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The key at fault, e.g. `tools[0].fault_probability`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// Faults and latency for the tools whose name matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolChaos {
    /// A tool name, or `"*"` for every tool.
    pub name: String,
    /// Probability that a call fails (0..=1).
    #[serde(default)]
    pub fault_probability: f64,
    /// The error classes a fault is drawn from (uniformly). Required when faults are enabled.
    #[serde(default)]
    pub classes: Vec<String>,
    /// The error message (`{tool}` and `{class}` are replaced); a default names both.
    #[serde(default)]
    pub message: Option<String>,
    /// Probability that a call gets extra virtual latency.
    #[serde(default)]
    pub latency_probability: f64,
    /// Extra latency range in ms, inclusive.
    #[serde(default)]
    pub latency_ms: [u64; 2],
}

/// Panics and delays for the actor with this name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActorChaos {
    /// The actor's name as passed to [`ChaosHandle::inject`] / [`ChaosPlan::actor_fault`], or
    /// `"*"` for every actor. `"run_driver"` panics run drivers (at their start), which `"*"`
    /// leaves alone.
    pub name: String,
    /// Probability per message that the actor panics.
    #[serde(default)]
    pub panic_probability: f64,
    /// Panic at every N-th message (1-based message index divisible by N); 0 turns it off.
    #[serde(default)]
    pub panic_every: u64,
    /// Probability per message of a delay.
    #[serde(default)]
    pub delay_probability: f64,
    /// Delay range in ms, inclusive.
    #[serde(default)]
    pub delay_ms: [u64; 2],
    /// Whether the delay is slept (tokio time) or only reported as virtual latency.
    #[serde(default)]
    pub delay_real: bool,
}

/// A seeded fault plan (the TOML of `config/chaos.toml`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosPlan {
    /// The seed of every decision.
    #[serde(default)]
    pub seed: u64,
    /// Tool rules, tried in order.
    #[serde(default)]
    pub tools: Vec<ToolChaos>,
    /// Actor rules, tried in order.
    #[serde(default)]
    pub actors: Vec<ActorChaos>,
}

/// What to do to one actor message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorFault {
    /// Panic inside `handle` (the supervisor sees `ActorFailed` and restarts the actor).
    Panic,
    /// Delay the message by `ms`: slept when `real`, otherwise only reported.
    Delay {
        /// Milliseconds.
        ms: u64,
        /// Slept (tokio time) or virtual.
        real: bool,
    },
}

/// The run drivers' name: they are tasks, not actors (a panic there is a bug, not a crash the
/// supervisor restarts from), so only a rule that names them injects into them.
pub const RUN_DRIVER: &str = "run_driver";

fn matches(pattern: &str, name: &str) -> bool {
    (pattern == "*" && name != RUN_DRIVER) || pattern == name
}

fn draw_range(rng: &mut fastrand::Rng, range: [u64; 2]) -> u64 {
    let [lo, hi] = range;
    if hi <= lo { lo } else { rng.u64(lo..=hi) }
}

impl ChaosPlan {
    /// Reads and validates a plan file.
    pub fn load(path: &Path) -> Result<ChaosPlan, ChaosError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ChaosError::Read {
            file: file.clone(),
            source,
        })?;
        ChaosPlan::parse(&text, &file)
    }

    /// Parses and validates a plan; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ChaosPlan, ChaosError> {
        let plan: ChaosPlan = toml::from_str(text).map_err(|e| ChaosError::Parse {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        plan.validate(file)?;
        Ok(plan)
    }

    /// Checks probabilities, ranges and error-class names.
    pub fn validate(&self, file: &str) -> Result<(), ChaosError> {
        let invalid = |key: String, reason: String| ChaosError::Invalid {
            file: file.to_string(),
            key,
            reason,
        };
        let prob = |key: String, p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(())
            } else {
                Err(invalid(key, format!("probability {p} is not within 0..=1")))
            }
        };
        let range = |key: String, r: [u64; 2]| {
            if r[0] <= r[1] {
                Ok(())
            } else {
                Err(invalid(
                    key,
                    format!("range [{}, {}] is reversed", r[0], r[1]),
                ))
            }
        };
        for (i, t) in self.tools.iter().enumerate() {
            prob(format!("tools[{i}].fault_probability"), t.fault_probability)?;
            prob(
                format!("tools[{i}].latency_probability"),
                t.latency_probability,
            )?;
            range(format!("tools[{i}].latency_ms"), t.latency_ms)?;
            if t.fault_probability > 0.0 && t.classes.is_empty() {
                return Err(invalid(
                    format!("tools[{i}].classes"),
                    "at least one error class is needed when fault_probability > 0".into(),
                ));
            }
            for (j, c) in t.classes.iter().enumerate() {
                if ErrorClass::parse(c).is_none() {
                    return Err(invalid(
                        format!("tools[{i}].classes[{j}]"),
                        format!("unknown error class '{c}'"),
                    ));
                }
            }
        }
        for (i, a) in self.actors.iter().enumerate() {
            prob(
                format!("actors[{i}].panic_probability"),
                a.panic_probability,
            )?;
            prob(
                format!("actors[{i}].delay_probability"),
                a.delay_probability,
            )?;
            range(format!("actors[{i}].delay_ms"), a.delay_ms)?;
        }
        Ok(())
    }

    /// Decides whether a call of `tool` fails, and how: `Some((class, message))`. Pure given
    /// the rng state.
    pub fn tool_fault(&self, tool: &str, rng: &mut fastrand::Rng) -> Option<(ErrorClass, String)> {
        for rule in self.tools.iter().filter(|r| matches(&r.name, tool)) {
            if rule.fault_probability <= 0.0 || rule.classes.is_empty() {
                continue;
            }
            if rng.f64() < rule.fault_probability {
                let name = &rule.classes[rng.usize(..rule.classes.len())];
                let class = ErrorClass::parse(name).unwrap_or(ErrorClass::DeterministicFailure);
                let message = match &rule.message {
                    Some(m) => m.replace("{tool}", tool).replace("{class}", class.as_str()),
                    None => format!("chaos: injected {class} fault in tool '{tool}'"),
                };
                return Some((class, message));
            }
        }
        None
    }

    /// Extra virtual latency (ms) for a call of `tool`, if any. Pure given the rng state.
    pub fn tool_latency(&self, tool: &str, rng: &mut fastrand::Rng) -> Option<u64> {
        for rule in self.tools.iter().filter(|r| matches(&r.name, tool)) {
            if rule.latency_probability > 0.0 && rng.f64() < rule.latency_probability {
                return Some(draw_range(rng, rule.latency_ms));
            }
        }
        None
    }

    /// Decides what happens to the actor `actor`'s message number `msg_counter` (1-based).
    /// `panic_every` is checked first, then the panic probability, then the delay. Pure given
    /// the rng state.
    pub fn actor_fault(
        &self,
        actor: &str,
        msg_counter: u64,
        rng: &mut fastrand::Rng,
    ) -> Option<ActorFault> {
        for rule in self.actors.iter().filter(|r| matches(&r.name, actor)) {
            if rule.panic_every > 0
                && msg_counter > 0
                && msg_counter.is_multiple_of(rule.panic_every)
            {
                return Some(ActorFault::Panic);
            }
            if rule.panic_probability > 0.0 && rng.f64() < rule.panic_probability {
                return Some(ActorFault::Panic);
            }
            if rule.delay_probability > 0.0 && rng.f64() < rule.delay_probability {
                return Some(ActorFault::Delay {
                    ms: draw_range(rng, rule.delay_ms),
                    real: rule.delay_real,
                });
            }
        }
        None
    }

    /// Whether the plan injects nothing.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.actors.is_empty()
    }
}

/// FNV-1a, stable across runs and platforms.
fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Keeps the backtraces of injected panics (they are on purpose) out of the output; every other
/// panic still reaches the hook that was installed before. Installed once per process, however
/// often it is called.
pub fn quiet_injected_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("chaos: injected"));
            if !injected {
                default(info);
            }
        }));
    });
}

/// The rng of one decision: a function of (plan seed, kind and name, index) only.
pub fn decision_rng(seed: u64, name: &str, index: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(splitmix(seed ^ splitmix(name_hash(name) ^ splitmix(index))))
}

/// What a [`ChaosHandle`] has injected so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChaosCounts {
    /// Actor messages seen by [`ChaosHandle::actor_fault`] / [`ChaosHandle::inject`].
    pub messages: u64,
    /// Panics injected.
    pub panics: u64,
    /// Message delays injected.
    pub delays: u64,
    /// Total milliseconds of message delay.
    pub delay_ms: u64,
    /// Tool calls seen by [`ChaosHandle::tool_fault`].
    pub tool_calls: u64,
    /// Tool faults injected.
    pub tool_faults: u64,
    /// Tool latencies injected.
    pub latencies: u64,
    /// Total milliseconds of tool latency.
    pub latency_ms: u64,
}

#[derive(Default)]
struct Counters {
    messages: AtomicU64,
    panics: AtomicU64,
    delays: AtomicU64,
    delay_ms: AtomicU64,
    tool_calls: AtomicU64,
    tool_faults: AtomicU64,
    latencies: AtomicU64,
    latency_ms: AtomicU64,
}

struct Inner {
    plan: ChaosPlan,
    counters: Counters,
    per_actor: Mutex<HashMap<String, u64>>,
}

/// The plan installed for a set of actors: cheap to clone, thread-safe, deterministic per
/// (actor, message index) and per (tool, call key), and counting what it injects.
#[derive(Clone)]
pub struct ChaosHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ChaosHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosHandle")
            .field("seed", &self.inner.plan.seed)
            .field("counts", &self.counts())
            .finish()
    }
}

impl ChaosHandle {
    /// Installs `plan`.
    pub fn new(plan: ChaosPlan) -> Self {
        ChaosHandle {
            inner: Arc::new(Inner {
                plan,
                counters: Counters::default(),
                per_actor: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A handle that injects nothing.
    pub fn disabled() -> Self {
        Self::new(ChaosPlan::default())
    }

    /// The installed plan.
    pub fn plan(&self) -> &ChaosPlan {
        &self.inner.plan
    }

    /// The fault for message `index` (1-based) of `actor`, counted.
    pub fn actor_fault(&self, actor: &str, index: u64) -> Option<ActorFault> {
        let c = &self.inner.counters;
        c.messages.fetch_add(1, Ordering::Relaxed);
        let mut rng = decision_rng(self.inner.plan.seed, actor, index);
        let fault = self.inner.plan.actor_fault(actor, index, &mut rng);
        match fault {
            Some(ActorFault::Panic) => {
                c.panics.fetch_add(1, Ordering::Relaxed);
            }
            Some(ActorFault::Delay { ms, .. }) => {
                c.delays.fetch_add(1, Ordering::Relaxed);
                c.delay_ms.fetch_add(ms, Ordering::Relaxed);
            }
            None => {}
        }
        fault
    }

    /// Counts one more message of `actor` (the count survives the actor's restarts) and returns
    /// its fault.
    pub fn next_actor_fault(&self, actor: &str) -> Option<ActorFault> {
        let index = {
            let mut map = self
                .inner
                .per_actor
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let n = map.entry(actor.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        self.actor_fault(actor, index)
    }

    /// Call first thing in an actor's `handle`: applies the next fault of `actor`. A real delay
    /// is slept (tokio time); a virtual one is returned in ms; a panic fault **panics on
    /// purpose** (ractor turns it into `ActorFailed` for the supervisor).
    pub async fn inject(&self, actor: &str) -> u64 {
        match self.next_actor_fault(actor) {
            Some(ActorFault::Panic) => panic!("chaos: injected panic in actor '{actor}'"),
            Some(ActorFault::Delay { ms, real: true }) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                0
            }
            Some(ActorFault::Delay { ms, real: false }) => ms,
            None => 0,
        }
    }

    /// The fault of a call of `tool`, deterministic per `call_key` (for example a hash of the
    /// run, step and attempt), counted.
    pub fn tool_fault(&self, tool: &str, call_key: u64) -> Option<(ErrorClass, String)> {
        let c = &self.inner.counters;
        c.tool_calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = decision_rng(self.inner.plan.seed, &format!("tool:{tool}"), call_key);
        let fault = self.inner.plan.tool_fault(tool, &mut rng);
        if fault.is_some() {
            c.tool_faults.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }

    /// The extra virtual latency (ms) of a call of `tool`, deterministic per `call_key`, counted.
    pub fn tool_latency(&self, tool: &str, call_key: u64) -> Option<u64> {
        let mut rng = decision_rng(self.inner.plan.seed, &format!("latency:{tool}"), call_key);
        let ms = self.inner.plan.tool_latency(tool, &mut rng);
        if let Some(ms) = ms {
            let c = &self.inner.counters;
            c.latencies.fetch_add(1, Ordering::Relaxed);
            c.latency_ms.fetch_add(ms, Ordering::Relaxed);
        }
        ms
    }

    /// A snapshot of the counters.
    pub fn counts(&self) -> ChaosCounts {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChaosCounts {
            messages: get(&c.messages),
            panics: get(&c.panics),
            delays: get(&c.delays),
            delay_ms: get(&c.delay_ms),
            tool_calls: get(&c.tool_calls),
            tool_faults: get(&c.tool_faults),
            latencies: get(&c.latencies),
            latency_ms: get(&c.latency_ms),
        }
    }
}

/// What a workload gets from [`run_under_chaos`]: the handle to give its actors and the restart
/// counters to give its supervisors.
#[derive(Debug, Clone)]
pub struct ChaosContext {
    /// The installed plan.
    pub chaos: ChaosHandle,
    /// Restart counters the report reads; use them in every supervisor of the workload.
    pub restarts: Arc<RestartStats>,
}

impl ChaosContext {
    /// Supervisor options with this context's restart counters.
    pub fn supervisor_options(&self, strategy: Strategy) -> SupervisorOptions {
        SupervisorOptions::new(strategy).stats(self.restarts.clone())
    }
}

/// What [`run_under_chaos`] counted, with the workload's own result.
#[derive(Debug, Clone)]
pub struct ChaosReport<T> {
    /// What was injected.
    pub counts: ChaosCounts,
    /// Restarts the workload's supervisors performed.
    pub restarts: u64,
    /// Escalations (supervisors exceeding their intensity).
    pub escalations: u64,
    /// The workload's result.
    pub output: T,
}

/// Runs `workload` with `plan` installed and returns what was injected and observed.
pub async fn run_under_chaos<F, Fut, T>(plan: ChaosPlan, workload: F) -> ChaosReport<T>
where
    F: FnOnce(ChaosContext) -> Fut,
    Fut: Future<Output = T>,
{
    let ctx = ChaosContext {
        chaos: ChaosHandle::new(plan),
        restarts: Arc::new(RestartStats::new()),
    };
    let output = workload(ctx.clone()).await;
    ChaosReport {
        counts: ctx.chaos.counts(),
        restarts: ctx.restarts.total(),
        escalations: ctx.restarts.escalations(),
        output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = r#"
seed = 7

[[tools]]
name = "*"
fault_probability = 0.1
classes = ["TransientNetwork", "rate_limit"]
latency_probability = 0.5
latency_ms = [10, 20]

[[actors]]
name = "executor"
panic_probability = 0.01

[[actors]]
name = "memory"
panic_every = 10
delay_probability = 0.5
delay_ms = [1, 3]
"#;

    #[test]
    fn parses_and_decides_deterministically() {
        let plan = ChaosPlan::parse(PLAN, "t.toml").unwrap();
        let mut a = fastrand::Rng::with_seed(1);
        let mut b = fastrand::Rng::with_seed(1);
        let xs: Vec<_> = (0..200).map(|_| plan.tool_fault("x", &mut a)).collect();
        let ys: Vec<_> = (0..200).map(|_| plan.tool_fault("x", &mut b)).collect();
        assert_eq!(xs, ys);
        let faults = xs.iter().flatten().count();
        assert!((5..=40).contains(&faults), "{faults}");
        for (class, msg) in xs.iter().flatten() {
            assert!(matches!(
                class,
                ErrorClass::TransientNetwork | ErrorClass::RateLimit
            ));
            assert!(msg.contains("tool 'x'"));
        }
    }

    #[test]
    fn fault_rate_matches_probability() {
        let plan = ChaosPlan::parse(PLAN, "t.toml").unwrap();
        let h = ChaosHandle::new(plan);
        let faults = (0..10_000)
            .filter(|k| h.tool_fault("t", *k).is_some())
            .count();
        assert!((900..=1100).contains(&faults), "{faults}");
        let panics = (1..=10_000)
            .filter(|i| h.actor_fault("executor", *i) == Some(ActorFault::Panic))
            .count();
        assert!((70..=130).contains(&panics), "{panics}");
        assert_eq!(h.counts().panics, panics as u64);
        assert_eq!(h.counts().tool_faults, faults as u64);
        assert_eq!(h.actor_fault("nobody", 1), None);
    }

    #[test]
    fn panic_every_n_and_delays() {
        let plan = ChaosPlan::parse(PLAN, "t.toml").unwrap();
        let h = ChaosHandle::new(plan);
        let faults: Vec<_> = (0..30).map(|_| h.next_actor_fault("memory")).collect();
        for (i, f) in faults.iter().enumerate() {
            let index = i as u64 + 1;
            if index.is_multiple_of(10) {
                assert_eq!(*f, Some(ActorFault::Panic));
            } else if let Some(fault) = f {
                assert!(matches!(
                    fault,
                    ActorFault::Delay {
                        ms: 1..=3,
                        real: false
                    }
                ));
            }
        }
        assert_eq!(h.counts().panics, 3);
        assert!(h.counts().delays > 5);
    }

    #[test]
    fn decisions_do_not_depend_on_order() {
        let plan = ChaosPlan::parse(PLAN, "t.toml").unwrap();
        let h1 = ChaosHandle::new(plan.clone());
        let h2 = ChaosHandle::new(plan);
        let forward: Vec<_> = (1..=500).map(|i| h1.actor_fault("executor", i)).collect();
        let mut backward: Vec<_> = (1..=500)
            .rev()
            .map(|i| h2.actor_fault("executor", i))
            .collect();
        backward.reverse();
        assert_eq!(forward, backward);
    }

    #[test]
    fn errors_name_the_key() {
        let bad_prob = PLAN.replace("panic_probability = 0.01", "panic_probability = 1.5");
        let e = ChaosPlan::parse(&bad_prob, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("actors[0].panic_probability") && e.contains("c.toml"),
            "{e}"
        );
        let bad_class = PLAN.replace("rate_limit", "Meteor");
        let e = ChaosPlan::parse(&bad_class, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tools[0].classes[1]"), "{e}");
        let unknown = PLAN.replace("panic_every", "panic_evry");
        let e = ChaosPlan::parse(&unknown, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("panic_evry"), "{e}");
        let e = ChaosPlan::load(Path::new("/nonexistent/chaos.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/chaos.toml"), "{e}");
        let missing = "[[tools]]\nname = \"*\"\nfault_probability = 0.2\n";
        let e = ChaosPlan::parse(missing, "c.toml").unwrap_err().to_string();
        assert!(e.contains("tools[0].classes"), "{e}");
    }

    #[test]
    fn the_shipped_plan_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/chaos.toml");
        let plan = ChaosPlan::load(&path).unwrap();
        assert!(!plan.is_empty());
    }
}

//! Plugins of an embedder's, hosted by the tree: they see every run's start, its events as they
//! happen and each round's report; they may send a run back within their `max_retries`; and one
//! that fails or panics never fails a run nor takes the tree down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hindsight::Task;
use hindsight::store::Durability;
use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::workload;
use hindsight_actors::plugin::{Plugin, PluginError, PluginSpec, RunEvent, RunReport, Verdict};
use hindsight_actors::reflect_retry::ReflectRetryConfig;
use hindsight_actors::runtime::{Runtime, RuntimeOptions};

fn env() -> SimEnv {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/envs/bank_statements.toml");
    SimEnv::load(&path).unwrap()
}

fn options(dir: &std::path::Path, plugins: Vec<PluginSpec>) -> RuntimeOptions {
    let mut opts = RuntimeOptions::new(dir, env());
    opts.durability = Durability::None;
    opts.seed = 3;
    opts.plugins = plugins;
    opts
}

/// What a [`Recorder`] saw.
#[derive(Default)]
struct Seen {
    started: Vec<String>,
    events: BTreeMap<String, Vec<RunEvent>>,
    reports: Vec<RunReport>,
    built: u32,
}

/// Records every callback; asks for a retry of every round when `retry` is set; panics on the
/// `panic_every`-th event when set.
struct Recorder {
    seen: Arc<Mutex<Seen>>,
    retry: bool,
    panic_every: Option<usize>,
}

impl Plugin for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn before_run(&mut self, task: &Task) -> Result<(), PluginError> {
        self.seen.lock().unwrap().started.push(task.task_id.clone());
        Ok(())
    }

    fn on_event(&mut self, run_id: &str, event: &RunEvent) -> Result<(), PluginError> {
        let mut seen = self.seen.lock().unwrap();
        let n: usize = seen.events.values().map(Vec::len).sum();
        if self.panic_every.is_some_and(|k| (n + 1).is_multiple_of(k)) {
            seen.events
                .entry(run_id.to_string())
                .or_default()
                .push(event.clone());
            drop(seen);
            panic!("the recorder panics on purpose");
        }
        seen.events
            .entry(run_id.to_string())
            .or_default()
            .push(event.clone());
        Ok(())
    }

    async fn after_run(&mut self, report: &RunReport) -> Result<Verdict, PluginError> {
        self.seen.lock().unwrap().reports.push(report.clone());
        if self.retry {
            return Ok(Verdict::Retry {
                attempt: report.round,
                reflection: "the recorder wants another look".to_string(),
            });
        }
        Ok(Verdict::Accept)
    }
}

fn recorder(seen: &Arc<Mutex<Seen>>, retry: bool, panic_every: Option<usize>) -> PluginSpec {
    let seen = seen.clone();
    PluginSpec::from_fn("recorder", move || {
        seen.lock().unwrap().built += 1;
        Recorder {
            seen: seen.clone(),
            retry,
            panic_every,
        }
    })
}

/// A plugin whose every callback fails.
struct Failing;

impl Plugin for Failing {
    fn name(&self) -> &str {
        "failing"
    }

    fn before_run(&mut self, _task: &Task) -> Result<(), PluginError> {
        Err("before_run refuses".into())
    }

    fn on_event(&mut self, _run_id: &str, _event: &RunEvent) -> Result<(), PluginError> {
        Err("on_event refuses".into())
    }

    async fn after_run(&mut self, _report: &RunReport) -> Result<Verdict, PluginError> {
        Err("after_run refuses".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_sees_every_run_start_event_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut opts = options(dir.path(), vec![recorder(&seen, false, None)]);
    opts.reflect_retry.max_retries = 0;
    let rt = Runtime::start(opts).await.unwrap();
    let plugins = &rt.ctx().dir.plugins;
    assert_eq!(plugins.len(), 1);
    assert_eq!(plugins[0].name, "recorder");
    assert!(
        plugins[0].slot.current().is_some(),
        "the plugin's host runs"
    );

    let env = env();
    let records = workload::run_tasks(&rt, &env, 3, 8, 1, |_| {})
        .await
        .unwrap();
    let stages = env.stages().len();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.started.len(), records.len(), "before_run once per run");
        assert_eq!(
            seen.reports.len(),
            records.len(),
            "one report per run (no retries)"
        );
        for report in &seen.reports {
            // Every event of the round reached on_event before the report, in the same order.
            let events = seen.events.get(&report.run_id).unwrap();
            assert_eq!(events, &report.events, "run {}", report.run_id);
            if report.passed {
                let ok = events
                    .iter()
                    .filter(|e| matches!(e, RunEvent::StepSucceeded { .. }))
                    .count();
                assert!(ok >= stages, "a passed run succeeded in every stage");
                assert!(events.contains(&RunEvent::Validation {
                    passed: true,
                    reason: None
                }));
            }
        }
        assert_eq!(
            seen.reports.iter().filter(|r| r.passed).count(),
            records.iter().filter(|r| r.passed).count()
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_retry_is_honoured_up_to_its_max_retries_and_ignored_without() {
    let env = env();
    for (allowed, expected) in [(0u32, 0u32), (2, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut opts = options(
            dir.path(),
            vec![recorder(&seen, true, None).max_retries(allowed)],
        );
        opts.reflect_retry.max_retries = 0;
        let rt = Runtime::start(opts).await.unwrap();
        let records = workload::run_tasks(&rt, &env, 3, 4, 2, |_| {})
            .await
            .unwrap();
        for r in &records {
            assert_eq!(
                r.reflect_retries, expected,
                "task {} with max_retries {allowed}",
                r.task
            );
        }
        // Each run was reported once per round.
        let reports = seen.lock().unwrap().reports.len() as u32;
        assert_eq!(reports, records.len() as u32 * (expected + 1));
        rt.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_sees_the_rounds_reflect_retry_sends_back_and_retries_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut opts = options(dir.path(), vec![recorder(&seen, true, None).max_retries(1)]);
    // ReflectRetry sends every run back once; then the plugin does, once.
    opts.reflect_retry = ReflectRetryConfig {
        max_retries: 1,
        template: "retry {attempt} of {max}: {reason}".to_string(),
    };
    opts.validator = Arc::new(|_events: &[RunEvent]| Err("the CSV has no header row".to_string()));
    let rt = Runtime::start(opts).await.unwrap();
    let records = workload::run_tasks(&rt, &env(), 3, 4, 1, |_| {})
        .await
        .unwrap();
    for r in &records {
        assert_eq!(r.reflect_retries, 2, "task {}", r.task);
    }
    {
        let seen = seen.lock().unwrap();
        // Three rounds a run, each reported to the plugin, the first one included.
        assert_eq!(seen.reports.len(), records.len() * 3);
        let rounds: Vec<u32> = seen.reports.iter().map(|r| r.round).collect();
        assert_eq!(rounds, [1, 2, 3].repeat(records.len()));
    }
    rt.shutdown().await;
}

/// A plugin whose `after_run` panics on every `every`-th report.
struct Crasher {
    reports: Arc<std::sync::atomic::AtomicUsize>,
    every: usize,
}

impl Plugin for Crasher {
    fn name(&self) -> &str {
        "crasher"
    }

    async fn after_run(&mut self, _report: &RunReport) -> Result<Verdict, PluginError> {
        let n = self
            .reports
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if (n + 1).is_multiple_of(self.every) {
            panic!("the crasher panics on purpose");
        }
        Ok(Verdict::Accept)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_plugin_never_fails_a_run() {
    let env = env();
    let baseline = {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::start(options(dir.path(), Vec::new()))
            .await
            .unwrap();
        let records = workload::run_tasks(&rt, &env, 3, 12, 1, |_| {})
            .await
            .unwrap();
        rt.shutdown().await;
        records
    };
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let reports = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let crasher = {
        let reports = reports.clone();
        PluginSpec::from_fn("crasher", move || Crasher {
            reports: reports.clone(),
            every: 4,
        })
        .max_retries(3)
    };
    let opts = options(
        dir.path(),
        vec![
            PluginSpec::from_fn("failing", || Failing).max_retries(3),
            recorder(&seen, false, Some(5)),
            crasher,
        ],
    );
    let rt = Runtime::start(opts).await.unwrap();
    let records = workload::run_tasks(&rt, &env, 3, 12, 1, |_| {})
        .await
        .unwrap();
    // The same runs as without plugins: same plans, outcomes and rewards.
    assert_eq!(records.len(), baseline.len());
    for (a, b) in records.iter().zip(&baseline) {
        assert_eq!(
            (&a.plan, a.passed, a.reflect_retries),
            (&b.plan, b.passed, b.reflect_retries)
        );
        assert!((a.reward - b.reward).abs() < 1e-9, "task {}", a.task);
    }
    {
        let seen = seen.lock().unwrap();
        let events: usize = seen.events.values().map(Vec::len).sum();
        assert!(events >= 10, "the recorder saw {events} events");
        // It panicked on every fifth event and was built afresh each time, in the same host: the
        // supervisor restarted nothing.
        assert_eq!(seen.built as usize, 1 + events / 5);
        // One report per round of each run: a run the validator sent back has more.
        let rounds: usize = records.iter().map(|r| 1 + r.reflect_retries as usize).sum();
        assert_eq!(seen.reports.len(), rounds);
    }
    // Only the crasher's host was restarted (its after_run panicked on every fourth report).
    let restarts = rt.restart_counts();
    let crasher_restarts: u64 = restarts
        .iter()
        .filter(|(child, _)| child.contains("plugin:crasher"))
        .map(|(_, n)| n)
        .sum();
    assert!(crasher_restarts >= 1, "restarts: {restarts:?}");
    assert_eq!(rt.restarts(), crasher_restarts, "restarts: {restarts:?}");
    rt.shutdown().await;
}

/// `max_total_attempts` caps a run's attempts whatever asks for them: a plugin that sends every
/// round back gets as many rounds as the cap leaves (the last result stands), and all of them
/// without a cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_attempts_cap_holds_against_a_plugin_that_always_sends_runs_back() {
    let env = env();
    for cap in [3u32, 1, 0] {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut opts = options(dir.path(), vec![recorder(&seen, true, None).max_retries(6)]);
        opts.reflect_retry.max_retries = 0;
        opts.tree.rules.max_total_attempts = cap;
        let rt = Runtime::start(opts).await.unwrap();
        let records = workload::run_tasks(&rt, &env, 3, 6, 2, |_| {})
            .await
            .unwrap();
        assert_eq!(records.len(), 6);
        for r in &records {
            // An escalated run lists the recovery it was refused.
            let refused = u32::from(r.state == "escalated");
            let attempts = 1 + r.recoveries.len() as u32 + r.reflect_retries - refused;
            if cap == 1 {
                // One attempt: no round is sent back, and a run that needed a recovery ends
                // escalated instead of making a second attempt.
                assert_eq!(r.reflect_retries, 0, "task {}", r.task);
                assert!(
                    r.recoveries.is_empty() || r.state == "escalated",
                    "task {}",
                    r.task
                );
            } else if cap > 0 {
                assert!(attempts <= cap, "task {}: {attempts} attempts", r.task);
            } else {
                assert_eq!(r.reflect_retries, 6, "task {} without a cap", r.task);
            }
        }
        if cap > 1 {
            assert!(
                records
                    .iter()
                    .any(|r| r.recoveries.is_empty() && r.reflect_retries == cap - 1),
                "a run without recoveries gets every round the cap leaves"
            );
        }
        rt.shutdown().await;
    }
}

//! `hindsight bench adaptive`: learning in words, measured. A simulated agent environment
//! (`config/envs/AGENT-FORMAT.md`) runs through the whole tree, its human corrections submitted
//! through the API's path, and the run is read back from what the tree recorded (the experience
//! log's steps, the lessons, what the model was sent): success, repeat errors, lessons and their
//! cost in context, model calls and tokens, SOP coverage, corrections accepted. With `--ablate` a
//! second run with one mechanism off is measured side by side.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hindsight::learn::Mechanism;
use hindsight::model::{ChatRequest, LanguageModel, ModelFuture, ModelReply, TurnContext};
use hindsight::run::workflow::SIM_MODEL;
use hindsight::store::Durability;
use hindsight::tools::sim::agent::{AgentEnv, SimModel};
use hindsight::{ExperienceTuple, Task};
use serde::{Deserialize, Serialize};

use crate::reflector::{FeedbackRefused, ReflectorMsg};
use crate::runtime::{Runtime, RuntimeError, RuntimeOptions};

/// The user every bench task runs for: lessons and corrections are kept per user, so the whole
/// run is one scope.
pub const BENCH_USER: &str = "bench";

/// The principal the bench's corrections come from (the API takes it from the key).
const BENCH_PRINCIPAL: &str = "bench-operator";

/// How a `bench adaptive` run goes.
#[derive(Debug, Clone, Copy)]
pub struct AdaptivePlan {
    /// Tasks to run, one after another.
    pub tasks: u64,
    /// Seed of the tasks, the simulated model and tools, and every choice.
    pub seed: u64,
    /// The mechanism to switch off in a second run measured beside the first, if any.
    pub ablate: Option<Mechanism>,
}

/// The figures of one `bench adaptive` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveFigures {
    /// Tasks run.
    pub tasks: u64,
    /// Share of tasks whose run passed.
    pub success_rate: f64,
    /// Share of tasks in which a tool call failed for a cause (the same tool under the same
    /// hidden rule, or the same correction's effect) that had already failed in an earlier task
    /// of the same scope. Infrastructure faults are never repeats.
    pub repeat_error_rate: f64,
    /// The repeated failures by cause (`rule:<tool>:<n>` in file order, or `correction:<n>`):
    /// what the repeat error rate is made of.
    pub repeat_causes: BTreeMap<String, u64>,
    /// Share of the last 100 tasks that passed on their first attempt.
    pub first_try_success_last_100: f64,
    /// Tasks run before the scope held its first lesson (`null`: none by the end).
    pub tasks_to_first_lesson: Option<u64>,
    /// Lessons in the scope at the end (synthesised and corrections, superseded ones left out).
    pub lessons: u64,
    /// Mean lessons in the `<strategy_context>` of a task's first model request.
    pub lessons_injected_per_run: f64,
    /// Mean words per task of what learning added to the model's requests (the
    /// `<strategy_context>` and `<attempt_guidance>` blocks), summed over the task's requests.
    pub context_tokens_per_run: f64,
    /// Mean model turns per task.
    pub model_calls_per_task: f64,
    /// Mean tokens (prompt and completion) per task, as the model reported them.
    pub tokens_per_task: f64,
    /// Share of the last 100 tasks whose agent stage a stable SOP ran.
    pub sop_coverage_last_100: f64,
    /// Infrastructure failures the policy learned from (must be 0).
    pub infra_failures_learned_from: u64,
    /// Corrections submitted.
    pub corrections_submitted: u64,
    /// Right corrections accepted.
    pub right_corrections_accepted: u64,
    /// Poisoned corrections accepted.
    pub poisoned_corrections_accepted: u64,
    /// The oracle model's first-try success, exact from the file.
    pub oracle_first_try_success: f64,
    /// Wall time of the run.
    pub seconds: f64,
}

/// What `hindsight bench adaptive` prints: the run's figures and, with `--ablate`, the same
/// figures for the run with that mechanism off.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdaptiveBench {
    /// The environment's name.
    pub env: String,
    /// The seed.
    pub seed: u64,
    /// Everything on.
    #[serde(flatten)]
    pub figures: AdaptiveFigures,
    /// The mechanism switched off in `ablated`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ablation: Option<Mechanism>,
    /// The same tasks with `ablation` off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ablated: Option<AdaptiveFigures>,
}

/// Runs `plan` on `env`: everything on, then, with `plan.ablate`, again with that mechanism off.
pub async fn adaptive(env: &AgentEnv, plan: AdaptivePlan) -> Result<AdaptiveBench, RuntimeError> {
    let figures = run_once(env, plan.tasks, plan.seed, None).await?;
    let ablated = match plan.ablate {
        Some(m) => Some(run_once(env, plan.tasks, plan.seed, Some(m)).await?),
        None => None,
    };
    Ok(AdaptiveBench {
        env: env.name().to_string(),
        seed: plan.seed,
        figures,
        ablation: plan.ablate,
        ablated,
    })
}

/// What the model was sent for one task.
#[derive(Debug, Default, Clone)]
struct Sent {
    /// Lessons in the first request's `<strategy_context>`.
    first_lessons: Option<u64>,
    /// Words of the learned blocks over every request.
    context_words: u64,
}

/// The environment's simulated model, noting what learning put in each request.
struct Observed {
    inner: SimModel,
    sent: Arc<Mutex<BTreeMap<u64, Sent>>>,
}

impl LanguageModel for Observed {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String> {
        self.inner.complete(request)
    }

    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        let system = request
            .messages
            .first()
            .map(|m| m.content.as_str())
            .unwrap_or("");
        let lessons = block(system, "<strategy_context>", "</strategy_context>");
        let guidance = block(system, "<attempt_guidance>", "</attempt_guidance>");
        let words = |b: Option<&str>| b.map_or(0, |b| b.split_whitespace().count() as u64);
        if let Ok(mut sent) = self.sent.lock() {
            let s = sent.entry(ctx.task_index).or_default();
            s.first_lessons.get_or_insert_with(|| {
                lessons.map_or(0, |b| {
                    b.lines().filter(|l| l.starts_with("- ")).count() as u64
                })
            });
            s.context_words += words(lessons) + words(guidance);
        }
        self.inner.turn(request, ctx)
    }
}

/// The text between `open` and `close` in `text`, if both are there.
fn block<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = start + text[start..].find(close)?;
    Some(&text[start..end])
}

/// One run of `tasks` tasks on a fresh tree, with `off` switched off.
async fn run_once(
    env: &AgentEnv,
    tasks: u64,
    seed: u64,
    off: Option<Mechanism>,
) -> Result<AdaptiveFigures, RuntimeError> {
    let started = Instant::now();
    let env = env.clone().with_seed(seed);
    let dir = super::bench::tempdir()?;
    let sent = Arc::new(Mutex::new(BTreeMap::new()));
    let mut opts = RuntimeOptions::new(dir.path(), env.clone());
    opts.durability = Durability::None;
    opts.seed = seed;
    opts.ablate = off.into_iter().collect();
    opts.models.insert(
        SIM_MODEL,
        Arc::new(Observed {
            inner: env.model(),
            sent: sent.clone(),
        }),
    );
    let rt = Runtime::start(opts).await?;
    let mut corrections = Corrections::default();
    let mut first_lesson = None;
    let mut outcomes = Vec::with_capacity(tasks as usize);
    for index in 0..tasks {
        let task = Task {
            user_id: Some(BENCH_USER.into()),
            ..env.task(index)
        };
        corrections.submit_due(&rt, &env, index, &task).await?;
        if first_lesson.is_none() && scope_lessons(&rt).await? > 0 {
            first_lesson = Some(index);
        }
        outcomes.push(rt.orchestrate(task).await?);
    }
    let lessons = scope_lessons(&rt).await?;
    if first_lesson.is_none() && lessons > 0 {
        first_lesson = Some(tasks);
    }
    let stats = super::bench::policy_stats(&rt).await?;
    let log: Vec<ExperienceTuple> = rt
        .store()
        .experience_all()?
        .into_iter()
        .filter_map(|(_, e)| e.ok())
        .collect();
    rt.shutdown().await;
    let sent = sent.lock().map(|s| s.clone()).unwrap_or_default();
    let trail = Trail::read(&env, &log);
    let n = tasks.max(1) as f64;
    let last: Vec<u64> = (tasks.saturating_sub(100)..tasks).collect();
    let last_n = last.len().max(1) as f64;
    let mean = |f: &dyn Fn(u64) -> f64| (0..tasks).map(f).sum::<f64>() / n;
    Ok(AdaptiveFigures {
        tasks,
        success_rate: outcomes.iter().filter(|o| o.passed).count() as f64 / n,
        repeat_error_rate: trail.repeated.len() as f64 / n,
        repeat_causes: trail.causes.clone(),
        first_try_success_last_100: last
            .iter()
            .filter(|&&i| {
                outcomes
                    .get(i as usize)
                    .is_some_and(|o| o.passed && o.attempts <= 1 && o.reflect_retries == 0)
            })
            .count() as f64
            / last_n,
        tasks_to_first_lesson: first_lesson,
        lessons,
        lessons_injected_per_run: mean(&|i| {
            sent.get(&i).and_then(|s| s.first_lessons).unwrap_or(0) as f64
        }),
        context_tokens_per_run: mean(&|i| sent.get(&i).map_or(0, |s| s.context_words) as f64),
        model_calls_per_task: mean(&|i| trail.turns.get(&i).copied().unwrap_or(0) as f64),
        tokens_per_task: mean(&|i| trail.tokens.get(&i).copied().unwrap_or(0) as f64),
        sop_coverage_last_100: last
            .iter()
            .filter(|&&i| {
                outcomes
                    .get(i as usize)
                    .is_some_and(|o| o.sop_id.is_some() && !trail.turns.contains_key(&i))
            })
            .count() as f64
            / last_n,
        infra_failures_learned_from: stats.infra_learned,
        corrections_submitted: corrections.submitted,
        right_corrections_accepted: corrections.right_accepted,
        poisoned_corrections_accepted: corrections.poisoned_accepted,
        oracle_first_try_success: env.oracle_first_try_success(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Lessons of the bench's scope in force (not superseded).
async fn scope_lessons(rt: &Runtime) -> Result<u64, RuntimeError> {
    let lessons = rt
        .ctx()
        .dir
        .reflector
        .call_with_timeout(
            |reply| ReflectorMsg::Lessons {
                scope_prefix: Some(format!("user:{BENCH_USER}")),
                reply,
            },
            Duration::from_secs(30),
        )
        .await?;
    Ok(lessons.iter().filter(|l| l.superseded_by.is_none()).count() as u64)
}

/// The corrections of the environment submitted so far and what became of them.
#[derive(Debug, Default)]
struct Corrections {
    submitted: u64,
    right_accepted: u64,
    poisoned_accepted: u64,
}

impl Corrections {
    /// Submits the corrections due before task `index` through the reflector, as the API's
    /// `POST /feedback` does (the scope from the task's user).
    async fn submit_due(
        &mut self,
        rt: &Runtime,
        env: &AgentEnv,
        index: u64,
        task: &Task,
    ) -> Result<(), RuntimeError> {
        let due: Vec<(String, String, bool)> = env
            .corrections_before(index)
            .filter(|(_, c)| c.at_task == index)
            .map(|(_, c)| (c.tool.clone(), c.text.clone(), c.poisoned))
            .collect();
        for (tool, text, poisoned) in due {
            let answer = rt
                .ctx()
                .dir
                .reflector
                .call_with_timeout(
                    |reply| ReflectorMsg::Feedback {
                        principal: Some(BENCH_PRINCIPAL.into()),
                        scope_of: Box::new(task.clone()),
                        tool: Some(tool.clone()),
                        text: text.clone(),
                        run_id: None,
                        reply,
                    },
                    Duration::from_secs(30),
                )
                .await?;
            self.submitted += 1;
            match answer {
                Ok(_) if poisoned => self.poisoned_accepted += 1,
                Ok(_) => self.right_accepted += 1,
                Err(FeedbackRefused::Rejected { reason }) => {
                    tracing::debug!(%reason, poisoned, "correction refused");
                }
                Err(other) => {
                    return Err(RuntimeError::Invalid(format!(
                        "the bench's correction before task {index} was not taken: {other:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What the experience log says of each task: its model turns, tokens and repeated errors.
#[derive(Debug, Default)]
struct Trail {
    turns: BTreeMap<u64, u64>,
    tokens: BTreeMap<u64, u64>,
    /// Tasks in which a failure repeated a cause of an earlier task.
    repeated: BTreeSet<u64>,
    /// Repeated failures by cause.
    causes: BTreeMap<String, u64>,
}

impl Trail {
    /// Reads the log of a bench run (one scope), in task order.
    fn read(env: &AgentEnv, log: &[ExperienceTuple]) -> Trail {
        let mut by_task: BTreeMap<u64, &ExperienceTuple> = BTreeMap::new();
        for exp in log {
            if let Some(index) = task_index(&exp.task_id) {
                by_task.insert(index, exp);
            }
        }
        let mut trail = Trail::default();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for (&index, exp) in &by_task {
            let mut causes = Vec::new();
            for step in &exp.steps {
                if step.action == "model_turn" {
                    *trail.turns.entry(index).or_default() += 1;
                    let tokens = step
                        .metadata
                        .get("tokens")
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0);
                    *trail.tokens.entry(index).or_default() += tokens;
                }
                let (Some(tool), Some(error)) = (&step.tool_called, &step.error) else {
                    continue;
                };
                let args = step.tool_input.clone().unwrap_or(serde_json::Value::Null);
                if let Some(source) = env.failure_source(index, tool, &args, error) {
                    causes.push(source.key());
                }
            }
            for cause in causes.iter().filter(|c| seen.contains(*c)) {
                trail.repeated.insert(index);
                *trail.causes.entry(cause.clone()).or_default() += 1;
            }
            seen.extend(causes);
        }
        trail
    }
}

/// The index of a simulated task from its id (`<env>#<index>`).
fn task_index(task_id: &str) -> Option<u64> {
    task_id.rsplit_once('#')?.1.parse().ok()
}

/// Several seeds of `bench adaptive` (`--runs N`): each run's figures and the means that the
/// issue's bars are read on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdaptiveRuns {
    /// The environment's name.
    pub env: String,
    /// Seeds run, in order.
    pub seeds: Vec<u64>,
    /// Mean repeat error rate with everything on.
    pub mean_repeat_error_rate: f64,
    /// Mean repeat error rate with the mechanism off (with `--ablate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_repeat_error_rate_ablated: Option<f64>,
    /// Mean success rate with everything on.
    pub mean_success_rate: f64,
    /// Poisoned corrections accepted, over the runs with everything on.
    pub poisoned_corrections_accepted: u64,
    /// Infrastructure failures learned from, over every run (must be 0).
    pub infra_failures_learned_from: u64,
    /// Each run, in seed order.
    pub per_run: Vec<AdaptiveBench>,
}

impl AdaptiveRuns {
    /// Aggregates runs (one per seed, same order); `None` when there is none.
    pub fn new(seeds: Vec<u64>, per_run: Vec<AdaptiveBench>) -> Option<AdaptiveRuns> {
        let first = per_run.first()?;
        let n = per_run.len() as f64;
        let mean = |f: &dyn Fn(&AdaptiveFigures) -> f64| {
            per_run.iter().map(|b| f(&b.figures)).sum::<f64>() / n
        };
        let ablated: Vec<f64> = per_run
            .iter()
            .filter_map(|b| b.ablated.as_ref().map(|a| a.repeat_error_rate))
            .collect();
        Some(AdaptiveRuns {
            env: first.env.clone(),
            seeds,
            mean_repeat_error_rate: mean(&|f| f.repeat_error_rate),
            mean_repeat_error_rate_ablated: (!ablated.is_empty())
                .then(|| ablated.iter().sum::<f64>() / ablated.len() as f64),
            mean_success_rate: mean(&|f| f.success_rate),
            poisoned_corrections_accepted: per_run
                .iter()
                .map(|b| b.figures.poisoned_corrections_accepted)
                .sum(),
            infra_failures_learned_from: per_run
                .iter()
                .map(|b| {
                    b.figures.infra_failures_learned_from
                        + b.ablated
                            .as_ref()
                            .map_or(0, |a| a.infra_failures_learned_from)
                })
                .sum(),
            per_run,
        })
    }
}

/// Loads an agent environment for the bench, naming the file in errors.
pub fn load(path: &Path) -> Result<AgentEnv, RuntimeError> {
    Ok(AgentEnv::load(path)?)
}

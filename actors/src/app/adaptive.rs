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
use hindsight::learn::cluster::cluster_key;
use hindsight::model::{ChatRequest, LanguageModel, ModelFuture, ModelReply, TurnContext};
use hindsight::run::RunOutcome;
use hindsight::run::workflow::SIM_MODEL;
use hindsight::store::Durability;
use hindsight::tools::sim::agent::{AgentEnv, SimModel};
use hindsight::{ExperienceTuple, Sop, Task};
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
    /// Share of the last 100 tasks run through a promoted procedure (a stable SOP of an agent
    /// stage; trials of a candidate are not counted).
    pub sop_coverage_last_100: f64,
    /// Procedures proposed and promoted, and what running them changed where they were.
    pub procedures: ProcedureFigures,
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

/// Procedures from the agent's trajectories: how many were proposed and promoted, and in the
/// clusters where one was promoted, the runs through it against the model's own runs there
/// (those outside any procedure: before the promotion, and the router's holdout after it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcedureFigures {
    /// Candidate procedures proposed (every version).
    pub proposed: u64,
    /// Of those, promoted on their trials.
    pub promoted: u64,
    /// Runs that trialled a candidate.
    pub trial_runs: u64,
    /// Runs through a promoted procedure.
    pub sop_runs: u64,
    /// The model's own runs in the clusters where a procedure was promoted.
    pub model_runs: u64,
    /// Mean model turns of a run through a promoted procedure.
    pub model_calls_per_task_sop: f64,
    /// Mean model turns of the model's own runs in those clusters.
    pub model_calls_per_task_model: f64,
    /// Share of the runs through a promoted procedure that passed.
    pub success_rate_sop: f64,
    /// Share of the model's own runs in those clusters that passed.
    pub success_rate_model: f64,
    /// Share of the runs through a promoted procedure that passed on their first attempt.
    pub first_try_success_sop: f64,
    /// Share of the model's own runs in those clusters that passed on their first attempt.
    pub first_try_success_model: f64,
}

/// What a procedure did to a run, by task: `None` (the model's run), a trial of a candidate, or
/// a run through a promoted procedure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Model,
    Trial,
    Sop,
}

impl ProcedureFigures {
    /// The figures of a bench run from its SOP table, its log and its outcomes (in task order).
    fn read(
        sops: &[Sop],
        log: &BTreeMap<u64, &ExperienceTuple>,
        outcomes: &[RunOutcome],
        turns: &BTreeMap<u64, u64>,
    ) -> (ProcedureFigures, BTreeMap<u64, Via>) {
        let procedures: Vec<&Sop> = sops.iter().filter(|s| !s.procedure.is_empty()).collect();
        let promoted: Vec<&&Sop> = procedures.iter().filter(|s| s.p_value.is_some()).collect();
        // Runs through each procedure version in task order: the first `trials` of a promoted
        // one were its trials (recorded while it was a candidate), the rest ran it stable.
        let mut through: BTreeMap<String, u64> = BTreeMap::new();
        let mut via = BTreeMap::new();
        for (&index, exp) in log {
            let v = match hindsight::run::parse_sop_plan_id(&exp.plan_id) {
                Some((id, version)) => match procedures
                    .iter()
                    .find(|s| s.sop_id == id && s.version == version)
                {
                    Some(sop) => {
                        let n = through.entry(exp.plan_id.clone()).or_default();
                        *n += 1;
                        if sop.p_value.is_some() && *n > sop.trials {
                            Via::Sop
                        } else {
                            Via::Trial
                        }
                    }
                    None => Via::Model,
                },
                None => Via::Model,
            };
            via.insert(index, v);
        }
        let clusters: BTreeSet<String> = promoted
            .iter()
            .map(|s| cluster_key(&s.preconditions))
            .collect();
        let in_clusters = |index: u64| {
            log.get(&index)
                .is_some_and(|e| clusters.contains(&cluster_key(&e.context_features)))
        };
        let group = |want: Via| -> Vec<u64> {
            via.iter()
                .filter(|(i, v)| **v == want && in_clusters(**i))
                .map(|(i, _)| *i)
                .collect()
        };
        let (sop_runs, model_runs) = (group(Via::Sop), group(Via::Model));
        let share = |runs: &[u64], f: &dyn Fn(&RunOutcome) -> bool| {
            let n = runs.len().max(1) as f64;
            runs.iter()
                .filter(|&&i| outcomes.get(i as usize).is_some_and(f))
                .count() as f64
                / n
        };
        let mean_turns = |runs: &[u64]| {
            runs.iter()
                .map(|i| turns.get(i).copied().unwrap_or(0) as f64)
                // A sum from 0.0 (an empty `sum` of floats is -0.0).
                .fold(0.0, |a, b| a + b)
                / runs.len().max(1) as f64
        };
        let first_try = |o: &RunOutcome| o.passed && o.attempts <= 1 && o.reflect_retries == 0;
        let figures = ProcedureFigures {
            proposed: procedures.len() as u64,
            promoted: promoted.len() as u64,
            trial_runs: via.values().filter(|v| **v == Via::Trial).count() as u64,
            sop_runs: sop_runs.len() as u64,
            model_runs: model_runs.len() as u64,
            model_calls_per_task_sop: mean_turns(&sop_runs),
            model_calls_per_task_model: mean_turns(&model_runs),
            success_rate_sop: share(&sop_runs, &|o| o.passed),
            success_rate_model: share(&model_runs, &|o| o.passed),
            first_try_success_sop: share(&sop_runs, &first_try),
            first_try_success_model: share(&model_runs, &first_try),
        };
        (figures, via)
    }
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
    let sops: Vec<Sop> = rt
        .store()
        .scan::<Sop>(crate::policy::SOPS)?
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .collect();
    let log: Vec<ExperienceTuple> = rt
        .store()
        .experience_all()?
        .into_iter()
        .filter_map(|(_, e)| e.ok())
        .collect();
    rt.shutdown().await;
    let sent = sent.lock().map(|s| s.clone()).unwrap_or_default();
    let by_task: BTreeMap<u64, &ExperienceTuple> = log
        .iter()
        .filter_map(|e| Some((task_index(&e.task_id)?, e)))
        .collect();
    let trail = Trail::read(&env, &by_task);
    let (procedures, via) = ProcedureFigures::read(&sops, &by_task, &outcomes, &trail.turns);
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
            .filter(|i| via.get(i) == Some(&Via::Sop))
            .count() as f64
            / last_n,
        procedures,
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
    /// Reads the log of a bench run (one scope), by task index.
    fn read(env: &AgentEnv, by_task: &BTreeMap<u64, &ExperienceTuple>) -> Trail {
        let mut trail = Trail::default();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for (&index, exp) in by_task {
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

//! local: the core's interpreter of the run machine. It runs tasks one after another in this
//! process, without actors or a store: the planner, the tool runner, the validator and
//! ReflectRetry's verdict are called directly, checkpoints and the experience log are kept in
//! memory. It performs the same commands in the same order as the tree's driver with one task in
//! flight, so for the same seed it takes the same decisions (the learning bench's
//! `--engine core`, and sweeps that need many runs fast).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::ReflectRetryConfig;
use crate::learn::planner::Planner;
use crate::model::Models;
use crate::tools::ToolRunner;
use crate::{ExperienceTuple, Run, Task};

use super::agent::perform;
use super::call::execute;
use super::machine::{Command, Event, RunError, RunMachine, RunProgress, RunRules};
use super::outcome::RunOutcome;
use super::report::{RunValidator, reflect_verdict};
use super::workflow::Workflow;

/// Runs tasks through the run machine in this process. See the module's documentation.
pub struct LocalRunner {
    workflow: Arc<Workflow>,
    runner: ToolRunner,
    rules: Arc<RunRules>,
    planner: Planner,
    reflect_retry: ReflectRetryConfig,
    validator: RunValidator,
    /// ReflectRetry's retries per run.
    retries: HashMap<String, u32>,
    /// Each unfinished run's latest checkpoint (for rollbacks: the machine names none, so only
    /// the latest can be loaded; encoded only then).
    checkpoints: HashMap<String, RunProgress>,
    /// The experience log; an experience's sequence number is its position plus one.
    log: Vec<ExperienceTuple>,
    /// The models of the workflow's agent stages.
    models: Models,
}

impl LocalRunner {
    /// A runner of `workflow`'s tasks whose tools `runner` calls, recovered by `rules`, planned
    /// by `planner`, and judged by ReflectRetry with `reflect_retry` and `validator`.
    pub fn new(
        workflow: Arc<Workflow>,
        runner: ToolRunner,
        rules: RunRules,
        planner: Planner,
        reflect_retry: ReflectRetryConfig,
        validator: RunValidator,
    ) -> LocalRunner {
        LocalRunner {
            workflow,
            runner,
            rules: Arc::new(rules),
            planner,
            reflect_retry,
            validator,
            retries: HashMap::new(),
            checkpoints: HashMap::new(),
            log: Vec::new(),
            models: Models::new(),
        }
    }

    /// The same runner, its agent stages' turns performed by `models`.
    pub fn with_models(mut self, models: Models) -> LocalRunner {
        self.models = models;
        self
    }

    /// The planner, with everything it learned.
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The experience log, oldest first.
    pub fn experiences(&self) -> &[ExperienceTuple] {
        &self.log
    }

    /// The time the runner's clock shows (virtual for simulated tools).
    fn now(&self) -> u64 {
        self.runner.clock().now_ms()
    }

    /// Runs `task` to its end (one run per task id, as the tree's: `run-<task id>`), logs its
    /// experience and teaches the planner.
    pub async fn run(&mut self, task: Task) -> Result<RunOutcome, RunError> {
        let run_id = format!("run-{}", task.task_id);
        let task = Arc::new(task);
        // The run's record, whose state machine checks every transition as the orchestrator's does.
        let mut record = Run::new(run_id.clone(), &task, self.now());
        let mut machine = RunMachine::new(
            run_id.clone(),
            task.clone(),
            self.workflow.clone(),
            self.rules.clone(),
        );
        loop {
            let Some(command) = machine.poll() else {
                return Err(RunError::Stalled(run_id));
            };
            let event = match command {
                Command::Prepare => Event::Prepared {
                    citations: Vec::new(),
                    guidance: None,
                    forced: None,
                },
                Command::Choose { base, exclude } => {
                    Event::Planned(self.planner.choose(&task, base, &exclude))
                }
                Command::Transition {
                    next,
                    then,
                    checkpoint,
                    ..
                } => {
                    record.transition(next, self.now())?;
                    if let Some(then) = then {
                        record.transition(then, self.now())?;
                    }
                    if checkpoint {
                        self.checkpoints
                            .insert(run_id.clone(), machine.progress().clone());
                    }
                    Event::Transitioned(record.state)
                }
                Command::Checkpoint => {
                    self.checkpoints
                        .insert(run_id.clone(), machine.progress().clone());
                    continue;
                }
                Command::Notify(_) => continue,
                Command::LearnFirstAttempt(steps) => {
                    self.planner.learn_first_attempt(
                        &run_id,
                        &task.task_id,
                        task.features.clone(),
                        steps,
                    );
                    continue;
                }
                Command::Call(call) => {
                    let outcome = execute(&self.runner, *call).await;
                    Event::Called {
                        outcome,
                        at_ms: self.now(),
                    }
                }
                Command::Turn(turn) => {
                    let outcome = perform(&self.models, &turn, self.runner.clock().as_ref()).await;
                    Event::Turned {
                        outcome,
                        at_ms: self.now(),
                    }
                }
                Command::Validate(outputs) => Event::Validated(
                    outputs
                        .into_iter()
                        .map(|(stage, output)| {
                            let verdict = self.workflow.validate(&task, &stage, &output);
                            (stage, verdict)
                        })
                        .collect(),
                ),
                Command::LoadCheckpoint(name) => {
                    // The machine's checkpoints have no names: a named one is not found.
                    let latest = match name {
                        Some(_) => None,
                        None => self.checkpoints.get(&run_id),
                    };
                    let found = latest
                        .map(|progress| RunMachine::checkpoint_of(&run_id, progress, self.now()))
                        .transpose()?;
                    Event::CheckpointLoaded(found)
                }
                Command::Review(report) => {
                    let done = self.retries.get(&run_id).copied().unwrap_or(0);
                    let (verdict, now) =
                        reflect_verdict(&self.reflect_retry, &self.validator, &report, done);
                    self.retries.insert(run_id.clone(), now);
                    Event::Reviewed {
                        reflect_retry: verdict,
                        plugins: Vec::new(),
                        at_ms: self.now(),
                    }
                }
                Command::Finish(finished) => {
                    self.checkpoints.remove(&run_id);
                    self.retries.remove(&run_id);
                    self.log.push(finished.experience);
                    let seq = self.log.len() as u64;
                    if let Some(exp) = self.log.last() {
                        self.planner.observe(seq, exp);
                    }
                    self.maybe_distill();
                    return Ok(finished.outcome);
                }
            };
            machine.handle(event)?;
        }
    }

    /// Fits and evaluates a ranker when one is due, as the policy actor does after each
    /// experience.
    fn maybe_distill(&mut self) {
        if self.planner.distill_from().is_some() {
            self.planner.refit(&self.log);
        }
    }
}

//! The run machine's agent stages: the loop in which a model calls tools until it answers.
//! Every model turn and every tool call is a step, checkpointed before the next is asked for;
//! the conversation is part of the checkpoint, so a run resumed after a crash goes on
//! mid-loop: a turn in flight is asked again, a completed idempotent call is replayed from its
//! idempotency record (same key), a non-idempotent call in doubt goes to the failure policy.
//! The loop's trajectory failures are found here (a loop of calls, a tool not offered, the
//! budget of turns spent, an answer citing a value no tool returned, a declared plan left
//! undone, a constraint broken, the goal drifted from) and recovered by the failure policy,
//! whose words reach the model in its next attempt.

use serde_json::Value;

use crate::model::{ChatMessage, ChatRequest, ToolCall, ToolChoice};
use crate::triage::context::{STATUS_KEY, SUBGOAL_KEY};
use crate::{ArmChoice, ErrorClass, FailureCategory, FailureType, RecoveryAction, RunState, Step};

use super::super::agent::{
    ModelTurn, TurnOutcome, declared_plan, model_failure, opening, system_message,
    tool_message_text, turn_context, unbacked_values, user_message,
};
use super::super::call::{Budget, CallOutcome, StageCall};
use super::super::plan::PlanChoice;
use super::super::recovery::AttemptFailure;
use super::super::report::RunEvent;
use super::super::workflow::{AgentStage, task_index};
use super::{Command, Phase, RunMachine};

impl RunMachine {
    /// Goes on with agent stage `i` run by `arm`: the conversation opens, the calls the model
    /// asked for are made one after another, then the model is asked again.
    pub(super) fn run_agent(&mut self, i: usize, arm: ArmChoice, agent: &AgentStage) {
        let toolset = self.workflow.toolset(&arm.stage, &arm.strategy);
        let variant = agent.variants.iter().find(|v| v.name == arm.strategy);
        if self.st.conversation.is_empty() {
            let system = system_message(
                agent,
                variant,
                self.st.context.as_deref(),
                self.st.guidance.as_deref(),
            );
            let user = user_message(&self.task, self.st.outputs());
            self.st.conversation = opening(system, user);
            self.st.turn = 0;
            self.st.stage_calls = 0;
            self.st.pending_calls.clear();
            self.open_procedure(&arm.stage);
        }
        if let Some(call) = self.st.pending_calls.first().cloned() {
            self.agent_call(i, &arm, call);
            return;
        }
        if self.follow_procedure(i, &arm, agent) {
            return;
        }
        if let Some(spent) = self.budget_spent(&arm.stage, agent) {
            // Every later attempt would find the run's budget spent too: the run ends here,
            // not through the failure policy.
            let message = format!("stage {} spent {spent}", arm.stage);
            self.event(RunEvent::Error {
                stage: arm.stage.clone(),
                tool: arm.tool.clone(),
                class: ErrorClass::DeterministicFailure,
                message: message.clone(),
            });
            self.learn_first_attempt();
            self.round_end(RunState::Aborted, Some(message));
            return;
        }
        if self.st.turn >= agent.max_turns {
            let message = format!(
                "stage {} spent its budget of {} model turns without an answer",
                arm.stage, agent.max_turns
            );
            self.agent_failed(i, &arm, message, "TurnBudget", None);
            return;
        }
        let request = ChatRequest {
            messages: self.st.conversation.clone(),
            temperature: variant.and_then(|v| v.temperature),
            max_tokens: agent.max_turn_tokens,
            tools: toolset.offered.clone(),
            tool_choice: ToolChoice::Auto,
            ..ChatRequest::default()
        };
        let turn = ModelTurn {
            model: arm.tool.clone(),
            request,
            context: turn_context(
                &self.run_id,
                &self.task,
                task_index(&self.task),
                self.st.attempt,
                &arm.stage,
                self.st.turn,
            ),
        };
        self.wait(Phase::Turning { stage: i }, Command::Turn(Box::new(turn)));
    }

    /// Which of `agent`'s budgets the run has spent: the tokens of the stage's model turns, and
    /// the run's cost and time, over every attempt so far.
    fn budget_spent(&self, stage: &str, agent: &AgentStage) -> Option<String> {
        let tokens: u64 = self
            .st
            .steps
            .iter()
            .filter(|s| {
                s.action == "model_turn"
                    && s.metadata.get("stage").and_then(Value::as_str) == Some(stage)
            })
            .filter_map(|s| s.metadata.get("tokens").and_then(Value::as_u64))
            .sum();
        agent.budget_spent(tokens, self.st.cost, self.st.latency_ms)
    }

    /// The model's turn at stage `i`: its tool calls are queued, or its answer ends the stage.
    pub(super) fn turned(&mut self, i: usize, outcome: TurnOutcome, at_ms: u64) {
        let Some(arm) = self.st.plan.as_ref().and_then(|p| p.arms.get(i)).cloned() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        let Some(agent) = self.workflow.agent(&arm.stage).cloned() else {
            self.round_end(RunState::Failed, Some("no plan could be made".to_string()));
            return;
        };
        let st = &mut self.st;
        st.latency_ms += outcome.latency_ms;
        st.cost += outcome.cost;
        let mut step = Step {
            index: st.steps.len() as u32,
            action: "model_turn".to_string(),
            timestamp_ms: at_ms,
            latency_ms: outcome.latency_ms,
            cost: outcome.cost,
            idempotent: true,
            ..Step::default()
        };
        step.metadata
            .insert("stage".into(), Value::from(arm.stage.clone()));
        step.metadata
            .insert("strategy".into(), Value::from(arm.strategy.clone()));
        step.metadata
            .insert("attempt".into(), Value::from(st.attempt));
        step.metadata.insert("turn".into(), Value::from(st.turn));
        step.metadata
            .insert("model".into(), Value::from(arm.tool.clone()));
        let reply = match outcome.result {
            Ok(reply) => reply,
            Err(e) => {
                let (class, category) = model_failure(&e);
                let message = e.to_string();
                step.error = Some(message.clone());
                step.error_class = Some(class);
                step.exception_type = Some(class.to_string());
                step.metadata
                    .insert("outcome".into(), Value::from(category.as_str()));
                st.steps.push(step);
                self.event(RunEvent::Error {
                    stage: arm.stage.clone(),
                    tool: arm.tool.clone(),
                    class,
                    message: message.clone(),
                });
                self.checkpoint();
                self.attempt_failed(AttemptFailure {
                    trajectory: self.st.attempt_trajectory(),
                    stage: i,
                    message,
                    error_type: Some(class.to_string()),
                    class: Some(class),
                    category,
                    retry_after_ms: None,
                    classified: None,
                });
                return;
            }
        };
        let tokens = reply.usage.map_or(0, |u| u64::from(u.total()));
        step.llm_output = Some(reply.content.clone());
        step.metadata.insert("tokens".into(), Value::from(tokens));
        step.metadata
            .insert("tool_calls".into(), Value::from(reply.tool_calls.len()));
        step.metadata
            .insert("outcome".into(), Value::from("success"));
        st.steps.push(step);
        for subgoal in declared_plan(&reply.content) {
            let mut declared = Step {
                index: st.steps.len() as u32,
                action: "subgoal".to_string(),
                timestamp_ms: at_ms,
                ..Step::default()
            };
            declared
                .metadata
                .insert(SUBGOAL_KEY.into(), Value::from(subgoal));
            declared
                .metadata
                .insert(STATUS_KEY.into(), Value::from("declared"));
            declared
                .metadata
                .insert("attempt".into(), Value::from(st.attempt));
            declared
                .metadata
                .insert("stage".into(), Value::from(arm.stage.clone()));
            st.steps.push(declared);
        }
        st.conversation.push(ChatMessage::assistant(
            reply.content.clone(),
            reply.tool_calls.clone(),
        ));
        st.turn += 1;
        if !reply.tool_calls.is_empty() {
            st.pending_calls = reply.tool_calls;
            self.checkpoint();
            self.run_agent(i, arm, &agent);
            return;
        }
        self.answered(i, &arm, &agent, reply.content);
    }

    /// The model answered: the answer is read (as JSON under a schema), checked for values no
    /// tool returned and judged by the classifier (plan left undone, constraint, goal); then it
    /// is the stage's output.
    pub(super) fn answered(
        &mut self,
        i: usize,
        arm: &ArmChoice,
        agent: &AgentStage,
        content: String,
    ) {
        let output = match &agent.answer_schema {
            None => serde_json::json!({ "answer": content }),
            Some(_) => match serde_json::from_str::<Value>(content.trim()) {
                Ok(v) => v,
                Err(e) => {
                    let message = format!("the answer is not the JSON its schema asks for: {e}");
                    self.agent_failed(
                        i,
                        arm,
                        message,
                        "SchemaMismatch",
                        Some((ErrorClass::SchemaMismatch, None)),
                    );
                    return;
                }
            },
        };
        let unbacked = unbacked_values(&content, &self.st.conversation);
        if !unbacked.is_empty() {
            let message = format!(
                "the answer cites {} that no tool returned",
                unbacked.join(", ")
            );
            self.agent_failed(
                i,
                arm,
                message,
                "UnbackedValue",
                Some((
                    ErrorClass::DeterministicFailure,
                    Some((FailureType::HallucinatedState, "unbacked_value".to_string())),
                )),
            );
            return;
        }
        let trajectory = self.st.attempt_trajectory();
        if let Some(verdict) = self
            .rules
            .triage
            .judge_answer(&self.task, &trajectory, &output)
        {
            self.agent_failed(
                i,
                arm,
                verdict.message,
                "AnswerRejected",
                Some((
                    ErrorClass::DeterministicFailure,
                    Some((verdict.failure_type, verdict.rule)),
                )),
            );
            return;
        }
        if let Some(step) = self.st.steps.last_mut() {
            step.tool_output = Some(output);
        }
        self.record_procedure(&arm.stage, &content);
        let st = &mut self.st;
        st.output_step.insert(arm.stage.clone(), st.steps.len() - 1);
        st.next_stage += 1;
        st.conversation.clear();
        st.pending_calls.clear();
        self.event(RunEvent::StepSucceeded {
            stage: arm.stage.clone(),
            tool: arm.tool.clone(),
        });
        self.checkpoint();
        self.run_stages();
    }

    /// The attempt of agent stage `i` failed for what the loop found; `class` is the error's
    /// class with the failure type already judged, if it was.
    fn agent_failed(
        &mut self,
        i: usize,
        arm: &ArmChoice,
        message: String,
        error_type: &str,
        class: Option<(ErrorClass, Option<(FailureType, String)>)>,
    ) {
        let (class, classified) = class.unwrap_or((ErrorClass::DeterministicFailure, None));
        self.event(RunEvent::Error {
            stage: arm.stage.clone(),
            tool: arm.tool.clone(),
            class,
            message: message.clone(),
        });
        if let Some(step) = self.st.steps.last_mut() {
            step.metadata
                .insert("outcome".into(), Value::from("failed"));
        }
        self.checkpoint();
        self.attempt_failed(AttemptFailure {
            trajectory: self.st.attempt_trajectory(),
            stage: i,
            message,
            error_type: Some(error_type.to_string()),
            class: Some(class),
            category: FailureCategory::Strategy,
            retry_after_ms: None,
            classified,
        });
    }

    /// Makes the model's next call: through the resilient runner under an idempotency key of
    /// its own (stage, turn, call), so that a completed call is replayed, never repeated.
    pub(super) fn agent_call(&mut self, i: usize, arm: &ArmChoice, call: ToolCall) {
        let toolset = self.workflow.toolset(&arm.stage, &arm.strategy);
        let Some(tool) = toolset.registry_name(&call.name).map(str::to_string) else {
            let offered: Vec<&str> = toolset.offered.iter().map(|t| t.name.as_str()).collect();
            let message = format!(
                "unknown tool: the model called `{}`, which is not one of its tools ({})",
                call.name,
                offered.join(", ")
            );
            let step = Step {
                index: self.st.steps.len() as u32,
                action: "tool_call".to_string(),
                tool_called: Some(call.name.clone()),
                tool_input: Some(call.arguments.clone()),
                error: Some(message.clone()),
                error_class: Some(ErrorClass::ToolNotFit),
                exception_type: Some("UnknownTool".to_string()),
                metadata: [
                    ("stage".to_string(), Value::from(arm.stage.clone())),
                    ("attempt".to_string(), Value::from(self.st.attempt)),
                ]
                .into_iter()
                .collect(),
                ..Step::default()
            };
            self.st.steps.push(step);
            self.st.pending_calls.clear();
            self.agent_failed(
                i,
                arm,
                message,
                "UnknownTool",
                Some((ErrorClass::ToolNotFit, None)),
            );
            return;
        };
        let idempotent = self.workflow.is_idempotent(&tool);
        if self.st.in_flight == Some(i) && !idempotent {
            let when = format!(" (turn {})", self.st.turn);
            self.in_doubt(i, &arm.stage, &tool, &when);
            return;
        }
        if !idempotent {
            self.st.in_flight = Some(i);
            self.checkpoint();
        }
        let stage_call = StageCall {
            run_id: self.run_id.clone(),
            task_index: task_index(&self.task),
            attempt: self.st.attempt,
            stage: arm.stage.clone(),
            tool,
            args: call.arguments.clone(),
            features: self.task.features.clone(),
            idempotency_key: match &self.st.following {
                Some(f) => crate::store::idempotency::procedure_call_key(
                    &self.run_id,
                    self.st.attempt,
                    &arm.stage,
                    f.next,
                ),
                None => crate::store::idempotency::agent_call_key(
                    &self.run_id,
                    self.st.attempt,
                    &arm.stage,
                    self.st.turn,
                    self.st.stage_calls,
                ),
            },
            budget: Budget::remaining(&self.task.constraints, self.st.latency_ms, self.st.cost),
            turn: self.st.turn,
            call: self.st.stage_calls,
            input: self.task.input.clone(),
            tenant: self.task.tenant.clone(),
        };
        self.wait(
            Phase::Calling {
                stage: i,
                call: Box::new(stage_call.clone()),
            },
            Command::Call(Box::new(stage_call)),
        );
    }

    /// A tool call of agent stage `i` ended: its result goes back to the model as a tool
    /// message (an error too, unless the environment failed it after the runner's retries);
    /// a loop ends the attempt.
    pub(super) fn agent_called(
        &mut self,
        i: usize,
        arm: ArmChoice,
        agent: &AgentStage,
        call: StageCall,
        outcome: CallOutcome,
        at_ms: u64,
    ) {
        let Some(model_call) = self.st.pending_calls.first().cloned() else {
            self.round_end(
                RunState::Failed,
                Some("a tool result came for no call".to_string()),
            );
            return;
        };
        let mut step = self.call_step(&arm, &call, &outcome, at_ms);
        step.metadata.insert("turn".into(), Value::from(call.turn));
        step.metadata.insert("call".into(), Value::from(call.call));
        let st = &mut self.st;
        st.in_flight = None;
        st.pending_calls.remove(0);
        st.stage_calls += 1;
        st.conversation.push(ChatMessage::tool(
            model_call.id.clone(),
            tool_message_text(&outcome.result),
        ));
        let following = self.st.following.as_ref().map(|f| f.next);
        if let Some(at) = following {
            step.metadata
                .insert("procedure_step".into(), Value::from(at));
        }
        match outcome.result {
            Ok(value) => {
                if following.is_some() {
                    self.procedure_called(&value);
                }
                let st = &mut self.st;
                step.tool_output = Some(value);
                step.metadata
                    .insert("outcome".into(), Value::from("success"));
                let offered = model_call.name.clone();
                let declared: Vec<String> = crate::triage::context::subgoals(&st.steps)
                    .into_iter()
                    .map(|(name, _)| name)
                    .collect();
                if let Some(goal) = declared
                    .into_iter()
                    .find(|g| *g == offered || *g == call.tool)
                {
                    step.metadata.insert(SUBGOAL_KEY.into(), Value::from(goal));
                    step.metadata.insert(STATUS_KEY.into(), Value::from("done"));
                }
                st.steps.push(step);
                self.event(RunEvent::StepSucceeded {
                    stage: arm.stage.clone(),
                    tool: call.tool.clone(),
                });
            }
            Err(err) => {
                step.error = Some(err.message.clone());
                step.error_class = Some(err.class);
                step.exception_type = Some(err.class.to_string());
                step.metadata
                    .insert("outcome".into(), Value::from(err.category.as_str()));
                self.st.steps.push(step);
                self.event(RunEvent::Error {
                    stage: arm.stage.clone(),
                    tool: call.tool.clone(),
                    class: err.class,
                    message: err.message.clone(),
                });
                if err.category != FailureCategory::Infrastructure && following.is_some() {
                    self.procedure_failed(&arm.stage, &err.message);
                }
                if err.category == FailureCategory::Infrastructure {
                    self.st.pending_calls.clear();
                    self.checkpoint();
                    self.attempt_failed(AttemptFailure {
                        trajectory: self.st.attempt_trajectory(),
                        stage: i,
                        message: err.message,
                        error_type: Some(err.class.to_string()),
                        class: Some(err.class),
                        category: err.category,
                        retry_after_ms: err.retry_after_ms,
                        classified: None,
                    });
                    return;
                }
            }
        }
        let trajectory = self.st.attempt_trajectory();
        if let Some(found) = self.rules.triage.loop_in(&trajectory) {
            self.st.pending_calls.clear();
            self.agent_failed(i, &arm, found.message, "Loop", None);
            return;
        }
        self.checkpoint();
        self.run_agent(i, arm, agent);
    }

    /// The recovery of a failed attempt of an agent stage, in words the model reads next: a
    /// retry goes on with the conversation (the failure is in it); a resume keeps the finished
    /// calls and names the subgoal to go on from; a replan or a retry with the tool manifest
    /// starts the stage again with the hint (and the manifest) as guidance, with another
    /// variant while the stage has one not ruled out. Rollback, escalation, suspension and
    /// abort are the machine's, as for a tool stage (`false`).
    pub(super) fn recover_agent(
        &mut self,
        plan: &PlanChoice,
        failed: &ArmChoice,
        failure: &AttemptFailure,
        action: &RecoveryAction,
    ) -> bool {
        let said = self.rules.triage.hints();
        let words = match action {
            RecoveryAction::Retry {
                inject: None,
                delay_ms,
                ..
            } => {
                self.st.latency_ms += *delay_ms as f64;
                self.go_on_in_words(
                    said.then(|| format!("The last step failed ({}); try again.", failure.message)),
                );
                return true;
            }
            RecoveryAction::Resume { from_subgoal } => {
                self.go_on_in_words(said.then(|| {
                    format!(
                        "Resume from the subgoal `{from_subgoal}`: the steps above that succeeded \
                         stand; do not repeat them."
                    )
                }));
                return true;
            }
            RecoveryAction::Retry {
                inject: Some(_),
                hint,
                ..
            } => {
                let tools = self
                    .workflow
                    .toolset(&failed.stage, &failed.strategy)
                    .manifest();
                format!(
                    "{}\nWhat went wrong: {}\nThe tools you may call:\n{tools}",
                    hint.as_deref()
                        .unwrap_or("Use only the tools you are given."),
                    failure.message
                )
            }
            RecoveryAction::Replan { hint } => {
                format!("{hint}\nWhat went wrong: {}", failure.message)
            }
            _ => return false,
        };
        let words = said.then_some(words);
        let others = self.workflow.agent(&failed.stage).is_some_and(|agent| {
            agent.variants.iter().any(|v| {
                v.name != failed.strategy
                    && !self.st.excluded.iter().any(|(stage, model, variant)| {
                        *stage == failed.stage && *model == v.model && *variant == v.name
                    })
            })
        });
        if others {
            self.repair(plan.clone(), failed, failure.stage, words);
        } else {
            self.st.guidance = words;
            self.st.rewind_to(plan, failure.stage);
            self.checkpoint();
            self.attempt_start();
        }
        true
    }

    /// Goes on with the stage's conversation after a failure: the calls not made are dropped
    /// and `words`, if any, reach the model as a user message.
    fn go_on_in_words(&mut self, words: Option<String>) {
        self.st.pending_calls.clear();
        self.st.in_flight = None;
        match words {
            Some(words) if !self.st.conversation.is_empty() => {
                self.st.conversation.push(ChatMessage::user(words));
            }
            words => self.st.guidance = words,
        }
        self.checkpoint();
        self.attempt_start();
    }
}

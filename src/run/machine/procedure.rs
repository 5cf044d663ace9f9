//! The run machine's procedures: an agent stage whose plan follows a procedure SOP makes the
//! procedure's calls itself, filled in for the task, without asking the model; then it answers
//! with the procedure's answer, or asks the model once for it. A step that fails, or cannot be
//! filled in, hands the stage back to the model, with the failure as the words it reads next.
//! A stage that passed without a procedure records the procedure its calls make, for the SOP
//! book to propose.

use serde_json::Value;

use crate::ArmChoice;
use crate::learn::procedure::{Bindings, MadeCall, PROCEDURE_KEY, Procedure};
use crate::model::{ChatMessage, ToolCall};
use crate::{Step, Task};

use super::super::workflow::{AgentStage, offered_name};
use super::{Following, RunMachine};

impl RunMachine {
    /// The procedure the plan follows for `stage`, unless the run's procedure stopped.
    pub(super) fn procedure_for(&self, stage: &str) -> Option<&Procedure> {
        if self.st.procedure_dropped {
            return None;
        }
        let plan = self.st.plan.as_ref()?;
        plan.procedure.iter().find(|p| p.stage == stage)
    }

    /// Opens agent stage `stage` on its procedure, if the plan follows one.
    pub(super) fn open_procedure(&mut self, stage: &str) {
        self.st.following = self.procedure_for(stage).map(|_| Following::default());
    }

    /// Makes the procedure's next step at agent stage `i`: its next call, or its answer. False
    /// when the model goes on instead (no procedure, every call made and no answer template,
    /// or a step that cannot be made, which stops the procedure).
    pub(super) fn follow_procedure(
        &mut self,
        i: usize,
        arm: &ArmChoice,
        agent: &AgentStage,
    ) -> bool {
        let Some(following) = self.st.following.clone() else {
            return false;
        };
        let Some(procedure) = self.procedure_for(&arm.stage).cloned() else {
            self.st.following = None;
            return false;
        };
        let bindings = Bindings {
            features: &self.task.features,
            input: self.task.input.as_ref(),
            results: &following.results,
        };
        if let Some(call) = procedure.calls.get(following.next) {
            let offered = offered_name(&call.tool);
            let toolset = self.workflow.toolset(&arm.stage, &arm.strategy);
            if toolset.registry_name(&offered) != Some(call.tool.as_str()) {
                let why = format!("`{}` is not one of this variant's tools", call.tool);
                self.stop_procedure(&procedure, following.next, &why);
                return false;
            }
            let arguments = match procedure.args(following.next, &bindings) {
                Ok(args) => args,
                Err(e) => {
                    self.stop_procedure(&procedure, following.next, &e.to_string());
                    return false;
                }
            };
            let call = ToolCall {
                id: format!("sop-{}-{}", self.st.attempt, following.next),
                name: offered,
                arguments,
            };
            self.st
                .conversation
                .push(ChatMessage::assistant(String::new(), vec![call.clone()]));
            self.st.pending_calls = vec![call.clone()];
            self.checkpoint();
            self.agent_call(i, arm, call);
            return true;
        }
        self.st.following = None;
        let answer = match procedure.answer(&bindings) {
            None => return false,
            Some(Err(e)) => {
                self.stop_procedure(&procedure, procedure.calls.len(), &e.to_string());
                return false;
            }
            Some(Ok(answer)) => answer,
        };
        // An answer the checks reject sends the next attempt to the model.
        self.st.procedure_dropped = true;
        let step = Step {
            index: self.st.steps.len() as u32,
            action: "procedure_answer".to_string(),
            llm_output: Some(answer.clone()),
            metadata: [
                ("stage".to_string(), Value::from(arm.stage.clone())),
                ("attempt".to_string(), Value::from(self.st.attempt)),
                ("outcome".to_string(), Value::from("success")),
            ]
            .into_iter()
            .collect(),
            ..Step::default()
        };
        self.st.steps.push(step);
        self.st
            .conversation
            .push(ChatMessage::assistant(answer.clone(), Vec::new()));
        self.answered(i, arm, agent, answer);
        true
    }

    /// A call the procedure made came back: its result is the next step's to use.
    pub(super) fn procedure_called(&mut self, result: &Value) {
        if let Some(f) = self.st.following.as_mut() {
            f.results.push(result.clone());
            f.next += 1;
        }
    }

    /// The call of the procedure of agent stage `stage` in progress failed (`why`): the model
    /// carries on from here, told so.
    pub(super) fn procedure_failed(&mut self, stage: &str, why: &str) {
        let Some(following) = self.st.following.clone() else {
            return;
        };
        if let Some(procedure) = self.procedure_for(stage).cloned() {
            self.stop_procedure(&procedure, following.next, why);
        }
    }

    /// Stops the run's procedure at step `at` for `why`, in words the model reads next.
    fn stop_procedure(&mut self, procedure: &Procedure, at: usize, why: &str) {
        let sop = self
            .st
            .plan
            .as_ref()
            .and_then(|p| p.sop_id.clone())
            .unwrap_or_default();
        let step = match procedure.calls.get(at) {
            Some(call) => format!(
                "step {} of {} ({})",
                at + 1,
                procedure.calls.len(),
                call.tool
            ),
            None => "its answer".to_string(),
        };
        self.st.following = None;
        self.st.procedure_dropped = true;
        self.st.conversation.push(ChatMessage::user(format!(
            "The procedure {sop} stopped at {step}: {why}. Go on with the task yourself; the \
             calls above that succeeded stand."
        )));
    }

    /// Records on the answer step of agent stage `stage` the procedure its calls made, when the
    /// stage passed on the run's first attempt without following one.
    pub(super) fn record_procedure(&mut self, stage: &str, answer: &str) {
        if self.st.attempt != 0 || self.st.plan.as_ref().is_some_and(|p| p.sop_id.is_some()) {
            return;
        }
        let Some(procedure) = made_procedure(&self.st.steps, stage, &self.task, answer) else {
            return;
        };
        let Ok(value) = serde_json::to_value(&procedure) else {
            return;
        };
        if let Some(step) = self.st.steps.last_mut() {
            step.metadata.insert(PROCEDURE_KEY.to_string(), value);
        }
    }
}

/// The procedure of the successful calls of agent stage `stage` in `steps`, answered with
/// `answer`.
fn made_procedure(steps: &[Step], stage: &str, task: &Task, answer: &str) -> Option<Procedure> {
    let calls: Vec<MadeCall<'_>> = steps
        .iter()
        .filter(|s| {
            s.action == "tool_call"
                && s.metadata.get("stage").and_then(Value::as_str) == Some(stage)
                && s.metadata.get("outcome").and_then(Value::as_str) == Some("success")
        })
        .filter_map(|s| {
            Some(MadeCall {
                tool: s.tool_called.as_deref()?,
                args: s.tool_input.as_ref()?,
                result: s.tool_output.as_ref()?,
            })
        })
        .collect();
    if calls.is_empty() {
        return None;
    }
    Procedure::abstracted(stage, &calls, &task.features, task.input.as_ref(), answer)
}

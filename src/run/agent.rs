//! agent: what an agent stage's loop is made of, as data. The model turn the run machine asks
//! for and its outcome, the conversation's opening (the system message built from the agent's
//! instructions, the fenced lessons, the retrieval bundle and this attempt's guidance; the user
//! message from the goal, features, input and earlier outputs), the text a tool's result goes
//! back as, the plan a model declares, and the values of an answer that no tool returned.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::Task;
use crate::model::{ChatMessage, ChatRequest, ModelError, ModelReply, Models, Role, TurnContext};
use crate::tools::Clock;
use crate::tools::ToolError;
use crate::{ErrorClass, FailureCategory};

use super::workflow::{AgentStage, AgentVariant};

/// One model turn the run machine asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTurn {
    /// The model endpoint (a name the interpreter's models know).
    pub model: String,
    /// The request: the conversation so far and the tools offered.
    pub request: ChatRequest,
    /// Where the turn happens.
    pub context: TurnContext,
}

/// What came of a model turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The model's reply, or why there is none.
    pub result: Result<ModelReply, ModelError>,
    /// How long the turn took (0 for a simulated model).
    pub latency_ms: f64,
    /// What it cost.
    pub cost: f64,
}

/// Performs `turn` with the model it names; the latency is the clock's (0 on a virtual clock:
/// a simulated model takes no time), the cost the reply's usage at the endpoint's price.
pub async fn perform(models: &Models, turn: &ModelTurn, clock: &dyn Clock) -> TurnOutcome {
    let Some(model) = models.get(&turn.model) else {
        return TurnOutcome {
            result: Err(ModelError::InvalidInput(format!(
                "no model endpoint is named `{}` (configured: {})",
                turn.model,
                models.names().join(", ")
            ))),
            latency_ms: 0.0,
            cost: 0.0,
        };
    };
    let start = clock.now_ms();
    let result = model.turn(&turn.request, &turn.context).await;
    let cost = match &result {
        Ok(reply) => reply
            .usage
            .map_or(0.0, |u| models.price(&turn.model).cost(&u)),
        Err(_) => 0.0,
    };
    TurnOutcome {
        result,
        latency_ms: clock.now_ms().saturating_sub(start) as f64,
        cost,
    }
}

/// The line prefix with which a model may declare its plan (`Plan: search; fetch; answer`):
/// the subgoals a run that stops early is found to have left undone.
pub const PLAN_PREFIX: &str = "plan:";

/// The system message of an attempt of `agent` with `variant`: the instructions, the variant's
/// instruction variant, what memory and the lessons say (`context`, fenced as retrieved), and
/// this attempt's guidance (a triage hint, the tool manifest, a reflection).
pub fn system_message(
    agent: &AgentStage,
    variant: Option<&AgentVariant>,
    context: Option<&str>,
    guidance: Option<&str>,
) -> String {
    let mut parts = vec![agent.instructions.trim().to_string()];
    if let Some(prompt) = variant.and_then(|v| v.prompt.as_deref()) {
        parts.push(prompt.trim().to_string());
    }
    parts.push(
        "Call the tools you need; answer in words when you are done. You may declare your plan \
         first as one line `Plan: step; step; ...` naming the tools."
            .to_string(),
    );
    if let Some(context) = context.filter(|c| !c.trim().is_empty()) {
        parts.push(context.trim().to_string());
    }
    if let Some(guidance) = guidance.filter(|g| !g.trim().is_empty()) {
        parts.push(format!(
            "<attempt_guidance>\n{}\n</attempt_guidance>",
            guidance.trim()
        ));
    }
    parts.join("\n\n")
}

/// The user message: the goal, the features, the input and the outputs of earlier stages.
pub fn user_message<'a>(
    task: &Task,
    earlier: impl IntoIterator<Item = (&'a str, &'a Value)>,
) -> String {
    let mut out = format!("Goal: {}", task.goal);
    if !task.features.is_empty() {
        let features: Vec<String> = task
            .features
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!("\nFeatures: {}", features.join(", ")));
    }
    if let Some(input) = &task.input {
        out.push_str(&format!("\nInput: {input}"));
    }
    for (stage, output) in earlier {
        out.push_str(&format!("\nOutput of stage {stage}: {output}"));
    }
    out
}

/// The opening of an attempt's conversation.
pub fn opening(system: String, user: String) -> Vec<ChatMessage> {
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

/// What a tool's result says to the model: its output as JSON, or its error.
pub fn tool_message_text(result: &Result<Value, ToolError>) -> String {
    match result {
        Ok(Value::String(s)) => s.clone(),
        Ok(v) => v.to_string(),
        Err(e) => format!("error ({}): {}", e.class, e.message),
    }
}

/// The subgoals a model's text declares on a `Plan:` line, in order.
pub fn declared_plan(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim().trim_start_matches(['-', '*', ' ']);
            let lower = line.to_ascii_lowercase();
            lower
                .starts_with(PLAN_PREFIX)
                .then(|| line[PLAN_PREFIX.len()..].to_string())
        })
        .flat_map(|rest| {
            rest.split([';', ',', '>'])
                .map(|s| {
                    s.trim()
                        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == ')')
                        .trim()
                        .to_string()
                })
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The values of `answer` that look like identifiers or references (a word of letters, digits,
/// `-` and `_` with both a letter and a digit, at least four characters) and appear in no
/// message of `conversation` (tool results, the goal, the input): what the model made up.
pub fn unbacked_values(answer: &str, conversation: &[ChatMessage]) -> Vec<String> {
    let seen: Vec<&str> = conversation
        .iter()
        .filter(|m| m.role != Role::Assistant)
        .map(|m| m.content.as_str())
        .collect();
    let mut out = BTreeSet::new();
    for word in answer.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')) {
        let word = word.trim_matches(['-', '_']);
        let looks_like_value = word.len() >= 4
            && word.chars().any(|c| c.is_ascii_digit())
            && word.chars().any(|c| c.is_ascii_alphabetic());
        if looks_like_value && !seen.iter().any(|text| text.contains(word)) {
            out.insert(word.to_string());
        }
    }
    out.into_iter().collect()
}

/// The class and category of a model turn's failure.
pub fn model_failure(error: &ModelError) -> (ErrorClass, FailureCategory) {
    let class = match error {
        ModelError::Request { class, .. } => *class,
        ModelError::BadResponse { .. } => ErrorClass::DeterministicFailure,
        ModelError::InvalidInput(_) => ErrorClass::SchemaMismatch,
    };
    let category = match class {
        ErrorClass::Timeout | ErrorClass::RateLimit | ErrorClass::TransientNetwork => {
            FailureCategory::Infrastructure
        }
        _ => FailureCategory::Strategy,
    };
    (class, category)
}

/// A turn context for `task`.
pub fn turn_context(
    run_id: &str,
    task: &Task,
    task_index: u64,
    attempt: u32,
    stage: &str,
    turn: u32,
) -> TurnContext {
    TurnContext {
        run_id: run_id.to_string(),
        task_index,
        attempt,
        stage: stage.to_string(),
        turn,
        goal: task.goal.clone(),
        features: task.features.clone(),
        input: task.input.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_plan_is_read_from_its_line() {
        let text = "I will look it up.\nPlan: 1. search_customers; 2. list_invoices\nok";
        assert_eq!(
            declared_plan(text),
            vec!["search_customers".to_string(), "list_invoices".to_string()]
        );
        assert!(declared_plan("no plan here").is_empty());
    }

    #[test]
    fn values_no_tool_returned_are_found() {
        let conversation = vec![
            ChatMessage::user("Goal: find the invoice of c17@example.com"),
            ChatMessage::tool("call_0", r#"{"id":"cus_17","total":"120.50"}"#),
        ];
        let answer = "Customer cus_17 (c17) owes 120.50 under ref-4821.";
        assert_eq!(unbacked_values(answer, &conversation), vec!["ref-4821"]);
        assert!(unbacked_values("cus_17 owes 120.50", &conversation).is_empty());
    }
}

//! The run machine's agent stages without actors: a scripted model and scripted tools answer
//! its commands, and the tests read what the model was sent and how the run ended.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Value, json};

use super::tests::{Named, reward};
use super::*;
use crate::model::{ChatRequest, ModelError, ModelReply, Role, ToolCall, Usage};
use crate::tools::{ToolError, ToolRegistry, ToolSpec};
use crate::{ArmChoice, ErrorClass, FailureType, RunState, Task};

/// One agent stage, `answer`, with one variant on model `m` offering `crm.lookup`
/// (idempotent, an MCP-style dotted name) and `charge` (not idempotent).
fn workflow(variants: &[&str]) -> Arc<Workflow> {
    workflow_with(variants, |_| {})
}

/// [`workflow`] with its agent stage changed by `edit`.
fn workflow_with(variants: &[&str], edit: impl FnOnce(&mut AgentStage)) -> Arc<Workflow> {
    let mut registry = ToolRegistry::new();
    for (name, idempotent) in [("crm.lookup", true), ("charge", false), ("other", true)] {
        let mut spec = ToolSpec::new(name, format!("the {name} tool"));
        spec.idempotent = idempotent;
        registry.register(Arc::new(Named(spec))).unwrap();
    }
    let mut agent = AgentStage {
        description: "answers billing questions".into(),
        instructions: "You are the billing agent.".into(),
        variants: variants
            .iter()
            .map(|name| AgentVariant {
                name: name.to_string(),
                model: "m".into(),
                prompt: Some(format!("Variant {name}.")),
                tools: vec!["crm/*".into(), "charge".into()],
                temperature: Some(0.0),
            })
            .collect(),
        max_turns: 6,
        answer_schema: None,
        max_turn_tokens: Some(256),
        max_tokens: None,
        max_cost: None,
        max_wall_ms: None,
    };
    edit(&mut agent);
    let check: workflow::OutputCheck = Arc::new(|_, _, _| Ok(()));
    let stages = vec![WorkflowStage::agent("answer", agent)];
    Arc::new(Workflow::new("agent-test", stages, &registry, check, reward()).unwrap())
}

fn task() -> Arc<Task> {
    Arc::new(Task {
        task_id: "t#1".into(),
        goal: "Find what customer c17 owes".into(),
        input: Some(json!({"email": "c17@example.com"})),
        ..Task::default()
    })
}

fn rules(policy: Option<&str>) -> Arc<RunRules> {
    let mut rules = RunRules::default();
    if let Some(text) = policy {
        rules.triage = Arc::new(TriageSetup::parse(text, "test.toml").unwrap());
    }
    Arc::new(rules.for_workflow(&workflow(&["v1"])))
}

fn plan(variant: &str) -> PlanChoice {
    PlanChoice::new(
        vec![ArmChoice {
            stage: "answer".into(),
            tool: "m".into(),
            strategy: variant.into(),
            propensity: 1.0,
        }],
        None,
        true,
    )
}

fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args,
    }
}

fn reply(content: &str, calls: Vec<ToolCall>) -> Result<ModelReply, ModelError> {
    Ok(ModelReply {
        content: content.into(),
        tool_calls: calls,
        usage: Some(Usage {
            prompt_tokens: 100,
            completion_tokens: 10,
        }),
    })
}

/// A call that took 1 ms and came to `result`.
fn outcome(result: Result<Value, ToolError>) -> CallOutcome {
    CallOutcome {
        result,
        latency_ms: 1.0,
        cost: 0.0,
        own_latency_ms: 1.0,
        own_cost: 0.0,
        calls: 1,
        error_classes: Vec::new(),
        infra_errors: 0,
        replayed: false,
    }
}

/// What a scripted run saw.
struct Seen {
    requests: Vec<ChatRequest>,
    calls: Vec<StageCall>,
    finished: Finished,
}

/// Drives `m` to its end: the model answers with `model(attempt, turn, request)`, a tool with
/// `tool(call)`, the lessons of `context` come with the preparation, ReflectRetry accepts.
fn drive(
    m: RunMachine,
    context: Option<&str>,
    model: impl FnMut(u32, u32, &ChatRequest) -> Result<ModelReply, ModelError>,
    tool: impl FnMut(&StageCall) -> Result<Value, ToolError>,
) -> Seen {
    drive_reviewed(m, context, model, tool, |_| Verdict::Accept)
}

/// As [`drive`], ReflectRetry judging each round with `review`.
fn drive_reviewed(
    m: RunMachine,
    context: Option<&str>,
    model: impl FnMut(u32, u32, &ChatRequest) -> Result<ModelReply, ModelError>,
    tool: impl FnMut(&StageCall) -> Result<Value, ToolError>,
    review: impl FnMut(&RunReport) -> Verdict,
) -> Seen {
    drive_planned(m, context, None, model, tool, review)
}

/// As [`drive_reviewed`], the first plan being `first` when given.
fn drive_planned(
    mut m: RunMachine,
    context: Option<&str>,
    mut first: Option<PlanChoice>,
    mut model: impl FnMut(u32, u32, &ChatRequest) -> Result<ModelReply, ModelError>,
    mut tool: impl FnMut(&StageCall) -> Result<Value, ToolError>,
    mut review: impl FnMut(&RunReport) -> Verdict,
) -> Seen {
    let (mut requests, mut calls) = (Vec::new(), Vec::new());
    for _ in 0..500 {
        let Some(command) = m.poll() else {
            panic!("the machine stalled");
        };
        // A model turn and an idempotent call may go on before the writes ahead of them are on
        // disk; the non-idempotent `charge` waits for the checkpoint that marks it in flight.
        let ahead = m.may_run_ahead(&command);
        let event = match command {
            Command::Prepare => Event::Prepared {
                citations: Vec::new(),
                guidance: context.map(str::to_string),
                forced: None,
            },
            Command::Choose { exclude, .. } => {
                let taken = |v: &str| exclude.iter().any(|(_, _, s)| s == v);
                let variant = ["v1", "v2"].into_iter().find(|v| !taken(v)).unwrap();
                Event::Planned(Ok(first.take().unwrap_or_else(|| plan(variant))))
            }
            Command::Transition { next, .. } => Event::Transitioned(next),
            Command::Checkpoint | Command::Notify(_) | Command::LearnFirstAttempt(_) => continue,
            Command::Turn(turn) => {
                assert!(ahead);
                let result = model(turn.context.attempt, turn.context.turn, &turn.request);
                requests.push(turn.request.clone());
                Event::Turned {
                    outcome: TurnOutcome {
                        result,
                        latency_ms: 0.0,
                        cost: 0.0,
                    },
                    at_ms: 0,
                }
            }
            Command::Call(c) => {
                assert_eq!(ahead, c.tool != "charge", "{}", c.tool);
                let result = tool(&c);
                calls.push(*c);
                Event::Called {
                    outcome: outcome(result),
                    at_ms: 0,
                }
            }
            Command::Validate(outputs) => {
                Event::Validated(outputs.into_iter().map(|(s, _)| (s, Ok(()))).collect())
            }
            Command::LoadCheckpoint(_) => Event::CheckpointLoaded(None),
            Command::Review(report) => Event::Reviewed {
                reflect_retry: review(&report),
                plugins: Vec::new(),
                at_ms: 0,
            },
            Command::Finish(finished) => {
                return Seen {
                    requests,
                    calls,
                    finished: *finished,
                };
            }
        };
        m.handle(event).unwrap();
    }
    panic!("the run did not end in 500 commands");
}

fn machine(variants: &[&str], policy: Option<&str>) -> RunMachine {
    RunMachine::new("run-t#1", task(), workflow(variants), rules(policy))
}

/// A model that looks the customer up by the input's email, then answers `answer`.
fn looks_up_then_answers(
    answer: &'static str,
) -> impl FnMut(u32, u32, &ChatRequest) -> Result<ModelReply, ModelError> {
    move |_, turn, _| match turn {
        0 => reply(
            "",
            vec![call(
                "c0",
                "crm_lookup",
                json!({"email": "c17@example.com"}),
            )],
        ),
        _ => reply(answer, vec![]),
    }
}

/// A model that looks a new customer up every turn and never answers; `turns` counts its turns.
fn looks_up_forever(
    turns: Rc<Cell<u32>>,
) -> impl FnMut(u32, u32, &ChatRequest) -> Result<ModelReply, ModelError> {
    move |_, _, _| {
        turns.set(turns.get() + 1);
        reply(
            "",
            vec![call(
                "c",
                "crm_lookup",
                json!({"email": turns.get().to_string()}),
            )],
        )
    }
}

fn lookup_ok(_: &StageCall) -> Result<Value, ToolError> {
    Ok(json!({"id": "cus_17", "owes": "120.50"}))
}

fn system(request: &ChatRequest) -> &str {
    &request.messages[0].content
}

fn failures(seen: &Seen) -> Vec<FailureType> {
    seen.finished
        .outcome
        .recoveries
        .iter()
        .map(|r| r.failure)
        .collect()
}

#[test]
fn a_model_calls_tools_and_its_answer_is_the_stages_output() {
    let seen = drive(
        machine(&["v1"], None),
        Some("<strategy_context>\n- crm.lookup: search by email\n</strategy_context>"),
        |_, turn, request| match turn {
            0 => reply(
                "Plan: crm_lookup",
                vec![call(
                    "c0",
                    "crm_lookup",
                    json!({"email": "c17@example.com"}),
                )],
            ),
            _ => {
                assert_eq!(request.messages.last().unwrap().role, Role::Tool);
                reply("Customer cus_17 owes 120.50", vec![])
            }
        },
        lookup_ok,
    );
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    assert_eq!(
        out.output,
        Some(json!({"answer": {"answer": "Customer cus_17 owes 120.50"}}))
    );
    // The model saw the instructions, the variant, the lessons, the goal and the input; the
    // tools were offered under names a server accepts, and called by their registry names.
    let first = &seen.requests[0];
    assert_eq!(first.max_tokens, Some(256));
    assert!(system(first).starts_with("You are the billing agent.\n\nVariant v1."));
    assert!(system(first).contains("<strategy_context>"));
    assert!(
        first.messages[1]
            .content
            .contains("Goal: Find what customer c17 owes")
    );
    assert!(first.messages[1].content.contains("c17@example.com"));
    let offered: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(offered, vec!["crm_lookup", "charge"]);
    assert_eq!(seen.calls[0].tool, "crm.lookup");
    assert_eq!(seen.calls[0].idempotency_key, "run-t#1/a0/answer/t1/c0");
    // Two model turns, one tool call, tokens counted.
    let steps = &seen.finished.experience.steps;
    let actions: Vec<&str> = steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(
        actions,
        vec!["model_turn", "subgoal", "tool_call", "model_turn"]
    );
}

#[test]
fn a_tool_not_offered_is_a_wrong_tool_and_the_next_attempt_reads_the_manifest() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        |attempt, turn, _| match (attempt, turn) {
            (0, _) => reply("", vec![call("c0", "delete_everything", json!({}))]),
            (_, 0) => reply(
                "",
                vec![call(
                    "c0",
                    "crm_lookup",
                    json!({"email": "c17@example.com"}),
                )],
            ),
            _ => reply("cus_17 owes 120.50", vec![]),
        },
        lookup_ok,
    );
    assert_eq!(failures(&seen), vec![FailureType::WrongToolCalled]);
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
    let second = &seen.requests[1];
    assert!(
        system(second).contains("The tools you may call:\n- crm_lookup: the crm.lookup tool"),
        "{}",
        system(second)
    );
    assert!(system(second).contains("delete_everything"));
}

#[test]
fn the_same_call_again_and_again_is_a_loop() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        |attempt, turn, _| match (attempt, turn) {
            (0, _) | (_, 0) => reply(
                "",
                vec![call("c", "crm_lookup", json!({"email": "c17@example.com"}))],
            ),
            _ => reply("cus_17 owes 120.50", vec![]),
        },
        lookup_ok,
    );
    assert_eq!(failures(&seen), vec![FailureType::LoopDetected]);
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
    // The loop's words reach the model in its next attempt.
    let next = system(&seen.requests[3]);
    assert!(
        next.contains("What went wrong: 3 identical calls of crm.lookup"),
        "{next}"
    );
}

#[test]
fn an_answer_citing_a_value_no_tool_returned_is_hallucinated_state() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        |attempt, turn, _| match (attempt, turn) {
            (_, 0) => reply(
                "",
                vec![call(
                    "c0",
                    "crm_lookup",
                    json!({"email": "c17@example.com"}),
                )],
            ),
            (0, _) => reply("cus_17 owes 120.50, see ref-4821", vec![]),
            _ => reply("cus_17 owes 120.50", vec![]),
        },
        lookup_ok,
    );
    assert_eq!(failures(&seen), vec![FailureType::HallucinatedState]);
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
    assert!(system(seen.requests.last().unwrap()).contains("ref-4821"));
}

#[test]
fn a_context_length_error_is_context_overflow() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        |attempt, _, _| match attempt {
            0 => Err(ModelError::Request {
                url: "http://model/v1".into(),
                message: "HTTP 400: context length exceeded: 9120 tokens > 8000".into(),
                class: ErrorClass::ToolNotFit,
            }),
            _ => reply("nothing to look up", vec![]),
        },
        lookup_ok,
    );
    assert_eq!(failures(&seen), vec![FailureType::ContextOverflow]);
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
}

#[test]
fn a_declared_plan_left_undone_resumes_from_its_subgoal_with_the_finished_calls_kept() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        |_, turn, request| match turn {
            0 => reply(
                "Plan: crm_lookup; charge",
                vec![call(
                    "c0",
                    "crm_lookup",
                    json!({"email": "c17@example.com"}),
                )],
            ),
            1 => reply("cus_17 owes 120.50", vec![]),
            2 => {
                // The same conversation goes on, with the subgoal to resume from.
                let last = request.messages.last().unwrap();
                assert_eq!(last.role, Role::User);
                assert!(last.content.contains("Resume from the subgoal `charge`"));
                reply("", vec![call("c1", "charge", json!({"amount": 120.5}))])
            }
            _ => reply("cus_17 paid 120.50", vec![]),
        },
        |c| match c.tool.as_str() {
            "charge" => Ok(json!({"charged": true})),
            _ => lookup_ok(c),
        },
    );
    assert_eq!(failures(&seen), vec![FailureType::PlanIncomplete]);
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
    // The lookup was not made again.
    let tools: Vec<&str> = seen.calls.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(tools, vec!["crm.lookup", "charge"]);
}

#[test]
fn a_constraint_broken_by_the_answer_is_constraint_ignored() {
    let policy = format!(
        "{}\n",
        TREE_POLICY.replace(
            "[classifier]\n",
            "[classifier]\nconstraints = [\"(?i)card number\"]\n"
        )
    );
    let seen = drive(
        machine(&["v1", "v2"], Some(&policy)),
        None,
        |attempt, _, _| match attempt {
            0 => reply("The card number on file is 4111", vec![]),
            _ => reply("The balance is settled", vec![]),
        },
        lookup_ok,
    );
    assert_eq!(failures(&seen), vec![FailureType::ConstraintIgnored]);
    // A replan takes the other variant.
    let out = &seen.finished.outcome;
    assert_eq!(out.final_arms[0].strategy, "v2");
    assert_eq!(out.state, RunState::Succeeded);
}

#[test]
fn a_reflection_is_the_next_rounds_guidance_and_reflect_retry_sees_the_agents_events() {
    let mut reports = Vec::new();
    let seen = drive_reviewed(
        machine(&["v1"], None),
        None,
        looks_up_then_answers("cus_17 owes 120.50"),
        lookup_ok,
        |report| {
            reports.push(report.clone());
            match report.round {
                1 => Verdict::Retry {
                    attempt: 1,
                    reflection: "[Reflect & Retry - Attempt 1/2] state the currency".into(),
                },
                _ => Verdict::Accept,
            }
        },
    );
    assert_eq!(seen.finished.outcome.reflect_retries, 1);
    // ReflectRetry saw the tool call the model made.
    assert!(
        reports[0]
            .events
            .iter()
            .any(|e| matches!(e, RunEvent::StepSucceeded { tool, .. } if tool == "crm.lookup"))
    );
    let second_round = seen
        .requests
        .iter()
        .find(|r| system(r).contains("<attempt_guidance>"))
        .expect("a request of the second round");
    assert!(system(second_round).contains("state the currency"));
}

#[test]
fn a_turn_budget_spent_fails_the_attempt() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        looks_up_forever(Rc::default()),
        lookup_ok,
    );
    let out = &seen.finished.outcome;
    assert_ne!(out.state, RunState::Succeeded);
    let reason = out.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("spent its budget of 6 model turns"),
        "{reason}"
    );
}

#[test]
fn a_run_that_spent_its_token_budget_is_aborted_without_another_attempt() {
    // Each turn uses 110 tokens; the budget of 300 is spent after the third.
    let flow = workflow_with(&["v1"], |a| a.max_tokens = Some(300));
    let m = RunMachine::new("run-t#1", task(), flow, rules(None));
    let turns = Rc::new(Cell::new(0));
    let seen = drive(m, None, looks_up_forever(turns.clone()), lookup_ok);
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Aborted);
    assert_eq!(turns.get(), 3);
    assert_eq!(out.attempts, 1);
    assert!(out.recoveries.is_empty());
    let reason = out.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("spent its budget of 300 tokens (330 used)"),
        "{reason}"
    );
}

#[test]
fn a_run_that_spent_its_time_budget_is_aborted() {
    // Each call takes 1 ms; the budget of 2 ms is spent after the second.
    let flow = workflow_with(&["v1"], |a| a.max_wall_ms = Some(2));
    let m = RunMachine::new("run-t#1", task(), flow, rules(None));
    let turns = Rc::new(Cell::new(0));
    let seen = drive(m, None, looks_up_forever(turns.clone()), lookup_ok);
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Aborted);
    assert_eq!((turns.get(), seen.calls.len()), (2, 2));
    let reason = out.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("budget of 2 ms"), "{reason}");
}

#[tokio::test]
async fn a_turns_cost_is_its_tokens_at_the_endpoints_price() {
    struct Counted;
    impl crate::model::LanguageModel for Counted {
        fn name(&self) -> &str {
            "counted"
        }
        fn complete<'a>(&'a self, _: &'a ChatRequest) -> crate::model::ModelFuture<'a, String> {
            Box::pin(std::future::ready(Ok(String::new())))
        }
        fn turn<'a>(
            &'a self,
            _: &'a ChatRequest,
            _: &'a crate::model::TurnContext,
        ) -> crate::model::ModelFuture<'a, ModelReply> {
            Box::pin(std::future::ready(reply("done", vec![])))
        }
    }
    let mut models = crate::model::Models::new();
    models.insert("m", Arc::new(Counted));
    let turn = ModelTurn {
        model: "m".into(),
        request: ChatRequest::default(),
        context: crate::model::TurnContext::default(),
    };
    let clock = crate::tools::VirtualClock::new();
    // Free unless priced.
    assert_eq!(
        super::agent::perform(&models, &turn, &clock).await.cost,
        0.0
    );
    models.set_price(
        "m",
        crate::model::Price {
            prompt_per_1k: 2.0,
            completion_per_1k: 10.0,
        },
    );
    // 100 prompt tokens at 2 per 1k and 10 generated at 10 per 1k.
    let cost = super::agent::perform(&models, &turn, &clock).await.cost;
    assert!((cost - 0.3).abs() < 1e-12, "{cost}");
}

/// Runs `m` until it asks for something `stop` matches; returns that command.
fn until(m: &mut RunMachine, stop: impl Fn(&Command) -> bool) -> Command {
    loop {
        let command = m.poll().expect("a command");
        if stop(&command) {
            return command;
        }
        let event = match command {
            Command::Prepare => Event::Prepared {
                citations: Vec::new(),
                guidance: None,
                forced: None,
            },
            Command::Choose { .. } => Event::Planned(Ok(plan("v1"))),
            Command::Transition { next, .. } => Event::Transitioned(next),
            Command::Checkpoint | Command::Notify(_) | Command::LearnFirstAttempt(_) => continue,
            Command::Turn(turn) => Event::Turned {
                outcome: TurnOutcome {
                    result: match turn.context.turn {
                        0 => reply("", vec![call("c0", "crm_lookup", json!({"email": "x1"}))]),
                        _ => reply("", vec![call("c1", "charge", json!({"amount": 1}))]),
                    },
                    latency_ms: 0.0,
                    cost: 0.0,
                },
                at_ms: 0,
            },
            Command::Call(c) => Event::Called {
                outcome: outcome(lookup_ok(&c)),
                at_ms: 0,
            },
            other => panic!("unexpected {other:?}"),
        };
        m.handle(event).unwrap();
    }
}

fn resumed(m: &RunMachine) -> RunMachine {
    let cp = RunMachine::checkpoint_of("run-t#1", m.progress(), 0).unwrap();
    RunMachine::resume("run-t#1", task(), workflow(&["v1"]), rules(None), cp).unwrap()
}

#[test]
fn after_a_crash_mid_loop_a_turn_is_asked_again_a_done_call_is_not_repeated_and_one_in_doubt_is_escalated()
 {
    // A crash while the model's second turn is in flight: the resumed run asks for that turn
    // again, with the first call's result in the conversation (not made again).
    let mut m = machine(&["v1"], None);
    until(
        &mut m,
        |c| matches!(c, Command::Turn(t) if t.context.turn == 1),
    );
    let mut again = resumed(&m);
    let Command::Turn(turn) = until(&mut again, |c| {
        matches!(c, Command::Turn(_) | Command::Call(_))
    }) else {
        panic!("the resumed run did not ask the model again");
    };
    assert_eq!(turn.context.turn, 1);
    assert_eq!(turn.request.messages.last().unwrap().role, Role::Tool);

    // A crash while the non-idempotent `charge` is in flight: in doubt, escalated, not made.
    let mut m = machine(&["v1"], None);
    until(
        &mut m,
        |c| matches!(c, Command::Call(c) if c.tool == "charge"),
    );
    let mut again = resumed(&m);
    let first = until(&mut again, |c| {
        matches!(
            c,
            Command::Call(_) | Command::Finish(_) | Command::Review(_)
        )
    });
    assert!(
        matches!(first, Command::Review(_)),
        "the in-doubt call was not escalated: {first:?}"
    );
}

/// The procedure the model of [`a_model_calls_tools_and_its_answer_is_the_stages_output`]
/// makes: a lookup by the input's email, then the answer from its result.
fn procedure(answer: bool) -> crate::learn::procedure::Procedure {
    let args = json!({"email": "c17@example.com"});
    let result = json!({"id": "cus_17", "owes": "120.50"});
    let calls = [crate::learn::procedure::MadeCall {
        tool: "crm.lookup",
        args: &args,
        result: &result,
    }];
    let mut p = crate::learn::procedure::Procedure::abstracted(
        "answer",
        &calls,
        &task().features,
        task().input.as_ref(),
        "Customer cus_17 owes 120.50",
    )
    .unwrap();
    if !answer {
        p.answer = None;
    }
    p
}

fn sop_plan(answer: bool) -> PlanChoice {
    let mut plan = plan("v1");
    plan.sop_id = Some("sop-x".into());
    plan.plan_id = crate::run::sop_plan_id("sop-x", 1);
    plan.procedure = vec![procedure(answer)];
    plan
}

#[test]
fn a_passed_stage_records_the_procedure_its_calls_make() {
    let seen = drive(
        machine(&["v1"], None),
        None,
        looks_up_then_answers("Customer cus_17 owes 120.50"),
        lookup_ok,
    );
    let recorded = crate::learn::planner::procedures_of(&seen.finished.experience);
    assert_eq!(recorded, vec![procedure(true)]);
    assert_eq!(
        recorded[0].calls_key(),
        "answer:crm.lookup(email={input.email})"
    );
}

#[test]
fn a_procedure_runs_its_calls_and_answers_without_the_model() {
    let seen = drive_planned(
        machine(&["v1"], None),
        None,
        Some(sop_plan(true)),
        |_, _, _| panic!("the model is not asked"),
        lookup_ok,
        |_| Verdict::Accept,
    );
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    assert_eq!(
        out.output,
        Some(json!({"answer": {"answer": "Customer cus_17 owes 120.50"}}))
    );
    assert_eq!(seen.calls.len(), 1);
    assert_eq!(seen.calls[0].tool, "crm.lookup");
    assert_eq!(seen.calls[0].args, json!({"email": "c17@example.com"}));
    assert!(seen.requests.is_empty());
    // A run through a procedure proposes none of its own.
    assert!(crate::learn::planner::procedures_of(&seen.finished.experience).is_empty());
}

#[test]
fn a_procedure_without_an_answer_asks_the_model_once_after_its_calls() {
    let seen = drive_planned(
        machine(&["v1"], None),
        None,
        Some(sop_plan(false)),
        |_, turn, request| {
            assert_eq!(turn, 0, "one turn");
            // The model sees the procedure's call and its result as its own.
            let n = request.messages.len();
            assert_eq!(request.messages[n - 2].tool_calls[0].name, "crm_lookup");
            assert_eq!(request.messages[n - 1].role, Role::Tool);
            reply("Customer cus_17 owes 120.50", vec![])
        },
        lookup_ok,
        |_| Verdict::Accept,
    );
    assert_eq!(seen.finished.outcome.state, RunState::Succeeded);
    assert_eq!(seen.requests.len(), 1);
}

#[test]
fn a_failing_procedure_step_hands_the_stage_to_the_model_with_the_failure_in_words() {
    let mut calls = 0;
    let seen = drive_planned(
        machine(&["v1"], None),
        None,
        Some(sop_plan(true)),
        |_, turn, request| {
            if turn == 0 {
                let said = &request.messages.last().unwrap().content;
                assert!(
                    said.contains("The procedure sop-x stopped at step 1 of 1 (crm.lookup)")
                        && said.contains("no customer with that email"),
                    "{said}"
                );
                return reply(
                    "",
                    vec![call(
                        "c0",
                        "crm_lookup",
                        json!({"email": "C17@example.com"}),
                    )],
                );
            }
            reply("Customer cus_17 owes 120.50", vec![])
        },
        |_| {
            calls += 1;
            if calls == 1 {
                Err(ToolError::new(
                    ErrorClass::SchemaMismatch,
                    crate::FailureCategory::Strategy,
                    "no customer with that email",
                ))
            } else {
                Ok(json!({"id": "cus_17", "owes": "120.50"}))
            }
        },
        |_| Verdict::Accept,
    );
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    assert_eq!(seen.requests.len(), 2);
    assert_eq!(seen.calls.len(), 2);
}

#[test]
fn a_procedures_calls_feed_each_other_under_keys_of_their_own() {
    let (a1, r1) = (json!({"email": "c17@example.com"}), json!({"id": "cus_17"}));
    let (a2, r2) = (json!({"customer": "cus_17"}), json!({"owes": "120.50"}));
    let calls = [
        crate::learn::procedure::MadeCall {
            tool: "crm.lookup",
            args: &a1,
            result: &r1,
        },
        crate::learn::procedure::MadeCall {
            tool: "charge",
            args: &a2,
            result: &r2,
        },
    ];
    let p = crate::learn::procedure::Procedure::abstracted(
        "answer",
        &calls,
        &task().features,
        task().input.as_ref(),
        "cus_17 owes 120.50",
    )
    .unwrap();
    let mut plan = sop_plan(true);
    plan.procedure = vec![p];
    let seen = drive_planned(
        machine(&["v1"], None),
        None,
        Some(plan),
        |_, _, _| panic!("the model is not asked"),
        |c| match c.tool.as_str() {
            "crm.lookup" => Ok(json!({"id": "cus_99"})),
            _ => Ok(json!({"owes": "7"})),
        },
        |_| Verdict::Accept,
    );
    let out = &seen.finished.outcome;
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    assert_eq!(seen.calls[1].args, json!({"customer": "cus_99"}));
    assert_eq!(
        out.output,
        Some(json!({"answer": {"answer": "cus_99 owes 7"}}))
    );
    let keys: Vec<&str> = seen
        .calls
        .iter()
        .map(|c| c.idempotency_key.as_str())
        .collect();
    assert_eq!(keys, ["run-t#1/a0/answer/p0", "run-t#1/a0/answer/p1"]);
}

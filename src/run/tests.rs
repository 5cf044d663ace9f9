//! The run machine without actors: scripted answers, and the commands it gives back.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::tools::sim::RewardConfig;
use crate::tools::{CallContext, Tool, ToolError, ToolFuture, ToolRegistry, ToolSpec};
use crate::{ArmChoice, Checkpoint, ErrorClass, FailureCategory, RunState, Step, Task};

/// A tool the machine never calls (the tests answer for it).
pub(super) struct Named(pub(super) ToolSpec);

impl Tool for Named {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn call<'a>(&'a self, _args: Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async {
            Ok(crate::tools::ToolOutput {
                value: Value::Null,
                latency_ms: 0.0,
                cost: 0.0,
            })
        })
    }
}

/// The reward of the test workflows.
pub(super) fn reward() -> RewardConfig {
    RewardConfig {
        success: 1.0,
        latency: 0.1,
        cost: 0.1,
        max_cost: 1.0,
        sla_ms: 1000.0,
    }
}

/// Two stages: `fetch` (idempotent `search`, or `scrape`) then `write` (non-idempotent
/// `post`); an output passes when it is not `"bad"`.
fn workflow() -> Arc<Workflow> {
    let mut registry = ToolRegistry::new();
    for (name, idempotent) in [("search", true), ("scrape", true), ("post", false)] {
        let mut spec = ToolSpec::new(name, "a test tool");
        spec.idempotent = idempotent;
        registry.register(Arc::new(Named(spec))).unwrap();
    }
    let arm = |tool: &str| WorkflowArm {
        tool: tool.to_string(),
        strategy: "plain".to_string(),
        params: Default::default(),
    };
    let stages = vec![
        WorkflowStage::tools("fetch", vec![arm("search"), arm("scrape")]),
        WorkflowStage::tools("write", vec![arm("post")]),
    ];
    let check: workflow::OutputCheck = Arc::new(|_, _, output| {
        if output == &json!("bad") {
            Err("the output is bad".to_string())
        } else {
            Ok(())
        }
    });
    Arc::new(Workflow::new("test", stages, &registry, check, reward()).unwrap())
}

fn task() -> Arc<Task> {
    Arc::new(Task {
        task_id: "t#1".into(),
        goal: "fetch and write".into(),
        ..Task::default()
    })
}

fn plan(first: &str) -> PlanChoice {
    let arm = |stage: &str, tool: &str| ArmChoice {
        stage: stage.into(),
        tool: tool.into(),
        strategy: "plain".into(),
        propensity: 0.5,
    };
    PlanChoice::new(vec![arm("fetch", first), arm("write", "post")], None, true)
}

fn machine() -> RunMachine {
    RunMachine::new(
        "run-t#1",
        task(),
        workflow(),
        Arc::new(RunRules::default().for_workflow(&workflow())),
    )
}

fn ok(value: Value) -> CallOutcome {
    CallOutcome {
        result: Ok(value),
        latency_ms: 10.0,
        cost: 0.01,
        own_latency_ms: 10.0,
        own_cost: 0.01,
        calls: 1,
        error_classes: Vec::new(),
        infra_errors: 0,
        replayed: false,
    }
}

fn failed(class: ErrorClass, category: FailureCategory) -> CallOutcome {
    CallOutcome {
        result: Err(ToolError {
            class,
            category,
            message: format!("{class}"),
            retry_after_ms: None,
            latency_ms: 5.0,
            cost: 0.0,
        }),
        error_classes: vec![class],
        ..ok(Value::Null)
    }
}

/// Performs the commands that need no answer, and returns the first one that does.
fn next(m: &mut RunMachine, seen: &mut Vec<Command>) -> Command {
    loop {
        let c = m.poll().expect("the machine has a command");
        match c {
            Command::Checkpoint | Command::Notify(_) | Command::LearnFirstAttempt(_) => {
                seen.push(c)
            }
            c => return c,
        }
    }
}

/// Answers transitions as the orchestrator would, until a command of another kind.
fn through_transitions(m: &mut RunMachine, seen: &mut Vec<Command>) -> Command {
    loop {
        match next(m, seen) {
            Command::Transition { next, .. } => m.handle(Event::Transitioned(next)).unwrap(),
            c => return c,
        }
    }
}

fn reviewed(verdict: Verdict) -> Event {
    Event::Reviewed {
        reflect_retry: verdict,
        plugins: Vec::new(),
        at_ms: 7,
    }
}

fn prepared() -> Event {
    Event::Prepared {
        citations: vec!["lesson:1".into()],
        guidance: Some("from memory".into()),
        forced: None,
    }
}

/// A new run, prepared and given the plan `search` then `post`.
fn planned() -> (RunMachine, Vec<Command>) {
    let mut m = machine();
    let mut seen = Vec::new();
    m.poll();
    m.handle(prepared()).unwrap();
    next(&mut m, &mut seen);
    m.handle(Event::Planned(Ok(plan("search")))).unwrap();
    (m, seen)
}

#[test]
fn a_checkpoint_leaves_out_what_a_resumed_run_prepares_again() {
    let (mut m, mut seen) = planned();
    through_transitions(&mut m, &mut seen);
    assert_eq!(m.progress().context.as_deref(), Some("from memory"));
    let cp = RunMachine::checkpoint_of("run-t#1", m.progress(), 2).unwrap();
    let state = cp.state.as_object().unwrap();
    assert!(
        !state.contains_key("context") && !state.contains_key("citations"),
        "the checkpoint carries neither: {state:?}"
    );
    // The resumed run has them from its preparation, which it asks for first.
    let mut m = RunMachine::resume(
        "run-t#1",
        task(),
        workflow(),
        Arc::new(RunRules::default().for_workflow(&workflow())),
        cp,
    )
    .unwrap();
    assert_eq!(m.progress().context, None);
    assert_eq!(m.poll(), Some(Command::Prepare));
    m.handle(Event::Prepared {
        citations: vec!["lesson:2".into()],
        guidance: Some("memory now".into()),
        forced: None,
    })
    .unwrap();
    assert_eq!(m.progress().context.as_deref(), Some("memory now"));
    assert_eq!(m.progress().citations, vec!["lesson:2".to_string()]);
    // A checkpoint written before this change, with both, still reads back.
    let mut old = RunMachine::checkpoint_of("run-t#1", m.progress(), 3).unwrap();
    let state = old.state.as_object_mut().unwrap();
    state.insert("context".into(), json!("then"));
    state.insert("citations".into(), json!(["lesson:1"]));
    assert!(
        RunMachine::resume(
            "run-t#1",
            task(),
            workflow(),
            Arc::new(RunRules::default()),
            old
        )
        .is_ok()
    );
}

#[test]
fn a_clean_run_plans_calls_validates_is_reviewed_and_ends() {
    let mut m = machine();
    let mut seen = Vec::new();
    assert_eq!(m.poll(), Some(Command::Prepare));
    assert_eq!(m.poll(), None, "it waits for the preparation");
    m.handle(prepared()).unwrap();
    assert!(matches!(
        next(&mut m, &mut seen),
        Command::Choose { base: None, .. }
    ));
    m.handle(Event::Planned(Ok(plan("search")))).unwrap();
    let Command::Transition {
        from,
        next: to,
        patch,
        then,
        checkpoint,
    } = next(&mut m, &mut seen)
    else {
        panic!("a transition to planned")
    };
    assert_eq!((from, to), (RunState::Received, RunState::Planned));
    // On to executing in the same write; a performer that records only planned is asked for
    // executing next (below).
    assert_eq!(then, Some(RunState::Executing));
    // The first call (a search) is idempotent: nothing to checkpoint with the transition.
    assert!(!checkpoint);
    assert_eq!(patch.plan_id.as_deref(), Some("search/plain+post/plain"));
    m.handle(Event::Transitioned(to)).unwrap();
    let Command::Call(call) = through_transitions(&mut m, &mut seen) else {
        panic!("the first call")
    };
    assert_eq!(
        (call.stage.as_str(), call.tool.as_str()),
        ("fetch", "search")
    );
    assert_eq!(call.args["strategy"], "plain");
    m.handle(Event::Called {
        outcome: ok(json!("page")),
        at_ms: 1,
    })
    .unwrap();
    let Command::Call(call) = through_transitions(&mut m, &mut seen) else {
        panic!("the second call")
    };
    assert_eq!(call.tool, "post");
    // The non-idempotent call was checkpointed as in flight before it was asked for.
    assert_eq!(
        seen.last(),
        Some(&Command::Checkpoint),
        "a checkpoint before the non-idempotent call"
    );
    assert_eq!(m.progress().in_flight, Some(1));
    m.handle(Event::Called {
        outcome: ok(json!("posted")),
        at_ms: 2,
    })
    .unwrap();
    let Command::Validate(outputs) = through_transitions(&mut m, &mut seen) else {
        panic!("the validation")
    };
    assert_eq!(outputs.len(), 2);
    m.handle(Event::Validated(
        outputs.into_iter().map(|(s, _)| (s, Ok(()))).collect(),
    ))
    .unwrap();
    let Command::Review(report) = next(&mut m, &mut seen) else {
        panic!("the review")
    };
    assert!(report.passed);
    assert_eq!(report.round, 1);
    assert!(
        seen.iter()
            .any(|c| matches!(c, Command::LearnFirstAttempt(steps) if steps.len() == 2)),
        "the first attempt's two settled steps are taught"
    );
    m.handle(reviewed(Verdict::Accept)).unwrap();
    let Command::Finish(done) = next(&mut m, &mut seen) else {
        panic!("the end")
    };
    assert!(m.is_done());
    let (outcome, exp) = (&done.outcome, &done.experience);
    assert_eq!(outcome.state, RunState::Succeeded);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.citations, vec!["lesson:1".to_string()]);
    assert_eq!(outcome.tool_calls, 2);
    assert_eq!(exp.time_ms, 7);
    assert_eq!(exp.steps.len(), 2);
    assert!(
        exp.steps
            .iter()
            .all(|s| s.metadata["outcome"] == json!("valid"))
    );
    assert_eq!(m.poll(), None);
}

#[test]
fn a_wrong_tool_is_ruled_out_and_the_plan_repaired_from_its_stage() {
    let (mut m, mut seen) = planned();
    let Command::Call(_) = through_transitions(&mut m, &mut seen) else {
        panic!("a call")
    };
    m.handle(Event::Called {
        outcome: failed(ErrorClass::ToolNotFit, FailureCategory::Strategy),
        at_ms: 1,
    })
    .unwrap();
    let Command::Choose { base, exclude } = through_transitions(&mut m, &mut seen) else {
        panic!("a repair")
    };
    assert_eq!(base.map(|b| b.len()), Some(2));
    assert_eq!(
        exclude,
        vec![("fetch".into(), "search".into(), "plain".into())]
    );
    assert!(seen.iter().any(|c| matches!(
        c,
        Command::Notify(RunEvent::Recovery { failure, .. }) if failure == "wrong_tool_called"
    )));
    m.handle(Event::Planned(Ok(plan("scrape")))).unwrap();
    let Command::Call(call) = through_transitions(&mut m, &mut seen) else {
        panic!("the repaired call")
    };
    assert_eq!((call.tool.as_str(), call.attempt), ("scrape", 1));
    assert!(m.progress().guidance.is_some());
}

/// A first call that is not idempotent is marked in flight in the checkpoint written with the
/// transition to executing, and needs no write of its own; a run resumed from that checkpoint
/// (the process died after the write, perhaps during the call) holds the call in doubt rather
/// than making it again.
#[test]
fn a_first_call_not_idempotent_is_checkpointed_with_the_transition_to_executing() {
    let mut registry = ToolRegistry::new();
    let mut spec = ToolSpec::new("post", "a test tool");
    spec.idempotent = false;
    registry.register(Arc::new(Named(spec))).unwrap();
    let arm = WorkflowArm {
        tool: "post".to_string(),
        strategy: "plain".to_string(),
        params: Default::default(),
    };
    let check: workflow::OutputCheck = Arc::new(|_, _, _| Ok(()));
    let stages = vec![WorkflowStage::tools("write", vec![arm])];
    let wf = Arc::new(Workflow::new("one", stages, &registry, check, reward()).unwrap());
    let rules = Arc::new(RunRules::default().for_workflow(&wf));
    let mut m = RunMachine::new("run-t#1", task(), wf.clone(), rules.clone());
    let mut seen = Vec::new();
    m.poll();
    m.handle(prepared()).unwrap();
    next(&mut m, &mut seen);
    let post = ArmChoice {
        stage: "write".into(),
        tool: "post".into(),
        strategy: "plain".into(),
        propensity: 1.0,
    };
    m.handle(Event::Planned(Ok(PlanChoice::new(vec![post], None, true))))
        .unwrap();
    let Command::Transition {
        then, checkpoint, ..
    } = next(&mut m, &mut seen)
    else {
        panic!("the transition to planned and executing")
    };
    assert_eq!(then, Some(RunState::Executing));
    assert!(checkpoint, "the checkpoint goes with the transition");
    assert_eq!(m.progress().in_flight, Some(0));
    // What the performer writes with the transition.
    let written = RunMachine::checkpoint_of("run-t#1", m.progress(), 2).unwrap();
    m.handle(Event::Transitioned(RunState::Executing)).unwrap();
    let Command::Call(call) = next(&mut m, &mut seen) else {
        panic!("the call")
    };
    assert_eq!(call.tool, "post");
    assert!(
        !seen.contains(&Command::Checkpoint),
        "no checkpoint of its own: {seen:?}"
    );
    // The process dies during the call: the resumed run does not call again.
    let mut m = RunMachine::resume("run-t#1", task(), wf, rules, written).unwrap();
    let mut seen = Vec::new();
    m.poll();
    m.handle(prepared()).unwrap();
    let mut c = through_transitions(&mut m, &mut seen);
    while !matches!(c, Command::Finish(_)) {
        assert!(!matches!(c, Command::Call(_)), "no call is repeated: {c:?}");
        match c {
            Command::Review(_) => m.handle(reviewed(Verdict::Accept)).unwrap(),
            Command::Validate(outputs) => m
                .handle(Event::Validated(
                    outputs.into_iter().map(|(s, _)| (s, Ok(()))).collect(),
                ))
                .unwrap(),
            other => panic!("unexpected {other:?}"),
        }
        c = through_transitions(&mut m, &mut seen);
    }
    let Command::Finish(done) = c else {
        unreachable!()
    };
    assert_eq!(done.outcome.state, RunState::Escalated);
}

#[test]
fn a_non_idempotent_call_in_doubt_after_a_crash_is_escalated_not_repeated() {
    let (mut m, mut seen) = planned();
    through_transitions(&mut m, &mut seen);
    m.handle(Event::Called {
        outcome: ok(json!("page")),
        at_ms: 1,
    })
    .unwrap();
    let Command::Call(_) = through_transitions(&mut m, &mut seen) else {
        panic!("the non-idempotent call")
    };
    // The process dies here: the last checkpoint has the call in flight.
    assert_eq!(seen.last(), Some(&Command::Checkpoint));
    let cp = RunMachine::checkpoint_of("run-t#1", m.progress(), 3).unwrap();
    let mut m = RunMachine::resume(
        "run-t#1",
        task(),
        workflow(),
        Arc::new(RunRules::default()),
        cp,
    )
    .unwrap();
    let mut seen = Vec::new();
    m.poll();
    m.handle(prepared()).unwrap();
    // No call: the failure policy gets the doubt, and the tree's policy escalates it. The
    // output of the stage before is validated for the learners.
    let mut c = through_transitions(&mut m, &mut seen);
    if let Command::Validate(outputs) = c {
        assert_eq!(outputs.len(), 1);
        m.handle(Event::Validated(vec![("fetch".into(), Ok(()))]))
            .unwrap();
        c = next(&mut m, &mut seen);
    }
    let Command::Review(report) = c else {
        panic!("no call is repeated: {c:?}")
    };
    assert!(!report.passed);
    m.handle(reviewed(Verdict::Accept)).unwrap();
    let Command::Finish(done) = next(&mut m, &mut seen) else {
        panic!("the end")
    };
    assert_eq!(done.outcome.state, RunState::Escalated);
    assert!(done.outcome.resumed);
    assert!(
        done.outcome
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("in doubt")),
        "{:?}",
        done.outcome.reason
    );
}

#[test]
fn a_reflect_retry_verdict_starts_a_round_with_the_reflection_and_a_new_plan() {
    let (mut m, mut seen) = planned();
    for output in [json!("bad"), json!("posted")] {
        through_transitions(&mut m, &mut seen);
        m.handle(Event::Called {
            outcome: ok(output),
            at_ms: 1,
        })
        .unwrap();
    }
    let Command::Validate(outputs) = through_transitions(&mut m, &mut seen) else {
        panic!("the validation")
    };
    let verdicts = outputs
        .iter()
        .map(|(s, v)| (s.clone(), workflow().validate(&task(), s, v)))
        .collect();
    m.handle(Event::Validated(verdicts)).unwrap();
    // The invalid output is a strategy failure: recovered within the round first.
    let mut c = through_transitions(&mut m, &mut seen);
    while !matches!(c, Command::Review(_)) {
        c = match c {
            Command::Choose { .. } => {
                m.handle(Event::Planned(Err(
                    crate::learn::planner::PlanError::Exhausted {
                        stage: "fetch".into(),
                        tried: 2,
                    },
                )))
                .unwrap();
                through_transitions(&mut m, &mut seen)
            }
            Command::Call(_) => {
                m.handle(Event::Called {
                    outcome: ok(json!("bad")),
                    at_ms: 2,
                })
                .unwrap();
                through_transitions(&mut m, &mut seen)
            }
            Command::Validate(outputs) => {
                let verdicts = outputs
                    .iter()
                    .map(|(s, v)| (s.clone(), workflow().validate(&task(), s, v)))
                    .collect();
                m.handle(Event::Validated(verdicts)).unwrap();
                through_transitions(&mut m, &mut seen)
            }
            other => panic!("{other:?}"),
        };
    }
    let reflection = "[Reflect & Retry - Attempt 1/2] fix it".to_string();
    m.handle(reviewed(Verdict::Retry {
        attempt: 1,
        reflection: reflection.clone(),
    }))
    .unwrap();
    let c = through_transitions(&mut m, &mut seen);
    assert!(
        matches!(c, Command::Choose { base: None, .. }),
        "a new plan: {c:?}"
    );
    assert_eq!(m.progress().guidance.as_deref(), Some(reflection.as_str()));
    assert_eq!(m.progress().round, 2);
    assert!(m.progress().events.is_empty(), "a round starts afresh");
}

#[test]
fn an_answer_to_nothing_asked_is_an_error_not_a_guess() {
    let mut m = machine();
    m.poll();
    let err = m
        .handle(Event::Transitioned(RunState::Planned))
        .unwrap_err();
    assert!(matches!(err, RunError::Unexpected { .. }), "{err}");
    // The machine still waits for what it asked.
    m.handle(prepared()).unwrap();
}

#[test]
fn a_checkpoint_that_does_not_decode_is_refused_with_the_run_and_step() {
    let cp = Checkpoint {
        run_id: "run-t#1".into(),
        step_index: 4,
        name: None,
        state: json!({"attempt": "two"}),
        completed_steps: Vec::new(),
        created_ms: 0,
    };
    let Err(err) = RunMachine::resume(
        "run-t#1",
        task(),
        workflow(),
        Arc::new(RunRules::default()),
        cp,
    ) else {
        panic!("it decoded")
    };
    let text = err.to_string();
    assert!(text.contains("checkpoint 4 of run run-t#1"), "{text}");
}

#[test]
fn a_checkpoint_leaves_out_what_is_empty_and_reads_back_the_same() {
    let (mut m, mut seen) = planned();
    through_transitions(&mut m, &mut seen);
    let cp = RunMachine::checkpoint_of("run-t#1", m.progress(), 2).unwrap();
    let state = cp.state.as_object().unwrap();
    for empty in [
        "steps",
        "outputs",
        "in_flight",
        "events",
        "conversation",
        "tool_errors",
        "policy_state",
        "cost",
    ] {
        assert!(!state.contains_key(empty), "{empty} is left out: {state:?}");
    }
    // Read back, the same progress (less what a resumed run is prepared with again).
    let back: RunProgress = serde_json::from_value(cp.state.clone()).unwrap();
    let mut expected = m.progress().clone();
    expected.context = None;
    expected.citations.clear();
    assert_eq!(back, expected);
    // Fields that are set are written and read back.
    let set = RunProgress {
        recoveries_in_round: 1,
        in_flight: Some(0),
        guidance: Some("narrow the query".into()),
        latency_ms: 1.5,
        cost: 0.25,
        tool_calls: 2,
        reflect_retries: 1,
        turn: 3,
        stage_calls: 4,
        procedure_dropped: true,
        following: Some(machine::Following::default()),
        ..expected.clone()
    };
    let cp = RunMachine::checkpoint_of("run-t#1", &set, 3).unwrap();
    let back: RunProgress = serde_json::from_value(cp.state).unwrap();
    assert_eq!(back, set);
}

/// What may go on before the writes asked for ahead of it are on disk: reads, writes queued
/// behind them, and calls a crash may repeat; never a write-ahead call, a validation or the end.
#[test]
fn only_reads_writes_and_repeatable_calls_run_ahead_of_the_writes_before_them() {
    let mut m = machine();
    let mut seen = Vec::new();
    let prepare = m.poll().unwrap();
    assert!(m.may_run_ahead(&prepare));
    m.handle(prepared()).unwrap();
    let choose = next(&mut m, &mut seen);
    assert!(m.may_run_ahead(&choose));
    m.handle(Event::Planned(Ok(plan("search")))).unwrap();
    // A transition is written after the acceptance, in the order queued.
    let transition = next(&mut m, &mut seen);
    assert!(matches!(transition, Command::Transition { .. }));
    assert!(m.may_run_ahead(&transition));
    let Command::Transition { next: to, .. } = transition else {
        unreachable!()
    };
    m.handle(Event::Transitioned(to)).unwrap();
    // `search` is idempotent: a crash that loses the transition may have it called again.
    let search = through_transitions(&mut m, &mut seen);
    assert!(matches!(&search, Command::Call(c) if c.tool == "search"));
    assert!(m.may_run_ahead(&search));
    m.handle(Event::Called {
        outcome: ok(json!("page")),
        at_ms: 1,
    })
    .unwrap();
    // `post` is not: its checkpoint, which marks it in flight, must be on disk first.
    seen.clear();
    let post = through_transitions(&mut m, &mut seen);
    assert!(matches!(&post, Command::Call(c) if c.tool == "post"));
    assert!(!m.may_run_ahead(&post));
    // Its checkpoint is queued behind the writes before it, as the store keeps their order.
    assert_eq!(seen.last(), Some(&Command::Checkpoint));
    assert!(m.may_run_ahead(&Command::Checkpoint));
    assert!(
        seen.iter()
            .filter(|c| matches!(c, Command::Notify(_) | Command::LearnFirstAttempt(_)))
            .all(|c| !m.may_run_ahead(c)),
        "a notice and a lesson wait: {seen:?}"
    );
    m.handle(Event::Called {
        outcome: ok(json!("posted")),
        at_ms: 2,
    })
    .unwrap();
    let validate = through_transitions(&mut m, &mut seen);
    assert!(matches!(validate, Command::Validate(_)));
    assert!(!m.may_run_ahead(&validate));
}

#[test]
fn a_stage_s_output_is_kept_once_in_its_step_and_an_earlier_build_s_checkpoint_reads_back() {
    let table = json!({"rows": [[0, "a", 1.5]]});
    let progress = RunProgress {
        steps: vec![Step {
            index: 0,
            tool_output: Some(table.clone()),
            ..Step::default()
        }],
        output_step: BTreeMap::from([("search".to_string(), 0)]),
        ..RunProgress::default()
    };
    let cp = RunMachine::checkpoint_of("run-t#1", &progress, 2).unwrap();
    let state = cp.state.as_object().unwrap();
    assert_eq!(state["outputs_at"], json!({"search": 0}));
    assert!(
        !state.contains_key("outputs"),
        "the output is in its step only"
    );
    let resume = |cp: Checkpoint| {
        RunMachine::resume(
            "run-t#1",
            task(),
            workflow(),
            Arc::new(RunRules::default().for_workflow(&workflow())),
            cp,
        )
        .unwrap()
    };
    assert_eq!(resume(cp.clone()).progress().output("search"), Some(&table));
    // An earlier build's checkpoint names the step `output_step` and holds the outputs too.
    let earlier = |outputs: Option<Value>| {
        let mut cp = cp.clone();
        let state = cp.state.as_object_mut().unwrap();
        let at = state.remove("outputs_at").unwrap();
        state.insert("output_step".into(), at);
        if let Some(outputs) = outputs {
            state.insert("outputs".into(), outputs);
        }
        cp
    };
    let m = resume(earlier(Some(json!({"search": table.clone()}))));
    assert_eq!(m.progress().output("search"), Some(&table));
    // One written after a retried round had cleared its outputs (and not the steps' names):
    // the stage has no output, as it had none then.
    let m = resume(earlier(None));
    assert_eq!(m.progress().output("search"), None);
    assert!(m.progress().output_step.is_empty());
}

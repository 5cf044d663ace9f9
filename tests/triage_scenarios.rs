//! Every scenario of triage-agent 1.0.1's table (shared/peers/triage-agent.md) reproduced with
//! hindsight's outcome, and one test per numbered bug of the peer showing hindsight lacks it.

use std::sync::{Arc, Mutex};

use hindsight::FailureType::{self, *};
use hindsight::RecoveryAction;
use hindsight::triage::policy::MANIFEST_HINT;
use hindsight::triage::{
    Agent, AgentConfig, Classifier, ClassifierConfig, FailurePolicy, MemoryCheckpoints,
    RulesClassifier, RunError, RunReport, Strategy, TriageContext, TriageError, VirtualClock,
};
use serde_json::{Value, json};

type Seen = Arc<Mutex<Vec<Option<TriageContext>>>>;

fn agent(
    policy: FailurePolicy,
    cfg: AgentConfig,
) -> (Agent, Arc<VirtualClock>, Arc<MemoryCheckpoints>) {
    let clock = Arc::new(VirtualClock::new(1_000));
    let store = Arc::new(MemoryCheckpoints::default());
    let a = Agent::new(policy, cfg)
        .with_clock(clock.clone())
        .with_store(store.clone());
    (a, clock, store)
}

fn with_constraints(a: Agent, patterns: &[&str]) -> Agent {
    let c = RulesClassifier::new(&ClassifierConfig {
        loop_window: 3,
        constraints: patterns.iter().map(|s| s.to_string()).collect(),
    })
    .unwrap();
    a.with_classifier(Arc::new(c) as Arc<dyn Classifier>)
}

fn seen() -> Seen {
    Arc::new(Mutex::new(Vec::new()))
}

fn types<T>(r: &RunReport<T>) -> Vec<FailureType> {
    r.failure_types()
}

fn escalated(e: TriageError) -> hindsight::triage::FailureReport {
    match e {
        TriageError::Escalated(r) => *r,
        other => panic!("expected escalation, got {other:?}"),
    }
}

#[tokio::test]
async fn s01_wrong_tool_retries_with_manifest() {
    let policy = FailurePolicy::new().on(WrongToolCalled, Strategy::retry_with_tool_manifest(3));
    let cfg = AgentConfig {
        tool_manifest: Some("tools: lookup_user, search".into()),
        ..AgentConfig::default()
    };
    let (a, _, _) = agent(policy, cfg);
    let s = seen();
    let s2 = s.clone();
    let r = a
        .run("s1", None, Value::Null, move |ctx, tc| {
            s2.lock().unwrap().push(tc);
            async move {
                if ctx.attempt() == 0 {
                    ctx.tool_step("lookup_usr", json!({"id": 1}), None);
                    return Err(RunError::new("Tool 'lookup_usr' not found"));
                }
                Ok(())
            }
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![WrongToolCalled]);
    assert_eq!(r.calls, 2);
    let tc = s.lock().unwrap()[1].clone().unwrap();
    assert_eq!(tc.hint.as_deref(), Some(MANIFEST_HINT));
    assert_eq!(tc.inject.as_deref(), Some("tools: lookup_user, search"));
}

#[tokio::test]
async fn s02_constraint_ignored_replans() {
    let policy = FailurePolicy::new().on(ConstraintIgnored, Strategy::replan("No code fences.", 3));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let a = with_constraints(a, &["```"]);
    let r = a
        .run("s2", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                ctx.record_step(hindsight::Step {
                    action: "llm".into(),
                    llm_output: Some("```json\n{}\n```".into()),
                    ..Default::default()
                });
                return Err(RunError::new("output rejected by validator"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ConstraintIgnored]);
    assert_eq!(r.calls, 2);
}

#[tokio::test]
async fn s03_loop_detected_replans() {
    let policy = FailurePolicy::new().on(LoopDetected, Strategy::replan("Change the query.", 3));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s3", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                for _ in 0..3 {
                    ctx.tool_step("search", json!({"q": "weather paris"}), None);
                }
                return Err(RunError::new("agent exceeded its step budget"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![LoopDetected]);
    assert_eq!(r.calls, 2);
}

#[tokio::test]
async fn s04_schema_mismatch_retries() {
    let policy = FailurePolicy::new().on(SchemaMismatch, Strategy::retry_with_tool_manifest(2));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s4", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                return Err(RunError::new(
                    "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
                )
                .with_type("JSONDecodeError"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![SchemaMismatch]);
    assert_eq!(r.calls, 2);
}

async fn s05_run(run_id: &str) -> (RunReport<()>, Vec<u64>) {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(5));
    let cfg = AgentConfig {
        seed: 42,
        ..AgentConfig::default()
    };
    let (a, clock, _) = agent(policy, cfg);
    let r = a
        .run(run_id, None, Value::Null, |ctx, _| async move {
            if ctx.attempt() < 2 {
                return Err(RunError::new("HTTP 503 Service Unavailable"));
            }
            Ok(())
        })
        .await
        .unwrap();
    (r, clock.sleeps())
}

#[tokio::test]
async fn s05_external_fault_backs_off_with_seeded_full_jitter() {
    let (r, sleeps) = s05_run("s5").await;
    assert_eq!(types(&r), vec![ExternalFault, ExternalFault]);
    assert_eq!(r.calls, 3);
    assert_eq!(r.delays_ms.len(), 2);
    assert!(
        r.delays_ms[0] <= 1_000 && r.delays_ms[1] <= 2_000,
        "{:?}",
        r.delays_ms
    );
    let slept: Vec<u64> = r.delays_ms.iter().copied().filter(|d| *d > 0).collect();
    assert_eq!(sleeps, slept);
    // Same seed and run id: same delays.
    let (r2, _) = s05_run("s5").await;
    assert_eq!(r.delays_ms, r2.delays_ms);
}

#[tokio::test]
async fn s06_empty_timeout_error_is_a_timeout() {
    let policy = FailurePolicy::new().on(Timeout, Strategy::backoff_and_retry(2));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s6", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                return Err(RunError::new("").with_type("TimeoutError"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![Timeout]);
    assert_eq!(r.calls, 2);
}

#[tokio::test]
async fn s07_unknown_escalates_by_default() {
    let policy = FailurePolicy::new().otherwise(Strategy::escalate_by_default());
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("s7", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("the model produced an empty answer"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert_eq!(rep.reason, "Unhandled failure: unknown at step 0");
    assert_eq!(rep.calls, 1);
    assert_eq!(rep.failures[0].classification.failure_type, Unknown);
}

#[tokio::test]
async fn s08_plan_incomplete_resumes_from_the_derived_subgoal() {
    let policy = FailurePolicy::new().on(PlanIncomplete, Strategy::ResumeFromSubgoal);
    let (a, _, _) = agent(policy, AgentConfig::default());
    let s = seen();
    let s2 = s.clone();
    let r = a
        .run("s8", None, Value::Null, move |ctx, tc| {
            s2.lock().unwrap().push(tc.clone());
            async move {
                if ctx.attempt() == 0 {
                    for g in ["a", "b", "c"] {
                        ctx.declare_subgoal(g);
                    }
                    ctx.complete_subgoal("a");
                    ctx.complete_subgoal("b");
                    return Err(RunError::new("declared done but subgoal c incomplete"));
                }
                // The resumed attempt starts with the trajectory of the done work.
                assert_eq!(tc.unwrap().resume_from.as_deref(), Some("c"));
                assert!(ctx.trajectory().len() >= 5);
                ctx.complete_subgoal("c");
                Ok(())
            }
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![PlanIncomplete]);
    assert_eq!(r.calls, 2);
    let tc = s.lock().unwrap()[1].clone().unwrap();
    assert_eq!(tc.resume_from.as_deref(), Some("c"));
}

#[tokio::test]
async fn s10_context_overflow_replans() {
    let hint = "Compress the context and retry.";
    let policy = FailurePolicy::new().on(ContextOverflow, Strategy::replan(hint, 3));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s10", None, Value::Null, |ctx, tc| async move {
            if ctx.attempt() == 0 {
                return Err(RunError::new(
                    "maximum context length is 8192 tokens; requested 9100",
                ));
            }
            assert_eq!(
                tc.unwrap().hint.as_deref(),
                Some("Compress the context and retry.")
            );
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ContextOverflow]);
    assert_eq!(r.calls, 2);
}

#[tokio::test]
async fn s11_chain_backs_off_then_replans() {
    let policy = FailurePolicy::new().on(
        ExternalFault,
        Strategy::chain(
            Strategy::backoff_and_retry(1),
            Strategy::replan("Use the mirror.", 3),
        ),
    );
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s11", None, Value::Null, |ctx, tc| async move {
            let replanned = tc.and_then(|t| t.hint).as_deref() == Some("Use the mirror.");
            if ctx.attempt() < 2 || !replanned {
                return Err(RunError::new("HTTP 502 Bad Gateway"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault, ExternalFault]);
    assert_eq!(r.calls, 3);
    let kinds: Vec<&str> = r
        .failures
        .iter()
        .map(|f| f.action.as_ref().unwrap().kind())
        .collect();
    assert_eq!(kinds, vec!["retry", "replan"]);
}

#[tokio::test]
async fn s12_max_total_attempts_caps_the_history() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(5));
    let cfg = AgentConfig {
        max_recovery_attempts: 5,
        max_total_attempts: Some(2),
        ..AgentConfig::default()
    };
    let (a, _, _) = agent(policy, cfg);
    let e = a
        .run("s12", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("429 Too Many Requests"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert_eq!(rep.reason, "max_total_attempts (2) exceeded");
    assert_eq!(rep.calls, 3);
    assert_eq!(rep.failures.len(), 3);
    assert!(
        rep.failures
            .iter()
            .all(|f| f.classification.failure_type == ExternalFault)
    );
}

#[tokio::test]
async fn s13_max_recovery_attempts_caps_the_calls() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(5));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("s13", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert_eq!(rep.reason, "max_recovery_attempts (3) exceeded");
    assert_eq!(rep.calls, 4);
    assert_eq!(rep.failures.len(), 4);
}

#[tokio::test]
async fn s14_retry_with_manifest_gives_up_after_max_attempts() {
    let policy = FailurePolicy::new().on(WrongToolCalled, Strategy::retry_with_tool_manifest(2));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("s14", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("no tool named 'frobnicate'"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert_eq!(rep.reason, "max_attempts (2) reached");
    assert_eq!(rep.calls, 3);
    assert!(
        rep.failures
            .iter()
            .all(|f| f.classification.failure_type == WrongToolCalled)
    );
}

#[tokio::test]
async fn s15_bug1_rollback_restores_state_and_trajectory() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::rollback_to_checkpoint(None));
    let cfg = AgentConfig {
        auto_checkpoint: true,
        ..AgentConfig::default()
    };
    let (a, _, store) = agent(policy, cfg);
    let r = a
        .run("s15", None, Value::Null, |ctx, tc| async move {
            if ctx.attempt() == 0 {
                ctx.set_state(json!({"rows": [1, 2, 3], "cursor": 0}));
                ctx.tool_step("read_rows", json!({"table": "t"}), Some(json!([1, 2, 3])));
                ctx.update_state("cursor", json!(1));
                return Err(RunError::new("502 Bad Gateway from writer"));
            }
            let tc = tc.unwrap();
            assert_eq!(tc.restored_checkpoint, Some(None));
            assert_eq!(ctx.state(), json!({"rows": [1, 2, 3], "cursor": 1}));
            let t = ctx.trajectory();
            assert_eq!(
                t.len(),
                1,
                "the trajectory up to the checkpoint is restored"
            );
            assert_eq!(t.steps[0].tool_called.as_deref(), Some("read_rows"));
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault]);
    assert_eq!(r.calls, 2);
    assert_eq!(r.state, json!({"rows": [1, 2, 3], "cursor": 1}));
    assert!(!store.all("s15").is_empty());
}

#[tokio::test]
async fn s16_rollback_to_a_named_checkpoint() {
    let policy = FailurePolicy::new().on(
        ExternalFault,
        Strategy::rollback_to_checkpoint(Some("before-write")),
    );
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s16", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                ctx.set_state(json!({"cursor": 0}));
                ctx.checkpoint(Some("before-write")).await.unwrap();
                ctx.update_state("cursor", json!(1));
                return Err(RunError::new("HTTP 503"));
            }
            assert_eq!(ctx.state()["cursor"], 0);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault]);
    assert_eq!(r.calls, 2);
    assert_eq!(r.state["cursor"], 0);
}

#[tokio::test]
async fn s17_rollback_without_checkpoint_escalates() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::rollback_to_checkpoint(None));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("s17", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert!(
        rep.reason.contains("no checkpoint is available"),
        "{}",
        rep.reason
    );
    assert_eq!(rep.calls, 1);
}

#[tokio::test]
async fn s18_abort_by_default() {
    let policy = FailurePolicy::new().otherwise(Strategy::abort_by_default());
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("s18", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("unrecoverable: invariant violated"))
        })
        .await
        .unwrap_err();
    match e {
        TriageError::Aborted(rep) => {
            assert_eq!(rep.calls, 1);
            assert_eq!(rep.failures[0].classification.failure_type, Unknown);
            assert!(rep.reason.contains("invariant violated"));
        }
        other => panic!("expected abort, got {other:?}"),
    }
}

#[tokio::test]
async fn s19_bug3_nothing_of_an_earlier_recovery_leaks() {
    let policy = FailurePolicy::new()
        .on(WrongToolCalled, Strategy::retry_with_tool_manifest(3))
        .on(PlanIncomplete, Strategy::ResumeFromSubgoal);
    let cfg = AgentConfig {
        tool_manifest: Some("tools: geo".into()),
        ..AgentConfig::default()
    };
    let (a, _, _) = agent(policy, cfg);
    let s = seen();
    let s2 = s.clone();
    let r = a
        .run("s19", None, json!({"fresh": true}), move |ctx, tc| {
            s2.lock().unwrap().push(tc);
            async move {
                match ctx.attempt() {
                    0 => Err(RunError::new("Tool 'geo_lookup' not found")),
                    1 => {
                        ctx.update_state("fresh", json!(false));
                        ctx.declare_subgoal("finalize");
                        Err(RunError::new("stopped before finalize"))
                    }
                    _ => {
                        // A resumed run that returns must have done its subgoals.
                        ctx.complete_subgoal("finalize");
                        Ok(())
                    }
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![WrongToolCalled, PlanIncomplete]);
    let s = s.lock().unwrap();
    let call1 = s[1].clone().unwrap();
    assert_eq!(call1.hint.as_deref(), Some(MANIFEST_HINT));
    let call2 = s[2].clone().unwrap();
    assert_eq!(call2.resume_from.as_deref(), Some("finalize"));
    assert_eq!(
        call2.hint, None,
        "the manifest hint does not leak into call 2"
    );
    assert_eq!(call2.inject, None);
}

#[tokio::test]
async fn s20_bug7_the_error_that_ended_the_attempt_wins() {
    let policy = FailurePolicy::new()
        .on(ExternalFault, Strategy::backoff_and_retry(3))
        .on(WrongToolCalled, Strategy::escalate_by_default());
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("s20", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                ctx.record_step(hindsight::Step {
                    action: "tool_call".into(),
                    tool_called: Some("geo".into()),
                    error: Some("Tool 'geo' not found".into()),
                    ..Default::default()
                });
                ctx.tool_step("geocode", json!({"q": "paris"}), None);
                return Err(RunError::new("HTTP 503"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault]);
}

#[tokio::test]
async fn bug7_the_raised_exception_is_seen_even_when_the_last_step_has_an_error() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(3));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("b7", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                ctx.record_step(hindsight::Step {
                    tool_called: Some("geo".into()),
                    error: Some("Tool 'geo' not found".into()),
                    ..Default::default()
                });
                return Err(RunError::new("connect ECONNREFUSED 10.0.0.1:443"));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault]);
}

#[tokio::test]
async fn s21_bug10_strict_idempotency_escalates_at_once() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(5));
    let cfg = AgentConfig {
        strict_idempotency: true,
        ..AgentConfig::default()
    };
    let (a, clock, _) = agent(policy, cfg);
    let e = a
        .run("s21", None, Value::Null, |ctx, _| async move {
            ctx.tool_step("send_email", json!({"to": "a@b.c"}), Some(json!("sent")));
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert!(rep.reason.contains("send_email"), "{}", rep.reason);
    assert_eq!(rep.calls, 1);
    assert!(clock.sleeps().is_empty(), "no backoff was slept");
}

#[tokio::test]
async fn s22_suspend_for_human_approval_then_resume() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::suspend("Retry the payment?"));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let attempt = |ctx: hindsight::triage::RunContext, tc: Option<TriageContext>| async move {
        if ctx.attempt() == 0 {
            return Err(RunError::new("HTTP 503"));
        }
        assert_eq!(tc.unwrap().hint.as_deref(), Some("human approved"));
        Ok(())
    };
    let e = a.run("s22", None, Value::Null, attempt).await.unwrap_err();
    let TriageError::Suspended(s) = e else {
        panic!("expected a suspension, got {e:?}");
    };
    assert_eq!(s.message, "Retry the payment?");
    assert_eq!(s.report.failures.len(), 1);
    let r = a
        .resume(
            *s,
            RecoveryAction::Retry {
                hint: Some("human approved".into()),
                inject: None,
                delay_ms: 0,
            },
            attempt,
        )
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault]);
    assert_eq!(r.calls, 2);
}

#[tokio::test]
async fn success_with_an_undone_subgoal_is_plan_incomplete() {
    let policy = FailurePolicy::new().otherwise(Strategy::escalate_by_default());
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("undone", None, Value::Null, |ctx, _| async move {
            ctx.declare_subgoal("write");
            Ok(())
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert_eq!(rep.failures[0].classification.failure_type, PlanIncomplete);
}

#[tokio::test]
async fn bug2_resume_needs_no_hook() {
    // Covered in depth by s08; here the subgoal comes only from the trajectory's declarations.
    let policy = FailurePolicy::new().on(PlanIncomplete, Strategy::ResumeFromSubgoal);
    let (a, _, _) = agent(policy, AgentConfig::default());
    let r = a
        .run("b2", None, Value::Null, |ctx, tc| async move {
            if ctx.attempt() == 0 {
                ctx.declare_subgoal("fetch");
                ctx.declare_subgoal("write");
                ctx.complete_subgoal("fetch");
                return Err(RunError::new("ran out of steps"));
            }
            assert_eq!(tc.unwrap().resume_from.as_deref(), Some("write"));
            ctx.complete_subgoal("write");
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![PlanIncomplete]);
}

#[tokio::test]
async fn bug3_restored_state_does_not_outlive_its_recovery() {
    let policy = FailurePolicy::new()
        .on(ExternalFault, Strategy::rollback_to_checkpoint(None))
        .on(Timeout, Strategy::backoff_and_retry(2));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let s = seen();
    let s2 = s.clone();
    let r = a
        .run("b3", None, json!({"cursor": 0}), move |ctx, tc| {
            s2.lock().unwrap().push(tc);
            async move {
                match ctx.attempt() {
                    0 => {
                        ctx.update_state("cursor", json!(5));
                        ctx.checkpoint(None).await.unwrap();
                        Err(RunError::new("HTTP 503"))
                    }
                    1 => {
                        assert_eq!(ctx.state()["cursor"], 5);
                        Err(RunError::new("request timed out"))
                    }
                    _ => {
                        assert_eq!(ctx.state()["cursor"], 0, "a plain retry starts fresh");
                        assert!(ctx.trajectory().is_empty());
                        Ok(())
                    }
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(types(&r), vec![ExternalFault, Timeout]);
    let call2 = s.lock().unwrap()[2].clone().unwrap();
    assert_eq!(call2.restored_checkpoint, None);
    assert_eq!(call2.resume_from, None);
}

#[tokio::test]
async fn bug4_checkpoints_do_not_leak_between_runs() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::rollback_to_checkpoint(None));
    let (a, _, _) = agent(policy, AgentConfig::default());
    a.run("b4-first", None, Value::Null, |ctx, _| async move {
        ctx.set_state(json!({"secret": 1}));
        ctx.checkpoint(Some("x")).await.unwrap();
        Ok(())
    })
    .await
    .unwrap();
    let e = a
        .run("b4-second", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    assert!(escalated(e).reason.contains("no checkpoint is available"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bug5_concurrent_runs_on_one_agent_are_isolated() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(3));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let run = |name: &'static str| {
        let a = a.clone();
        tokio::spawn(async move {
            a.run(name, None, Value::Null, move |ctx, _| async move {
                for i in 0..20 {
                    ctx.tool_step(name, json!({ "i": i }), None);
                    tokio::task::yield_now().await;
                }
                if ctx.attempt() == 0 {
                    return Err(RunError::new("HTTP 503"));
                }
                Ok(())
            })
            .await
        })
    };
    let (x, y) = tokio::join!(run("alpha"), run("beta"));
    for (r, name) in [
        (x.unwrap().unwrap(), "alpha"),
        (y.unwrap().unwrap(), "beta"),
    ] {
        assert_eq!(r.trajectory.len(), 20);
        assert!(
            r.trajectory
                .steps
                .iter()
                .all(|s| s.tool_called.as_deref() == Some(name))
        );
        assert_eq!(r.calls, 2);
    }
}

#[tokio::test]
async fn bug6_missing_named_checkpoint_escalates_with_a_clear_reason() {
    let policy = FailurePolicy::new().on(
        ExternalFault,
        Strategy::rollback_to_checkpoint(Some("nope")),
    );
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("b6", None, Value::Null, |ctx, _| async move {
            ctx.checkpoint(Some("other")).await.unwrap();
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert!(
        rep.reason.contains("checkpoint \"nope\" not found"),
        "{}",
        rep.reason
    );
}

#[tokio::test]
async fn bug8_504_529_and_status_lookalikes_are_external() {
    let policy = FailurePolicy::new()
        .on(ExternalFault, Strategy::backoff_and_retry(5))
        .on(Timeout, Strategy::backoff_and_retry(5));
    let (a, _, _) = agent(policy, AgentConfig::default());
    for (msg, want) in [
        ("HTTP 504 Gateway Timeout", Timeout),
        ("HTTP 529 Overloaded", ExternalFault),
        ("HTTP 502 from upstream at step 500", ExternalFault),
    ] {
        let r = a
            .run(msg, None, Value::Null, move |ctx, _| async move {
                if ctx.attempt() == 0 {
                    return Err(RunError::new(msg));
                }
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(types(&r), vec![want], "{msg}");
        let ec = r.failures[0].classification.error.clone().unwrap();
        assert_eq!(
            ec.category,
            hindsight::FailureCategory::Infrastructure,
            "{msg}"
        );
    }
}

#[tokio::test]
async fn bug9_limits_and_backoff_are_counted_per_failure_type() {
    let backoff = |n| {
        Strategy::BackoffAndRetry(hindsight::triage::Backoff {
            max_attempts: n,
            base_ms: 1_000,
            cap_ms: 1_000_000,
        })
    };
    let policy = FailurePolicy::new()
        .on(ExternalFault, backoff(2))
        .on(Timeout, backoff(1));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let mut ext_second_over_base = 0;
    for i in 0..20 {
        let r = a
            .run(&format!("b9-{i}"), None, Value::Null, |ctx, _| async move {
                match ctx.attempt() {
                    0 | 1 => Err(RunError::new("HTTP 503")),
                    2 => Err(RunError::new("").with_type("TimeoutError")),
                    _ => Ok(()),
                }
            })
            .await
            .unwrap();
        assert_eq!(types(&r), vec![ExternalFault, ExternalFault, Timeout]);
        // The timeout is the first of its type: its ceiling is the base, not base * 2^2.
        assert!(r.delays_ms[2] <= 1_000, "{:?}", r.delays_ms);
        assert!(r.delays_ms[1] <= 2_000);
        ext_second_over_base += (r.delays_ms[1] > 1_000) as u32;
    }
    assert!(
        ext_second_over_base > 0,
        "the second external fault's ceiling doubled"
    );
}

#[tokio::test]
async fn escalation_carries_the_full_failure_context() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(1));
    let (a, _, _) = agent(policy, AgentConfig::default());
    let e = a
        .run("ctx", None, json!({"k": 1}), |ctx, _| async move {
            ctx.tool_step("fetch", json!({"u": 1}), None);
            ctx.spend(100, 0.5);
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("ctx") && msg.contains("max_attempts (1) reached"),
        "{msg}"
    );
    let rep = e.report().unwrap().clone();
    assert_eq!(rep.failures.len(), 2);
    assert_eq!(rep.failures[0].action.as_ref().unwrap().kind(), "retry");
    assert_eq!(rep.failures[1].error.as_ref().unwrap().message, "HTTP 503");
    assert_eq!(rep.trajectory.len(), 1);
    assert_eq!(rep.state, json!({"k": 1}));
    assert_eq!(rep.tokens, 200);
}

#[tokio::test]
async fn budgets_and_recovery_time_are_capped() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(9));
    let cfg = AgentConfig {
        max_tokens: Some(250),
        max_recovery_attempts: 9,
        ..AgentConfig::default()
    };
    let (a, _, _) = agent(policy.clone(), cfg);
    let e = a
        .run("budget", None, Value::Null, |ctx, _| async move {
            ctx.spend(100, 0.0);
            Err::<(), _>(RunError::new("HTTP 503"))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert!(
        rep.reason.starts_with("token budget (250) exceeded"),
        "{}",
        rep.reason
    );
    assert_eq!(rep.calls, 3);

    let cfg = AgentConfig {
        max_recovery_ms: Some(5_000),
        max_recovery_attempts: 9,
        ..AgentConfig::default()
    };
    let (a, clock, _) = agent(policy, cfg);
    let e = a
        .run("time", None, Value::Null, |_, _| async {
            Err::<(), _>(RunError::new("HTTP 503").retry_after(2_000))
        })
        .await
        .unwrap_err();
    let rep = escalated(e);
    assert!(
        rep.reason
            .starts_with("max recovery time (5000 ms) exceeded"),
        "{}",
        rep.reason
    );
    let slept: u64 = clock.sleeps().iter().sum();
    assert!(slept <= 5_000, "never sleeps past the limit: {slept}");
    assert!(
        clock.sleeps().iter().all(|d| *d >= 2_000),
        "Retry-After honoured"
    );
}

#[tokio::test(start_paused = true)]
async fn the_tokio_clock_sleeps_the_backoff_in_paused_time() {
    let policy = FailurePolicy::new().on(ExternalFault, Strategy::backoff_and_retry(3));
    let a = Agent::new(policy, AgentConfig::default())
        .with_clock(Arc::new(hindsight::triage::TokioClock::new(0)));
    let start = tokio::time::Instant::now();
    let r = a
        .run("tokio", None, Value::Null, |ctx, _| async move {
            if ctx.attempt() == 0 {
                return Err(RunError::new("HTTP 503").retry_after(1_500));
            }
            Ok(())
        })
        .await
        .unwrap();
    assert!(r.delays_ms[0] >= 1_500);
    assert!(start.elapsed() >= std::time::Duration::from_millis(r.delays_ms[0]));
}

#[tokio::test]
async fn the_memory_store_keeps_named_checkpoints_and_the_last_k() {
    use hindsight::triage::CheckpointStore;
    let store = MemoryCheckpoints::new(2);
    for i in 0..5u32 {
        let cp = hindsight::Checkpoint {
            run_id: "r".into(),
            step_index: i,
            name: (i == 1).then(|| "one".to_string()),
            state: json!(i),
            completed_steps: vec![],
            created_ms: u64::from(i),
        };
        store.put(&cp).await.unwrap();
    }
    assert_eq!(store.latest("r").unwrap().unwrap().step_index, 4);
    assert_eq!(store.named("r", "one").unwrap().unwrap().step_index, 1);
    assert_eq!(store.all("r").len(), 3);
    assert!(store.latest("other").unwrap().is_none());
}

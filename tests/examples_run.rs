//! The examples run and show what they claim: each example's `demo` is called here (the example
//! files are included as modules) and its result is checked.

#[allow(dead_code)]
#[path = "../examples/agent_mcp.rs"]
mod agent_mcp;
#[allow(dead_code)]
#[path = "../examples/chaos_own_actor.rs"]
mod chaos_own_actor;
#[allow(dead_code)]
#[path = "../examples/custom_tool.rs"]
mod custom_tool;
#[allow(dead_code)]
#[path = "../examples/custom_validator.rs"]
mod custom_validator;
#[allow(dead_code)]
#[path = "../examples/embed_tree.rs"]
mod embed_tree;
// `mcp_tools` comes with `agent_mcp`, which installs the server through it.
use agent_mcp::mcp_tools;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_tree_runs_tasks_under_your_own_supervisor_and_stops_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let summary = embed_tree::demo(dir.path(), 6).await.unwrap();
    assert_eq!(summary.tasks.len(), 6);
    for (i, t) in summary.tasks.iter().enumerate() {
        assert_eq!(t.task_id, format!("bank-statements#{i}"));
        assert!(
            matches!(
                t.state.as_str(),
                "succeeded" | "failed" | "escalated" | "aborted"
            ),
            "{t:?}"
        );
        assert_eq!(t.plan.len(), 2, "one arm per stage: {t:?}");
        assert!(t.attempts >= 1);
    }
    // The hindsight subtree stopped first; the application's own actor was still running.
    assert_eq!(
        summary.children_after_terminate,
        vec![("auditor".to_string(), "running".to_string())]
    );
    // The auditor recorded every outcome, as it was.
    assert_eq!(summary.audited.len(), 6);
    for t in &summary.tasks {
        let line = summary
            .audited
            .iter()
            .find(|(run, _)| *run == t.run_id)
            .map(|(_, l)| l)
            .unwrap_or_else(|| panic!("{} not audited", t.run_id));
        assert_eq!(line.passed, t.passed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_tool_workflow_learns_the_better_arm_per_kind_of_invoice() {
    let dir = tempfile::tempdir().unwrap();
    let summary = custom_tool::demo(dir.path(), 60).await.unwrap();
    assert_eq!(summary.choices.len(), 60);
    let wrong = |c: &&custom_tool::Choice| match c.source {
        "scan" => c.read != "layout_model",
        _ => c.read != "regex",
    };
    let early = summary.choices[..15].iter().filter(wrong).count();
    let late = summary.choices[45..].iter().filter(wrong).count();
    // The first plans try both readers (a wrong reading that fails the check is replanned
    // with the other, so the policy learns from fallbacks as well and needs few first tries);
    // the last ones use the better reader more often than the first did.
    assert!(early >= 1, "the first plans try both readers: {early}");
    assert!(
        late <= 1 && late < early,
        "the last plans use the better reader: {late} wrong, against {early} in the first 15"
    );
    // Every run passed: a regex reading of a scan fails the output check and is replanned.
    assert!(summary.choices.iter().all(|c| c.passed));
    for c in summary
        .choices
        .iter()
        .filter(|c| c.source == "scan" && c.read == "regex")
    {
        assert_eq!(c.recoveries, vec!["schema_mismatch".to_string()], "{c:?}");
    }
    assert_eq!(
        summary.greedy["pdf"],
        vec!["invoice_reader/regex", "fx_convert/daily_rate"]
    );
    assert_eq!(
        summary.greedy["scan"],
        vec!["invoice_reader/layout_model", "fx_convert/daily_rate"]
    );
    let mean = |rows: &[custom_tool::Choice]| {
        rows.iter().map(|c| c.reward).sum::<f64>() / rows.len() as f64
    };
    assert!(mean(&summary.choices[45..]) > mean(&summary.choices[..15]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_validator_sends_each_first_round_back_once_with_its_reflection() {
    let dir = tempfile::tempdir().unwrap();
    let reviewed = custom_validator::demo(dir.path(), 3).await.unwrap();
    assert_eq!(reviewed.len(), 3);
    for r in &reviewed {
        assert!(r.reflect_retries >= 1, "{r:?}");
        assert!(r.reflect_retries <= custom_validator::MAX_RETRIES, "{r:?}");
        assert_eq!(r.persisted_retries, Some(r.reflect_retries), "{r:?}");
        assert!(r.attempts > r.reflect_retries, "{r:?}");
        let reflection = r.reflection.as_deref().unwrap_or_default();
        assert!(
            reflection.starts_with(&format!(
                "[review 1/{}] {}",
                custom_validator::MAX_RETRIES,
                custom_validator::REASON
            )),
            "{reflection}"
        );
        assert!(reflection.ends_with("check that the totals match."));
    }
    // Where no recovery of the second round replaced it, the run planned with the reflection.
    assert!(
        reviewed
            .iter()
            .any(|r| r.last_guidance.is_some() && r.last_guidance == r.reflection)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_your_own_actor_is_restarted_and_the_workload_completes() {
    hindsight_actors::chaos::quiet_injected_panics();
    let dir = tempfile::tempdir().unwrap();
    let n = 300;
    let report = chaos_own_actor::demo(dir.path(), n).await.unwrap();
    let outcome = report.output.unwrap();
    assert_eq!(outcome.sent, n);
    assert_eq!(outcome.posted, n, "every transaction posted");
    assert_eq!(
        outcome.total_cents,
        (0..n).map(chaos_own_actor::amount).sum::<u64>()
    );
    let c = report.counts;
    assert!(c.panics > 0, "the plan injected panics");
    assert!(
        c.panics < n / 5,
        "about 5% of {} messages: {}",
        c.messages,
        c.panics
    );
    assert_eq!(report.restarts, c.panics, "one restart per injected panic");
    assert_eq!(outcome.starts, c.panics + 1);
    assert_eq!(
        c.messages,
        n + c.panics,
        "each message that panicked was re-sent"
    );
    assert_eq!(report.escalations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_lists_server_everything_and_echoes_through_the_runner() {
    // Installs the pinned server on first use (the MCP tests' cache); fails when it cannot.
    let index = mcp_tools::install_everything().unwrap();
    let message = "examples test";
    let summary = mcp_tools::demo(&index, message).await.unwrap();
    assert!(summary.tools.len() >= 10, "{:?}", summary.tools);
    assert!(summary.tools.iter().any(|t| t == "echo"));
    mcp_tools::check(&summary, message).unwrap();
    assert_eq!(summary.echo.attempts.len(), 1);
    assert!(
        summary.bad_echo.attempts.is_empty(),
        "rejected before any call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_mcp_answers_with_what_the_real_tools_returned() {
    let index = mcp_tools::install_everything().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The offline model: the example uses a model server only when HINDSIGHT_MODEL_URL is set.
    let answers = agent_mcp::demo(&index, dir.path(), 2).await.unwrap();
    assert_eq!(answers.len(), 2);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.state, "succeeded", "{a:?}");
        assert!(a.answer.contains(&format!("hello {i}")), "{a:?}");
        assert!(a.answer.contains(&format!("{}", i + 10)), "{a:?}");
        assert_eq!(a.plan_id.as_deref(), Some("model/default"));
    }
}

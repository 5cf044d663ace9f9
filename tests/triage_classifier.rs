//! The rules trajectory classifier produces each of the eleven failure types.

use std::sync::Arc;

use hindsight::FailureType::{self, *};
use hindsight::triage::classify::GoalValidator;
use hindsight::triage::context::Claim;
use hindsight::triage::{Classifier, ClassifierConfig, FailureInput, RulesClassifier, RunError};
use hindsight::{Step, Trajectory};
use serde_json::{Value, json};

fn rules() -> RulesClassifier {
    RulesClassifier::new(&ClassifierConfig {
        loop_window: 3,
        constraints: vec!["```".into(), "(?i)as an ai language model".into()],
    })
    .unwrap()
}

fn call(tool: &str, input: Value, error: Option<&str>) -> Step {
    Step {
        action: "tool_call".into(),
        tool_called: Some(tool.into()),
        tool_input: Some(input),
        error: error.map(str::to_string),
        ..Step::default()
    }
}

fn traj(steps: Vec<Step>) -> Trajectory {
    let mut t = Trajectory::default();
    for s in steps {
        t.push(s);
    }
    t
}

fn failed(c: &RulesClassifier, t: &Trajectory, err: &str) -> FailureType {
    let e = RunError::new(err);
    let input = FailureInput {
        trajectory: t,
        error: Some(&e),
        claims: &[],
        goal: None,
        output: None,
    };
    c.classify(&input).unwrap().failure_type
}

fn subgoal(name: &str, status: &str) -> Step {
    let mut s = Step {
        action: "subgoal".into(),
        ..Step::default()
    };
    s.metadata.insert("subgoal".into(), json!(name));
    s.metadata.insert("status".into(), json!(status));
    s
}

#[test]
fn every_failure_type_has_a_rule() {
    let c = rules();
    let empty = Trajectory::default();
    assert_eq!(
        failed(&c, &empty, "Unknown tool: frobnicate"),
        WrongToolCalled
    );
    assert_eq!(
        failed(&c, &empty, "unsupported file type: .heic"),
        WrongToolCalled
    );
    let fenced = traj(vec![Step {
        llm_output: Some("As an AI language model I cannot".into()),
        ..Step::default()
    }]);
    assert_eq!(failed(&c, &fenced, "validator said no"), ConstraintIgnored);
    let same_call = traj(vec![
        call("search", json!({"q": "x"}), None),
        call("search", json!({"q": "x"}), None),
        call("search", json!({"q": "x"}), None),
    ]);
    assert_eq!(failed(&c, &same_call, "step budget"), LoopDetected);
    let same_error = traj(vec![
        call("search", json!({"q": "a"}), Some("missing field `q`")),
        call("search", json!({"q": "b"}), Some("missing field `q`")),
        call("search", json!({"q": "c"}), Some("missing field `q`")),
    ]);
    assert_eq!(failed(&c, &same_error, "gave up"), LoopDetected);
    // The same infrastructure error three times is an external fault, not a loop.
    let same_503 = traj(vec![
        call("search", json!({"q": "a"}), Some("HTTP 503")),
        call("search", json!({"q": "b"}), Some("HTTP 503")),
        call("search", json!({"q": "c"}), Some("HTTP 503")),
    ]);
    assert_eq!(failed(&c, &same_503, ""), ExternalFault);
    assert_eq!(
        failed(&c, &empty, "Expecting value: line 1 column 1 (char 0)"),
        SchemaMismatch
    );
    assert_eq!(
        failed(
            &c,
            &empty,
            "This model's maximum context length is 8192 tokens"
        ),
        ContextOverflow
    );
    assert_eq!(
        failed(&c, &empty, "connect ECONNREFUSED 127.0.0.1:80"),
        ExternalFault
    );
    assert_eq!(failed(&c, &empty, "context deadline exceeded"), Timeout);
    assert_eq!(
        failed(&c, &empty, "the model produced an empty answer"),
        Unknown
    );
    let plan = traj(vec![
        subgoal("a", "declared"),
        subgoal("b", "declared"),
        subgoal("a", "done"),
    ]);
    assert_eq!(failed(&c, &plan, "stopped"), PlanIncomplete);

    // Hallucinated state: the run claims an artifact the trajectory does not have.
    let claims = [Claim {
        kind: "artifact".into(),
        name: "report.pdf".into(),
    }];
    let t = traj(vec![call("render", json!({}), None)]);
    let input = FailureInput {
        trajectory: &t,
        error: None,
        claims: &claims,
        goal: None,
        output: None,
    };
    assert_eq!(c.classify(&input).unwrap().failure_type, HallucinatedState);
    let mut backed = t.clone();
    let mut art = Step::default();
    art.metadata.insert("artifact".into(), json!("report.pdf"));
    backed.push(art);
    let input = FailureInput {
        trajectory: &backed,
        ..input
    };
    assert_eq!(c.classify(&input), None);

    // Goal drift: the configured validator judges the output unrelated.
    let v: Arc<dyn GoalValidator> = Arc::new(|goal: &str, out: &Value| {
        let text = out.as_str().unwrap_or("");
        if goal.split(' ').any(|w| text.contains(w)) {
            Ok(())
        } else {
            Err(format!("{text:?} does not mention the goal"))
        }
    });
    let c = rules().with_validator(v);
    assert!(c.wants_output());
    let out = json!("a poem about cats");
    let input = FailureInput {
        trajectory: &empty,
        error: None,
        claims: &[],
        goal: Some("invoice total"),
        output: Some(&out),
    };
    assert_eq!(c.classify(&input).unwrap().failure_type, GoalDrift);
    let ok = json!("the invoice total is 12");
    let input = FailureInput {
        output: Some(&ok),
        ..input
    };
    assert_eq!(c.classify(&input), None);
}

#[test]
fn all_eleven_types_are_covered_above() {
    // Keeps this file honest if a type is added to the taxonomy.
    assert_eq!(FailureType::ALL.len(), 11);
}

#[test]
fn a_bad_constraint_names_its_index() {
    let e = RulesClassifier::new(&ClassifierConfig {
        loop_window: 3,
        constraints: vec!["ok".into(), "(".into()],
    })
    .unwrap_err();
    assert!(
        e.to_string().starts_with("classifier.constraints[1]"),
        "{e}"
    );
}

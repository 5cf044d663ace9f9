//! Failure policies: loading from TOML (errors name the key), backoff with seeded full jitter,
//! caps and Retry-After, and each combinator.

use hindsight::FailureType::*;
use hindsight::RecoveryAction;
use hindsight::triage::policy::{FailureContext, PolicyState, retry_after_ms};
use hindsight::triage::{Backoff, Classification, FailurePolicy, PolicyFile, Strategy};
use hindsight::{FailureType, Trajectory};

fn failure(ft: FailureType) -> Classification {
    Classification {
        failure_type: ft,
        error: None,
        rule: "test".into(),
        step_index: Some(0),
        message: "boom".into(),
    }
}

#[test]
fn the_shipped_policy_file_loads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/policy.toml");
    let p = PolicyFile::load(std::path::Path::new(path)).unwrap();
    assert_eq!(p.limits.max_recovery_attempts, 3);
    assert!(p.limits.strict_idempotency);
    assert_eq!(p.classifier.loop_window, 3);
    assert_eq!(p.policy.default, Some(Strategy::escalate_by_default()));
    assert!(matches!(
        p.policy.strategies.get(&ExternalFault),
        Some(Strategy::Chain { .. })
    ));
    assert_eq!(
        p.policy.strategies.get(&PlanIncomplete),
        Some(&Strategy::ResumeFromSubgoal)
    );
    p.rules_classifier().unwrap();
}

#[test]
fn errors_name_the_key() {
    for (text, key) in [
        (
            "[policy.types]\ntimout = \"escalate\"",
            "policy.types.timout",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"backoff_and_retry\"\nmax_attempts = -1",
            "policy.types.timeout.max_attempts",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"chain\"\nprimary = \"escalate\"",
            "policy.types.timeout.fallback",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"sequence\"\nsteps = [\"escalate\", { strategy = \"bogus\" }]",
            "policy.types.timeout.steps[1].strategy",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"replan\"",
            "policy.types.timeout.hint",
        ),
        (
            "[limits]\nmax_recovery_attempts = \"3\"",
            "limits.max_recovery_attempts",
        ),
        ("[limits]\nmax_retries = 3", "limits.max_retries"),
        (
            "[classifier]\nconstraints = [\"(\"]",
            "classifier.constraints[0]",
        ),
        ("[classifier]\nloop_window = 1", "classifier.loop_window"),
        ("[polcy]\n", "polcy"),
        // Unknown keys and wrong types, at any depth, are named with their path.
        ("[limits]\nmax_cost = \"x\"", "limits.max_cost"),
        ("[limits]\nmax_cost = -1", "limits.max_cost"),
        (
            "[classifier]\nconstraints = \"x\"",
            "classifier.constraints",
        ),
        ("[policy]\ndefault = 3", "policy.default"),
        ("limits = [3]", "limits"),
        (
            "[policy.types.timeout]\nstrategy = \"backoff_and_retry\"\nhint = \"h\"",
            "policy.types.timeout.hint",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"chain\"\nprimary = { strategy = \"replan\", hint = 3 }\nfallback = \"abort\"",
            "policy.types.timeout.primary.hint",
        ),
        (
            "[policy.types.timeout]\nstrategy = \"sequence\"\nsteps = [\"escalate\", { strategy = \"abort\", bogus = 1 }]",
            "policy.types.timeout.steps[1].bogus",
        ),
        (
            "[policy.types.timeout]\nmax_attempts = 2",
            "policy.types.timeout.strategy",
        ),
    ] {
        let e = PolicyFile::parse(text, "p.toml").unwrap_err().to_string();
        assert!(e.starts_with(&format!("p.toml: {key}:")), "{text:?} -> {e}");
    }
    let e = PolicyFile::parse("[limits", "p.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.toml:"), "{e}");
}

#[test]
fn backoff_is_full_jitter_capped_and_seeded() {
    let b = Backoff {
        max_attempts: 10,
        base_ms: 100,
        cap_ms: 1_000,
    };
    let mut rng = fastrand::Rng::with_seed(1);
    let mut max_seen = 0;
    for k in 0..10 {
        for _ in 0..200 {
            let d = b.delay_ms(k, None, &mut rng);
            let ceiling = (100u64 << k).min(1_000);
            assert!(d <= ceiling, "k={k} d={d}");
            max_seen = max_seen.max(d);
        }
    }
    assert!(max_seen > 900, "the cap is reached, not exceeded");
    let draw = |seed| {
        let mut r = fastrand::Rng::with_seed(seed);
        (0..5)
            .map(|k| b.delay_ms(k, None, &mut r))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(9), draw(9));
    assert_ne!(draw(9), draw(10));
    // Retry-After is a floor, even above the cap.
    assert_eq!(b.delay_ms(0, Some(5_000), &mut rng), 5_000);
    // A huge retry index neither overflows nor passes the cap.
    assert!(b.delay_ms(u32::MAX, None, &mut rng) <= 1_000);
}

#[test]
fn retry_after_is_read_from_messages() {
    assert_eq!(retry_after_ms("Retry-After: 30"), Some(30_000));
    assert_eq!(
        retry_after_ms("Rate limit exceeded. Try again in 20 seconds."),
        Some(20_000)
    );
    assert_eq!(retry_after_ms("Please retry in 1.5s"), Some(1_500));
    assert_eq!(retry_after_ms("retry after 250ms"), Some(250));
    assert_eq!(retry_after_ms("HTTP 503"), None);
}

fn decide(
    p: &FailurePolicy,
    ft: FailureType,
    occurrence: u32,
    st: &mut PolicyState,
) -> RecoveryAction {
    let f = failure(ft);
    let t = Trajectory::default();
    let fc = FailureContext {
        failure: &f,
        trajectory: &t,
        occurrence,
        retry_after_ms: None,
        manifest: None,
    };
    p.decide(&fc, st, &mut fastrand::Rng::with_seed(0))
}

#[test]
fn combinators_and_defaults() {
    let p = FailurePolicy::new().on(
        Unknown,
        Strategy::sequence(vec![
            Strategy::replan("first", 5),
            Strategy::retry_with_tool_manifest(5),
        ]),
    );
    let mut st = PolicyState::default();
    assert_eq!(decide(&p, Unknown, 1, &mut st).kind(), "replan");
    assert_eq!(decide(&p, Unknown, 2, &mut st).kind(), "retry");
    assert!(matches!(
        decide(&p, Unknown, 3, &mut st),
        RecoveryAction::Escalate { message } if message.contains("sequence")
    ));
    // No strategy and no default: escalate, naming the type.
    assert!(matches!(
        decide(&p, Timeout, 1, &mut st),
        RecoveryAction::Escalate { message } if message.contains("No strategy registered for timeout")
    ));
    let p = FailurePolicy::new().otherwise(Strategy::abort_by_default());
    assert_eq!(decide(&p, GoalDrift, 1, &mut st).kind(), "abort");
    // Chain hands over on the kinds it is told to.
    let p = FailurePolicy::new().on(
        Timeout,
        Strategy::Chain {
            primary: Box::new(Strategy::replan("x", 1)),
            fallback: Box::new(Strategy::suspend("approve?")),
            after_kinds: vec!["escalate".into()],
        },
    );
    let mut st = PolicyState::default();
    assert_eq!(decide(&p, Timeout, 1, &mut st).kind(), "replan");
    assert_eq!(decide(&p, Timeout, 2, &mut st).kind(), "suspend");
    assert_eq!(st.used(Timeout, "replan"), 1);
}

//! Tests of the simulated agent environments: the shipped files, contract-breaking files refused
//! with the key named, tasks, the tools' calls (infra, params, rules), the model's turns (cues,
//! following, crowding, retries, quirks, corrections before fixes, context overflow), validation,
//! reward, repeat-error sources and the oracle figure. Deterministic by seed.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde_json::{Value, json};

use super::*;
use crate::model::{ChatMessage, ChatRequest, LanguageModel, ModelError, ToolDef, TurnContext};
use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::tools::tool::{CallContext, ToolError, ToolOutput};

/// Polls a future that is ready at once (the simulators never wait).
fn now<T>(f: impl Future<Output = T>) -> T {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a simulated call is never pending"),
    }
}

fn shipped(name: &str) -> AgentEnv {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/envs")
        .join(name);
    AgentEnv::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn support() -> AgentEnv {
    shipped("support_desk.toml")
}

/// A small environment to vary: one tool with two rules, a one-call plan.
fn tiny(model: &str, extra: &str) -> AgentEnv {
    let text = format!(
        r#"
name = "tiny"
goal = "Look up {{kind}} item"
sla_ms = 1000

[features]
kind = {{ values = ["a", "b"] }}

[input]
who = "user {{index}}"

[[tool]]
name = "lookup"
description = "Look an item up"
params = {{ query = "string", email = "string?", limit = "integer?" }}
returns = {{ id = "item_{{index}}" }}
latency_ms = 100
cost = 0.01

[[tool.rule]]
require = {{ has = ["email"] }}
error = "SchemaMismatch"
message = "ambiguous name; search by email"
fix = {{ set = {{ email = "x@example.com" }} }}
cue = ["email"]

[[tool.rule]]
require = {{ absent = ["limit"] }}
error = "DeterministicFailure"
message = "limit is refused for this key"
fix = {{ remove = ["limit"] }}
cue = ["limit", "refused"]

[model]
{model}

[[plan]]
calls = [ {{ tool = "lookup", args = {{ query = "{{input.who}}" }} }} ]
answer = "found {{lookup.id}}"
{extra}
"#
    );
    AgentEnv::parse(&text, "tiny.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// What a conversation came to.
#[derive(Debug, Default)]
struct Run {
    answer: Option<String>,
    error: Option<ModelError>,
    calls: Vec<(String, Value, Result<ToolOutput, ToolError>)>,
    tokens: u64,
    turns: u32,
}

impl Run {
    fn passed(&self, env: &AgentEnv, index: u64) -> bool {
        self.answer
            .as_deref()
            .is_some_and(|a| env.validate(index, a).is_ok())
    }
}

fn offered(env: &AgentEnv) -> Vec<ToolDef> {
    env.tools()
        .iter()
        .map(|t| ToolDef {
            name: t.spec().name.clone(),
            description: t.spec().description.clone(),
            parameters: t.spec().input_schema.clone(),
        })
        .collect()
}

/// Runs one attempt of task `index`: `system` as the first message, the goal and input as the
/// user's, at most `max_turns` turns.
fn converse(
    env: &AgentEnv,
    model: &SimModel,
    index: u64,
    attempt: u32,
    system: &str,
    tools: Vec<ToolDef>,
    max_turns: u32,
) -> Run {
    let task = env.task(index);
    let registry = env.tools();
    let mut req = ChatRequest {
        messages: vec![
            ChatMessage::system(system),
            ChatMessage::user(format!(
                "{}\ninput: {}",
                task.goal,
                task.input.clone().unwrap_or_default()
            )),
        ],
        tools,
        ..ChatRequest::default()
    };
    let mut run = Run::default();
    let mut call_no = 0;
    for turn in 0..max_turns {
        run.turns = turn + 1;
        let ctx = TurnContext {
            task_index: index,
            attempt,
            turn,
            goal: task.goal.clone(),
            features: task.features.clone(),
            input: task.input.clone(),
            ..TurnContext::default()
        };
        let reply = match now(model.turn(&req, &ctx)) {
            Ok(r) => r,
            Err(e) => {
                run.error = Some(e);
                return run;
            }
        };
        run.tokens += u64::from(reply.usage.map_or(0, |u| u.total()));
        if reply.tool_calls.is_empty() {
            run.answer = Some(reply.content);
            return run;
        }
        req.messages.push(ChatMessage::assistant(
            reply.content,
            reply.tool_calls.clone(),
        ));
        for c in reply.tool_calls {
            let tool = registry
                .iter()
                .find(|t| t.spec().name == c.name)
                .expect("the model calls offered tools");
            let cctx = CallContext {
                task_index: index,
                attempt,
                call: call_no,
                turn,
                features: task.features.clone(),
                input: task.input.clone(),
                ..CallContext::default()
            };
            call_no += 1;
            let result = now(tool.call(c.arguments.clone(), &cctx));
            req.messages.push(ChatMessage::tool(
                c.id.clone(),
                crate::run::agent::tool_message_text(&result.clone().map(|o| o.value)),
            ));
            run.calls.push((c.name, c.arguments, result));
        }
    }
    run
}

fn rate(hits: usize, n: usize) -> f64 {
    hits as f64 / n as f64
}

fn near(x: f64, want: f64, tol: f64) {
    assert!((x - want).abs() <= tol, "{x} is not within {tol} of {want}");
}

// ---- the shipped files ----

#[test]
fn shipped_files_parse() {
    let s = support();
    assert_eq!(s.name(), "support-desk");
    assert_eq!(s.spec().tools.len(), 4);
    assert_eq!(s.spec().plans.len(), 3);
    assert_eq!(s.spec().corrections.len(), 2);
    let ops = shipped("ops_runbook.toml");
    assert_eq!(ops.spec().plans[0].calls.len(), 6);
    assert!(ops.spec().tools.iter().filter(|t| !t.idempotent).count() >= 3);
    assert_eq!(ops.spec().model.context_window, 1500);
    let research = shipped("research_assistant.toml");
    assert!(research.spec().corrections.iter().any(|c| c.poisoned));
    assert!(research.spec().corrections.iter().any(|c| !c.poisoned));
    assert!(research.spec().model.p_claim > 0.0 && research.spec().model.p_drift > 0.0);
    // Written apart from the others, from a different angle (see config/envs/README.md).
    let travel = shipped("travel_booking.toml");
    assert_eq!(travel.spec().plans.len(), 4);
    assert!(travel.spec().corrections.iter().any(|c| c.poisoned));
    let claims = shipped("claims_intake.toml");
    assert_eq!(claims.spec().features.len(), 3);
    assert!(claims.spec().corrections.iter().all(|c| c.poisoned));
    let warehouse = shipped("warehouse_loader.toml");
    assert_eq!(warehouse.spec().plans[0].calls.len(), 7);
    assert_eq!(warehouse.spec().corrections.len(), 2);
    let shared =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envs/AGENT-FORMAT.md");
    assert!(std::fs::read_to_string(shared).is_ok_and(|t| t.contains("## Semantics")));
}

// ---- contract-breaking files ----

fn refused(text: &str) -> (String, String) {
    match AgentEnv::parse(text, "bad.toml") {
        Ok(_) => panic!("accepted a file that breaks the contract"),
        Err(SimError::Key {
            file,
            key,
            expected,
        }) => {
            assert_eq!(file, "bad.toml");
            (key, expected)
        }
        Err(e) => panic!("not a key error: {e}"),
    }
}

fn support_text() -> String {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envs/support_desk.toml");
    std::fs::read_to_string(path).expect("shipped file")
}

#[test]
fn files_breaking_the_contract_are_refused_with_the_key() {
    let base = support_text();
    let cases: Vec<(String, &str, &str)> = vec![
        (
            base.replace("latency_ms = 400\n", "latency_ms = 400\ncolour = \"red\"\n"),
            "tool[0].colour",
            "unknown",
        ),
        (
            base.replace(
                "customer_id = \"{search_customers.id}\" } },\n]\nanswer = \"{input.customer} has",
                "customer_id = \"{search_customers.idd}\" } },\n]\nanswer = \"{input.customer} has",
            ),
            "plan[0].calls[1].args.customer_id",
            "no field",
        ),
        (
            base.replace(
                "answer = \"{input.customer} has",
                "answer = \"{reset_login.ticket} {input.customer} has",
            ),
            "plan[0].answer",
            "not a tool called earlier",
        ),
        (
            base.replace(
                "query = \"{input.customer}\" } },\n  { tool = \"list_invoices\"",
                "query = \"{input.nobody}\" } },\n  { tool = \"list_invoices\"",
            ),
            "plan[0].calls[0].args.query",
            "names no key of [input]",
        ),
        (
            base.replace("goal = \"Answer the {tier}", "goal = \"Answer the {level}"),
            "goal",
            "names no feature",
        ),
        (
            base.replace("limit = \"integer?\"", "limit = \"int?\""),
            "tool[0].params.limit",
            "expected string, integer, number or boolean",
        ),
        (
            base.replace("error = \"ToolNotFit\"", "error = \"NotFit\""),
            "tool[3].rule[0].error",
            "unknown error class",
        ),
        (
            base.replace(
                "require = { has = [\"since\"] }",
                "require = { has = [\"until\"] }",
            ),
            "tool[1].rule[0].require.has[0]",
            "expected a parameter of tool `list_invoices`",
        ),
        (
            base.replace(
                "require = { equals = { notify = true } }",
                "require = { equals = { notify = \"yes\" } }",
            ),
            "tool[2].rule[0].require.equals.notify",
            "expected a value of type boolean",
        ),
        (
            base.replace(
                "args = { customer_id = \"{search_customers.id}\" } },\n]\nanswer = \"A reset",
                "args = { } },\n]\nanswer = \"A reset",
            ),
            "plan[1].calls[1].args",
            "`customer_id` is missing",
        ),
        (
            base.replace("p_follow = 0.9", "p_follow = 1.5"),
            "model.p_follow",
            "probability",
        ),
        (
            base.replace(
                "text = \"When calling search_customers always set limit",
                "text = \"When searching always set limit",
            ),
            "correction[1].text",
            "every cue word",
        ),
        (
            base.replace("cue = [\"csv\"]", "cue = [\"c s v\"]"),
            "tool[3].rule[0].cue[0]",
            "one word",
        ),
        (
            base.replace(
                "tool = \"list_invoices\"\nset",
                "tool = \"list_bills\"\nset",
            ),
            "correction[0].tool",
            "expected the name of a [[tool]]",
        ),
        (
            base.replace("when = { tier = \"pro\" }", "when = { tier = \"gold\" }"),
            "tool[1].rule[0].when.tier",
            "one of the feature's values",
        ),
        (
            base.replace(
                "fix = { remove = [\"limit\"] }",
                "fix = { remove = [\"query\"] }",
            ),
            "tool[0].rule[1].fix.remove[0]",
            "optional parameter",
        ),
        (
            base.replace("name = \"reset_login\"", "name = \"reset-login\""),
            "tool[2].name",
            "letters, digits and underscores",
        ),
    ];
    for (text, key, why) in cases {
        assert_ne!(text, base, "case {key} did not change the file");
        let (k, e) = refused(&text);
        assert_eq!(k, key, "{e}");
        assert!(e.contains(why), "{key}: `{e}` does not say `{why}`");
    }
    assert!(matches!(
        AgentEnv::parse("name = ", "x.toml"),
        Err(SimError::Toml { .. })
    ));
}

// ---- tasks ----

#[test]
fn tasks_render_goal_input_and_id() {
    let env = support().with_seed(7);
    let t = env.task(42);
    assert_eq!(t.task_id, "support-desk#42");
    assert_eq!(
        t.goal,
        format!(
            "Answer the {} customer's question about {}",
            t.features["tier"], t.features["topic"]
        )
    );
    assert_eq!(
        t.input,
        Some(json!({"customer": "Customer 42", "email": "c42@example.com", "since": "2026-01-01"}))
    );
    // Features drawn as FORMAT.md draws them.
    assert_eq!(
        t.features,
        crate::tools::sim::draw_features(&env.spec().features, 7, 42)
    );
    let n = 6000;
    let ent = (0..n)
        .filter(|&i| env.task(i).features["tier"] == "enterprise")
        .count();
    near(rate(ent, n as usize), 0.2, 0.02);
}

// ---- the tools ----

fn call(
    env: &AgentEnv,
    tool: &str,
    index: u64,
    call: u32,
    args: Value,
) -> Result<ToolOutput, ToolError> {
    let tools = env.tools();
    let t = tools.iter().find(|t| t.spec().name == tool).expect("tool");
    let task = env.task(index);
    let ctx = CallContext {
        task_index: index,
        call,
        features: task.features,
        input: task.input,
        ..CallContext::default()
    };
    now(t.call(args, &ctx))
}

/// Support desk without infrastructure faults.
fn calm_support() -> AgentEnv {
    let text = support_text().replace("p_fault = 0.04", "p_fault = 0.0");
    AgentEnv::parse(&text, "calm.toml").expect("parses")
}

fn index_where(env: &AgentEnv, f: impl Fn(&BTreeMap<String, String>) -> bool) -> u64 {
    (0..).find(|&i| f(&env.features(i))).expect("some task")
}

#[test]
fn a_call_checks_params_then_rules_in_order_then_returns() {
    let env = calm_support();
    let free = index_where(&env, |f| f["tier"] == "free");
    let ent = index_where(&env, |f| f["tier"] == "enterprise");
    // Returns rendered.
    let ok = call(&env, "search_customers", free, 0, json!({"query": "x"})).expect("passes");
    assert_eq!(
        ok.value,
        json!({"id": format!("cus_{free}"), "plan": "free"})
    );
    assert!(ok.latency_ms > 0.0 && ok.cost == 0.001);
    // Missing required, mistyped, unexpected: SchemaMismatch before any rule.
    for args in [
        json!({"email": "a@b"}),
        json!({"query": "x", "limit": "lots"}),
        json!({"query": 5}),
        json!({"query": "x", "colour": "red"}),
    ] {
        let e = call(&env, "search_customers", ent, 0, args.clone()).expect_err("refused");
        assert_eq!(e.class, ErrorClass::SchemaMismatch, "{args}");
        assert_eq!(e.category, FailureCategory::Strategy);
        assert!(
            e.message
                .starts_with("invalid arguments for search_customers")
        );
        assert!(
            e.latency_ms > 0.0 && e.cost > 0.0,
            "a failed call costs too"
        );
    }
    // A rendered string converts: "10" is an integer, so the limit rule (not params) fails it.
    let e = call(
        &env,
        "search_customers",
        free,
        0,
        json!({"query": "x", "limit": "10"}),
    )
    .expect_err("rule");
    assert_eq!(e.message, "limit above 1000 is refused for this API key");
    // Rules in order: an enterprise call breaking both fails with the first.
    let e = call(
        &env,
        "search_customers",
        ent,
        0,
        json!({"query": "x", "limit": 5}),
    )
    .expect_err("rule");
    assert_eq!(e.class, ErrorClass::SchemaMismatch);
    assert!(e.message.starts_with("a name search matched 512"));
    // `when` restricts a rule: the free tier needs no email.
    assert!(call(&env, "search_customers", free, 0, json!({"query": "x"})).is_ok());
    // `equals` compares after conversion: "true" and true both satisfy notify = true.
    for notify in [json!(true), json!("true")] {
        assert!(
            call(
                &env,
                "reset_login",
                free,
                0,
                json!({"customer_id": "c", "notify": notify})
            )
            .is_ok()
        );
    }
    let e = call(
        &env,
        "reset_login",
        free,
        0,
        json!({"customer_id": "c", "notify": false}),
    )
    .expect_err("rule");
    assert_eq!(e.class, ErrorClass::DeterministicFailure);
}

#[test]
fn infrastructure_faults_follow_their_rate_and_read_like_real_ones() {
    let env = support();
    let n = 20_000;
    let mut faults = 0;
    let mut classes = BTreeMap::new();
    for i in 0..n {
        let args = json!({"customer_id": "c", "since": "x"});
        if let Err(e) = call(&env, "list_invoices", i, 0, args)
            && e.category == FailureCategory::Infrastructure
        {
            faults += 1;
            *classes.entry(e.class).or_insert(0) += 1;
            let c = crate::triage::classify_error(None, &e.message);
            assert_eq!(
                c.error_class, e.class,
                "{} reads as {:?}",
                e.message, c.error_class
            );
            assert_eq!(c.category, FailureCategory::Infrastructure, "{}", e.message);
        }
    }
    near(rate(faults, n as usize), 0.04, 0.006);
    // { TransientNetwork = 2, RateLimit = 1, Timeout = 1 }.
    near(
        rate(classes[&ErrorClass::TransientNetwork], faults),
        0.5,
        0.06,
    );
    near(rate(classes[&ErrorClass::RateLimit], faults), 0.25, 0.06);
    // A tool's own p_infra overrides [infra].p_fault.
    let ops = shipped("ops_runbook.toml");
    let args = json!({"host": "h", "source": "s", "target": "t"});
    let f = (0..n)
        .filter(|&i| {
            call(&ops, "compress_file", i, 0, args.clone()).is_err_and(|e| e.is_infrastructure())
        })
        .count();
    near(rate(f, n as usize), 0.06, 0.008);
    // Seeded by (seed, task, attempt, turn, call): the same call gives the same draw.
    let a = call(
        &env,
        "list_invoices",
        3,
        1,
        json!({"customer_id": "c", "since": "x"}),
    );
    let b = call(
        &env,
        "list_invoices",
        3,
        1,
        json!({"customer_id": "c", "since": "x"}),
    );
    assert_eq!(a, b);
}

// ---- the model ----

#[test]
fn context_overflow_fails_like_a_server() {
    let env = tiny("context_window = 20", "");
    let long = "word ".repeat(30);
    let run = converse(&env, &env.model(), 0, 0, &long, offered(&env), 5);
    let Some(ModelError::Request { message, class, .. }) = run.error else {
        panic!("expected a request error, got {run:?}");
    };
    assert!(
        message.starts_with("context length exceeded: "),
        "{message}"
    );
    assert!(message.ends_with(" tokens > 20"), "{message}");
    assert_eq!(
        class,
        crate::triage::classify_error(None, &message).error_class
    );
    assert_eq!(class, ErrorClass::ToolNotFit);
    // Under the window, usage reports the request's tokens and completion_tokens.
    let env = tiny("completion_tokens = 7", "");
    let req = ChatRequest {
        messages: vec![ChatMessage::user("one two three")],
        tools: offered(&env),
        ..ChatRequest::default()
    };
    let reply = now(env.model().turn(&req, &TurnContext::default())).expect("turn");
    let usage = reply.usage.expect("usage");
    // 3 words + tool name 1 + description 4 + 3 parameter names.
    assert_eq!(usage.prompt_tokens, 3 + 1 + 4 + 3);
    assert_eq!(u64::from(usage.prompt_tokens), request_tokens(&req));
    assert_eq!(usage.completion_tokens, 7);
}

#[test]
fn cues_match_whole_words_case_insensitively_on_one_line() {
    let env = tiny("p_follow = 1.0", "");
    let first_args = |system: &str| {
        let run = converse(&env, &env.model(), 0, 0, system, offered(&env), 1);
        run.calls.first().map(|c| c.1.clone()).expect("a call")
    };
    let has_email = |system: &str| first_args(system).get("email").is_some();
    assert!(has_email("LOOKUP: pass an Email."));
    assert!(has_email(
        "notes\nwhen calling lookup, the email is needed\nmore"
    ));
    assert!(!has_email("lookups need an email"), "lookups is not lookup");
    assert!(!has_email("lookup needs emails"), "emails is not email");
    assert!(!has_email("lookup needs\nan email"), "two lines");
    assert!(!has_email("look_up needs an email"));
    assert!(!has_email(""));
}

#[test]
fn a_known_fix_is_followed_with_p_follow_scaled_by_crowd() {
    let n = 4000;
    let followed = |env: &AgentEnv, system: &str| {
        (0..n)
            .filter(|&i| {
                let run = converse(env, &env.model(), i, 0, system, offered(env), 1);
                run.calls[0].1.get("email").is_some()
            })
            .count()
    };
    let env = tiny("p_follow = 0.7", "");
    near(
        rate(followed(&env, "lookup: use the email"), n as usize),
        0.7,
        0.03,
    );
    // Crowd: p_follow * crowd / tokens once the request is longer than `crowd`.
    let env = tiny("p_follow = 0.8\ncrowd = 40", "");
    let system = format!("lookup: use the email\n{}", "filler ".repeat(100));
    let req = ChatRequest {
        messages: vec![
            ChatMessage::system(&system),
            ChatMessage::user(format!(
                "{}\ninput: {}",
                env.task(0).goal,
                env.task(0).input.unwrap_or_default()
            )),
        ],
        tools: offered(&env),
        ..ChatRequest::default()
    };
    let tokens = request_tokens(&req) as f64;
    assert!(tokens > 100.0);
    near(
        rate(followed(&env, &system), n as usize),
        0.8 * 40.0 / tokens,
        0.03,
    );
}

#[test]
fn the_model_learns_from_the_failure_and_retries_at_most_retries_times() {
    // Known only from the tool's own failure: the retry follows the fix with p_follow.
    let env = tiny("p_follow = 1.0\nretries = 2", "");
    let run = converse(&env, &env.model(), 0, 0, "", offered(&env), 10);
    assert_eq!(run.calls.len(), 2, "{run:?}");
    assert_eq!(
        run.calls[0].2.as_ref().expect_err("fails").message,
        "ambiguous name; search by email"
    );
    assert!(run.calls[1].2.is_ok());
    assert!(run.passed(&env, 0));
    // Never following: the call is made 1 + retries times, then the model gives up.
    for retries in [0, 1, 3] {
        let env = tiny(&format!("p_follow = 0.0\nretries = {retries}"), "");
        let run = converse(&env, &env.model(), 0, 0, "", offered(&env), 20);
        assert_eq!(run.calls.len() as u32, retries + 1);
        let answer = run.answer.clone().expect("answers");
        assert!(
            answer.starts_with("I could not finish: lookup kept failing"),
            "{answer}"
        );
        assert!(!run.passed(&env, 0));
    }
}

#[test]
fn a_correction_applies_before_a_rule_fix_on_the_same_argument() {
    // The correction sets limit (a poisoned one); the rule's fix removes it: the fix wins.
    let extra = r#"
[[correction]]
at_task = 0
tool = "lookup"
set = { limit = 100000, email = "wrong@example.com" }
cue = ["limit"]
text = "lookup: always set limit to 100000"
poisoned = true
"#;
    let env = tiny("p_follow = 1.0", extra);
    let text = &env.spec().corrections[0].text;
    let both = format!("{text}\nlookup: search by email, a limit is refused");
    let run = converse(&env, &env.model(), 0, 0, &both, offered(&env), 5);
    let args = &run.calls[0].1;
    assert_eq!(
        args.get("limit"),
        None,
        "the rule's fix removed what the correction set"
    );
    assert_eq!(
        args["email"],
        json!("x@example.com"),
        "the rule's fix overwrote the correction"
    );
    assert!(run.passed(&env, 0));
    // The correction alone: its effect is applied (and fails the call on the limit rule).
    let run = converse(&env, &env.model(), 0, 0, text, offered(&env), 1);
    assert_eq!(run.calls[0].1["limit"], json!(100000));
    assert_eq!(run.calls[0].1["email"], json!("wrong@example.com"));
    let e = run.calls[0].2.as_ref().expect_err("fails");
    assert_eq!(e.message, "limit is refused for this key");
    // That failure belongs to the correction, not to the rule: a different repeat key.
    let src = env.failure_source(0, "lookup", &run.calls[0].1, &e.message);
    assert_eq!(src, Some(FailureSource::Correction { index: 0 }));
    let src = env.failure_source(
        0,
        "lookup",
        &json!({"query": "q", "email": "e", "limit": 3}),
        &e.message,
    );
    assert_eq!(src.map(|s| s.key()), Some("rule:lookup:1".to_string()));
    assert_eq!(
        env.failure_source(0, "lookup", &json!({}), "HTTP 503 Service Unavailable"),
        None
    );
    // The oracle follows no poisoned correction.
    let run = converse(&env, &env.oracle_model(), 0, 0, text, offered(&env), 5);
    assert_eq!(run.calls.len(), 1);
    assert!(run.passed(&env, 0));
}

#[test]
fn quirks_are_drawn_once_per_attempt_at_their_rates() {
    let env = tiny(
        "p_loop = 0.1\np_claim = 0.2\np_stop = 0.3\np_drift = 0.4",
        "",
    );
    let m = env.model();
    let n = 8000;
    let q: Vec<Quirks> = (0..n).map(|i| m.quirks(i / 2, (i % 2) as u32)).collect();
    near(
        rate(q.iter().filter(|q| q.looping).count(), n as usize),
        0.1,
        0.015,
    );
    near(
        rate(q.iter().filter(|q| q.claim.is_some()).count(), n as usize),
        0.2,
        0.015,
    );
    near(
        rate(q.iter().filter(|q| q.stop).count(), n as usize),
        0.3,
        0.02,
    );
    near(
        rate(q.iter().filter(|q| q.drift.is_some()).count(), n as usize),
        0.4,
        0.02,
    );
    // Drawn again per attempt: the attempts of one task differ.
    assert!((0..200).any(|i| m.quirks(i, 0) != m.quirks(i, 1)));
    assert_eq!(env.oracle_model().quirks(1, 0), Quirks::default());
}

fn quirky(what: &str) -> (AgentEnv, SimModel, u64) {
    let env = tiny(&format!("p_follow = 1.0\n{what} = 1.0"), "");
    let m = env.model();
    (env, m, 3)
}

#[test]
fn each_quirk_does_what_the_contract_says() {
    let sys = "lookup: pass the email";
    // Loop: the first successful call again and again.
    let (env, m, i) = quirky("p_loop");
    let run = converse(&env, &m, i, 0, sys, offered(&env), 6);
    assert!(run.answer.is_none() && run.calls.len() == 6);
    assert!(run.calls.windows(2).all(|w| w[0].1 == w[1].1));
    // Claim: a reference no tool returned; validation refuses it.
    let (env, m, i) = quirky("p_claim");
    let run = converse(&env, &m, i, 0, sys, offered(&env), 6);
    let answer = run.answer.clone().expect("answers");
    assert!(
        answer.contains("found item_3") && answer.contains("ref-"),
        "{answer}"
    );
    let why = env.validate(i, &answer).expect_err("refused");
    assert!(why.contains("ref-"), "{why}");
    // Stop: answers right after its first call (which failed here: no cue given).
    let (env, m, i) = quirky("p_stop");
    let run = converse(&env, &m, i, 0, "", offered(&env), 6);
    assert_eq!(run.calls.len(), 1);
    assert!(!run.passed(&env, i));
    // Drift: answers about the other value of the goal's first feature.
    let (env, m, i) = quirky("p_drift");
    let run = converse(&env, &m, i, 0, sys, offered(&env), 6);
    let answer = run.answer.clone().expect("answers");
    let other = if env.features(i)["kind"] == "a" {
        "b"
    } else {
        "a"
    };
    assert!(
        answer.starts_with(&format!("Look up {other} item")),
        "{answer}"
    );
    assert!(!run.passed(&env, i));
}

#[test]
fn a_tool_not_offered_is_skipped_and_its_value_is_missing() {
    let env = calm_support();
    let billing = index_where(&env, |f| f["topic"] == "billing" && f["tier"] == "free");
    let only_search: Vec<ToolDef> = offered(&env)
        .into_iter()
        .filter(|t| t.name == "search_customers")
        .collect();
    let run = converse(&env, &env.oracle_model(), billing, 0, "", only_search, 10);
    assert!(run.calls.iter().all(|c| c.0 == "search_customers"));
    let answer = run.answer.clone().expect("answers");
    assert!(answer.contains(" invoices totalling "), "{answer}");
    assert!(!run.passed(&env, billing));
}

// ---- validation, reward, the oracle ----

#[test]
fn validation_needs_the_rendered_answer_and_no_ref() {
    let env = support();
    let i = index_where(&env, |f| f["topic"] == "billing");
    let expected = env.expected_answer(i).expect("a plan");
    assert_eq!(
        expected,
        format!("Customer {i} has 3 invoices totalling {i}.50 EUR")
    );
    assert!(env.validate(i, &format!("Done. {expected}.")).is_ok());
    assert!(env.validate(i, &format!("{expected} (ref-12)")).is_err());
    assert!(
        env.validate(i, &format!("{expected} (pref-12 is a word)"))
            .is_ok()
    );
    assert!(env.validate(i, "Customer has invoices").is_err());
}

#[test]
fn reward_is_format_md_minus_tokens() {
    let env = support();
    // sla 30000, latency 0.2, cost 0.1 / max_cost 0.1, tokens 0.1 / 20000.
    near(
        env.reward(true, 15_000.0, 0.05, 10_000.0),
        1.0 - 0.1 - 0.05 - 0.05,
        1e-12,
    );
    near(env.reward(true, 0.0, 0.0, 1e9), 0.9, 1e-12);
    assert_eq!(env.reward(false, 0.0, 0.0, 0.0), 0.0);
}

#[test]
fn oracle_first_try_success_is_exact_and_matches_the_oracle_model() {
    let env = support();
    // Every plan makes two calls at p_fault 0.04.
    near(env.oracle_first_try_success(), 0.96 * 0.96, 1e-12);
    let ops = shipped("ops_runbook.toml");
    near(
        ops.oracle_first_try_success(),
        0.98f64.powi(5) * 0.94,
        1e-12,
    );
    let research = shipped("research_assistant.toml");
    // survey (2/6): two calls; else three calls; p_fault 0.02.
    near(
        research.oracle_first_try_success(),
        (2.0 / 6.0) * 0.98f64.powi(2) + (4.0 / 6.0) * 0.98f64.powi(3),
        1e-12,
    );
    // The oracle model passes exactly the tasks where no fault struck.
    for env in [support(), ops, research] {
        let n = 1500;
        let mut passed = 0;
        for i in 0..n {
            let run = converse(&env, &env.oracle_model(), i, 0, "", offered(&env), 30);
            let clean = run
                .calls
                .iter()
                .all(|c| !c.2.as_ref().is_err_and(|e| e.is_infrastructure()));
            assert!(
                run.passed(&env, i) || !clean,
                "{}: task {i}: {run:?}",
                env.name()
            );
            assert!(run.calls.iter().all(
                |c| c.2.as_ref().is_ok() || c.2.as_ref().is_err_and(|e| e.is_infrastructure())
            ));
            if clean && run.passed(&env, i) {
                passed += 1;
            }
        }
        near(
            rate(passed, n as usize),
            env.oracle_first_try_success(),
            0.03,
        );
    }
}

#[test]
fn the_default_model_learns_within_a_conversation_and_spends_tokens() {
    let env = calm_support().with_seed(3);
    let m = env.model();
    let n = 600;
    let mut passed = 0;
    for i in 0..n {
        let run = converse(&env, &m, i, 0, "", offered(&env), 20);
        assert!(run.tokens > 0);
        passed += usize::from(run.passed(&env, i));
    }
    // Rule failures are learned from (p_follow 0.9, two retries); quirks cost ~4%.
    let r = rate(passed, n as usize);
    assert!(r > 0.8 && r < 1.0, "{r}");
}

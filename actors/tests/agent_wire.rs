//! What an agent's model server receives, through the whole tree: the agent's turns are made by
//! the OpenAI-compatible client against a scripted server on loopback, which reads each request
//! body as a real server would. The tool manifest reaches the body after a wrong tool, the
//! lessons (`<strategy_context>`) after failures taught them, ReflectRetry's reflection after a
//! rejected round; and a priced endpoint's tokens become the run's cost.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use hindsight::Task;
use hindsight::model::Price;
use hindsight::model::openai::{OpenAiClient, OpenAiConfig};
use hindsight::run::{AgentStage, AgentVariant, WorkflowStage};
use hindsight::store::Durability;
use hindsight::tools::sim::RewardConfig;
use hindsight::tools::{
    CallContext, Tool, ToolError, ToolFuture, ToolOutput, ToolRegistry, ToolSpec,
};
use hindsight::{ErrorClass, FailureCategory, RunState};
use hindsight_actors::runtime::{Runtime, RuntimeOptions, WorkflowSource};
use serde_json::{Value, json};

/// Every request body the server received.
type Seen = Arc<Mutex<Vec<Value>>>;

fn text_of(body: &Value) -> String {
    body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Whether the conversation already holds the lookup's result.
fn has_result(body: &Value) -> bool {
    body["messages"].as_array().is_some_and(|ms| {
        ms.iter().any(|m| {
            m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.contains("120.50"))
        })
    })
}

fn call(name: &str, args: Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": name, "arguments": args.to_string()}
    }]})
}

fn say(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

/// The scripted model. The user message names the task's kind:
/// - `manifest`: calls `fetch_record` (not offered) until the system message lists the
///   toolset (`- lookup:`), then `lookup`, then answers;
/// - `lesson`: calls `lookup` without `region` unless the conversation says `region=eu` (the
///   tool's own error says it, and so does a lesson), then answers;
/// - `reflect`: answers `draft` (which the output check refuses) until its system message
///   holds ReflectRetry's reflection.
async fn model(State(seen): State<Seen>, Json(body): Json<Value>) -> Json<Value> {
    if let Ok(mut s) = seen.lock() {
        s.push(body.clone());
    }
    let all = text_of(&body);
    let system = system_of(&body);
    let message = if all.contains("kind: manifest") {
        if has_result(&body) {
            say("customer c17 owes 120.50")
        } else if system.contains("- lookup:") {
            call("lookup", json!({"id": "c17", "region": "eu"}))
        } else {
            call("fetch_record", json!({"id": "c17"}))
        }
    } else if all.contains("kind: lesson") {
        if has_result(&body) {
            say("customer c17 owes 120.50")
        } else if all.contains("region=eu") {
            call("lookup", json!({"id": "c17", "region": "eu"}))
        } else {
            call("lookup", json!({"id": "c17"}))
        }
    } else if system.contains("[Reflect & Retry") {
        say("final: customer c17 owes 120.50")
    } else {
        say("draft")
    };
    Json(json!({
        "id": "x", "object": "chat.completion", "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    }))
}

/// `lookup`: needs `region` (the hidden rule the lessons teach).
struct Lookup(ToolSpec);

impl Tool for Lookup {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn call<'a>(&'a self, args: Value, _: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            if args.get("region").is_none() {
                return Err(ToolError::new(
                    ErrorClass::SchemaMismatch,
                    FailureCategory::Strategy,
                    "region is required: pass region=eu for European customers",
                ));
            }
            Ok(ToolOutput {
                value: json!({"id": "c17", "owes": "120.50"}),
                latency_ms: 1.0,
                cost: 0.0,
            })
        })
    }
}

fn task(i: u64, kind: &str) -> Task {
    Task {
        task_id: format!("t{i}"),
        goal: format!("Find what customer c17 owes (kind: {kind})"),
        user_id: Some("desk".into()),
        input: Some(json!({"customer": "c17"})),
        ..Task::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guidance_and_lessons_reach_the_body_a_model_server_receives() {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(model))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let mut registry = ToolRegistry::new();
    let mut spec = ToolSpec::new("lookup", "Looks a customer up by id and region");
    spec.idempotent = true;
    spec.input_schema = json!({
        "type": "object",
        "properties": {"id": {"type": "string"}, "region": {"type": "string"}},
        "required": ["id"]
    });
    registry.register(Arc::new(Lookup(spec))).unwrap();
    let agent = AgentStage {
        description: "answers billing questions".into(),
        instructions: "You are the billing agent.".into(),
        variants: vec![AgentVariant {
            name: "default".into(),
            model: "served".into(),
            prompt: None,
            tools: vec!["lookup".into()],
            temperature: Some(0.0),
        }],
        max_turns: 6,
        answer_schema: None,
        max_turn_tokens: Some(256),
        max_tokens: None,
        max_cost: None,
        max_wall_ms: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = RuntimeOptions::new(
        dir.path(),
        WorkflowSource::Custom {
            name: "billing".into(),
            stages: vec![WorkflowStage::agent("answer", agent)],
            // A draft is not an answer.
            check: Arc::new(|_, _, output: &Value| match output["answer"].as_str() {
                Some("draft") => Err("the answer is a draft, not the amount owed".into()),
                _ => Ok(()),
            }),
            reward: RewardConfig {
                success: 1.0,
                latency: 0.1,
                cost: 0.1,
                max_cost: 1.0,
                sla_ms: 60_000.0,
            },
        },
    );
    opts.durability = Durability::None;
    opts.registry = registry;
    let client = OpenAiClient::new(OpenAiConfig {
        base_url: format!("http://{addr}/v1"),
        model: "scripted".into(),
        ..OpenAiConfig::default()
    })
    .unwrap();
    opts.models.insert("served", Arc::new(client));
    opts.models.set_price(
        "served",
        Price {
            prompt_per_1k: 0.01,
            completion_per_1k: 0.03,
        },
    );
    let rt = Runtime::start(opts).await.unwrap();
    let count = || seen.lock().unwrap().len();

    // A wrong tool: the retry's body lists the toolset.
    let out = rt.orchestrate(task(0, "manifest")).await.unwrap();
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    let bodies = seen.lock().unwrap().clone();
    assert!(!system_of(&bodies[0]).contains("- lookup:"));
    assert!(
        bodies.iter().any(|b| system_of(b).contains("- lookup:")),
        "no request listed the toolset after the wrong tool"
    );
    assert_eq!(bodies[0]["tools"][0]["function"]["name"], "lookup");
    // Each turn: 1,000 prompt tokens at 0.01 and 100 generated at 0.03 per thousand.
    let turns = bodies.len() as f64;
    assert!(
        (out.cost - turns * 0.013).abs() < 1e-9,
        "cost {} for {turns} turns",
        out.cost
    );

    // Failures of `lookup` teach a lesson that later tasks' first request carries.
    let mut taught = None;
    for i in 1..=12 {
        let before = count();
        let out = rt.orchestrate(task(i, "lesson")).await.unwrap();
        assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
        let first = seen.lock().unwrap()[before].clone();
        if system_of(&first).contains("<strategy_context>") {
            taught = Some(system_of(&first));
            break;
        }
    }
    let taught = taught.expect("no first request carried the lessons");
    assert!(taught.contains("lookup"), "{taught}");

    // A round its check refuses: ReflectRetry's reflection opens the next round's body.
    let before = count();
    let out = rt.orchestrate(task(100, "reflect")).await.unwrap();
    assert_eq!(out.state, RunState::Succeeded, "{:?}", out.reason);
    assert!(out.reflect_retries >= 1);
    let reflected = seen.lock().unwrap()[before..]
        .iter()
        .any(|b| system_of(b).contains("[Reflect & Retry"));
    assert!(reflected, "no request carried the reflection");
    rt.shutdown().await;
}

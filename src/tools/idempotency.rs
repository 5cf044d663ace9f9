//! Idempotency records: the result of a call that succeeded under an idempotency key, so that the
//! same call is answered from the record instead of being made again. The store implements
//! [`IdempotencyStore`] at integration; [`MemoryIdempotency`] keeps them in memory.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The future of an idempotency store operation.
pub type IdempotencyFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, IdempotencyError>> + Send + 'a>>;

/// The store could not be read or written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("idempotency store: {0}")]
pub struct IdempotencyError(pub String);

/// Where successful results are recorded by idempotency key.
pub trait IdempotencyStore: Send + Sync {
    /// The recorded result of `key`, if any.
    fn get<'a>(&'a self, key: &'a str) -> IdempotencyFuture<'a, Option<Value>>;
    /// Records `value` as the result of `key` (acknowledged once durable).
    fn put<'a>(&'a self, key: &'a str, value: &'a Value) -> IdempotencyFuture<'a, ()>;
}

/// Records kept in memory (lost on restart).
#[derive(Debug, Default)]
pub struct MemoryIdempotency {
    records: Mutex<HashMap<String, Value>>,
}

impl MemoryIdempotency {
    /// An empty store.
    pub fn new() -> MemoryIdempotency {
        MemoryIdempotency::default()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl IdempotencyStore for MemoryIdempotency {
    fn get<'a>(&'a self, key: &'a str) -> IdempotencyFuture<'a, Option<Value>> {
        let r = self
            .records
            .lock()
            .map(|r| r.get(key).cloned())
            .map_err(|_| IdempotencyError("lock poisoned".into()));
        Box::pin(std::future::ready(r))
    }

    fn put<'a>(&'a self, key: &'a str, value: &'a Value) -> IdempotencyFuture<'a, ()> {
        let r = self
            .records
            .lock()
            .map(|mut r| {
                r.insert(key.to_string(), value.clone());
            })
            .map_err(|_| IdempotencyError("lock poisoned".into()));
        Box::pin(std::future::ready(r))
    }
}

/// A key for "this call of this run": SHA-256 over the run, stage, tool and the arguments'
/// canonical JSON (object keys sorted), hex-encoded.
pub fn idempotency_key(run_id: &str, stage: &str, tool: &str, args: &Value) -> String {
    let mut h = Sha256::new();
    for part in [run_id, stage, tool] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(canonical(args).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ignores_object_key_order() {
        let a = serde_json::json!({"a": 1, "b": [1, {"x": 2, "y": 3}]});
        let b = serde_json::json!({"b": [1, {"y": 3, "x": 2}], "a": 1});
        assert_eq!(
            idempotency_key("r", "s", "t", &a),
            idempotency_key("r", "s", "t", &b)
        );
        assert_ne!(
            idempotency_key("r", "s", "t", &a),
            idempotency_key("r2", "s", "t", &a)
        );
        assert_eq!(idempotency_key("r", "s", "t", &a).len(), 64);
    }
}

//! Where the recovery loop keeps checkpoints: the `CheckpointStore` trait and an in-memory store.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use crate::record::Checkpoint;

/// A boxed future returned by [`CheckpointStore::put`].
pub type PutFuture<'a> = Pin<Box<dyn Future<Output = Result<(), CheckpointError>> + Send + 'a>>;

/// A checkpoint store failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("checkpoint store: {0}")]
pub struct CheckpointError(pub String);

impl CheckpointError {
    /// Wraps any backend error (a `StoreError`, an I/O error) by its message.
    pub fn backend(e: impl std::fmt::Display) -> CheckpointError {
        CheckpointError(e.to_string())
    }
}

/// Durable (or not) storage of a run's checkpoints. Writes are async (acknowledged when
/// durable); reads are sync. `hindsight::store::Store` implements it in a few lines:
/// `put` -> `put_checkpoint`, `latest` -> `latest_checkpoint`, `named` -> `checkpoint_named`.
pub trait CheckpointStore: Send + Sync {
    /// Stores a checkpoint of `cp.run_id`.
    fn put<'a>(&'a self, cp: &'a Checkpoint) -> PutFuture<'a>;
    /// The most recent checkpoint of a run.
    fn latest(&self, run_id: &str) -> Result<Option<Checkpoint>, CheckpointError>;
    /// The most recent checkpoint of a run with this name.
    fn named(&self, run_id: &str, name: &str) -> Result<Option<Checkpoint>, CheckpointError>;
}

/// Checkpoints in memory, keyed by run (the last `keep` per run).
#[derive(Debug)]
pub struct MemoryCheckpoints {
    keep: usize,
    runs: Mutex<HashMap<String, Vec<Checkpoint>>>,
}

impl Default for MemoryCheckpoints {
    fn default() -> Self {
        MemoryCheckpoints::new(16)
    }
}

impl MemoryCheckpoints {
    /// Keeps the last `keep` (at least 1) checkpoints of each run; named ones are kept too.
    pub fn new(keep: usize) -> MemoryCheckpoints {
        MemoryCheckpoints {
            keep: keep.max(1),
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// All checkpoints kept for a run, oldest first.
    pub fn all(&self, run_id: &str) -> Vec<Checkpoint> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(run_id).cloned().unwrap_or_default()
    }
}

impl CheckpointStore for MemoryCheckpoints {
    fn put<'a>(&'a self, cp: &'a Checkpoint) -> PutFuture<'a> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let list = runs.entry(cp.run_id.clone()).or_default();
        list.push(cp.clone());
        // Drop the oldest unnamed checkpoints beyond `keep`.
        while list.iter().filter(|c| c.name.is_none()).count() > self.keep {
            if let Some(pos) = list.iter().position(|c| c.name.is_none()) {
                list.remove(pos);
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn latest(&self, run_id: &str) -> Result<Option<Checkpoint>, CheckpointError> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(runs.get(run_id).and_then(|l| l.last().cloned()))
    }

    fn named(&self, run_id: &str, name: &str) -> Result<Option<Checkpoint>, CheckpointError> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(runs.get(run_id).and_then(|l| {
            l.iter()
                .rev()
                .find(|c| c.name.as_deref() == Some(name))
                .cloned()
        }))
    }
}

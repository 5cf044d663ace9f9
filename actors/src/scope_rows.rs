//! The adaptive strategies' scopes on disk: a row per scope that names its lessons, each
//! lesson a row of the lessons table written only when it changes; and the move of an earlier
//! build's scope rows, which carried their lessons inline (a scope whose run confirmed four of
//! its twenty lessons wrote all twenty again).

use std::collections::HashMap;

use hindsight::Lesson;
use hindsight::learn::adaptive::ScopeState;
use hindsight::store::{Entries, KvTable, Store, StoreError, WriteOp};

use crate::reflector::{LESSONS, LessonRecord, LessonRecordRef};

/// A scope's row, by scope: its state with its lessons named, each a row of [`LESSONS`].
pub const SCOPES: KvTable = KvTable::new("reflector_scope_rows");
/// An earlier build's scope rows, which carried their lessons: moved by [`move_inline_rows`].
const INLINE_SCOPES: KvTable = KvTable::new("reflector_scopes");

/// The write of a scope's row (its lessons are written apart, as they change).
pub fn put(scope: &str, state: &ScopeState) -> Result<WriteOp, StoreError> {
    put_named(scope, &state.named())
}

/// The write of a scope's row as stored, its lessons named.
pub fn put_named(scope: &str, row: &ScopeState<String>) -> Result<WriteOp, StoreError> {
    WriteOp::put(SCOPES, scope, row)
}

/// The write of a lesson's row.
pub fn put_lesson(lesson: &Lesson) -> Result<WriteOp, StoreError> {
    WriteOp::put(LESSONS, &lesson.lesson_id, &LessonRecordRef { lesson })
}

/// A scope's row as stored (its lessons named), if it has one.
pub fn get_named(store: &Store, scope: &str) -> Result<Option<ScopeState<String>>, StoreError> {
    store.get(SCOPES, scope)
}

/// Every scope's state, its lessons read from their rows in the same pass; a row that cannot
/// be read is an `Err` in its place. A lesson a scope names that cannot be read, or has no row,
/// is left out of the scope and logged.
pub fn read_all(store: &Store) -> Result<Entries<String, ScopeState>, StoreError> {
    let rows = store.scan::<ScopeState<String>>(SCOPES)?;
    let ids: Vec<&str> = rows
        .iter()
        .filter_map(|(_, row)| row.as_ref().ok())
        .flat_map(|row| row.lessons.iter().map(String::as_str))
        .collect();
    let found = store.get_many::<LessonRecord>(LESSONS, ids.iter().copied())?;
    let mut lessons: HashMap<String, Lesson> = HashMap::with_capacity(ids.len());
    for (id, record) in ids.iter().zip(found) {
        match record {
            Some(Ok(record)) => {
                lessons.insert((*id).to_string(), record.lesson);
            }
            Some(Err(e)) => {
                tracing::error!(lesson = id, error = %e, "a lesson of the adaptive strategies cannot be read; it is lost");
            }
            None => {}
        }
    }
    Ok(rows
        .into_iter()
        .map(|(scope, row)| {
            let state = row.map(|row| {
                let (state, missing) = row.resolve(|id| lessons.remove(id));
                for id in missing {
                    tracing::error!(
                        scope,
                        lesson = id,
                        "a lesson of the adaptive strategies has no row in `kv.lessons`; it is lost"
                    );
                }
                state
            });
            (scope, state)
        })
        .collect())
}

/// Moves an earlier build's scope rows, which carried their lessons, to rows that name them
/// (each lesson written to its row), in one batch. A row that cannot be read is removed, its
/// lessons lost (logged). Returns how many rows were moved.
pub async fn move_inline_rows(store: &Store) -> Result<usize, StoreError> {
    let rows = store.scan::<ScopeState>(INLINE_SCOPES)?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut moved = 0;
    let mut ops = Vec::new();
    for (scope, state) in rows {
        match state {
            Ok(state) => {
                for lesson in &state.lessons {
                    ops.push(put_lesson(lesson)?);
                }
                ops.push(put(&scope, &state)?);
                moved += 1;
            }
            Err(e) => {
                tracing::error!(scope, error = %e, "a scope of the adaptive strategies cannot be read; its lessons are lost");
            }
        }
        ops.push(WriteOp::delete(INLINE_SCOPES, &scope));
    }
    store.write_batch(ops).await?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lesson(id: &str, scope: &str) -> Lesson {
        Lesson {
            lesson_id: id.into(),
            preconditions: [("bank".to_string(), "acme".to_string())].into(),
            tool: Some("pdfminer".into()),
            action: format!("lesson {id}: check the date format first"),
            confidence: 0.6,
            evidence: vec!["run-1".into()],
            source: "synthesis".into(),
            scope: scope.into(),
            created_ms: 1,
            reinforced_ms: 2,
            superseded_by: None,
        }
    }

    fn scope_with(ids: &[&str], scope: &str) -> ScopeState {
        ScopeState {
            lessons: ids.iter().map(|id| lesson(id, scope)).collect(),
            cycles: 3,
            ..ScopeState::default()
        }
    }

    #[tokio::test]
    async fn an_earlier_builds_rows_are_moved_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let alice = scope_with(&["a1", "a2"], "user:alice");
        let bob = scope_with(&["b1"], "user:bob");
        store
            .write_batch(vec![
                WriteOp::put(INLINE_SCOPES, "user:alice", &alice).unwrap(),
                WriteOp::put(INLINE_SCOPES, "user:bob", &bob).unwrap(),
                WriteOp::put(INLINE_SCOPES, "user:broken", &7u8).unwrap(),
            ])
            .await
            .unwrap();
        assert_eq!(move_inline_rows(&store).await.unwrap(), 2);
        assert!(store.scan::<ScopeState>(INLINE_SCOPES).unwrap().is_empty());
        assert_eq!(move_inline_rows(&store).await.unwrap(), 0, "moved once");
        // Each lesson has its row, and the scope's row names them.
        let row: LessonRecord = store.get(LESSONS, "a2").unwrap().unwrap();
        assert_eq!(row.lesson, alice.lessons[1]);
        let named = get_named(&store, "user:alice").unwrap().unwrap();
        assert_eq!(named.lessons, vec!["a1".to_string(), "a2".to_string()]);
        let all = read_all(&store).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], ("user:alice".to_string(), Ok(alice)));
        assert_eq!(all[1], ("user:bob".to_string(), Ok(bob)));
    }

    #[tokio::test]
    async fn a_lesson_without_a_readable_row_is_left_out_of_its_scope_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let alice = scope_with(&["a1", "a2", "a3"], "user:alice");
        store
            .write_batch(vec![
                put("user:alice", &alice).unwrap(),
                put_lesson(&alice.lessons[0]).unwrap(),
                WriteOp::put(LESSONS, "a2", &7u8).unwrap(),
                WriteOp::put(SCOPES, "user:broken", &7u8).unwrap(),
            ])
            .await
            .unwrap();
        let all = read_all(&store).unwrap();
        let mut want = alice.clone();
        want.lessons.truncate(1);
        assert_eq!(all[0], ("user:alice".to_string(), Ok(want)));
        assert_eq!(all[1].0, "user:broken");
        assert!(all[1].1.is_err());
    }
}

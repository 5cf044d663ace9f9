//! The lesson board: each scope's lessons as the reflector last published them, read by the
//! runs' own tasks (and the API) without a message to the reflector, so that a run's lesson
//! context never waits in the reflector's mailbox behind its learning (a consolidation, a
//! snapshot, a restart).
//!
//! The reflector owns the lessons and is the board's only writer: after every message it
//! handles it publishes the scopes that message changed (an accepted correction before its
//! answer), and at its start every scope it restored. A reader takes a scope's lessons (one
//! reference count) and ranks them itself, with the same code the reflector would use
//! ([`hindsight::learn::adaptive::strategy_context`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use hindsight::learn::adaptive::{AdaptiveConfig, RelevanceQuery, strategy_context};
use hindsight::{Lesson, Task, now_ms};

/// Each scope's lessons as last published, with what ranking them needs.
#[derive(Debug)]
pub struct LessonBoard {
    /// The adaptive strategies' configuration (the scope of a task, the ranking's limits).
    config: AdaptiveConfig,
    /// The tools a plan may use (lessons about them rank higher).
    tools: Vec<String>,
    scopes: RwLock<HashMap<String, Arc<[Lesson]>>>,
}

impl LessonBoard {
    /// An empty board for lessons ranked with `config` against plans that may use `tools`.
    pub fn new(config: AdaptiveConfig, tools: Vec<String>) -> LessonBoard {
        LessonBoard {
            config,
            tools,
            scopes: RwLock::new(HashMap::new()),
        }
    }

    /// The fenced `<strategy_context>` block of `task`'s scope, if a lesson of it is relevant
    /// (none for a task without the identity its scope needs).
    pub fn context_for(&self, task: &Task) -> Option<String> {
        let scope = self.config.scope_of(task).ok()?;
        let lessons = self.lessons(&scope)?;
        strategy_context(
            &self.config,
            &lessons,
            RelevanceQuery {
                features: &task.features,
                tools: &self.tools,
                goal: &task.goal,
            },
            now_ms(),
        )
    }

    /// The lessons of `scope` as last published, if it has any.
    pub fn lessons(&self, scope: &str) -> Option<Arc<[Lesson]>> {
        // A writer that panicked left a whole map (each publish is one insert): read it on.
        let scopes = self.scopes.read().unwrap_or_else(|e| e.into_inner());
        scopes.get(scope).cloned()
    }

    /// Publishes `lessons` as the lessons of `scope` (an empty list removes it). Lessons as
    /// published already are left in place: most changes to a scope (a failure noted as
    /// evidence) change none of its lessons, and comparing them costs less than copying them.
    pub fn publish(&self, scope: &str, lessons: &[Lesson]) {
        if self.lessons(scope).as_deref().unwrap_or(&[]) == lessons {
            return;
        }
        let lessons: Option<Arc<[Lesson]>> = (!lessons.is_empty()).then(|| lessons.into());
        let mut scopes = self.scopes.write().unwrap_or_else(|e| e.into_inner());
        match lessons {
            Some(lessons) => {
                scopes.insert(scope.to_string(), lessons);
            }
            None => {
                scopes.remove(scope);
            }
        }
    }

    /// Replaces every scope's lessons with `scopes` (at the reflector's start: a scope it no
    /// longer has goes).
    pub fn publish_all<'a>(&self, scopes: impl IntoIterator<Item = (&'a str, &'a [Lesson])>) {
        let fresh: HashMap<String, Arc<[Lesson]>> = scopes
            .into_iter()
            .filter(|(_, lessons)| !lessons.is_empty())
            .map(|(scope, lessons)| (scope.to_string(), lessons.into()))
            .collect();
        *self.scopes.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn lesson(id: &str, scope: &str, tool: &str) -> Lesson {
        Lesson {
            lesson_id: id.into(),
            preconditions: BTreeMap::new(),
            tool: Some(tool.into()),
            action: format!("check the {tool} input first"),
            confidence: 0.8,
            evidence: vec![],
            source: "synthesis".into(),
            scope: scope.into(),
            created_ms: now_ms(),
            reinforced_ms: now_ms(),
            superseded_by: None,
        }
    }

    fn task(user: &str) -> Task {
        Task {
            user_id: Some(user.into()),
            goal: "parse the statement".into(),
            features: BTreeMap::new(),
            ..Task::default()
        }
    }

    #[test]
    fn a_task_reads_the_lessons_of_its_own_scope_as_last_published() {
        let board = LessonBoard::new(AdaptiveConfig::default(), vec!["parser".into()]);
        let scope = AdaptiveConfig::default()
            .scope_of(&task("ann"))
            .expect("a task with a user has a scope");
        assert_eq!(board.context_for(&task("ann")), None, "nothing published");

        board.publish(&scope, &[lesson("l1", &scope, "parser")]);
        let published = board.lessons(&scope).expect("published");
        // The reflector's own copy of the same lessons.
        let same: Vec<Lesson> = published.iter().cloned().collect();
        board.publish(&scope, &same);
        let again = board.lessons(&scope).expect("still published");
        assert!(
            Arc::ptr_eq(&published, &again),
            "the same lessons are not copied again"
        );
        let context = board
            .context_for(&task("ann"))
            .expect("its lesson is relevant");
        assert!(
            context.contains("check the parser input first"),
            "{context}"
        );
        assert_eq!(
            board.context_for(&task("bob")),
            None,
            "another user's scope"
        );

        board.publish(&scope, &[]);
        assert_eq!(
            board.context_for(&task("ann")),
            None,
            "an emptied scope goes"
        );

        board.publish(&scope, &[lesson("l2", &scope, "parser")]);
        board.publish_all([]);
        assert_eq!(board.lessons(&scope), None, "a start replaces every scope");
    }
}

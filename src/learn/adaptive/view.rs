//! view: what runs read of the adaptive strategies without asking their owner. The owner
//! publishes each scope's lessons as they change ([`AdaptiveStrategies::publish`]); a reader
//! ranks the lessons of its task's scope in the view and renders the fenced block, so that a
//! run's lessons never wait behind the owner's other work (a consolidation, a synthesis).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::relevance::context_among;
use super::{AdaptiveConfig, AdaptiveStrategies, RelevanceQuery};
use crate::record::{Lesson, Task};

/// The configuration, the workflow's tools and each scope's lessons, as last published.
#[derive(Debug, Clone, Default)]
pub struct LessonView {
    config: AdaptiveConfig,
    tools: Vec<String>,
    scopes: BTreeMap<String, Arc<[Lesson]>>,
}

impl LessonView {
    /// The fenced `<strategy_context>` block of the lessons of `task`'s scope that are relevant
    /// to it, as [`AdaptiveStrategies::context_for`] gives it; `None` when the task names no
    /// scope the configuration can place it in, or none of its lessons is relevant.
    pub fn context_for(&self, task: &Task, now_ms: u64) -> Option<String> {
        let scope = self.config.scope_of(task).ok()?;
        let lessons = self.scopes.get(&scope)?;
        context_among(
            &self.config,
            lessons,
            RelevanceQuery {
                features: &task.features,
                tools: &self.tools,
                goal: &task.goal,
            },
            now_ms,
        )
    }

    /// The lessons of `scope` in the view.
    pub fn lessons(&self, scope: &str) -> &[Lesson] {
        self.scopes.get(scope).map_or(&[], |l| l)
    }
}

/// What publishing changes in a view: the whole of it, or some scopes' lessons (`None`: the
/// scope is gone).
#[derive(Debug)]
pub enum Publication {
    /// The view as a whole (the first time, and after a new configuration).
    Whole(LessonView),
    /// The lessons of the scopes that changed since the view was published.
    Scopes(Vec<(String, Option<Arc<[Lesson]>>)>),
}

impl LessonView {
    /// Puts `publication` in force.
    pub fn apply(&mut self, publication: Publication) {
        match publication {
            Publication::Whole(view) => *self = view,
            Publication::Scopes(scopes) => {
                for (scope, lessons) in scopes {
                    match lessons {
                        Some(lessons) => self.scopes.insert(scope, lessons),
                        None => self.scopes.remove(&scope),
                    };
                }
            }
        }
    }
}

impl AdaptiveStrategies {
    /// Whether a scope changed (or the configuration) since the last publication.
    pub fn has_unpublished(&self) -> bool {
        !self.published || !self.unpublished.is_empty()
    }

    /// What brings `view` up to date, and forgets it: the lessons of the scopes that changed
    /// since the last call and differ from the view's; or, the first time and after
    /// [`Self::set_config`], the whole view (the configuration, `tools`, the workflow's tool
    /// names the lessons are ranked against, and every scope), so that a view an earlier
    /// owner published keeps nothing this one does not hold. Built from `view` as read, to be
    /// applied by its only writer ([`LessonView::apply`]).
    pub fn publication(&mut self, view: &LessonView, tools: &[String]) -> Publication {
        let scopes = std::mem::take(&mut self.unpublished);
        if !self.published {
            self.published = true;
            return Publication::Whole(LessonView {
                config: self.state.config.clone(),
                tools: tools.to_vec(),
                scopes: self
                    .state
                    .scopes
                    .iter()
                    .map(|(k, s)| (k.clone(), Arc::from(s.lessons.as_slice())))
                    .collect(),
            });
        }
        Publication::Scopes(
            scopes
                .into_iter()
                .filter_map(|scope| match self.state.scopes.get(&scope) {
                    // A scope whose failures changed and lessons did not stays as it is.
                    Some(s) if view.lessons(&scope) == s.lessons.as_slice() => None,
                    Some(s) => Some((scope, Some(Arc::from(s.lessons.as_slice())))),
                    None => Some((scope, None)),
                })
                .collect(),
        )
    }

    /// Brings `view` up to date ([`Self::publication`], applied).
    pub fn publish(&mut self, view: &mut LessonView, tools: &[String]) {
        let publication = self.publication(view, tools);
        view.apply(publication);
    }
}

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

impl AdaptiveStrategies {
    /// Whether a scope changed (or the configuration) since the last [`Self::publish`].
    pub fn has_unpublished(&self) -> bool {
        !self.published || !self.unpublished.is_empty()
    }

    /// Brings `view` up to date: the scopes changed since the last call, or every scope (and
    /// the configuration, and `tools`, the workflow's tool names the lessons are ranked
    /// against) the first time and after [`Self::set_config`], when the view is replaced
    /// whole, so that a view an earlier owner published keeps nothing this one does not hold.
    pub fn publish(&mut self, view: &mut LessonView, tools: &[String]) {
        let scopes = std::mem::take(&mut self.unpublished);
        if !self.published {
            *view = LessonView {
                config: self.state.config.clone(),
                tools: tools.to_vec(),
                scopes: self
                    .state
                    .scopes
                    .iter()
                    .map(|(k, s)| (k.clone(), Arc::from(s.lessons.as_slice())))
                    .collect(),
            };
            self.published = true;
            return;
        }
        for scope in scopes {
            match self.state.scopes.get(&scope) {
                Some(s) => view.scopes.insert(scope, Arc::from(s.lessons.as_slice())),
                None => view.scopes.remove(&scope),
            };
        }
    }
}

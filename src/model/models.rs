//! models: the model endpoints an agent's turns are performed with, by name (the name an agent
//! variant's `model` gives).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::LanguageModel;

/// Model endpoints by name; cheap to clone.
#[derive(Clone, Default)]
pub struct Models {
    by_name: BTreeMap<String, Arc<dyn LanguageModel>>,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}

impl Models {
    /// No models.
    pub fn new() -> Models {
        Models::default()
    }

    /// These models with `model` as `name` (replacing one of that name).
    pub fn with(mut self, name: impl Into<String>, model: Arc<dyn LanguageModel>) -> Models {
        self.by_name.insert(name.into(), model);
        self
    }

    /// Adds `model` as `name` (replacing one of that name).
    pub fn insert(&mut self, name: impl Into<String>, model: Arc<dyn LanguageModel>) {
        self.by_name.insert(name.into(), model);
    }

    /// The model called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn LanguageModel>> {
        self.by_name.get(name)
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }
}

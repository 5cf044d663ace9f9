//! models: the model endpoints an agent's turns are performed with, by name (the name an agent
//! variant's `model` gives).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{LanguageModel, Usage};

/// What an endpoint charges per thousand tokens (in the unit of the tasks' cost budgets); a
/// turn's cost is its usage priced so, and enters the run's cost, its budgets and its reward.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Price {
    /// Per thousand tokens of the request.
    pub prompt_per_1k: f64,
    /// Per thousand tokens generated.
    pub completion_per_1k: f64,
}

impl Price {
    /// What `usage` costs.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (f64::from(usage.prompt_tokens) * self.prompt_per_1k
            + f64::from(usage.completion_tokens) * self.completion_per_1k)
            / 1000.0
    }
}

/// Model endpoints by name, each with its price; cheap to clone.
#[derive(Clone, Default)]
pub struct Models {
    by_name: BTreeMap<String, Arc<dyn LanguageModel>>,
    prices: BTreeMap<String, Price>,
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

    /// Sets what the endpoint `name` charges (free unless set).
    pub fn set_price(&mut self, name: impl Into<String>, price: Price) {
        self.prices.insert(name.into(), price);
    }

    /// What the endpoint `name` charges.
    pub fn price(&self, name: &str) -> Price {
        self.prices.get(name).copied().unwrap_or_default()
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

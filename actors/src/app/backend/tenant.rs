//! tenant: the API's tenant isolation: namespaced ids, and what of memory a tenant may see.
//!
//! Isolation rules:
//! - A task id is stored as `{tenant}/{task_id}` (run id `run-{tenant}/{task_id}`), generated when
//!   the request names none (derived from `idempotency_key` when it has one), so two tenants never
//!   share a run. A run is visible only to the tenant of its record and its namespace.
//! - User and session ids are stored as `{tenant}/{id}`, so lesson scopes (`user:{tenant}/{u}`,
//!   `tenant:{tenant}`, `session:{tenant}/{s}`) never cross tenants.
//! - An SOP is visible to a tenant only when every run of its evidence belongs to that tenant.
//! - Retrieval returns lessons, SOPs, postmortems and diary notes only when they are the tenant's;
//!   the graph's aggregate statistics over the shared workflow (`strategy`, `failure_mode`),
//!   computed from every tenant's runs, only when `api.shared_learning` is set.

use std::collections::{BTreeMap, BTreeSet};

use hindsight::{ArmChoice, Task};

/// The namespaced task id of a tenant's task.
pub fn tenant_task_id(tenant: &str, task_id: &str) -> String {
    format!("{tenant}/{task_id}")
}

/// The run id of a tenant's task.
pub fn tenant_run_id(tenant: &str, task_id: &str) -> String {
    crate::run::run_id_for(&Task {
        task_id: tenant_task_id(tenant, task_id),
        goal: String::new(),
        features: BTreeMap::new(),
        constraints: Default::default(),
        user_id: None,
        tenant: None,
        session_id: None,
        input: None,
    })
}

pub use crate::tenancy::{run_in_tenant, scope_in_tenant, sop_in_tenant};

/// What one tenant may see of memory.
pub(super) struct Visible {
    pub(super) tenant: String,
    pub(super) shared_learning: bool,
    pub(super) lessons: BTreeSet<String>,
    pub(super) sops: BTreeSet<String>,
    pub(super) diary: BTreeSet<String>,
}

impl Visible {
    pub(super) fn allows(&self, kind: &str, id: &str) -> bool {
        match kind {
            "lesson" => self.lessons.contains(id),
            "sop" => self.sops.contains(id),
            "postmortem" => run_in_tenant(&self.tenant, id),
            "diary" => self.diary.contains(id),
            "strategy" | "failure_mode" => self.shared_learning,
            _ => false,
        }
    }

    /// The SOP and plan ids to show: an SOP the tenant may not see (promoted from another
    /// tenant's runs, shared through the policy) is not named; the plan id is then its arms'.
    pub(super) fn provenance(
        &self,
        sop_id: Option<String>,
        plan_id: Option<String>,
        arms: &[ArmChoice],
    ) -> (Option<String>, Option<String>) {
        match sop_id {
            Some(id) if !self.sops.contains(&id) => (
                None,
                Some(crate::policy::PlanChoice::new(arms.to_vec(), None, true).plan_id),
            ),
            other => (other, plan_id),
        }
    }

    pub(super) fn allows_citation(&self, citation: &str) -> bool {
        citation
            .split_once(':')
            .is_some_and(|(kind, id)| self.allows(kind, id))
    }
}

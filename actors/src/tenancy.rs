//! tenancy: whose a run, a lesson scope or an SOP is, from the namespaced ids the API gives
//! tenants' tasks (`{tenant}/{task_id}`, `user:{tenant}/{u}`): what the API shows a tenant and
//! what a tenant's run may read from memory follow the same rules.

use hindsight::Sop;

/// Whether `run_id` is in `tenant`'s namespace.
pub fn run_in_tenant(tenant: &str, run_id: &str) -> bool {
    run_id
        .strip_prefix("run-")
        .and_then(|rest| rest.strip_prefix(tenant))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether a lesson scope belongs to `tenant`.
pub fn scope_in_tenant(tenant: &str, scope: &str) -> bool {
    scope == format!("tenant:{tenant}")
        || scope.starts_with(&format!("user:{tenant}/"))
        || scope.starts_with(&format!("session:{tenant}/"))
}

/// Whether an SOP is visible to `tenant`: every run of its evidence is the tenant's.
pub fn sop_in_tenant(tenant: &str, sop: &Sop) -> bool {
    !sop.evidence.is_empty() && sop.evidence.iter().all(|r| run_in_tenant(tenant, r))
}

//! idempotency: the key scheme of the idempotency table, and which of its records belong to a
//! run, so that the run's end and the run TTL remove them with it.
//!
//! Two kinds of record live in the table:
//! - a tool call's result, keyed [`call_key`]: `{run_id}/a{attempt}/{stage}`;
//! - a client's idempotency key claimed for a task, keyed [`task_claim_key`]
//!   (`api:{scope}:{hash}`), whose value is `{"task_id": ...}`.

use redb::ReadableTable;

/// Prefix of the records that claim a client's idempotency key for a task.
pub const TASK_CLAIM_PREFIX: &str = "api:";
/// The first key after every claim's (`:` + 1 = `;`).
pub(crate) const TASK_CLAIM_END: &str = "api;";

/// The key of the recorded result of one stage call of one attempt of a run.
pub fn call_key(run_id: &str, attempt: u32, stage: &str) -> String {
    format!("{run_id}/a{attempt}/{stage}")
}

/// The key of the recorded result of call `call` of an agent stage's model turn `turn` (turns
/// count from 1: a tool stage's call, turn 0, has the stage's [`call_key`]).
pub fn agent_call_key(run_id: &str, attempt: u32, stage: &str, turn: u32, call: u32) -> String {
    if turn == 0 {
        return call_key(run_id, attempt, stage);
    }
    format!("{run_id}/a{attempt}/{stage}/t{turn}/c{call}")
}

/// The idempotency key of call `call` (0-based) that a procedure makes in place of the model in
/// agent stage `stage`.
pub fn procedure_call_key(run_id: &str, attempt: u32, stage: &str, call: usize) -> String {
    format!("{run_id}/a{attempt}/{stage}/p{call}")
}

/// The key of a claim of a client's idempotency key (`key_hash`, hashed by the caller) within
/// `scope` (a tenant).
pub fn task_claim_key(scope: &str, key_hash: &str) -> String {
    format!("{TASK_CLAIM_PREFIX}{scope}:{key_hash}")
}

/// The value of a task claim: the task the client's key names.
pub fn task_claim_value(task_id: &str) -> serde_json::Value {
    serde_json::json!({ "task_id": task_id })
}

/// The task a claim's value names, if it is a claim's value.
pub(crate) fn claimed_task(value: &serde_json::Value) -> Option<&str> {
    value.get("task_id")?.as_str()
}

/// The run ids that call key `key` could belong to, shortest first: every prefix `r` of `key`
/// followed by `/a{digits}/` and a non-empty stage name. (A run id may itself contain `/a1/`,
/// so a key can have more than one candidate; the longest one that is a stored run owns it.)
pub(crate) fn call_key_runs(key: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = key[from..].find("/a").map(|i| i + from) {
        let rest = &key[i + 2..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if i > 0 && digits > 0 && rest[digits..].len() > 1 && rest[digits..].starts_with('/') {
            out.push(&key[..i]);
        }
        from = i + 2;
    }
    out
}

/// The keys of run `run_id`'s call records in `idem`: those under its `{run_id}/a` prefix that
/// name it as a candidate ([`call_key_runs`]) and no longer candidate that is a run in `runs`
/// (a run whose id extends `run_id` with `/a1/...` owns its own).
pub(crate) fn calls_of(
    idem: &redb::Table<&str, &[u8]>,
    runs: &redb::Table<&str, &[u8]>,
    run_id: &str,
) -> Result<Vec<String>, redb::Error> {
    let (from, to) = (format!("{run_id}/a"), format!("{run_id}/b"));
    let mut keys = Vec::new();
    for entry in idem.range(from.as_str()..to.as_str())? {
        let (k, _) = entry?;
        let key = k.value();
        let candidates = call_key_runs(key);
        if !candidates.contains(&run_id) {
            continue;
        }
        let mut taken = false;
        for c in candidates.iter().filter(|c| c.len() > run_id.len()) {
            if runs.get(*c)?.is_some() {
                taken = true;
                break;
            }
        }
        if !taken {
            keys.push(key.to_string());
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_key_names_its_run() {
        let key = call_key("run-acme/t1", 2, "extract");
        assert_eq!(key, "run-acme/t1/a2/extract");
        assert_eq!(call_key_runs(&key), vec!["run-acme/t1"]);
    }

    #[test]
    fn a_run_id_that_looks_like_a_call_key_gives_every_candidate() {
        // Task `t/a1/x` of tenant `acme`: its run id holds `/a1/` itself.
        let key = call_key("run-acme/t/a1/x", 0, "s");
        assert_eq!(call_key_runs(&key), vec!["run-acme/t", "run-acme/t/a1/x"]);
    }

    #[test]
    fn keys_not_of_the_scheme_have_no_run() {
        for key in ["api:acme:00ff", "run-1/a/s", "run-1/a2/", "/a1/s", "plain"] {
            assert!(call_key_runs(key).is_empty(), "{key}");
        }
    }

    #[test]
    fn the_claim_range_holds_every_claim_and_nothing_else() {
        let claims = TASK_CLAIM_PREFIX..TASK_CLAIM_END;
        assert!(claims.contains(&task_claim_key("zzz", "ffff").as_str()));
        assert!(claims.contains(&task_claim_key("", "").as_str()));
        assert!(!claims.contains(&"api"));
        assert!(!claims.contains(&"apj:"));
        assert!(!claims.contains(&"run-api:x/a1/s"));
    }

    #[test]
    fn a_claim_names_its_task() {
        assert_eq!(task_claim_key("acme", "00ff"), "api:acme:00ff");
        let v = task_claim_value("acme/t1");
        assert_eq!(claimed_task(&v), Some("acme/t1"));
        assert_eq!(claimed_task(&serde_json::json!({"other": 1})), None);
    }
}

//! instruction: what an error message asks the caller to do: its clauses, the ones that give an
//! instruction or state a need, and whether one asks for another argument.

/// The clauses of an error message: split at `;`, newlines, and `:`, `.` and `,` followed by a
/// space, trimmed.
pub(crate) fn clauses(message: &str) -> impl Iterator<Item = &str> {
    message
        .split([';', '\n'])
        .flat_map(|part| part.split(": "))
        .flat_map(|part| part.split(". "))
        .flat_map(|part| part.split(", "))
        .map(|c| c.trim().trim_end_matches('.'))
}

/// Whether a clause opens with one of `verbs` (ASCII case ignored).
pub(crate) fn opens_with(clause: &str, verbs: &[&str]) -> bool {
    clause
        .split_whitespace()
        .next()
        .is_some_and(|w| verbs.iter().any(|v| w.eq_ignore_ascii_case(v)))
}

/// Words by which a message states a requirement (`deletion needs confirm=true`).
const REQUIREMENTS: [&str; 7] = [
    "needs", "need", "requires", "require", "must", "only", "expects",
];

/// Whether a clause states a requirement (`deletion needs confirm=true`).
pub(crate) fn states_a_need(clause: &str) -> bool {
    clause
        .split_whitespace()
        .any(|w| REQUIREMENTS.iter().any(|r| w.eq_ignore_ascii_case(r)))
}

/// Imperatives that ask for other arguments, not for time (`try`, `retry`, `wait` are not
/// among them).
const CHANGE_VERBS: [&str; 15] = [
    "pass", "set", "use", "add", "remove", "include", "specify", "provide", "give", "send", "omit",
    "drop", "leave", "narrow", "bound",
];

/// The longest prefix of a message read for an instruction, in bytes (the classifier's own
/// reading is bounded too, so that a long message costs linear time).
const MAX_READ: usize = 4096;

/// Whether an error message tells the caller how to change its call: a clause that asks for
/// other arguments (opens with `pass`, `set`, `use`, `remove`, ... or states a requirement)
/// and names one, as `name=value` or as an identifier (`pass recursive=false`, `pass
/// timeout_ms of at least 5000`, `deletion needs confirm=true`). A timeout or a refusal that
/// says so is the call's doing, not the infrastructure's: the same call fails the same way
/// however often it is retried. `try again later (request_id=abc)` asks for time, not for
/// another argument.
pub fn asks_to_change_the_call(message: &str) -> bool {
    let mut end = message.len().min(MAX_READ);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message[..end];
    // An argument is named as `name=value` or as an identifier with an underscore: a message
    // without either byte names none (most messages; one pass over the bytes).
    if !message.bytes().any(|b| b == b'=' || b == b'_') {
        return false;
    }
    let names_an_argument = |clause: &str| {
        clause.split_whitespace().any(|word| {
            let word = word.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
            let name_like = |w: &str| {
                w.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && w.chars().any(char::is_alphabetic)
            };
            match word.split_once('=') {
                Some((name, value)) => !value.is_empty() && name_like(name),
                None => {
                    let w = word.trim_matches('_');
                    w.contains('_') && name_like(w)
                }
            }
        })
    };
    clauses(message)
        .filter(|c| opens_with(c, &CHANGE_VERBS) || states_a_need(c))
        .any(names_an_argument)
}

#[cfg(test)]
mod tests {
    use super::asks_to_change_the_call;
    use crate::taxonomy::{ErrorClass, FailureCategory};
    use crate::triage::classify_error;

    #[test]
    fn a_message_asking_for_another_argument_is_the_calls_doing() {
        for m in [
            "listing timed out after 30 s: recursive listing is disabled on legacy hosts, pass recursive=false",
            "429 SlowDown: unbounded listings are throttled on this bucket; pass max_keys=1000",
            "deletion needs confirm=true",
        ] {
            assert!(asks_to_change_the_call(m), "{m}");
            let c = classify_error(Some("Timeout"), m);
            assert_eq!(c.category, FailureCategory::Strategy, "{m}: {c:?}");
            assert!(c.rule.ends_with("+asks_for_another_argument"), "{c:?}");
        }
        // The class stays the rules' (a timeout is still a timeout).
        let c = classify_error(
            Some("Timeout"),
            "copy timed out after 300 s, pass timeout_s=3600",
        );
        assert_eq!(c.error_class, ErrorClass::Timeout);
        for m in [
            "request timed out after 30000 ms",
            "503 Service Unavailable: try again later (request_id=7f3a_c2)",
            "429 Too Many Requests: retry_after=30",
            "pass the salt",
        ] {
            let c = classify_error(None, m);
            assert!(
                !c.rule.ends_with("+asks_for_another_argument"),
                "{m}: {c:?}"
            );
        }
    }
}

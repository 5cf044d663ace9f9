//! The error classifier: `(error_type, message) -> {category, error_class, confidence, rule}`.
//!
//! Deterministic and linear in the input: every pattern is compiled once (`LazyLock`) by the
//! `regex` crate, whose automata never backtrack, and the message is bounded (head and tail kept)
//! and normalised (ASCII-lowercased, whitespace runs collapsed) in one pass before matching.
//! Labelling follows promptise's conventions: infrastructure when the environment failed,
//! strategy when the agent's choice of tool or arguments was wrong, unknown when ambiguous.

mod rules;

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

use crate::taxonomy::{ErrorClass, ErrorClassification, FailureCategory};
use rules::{AFTER_STATUS, BEFORE_STATUS, Rule, TYPE_RULES};

use ErrorClass::*;
use FailureCategory::{Infrastructure as Infra, Strategy as Strat};

/// Bytes of the message kept from its start; the rest is cut (keeping [`TAIL_BYTES`] of the end).
pub const HEAD_BYTES: usize = 12 * 1024;
/// Bytes of the message kept from its end when it is longer than `HEAD_BYTES + TAIL_BYTES`.
pub const TAIL_BYTES: usize = 4 * 1024;

/// Word boundaries as ASCII ones (`(?-u:\b)`): the text is ASCII-lowercased already, and ASCII
/// boundaries keep every pattern inside the regex crate's DFA engines.
fn ascii_boundaries(p: &str) -> String {
    p.replace(r"\b", r"(?-u:\b)")
}

/// A rule list compiled into one `RegexSet` (one linear pass tells every pattern that matched)
/// plus the index of the rule each pattern belongs to.
struct Compiled {
    set: RegexSet,
    owner: Vec<usize>,
    rules: &'static [Rule],
}

impl Compiled {
    fn new(rules: &'static [Rule]) -> Compiled {
        let mut patterns: Vec<String> = Vec::new();
        let mut owner = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            for p in r.patterns {
                patterns.push(ascii_boundaries(p));
                owner.push(i);
            }
        }
        // The patterns are constants of this file, checked by the unit tests below.
        #[allow(clippy::expect_used)]
        let set = RegexSet::new(&patterns).expect("built-in error patterns compile");
        Compiled { set, owner, rules }
    }

    /// The first rule (in priority order) with a matching pattern.
    fn first(&self, text: &str) -> Option<&'static Rule> {
        // Patterns are numbered in rule order, so the first match belongs to the first rule.
        let rules = self.rules;
        self.set
            .matches(text)
            .iter()
            .next()
            .map(|p| &rules[self.owner[p]])
    }
}

static BEFORE: LazyLock<Compiled> = LazyLock::new(|| Compiled::new(BEFORE_STATUS));
static AFTER: LazyLock<Compiled> = LazyLock::new(|| Compiled::new(AFTER_STATUS));
static TYPES: LazyLock<Compiled> = LazyLock::new(|| Compiled::new(TYPE_RULES));

/// Reason phrases of 4xx/5xx statuses, as they follow a number ("503 Service Unavailable").
const REASONS: &str = "bad request|unauthorized|payment required|forbidden|not found|method not allowed|not acceptable|proxy authentication|request time-?out|conflict|gone|length required|precondition|payload too large|request entity too large|uri too long|unsupported media type|range not satisfiable|expectation failed|misdirected|unprocessable|locked|failed dependency|too early|upgrade required|too many requests|request header fields too large|unavailable for legal|client closed|internal server error|not implemented|bad gateway|service unavailable|gateway time-?out|http version|insufficient storage|loop detected|network authentication|overloaded|server error|client error|error";

/// Explicit statuses: a status keyword before a 3-digit number, or a reason phrase after one.
static STATUS: LazyLock<Regex> = LazyLock::new(|| {
    let strong = r"(?:\bhttps?(?:/[0-9.]+)?|\bstatus(?:[ _-]?code)?|\berror[ _-]?code|\bresponse[ _-]?(?:code|status)|\bcode|\bhttperror|\bstatus_?code)\s?[:=]?\s?[\x22'(\[]?\s?([45][0-9][0-9])\b";
    let weak = r"(?:\breturned|\bgot|\breceived|\berror|\bfailed with|\bresponded with|\bwith|\bresponse)\s?(?:an?\s)?(?:http\s)?(?:status\s)?[:=]?\s?([45][0-9][0-9])(?:$|[,.;:)\]!\x22' -]\s?(?:$|[^a-z0-9]|error|response|status|from|for|when|while|on|at|in|after))";
    let reason = format!(r"\b([45][0-9][0-9])\s?[-:]?\s?(?:{REASONS})\b");
    let weak_end = r"(?:\breturned|\bgot|\breceived|\berror|\bfailed with|\bresponded with|\bwith|\bresponse)\s?(?:an?\s)?(?:http\s)?(?:status\s)?[:=]?\s?([45][0-9][0-9])$";
    let all = ascii_boundaries(&format!("{strong}|{weak}|{reason}|{weak_end}"));
    #[allow(clippy::expect_used)]
    Regex::new(&all).expect("built-in status pattern compiles")
});

/// The first explicit HTTP status (400..=599) the text names, if any.
///
/// Only match bounds are asked of the regex (its DFA; no capture engine): the status is the
/// first standalone 3-digit run starting with 4 or 5 inside the match.
pub fn http_status(normalised: &str) -> Option<u16> {
    STATUS
        .find_iter(normalised)
        .find_map(|m| first_status(m.as_str()))
}

/// The first run of exactly three digits, starting with 4 or 5, in `s`.
fn first_status(s: &str) -> Option<u16> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i - start == 3 && matches!(b[start], b'4' | b'5') {
                return s[start..i].parse().ok();
            }
        } else {
            i += 1;
        }
    }
    None
}

/// The verdict for an explicit HTTP status.
fn status_verdict(code: u16) -> (FailureCategory, ErrorClass, f64) {
    match code {
        400 | 411 | 416 | 417 | 422 | 428 | 431 => (Strat, SchemaMismatch, 0.9),
        401 | 407 => (Infra, Auth, 0.9),
        403 => (Strat, Auth, 0.9),
        404 | 410 => (Strat, NotFound, 0.9),
        405 | 406 | 413 | 414 | 415 => (Strat, ToolNotFit, 0.85),
        408 => (Infra, Timeout, 0.9),
        409 | 412 | 451 => (Strat, DeterministicFailure, 0.8),
        423 | 425 | 499 => (Infra, TransientNetwork, 0.8),
        429 => (Infra, RateLimit, 0.95),
        504 | 524 | 598 | 599 => (Infra, Timeout, 0.95),
        509 => (Infra, RateLimit, 0.85),
        500..=599 => (Infra, TransientNetwork, 0.9),
        _ => (FailureCategory::Unknown, DeterministicFailure, 0.4),
    }
}

/// Cuts the message to its head and tail (on char boundaries), ASCII-lowercases it and collapses
/// runs of whitespace into one space, in one linear pass.
pub fn normalise(message: &str) -> String {
    let limit = HEAD_BYTES + TAIL_BYTES;
    let (head, tail) = if message.len() > limit {
        let mut h = HEAD_BYTES;
        while !message.is_char_boundary(h) {
            h -= 1;
        }
        let mut t = message.len() - TAIL_BYTES;
        while !message.is_char_boundary(t) {
            t += 1;
        }
        (&message[..h], Some(&message[t..]))
    } else {
        (message, None)
    };
    let mut out = String::with_capacity(head.len() + tail.map_or(0, str::len) + 1);
    let push = |s: &str, out: &mut String| {
        let mut space = out.ends_with(' ');
        for c in s.chars() {
            if c.is_whitespace() {
                if !space && !out.is_empty() {
                    out.push(' ');
                }
                space = true;
            } else {
                out.push(c.to_ascii_lowercase());
                space = false;
            }
        }
    };
    push(head, &mut out);
    if let Some(t) = tail {
        if !out.ends_with(' ') {
            out.push(' ');
        }
        push(t, &mut out);
    }
    while out.ends_with(' ') {
        out.pop();
    }
    out
}

fn verdict(r: &Rule) -> ErrorClassification {
    ErrorClassification {
        category: r.category,
        error_class: r.class,
        confidence: r.confidence,
        rule: r.name.to_string(),
    }
}

/// Classifies one error by its type name (`TimeoutError`, `reqwest::Error`, ...) and message.
///
/// Priority: context overflow, unknown tool, a named bad argument (even under a 5xx), rate
/// limits and quotas, invalid credentials, then an explicit HTTP status, then protocol codes and
/// phrases (JSON-RPC/MCP, gRPC, timeouts, DNS, TLS, network, database contention, schema and
/// parse errors, not found, unsupported input, conflicts), then the type name, else unknown.
pub fn classify_error(error_type: Option<&str>, message: &str) -> ErrorClassification {
    let text = normalise(message);
    if let Some(r) = BEFORE.first(&text) {
        return verdict(r);
    }
    if let Some(code) = http_status(&text) {
        let (category, error_class, confidence) = status_verdict(code);
        return ErrorClassification {
            category,
            error_class,
            confidence,
            rule: format!("http_status_{code}"),
        };
    }
    if let Some(r) = AFTER.first(&text) {
        return verdict(r);
    }
    let ty = error_type.map(normalise).unwrap_or_default();
    if !ty.is_empty() {
        if let Some(r) = BEFORE.first(&ty).or_else(|| AFTER.first(&ty)) {
            let mut v = verdict(r);
            v.rule = format!("type_{}", r.name);
            return v;
        }
        if let Some(r) = TYPES.first(&ty) {
            return verdict(r);
        }
    }
    if let Some(r) = TYPES.first(&text) {
        let mut v = verdict(r);
        v.confidence -= 0.1;
        return v;
    }
    ErrorClassification {
        category: FailureCategory::Unknown,
        error_class: DeterministicFailure,
        confidence: 0.3,
        rule: "unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_patterns_compile() {
        for rules in [BEFORE_STATUS, AFTER_STATUS, TYPE_RULES] {
            for r in rules {
                for p in r.patterns {
                    assert!(Regex::new(p).is_ok(), "{}: {p}", r.name);
                }
            }
        }
        let _ = &*STATUS;
        let _ = &*BEFORE;
        let _ = &*AFTER;
        let _ = &*TYPES;
    }

    #[test]
    fn statuses_in_every_phrasing() {
        for (m, code) in [
            ("HTTP 503", Some(503)),
            ("HTTP/1.1 504 Gateway Timeout", Some(504)),
            ("status_code=503", Some(503)),
            ("statusCode: 404", Some(404)),
            ("Request failed with status code 422", Some(422)),
            (
                "503 Server Error: Service Unavailable for url: http://x",
                Some(503),
            ),
            ("Error code: 429 - {'error': {}}", Some(429)),
            ("returned 502 seats", None),
            ("HTTP 502 from upstream at step 500", Some(502)),
            ("step 500 of 900", None),
            ("the server returned 500", Some(500)),
            ("upstream returned 503.", Some(503)),
        ] {
            assert_eq!(http_status(&normalise(m)), code, "{m}");
        }
    }

    #[test]
    fn normalise_bounds_and_collapses() {
        let long = format!("Status{}503", " ".repeat(40_000));
        assert_eq!(normalise(&long), "status 503");
        let big = "é".repeat(1 << 20);
        assert!(normalise(&big).len() <= HEAD_BYTES + TAIL_BYTES + 1);
    }

    #[test]
    fn verdicts_for_key_cases() {
        let c = classify_error(None, "HTTP 500: invalid parameter 'date'");
        assert_eq!((c.category, c.error_class), (Strat, SchemaMismatch));
        let c = classify_error(None, "returned 502 seats");
        assert_eq!(c.category, FailureCategory::Unknown);
        let c = classify_error(Some("TimeoutError"), "");
        assert_eq!((c.category, c.error_class), (Infra, Timeout));
        let c = classify_error(Some("TypeError"), "fetch failed");
        assert_eq!((c.category, c.error_class), (Infra, TransientNetwork));
    }
}

//! The error classifier: `(error_type, message) -> {category, error_class, confidence, rule}`.
//!
//! Deterministic and linear in the input: the message is bounded (head and tail kept) and
//! normalised (ASCII-lowercased, whitespace runs collapsed) in one pass; one Aho-Corasick pass
//! then finds the literals the rules' patterns must start with, and only the patterns so admitted
//! run, each once, as its own `regex` automaton (no backtracking), in priority order. Labelling
//! follows promptise's conventions: infrastructure when the environment failed (including a
//! missing executable or module, and a 404 of the endpoint rather than of a resource), strategy
//! when the agent's choice of tool or arguments was wrong (including an argument error wrapped in
//! a server error), unknown when ambiguous. Figures: `docs/benchmarks.md`.

mod rules;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{LazyLock, OnceLock};

use aho_corasick::{AhoCorasick, AhoCorasickKind};
use regex::Regex;
use regex_syntax::hir::literal::{ExtractKind, Extractor};

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

/// The literals one of which every match of `pattern` starts with, or `None` when no such finite
/// set of non-empty literals exists (the pattern is then tried on every text).
fn required_prefixes(pattern: &str) -> Option<Vec<Vec<u8>>> {
    let hir = regex_syntax::parse(pattern).ok()?;
    let seq = Extractor::new().kind(ExtractKind::Prefix).extract(&hir);
    let lits = seq.literals()?;
    if lits.is_empty() || lits.iter().any(|l| l.as_bytes().is_empty()) {
        return None;
    }
    Some(lits.iter().map(|l| l.as_bytes().to_vec()).collect())
}

/// The rule tables, tried in this order of priority (each in its own order).
#[derive(Debug, Clone, Copy)]
enum Table {
    /// Message rules that outrank an explicit HTTP status.
    Before = 0,
    /// Message rules tried when no status decided.
    After = 1,
    /// Rules on type names.
    Types = 2,
}

/// The three rule tables compiled for "the first rule of a table with a matching pattern".
///
/// One Aho-Corasick pass over a text finds every literal that some pattern's match must start
/// with ([`Tables::scan`]); only the patterns so admitted (plus any without such literals) are
/// run, each at most once, from its earliest admitting literal, in rule order, until one
/// matches. Each pattern is its own small regex, compiled on first use, so no automaton over a
/// whole alternation is built per message, and the cost stays linear: one pass for the literals
/// and at most one linear search per pattern.
struct Tables {
    /// The patterns, numbered table by table in rule order (each compiled on first use).
    patterns: Vec<(String, OnceLock<Regex>)>,
    /// The rule each pattern belongs to.
    owner: Vec<&'static Rule>,
    /// The pattern numbers of each table.
    ranges: [Range<u32>; 3],
    /// Every required literal of every pattern.
    literals: AhoCorasick,
    /// For each literal (by its index in `literals`), the patterns it admits.
    admits: Vec<Vec<u32>>,
    /// Patterns without a required literal, always tried.
    always: Vec<u32>,
}

/// The patterns one text admits: (pattern, earliest start of an admitting literal), sorted.
struct Candidates<'t> {
    text: &'t str,
    list: Vec<(u32, usize)>,
}

impl Tables {
    fn new(tables: [&'static [Rule]; 3]) -> Tables {
        let mut patterns = Vec::new();
        let mut owner = Vec::new();
        let mut lits: Vec<Vec<u8>> = Vec::new();
        let mut admits: Vec<Vec<u32>> = Vec::new();
        let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut always = Vec::new();
        let mut ranges = [0..0, 0..0, 0..0];
        for (t, rules) in tables.into_iter().enumerate() {
            let start = patterns.len() as u32;
            for r in rules {
                for p in r.patterns {
                    let p = ascii_boundaries(p);
                    let id = patterns.len() as u32;
                    match required_prefixes(&p) {
                        Some(prefixes) => {
                            for l in prefixes {
                                let k = *index.entry(l.clone()).or_insert_with(|| {
                                    lits.push(l);
                                    admits.push(Vec::new());
                                    lits.len() - 1
                                });
                                if admits[k].last() != Some(&id) {
                                    admits[k].push(id);
                                }
                            }
                        }
                        None => always.push(id),
                    }
                    patterns.push((p, OnceLock::new()));
                    owner.push(r);
                }
            }
            ranges[t] = start..patterns.len() as u32;
        }
        // The literals come from this file's constant patterns; building their automaton can
        // only fail on a size limit they are far below (checked by the unit tests).
        #[allow(clippy::expect_used)]
        let literals = AhoCorasick::builder()
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(&lits)
            .expect("built-in literal prefilter builds");
        Tables {
            patterns,
            owner,
            ranges,
            literals,
            admits,
            always,
        }
    }

    /// The patterns `text` admits, for every table (one pass over the text).
    fn scan<'t>(&self, text: &'t str) -> Candidates<'t> {
        let mut list: Vec<(u32, usize)> = self.always.iter().map(|&p| (p, 0)).collect();
        for m in self.literals.find_overlapping_iter(text) {
            let start = m.start();
            list.extend(
                self.admits[m.pattern().as_usize()]
                    .iter()
                    .map(|&p| (p, start)),
            );
        }
        list.sort_unstable();
        list.dedup_by_key(|c| c.0);
        Candidates { text, list }
    }

    /// Pattern `id`'s regex, compiled on first use.
    fn regex(&self, id: u32) -> &Regex {
        let (p, re) = &self.patterns[id as usize];
        // The patterns are constants of this file, checked by the unit tests below.
        #[allow(clippy::expect_used)]
        re.get_or_init(|| Regex::new(p).expect("built-in error pattern compiles"))
    }

    /// The first rule of `table` (in priority order) with a pattern matching the scanned text.
    fn first(&self, c: &Candidates<'_>, table: Table) -> Option<&'static Rule> {
        let range = &self.ranges[table as usize];
        let from = c.list.partition_point(|&(p, _)| p < range.start);
        c.list[from..]
            .iter()
            .take_while(|&&(p, _)| p < range.end)
            .find(|&&(p, start)| self.regex(p).is_match_at(c.text, start))
            .map(|&(p, _)| self.owner[p as usize])
    }
}

static TABLES: LazyLock<Tables> =
    LazyLock::new(|| Tables::new([BEFORE_STATUS, AFTER_STATUS, TYPE_RULES]));

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
    // Bytes, not chars: ASCII is lowercased and its whitespace collapsed directly; a non-ASCII
    // char is decoded only to ask whether it is whitespace, and is otherwise copied unchanged.
    let push = |s: &str, out: &mut String| {
        let mut space = out.ends_with(' ');
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let (white, len) = if b[i] < 0x80 {
                let white = matches!(b[i], b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
                (white, 1)
            } else {
                let c = s[i..].chars().next().unwrap_or(' ');
                (c.is_whitespace(), c.len_utf8())
            };
            if white {
                if !space && !out.is_empty() {
                    out.push(' ');
                }
                space = true;
            } else {
                if len == 1 {
                    out.push(char::from(b[i].to_ascii_lowercase()));
                } else {
                    out.push_str(&s[i..i + len]);
                }
                space = false;
            }
            i += len;
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

/// Rules whose verdict is a generic server-side failure: an exception named inside one decides.
const SERVER_ERROR_RULES: &[&str] = &["jsonrpc_server_error", "grpc_status", "network"];

/// An exception type named in the text (`ValueError:`, `java.lang.IllegalStateException(`), as
/// servers wrap the exception that made them fail.
static INNER_EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)]
    Regex::new(&ascii_boundaries(
        r"\b[a-z_][a-z0-9_.]*(?:error|exception)\b ?[:(]",
    ))
    .expect("built-in exception pattern compiles")
});

/// The last exception type named in `text` and the text after it, if any.
fn inner_exception(text: &str) -> Option<(&str, &str)> {
    let m = INNER_EXCEPTION.find_iter(text).last()?;
    let name = m.as_str().trim_end_matches([':', '(', ' ']);
    Some((name, &text[m.end()..]))
}

/// A server error's verdict, unless the exception it wraps is the agent's fault: then that one.
fn unwrap_server_error(text: &str, outer: ErrorClassification) -> ErrorClassification {
    let Some((name, rest)) = inner_exception(text) else {
        return outer;
    };
    let inner = classify_normalised(Some(name), rest.trim_start(), false);
    if inner.category == Strat {
        ErrorClassification {
            rule: format!("wrapped_{}", inner.rule),
            ..inner
        }
    } else {
        outer
    }
}

/// Classifies one error by its type name (`TimeoutError`, `reqwest::Error`, ...) and message.
///
/// Priority: context overflow, unknown tool, a missing executable or module (the environment),
/// a 404 of the endpoint rather than a resource (no route, unknown session), a named bad
/// argument (even under a 5xx), JSON-RPC codes of definite meaning, rate limits and quotas,
/// invalid credentials, then an explicit HTTP status, then protocol codes and phrases (JSON-RPC/
/// MCP, gRPC, timeouts, DNS, TLS, network, database contention, schema and parse errors, not
/// found, unsupported input, conflicts), then the type name, else unknown. A 5xx or another
/// generic server error that names the exception it wraps takes that exception's verdict when it
/// is the agent's fault (`500: ValueError: invalid literal for int()` is a bad argument).
pub fn classify_error(error_type: Option<&str>, message: &str) -> ErrorClassification {
    classify_normalised(error_type, &normalise(message), true)
}

/// [`classify_error`] on a normalised message; `unwrap` looks inside server errors (one level).
fn classify_normalised(error_type: Option<&str>, text: &str, unwrap: bool) -> ErrorClassification {
    let found = TABLES.scan(text);
    if let Some(r) = TABLES.first(&found, Table::Before) {
        return verdict(r);
    }
    if let Some(code) = http_status(text) {
        let (category, error_class, confidence) = status_verdict(code);
        let v = ErrorClassification {
            category,
            error_class,
            confidence,
            rule: format!("http_status_{code}"),
        };
        return if unwrap && code >= 500 {
            unwrap_server_error(text, v)
        } else {
            v
        };
    }
    if let Some(r) = TABLES.first(&found, Table::After) {
        let v = verdict(r);
        return if unwrap && SERVER_ERROR_RULES.contains(&r.name) {
            unwrap_server_error(text, v)
        } else {
            v
        };
    }
    let ty = error_type.map(normalise).unwrap_or_default();
    if !ty.is_empty() {
        let in_ty = TABLES.scan(&ty);
        if let Some(r) = TABLES
            .first(&in_ty, Table::Before)
            .or_else(|| TABLES.first(&in_ty, Table::After))
        {
            let mut v = verdict(r);
            v.rule = format!("type_{}", r.name);
            return v;
        }
        if let Some(r) = TABLES.first(&in_ty, Table::Types) {
            return verdict(r);
        }
    }
    if let Some(r) = TABLES.first(&found, Table::Types) {
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
        let _ = &*TABLES;
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

    #[test]
    fn model_servers_context_overflow() {
        // What OpenAI, llama.cpp's server, llama-cpp-python's server and its library say when a
        // request does not fit the context, as the OpenAI-compatible client reports them: a
        // context overflow (the request must shrink), not the 400's malformed request.
        for m in [
            r#"HTTP 400: {"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9100 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            r#"HTTP 400: {"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
            r#"HTTP 400: {"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}"#,
            r#"HTTP 400: {"error":{"message":"This model's maximum context length is 1024 tokens. However, you requested 1100 tokens (1084 in the messages, 16 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            "ValueError: Requested tokens (1100) exceed context window of 1024",
            r#"{"type":"exceed_context_size_error"}"#,
        ] {
            let c = classify_error(None, m);
            assert_eq!(
                (c.category, c.error_class, c.rule.as_str()),
                (Strat, ToolNotFit, "context_overflow"),
                "{m}"
            );
        }
        // Other 400s stay malformed requests; a context that is merely mentioned is no overflow.
        let c = classify_error(None, r#"HTTP 400: {"error":"'messages' must be a list"}"#);
        assert_eq!(c.error_class, SchemaMismatch);
        let c = classify_error(None, "HTTP 400: the available context size is 4096 tokens");
        assert_eq!(c.error_class, SchemaMismatch);
    }

    #[test]
    fn issue_57_kinds() {
        // The environment lacks an executable or module: not the agent's arguments.
        for (ty, m) in [
            (None, "bash: yq: command not found"),
            (Some("ModuleNotFoundError"), "No module named 'lxml'"),
            (
                None,
                "exec: \"terraform\": executable file not found in $PATH",
            ),
        ] {
            let c = classify_error(ty, m);
            assert_eq!(
                (c.category, c.error_class),
                (Infra, DeterministicFailure),
                "{m}"
            );
        }
        // A 404 of the endpoint (router, gateway, session) is not a missing resource.
        for m in [
            "HTTP 404: no route matched",
            "404: Session not found",
            "Cannot POST /v9/run",
        ] {
            assert_eq!(classify_error(None, m).category, Infra, "{m}");
        }
        let c = classify_error(None, "HTTP 404: no such user 'bob'");
        assert_eq!((c.category, c.error_class), (Strat, NotFound));
        // A server error wrapping an argument error is the argument's fault; wrapping a network
        // error, or naming no exception, it stays infrastructure.
        let c = classify_error(None, "HTTP 500: ValueError: invalid literal for int(): 'x'");
        assert_eq!((c.category, c.rule.as_str()), (Strat, "wrapped_schema"));
        let c = classify_error(None, "HTTP 500: ConnectionError: connection refused");
        assert_eq!(c.category, Infra);
        assert_eq!(classify_error(None, "HTTP 500: boom").category, Infra);
        // JSON-RPC codes of definite meaning outrank the transport's status.
        let c = classify_error(None, r#"HTTP 500: {"error":{"code":-32601}}"#);
        assert_eq!((c.category, c.error_class), (Strat, NotFound));
        let c = classify_error(None, r#"HTTP 400: {"error":{"code":-32603}}"#);
        assert_eq!(c.category, Strat, "the 400 decides a generic -32603");
    }

    #[test]
    fn prefilter_agrees_with_trying_every_pattern() {
        // On every training message (and a few edge cases) the first rule found through the
        // literal prefilter is the first rule a plain scan of every pattern finds.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/errors.jsonl");
        let corpus = std::fs::read_to_string(path).unwrap();
        let mut texts: Vec<String> = corpus
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                normalise(v["error_message"].as_str().unwrap())
            })
            .collect();
        texts.extend(["", "x", "eof", "-32601", "tool"].map(String::from));
        for (rules, table) in [
            (BEFORE_STATUS, Table::Before),
            (AFTER_STATUS, Table::After),
            (TYPE_RULES, Table::Types),
        ] {
            let plain: Vec<Vec<Regex>> = rules
                .iter()
                .map(|r| {
                    let ps = r.patterns.iter();
                    ps.map(|p| Regex::new(&ascii_boundaries(p)).unwrap())
                        .collect()
                })
                .collect();
            for t in &texts {
                let want = (rules.iter().zip(&plain))
                    .find(|(_, res)| res.iter().any(|re| re.is_match(t)))
                    .map(|(r, _)| r.name);
                let got = TABLES.first(&TABLES.scan(t), table).map(|r| r.name);
                assert_eq!(got, want, "{t}");
            }
        }
    }
}

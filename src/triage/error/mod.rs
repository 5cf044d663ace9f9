//! The error classifier: `(error_type, message) -> {category, error_class, confidence, rule}`.
//!
//! Deterministic and linear in the input: the message is bounded (head and tail kept) and
//! normalised (ASCII-lowercased, whitespace runs collapsed) in one pass, into a per-thread buffer
//! reused across calls; one pass of an Aho-Corasick DFA then finds every occurrence of the rules'
//! literals. Most patterns are nothing but literals with word-boundary or anchor edges, decided
//! by checking those edges where the literal occurs; the rest run as their own `regex` automata
//! (no backtracking), only when a literal they must start with occurs, each once, in priority
//! order. The explicit-status pattern runs only on text holding a 3-digit 4xx/5xx number.
//! Labelling follows promptise's conventions: infrastructure when the environment failed
//! (including a missing executable or module, and a 404 of the endpoint rather than of a
//! resource), strategy when the agent's choice of tool or arguments was wrong (including an
//! argument error wrapped in a server error), unknown when ambiguous. Figures:
//! `docs/benchmarks.md`.

pub mod instruction;
mod rules;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{LazyLock, OnceLock};

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind, StartKind};
use regex::Regex;
use regex_syntax::hir::literal::{ExtractKind, Extractor};
use regex_syntax::hir::{Hir, HirKind, Look};

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

/// What must hold at one end of a literal for a pattern's branch to match there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Edge {
    /// Nothing.
    Any,
    /// An ASCII word boundary (`(?-u:\b)`).
    Word,
    /// The start of the text (`^`) before the literal, its end (`$`) after it.
    Text,
}

impl Edge {
    /// The assertion `h`, if it is one an edge can stand for (`before`: on the literal's left).
    fn of(h: &Hir, before: bool) -> Option<Edge> {
        match h.kind() {
            HirKind::Look(Look::WordAscii) => Some(Edge::Word),
            HirKind::Look(Look::Start) if before => Some(Edge::Text),
            HirKind::Look(Look::End) if !before => Some(Edge::Text),
            _ => None,
        }
    }

    /// Whether the edge holds at byte offset `at` of `text` (`before`: on the literal's left).
    fn holds(self, text: &[u8], at: usize, before: bool) -> bool {
        match self {
            Edge::Any => true,
            Edge::Text if before => at == 0,
            Edge::Text => at == text.len(),
            Edge::Word => {
                let word = |i: usize| {
                    text.get(i)
                        .is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_')
                };
                let left = at > 0 && word(at - 1);
                left != word(at)
            }
        }
    }
}

/// Most literals one pattern is expanded into; beyond that it stays a regex.
const MAX_BRANCH_LITERALS: usize = 64;

/// `pattern` as a finite set of literals with an edge on either side, when every match is exactly
/// one of them: each branch of its top-level alternation is an optional edge assertion, a part
/// without assertions that matches one of a few exact literals, and an optional edge assertion
/// (`\bno such tool\b`, `timed? ?out`, `^eof$`). `None` when some branch is of another form.
fn literal_branches(pattern: &str) -> Option<Vec<(Vec<u8>, Edge, Edge)>> {
    let hir = regex_syntax::parse(pattern).ok()?;
    let branches = match hir.kind() {
        HirKind::Alternation(hs) => hs.as_slice(),
        _ => std::slice::from_ref(&hir),
    };
    let mut out = Vec::new();
    for b in branches {
        let parts = match b.kind() {
            HirKind::Concat(hs) => hs.as_slice(),
            _ => std::slice::from_ref(b),
        };
        let (mut lo, mut hi) = (0, parts.len());
        let before = match parts.first().and_then(|h| Edge::of(h, true)) {
            Some(e) => {
                lo += 1;
                e
            }
            None => Edge::Any,
        };
        let after = match parts[lo..hi].last().and_then(|h| Edge::of(h, false)) {
            Some(e) => {
                hi -= 1;
                e
            }
            None => Edge::Any,
        };
        let middle = Hir::concat(parts[lo..hi].to_vec());
        if !middle.properties().look_set().is_empty() {
            return None;
        }
        let seq = Extractor::new().kind(ExtractKind::Prefix).extract(&middle);
        let lits = seq.literals()?;
        if lits.is_empty()
            || lits.len() > MAX_BRANCH_LITERALS
            || lits
                .iter()
                .any(|l| !l.is_exact() || l.as_bytes().is_empty())
        {
            return None;
        }
        out.extend(lits.iter().map(|l| (l.as_bytes().to_vec(), before, after)));
    }
    Some(out)
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

/// What one occurrence of a literal says about one pattern.
#[derive(Debug, Clone, Copy)]
enum Admit {
    /// The literal is a whole branch of the pattern, which matches here if both edges hold.
    Whole {
        pattern: u32,
        before: Edge,
        after: Edge,
    },
    /// Every match of the pattern starts with one of its literals, this one among them: the
    /// pattern's regex is run from the earliest such occurrence.
    Prefix { pattern: u32 },
}

/// The three rule tables compiled for "the first rule of a table with a matching pattern".
///
/// One pass of an Aho-Corasick DFA over a text finds every occurrence of every literal of the
/// patterns ([`Tables::scan`]). Most patterns are literals with word-boundary or anchor edges
/// ([`literal_branches`]): an occurrence whose edges hold is a match, decided on the spot. The
/// others are regexes admitted by a literal every match of theirs starts with; only those are
/// run, each at most once, from its earliest admitting literal, in rule order, and only while no
/// earlier pattern of the table has matched. Each such pattern is its own small regex, compiled
/// on first use. The cost stays linear: one pass for the literals (constant work per occurrence,
/// the number of literals ending at one offset being bounded by the tables) and at most one
/// linear search per regex pattern.
struct Tables {
    /// The regex of each pattern that is not literal branches (each compiled on first use).
    regexes: Vec<Option<(String, OnceLock<Regex>)>>,
    /// The rule each pattern belongs to.
    owner: Vec<&'static Rule>,
    /// The pattern numbers of each table.
    ranges: [Range<u32>; 3],
    /// Every literal of every pattern (whole branches and required prefixes).
    literals: DFA,
    /// For each literal (by its index in `literals`), what an occurrence of it says.
    admits: Vec<Vec<Admit>>,
    /// Patterns without a required literal, always tried.
    always: Vec<u32>,
}

/// Regex patterns kept inline per scanned text before spilling to the heap.
const INLINE_CANDIDATES: usize = 8;

/// What one scan of a text found.
struct Candidates<'t> {
    text: &'t str,
    /// Per table, the first pattern (lowest number) decided to match by its literals alone, or
    /// `u32::MAX`.
    matched: [u32; 3],
    /// Regex patterns admitted, with the earliest start of an admitting literal, sorted by
    /// pattern (the first `len` entries, then `spill` when more were admitted).
    inline: [(u32, usize); INLINE_CANDIDATES],
    len: usize,
    spill: Vec<(u32, usize)>,
}

impl Candidates<'_> {
    /// Admits regex pattern `p` from `start` (keeping its earliest start).
    fn admit(&mut self, p: u32, start: usize) {
        let list = if self.spill.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.spill[..]
        };
        match list.binary_search_by_key(&p, |c| c.0) {
            Ok(i) => list[i].1 = list[i].1.min(start),
            Err(i) if self.spill.is_empty() && self.len < INLINE_CANDIDATES => {
                self.inline.copy_within(i..self.len, i + 1);
                self.inline[i] = (p, start);
                self.len += 1;
            }
            Err(i) => {
                if self.spill.is_empty() {
                    self.spill.extend_from_slice(&self.inline[..self.len]);
                }
                self.spill.insert(i, (p, start));
            }
        }
    }

    /// The admitted regex patterns, sorted.
    fn list(&self) -> &[(u32, usize)] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl Tables {
    fn new(tables: [&'static [Rule]; 3]) -> Tables {
        let mut regexes = Vec::new();
        let mut owner = Vec::new();
        let mut lits: Vec<Vec<u8>> = Vec::new();
        let mut admits: Vec<Vec<Admit>> = Vec::new();
        let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut always = Vec::new();
        let mut ranges = [0..0, 0..0, 0..0];
        let mut add = |l: Vec<u8>, a: Admit| {
            let k = *index.entry(l.clone()).or_insert_with(|| {
                lits.push(l);
                admits.push(Vec::new());
                lits.len() - 1
            });
            admits[k].push(a);
        };
        for (t, rules) in tables.into_iter().enumerate() {
            let start = regexes.len() as u32;
            for r in rules {
                for p in r.patterns {
                    let p = ascii_boundaries(p);
                    let pattern = regexes.len() as u32;
                    owner.push(r);
                    if let Some(branches) = literal_branches(&p) {
                        for (l, before, after) in branches {
                            add(
                                l,
                                Admit::Whole {
                                    pattern,
                                    before,
                                    after,
                                },
                            );
                        }
                        regexes.push(None);
                        continue;
                    }
                    match required_prefixes(&p) {
                        Some(prefixes) => {
                            for l in prefixes {
                                add(l, Admit::Prefix { pattern });
                            }
                        }
                        None => always.push(pattern),
                    }
                    regexes.push(Some((p, OnceLock::new())));
                }
            }
            ranges[t] = start..regexes.len() as u32;
        }
        // The literals come from this file's constant patterns; building their automaton can
        // only fail on a size limit they are far below (checked by the unit tests).
        #[allow(clippy::expect_used)]
        let literals = aho_corasick::dfa::Builder::new()
            .match_kind(MatchKind::Standard)
            .start_kind(StartKind::Unanchored)
            .prefilter(false)
            .build(&lits)
            .expect("built-in literal automaton builds");
        Tables {
            regexes,
            owner,
            ranges,
            literals,
            admits,
            always,
        }
    }

    /// The table pattern `p` belongs to.
    fn table_of(&self, p: u32) -> usize {
        if p < self.ranges[1].start {
            0
        } else if p < self.ranges[2].start {
            1
        } else {
            2
        }
    }

    /// What `text` admits and matches, for every table (one pass over the text).
    fn scan<'t>(&self, text: &'t str) -> Candidates<'t> {
        let mut c = Candidates {
            text,
            matched: [u32::MAX; 3],
            inline: [(0, 0); INLINE_CANDIDATES],
            len: 0,
            spill: Vec::new(),
        };
        for &p in &self.always {
            c.admit(p, 0);
        }
        let dfa = &self.literals;
        let bytes = text.as_bytes();
        // An unanchored DFA without a prefilter always has an unanchored start state.
        let Ok(mut sid) = dfa.start_state(Anchored::No) else {
            return c;
        };
        for (i, &b) in bytes.iter().enumerate() {
            sid = dfa.next_state(Anchored::No, sid, b);
            if dfa.is_match(sid) {
                self.occurrences(sid, i + 1, &mut c);
            }
        }
        c
    }

    /// Records what the literals ending at `end` (those of DFA state `sid`) say.
    #[inline(never)]
    fn occurrences(&self, sid: StateID, end: usize, c: &mut Candidates<'_>) {
        let dfa = &self.literals;
        let bytes = c.text.as_bytes();
        for m in 0..dfa.match_len(sid) {
            let lit = dfa.match_pattern(sid, m);
            let start = end - dfa.pattern_len(lit);
            for a in &self.admits[lit.as_usize()] {
                match *a {
                    Admit::Whole {
                        pattern,
                        before,
                        after,
                    } => {
                        let t = self.table_of(pattern);
                        if pattern < c.matched[t]
                            && before.holds(bytes, start, true)
                            && after.holds(bytes, end, false)
                        {
                            c.matched[t] = pattern;
                        }
                    }
                    Admit::Prefix { pattern } => c.admit(pattern, start),
                }
            }
        }
    }

    /// Pattern `id`'s regex (compiled on first use), if it is not literal branches.
    fn regex(&self, id: u32) -> Option<&Regex> {
        let (p, re) = self.regexes.get(id as usize)?.as_ref()?;
        // The patterns are constants of this file, checked by the unit tests below.
        #[allow(clippy::expect_used)]
        Some(re.get_or_init(|| Regex::new(p).expect("built-in error pattern compiles")))
    }

    /// The first rule of `table` (in priority order) with a pattern matching the scanned text.
    fn first(&self, c: &Candidates<'_>, table: Table) -> Option<&'static Rule> {
        let range = &self.ranges[table as usize];
        let matched = c.matched[table as usize];
        let list = c.list();
        let from = list.partition_point(|&(p, _)| p < range.start);
        let p = list[from..]
            .iter()
            .take_while(|&&(p, _)| p < range.end && p < matched)
            .find(|&&(p, start)| {
                self.regex(p)
                    .is_some_and(|re| re.is_match_at(c.text, start))
            })
            .map_or(matched, |&(p, _)| p);
        self.owner.get(p as usize).copied()
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
    // Every branch of the pattern captures `[45][0-9][0-9]`: without such three bytes, no match
    // (most messages), and the regex is not run.
    let may = normalised
        .as_bytes()
        .windows(3)
        .any(|w| matches!(w[0], b'4' | b'5') && w[1].is_ascii_digit() && w[2].is_ascii_digit());
    if !may {
        return None;
    }
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
    let mut out = Vec::new();
    normalise_into(message, &mut out);
    into_string(out)
}

/// `bytes` as a `String`: they are always UTF-8 here (whole chars of the input, ASCII bytes and
/// spaces), and would be replaced lossily otherwise.
fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`normalise`] into `out` (cleared first).
fn normalise_into(message: &str, out: &mut Vec<u8>) {
    out.clear();
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
    out.reserve(head.len() + tail.map_or(0, str::len) + 1);
    push_normalised(head, out);
    if let Some(t) = tail {
        if out.last() != Some(&b' ') {
            out.push(b' ');
        }
        push_normalised(t, out);
    }
    while out.last() == Some(&b' ') {
        out.pop();
    }
}

thread_local! {
    /// Each thread's buffers for normalised messages and type names, reused across calls.
    static SCRATCH: [RefCell<Vec<u8>>; 2] = const { [RefCell::new(Vec::new()), RefCell::new(Vec::new())] };
}

/// Runs `f` on `s` normalised, in this thread's buffer `slot` (0: messages, 1: type names) when
/// it is free, else in a new one.
fn with_normalised<R>(slot: usize, s: &str, mut f: impl FnMut(&str) -> R) -> R {
    let reused = SCRATCH.try_with(|bufs| {
        let mut buf = bufs.get(slot)?.try_borrow_mut().ok()?;
        normalise_into(s, &mut buf);
        std::str::from_utf8(&buf).ok().map(&mut f)
    });
    match reused {
        Ok(Some(r)) => r,
        _ => f(&normalise(s)),
    }
}

/// Appends `s` to `out` ASCII-lowercased, its whitespace runs collapsed into one space (none
/// at the start of `out`).
///
/// Most messages are printable ASCII with single spaces that need no collapsing: checked in one
/// vectorisable pass, they are copied and lowercased in bulk. Otherwise bytes, not chars: ASCII
/// is lowercased and its whitespace collapsed directly; a non-ASCII char is decoded only to ask
/// whether it is whitespace, and is otherwise copied unchanged.
fn push_normalised(s: &str, out: &mut Vec<u8>) {
    let b = s.as_bytes();
    // No control byte, no non-ASCII byte (`c - 0x20` wraps above 0x5f for both), no two spaces
    // in a row and no leading space: then the only whitespace is single spaces, kept as they are.
    let plain = b
        .iter()
        .fold(true, |ok, &c| ok & (c.wrapping_sub(0x20) < 0x60))
        && b.iter()
            .zip(b.iter().skip(1))
            .fold(true, |ok, (&x, &y)| ok & !(x == b' ' && y == b' '))
        && b.first() != Some(&b' ');
    if plain {
        let from = out.len();
        out.extend_from_slice(b);
        if let Some(new) = out.get_mut(from..) {
            new.make_ascii_lowercase();
        }
        return;
    }
    let mut space = out.last() == Some(&b' ');
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let (white, len) = if c < 0x80 {
            (
                matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r'),
                1,
            )
        } else {
            let ch = s.get(i..).and_then(|r| r.chars().next()).unwrap_or(' ');
            (ch.is_whitespace(), ch.len_utf8())
        };
        if white {
            if !space && !out.is_empty() {
                out.push(b' ');
            }
            space = true;
        } else {
            if len == 1 {
                out.push(c.to_ascii_lowercase());
            } else {
                out.extend_from_slice(&b[i..(i + len).min(b.len())]);
            }
            space = false;
        }
        i += len;
    }
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
///
/// Whatever the rules say, a message that asks for another argument
/// ([`instruction::asks_to_change_the_call`]: `listing timed out: pass recursive=false`) is the
/// call's doing: strategy, the rule's name followed by `+asks_for_another_argument`. Retrying
/// the same call would fail the same way.
pub fn classify_error(error_type: Option<&str>, message: &str) -> ErrorClassification {
    let mut v = with_normalised(0, message, |text| {
        classify_normalised(error_type, text, true)
    });
    if v.category != FailureCategory::Strategy && instruction::asks_to_change_the_call(message) {
        v.category = FailureCategory::Strategy;
        v.rule.push_str("+asks_for_another_argument");
    }
    v
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
    let by_type = error_type.and_then(|ty| with_normalised(1, ty, type_verdict));
    if let Some(v) = by_type {
        return v;
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

/// The verdict of the rules on a normalised type name, if one matches: message rules first (as
/// `type_<rule>`), then type-name rules.
fn type_verdict(ty: &str) -> Option<ErrorClassification> {
    if ty.is_empty() {
        return None;
    }
    let in_ty = TABLES.scan(ty);
    if let Some(r) = TABLES
        .first(&in_ty, Table::Before)
        .or_else(|| TABLES.first(&in_ty, Table::After))
    {
        let mut v = verdict(r);
        v.rule = format!("type_{}", r.name);
        return Some(v);
    }
    TABLES.first(&in_ty, Table::Types).map(verdict)
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

    /// Every labelled fixture message, normalised, and variants that put other bytes against
    /// the literals' edges.
    fn fixture_texts() -> Vec<String> {
        let mut texts = Vec::new();
        for name in [
            "errors.jsonl",
            "errors_holdout.jsonl",
            "errors_heldout_real.jsonl",
        ] {
            let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
            let corpus = std::fs::read_to_string(path).unwrap();
            for l in corpus.lines().filter(|l| !l.trim().is_empty()) {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let m = normalise(v["error_message"].as_str().unwrap());
                texts.push(format!("x{m}_"));
                texts.push(format!("é{m}é"));
                texts.push(m.replace(' ', "_"));
                texts.push(m.replace(' ', "-"));
                texts.push(m);
            }
        }
        texts.extend(
            [
                "",
                "x",
                "eof",
                ": eof",
                "x: eof",
                "eofx",
                "-32601",
                "x-32601",
                "-326010",
                "tool",
                "tls",
                "xtls",
                "tls_",
                "tls-",
                "étls",
                "tlsé",
                "tpm",
                "the tpm is",
                "rpm1",
                "timed out",
                "timedout",
                "time out",
                "timeoutx",
                "no such tool here",
                "cannot get /x",
                "a cannot get /x",
                "sh: 1: yq: not found",
            ]
            .map(String::from),
        );
        texts
    }

    #[test]
    fn prefilter_agrees_with_trying_every_pattern() {
        // On every fixture message (and variants and edge cases) the first rule found through
        // the literal automaton, its edge checks and the admitted regexes is the first rule a
        // plain scan of every pattern as a regex finds.
        let texts = fixture_texts();
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

    #[test]
    fn most_patterns_are_decided_by_their_literals() {
        let regexes = TABLES.regexes.iter().filter(|r| r.is_some()).count();
        let all = TABLES.regexes.len();
        println!("{regexes} of {all} patterns run as regexes");
        assert!(
            regexes * 5 < all,
            "{regexes} of {all} patterns run as regexes"
        );
    }

    #[test]
    fn literal_branches_of_patterns() {
        use Edge::{Any, Text, Word};
        let b = |p: &str| literal_branches(&ascii_boundaries(p));
        let lit = |l: &str, x, y| (l.as_bytes().to_vec(), x, y);
        assert_eq!(
            b(r"\bno such tool\b"),
            Some(vec![lit("no such tool", Word, Word)])
        );
        assert_eq!(b(r"^eof$"), Some(vec![lit("eof", Text, Text)]));
        assert_eq!(b(r": eof$"), Some(vec![lit(": eof", Any, Text)]));
        assert_eq!(b(r"-32601\b"), Some(vec![lit("-32601", Any, Word)]));
        let mut t = b(r"timed? ?out").unwrap();
        t.sort();
        let want = ["time out", "timed out", "timedout", "timeout"];
        assert_eq!(t, want.map(|l| lit(l, Any, Any)).to_vec());
        let mut t = b(r"(?:tpm|rpm)\b").unwrap();
        t.sort();
        assert_eq!(t, vec![lit("rpm", Any, Word), lit("tpm", Any, Word)]);
        assert_eq!(
            b(r": eof$|^eof\b"),
            Some(vec![lit(": eof", Any, Text), lit("eof", Text, Word)])
        );
        // The parser factors a common leading assertion out of the branches: then a regex.
        assert_eq!(b(r"\btpm\b|\brpm\b"), None);
        // A class, an assertion inside a branch, or an unbounded part: a regex.
        assert_eq!(b(r"\btool \S+ not found\b"), None);
        assert_eq!(b(r"(?:a|\bb)c"), None);
        // `\d` is Unicode's digits: too many to expand.
        assert_eq!(b(r"invalid length \d"), None);
        assert_eq!(b(r"requested tokens \(\d+\)"), None);
        assert_eq!(b(r"\b"), None);
    }

    #[test]
    fn normalise_equals_its_definition() {
        // Whitespace runs (Unicode's) to one space, none at either end, ASCII lowercased: the
        // bulk path for plain text and the byte path for the rest agree with that definition.
        let mut texts: Vec<String> = fixture_texts();
        texts.extend(
            [
                " lead",
                "trail ",
                "two  spaces",
                "Tab\there",
                "NBSP\u{a0}here",
                "Ünïcode ÉRROR",
                "\u{85}next line",
                "line\r\nbreak",
                "\u{3000}",
                "A",
                " ",
                "DEL\u{7f}",
                "ctl\x01x",
            ]
            .map(String::from),
        );
        for t in &texts {
            let want = t
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_lowercase();
            assert_eq!(normalise(t), want, "{t:?}");
            let upper = t.to_uppercase();
            let want = upper
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_lowercase();
            assert_eq!(normalise(&upper), want, "{upper:?}");
        }
    }

    #[test]
    fn status_precheck_agrees_with_the_pattern() {
        for t in fixture_texts() {
            let by_regex = STATUS.find_iter(&t).find_map(|m| first_status(m.as_str()));
            assert_eq!(http_status(&t), by_regex, "{t}");
        }
    }

    #[test]
    fn scratch_buffers_are_reused_safely() {
        // A long message, then a short one, then a wrapped server error that classifies its
        // inner exception's type while the message's buffer is in use: as if freshly computed.
        let long = format!("{} HTTP 503", "x ".repeat(20_000));
        let short = "HTTP 500: ValueError: invalid literal for int(): 'x'";
        let fresh = |m: &str| classify_normalised(Some("E"), &normalise(m), true);
        for m in [long.as_str(), short, "fetch failed", short] {
            assert_eq!(classify_error(Some("E"), m), fresh(m), "{m}");
        }
        let c = classify_error(None, short);
        assert_eq!((c.category, c.rule.as_str()), (Strat, "wrapped_schema"));
    }
}

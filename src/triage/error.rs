//! The error classifier: `(error_type, message) -> {category, error_class, confidence, rule}`.
//!
//! Deterministic and linear in the input: every pattern is compiled once (`LazyLock`) by the
//! `regex` crate, whose automata never backtrack, and the message is bounded (head and tail kept)
//! and normalised (ASCII-lowercased, whitespace runs collapsed) in one pass before matching.
//! Labelling follows promptise's conventions: infrastructure when the environment failed,
//! strategy when the agent's choice of tool or arguments was wrong, unknown when ambiguous.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

use crate::taxonomy::{ErrorClass, ErrorClassification, FailureCategory};

use ErrorClass::*;
use FailureCategory::{Infrastructure as Infra, Strategy as Strat};

/// Bytes of the message kept from its start; the rest is cut (keeping [`TAIL_BYTES`] of the end).
pub const HEAD_BYTES: usize = 12 * 1024;
/// Bytes of the message kept from its end when it is longer than `HEAD_BYTES + TAIL_BYTES`.
pub const TAIL_BYTES: usize = 4 * 1024;

/// One message rule: a name, patterns (any may match), and the verdict.
struct Rule {
    name: &'static str,
    patterns: &'static [&'static str],
    category: FailureCategory,
    class: ErrorClass,
    confidence: f64,
}

const fn rule(
    name: &'static str,
    category: FailureCategory,
    class: ErrorClass,
    confidence: f64,
    patterns: &'static [&'static str],
) -> Rule {
    Rule {
        name,
        patterns,
        category,
        class,
        confidence,
    }
}

/// Rules that outrank an explicit HTTP status (they say more than the status does).
const BEFORE_STATUS: &[Rule] = &[
    rule(
        "context_overflow",
        Strat,
        ToolNotFit,
        0.95,
        &[
            r"maximum context length",
            r"context[ _]length[ _]exceeded",
            r"context window (?:is |was )?(?:exceeded|full|overflow)",
            r"exceeds? the (?:model'?s? )?context (?:window|length|limit)",
            r"prompt is too long",
            r"reduce the length of the messages",
            r"input is too long for (?:the )?(?:requested )?model",
            r"too many tokens in (?:the )?(?:prompt|input|request)",
        ],
    ),
    rule(
        "unknown_tool",
        Strat,
        NotFound,
        0.95,
        &[
            r"\bunknown tool\b",
            r"\bno tool (?:named|called|with (?:the )?name)\b",
            r"\btool \S+ (?:was )?not found\b",
            r"\btool not found\b",
            r"\btool \S+ (?:is not|isn't) (?:available|registered|defined|in the manifest)",
            r"\bno such tool\b",
            r"\binvalid tool(?: name)?\b",
            r"\bfunction \S+ (?:is )?not found\b",
        ],
    ),
    rule(
        "bad_argument",
        Strat,
        SchemaMismatch,
        0.9,
        &[
            r"\binvalid (?:request )?(?:parameter|param|argument|arg|value|input|field|query|enum value|option|format for|type for|json|payload|body|schema|date|url)s?\b",
            r"\bmissing (?:required |mandatory )?(?:parameter|param|argument|field|property|key|value)s?\b",
            r"\bmissing required\b",
            r"\b(?:parameter|argument|field|property|param)s? \S+ (?:is )?(?:required|missing|invalid|not allowed|must be)",
            r"\bunknown (?:parameter|argument|field|property|param|option|keyword)s?\b",
            r"\bunexpected (?:keyword )?argument\b",
            r"\bunrecognized (?:argument|parameter|field|option|arguments)\b",
            r"\bis a required property\b",
            r"\brequired (?:parameter|field|argument|property)\b",
            r"\bfailed to satisfy constraint\b",
            r"\bvalidation (?:error|failed|exception)\b",
            r"\bvalidationexception\b",
            r"\bvalidationerror\b",
            r"\bschema validation\b",
            r"\binvalid[_ ]argument\b",
            r"\binvalidargument\b",
            r"\binvalid[_ ]params\b",
            r"\binvalidparametervalue\b",
            r"\binvalidparametercombination\b",
            r"-32602\b",
            r"\bmust be (?:a|an|one of|of type|between|positive|non-negative|greater|less|at least|at most|provided|specified|set|valid|an integer|a string|a number)\b",
            r"\bis not (?:a valid|one of|of type)\b",
            r"\bshould be (?:a valid|one of|of type)\b",
            r"\binput should be\b",
            r"\bfield required\b",
        ],
    ),
    rule(
        "rate_limit",
        Infra,
        RateLimit,
        0.95,
        &[
            r"rate[ _-]?limit",
            r"ratelimit",
            r"too many requests",
            r"throttl",
            r"\bquota\b",
            r"quota[ _]?exceeded",
            r"insufficient_quota",
            r"resource[_ ]exhausted",
            r"resourceexhausted",
            r"\bslow ?down\b",
            r"request ?limit ?exceeded",
            r"limitexceeded",
            r"limit exceeded for",
            r"provisionedthroughputexceeded",
            r"(?:tokens|requests) per (?:min|minute|day|second)",
            r"\btpm\b|\brpm\b",
            r"exceeded (?:your|the) (?:current )?(?:quota|request limit|rate)",
            r"too many (?:calls|concurrent requests)",
            r"request rate",
            r"\bbandwidth limit",
        ],
    ),
    rule(
        "credentials",
        Infra,
        Auth,
        0.9,
        &[
            r"\binvalid[ _-]?api[ _-]?key\b",
            r"\bincorrect api key\b",
            r"\bapi[ _-]?key (?:is )?(?:invalid|expired|not valid|missing|revoked|not found)",
            r"\bno api key\b",
            r"\b(?:access |auth |bearer |id |refresh |security )?token (?:has |is )?(?:expired|invalid|revoked|not valid)",
            r"\bexpired[ _]?token",
            r"\bjwt (?:expired|malformed)",
            r"\binvalid[_ ](?:token|grant|client|credentials|auth)",
            r"\bunauthenticated\b",
            r"\bunauthorized\b",
            r"\bnot authenticated\b",
            r"\bauthentication (?:failed|required|error|credentials|token)",
            r"\bpassword authentication failed\b",
            r"\baccess denied for user\b",
            r"\bnoauth\b",
            r"\bsecurity token included in the request is (?:expired|invalid)",
            r"\bunable to locate credentials\b",
            r"\bsignaturedoesnotmatch\b",
            r"\binvalidsignature",
            r"\bunrecognizedclient",
            r"\binvalidclienttokenid\b",
            r"\bauthenticationfailed\b",
            r"\blogin failed\b",
            r"\bcredentials (?:have )?expired\b",
            r"\bcould not (?:load|find) (?:default )?credentials\b",
            r"\bauthentication ?error\b",
            r"\bwrongpass\b",
        ],
    ),
];

/// Rules tried when no explicit status decided.
const AFTER_STATUS: &[Rule] = &[
    rule(
        "permission",
        Strat,
        Auth,
        0.9,
        &[
            r"\bpermission[ _]?denied\b",
            r"\bnot authorized to\b",
            r"\bnot permitted\b",
            r"\bforbidden\b",
            r"\baccess[ _]?denied",
            r"\binsufficient (?:permissions?|privileges?|scopes?|access)\b",
            r"\bdoes not have (?:the )?(?:required )?(?:permission|access)",
            r"\bdo(?:es)? not have permission\b",
            r"\beacces\b",
            r"\beperm\b",
            r"\bmust be owner of\b",
            r"\bnot allowed to\b",
            r"\bnot accessible by\b",
        ],
    ),
    rule(
        "jsonrpc_method_not_found",
        Strat,
        NotFound,
        0.95,
        &[r"-32601\b", r"\bmethod not found\b"],
    ),
    rule(
        "jsonrpc_parse_error",
        Strat,
        SchemaMismatch,
        0.9,
        &[r"-32700\b", r"-32600\b", r"\binvalid request\b"],
    ),
    rule(
        "mcp_resource_not_found",
        Strat,
        NotFound,
        0.9,
        &[r"-32002\b"],
    ),
    rule("jsonrpc_timeout", Infra, Timeout, 0.9, &[r"-32001\b"]),
    rule(
        "jsonrpc_server_error",
        Infra,
        TransientNetwork,
        0.85,
        &[r"-32603\b", r"-320[0-9][0-9]\b", r"\binternal error\b"],
    ),
    rule(
        "grpc_status",
        Infra,
        TransientNetwork,
        0.9,
        &[
            r"code = (?:unavailable|internal|aborted|dataloss)\b",
            r"\bstatuscode\.(?:unavailable|internal|aborted)\b",
            r"\b(?:unavailable|internal|aborted|data_loss):",
        ],
    ),
    rule(
        "timeout",
        Infra,
        Timeout,
        0.9,
        &[
            r"timed? ?out",
            r"timeout",
            r"deadline[ _]?(?:exceeded|has elapsed|expired)",
            r"deadlineexceeded",
            r"\betimedout\b",
            r"\betime\b",
            r"took too long",
            r"request_timeout",
            r"\belapsed\b",
        ],
    ),
    rule(
        "dns",
        Infra,
        TransientNetwork,
        0.9,
        &[
            r"name or service not known",
            r"nodename nor servname",
            r"temporary failure in name resolution",
            r"no such host",
            r"\bnxdomain\b",
            r"\benotfound\b",
            r"\beai_again\b",
            r"\beai_noname\b",
            r"getaddrinfo",
            r"could not resolve (?:host|hostname|proxy)",
            r"failed to (?:lookup|resolve) (?:address|host)",
            r"dns (?:error|resolution|lookup|failure|name)",
            r"name resolution",
            r"server misbehaving",
            r"unknown host",
            r"unknownhostexception",
            r"no address associated with hostname",
        ],
    ),
    rule(
        "tls",
        Infra,
        TransientNetwork,
        0.85,
        &[
            r"\bcertificate\b",
            r"\bx509\b",
            r"\bssl\b",
            r"\btls\b",
            r"handshake",
            r"self[ -]signed",
            r"cert_has_expired",
            r"unable_to_verify_leaf",
            r"unable_to_get_issuer",
            r"err_tls",
            r"\beproto\b",
            r"unknownissuer",
            r"invalidcertificate",
        ],
    ),
    rule(
        "network",
        Infra,
        TransientNetwork,
        0.9,
        &[
            r"connection (?:was )?(?:refused|reset|aborted|closed|error|lost|failed|dropped|terminated|timed)",
            r"connection(?:refused|reset|aborted)",
            r"\beconn(?:refused|reset|aborted)\b",
            r"\be(?:host|net)(?:unreach|down)\b",
            r"\bepipe\b",
            r"broken ?pipe",
            r"socket hang up",
            r"socket (?:closed|error|is not connected)",
            r"fetch failed",
            r"failed to fetch",
            r"network (?:error|is unreachable|unreachable|is down|down|failure)",
            r"(?:host|network)unreachable",
            r"networkdown",
            r"host (?:is )?unreachable",
            r"no route to host",
            r"error trying to connect",
            r"connect error",
            r"error sending request",
            r"failed to (?:establish|open) (?:a )?(?:new )?connection",
            r"failed to connect",
            r"max retries exceeded",
            r"remote end closed connection",
            r"remotedisconnected",
            r"server ?disconnected",
            r"closed before message completed",
            r"incomplete ?message",
            r"server closed the connection",
            r"server has gone away",
            r"lost connection",
            r"can'?t connect to",
            r"(?:could|can) not connect",
            r"unable to connect",
            r"unexpected ?eof",
            r"unexpected end of file",
            r"^eof$",
            r": eof$",
            r"empty reply from server",
            r"other side closed",
            r"und_err_socket",
            r"connectionerror",
            r"apiconnectionerror",
            r"upstream connect error",
            r"no healthy upstream",
            r"bad gateway",
            r"service (?:is )?(?:temporarily )?unavailable",
            r"serviceunavailable",
            r"internal server ?error",
            r"internalservererror",
            r"internal ?error",
            r"internalfailure",
            r"temporarily unavailable",
            r"try again later",
            r"overloaded",
            r"server (?:is )?busy",
            r"serverbusy",
            r"not ?connected",
            r"address (?:already )?in use",
            r"addrinuse",
            r"address not available",
            r"recv failure",
            r"send failure",
            r"stream error",
            r"goaway",
            r"refused stream",
            r"channel closed",
            r"transport (?:error|is closing)",
            r"could not connect to the endpoint",
            r"endpoint ?connection ?error",
            r"(?:upstream|backend|origin) (?:error|unavailable|failure)",
        ],
    ),
    rule(
        "db_contention",
        Infra,
        TransientNetwork,
        0.9,
        &[
            r"deadlock",
            r"too many (?:connections|clients|open files)",
            r"remaining connection slots",
            r"max(?:imum)? number of clients",
            r"database is locked",
            r"could not serialize access",
            r"serialization failure",
            r"lock wait",
            r"oom command not allowed",
            r"out of memory",
            r"outofmemory",
            r"cannot allocate memory",
            r"is loading the dataset",
            r"command not allowed when used memory",
            r"read only replica",
            r"\bbusy redis is busy\b",
            r"\breadonly you can't write\b",
            r"terminating connection",
            r"the database system is (?:starting up|shutting down|in recovery mode)",
            r"not master",
            r"notwritableprimary",
            r"no space left",
            r"no storage space",
            r"insufficient storage",
            r"\benospc\b",
            r"\bemfile\b",
            r"resource busy",
            r"\btryagain\b",
            r"\bclusterdown\b",
            r"\bmasterdown\b",
            r"connection pool",
            r"pool (?:is )?exhausted",
            r"operation interrupted",
            r"operation would block",
            r"wouldblock",
            r"write zero",
        ],
    ),
    rule(
        "schema",
        Strat,
        SchemaMismatch,
        0.85,
        &[
            r"expecting (?:value|property name|',' delimiter|':' delimiter)",
            r"extra data: line",
            r"unterminated string",
            r"invalid control character",
            r"json ?decode",
            r"unexpected token .{0,40}\bjson\b",
            r"unexpected end of json",
            r"cannot unmarshal",
            r"invalid character .{0,20} (?:looking for|after|in)",
            r"expected value at line",
            r"eof while parsing",
            r"trailing characters at line",
            r"missing field",
            r"unknown field",
            r"invalid type: ",
            r"invalid value: ",
            r"invalid length \d",
            r"duplicate field",
            r"unknown variant",
            r"expected `[^`]{1,20}`",
            r"key must be a string",
            r"is not of type",
            r"additional properties are not allowed",
            r"does not match '",
            r"is too (?:long|short)\b.{0,40}(?:characters|items|elements)?",
            r"is (?:less|greater) than the (?:minimum|maximum)",
            r"wrong number of arguments",
            r"wrongtype",
            r"syntax error",
            r"error in your sql syntax",
            r"unsupported operand",
            r"syntaxerror",
            r"invalid input syntax",
            r"violates (?:not-null|check) constraint",
            r"null value in column",
            r"value too long for type",
            r"no such column",
            r"unknown column",
            r"column \S+ (?:of relation \S+ )?does not exist",
            r"parse ?error",
            r"failed to (?:parse|deserialize|decode)",
            r"(?:could|can) ?not (?:parse|deserialize|decode)",
            r"error decoding",
            r"unable to parse",
            r"malformed",
            r"bad request",
            r"badrequest",
            r"unprocessable",
            r"deserializ",
            r"\binvaliddata\b",
            r"\binvalidinput\b",
            r"invalid (?:data|input)\b",
            r"invalid literal",
            r"invalid url",
            r"relative url without a base",
            r"err_invalid_arg",
            r"type ?error",
            r"out of range",
            r"outofrange",
            r"out_of_range",
            r"not (?:a )?valid (?:json|integer|number|string|email|date|uuid|url|enum)",
            r"cannot be (?:null|empty|blank)",
            r"expected .{1,40} (?:got|but got|found|but found|received)\b",
            r"\bexpected (?:a|an) \S+",
            r"is required\b",
        ],
    ),
    rule(
        "not_found",
        Strat,
        NotFound,
        0.85,
        &[
            r"not ?found",
            r"no such (?:file|table|key|bucket|index|user|resource|directory|object|entity|collection|container|database|model|repository|record)",
            r"does ?n[o']t exist",
            r"do(?:es)? not exist",
            r"nosuch(?:key|bucket|entity|upload)",
            r"resourcenotfound",
            r"unknown (?:database|table|command|model|method|endpoint|resource|user|collection|index|file)",
            r"\benoent\b",
            r"could not find",
            r"cannot find",
            r"can't find",
            r"unable to find",
            r"no (?:such|matching) \S+",
            r"\bgone\b",
            r"has been deleted",
            r"no results? (?:found|for)",
            r"no rows in result set",
            r"is not (?:a )?(?:known|registered)",
        ],
    ),
    rule(
        "tool_not_fit",
        Strat,
        ToolNotFit,
        0.85,
        &[
            r"unsupported",
            r"not supported",
            r"does(?: not|n't) support",
            r"not implemented",
            r"notimplemented",
            r"unimplemented",
            r"cannot (?:process|handle|read|open) (?:this|the|files? of|input|image|document)",
            r"(?:can't|cannot|could not|unable to) decode",
            r"codec can't",
            r"too (?:large|big|long)",
            r"toolarge",
            r"exceeds? (?:the )?(?:maximum|max|allowed|size|limit)",
            r"file size",
            r"is a directory",
            r"isadirectory",
            r"\beisdir\b",
            r"not a directory",
            r"\benotdir\b",
            r"method not allowed",
            r"not acceptable",
            r"invalid (?:file|image|document|media|encoding)",
            r"only \S+ (?:files?|images?|documents?|formats?) (?:are|is) (?:supported|accepted|allowed)",
            r"unknown (?:file|image|media|format)",
            r"cannot identify image",
            r"not (?:a|an) (?:pdf|image|zip|valid image|valid pdf)",
            r"corrupt(?:ed)? (?:file|image|pdf|archive)",
            r"unrecognized (?:file|image|format)",
            r"argument list too long",
            r"too many links",
        ],
    ),
    rule(
        "conflict",
        Strat,
        DeterministicFailure,
        0.85,
        &[
            r"already exists",
            r"alreadyexists",
            r"already_exists",
            r"\beexist\b",
            r"duplicate (?:key|entry|record|item)",
            r"unique constraint",
            r"unique ?violation",
            r"\be11000\b",
            r"conditionalcheckfailed",
            r"foreign key constraint",
            r"integrity ?error",
            r"\bconflict\b",
            r"precondition (?:failed|required)",
            r"failed[_ ]?precondition",
            r"directory not empty",
            r"\benotempty\b",
            r"read-only file ?system",
        ],
    ),
];

/// Type-name rules, tried on the error type, then on the message, when no message rule decided.
const TYPE_RULES: &[Rule] = &[
    rule(
        "type_timeout",
        Infra,
        Timeout,
        0.8,
        &[r"timeout", r"timedout", r"deadline", r"\belapsed\b"],
    ),
    rule(
        "type_rate_limit",
        Infra,
        RateLimit,
        0.8,
        &[r"ratelimit", r"throttl", r"toomanyrequests", r"quota"],
    ),
    rule(
        "type_credentials",
        Infra,
        Auth,
        0.8,
        &[
            r"authentication",
            r"unauthorized",
            r"unauthenticated",
            r"credential",
        ],
    ),
    rule(
        "type_permission",
        Strat,
        Auth,
        0.8,
        &[r"permission", r"forbidden", r"accessdenied"],
    ),
    rule(
        "type_network",
        Infra,
        TransientNetwork,
        0.8,
        &[
            r"connection",
            r"connect",
            r"brokenpipe",
            r"remotedisconnected",
            r"protocolerror",
            r"chunkedencodingerror",
            r"serverdisconnected",
            r"clientoserror",
            r"operationalerror",
            r"interfaceerror",
            r"serviceunavailable",
            r"internalserver",
            r"apierror",
            r"\bhyper::error\b",
            r"\breqwest::error\b",
            r"\bioerror\b",
            r"\boserror\b",
            r"memoryerror",
            r"unavailable",
            r"deadlock",
            r"toomanyconnections",
        ],
    ),
    rule(
        "type_not_found",
        Strat,
        NotFound,
        0.8,
        &[r"notfound", r"nosuch", r"doesnotexist", r"lookuperror"],
    ),
    rule(
        "type_not_fit",
        Strat,
        ToolNotFit,
        0.8,
        &[
            r"notimplemented",
            r"unsupported",
            r"isadirectory",
            r"notadirectory",
            r"unicode(?:de|en)codeerror",
        ],
    ),
    rule(
        "type_schema",
        Strat,
        SchemaMismatch,
        0.8,
        &[
            r"validation",
            r"valueerror",
            r"typeerror",
            r"keyerror",
            r"jsondecode",
            r"json",
            r"syntaxerror",
            r"parse",
            r"decodeerror",
            r"badrequest",
            r"unprocessable",
            r"invalidargument",
            r"serde",
            r"schema",
        ],
    ),
    rule(
        "type_conflict",
        Strat,
        DeterministicFailure,
        0.75,
        &[
            r"integrityerror",
            r"uniqueviolation",
            r"conflict",
            r"alreadyexists",
            r"fileexists",
        ],
    ),
    rule(
        "type_deterministic",
        Strat,
        DeterministicFailure,
        0.7,
        &[
            r"attributeerror",
            r"indexerror",
            r"zerodivisionerror",
            r"assertionerror",
            r"recursionerror",
            r"overflowerror",
            r"arithmeticerror",
            r"rangeerror",
        ],
    ),
];

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

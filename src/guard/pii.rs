//! PII redaction: emails, phone numbers, payment cards (Luhn-checked), IBANs (mod-97-checked),
//! SSN-like numbers, IPv4/IPv6 addresses, URLs with credentials, API keys and bearer tokens are
//! replaced by typed placeholders (`[EMAIL]`, `[CARD]`, ...).

use std::borrow::Cow;
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde::{Deserialize, Serialize};

use super::sanitize::re;

/// A kind of personal or secret data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    /// An email address.
    Email,
    /// A phone number.
    Phone,
    /// A payment card number that passes the Luhn check.
    Card,
    /// An IBAN that passes the mod-97 check.
    Iban,
    /// A US social security number or a number shaped like one.
    Ssn,
    /// An IPv4 or IPv6 address.
    Ip,
    /// An API key, access token, bearer token or `password=` style secret.
    Secret,
}

impl PiiKind {
    /// The placeholder that replaces a redacted value.
    pub fn placeholder(self) -> &'static str {
        match self {
            PiiKind::Email => "[EMAIL]",
            PiiKind::Phone => "[PHONE]",
            PiiKind::Card => "[CARD]",
            PiiKind::Iban => "[IBAN]",
            PiiKind::Ssn => "[SSN]",
            PiiKind::Ip => "[IP]",
            PiiKind::Secret => "[SECRET]",
        }
    }
}

impl fmt::Display for PiiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.placeholder())
    }
}

/// The outcome of redacting one text.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Redaction {
    /// The text with every finding replaced by its placeholder.
    pub text: String,
    /// What was found, one entry per replaced value, in replacement order.
    pub found: Vec<PiiKind>,
}

impl Redaction {
    /// Whether anything was redacted.
    pub fn is_clean(&self) -> bool {
        self.found.is_empty()
    }
}

static BEARER: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\b(bearer|token|basic)\s+[A-Za-z0-9\-._~+/]{16,}=*"));
static KEYED_SECRET: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r#"(?i)\b(api[_-]?key|apikey|access[_-]?token|auth[_-]?token|secret|password|passwd|pwd|client[_-]?secret)(["']?\s*[:=]\s*["']?)[^\s"',;]{4,}"#,
    )
});
static KNOWN_KEY: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\b(?:sk|pk|rk)[-_](?:live[-_]|test[-_]|proj[-_])?[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{35}\b|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    )
});
static EMAIL: LazyLock<Regex> =
    LazyLock::new(|| re(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"));
static IBAN: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?\b"));
static CARD: LazyLock<Regex> = LazyLock::new(|| re(r"\b(?:[0-9][ \-]?){12,18}[0-9]\b"));
static SSN: LazyLock<Regex> = LazyLock::new(|| re(r"\b[0-9]{3}-[0-9]{2}-[0-9]{4}\b"));
static IPV4: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\b(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\b",
    )
});
static IPV6: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?:%[0-9a-z]+)?"));
static PHONE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?:\+|\b)[0-9](?:[0-9]|[ .\-]|\([0-9]{1,4}\)){6,20}[0-9]\b"));

/// Whether the digits of `s` pass the Luhn check (13 to 19 digits).
pub fn luhn_valid(s: &str) -> bool {
    let digits: Vec<u32> = s.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let mut sum = 0;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut d = *d;
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    sum % 10 == 0
}

/// Whether `s` (spaces ignored) is an IBAN with a valid mod-97 check.
pub fn iban_valid(s: &str) -> bool {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !(15..=34).contains(&compact.len()) || !compact.is_ascii() {
        return false;
    }
    let (head, tail) = compact.split_at(4);
    let mut rem: u32 = 0;
    for c in tail.chars().chain(head.chars()) {
        let v = match c {
            '0'..='9' => c as u32 - '0' as u32,
            'A'..='Z' => c as u32 - 'A' as u32 + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// Replaces the matches of `re` for which `keep` says yes, counting them (`text` itself when
/// there are none: most texts hold no PII, and each kind's pass then copies nothing).
fn replace<'t>(
    text: &'t str,
    re: &Regex,
    kind: PiiKind,
    found: &mut Vec<PiiKind>,
    mut accept: impl FnMut(&Captures<'_>) -> Option<String>,
) -> Cow<'t, str> {
    re.replace_all(text, |c: &Captures<'_>| match accept(c) {
        Some(replacement) => {
            found.push(kind);
            replacement
        }
        None => c[0].to_string(),
    })
}

/// Redacts every kind of PII and secret from `text`.
pub fn redact(text: &str) -> Redaction {
    let mut found = Vec::new();
    let t = replace(text, &KNOWN_KEY, PiiKind::Secret, &mut found, |_| {
        Some(PiiKind::Secret.placeholder().to_string())
    });
    let t = replace(&t, &BEARER, PiiKind::Secret, &mut found, |c| {
        Some(format!("{} {}", &c[1], PiiKind::Secret.placeholder()))
    });
    let t = replace(&t, &KEYED_SECRET, PiiKind::Secret, &mut found, |c| {
        Some(format!(
            "{}{}{}",
            &c[1],
            &c[2],
            PiiKind::Secret.placeholder()
        ))
    });
    let t = replace(&t, &EMAIL, PiiKind::Email, &mut found, |_| {
        Some(PiiKind::Email.placeholder().to_string())
    });
    let t = replace(&t, &IBAN, PiiKind::Iban, &mut found, |c| {
        iban_valid(&c[0]).then(|| PiiKind::Iban.placeholder().to_string())
    });
    let t = replace(&t, &CARD, PiiKind::Card, &mut found, |c| {
        let first = c[0].chars().next().unwrap_or('0');
        (('2'..='6').contains(&first) && luhn_valid(&c[0]))
            .then(|| PiiKind::Card.placeholder().to_string())
    });
    let t = replace(&t, &SSN, PiiKind::Ssn, &mut found, |_| {
        Some(PiiKind::Ssn.placeholder().to_string())
    });
    let t = replace(&t, &IPV4, PiiKind::Ip, &mut found, |_| {
        Some(PiiKind::Ip.placeholder().to_string())
    });
    let t = redact_ipv6(&t, &mut found);
    let t = replace(&t, &PHONE, PiiKind::Phone, &mut found, |c| {
        let m = &c[0];
        let digits = m.chars().filter(|ch| ch.is_ascii_digit()).count();
        let separated = m.starts_with('+') || m.contains([' ', '-', '.', '(']);
        ((9..=15).contains(&digits) && separated && !looks_like_date(m))
            .then(|| PiiKind::Phone.placeholder().to_string())
    });
    Redaction {
        text: t.into_owned(),
        found,
    }
}

/// Whether the IPv6 candidate at `start..end` of `text` stands alone (no word character or
/// colon glued to it, so `std::net` or `reqwest::Error` are not addresses) and parses.
fn is_ipv6_at(text: &str, start: usize, end: usize) -> bool {
    let glued = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
    let candidate = text[start..end].split('%').next().unwrap_or("");
    !glued(text[..start].chars().next_back())
        && !glued(text[end..].chars().next())
        && candidate.matches(':').count() >= 2
        && candidate.parse::<Ipv6Addr>().is_ok()
}

/// Replaces stand-alone IPv6 addresses (`text` itself when there are none).
fn redact_ipv6<'t>(text: &'t str, found: &mut Vec<PiiKind>) -> Cow<'t, str> {
    let mut out = String::new();
    let mut last = 0;
    let mut replaced = false;
    for m in IPV6.find_iter(text) {
        if is_ipv6_at(text, m.start(), m.end()) {
            out.push_str(&text[last..m.start()]);
            out.push_str(PiiKind::Ip.placeholder());
            found.push(PiiKind::Ip);
            last = m.end();
            replaced = true;
        }
    }
    if !replaced {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}

/// Whether a digit run is a date or time (`2024-01-15`, `2024.01.15 10.30`), not a phone.
fn looks_like_date(s: &str) -> bool {
    let groups: Vec<&str> = s
        .split([' ', '-', '.', '/'])
        .filter(|g| !g.is_empty())
        .collect();
    groups.len() >= 3
        && groups[0].len() == 4
        && groups[1].len() == 2
        && groups[2].len() == 2
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
}

/// Whether `text` contains a URL, an email address or an IP address (lesson vetting).
pub fn contains_locator(text: &str) -> bool {
    static URL: LazyLock<Regex> = LazyLock::new(|| {
        re(
            r"(?i)\b(?:[a-z][a-z0-9+.\-]{1,15}://|www\.)\S+|\b[a-z0-9\-]+\.(?:com|net|org|io|dev|ai|co|gov|edu)\b",
        )
    });
    URL.is_match(text)
        || EMAIL.is_match(text)
        || IPV4.is_match(text)
        || IPV6
            .find_iter(text)
            .any(|m| is_ipv6_at(text, m.start(), m.end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks() {
        assert!(luhn_valid("4111 1111 1111 1111"));
        assert!(!luhn_valid("4111 1111 1111 1112"));
        assert!(iban_valid("GB82 WEST 1234 5698 7654 32"));
        assert!(!iban_valid("GB82 WEST 1234 5698 7654 33"));
    }
}

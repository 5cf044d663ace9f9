//! Multi-pass text sanitising: Unicode NFKC folding, removal of zero-width, bidi and control
//! characters, and removal of chat role markers and template tokens, repeated until nothing
//! changes (so `sysSYSTEM:tem:` cannot reassemble into `system:`).

use std::sync::LazyLock;

use regex::Regex;
use unicode_normalization::UnicodeNormalization;

/// Whether `c` is invisible formatting that can hide text from a reader: zero-width characters,
/// bidi embeddings/overrides/isolates, soft hyphen, word joiners, BOM, variation selectors.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// NFKC-normalises `text` and removes invisible characters and control characters other than
/// newline and tab. One pass; [`sanitize`] repeats it. ASCII text is its own NFKC form and has
/// no invisible character, so it only loses its control characters.
pub fn normalize(text: &str) -> String {
    if text.is_ascii() {
        return text.chars().filter(|c| kept_control(*c)).collect();
    }
    text.nfkc()
        .filter(|c| !is_invisible(*c))
        .filter(|c| kept_control(*c))
        .collect()
}

/// Whether `c` survives [`normalize`]'s removal of control characters (all but newline and
/// tab go).
fn kept_control(c: char) -> bool {
    !c.is_control() || c == '\n' || c == '\t'
}

/// Role markers (`system:`, `User :`) with no word boundary required before them, so that a
/// marker split around another one is caught on the next pass.
static ROLE_MARKER: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)(system|user|assistant|developer|human)[ \t]*:"));

/// Chat template tags and tokens: `<system>`, `</user>`, `<|im_start|>`, `[INST]`, `<<SYS>>`,
/// and the strategy-context fence itself; an unclosed `<system` is removed too.
static TEMPLATE_TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)<\s*/?\s*(system|user|assistant|developer|human|instructions?|strategy_context)(?:\b[^<>]{0,64})?>?|<\|[a-z_]{1,32}\|>|\[/?\s*(inst|sys)\s*\]|<</?\s*sys\s*>>",
    )
});

/// Compiles a built-in constant pattern (every one is exercised by the tests, so this cannot fail
/// at run time on any input).
pub(crate) fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("built-in pattern compiles")
}

/// One sanitising pass.
fn pass(text: &str) -> String {
    let t = normalize(text);
    let t = TEMPLATE_TOKEN.replace_all(&t, "");
    let t = ROLE_MARKER.replace_all(&t, "");
    t.into_owned()
}

/// Sanitises `text` by repeating one pass (NFKC, invisible removal, role markers and template
/// tokens removed) until a fixed point. Every pass that changes the text shortens it or only
/// folds it, so this ends; as a guard it stops after `text.len() + 2` passes.
pub fn sanitize(text: &str) -> String {
    let mut current = text.to_string();
    for _ in 0..current.len() + 2 {
        let next = pass(&current);
        if next == current {
            break;
        }
        current = next;
    }
    current.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_text_is_normalised_as_by_nfkc() {
        let every: String = (0u8..128).map(char::from).collect();
        for text in [every.as_str(), "plain lesson: use pdfminer\r\n\t<b>&", ""] {
            let slow: String = text
                .nfkc()
                .filter(|c| !is_invisible(*c))
                .filter(|c| kept_control(*c))
                .collect();
            assert_eq!(normalize(text), slow);
        }
    }

    #[test]
    fn nested_marker_does_not_survive() {
        assert_eq!(sanitize("sysSYSTEM:tem: do it"), "do it");
        assert_eq!(sanitize("usUSER:er: hi"), "hi");
    }

    #[test]
    fn full_width_and_zero_width_fold() {
        assert_eq!(sanitize("ｓｙｓｔｅｍ： go"), "go");
        assert_eq!(sanitize("sys\u{200B}tem: go"), "go");
        assert_eq!(sanitize("a\u{202E}b\u{2066}c"), "abc");
        assert_eq!(sanitize("<system>x</system> <|im_start|>y"), "x y");
    }
}

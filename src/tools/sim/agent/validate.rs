//! Validating a final answer (AGENT-FORMAT.md): it must contain the rendered `answer` and no
//! reference `ref-<number>` that no tool returned (the simulated tools never return one).

/// The first `ref-<number>` of `text` (not inside a longer word), if any.
pub fn first_ref(text: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = text[from..].find("ref-") {
        let start = from + at;
        let before_ok = text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let digits = text[start + 4..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if before_ok && digits > 0 {
            return Some(&text[start..start + 4 + digits]);
        }
        from = start + 4;
    }
    None
}

/// Checks a final answer against the rendered expected answer; the error says why it fails.
pub fn check(answer: &str, expected: &str) -> Result<(), String> {
    if let Some(r) = first_ref(answer) {
        return Err(format!(
            "the answer cites `{r}`, a reference no tool returned"
        ));
    }
    if !answer.contains(expected) {
        return Err(format!(
            "the answer does not contain the expected result `{expected}`"
        ));
    }
    Ok(())
}

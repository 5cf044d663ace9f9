//! `hindsight classify [--json]`: classifies error messages read as JSON lines on stdin.
//!
//! Each input line is `{"error_type": ..., "error_message": ...}` (`error_type` optional). Each
//! output line is, in input order, either the verdict (`category`, `error_class`, `confidence`,
//! `rule`) or, for a line that is not such an object, an error naming the line number; the other
//! lines are still classified.

use std::io::{BufRead, Write};

use hindsight::triage::classify_error;
use serde::{Deserialize, Serialize};

/// Arguments of `hindsight classify`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// Write one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One input line.
#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    error_type: Option<String>,
    error_message: String,
}

/// One output line in `--json` mode.
#[derive(Debug, Serialize)]
struct Output<'a> {
    line: usize,
    category: &'a str,
    error_class: &'a str,
    confidence: f64,
    rule: &'a str,
}

/// What `run` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Lines classified.
    pub classified: usize,
    /// Lines rejected (each got an error line).
    pub errors: usize,
}

/// Errors that stop `run`: reading stdin or writing stdout failed.
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    /// Reading the input failed.
    #[error("reading input line {line}: {source}")]
    Read {
        /// 1-based line number.
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Write(#[from] std::io::Error),
    /// Encoding an output line failed.
    #[error("encoding output line {line}: {source}")]
    Encode {
        /// 1-based line number.
        line: usize,
        /// The serde error.
        source: serde_json::Error,
    },
}

/// Entry point for the binary: classifies stdin to stdout.
pub fn main(args: &Args) -> Result<Summary, ClassifyError> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    run(args.json, stdin.lock(), stdout.lock())
}

/// Classifies every JSON line of `input`, writing one line per input line to `out`, in order.
///
/// Blank lines are skipped. With `json` each output line is a JSON object (`line`, `category`,
/// `error_class`, `confidence`, `rule`, or `line` and `error`); otherwise an aligned table.
pub fn run(json: bool, input: impl BufRead, mut out: impl Write) -> Result<Summary, ClassifyError> {
    let mut summary = Summary::default();
    if !json {
        writeln!(
            out,
            "{:>5}  {:<14}  {:<20}  {:>4}  {:<24}  message",
            "line", "category", "error_class", "conf", "rule"
        )?;
    }
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|source| ClassifyError::Read { line: n, source })?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Result<Input, _> = serde_json::from_str(&line);
        match parsed {
            Ok(inp) => {
                summary.classified += 1;
                let c = classify_error(inp.error_type.as_deref(), &inp.error_message);
                if json {
                    let o = Output {
                        line: n,
                        category: c.category.as_str(),
                        error_class: c.error_class.as_str(),
                        confidence: c.confidence,
                        rule: &c.rule,
                    };
                    let s = serde_json::to_string(&o)
                        .map_err(|source| ClassifyError::Encode { line: n, source })?;
                    writeln!(out, "{s}")?;
                } else {
                    let msg: String = inp
                        .error_message
                        .chars()
                        .map(|c| if c.is_control() { ' ' } else { c })
                        .take(60)
                        .collect();
                    writeln!(
                        out,
                        "{:>5}  {:<14}  {:<20}  {:>4.2}  {:<24}  {}",
                        n,
                        c.category.as_str(),
                        c.error_class.as_str(),
                        c.confidence,
                        c.rule,
                        msg
                    )?;
                }
            }
            Err(e) => {
                summary.errors += 1;
                let msg = format!(
                    "line {n}: expected {{\"error_type\": ..., \"error_message\": ...}}: {e}"
                );
                if json {
                    let v = serde_json::json!({ "line": n, "error": msg });
                    writeln!(out, "{v}")?;
                } else {
                    writeln!(out, "{n:>5}  error: {msg}")?;
                }
            }
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str = concat!(
        "{\"error_type\": \"TimeoutError\", \"error_message\": \"\"}\n",
        "not json\n",
        "\n",
        "{\"error_message\": \"HTTP 500: invalid parameter 'date'\"}\n",
        "{\"error_type\": null}\n",
        "{\"error_type\": null, \"error_message\": \"connect ECONNREFUSED 127.0.0.1:3000\"}\n",
    );

    #[test]
    fn json_mode_keeps_order_and_names_bad_lines() {
        let mut out = Vec::new();
        let s = run(true, INPUT.as_bytes(), &mut out).unwrap();
        assert_eq!(
            s,
            Summary {
                classified: 3,
                errors: 2
            }
        );
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0]["category"], "infrastructure");
        assert_eq!(lines[0]["error_class"], "Timeout");
        assert!(lines[0]["confidence"].as_f64().unwrap() > 0.5);
        assert!(lines[0]["rule"].is_string());
        assert_eq!(lines[1]["line"], 2);
        assert!(lines[1]["error"].as_str().unwrap().starts_with("line 2:"));
        assert_eq!(lines[2]["line"], 4);
        assert_eq!(lines[2]["category"], "strategy");
        assert_eq!(lines[2]["error_class"], "SchemaMismatch");
        assert!(lines[3]["error"].as_str().unwrap().contains("line 5"));
        assert_eq!(lines[4]["error_class"], "TransientNetwork");
        // Field order: category, error_class, confidence, rule.
        let raw = {
            let mut o = Vec::new();
            run(true, INPUT.as_bytes(), &mut o).unwrap();
            String::from_utf8(o).unwrap()
        };
        let first = raw.lines().next().unwrap();
        let pos = |k: &str| first.find(k).unwrap();
        assert!(pos("category") < pos("error_class"));
        assert!(pos("error_class") < pos("confidence"));
        assert!(pos("confidence") < pos("rule"));
    }

    #[test]
    fn table_mode_is_readable() {
        let mut out = Vec::new();
        run(false, INPUT.as_bytes(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("category") && lines[0].contains("rule"));
        assert!(lines[1].contains("infrastructure") && lines[1].contains("Timeout"));
        assert!(lines[2].contains("error: line 2"));
        assert!(lines[3].contains("strategy"));
        assert_eq!(lines.len(), 6);
    }
}

//! Mapping MCP answers to tool outputs and classified errors: JSON-RPC errors (-32601, -32602,
//! -32603, ...) and results with `isError: true` alike.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::tools::tool::ToolError;

/// JSON-RPC: the method does not exist.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC: invalid parameters.
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC: internal error.
pub const INTERNAL_ERROR: i32 = -32603;
/// JSON-RPC: invalid request.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC: parse error.
pub const PARSE_ERROR: i32 = -32700;

/// The text of the content blocks, joined by newlines.
pub fn content_text(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a successful result: `{"text", "content", "structured"?}`.
pub fn result_value(result: &CallToolResult) -> Value {
    let mut v = json!({
        "text": content_text(&result.content),
        "content": serde_json::to_value(&result.content).unwrap_or(Value::Null),
    });
    if let (Some(s), Some(obj)) = (&result.structured_content, v.as_object_mut()) {
        obj.insert("structured".into(), s.clone());
    }
    v
}

/// Finds `MCP error -32602:` style codes in a message (TypeScript servers put JSON-RPC codes in
/// the text of `isError` results).
pub fn code_in_text(text: &str) -> Option<i32> {
    let i = text.find("MCP error ")?;
    let rest = &text[i + "MCP error ".len()..];
    let end = rest.find(':').unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Classifies an error of `tool` with an optional JSON-RPC code and its message.
pub fn classify(tool: &str, code: Option<i32>, message: &str) -> ToolError {
    let lower = message.to_ascii_lowercase();
    let full = format!("{tool}: {message}");
    match code {
        Some(METHOD_NOT_FOUND) => {
            ToolError::new(ErrorClass::NotFound, FailureCategory::Strategy, full)
        }
        Some(INVALID_PARAMS) if lower.contains("not found") || lower.contains("unknown tool") => {
            ToolError::new(ErrorClass::NotFound, FailureCategory::Strategy, full)
        }
        Some(INVALID_PARAMS | INVALID_REQUEST | PARSE_ERROR) => {
            ToolError::new(ErrorClass::SchemaMismatch, FailureCategory::Strategy, full)
        }
        Some(INTERNAL_ERROR) => {
            let c = crate::triage::classify_error(Some("McpInternalError"), message);
            if c.category == FailureCategory::Unknown {
                ToolError::new(
                    ErrorClass::DeterministicFailure,
                    FailureCategory::Unknown,
                    full,
                )
            } else {
                ToolError::new(c.error_class, c.category, full)
            }
        }
        _ => ToolError::classified(Some("McpToolError"), full),
    }
}

/// The error of a result with `isError: true`.
pub fn error_result(tool: &str, result: &CallToolResult) -> ToolError {
    let text = content_text(&result.content);
    let text = if text.is_empty() {
        "tool reported an error without text".to_string()
    } else {
        text
    };
    classify(tool, code_in_text(&text), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_classes() {
        assert_eq!(
            code_in_text("MCP error -32602: Tool x not found"),
            Some(-32602)
        );
        assert_eq!(code_in_text("plain failure"), None);
        let e = classify("x", Some(-32602), "Tool x not found");
        assert_eq!(
            (e.class, e.category),
            (ErrorClass::NotFound, FailureCategory::Strategy)
        );
        let e = classify(
            "echo",
            Some(-32602),
            "Input validation error: expected string",
        );
        assert_eq!(e.class, ErrorClass::SchemaMismatch);
        assert!(e.message.starts_with("echo: "));
        assert_eq!(
            classify("x", Some(-32601), "nope").class,
            ErrorClass::NotFound
        );
        let e = classify("x", Some(-32603), "upstream returned 503");
        assert_eq!(e.category, FailureCategory::Infrastructure);
        let e = classify("x", None, "rate limit exceeded");
        assert_eq!(e.class, ErrorClass::RateLimit);
    }
}

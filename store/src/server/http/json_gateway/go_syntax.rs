//! Go's words for JSON that does not parse, as etcd's grpc-gateway answers
//! them: its scanner's syntax errors (`invalid character 'b' looking for
//! beginning of object key string`, `unexpected EOF`) recovered from
//! serde_json's error and position, shared by the body reader
//! ([`super::json`]) and the field checks ([`super::schema`]).

use serde_json::error::Category;

/// Why a body could not be read as a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The body ended inside the value (Go's `unexpected EOF`).
    UnexpectedEof,
    /// Anything else, with the message the gateway gives.
    Invalid(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnexpectedEof => f.write_str("unexpected EOF"),
            DecodeError::Invalid(m) => f.write_str(m),
        }
    }
}

/// Go's scanner message for the syntax error `e` in `value`.
pub fn syntax_error(value: &[u8], e: &serde_json::Error) -> DecodeError {
    let Some(at) = offset(value, e.line(), e.column()) else {
        return without_position(e);
    };
    let text = e.to_string();
    let context = if text.starts_with("key must be a string") {
        "looking for beginning of object key string"
    } else if text.starts_with("expected value") {
        "looking for beginning of value"
    } else if text.starts_with("expected `:`") {
        "after object key"
    } else if text.starts_with("expected `,` or `}`") {
        "after object key:value pair"
    } else if text.starts_with("expected `,` or `]`") {
        "after array element"
    } else if text.starts_with("trailing comma") {
        trailing_comma_context(value[at])
    } else if text.starts_with("control character") {
        "in string literal"
    } else if text.starts_with("invalid escape") {
        "in string escape code"
    } else if text.starts_with("trailing characters") {
        "after top-level value"
    } else {
        return without_position(e);
    };
    DecodeError::Invalid(format!(
        "invalid character {} {context}",
        quote_char(value[at])
    ))
}

/// Go's message for the syntax error `e` of `json.Unmarshal(value)` (one
/// whole value, as jsonpb reads a field).
pub fn value_syntax_error(value: &[u8], e: &serde_json::Error) -> String {
    if e.classify() == Category::Eof {
        return "unexpected end of JSON input".to_string();
    }
    syntax_error(value, e).to_string()
}

/// Serde's message for an error, without its position.
pub fn without_position(e: &serde_json::Error) -> DecodeError {
    let text = e.to_string();
    DecodeError::Invalid(match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    })
}

/// After `[1,` Go looks for a value, after `{"a":1,` for a key.
fn trailing_comma_context(closing: u8) -> &'static str {
    if closing == b']' {
        "looking for beginning of value"
    } else {
        "looking for beginning of object key string"
    }
}

/// The byte index serde's 1-based `line` and `column` point at.
fn offset(value: &[u8], line: usize, column: usize) -> Option<usize> {
    let mut line_start = 0;
    for _ in 1..line {
        line_start += value[line_start..].iter().position(|b| *b == b'\n')? + 1;
    }
    let at = line_start + column.checked_sub(1)?;
    (at < value.len()).then_some(at)
}

/// A byte as Go's JSON scanner quotes it in messages (`quoteChar`).
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_string(),
        b'"' => "'\"'".to_string(),
        b'\x07' => r"'\a'".to_string(),
        b'\x08' => r"'\b'".to_string(),
        b'\x0c' => r"'\f'".to_string(),
        b'\n' => r"'\n'".to_string(),
        b'\r' => r"'\r'".to_string(),
        b'\t' => r"'\t'".to_string(),
        b'\x0b' => r"'\v'".to_string(),
        b'\\' => r"'\\'".to_string(),
        c if c < 0x20 || c == 0x7f => format!(r"'\x{c:02x}'"),
        c if (0x80..0xa0).contains(&c) => format!(r"'\u{c:04x}'"),
        c => format!("'{}'", char::from(c)),
    }
}

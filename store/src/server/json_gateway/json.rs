//! Request bodies in, response bodies out, as etcd 3.5's grpc-gateway reads
//! and writes them.
//!
//! Reading follows the gateway's decoder (Go's `json.Decoder` feeding
//! `jsonpb`): only the first JSON value of a body counts (anything after it
//! is never looked at), an empty body is the empty request, `null` too, and
//! a value that is not an object is refused. Syntax errors carry Go's
//! wording (`invalid character 'b' looking for beginning of object key
//! string`, `unexpected EOF`), since clients and scripts match on them;
//! well-formed JSON is then checked field by field as jsonpb does
//! ([`super::schema`]) before the generated decoder reads it.
//!
//! Writing is the generated proto3 JSON of the message (see the
//! `etcd-proto` crate docs for the naming), wrapped as `{"result": ...}`
//! for each message of a stream.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;
use serde_json::error::Category;
use serde_json::Value;

use super::schema::{schema, Named};

/// What the gateway's decoder requests implement.
pub trait Request: DeserializeOwned + Default + Named {}

impl<T: DeserializeOwned + Default + Named> Request for T {}

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

/// One step of reading a stream of requests from `buf`.
#[derive(Debug)]
pub enum Next<T> {
    /// A request, and how many bytes of `buf` it used.
    Message(T, usize),
    /// `buf` holds only whitespace or the start of a value: read more.
    NeedMore,
}

/// The request a whole (unary) body holds: its first JSON value, or the
/// empty request when there is none.
pub fn decode<T: Request>(body: &[u8]) -> Result<T, DecodeError> {
    match next(body)? {
        Next::Message(msg, _) => Ok(msg),
        Next::NeedMore if is_blank(body) => Ok(T::default()),
        Next::NeedMore => Err(DecodeError::UnexpectedEof),
    }
}

/// The first request in `buf`, if all of it has arrived.
pub fn next<T: Request>(buf: &[u8]) -> Result<Next<T>, DecodeError> {
    let start = buf.len() - trim_start(buf).len();
    if start == buf.len() {
        return Ok(Next::NeedMore);
    }
    let mut values = serde_json::Deserializer::from_slice(&buf[start..]).into_iter::<IgnoredAny>();
    match values.next() {
        None => Ok(Next::NeedMore),
        Some(Err(e)) if e.classify() == Category::Eof => Ok(Next::NeedMore),
        Some(Err(e)) => Err(syntax_error(&buf[start..], &e)),
        Some(Ok(_)) => {
            let end = start + values.byte_offset();
            Ok(Next::Message(message(&buf[start..end])?, end))
        }
    }
}

/// A syntactically valid JSON value as a request.
fn message<T: Request>(value: &[u8]) -> Result<T, DecodeError> {
    let kind = match value[0] {
        b'{' => return object(value),
        b'n' => return Ok(T::default()),
        b'[' => "array",
        b'"' => "string",
        b't' | b'f' => "bool",
        _ => "number",
    };
    Err(DecodeError::Invalid(format!(
        "json: cannot unmarshal {kind} into Go value of type map[string]json.RawMessage"
    )))
}

/// Go's scanner message for the syntax error `e` in `value`.
fn syntax_error(value: &[u8], e: &serde_json::Error) -> DecodeError {
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

/// A JSON object as a request: checked and canonicalized as jsonpb reads
/// it, then decoded.
fn object<T: Request>(value: &[u8]) -> Result<T, DecodeError> {
    let mut v: Value = serde_json::from_slice(value).map_err(|e| without_position(&e))?;
    schema()
        .check(T::FULL_NAME, &mut v)
        .map_err(DecodeError::Invalid)?;
    serde_json::from_value(v).map_err(|e| without_position(&e))
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
fn without_position(e: &serde_json::Error) -> DecodeError {
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

fn trim_start(buf: &[u8]) -> &[u8] {
    let n = buf
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &buf[n..]
}

fn is_blank(buf: &[u8]) -> bool {
    trim_start(buf).is_empty()
}

/// The JSON of a message (a unary answer).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Generated impls only fail on maps with non-string keys, which the
    // etcd API has none of; an empty object stands in for the impossible.
    serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec())
}

/// One message of a stream: `{"result":...}` and the newline the gateway
/// writes after each.
pub fn encode_chunk<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = b"{\"result\":".to_vec();
    out.extend_from_slice(&encode(msg));
    out.extend_from_slice(b"}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::etcdserverpb::{
        LeaseGrantResponse, PutRequest, RangeRequest, RangeResponse, ResponseHeader,
    };
    use etcd_proto::mvccpb::KeyValue;

    fn err(body: &str) -> String {
        decode::<RangeRequest>(body.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn first_value_only_and_empty_bodies() {
        let r: RangeRequest = decode(br#" {"key":"Zm9v","zzz":1} {"x""#).unwrap();
        assert_eq!(r.key, b"foo");
        assert_eq!(
            decode::<RangeRequest>(b"").unwrap(),
            RangeRequest::default()
        );
        assert_eq!(
            decode::<RangeRequest>(b" null").unwrap(),
            RangeRequest::default()
        );
        let p: PutRequest = decode(br#"{"key":"YQ==","lease":"12","prev_kv":true}"#).unwrap();
        assert_eq!((p.lease, p.prev_kv), (12, true));
    }

    #[test]
    fn syntax_errors_in_go_words() {
        assert_eq!(
            err("{bad"),
            "invalid character 'b' looking for beginning of object key string"
        );
        assert_eq!(err(r#"{"key":"Zm9v""#), "unexpected EOF");
        assert_eq!(
            err(r#"{"key":"Zm9v",}"#),
            "invalid character '}' looking for beginning of object key string"
        );
        assert_eq!(
            err(r#"{"key" "Zm9v"}"#),
            "invalid character '\"' after object key"
        );
        assert_eq!(
            err(r#"{"key":"Zm9v" "a":1}"#),
            "invalid character '\"' after object key:value pair"
        );
        assert_eq!(
            err(r#"{"key":x}"#),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(
            err("[]"),
            "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"
        );
        assert_eq!(
            err(r#""x""#),
            "json: cannot unmarshal string into Go value of type map[string]json.RawMessage"
        );
    }

    #[test]
    fn stream_of_values() {
        let buf = br#"{"key":"YQ=="}  {"key":"Yg=="} {"ke"#;
        let Next::Message(a, used) = next::<RangeRequest>(buf).unwrap() else {
            panic!("first value")
        };
        assert_eq!(a.key, b"a");
        let Next::Message(b, used2) = next::<RangeRequest>(&buf[used..]).unwrap() else {
            panic!("second value")
        };
        assert_eq!(b.key, b"b");
        assert!(matches!(
            next::<RangeRequest>(&buf[used + used2..]).unwrap(),
            Next::NeedMore
        ));
    }

    #[test]
    fn answers_as_etcd_writes_them() {
        let header = ResponseHeader {
            cluster_id: 6995379360883047808,
            member_id: 7206135291501928045,
            revision: 2,
            raft_term: 2,
        };
        let resp = RangeResponse {
            header: Some(header),
            kvs: vec![KeyValue {
                key: b"foo".to_vec(),
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                value: b"bar".to_vec(),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        assert_eq!(
            String::from_utf8(encode(&resp)).unwrap(),
            r#"{"header":{"cluster_id":"6995379360883047808","member_id":"7206135291501928045","revision":"2","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#
        );
        let grant = LeaseGrantResponse {
            header: Some(ResponseHeader::default()),
            id: 77,
            ttl: 60,
            error: String::new(),
        };
        assert_eq!(
            String::from_utf8(encode_chunk(&grant)).unwrap(),
            "{\"result\":{\"header\":{},\"ID\":\"77\",\"TTL\":\"60\"}}\n"
        );
    }
}

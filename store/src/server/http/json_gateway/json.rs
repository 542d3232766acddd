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

pub use super::go_syntax::DecodeError;
use super::go_syntax::{syntax_error, without_position};
use super::schema::{schema, Named};

/// What the gateway's decoder requests implement.
pub trait Request: DeserializeOwned + Default + Named {}

impl<T: DeserializeOwned + Default + Named> Request for T {}

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

/// A JSON object as a request: checked and canonicalized as jsonpb reads
/// it, then decoded.
fn object<T: Request>(value: &[u8]) -> Result<T, DecodeError> {
    let mut v: Value = serde_json::from_slice(value).map_err(|e| without_position(&e))?;
    schema()
        .check(T::FULL_NAME, &mut v)
        .map_err(DecodeError::Invalid)?;
    serde_json::from_value(v).map_err(|e| without_position(&e))
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

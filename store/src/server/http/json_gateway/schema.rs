//! Checks a JSON request against its message's descriptor the way etcd's
//! gateway decoder does (golang/protobuf's `jsonpb` over Go's
//! `encoding/json`), so that what etcd refuses is refused with etcd's
//! message, and what it accepts is accepted.
//!
//! The walk follows jsonpb: fields in declaration order, each looked up by
//! its proto name and then its JSON name (the latter wins), `null` meaning
//! unset, unknown fields ignored. Per field kind:
//!
//! - 64- and 32-bit integers: a number, or a string holding one (quotes
//!   trimmed, the rest read as JSON); a fraction, an exponent or a value out
//!   of range is `json: cannot unmarshal number 1.5 into Go value of type
//!   int64`;
//! - bytes: standard base64 with padding, checked as Go's decoder does
//!   (`illegal base64 data at input byte 3`), line breaks skipped;
//! - enums: a value name (`unknown value "\"X\"" for enum pkg.Enum`
//!   otherwise) or a number;
//! - bools and strings: their own JSON type only.
//!
//! Values are rewritten to one canonical form (integers as decimal strings,
//! bytes re-encoded) for the generated decoder, which is more lenient.

use std::sync::OnceLock;

use base64::Engine;
use etcd_proto::descriptors::{descriptors, Descriptors};
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto};
use serde_json::{Map, Value};

use super::go_syntax;

/// A request message the gateway decodes, by its full protobuf name.
pub trait Named {
    /// `.package.Message`.
    const FULL_NAME: &'static str;
}

macro_rules! named {
    ($package:ident: $($t:ident),* $(,)?) => {
        $(impl Named for etcd_proto::$package::$t {
            const FULL_NAME: &'static str =
                concat!(".", stringify!($package), ".", stringify!($t));
        })*
    };
}

named!(v3lockpb: LockRequest, UnlockRequest);
named!(
    v3electionpb: CampaignRequest,
    ProclaimRequest,
    LeaderRequest,
    ResignRequest,
);
named!(
    etcdserverpb: RangeRequest,
    PutRequest,
    DeleteRangeRequest,
    TxnRequest,
    CompactionRequest,
    WatchRequest,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    LeaseKeepAliveRequest,
    LeaseTimeToLiveRequest,
    LeaseLeasesRequest,
    MemberAddRequest,
    MemberRemoveRequest,
    MemberUpdateRequest,
    MemberListRequest,
    MemberPromoteRequest,
    AlarmRequest,
    StatusRequest,
    DefragmentRequest,
    HashRequest,
    SnapshotRequest,
    MoveLeaderRequest,
    DowngradeRequest,
    AuthEnableRequest,
    AuthDisableRequest,
    AuthStatusRequest,
    AuthenticateRequest,
    AuthUserAddRequest,
    AuthUserGetRequest,
    AuthUserListRequest,
    AuthUserDeleteRequest,
    AuthUserChangePasswordRequest,
    AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest,
    AuthRoleAddRequest,
    AuthRoleGetRequest,
    AuthRoleListRequest,
    AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest,
);

/// Every message and enum of the etcd API, by full name (`.pkg.Name`):
/// the proto crate's index of its compiled-in descriptors.
pub struct Schema {
    index: &'static Descriptors,
}

/// The schema of the compiled-in descriptors.
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema {
        index: descriptors(),
    })
}

impl Schema {
    /// Checks and canonicalizes `value`, a request of message `full_name`
    /// (`.etcdserverpb.RangeRequest`). A message the schema does not know
    /// is left to the generated decoder.
    pub fn check(&self, full_name: &str, value: &mut Value) -> Result<(), String> {
        match self.index.messages.get(full_name) {
            Some(m) => self.message(&m.descriptor, value),
            None => Ok(()),
        }
    }

    fn message(&self, desc: &DescriptorProto, value: &mut Value) -> Result<(), String> {
        let map = match value {
            Value::Null => return Ok(()),
            Value::Object(map) => map,
            other => return Err(type_error(other, "map[string]json.RawMessage")),
        };
        let mut checked = Map::new();
        for field in &desc.field {
            let mut raw = map.remove(field.name());
            if let Some(v) = map.remove(&json_name(field)) {
                raw = Some(v);
            }
            let Some(mut v) = raw.filter(|v| !v.is_null()) else {
                continue;
            };
            self.field(field, &mut v)?;
            checked.insert(field.name().to_string(), v);
        }
        *map = checked;
        Ok(())
    }

    fn field(&self, field: &FieldDescriptorProto, value: &mut Value) -> Result<(), String> {
        if field.label() != Label::Repeated {
            return self.singular(field, value);
        }
        let Value::Array(items) = value else {
            return Err(type_error(value, "[]json.RawMessage"));
        };
        items.iter_mut().try_for_each(|v| self.singular(field, v))
    }

    fn singular(&self, field: &FieldDescriptorProto, value: &mut Value) -> Result<(), String> {
        match field.r#type() {
            Type::Int64 | Type::Sint64 | Type::Sfixed64 => integer(value, "int64", true),
            Type::Uint64 | Type::Fixed64 => integer(value, "uint64", true),
            Type::Int32 | Type::Sint32 | Type::Sfixed32 => integer(value, "int32", false),
            Type::Uint32 | Type::Fixed32 => integer(value, "uint32", false),
            Type::Bool => same_type(value, value.is_boolean(), "bool"),
            Type::String => same_type(value, value.is_string(), "string"),
            Type::Bytes => bytes(value),
            Type::Enum => self.enumeration(field.type_name(), value),
            Type::Message | Type::Group => match self.index.messages.get(field.type_name()) {
                Some(m) => self.message(&m.descriptor, value),
                None => Ok(()),
            },
            Type::Double | Type::Float => Ok(()),
        }
    }

    fn enumeration(&self, full_name: &str, value: &mut Value) -> Result<(), String> {
        let Some(desc) = self.index.enums.get(full_name) else {
            return Ok(());
        };
        match value {
            Value::String(name) => {
                let known = desc.value.iter().find(|v| v.name() == name.as_str());
                match known {
                    Some(v) => {
                        *value = Value::from(v.number());
                        Ok(())
                    }
                    None => Err(format!(
                        "unknown value {} for enum {}",
                        go_quote(&Value::String(name.clone()).to_string()),
                        full_name.trim_start_matches('.')
                    )),
                }
            }
            _ => integer(value, "protoreflect.EnumNumber", false),
        }
    }
}

/// protoc's JSON name: underscores dropped, the letter after each upper-cased.
fn json_name(field: &FieldDescriptorProto) -> String {
    if let Some(name) = &field.json_name {
        return name.clone();
    }
    let mut out = String::new();
    let mut upper = false;
    for c in field.name().chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// Go's `UnmarshalTypeError` for a JSON value of the wrong kind.
fn type_error(value: &Value, go_type: &str) -> String {
    let kind = match value {
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
    };
    format!("json: cannot unmarshal {kind} into Go value of type {go_type}")
}

fn same_type(value: &Value, ok: bool, go_type: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(type_error(value, go_type))
    }
}

/// An integer field: jsonpb trims one pair of quotes and reads the rest as
/// JSON into the Go type; the canonical form is the decimal text (a string
/// for 64-bit types, a number otherwise).
fn integer(value: &mut Value, go_type: &str, as_string: bool) -> Result<(), String> {
    let literal = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => return Err(type_error(other, go_type)),
    };
    let inner: Value = match serde_json::from_str(&literal) {
        Ok(v) => v,
        Err(e) => return Err(go_syntax::value_syntax_error(literal.as_bytes(), &e)),
    };
    let parsed = match &inner {
        Value::Number(_) => parse_int(&literal, go_type),
        Value::Null => {
            *value = Value::Null;
            return Ok(());
        }
        other => return Err(type_error(other, go_type)),
    };
    let Some(n) = parsed else {
        return Err(format!(
            "json: cannot unmarshal number {} into Go value of type {go_type}",
            literal.trim()
        ));
    };
    *value = if as_string {
        Value::String(n.to_string())
    } else {
        // 32-bit types only get here (range checked above).
        Value::from(i64::try_from(n).unwrap_or_default())
    };
    Ok(())
}

/// `literal` as an integer of `go_type`, if it is one (no fraction, no
/// exponent, in range).
fn parse_int(literal: &str, go_type: &str) -> Option<i128> {
    let n: i128 = literal.trim().parse().ok()?;
    let (min, max) = match go_type {
        "int64" => (i64::MIN as i128, i64::MAX as i128),
        "uint64" => (0, u64::MAX as i128),
        "uint32" => (0, u32::MAX as i128),
        _ => (i32::MIN as i128, i32::MAX as i128),
    };
    (min..=max).contains(&n).then_some(n)
}

/// A bytes field: Go's standard base64, re-encoded canonically.
fn bytes(value: &mut Value) -> Result<(), String> {
    let Value::String(s) = value else {
        return Err(type_error(value, "[]uint8"));
    };
    let decoded = go_base64_decode(s.as_bytes())
        .map_err(|at| format!("illegal base64 data at input byte {at}"))?;
    *value = Value::String(base64::engine::general_purpose::STANDARD.encode(decoded));
    Ok(())
}

/// Go's `base64.StdEncoding.DecodeString`: padding required, `\r` and `\n`
/// skipped, trailing bits ignored; the error is the offset Go reports.
pub fn go_base64_decode(src: &[u8]) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    while si < src.len() {
        let (next, chunk) = decode_quantum(src, si)?;
        out.extend_from_slice(&chunk);
        si = next;
    }
    Ok(out)
}

fn sextet(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

fn skip_newlines(src: &[u8], mut si: usize) -> usize {
    while si < src.len() && matches!(src[si], b'\n' | b'\r') {
        si += 1;
    }
    si
}

/// One 4-character quantum from `si` (Go's `decodeQuantum`).
fn decode_quantum(src: &[u8], mut si: usize) -> Result<(usize, Vec<u8>), usize> {
    let mut buf = [0u32; 4];
    let mut len = 4;
    let mut j = 0;
    while j < 4 {
        if si == src.len() {
            if j == 0 {
                return Ok((si, Vec::new()));
            }
            return Err(si - j);
        }
        let c = src[si];
        si += 1;
        if let Some(v) = sextet(c) {
            buf[j] = v;
            j += 1;
            continue;
        }
        if matches!(c, b'\n' | b'\r') {
            continue;
        }
        if c != b'=' || j < 2 {
            return Err(si - 1);
        }
        if j == 2 {
            si = skip_newlines(src, si);
            if si == src.len() {
                return Err(src.len());
            }
            if src[si] != b'=' {
                return Err(si - 1);
            }
            si += 1;
        }
        si = skip_newlines(src, si);
        if si < src.len() {
            return Err(si);
        }
        len = j;
        break;
    }
    let val = buf[0] << 18 | buf[1] << 12 | buf[2] << 6 | buf[3];
    let bytes = [(val >> 16) as u8, (val >> 8) as u8, val as u8];
    Ok((si, bytes[..len - 1].to_vec()))
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, body: &str) -> Result<Value, String> {
        let mut v: Value = serde_json::from_str(body).unwrap();
        schema().check(name, &mut v).map(|()| v)
    }

    #[test]
    fn base64_as_go_decodes_it() {
        assert_eq!(go_base64_decode(b"YmFy").unwrap(), b"bar");
        assert_eq!(go_base64_decode(b"YQ==").unwrap(), b"a");
        assert_eq!(go_base64_decode(b"Y\nQ==").unwrap(), b"a");
        assert_eq!(go_base64_decode(b"YR==").unwrap(), b"a");
        assert_eq!(go_base64_decode(b"YmF-"), Err(3));
        assert_eq!(go_base64_decode(b"YQ"), Err(0));
        assert_eq!(go_base64_decode(b"YQ="), Err(3));
        assert_eq!(go_base64_decode(b"!!!"), Err(0));
        assert_eq!(go_base64_decode(b"YQ==YQ=="), Err(4));
    }

    #[test]
    fn etcds_messages_for_bad_fields() {
        let put = ".etcdserverpb.PutRequest";
        assert_eq!(
            check(put, r#"{"key":"YQ==","lease":1.5}"#).unwrap_err(),
            "json: cannot unmarshal number 1.5 into Go value of type int64"
        );
        assert_eq!(
            check(put, r#"{"lease":"abc"}"#).unwrap_err(),
            "invalid character 'a' looking for beginning of value"
        );
        assert_eq!(
            check(put, r#"{"prev_kv":"true"}"#).unwrap_err(),
            "json: cannot unmarshal string into Go value of type bool"
        );
        assert_eq!(
            check(put, r#"{"value":"YmF-"}"#).unwrap_err(),
            "illegal base64 data at input byte 3"
        );
        let txn = ".etcdserverpb.TxnRequest";
        assert_eq!(
            check(txn, r#"{"compare":[{"key":"Zm9v","target":"BOGUS"}]}"#).unwrap_err(),
            r#"unknown value "\"BOGUS\"" for enum etcdserverpb.Compare.CompareTarget"#
        );
    }

    #[test]
    fn canonical_values_for_the_generated_decoder() {
        let v = check(
            ".etcdserverpb.LeaseGrantRequest",
            r#"{"TTL":60,"ID":"7","zzz":1}"#,
        )
        .unwrap();
        assert_eq!(v, serde_json::json!({"TTL":"60","ID":"7"}));
        let v = check(
            ".etcdserverpb.RangeRequest",
            r#"{"key":"YR==","sort_order":"DESCEND"}"#,
        )
        .unwrap();
        assert_eq!(v, serde_json::json!({"key":"YQ==","sort_order":2}));
    }
}

//! A stored key-value's index fields, read without copying its value.
//!
//! The `kv` table's values are etcd's `mvccpb.KeyValue` protobuf. Rebuilding
//! the index at start-up needs each revision's key, create revision,
//! version and lease, not its value, which is most of the bytes (1 KiB of a
//! Kubernetes object against a few dozen bytes of the rest). Decoding the
//! whole message copied every value once more at every start; [`parse`]
//! walks the fields and borrows the key.
//!
//! Worked example: `KeyValue{key: "a", create_revision: 2, mod_revision: 5,
//! version: 3, value: "xyz", lease: 7}` is the bytes
//! `0a 01 61 | 10 02 | 18 05 | 20 03 | 2a 03 78 79 7a | 30 07`; [`parse`]
//! answers `{key: "a", create_revision: 2, version: 3, lease: 7}`, skipping
//! the 3 value bytes (and any field it does not know, as protobuf asks).
//!
//! [`StoredKvs`] hands out a range's stored key-values as they are, for an
//! answer that carries them without decoding: a `RangeResponse`'s `kvs`
//! field is that same message, so its encoding is the stored bytes behind
//! a field key and a length.

use std::collections::VecDeque;
use std::sync::Arc;

use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

use super::revision::Revision;
use crate::engine::{EngineError, EngineRead, Table};

/// A range's key-values as the `kv` table stores them (each an encoded
/// `mvccpb.KeyValue`), in key order, each read when it is taken.
///
/// A small range is read at once ([`StoredKvs::read`], under the store's
/// lock); a large one from an engine snapshot taken under the lock
/// ([`StoredKvs::from_snapshot`]), one value per [`Iterator::next`], so
/// whoever encodes the answer holds one value at a time beside what it
/// has written: a 1 GiB list is held once, as its encoding, not also as
/// decoded key-values.
pub struct StoredKvs {
    source: Source,
}

enum Source {
    /// Values read already.
    Read(VecDeque<Vec<u8>>),
    /// Revisions still to read from `view`.
    Snapshot {
        view: Arc<dyn EngineRead>,
        revisions: VecDeque<Revision>,
    },
}

impl StoredKvs {
    /// Reads the value of each of `revisions` from `engine` now.
    pub fn read(engine: &dyn EngineRead, revisions: Vec<Revision>) -> Result<Self, EngineError> {
        let values = revisions
            .into_iter()
            .map(|rev| read_value(engine, rev))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            source: Source::Read(values),
        })
    }

    /// The values of `revisions`, to be read from `view` as they are taken.
    pub fn from_snapshot(view: Arc<dyn EngineRead>, revisions: Vec<Revision>) -> Self {
        Self {
            source: Source::Snapshot {
                view,
                revisions: revisions.into(),
            },
        }
    }

    /// Key-values not taken yet.
    pub fn len(&self) -> usize {
        match &self.source {
            Source::Read(values) => values.len(),
            Source::Snapshot { revisions, .. } => revisions.len(),
        }
    }

    /// True if every key-value was taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// About how many bytes the key-values not taken yet encode to as a
    /// message's repeated field (each behind a field key and a length), at
    /// least that for the values read already, else estimated from up to
    /// [`SIZE_SAMPLES`] values spread over the revisions, with a margin of
    /// [`SIZE_MARGIN_PERCENT`]: an encoder reserving this much at once
    /// grows its buffer no further for evenly sized values (a buffer that
    /// doubles copies what it holds), and room never written is never
    /// touched, so never resident.
    pub fn estimated_field_bytes(&self) -> usize {
        match &self.source {
            Source::Read(values) => values.iter().map(|v| field_bytes(v.len())).sum(),
            Source::Snapshot { view, revisions } => {
                let n = revisions.len();
                let samples = n.min(SIZE_SAMPLES);
                if samples == 0 {
                    return 0;
                }
                let sampled: usize = (0..samples)
                    .filter_map(|i| revisions.get(i * n / samples))
                    .filter_map(|rev| read_value(view.as_ref(), *rev).ok())
                    .map(|v| field_bytes(v.len()))
                    .sum();
                sampled / samples * n / 100 * SIZE_MARGIN_PERCENT
            }
        }
    }

    /// Exactly how many bytes the key-values not taken yet encode to as a
    /// message's repeated field: each value not read yet is read, measured
    /// and dropped (one held at a time).
    pub fn field_bytes(&self) -> Result<usize, EngineError> {
        match &self.source {
            Source::Read(values) => Ok(values.iter().map(|v| field_bytes(v.len())).sum()),
            Source::Snapshot { view, revisions } => revisions.iter().try_fold(0, |sum, rev| {
                Ok(sum + field_bytes(read_value(view.as_ref(), *rev)?.len()))
            }),
        }
    }

    /// Keeps the first `n` key-values (unread ones are never read).
    pub fn truncate(&mut self, n: usize) {
        match &mut self.source {
            Source::Read(values) => values.truncate(n),
            Source::Snapshot { revisions, .. } => revisions.truncate(n),
        }
    }
}

impl Iterator for StoredKvs {
    type Item = Result<Vec<u8>, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.source {
            Source::Read(values) => values.pop_front().map(Ok),
            Source::Snapshot { view, revisions } => {
                let rev = revisions.pop_front()?;
                Some(read_value(view.as_ref(), rev))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

/// Values [`StoredKvs::estimated_field_bytes`] reads to estimate a large
/// range's size.
pub const SIZE_SAMPLES: usize = 16;

/// Percent of the sampled size [`StoredKvs::estimated_field_bytes`]
/// answers, for values that are not all alike.
pub const SIZE_MARGIN_PERCENT: usize = 125;

/// Bytes of a `len`-byte message as a repeated field: its key (one byte
/// for the field numbers a `RangeResponse` has), its length, itself.
pub fn field_bytes(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// The stored value of revision `rev` (a put), which must be there.
fn read_value(engine: &dyn EngineRead, rev: Revision) -> Result<Vec<u8>, EngineError> {
    engine
        .get(Table::Kv, &rev.to_key(false))?
        .ok_or_else(|| EngineError::corrupt(format!("revision {rev:?} missing")))
}

/// The index fields of a stored `KeyValue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoredMeta<'a> {
    /// The user key, borrowed from the stored bytes.
    pub key: &'a [u8],
    /// Revision of the put that created the key's current generation.
    pub create_revision: i64,
    /// Puts since creation.
    pub version: i64,
    /// The attached lease (0: none).
    pub lease: i64,
}

/// `KeyValue` field numbers (etcd's `mvccpb/kv.proto`).
const KEY: u32 = 1;
const CREATE_REVISION: u32 = 2;
const VERSION: u32 = 4;
const LEASE: u32 = 6;

/// Reads the index fields of an encoded `KeyValue`.
pub fn parse(bytes: &[u8]) -> Result<StoredMeta<'_>, EngineError> {
    parse_fields(bytes).map_err(|e| EngineError::corrupt(format!("key-value: {e}")))
}

fn parse_fields(mut bytes: &[u8]) -> Result<StoredMeta<'_>, String> {
    let mut meta = StoredMeta::default();
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes).map_err(|e| e.to_string())?;
        match (tag, wire_type) {
            (KEY, WireType::LengthDelimited) => {
                let len = usize::try_from(varint(&mut bytes)?)
                    .map_err(|_| "key length overflows".to_string())?;
                if len > bytes.len() {
                    return Err("buffer underflow".into());
                }
                let (key, rest) = bytes.split_at(len);
                meta.key = key;
                bytes = rest;
            }
            (CREATE_REVISION, WireType::Varint) => {
                meta.create_revision = varint(&mut bytes)? as i64
            }
            (VERSION, WireType::Varint) => meta.version = varint(&mut bytes)? as i64,
            (LEASE, WireType::Varint) => meta.lease = varint(&mut bytes)? as i64,
            _ => skip_field(wire_type, tag, &mut bytes, DecodeContext::default())
                .map_err(|e| e.to_string())?,
        }
    }
    Ok(meta)
}

fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
    decode_varint(bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use etcd_proto::mvccpb::KeyValue;
    use prost::Message;

    use super::*;

    #[test]
    fn the_worked_example() {
        let bytes = [
            0x0a, 0x01, b'a', 0x10, 0x02, 0x18, 0x05, 0x20, 0x03, 0x2a, 0x03, b'x', b'y', b'z',
            0x30, 0x07,
        ];
        let kv = KeyValue::decode(&bytes[..]).expect("prost reads it");
        assert_eq!((kv.mod_revision, kv.value.as_slice()), (5, &b"xyz"[..]));
        assert_eq!(
            parse(&bytes).expect("parse"),
            StoredMeta {
                key: b"a",
                create_revision: 2,
                version: 3,
                lease: 7
            }
        );
    }

    /// What prost decodes, for messages with and without each field, with
    /// large and negative numbers; truncated bytes are refused.
    #[test]
    fn parses_what_prost_decodes() {
        let kvs = [
            KeyValue::default(),
            KeyValue {
                key: b"k".repeat(300),
                create_revision: i64::MAX,
                mod_revision: 9,
                version: 1 << 40,
                value: vec![7; 5000],
                lease: -1,
            },
            KeyValue {
                key: b"only".to_vec(),
                ..Default::default()
            },
        ];
        for kv in kvs {
            let bytes = kv.encode_to_vec();
            let meta = parse(&bytes).expect("parse");
            assert_eq!(
                (meta.key, meta.create_revision, meta.version, meta.lease),
                (kv.key.as_slice(), kv.create_revision, kv.version, kv.lease)
            );
            if bytes.len() > 1 {
                assert!(parse(&bytes[..bytes.len() - 1]).is_err());
            }
        }
    }
}

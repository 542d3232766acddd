//! The log's record kinds (the table in the [module docs](super)) and the
//! codec of their payloads; and the I/O error the whole log store returns.

use std::io;

use crate::codec;
use crate::raft::{Entry, LeaderId, LogId};

pub(super) const KIND_ENTRY: u8 = 1;
pub(super) const KIND_TRUNCATE: u8 = 2;
pub(super) const KIND_VOTE: u8 = 16;
pub(super) const KIND_COMMITTED: u8 = 17;
pub(super) const KIND_PURGED: u8 = 18;
pub(super) const STICKY_KINDS: [u8; 3] = [KIND_VOTE, KIND_COMMITTED, KIND_PURGED];

/// Bytes before the entry's bincode in an entry record: its log id.
pub(super) const ENTRY_PREFIX_BYTES: usize = 24;

/// An I/O failure as the storage error openraft takes, naming what failed.
pub(crate) fn io_error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(payload: &[u8], what: &str) -> io::Result<T> {
    codec::decode(payload).map_err(|e| io_error(&format!("raft log: decoding {what}"), e))
}

/// An entry record's payload: its log id, then its bincode (encoded in
/// place); and the bincode's size.
pub(super) fn entry_record(entry: &Entry) -> (Vec<u8>, usize) {
    let mut payload = Vec::with_capacity(ENTRY_PREFIX_BYTES);
    payload.extend_from_slice(&entry.log_id.leader_id.term.to_be_bytes());
    payload.extend_from_slice(&entry.log_id.leader_id.node_id.to_be_bytes());
    payload.extend_from_slice(&entry.log_id.index.to_be_bytes());
    codec::encode_into(&mut payload, entry);
    let size = payload.len() - ENTRY_PREFIX_BYTES;
    (payload, size)
}

pub(super) fn entry_log_id(payload: &[u8]) -> io::Result<LogId> {
    if payload.len() < ENTRY_PREFIX_BYTES {
        return Err(io::Error::other("raft log: an entry record is too short"));
    }
    let word = |i: usize| u64::from_be_bytes(payload[i * 8..i * 8 + 8].try_into().expect("8"));
    Ok(LogId::new(
        LeaderId {
            term: word(0),
            node_id: word(1),
        },
        word(2),
    ))
}

pub(super) fn entry_of_record(payload: &[u8]) -> io::Result<Entry> {
    decode(
        &payload[ENTRY_PREFIX_BYTES.min(payload.len())..],
        "an entry",
    )
}

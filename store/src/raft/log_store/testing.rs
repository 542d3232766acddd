//! Entries and log ids for the log store's tests.
#![cfg(test)]

use std::sync::Arc;

use etcd_proto::etcdserverpb::PutRequest;
use openraft::EntryPayload;

use crate::raft::types::{Batch, Command, Proposal};
use crate::raft::{Entry, LeaderId, LogId};

/// An entry of `value_bytes` at `index` in `term`.
pub(super) fn entry_of(term: u64, index: u64, value_bytes: usize) -> Entry {
    let put = PutRequest {
        key: index.to_be_bytes().to_vec(),
        value: vec![b'v'; value_bytes],
        ..Default::default()
    };
    Entry {
        log_id: LogId::new(LeaderId { term, node_id: 1 }, index),
        payload: EntryPayload::Normal(Batch {
            proposals: Arc::new([Proposal {
                by: None,
                cmd: Command::Put(put),
            }]),
        }),
    }
}

pub(super) fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(LeaderId { term, node_id: 1 }, index)
}

pub(super) fn indexes(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

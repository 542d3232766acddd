//! Records, stores and directory listings for the snapshot files' tests.
#![cfg(test)]

use std::path::Path;
use std::sync::Arc;

use super::records::{write_record, Record};
use super::SnapshotFiles;
use crate::codec;
use crate::engine::{Engine, Table};
use crate::raft::state_machine::KEY_APPLIED;
use crate::raft::LogId;

pub(super) fn record(table: Table, key: &str, value: &str) -> Record {
    Record {
        table,
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

pub(super) fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let i = Table::STATE_MACHINE
            .iter()
            .position(|t| *t == r.table)
            .unwrap();
        write_record(&mut out, i as u8, &r.key, &r.value).unwrap();
    }
    out
}

pub(super) fn memory_files(dir: &Path) -> (Arc<dyn Engine>, SnapshotFiles) {
    let engine: Arc<dyn Engine> = Arc::new(crate::engine::memory::MemoryEngine::new());
    (
        engine.clone(),
        SnapshotFiles::new(dir.to_path_buf(), engine),
    )
}

pub(super) fn applied_batch(index: u64, key: &str) -> crate::engine::WriteBatch {
    let mut b = crate::engine::WriteBatch::new();
    b.put(Table::Kv, key.as_bytes().to_vec(), b"v".to_vec());
    let leader = crate::raft::LeaderId {
        term: 1,
        node_id: 1,
    };
    let log_id = LogId::new(leader, index);
    b.put(
        Table::Meta,
        KEY_APPLIED.to_vec(),
        codec::encode(&Some(log_id)),
    );
    b
}

pub(super) fn put_applied(engine: &dyn Engine, index: u64, key: &str) {
    engine.write(applied_batch(index, key), true).unwrap();
}

pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

//! The log of a data directory written before it had files of its own,
//! kept in the engine's `raft_log` and `raft_state` tables: moved into
//! segment files at the first open ([`migrate_from_engine`]).

use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::records::{decode, io_error, KIND_COMMITTED, KIND_PURGED, KIND_VOTE};
use super::segments::{log_options, open_log, write_entries};
use crate::engine::{try_scan, Engine, Table, WriteBatch};
use crate::raft::Entry;
use crate::wal;

/// Where the engine kept the log's state before it had files of its own
/// (`raft_state` keys), and the record kind each becomes: the values are
/// the bincode of the same types, so they are copied as they are.
const LEGACY_KEY_VOTE: &[u8] = b"vote";
const LEGACY_STATE: [(&[u8], u8); 3] = [
    (LEGACY_KEY_VOTE, KIND_VOTE),
    (b"committed", KIND_COMMITTED),
    (b"last_purged", KIND_PURGED),
];

/// Moves a log kept in the engine's tables (see the module docs) into
/// segments in `dir`, unless `dir` exists. The segments are built in a
/// sibling directory and renamed into place once synced, so a crash
/// during the copy leaves the engine's log as the only one.
pub(super) fn migrate_from_engine(engine: &dyn Engine, dir: &Path) -> io::Result<()> {
    let building = building_dir(dir);
    if dir.exists() {
        return remove_legacy_log(engine);
    }
    if building.exists() {
        std::fs::remove_dir_all(&building)
            .map_err(|e| io_error(&format!("removing {}", building.display()), e))?;
    }
    if !legacy_log_present(engine)? {
        return Ok(());
    }
    let mut state = Vec::new();
    for (key, kind) in LEGACY_STATE {
        if let Some(value) = engine
            .get(Table::RaftState, key)
            .map_err(|e| io_error("reading raft state", e))?
        {
            state.push((kind, value));
        }
    }
    let mut log = open_log(&building, log_options())?;
    let records: Vec<(u8, &[u8])> = state.iter().map(|(k, v)| (*k, &v[..])).collect();
    log.write(&records)?;
    for_each_legacy_entry(engine, &mut |entry| {
        write_entries(&mut log, &[entry])?;
        Ok(ControlFlow::Continue(()))
    })?;
    log.wal.sync()?;
    drop(log);
    std::fs::rename(&building, dir)
        .map_err(|e| io_error(&format!("renaming {}", building.display()), e))?;
    if let Some(parent) = dir.parent() {
        wal::sync_dir(parent)?;
    }
    tracing::info!(dir = %dir.display(), "moved the raft log from the engine into segment files");
    remove_legacy_log(engine)
}

fn building_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".building");
    dir.with_file_name(name)
}

fn for_each_legacy_entry(
    engine: &dyn Engine,
    visit: &mut dyn FnMut(Entry) -> io::Result<ControlFlow<()>>,
) -> io::Result<()> {
    try_scan(engine, Table::RaftLog, &[], None, &mut |_, v| {
        visit(decode(v, "an engine log entry")?)
    })
}

/// Whether the engine still holds a log: entries or state.
fn legacy_log_present(engine: &dyn Engine) -> io::Result<bool> {
    let mut present = false;
    for_each_legacy_entry(engine, &mut |_| {
        present = true;
        Ok(ControlFlow::Break(()))
    })?;
    for (key, _) in LEGACY_STATE {
        present |= engine
            .get(Table::RaftState, key)
            .map_err(|e| io_error("reading raft state", e))?
            .is_some();
    }
    Ok(present)
}

/// Removes the engine's copy of the log, synced (nothing if none).
fn remove_legacy_log(engine: &dyn Engine) -> io::Result<()> {
    if !legacy_log_present(engine)? {
        return Ok(());
    }
    let mut b = WriteBatch::new();
    b.delete_range(Table::RaftLog, vec![0; 8], vec![0xff; 9]);
    for (key, _) in LEGACY_STATE {
        b.delete(Table::RaftState, key.to_vec());
    }
    engine
        .write(b, true)
        .map_err(|e| io_error("removing the engine's raft log", e))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openraft::storage::{RaftLogReader, RaftLogStorage};

    use super::*;
    use crate::codec;
    use crate::engine::memory::MemoryEngine;
    use crate::raft::log_store::testing::{entry_of, log_id};
    use crate::raft::log_store::LogStore;
    use crate::raft::Vote;

    /// A data directory from before the log had files: its log moves out
    /// of the engine's tables, whole, and leaves them empty.
    #[tokio::test]
    async fn a_log_kept_in_the_engine_moves_into_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
        let mut b = WriteBatch::new();
        b.put(
            Table::RaftState,
            LEGACY_KEY_VOTE.to_vec(),
            codec::encode(&Vote::new(4, 1)),
        );
        b.put(
            Table::RaftState,
            b"last_purged".to_vec(),
            codec::encode(&log_id(1, 2)),
        );
        b.put(
            Table::RaftState,
            b"committed".to_vec(),
            codec::encode(&Some(log_id(4, 7))),
        );
        for index in 3..=10u64 {
            b.put(
                Table::RaftLog,
                index.to_be_bytes().to_vec(),
                codec::encode(&entry_of(4, index, 100)),
            );
        }
        engine.write(b, true).expect("write");
        let log_dir = dir.path().join("log");
        for _ in 0..2 {
            let mut store = LogStore::open(engine.clone(), &log_dir).expect("open");
            let state = store.get_log_state().await.expect("state");
            assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
            assert_eq!(state.last_log_id, Some(log_id(4, 10)));
            assert_eq!(
                store.read_vote().await.expect("vote"),
                Some(Vote::new(4, 1))
            );
            assert_eq!(
                store.read_committed().await.expect("commit"),
                Some(log_id(4, 7))
            );
            let entries = store.try_get_log_entries(0..100).await.expect("read");
            assert_eq!(
                entries,
                (3..=10).map(|i| entry_of(4, i, 100)).collect::<Vec<_>>()
            );
        }
        let mut left = 0;
        engine
            .scan(Table::RaftLog, &[], None, &mut |_, _| {
                left += 1;
                ControlFlow::Continue(())
            })
            .expect("scan");
        assert_eq!(left, 0, "the engine's log is gone");
        assert_eq!(
            engine.get(Table::RaftState, LEGACY_KEY_VOTE).expect("get"),
            None
        );
        assert!(!building_dir(&log_dir).exists());
    }
}

//! The state machine's snapshot: its record format, the files that keep
//! the latest one in `<data-dir>/member/snap/`, and the builder.
//!
//! A snapshot is every key of the state machine tables
//! ([`Table::STATE_MACHINE`]) read from one engine snapshot, so it is a
//! consistent point-in-time copy that includes the applied log id. The
//! format is a sequence of records `table u8 | key_len u32 | key |
//! value_len u32 | value` (big-endian lengths).

use std::io::Cursor;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftSnapshotBuilder;

use super::{read_meta, KEY_APPLIED, KEY_MEMBERSHIP};
use crate::codec;
use crate::engine::{EngineError, EngineRead, Table, WriteBatch};
use crate::raft::log_store::io_error;
use crate::raft::types::{
    LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};

const SNAPSHOT_DATA_FILE: &str = "current.snap";
const SNAPSHOT_META_FILE: &str = "current.meta";

pub(super) fn snapshot_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join(SNAPSHOT_DATA_FILE), dir.join(SNAPSHOT_META_FILE))
}

/// Writes `data` and `meta` as the current snapshot in `dir` (atomically:
/// synced temp files, then renames, data first so meta never points at
/// older data).
pub(super) fn save_snapshot(dir: &Path, meta: &SnapshotMeta, data: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (data_path, meta_path) = snapshot_paths(dir);
    let tmp_data = data_path.with_extension("snap.tmp");
    let tmp_meta = meta_path.with_extension("meta.tmp");
    std::fs::write(&tmp_data, data)?;
    std::fs::File::open(&tmp_data)?.sync_all()?;
    std::fs::write(&tmp_meta, codec::encode(meta))?;
    std::fs::File::open(&tmp_meta)?.sync_all()?;
    std::fs::rename(&tmp_data, &data_path)?;
    std::fs::rename(&tmp_meta, &meta_path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Appends `records` (snapshot format) to `batch` as puts.
pub fn decode_records(mut data: &[u8], batch: &mut WriteBatch) -> std::io::Result<()> {
    fn take<'a>(data: &mut &'a [u8], n: usize) -> std::io::Result<&'a [u8]> {
        if data.len() < n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "truncated snapshot",
            ));
        }
        let (head, tail) = data.split_at(n);
        *data = tail;
        Ok(head)
    }
    fn take_len(data: &mut &[u8]) -> std::io::Result<usize> {
        Ok(u32::from_be_bytes(take(data, 4)?.try_into().expect("4 bytes")) as usize)
    }
    while !data.is_empty() {
        let table_byte = take(&mut data, 1)?[0];
        let table = *Table::STATE_MACHINE
            .get(table_byte as usize)
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "unknown snapshot table")
            })?;
        let klen = take_len(&mut data)?;
        let key = take(&mut data, klen)?.to_vec();
        let vlen = take_len(&mut data)?;
        let value = take(&mut data, vlen)?.to_vec();
        batch.put(table, key, value);
    }
    Ok(())
}

/// Serializes every state machine table of `reader` (snapshot format).
pub fn encode_records(reader: &dyn EngineRead) -> Result<Vec<u8>, EngineError> {
    let mut out = Vec::new();
    for (i, t) in Table::STATE_MACHINE.iter().enumerate() {
        reader.scan(*t, &[], None, &mut |k, v| {
            out.push(i as u8);
            out.extend_from_slice(&(k.len() as u32).to_be_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
            ControlFlow::Continue(())
        })?;
    }
    Ok(out)
}

/// Builds a snapshot from a frozen engine view.
pub struct SnapshotBuilder {
    pub(super) view: Arc<dyn EngineRead>,
    pub(super) snapshot_dir: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let applied: Option<LogId> =
            read_meta::<Option<LogId>>(self.view.as_ref(), KEY_APPLIED)?.flatten();
        let membership: StoredMembership =
            read_meta(self.view.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        let data = encode_records(self.view.as_ref())
            .map_err(|e| io_error("reading the state machine", e))?;
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
        };
        save_snapshot(&self.snapshot_dir, &meta, &data)
            .map_err(|e| io_error("saving a snapshot", e))?;
        tracing::info!(dir = %self.snapshot_dir.display(), meta = %meta, bytes = data.len(), "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

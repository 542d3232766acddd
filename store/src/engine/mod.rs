//! The storage engine trait: ordered key-value tables, atomic batches,
//! point-in-time snapshots. Nothing here names RocksDB.
//!
//! The store keeps everything (Raft log, vote, MVCC data, metadata) in one
//! engine so that one atomic, synced batch can cover what must change
//! together: for example an applied entry's data and the applied log id.
//!
//! Two engines implement the trait: [`rocks::RocksEngine`] (the real one;
//! one RocksDB column family per [`Table`]) and [`memory::MemoryEngine`]
//! (BTreeMaps; for tests and for embedding without persistence). The same
//! conformance suite (`conformance`, compiled for tests only) runs against both.

#[cfg(test)]
pub mod conformance;
pub mod memory;
pub mod rocks;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The logical tables. Each is an independent ordered key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Raft log entries: key = log index (8 bytes big-endian).
    RaftLog,
    /// Raft's own persistent state: vote, last purged log id, committed.
    RaftState,
    /// MVCC data in etcd's layout: key = revision (see `mvcc::revision`),
    /// value = `mvccpb.KeyValue`.
    Kv,
    /// State machine metadata: applied log id, membership, compaction marks.
    Meta,
    /// Leases: key = lease id (8 bytes big-endian).
    Lease,
    /// The `kv` table's index fields: the same keys (revisions), each with
    /// its `mvccpb.KeyValue` but the value (`mvcc::store` keeps the two in
    /// step). Rebuilding the key index at start-up reads these instead of
    /// every stored value: at a million keys of 1 KiB, 60 MB instead of 1 GiB.
    KvIndex,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 6] = [
        Table::RaftLog,
        Table::RaftState,
        Table::Kv,
        Table::Meta,
        Table::Lease,
        Table::KvIndex,
    ];

    /// Stable on-disk name of the table (the RocksDB column family name).
    pub fn name(self) -> &'static str {
        match self {
            Table::RaftLog => "raft_log",
            Table::RaftState => "raft_state",
            Table::Kv => "kv",
            Table::Meta => "meta",
            Table::Lease => "lease",
            Table::KvIndex => "kv_index",
        }
    }

    /// Tables that belong to the replicated state machine (what a Raft
    /// snapshot carries); the rest are this member's Raft log and vote.
    /// The position of each is its number in a snapshot's records, so a
    /// new table goes last.
    pub const STATE_MACHINE: [Table; 4] = [Table::Kv, Table::Meta, Table::Lease, Table::KvIndex];
}

/// One change inside a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Set `key` to `value`.
    Put(Table, Vec<u8>, Vec<u8>),
    /// Remove `key`.
    Delete(Table, Vec<u8>),
    /// Remove every key in `[start, end)`.
    DeleteRange(Table, Vec<u8>, Vec<u8>),
}

/// Changes applied atomically: all or none survive a crash.
#[derive(Debug, Default, Clone)]
pub struct WriteBatch {
    ops: Vec<BatchOp>,
    bytes: usize,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put.
    pub fn put(&mut self, table: Table, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        let (key, value) = (key.into(), value.into());
        self.bytes += key.len() + value.len();
        self.ops.push(BatchOp::Put(table, key, value));
    }

    /// Adds a delete.
    pub fn delete(&mut self, table: Table, key: impl Into<Vec<u8>>) {
        let key = key.into();
        self.bytes += key.len();
        self.ops.push(BatchOp::Delete(table, key));
    }

    /// Adds a range delete of `[start, end)`.
    pub fn delete_range(
        &mut self,
        table: Table,
        start: impl Into<Vec<u8>>,
        end: impl Into<Vec<u8>>,
    ) {
        let (start, end) = (start.into(), end.into());
        self.bytes += start.len() + end.len();
        self.ops.push(BatchOp::DeleteRange(table, start, end));
    }

    /// The changes, in order.
    pub fn ops(&self) -> &[BatchOp] {
        &self.ops
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if the batch holds no change.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Sum of key and value sizes, in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }

    /// Appends another batch's changes after this one's.
    pub fn extend(&mut self, other: WriteBatch) {
        self.bytes += other.bytes;
        self.ops.extend(other.ops);
    }
}

/// An engine failure. Engines are expected to be reliable: the store treats
/// any of these as fatal for the operation (and for Raft, for the member).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The backend failed (for RocksDB, its error; the trait names no
    /// backend type, so the source is boxed).
    #[error("storage engine: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Stored bytes do not hold what their place says they hold.
    #[error("storage engine: corrupt data: {0}")]
    Corrupt(String),
}

impl EngineError {
    /// Stored bytes that do not decode: `what` was expected.
    pub fn corrupt(what: impl std::fmt::Display) -> Self {
        Self::Corrupt(what.to_string())
    }
}

/// Result of engine calls.
pub type EngineResult<T> = Result<T, EngineError>;

/// Visitor for scans: return `ControlFlow::Break(())` to stop early.
pub type ScanVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> ControlFlow<()> + 'a;

/// Reads of an ordered key-value space: the live engine or a snapshot.
pub trait EngineRead: Send + Sync {
    /// The value of `key`, if present.
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>>;

    /// Visits keys in `[start, end)` (`end = None`: to the end of the
    /// table), ascending or, with `reverse`, descending, until the visitor
    /// breaks.
    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()>;

    /// Visits keys in `[start, end)` in ascending order.
    fn scan(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        self.scan_range(table, start, end, false, visit)
    }

    /// Visits keys in `[start, end)` in descending order.
    fn scan_reverse(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        self.scan_range(table, start, end, true, visit)
    }
}

/// One pair of a bulk load: (table, key, value).
pub type BulkPair = (Table, Vec<u8>, Vec<u8>);

/// The pairs of a bulk load ([`Engine::bulk_load`]), one call each until
/// `None`.
pub type BulkSource<'a> = dyn FnMut() -> EngineResult<Option<BulkPair>> + 'a;

/// A bulk load read ahead of its ingestion ([`Engine::prepare_load`]):
/// table files in a staging directory, removed with it when the load is
/// dropped, or (an engine without files) the pairs themselves.
#[derive(Debug)]
pub struct PreparedLoad {
    /// The staging directory holding `files`, if the engine wrote any.
    staging: Option<PathBuf>,
    /// Each table file with its table, in the order written.
    files: Vec<(Table, PathBuf)>,
    /// The pairs, for an engine without table files.
    pairs: Vec<BulkPair>,
}

impl PreparedLoad {
    /// The table files written into `staging`.
    pub fn files(staging: PathBuf, files: Vec<(Table, PathBuf)>) -> Self {
        Self {
            staging: Some(staging),
            files,
            pairs: Vec::new(),
        }
    }

    /// The pairs themselves.
    pub fn pairs(pairs: Vec<BulkPair>) -> Self {
        Self {
            staging: None,
            files: Vec::new(),
            pairs,
        }
    }

    /// The table files of `table`, in the order written.
    pub fn files_of(&self, table: Table) -> Vec<&Path> {
        self.files
            .iter()
            .filter(|(t, _)| *t == table)
            .map(|(_, p)| p.as_path())
            .collect()
    }

    /// Takes the pairs out.
    pub fn take_pairs(&mut self) -> Vec<BulkPair> {
        std::mem::take(&mut self.pairs)
    }
}

impl Drop for PreparedLoad {
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            if let Err(e) = std::fs::remove_dir_all(&staging) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %staging.display(), error = %e, "removing a bulk load's staging directory");
                }
            }
        }
    }
}

/// A storage engine. Implementations are internally synchronized.
pub trait Engine: EngineRead + 'static {
    /// Applies `batch` atomically. With `sync`, it is durable (fsynced)
    /// before this returns, together with every batch written before it.
    fn write(&self, batch: WriteBatch, sync: bool) -> EngineResult<()>;

    /// Makes every batch written so far durable (one fsync for all of them:
    /// the group-commit primitive).
    fn sync(&self) -> EngineResult<()>;

    /// A consistent point-in-time view that later writes do not change.
    fn snapshot(&self) -> Arc<dyn EngineRead>;

    /// Approximate bytes the engine uses on disk (or in memory).
    fn size_bytes(&self) -> u64;

    /// Approximate bytes used by `tables` alone (the quota counts only the
    /// state machine, as etcd's counts only its bbolt file, not its WAL).
    fn tables_size_bytes(&self, tables: &[Table]) -> u64;

    /// Approximate bytes of live data (what `size_bytes` would become
    /// after a full compaction of the files).
    fn size_in_use_bytes(&self) -> u64;

    /// Reclaims space left by deleted data (etcd's defragment).
    fn compact_files(&self) -> EngineResult<()>;

    /// Writes a consistent point-in-time copy of every table into `dir`
    /// (which must not exist yet), durable when this returns. The RocksDB
    /// engine flushes its memtables and hard-links its table files, so the
    /// cost does not grow with the data; the copy pins those files until it
    /// is removed.
    fn checkpoint(&self, dir: &Path) -> EngineResult<()>;

    /// Opens a copy [`Engine::checkpoint`] wrote into `dir`, read-only.
    fn open_checkpoint(&self, dir: &Path) -> EngineResult<Arc<dyn EngineRead>>;

    /// Adds the pairs `next` yields, outside the write path: each table's
    /// pairs in ascending key order, one table after the other, into
    /// tables that hold none of those keys (a snapshot install clears them
    /// first). Durable when this returns. [`Engine::prepare_load`] then
    /// [`Engine::ingest`]: the RocksDB engine writes table files into
    /// `staging` (a directory it creates and removes, on the engine's file
    /// system) and ingests them: no WAL, no memtable, and no compaction on
    /// the way in, so a store-sized load runs at disk speed. Out-of-order
    /// pairs may be refused.
    fn bulk_load(&self, staging: &Path, next: &mut BulkSource<'_>) -> EngineResult<()> {
        let load = self.prepare_load(staging, next)?;
        self.ingest(load)
    }

    /// The first half of [`Engine::bulk_load`]: reads every pair `next`
    /// yields into a load that [`Engine::ingest`] adds later, without
    /// touching the tables (so it may run while they serve, and the load
    /// may be dropped instead). The RocksDB engine writes the table files
    /// into `staging` (created here, removed when the load is dropped).
    fn prepare_load(&self, staging: &Path, next: &mut BulkSource<'_>)
        -> EngineResult<PreparedLoad>;

    /// The second half of [`Engine::bulk_load`]: adds a load
    /// [`Engine::prepare_load`] of this engine prepared. Durable when this
    /// returns.
    fn ingest(&self, load: PreparedLoad) -> EngineResult<()>;
}

/// Collects `[start, end)` of `table` into a vector, at most `limit` pairs
/// (0 = no limit). A convenience for small scans.
pub fn scan_collect(
    reader: &dyn EngineRead,
    table: Table,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> EngineResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    reader.scan(table, start, end, &mut |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        if limit != 0 && out.len() >= limit {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(out)
}

/// A visitor of [`try_scan`]: what to do next, or why to stop.
pub type TryScanVisitor<'a, E> = dyn FnMut(&[u8], &[u8]) -> Result<ControlFlow<()>, E> + 'a;

/// [`EngineRead::scan`] with a visitor that can fail: the scan stops at the
/// first error the visitor returns, and that error is the result.
pub fn try_scan<E: From<EngineError>>(
    read: &(impl EngineRead + ?Sized),
    table: Table,
    start: &[u8],
    end: Option<&[u8]>,
    visit: &mut TryScanVisitor<'_, E>,
) -> Result<(), E> {
    let mut failure = None;
    read.scan(table, start, end, &mut |k, v| match visit(k, v) {
        Ok(flow) => flow,
        Err(e) => {
            failure = Some(e);
            ControlFlow::Break(())
        }
    })?;
    failure.map_or(Ok(()), Err)
}

/// An engine failure where an I/O error is expected (openraft's storage
/// traits).
impl From<EngineError> for std::io::Error {
    fn from(e: EngineError) -> Self {
        std::io::Error::other(e.to_string())
    }
}

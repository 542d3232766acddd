//! The state machine's snapshot: its record format, the files that keep
//! the latest one in `<data-dir>/member/snap/`, the builder, and the
//! streaming reader and receiver.
//!
//! A snapshot is every key of the state machine tables
//! ([`Table::STATE_MACHINE`]) read from one engine snapshot, so it is a
//! consistent point-in-time copy that includes the applied log id. The
//! format is a sequence of records `table u8 | key_len u32 | key |
//! value_len u32 | value` (big-endian lengths).
//!
//! A snapshot never sits in memory whole: openraft passes a
//! [`SnapshotFile`] (an open file and its length) around, the builder
//! writes records to a file as it scans, the leader sends the file in
//! chunks read at their offsets, a follower writes the chunks it receives
//! to a temporary file ([`SnapshotReceiver`]) and installing reads records
//! back in bounded batches ([`RecordReader`]). Memory per snapshot is a
//! chunk or a batch, whatever the store's size (etcd's default quota is
//! 2 GiB).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::RaftSnapshotBuilder;

use super::{read_meta, KEY_APPLIED, KEY_MEMBERSHIP};
use crate::codec;
use crate::engine::{EngineError, EngineRead, Table};
use crate::limits::MAX_SNAPSHOT_BYTES;
use crate::raft::log_store::io_error;
use crate::raft::types::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

const SNAPSHOT_DATA_FILE: &str = "current.snap";
const SNAPSHOT_META_FILE: &str = "current.meta";
/// Prefix of the temporary files snapshots are received into.
const RECEIVING_PREFIX: &str = "receiving-";
/// Extension of every temporary file in the snapshot directory.
const TEMP_EXTENSION: &str = "tmp";
/// Buffer of the builder's writer and of the installer's reader.
const FILE_BUFFER_BYTES: usize = 1024 * 1024;

pub(super) fn snapshot_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join(SNAPSHOT_DATA_FILE), dir.join(SNAPSHOT_META_FILE))
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// A snapshot's bytes in a file: what openraft passes around as the
/// snapshot data. The file is open, so a newer snapshot replacing the path
/// does not change what a reader of this one sees. A temporary file (one
/// being received) is removed when dropped unless it was adopted as the
/// current snapshot ([`SnapshotFile::persist_as_current`]).
#[derive(Debug)]
pub struct SnapshotFile {
    file: Arc<File>,
    path: PathBuf,
    len: u64,
    temporary: bool,
}

impl SnapshotFile {
    /// Opens the snapshot data at `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            len,
            temporary: false,
        })
    }

    /// The snapshot's size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the snapshot holds no record.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The records, read from the start through a buffer.
    pub fn records(&self) -> RecordReader<impl Read> {
        let reader = BufReader::with_capacity(FILE_BUFFER_BYTES, self.reader());
        RecordReader::new(reader, self.len)
    }

    /// The bytes, read from the start.
    fn reader(&self) -> PositionedReader {
        PositionedReader {
            file: self.file.clone(),
            offset: 0,
        }
    }

    /// Reads the chunk of at most `max` bytes at `offset` (a blocking read).
    pub fn chunk_at(&self, offset: u64, max: u64) -> std::io::Result<Vec<u8>> {
        let n = max.min(self.len.saturating_sub(offset));
        let mut chunk = vec![0; n as usize];
        self.file.read_exact_at(&mut chunk, offset)?;
        Ok(chunk)
    }

    /// Makes this snapshot the current one of `files` with `meta`: a
    /// received (temporary) file is moved there, another directory's
    /// snapshot is copied; a no-op when it already is the current one.
    pub(super) fn persist_as_current(
        &mut self,
        files: &SnapshotFiles,
        meta: &SnapshotMeta,
    ) -> std::io::Result<()> {
        let (data_path, _) = snapshot_paths(&files.dir);
        if self.path == data_path {
            return Ok(());
        }
        if !self.temporary {
            // Another directory's snapshot: copy it, leaving the original.
            std::fs::create_dir_all(files.dir())?;
            let copy = data_path.with_extension(format!("copy.{TEMP_EXTENSION}"));
            let mut out = File::create(&copy)?;
            std::io::copy(&mut self.reader(), &mut out)?;
            out.sync_all()?;
            files.save_current(meta, &copy)?;
            *self = Self::open(&data_path)?;
            return Ok(());
        }
        self.file.sync_all()?;
        files.save_current(meta, &self.path)?;
        self.path = data_path;
        self.temporary = false;
        Ok(())
    }
}

impl Drop for SnapshotFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `Read` over a shared file at a private offset (positioned reads, so
/// several readers of one [`SnapshotFile`] never move each other's offset).
struct PositionedReader {
    file: Arc<File>,
    offset: u64,
}

impl Read for PositionedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// The snapshot directory. The current snapshot is two files (data and
/// meta), replaced by renames; a lock taken by every replacement and by
/// [`SnapshotFiles::current`] makes the pair a reader gets always match,
/// whatever a concurrent build or install does.
#[derive(Debug, Clone)]
pub struct SnapshotFiles {
    dir: PathBuf,
    lock: Arc<Mutex<()>>,
}

impl SnapshotFiles {
    /// The snapshot files in `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes the synced data file `data` and `meta` the current snapshot:
    /// the meta is written to a synced temporary file, then both are
    /// renamed into place.
    fn save_current(&self, meta: &SnapshotMeta, data: &Path) -> std::io::Result<()> {
        let (data_path, meta_path) = snapshot_paths(&self.dir);
        let tmp_meta = meta_path.with_extension(format!("meta.{TEMP_EXTENSION}"));
        std::fs::write(&tmp_meta, codec::encode(meta))?;
        File::open(&tmp_meta)?.sync_all()?;
        let _guard = self.locked();
        std::fs::rename(data, &data_path)?;
        std::fs::rename(&tmp_meta, &meta_path)?;
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// The current snapshot's meta and data, if there is one.
    pub fn current(&self) -> std::io::Result<Option<(SnapshotMeta, SnapshotFile)>> {
        let (data_path, meta_path) = snapshot_paths(&self.dir);
        let _guard = self.locked();
        let meta_bytes = match std::fs::read(&meta_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta: SnapshotMeta =
            codec::decode(&meta_bytes).map_err(|e| io_error("reading the snapshot meta", e))?;
        Ok(Some((meta, SnapshotFile::open(&data_path)?)))
    }
}

/// Removes temporary files a crash left in the snapshot directory (a
/// snapshot being built or received).
pub fn remove_temporary_files(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == TEMP_EXTENSION) {
            tracing::info!(path = %path.display(), "removing a leftover snapshot file");
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// One record of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The table the pair belongs to.
    pub table: Table,
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

impl Record {
    /// The record's size in the snapshot format.
    pub fn encoded_len(&self) -> usize {
        1 + 4 + self.key.len() + 4 + self.value.len()
    }
}

/// Reads records one by one. A length that runs past the end of the
/// snapshot is refused before anything is allocated for it.
pub struct RecordReader<R> {
    input: R,
    remaining: u64,
}

impl<R: Read> RecordReader<R> {
    /// Reads records from `input`, which holds `len` bytes.
    pub fn new(input: R, len: u64) -> Self {
        Self {
            input,
            remaining: len,
        }
    }

    fn take(&mut self, n: u64) -> std::io::Result<Vec<u8>> {
        if n > self.remaining {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "truncated snapshot",
            ));
        }
        let mut buf = vec![0; n as usize];
        self.input.read_exact(&mut buf)?;
        self.remaining -= n;
        Ok(buf)
    }

    fn take_len(&mut self) -> std::io::Result<u64> {
        let bytes: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
        Ok(u32::from_be_bytes(bytes) as u64)
    }

    /// The next record, or `None` at the end.
    pub fn next_record(&mut self) -> std::io::Result<Option<Record>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        let table_byte = self.take(1)?[0];
        let table = *Table::STATE_MACHINE
            .get(table_byte as usize)
            .ok_or_else(|| invalid("unknown snapshot table"))?;
        let key_len = self.take_len()?;
        let key = self.take(key_len)?;
        let value_len = self.take_len()?;
        let value = self.take(value_len)?;
        Ok(Some(Record { table, key, value }))
    }
}

/// Writes one record (snapshot format) of the table at `table_index` in
/// [`Table::STATE_MACHINE`].
fn write_record(
    out: &mut dyn Write,
    table_index: u8,
    key: &[u8],
    value: &[u8],
) -> std::io::Result<()> {
    out.write_all(&[table_index])?;
    out.write_all(&(key.len() as u32).to_be_bytes())?;
    out.write_all(key)?;
    out.write_all(&(value.len() as u32).to_be_bytes())?;
    out.write_all(value)
}

/// Writes every state machine table of `reader` to `out` (snapshot format).
pub fn encode_records(reader: &dyn EngineRead, out: &mut dyn Write) -> std::io::Result<()> {
    let mut failed = None;
    for (i, t) in Table::STATE_MACHINE.iter().enumerate() {
        reader
            .scan(
                *t,
                &[],
                None,
                &mut |k, v| match write_record(out, i as u8, k, v) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                },
            )
            .map_err(|e: EngineError| io_error("reading the state machine", e))?;
        if let Some(e) = failed.take() {
            return Err(e);
        }
    }
    Ok(())
}

/// Distinguishes the temporary files of concurrent receives.
static RECEIVING: AtomicU64 = AtomicU64::new(0);

/// Writes a snapshot arriving in chunks to a temporary file in the
/// snapshot directory, refusing more than the sender announced and more
/// than [`MAX_SNAPSHOT_BYTES`]. The file is removed if the receive fails.
pub struct SnapshotReceiver {
    file: BufWriter<File>,
    /// The file being received; its `len` counts the bytes so far.
    snapshot: SnapshotFile,
    expected: u64,
}

impl SnapshotReceiver {
    /// Starts receiving a snapshot of `expected` bytes into `dir`.
    pub fn create(dir: &Path, expected: u64) -> std::io::Result<Self> {
        if expected > MAX_SNAPSHOT_BYTES {
            return Err(invalid("snapshot larger than the member's limit"));
        }
        std::fs::create_dir_all(dir)?;
        let n = RECEIVING.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "{RECEIVING_PREFIX}{}-{n}.{TEMP_EXTENSION}",
            std::process::id()
        ));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let snapshot = SnapshotFile {
            file: Arc::new(file.try_clone()?),
            path,
            len: 0,
            temporary: true,
        };
        Ok(Self {
            file: BufWriter::with_capacity(FILE_BUFFER_BYTES, file),
            snapshot,
            expected,
        })
    }

    /// Appends `chunk` (a blocking write).
    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        if self.snapshot.len + chunk.len() as u64 > self.expected {
            return Err(invalid("snapshot longer than announced"));
        }
        self.file.write_all(chunk)?;
        self.snapshot.len += chunk.len() as u64;
        Ok(())
    }

    /// The received snapshot, once every announced byte arrived.
    pub fn finish(mut self) -> std::io::Result<SnapshotFile> {
        if self.snapshot.len != self.expected {
            return Err(invalid("snapshot shorter than announced"));
        }
        self.file.flush()?;
        Ok(self.snapshot)
    }
}

/// Builds a snapshot from a frozen engine view.
pub struct SnapshotBuilder {
    pub(super) view: Arc<dyn EngineRead>,
    pub(super) files: SnapshotFiles,
}

impl SnapshotBuilder {
    /// Writes the view's records to a temporary file and makes it the
    /// current snapshot (a blocking scan of the whole state machine).
    fn build(
        view: &dyn EngineRead,
        files: &SnapshotFiles,
    ) -> std::io::Result<(SnapshotMeta, SnapshotFile)> {
        let applied: Option<LogId> = read_meta::<Option<LogId>>(view, KEY_APPLIED)?.flatten();
        let membership: StoredMembership = read_meta(view, KEY_MEMBERSHIP)?.unwrap_or_default();
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
        };
        std::fs::create_dir_all(files.dir())?;
        let (data_path, _) = snapshot_paths(files.dir());
        let tmp_data = data_path.with_extension(format!("snap.{TEMP_EXTENSION}"));
        let file = File::create(&tmp_data)?;
        let mut out = BufWriter::with_capacity(FILE_BUFFER_BYTES, file);
        encode_records(view, &mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let mut snapshot = SnapshotFile::open(&tmp_data)?;
        files.save_current(&meta, &tmp_data)?;
        snapshot.path = data_path;
        Ok((meta, snapshot))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let view = self.view.clone();
        let files = self.files.clone();
        let (meta, snapshot) =
            tokio::task::spawn_blocking(move || Self::build(view.as_ref(), &files))
                .await
                .map_err(|e| io_error("building a snapshot", e))?
                .map_err(|e| io_error("saving a snapshot", e))?;
        tracing::info!(dir = %self.files.dir().display(), meta = %meta, bytes = snapshot.len(), "built snapshot");
        Ok(Snapshot { meta, snapshot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(table: Table, key: &str, value: &str) -> Record {
        Record {
            table,
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        }
    }

    fn encode(records: &[Record]) -> Vec<u8> {
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

    fn read_all(data: &[u8]) -> std::io::Result<Vec<Record>> {
        let mut reader = RecordReader::new(data, data.len() as u64);
        let mut out = Vec::new();
        while let Some(r) = reader.next_record()? {
            out.push(r);
        }
        Ok(out)
    }

    #[test]
    fn records_read_back_in_order() {
        let records = vec![
            record(Table::Kv, "a", "1"),
            record(Table::Meta, "", ""),
            record(Table::Lease, "lease", "x"),
        ];
        let data = encode(&records);
        assert_eq!(
            data.len(),
            records.iter().map(Record::encoded_len).sum::<usize>()
        );
        assert_eq!(read_all(&data).unwrap(), records);
    }

    #[test]
    fn a_length_past_the_end_is_refused_before_allocating() {
        let mut data = vec![0u8];
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        let err = read_all(&data).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut cut = encode(&[record(Table::Kv, "key", "value")]);
        cut.pop();
        assert!(read_all(&cut).is_err());
    }

    #[test]
    fn an_unknown_table_is_refused() {
        let mut data = encode(&[record(Table::Kv, "k", "v")]);
        data[0] = 9;
        assert_eq!(
            read_all(&data).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn a_receiver_takes_exactly_the_announced_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut short = SnapshotReceiver::create(dir.path(), 4).unwrap();
        short.write(b"abc").unwrap();
        assert!(short.finish().is_err());
        let mut long = SnapshotReceiver::create(dir.path(), 2).unwrap();
        assert!(long.write(b"abc").is_err());
        drop(long);
        assert!(SnapshotReceiver::create(dir.path(), MAX_SNAPSHOT_BYTES + 1).is_err());

        let mut ok = SnapshotReceiver::create(dir.path(), 6).unwrap();
        ok.write(b"abc").unwrap();
        ok.write(b"def").unwrap();
        let snapshot = ok.finish().unwrap();
        assert_eq!(snapshot.len(), 6);
        assert_eq!(snapshot.chunk_at(2, 3).unwrap(), b"cde");
        assert_eq!(snapshot.chunk_at(4, 100).unwrap(), b"ef");
        drop(snapshot);
        // Every temporary file is gone: none was adopted.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn leftover_temporary_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("current.snap"), b"x").unwrap();
        std::fs::write(dir.path().join("current.snap.tmp"), b"x").unwrap();
        std::fs::write(dir.path().join("receiving-1-0.tmp"), b"x").unwrap();
        remove_temporary_files(dir.path()).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("current.snap")]);
    }
}

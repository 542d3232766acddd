//! The state machine's snapshot: the checkpoints and files that keep the
//! latest one in `<data-dir>/member/snap/`, its record format, and the
//! streaming reader and receiver.
//!
//! **Building** a snapshot (every `--snapshot-count` entries) takes an
//! engine checkpoint ([`Engine::checkpoint`]: RocksDB flushes its
//! memtables and hard-links its table files), so its cost does not grow
//! with the store: no scan, no copy, and apply goes on meanwhile. Its meta
//! (applied log id, membership) is read back from the checkpoint itself.
//! A checkpoint must not hold part of an entry: one that does (it caught
//! an entry applied in several engine batches) is taken again between
//! two entries, through the [`SnapshotFiles::entry_gate`] that apply holds
//! for each entry ([`SnapshotFiles::build`]). Writing every
//! key and revision out instead cost a member a whole scan and a file of
//! the store's size each time, and stretched the writes' p99.9 from 99 to
//! 354 ms at `--snapshot-count 5000` as the file grew to 102 MB.
//!
//! **Sending** one to a lagging follower reads the checkpoint twice: once
//! to measure its records (the stream's header announces their length),
//! then again as the stream sends them, in the format below, produced in
//! chunks on a thread a few chunks ahead ([`SnapshotData::source`],
//! [`Checkpoint::produce`]); no file is written. A **received** snapshot
//! is a records file: installing it makes it the current snapshot before
//! the tables are replaced, so a crash in between installs it again at the
//! next start. While it arrives, two threads read the same chunks into
//! what the install needs ([`SnapshotReceiver::prepare_install`]): the
//! engine's table files, and the key index of its revisions. The install
//! then ingests those files and takes that index, instead of reading the
//! file back and scanning the tables once they hold it.
//!
//! The format is a sequence of records `table u8 | key_len u32 | key |
//! value_len u32 | value` (big-endian lengths) of the state machine tables
//! ([`Table::STATE_MACHINE`]). A snapshot never sits in memory whole: the
//! sender reads chunks at their offsets, a follower writes the chunks it
//! receives to a temporary file ([`SnapshotReceiver`]) and installing reads
//! records back in bounded batches ([`RecordReader`]). Memory per snapshot
//! is a chunk or a batch, whatever the store's size (etcd's default quota
//! is 2 GiB).
//!
//! On disk: `snapshot.meta` names the current snapshot's data (a
//! `snapshot-*.ckpt` directory or a `snapshot-*.snap` file) and holds its
//! meta; it is replaced by a rename after the data is synced, and the
//! previous data is removed once no sender reads it. At start,
//! [`remove_leftovers`] removes what a crash left: data no meta names and
//! temporary files. A data dir of the previous layout (`current.meta` and
//! `current.snap`) is read as is until the next snapshot replaces it.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftSnapshotBuilder;

use super::{read_meta, KEY_APPLIED, KEY_APPLIED_PART, KEY_MEMBERSHIP};
use crate::codec;
use crate::engine::{BulkPair, Engine, EngineError, EngineRead, EngineResult, PreparedLoad, Table};
use crate::limits::{MAX_SNAPSHOT_BYTES, SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT};
use crate::mvcc::{IndexBuilder, PreparedIndex};
use crate::raft::log_store::io_error;
use crate::raft::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};

/// The file that names the current snapshot's data and holds its meta.
const META_FILE: &str = "snapshot.meta";
/// The previous layout's meta file (a bare [`SnapshotMeta`]).
const LEGACY_META_FILE: &str = "current.meta";
/// The previous layout's data file.
const LEGACY_DATA_FILE: &str = "current.snap";
/// Prefix of every snapshot's data (a checkpoint or a file).
const DATA_PREFIX: &str = "snapshot-";
/// Extension of a checkpoint directory.
const CHECKPOINT_EXTENSION: &str = "ckpt";
/// Extension of a records file.
const FILE_EXTENSION: &str = "snap";
/// Prefix of the temporary files snapshots are received into.
const RECEIVING_PREFIX: &str = "receiving-";
/// Prefix of the staging directories of table files to ingest.
const INGEST_PREFIX: &str = "ingest-";
/// Prefix of the temporary files checkpoints are written out to be sent.
const SENDING_PREFIX: &str = "sending-";
/// Extension of every temporary file in the snapshot directory (RocksDB
/// also builds a checkpoint in `<name>.tmp` before it renames it).
const TEMP_EXTENSION: &str = "tmp";
/// Buffer of the writers and readers of records files.
const FILE_BUFFER_BYTES: usize = 1024 * 1024;

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Distinguishes the names of files and checkpoints made by this process.
static NAMES: AtomicU64 = AtomicU64::new(0);

/// A name no earlier snapshot or temporary file of this directory has:
/// the time in nanoseconds, the process id and a counter.
fn unique_name(prefix: &str, extension: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = NAMES.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{nanos}-{}-{n}.{extension}", std::process::id())
}

/// A new staging directory for the table files of an install's bulk load,
/// in the snapshot directory `dir` (on the engine's file system, so
/// ingesting them links instead of copying); temporary, so a start removes
/// what a crash left.
fn staging_dir_in(dir: &Path) -> PathBuf {
    dir.join(unique_name(INGEST_PREFIX, TEMP_EXTENSION))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A snapshot's data as openraft passes it around: a checkpoint of this
/// member's engine, or records in a file (received, or written out to be
/// sent). Clones share the data.
#[derive(Debug, Clone)]
pub enum SnapshotData {
    /// Records in a file.
    File(Arc<SnapshotFile>),
    /// An engine checkpoint, written out as records only to be sent.
    Checkpoint(Arc<Checkpoint>),
}

impl SnapshotData {
    /// The records in a file: this file, or a checkpoint's written out to
    /// a temporary file beside it (a blocking scan of the checkpoint).
    pub fn encoded(&self) -> std::io::Result<Arc<SnapshotFile>> {
        match self {
            Self::File(file) => Ok(file.clone()),
            Self::Checkpoint(checkpoint) => checkpoint.encode().map(Arc::new),
        }
    }

    /// What a sender streams (blocking): a file as it is; a checkpoint's
    /// records produced as they are sent ([`Checkpoint::measure`] first:
    /// the stream's header announces their length), with no file written.
    pub fn source(&self) -> std::io::Result<SnapshotSource> {
        match self {
            Self::File(file) => Ok(SnapshotSource::File(file.clone())),
            Self::Checkpoint(checkpoint) => Ok(SnapshotSource::Checkpoint {
                len: checkpoint.measure()?,
                checkpoint: checkpoint.clone(),
            }),
        }
    }

    /// The file or directory that holds the data.
    fn path(&self) -> &Path {
        match self {
            Self::File(file) => &file.path,
            Self::Checkpoint(checkpoint) => &checkpoint.path,
        }
    }
}

/// An engine checkpoint that is (or was) a snapshot. Once a newer
/// snapshot replaced it, the directory is removed when the last reader
/// (a sender writing it out) lets go.
pub struct Checkpoint {
    path: PathBuf,
    engine: Arc<dyn Engine>,
    retired: AtomicBool,
    /// Its records' length, once measured ([`Checkpoint::measure`]): the
    /// checkpoint never changes, so a later send skips the pass.
    measured: std::sync::OnceLock<u64>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// The checkpoint of `engine` in `path`.
    fn new(path: PathBuf, engine: Arc<dyn Engine>) -> Arc<Self> {
        Arc::new(Self {
            path,
            engine,
            retired: AtomicBool::new(false),
            measured: std::sync::OnceLock::new(),
        })
    }

    fn open(&self) -> std::io::Result<Arc<dyn EngineRead>> {
        self.engine
            .open_checkpoint(&self.path)
            .map_err(|e| io_error("opening a snapshot checkpoint", e))
    }

    /// The checkpoint's state machine tables written out to a temporary
    /// records file in the snapshot directory.
    fn encode(&self) -> std::io::Result<SnapshotFile> {
        let started = std::time::Instant::now();
        let view = self.open()?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        // Temporary from the start, so an error below removes the file.
        let (mut snapshot, file) = SnapshotFile::create_temporary(dir, SENDING_PREFIX)?;
        let mut out = BufWriter::with_capacity(FILE_BUFFER_BYTES, file);
        encode_records(view.as_ref(), &mut out)?;
        out.flush()?;
        snapshot.len = snapshot.file.metadata()?.len();
        tracing::info!(
            bytes = snapshot.len,
            took_ms = started.elapsed().as_millis() as u64,
            "wrote a snapshot out to send"
        );
        Ok(snapshot)
    }
}

/// A snapshot's records as a sender streams them ([`SnapshotData::source`]).
pub enum SnapshotSource {
    /// Records in a file, read in chunks at their offsets.
    File(Arc<SnapshotFile>),
    /// A checkpoint's records, `len` bytes, produced as they are sent
    /// ([`Checkpoint::produce`]).
    Checkpoint {
        /// The checkpoint.
        checkpoint: Arc<Checkpoint>,
        /// Its records' length ([`Checkpoint::measure`]).
        len: u64,
    },
}

impl SnapshotSource {
    /// The records' length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::File(file) => file.len(),
            Self::Checkpoint { len, .. } => *len,
        }
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Checkpoint {
    /// The length of the checkpoint's records: one pass over it that
    /// reads but writes nothing, the first time it is sent.
    fn measure(&self) -> std::io::Result<u64> {
        if let Some(len) = self.measured.get() {
            return Ok(*len);
        }
        let started = std::time::Instant::now();
        let view = self.open()?;
        let mut counter = ByteCounter(0);
        encode_records(view.as_ref(), &mut counter)?;
        tracing::info!(
            bytes = counter.0,
            took_ms = started.elapsed().as_millis() as u64,
            "measured a snapshot to send"
        );
        Ok(*self.measured.get_or_init(|| counter.0))
    }

    /// Produces the checkpoint's records on a thread of its own, in chunks
    /// of `chunk_bytes` sent to the returned queue (of `in_flight` chunks:
    /// the thread waits while the queue is full). A read error is the
    /// last item; the thread stops when the queue's reader is dropped.
    pub fn produce(
        self: &Arc<Self>,
        chunk_bytes: usize,
        in_flight: usize,
    ) -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(in_flight);
        let checkpoint = self.clone();
        let spawned = std::thread::Builder::new()
            .name("snapshot-send".into())
            .spawn({
                let tx = tx.clone();
                move || {
                    let started = std::time::Instant::now();
                    let mut sink = ChunkSink {
                        chunk: Vec::with_capacity(chunk_bytes),
                        chunk_bytes,
                        queue: tx.clone(),
                    };
                    let produced = checkpoint
                        .open()
                        .and_then(|view| encode_records(view.as_ref(), &mut sink))
                        .and_then(|()| sink.flush());
                    match produced {
                        Ok(()) => tracing::info!(
                            took_ms = started.elapsed().as_millis() as u64,
                            "streamed a snapshot"
                        ),
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e));
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            let _ = tx.try_send(Err(e));
        }
        rx
    }
}

/// A `Write` that only counts the bytes.
struct ByteCounter(u64);

impl Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `Write` that cuts what it is given into chunks sent to a queue; a
/// gone reader fails the write, which ends the producer.
struct ChunkSink {
    chunk: Vec<u8>,
    chunk_bytes: usize,
    queue: tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>,
}

impl Write for ChunkSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.chunk_bytes - self.chunk.len());
        self.chunk.extend_from_slice(&buf[..n]);
        if self.chunk.len() == self.chunk_bytes {
            self.flush()?;
        }
        Ok(n)
    }

    /// Sends the chunk so far, if any.
    fn flush(&mut self) -> std::io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.chunk, Vec::with_capacity(self.chunk_bytes));
        self.queue.blocking_send(Ok(full)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the snapshot's send ended")
        })
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            remove_in_background(self.path.clone());
        }
    }
}

/// Bytes freed per step when a replaced snapshot is removed, and the pause
/// after each step (80 MiB/s). A checkpoint whose table files a defragment
/// replaced is the last link to a whole copy of the store. Freed at once
/// (or even at 1.3 GB/s), a gigabyte held up every member's fsync on the
/// file system for 0.4-0.8 s: on a file system mounted with `discard`
/// (ext4's online discard), the journal commit that an fsync waits for
/// discards every block freed since the last one.
const REMOVE_STEP_BYTES: u64 = 16 * 1024 * 1024;
const REMOVE_STEP_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Removes `path` (a replaced snapshot's file or checkpoint directory):
/// at once if it holds at most [`REMOVE_STEP_BYTES`], else on a thread of
/// its own, freeing large files gradually.
fn remove_in_background(path: PathBuf) {
    if bytes_under(&path) <= REMOVE_STEP_BYTES {
        return remove_logging_failure(&path);
    }
    let spawned = std::thread::Builder::new()
        .name("snapshot-remove".into())
        .spawn({
            let path = path.clone();
            move || remove_logging_failure(&path)
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to remove a replaced snapshot; removing it now");
        remove_logging_failure(&path);
    }
}

/// [`remove_gradually`], a failure logged (nothing waits for the removal).
fn remove_logging_failure(path: &Path) {
    if let Err(e) = remove_gradually(path) {
        tracing::warn!(path = %path.display(), error = %e, "removing a replaced snapshot");
    }
}

/// Bytes of the files at `path` (a file, or a directory's files); 0 for
/// what cannot be read.
fn bytes_under(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| bytes_under(&e.path()))
                    .sum()
            })
            .unwrap_or(0),
        Ok(meta) => meta.len(),
        Err(_) => 0,
    }
}

/// Removes a file or a directory of files, first shrinking each file that
/// has no other link (a table file the engine still uses is only unlinked)
/// by [`REMOVE_STEP_BYTES`] at a time.
fn remove_gradually(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            remove_gradually(&entry?.path())?;
        }
        return std::fs::remove_dir(path);
    }
    if meta.is_file() && meta.nlink() == 1 && meta.len() > REMOVE_STEP_BYTES {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        let mut len = meta.len();
        while len > REMOVE_STEP_BYTES {
            len -= REMOVE_STEP_BYTES;
            file.set_len(len)?;
            std::thread::sleep(REMOVE_STEP_PAUSE);
        }
    }
    remove_if_present(path)
}

/// A snapshot's records in a file. The file is open, so removing or
/// replacing the path does not change what a reader of this one sees. A
/// temporary file (one being received or sent) is removed when dropped
/// unless it was adopted as the current snapshot.
#[derive(Debug)]
pub struct SnapshotFile {
    file: Arc<File>,
    path: PathBuf,
    len: u64,
    temporary: bool,
    /// The install read from the records as they were received, if it
    /// was prepared ([`SnapshotReceiver::prepare_install`]).
    prepared: Mutex<Option<PreparedInstall>>,
}

impl SnapshotFile {
    /// Opens the records file at `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Self {
            file: Arc::new(file),
            path: path.to_path_buf(),
            len,
            temporary: false,
            prepared: Mutex::default(),
        })
    }

    /// A new, empty temporary file in `dir` named with `prefix` (removed
    /// when dropped), and a handle to write it.
    fn create_temporary(dir: &Path, prefix: &str) -> std::io::Result<(Self, File)> {
        let path = dir.join(unique_name(prefix, TEMP_EXTENSION));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let snapshot = Self {
            file: Arc::new(file.try_clone()?),
            path,
            len: 0,
            temporary: true,
            prepared: Mutex::default(),
        };
        Ok((snapshot, file))
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

    /// This file as a synced, permanent file named `name` in `dir`: a
    /// temporary file there is renamed, any other file is copied (one
    /// still shared, one of another directory, another member's).
    fn persist(this: Arc<Self>, dir: &Path, name: &str) -> std::io::Result<SnapshotFile> {
        let path = dir.join(name);
        let this = match Arc::try_unwrap(this) {
            Ok(mut own) if own.temporary && own.path.parent() == Some(dir) => {
                own.file.sync_all()?;
                std::fs::rename(&own.path, &path)?;
                own.temporary = false;
                own.path = path;
                return Ok(own);
            }
            Ok(own) => Arc::new(own),
            Err(shared) => shared,
        };
        let mut out = File::create(&path)?;
        std::io::copy(&mut this.reader(), &mut out)?;
        out.sync_all()?;
        let copy = Self::open(&path)?;
        *lock(&copy.prepared) = this.take_prepared();
        Ok(copy)
    }

    /// The install prepared while the records arrived, once.
    pub fn take_prepared(&self) -> Option<PreparedInstall> {
        lock(&self.prepared).take()
    }
}

impl Drop for SnapshotFile {
    fn drop(&mut self) {
        if !self.temporary {
            return;
        }
        if Arc::strong_count(&self.file) == 1 {
            // Nothing reads it any more (a file written out to be sent, as
            // large as the store): free it gradually.
            remove_in_background(self.path.clone());
        } else {
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

/// What `snapshot.meta` holds.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SavedMeta {
    meta: SnapshotMeta,
    /// The data's name in the snapshot directory.
    data: String,
}

/// The current snapshot.
#[derive(Debug, Clone)]
struct Current {
    meta: SnapshotMeta,
    data: SnapshotData,
}

/// The decoded file `name` of `dir`, if it exists.
fn read_meta_file<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
) -> std::io::Result<Option<T>> {
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => codec::decode(&bytes)
            .map(Some)
            .map_err(|e| io_error("reading the snapshot meta", e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the current snapshot's meta and data from `dir`: `snapshot.meta`,
/// else the previous layout's files.
fn load_current(dir: &Path, engine: &Arc<dyn Engine>) -> std::io::Result<Option<Current>> {
    let (meta, name) = if let Some(saved) = read_meta_file::<SavedMeta>(dir, META_FILE)? {
        (saved.meta, saved.data)
    } else if let Some(meta) = read_meta_file::<SnapshotMeta>(dir, LEGACY_META_FILE)? {
        (meta, LEGACY_DATA_FILE.to_string())
    } else {
        return Ok(None);
    };
    let path = dir.join(&name);
    let data = if name.ends_with(&format!(".{CHECKPOINT_EXTENSION}")) {
        if !path.is_dir() {
            return Err(invalid("the snapshot's checkpoint is missing"));
        }
        SnapshotData::Checkpoint(Checkpoint::new(path, engine.clone()))
    } else {
        SnapshotData::File(Arc::new(SnapshotFile::open(&path)?))
    };
    Ok(Some(Current { meta, data }))
}

/// Held by apply for each entry and by a checkpoint taken between
/// entries, so such a checkpoint never holds part of an entry.
#[derive(Debug, Default)]
pub struct EntryGate(Mutex<()>);

impl EntryGate {
    /// Holds the gate until the guard is dropped.
    pub fn hold(&self) -> MutexGuard<'_, ()> {
        lock(&self.0)
    }
}

/// The current snapshot in memory, read from disk on first use.
#[derive(Debug)]
enum Slot {
    Unread,
    Read(Option<Current>),
}

impl Slot {
    /// The current snapshot, once read.
    fn get(&self) -> Option<&Current> {
        match self {
            Slot::Read(current) => current.as_ref(),
            Slot::Unread => None,
        }
    }
}

/// The snapshot directory and the current snapshot. Replacing the current
/// snapshot and reading it take one lock, so a reader gets a meta and the
/// data it describes, whatever a concurrent build or install does.
#[derive(Clone)]
pub struct SnapshotFiles {
    dir: PathBuf,
    engine: Arc<dyn Engine>,
    current: Arc<Mutex<Slot>>,
    /// Shared with apply (see [`EntryGate`]).
    entry_gate: Arc<EntryGate>,
}

impl std::fmt::Debug for SnapshotFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotFiles")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SnapshotFiles {
    /// The snapshots of `engine`'s state machine in `dir`.
    pub fn new(dir: PathBuf, engine: Arc<dyn Engine>) -> Self {
        Self {
            dir,
            engine,
            current: Arc::new(Mutex::new(Slot::Unread)),
            entry_gate: Arc::default(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new staging directory in this snapshot directory
    /// ([`staging_dir_in`]).
    pub(super) fn staging_dir(&self) -> PathBuf {
        staging_dir_in(&self.dir)
    }

    /// The gate apply holds while it applies one entry.
    pub(super) fn entry_gate(&self) -> Arc<EntryGate> {
        self.entry_gate.clone()
    }

    fn locked_current(&self) -> std::io::Result<MutexGuard<'_, Slot>> {
        let mut slot = lock(&self.current);
        if let Slot::Unread = *slot {
            *slot = Slot::Read(load_current(&self.dir, &self.engine)?);
        }
        Ok(slot)
    }

    /// The current snapshot's meta and data, if there is one.
    pub fn current(&self) -> std::io::Result<Option<(SnapshotMeta, SnapshotData)>> {
        let slot = self.locked_current()?;
        Ok(slot.get().map(|c| (c.meta.clone(), c.data.clone())))
    }

    /// Whether `data` is the current snapshot's.
    fn is_current(&self, data: &SnapshotData) -> std::io::Result<bool> {
        let slot = self.locked_current()?;
        Ok(slot.get().is_some_and(|c| c.data.path() == data.path()))
    }

    /// Makes the synced `data`, named `name` in the directory, the current
    /// snapshot with `meta`, unless the current one is newer (a build that
    /// an install overtook): `snapshot.meta` is written to a synced
    /// temporary file and renamed into place, then the previous data is
    /// retired. Data that does not become current is retired itself.
    fn make_current(
        &self,
        meta: &SnapshotMeta,
        name: &str,
        data: SnapshotData,
    ) -> std::io::Result<()> {
        let saved = codec::encode(&SavedMeta {
            meta: meta.clone(),
            data: name.to_string(),
        });
        let tmp = self
            .dir
            .join(format!("{META_FILE}.{}", unique_name("", TEMP_EXTENSION)));
        std::fs::write(&tmp, saved)?;
        File::open(&tmp)?.sync_all()?;
        let mut slot = self.locked_current()?;
        let previous = slot.get().cloned();
        if previous
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > meta.last_log_id)
        {
            std::fs::remove_file(&tmp)?;
            retire(&data);
            return Ok(());
        }
        std::fs::rename(&tmp, self.dir.join(META_FILE))?;
        sync_dir(&self.dir)?;
        *slot = Slot::Read(Some(Current {
            meta: meta.clone(),
            data: data.clone(),
        }));
        drop(slot);
        if let Some(previous) = previous {
            if previous.data.path() != data.path() {
                retire(&previous.data);
            }
        }
        for legacy in [LEGACY_META_FILE, LEGACY_DATA_FILE] {
            remove_if_present(&self.dir.join(legacy))?;
        }
        Ok(())
    }

    /// Takes a checkpoint and reads its meta back; `None` (and the
    /// checkpoint removed) if it holds part of an entry. With `gated`, it
    /// is taken between two entries (apply waits meanwhile).
    fn checkpoint(
        &self,
        gated: bool,
    ) -> std::io::Result<Option<(SnapshotMeta, SnapshotData, String)>> {
        let name = unique_name(DATA_PREFIX, CHECKPOINT_EXTENSION);
        let path = self.dir.join(&name);
        {
            let _between_entries = gated.then(|| self.entry_gate.hold());
            self.engine
                .checkpoint(&path)
                .map_err(|e| io_error("taking a snapshot checkpoint", e))?;
        }
        let checkpoint = Checkpoint::new(path, self.engine.clone());
        let view = checkpoint.open()?;
        if view
            .get(Table::Meta, KEY_APPLIED_PART)
            .map_err(|e| io_error("reading a checkpoint", e))?
            .is_some()
        {
            drop(view);
            checkpoint.retired.store(true, Ordering::Release);
            return Ok(None);
        }
        let applied: Option<LogId> =
            read_meta::<Option<LogId>>(view.as_ref(), KEY_APPLIED)?.flatten();
        let membership: StoredMembership =
            read_meta(view.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
        };
        Ok(Some((meta, SnapshotData::Checkpoint(checkpoint), name)))
    }

    /// Takes a checkpoint at an entry boundary and makes it the current
    /// snapshot (blocking). The first try does not stop apply: a
    /// checkpoint lands between entries unless it catches an entry applied
    /// in several engine batches (an auth, alarm or member proposal among
    /// key-value ones), which the progress key `sm/applied_part` shows;
    /// then a second one is taken through the entry gate, with little
    /// left to flush after the first.
    fn build(&self) -> std::io::Result<(SnapshotMeta, SnapshotData)> {
        std::fs::create_dir_all(&self.dir)?;
        let started = std::time::Instant::now();
        let (gated, (meta, data, name)) = match self.checkpoint(false)? {
            Some(taken) => (false, taken),
            None => match self.checkpoint(true)? {
                Some(taken) => (true, taken),
                None => return Err(invalid("a checkpoint between entries holds part of one")),
            },
        };
        self.make_current(&meta, &name, data.clone())?;
        tracing::info!(
            dir = %self.dir.display(),
            meta = %meta,
            between_entries_by_gate = gated,
            took_ms = started.elapsed().as_millis() as u64,
            "built snapshot"
        );
        Ok((meta, data))
    }

    /// After an install has replaced the tables with `installed`'s records:
    /// a checkpoint of them becomes the current snapshot in place of the
    /// received file, which is removed. A checkpoint shares its table files
    /// with the engine, so a member that caught up by snapshot no longer
    /// keeps the store twice on disk (a records file as large as the
    /// store, until its next snapshot). The caller holds the entry gate.
    /// On failure the file stays current, as before.
    pub(super) fn replace_installed_file(&self, installed: &SnapshotMeta) -> std::io::Result<()> {
        let Some((meta, data, name)) = self.checkpoint(false)? else {
            return Err(invalid("the installed tables hold part of an entry"));
        };
        if meta.last_log_id != installed.last_log_id {
            if let SnapshotData::Checkpoint(c) = &data {
                c.retired.store(true, Ordering::Release);
            }
            return Err(invalid(
                "the installed tables are not at the snapshot's log id",
            ));
        }
        self.make_current(&meta, &name, data)
    }

    /// Makes a snapshot to be installed the current one, unless it already
    /// is (one restored at start), and returns its records: a received
    /// file is moved into place, another member's checkpoint (openraft's
    /// storage suite installs one store's snapshot into another) is
    /// written out first. Blocking.
    pub(super) fn adopt(
        &self,
        meta: &SnapshotMeta,
        data: SnapshotData,
    ) -> std::io::Result<Arc<SnapshotFile>> {
        if self.is_current(&data)? {
            return data.encoded();
        }
        std::fs::create_dir_all(&self.dir)?;
        let file = match data {
            SnapshotData::File(file) => file,
            SnapshotData::Checkpoint(checkpoint) => Arc::new(checkpoint.encode()?),
        };
        let name = unique_name(DATA_PREFIX, FILE_EXTENSION);
        let file = Arc::new(SnapshotFile::persist(file, &self.dir, &name)?);
        sync_dir(&self.dir)?;
        self.make_current(meta, &name, SnapshotData::File(file.clone()))?;
        Ok(file)
    }
}

/// Marks data a newer snapshot replaced for removal: a checkpoint goes
/// when its last reader lets go, a file now (its readers hold it open).
fn retire(data: &SnapshotData) {
    match data {
        SnapshotData::Checkpoint(checkpoint) => checkpoint.retired.store(true, Ordering::Release),
        SnapshotData::File(file) => {
            if let Err(e) = remove_if_present(&file.path) {
                tracing::warn!(path = %file.path.display(), error = %e, "removing a replaced snapshot");
            }
        }
    }
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes what a crash left in the snapshot directory: temporary files
/// and checkpoints, snapshot data that `snapshot.meta` does not name, and
/// the previous layout's files once `snapshot.meta` exists.
pub fn remove_leftovers(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let current = read_meta_file::<SavedMeta>(dir, META_FILE)?.map(|saved| saved.data);
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let temporary = name.ends_with(&format!(".{TEMP_EXTENSION}"));
        let stale_data = name.starts_with(DATA_PREFIX) && current.as_deref() != Some(name.as_str());
        let stale_legacy =
            current.is_some() && [LEGACY_META_FILE, LEGACY_DATA_FILE].contains(&name.as_str());
        if !(temporary || stale_data || stale_legacy) {
            continue;
        }
        let path = entry.path();
        tracing::info!(path = %path.display(), "removing a leftover snapshot file");
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
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

/// Writes a snapshot arriving in chunks to a temporary file in the
/// snapshot directory, refusing more than the sender announced and more
/// than [`MAX_SNAPSHOT_BYTES`]. The file is removed if the receive fails.
/// With [`SnapshotReceiver::prepare_install`], the records are also read
/// as they arrive into what installing them needs.
pub struct SnapshotReceiver {
    file: BufWriter<File>,
    /// The file being received; its `len` counts the bytes so far.
    snapshot: SnapshotFile,
    expected: u64,
    preparing: Option<Preparing>,
}

impl SnapshotReceiver {
    /// Starts receiving a snapshot of `expected` bytes into `dir`.
    pub fn create(dir: &Path, expected: u64) -> std::io::Result<Self> {
        if expected > MAX_SNAPSHOT_BYTES {
            return Err(invalid("snapshot larger than the member's limit"));
        }
        std::fs::create_dir_all(dir)?;
        let (snapshot, file) = SnapshotFile::create_temporary(dir, RECEIVING_PREFIX)?;
        Ok(Self {
            file: BufWriter::with_capacity(FILE_BUFFER_BYTES, file),
            snapshot,
            expected,
            preparing: None,
        })
    }

    /// Prepares the install on two threads while the chunks arrive: one
    /// writes the records into `engine`'s table files (in a staging
    /// directory beside the file, [`Engine::prepare_load`]), the other
    /// builds the key index from the `kv` records ([`IndexBuilder`]). An
    /// install of the received file then ingests those files and takes
    /// that index instead of reading the records back and scanning the
    /// tables. A failed preparation only falls back to that.
    pub fn prepare_install(&mut self, engine: Arc<dyn Engine>) -> std::io::Result<()> {
        let staging = staging_dir_in(self.snapshot.path.parent().unwrap_or(Path::new(".")));
        let expected = self.expected;
        let load = Feed::start("snapshot-load", expected, move |records| {
            let mut next = installed_pairs(records);
            engine
                .prepare_load(&staging, &mut next)
                .map_err(|e| io_error("writing a received snapshot's table files", e))
        })?;
        let index = Feed::start("snapshot-index", expected, |records| {
            let mut builder = IndexBuilder::default();
            while let Some(record) = records.next_record()? {
                if record.table == Table::Kv {
                    builder
                        .push(&record.key, &record.value)
                        .map_err(|e| io_error("indexing a received snapshot", e))?;
                }
            }
            Ok(builder.finish())
        })?;
        self.preparing = Some(Preparing { load, index });
        Ok(())
    }

    /// Appends `chunk` (a blocking write; it waits for the preparing
    /// threads when they are [`SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT`] chunks
    /// behind).
    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.write_owned(chunk.to_vec())
    }

    /// [`SnapshotReceiver::write`] of a chunk the caller gives up (the
    /// preparing threads share it instead of a copy).
    pub fn write_owned(&mut self, chunk: Vec<u8>) -> std::io::Result<()> {
        if self.snapshot.len + chunk.len() as u64 > self.expected {
            return Err(invalid("snapshot longer than announced"));
        }
        self.file.write_all(&chunk)?;
        self.snapshot.len += chunk.len() as u64;
        if let Some(preparing) = &mut self.preparing {
            let chunk = Arc::new(chunk);
            preparing.load.send(&chunk);
            preparing.index.send(&chunk);
        }
        Ok(())
    }

    /// The received snapshot, once every announced byte arrived (and the
    /// preparing threads, if any, are done with it).
    pub fn finish(mut self) -> std::io::Result<SnapshotFile> {
        if self.snapshot.len != self.expected {
            return Err(invalid("snapshot shorter than announced"));
        }
        self.file.flush()?;
        if let Some(Preparing { load, index }) = self.preparing.take() {
            let (load, index) = (load.finish(), index.finish());
            if let (Some(load), Some(index)) = (load, index) {
                *lock(&self.snapshot.prepared) = Some(PreparedInstall { load, index });
            }
        }
        Ok(self.snapshot)
    }
}

/// What installing a received snapshot needs, read from its records as
/// they arrived ([`SnapshotReceiver::prepare_install`]).
pub struct PreparedInstall {
    /// The records as table files, ready to ingest.
    pub load: PreparedLoad,
    /// The key index of the `kv` records.
    pub index: PreparedIndex,
}

impl std::fmt::Debug for PreparedInstall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedInstall")
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// The two threads of [`SnapshotReceiver::prepare_install`].
struct Preparing {
    load: Feed<PreparedLoad>,
    index: Feed<PreparedIndex>,
}

/// A thread reading the received records from a queue of chunks.
struct Feed<T> {
    /// The queue; gone once the thread stopped taking chunks (it failed).
    chunks: Option<SyncSender<Arc<Vec<u8>>>>,
    thread: std::thread::JoinHandle<std::io::Result<T>>,
}

impl<T: Send + 'static> Feed<T> {
    /// Starts `work` on a thread named `name`, reading the `len` bytes of
    /// records the chunks sent to it hold.
    fn start(
        name: &str,
        len: u64,
        work: impl FnOnce(&mut RecordReader<ChunkReader>) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut records = RecordReader::new(ChunkReader::new(rx), len);
                work(&mut records)
            })?;
        Ok(Self {
            chunks: Some(tx),
            thread,
        })
    }

    fn send(&mut self, chunk: &Arc<Vec<u8>>) {
        let stopped = match &self.chunks {
            Some(chunks) => chunks.send(chunk.clone()).is_err(),
            None => false,
        };
        if stopped {
            self.chunks = None;
        }
    }

    /// What the thread made of every chunk sent, or `None` (logged) if it
    /// failed.
    fn finish(mut self) -> Option<T> {
        self.chunks = None;
        let name = self.thread.thread().name().unwrap_or_default().to_string();
        match self.thread.join() {
            Ok(Ok(done)) => Some(done),
            Ok(Err(e)) => {
                tracing::warn!(thread = %name, error = %e, "preparing a snapshot's install failed; it reads the file instead");
                None
            }
            Err(_) => {
                tracing::warn!(thread = %name, "preparing a snapshot's install panicked; it reads the file instead");
                None
            }
        }
    }
}

/// `Read` over the chunks a [`Feed`] receives; the end of the queue (the
/// receiver done or gone) is the end of the input.
struct ChunkReader {
    chunks: Receiver<Arc<Vec<u8>>>,
    current: Arc<Vec<u8>>,
    offset: usize,
}

impl ChunkReader {
    fn new(chunks: Receiver<Arc<Vec<u8>>>) -> Self {
        Self {
            chunks,
            current: Arc::default(),
            offset: 0,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.offset == self.current.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.current = chunk;
                    self.offset = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.offset);
        buf[..n].copy_from_slice(&self.current[self.offset..self.offset + n]);
        self.offset += n;
        Ok(n)
    }
}

/// The pairs of `records` an install loads into the tables: all but the
/// meta keys that record how far the state machine is applied (the
/// install writes its own).
pub(super) fn installed_pairs<R: Read>(
    records: &mut RecordReader<R>,
) -> impl FnMut() -> EngineResult<Option<BulkPair>> + '_ {
    move || loop {
        let record = records
            .next_record()
            .map_err(|e| EngineError::Backend(Box::new(e)))?;
        match record {
            Some(r) if r.table == Table::Meta && PROGRESS_KEYS.contains(&&r.key[..]) => {}
            Some(r) => return Ok(Some((r.table, r.key, r.value))),
            None => return Ok(None),
        }
    }
}

/// Meta keys that record how far the state machine is applied.
const PROGRESS_KEYS: [&[u8]; 3] = [KEY_APPLIED, KEY_MEMBERSHIP, KEY_APPLIED_PART];

/// Builds a snapshot: a checkpoint of the engine (module docs).
pub struct SnapshotBuilder {
    pub(super) files: SnapshotFiles,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let files = self.files.clone();
        let (meta, snapshot) = tokio::task::spawn_blocking(move || files.build())
            .await
            .map_err(|e| io_error("building a snapshot", e))?
            .map_err(|e| io_error("saving a snapshot", e))?;
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

    /// The records of a small store: puts (one leased, one key written
    /// twice), a tombstone, a lease, and the meta keys an install skips.
    fn store_records() -> Vec<Record> {
        use crate::mvcc::Revision;
        use etcd_proto::mvccpb::KeyValue;
        use prost::Message;
        let kv = |main: i64, key: &str, version: i64, create: i64, lease: i64| KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: main,
            version,
            value: format!("value of {key} at {main}").into_bytes(),
            lease,
        };
        let mut records: Vec<Record> = [
            (kv(2, "a", 1, 2, 0), false),
            (kv(3, "b", 1, 3, 7), false),
            (kv(4, "a", 2, 2, 0), false),
            (kv(5, "c", 1, 5, 0), false),
            (
                KeyValue {
                    key: b"c".to_vec(),
                    mod_revision: 6,
                    ..KeyValue::default()
                },
                true,
            ),
        ]
        .into_iter()
        .map(|(kv, tombstone)| Record {
            table: Table::Kv,
            key: Revision::new(kv.mod_revision, 0).to_key(tombstone),
            value: kv.encode_to_vec(),
        })
        .collect();
        records.push(Record {
            table: Table::Meta,
            key: KEY_APPLIED.to_vec(),
            value: b"the sender's".to_vec(),
        });
        records.push(record(Table::Meta, "mvcc/currentRev", "\0\0\0\0\0\0\0\x06"));
        records.push(record(Table::Lease, "\0\0\0\0\0\0\0\x07", "ttl"));
        records
    }

    fn rocks_engine(dir: &Path) -> Arc<dyn Engine> {
        Arc::new(crate::engine::rocks::RocksEngine::open(dir).unwrap())
    }

    #[test]
    fn a_prepared_receive_ingests_and_indexes_what_the_file_would() {
        let dir = tempfile::tempdir().unwrap();
        let data = encode(&store_records());
        let mut receiver = SnapshotReceiver::create(dir.path(), data.len() as u64).unwrap();
        receiver
            .prepare_install(rocks_engine(&dir.path().join("prepared")))
            .unwrap();
        for chunk in data.chunks(7) {
            receiver.write(chunk).unwrap();
        }
        let received = receiver.finish().unwrap();
        let prepared = received.take_prepared().expect("prepared while received");
        assert!(received.take_prepared().is_none(), "taken once");

        // The same records read back from the file, loaded the slow way.
        let slow = rocks_engine(&dir.path().join("slow"));
        let mut records = received.records();
        slow.bulk_load(
            &dir.path().join("staging"),
            &mut installed_pairs(&mut records),
        )
        .unwrap();
        let fast = rocks_engine(&dir.path().join("prepared"));
        fast.ingest(prepared.load).unwrap();
        for table in Table::STATE_MACHINE {
            let all = |e: &Arc<dyn Engine>| {
                crate::engine::scan_collect(e.as_ref(), table, b"", None, 0).unwrap()
            };
            assert_eq!(all(&fast), all(&slow), "{table:?}");
        }
        assert_eq!(fast.get(Table::Meta, KEY_APPLIED).unwrap(), None);

        let by_scan = crate::mvcc::MvccStore::open(slow).unwrap();
        let by_prepared = crate::mvcc::MvccStore::open(fast).unwrap();
        by_prepared.reload_with(Some(prepared.index)).unwrap();
        let everything = crate::mvcc::KeyRange::new(b"\0", b"\0");
        for rev in [0, 2, 3, 4, 5, 6] {
            let opts = crate::mvcc::RangeOptions {
                rev,
                ..Default::default()
            };
            assert_eq!(
                by_prepared.range(&everything, opts).unwrap().kvs,
                by_scan.range(&everything, opts).unwrap().kvs,
                "at revision {rev}"
            );
        }
        assert_eq!(by_prepared.current_revision(), 6);
        assert_eq!(
            by_prepared.take_reloaded_leased_keys(),
            vec![(b"b".to_vec(), 7)]
        );
        // Ingesting moved the table files out; the staging directory went
        // with the load.
        let staged: Vec<String> = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with(INGEST_PREFIX))
            .collect();
        assert!(staged.is_empty(), "{staged:?}");
    }

    #[test]
    fn a_failed_preparation_leaves_the_received_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = encode(&store_records());
        data.extend_from_slice(&[200, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mut receiver = SnapshotReceiver::create(dir.path(), data.len() as u64).unwrap();
        receiver
            .prepare_install(rocks_engine(&dir.path().join("db")))
            .unwrap();
        receiver.write(&data).unwrap();
        let received = receiver.finish().unwrap();
        assert!(received.take_prepared().is_none());
        assert_eq!(received.len(), data.len() as u64);
        let left: Vec<String> = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with(INGEST_PREFIX))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    fn memory_files(dir: &Path) -> (Arc<dyn Engine>, SnapshotFiles) {
        let engine: Arc<dyn Engine> = Arc::new(crate::engine::memory::MemoryEngine::new());
        (
            engine.clone(),
            SnapshotFiles::new(dir.to_path_buf(), engine),
        )
    }

    fn applied_batch(index: u64, key: &str) -> crate::engine::WriteBatch {
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

    fn put_applied(engine: &dyn Engine, index: u64, key: &str) {
        engine.write(applied_batch(index, key), true).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A replaced checkpoint goes file by file; a large file with no other
    /// link shrinks in steps, one the engine still links is only unlinked.
    #[test]
    fn removal_shrinks_only_unshared_files() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("snapshot-1.ckpt");
        std::fs::create_dir(&checkpoint).unwrap();
        let big = REMOVE_STEP_BYTES * 2 + 1;
        let own = File::create(checkpoint.join("own.sst")).unwrap();
        own.set_len(big).unwrap();
        let engine_file = dir.path().join("engine.sst");
        File::create(&engine_file).unwrap().set_len(big).unwrap();
        std::fs::hard_link(&engine_file, checkpoint.join("shared.sst")).unwrap();
        assert_eq!(bytes_under(&checkpoint), 2 * big);

        remove_gradually(&checkpoint).unwrap();
        assert!(!checkpoint.exists());
        assert_eq!(std::fs::metadata(&engine_file).unwrap().len(), big);
        remove_gradually(&checkpoint).unwrap();
    }

    /// A build is a checkpoint with the meta read back from it; the next
    /// build replaces it and removes the old one once its last reader is
    /// gone; a restart finds the current one.
    #[test]
    fn builds_replace_the_current_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        assert!(files.current().unwrap().is_none());
        put_applied(engine.as_ref(), 5, "a");
        let (meta, first) = files.build().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 5);
        let sent = first.encoded().unwrap();
        let mut records = sent.records();
        let mut keys = Vec::new();
        while let Some(r) = records.next_record().unwrap() {
            keys.push((r.table, r.key));
        }
        assert!(keys.contains(&(Table::Kv, b"a".to_vec())));

        put_applied(engine.as_ref(), 9, "b");
        let (meta, second) = files.build().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 9);
        assert!(first.path().exists(), "a reader still holds the first one");
        let first_path = first.path().to_path_buf();
        drop(first);
        assert!(!first_path.exists());
        drop(sent);
        assert_eq!(names(dir.path()).len(), 2, "{:?}", names(dir.path()));

        let (_, reopened) = memory_files(dir.path());
        let (meta, data) = reopened.current().unwrap().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 9);
        assert_eq!(data.path(), second.path());
    }

    /// A snapshot older than the current one (an install a build
    /// overtook, or the reverse) never replaces it.
    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 3, "a");
        let (old_meta, _) = files.build().unwrap();
        put_applied(engine.as_ref(), 7, "b");
        let (new_meta, newer) = files.build().unwrap();
        let received = newer.encoded().unwrap();
        let copy = SnapshotReceiver::create(dir.path(), received.len()).unwrap();
        let mut copy = copy;
        copy.write(&received.chunk_at(0, received.len()).unwrap())
            .unwrap();
        let copy = SnapshotData::File(Arc::new(copy.finish().unwrap()));
        // Adopting an older snapshot's records keeps the newer current.
        files.adopt(&old_meta, copy).unwrap();
        let (meta, _) = files.current().unwrap().unwrap();
        assert_eq!(meta.last_log_id, new_meta.last_log_id);
    }

    /// A checkpoint that catches an entry in the middle (its progress key
    /// `sm/applied_part` set) is dropped and taken again between entries,
    /// once the entry being applied is done.
    #[test]
    fn a_checkpoint_never_holds_part_of_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 3, "a");
        let mut part = crate::engine::WriteBatch::new();
        part.put(
            Table::Meta,
            KEY_APPLIED_PART.to_vec(),
            b"entry 4, 1 applied".to_vec(),
        );
        engine.write(part, false).unwrap();
        assert!(files.checkpoint(false).unwrap().is_none());
        assert_eq!(
            names(dir.path()),
            Vec::<String>::new(),
            "the partial one is gone"
        );

        let (gate_held, held) = std::sync::mpsc::channel();
        let applier = {
            let (engine, files) = (engine.clone(), files.clone());
            std::thread::spawn(move || {
                let gate = files.entry_gate();
                let _held = gate.hold();
                gate_held.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                // The entry's last group: its data, `applied`, and the
                // progress key gone, in one batch.
                let mut done = applied_batch(4, "b");
                done.delete(Table::Meta, KEY_APPLIED_PART.to_vec());
                engine.write(done, false).unwrap();
            })
        };
        held.recv().unwrap();
        let (meta, _) = files.build().unwrap();
        applier.join().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 4);
    }

    /// Another member's current snapshot file (still shared with its own
    /// current slot) is copied when adopted, and stays with its owner.
    #[test]
    fn a_checkpoint_streams_the_records_a_file_would_hold() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        for (index, key) in ["a", "b", "c"].into_iter().enumerate() {
            put_applied(engine.as_ref(), index as u64 + 1, key);
        }
        let (_, built) = files.build().unwrap();
        let written = built.encoded().unwrap();
        let expected = written.chunk_at(0, written.len()).unwrap();
        let SnapshotSource::Checkpoint { checkpoint, len } = built.source().unwrap() else {
            panic!("a built snapshot is a checkpoint");
        };
        assert_eq!(len, expected.len() as u64);
        assert_eq!(checkpoint.measured.get(), Some(&len), "measured once");
        assert_eq!(built.source().unwrap().len(), len);
        let mut produced = checkpoint.produce(7, 2);
        let mut streamed = Vec::new();
        while let Some(chunk) = produced.blocking_recv() {
            let chunk = chunk.unwrap();
            assert!(chunk.len() <= 7);
            streamed.extend_from_slice(&chunk);
        }
        assert_eq!(streamed, expected);
        // No file was written to stream it.
        let sending: Vec<String> = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with(SENDING_PREFIX))
            .collect();
        assert_eq!(sending.len(), 1, "only encoded()'s: {sending:?}");

        // A reader that goes away stops the producer.
        let mut produced = checkpoint.produce(1, 1);
        assert!(produced.blocking_recv().is_some());
        drop(produced);
    }

    #[test]
    fn a_shared_file_is_copied_when_adopted() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (engine_a, files_a) = memory_files(a.path());
        put_applied(engine_a.as_ref(), 4, "k");
        let (meta, built) = files_a.build().unwrap();
        let records = built.encoded().unwrap();
        let mut receiver = SnapshotReceiver::create(a.path(), records.len()).unwrap();
        receiver
            .write(&records.chunk_at(0, records.len()).unwrap())
            .unwrap();
        let received = SnapshotData::File(Arc::new(receiver.finish().unwrap()));
        drop((built, records));
        files_a.adopt(&meta, received).unwrap();
        let (_, shared) = files_a.current().unwrap().unwrap();

        let (_, files_b) = memory_files(b.path());
        let adopted = files_b.adopt(&meta, shared.clone()).unwrap();
        assert_eq!(adopted.len(), shared.encoded().unwrap().len());
        assert!(shared.path().exists(), "the owner keeps its file");
        assert_eq!(
            files_b.current().unwrap().unwrap().0.last_log_id,
            meta.last_log_id
        );
    }

    #[test]
    fn leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 2, "a");
        let (_, current) = files.build().unwrap();
        let current_name = current
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        drop(current);
        std::fs::write(dir.path().join("current.snap"), b"x").unwrap();
        std::fs::write(dir.path().join("current.meta"), b"x").unwrap();
        std::fs::write(dir.path().join("receiving-1-0.tmp"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("snapshot-1-2-3.ckpt.tmp")).unwrap();
        std::fs::create_dir(dir.path().join("snapshot-1-2-4.ckpt")).unwrap();
        std::fs::write(dir.path().join("snapshot-1-2-5.snap"), b"x").unwrap();
        std::fs::write(dir.path().join("unrelated"), b"x").unwrap();
        remove_leftovers(dir.path()).unwrap();
        let mut expected = vec![current_name, META_FILE.to_string(), "unrelated".to_string()];
        expected.sort();
        assert_eq!(names(dir.path()), expected);
    }

    /// A data dir of the previous layout is read until a new snapshot
    /// replaces it, and its files go then.
    #[test]
    fn the_previous_layout_is_read_then_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(
                crate::raft::LeaderId {
                    term: 1,
                    node_id: 1,
                },
                4,
            )),
            last_membership: StoredMembership::default(),
        };
        std::fs::write(
            dir.path().join(LEGACY_DATA_FILE),
            encode(&[record(Table::Kv, "k", "v")]),
        )
        .unwrap();
        std::fs::write(dir.path().join(LEGACY_META_FILE), codec::encode(&meta)).unwrap();
        remove_leftovers(dir.path()).unwrap();
        let (read, data) = files.current().unwrap().unwrap();
        assert_eq!(read.last_log_id, meta.last_log_id);
        assert!(matches!(data, SnapshotData::File(_)));
        put_applied(engine.as_ref(), 6, "a");
        files.build().unwrap();
        assert!(!dir.path().join(LEGACY_DATA_FILE).exists());
        assert!(!dir.path().join(LEGACY_META_FILE).exists());
    }
}

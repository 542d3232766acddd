//! A snapshot's records in a file ([`SnapshotFile`]): opened, or created as
//! a temporary file (received, or written out to be sent); read in chunks
//! or record by record; made a permanent file; with the install prepared
//! while it arrived ([`PreparedInstall`]).

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::names::{unique_name, TEMP_EXTENSION};
use super::records::RecordReader;
use super::SNAPSHOT_REMOVAL_THREAD;
use crate::engine::PreparedLoad;
use crate::removal::remove_in_background;

/// Buffer of the writers and readers of records files.
pub(super) const FILE_BUFFER_BYTES: usize = 1024 * 1024;

/// A snapshot's records in a file. The file is open, so removing or
/// replacing the path does not change what a reader of this one sees. A
/// temporary file (one being received or sent) is removed when dropped
/// unless it was adopted as the current snapshot.
#[derive(Debug)]
pub struct SnapshotFile {
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    pub(super) len: u64,
    temporary: bool,
    /// The install read from the records as they were received, if it
    /// was prepared
    /// ([`SnapshotReceiver::prepare_install`](super::SnapshotReceiver::prepare_install)).
    pub(super) prepared: Mutex<Option<PreparedInstall>>,
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
    pub(super) fn create_temporary(dir: &Path, prefix: &str) -> std::io::Result<(Self, File)> {
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
    pub(super) fn persist(
        this: Arc<Self>,
        dir: &Path,
        name: &str,
    ) -> std::io::Result<SnapshotFile> {
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
            remove_in_background(self.path.clone(), SNAPSHOT_REMOVAL_THREAD);
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

/// What installing a received snapshot needs, read from its records as
/// they arrived
/// ([`SnapshotReceiver::prepare_install`](super::SnapshotReceiver::prepare_install)).
pub struct PreparedInstall {
    /// The records as table files, ready to ingest.
    pub load: PreparedLoad,
}

impl std::fmt::Debug for PreparedInstall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedInstall")
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// Locks `m`, taking over a lock whose holder panicked.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

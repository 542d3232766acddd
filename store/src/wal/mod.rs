//! An append-only log of checksummed records in preallocated segment files
//! (`<dir>/<sequence, 16 hex digits>.seg`): where the Raft log lives
//! ([`crate::raft::log_store`] gives the records their meaning).
//!
//! Why files of our own: a group commit's `fdatasync` costs what the disk
//! writes. Appending to a file that grows also writes its inode (its size
//! changed), three I/Os instead of two; RocksDB's WAL grows. A segment here
//! is allocated at its full size when it is created ([`WAL_SEGMENT_BYTES`],
//! `fallocate` without `KEEP_SIZE`, as etcd preallocates its WAL segments),
//! so appends overwrite allocated space and a sync writes data only. On
//! this machine that was 88-102 us per `write` + `fdatasync` against
//! 128-134 us for a growing file (docs/benchmarks.md). The log's entries no
//! longer pass through RocksDB's memtables, flushes and compactions either.
//!
//! `fallocate` alone leaves the space *unwritten* (ext4, xfs): the first
//! write to each block converts it, a metadata change, so nearly every
//! group commit's `fdatasync` also committed the file system's journal, and
//! on ext4 (`data=ordered`) a journal commit first writes out the data of
//! every file with newly allocated blocks: the engine's table files being
//! written by a compaction or a defragment. A paced writer's puts stalled up
//! to 192 ms while a member rewrote its tables. So a new segment's space is
//! also written with zeros, past the page cache ([`crate::direct_io`]), and
//! synced, before it is used: appends then overwrite written blocks and a
//! sync writes data only (the same run: 60 ms). Zeroing 64 MiB must not sit
//! on a write's path, so the next segment is prepared on a thread, as
//! `next.spare`, once the current one is half full, and renamed into place
//! when the log rolls (a roll that finds it not ready waits for it; one
//! whose preparation failed allocates a segment the old way). A member
//! that never fills half a segment writes no zeros. The segment found
//! newest at open keeps its `fallocate`d tail until the log rolls.
//!
//! The rules that keep what was synced:
//!
//! - Records are only appended, each with its own CRC32C ([`frame`]); the
//!   unwritten rest of a segment reads as zeros, the clean end.
//! - A segment is synced before the next one is created, and the directory
//!   is synced after a segment is created or removed. So only the newest
//!   segment can end in a torn record; an older segment whose records stop
//!   at a bad checksum is corrupt and the log refuses to open.
//! - Opening reads every record and cuts the newest segment at its first
//!   bad or missing record: the file is truncated there and allocated
//!   again, so bytes a crash left after that point (never synced, never
//!   acknowledged) cannot be read back as records once new ones follow.
//! - Sticky records: for the kinds the owner names (the vote, the commit
//!   index, the purge point), the newest record of each is written again at
//!   the start of every new segment, so removing old segments never loses
//!   them: whatever was last written is in a remaining segment.
//!
//! Every write ends on a page boundary ([`WRITE_PAGE_BYTES`]): the records,
//! then zeros to the end of their last page, which is what the segment
//! holds there already. The segment's zeros were written past the page
//! cache, so a write that ended inside a page the kernel did not hold made
//! it read that page from the disk first, to keep the page's rest: one
//! synchronous read per append, inside the `pwrite` of a runtime thread
//! (0.45 ms on average and up to 28 ms under a put load, measured). A write
//! that starts inside a page starts in the one the previous append left in
//! the page cache. The log's offset moves past the records only: the next
//! append overwrites the padding.
//!
//! The owner decides when old segments may go ([`Wal::remove_segments_before`])
//! and syncs ([`Wal::current_file`]); this module knows nothing of Raft.

pub mod frame;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::direct_io::DirectAppender;
use crate::limits::{WAL_READ_BUFFER_BYTES, WAL_SEGMENT_BYTES};
use crate::removal::remove_if_present;

/// File name suffix of a segment.
const SEGMENT_SUFFIX: &str = ".seg";
/// Writes are padded with zeros to a multiple of this offset (the page
/// cache's page and ext4's block), so none leaves a page partly written.
const WRITE_PAGE_BYTES: u64 = 4096;
/// The next segment, being prepared ([`prepare_segment`]); a leftover is
/// removed at open.
const SPARE_NAME: &str = "next.spare";
/// Name prefix and extension of a directory of purged segments being freed
/// ([`Wal::remove_segments_before`]: `purged-<unique_name>.purged`), and
/// the thread that frees them. One a crash left is freed at the next open.
const PURGED_PREFIX: &str = "purged-";
const PURGED_EXTENSION: &str = "purged";
const PURGED_REMOVAL_THREAD: &str = "raft-log-purge";

/// What opening hands each record to, in order: `(kind, payload,
/// location)`; an error stops the opening.
pub type Replay<'a> = dyn FnMut(u8, &[u8], Location) -> io::Result<()> + 'a;

/// Where a record's payload is: segment, byte offset, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The segment's sequence number.
    pub segment: u64,
    /// Offset of the payload (after the kind byte) in the segment.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
}

/// Why a log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A file operation failed.
    #[error("raft log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// A segment older than the newest one ends in a bad record.
    #[error("raft log {path}: corrupt record at byte {offset} (not the newest segment)")]
    Corrupt {
        /// The segment.
        path: PathBuf,
        /// Where its records stop making sense.
        offset: u64,
    },
    /// One record larger than the frame's length field.
    #[error("raft log: a record of {0} bytes is too large")]
    TooLarge(usize),
}

impl From<WalError> for io::Error {
    fn from(e: WalError) -> Self {
        let kind = match &e {
            WalError::Io { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a log is laid out; [`WalOptions::default`] is the store's.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// Bytes allocated per segment (a larger record makes its segment grow).
    pub segment_bytes: u64,
    /// The record kinds whose newest record starts every new segment.
    pub sticky_kinds: Vec<u8>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: WAL_SEGMENT_BYTES,
            sticky_kinds: Vec::new(),
        }
    }
}

struct Segment {
    file: Arc<File>,
    path: PathBuf,
}

/// An open log, positioned after its last record.
pub struct Wal {
    dir: PathBuf,
    options: WalOptions,
    segments: BTreeMap<u64, Segment>,
    /// Sequence of the segment written to.
    current: u64,
    /// Where the next record goes in it.
    offset: u64,
    /// Where the sticky records this process wrote at the head of the
    /// current segment end (0 for a segment found at open): a batch that
    /// starts there has the segment to itself and never rolls.
    header_end: u64,
    /// The newest payload of each sticky kind.
    sticky: BTreeMap<u8, Vec<u8>>,
    /// The next segment's file, being prepared on a thread.
    spare: Option<std::thread::JoinHandle<io::Result<File>>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("segments", &self.segments.keys().collect::<Vec<_>>())
            .field("offset", &self.offset)
            .finish()
    }
}

impl Wal {
    /// Opens (or creates) the log in `dir`, handing every record in order to
    /// `replay` as `(kind, payload, location)`. An error from `replay`
    /// stops the opening.
    pub fn open(dir: &Path, options: WalOptions, replay: &mut Replay<'_>) -> io::Result<Wal> {
        std::fs::create_dir_all(dir).map_err(at(dir))?;
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            options,
            segments: BTreeMap::new(),
            current: 0,
            offset: 0,
            header_end: 0,
            sticky: BTreeMap::new(),
            spare: None,
        };
        remove_if_present(&wal.spare_path())?;
        free_purged_leftovers(dir)?;
        let sequences = list_segments(dir)?;
        let newest = sequences.last().copied();
        for seq in sequences {
            let path = wal.segment_path(seq);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(at(&path))?;
            let end = wal.read_segment(seq, &file, &path, replay)?;
            if let (SegmentEnd::Torn(offset), false) = (end, Some(seq) == newest) {
                return Err(WalError::Corrupt { path, offset }.into());
            }
            if Some(seq) == newest {
                let end = end.offset();
                // Cut whatever follows the last good record and allocate again.
                file.set_len(end).map_err(at(&path))?;
                allocate(&file, wal.options.segment_bytes).map_err(at(&path))?;
                file.sync_all().map_err(at(&path))?;
                wal.current = seq;
                wal.offset = end;
            }
            wal.segments.insert(
                seq,
                Segment {
                    file: Arc::new(file),
                    path,
                },
            );
        }
        if wal.segments.is_empty() {
            wal.create_segment(1)?;
        } else if wal.offset == 0 && !wal.sticky.is_empty() {
            // A crash while the newest segment was being created: it must
            // still start with the sticky records before older ones go.
            wal.write_sticky_header()?;
            wal.header_end = wal.offset;
            wal.sync()?;
        }
        Ok(wal)
    }

    fn segment_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:016x}{SEGMENT_SUFFIX}"))
    }

    fn spare_path(&self) -> PathBuf {
        self.dir.join(SPARE_NAME)
    }

    /// Starts preparing the next segment on a thread, unless one is.
    fn prepare_spare(&mut self) {
        if self.spare.is_some() {
            return;
        }
        let path = self.spare_path();
        let bytes = self.options.segment_bytes;
        let started = std::thread::Builder::new()
            .name("raft-log-spare".to_string())
            .spawn(move || prepare_segment(&path, bytes));
        match started {
            Ok(thread) => self.spare = Some(thread),
            Err(e) => tracing::warn!(error = %e, "starting the raft log's segment preparation"),
        }
    }

    /// The prepared next segment, renamed to `path`, if its preparation
    /// worked (waiting for it to finish).
    fn take_spare(&mut self, path: &Path) -> Option<File> {
        let prepared = match self.spare.take()?.join() {
            Ok(Ok(file)) => file,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "preparing a raft log segment; allocating one instead");
                return None;
            }
            Err(_) => {
                tracing::warn!("preparing a raft log segment panicked; allocating one instead");
                return None;
            }
        };
        match std::fs::rename(self.spare_path(), path) {
            Ok(()) => Some(prepared),
            Err(e) => {
                tracing::warn!(error = %e, "renaming the prepared raft log segment; allocating one instead");
                None
            }
        }
    }

    /// Reads one segment's records into `replay`; where they end.
    fn read_segment(
        &mut self,
        seq: u64,
        file: &File,
        path: &Path,
        replay: &mut Replay<'_>,
    ) -> io::Result<SegmentEnd> {
        let size = file.metadata().map_err(at(path))?.len();
        let mut reader = io::BufReader::with_capacity(WAL_READ_BUFFER_BYTES, file);
        let mut offset = 0u64;
        let mut body = Vec::new();
        loop {
            if size - offset < frame::HEADER_BYTES as u64 {
                return Ok(SegmentEnd::Clean(offset));
            }
            let mut header = [0u8; frame::HEADER_BYTES];
            reader.read_exact(&mut header).map_err(at(path))?;
            let (length, crc) = match frame::decode_header(&header) {
                frame::Header::End => return Ok(SegmentEnd::Clean(offset)),
                frame::Header::Record { length, crc } => (u64::from(length), crc),
            };
            let body_at = offset + frame::HEADER_BYTES as u64;
            if length > size - body_at {
                return Ok(SegmentEnd::Torn(offset));
            }
            body.resize(length as usize, 0);
            reader.read_exact(&mut body).map_err(at(path))?;
            if !frame::body_matches(&body, crc) {
                return Ok(SegmentEnd::Torn(offset));
            }
            let (kind, payload) = (body[0], &body[1..]);
            if self.options.sticky_kinds.contains(&kind) {
                self.sticky.insert(kind, payload.to_vec());
            }
            let location = Location {
                segment: seq,
                offset: body_at + 1,
                len: payload.len() as u32,
            };
            replay(kind, payload, location)?;
            offset = body_at + length;
        }
    }

    /// Creates segment `seq`, allocated at full size, starting with the
    /// sticky records; it becomes the one written to.
    fn create_segment(&mut self, seq: u64) -> io::Result<()> {
        let path = self.segment_path(seq);
        let file = match self.take_spare(&path) {
            Some(file) => file,
            None => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(at(&path))?;
                allocate(&file, self.options.segment_bytes).map_err(at(&path))?;
                file
            }
        };
        sync_dir(&self.dir)?;
        self.segments.insert(
            seq,
            Segment {
                file: Arc::new(file),
                path,
            },
        );
        self.current = seq;
        self.offset = 0;
        self.write_sticky_header()?;
        self.header_end = self.offset;
        Ok(())
    }

    fn write_sticky_header(&mut self) -> io::Result<()> {
        let mut header = Vec::new();
        for (kind, payload) in &self.sticky {
            frame::encode_into(&mut header, *kind, payload);
        }
        if header.is_empty() {
            return Ok(());
        }
        self.write(&mut header)
    }

    /// Writes `bytes` at the offset, followed by zeros to the end of the
    /// last page they reach (within the segment's allocated size), and
    /// moves the offset past `bytes` only; `bytes` is left as it was given.
    fn write(&mut self, bytes: &mut Vec<u8>) -> io::Result<()> {
        let len = bytes.len();
        let end = self.offset + len as u64;
        bytes.resize(len + padding(end, self.options.segment_bytes), 0);
        let segment = &self.segments[&self.current];
        let written = segment.file.write_all_at(bytes, self.offset);
        bytes.truncate(len);
        written.map_err(at(&segment.path))?;
        self.offset = end;
        Ok(())
    }

    /// Appends `records` (kind, payload) with one write, unsynced, and says
    /// where each payload is. A batch that would pass the segment's
    /// allocated end goes to a new segment (after syncing this one), unless
    /// this segment holds nothing yet.
    pub fn append(&mut self, records: &[(u8, &[u8])]) -> io::Result<Vec<Location>> {
        let mut needed = 0;
        for (_, payload) in records {
            if payload.len() >= u32::MAX as usize {
                return Err(WalError::TooLarge(payload.len()).into());
            }
            needed += frame::HEADER_BYTES + 1 + payload.len();
        }
        if self.offset > self.header_end && self.offset + needed as u64 > self.options.segment_bytes
        {
            self.roll()?;
        }
        let mut bytes = Vec::with_capacity(needed + WRITE_PAGE_BYTES as usize);
        let mut locations = Vec::with_capacity(records.len());
        for (kind, payload) in records {
            let offset = self.offset + bytes.len() as u64 + frame::HEADER_BYTES as u64 + 1;
            frame::encode_into(&mut bytes, *kind, payload);
            locations.push(Location {
                segment: self.current,
                offset,
                len: payload.len() as u32,
            });
            if self.options.sticky_kinds.contains(kind) {
                self.sticky.insert(*kind, payload.to_vec());
            }
        }
        self.write(&mut bytes)?;
        if self.offset > self.options.segment_bytes / 2 {
            self.prepare_spare();
        }
        Ok(locations)
    }

    /// Syncs the segment written to and starts the next one.
    fn roll(&mut self) -> io::Result<()> {
        self.sync()?;
        self.create_segment(self.current + 1)
    }

    /// The file a sync must cover: every older segment was synced before
    /// this one was created.
    pub fn current_file(&self) -> Arc<File> {
        self.segments[&self.current].file.clone()
    }

    /// Syncs the segment written to.
    pub fn sync(&self) -> io::Result<()> {
        let segment = &self.segments[&self.current];
        segment.file.sync_data().map_err(at(&segment.path))?;
        Ok(())
    }

    /// The file holding `location`, for a read outside any lock
    /// ([`read_at`]).
    pub fn file_of(&self, location: Location) -> io::Result<Arc<File>> {
        self.segments
            .get(&location.segment)
            .map(|s| s.file.clone())
            .ok_or_else(|| {
                io::Error::other(format!(
                    "raft log: segment {:016x} was removed",
                    location.segment
                ))
            })
    }

    /// Removes the segments older than `seq` (never the one written to):
    /// moves them into a directory of purged segments, syncs the log's
    /// directory, and frees them gradually ([`crate::removal`]). The
    /// caller syncs first whatever must outlive them.
    ///
    /// Unlinked at once, a 64 MiB segment (the log purges one or more after
    /// every snapshot) stalled every member's `fdatasync` for tens of
    /// milliseconds on a file system mounted with `discard`, whose next
    /// journal commit discards every block freed since the last one.
    pub fn remove_segments_before(&mut self, seq: u64) -> io::Result<usize> {
        let seq = seq.min(self.current);
        let old: Vec<u64> = self.segments.range(..seq).map(|(s, _)| *s).collect();
        if old.is_empty() {
            return Ok(0);
        }
        let purged = self.dir.join(unique_name(PURGED_PREFIX, PURGED_EXTENSION));
        std::fs::create_dir(&purged).map_err(at(&purged))?;
        for s in &old {
            let segment = self.segments.remove(s).expect("listed");
            let name = segment.path.file_name().expect("a segment's file name");
            std::fs::rename(&segment.path, purged.join(name)).map_err(at(&segment.path))?;
        }
        sync_dir(&self.dir)?;
        crate::removal::remove_in_background(purged, PURGED_REMOVAL_THREAD);
        Ok(old.len())
    }

    /// The sequence of the segment written to.
    pub fn current_segment(&self) -> u64 {
        self.current
    }

    /// How many segments exist.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The sequence of the oldest segment.
    pub fn oldest_segment(&self) -> u64 {
        self.segments.keys().next().copied().unwrap_or(self.current)
    }
}

/// Reads a payload at `location` from `file` (see [`Wal::file_of`]).
pub fn read_at(file: &File, location: Location) -> io::Result<Vec<u8>> {
    let mut payload = vec![0u8; location.len as usize];
    file.read_exact_at(&mut payload, location.offset)?;
    Ok(payload)
}

/// Where a segment's records stop.
#[derive(Debug, Clone, Copy)]
enum SegmentEnd {
    /// At zeros or the end of the file.
    Clean(u64),
    /// At a record that is cut short or fails its checksum.
    Torn(u64),
}

impl SegmentEnd {
    fn offset(self) -> u64 {
        match self {
            SegmentEnd::Clean(o) | SegmentEnd::Torn(o) => o,
        }
    }
}

/// Frees, in the background, the directories of purged segments a stop
/// left before their removal finished.
fn free_purged_leftovers(dir: &Path) -> io::Result<()> {
    let is_purged = |path: &Path| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        name.starts_with(PURGED_PREFIX) && path.extension().is_some_and(|x| x == PURGED_EXTENSION)
    };
    crate::removal::remove_matching_in_background(dir, is_purged, PURGED_REMOVAL_THREAD)
        .map_err(at(dir))?;
    Ok(())
}

/// The segment sequences in `dir`, ascending.
fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut sequences = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry.map_err(at(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        if stem.len() == 16 {
            if let Ok(seq) = u64::from_str_radix(stem, 16) {
                sequences.push(seq);
            }
        }
    }
    sequences.sort_unstable();
    Ok(sequences)
}

impl Drop for Wal {
    /// Waits for the next segment's preparation, so nothing writes in the
    /// directory once the log is closed.
    fn drop(&mut self) {
        if let Some(spare) = self.spare.take() {
            let _ = spare.join();
        }
    }
}

/// Creates the file `path` (replacing one left there) with `bytes` of
/// allocated space written with zeros, synced: a segment whose appends
/// change no metadata.
fn prepare_segment(path: &Path, bytes: u64) -> io::Result<File> {
    remove_if_present(path)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    allocate(&file, bytes)?;
    let mut zeros = DirectAppender::new(path, file.try_clone()?);
    zeros.write_zeros(bytes)?;
    zeros.finish()?;
    file.sync_all()?;
    Ok(file)
}

/// Zeros to write after a write that ends at `end`: up to the next page
/// boundary, or none if that is past `allocated` (the file would grow).
fn padding(end: u64, allocated: u64) -> usize {
    let page_end = end.next_multiple_of(WRITE_PAGE_BYTES);
    if page_end > allocated {
        return 0;
    }
    // Less than one page.
    (page_end - end) as usize
}

/// Distinguishes the names [`unique_name`] gives in this process.
static NAMES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A name no earlier file or directory of its directory has: the time in
/// nanoseconds, the process id and a counter (the snapshot directory's
/// files and a defragment's hold directory).
pub fn unique_name(prefix: &str, extension: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = NAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}{nanos}-{}-{n}.{extension}", std::process::id())
}

/// Gives `file` `bytes` of allocated space and that size (etcd's
/// preallocation); a file system without `fallocate` gets the size only.
fn allocate(file: &File, bytes: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
    // SAFETY: fallocate on an open descriptor we own, no pointers.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        let size = file.metadata()?.len();
        if size < bytes {
            file.set_len(bytes)?;
        }
        return Ok(());
    }
    Err(e)
}

/// Syncs a directory, so that files created, renamed or removed in it stay
/// so after a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at(dir))
        .map_err(Into::into)
}

#[cfg(test)]
mod tests;

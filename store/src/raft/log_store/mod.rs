//! The Raft log and vote, in segment files of their own ([`crate::wal`]),
//! with group commit.
//!
//! Records (kind, payload):
//!
//! | kind | payload | meaning |
//! | --- | --- | --- |
//! | 1 entry | term, leader node id, index (8 bytes big-endian each), then the bincode of the openraft entry | appended after the last entry |
//! | 2 truncate | bincode of the last log id kept (`Option`) | entries after it are gone |
//! | 16 vote | bincode of the vote | the vote (sticky) |
//! | 17 committed | bincode of the commit index (`Option`) | the commit index (sticky) |
//! | 18 purged | bincode of the last purged log id | entries up to it are gone (sticky) |
//!
//! Opening replays the records into the log's state: the vote, the commit
//! index, the purge point, the last log id and where each live entry is
//! (segment and offset, 16 bytes per entry in memory). Sticky kinds start
//! every new segment again, so segments that hold only purged entries can
//! be removed.
//!
//! Group commit: `append` writes the entries unsynced (one `pwrite`) and
//! hands openraft's completion callback to one flusher thread. The flusher
//! takes every callback queued so far (up to [`GROUP_COMMIT_MAX_PENDING`]),
//! makes them durable with one `fdatasync` of the segment written to (an
//! older segment is synced before the next one is created), then completes
//! them in order. While one sync runs, the next appends queue up behind it,
//! so under load many appends share one sync. A callback is only completed
//! after the sync that covers its entries returns, so openraft never counts
//! an entry as stored before it is on disk. The vote and truncations are
//! synced before they return.
//!
//! The state machine (RocksDB) is not synced with the log: after a crash
//! it replays the log from the applied index that reached its disk. So the
//! engine is synced before segments are removed: a purged entry is then
//! applied durably, and RocksDB never needs an entry no segment holds. (If
//! a power cut left the state machine ahead of this member's own log,
//! openraft purges up to the applied index at start.)
//!
//! Tail cache: the entries an append writes are also kept in memory, the
//! newest [`LOG_TAIL_CACHE_BYTES`] of them ([`TailCache`]), as etcd's raft
//! keeps its log's tail in memory. Replication (one read per follower) and
//! the state machine (one read per member) take clones from there (a
//! [`super::types::Batch`] shares its proposals), so the leader does not
//! read and decode each entry three times. Truncation and purging remove
//! the same entries from both; a read the cache cannot serve whole goes to
//! the segment files.
//!
//! openraft 0.10 does not wait for the callback before it replicates: the
//! leader sends new entries to the followers while its own sync runs (as
//! etcd writes its WAL in parallel with sending), and counts itself towards
//! the commit quorum only once the callback says its copy is durable.
//!
//! A data directory written before the log had files of its own keeps its
//! log in the engine's `raft_log` and `raft_state` tables: the first open
//! copies it into segments (built beside the log directory, then renamed
//! into place) and only then removes it from the engine.
//!
//! The parts: [`records`] (the record kinds and their codec), [`index`]
//! (the state the records give), [`segments`] (the files with that
//! state), [`tail_cache`], [`flusher`] (group commit) and [`legacy`] (the
//! move out of the engine's tables).
//!
//! [`GROUP_COMMIT_MAX_PENDING`]: crate::limits::GROUP_COMMIT_MAX_PENDING

mod flusher;
mod index;
mod legacy;
mod records;
mod segments;
mod tail_cache;

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{stream, Stream, StreamExt};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use self::flusher::Flusher;
use self::legacy::migrate_from_engine;
pub(crate) use self::records::io_error;
use self::records::{entry_of_record, KIND_PURGED, KIND_TRUNCATE, KIND_VOTE};
use self::segments::{lock_log, log_options, open_log, write_entries, Log};
use self::tail_cache::TailCache;
use super::{Entry, LogId, TypeConfig, Vote};
use crate::codec;
use crate::engine::Engine;
use crate::limits::{LOG_TAIL_CACHE_BYTES, MAX_APPEND_ENTRIES_BYTES, MAX_APPLY_READ_BYTES};
use crate::wal::{self, WalOptions};

/// The Raft log storage. Cheap to clone (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
    /// The state machine's engine, synced before segments are removed.
    engine: Arc<dyn Engine>,
    flusher: Arc<Flusher>,
    /// The newest entries, shared by every clone (see the module docs).
    tail: Arc<Mutex<TailCache>>,
}

impl LogStore {
    /// Bytes of the live entries' records with an index above `index`.
    pub fn bytes_after(&self, index: u64) -> u64 {
        let log = self.log();
        let from = index.saturating_add(1).saturating_sub(log.index.first) as usize;
        log.index
            .locations
            .iter()
            .skip(from)
            .map(|at| u64::from(at.len))
            .sum()
    }

    /// The highest index at or below `upto` whose entry lies wholly beyond
    /// `bytes` counted back from `upto`: purging up to it keeps at least
    /// `bytes` of entries at or below `upto`. None when every live entry
    /// at or below `upto` fits in `bytes`.
    ///
    /// Example: entries 5..=9 of 10 bytes each, `upto` 9, `bytes` 25:
    /// 9, 8 and 7 hold 30 bytes, so entries up to 6 may go (`Some(6)`).
    pub fn purge_point_keeping(&self, upto: u64, bytes: u64) -> Option<u64> {
        let log = self.log();
        let first = log.index.first;
        let end = upto.checked_sub(first)?.saturating_add(1);
        let end = usize::try_from(end).ok()?.min(log.index.locations.len());
        let mut kept = 0u64;
        for i in (0..end).rev() {
            if kept >= bytes {
                return Some(first + i as u64);
            }
            kept += u64::from(log.index.locations[i].len);
        }
        None
    }
    /// The log store in `dir` (created if missing; a log still in the
    /// engine's tables is moved there first), starting its flusher thread.
    /// `engine` is the state machine's, synced before segments go.
    pub fn open(engine: Arc<dyn Engine>, dir: &Path) -> io::Result<Self> {
        Self::open_with(engine, dir, log_options())
    }

    fn open_with(engine: Arc<dyn Engine>, dir: &Path, options: WalOptions) -> io::Result<Self> {
        migrate_from_engine(engine.as_ref(), dir)?;
        let log = open_log(dir, options)?;
        let log = Arc::new(Mutex::new(log));
        let flusher = Flusher::start(log.clone())?;
        Ok(Self {
            log,
            engine,
            flusher: Arc::new(flusher),
            tail: Arc::new(Mutex::new(TailCache::new(LOG_TAIL_CACHE_BYTES))),
        })
    }

    fn tail(&self) -> MutexGuard<'_, TailCache> {
        self.tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        lock_log(&self.log)
    }

    /// Writes `entries` and makes them durable at once, outside openraft's
    /// append protocol: for repairs made before Raft starts
    /// ([`super::recovery`]).
    pub fn append_synced(&self, entries: &[Entry]) -> io::Result<()> {
        self.tail().clear();
        let mut log = self.log();
        write_entries(&mut log, entries)?;
        log.wal.sync()
    }
}

fn bound_start(b: Bound<&u64>) -> u64 {
    match b {
        Bound::Included(i) => *i,
        Bound::Excluded(i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    }
}

fn bound_end(b: Bound<&u64>) -> Option<u64> {
    match b {
        Bound::Included(i) => i.checked_add(1),
        Bound::Excluded(i) => Some(*i),
        Bound::Unbounded => None,
    }
}

impl LogStore {
    /// The entries in `[start, end)` (`end` `None`: to the last), stopping
    /// after the entry that brings the encoded total to `max_bytes`.
    fn read_entries(
        &self,
        start: u64,
        end: Option<u64>,
        max_bytes: usize,
    ) -> io::Result<Vec<Entry>> {
        if let Some(cached) = self.tail().read(start, end, max_bytes) {
            return Ok(cached);
        }
        self.read_file_entries(start, end, max_bytes)
    }

    /// [`LogStore::read_entries`] from the segment files alone. The reads
    /// run outside the lock: records are never overwritten, and a removed
    /// segment stays readable through its open file.
    fn read_file_entries(
        &self,
        start: u64,
        end: Option<u64>,
        max_bytes: usize,
    ) -> io::Result<Vec<Entry>> {
        let found = self.log().locate(start, end, max_bytes)?;
        found
            .into_iter()
            .map(|(file, at)| {
                let payload =
                    wal::read_at(&file, at).map_err(|e| io_error("reading the raft log", e))?;
                entry_of_record(&payload)
            })
            .collect()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let start = bound_start(range.start_bound());
        self.read_entries(start, bound_end(range.end_bound()), usize::MAX)
    }

    /// What replication sends in one AppendEntries: at most
    /// [`MAX_APPEND_ENTRIES_BYTES`] of entries, and at least one.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.read_entries(start, Some(end), MAX_APPEND_ENTRIES_BYTES)
    }

    /// The committed entries the state machine applies, read
    /// [`MAX_APPLY_READ_BYTES`] at a time as the apply loop asks for them.
    /// openraft's default read the whole range first: a follower catching
    /// up through 1 MiB entries could be handed hundreds of them at once.
    async fn entries_stream<RB>(
        &mut self,
        range: RB,
    ) -> impl Stream<Item = io::Result<Entry>> + OptionalSend
    where
        RB: RangeBounds<u64> + Clone + Debug + OptionalSend,
    {
        let start = bound_start(range.start_bound());
        let end = bound_end(range.end_bound());
        let chunks = stream::unfold(Some((self.clone(), start)), move |state| async move {
            let (store, next) = state?;
            if end.is_some_and(|end| next >= end) {
                return None;
            }
            match store.read_entries(next, end, MAX_APPLY_READ_BYTES) {
                Ok(chunk) => {
                    let last = chunk.last()?.log_id.index;
                    let chunk: Vec<io::Result<Entry>> = chunk.into_iter().map(Ok).collect();
                    Some((stream::iter(chunk), Some((store, last + 1))))
                }
                Err(e) => Some((stream::iter(vec![Err(e)]), None)),
            }
        });
        chunks.flatten()
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.log().index.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let log = self.log();
        Ok(LogState {
            last_purged_log_id: log.index.purged,
            last_log_id: log.index.last.or(log.index.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Written and synced before it returns, as openraft requires.
    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let mut log = self.log();
        log.write(&[(KIND_VOTE, &codec::encode(vote))])
            .and_then(|()| log.wal.sync())
            .map_err(|e| io_error("saving the vote", e))
    }

    /// Keeps the commit index in memory; the next append writes it in the
    /// same write as its entries. openraft awaits this before it applies
    /// each commit, so a write here was one more write on every write's
    /// path, on the leader and on each follower. The commit index is
    /// optional state (openraft recovers it from the leader, and takes the
    /// applied index when it is lower): after a crash it may be a few
    /// entries behind, which only means re-applying from the last applied
    /// index.
    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let mut log = self.log();
        log.index.committed = committed;
        log.index.committed_unwritten = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.log().index.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        let written = write_entries(&mut self.log(), &entries);
        let mut tail = self.tail();
        match &written {
            // What reached the files is unknown: serve reads from them.
            Err(_) => tail.clear(),
            Ok(sizes) => {
                for (entry, size) in entries.into_iter().zip(sizes) {
                    tail.push(entry, *size);
                }
            }
        }
        drop(tail);
        written.map_err(|e| io_error("writing raft log entries", e))?;
        self.flusher.enqueue(callback)
    }

    /// Written and synced before it returns (rare: a follower whose
    /// uncommitted entries conflict with the leader's).
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        self.tail().truncate_after(last_log_id.map(|l| l.index));
        let mut log = self.log();
        log.write(&[(KIND_TRUNCATE, &codec::encode(&last_log_id))])
            .and_then(|()| log.wal.sync())
            .inspect_err(|_| self.tail().clear())
            .map_err(|e| io_error("truncating the raft log", e))
    }

    /// Writes the purge point unsynced; once a whole segment holds only
    /// purged entries, syncs the purge point and the state machine's engine
    /// (see the module docs) and removes the segments before the oldest
    /// live entry's.
    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.tail().purge(log_id.index);
        let mut log = self.log();
        log.write(&[(KIND_PURGED, &codec::encode(&log_id))])
            .map_err(|e| io_error("purging the raft log", e))?;
        let keep_from = log.oldest_needed_segment();
        if log.wal.oldest_segment() >= keep_from {
            return Ok(());
        }
        log.wal
            .sync()
            .map_err(|e| io_error("syncing the raft log", e))?;
        self.engine
            .sync()
            .map_err(|e| io_error("syncing the state machine before removing log segments", e))?;
        log.wal
            .remove_segments_before(keep_from)
            .map_err(|e| io_error("removing raft log segments", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::testing::{entry_of, indexes, log_id};
    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::raft::LeaderId;

    /// Entries of this many value bytes: two fit under the 1 MiB bounds,
    /// the second one reaches them.
    const VALUE_BYTES: usize = 600 * 1024;
    const ENTRIES: u64 = 6;

    fn open_in(dir: &tempfile::TempDir) -> LogStore {
        LogStore::open(Arc::new(MemoryEngine::new()), &dir.path().join("log")).expect("open")
    }

    fn store_with_large_entries() -> (tempfile::TempDir, LogStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open_in(&dir);
        let entries: Vec<Entry> = (1..=ENTRIES)
            .map(|index| entry_of(1, index, VALUE_BYTES))
            .collect();
        store.append_synced(&entries).expect("append");
        (dir, store)
    }

    #[tokio::test]
    async fn an_append_message_stops_at_the_entry_reaching_the_byte_bound() {
        let (_dir, mut store) = store_with_large_entries();
        let first = store.limited_get_log_entries(1, ENTRIES + 1).await;
        assert_eq!(indexes(&first.expect("read")), vec![1, 2]);
        let tail = store.limited_get_log_entries(ENTRIES, ENTRIES + 1).await;
        assert_eq!(indexes(&tail.expect("read")), vec![ENTRIES]);
    }

    /// The byte counts the log bound works from ([`super::super::log_bound`]).
    #[tokio::test]
    async fn byte_counts_follow_the_live_entries() {
        let (_dir, mut store) = store_with_large_entries();
        let all = store.bytes_after(0);
        let one = all / ENTRIES;
        assert!(
            one > VALUE_BYTES as u64 && one < 2 * VALUE_BYTES as u64,
            "{one}"
        );
        assert_eq!(store.bytes_after(ENTRIES - 2), 2 * one);
        assert_eq!(store.bytes_after(ENTRIES), 0);
        // Keeping two and a half entries' bytes at or below 5: 5, 4, 3 stay.
        assert_eq!(store.purge_point_keeping(5, 2 * one + one / 2), Some(2));
        assert_eq!(store.purge_point_keeping(5, 2 * one), Some(3));
        assert_eq!(store.purge_point_keeping(5, 10 * one), None);
        store
            .purge(LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                2,
            ))
            .await
            .expect("purge");
        assert_eq!(store.bytes_after(0), all - 2 * one);
        assert_eq!(
            store.purge_point_keeping(5, 2 * one + one / 2),
            None,
            "3 is the first"
        );
    }

    /// The byte bounds ask for a snapshot past `per_snapshot` bytes after
    /// the last one, and a purge that keeps `catch_up` bytes behind it.
    #[tokio::test]
    async fn the_log_bound_decides_from_bytes() {
        use super::super::log_bound::{decide, Actions, Bounds};
        let (_dir, store) = store_with_large_entries();
        let one = store.bytes_after(0) / ENTRIES;
        let bounds = Bounds {
            per_snapshot: 3 * one,
            catch_up: one + one / 2,
            catch_up_entries: 10,
            held: 3 * one + one / 2,
        };
        assert_eq!(
            decide(&store, bounds, None, None, None),
            Actions {
                snapshot: true,
                purge_upto: None
            },
            "six entries and no snapshot"
        );
        // Snapshot at 4: two entries past it; keep 4 and 3, purge up to 2.
        let actions = decide(&store, bounds, Some(4), None, None);
        assert_eq!(
            actions,
            Actions {
                snapshot: false,
                purge_upto: Some(2)
            }
        );
        assert_eq!(
            decide(&store, bounds, Some(4), Some(2), None).purge_upto,
            None
        );
        // A member being sent snapshot 1 needs 2 onward: purge up to 1 only.
        assert_eq!(
            decide(&store, bounds, Some(4), None, Some(1)).purge_upto,
            Some(1)
        );
        // A hold at 3 is past the byte rule's point: no effect.
        assert_eq!(
            decide(&store, bounds, Some(4), None, Some(3)).purge_upto,
            Some(2)
        );
        // A member being sent nothing yet (no hold past 0) keeps at most
        // `held` bytes (three and a half entries: 4, 3, 2, 1) behind 4.
        assert_eq!(
            decide(&store, bounds, Some(4), None, Some(0)).purge_upto,
            Some(0)
        );
        let tight = Bounds {
            held: 2 * one,
            ..bounds
        };
        assert_eq!(
            decide(&store, tight, Some(4), None, Some(0)).purge_upto,
            Some(2)
        );
        // Keeping one entry behind 4 purges more than the bytes do: up to
        // 3, unless held.
        let by_entries = Bounds {
            catch_up_entries: 1,
            ..bounds
        };
        assert_eq!(
            decide(&store, by_entries, Some(4), None, None).purge_upto,
            Some(3)
        );
        assert_eq!(
            decide(&store, by_entries, Some(4), None, Some(1)).purge_upto,
            Some(1)
        );
    }

    #[tokio::test]
    async fn the_apply_stream_yields_the_range_in_order_across_reads() {
        let (_dir, mut store) = store_with_large_entries();
        let read: Vec<Entry> = store
            .entries_stream(2..=ENTRIES)
            .await
            .map(|e| e.expect("entry"))
            .collect()
            .await;
        assert_eq!(indexes(&read), (2..=ENTRIES).collect::<Vec<_>>());
    }

    /// The stream reads one bounded chunk at a time: entries removed after
    /// the first chunk was read are not yielded (openraft's default read
    /// the whole range before yielding the first entry).
    #[tokio::test]
    async fn the_apply_stream_reads_a_bounded_chunk_at_a_time() {
        let (_dir, mut store) = store_with_large_entries();
        let mut reader = store.clone();
        let mut stream = std::pin::pin!(reader.entries_stream(1..=ENTRIES).await);
        let first = stream.next().await.expect("first").expect("entry");
        assert_eq!(first.log_id.index, 1);
        store
            .truncate_after(Some(first.log_id))
            .await
            .expect("truncate");
        let rest: Vec<Entry> = stream.map(|e| e.expect("entry")).collect().await;
        assert_eq!(indexes(&rest), vec![2], "only the rest of the first chunk");
    }

    /// Seeded random appends (some entries larger than the whole cache),
    /// truncations, purges and reads: every read answers what the segment
    /// files alone answer, and the cache served some of them.
    #[tokio::test]
    async fn the_tail_cache_answers_what_the_files_hold() {
        use rand::{Rng, SeedableRng};
        const CACHE_BYTES: usize = 4096;
        const STEPS: usize = 3_000;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = open_in(&dir);
        *store.tail() = TailCache::new(CACHE_BYTES);
        let (mut first, mut last, mut term) = (1u64, 0u64, 1u64);
        for _ in 0..STEPS {
            match rng.gen_range(0..10) {
                0..=3 => {
                    let count = rng.gen_range(1..4);
                    let entries: Vec<Entry> = (last + 1..=last + count)
                        .map(|index| {
                            let value = if rng.gen_ratio(1, 20) { 5_000 } else { 300 };
                            entry_of(term, index, value)
                        })
                        .collect();
                    store
                        .append(entries, IOFlushed::noop())
                        .await
                        .expect("append");
                    last += count;
                }
                4 if last > first => {
                    let keep = rng.gen_range(first..=last);
                    let keep_id = LogId::new(LeaderId { term, node_id: 1 }, keep);
                    store.truncate_after(Some(keep_id)).await.expect("truncate");
                    last = keep;
                    term += 1;
                }
                5 if last > first + 4 => {
                    let upto = rng.gen_range(first..last - 2);
                    let upto_id = LogId::new(LeaderId { term, node_id: 1 }, upto);
                    store.purge(upto_id).await.expect("purge");
                    first = upto + 1;
                }
                _ => {
                    // Also from below the purged index (openraft does not, but
                    // the answers must still be the files').
                    let start = rng.gen_range(first.saturating_sub(3)..=last + 1);
                    let end = rng.gen_bool(0.5).then(|| rng.gen_range(start..=last + 2));
                    let max_bytes = [usize::MAX, 1, 700, 2_000][rng.gen_range(0..4)];
                    let cached = store.read_entries(start, end, max_bytes).expect("read");
                    let files = store
                        .read_file_entries(start, end, max_bytes)
                        .expect("file read");
                    assert_eq!(cached, files, "[{start}, {end:?}) max {max_bytes}");
                }
            }
            store.tail().assert_consistent();
        }
        assert!(store.tail().hits() > 100, "the cache served reads");
        let before = store.read_file_entries(0, None, usize::MAX).expect("read");
        let state = store.get_log_state().await.expect("state");
        drop(store);
        let mut reopened = open_in(&dir);
        assert_eq!(reopened.get_log_state().await.expect("state"), state);
        assert_eq!(
            reopened
                .read_file_entries(0, None, usize::MAX)
                .expect("read"),
            before
        );
    }

    async fn append(store: &mut LogStore, term: u64, indexes: std::ops::RangeInclusive<u64>) {
        let entries: Vec<Entry> = indexes.map(|i| entry_of(term, i, 300)).collect();
        store
            .append(entries, IOFlushed::noop())
            .await
            .expect("append");
    }

    #[tokio::test]
    async fn a_reopened_log_has_its_entries_vote_commit_and_purge_point() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = open_in(&dir);
        append(&mut store, 1, 1..=20).await;
        let vote = Vote::new(3, 2);
        store.save_vote(&vote).await.expect("vote");
        store
            .save_committed(Some(log_id(1, 12)))
            .await
            .expect("commit");
        store
            .truncate_after(Some(log_id(1, 15)))
            .await
            .expect("truncate");
        append(&mut store, 3, 16..=18).await;
        store.purge(log_id(1, 5)).await.expect("purge");
        drop(store);
        let mut store = open_in(&dir);
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(state.last_log_id, Some(log_id(3, 18)));
        assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            store.read_committed().await.expect("commit"),
            Some(log_id(1, 12))
        );
        let entries = store.try_get_log_entries(0..100).await.expect("read");
        assert_eq!(indexes(&entries), (6..=18).collect::<Vec<_>>());
        assert_eq!(entries[9].log_id, log_id(1, 15));
        assert_eq!(entries[10].log_id, log_id(3, 16));
        // Everything purged: the log is empty and goes on after the point.
        store.purge(log_id(3, 30)).await.expect("purge");
        drop(store);
        let mut store = open_in(&dir);
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(log_id(3, 30)));
        append(&mut store, 4, 31..=31).await;
        assert_eq!(
            indexes(&store.try_get_log_entries(0..100).await.expect("read")),
            vec![31]
        );
    }

    /// Segments holding only purged entries are removed; the log reopens
    /// with its vote and entries (the vote was written in a removed one).
    #[tokio::test]
    async fn purged_segments_are_removed_and_the_log_reopens() {
        const SEGMENT_BYTES: u64 = 8 * 1024;
        let dir = tempfile::tempdir().expect("tempdir");
        let open = || {
            let options = WalOptions {
                segment_bytes: SEGMENT_BYTES,
                ..log_options()
            };
            LogStore::open_with(
                Arc::new(MemoryEngine::new()),
                &dir.path().join("log"),
                options,
            )
            .expect("open")
        };
        let mut store = open();
        store.save_vote(&Vote::new(2, 1)).await.expect("vote");
        for index in 1..=200 {
            append(&mut store, 2, index..=index).await;
        }
        let before = store.log().wal.segment_count();
        assert!(before > 5, "{before} segments");
        store.purge(log_id(2, 150)).await.expect("purge");
        let after = store.log().wal.segment_count();
        assert!(after < before / 2, "{after} of {before} segments left");
        drop(store);
        let mut store = open();
        assert_eq!(
            store.read_vote().await.expect("vote"),
            Some(Vote::new(2, 1))
        );
        let entries = store.try_get_log_entries(0..1000).await.expect("read");
        assert_eq!(indexes(&entries), (151..=200).collect::<Vec<_>>());
    }
}

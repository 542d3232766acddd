//! The Raft log and vote, stored in the engine, with group commit.
//!
//! Layout: [`Table::RaftLog`] maps the 8-byte big-endian log index to the
//! bincode of the openraft entry; [`Table::RaftState`] holds the vote, the
//! last purged log id and the committed log id.
//!
//! Group commit: `append` writes the entries unsynced and hands openraft's
//! completion callback to one flusher thread. The flusher takes every
//! callback queued so far (up to [`GROUP_COMMIT_MAX_PENDING`]), makes them
//! durable with one `Engine::sync` (one fsync of the shared WAL), then
//! completes them in order. While one fsync runs, the next appends queue up
//! behind it, so under load many appends share one fsync. A callback is only
//! completed after the sync that covers its entries returns, so openraft
//! never counts an entry as stored before it is on disk.
//!
//! Tail cache: the entries an append writes are also kept in memory, the
//! newest [`LOG_TAIL_CACHE_BYTES`] of them ([`TailCache`]), as etcd's raft
//! keeps its log's tail in memory. Replication (one read per follower) and
//! the state machine (one read per member) take clones from there (a
//! [`super::types::Batch`] shares its proposals), so the leader no longer
//! reads and decodes each entry three times from the engine. Truncation
//! and purging remove the same entries from both; a read the cache cannot
//! serve whole goes to the engine.
//!
//! openraft 0.10 does not wait for the callback before it replicates: the
//! leader sends new entries to the followers while its own fsync runs (as
//! etcd writes its WAL in parallel with sending), and counts itself towards
//! the commit quorum only once the callback says its copy is durable.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, ControlFlow, RangeBounds};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};

use futures::{stream, Stream, StreamExt};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use super::types::{Entry, LogId, TypeConfig, Vote};
use crate::codec;
use crate::engine::{Engine, Table, WriteBatch};
use crate::limits::{
    GROUP_COMMIT_MAX_PENDING, LOG_TAIL_CACHE_BYTES, MAX_APPEND_ENTRIES_BYTES, MAX_APPLY_READ_BYTES,
};

const KEY_VOTE: &[u8] = b"vote";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_COMMITTED: &[u8] = b"committed";

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// An engine failure as the storage error openraft takes, naming what failed.
pub(crate) fn io_error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// The Raft log storage. Cheap to clone (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn Engine>,
    flusher: Arc<Flusher>,
    /// The commit index openraft last saved, not yet written: it goes to
    /// the engine with the next append (see `save_committed`).
    committed: Arc<Mutex<Option<Option<LogId>>>>,
    /// The newest entries, shared by every clone (see the module docs).
    tail: Arc<Mutex<TailCache>>,
}

/// The newest log entries in memory, with their encoded sizes: a
/// contiguous run of indexes ending at the log's last entry, or empty.
/// Every append pushes its entries; every truncation and purge removes
/// theirs, so a cached entry is always the one the engine holds at its
/// index.
#[derive(Debug)]
struct TailCache {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    limit: usize,
    /// Reads served from memory (the tests check that the cache serves).
    hits: u64,
}

impl TailCache {
    fn new(limit: usize) -> Self {
        TailCache {
            entries: VecDeque::new(),
            bytes: 0,
            limit,
            hits: 0,
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Adds the entry appended after the current last one. An entry that
    /// does not follow it (the log was truncated or jumped past a snapshot
    /// without this cache seeing it) starts a new run; one larger than the
    /// whole cache leaves it empty. The oldest entries go past the limit.
    fn push(&mut self, entry: Entry, size: usize) {
        let follows = self
            .entries
            .back()
            .is_none_or(|(last, _)| last.log_id.index.checked_add(1) == Some(entry.log_id.index));
        if !follows || size > self.limit {
            self.clear();
        }
        if size > self.limit {
            return;
        }
        self.bytes += size;
        self.entries.push_back((entry, size));
        while self.bytes > self.limit {
            let Some((_, oldest)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= oldest;
        }
    }

    /// Drops the entries after `last` (all of them for `None`).
    fn truncate_after(&mut self, last: Option<u64>) {
        while let Some((entry, size)) = self.entries.back() {
            if last.is_some_and(|last| entry.log_id.index <= last) {
                break;
            }
            self.bytes -= size;
            self.entries.pop_back();
        }
    }

    /// Drops the entries up to and including `upto`.
    fn purge(&mut self, upto: u64) {
        while let Some((entry, size)) = self.entries.front() {
            if entry.log_id.index > upto {
                break;
            }
            self.bytes -= size;
            self.entries.pop_front();
        }
    }

    /// The entries in `[start, end)` (`end` `None`: to the last) under the
    /// same byte rule as the engine read, if the cache holds all of them.
    fn read(&mut self, start: u64, end: Option<u64>, max_bytes: usize) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.0.log_id.index;
        let after_last = self.entries.back()?.0.log_id.index + 1;
        let end = end.unwrap_or(after_last);
        if start < first || end > after_last {
            return None;
        }
        self.hits += 1;
        if start >= end {
            return Some(Vec::new());
        }
        let mut entries = Vec::new();
        let mut bytes = 0;
        let from = usize::try_from(start - first).ok()?;
        for (entry, size) in self.entries.range(from..) {
            if entry.log_id.index >= end {
                break;
            }
            entries.push(entry.clone());
            bytes += size;
            if bytes >= max_bytes {
                break;
            }
        }
        Some(entries)
    }
}

/// The flusher thread's queue and handle. When the last log store clone
/// goes, the queue closes and the thread is joined, so no thread outlives
/// the store while still holding (and possibly closing) the engine: a
/// RocksDB closed by a detached thread during process exit aborts.
struct Flusher {
    /// Callbacks of appends waiting for the flusher's next sync.
    queue: Option<SyncSender<IOFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl LogStore {
    /// The log store on `engine`, starting its flusher thread. Syncs first,
    /// so everything the log holds is durable before openraft reads it.
    pub fn open(engine: Arc<dyn Engine>) -> io::Result<Self> {
        engine
            .sync()
            .map_err(|e| io_error("syncing the raft log", e))?;
        let (queue, rx) = sync_channel(GROUP_COMMIT_MAX_PENDING);
        let flush_engine = engine.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || run_flusher(flush_engine, rx))?;
        Ok(Self {
            engine,
            flusher: Arc::new(Flusher {
                queue: Some(queue),
                thread: Some(thread),
            }),
            committed: Arc::default(),
            tail: Arc::new(Mutex::new(TailCache::new(LOG_TAIL_CACHE_BYTES))),
        })
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, TailCache> {
        self.tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn pending_committed(&self) -> std::sync::MutexGuard<'_, Option<Option<LogId>>> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes `entries` and makes them durable at once, outside openraft's
    /// append protocol: for repairs made before Raft starts
    /// ([`super::recovery`]).
    pub fn append_synced(&self, entries: &[Entry]) -> io::Result<()> {
        let (b, _) = entries_batch(entries);
        self.tail().clear();
        self.engine
            .write(b, true)
            .map_err(|e| io_error("writing raft log entries", e))
    }
}

fn read_state<T: serde::de::DeserializeOwned>(
    engine: &dyn Engine,
    key: &[u8],
) -> io::Result<Option<T>> {
    let Some(bytes) = engine
        .get(Table::RaftState, key)
        .map_err(|e| io_error("reading raft state", e))?
    else {
        return Ok(None);
    };
    codec::decode(&bytes)
        .map(Some)
        .map_err(|e| io_error("decoding raft state", e))
}

fn last_entry_log_id(engine: &dyn Engine) -> io::Result<Option<LogId>> {
    let mut last = None;
    engine
        .scan_reverse(Table::RaftLog, &[], None, &mut |_, v| {
            last = Some(v.to_vec());
            ControlFlow::Break(())
        })
        .map_err(|e| io_error("reading the raft log", e))?;
    match last {
        None => Ok(None),
        Some(bytes) => {
            let entry: Entry =
                codec::decode(&bytes).map_err(|e| io_error("decoding a raft log entry", e))?;
            Ok(Some(entry.log_id))
        }
    }
}

/// One engine batch writing `entries` to the log, and each entry's encoded
/// size (what the tail cache counts).
fn entries_batch(entries: &[Entry]) -> (WriteBatch, Vec<usize>) {
    let mut b = WriteBatch::new();
    let mut sizes = Vec::with_capacity(entries.len());
    for entry in entries {
        let encoded = codec::encode(entry);
        sizes.push(encoded.len());
        b.put(
            Table::RaftLog,
            index_key(entry.log_id.index).to_vec(),
            encoded,
        );
    }
    (b, sizes)
}

/// The flusher loop: batch appends, one sync per batch, then complete the
/// callbacks in order.
fn run_flusher(engine: Arc<dyn Engine>, rx: Receiver<IOFlushed<TypeConfig>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT_MAX_PENDING {
            match rx.try_recv() {
                Ok(cb) => batch.push(cb),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let started = std::time::Instant::now();
        let result = engine.sync();
        crate::metrics::global()
            .disk
            .wal_fsync
            .observe(started.elapsed().as_secs_f64());
        for callback in batch {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io_error("syncing the raft log", e)),
            };
            callback.io_completed(r);
        }
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
        self.read_engine_entries(start, end, max_bytes)
    }

    /// [`LogStore::read_entries`] from the engine alone.
    fn read_engine_entries(
        &self,
        start: u64,
        end: Option<u64>,
        max_bytes: usize,
    ) -> io::Result<Vec<Entry>> {
        let start = index_key(start);
        let end = end.map(index_key);
        let mut entries = Vec::new();
        let mut bytes = 0;
        let mut failure = None;
        self.engine
            .scan(
                Table::RaftLog,
                &start,
                end.as_ref().map(|e| &e[..]),
                &mut |_, v| {
                    match codec::decode::<Entry>(v) {
                        Ok(e) => entries.push(e),
                        Err(e) => {
                            failure = Some(e);
                            return ControlFlow::Break(());
                        }
                    }
                    bytes += v.len();
                    if bytes >= max_bytes {
                        return ControlFlow::Break(());
                    }
                    ControlFlow::Continue(())
                },
            )
            .map_err(|e| io_error("reading the raft log", e))?;
        if let Some(e) = failure {
            return Err(io_error("decoding a raft log entry", e));
        }
        Ok(entries)
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
        read_state(self.engine.as_ref(), KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let engine = self.engine.as_ref();
        let last_purged_log_id: Option<LogId> = read_state(engine, KEY_LAST_PURGED)?;
        let last_log_id = last_entry_log_id(engine)?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let mut b = WriteBatch::new();
        b.put(Table::RaftState, KEY_VOTE.to_vec(), codec::encode(vote));
        self.engine
            .write(b, true)
            .map_err(|e| io_error("saving the vote", e))
    }

    /// Keeps the commit index in memory; the next append writes it in the
    /// same engine batch as its entries. openraft awaits this before it
    /// applies each commit, so an engine write here was one more write on
    /// every write's path, on the leader and on each follower. The commit
    /// index is optional state (openraft recovers it from the leader, and
    /// takes the applied index when it is lower): after a crash it may be a
    /// few entries behind, which only means re-applying from the last
    /// applied index, as before.
    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        *self.pending_committed() = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        if let Some(pending) = *self.pending_committed() {
            return Ok(pending);
        }
        Ok(read_state::<Option<LogId>>(self.engine.as_ref(), KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let (mut b, sizes) = entries_batch(&entries);
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        if let Some(committed) = self.pending_committed().take() {
            b.put(
                Table::RaftState,
                KEY_COMMITTED.to_vec(),
                codec::encode(&committed),
            );
        }
        let written = self.engine.write(b, false);
        let mut tail = self.tail();
        if written.is_err() {
            // What reached the engine is unknown: serve reads from it.
            tail.clear();
        } else {
            for (entry, size) in entries.into_iter().zip(sizes) {
                tail.push(entry, size);
            }
        }
        drop(tail);
        written.map_err(|e| io_error("writing raft log entries", e))?;
        let queue = self.flusher.queue.as_ref().expect("open until dropped");
        queue
            .send(callback)
            .map_err(|_| io::Error::other("the raft log flusher stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.tail().truncate_after(last_log_id.map(|l| l.index));
        let mut b = WriteBatch::new();
        b.delete_range(
            Table::RaftLog,
            index_key(from).to_vec(),
            index_key(u64::MAX).to_vec(),
        );
        self.engine
            .write(b, true)
            .inspect_err(|_| self.tail().clear())
            .map_err(|e| io_error("truncating the raft log", e))
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.tail().purge(log_id.index);
        let mut b = WriteBatch::new();
        b.put(
            Table::RaftState,
            KEY_LAST_PURGED.to_vec(),
            codec::encode(&log_id),
        );
        b.delete_range(
            Table::RaftLog,
            index_key(0).to_vec(),
            index_key(log_id.index + 1).to_vec(),
        );
        self.engine
            .write(b, false)
            .inspect_err(|_| self.tail().clear())
            .map_err(|e| io_error("purging the raft log", e))
    }
}

#[cfg(test)]
mod tests {
    use etcd_proto::etcdserverpb::PutRequest;
    use futures::StreamExt;
    use openraft::EntryPayload;

    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::raft::types::{Batch, Command, LeaderId, Proposal};

    /// Entries of this many value bytes: two fit under the 1 MiB bounds,
    /// the second one reaches them.
    const VALUE_BYTES: usize = 600 * 1024;
    const ENTRIES: u64 = 6;

    fn store_with_large_entries() -> LogStore {
        let store = LogStore::open(Arc::new(MemoryEngine::new())).expect("open");
        let entries: Vec<Entry> = (1..=ENTRIES)
            .map(|index| entry_of(1, index, VALUE_BYTES))
            .collect();
        store.append_synced(&entries).expect("append");
        store
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn an_append_message_stops_at_the_entry_reaching_the_byte_bound() {
        let mut store = store_with_large_entries();
        let first = store.limited_get_log_entries(1, ENTRIES + 1).await;
        assert_eq!(indexes(&first.expect("read")), vec![1, 2]);
        let tail = store.limited_get_log_entries(ENTRIES, ENTRIES + 1).await;
        assert_eq!(indexes(&tail.expect("read")), vec![ENTRIES]);
    }

    #[tokio::test]
    async fn the_apply_stream_yields_the_range_in_order_across_reads() {
        let mut store = store_with_large_entries();
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
        let mut store = store_with_large_entries();
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

    /// An entry of `value_bytes` at `index` in `term`.
    fn entry_of(term: u64, index: u64, value_bytes: usize) -> Entry {
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

    /// Seeded random appends (some entries larger than the whole cache),
    /// truncations, purges and reads: every read answers what the engine
    /// alone answers, and the cache served some of them.
    #[tokio::test]
    async fn the_tail_cache_answers_what_the_engine_holds() {
        use rand::{Rng, SeedableRng};
        const CACHE_BYTES: usize = 4096;
        const STEPS: usize = 3_000;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut store = LogStore::open(Arc::new(MemoryEngine::new())).expect("open");
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
                    // the answers must still be the engine's).
                    let start = rng.gen_range(first.saturating_sub(3)..=last + 1);
                    let end = rng.gen_bool(0.5).then(|| rng.gen_range(start..=last + 2));
                    let max_bytes = [usize::MAX, 1, 700, 2_000][rng.gen_range(0..4)];
                    let cached = store.read_entries(start, end, max_bytes).expect("read");
                    let engine = store
                        .read_engine_entries(start, end, max_bytes)
                        .expect("engine read");
                    assert_eq!(cached, engine, "[{start}, {end:?}) max {max_bytes}");
                }
            }
            let tail = store.tail();
            assert!(tail.bytes <= CACHE_BYTES);
            assert_eq!(
                tail.bytes,
                tail.entries.iter().map(|(_, size)| size).sum::<usize>()
            );
        }
        assert!(store.tail().hits > 100, "the cache served reads");
    }

    #[test]
    fn the_tail_cache_keeps_a_contiguous_run_within_its_bound() {
        let mut tail = TailCache::new(1_000);
        for index in 1..=5 {
            tail.push(entry_of(1, index, 10), 300);
        }
        let held = |tail: &TailCache| -> Vec<u64> {
            tail.entries.iter().map(|(e, _)| e.log_id.index).collect()
        };
        assert_eq!(held(&tail), vec![3, 4, 5], "the oldest go past the bound");
        assert_eq!(tail.read(2, None, usize::MAX), None, "not all cached");
        assert_eq!(
            tail.read(7, None, usize::MAX),
            Some(Vec::new()),
            "past the last"
        );
        let read = tail.read(3, Some(5), usize::MAX).expect("cached");
        assert_eq!(indexes(&read), vec![3, 4]);
        tail.push(entry_of(2, 9, 10), 300);
        assert_eq!(held(&tail), vec![9], "a gap starts a new run");
        tail.push(entry_of(2, 10, 10), 2_000);
        assert_eq!(held(&tail), Vec::<u64>::new(), "larger than the cache");
        tail.push(entry_of(2, 11, 10), 300);
        tail.push(entry_of(2, 12, 10), 300);
        tail.truncate_after(Some(11));
        assert_eq!(held(&tail), vec![11]);
        tail.purge(11);
        assert_eq!((held(&tail), tail.bytes), (Vec::new(), 0));
    }
}

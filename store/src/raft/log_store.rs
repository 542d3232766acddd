//! The Raft log and vote, stored in the engine, with group commit.
//!
//! Layout: [`Table::RaftLog`] maps the 8-byte big-endian log index to the
//! bincode of the openraft entry; [`Table::RaftState`] holds the vote, the
//! last purged log id and the committed log id.
//!
//! Group commit: `append` writes the entries unsynced and hands the
//! completion callback to one flusher thread. The flusher takes every
//! callback queued so far (up to [`GROUP_COMMIT_MAX_PENDING`]), makes them
//! durable with one `Engine::sync` (one fsync of the shared WAL), then
//! completes them in order. While one fsync runs, the next appends queue up
//! behind it, so under load many client writes share one fsync. A callback
//! is only completed after the sync that covers its entries returns, so
//! nothing is acknowledged before it is on disk.
//!
//! The exception is the leader's own entries: their callback completes as
//! soon as they are written, so openraft replicates them while the fsync
//! runs; what becomes durable is published through [`DurableLog`], and the
//! state machine and the commit index sent to followers wait for it (the
//! argument is in [`super::durable`]).

use std::borrow::Borrow;
use std::fmt::Debug;
use std::ops::{Bound, ControlFlow, RangeBounds};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogId, StorageError, StorageIOError, Vote};

use super::durable::DurableLog;
use super::types::{NodeId, TypeConfig};
use crate::codec;
use crate::engine::{Engine, Table, WriteBatch};
use crate::limits::GROUP_COMMIT_MAX_PENDING;

const KEY_VOTE: &[u8] = b"vote";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_COMMITTED: &[u8] = b"committed";

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

type Flushed = LogFlushed<TypeConfig>;

/// An append waiting for the flusher's next sync: its last log id, and
/// openraft's callback unless it was completed early (a leader's append).
struct Pending {
    last: LogId<NodeId>,
    /// [`DurableLog`]'s truncation generation when it was appended.
    generation: u64,
    callback: Option<Flushed>,
}

/// The Raft log storage. Cheap to clone (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn Engine>,
    flusher: Arc<Flusher>,
    /// This member's id: entries of its own term are its own appends.
    me: NodeId,
    /// The vote last saved (or read at open), to recognise own-term entries.
    vote: Arc<Mutex<Option<Vote<NodeId>>>>,
    durable: Arc<DurableLog>,
}

/// The flusher thread's queue and handle. When the last log store clone
/// goes, the queue closes and the thread is joined, so no thread outlives
/// the store while still holding (and possibly closing) the engine: a
/// RocksDB closed by a detached thread during process exit aborts.
struct Flusher {
    queue: Option<SyncSender<Pending>>,
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
    /// The log store of member `me` on `engine`, starting its flusher
    /// thread. Syncs first, so everything the log holds counts as durable.
    pub fn open(engine: Arc<dyn Engine>, me: NodeId) -> Result<Self, StorageError<NodeId>> {
        engine.sync().map_err(|e| StorageIOError::write_logs(&e))?;
        let vote = read_state(engine.as_ref(), KEY_VOTE)?;
        let durable = DurableLog::new(last_entry_log_id(engine.as_ref())?);
        let (queue, rx) = sync_channel(GROUP_COMMIT_MAX_PENDING);
        let (flush_engine, flush_durable) = (engine.clone(), durable.clone());
        let thread = std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || run_flusher(flush_engine, rx, flush_durable))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(Self {
            engine,
            flusher: Arc::new(Flusher {
                queue: Some(queue),
                thread: Some(thread),
            }),
            me,
            vote: Arc::new(Mutex::new(vote)),
            durable,
        })
    }

    /// What of this log is durable; the state machine and the peer client
    /// wait for and clamp to it.
    pub fn durable(&self) -> Arc<DurableLog> {
        self.durable.clone()
    }

    /// Whether `last` (the last of entries being appended) was proposed by
    /// this member in the term it leads: its own append as leader.
    fn is_own_append(&self, last: &LogId<NodeId>) -> bool {
        let vote = self.vote.lock().expect("vote lock");
        vote.is_some_and(|v| v.leader_id.node_id == self.me && v.leader_id == last.leader_id)
    }

    /// Writes `entries` and makes them durable at once, outside openraft's
    /// append protocol: for repairs made before Raft starts
    /// ([`super::recovery`]).
    pub fn append_synced(&self, entries: &[Entry<TypeConfig>]) -> Result<(), StorageError<NodeId>> {
        let (b, _) = entries_batch(entries);
        self.engine
            .write(b, true)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.durable
            .truncated_to(last_entry_log_id(self.engine.as_ref())?);
        Ok(())
    }
}

fn read_state<T: serde::de::DeserializeOwned>(
    engine: &dyn Engine,
    key: &[u8],
) -> Result<Option<T>, StorageError<NodeId>> {
    let Some(bytes) = engine
        .get(Table::RaftState, key)
        .map_err(|e| StorageIOError::read(&e))?
    else {
        return Ok(None);
    };
    codec::decode(&bytes)
        .map(Some)
        .map_err(|e| StorageIOError::read(&e).into())
}

fn last_entry_log_id(engine: &dyn Engine) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
    let mut last = None;
    engine
        .scan_reverse(Table::RaftLog, &[], None, &mut |_, v| {
            last = Some(v.to_vec());
            ControlFlow::Break(())
        })
        .map_err(|e| StorageIOError::read_logs(&e))?;
    match last {
        None => Ok(None),
        Some(bytes) => {
            let entry: Entry<TypeConfig> =
                codec::decode(&bytes).map_err(|e| StorageIOError::read_logs(&e))?;
            Ok(Some(*entry.get_log_id()))
        }
    }
}

/// One engine batch writing `entries` to the log, and the last one's id.
fn entries_batch<E: Borrow<Entry<TypeConfig>>>(
    entries: impl IntoIterator<Item = E>,
) -> (WriteBatch, Option<LogId<NodeId>>) {
    let mut b = WriteBatch::new();
    let mut last = None;
    for entry in entries {
        let entry = entry.borrow();
        last = Some(*entry.get_log_id());
        b.put(
            Table::RaftLog,
            index_key(entry.get_log_id().index).to_vec(),
            codec::encode(entry),
        );
    }
    (b, last)
}

/// The flusher loop: batch appends, one sync per batch, publish the new
/// durable end, then complete the callbacks in order.
fn run_flusher(engine: Arc<dyn Engine>, rx: Receiver<Pending>, durable: Arc<DurableLog>) {
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
        match &result {
            Ok(()) => {
                let newest = batch.last().expect("non-empty batch");
                durable.advance(newest.last, newest.generation)
            }
            Err(_) => durable.fail(),
        }
        for cb in batch.into_iter().filter_map(|p| p.callback) {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            cb.log_io_completed(r);
        }
    }
    durable.close();
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

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let start = index_key(bound_start(range.start_bound()));
        let end = bound_end(range.end_bound()).map(index_key);
        let mut entries = Vec::new();
        let mut failure = None;
        self.engine
            .scan(
                Table::RaftLog,
                &start,
                end.as_ref().map(|e| &e[..]),
                &mut |_, v| {
                    match codec::decode::<Entry<TypeConfig>>(v) {
                        Ok(e) => entries.push(e),
                        Err(e) => {
                            failure = Some(e);
                            return ControlFlow::Break(());
                        }
                    }
                    ControlFlow::Continue(())
                },
            )
            .map_err(|e| StorageIOError::read_logs(&e))?;
        if let Some(e) = failure {
            return Err(StorageIOError::read_logs(&e).into());
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let engine = self.engine.as_ref();
        let last_purged_log_id: Option<LogId<NodeId>> = read_state(engine, KEY_LAST_PURGED)?;
        let last_log_id = last_entry_log_id(engine)?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut b = WriteBatch::new();
        b.put(Table::RaftState, KEY_VOTE.to_vec(), codec::encode(vote));
        self.engine
            .write(b, true)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        *self.vote.lock().expect("vote lock") = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        read_state(self.engine.as_ref(), KEY_VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut b = WriteBatch::new();
        b.put(
            Table::RaftState,
            KEY_COMMITTED.to_vec(),
            codec::encode(&committed),
        );
        // Not synced: losing it only means re-applying from the last applied.
        self.engine
            .write(b, false)
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(read_state::<Option<LogId<NodeId>>>(self.engine.as_ref(), KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (b, last) = entries_batch(entries);
        let Some(last) = last else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        self.engine
            .write(b, false)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // A leader's own entries are acknowledged now and synced by the
        // flusher meanwhile; anyone else's after the sync.
        let (now, after_sync) = if self.is_own_append(&last) {
            (Some(callback), None)
        } else {
            (None, Some(callback))
        };
        let queue = self.flusher.queue.as_ref().expect("open until dropped");
        queue
            .send(Pending {
                last,
                generation: self.durable.current().generation,
                callback: after_sync,
            })
            .map_err(|_| {
                StorageIOError::write_logs(&std::io::Error::other("log flusher stopped"))
            })?;
        if let Some(cb) = now {
            cb.log_io_completed(Ok(()));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut b = WriteBatch::new();
        b.delete_range(
            Table::RaftLog,
            index_key(log_id.index).to_vec(),
            index_key(u64::MAX).to_vec(),
        );
        self.engine
            .write(b, true)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // The write was synced, so all that remains is durable.
        self.durable
            .truncated_to(last_entry_log_id(self.engine.as_ref())?);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
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
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

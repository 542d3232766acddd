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

use std::fmt::Debug;
use std::ops::{Bound, ControlFlow, RangeBounds};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogId, StorageError, StorageIOError, Vote};

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

/// The Raft log storage. Cheap to clone (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn Engine>,
    flusher: Arc<Flusher>,
}

/// The flusher thread's queue and handle. When the last log store clone
/// goes, the queue closes and the thread is joined, so no thread outlives
/// the store while still holding (and possibly closing) the engine: a
/// RocksDB closed by a detached thread during process exit aborts.
struct Flusher {
    queue: Option<SyncSender<Flushed>>,
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
    /// A log store on `engine`, starting its flusher thread.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        let (queue, rx) = sync_channel(GROUP_COMMIT_MAX_PENDING);
        let flush_engine = engine.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || run_flusher(flush_engine, rx))
            .expect("spawn flusher thread");
        let flusher = Arc::new(Flusher {
            queue: Some(queue),
            thread: Some(thread),
        });
        Self { engine, flusher }
    }

    fn read_state<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError<NodeId>> {
        let Some(bytes) = self
            .engine
            .get(Table::RaftState, key)
            .map_err(|e| StorageIOError::read(&e))?
        else {
            return Ok(None);
        };
        codec::decode(&bytes)
            .map(Some)
            .map_err(|e| StorageIOError::read(&e).into())
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        let mut last = None;
        self.engine
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

    /// Writes `entries` and makes them durable at once, outside openraft's
    /// append protocol: for repairs made before Raft starts
    /// ([`super::recovery`]).
    pub fn append_synced(&self, entries: &[Entry<TypeConfig>]) -> Result<(), StorageError<NodeId>> {
        let mut b = WriteBatch::new();
        for entry in entries {
            b.put(
                Table::RaftLog,
                index_key(entry.get_log_id().index).to_vec(),
                codec::encode(entry),
            );
        }
        self.engine
            .write(b, true)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// The flusher loop: batch callbacks, one sync per batch, complete in order.
fn run_flusher(engine: Arc<dyn Engine>, rx: Receiver<Flushed>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT_MAX_PENDING {
            match rx.try_recv() {
                Ok(cb) => batch.push(cb),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let result = engine.sync();
        for cb in batch {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            cb.log_io_completed(r);
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
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_state(KEY_LAST_PURGED)?;
        let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
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
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.read_state(KEY_VOTE)
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
        Ok(self
            .read_state::<Option<LogId<NodeId>>>(KEY_COMMITTED)?
            .flatten())
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
        let mut b = WriteBatch::new();
        for entry in entries {
            b.put(
                Table::RaftLog,
                index_key(entry.get_log_id().index).to_vec(),
                codec::encode(&entry),
            );
        }
        self.engine
            .write(b, false)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let queue = self.flusher.queue.as_ref().expect("open until dropped");
        queue.send(callback).map_err(|_| {
            StorageIOError::write_logs(&std::io::Error::other("log flusher stopped"))
        })?;
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
            .map_err(|e| StorageIOError::write_logs(&e).into())
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

//! Group commit ([`Flusher`]): the thread that makes queued appends durable
//! with one sync per batch, then completes their callbacks in order (see
//! the [module docs](super)).

use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};

use openraft::storage::IOFlushed;

use super::records::io_error;
use super::segments::{lock_log, Log};
use crate::limits::GROUP_COMMIT_MAX_PENDING;
use crate::raft::TypeConfig;

/// The flusher thread's queue and handle. When the last log store clone
/// goes, the queue closes and the thread is joined, so no thread outlives
/// the store while still holding (and possibly closing) the engine: a
/// RocksDB closed by a detached thread during process exit aborts.
pub(super) struct Flusher {
    /// Callbacks of appends waiting for the flusher's next sync.
    queue: Option<SyncSender<IOFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    /// Starts the flusher thread of `log`.
    pub(super) fn start(log: Arc<Mutex<Log>>) -> io::Result<Self> {
        let (queue, rx) = sync_channel(GROUP_COMMIT_MAX_PENDING);
        let thread = std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || run_flusher(log, rx))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues the callback of an append written (unsynced) before, for
    /// the next sync.
    pub(super) fn enqueue(&self, callback: IOFlushed<TypeConfig>) -> io::Result<()> {
        let queue = self.queue.as_ref().expect("open until dropped");
        queue
            .send(callback)
            .map_err(|_| io::Error::other("the raft log flusher stopped"))
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The flusher loop: batch appends, one sync per batch, then complete the
/// callbacks in order.
fn run_flusher(log: Arc<Mutex<Log>>, rx: Receiver<IOFlushed<TypeConfig>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT_MAX_PENDING {
            match rx.try_recv() {
                Ok(cb) => batch.push(cb),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // Every queued append wrote before it queued, so into this file or
        // into one synced before this one was created.
        let file = lock_log(&log).wal.current_file();
        let started = std::time::Instant::now();
        let result = file.sync_data();
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

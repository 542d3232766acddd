//! A snapshot that is an engine checkpoint ([`Checkpoint`]): opened
//! read-only, written out to a records file, measured, or streamed as
//! records produced on a thread of their own; removed once replaced and
//! no longer read (see the [module docs](super)).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::file::{SnapshotFile, FILE_BUFFER_BYTES};
use super::names::SENDING_PREFIX;
use super::records::encode_records;
use super::SNAPSHOT_REMOVAL_THREAD;
use crate::engine::{Engine, EngineRead};
use crate::raft::log_store::io_error;
use crate::removal::remove_in_background;

/// An engine checkpoint that is (or was) a snapshot. Once a newer
/// snapshot replaced it, the directory is removed when the last reader
/// (a sender writing it out) lets go.
pub struct Checkpoint {
    pub(super) path: PathBuf,
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
    pub(super) fn new(path: PathBuf, engine: Arc<dyn Engine>) -> Arc<Self> {
        Arc::new(Self {
            path,
            engine,
            retired: AtomicBool::new(false),
            measured: std::sync::OnceLock::new(),
        })
    }

    pub(super) fn open(&self) -> std::io::Result<Arc<dyn EngineRead>> {
        self.engine
            .open_checkpoint(&self.path)
            .map_err(|e| io_error("opening a snapshot checkpoint", e))
    }

    /// The checkpoint's state machine tables written out to a temporary
    /// records file in the snapshot directory.
    pub(super) fn encode(&self) -> std::io::Result<SnapshotFile> {
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

    /// Marks the checkpoint for removal once the last reader lets go (a
    /// newer snapshot replaced it, or it is not to become one).
    pub(super) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// The length of the checkpoint's records: one pass over it that
    /// reads but writes nothing, the first time it is sent.
    pub(super) fn measure(&self) -> std::io::Result<u64> {
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

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            remove_in_background(self.path.clone(), SNAPSHOT_REMOVAL_THREAD);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::state_machine::snapshot_file::testing::{memory_files, names, put_applied};
    use crate::raft::state_machine::snapshot_file::SnapshotSource;

    /// A built checkpoint, measured once, streams in chunks the records a
    /// file written out of it holds, with no file written; a reader that
    /// goes away stops the producer.
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
        let unmeasured = built.source(false).unwrap();
        assert_eq!(
            unmeasured.known_len(),
            None,
            "protocol 2 sends it unmeasured"
        );
        let SnapshotSource::Checkpoint { checkpoint, len } = built.source(true).unwrap() else {
            panic!("a built snapshot is a checkpoint");
        };
        let len = len.expect("measured");
        assert_eq!(len, expected.len() as u64);
        assert_eq!(checkpoint.measured.get(), Some(&len), "measured once");
        assert_eq!(built.source(true).unwrap().known_len(), Some(len));
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
}

//! Receiving a snapshot ([`SnapshotReceiver`]): its chunks written to a
//! temporary file (bypassing the page cache: [`DirectAppender`]) and, while
//! they arrive, read on a thread into the engine's table files that
//! installing it ingests.

use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use super::file::{lock, PreparedInstall, SnapshotFile};
use super::names::{staging_dir_in, RECEIVING_PREFIX};
use super::records::{installed_pairs, invalid, RecordReader};
use crate::direct_io::DirectAppender;
use crate::engine::{Engine, PreparedLoad};
use crate::limits::{MAX_SNAPSHOT_BYTES, SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT};
use crate::raft::log_store::io_error;

/// Why a snapshot over [`MAX_SNAPSHOT_BYTES`] is refused.
const TOO_LARGE: &str = "snapshot larger than the member's limit";

/// Writes a snapshot arriving in chunks to a temporary file in the
/// snapshot directory, refusing more than the sender announced and more
/// than [`MAX_SNAPSHOT_BYTES`]. The file is removed if the receive fails.
/// With [`SnapshotReceiver::prepare_install`], the records are also
/// written into table files as they arrive.
///
/// Peer protocol 1 announces the snapshot's length first; protocol 2 does
/// not (the sender streams a checkpoint without measuring it first) and
/// marks the end instead ([`SnapshotReceiver::end`]). Either way a stream
/// that stops early, because its sender failed to read the snapshot, is
/// refused.
pub struct SnapshotReceiver {
    file: DirectAppender,
    /// The file being received; its `len` counts the bytes so far.
    snapshot: SnapshotFile,
    /// The announced length, if any.
    expected: Option<u64>,
    /// Whether the sender marked the end.
    ended: bool,
    /// The thread writing the table files, while preparing.
    preparing: Option<Feed<PreparedLoad>>,
}

impl SnapshotReceiver {
    /// Starts receiving a snapshot of `expected` bytes (`None`: not
    /// announced; the sender marks the end) into `dir`.
    pub fn create(dir: &Path, expected: Option<u64>) -> std::io::Result<Self> {
        if expected.is_some_and(|n| n > MAX_SNAPSHOT_BYTES) {
            return Err(invalid(TOO_LARGE));
        }
        std::fs::create_dir_all(dir)?;
        let (snapshot, file) = SnapshotFile::create_temporary(dir, RECEIVING_PREFIX)?;
        Ok(Self {
            file: DirectAppender::new(&snapshot.path, file),
            snapshot,
            expected,
            ended: false,
            preparing: None,
        })
    }

    /// The sender marked the end of a snapshot whose length it did not
    /// announce: every byte arrived.
    pub fn end(&mut self) -> std::io::Result<()> {
        if self.expected.is_some() {
            return Err(invalid("an end mark in a snapshot of announced length"));
        }
        self.ended = true;
        Ok(())
    }

    /// Prepares the install on a thread while the chunks arrive: it writes
    /// the records into `engine`'s table files (in a staging directory
    /// beside the file, [`Engine::prepare_load`]), which an install of the
    /// received file then ingests instead of reading the records back. A
    /// failed preparation only falls back to that. The key index is not
    /// built here: the records carry the key history, from which the
    /// installed store loads its index while it serves
    /// ([`crate::mvcc::MvccStore::reload`]); building it from the `kv`
    /// records on a third thread took CPU from the transfer itself.
    pub fn prepare_install(&mut self, engine: Arc<dyn Engine>) -> std::io::Result<()> {
        let staging = staging_dir_in(self.snapshot.path.parent().unwrap_or(Path::new(".")));
        let load = Feed::start("snapshot-load", self.expected, move |records| {
            let mut next = installed_pairs(records);
            engine
                .prepare_load(&staging, &mut next)
                .map_err(|e| io_error("writing a received snapshot's table files", e))
        })?;
        self.preparing = Some(load);
        Ok(())
    }

    /// Appends `chunk` (a blocking write; it waits for the preparing
    /// thread when it is [`SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT`] chunks
    /// behind).
    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.write_owned(chunk.to_vec())
    }

    /// [`SnapshotReceiver::write`] of a chunk the caller gives up (the
    /// preparing thread takes it instead of a copy).
    pub fn write_owned(&mut self, chunk: Vec<u8>) -> std::io::Result<()> {
        if self.ended {
            return Err(invalid("snapshot data after its end mark"));
        }
        let after = self.snapshot.len + chunk.len() as u64;
        match self.expected {
            Some(expected) if after > expected => {
                return Err(invalid("snapshot longer than announced"))
            }
            None if after > MAX_SNAPSHOT_BYTES => return Err(invalid(TOO_LARGE)),
            _ => {}
        }
        self.file.write_all(&chunk)?;
        self.snapshot.len += chunk.len() as u64;
        if let Some(preparing) = &mut self.preparing {
            preparing.send(&Arc::new(chunk));
        }
        Ok(())
    }

    /// The received snapshot, once every announced byte arrived or the
    /// end was marked (and the preparing thread, if any, is done with
    /// it).
    pub fn finish(mut self) -> std::io::Result<SnapshotFile> {
        match self.expected {
            Some(expected) if self.snapshot.len != expected => {
                return Err(invalid("snapshot shorter than announced"))
            }
            None if !self.ended => {
                return Err(invalid("snapshot stream ended before its end mark"))
            }
            _ => {}
        }
        self.file.finish()?;
        if let Some(load) = self.preparing.take().and_then(Feed::finish) {
            *lock(&self.snapshot.prepared) = Some(PreparedInstall { load });
        }
        Ok(self.snapshot)
    }
}

/// A thread reading the received records from a queue of chunks.
struct Feed<T> {
    /// The queue; gone once the thread stopped taking chunks (it failed).
    chunks: Option<SyncSender<Arc<Vec<u8>>>>,
    thread: std::thread::JoinHandle<std::io::Result<T>>,
}

impl<T: Send + 'static> Feed<T> {
    /// Starts `work` on a thread named `name`, reading the `len` bytes of
    /// records the chunks sent to it hold (all of them, when not known).
    fn start(
        name: &str,
        len: Option<u64>,
        work: impl FnOnce(&mut RecordReader<ChunkReader>) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(SNAPSHOT_PREPARE_CHUNKS_IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let chunks = ChunkReader::new(rx);
                let mut records = match len {
                    Some(len) => RecordReader::new(chunks, len),
                    None => RecordReader::until_end(chunks, MAX_SNAPSHOT_BYTES),
                };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Table;
    use crate::raft::state_machine::snapshot_file::names::INGEST_PREFIX;
    use crate::raft::state_machine::snapshot_file::records::Record;
    use crate::raft::state_machine::snapshot_file::testing::{encode, names, record};
    use crate::raft::state_machine::KEY_APPLIED;

    #[test]
    fn a_receiver_takes_exactly_the_announced_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut short = SnapshotReceiver::create(dir.path(), Some(4)).unwrap();
        short.write(b"abc").unwrap();
        assert!(short.finish().is_err());
        let mut long = SnapshotReceiver::create(dir.path(), Some(2)).unwrap();
        assert!(long.write(b"abc").is_err());
        let mut marked = SnapshotReceiver::create(dir.path(), Some(3)).unwrap();
        assert!(marked.end().is_err(), "protocol 1 has no end mark");
        drop((long, marked));
        assert!(SnapshotReceiver::create(dir.path(), Some(MAX_SNAPSHOT_BYTES + 1)).is_err());

        let mut ok = SnapshotReceiver::create(dir.path(), Some(6)).unwrap();
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

    /// Without an announced length (peer protocol 2) the end mark says
    /// every byte arrived: a stream that stops before it is refused, and
    /// so is data after it.
    #[test]
    fn a_receiver_of_unknown_length_takes_the_bytes_before_the_end_mark() {
        let dir = tempfile::tempdir().unwrap();
        let mut unmarked = SnapshotReceiver::create(dir.path(), None).unwrap();
        unmarked.write(b"abc").unwrap();
        let refused = unmarked.finish().unwrap_err();
        assert_eq!(
            refused.to_string(),
            "snapshot stream ended before its end mark"
        );
        let mut after = SnapshotReceiver::create(dir.path(), None).unwrap();
        after.write(b"abc").unwrap();
        after.end().unwrap();
        assert!(after.write(b"d").is_err());
        drop(after);

        let mut ok = SnapshotReceiver::create(dir.path(), None).unwrap();
        ok.write(b"abc").unwrap();
        ok.write(b"def").unwrap();
        ok.end().unwrap();
        let snapshot = ok.finish().unwrap();
        assert_eq!(snapshot.len(), 6);
        assert_eq!(snapshot.chunk_at(0, 6).unwrap(), b"abcdef");
        drop(snapshot);
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

    /// The same with the length announced (peer protocol 1) and with an
    /// end mark instead (protocol 2).
    #[test]
    fn a_prepared_receive_ingests_what_the_file_would() {
        let data = encode(&store_records());
        for announced in [Some(data.len() as u64), None] {
            a_prepared_receive_of(&data, announced);
        }
    }

    fn a_prepared_receive_of(data: &[u8], announced: Option<u64>) {
        let dir = tempfile::tempdir().unwrap();
        let mut receiver = SnapshotReceiver::create(dir.path(), announced).unwrap();
        receiver
            .prepare_install(rocks_engine(&dir.path().join("prepared")))
            .unwrap();
        for chunk in data.chunks(7) {
            receiver.write(chunk).unwrap();
        }
        if announced.is_none() {
            receiver.end().unwrap();
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
        let mut receiver = SnapshotReceiver::create(dir.path(), Some(data.len() as u64)).unwrap();
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
}

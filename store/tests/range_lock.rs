//! A large range loads its values without holding the MVCC state lock:
//! writes commit while it loads, and it still answers the values of the
//! revision it started at (issue 14's bound: an unlimited range used to
//! hold the read lock while loading every match, stalling apply).

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use store::engine::memory::MemoryEngine;
use store::engine::{Engine, EngineRead, EngineResult, ScanVisitor, Table, WriteBatch};
use store::mvcc::{KeyRange, MvccStore, Prev, RangeOptions, RANGE_VALUES_UNDER_LOCK};

/// Keys the range sees: more than are loaded under the lock.
const KEYS: usize = RANGE_VALUES_UNDER_LOCK + 100;
/// Longest a write may wait for the lock before the test calls it stuck
/// (the write needs microseconds; only a held lock makes it wait).
const STUCK: Duration = Duration::from_secs(30);

/// Opens or shuts the gate snapshot reads wait at.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
    /// Snapshot reads that reached the gate.
    waiting: Mutex<usize>,
}

impl Gate {
    fn pass(&self) {
        *self.waiting.lock().unwrap() += 1;
        self.changed.notify_all();
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.changed.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// True once a snapshot read reached the gate, false if none did
    /// within [`STUCK`] (the range loaded without a snapshot).
    fn wait_for_reader(&self) -> bool {
        let waiting = self.waiting.lock().unwrap();
        let (waiting, _) = self
            .changed
            .wait_timeout_while(waiting, STUCK, |w| *w == 0)
            .unwrap();
        *waiting > 0
    }
}

/// The memory engine, whose snapshots' reads wait at a gate.
struct GatedEngine {
    inner: MemoryEngine,
    gate: Arc<Gate>,
}

struct GatedView {
    inner: Arc<dyn EngineRead>,
    gate: Arc<Gate>,
}

impl EngineRead for GatedView {
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        self.gate.pass();
        self.inner.get(table, key)
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        self.inner.scan_range(table, start, end, reverse, visit)
    }
}

impl EngineRead for GatedEngine {
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        self.inner.get(table, key)
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        self.inner.scan_range(table, start, end, reverse, visit)
    }
}

impl Engine for GatedEngine {
    fn write(&self, batch: WriteBatch, sync: bool) -> EngineResult<()> {
        self.inner.write(batch, sync)
    }
    fn sync(&self) -> EngineResult<()> {
        self.inner.sync()
    }
    fn snapshot(&self) -> Arc<dyn EngineRead> {
        Arc::new(GatedView {
            inner: self.inner.snapshot(),
            gate: self.gate.clone(),
        })
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn tables_size_bytes(&self, tables: &[Table]) -> u64 {
        self.inner.tables_size_bytes(tables)
    }
    fn size_in_use_bytes(&self) -> u64 {
        self.inner.size_in_use_bytes()
    }
    fn compact_files(&self) -> EngineResult<()> {
        self.inner.compact_files()
    }
    fn checkpoint(&self, dir: &std::path::Path) -> EngineResult<()> {
        self.inner.checkpoint(dir)
    }
    fn open_checkpoint(&self, dir: &std::path::Path) -> EngineResult<Arc<dyn EngineRead>> {
        self.inner.open_checkpoint(dir)
    }
    fn prepare_load(
        &self,
        staging: &std::path::Path,
        next: &mut store::engine::BulkSource<'_>,
    ) -> store::engine::EngineResult<store::engine::PreparedLoad> {
        self.inner.prepare_load(staging, next)
    }
    fn ingest(&self, load: store::engine::PreparedLoad) -> store::engine::EngineResult<()> {
        self.inner.ingest(load)
    }
}

fn put(mvcc: &MvccStore, key: &str, value: &str) {
    let mut txn = mvcc.write();
    txn.put(key.as_bytes(), value.as_bytes().to_vec(), 0, Prev::Unread)
        .expect("put");
    txn.commit(WriteBatch::new()).expect("commit");
}

#[test]
fn writes_commit_while_a_large_range_loads() {
    let gate = Arc::new(Gate::default());
    let engine = Arc::new(GatedEngine {
        inner: MemoryEngine::new(),
        gate: gate.clone(),
    });
    let mvcc = Arc::new(MvccStore::open(engine).expect("open"));
    for i in 0..KEYS {
        put(&mvcc, &format!("k/{i:05}"), "old");
    }
    let reader = {
        let mvcc = mvcc.clone();
        std::thread::spawn(move || {
            let all = KeyRange::Between(b"k/".to_vec(), b"k0".to_vec());
            mvcc.range(&all, RangeOptions::default()).expect("range")
        })
    };
    if !gate.wait_for_reader() {
        gate.open();
        panic!("the range did not load its values from an engine snapshot");
    }
    // The range is loading values now. A write must not wait for it.
    let (done, committed) = mpsc::channel();
    {
        let mvcc = mvcc.clone();
        std::thread::spawn(move || {
            put(&mvcc, "k/00000", "new");
            let _ = done.send(());
        });
    }
    let stuck = committed.recv_timeout(STUCK).is_err();
    gate.open();
    let result = reader.join().expect("reader");
    assert!(!stuck, "the write waited for the range to load its values");
    assert_eq!(result.kvs.len(), KEYS);
    assert_eq!(result.rev, KEYS as i64 + 1, "the range's own revision");
    assert!(
        result.kvs.iter().all(|kv| kv.value == b"old"),
        "the range answers the values of the revision it started at"
    );
}

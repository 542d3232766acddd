//! RocksDB engine: one column family per [`Table`], one write-ahead log for
//! all of them.
//!
//! Because every table shares one WAL, a synced write makes every earlier
//! write durable too, and [`Engine::sync`] (`FlushWAL(sync=true)`) makes
//! everything written so far durable: the Raft log store calls it before it
//! removes log segments, and the member at a graceful stop.
//!
//! Unsynced writes (the state machine's apply batches) are not written to
//! the WAL file one `write(2)` each: RocksDB keeps them in its user-space
//! WAL buffer (`manual_wal_flush`) and a flusher thread of the engine
//! ([`WalFlusher`]) writes the buffer out at most [`WAL_FLUSH_DELAY`] after
//! the first write it holds, one system call for every write of that
//! interval (a full buffer, 1 MiB, goes out at once). A kill -9 so loses at
//! most that interval of applied writes on this member's disk; the Raft log
//! holds them and replays them at the next start (see `raft::log_store`),
//! as etcd replays its WAL over a backend that commits every 100 ms.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rocksdb::{ColumnFamilyDescriptor, Options, ReadOptions, WriteOptions, DB};

use crate::wal::unique_name;

use super::{
    BatchOp, BulkSource, Engine, EngineError, EngineRead, EngineResult, PreparedLoad, ScanVisitor,
    Table, WriteBatch,
};

/// Memtable size per column family: large enough that bursts of small writes
/// do not flush constantly, small enough to bound memory (5 tables x 64 MiB).
const WRITE_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// Old write-ahead log files kept for reuse instead of deleted. A new WAL
/// then overwrites a recycled file in place: its size and blocks are already
/// on disk, so the `fdatasync` of each group commit writes the data and the
/// cache flush only, where a growing file also writes its inode (RocksDB
/// preallocates with `FALLOC_FL_KEEP_SIZE`, so every append changes the
/// size): 85-100 us instead of 130 us per sync on this machine's disk.
const RECYCLED_WAL_FILES: usize = 2;

/// The WAL size at which RocksDB flushes the tables that still hold data
/// only in the oldest WAL file, so that file can go (and be recycled). The
/// small tables (vote, membership, leases) would otherwise pin every WAL
/// until RocksDB's default, four times the sum of all memtables (1.25 GiB).
const MAX_TOTAL_WAL_BYTES: u64 = 128 * 1024 * 1024;

/// Bytes RocksDB writes to a WAL or table file before it asks the kernel
/// to start writing them out (`sync_file_range`, no wait for the disk).
/// The state machine never syncs its engine on a write's path (the Raft
/// log replays what was lost), so without this its WAL stays dirty in the
/// page cache until the kernel's 30 s expiry and then goes out in one
/// burst of tens of MiB per member, in front of the log's group-commit
/// `fdatasync`: a lone writer saw one put of 100-300 ms in most 5 s runs
/// after a burst of writes (docs/benchmarks.md). Written out 1 MiB at a
/// time, the same bytes queue in small pieces. RocksDB's recommended value.
const BYTES_PER_SYNC: u64 = 1024 * 1024;

/// Bytes per second the engine's flushes and compactions may write, and
/// the refill period of that budget (RocksDB's rate limiter, flushes first).
/// A defragment rewrites the whole store at once; unbounded, its writes
/// saturated the disk and the Raft log's fsyncs on the same disk waited
/// behind them: a paced writer's p99 went from 13 to 200 ms. Refilled every
/// 10 ms (RocksDB's default is 100 ms), a compaction works in slices of
/// 640 KiB instead of bursts of 6.4 MiB, each of which took a core and the
/// page cache for tens of milliseconds: through a defragment at a million
/// keys the paced writer's p99 per second went from 4-9 ms to 2-5 ms.
const BACKGROUND_WRITE_BYTES_PER_SEC: i64 = 64 * 1024 * 1024;
const RATE_LIMIT_REFILL_US: i64 = 10_000;
/// RocksDB's default fairness between high (flush) and low (compaction) priority.
const RATE_LIMIT_FAIRNESS: i32 = 10;

/// The suffix and extension of the directory beside the engine's where a
/// defragment holds the files it replaces
/// (`member/db.defrag-hold-<unique_name>.hold`), and the thread that frees
/// them ([`Engine::compact_files`]). One a crash left is freed the same way
/// at the next open.
const HOLD_SUFFIX: &str = ".defrag-hold-";
const HOLD_EXTENSION: &str = "hold";
const HOLD_REMOVAL_THREAD: &str = "defrag-release";

/// Longest time an unsynced write waits in RocksDB's user-space WAL buffer
/// before [`WalFlusher`] writes it to the WAL file (the bound on what a
/// kill -9 takes from the engine's files; the Raft log replays it). At
/// 256 writers one `write(2)` per apply batch cost ~2.4% of a member's CPU
/// (1,940 a second on one member, docs/benchmarks.md); one per 5 ms is at
/// most 200.
pub const WAL_FLUSH_DELAY: Duration = Duration::from_millis(5);

/// Block cache shared by every table (data, index and filter blocks).
const BLOCK_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// The block cache is split into `2^BLOCK_CACHE_SHARD_BITS` shards of
/// 16 MiB. A block larger than its shard is never kept: RocksDB's default
/// of 64 shards (1 MiB each) made every point read of a 1M-key database
/// re-read its table file's whole filter (1.2 MB) and index (2.6 MB) block
/// from the file. Partitioned index and filters (below) keep blocks small;
/// big shards still hold the monolithic blocks of files written before.
const BLOCK_CACHE_SHARD_BITS: i32 = 2;
/// Size of one index or filter partition: a point read loads the pinned
/// top-level index, then one partition of each, not the file's whole index
/// and filter (whose size grows with the keys in the file).
const METADATA_BLOCK_BYTES: usize = 4 * 1024;
/// Bloom filter bits per key: ~1% false positives, so a point read (the
/// MVCC store reads values by revision) probes only the files that hold
/// the key instead of every L0 file and one file per level.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

/// Share of each `kv` memtable given to a whole-key bloom filter, so a
/// point read by revision skips the memtables that do not hold it (after a
/// put load, the active and immutable memtables hold the recent keys).
/// Other tables are read by scans or rarely, and go without.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;

/// The bloom filter's bytes in one `kv` memtable: RocksDB allocates them
/// from the memtable's arena up front, so the memtable size properties
/// count them; the size reports take them out again (an empty store is
/// not 1.3 MiB).
const MEMTABLE_BLOOM_BYTES: u64 = (WRITE_BUFFER_BYTES as f64 * MEMTABLE_BLOOM_RATIO) as u64;

/// Seconds a bottommost table file must age before RocksDB rewrites it
/// only to drop what a released snapshot protected (a `BottommostFiles`
/// compaction): never, in effect (`u32::MAX` seconds is 136 years).
/// `kv`'s keys are revisions, always new, so its files move down the levels
/// without being rewritten and keep their sequence numbers; releasing any
/// engine snapshot (a large Range, HashKV, a snapshot sent to a follower)
/// then marked every such file, and each member rewrote its whole `kv`
/// table (1 GiB at a million keys) at the background write rate, stalling
/// writes for the duration. Deleted revisions still go when an ordinary
/// compaction or a defragmentation rewrites their files.
const BOTTOMMOST_REWRITE_DELAY_SECS: u32 = u32::MAX;

/// The `meta` table's level sizes: its base level (where L0's files are
/// compacted into) holds at most `META_LEVEL_BASE_BYTES`, in files of
/// `META_TARGET_FILE_BYTES`. `meta` holds the key history (an entry per
/// revision, ordered by key) beside the marks written with every apply
/// batch (`consistent_index`, the current revision), so every L0 file spans
/// the table's whole key range and each L0 compaction rewrites the whole
/// base level. With RocksDB's defaults (a 256 MiB base) the base level was
/// the last, the whole history: at 8M keys each member rewrote 60-140 MB
/// every 18 s of a put load, work that grows with the keys (the load's p99
/// went from 44.6 ms at 1M keys to 67.5 ms at 8M). With a 16 MiB base the
/// history sits below it in more levels, and an L0 compaction rewrites at
/// most the base level whatever the store's size.
const META_LEVEL_BASE_BYTES: u64 = 16 * 1024 * 1024;
const META_TARGET_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Largest table file a bulk load writes before it starts the next
/// (RocksDB's default target file size).
const BULK_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Block cache of the table-file writers of a bulk load (they read nothing
/// back; the table options want one).
const BULK_BLOCK_CACHE_BYTES: usize = 1024 * 1024;

/// Block cache of a checkpoint opened to be read (a snapshot being sent
/// reads each block once, in order).
const CHECKPOINT_BLOCK_CACHE_BYTES: usize = 8 * 1024 * 1024;

/// Table files a checkpoint opened to be read keeps open at once (opened
/// as a read needs them). RocksDB's default opens every table file of the
/// checkpoint when it opens, reading each file's index and filter into
/// memory on 16 threads; every snapshot the member takes (one every few
/// seconds under a put load) opens its checkpoint to read two meta keys,
/// so at 8M keys each one read the index and filter blocks of some 300
/// table files, work that grows with the store.
const CHECKPOINT_OPEN_FILES: i32 = 64;

/// Table files the engine keeps open at once (RocksDB's table cache; a
/// file beyond it is opened again when a read needs it). RocksDB's default,
/// no bound, opens every table file when the engine opens, reading each
/// file's footer, properties and top-level index and filter: start-up I/O
/// that grows with the store, some 200 files at 8M keys of 1 KiB. With the
/// page cache dropped and the disk idle that open took 62 ms; right after a
/// put load, with compactions writing 200-350 MB/s, 1.5 s. Bounded, the
/// open loads 16 files and the rest as reads reach them (a file written
/// since, by a flush or compaction, still keeps its reader pinned while
/// the cache is under a quarter full): at 8M keys with the page cache
/// dropped a follower served 394 ms after its restart against 613 ms, the
/// whole cluster 415 against 583 ms (docs/benchmark-history.md). Room for
/// every file of a store at the 16 GiB default quota (64 MiB `kv` files,
/// 4 MiB `meta` ones), whose readers then stay open; each open file holds
/// a descriptor (the binary raises its soft limit to the hard one, as Go
/// does for etcd).
const ENGINE_OPEN_FILES: i32 = 1024;

/// A RocksDB-backed engine.
pub struct RocksEngine {
    db: Arc<DB>,
    /// Writes the WAL buffer out (None for a checkpoint opened to be read).
    flusher: Option<WalFlusher>,
}

/// The thread that writes RocksDB's user-space WAL buffer to the WAL file
/// within [`WAL_FLUSH_DELAY`] of the first write it holds.
///
/// A write marks the buffer dirty; the first mark of an interval wakes the
/// thread, which sleeps the delay (later writes of the interval join the
/// same flush), clears the mark and calls `FlushWAL(sync=false)`. A write
/// that lands after the clear marks the buffer again and so gets the next
/// flush. Dropping the flusher stops the thread after a last synced flush.
struct WalFlusher {
    shared: Arc<FlushShared>,
    thread: Option<JoinHandle<()>>,
}

struct FlushShared {
    /// Some write since the last flush started.
    dirty: AtomicBool,
    /// Set when the engine is dropped.
    stop: Mutex<bool>,
    wake: Condvar,
}

impl WalFlusher {
    fn start(db: Arc<DB>) -> std::io::Result<Self> {
        let shared = Arc::new(FlushShared {
            dirty: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("engine-wal-flush".into())
            .spawn(move || flush_loop(&db, &thread_shared))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Called after each unsynced write.
    fn mark_dirty(&self) {
        if !self.shared.dirty.swap(true, Ordering::AcqRel) {
            // Notify under the lock: the thread checks the mark under it,
            // so the wake-up cannot fall between its check and its wait.
            let _stop = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_one();
        }
    }
}

fn flush_loop(db: &DB, shared: &FlushShared) {
    loop {
        {
            let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
            while !*stop && !shared.dirty.load(Ordering::Acquire) {
                stop = shared.wake.wait(stop).unwrap_or_else(|e| e.into_inner());
            }
            if *stop {
                break;
            }
        }
        std::thread::sleep(WAL_FLUSH_DELAY);
        shared.dirty.store(false, Ordering::Release);
        if let Err(e) = db.flush_wal(false) {
            // The next write or sync reports the WAL's failure to its caller.
            tracing::warn!(error = %e, "writing the engine's WAL buffer");
        }
    }
    if let Err(e) = db.flush_wal(true) {
        tracing::warn!(error = %e, "syncing the engine's WAL at close");
    }
}

impl Drop for WalFlusher {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn err(e: rocksdb::Error) -> EngineError {
    EngineError::Backend(Box::new(e))
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> EngineResult<Self> {
        Self::open_with_wal_bound(path, MAX_TOTAL_WAL_BYTES)
    }

    /// [`Self::open`] with the WAL bound given (tests use a small one).
    fn open_with_wal_bound(path: &Path, max_total_wal_bytes: u64) -> EngineResult<Self> {
        remove_left_holds(path);
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        opts.increase_parallelism(2);
        opts.set_recycle_log_file_num(RECYCLED_WAL_FILES);
        opts.set_max_total_wal_size(max_total_wal_bytes);
        opts.set_wal_bytes_per_sync(BYTES_PER_SYNC);
        opts.set_bytes_per_sync(BYTES_PER_SYNC);
        opts.set_ratelimiter(
            BACKGROUND_WRITE_BYTES_PER_SEC,
            RATE_LIMIT_REFILL_US,
            RATE_LIMIT_FAIRNESS,
        );
        opts.set_manual_wal_flush(true);
        opts.set_max_open_files(ENGINE_OPEN_FILES);
        // What the WAL replays at open stays in the memtables (and its WAL
        // files stay until they are flushed as usual) instead of being
        // written to new table files before the open returns: after a
        // kill -9 at a million keys, the open took 1.1 s, most of it that
        // flush. The Rust binding has no setter for this option.
        let opts = opts
            .get_options_from_string("avoid_flush_during_recovery=true")
            .map_err(err)?;
        let cache = block_cache();
        let cfs = Table::ALL
            .iter()
            .map(|t| {
                Ok(ColumnFamilyDescriptor::new(
                    t.name(),
                    table_file_options(*t, &cache)?,
                ))
            })
            .collect::<EngineResult<Vec<_>>>()?;
        let db = Arc::new(DB::open_cf_descriptors(&opts, path, cfs).map_err(err)?);
        let flusher =
            WalFlusher::start(db.clone()).map_err(|e| EngineError::Backend(Box::new(e)))?;
        Ok(Self {
            db,
            flusher: Some(flusher),
        })
    }

    fn cf(&self, table: Table) -> &rocksdb::ColumnFamily {
        cf_of(&self.db, table)
    }

    /// [`Engine::compact_files`]'s rewrite: each table's files, the last
    /// level's too.
    fn compact_every_table(&self) -> EngineResult<()> {
        let mut opts = rocksdb::CompactOptions::default();
        opts.set_exclusive_manual_compaction(false);
        opts.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::ForceOptimized);
        for t in Table::ALL {
            let started = std::time::Instant::now();
            self.db
                .compact_range_cf_opt(self.cf(t), None::<&[u8]>, None::<&[u8]>, &opts);
            tracing::info!(
                table = t.name(),
                took_ms = started.elapsed().as_millis() as u64,
                "rewrote a table's files"
            );
        }
        Ok(())
    }

    fn property_sum(&self, name: &str) -> u64 {
        self.property_sum_of(&Table::ALL, name)
    }

    fn property_sum_of(&self, tables: &[Table], name: &str) -> u64 {
        tables
            .iter()
            .filter_map(|t| {
                self.db
                    .property_int_value_cf(self.cf(*t), name)
                    .ok()
                    .flatten()
            })
            .sum()
    }

    /// Bytes of the unflushed memtables of `tables`, without the `kv`
    /// memtables' bloom filters.
    fn memtable_bytes(&self, tables: &[Table]) -> u64 {
        let all = self.property_sum_of(tables, "rocksdb.cur-size-all-mem-tables");
        if !tables.contains(&Table::Kv) {
            return all;
        }
        let immutable = self.property_sum_of(&[Table::Kv], "rocksdb.num-immutable-mem-table");
        all.saturating_sub((immutable + 1) * MEMTABLE_BLOOM_BYTES)
    }
}

/// The options of `table`'s column family, which its table files follow
/// (files written for a bulk load too).
fn table_file_options(table: Table, cache: &rocksdb::Cache) -> EngineResult<Options> {
    // Options the Rust binding has no setter for, set first: the options
    // read from the string do not carry what the setters below attach.
    let mut cf_opts = Options::default()
        .get_options_from_string(format!(
            "bottommost_file_compaction_delay={BOTTOMMOST_REWRITE_DELAY_SECS}"
        ))
        .map_err(err)?;
    cf_opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
    cf_opts.set_block_based_table_factory(&table_options(cache));
    if table == Table::Kv {
        cf_opts.set_memtable_whole_key_filtering(true);
        cf_opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        // Every point read of `kv` names a revision the index knows
        // exists, so it always finds its key: a filter on the last
        // level (most of the data) would never spare a read.
        cf_opts.set_optimize_filters_for_hits(true);
    }
    if table == Table::Meta {
        cf_opts.set_max_bytes_for_level_base(META_LEVEL_BASE_BYTES);
        cf_opts.set_target_file_size_base(META_TARGET_FILE_BYTES);
    }
    if table == Table::KvIndex {
        // Only ever scanned whole: a filter on the last level would never
        // be read.
        cf_opts.set_optimize_filters_for_hits(true);
    }
    Ok(cf_opts)
}

/// The LRU block cache every table shares, in [`BLOCK_CACHE_SHARD_BITS`]
/// shards.
fn block_cache() -> rocksdb::Cache {
    let mut opts = rocksdb::LruCacheOptions::default();
    opts.set_capacity(BLOCK_CACHE_BYTES);
    opts.set_num_shard_bits(BLOCK_CACHE_SHARD_BITS);
    rocksdb::Cache::new_lru_cache_opts(&opts)
}

/// Table file options: bloom filters, a two-level index and filters cut
/// into [`METADATA_BLOCK_BYTES`] partitions, all in the block cache with the
/// top level pinned (and L0's partitions too, the files read most).
fn table_options(cache: &rocksdb::Cache) -> rocksdb::BlockBasedOptions {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(METADATA_BLOCK_BYTES);
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table
}

/// Bytes of the write-ahead log files (`*.log`) in the engine's directory,
/// recycled ones included; 0 for a file that went while it was listed.
fn wal_files_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn cf_of(db: &DB, table: Table) -> &rocksdb::ColumnFamily {
    db.cf_handle(table.name())
        .unwrap_or_else(|| panic!("column family {} is created at open", table.name()))
}

/// Options of a scan. Scans visit their blocks once (the index rebuild, a
/// snapshot written out, HashKV, a watcher catching up), so they do not
/// fill the block cache: at a million keys a rebuild's scan spent a tenth
/// of its time inserting and evicting blocks, and pushed out the index and
/// data blocks that point reads keep there.
fn read_opts(start: &[u8], end: Option<&[u8]>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    ro.fill_cache(false);
    ro.set_iterate_lower_bound(start.to_vec());
    if let Some(e) = end {
        ro.set_iterate_upper_bound(e.to_vec());
    }
    ro
}

/// Shared scan over the DB or a snapshot, with RocksDB's raw iterator:
/// the visitor borrows each key and value from the iterator, where the
/// boxed iterator copied both into new allocations (a start-up's index
/// rebuild copied every stored value once).
fn drive(
    mut iter: rocksdb::DBRawIteratorWithThreadMode<'_, DB>,
    reverse: bool,
    visit: &mut ScanVisitor<'_>,
) -> EngineResult<()> {
    if reverse {
        iter.seek_to_last();
    } else {
        iter.seek_to_first();
    }
    while let Some((k, v)) = iter.item() {
        if visit(k, v).is_break() {
            return Ok(());
        }
        if reverse {
            iter.prev();
        } else {
            iter.next();
        }
    }
    iter.status().map_err(err)
}

fn empty_range(start: &[u8], end: Option<&[u8]>) -> bool {
    matches!(end, Some(e) if e <= start)
}

impl EngineRead for RocksEngine {
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        let value = self.db.get_pinned_cf(self.cf(table), key).map_err(err)?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        if empty_range(start, end) {
            return Ok(());
        }
        let iter = self
            .db
            .raw_iterator_cf_opt(self.cf(table), read_opts(start, end));
        drive(iter, reverse, visit)
    }
}

impl Engine for RocksEngine {
    fn write(&self, batch: WriteBatch, sync: bool) -> EngineResult<()> {
        let mut wb = rocksdb::WriteBatch::default();
        for op in batch.ops {
            match op {
                BatchOp::Put(t, k, v) => wb.put_cf(self.cf(t), k, v),
                BatchOp::Delete(t, k) => wb.delete_cf(self.cf(t), k),
                BatchOp::DeleteRange(t, s, e) => wb.delete_range_cf(self.cf(t), s, e),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(wb, &wo).map_err(err)?;
        if !sync {
            if let Some(flusher) = &self.flusher {
                flusher.mark_dirty();
            }
        }
        Ok(())
    }

    fn sync(&self) -> EngineResult<()> {
        self.db.flush_wal(true).map_err(err)
    }

    fn snapshot(&self) -> Arc<dyn EngineRead> {
        Arc::new(RocksSnapshot::new(self.db.clone()))
    }

    /// What the engine's directory holds: its table files and its
    /// write-ahead log files (which hold the memtables' data, so those are
    /// not counted again), as etcd reports its bbolt file's size. The WAL
    /// files (up to [`MAX_TOTAL_WAL_BYTES`] plus the recycled ones) were
    /// left out before, and a 1M-key store reported 52 MB with 165 MiB on
    /// disk.
    fn size_bytes(&self) -> u64 {
        self.property_sum("rocksdb.total-sst-files-size") + wal_files_bytes(self.db.path())
    }

    fn tables_size_bytes(&self, tables: &[Table]) -> u64 {
        self.property_sum_of(tables, "rocksdb.total-sst-files-size") + self.memtable_bytes(tables)
    }

    fn size_in_use_bytes(&self) -> u64 {
        self.property_sum("rocksdb.estimate-live-data-size") + self.memtable_bytes(&Table::ALL)
    }

    /// Rewrites every table file, the last level's too (so a defragment
    /// drops every deleted revision and writes every file with the current
    /// table options). Not exclusive: RocksDB's own compactions go on
    /// meanwhile, so new writes' level-0 files do not pile up into a write
    /// stall while a large table is rewritten.
    ///
    /// Each file is rewritten once: RocksDB's `Force` also compacted again
    /// the last-level files its own earlier jobs had just written (at a
    /// million keys, a second job rewrote the 800 MB the first had
    /// written), `ForceOptimized` leaves them.
    ///
    /// The files being replaced are first linked into a hold directory
    /// beside the engine's ([`hold_table_files`]), so that RocksDB deleting
    /// them frees nothing; the hold is then freed gradually
    /// ([`crate::removal`]). RocksDB deletes a compaction's inputs at once
    /// when it ends (800 MB for one job at a million keys), and on a file
    /// system mounted with `discard` the next journal commit, which every
    /// member's fsync waits for, discards them all: a paced writer's puts
    /// stalled up to 275 ms a second after such a deletion.
    fn compact_files(&self) -> EngineResult<()> {
        let hold = hold_table_files(self.db.path())?;
        let compacted = self.compact_every_table();
        crate::removal::remove_in_background(hold, HOLD_REMOVAL_THREAD);
        compacted
    }

    /// Writes the pairs into table files in `staging` (a new file at each
    /// table change or past [`BULK_FILE_BYTES`]).
    fn prepare_load(
        &self,
        staging: &Path,
        next: &mut BulkSource<'_>,
    ) -> EngineResult<PreparedLoad> {
        std::fs::create_dir_all(staging).map_err(|e| EngineError::Backend(Box::new(e)))?;
        // From here on, dropping the load (a failure too) removes it.
        let mut load = PreparedLoad::files(staging.to_path_buf(), Vec::new());
        write_table_files(staging, next, &mut load.files)?;
        Ok(load)
    }

    /// Ingests each table's files, moved (hard-linked) into the engine:
    /// RocksDB gives them sequence numbers above everything written
    /// before, so they read as the newest data, and syncs them and its
    /// manifest before returning. The staging directory goes with the load.
    fn ingest(&self, load: PreparedLoad) -> EngineResult<()> {
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        for table in Table::ALL {
            let paths = load.files_of(table);
            if !paths.is_empty() {
                self.db
                    .ingest_external_file_cf_opts(self.cf(table), &ingest, paths)
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    /// A RocksDB checkpoint: the memtables are flushed, the table files
    /// hard-linked (copied only across file systems) and the MANIFEST
    /// copied, all synced.
    fn checkpoint(&self, dir: &Path) -> EngineResult<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(dir))
            .map_err(err)
    }

    fn open_checkpoint(&self, dir: &Path) -> EngineResult<Arc<dyn EngineRead>> {
        let mut opts = Options::default();
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(CHECKPOINT_BLOCK_CACHE_BYTES));
        opts.set_block_based_table_factory(&table);
        opts.set_max_open_files(CHECKPOINT_OPEN_FILES);
        let names = Table::ALL.iter().map(|t| t.name());
        // A checkpoint may hold write-ahead log files: the writes a table's
        // flush did not cover, when other tables were flushed after them.
        // Opening replays them (in memory), which makes the copy consistent.
        let db = DB::open_cf_for_read_only(&opts, dir, names, false).map_err(err)?;
        Ok(Arc::new(RocksEngine {
            db: Arc::new(db),
            flusher: None,
        }))
    }
}

/// The name a defragment's hold directory beside the engine's at `db`
/// starts with ([`Engine::compact_files`]): `db.defrag-hold-`.
fn hold_prefix(db: &Path) -> std::ffi::OsString {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(HOLD_SUFFIX);
    name
}

/// Frees, gradually, the hold directories a crash left beside the engine's
/// at `db`.
fn remove_left_holds(db: &Path) {
    let (Some(parent), prefix) = (db.parent(), hold_prefix(db)) else {
        return;
    };
    let is_hold = |path: &Path| {
        path.file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(prefix.as_encoded_bytes()))
    };
    // Best effort: a directory that cannot be read holds no hold to free.
    let _ = crate::removal::remove_matching_in_background(parent, is_hold, HOLD_REMOVAL_THREAD);
}

/// Links every table file of the engine at `db` into a new hold
/// directory, and returns it. A file RocksDB deletes meanwhile is skipped.
fn hold_table_files(db: &Path) -> EngineResult<PathBuf> {
    let backend = |e: std::io::Error| EngineError::Backend(Box::new(e));
    let prefix = hold_prefix(db);
    let hold = db.with_file_name(unique_name(&prefix.to_string_lossy(), HOLD_EXTENSION));
    std::fs::create_dir(&hold).map_err(backend)?;
    for entry in std::fs::read_dir(db).map_err(backend)? {
        let path = entry.map_err(backend)?.path();
        if path.extension().is_none_or(|x| x != "sst") {
            continue;
        }
        let Some(name) = path.file_name() else {
            continue;
        };
        match std::fs::hard_link(&path, hold.join(name)) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::AlreadyExists
                ) => {}
            Err(e) => return Err(backend(e)),
        }
    }
    Ok(hold)
}

/// Writes [`Engine::prepare_load`]'s table files into `staging` (which
/// exists), listing each with its table in `files`, in the order written.
fn write_table_files(
    staging: &Path,
    next: &mut BulkSource<'_>,
    files: &mut Vec<(Table, std::path::PathBuf)>,
) -> EngineResult<()> {
    let cache = rocksdb::Cache::new_lru_cache(BULK_BLOCK_CACHE_BYTES);
    let options = Table::ALL
        .iter()
        .map(|t| table_file_options(*t, &cache))
        .collect::<EngineResult<Vec<Options>>>()?;
    let mut open: Option<(Table, rocksdb::SstFileWriter<'_>)> = None;
    while let Some((table, key, value)) = next()? {
        let start_new = match &open {
            Some((t, writer)) => *t != table || writer.file_size() >= BULK_FILE_BYTES,
            None => true,
        };
        if start_new {
            if let Some((_, mut writer)) = open.take() {
                writer.finish().map_err(err)?;
            }
            let i = Table::ALL.iter().position(|t| *t == table).unwrap_or(0);
            let writer = rocksdb::SstFileWriter::create(&options[i]);
            let path = staging.join(format!("{:06}.sst", files.len()));
            writer.open(&path).map_err(err)?;
            files.push((table, path));
            open = Some((table, writer));
        }
        if let Some((_, writer)) = &mut open {
            writer.put(&key, &value).map_err(err)?;
        }
    }
    if let Some((_, mut writer)) = open.take() {
        writer.finish().map_err(err)?;
    }
    Ok(())
}

/// A RocksDB snapshot that owns a handle on its database.
///
/// `rocksdb::Snapshot` borrows the `DB`; we keep the `Arc<DB>` alongside it
/// so the borrow is valid for the snapshot's whole life. Field order matters:
/// `snapshot` is dropped (releasing the RocksDB snapshot) before `_db`.
struct RocksSnapshot {
    /// The options of point reads: at the snapshot, not filling the block
    /// cache (see [`EngineRead::get`] below). Made once per snapshot.
    point_reads: ReadOptions,
    snapshot: rocksdb::SnapshotWithThreadMode<'static, DB>,
    db: Arc<DB>,
}

impl RocksSnapshot {
    fn new(db: Arc<DB>) -> Self {
        let snapshot = db.snapshot();
        // SAFETY: the snapshot borrows `*db`, which lives on the heap inside
        // the Arc we store next to it; the Arc is dropped after the snapshot
        // (field order), so the referent outlives the extended borrow.
        let snapshot: rocksdb::SnapshotWithThreadMode<'static, DB> =
            unsafe { std::mem::transmute(snapshot) };
        let mut point_reads = ReadOptions::default();
        point_reads.fill_cache(false);
        point_reads.set_snapshot(&snapshot);
        Self {
            point_reads,
            snapshot,
            db,
        }
    }
}

impl EngineRead for RocksSnapshot {
    /// A snapshot serves bulk reads (a Range of more than a few hundred
    /// keys, a RangeStream's chunk, HashKV), whose blocks are read once:
    /// they do not fill the block cache, so a list of the whole keyspace
    /// neither grows the member by the cache's size nor evicts the blocks
    /// point reads keep there.
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        let value = self
            .db
            .get_pinned_cf_opt(cf_of(&self.db, table), key, &self.point_reads)
            .map_err(err)?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        if empty_range(start, end) {
            return Ok(());
        }
        let cf = cf_of(&self.db, table);
        let iter = self.snapshot.raw_iterator_cf_opt(cf, read_opts(start, end));
        drive(iter, reverse, visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dirs = std::sync::Mutex::new(Vec::new());
        super::super::conformance::run_all(&|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let engine = RocksEngine::open(dir.path()).expect("open");
            dirs.lock().unwrap().push(dir);
            Box::new(engine)
        });
    }

    /// Releasing a snapshot does not make RocksDB rewrite the `kv` files
    /// that only moved down the levels (see
    /// [`BOTTOMMOST_REWRITE_DELAY_SECS`]): the files live before the
    /// release are the files live once every compaction has run.
    #[test]
    fn releasing_a_snapshot_rewrites_no_table_file() {
        const FILES: u64 = 2;
        const KEYS_PER_FILE: u64 = 1_000;
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(&dir.path().join("db")).unwrap();
        let put_file = |first: u64| {
            let mut b = WriteBatch::new();
            for n in first..first + KEYS_PER_FILE {
                b.put(Table::Kv, n.to_be_bytes().to_vec(), vec![7; 100]);
            }
            e.write(b, true).unwrap();
            e.db.flush_cf(e.cf(Table::Kv)).unwrap();
        };
        for f in 0..FILES {
            put_file(f * KEYS_PER_FILE);
        }
        let snapshot = e.snapshot();
        put_file(FILES * KEYS_PER_FILE);
        let kv_files = |e: &RocksEngine| -> Vec<String> {
            let mut names: Vec<String> =
                e.db.live_files()
                    .unwrap()
                    .into_iter()
                    .filter(|f| f.column_family_name == Table::Kv.name())
                    .map(|f| f.name)
                    .collect();
            names.sort();
            names
        };
        let before = kv_files(&e);
        assert_eq!(before.len(), FILES as usize + 1);
        drop(snapshot);
        e.db.wait_for_compact(&rocksdb::WaitForCompactOptions::default())
            .unwrap();
        assert_eq!(kv_files(&e), before);
    }

    /// Every checkpoint taken while batches that span two tables are
    /// written holds each batch whole or not at all: the tables are
    /// flushed one by one, and the log files the checkpoint carries fill
    /// in what a table's flush did not cover.
    #[test]
    fn checkpoints_hold_whole_batches() {
        const WRITES: u64 = 20_000;
        const CHECKPOINTS: usize = 8;
        let dir = tempfile::tempdir().unwrap();
        let e = Arc::new(RocksEngine::open(&dir.path().join("db")).unwrap());
        let writer = {
            let e = e.clone();
            std::thread::spawn(move || {
                for n in 0..WRITES {
                    let mut b = WriteBatch::new();
                    b.put(Table::Kv, n.to_be_bytes().to_vec(), vec![7; 100]);
                    b.put(Table::Meta, b"last".to_vec(), n.to_be_bytes().to_vec());
                    e.write(b, false).unwrap();
                }
            })
        };
        for i in 0..CHECKPOINTS {
            let path = dir.path().join(format!("ckpt-{i}"));
            e.checkpoint(&path).unwrap();
            let copy = e.open_checkpoint(&path).unwrap();
            let Some(last) = copy.get(Table::Meta, b"last").unwrap() else {
                continue;
            };
            let last = u64::from_be_bytes(last.try_into().unwrap());
            let kv = crate::engine::scan_collect(copy.as_ref(), Table::Kv, b"", None, 0).unwrap();
            assert_eq!(kv.len() as u64, last + 1, "checkpoint {i}");
        }
        writer.join().unwrap();
    }

    #[test]
    fn data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = RocksEngine::open(dir.path()).unwrap();
            let mut b = WriteBatch::new();
            b.put(Table::Kv, b"k".to_vec(), b"v".to_vec());
            e.write(b, true).unwrap();
        }
        let e = RocksEngine::open(dir.path()).unwrap();
        assert_eq!(e.get(Table::Kv, b"k").unwrap(), Some(b"v".to_vec()));
    }

    /// Copies the files of `from` into `to`, as a kill -9 leaves them (what
    /// RocksDB's user-space buffer holds is not in them).
    fn crash_image(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }

    /// Upper bound on waiting for the flusher: a hang guard, not a timing
    /// assertion (the flusher's own bound is WAL_FLUSH_DELAY).
    const WAL_FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

    /// An engine opened at `dir/db` that took one unsynced put, `k` = `v`.
    fn engine_with_one_put(dir: &Path) -> (PathBuf, RocksEngine) {
        let db = dir.join("db");
        let e = RocksEngine::open(&db).unwrap();
        let mut b = WriteBatch::new();
        b.put(Table::Kv, b"k".to_vec(), b"v".to_vec());
        e.write(b, false).unwrap();
        (db, e)
    }

    /// An unsynced write reaches the WAL file without any further write or
    /// sync: a crash image taken later holds it.
    #[test]
    fn unsynced_writes_reach_the_wal_file_by_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let (db, _engine) = engine_with_one_put(dir.path());
        let start = std::time::Instant::now();
        for attempt in 0.. {
            let image = dir.path().join(format!("image-{attempt}"));
            crash_image(&db, &image);
            let copy = RocksEngine::open(&image).unwrap();
            if copy.get(Table::Kv, b"k").unwrap() == Some(b"v".to_vec()) {
                break;
            }
            assert!(
                start.elapsed() < WAL_FLUSH_DEADLINE,
                "the write never reached the WAL file"
            );
            std::thread::sleep(WAL_FLUSH_DELAY);
        }
    }

    /// Closing the engine writes out and syncs what the buffer holds.
    #[test]
    fn closing_writes_the_wal_buffer_out() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = RocksEngine::open(dir.path()).unwrap();
            for n in 0..100u32 {
                let mut b = WriteBatch::new();
                b.put(Table::Kv, n.to_be_bytes().to_vec(), b"v".to_vec());
                e.write(b, false).unwrap();
            }
        }
        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let e = RocksEngine::open(image.path()).unwrap();
        let kv = crate::engine::scan_collect(&e, Table::Kv, b"", None, 0).unwrap();
        assert_eq!(kv.len(), 100);
    }

    /// The options RocksDB runs with, as it persisted them (OPTIONS-*),
    /// ask it to write WAL and table bytes out as they come (BYTES_PER_SYNC)
    /// instead of leaving them dirty for the kernel's 30 s burst.
    #[test]
    fn wal_and_table_bytes_are_written_out_as_they_come() {
        let dir = tempfile::tempdir().unwrap();
        let _e = RocksEngine::open(dir.path()).unwrap();
        let options: String = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("OPTIONS-")
            })
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        for name in ["wal_bytes_per_sync", "bytes_per_sync"] {
            let line = format!("  {name}={BYTES_PER_SYNC}");
            assert!(
                options.lines().any(|l| l == line),
                "{line:?} not in RocksDB's OPTIONS file"
            );
        }
    }

    /// Sizes of the WAL files in `dir`, bytes.
    fn wal_file_sizes(dir: &Path) -> Vec<u64> {
        std::fs::read_dir(dir)
            .expect("read the database directory")
            .map(|entry| entry.expect("directory entry"))
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".log"))
            .map(|entry| entry.metadata().expect("WAL file metadata").len())
            .collect()
    }

    /// Upper bound on waiting for RocksDB's background flushes to go idle:
    /// a hang guard for a stuck flush, not a timing assertion.
    const FLUSH_IDLE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

    /// Waits until no table has a memtable flush pending or running, so a
    /// test sees the files as they are once RocksDB has caught up, whatever
    /// the machine's speed.
    fn wait_for_flushes_idle(e: &RocksEngine) {
        let start = std::time::Instant::now();
        loop {
            let running =
                e.db.property_int_value("rocksdb.num-running-flushes")
                    .expect("read a RocksDB property")
                    .expect("RocksDB knows num-running-flushes");
            let pending = e.property_sum("rocksdb.mem-table-flush-pending") + running;
            if pending == 0 {
                return;
            }
            assert!(
                start.elapsed() < FLUSH_IDLE_DEADLINE,
                "RocksDB's flushes still pending after {FLUSH_IDLE_DEADLINE:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The WAL stays near its bound although a small table (written once,
    /// as the vote is) pins the first WAL file, old files are reused, and
    /// everything written reads back after reopening over reused files.
    ///
    /// Each write waits for the flush it may have triggered: while a flush
    /// runs, RocksDB keeps appending to the newest WAL file, so without the
    /// wait the files' sizes would depend on how fast the machine's
    /// background threads are (a loaded CI machine once saw 22 MB).
    #[test]
    fn the_wal_stays_bounded_and_reused_files_replay_correctly() {
        const BOUND: u64 = 4 * 1024 * 1024;
        const VALUE_BYTES: usize = 1024 * 1024;
        const VALUES: u64 = 64;
        let dir = tempfile::tempdir().unwrap();
        let value = |i: u64| vec![i as u8; VALUE_BYTES];
        {
            let e = RocksEngine::open_with_wal_bound(dir.path(), BOUND).unwrap();
            let mut b = WriteBatch::new();
            b.put(Table::RaftState, b"vote".to_vec(), b"pinned".to_vec());
            e.write(b, true).unwrap();
            for i in 0..VALUES {
                let mut b = WriteBatch::new();
                b.put(Table::RaftLog, i.to_be_bytes().to_vec(), value(i));
                b.put(Table::Meta, b"last".to_vec(), i.to_be_bytes().to_vec());
                e.write(b, false).unwrap();
                e.sync().unwrap();
                wait_for_flushes_idle(&e);
            }
            let sizes = wal_file_sizes(dir.path());
            let total: u64 = sizes.iter().sum();
            // Live WAL files up to the bound plus one file's worth, and the
            // recycled ones: far below the 64 MiB written.
            let most = (RECYCLED_WAL_FILES as u64 + 2) * (BOUND + VALUE_BYTES as u64);
            assert!(
                total <= most,
                "WAL files {sizes:?} hold {total} bytes, more than {most}"
            );
        }
        let e = RocksEngine::open_with_wal_bound(dir.path(), BOUND).unwrap();
        assert_eq!(
            e.get(Table::RaftState, b"vote").unwrap(),
            Some(b"pinned".to_vec())
        );
        assert_eq!(
            e.get(Table::Meta, b"last").unwrap(),
            Some((VALUES - 1).to_be_bytes().to_vec())
        );
        for i in 0..VALUES {
            let read = e.get(Table::RaftLog, &i.to_be_bytes()).unwrap();
            assert!(read == Some(value(i)), "value {i} reads back");
        }
    }

    /// Bytes of the table and WAL files in `dir`, listed independently.
    fn data_files_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".sst") || name.ends_with(".log")
            })
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn the_reported_size_is_what_the_directory_holds() {
        const VALUE_BYTES: usize = 256 * 1024;
        const VALUES: usize = 20;
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        for i in 0..VALUES {
            let mut b = WriteBatch::new();
            b.put(
                Table::Kv,
                i.to_be_bytes().to_vec(),
                vec![i as u8; VALUE_BYTES],
            );
            e.write(b, false).unwrap();
        }
        e.sync().unwrap();
        // Everything is still in the memtable: only the WAL holds it.
        let written = (VALUE_BYTES * VALUES) as u64;
        let reported = e.size_bytes();
        assert!(
            reported >= written,
            "{reported} bytes reported for {written} written"
        );
        assert_eq!(reported, data_files_bytes(dir.path()));
        // Flushed into a table file, the values are counted there.
        e.compact_files().unwrap();
        let reported = e.size_bytes();
        let on_disk = data_files_bytes(dir.path());
        assert!(
            reported > 0 && reported <= on_disk,
            "{reported} reported, {on_disk} on disk"
        );
    }

    /// The names in `dir` that start with `prefix`.
    fn names_starting(dir: &Path, prefix: &str) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    /// A defragment first links the table files it replaces into a hold
    /// beside the engine, then frees the hold; a hold a crash left is
    /// freed at the next open.
    #[test]
    fn a_defragment_frees_the_files_it_replaced_through_a_hold() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (db, e) = engine_with_one_put(dir.path());
        e.compact_files().unwrap();
        assert_eq!(
            names_starting(dir.path(), "db.defrag-hold-"),
            Vec::<String>::new()
        );

        let tables = names_starting(&db, "")
            .into_iter()
            .filter(|n| n.ends_with(".sst"));
        let tables: Vec<String> = tables.collect();
        assert!(!tables.is_empty());
        let hold = hold_table_files(&db).unwrap();
        assert!(hold.starts_with(dir.path()));
        let mut held = names_starting(&hold, "");
        held.sort();
        let mut expected = tables.clone();
        expected.sort();
        assert_eq!(held, expected);
        for name in &tables {
            assert_eq!(
                std::fs::metadata(db.join(name)).unwrap().nlink(),
                2,
                "{name}"
            );
        }
        drop(e);

        // The hold as a crash leaves it.
        let e = RocksEngine::open(&db).unwrap();
        assert_eq!(
            names_starting(dir.path(), "db.defrag-hold-"),
            Vec::<String>::new()
        );
        for name in &tables {
            assert_eq!(
                std::fs::metadata(db.join(name)).unwrap().nlink(),
                1,
                "{name}"
            );
        }
        assert_eq!(e.get(Table::Kv, b"k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn sizes_leave_out_the_memtable_bloom_filters() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        let empty = e.size_bytes();
        // The kv memtable's filter alone is MEMTABLE_BLOOM_BYTES (1.3 MiB).
        assert!(empty < 64 * 1024, "an empty store reports {empty} bytes");
        let mut b = WriteBatch::new();
        b.put(Table::Kv, b"k".to_vec(), vec![0; 100_000]);
        e.write(b, false).unwrap();
        // Memtables grow by arena blocks (1 MiB), so this is approximate.
        let one = e.tables_size_bytes(&[Table::Kv]);
        assert!(
            (100_000..2 * 1024 * 1024).contains(&one),
            "one 100 kB value counts as {one} bytes"
        );
    }
}

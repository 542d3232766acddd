//! The MVCC store: the key index in memory, every revision in the engine.
//!
//! Write path: the Raft state machine opens a [`WriteTxn`] per applied entry
//! (it holds the index write lock), performs puts/deletes/ranges, and
//! commits with the applied log id in the same engine batch. A transaction
//! that changes anything creates exactly one new main revision; read-only
//! and failed transactions create none.
//!
//! Read path: [`MvccStore::range_stored`] takes the read lock, resolves
//! which revision of each key is visible at the read revision in the
//! index, and fetches those values from the engine under the same lock (a
//! small range) or from an engine snapshot taken under it (a large one), so
//! compaction cannot remove a value between the two steps. The values stay
//! as stored, encoded `mvccpb.KeyValue`s that an answer can carry as they
//! are; [`MvccStore::range`] decodes them.
//!
//! Previous values: a put or delete learns the key's create revision and
//! version from the index, not from its old value, so it reads that value
//! only when something needs it: the request asks for `prev_kv` (or
//! `ignore_value`/`ignore_lease`), or a watcher with `prev_kv` is open
//! ([`MvccStore::watch_prev_kv`]). Otherwise its event carries no
//! `prev_kv`, and a watcher that opened since fills it in from history
//! ([`MvccStore::prev_kv`]), as etcd's watch stream does for every event.
//! Worked example, `k` at version 3 (created at 5, last changed at 9), no
//! prev_kv watcher: `put(k)` at 12 writes `{create 5, mod 12, version 4}`
//! after one index lookup and no engine read; its event has no prev_kv.
//!
//! Compaction: [`WriteTxn::compact`] sets the compaction revision (so reads
//! below it fail immediately, as in etcd) and records the scheduled
//! revision; [`MvccStore::run_physical_compaction`] then compacts the index
//! a thousand keys at a time and deletes the revisions each step drops from
//! the engine in the same step, and records the finished revision. A
//! restart finishes an interrupted job.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use etcd_proto::mvccpb::{event::EventType, Event, KeyValue};
use prost::Message;
use tokio::sync::watch;

use super::index::{KeyRange, Rebuild, TreeIndex, VisibleKey};
use super::key_history::{self, Change, TAIL_FOLD_ENTRIES};
use super::loading::{still_leased, LeasedKeys, Loaded};
use super::revision::Revision;
use super::stored::StoredKvs;
use crate::engine::{try_scan, BatchOp, Engine, EngineError, EngineRead, Table, WriteBatch};
use crate::errors::EtcdError;
use crate::limits::{
    COMPACTION_BATCH_KEYS, COMPACTION_BATCH_PAUSE_MS, COMPACTION_BATCH_REVISIONS, LOAD_STEP_KEYS,
    REBUILD_BATCHES_IN_FLIGHT, REBUILD_BATCH_KEY_BYTES, REBUILD_BATCH_REVISIONS,
};

/// Meta key: the last revision any committed transaction created.
pub const META_CURRENT_REV: &[u8] = b"mvcc/currentRev";
/// Meta key: the revision of the newest compaction (index side done).
pub const META_SCHEDULED_COMPACT_REV: &[u8] = b"mvcc/scheduledCompactRev";
/// Meta key: the revision of the newest finished physical compaction.
pub const META_FINISHED_COMPACT_REV: &[u8] = b"mvcc/finishedCompactRev";
/// Meta key, present once the `kv_index` table holds the index fields of
/// every `kv` revision ([`Table::KvIndex`]): from then on every write of
/// `kv` writes `kv_index` in the same batch. A directory without it (one
/// an earlier release wrote, or a restored backup) gets the table built at
/// its next start, from the pass that rebuilds the key index.
pub const META_KV_INDEX_COMPLETE: &[u8] = b"mvcc/kvIndexComplete";

/// Meta key: the number of live keys after the last commit (etcd's
/// `keysGauge`), written with `mvcc/currentRev`: while the index loads
/// from the key history ([`super::loading`]), the count comes from it.
pub const META_LIVE_KEYS: &[u8] = b"mvcc/liveKeys";

/// A fresh store's revision, as in etcd (the first write creates 2).
pub const INITIAL_REVISION: i64 = 1;
/// The compaction revision before any compaction (etcd's initial
/// `compactMainRev`): a first `Compact` at revision 0 succeeds, and HashKV
/// reports -1 until something was compacted.
pub const NO_COMPACTION: i64 = -1;

/// MVCC failures.
#[derive(Debug, thiserror::Error)]
pub enum MvccError {
    /// The read or compaction revision is at or below the compaction point.
    #[error("required revision has been compacted")]
    Compacted,
    /// The read or compaction revision is in the future.
    #[error("required revision is a future revision")]
    FutureRev,
    /// The engine failed or returned data that breaks an invariant.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl MvccError {
    /// The client-facing error, if this is one; engine failures are not.
    pub fn to_etcd(&self) -> Option<EtcdError> {
        match self {
            MvccError::Compacted => Some(EtcdError::Compacted),
            MvccError::FutureRev => Some(EtcdError::FutureRev),
            MvccError::Engine(_) => None,
        }
    }
}

/// Options of a ranged read.
#[derive(Debug, Clone, Copy, Default)]
pub struct RangeOptions {
    /// Most key-values to return (0 = all); `count` is exact regardless.
    pub limit: usize,
    /// Read revision (<= 0: current).
    pub rev: i64,
    /// Only count, return no key-value.
    pub count_only: bool,
    /// Return key-values without their values: each value is dropped as
    /// soon as it is read, so a keys-only read of large values holds one
    /// value at a time, not all of them.
    pub keys_only: bool,
    /// Count no further than the first match past `limit`: `count` is
    /// then at most `limit + 1`, enough to tell whether there are more
    /// (etcd 3.7's Range without `WithTotalCount`, which each chunk of a
    /// RangeStream reads).
    pub count_to_limit: bool,
}

/// A ranged read whose key-values stay as stored
/// ([`MvccStore::range_stored`]).
pub struct StoredRange {
    /// Key-values in key order, at most `limit`, each read when taken.
    pub kvs: StoredKvs,
    /// Number of keys in the range at the read revision.
    pub count: usize,
    /// The store's current revision (what the response header carries).
    pub rev: i64,
}

/// Result of a ranged read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RangeResult {
    /// Key-values in key order, at most `limit`.
    pub kvs: Vec<KeyValue>,
    /// Number of keys in the range at the read revision.
    pub count: usize,
    /// The store's current revision (what the response header carries).
    pub rev: i64,
}

#[derive(Debug)]
struct State {
    index: TreeIndex,
    /// Which keys `index` holds ([`super::loading`]).
    loaded: Loaded,
    current_rev: i64,
    compact_rev: i64,
    /// A write transaction changed the index and was dropped without
    /// committing (its engine write failed): the index is ahead of the
    /// engine, so reads and writes fail until a reload rebuilds it.
    diverged: bool,
    /// The key history matched the stored revisions at the last reload
    /// ([`key_history`]'s markers): only then do commits and compactions
    /// move its markers on. After a snapshot whose history was not valid
    /// (one a build without it sent) the markers stay behind, so the next
    /// start refills the history instead of trusting it.
    history_valid: bool,
    /// Key history entries collected and not written yet
    /// ([`key_history::Pending`]).
    history: key_history::Pending,
    /// The key history's mark was written since the last reload (the
    /// first commit after one writes it: a new store has none).
    history_marked: bool,
}

impl State {
    /// Keys live now: the index's, and those not loaded yet.
    fn live_keys(&self) -> usize {
        self.index.live_len() + self.loaded.unloaded_live()
    }
}

/// What reads and writes answer once the index has diverged.
const DIVERGED: &str =
    "a write to the storage engine failed; the in-memory index no longer matches it (restart the member)";

/// Work left for the compactor: compacting the index at `rev` and deleting
/// from the engine the revisions that drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionJob {
    /// Compaction revision.
    pub rev: i64,
}

/// The MVCC key-value store.
pub struct MvccStore {
    engine: Arc<dyn Engine>,
    state: RwLock<State>,
    finished_compact_tx: watch::Sender<i64>,
    /// Open watchers that want `prev_kv` (see [`MvccStore::watch_prev_kv`]).
    prev_kv_watchers: Arc<AtomicUsize>,
    /// The live keys with a lease, as the last [`MvccStore::reload`] found
    /// them (taken by [`MvccStore::take_reloaded_leased_keys`]).
    reloaded_leased: std::sync::Mutex<LeasedKeys>,
    /// Where the leased keys go that completing a partial load finds
    /// ([`MvccStore::set_lease_sink`]).
    lease_sink: std::sync::Mutex<Option<LeaseSink>>,
    /// True while a loading thread runs ([`MvccStore::load_in_background`]);
    /// each of its steps notifies the receivers.
    loader: watch::Sender<bool>,
}

/// Receives (key, lease) for each live key with a lease that completing a
/// partial load of the index found ([`MvccStore::set_lease_sink`]).
pub type LeaseSink = Box<dyn Fn(LeasedKeys) + Send + Sync>;

/// The state, read-locked, or write-locked after loading keys into it.
enum Guard<'a> {
    Read(RwLockReadGuard<'a, State>),
    Write(RwLockWriteGuard<'a, State>),
}

impl std::ops::Deref for Guard<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        match self {
            Guard::Read(g) => g,
            Guard::Write(g) => g,
        }
    }
}

/// A watcher's interest in previous values: while one is held, writes put
/// each replaced value in their events. Dropping it ends the interest.
#[derive(Debug)]
pub struct PrevKvInterest(Arc<AtomicUsize>);

impl Drop for PrevKvInterest {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a write knows of the value it replaces.
#[derive(Debug, Clone, PartialEq)]
pub enum Prev {
    /// The caller read it (None: the key does not exist).
    Read(Option<KeyValue>),
    /// The caller did not read it: the transaction reads it only if a
    /// watcher wants previous values.
    Unread,
}

fn read_i64(engine: &dyn EngineRead, key: &[u8]) -> Result<i64, MvccError> {
    Ok(read_opt_i64(engine, key)?.unwrap_or(0))
}

fn read_opt_i64(engine: &dyn EngineRead, key: &[u8]) -> Result<Option<i64>, MvccError> {
    engine
        .get(Table::Meta, key)?
        .map(|v| {
            v.as_slice()
                .try_into()
                .map(i64::from_be_bytes)
                .map_err(|_| EngineError::corrupt(format!("bad meta value for {key:?}")).into())
        })
        .transpose()
}

fn decode_kv(bytes: &[u8]) -> Result<KeyValue, MvccError> {
    KeyValue::decode(bytes)
        .map_err(|e| MvccError::Engine(EngineError::corrupt(format!("key-value: {e}"))))
}

/// The `kv_index` value of a stored `kv` value ([`Table::KvIndex`]): `kv`
/// encoded without its value, which is put back.
fn index_fields(kv: &mut KeyValue) -> Vec<u8> {
    let value = std::mem::take(&mut kv.value);
    let fields = kv.encode_to_vec();
    kv.value = value;
    fields
}

impl MvccStore {
    /// Opens the store on `engine`, rebuilding the index from it.
    pub fn open(engine: Arc<dyn Engine>) -> Result<Self, MvccError> {
        Ok(Self::open_with_pending(engine)?.0)
    }

    /// Opens the store and returns the physical compaction left unfinished
    /// by a crash, if any (the caller runs it).
    pub fn open_with_pending(
        engine: Arc<dyn Engine>,
    ) -> Result<(Self, Option<CompactionJob>), MvccError> {
        let finished = read_i64(engine.as_ref(), META_FINISHED_COMPACT_REV)?;
        let (finished_compact_tx, _) = watch::channel(finished);
        let store = Self {
            engine,
            state: RwLock::new(State {
                index: TreeIndex::default(),
                loaded: Loaded::All,
                current_rev: INITIAL_REVISION,
                compact_rev: NO_COMPACTION,
                diverged: false,
                history_valid: false,
                history: key_history::Pending::default(),
                history_marked: false,
            }),
            finished_compact_tx,
            prev_kv_watchers: Arc::default(),
            reloaded_leased: std::sync::Mutex::default(),
            lease_sink: std::sync::Mutex::default(),
            loader: watch::Sender::new(false),
        };
        let pending = store.reload()?;
        Ok((store, pending))
    }

    /// Replaces the index with the engine's (start-up, snapshot install).
    /// Returns a compaction job if one was scheduled but not finished.
    ///
    /// With a valid key history the index starts empty and loads while the
    /// member serves ([`super::loading`]). Otherwise it is rebuilt first,
    /// refilling the history on the way. That one pass over every stored
    /// revision (in revision order) also records which live keys hold a
    /// lease: each key's newest revision decides, a tombstone or a put
    /// without a lease drops it. The lessor takes that list ([`MvccStore::take_reloaded_leased_keys`]) instead
    /// of reading every live value again by key, which at a million keys
    /// was a random read per key.
    pub fn reload(&self) -> Result<Option<CompactionJob>, MvccError> {
        let started = std::time::Instant::now();
        let history = match history_at_start(self.engine.as_ref())? {
            HistoryAtStart::Valid => History::Valid,
            HistoryAtStart::Behind(through) => {
                self.fold_history_tail(through)?;
                History::Valid
            }
            HistoryAtStart::Refill => History::Refill,
        };
        if history == History::Valid {
            if let Some(live) = self.loadable_live_keys()? {
                return self.reload_partly(live);
            }
        }
        let (prepared, from) = self.rebuild(history)?;
        let PreparedIndex {
            index,
            leased,
            max_rev,
            revisions,
        } = prepared;
        tracing::info!(
            keys = index.len(),
            revisions,
            leased_keys = leased.len(),
            from,
            took_ms = started.elapsed().as_millis() as u64,
            "rebuilt the key index"
        );
        *self
            .reloaded_leased
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = leased;
        self.install(index, Loaded::All, max_rev)
    }

    /// Writes the key history entries of the revisions after `through`
    /// (the history's mark) from `kv_index`, sorted, in batches of at most
    /// [`TAIL_FOLD_ENTRIES`], then the mark at the current revision (see
    /// [`key_history`]: what a stop without a graceful close left).
    fn fold_history_tail(&self, through: i64) -> Result<(), MvccError> {
        let started = std::time::Instant::now();
        let engine = self.engine.as_ref();
        let current = read_i64(engine, META_CURRENT_REV)?;
        let start = Revision::new(through + 1, 0).to_key(false);
        let mut entries = Vec::new();
        let mut revisions = 0usize;
        let write = |entries: &mut Vec<key_history::EncodedEntry>, mark: Option<i64>| {
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let slice = key_history::Slice {
                entries: std::mem::take(entries),
                through: mark,
            };
            let mut batch = WriteBatch::new();
            add_history(&mut batch, slice, true);
            self.engine.write(batch, mark.is_some())
        };
        try_scan(engine, Table::KvIndex, &start, None, &mut |k, v| {
            let (key, parsed) = ParsedRevision::parse(k, v)?;
            entries.push(parsed.history_entry(key));
            revisions += 1;
            if entries.len() >= TAIL_FOLD_ENTRIES {
                write(&mut entries, None)?;
            }
            Ok::<_, MvccError>(ControlFlow::Continue(()))
        })?;
        write(&mut entries, Some(current))?;
        tracing::info!(
            revisions,
            after_revision = through,
            took_ms = started.elapsed().as_millis() as u64,
            "wrote the key history of the revisions after its mark"
        );
        Ok(())
    }

    /// Writes every collected key history entry and moves the history's
    /// mark to the current revision (a graceful stop: the next start then
    /// reads nothing back from `kv_index`, and a build that wrote every
    /// entry with its write trusts the history).
    pub fn write_collected_history(&self) -> Result<(), MvccError> {
        let mut state = self.write_state();
        if state.diverged || state.history.is_empty() {
            return Ok(());
        }
        let current = state.current_rev;
        let slice = state.history.take(current, true);
        let mut batch = WriteBatch::new();
        add_history(&mut batch, slice, state.history_valid);
        self.engine.write(batch, false)?;
        Ok(())
    }

    /// The stored live key count if the index can load from a valid key
    /// history while the member serves: `kv_index` complete (else the
    /// rebuild fills it) and the count recorded.
    fn loadable_live_keys(&self) -> Result<Option<usize>, MvccError> {
        let engine = self.engine.as_ref();
        if read_opt_i64(engine, META_KV_INDEX_COMPLETE)?.is_none() {
            return Ok(None);
        }
        read_opt_i64(engine, META_LIVE_KEYS)?
            .map(|live| {
                usize::try_from(live)
                    .map_err(|_| EngineError::corrupt(format!("live key count {live}")).into())
            })
            .transpose()
    }

    /// The index rebuilt from every stored revision (`kv_index`, or `kv`
    /// filling it), the key history refilled on the way unless `history`
    /// is valid, and the live key count recorded for the next start.
    fn rebuild(&self, history: History) -> Result<(PreparedIndex, &'static str), MvccError> {
        let engine = self.engine.as_ref();
        let complete = read_opt_i64(engine, META_KV_INDEX_COMPLETE)?.is_some();
        let source = if complete {
            RebuildSource::IndexFields
        } else {
            RebuildSource::ValuesFillingIndexFields
        };
        let mut builder = IndexBuilder::default();
        rebuild_pipelined(engine, source, history, &mut |batch| {
            builder.add_batch(batch)
        })?;
        let prepared = builder.finish();
        let from = match (complete, prepared.revisions, history) {
            (false, 0, _) => "nothing stored",
            (true, _, History::Valid) => "the index fields",
            (true, _, History::Refill) => "the index fields (the key history now filled)",
            (false, _, _) => "the values (the index fields and key history now filled)",
        };
        let live = prepared.index.live_len() as i64;
        if prepared.revisions > 0 && read_opt_i64(engine, META_LIVE_KEYS)? != Some(live) {
            let mut count = WriteBatch::new();
            count.put(
                Table::Meta,
                META_LIVE_KEYS.to_vec(),
                live.to_be_bytes().to_vec(),
            );
            self.engine.write(count, true)?;
        }
        Ok((prepared, from))
    }

    /// [`MvccStore::reload`] from a valid key history, whose store held
    /// `live` live keys: the index starts empty and loads as it is used
    /// ([`super::loading`]).
    fn reload_partly(&self, live: usize) -> Result<Option<CompactionJob>, MvccError> {
        *self
            .reloaded_leased
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Vec::new();
        tracing::info!(
            live_keys = live,
            "loading the key index from the key history while serving"
        );
        self.install(TreeIndex::default(), Loaded::partly(live), 0)
    }

    /// Replaces the index and the revisions from the engine's meta keys;
    /// returns the compaction left to finish.
    fn install(
        &self,
        index: TreeIndex,
        loaded: Loaded,
        max_rev: i64,
    ) -> Result<Option<CompactionJob>, MvccError> {
        let scheduled = read_opt_i64(self.engine.as_ref(), META_SCHEDULED_COMPACT_REV)?
            .unwrap_or(NO_COMPACTION);
        let finished = read_i64(self.engine.as_ref(), META_FINISHED_COMPACT_REV)?;
        let stored_current = read_i64(self.engine.as_ref(), META_CURRENT_REV)?;
        // A finished compaction left nothing below its revision for the
        // index to drop; an unfinished one is resumed by the compactor.
        let job = (scheduled > finished).then_some(CompactionJob { rev: scheduled });
        let history_valid = history_is_valid(self.engine.as_ref())?;
        let mut state = self.write_state();
        state.index = index;
        state.loaded = loaded;
        state.history_valid = history_valid;
        state.history.clear();
        state.history_marked = false;
        state.current_rev = INITIAL_REVISION
            .max(max_rev)
            .max(stored_current)
            .max(scheduled);
        state.compact_rev = scheduled;
        state.diverged = false;
        drop(state);
        self.finished_compact_tx.send_replace(finished);
        Ok(job)
    }

    /// True while the index is partly loaded ([`super::loading`]).
    pub fn is_loading(&self) -> bool {
        !self.read_state().loaded.is_all()
    }

    /// Loads the next [`LOAD_STEP_KEYS`] keys of a partly loaded index;
    /// true once every key is loaded.
    pub fn load_step(&self) -> Result<bool, EngineError> {
        self.load_keys(LOAD_STEP_KEYS)
    }

    /// [`MvccStore::load_step`] of `max_keys` keys.
    fn load_keys(&self, max_keys: usize) -> Result<bool, EngineError> {
        let mut state = self.write_state();
        self.load_into(&mut state, |loaded, engine, index| {
            loaded.load_step(engine, index, max_keys)
        })?;
        Ok(state.loaded.is_all())
    }

    /// Loads every key a partly loaded index lacks (what needs them all:
    /// HashKV, a lease's keys).
    pub fn load_all(&self) -> Result<(), EngineError> {
        if self.read_state().loaded.is_all() {
            return Ok(());
        }
        let mut state = self.write_state();
        self.load_into(&mut state, |loaded, engine, index| {
            loaded.load_all(engine, index)
        })
    }

    /// Loads a partly loaded index on a thread of its own, a step at a
    /// time, until every key is loaded (or the store is dropped).
    pub fn load_in_background(self: &Arc<Self>) -> std::io::Result<()> {
        if !self.is_loading() {
            return Ok(());
        }
        if self.loader.send_replace(true) {
            return Ok(()); // One runs already.
        }
        let store = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("index-load".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                loop {
                    let Some(store) = store.upgrade() else { return };
                    let step = store.load_step();
                    // Readers waiting for their range look again.
                    store
                        .loader
                        .send_modify(|running| *running = matches!(step, Ok(false)));
                    match step {
                        Ok(true) => {
                            tracing::info!(
                                keys = store.read_state().index.len(),
                                took_ms = started.elapsed().as_millis() as u64,
                                "loaded the key index"
                            );
                            return;
                        }
                        Ok(false) => {}
                        Err(error) => {
                            tracing::error!(%error, "loading the key index failed");
                            return;
                        }
                    }
                    drop(store);
                    std::thread::yield_now();
                }
            });
        if spawned.is_err() {
            self.loader.send_replace(false);
        }
        spawned.map(drop)
    }

    /// Waits until the loading thread has loaded every key of `range`
    /// (at once for one key, if it has, or if none runs: the read then
    /// loads what it lacks itself, under the write lock). A large read so
    /// waits while writes go on, instead of holding them up while it loads.
    pub async fn loaded_for(&self, range: &KeyRange) {
        if let KeyRange::Single(_) = range {
            return; // One key loads at once.
        }
        let mut loader = self.loader.subscribe();
        loop {
            {
                let state = self.read_state();
                if state.loaded.covers(&state.index, range) {
                    return;
                }
            }
            if !*loader.borrow_and_update() || loader.changed().await.is_err() {
                return;
            }
        }
    }

    /// Runs `load` on the state; leased keys it found by completing the
    /// load go to the lease sink (under the state lock, so no write
    /// changes their keys before the lessor has them).
    fn load_into(
        &self,
        state: &mut State,
        load: impl FnOnce(
            &mut Loaded,
            &dyn EngineRead,
            &mut TreeIndex,
        ) -> Result<Option<LeasedKeys>, EngineError>,
    ) -> Result<(), EngineError> {
        let State { loaded, index, .. } = state;
        if let Some(leased) = load(loaded, self.engine.as_ref(), index)? {
            let sink = self.lease_sink.lock().unwrap_or_else(|p| p.into_inner());
            match sink.as_ref() {
                Some(sink) => sink(leased),
                None => self
                    .reloaded_leased
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(leased),
            }
        }
        Ok(())
    }

    /// Sets where the leased keys go that completing a partial load finds
    /// (the lessor, which has reloaded the leases themselves); ones found
    /// before are handed over at once.
    pub fn set_lease_sink(&self, sink: LeaseSink) {
        let state = self.write_state();
        if state.loaded.is_all() {
            let found = self.take_reloaded_leased_keys();
            if !found.is_empty() {
                sink(found);
            }
        }
        *self.lease_sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
        drop(state);
    }

    /// The state read-locked with every key of `range` in the index, or
    /// write-locked after loading them.
    fn read_covering(&self, range: &KeyRange) -> Result<Guard<'_>, MvccError> {
        let state = self.read_state();
        if state.loaded.covers(&state.index, range) {
            return Ok(Guard::Read(state));
        }
        drop(state);
        let mut state = self.write_state();
        self.load_into(&mut state, |loaded, engine, index| {
            loaded.load_range(engine, index, range)
        })?;
        Ok(Guard::Write(state))
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().expect("mvcc state lock poisoned")
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().expect("mvcc state lock poisoned")
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The newest revision.
    pub fn current_revision(&self) -> i64 {
        self.read_state().current_rev
    }

    /// The compaction revision (0 if never compacted).
    pub fn compact_revision(&self) -> i64 {
        self.read_state().compact_rev
    }

    /// Reads `range` as of `opts.rev`: [`MvccStore::range_stored`], each
    /// value decoded (and dropped for a keys-only read) as it is read.
    pub fn range(&self, range: &KeyRange, opts: RangeOptions) -> Result<RangeResult, MvccError> {
        let stored = self.range_stored(range, opts)?;
        let mut kvs = Vec::with_capacity(stored.kvs.len());
        for bytes in stored.kvs {
            let mut kv = decode_kv(&bytes?)?;
            if opts.keys_only {
                kv.value = Vec::new();
            }
            kvs.push(kv);
        }
        Ok(RangeResult {
            kvs,
            count: stored.count,
            rev: stored.rev,
        })
    }

    /// Reads `range` as of `opts.rev`, the key-values as stored
    /// (`opts.keys_only` is the caller's to apply).
    ///
    /// The index is read under the state lock; a range that sees more than
    /// [`RANGE_VALUES_UNDER_LOCK`] keys takes an engine snapshot under the
    /// lock and loads the values after releasing it, as they are taken, so
    /// a large read does not hold up apply (writers wait for the lock)
    /// while it loads. The snapshot keeps every revision the index named
    /// readable, even if a compaction removes it meanwhile.
    pub fn range_stored(
        &self,
        range: &KeyRange,
        opts: RangeOptions,
    ) -> Result<StoredRange, MvccError> {
        let state = self.read_covering(range)?;
        let current = state.current_rev;
        let (visible, count) = plan_range(&state, range, &opts, current)?;
        let revisions: Vec<Revision> = visible.into_iter().map(|v| v.at.modified).collect();
        let kvs = if revisions.len() <= RANGE_VALUES_UNDER_LOCK {
            let kvs = StoredKvs::read(self.engine.as_ref(), revisions)?;
            drop(state);
            kvs
        } else {
            let view = self.engine.snapshot();
            drop(state);
            StoredKvs::from_snapshot(view, revisions)
        };
        Ok(StoredRange {
            kvs,
            count,
            rev: current,
        })
    }

    /// Number of keys live now (`etcd_debugging_mvcc_keys_total`), without
    /// visiting them.
    pub fn live_keys(&self) -> usize {
        self.read_state().live_keys()
    }

    /// Starts a write transaction (blocks other writers and readers until
    /// it commits or is dropped).
    pub fn write(&self) -> WriteTxn<'_> {
        let state = self.write_state();
        let begin_rev = state.current_rev;
        WriteTxn {
            store: self,
            state,
            events_prev: self.prev_kv_watchers.load(Ordering::Acquire) > 0,
            begin_rev,
            batch: WriteBatch::new(),
            written: Vec::new(),
            events: Vec::new(),
            write_all_history: false,
        }
    }

    /// Every live key that had a lease at the last [`MvccStore::reload`]
    /// (start-up, snapshot install), with its lease id; taken once, right
    /// after that reload, by the lessor, which applied events keep current
    /// from then on. A second call returns nothing.
    pub fn take_reloaded_leased_keys(&self) -> LeasedKeys {
        std::mem::take(
            &mut *self
                .reloaded_leased
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Subscribes to the finished physical compaction revision.
    pub fn finished_compaction(&self) -> watch::Receiver<i64> {
        self.finished_compact_tx.subscribe()
    }

    /// Registers a watcher that wants `prev_kv`: from the next write
    /// transaction on, events carry the values they replace.
    pub fn watch_prev_kv(&self) -> PrevKvInterest {
        self.prev_kv_watchers.fetch_add(1, Ordering::AcqRel);
        PrevKvInterest(Arc::clone(&self.prev_kv_watchers))
    }

    /// The value `key` had just before `mod_revision` (an event's
    /// `prev_kv` filled in late), or None if it did not exist or that
    /// history is compacted (etcd's watch stream leaves prev_kv out then).
    pub fn prev_kv(&self, key: &[u8], mod_revision: i64) -> Result<Option<KeyValue>, MvccError> {
        let opts = RangeOptions {
            rev: mod_revision - 1,
            ..RangeOptions::default()
        };
        match self.range(&KeyRange::Single(key.to_vec()), opts) {
            Ok(mut r) => Ok(r.kvs.pop()),
            Err(MvccError::Compacted | MvccError::FutureRev) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The stored value of one revision (watch catch-up, prev_kv).
    pub fn kv_at_revision(
        &self,
        rev: Revision,
        tombstone: bool,
    ) -> Result<Option<KeyValue>, MvccError> {
        match self.engine.get(Table::Kv, &rev.to_key(tombstone))? {
            Some(v) => Ok(Some(decode_kv(&v)?)),
            None => Ok(None),
        }
    }

    /// Compacts the index at `job.rev` and deletes from the engine the
    /// revisions that drops, in steps of at most
    /// [`COMPACTION_BATCH_KEYS`] keys and [`COMPACTION_BATCH_REVISIONS`]
    /// revisions, each under the write lock, with a pause between them
    /// (etcd's batched compaction). A step holds writes for about a
    /// millisecond, where compacting a million keys at once held them for
    /// over a second. Reads at or above the compaction revision do not
    /// depend on how far the job got, and a restart resumes an unfinished
    /// job from the start (the rebuilt index holds what was not deleted).
    pub async fn run_physical_compaction(&self, job: CompactionJob) -> Result<(), MvccError> {
        // Every key's history, to know what the compaction drops.
        while !self.load_step()? {
            tokio::task::yield_now().await;
        }
        let mut after: Option<Arc<[u8]>> = None;
        loop {
            let mut dropped = Vec::new();
            {
                let mut state = self.write_state();
                after = state.index.compact_some(
                    job.rev,
                    after.as_deref(),
                    COMPACTION_BATCH_KEYS,
                    COMPACTION_BATCH_REVISIONS,
                    &mut dropped,
                );
                let mut batch = WriteBatch::new();
                for (key, rev, tombstone) in dropped {
                    batch.delete(Table::Kv, rev.to_key(tombstone));
                    batch.delete(Table::KvIndex, rev.to_key(tombstone));
                    batch.delete(Table::Meta, key_history::entry_key(&key, rev, tombstone));
                }
                if after.is_none() {
                    let rev = job.rev.to_be_bytes().to_vec();
                    if state.history_valid {
                        let mark = key_history::META_HISTORY_COMPACT_REV.to_vec();
                        batch.put(Table::Meta, mark, rev.clone());
                    }
                    batch.put(Table::Meta, META_FINISHED_COMPACT_REV.to_vec(), rev);
                }
                // Under the lock: a small read loads its values under it,
                // and must not find a revision its plan named deleted.
                self.engine.write(batch, false)?;
            }
            if after.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(COMPACTION_BATCH_PAUSE_MS)).await;
        }
        self.finished_compact_tx
            .send_modify(|f| *f = (*f).max(job.rev));
        Ok(())
    }

    /// History for watchers catching up: the events of main revisions
    /// `from..=to`, oldest first, each with its `prev_kv`. Stops after the
    /// revision during which `max_events` was reached (a revision's events
    /// are never split). Returns the events and the last revision covered.
    pub fn events_between(
        &self,
        from: i64,
        to: i64,
        max_events: usize,
    ) -> Result<(Vec<Event>, i64), MvccError> {
        let state = self.read_state();
        let mut state = if state.loaded.is_all() {
            Guard::Read(state)
        } else {
            // Each event's key is loaded for its previous value.
            drop(state);
            Guard::Write(self.write_state())
        };
        if from < state.compact_rev {
            return Err(MvccError::Compacted);
        }
        let to = to.min(state.current_rev);
        let mut events = Vec::new();
        let mut last = from - 1;
        let mut failure = None;
        let end = Revision::start_key(to + 1);
        self.engine.scan(
            Table::Kv,
            &Revision::start_key(from),
            Some(&end),
            &mut |k, v| {
                let Some((rev, tombstone)) = Revision::from_key(k) else {
                    return ControlFlow::Continue(());
                };
                if rev.main != last && events.len() >= max_events {
                    return ControlFlow::Break(());
                }
                if let Guard::Write(state) = &mut state {
                    let loaded = super::stored::parse(v).and_then(|kv| {
                        let key = KeyRange::Single(kv.key.to_vec());
                        self.load_into(state, |loaded, engine, index| {
                            loaded.load_range(engine, index, &key)
                        })
                    });
                    if let Err(e) = loaded {
                        failure = Some(e.into());
                        return ControlFlow::Break(());
                    }
                }
                match history_event(&state, self.engine.as_ref(), rev, tombstone, v) {
                    Ok(e) => events.push(e),
                    Err(e) => {
                        failure = Some(e);
                        return ControlFlow::Break(());
                    }
                }
                last = rev.main;
                ControlFlow::Continue(())
            },
        )?;
        if let Some(e) = failure {
            return Err(e);
        }
        if events.len() < max_events {
            last = to;
        }
        Ok((events, last.max(from - 1)))
    }

    /// etcd's `HashKV`: CRC-32C (Castagnoli) of the bucket name "key"
    /// followed by every stored (revision key, value) pair with revision
    /// `<= rev`, leaving out revisions at or below the compaction revision
    /// that a compaction at `rev` would not keep. Because the `kv` table is
    /// etcd's own layout, the hash equals etcd's for the same history.
    /// Returns (hash, compact revision, hashed revision).
    pub fn hash_kv(&self, rev: i64) -> Result<(u32, i64, i64), MvccError> {
        let state = loop {
            self.load_all()?;
            let state = self.read_state();
            if state.loaded.is_all() {
                break state;
            }
        };
        let compact_rev = state.compact_rev;
        if rev > 0 && rev <= compact_rev {
            return Err(MvccError::Compacted);
        }
        if rev > state.current_rev {
            return Err(MvccError::FutureRev);
        }
        let rev = if rev <= 0 { state.current_rev } else { rev };
        let keep = state.index.keep_at(rev);
        let mut crc = crc32c::crc32c(b"key");
        let end = Revision::start_key(rev + 1);
        self.engine.scan(Table::Kv, &[], Some(&end), &mut |k, v| {
            if let Some((r, _)) = Revision::from_key(k) {
                if r.main <= compact_rev && !keep.is_empty() && !keep.contains(&r) {
                    return ControlFlow::Continue(());
                }
            }
            crc = crc32c::crc32c_append(crc, k);
            crc = crc32c::crc32c_append(crc, v);
            ControlFlow::Continue(())
        })?;
        Ok((crc, compact_rev, rev))
    }
}

/// One stored revision as a watch event, with the key's previous value.
fn history_event(
    state: &State,
    engine: &dyn EngineRead,
    rev: Revision,
    tombstone: bool,
    value: &[u8],
) -> Result<Event, MvccError> {
    let mut kv = decode_kv(value)?;
    let prev_kv = match state.index.get(&kv.key, rev.main - 1) {
        Some(at) if rev.main > state.compact_rev => {
            match engine.get(Table::Kv, &at.modified.to_key(false))? {
                Some(bytes) => Some(decode_kv(&bytes)?),
                None => None,
            }
        }
        _ => None,
    };
    let kind = if tombstone {
        kv.mod_revision = rev.main;
        EventType::Delete
    } else {
        EventType::Put
    };
    Ok(Event {
        r#type: kind as i32,
        kv: Some(kv),
        prev_kv,
    })
}

/// The key index built from stored revisions, with what a reload needs
/// beside it ([`MvccStore::reload`]).
struct PreparedIndex {
    index: TreeIndex,
    /// The live keys holding a lease, with their lease ids.
    leased: LeasedKeys,
    /// The newest main revision stored.
    max_rev: i64,
    /// Revisions read.
    revisions: u64,
}

/// Builds a [`PreparedIndex`] from the `kv` table's pairs in revision
/// (key) order.
#[derive(Default)]
struct IndexBuilder {
    rebuild: Rebuild,
    /// Puts with a lease: (key, lease, revision).
    leased: Vec<(Vec<u8>, i64, Revision)>,
    max_rev: i64,
    revisions: u64,
}

impl IndexBuilder {
    fn add_batch(&mut self, batch: &ParsedBatch) {
        for (key, r) in batch.revisions() {
            self.add(key, r);
        }
    }

    fn add(&mut self, key: &[u8], r: &ParsedRevision) {
        restore_parsed(&mut self.rebuild, &mut self.leased, key, r);
        self.max_rev = self.max_rev.max(r.rev.main);
        self.revisions += 1;
    }

    /// The index, and the live keys holding a lease: a leased put names
    /// one if it is still its key's newest revision.
    fn finish(self) -> PreparedIndex {
        let index = self.rebuild.finish();
        let leased = still_leased(&index, self.leased);
        PreparedIndex {
            index,
            leased,
            max_rev: self.max_rev,
            revisions: self.revisions,
        }
    }
}

/// Restores one stored revision into `index`; a put with a lease is added
/// to `leased` (key, lease, revision) for [`MvccStore::reload`] to check.
fn restore_parsed(
    index: &mut Rebuild,
    leased: &mut Vec<(Vec<u8>, i64, Revision)>,
    key: &[u8],
    r: &ParsedRevision,
) {
    if !r.tombstone && r.lease != 0 {
        leased.push((key.to_vec(), r.lease, r.rev));
    }
    if r.tombstone {
        // A tombstone whose puts were all compacted away is harmless.
        index.tombstone(key, r.rev);
    } else {
        index.restore(key, Revision::new(r.create_revision, 0), r.rev, r.version);
    }
}

/// One stored revision's index fields but its key, as the rebuild needs
/// them.
#[derive(Clone, Copy)]
struct ParsedRevision {
    rev: Revision,
    tombstone: bool,
    create_revision: i64,
    version: i64,
    lease: i64,
}

impl ParsedRevision {
    /// A stored `kv` pair's index fields, and its user key (borrowed from
    /// `value`).
    fn parse<'v>(key: &[u8], value: &'v [u8]) -> Result<(&'v [u8], Self), MvccError> {
        let (rev, tombstone) = Revision::from_key(key)
            .ok_or_else(|| EngineError::corrupt(format!("bad revision key {key:?}")))?;
        let kv = super::stored::parse(value)?;
        let parsed = ParsedRevision {
            rev,
            tombstone,
            create_revision: kv.create_revision,
            version: kv.version,
            lease: kv.lease,
        };
        Ok((kv.key, parsed))
    }

    /// `key`'s key history entry for this revision.
    fn history_entry(&self, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let change = if self.tombstone {
            Change::Tombstone
        } else {
            Change::Put {
                create_revision: self.create_revision,
                version: self.version,
                lease: self.lease,
            }
        };
        key_history::encode(key, self.rev, change)
    }
}

/// Up to [`REBUILD_BATCH_REVISIONS`] parsed revisions (or fewer whose keys
/// make [`REBUILD_BATCH_KEY_BYTES`]), their keys in one buffer.
#[derive(Default)]
struct ParsedBatch {
    keys: Vec<u8>,
    /// Each revision with the end of its key in `keys`.
    revisions: Vec<(usize, ParsedRevision)>,
}

impl ParsedBatch {
    fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), MvccError> {
        let (user_key, parsed) = ParsedRevision::parse(key, value)?;
        self.keys.extend_from_slice(user_key);
        self.revisions.push((self.keys.len(), parsed));
        Ok(())
    }

    /// The revision pushed last, with its key.
    fn last(&self) -> Option<(&[u8], &ParsedRevision)> {
        let (end, parsed) = self.revisions.last()?;
        let start = match self.revisions.len() {
            1 => 0,
            n => self.revisions[n - 2].0,
        };
        Some((&self.keys[start..*end], parsed))
    }

    /// Each revision with its key, in scan order.
    fn revisions(&self) -> impl Iterator<Item = (&[u8], &ParsedRevision)> {
        let mut start = 0;
        self.revisions.iter().map(move |(end, parsed)| {
            let key = &self.keys[start..*end];
            start = *end;
            (key, parsed)
        })
    }
}

/// Whether the key history ([`key_history`]) can be trusted at start-up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum History {
    /// Written for every change of `kv` since it was filled (read back
    /// from `kv_index` past its mark, if it was behind).
    Valid,
    /// Missing, or `kv` changed without it: the rebuild's scan fills it
    /// again.
    Refill,
}

/// True if the key history matches `kv` through the current revision and
/// the finished compaction ([`key_history`]'s markers): only then do
/// commits and compactions move the markers on.
fn history_is_valid(engine: &dyn EngineRead) -> Result<bool, MvccError> {
    Ok(history_at_start(engine)? == HistoryAtStart::Valid)
}

/// Adds a slice of collected key history entries to `batch`, and the
/// history's mark if the slice completes a chunk and the history is
/// `valid` (see [`State::history_valid`]).
fn add_history(batch: &mut WriteBatch, slice: key_history::Slice, valid: bool) {
    for (entry, value) in slice.entries {
        batch.put(Table::Meta, entry, value);
    }
    if let (Some(through), true) = (slice.through, valid) {
        batch.put(
            Table::Meta,
            key_history::META_HISTORY_REV.to_vec(),
            through.to_be_bytes().to_vec(),
        );
    }
}

/// How a start treats the key history ([`key_history`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HistoryAtStart {
    /// Written through the current revision.
    Valid,
    /// Written through this revision; the later ones are in `kv_index`.
    Behind(i64),
    /// Missing, or `kv` changed without it.
    Refill,
}

/// Reads the key history's marks (see [`key_history`]'s module docs).
fn history_at_start(engine: &dyn EngineRead) -> Result<HistoryAtStart, MvccError> {
    if !history_is_valid_for_compaction(engine)? {
        return Ok(HistoryAtStart::Refill);
    }
    let current = read_opt_i64(engine, META_CURRENT_REV)?;
    let through = read_opt_i64(engine, key_history::META_HISTORY_REV)?;
    let index_complete = read_opt_i64(engine, META_KV_INDEX_COMPLETE)?.is_some();
    Ok(match (current, through) {
        (c, t) if c == t => HistoryAtStart::Valid,
        (Some(c), Some(t)) if t < c && index_complete => HistoryAtStart::Behind(t),
        _ => HistoryAtStart::Refill,
    })
}

/// True if the key history's compaction mark matches the finished
/// compaction: no compaction ran without deleting its entries.
fn history_is_valid_for_compaction(engine: &dyn EngineRead) -> Result<bool, MvccError> {
    Ok(read_opt_i64(engine, META_FINISHED_COMPACT_REV)?
        == read_opt_i64(engine, key_history::META_HISTORY_COMPACT_REV)?)
}

/// Which table a start-up rebuild reads.
#[derive(Clone, Copy)]
enum RebuildSource {
    /// `kv_index`, complete ([`META_KV_INDEX_COMPLETE`]).
    IndexFields,
    /// `kv`, every value, writing each revision's index fields to
    /// `kv_index` on the way and then [`META_KV_INDEX_COMPLETE`]: once, for
    /// a directory without them.
    ValuesFillingIndexFields,
}

/// Scans every stored revision in revision order on a thread of its own,
/// parsing each into batches that `restore` receives in order on the
/// calling thread: reading the engine (block reads, checksums) and building
/// the index run on two cores at once.
fn rebuild_pipelined(
    engine: &dyn Engine,
    source: RebuildSource,
    history: History,
    restore: &mut dyn FnMut(&ParsedBatch),
) -> Result<(), MvccError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<ParsedBatch>(REBUILD_BATCHES_IN_FLIGHT);
    std::thread::scope(|scope| {
        let scanner = std::thread::Builder::new()
            .name("index-rebuild-scan".into())
            .spawn_scoped(scope, move || {
                scan_for_rebuild(engine, source, history, &tx)
            })
            .map_err(|e| EngineError::Backend(Box::new(e)))?;
        for batch in rx {
            restore(&batch);
        }
        scanner
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The scanning half of [`rebuild_pipelined`].
fn scan_for_rebuild(
    engine: &dyn Engine,
    source: RebuildSource,
    history: History,
    tx: &std::sync::mpsc::SyncSender<ParsedBatch>,
) -> Result<(), MvccError> {
    let (table, fill) = match source {
        RebuildSource::IndexFields => (Table::KvIndex, false),
        RebuildSource::ValuesFillingIndexFields => (Table::Kv, true),
    };
    let refill = history == History::Refill;
    let mut batch = ParsedBatch::default();
    let mut fields = WriteBatch::new();
    if refill {
        // Entries a build without the key history left behind: revisions
        // it compacted away, kept by nothing else.
        fields.delete_range(
            Table::Meta,
            key_history::HISTORY_PREFIX.to_vec(),
            key_history::HISTORY_END.to_vec(),
        );
    }
    let mut stopped = false;
    // Filling `kv_index` writes to the engine while the scan goes on, so
    // it scans a view. Otherwise the engine is read directly: releasing a
    // RocksDB snapshot makes it rewrite every bottommost table file whose
    // sequence numbers the snapshot held (after a restart, the whole `kv`
    // table, a gigabyte at a million keys).
    let view = fill.then(|| engine.snapshot());
    let read: &dyn EngineRead = match &view {
        Some(view) => view.as_ref(),
        None => engine,
    };
    try_scan(read, table, b"", None, &mut |k, v| {
        batch.push(k, v)?;
        if fill {
            fields.put(Table::KvIndex, k.to_vec(), index_fields(&mut decode_kv(v)?));
        }
        if refill {
            let (key, r) = batch.last().expect("a revision was just pushed");
            let (entry, value) = r.history_entry(key);
            fields.put(Table::Meta, entry, value);
        }
        if fields.len() >= REBUILD_BATCH_REVISIONS {
            engine.write(std::mem::take(&mut fields), false)?;
        }
        let full = batch.revisions.len() >= REBUILD_BATCH_REVISIONS
            || batch.keys.len() >= REBUILD_BATCH_KEY_BYTES;
        if full && tx.send(std::mem::take(&mut batch)).is_err() {
            // The receiver is gone: nothing left to do.
            stopped = true;
            return Ok(ControlFlow::Break(()));
        }
        Ok::<_, MvccError>(ControlFlow::Continue(()))
    })?;
    if fill && !stopped {
        fields.put(
            Table::Meta,
            META_KV_INDEX_COMPLETE.to_vec(),
            1i64.to_be_bytes().to_vec(),
        );
    }
    if refill && !stopped {
        let marks = [
            (META_CURRENT_REV, key_history::META_HISTORY_REV),
            (
                META_FINISHED_COMPACT_REV,
                key_history::META_HISTORY_COMPACT_REV,
            ),
        ];
        for (stored, mark) in marks {
            if let Some(rev) = read_opt_i64(engine, stored)? {
                fields.put(Table::Meta, mark.to_vec(), rev.to_be_bytes().to_vec());
            }
        }
    }
    if (fill || refill) && !stopped {
        engine.write(fields, true)?;
    }
    let _ = tx.send(batch);
    Ok(())
}

/// The index half of a read: which revisions a range sees (none for a
/// count) and how many keys match. Needs the state lock.
fn plan_range(
    state: &State,
    range: &KeyRange,
    opts: &RangeOptions,
    read_rev_default: i64,
) -> Result<(Vec<VisibleKey>, usize), MvccError> {
    if state.diverged {
        return Err(EngineError::corrupt(DIVERGED).into());
    }
    let rev = if opts.rev <= 0 {
        read_rev_default
    } else {
        opts.rev
    };
    if rev > read_rev_default {
        return Err(MvccError::FutureRev);
    }
    if rev < state.compact_rev {
        return Err(MvccError::Compacted);
    }
    let limit = if opts.count_only { 1 } else { opts.limit };
    let (visible, count) = if opts.count_to_limit {
        state.index.range_to_limit(range, rev, limit)
    } else {
        state.index.range(range, rev, limit)
    };
    if opts.count_only {
        return Ok((Vec::new(), count));
    }
    Ok((visible, count))
}

/// A write transaction's own values, not in the engine yet: for each
/// revision it wrote, in the order written (so sorted), the position of the
/// encoded `KeyValue` in its batch. A put records two numbers instead of a
/// copy of its key and value in a hash map (whose growth alone was 1% of a
/// follower's CPU); the rare read of a value written earlier in the same
/// transaction decodes it from the batch.
#[derive(Clone, Copy)]
struct Pending<'a> {
    written: &'a [(Revision, usize)],
    batch: Option<&'a WriteBatch>,
}

impl Pending<'_> {
    fn get(&self, rev: Revision) -> Result<Option<KeyValue>, MvccError> {
        let (Ok(i), Some(batch)) = (
            self.written.binary_search_by_key(&rev, |(r, _)| *r),
            self.batch,
        ) else {
            return Ok(None);
        };
        match &batch.ops()[self.written[i].1] {
            BatchOp::Put(Table::Kv, _, value) => decode_kv(value).map(Some),
            _ => unreachable!("a written revision names a put of the Kv table"),
        }
    }
}

/// The engine half of a read: the values of `visible` (from `pending`
/// first: a transaction's own writes), without them for a keys-only read.
fn load_values(
    engine: &dyn EngineRead,
    pending: Pending<'_>,
    visible: Vec<VisibleKey>,
    opts: &RangeOptions,
) -> Result<Vec<KeyValue>, MvccError> {
    let mut kvs = Vec::with_capacity(visible.len());
    for v in visible {
        let mut kv = match pending.get(v.at.modified)? {
            Some(kv) => kv,
            None => {
                let bytes = engine
                    .get(Table::Kv, &v.at.modified.to_key(false))?
                    .ok_or_else(|| {
                        EngineError::corrupt(format!(
                            "revision {:?} of key {:?} missing",
                            v.at.modified, v.key
                        ))
                    })?;
                decode_kv(&bytes)?
            }
        };
        if opts.keys_only {
            kv.value = Vec::new();
        }
        kvs.push(kv);
    }
    Ok(kvs)
}

fn range_in(
    state: &State,
    engine: &dyn EngineRead,
    pending: Pending<'_>,
    range: &KeyRange,
    opts: RangeOptions,
    read_rev_default: i64,
    current_rev: i64,
) -> Result<RangeResult, MvccError> {
    let (visible, count) = plan_range(state, range, &opts, read_rev_default)?;
    Ok(RangeResult {
        kvs: load_values(engine, pending, visible, &opts)?,
        count,
        rev: current_rev,
    })
}

/// Ranges that see at most this many keys load their values under the
/// state lock (cheaper than an engine snapshot); larger ones load from a
/// snapshot after releasing it ([`MvccStore::range`]).
pub const RANGE_VALUES_UNDER_LOCK: usize = 256;

/// One write transaction: one new main revision, or several when the
/// caller [seals](WriteTxn::seal) each before starting the next (one engine
/// batch for many revisions, as etcd's batch transaction).
///
/// Worked example, store at revision 7: `put(a)` writes `8_0`; `seal()`
/// answers `(8, [PUT a])`; `put(b)` then writes `9_0` and reads inside the
/// transaction see both; `commit` writes `8_0`, `9_0` and the current
/// revision 9 in one engine batch and answers `(9, [])`.
pub struct WriteTxn<'a> {
    store: &'a MvccStore,
    state: RwLockWriteGuard<'a, State>,
    /// Whether events carry the values they replace (a watcher wants them).
    events_prev: bool,
    begin_rev: i64,
    batch: WriteBatch,
    /// Revisions written by this transaction, not yet in the engine, with
    /// their positions in `batch` (see [`Pending`]).
    written: Vec<(Revision, usize)>,
    events: Vec<Event>,
    /// A compaction was scheduled: the commit writes every collected key
    /// history entry ([`key_history`]).
    write_all_history: bool,
}

impl WriteTxn<'_> {
    /// The revision this transaction creates if it changes anything.
    pub fn write_rev(&self) -> i64 {
        self.begin_rev + 1
    }

    /// The revision reads inside the transaction see: its own writes included.
    fn read_rev(&self) -> i64 {
        if self.events.is_empty() {
            self.begin_rev
        } else {
            self.begin_rev + 1
        }
    }

    /// True once the transaction has changed something.
    pub fn has_changes(&self) -> bool {
        !self.events.is_empty()
    }

    /// True while the index is partly loaded ([`super::loading`]).
    pub fn is_loading(&self) -> bool {
        !self.state.loaded.is_all()
    }

    /// Loads `range`'s keys into a partly loaded index
    /// ([`super::loading`]): a read inside the transaction needs them
    /// loaded first, as it cannot load them itself.
    pub fn load(&mut self, range: &KeyRange) -> Result<(), EngineError> {
        if let KeyRange::Single(key) = range {
            return self.load_key(key);
        }
        let state = &mut *self.state;
        self.store.load_into(state, |loaded, engine, index| {
            loaded.load_range(engine, index, range)
        })
    }

    /// [`WriteTxn::load`] of one key, which allocates nothing when the key
    /// is loaded.
    fn load_key(&mut self, key: &[u8]) -> Result<(), EngineError> {
        if self.state.loaded.is_all() || self.state.index.contains(key) {
            return Ok(());
        }
        let state = &mut *self.state;
        let range = KeyRange::Single(key.to_vec());
        self.store.load_into(state, |loaded, engine, index| {
            loaded.load_range(engine, index, &range)
        })
    }

    /// Loads every key a partly loaded index lacks (a lease's revocation
    /// needs the lessor to know every key attached to it).
    pub fn load_all(&mut self) -> Result<(), EngineError> {
        let state = &mut *self.state;
        self.store.load_into(state, |loaded, engine, index| {
            loaded.load_all(engine, index)
        })
    }

    /// Reads inside the transaction (sees its own earlier writes). Its
    /// keys must be loaded ([`WriteTxn::load`]).
    pub fn range(&self, range: &KeyRange, opts: RangeOptions) -> Result<RangeResult, MvccError> {
        if !self.state.loaded.covers(&self.state.index, range) {
            return Err(EngineError::corrupt(format!(
                "a read inside a write transaction of keys not loaded into the index: {range:?}"
            ))
            .into());
        }
        let read_rev = self.read_rev();
        let engine = self.store.engine.as_ref();
        range_in(
            &self.state,
            engine,
            Pending {
                written: &self.written,
                batch: Some(&self.batch),
            },
            range,
            opts,
            read_rev,
            read_rev,
        )
    }

    /// The live value of `key` (as the transaction sees it).
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MvccError> {
        let mut r = self.range(&KeyRange::Single(key.to_vec()), RangeOptions::default())?;
        Ok(r.kvs.pop())
    }

    fn next_revision(&self) -> Revision {
        Revision::new(self.write_rev(), self.events.len() as i64)
    }

    /// Puts `key = value` with `lease`. The key's create revision and
    /// version come from the index; its old value is read only if `prev`
    /// is [`Prev::Unread`] and a watcher wants it for the event.
    pub fn put(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        lease: i64,
        prev: Prev,
    ) -> Result<(), MvccError> {
        self.load_key(key)?;
        let prev = match prev {
            Prev::Read(p) => p,
            Prev::Unread if self.events_prev => self.get(key)?,
            Prev::Unread => None,
        };
        let rev = self.next_revision();
        let (create_revision, version) = match self.state.index.put(key, rev) {
            Some(at) => (at.created.main, at.version + 1),
            None => (rev.main, 1),
        };
        debug_assert!(prev
            .as_ref()
            .is_none_or(|p| (p.create_revision, p.version + 1) == (create_revision, version)));
        let mut kv = KeyValue {
            key: key.to_vec(),
            create_revision,
            mod_revision: rev.main,
            version,
            value,
            lease,
        };
        debug_assert!(self.written.last().is_none_or(|(last, _)| *last < rev));
        self.written.push((rev, self.batch.len()));
        self.batch
            .put(Table::Kv, rev.to_key(false), kv.encode_to_vec());
        self.batch
            .put(Table::KvIndex, rev.to_key(false), index_fields(&mut kv));
        let change = Change::Put {
            create_revision,
            version,
            lease,
        };
        self.state
            .history
            .push(key_history::encode(key, rev, change));
        self.events.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: prev,
        });
        Ok(())
    }

    /// Deletes every live key in `range`; returns how many, and their
    /// values in key order if `values` (a watcher that wants previous
    /// values makes the transaction read them anyway, for the events).
    pub fn delete_range(
        &mut self,
        range: &KeyRange,
        values: bool,
    ) -> Result<(usize, Vec<KeyValue>), MvccError> {
        self.load(range)?;
        let keys = self.state.index.live_keys(range);
        let count = keys.len();
        let read = values || self.events_prev;
        let mut deleted = Vec::with_capacity(if values { count } else { 0 });
        for key in keys {
            let prev = if read {
                Some(self.get(&key)?.ok_or_else(|| {
                    EngineError::corrupt(format!("live key {key:?} has no value"))
                })?)
            } else {
                None
            };
            let rev = self.next_revision();
            let tomb = KeyValue {
                key: key.clone(),
                ..Default::default()
            };
            // A tombstone has no value: its index fields are all of it.
            let tomb = tomb.encode_to_vec();
            self.batch
                .put(Table::KvIndex, rev.to_key(true), tomb.clone());
            self.batch.put(Table::Kv, rev.to_key(true), tomb);
            self.state
                .history
                .push(key_history::encode(&key, rev, Change::Tombstone));
            let removed = self.state.index.tombstone(&key, rev);
            assert!(removed, "key {key:?} was live a moment ago");
            let event_kv = KeyValue {
                key,
                mod_revision: rev.main,
                ..Default::default()
            };
            self.events.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(event_kv),
                prev_kv: if self.events_prev { prev.clone() } else { None },
            });
            if values {
                deleted.extend(prev);
            }
        }
        Ok((count, deleted))
    }

    /// Compacts history at `rev`: the index at once, the engine later via
    /// [`MvccStore::run_physical_compaction`] with the returned job.
    pub fn compact(&mut self, rev: i64) -> Result<CompactionJob, MvccError> {
        if rev <= self.state.compact_rev {
            return Err(MvccError::Compacted);
        }
        if rev > self.state.current_rev {
            return Err(MvccError::FutureRev);
        }
        self.state.compact_rev = rev;
        self.write_all_history = true;
        self.batch.put(
            Table::Meta,
            META_SCHEDULED_COMPACT_REV.to_vec(),
            rev.to_be_bytes().to_vec(),
        );
        Ok(CompactionJob { rev })
    }

    /// Ends the current revision: later writes of this transaction make
    /// the next one. Returns the revision now current inside the
    /// transaction and the events of the revision just ended (none if it
    /// changed nothing, and then no revision is used up).
    pub fn seal(&mut self) -> (i64, Vec<Event>) {
        if self.has_changes() {
            self.begin_rev += 1;
        }
        (self.begin_rev, std::mem::take(&mut self.events))
    }

    /// Writes the transaction's changes plus `extra` in one engine batch
    /// (not synced: the Raft log is the durable record) and publishes the
    /// new revision. Returns the store revision after the transaction and
    /// the events of its last (unsealed) revision.
    pub fn commit(mut self, extra: WriteBatch) -> Result<(i64, Vec<Event>), MvccError> {
        if self.state.diverged {
            return Err(EngineError::corrupt(DIVERGED).into());
        }
        let (rev, events) = self.seal();
        let history = self.state.history.take(rev, self.write_all_history);
        if !self.state.history_marked && history.through.is_none() && self.state.history_valid {
            // Everything before this commit is written (a reload leaves
            // nothing collected); a new store has no mark yet.
            self.batch.put(
                Table::Meta,
                key_history::META_HISTORY_REV.to_vec(),
                self.state.current_rev.to_be_bytes().to_vec(),
            );
        }
        self.state.history_marked = true;
        add_history(&mut self.batch, history, self.state.history_valid);
        if rev > self.state.current_rev {
            let rev_bytes = rev.to_be_bytes().to_vec();
            self.batch
                .put(Table::Meta, META_CURRENT_REV.to_vec(), rev_bytes);
            let live = self.state.live_keys() as i64;
            self.batch.put(
                Table::Meta,
                META_LIVE_KEYS.to_vec(),
                live.to_be_bytes().to_vec(),
            );
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.extend(extra);
        let started = std::time::Instant::now();
        self.store.engine.write(batch, false)?;
        crate::metrics::global()
            .disk
            .backend_commit
            .observe(started.elapsed().as_secs_f64());
        self.state.current_rev = rev;
        Ok((rev, events))
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        // Changes never committed (the engine failed mid-apply, or a bug)
        // leave the index ahead of the engine: the store refuses to serve
        // from it rather than abort the process.
        let uncommitted = !self.events.is_empty() || self.begin_rev != self.state.current_rev;
        if uncommitted && !self.state.diverged {
            self.state.diverged = true;
            tracing::error!(
                revision = self.state.current_rev,
                "write transaction dropped without commit: {DIVERGED}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryEngine;

    fn value_of(txn: &WriteTxn<'_>, key: &[u8]) -> Option<(Vec<u8>, i64, i64)> {
        let kv = txn.get(key).expect("read inside the transaction")?;
        Some((kv.value, kv.mod_revision, kv.version))
    }

    /// Reads inside a write transaction see its own puts, decoded from its
    /// batch, across sealed revisions; after the commit the same values come
    /// from the engine.
    #[test]
    fn a_transaction_reads_its_own_writes() {
        let store = MvccStore::open(Arc::new(MemoryEngine::new())).expect("open");
        let mut txn = store.write();
        txn.put(b"a", b"1".to_vec(), 0, Prev::Read(None))
            .expect("put");
        assert_eq!(value_of(&txn, b"a"), Some((b"1".to_vec(), 2, 1)));
        txn.seal();
        txn.put(b"b", b"2".to_vec(), 0, Prev::Unread).expect("put");
        txn.put(b"a", b"3".to_vec(), 0, Prev::Unread).expect("put");
        assert_eq!(value_of(&txn, b"a"), Some((b"3".to_vec(), 3, 2)));
        assert_eq!(value_of(&txn, b"b"), Some((b"2".to_vec(), 3, 1)));
        let (rev, _) = txn.commit(WriteBatch::new()).expect("commit");
        assert_eq!(rev, 3);
        let read = store
            .range(&KeyRange::new(b"a", b"c"), RangeOptions::default())
            .expect("range");
        let values: Vec<_> = read.kvs.iter().map(|kv| kv.value.clone()).collect();
        assert_eq!(values, vec![b"3".to_vec(), b"2".to_vec()]);
    }

    /// The reload's one pass records the live leased keys: the newest
    /// revision of each key decides (a lease moved, dropped by a put
    /// without one, a deleted key, one deleted and put again with a lease).
    /// Loading from the key history finds the same ones once complete,
    /// less the keys written since the reload.
    #[test]
    fn reload_records_the_live_keys_with_leases() {
        let engine = Arc::new(MemoryEngine::new());
        let store = MvccStore::open(engine.clone()).expect("open");
        let mut txn = store.write();
        for (key, lease) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("a", 5), ("b", 0)] {
            txn.put(key.as_bytes(), b"v".to_vec(), lease, Prev::Unread)
                .expect("put");
            txn.seal();
        }
        for key in ["c", "d"] {
            txn.delete_range(&KeyRange::Single(key.as_bytes().to_vec()), false)
                .expect("delete");
            txn.seal();
        }
        txn.put(b"d", b"v".to_vec(), 6, Prev::Unread).expect("put");
        txn.commit(WriteBatch::new()).expect("commit");

        let reopened = MvccStore::open(engine.clone()).expect("reopen");
        assert!(reopened.is_loading(), "the key history is valid");
        assert!(reopened.take_reloaded_leased_keys().is_empty());
        let found = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = found.clone();
        reopened.set_lease_sink(Box::new(move |l| sink.lock().unwrap().extend(l)));
        assert_eq!(
            reopened.get(b"a"),
            Some((b"v".to_vec(), 5)),
            "loaded on demand"
        );
        let mut txn = reopened.write();
        txn.put(b"d", b"v".to_vec(), 0, Prev::Unread).expect("put");
        txn.commit(WriteBatch::new()).expect("commit");
        assert!(
            found.lock().unwrap().is_empty(),
            "nothing before the load completes"
        );
        while !reopened.load_step().expect("load") {}
        let mut leased = found.lock().unwrap().clone();
        leased.sort();
        assert_eq!(leased, vec![(b"a".to_vec(), 5)], "d lost its lease since");

        let mut no_history = WriteBatch::new();
        no_history.delete(Table::Meta, key_history::META_HISTORY_REV.to_vec());
        engine.write(no_history, true).expect("write");
        let rebuilt = MvccStore::open(engine).expect("reopen");
        assert!(!rebuilt.is_loading());
        let mut leased = rebuilt.take_reloaded_leased_keys();
        leased.sort();
        assert_eq!(leased, vec![(b"a".to_vec(), 5)]);
        assert!(rebuilt.take_reloaded_leased_keys().is_empty());
    }

    /// A copy of every table of `engine`.
    fn copy_of(engine: &MemoryEngine) -> Arc<MemoryEngine> {
        let copy = Arc::new(MemoryEngine::new());
        let mut batch = WriteBatch::new();
        for t in Table::ALL {
            for (k, v) in crate::engine::scan_collect(engine, t, b"", None, 0).expect("scan") {
                batch.put(t, k, v);
            }
        }
        copy.write(batch, true).expect("copy");
        copy
    }

    /// One random write of the loading test: a put (with a lease or
    /// none) or a delete of one key, or a delete of a range of keys, in a
    /// revision of its own; returns its events.
    fn random_write(rng: &mut rand::rngs::StdRng, txn: &mut WriteTxn<'_>) -> Vec<Event> {
        use rand::Rng;
        let key = |rng: &mut rand::rngs::StdRng| format!("k{:02}", rng.gen_range(0..40));
        match rng.gen_range(0..10) {
            0 => {
                let (a, b) = (key(rng), key(rng));
                let range = KeyRange::Between(a.min(b.clone()).into_bytes(), b.into_bytes());
                txn.delete_range(&range, false).expect("delete range");
            }
            1 | 2 => {
                let range = KeyRange::Single(key(rng).into_bytes());
                txn.delete_range(&range, false).expect("delete");
            }
            _ => {
                let lease = rng.gen_range(0..3);
                let value = rng.gen::<u32>().to_be_bytes().to_vec();
                txn.put(key(rng).as_bytes(), value, lease, Prev::Unread)
                    .expect("put");
            }
        }
        txn.seal().1
    }

    /// A restarted store loads its index from the key history while
    /// writes and reads go on, and ends with what a store that never
    /// stopped holds: the same answers at every revision, the same HashKV,
    /// and the lessor told of exactly the leased keys no write touched since
    /// (the others it learns from the writes' events).
    #[tokio::test]
    async fn an_index_loaded_while_serving_answers_as_one_never_restarted() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let engine = Arc::new(MemoryEngine::new());
        let running = MvccStore::open(engine.clone()).expect("open");
        for _ in 0..20 {
            let mut txn = running.write();
            for _ in 0..10 {
                random_write(&mut rng, &mut txn);
            }
            txn.commit(WriteBatch::new()).expect("commit");
        }
        let at = running.current_revision() / 2;
        let mut txn = running.write();
        let job = txn.compact(at).expect("compact");
        txn.commit(WriteBatch::new()).expect("commit");
        running.run_physical_compaction(job).await.expect("compact");

        let restarted = MvccStore::open(copy_of(&engine)).expect("reopen");
        assert!(restarted.is_loading());
        let attached = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let sink = attached.clone();
        restarted.set_lease_sink(Box::new(move |keys| sink.lock().unwrap().extend(keys)));
        let all = KeyRange::From(Vec::new());
        let mut completed_at = None;
        for round in 0..60 {
            // The same writes on both; the events keep the lessor's view.
            let seed = rng.gen::<u64>();
            for (store, events) in [(&running, false), (&restarted, true)] {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut txn = store.write();
                let mut changes = Vec::new();
                for _ in 0..3 {
                    changes.extend(random_write(&mut rng, &mut txn));
                }
                txn.commit(WriteBatch::new()).expect("commit");
                for e in changes.into_iter().filter(|_| events) {
                    let kv = e.kv.expect("an event's key-value");
                    match (e.r#type == EventType::Put as i32, kv.lease) {
                        (true, lease) if lease != 0 => {
                            attached.lock().unwrap().insert(kv.key, lease)
                        }
                        _ => attached.lock().unwrap().remove(&kv.key),
                    };
                }
            }
            // Reads of one key, of a range, and loading steps between.
            let a = format!("k{:02}", rng.gen_range(0..40)).into_bytes();
            let b = format!("k{:02}", rng.gen_range(0..40)).into_bytes();
            let reads = [
                KeyRange::Single(a.clone()),
                KeyRange::Between(a.clone().min(b.clone()), b.max(a)),
            ];
            assert_eq!(restarted.live_keys(), running.live_keys(), "round {round}");
            for range in reads.iter().filter(|_| round % 3 != 0) {
                let opts = RangeOptions::default();
                assert_eq!(
                    restarted.range(range, opts).expect("read"),
                    running.range(range, opts).expect("read"),
                    "round {round}: {range:?}"
                );
            }
            if round % 4 == 0 && restarted.load_keys(3).expect("load") {
                completed_at.get_or_insert(round);
            }
        }
        assert!(completed_at.is_some(), "the steps completed the load");
        assert!(!restarted.is_loading());
        for rev in running.compact_revision()..=running.current_revision() {
            let opts = RangeOptions {
                rev,
                ..RangeOptions::default()
            };
            assert_eq!(
                restarted.range(&all, opts).expect("read"),
                running.range(&all, opts).expect("read"),
                "at {rev}"
            );
        }
        assert_eq!(
            restarted.hash_kv(0).expect("hash"),
            running.hash_kv(0).expect("hash")
        );
        let expected: std::collections::BTreeMap<_, _> = running
            .range(&all, RangeOptions::default())
            .expect("read")
            .kvs
            .into_iter()
            .filter(|kv| kv.lease != 0)
            .map(|kv| (kv.key, kv.lease))
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(*attached.lock().unwrap(), expected);
    }

    /// While the loading thread runs, a Range of many keys waits for it and
    /// a read of one key does not (it loads its key itself); once the
    /// thread is done, nothing waits.
    #[tokio::test]
    async fn only_ranges_wait_for_the_loading_thread() {
        let engine = Arc::new(MemoryEngine::new());
        let store = MvccStore::open(engine.clone()).expect("open");
        let mut txn = store.write();
        for key in ["a", "b", "c"] {
            txn.put(key.as_bytes(), b"v".to_vec(), 0, Prev::Unread)
                .expect("put");
        }
        txn.commit(WriteBatch::new()).expect("commit");
        drop(store);
        let store = MvccStore::open(engine).expect("reopen");
        assert!(store.is_loading());
        // A loading thread that has not made its first step yet.
        store.loader.send_replace(true);
        let one = KeyRange::Single(b"c".to_vec());
        assert!(futures::poll!(Box::pin(store.loaded_for(&one))).is_ready());
        let all = KeyRange::From(Vec::new());
        let mut waiting = Box::pin(store.loaded_for(&all));
        assert!(futures::poll!(&mut waiting).is_pending());
        assert!(!store.load_keys(2).expect("load"));
        store.loader.send_modify(|running| *running = true);
        assert!(futures::poll!(&mut waiting).is_pending(), "c is not loaded");
        assert!(store.load_keys(2).expect("load"));
        store.loader.send_modify(|running| *running = false);
        assert!(futures::poll!(&mut waiting).is_ready());
        assert_eq!(store.live_keys(), 3);
    }

    impl MvccStore {
        /// The live value of `key` with its lease.
        fn get(&self, key: &[u8]) -> Option<(Vec<u8>, i64)> {
            let r = self.range(&KeyRange::Single(key.to_vec()), RangeOptions::default());
            let kv = r.expect("read").kvs.pop()?;
            Some((kv.value, kv.lease))
        }
    }

    /// A table's pairs, in key order.
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    /// Every `kv` pair, and what `kv_index` holds.
    fn kv_and_index_fields(engine: &MemoryEngine) -> (Pairs, Pairs) {
        let kv = crate::engine::scan_collect(engine, Table::Kv, b"", None, 0).expect("scan kv");
        let fields =
            crate::engine::scan_collect(engine, Table::KvIndex, b"", None, 0).expect("scan index");
        (kv, fields)
    }

    /// The key history entries, and the ones `kv` calls for: each revision's
    /// entry ([`key_history`]), in entry order.
    fn history_and_expected(engine: &MemoryEngine) -> (Pairs, Pairs) {
        let (start, end) = (key_history::HISTORY_PREFIX, key_history::HISTORY_END);
        let history =
            crate::engine::scan_collect(engine, Table::Meta, start, Some(end), 0).expect("scan");
        let mut expected: Pairs = kv_and_index_fields(engine)
            .0
            .iter()
            .map(|(k, v)| {
                let (user_key, parsed) = ParsedRevision::parse(k, v).expect("parse");
                parsed.history_entry(user_key)
            })
            .collect();
        expected.sort();
        (history, expected)
    }

    /// The key history follows `kv` through puts (with and without a
    /// lease), deletes and a physical compaction; after a change of `kv`
    /// without it (a build before it ran on the directory) the next open
    /// fills it again, dropping entries of revisions compacted meanwhile.
    #[tokio::test]
    async fn the_key_history_follows_kv_and_is_refilled_after_a_change_without_it() {
        let engine = Arc::new(MemoryEngine::new());
        let store = MvccStore::open(engine.clone()).expect("open");
        let mut txn = store.write();
        for (key, lease) in [("a\0", 1), ("a", 0), ("b", 3), ("a", 7), ("b", 0)] {
            txn.put(key.as_bytes(), b"v".to_vec(), lease, Prev::Unread)
                .expect("put");
            txn.seal();
        }
        txn.delete_range(&KeyRange::From(b"b".to_vec()), false)
            .expect("delete");
        txn.commit(WriteBatch::new()).expect("commit");
        let (history, _) = history_and_expected(&engine);
        assert!(history.is_empty(), "collected, not written: {history:?}");
        // Scheduling the compaction writes what was collected first.
        let mut txn = store.write();
        let job = txn.compact(7).expect("compact");
        txn.commit(WriteBatch::new()).expect("commit");
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history.len(), 6, "five puts and a tombstone: {history:?}");
        assert_eq!(history, expected);
        store.run_physical_compaction(job).await.expect("compact");
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history.len(), 2, "b's life and a's first put are gone");
        assert_eq!(history, expected);
        assert!(history_is_valid(engine.as_ref()).expect("read"));
        drop(store);

        // A build without the key history puts `a` at 8 and compacts at 8,
        // which drops `a@5`.
        let old = key_history::entry_key(b"a", Revision::new(5, 0), false);
        assert!(history.iter().any(|(k, _)| *k == old));
        let mut a = KeyValue {
            key: b"a".to_vec(),
            create_revision: 3,
            mod_revision: 8,
            version: 3,
            value: b"v".to_vec(),
            lease: 0,
        };
        let (at8, at5) = (
            Revision::new(8, 0).to_key(false),
            Revision::new(5, 0).to_key(false),
        );
        let mut batch = WriteBatch::new();
        batch.put(Table::Kv, at8.clone(), a.encode_to_vec());
        batch.put(Table::KvIndex, at8, index_fields(&mut a));
        batch.delete(Table::Kv, at5.clone());
        batch.delete(Table::KvIndex, at5);
        for meta in [
            META_CURRENT_REV,
            META_SCHEDULED_COMPACT_REV,
            META_FINISHED_COMPACT_REV,
        ] {
            batch.put(Table::Meta, meta.to_vec(), 8i64.to_be_bytes().to_vec());
        }
        engine.write(batch, true).expect("write");
        assert!(!history_is_valid(engine.as_ref()).expect("read"));

        let store = MvccStore::open(engine.clone()).expect("open refilling");
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history, expected);
        assert!(
            history.iter().all(|(k, _)| *k != old),
            "a@5's entry is gone"
        );
        assert_eq!(history.len(), 2, "a@8 and a\\0@2");
        assert!(history_is_valid(engine.as_ref()).expect("read"));
        assert_eq!(store.current_revision(), 8);
    }

    /// More than a chunk of writes reaches the key history in sorted
    /// slices. A start after a kill in the middle of a chunk (nothing
    /// written at the stop) reads the revisions after the mark back from
    /// `kv_index`; a compaction scheduled while a chunk is being written
    /// writes everything collected first, so the compactor deletes the
    /// entries of what it drops and no later slice brings one back.
    #[tokio::test]
    async fn the_key_history_is_whole_after_a_kill_in_a_chunk_and_a_compaction() {
        let engine = Arc::new(MemoryEngine::new());
        let puts_per_commit = 100;
        let commit = |store: &MvccStore, round: usize| {
            let mut txn = store.write();
            for i in 0..puts_per_commit {
                let key = format!("key{:03}", (round * 37 + i * 11) % 500);
                txn.put(key.as_bytes(), vec![round as u8], 0, Prev::Unread)
                    .expect("put");
                txn.seal();
            }
            txn.commit(WriteBatch::new()).expect("commit");
        };
        // Commits until a chunk is cut, and a few slices of it written.
        let chunk_commits = key_history::HISTORY_CHUNK_ENTRIES / puts_per_commit + 1;
        let store = MvccStore::open(engine.clone()).expect("open");
        for round in 0..chunk_commits + 3 {
            commit(&store, round);
        }
        let (history, expected) = history_and_expected(&engine);
        assert!(history.len() > 3 * key_history::HISTORY_SLICE_ENTRIES);
        assert!(history.len() < expected.len(), "a chunk is being written");
        let hash = store.hash_kv(0).expect("hash");
        drop(store); // as a kill -9: nothing more written

        let store = MvccStore::open(engine.clone()).expect("reopen");
        assert!(store.is_loading(), "the history is trusted once read back");
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history, expected);
        assert_eq!(store.hash_kv(0).expect("hash"), hash);

        // Again to the middle of a chunk, then a compaction.
        for round in 0..chunk_commits + 3 {
            commit(&store, round);
        }
        let at = store.current_revision() - 50;
        let mut txn = store.write();
        let job = txn.compact(at).expect("compact");
        txn.commit(WriteBatch::new()).expect("commit");
        store.run_physical_compaction(job).await.expect("compact");
        for round in 0..chunk_commits {
            commit(&store, round);
        }
        store.write_collected_history().expect("write");
        assert!(history_is_valid(engine.as_ref()).expect("read"));
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history, expected, "nothing compacted came back");
    }

    /// A snapshot whose key history is not valid (a build without it sent
    /// it) gets it refilled by its install, which then rebuilds the index
    /// instead of loading it from the history; later writes keep it valid,
    /// so the next start loads from it.
    #[test]
    fn a_snapshot_without_a_valid_key_history_is_refilled_by_its_install() {
        let engine = Arc::new(MemoryEngine::new());
        let store = MvccStore::open(engine.clone()).expect("open");
        let put = |store: &MvccStore, key: &[u8]| {
            let mut txn = store.write();
            txn.put(key, b"v".to_vec(), 0, Prev::Unread).expect("put");
            txn.commit(WriteBatch::new()).expect("commit");
        };
        put(&store, b"a");
        put(&store, b"b");
        let mut old = WriteBatch::new();
        let (start, end) = (key_history::HISTORY_PREFIX, key_history::HISTORY_END);
        old.delete_range(Table::Meta, start.to_vec(), end.to_vec());
        old.delete(Table::Meta, key_history::META_HISTORY_REV.to_vec());
        engine.write(old, true).expect("write");
        store.reload().expect("install");
        assert!(!store.is_loading(), "rebuilt, not loaded from the history");
        assert!(history_is_valid(engine.as_ref()).expect("read"));
        put(&store, b"c");
        assert_eq!(
            history_at_start(engine.as_ref()).expect("read"),
            HistoryAtStart::Behind(3),
            "c's entry is collected, not written; the mark moved on"
        );
        drop(store);
        let loading = MvccStore::open(engine.clone()).expect("reopen");
        assert!(history_is_valid(engine.as_ref()).expect("read"));
        let (history, expected) = history_and_expected(&engine);
        assert_eq!(history, expected, "c's entry read back from kv_index");
        assert_eq!(history.len(), 3);
        assert!(loading.is_loading());
        for key in [b"a", b"b", b"c"] {
            assert_eq!(loading.get(key), Some((b"v".to_vec(), 0)));
        }
        assert_eq!(loading.live_keys(), 3);
    }

    /// `kv_index` holds each `kv` revision's pair without its value through
    /// puts, deletes and a physical compaction; a directory without it (as
    /// an earlier release left one) gets it filled by the next open, which
    /// then rebuilds from it alone and answers as before at every revision.
    #[tokio::test]
    async fn the_index_fields_follow_kv_and_are_filled_once() {
        let engine = Arc::new(MemoryEngine::new());
        let store = MvccStore::open(engine.clone()).expect("open");
        let mut txn = store.write();
        for (key, lease) in [("a", 1), ("b", 0), ("c", 3), ("a", 0), ("b", 2), ("c", 0)] {
            txn.put(
                key.as_bytes(),
                format!("value of {key}").into_bytes(),
                lease,
                Prev::Unread,
            )
            .expect("put");
            txn.seal();
        }
        txn.delete_range(&KeyRange::Single(b"c".to_vec()), false)
            .expect("delete");
        txn.commit(WriteBatch::new()).expect("commit");
        let mut txn = store.write();
        let job = txn.compact(6).expect("compact");
        txn.commit(WriteBatch::new()).expect("commit");
        store
            .run_physical_compaction(job)
            .await
            .expect("physical compaction");
        let mut txn = store.write();
        txn.put(b"d", b"last".to_vec(), 0, Prev::Unread)
            .expect("put");
        txn.commit(WriteBatch::new()).expect("commit");

        let expected_fields = |kv: &[(Vec<u8>, Vec<u8>)]| -> Pairs {
            kv.iter()
                .map(|(k, v)| (k.clone(), index_fields(&mut decode_kv(v).expect("decode"))))
                .collect()
        };
        let (kv, fields) = kv_and_index_fields(&engine);
        assert_eq!(kv.len(), 6, "two revisions compacted away: {kv:?}");
        assert_eq!(fields, expected_fields(&kv));
        assert!(fields
            .iter()
            .all(|(_, v)| decode_kv(v).expect("decode").value.is_empty()));

        let mut old_layout = WriteBatch::new();
        old_layout.delete_range(Table::KvIndex, Vec::new(), vec![0xff; 20]);
        old_layout.delete(Table::Meta, META_KV_INDEX_COMPLETE.to_vec());
        engine.write(old_layout, true).expect("write");
        assert!(kv_and_index_fields(&engine).1.is_empty());
        MvccStore::open(engine.clone()).expect("open filling kv_index");
        assert_eq!(kv_and_index_fields(&engine), (kv.clone(), fields));
        assert!(read_opt_i64(engine.as_ref(), META_KV_INDEX_COMPLETE)
            .expect("read")
            .is_some());

        // Rebuilt from the index fields alone: the values are not read.
        let mut fields_only = WriteBatch::new();
        for (k, _) in &kv {
            fields_only.put(Table::Kv, k.clone(), b"not a KeyValue".to_vec());
        }
        let check = Arc::new(MemoryEngine::new());
        check
            .write(
                {
                    let mut b = WriteBatch::new();
                    for t in Table::STATE_MACHINE {
                        for (k, v) in crate::engine::scan_collect(engine.as_ref(), t, b"", None, 0)
                            .expect("scan")
                        {
                            b.put(t, k, v);
                        }
                    }
                    b.extend(fields_only);
                    b
                },
                true,
            )
            .expect("copy");
        // Loaded from the key history, which holds the same fields.
        let loaded = MvccStore::open(check.clone()).expect("reopen from the key history");
        assert!(loaded.is_loading());
        loaded.load_all().expect("load");
        let mut no_history = WriteBatch::new();
        no_history.delete(Table::Meta, key_history::META_HISTORY_REV.to_vec());
        check.write(no_history, true).expect("write");
        let reopened = MvccStore::open(check).expect("reopen from the index fields");
        assert!(!reopened.is_loading());
        let all = KeyRange::new(b"\0", b"\0");
        for rev in 6..=store.current_revision() {
            let visible = |s: &MvccStore| s.read_state().index.range(&all, rev, 0);
            assert_eq!(visible(&reopened), visible(&store), "at {rev}");
            assert_eq!(visible(&loaded), visible(&store), "at {rev}");
        }
        assert_eq!(reopened.current_revision(), store.current_revision());
        assert_eq!(loaded.current_revision(), store.current_revision());
    }
}

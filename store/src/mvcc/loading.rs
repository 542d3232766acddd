//! The key index loaded from the key history while the member serves.
//!
//! A start whose key history is valid ([`super::key_history`]) does not
//! read every key before serving: the index starts empty and *partly
//! loaded*, and fills in three ways, all under the store's write lock:
//!
//! - a request for one key loads that key first (one short scan of its
//!   entries), so a restarted member answers a Get or a Put at once;
//! - a Range waits at the service edge until the thread below has passed
//!   its keys ([`super::MvccStore::loaded_for`]), so that a large read
//!   does not hold writes up while it loads; a range read that cannot wait
//!   (inside a write transaction, or with no thread running) loads the
//!   keys it lacks itself;
//! - a thread loads the keys in order, [`crate::limits::LOAD_STEP_KEYS`]
//!   at a time, releasing the lock between steps, until every key is in.
//!
//! The invariant that makes this safe: **a key in the index has its whole
//! history.** Loading adds only keys the index lacks, from entries read
//! under the write lock, and every write takes that lock and loads its key
//! before changing it, so the engine's entries of a key missing from the
//! index are that key's whole history. A loaded key is never loaded
//! again. Which ranges are loaded is tracked by one bound, `below`: every
//! key before it is in the index (loading in key order moves it; a
//! request's range that starts at or before it moves it to the range's
//! end).
//!
//! Worked example, keys `a`, `b`, `c` stored: Get(`b`) loads `b`; Put(`b`)
//! finds it loaded; the thread's first step (two keys at a time) loads `a`,
//! skips `b` and sets `below` to `c`; a Range [`a`, `b`) is then served as
//! it is, a Range from `b` loads `c` and completes the index.
//!
//! Work that needs every key (compaction, HashKV, a lease's revocation,
//! which deletes the keys attached to it) first completes the load. The
//! live key count is the index's plus the live keys not loaded yet: the
//! count stored at the last commit, less each live key loaded since. The
//! lessor learns which keys hold a lease when the load completes: each
//! loaded key whose newest revision is a put with a lease, and whose newest
//! revision is still that put then.

use std::ops::ControlFlow;

use super::index::{KeyRange, TreeIndex};
use super::key_history::{self, Change};
use super::key_index::KeyIndex;
use super::revision::Revision;
use crate::engine::{try_scan, EngineError, EngineRead, Table};

/// Live keys with a lease: (key, lease).
pub type LeasedKeys = Vec<(Vec<u8>, i64)>;

/// How much of the key index is loaded.
#[derive(Debug)]
pub enum Loaded {
    /// Every key.
    All,
    /// Some keys (see the module docs).
    Partly(Partial),
}

/// A partly loaded index's progress.
#[derive(Debug, Default)]
pub struct Partial {
    /// Every key before this one is loaded (empty: none is known to be).
    below: Vec<u8>,
    /// Live keys not loaded yet: the stored count at the start, less each
    /// live key loaded since (writes load their key first, so they change
    /// only the index's own count).
    unloaded_live: usize,
    /// Loaded keys whose newest revision is a put with a lease:
    /// (key, lease, revision).
    leased: Vec<(Vec<u8>, i64, Revision)>,
}

impl Loaded {
    /// A partly loaded index whose store held `live` live keys.
    pub fn partly(live: usize) -> Self {
        Loaded::Partly(Partial {
            unloaded_live: live,
            ..Partial::default()
        })
    }

    /// Live keys not in `index` yet (none once every key is loaded).
    pub fn unloaded_live(&self) -> usize {
        match self {
            Loaded::All => 0,
            Loaded::Partly(p) => p.unloaded_live,
        }
    }

    /// True if every key of `range` is in `index`.
    pub fn covers(&self, index: &TreeIndex, range: &KeyRange) -> bool {
        let Loaded::Partly(p) = self else {
            return true;
        };
        match range {
            KeyRange::Single(k) => index.contains(k) || *k < p.below,
            KeyRange::From(_) => false,
            KeyRange::Between(s, e) => s >= e || *e <= p.below,
        }
    }

    /// True once every key is loaded.
    pub fn is_all(&self) -> bool {
        matches!(self, Loaded::All)
    }

    /// Loads every key of `range` that `index` lacks (nothing, without a
    /// read, if it [`Loaded::covers`] the range already); returns the
    /// leased keys (key, lease) if that completed the index
    /// ([`Loaded::finish`]).
    pub fn load_range(
        &mut self,
        engine: &dyn EngineRead,
        index: &mut TreeIndex,
        range: &KeyRange,
    ) -> Result<Option<LeasedKeys>, EngineError> {
        if self.covers(index, range) {
            return Ok(None);
        }
        let Loaded::Partly(p) = self else {
            return Ok(None);
        };
        let Some((start, end)) = key_history::bounds(range) else {
            return Ok(None);
        };
        load_keys(engine, index, &start, &end, usize::MAX, p)?;
        let contiguous = match range {
            KeyRange::Single(_) => false,
            KeyRange::From(s) | KeyRange::Between(s, _) => *s <= p.below,
        };
        match range {
            KeyRange::From(_) if contiguous => return Ok(Some(self.finish(index))),
            KeyRange::Between(_, e) if contiguous && *e > p.below => p.below = e.clone(),
            _ => {}
        }
        Ok(None)
    }

    /// One step of the loading thread: up to `max_keys` keys from `below`
    /// on. Returns the leased keys if that completed the index.
    pub fn load_step(
        &mut self,
        engine: &dyn EngineRead,
        index: &mut TreeIndex,
        max_keys: usize,
    ) -> Result<Option<LeasedKeys>, EngineError> {
        let Loaded::Partly(p) = self else {
            return Ok(None);
        };
        let start = key_history::key_start(&p.below);
        match load_keys(engine, index, &start, key_history::HISTORY_END, max_keys, p)? {
            Some(next) => {
                p.below = next;
                Ok(None)
            }
            None => Ok(Some(self.finish(index))),
        }
    }

    /// Loads every key left; returns the leased keys if the index was not
    /// complete before.
    pub fn load_all(
        &mut self,
        engine: &dyn EngineRead,
        index: &mut TreeIndex,
    ) -> Result<Option<LeasedKeys>, EngineError> {
        let below = match self {
            Loaded::All => return Ok(None),
            Loaded::Partly(p) => p.below.clone(),
        };
        self.load_range(engine, index, &KeyRange::From(below))
    }

    /// Marks the index complete; returns the leased keys still attached:
    /// those whose recorded put is still their key's newest revision.
    fn finish(&mut self, index: &TreeIndex) -> LeasedKeys {
        let Loaded::Partly(p) = std::mem::replace(self, Loaded::All) else {
            return Vec::new();
        };
        if p.unloaded_live != 0 {
            tracing::warn!(
                unloaded = p.unloaded_live,
                "the stored live key count exceeded the live keys loaded"
            );
        }
        still_leased(index, p.leased)
    }
}

/// Of the puts with a lease found while reading stored revisions (key,
/// lease, revision), the live leased keys: those whose put is still their
/// key's newest revision in `index`.
pub fn still_leased(index: &TreeIndex, puts: Vec<(Vec<u8>, i64, Revision)>) -> LeasedKeys {
    puts.into_iter()
        .filter(|(key, _, rev)| {
            index
                .get(key, i64::MAX)
                .is_some_and(|now| now.modified == *rev)
        })
        .map(|(key, lease, _)| (key, lease))
        .collect()
}

/// Loads into `index` the keys whose entries lie in `[start, end)` of the
/// `meta` table and that it lacks, stopping before the key past `max_keys`
/// keys: returns that key, or None if the scan reached `end`. Records the
/// loaded keys' leases and liveness in `progress`.
fn load_keys(
    engine: &dyn EngineRead,
    index: &mut TreeIndex,
    start: &[u8],
    end: &[u8],
    max_keys: usize,
    progress: &mut Partial,
) -> Result<Option<Vec<u8>>, EngineError> {
    let Partial {
        leased,
        unloaded_live,
        ..
    } = progress;
    let mut current: Option<(Vec<u8>, KeyIndex, i64)> = None;
    let mut keys = 0;
    let mut stopped_at = None;
    let mut finish = |index: &mut TreeIndex, (key, history, lease): (Vec<u8>, KeyIndex, i64)| {
        let newest = history.modified;
        let live = history.is_live();
        if index.insert_loaded(&key, history) && live {
            *unloaded_live = unloaded_live.saturating_sub(1);
            if lease != 0 {
                leased.push((key, lease, newest));
            }
        }
    };
    try_scan(engine, Table::Meta, start, Some(end), &mut |k, v| {
        let entry = key_history::decode(k, v)
            .ok_or_else(|| EngineError::corrupt(format!("bad key history entry {k:?}")))?;
        if current.as_ref().is_none_or(|(key, ..)| *key != entry.key) {
            if let Some(done) = current.take() {
                finish(index, done);
            }
            if keys == max_keys {
                stopped_at = Some(entry.key);
                return Ok(ControlFlow::Break(()));
            }
            keys += 1;
            current = Some((entry.key.clone(), KeyIndex::default(), 0));
        }
        let (_, history, lease) = current.as_mut().expect("set above");
        match entry.change {
            Change::Put {
                create_revision,
                version,
                lease: l,
            } => {
                let created = Revision::new(create_revision, 0);
                history.replay_stored(false, created, entry.rev, version);
                *lease = l;
            }
            Change::Tombstone => {
                history.replay_stored(true, Revision::default(), entry.rev, 0);
                *lease = 0;
            }
        }
        Ok::<_, EngineError>(ControlFlow::Continue(()))
    })?;
    if let Some(done) = current.take() {
        finish(index, done);
    }
    Ok(stopped_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::engine::{Engine, WriteBatch};

    /// An engine whose key history holds one put of each key, at
    /// revisions 2, 3, ... in order, `b` with lease 7.
    fn stored(keys: &[&str]) -> MemoryEngine {
        let engine = MemoryEngine::new();
        let mut batch = WriteBatch::new();
        for (i, key) in keys.iter().enumerate() {
            let main = i as i64 + 2;
            let lease = if *key == "b" { 7 } else { 0 };
            let change = Change::Put {
                create_revision: main,
                version: 1,
                lease,
            };
            let (entry, value) =
                key_history::encode(key.as_bytes(), Revision::new(main, 0), change);
            batch.put(Table::Meta, entry, value);
        }
        engine.write(batch, true).expect("write");
        engine
    }

    fn single(key: &str) -> KeyRange {
        KeyRange::Single(key.as_bytes().to_vec())
    }

    fn between(start: &str, end: &str) -> KeyRange {
        KeyRange::Between(start.as_bytes().to_vec(), end.as_bytes().to_vec())
    }

    /// The module docs' worked example.
    #[test]
    fn the_worked_example() {
        let engine = stored(&["a", "b", "c"]);
        let mut index = TreeIndex::default();
        let mut loaded = Loaded::partly(3);
        assert!(!loaded.covers(&index, &single("b")));
        assert_eq!(
            loaded
                .load_range(&engine, &mut index, &single("b"))
                .unwrap(),
            None
        );
        assert!(loaded.covers(&index, &single("b")) && !loaded.covers(&index, &single("a")));
        assert_eq!(
            index.get(b"b", i64::MAX).map(|at| at.modified.main),
            Some(3)
        );

        assert_eq!(loaded.unloaded_live(), 2, "a and c");
        assert_eq!(loaded.load_step(&engine, &mut index, 2).unwrap(), None);
        assert_eq!(loaded.unloaded_live(), 1, "c");
        assert!(loaded.covers(&index, &between("a", "c")));
        assert!(!loaded.covers(&index, &between("a", "d")));
        assert!(!loaded.covers(&index, &KeyRange::From(b"b".to_vec())));
        assert_eq!(index.len(), 2);

        let leased = loaded.load_range(&engine, &mut index, &KeyRange::From(b"b".to_vec()));
        assert_eq!(leased.unwrap(), Some(vec![(b"b".to_vec(), 7)]));
        assert!(loaded.is_all());
        assert_eq!(index.len(), 3);
        assert_eq!(index.live_len(), 3);
    }

    /// A range that starts past `below` loads its keys but moves nothing;
    /// one that starts at or before it moves it to its end; a key loaded
    /// is never loaded again (its newer history stays).
    #[test]
    fn ranges_move_the_bound_only_from_it() {
        let engine = stored(&["a", "b", "c", "d"]);
        let mut index = TreeIndex::default();
        let mut loaded = Loaded::partly(4);
        loaded
            .load_range(&engine, &mut index, &between("c", "d"))
            .unwrap();
        assert!(loaded.covers(&index, &single("c")));
        assert!(!loaded.covers(&index, &between("a", "b")));
        index.put(b"c", Revision::new(9, 0));
        loaded
            .load_range(&engine, &mut index, &between("", "c"))
            .unwrap();
        assert!(loaded.covers(&index, &between("a", "c")));
        assert!(!loaded.covers(&index, &between("a", "e")));
        assert_eq!(loaded.load_step(&engine, &mut index, 1).unwrap(), None);
        assert_eq!(
            index.get(b"c", i64::MAX).map(|at| at.modified.main),
            Some(9)
        );
        assert!(loaded.load_step(&engine, &mut index, 1).unwrap().is_some());
        assert_eq!(index.len(), 4);
    }

    /// A deleted key's history loads with its tombstone; a key whose puts
    /// were all compacted away (a tombstone alone) loads as nothing.
    #[test]
    fn tombstones_end_generations() {
        let engine = MemoryEngine::new();
        let mut batch = WriteBatch::new();
        let a = Change::Put {
            create_revision: 2,
            version: 1,
            lease: 5,
        };
        let entries = [
            (&b"a"[..], 2, a),
            (b"a", 3, Change::Tombstone),
            (b"gone", 4, Change::Tombstone),
        ];
        for (key, main, change) in entries {
            let (entry, value) = key_history::encode(key, Revision::new(main, 0), change);
            batch.put(Table::Meta, entry, value);
        }
        engine.write(batch, true).expect("write");
        let mut index = TreeIndex::default();
        let mut loaded = Loaded::partly(0);
        let leased = loaded.load_all(&engine, &mut index).unwrap();
        assert_eq!(leased, Some(Vec::new()), "a's lease went with it");
        assert_eq!(index.len(), 1);
        assert_eq!(index.live_len(), 0);
        assert!(index.get(b"a", 2).is_some() && index.get(b"a", 3).is_none());
    }
}

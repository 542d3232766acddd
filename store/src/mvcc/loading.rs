//! The key index loaded from the key history while the member serves.
//!
//! A start whose key history is valid ([`super::key_history`]) does not
//! read every key before serving: the index starts empty and *partly
//! loaded*, and fills in three ways, all under the store's write lock:
//!
//! - a request for one key loads that key first (one short scan of its
//!   entries), so a restarted member answers a Get or a Put at once;
//! - a request for a range loads the range's keys it lacks (a range as
//!   large as the key space reads all of it, as the start used to);
//! - a thread loads the keys in order, [`crate::limits::LOAD_STEP_KEYS`] at a time,
//!   releasing the lock between steps, until every key is in.
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
    /// Loaded keys whose newest revision is a put with a lease:
    /// (key, lease, revision).
    leased: Vec<(Vec<u8>, i64, Revision)>,
}

impl Loaded {
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

    /// Loads every key of `range` that `index` lacks; returns the leased
    /// keys (key, lease) if that completed the index ([`Loaded::finish`]).
    pub fn load_range(
        &mut self,
        engine: &dyn EngineRead,
        index: &mut TreeIndex,
        range: &KeyRange,
    ) -> Result<Option<LeasedKeys>, EngineError> {
        let Loaded::Partly(p) = self else {
            return Ok(None);
        };
        let Some((start, end)) = key_history::bounds(range) else {
            return Ok(None);
        };
        load_keys(engine, index, &start, &end, usize::MAX, &mut p.leased)?;
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
        match load_keys(
            engine,
            index,
            &start,
            key_history::HISTORY_END,
            max_keys,
            &mut p.leased,
        )? {
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
        p.leased
            .into_iter()
            .filter(|(key, _, rev)| {
                index
                    .get(key, i64::MAX)
                    .is_some_and(|now| now.modified == *rev)
            })
            .map(|(key, lease, _)| (key, lease))
            .collect()
    }
}

/// Loads into `index` the keys whose entries lie in `[start, end)` of the
/// `meta` table and that it lacks, stopping before the key past `max_keys`
/// keys: returns that key, or None if the scan reached `end`.
fn load_keys(
    engine: &dyn EngineRead,
    index: &mut TreeIndex,
    start: &[u8],
    end: &[u8],
    max_keys: usize,
    leased: &mut Vec<(Vec<u8>, i64, Revision)>,
) -> Result<Option<Vec<u8>>, EngineError> {
    let mut current: Option<(Vec<u8>, KeyIndex, i64)> = None;
    let mut keys = 0;
    let mut stopped_at = None;
    let mut finish = |index: &mut TreeIndex, (key, history, lease): (Vec<u8>, KeyIndex, i64)| {
        let newest = history.modified;
        let live = history.is_live();
        if index.insert_loaded(&key, history) && live && lease != 0 {
            leased.push((key, lease, newest));
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

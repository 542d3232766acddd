//! The per-key history index, as etcd's `keyIndex`.
//!
//! A key's history is a list of *generations*. A generation starts with the
//! put that creates the key and ends with its deletion (a tombstone); the
//! last generation is the live one and is empty when the key is deleted.
//!
//! Worked example: put(k)@1.0, put(k)@2.0, delete(k)@3.0, put(k)@4.0,
//! put(k)@5.0 gives
//!
//! ```text
//! generations: {created 1.0, version 3, revs [1.0 2.0 3.0(t)]}
//!              {created 4.0, version 2, revs [4.0 5.0]}
//! ```
//!
//! `get(2)` finds the first generation and returns 2.0 (version 2);
//! `get(3)` returns nothing (deleted at 3); `get(4)` returns 4.0 (version 1).
//!
//! Compaction at revision `at` keeps, in the generation that is live at `at`,
//! the largest revision `<= at` (it is still visible) and drops everything
//! older; whole generations that ended at or before `at` disappear, and a
//! generation left holding only its tombstone is dropped too. Compacting the
//! example at 4 leaves `{created 4.0, version 2, revs [4.0 5.0]}`; the
//! revisions kept are reported so the physical deletion spares them.

use std::collections::HashSet;

use smallvec::{smallvec, SmallVec};

use super::revision::Revision;

/// A generation's revisions: one inline (a key written once in a
/// generation, most keys between compactions), more on the heap.
pub type Revisions = SmallVec<[Revision; 1]>;

/// A key's generations: one inline (a key never deleted), more on the heap.
pub type Generations = SmallVec<[Generation; 1]>;

/// One life of a key: from creation to deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Generation {
    /// Revision of the put that created the key in this generation.
    pub created: Revision,
    /// Number of puts in this generation (the key's `version` after the last).
    pub version: i64,
    /// Revisions of every change, oldest first; a tombstone ends a closed
    /// generation.
    pub revs: Revisions,
}

impl Generation {
    fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// Index of the newest revision with `main <= at`, if any.
    fn newest_at_or_before(&self, at: i64) -> Option<usize> {
        self.revs.iter().rposition(|r| r.main <= at)
    }
}

/// What a key looked like at some revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAt {
    /// Revision of the change that produced the value visible then.
    pub modified: Revision,
    /// Creation revision of that generation.
    pub created: Revision,
    /// The key's version at that point.
    pub version: i64,
}

/// The full history of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyIndex {
    /// The latest change.
    pub modified: Revision,
    /// Oldest first; the last is the live one (empty if deleted).
    pub generations: Generations,
}

impl KeyIndex {
    /// Records a put at `rev`.
    pub fn put(&mut self, rev: Revision) {
        assert!(
            rev > self.modified || self.generations.is_empty(),
            "put {rev:?} not after {:?}",
            self.modified
        );
        if self.generations.is_empty() {
            self.generations.push(Generation::default());
        }
        let g = self.generations.last_mut().expect("just ensured");
        if g.is_empty() {
            g.created = rev;
        }
        g.revs.push(rev);
        g.version += 1;
        self.modified = rev;
    }

    /// Rebuilds a live generation from a stored value (restart path), where
    /// older revisions may already be compacted away.
    pub fn restore(&mut self, created: Revision, modified: Revision, version: i64) {
        self.generations.push(Generation {
            created,
            version,
            revs: smallvec![modified],
        });
        self.modified = modified;
    }

    /// Replays one stored revision, oldest first (a rebuild, a load): a
    /// put continues the live generation or starts one at `created` (whose
    /// older revisions may be compacted away); a tombstone ends it, and
    /// one of a key not live then (its puts compacted away) changes
    /// nothing.
    pub fn replay_stored(
        &mut self,
        tombstone: bool,
        created: Revision,
        modified: Revision,
        version: i64,
    ) {
        if tombstone {
            self.tombstone(modified);
        } else if self.is_live() {
            self.put(modified);
        } else {
            if self.generations.last().is_some_and(|g| g.revs.is_empty()) {
                self.generations.pop();
            }
            self.restore(created, modified, version);
        }
    }

    /// Records a deletion at `rev`. Returns false (and changes nothing) if
    /// the key is not live.
    pub fn tombstone(&mut self, rev: Revision) -> bool {
        if !self.is_live() {
            return false;
        }
        self.put(rev);
        self.generations.push(Generation::default());
        true
    }

    /// True if the key currently exists.
    pub fn is_live(&self) -> bool {
        self.generations.last().is_some_and(|g| !g.is_empty())
    }

    /// True if nothing is left of the key.
    pub fn is_empty(&self) -> bool {
        self.generations.iter().all(Generation::is_empty)
    }

    /// The generation in which the key was live at main revision `at`.
    fn generation_at(&self, at: i64) -> Option<&Generation> {
        let last = self.generations.len().checked_sub(1)?;
        for (i, g) in self.generations.iter().enumerate().rev() {
            if g.is_empty() {
                continue;
            }
            if i != last {
                let tomb = g.revs.last().expect("non-empty").main;
                if tomb <= at {
                    return None;
                }
            }
            if g.revs[0].main <= at {
                return Some(g);
            }
        }
        None
    }

    /// The key as of main revision `at`, or None if it did not exist then.
    pub fn get(&self, at: i64) -> Option<KeyAt> {
        let g = self.generation_at(at)?;
        let n = g.newest_at_or_before(at)?;
        let version = g.version - (g.revs.len() - n - 1) as i64;
        Some(KeyAt {
            modified: g.revs[n],
            created: g.created,
            version,
        })
    }

    /// Revisions of changes with `main > after` (watch catch-up), oldest first.
    pub fn since(&self, after: i64) -> Vec<Revision> {
        self.generations
            .iter()
            .flat_map(|g| g.revs.iter().copied())
            .filter(|r| r.main > after)
            .collect()
    }

    /// Compacts history at main revision `at`; adds the revisions that must
    /// stay on disk to `keep`. Returns true if the key is now empty and
    /// should be removed from the index.
    pub fn compact(&mut self, at: i64, keep: &mut HashSet<Revision>) -> bool {
        assert!(
            !self.generations.is_empty(),
            "compacting an empty key index"
        );
        let mut gen_idx = 0;
        while gen_idx < self.generations.len() - 1 {
            let tomb = self.generations[gen_idx]
                .revs
                .last()
                .expect("closed generations are non-empty")
                .main;
            if tomb > at {
                break;
            }
            gen_idx += 1;
        }
        let last = self.generations.len() - 1;
        let g = &mut self.generations[gen_idx];
        if !g.is_empty() {
            if let Some(n) = g.newest_at_or_before(at) {
                g.revs.drain(..n);
                keep.insert(g.revs[0]);
            }
            if g.revs.len() == 1 && gen_idx != last && g.revs[0].main <= at {
                // Only the tombstone is left: the key was deleted at or before
                // `at`, so nothing of this generation stays visible.
                keep.remove(&g.revs[0]);
                gen_idx += 1;
            }
        }
        self.generations.drain(..gen_idx);
        self.is_empty()
    }

    /// [`Self::compact`], adding to `dropped` every revision `<= at` it
    /// removes (each with whether it is a tombstone, as its stored key
    /// says): what the physical compaction deletes from the engine.
    ///
    /// In the module's example, compacting at 4 drops `1.0`, `2.0` and the
    /// tombstone `3.0(t)`; `4.0` stays, kept.
    pub fn compact_dropping(&mut self, at: i64, dropped: &mut Vec<(Revision, bool)>) -> bool {
        let last = self.generations.len().saturating_sub(1);
        let before: Vec<(Revision, bool)> = self
            .generations
            .iter()
            .enumerate()
            .flat_map(|(i, g)| {
                let tomb = (i != last).then(|| g.revs.last().copied()).flatten();
                g.revs.iter().map(move |r| (*r, Some(*r) == tomb))
            })
            .filter(|(r, _)| r.main <= at)
            .collect();
        let mut keep = HashSet::new();
        let empty = self.compact(at, &mut keep);
        dropped.extend(before.into_iter().filter(|(r, _)| !keep.contains(r)));
        empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// The module doc's example.
    fn example() -> KeyIndex {
        let mut ki = KeyIndex::default();
        ki.put(r(1));
        ki.put(r(2));
        assert!(ki.tombstone(r(3)));
        ki.put(r(4));
        ki.put(r(5));
        ki
    }

    #[test]
    fn get_walks_generations() {
        let ki = example();
        assert_eq!(ki.get(0), None);
        assert_eq!(
            ki.get(1),
            Some(KeyAt {
                modified: r(1),
                created: r(1),
                version: 1
            })
        );
        assert_eq!(
            ki.get(2),
            Some(KeyAt {
                modified: r(2),
                created: r(1),
                version: 2
            })
        );
        assert_eq!(ki.get(3), None, "deleted at 3");
        assert_eq!(
            ki.get(4),
            Some(KeyAt {
                modified: r(4),
                created: r(4),
                version: 1
            })
        );
        assert_eq!(
            ki.get(99),
            Some(KeyAt {
                modified: r(5),
                created: r(4),
                version: 2
            })
        );
    }

    #[test]
    fn tombstone_of_deleted_key_is_refused() {
        let mut ki = example();
        assert!(ki.tombstone(r(6)));
        assert!(!ki.tombstone(r(7)));
        assert_eq!(ki.get(7), None);
    }

    #[test]
    fn compaction_keeps_visible_revisions() {
        let mut ki = example();
        let mut keep = HashSet::new();
        assert!(!ki.compact(2, &mut keep));
        assert_eq!(keep, HashSet::from([r(2)]));
        assert_eq!(ki.get(2).map(|k| k.modified), Some(r(2)));
        assert_eq!(ki.get(2).map(|k| k.version), Some(2));

        let mut keep = HashSet::new();
        assert!(!ki.compact(3, &mut keep));
        assert!(
            keep.is_empty(),
            "a lone tombstone at the compaction point is not kept"
        );
        assert_eq!(ki.generations.len(), 1);
        assert_eq!(ki.get(4).map(|k| k.modified), Some(r(4)));

        let mut keep = HashSet::new();
        assert!(!ki.compact(4, &mut keep));
        assert_eq!(keep, HashSet::from([r(4)]));
        assert_eq!(ki.get(5).map(|k| k.version), Some(2));
    }

    #[test]
    fn compacting_a_deleted_key_empties_it() {
        let mut ki = KeyIndex::default();
        ki.put(r(1));
        assert!(ki.tombstone(r(2)));
        let mut keep = HashSet::new();
        assert!(ki.compact(5, &mut keep));
        assert!(keep.is_empty());
    }

    #[test]
    fn compaction_before_deletion_keeps_the_value() {
        let mut ki = KeyIndex::default();
        ki.put(r(1));
        assert!(ki.tombstone(r(4)));
        let mut keep = HashSet::new();
        assert!(!ki.compact(2, &mut keep));
        assert_eq!(keep, HashSet::from([r(1)]));
        assert_eq!(ki.get(2).map(|k| k.modified), Some(r(1)));
        assert_eq!(ki.get(4), None);
    }

    #[test]
    fn compaction_names_what_it_drops_with_the_tombstones() {
        let mut ki = example();
        let mut dropped = Vec::new();
        assert!(!ki.compact_dropping(4, &mut dropped));
        assert_eq!(dropped, vec![(r(1), false), (r(2), false), (r(3), true)]);
        dropped.clear();
        assert!(!ki.compact_dropping(4, &mut dropped), "again: nothing left");
        assert!(dropped.is_empty());

        let mut gone = KeyIndex::default();
        gone.put(r(1));
        assert!(gone.tombstone(r(2)));
        assert!(gone.compact_dropping(2, &mut dropped));
        assert_eq!(dropped, vec![(r(1), false), (r(2), true)]);
    }

    #[test]
    fn since_lists_later_changes() {
        assert_eq!(example().since(2), vec![r(3), r(4), r(5)]);
    }
}

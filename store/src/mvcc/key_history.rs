//! The key history: every stored revision's index fields, ordered by key.
//!
//! The `kv` and `kv_index` tables are ordered by revision (etcd's layout),
//! so the only way to learn one key's history from them is to read them
//! whole, which is what rebuilding the in-memory index at start-up did: at
//! eight million keys, six seconds before a restarted member could serve.
//! The key history holds the same fields under keys that sort by user key
//! first, so one key's history is one short scan, and the index can be
//! loaded key by key while the member already serves
//! ([`super::store::MvccStore`]).
//!
//! Layout, in the `meta` table (builds before the key history open exactly
//! the tables they know and read `kv_index` whole, so a new table or new
//! keys in `kv_index` would stop them from opening a directory this build
//! wrote; in `meta` they are keys those builds never read):
//!
//! ```text
//! key:   "mvcc/keyHistory/" ++ escaped(user key) ++ 00 01 ++ revision key
//! value: create_revision, version, lease (3 x 8 bytes, big-endian);
//!        empty for a tombstone (whose revision key ends in 't')
//! ```
//!
//! `escaped` writes each `00` byte of the user key as `00 ff`, and `00 01`
//! ends it, so entries sort by user key, then by revision, and no key's
//! entries fall between another's: `a` (`61 00 01 ...`) sorts before `a\0`
//! (`61 00 ff 00 01 ...`), which sorts before `b` (`62 00 01 ...`).
//!
//! Worked example: put(`a`)@2, put(`b`)@3, delete(`a`)@4 store
//!
//! ```text
//! mvcc/keyHistory/ 61 00 01 <2_0>  -> 2, 1, 0
//! mvcc/keyHistory/ 61 00 01 <4_0>t -> (empty)
//! mvcc/keyHistory/ 62 00 01 <3_0>  -> 3, 1, 0
//! ```
//!
//! Entries are written in sorted chunks, not with each write
//! ([`Pending`]): write transactions collect them, and once
//! [`HISTORY_CHUNK_ENTRIES`] are collected they are sorted by entry key
//! and written [`HISTORY_SLICE_ENTRIES`] per commit, in that order (a
//! larger chunk, which one large transaction makes, in
//! [`HISTORY_SLICES_PER_CHUNK`] commits).
//! Written one by one, each entry went to a random place in the `meta`
//! memtable, a skip list of hundreds of thousands of small entries: about
//! 11% of a member's CPU under a put load, in cache misses. A sorted
//! chunk walks the skip list in order instead (a member's CPU per put
//! 0.85x).
//!
//! [`META_HISTORY_REV`] is the revision through which the history is
//! written: a chunk's last revision, written in the batch that completes
//! the chunk. Revisions after it (at most two chunks' worth, and one write
//! transaction's) are in `kv_index` only; a start reads them from there
//! and writes their entries before it loads anything
//! (`MvccStore::fold_history_tail`). Scheduling a compaction writes every collected entry
//! first, with the mark at the current revision, so the compactor, which
//! deletes entries with the `kv` revisions it drops, never deletes one
//! that is written after it. A build without the key history changes
//! `kv` without the entries: they are trusted only while
//! [`META_HISTORY_COMPACT_REV`] equals the finished compaction revision
//! and [`META_HISTORY_REV`] is at most the current one, and are refilled
//! from `kv_index` otherwise. (Builds that wrote every entry with its
//! write, and the mark with every commit, refill when the mark is behind;
//! after a graceful stop it is not: closing writes what was collected.)

use super::index::KeyRange;
use super::revision::{Revision, REVISION_KEY_BYTES};

/// Prefix of every key history entry in the `meta` table.
pub const HISTORY_PREFIX: &[u8] = b"mvcc/keyHistory/";

/// The first `meta` key past every entry ([`HISTORY_PREFIX`] with its
/// last byte, `/`, raised by one).
pub const HISTORY_END: &[u8] = b"mvcc/keyHistory0";

/// Meta key: the current revision when this build last changed `kv`
/// (written in the same batch as `mvcc/currentRev`).
pub const META_HISTORY_REV: &[u8] = b"mvcc/keyHistoryRev";

/// Meta key: the finished compaction revision when this build last
/// finished one (written in the same batch as
/// `mvcc/finishedCompactRev`).
pub const META_HISTORY_COMPACT_REV: &[u8] = b"mvcc/keyHistoryCompactRev";

/// Bytes of a put's entry value: create revision, version, lease.
const FIELDS_BYTES: usize = 24;

/// Collected entries at which they are sorted and written as a chunk
/// (about 1.6 MiB of entries of 32-byte keys): large enough that
/// consecutive entries of a chunk sit close in the memtable, small enough
/// that a start reads few revisions back from `kv_index`.
pub const HISTORY_CHUNK_ENTRIES: usize = 16_384;

/// Entries of a sorted chunk written per commit, so that no apply batch
/// carries a whole chunk (a put load's p99 rose with whole chunks).
pub const HISTORY_SLICE_ENTRIES: usize = 1_024;

/// Commits a chunk is written in at most: a chunk larger than
/// [`HISTORY_CHUNK_ENTRIES`] (one transaction deleted a large range) goes
/// out in slices of its size over this, so the entries held in memory and
/// the revisions a start reads back stay bounded by what such a
/// transaction wrote itself.
pub const HISTORY_SLICES_PER_CHUNK: usize = HISTORY_CHUNK_ENTRIES / HISTORY_SLICE_ENTRIES;

/// Entries a start writes per batch when it reads the revisions after the
/// history's mark back from `kv_index` (normally fewer than two chunks;
/// a kill -9 right after a DeleteRange of a million keys leaves more).
pub const TAIL_FOLD_ENTRIES: usize = 65_536;

/// The two bytes that end an escaped user key.
const KEY_END: [u8; 2] = [0x00, 0x01];

/// The two bytes an escaped `00` byte of a user key becomes.
const ESCAPED_ZERO: [u8; 2] = [0x00, 0xff];

/// One key history entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The user key.
    pub key: Vec<u8>,
    /// The revision.
    pub rev: Revision,
    /// What the revision stored.
    pub change: Change,
}

/// What one revision of a key stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A put, with the fields the index and the lessor need.
    Put {
        /// The key's create revision.
        create_revision: i64,
        /// The key's version after the put.
        version: i64,
        /// The lease the key was put with (0: none).
        lease: i64,
    },
    /// A deletion.
    Tombstone,
}

/// `HISTORY_PREFIX ++ escaped(key) ++ 00 01`: where `key`'s entries start.
pub fn key_start(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HISTORY_PREFIX.len() + key.len() + 2 + REVISION_KEY_BYTES + 1);
    out.extend_from_slice(HISTORY_PREFIX);
    for &b in key {
        if b == 0 {
            out.extend_from_slice(&ESCAPED_ZERO);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&KEY_END);
    out
}

/// The first `meta` key past `key`'s entries.
pub fn key_end(key: &[u8]) -> Vec<u8> {
    let mut out = key_start(key);
    *out.last_mut().expect("key_start ends with 00 01") += 1;
    out
}

/// The entry key of `key`'s revision `rev`.
pub fn entry_key(key: &[u8], rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut out = key_start(key);
    out.extend_from_slice(&rev.to_key(tombstone));
    out
}

/// The entry (key and value) of `key`'s revision `rev`: [`decode`]'s
/// inverse.
pub fn encode(key: &[u8], rev: Revision, change: Change) -> (Vec<u8>, Vec<u8>) {
    match change {
        Change::Put {
            create_revision,
            version,
            lease,
        } => {
            let mut value = Vec::with_capacity(FIELDS_BYTES);
            for n in [create_revision, version, lease] {
                value.extend_from_slice(&n.to_be_bytes());
            }
            (entry_key(key, rev, false), value)
        }
        Change::Tombstone => (entry_key(key, rev, true), Vec::new()),
    }
}

/// The `meta` keys `[start, end)` holding the entries of every key in
/// `range`; None for an empty range.
pub fn bounds(range: &KeyRange) -> Option<(Vec<u8>, Vec<u8>)> {
    match range {
        KeyRange::Single(k) => Some((key_start(k), key_end(k))),
        KeyRange::From(s) => Some((key_start(s), HISTORY_END.to_vec())),
        KeyRange::Between(s, e) if s < e => Some((key_start(s), key_start(e))),
        KeyRange::Between(..) => None,
    }
}

/// Decodes one entry; None if `key` and `value` are not one.
pub fn decode(key: &[u8], value: &[u8]) -> Option<Entry> {
    let mut rest = key.strip_prefix(HISTORY_PREFIX)?;
    let mut user_key = Vec::with_capacity(rest.len());
    loop {
        match rest {
            [0x00, 0x01, tail @ ..] => {
                rest = tail;
                break;
            }
            [0x00, 0xff, tail @ ..] => {
                user_key.push(0);
                rest = tail;
            }
            [0x00, ..] | [] => return None,
            [b, tail @ ..] => {
                user_key.push(*b);
                rest = tail;
            }
        }
    }
    let (rev, tombstone) = Revision::from_key(rest)?;
    let change = if tombstone {
        if !value.is_empty() {
            return None;
        }
        Change::Tombstone
    } else {
        let fields: &[u8; FIELDS_BYTES] = value.try_into().ok()?;
        let field =
            |i: usize| i64::from_be_bytes(fields[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Change::Put {
            create_revision: field(0),
            version: field(1),
            lease: field(2),
        }
    };
    Some(Entry {
        key: user_key,
        rev,
        change,
    })
}

/// One entry: its key and value as [`encode`] makes them.
pub type EncodedEntry = (Vec<u8>, Vec<u8>);

/// Entries collected by write transactions and not written yet (see the
/// module docs). Empty after every start and snapshot install: the engine
/// then holds (or [`super::store`] folds in) every stored revision's entry.
#[derive(Debug, Default)]
pub struct Pending {
    /// Entries of revisions after the chunk being written, in the order
    /// they were collected.
    filling: Vec<EncodedEntry>,
    /// The chunk being written, sorted by entry key, reversed (the next
    /// entry to write is the last).
    draining: Vec<EncodedEntry>,
    /// The revision the chunk being written ends at.
    draining_through: i64,
    /// Entries of the chunk being written per commit.
    slice_entries: usize,
}

/// What a commit writes of the collected entries.
#[derive(Debug, Default)]
pub struct Slice {
    /// Entries to write, in entry key order.
    pub entries: Vec<EncodedEntry>,
    /// The new [`META_HISTORY_REV`], when the slice completes a chunk.
    pub through: Option<i64>,
}

impl Pending {
    /// Collects one entry.
    pub fn push(&mut self, entry: EncodedEntry) {
        self.filling.push(entry);
    }

    /// Entries collected and not written.
    pub fn len(&self) -> usize {
        self.filling.len() + self.draining.len()
    }

    /// True if nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything collected (the engine's state was replaced).
    pub fn clear(&mut self) {
        *self = Pending::default();
    }

    /// What a commit that leaves the store at revision `current` writes:
    /// the next slice of the chunk being written, after cutting a new
    /// chunk if none is and [`HISTORY_CHUNK_ENTRIES`] are collected; or,
    /// with `all`, every collected entry (the mark then moves to
    /// `current`).
    pub fn take(&mut self, current: i64, all: bool) -> Slice {
        if all {
            let mut entries = std::mem::take(&mut self.draining);
            entries.reverse();
            let mut rest = std::mem::take(&mut self.filling);
            rest.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            entries.extend(rest);
            return Slice {
                entries,
                through: Some(current),
            };
        }
        if self.draining.is_empty() {
            if self.filling.len() < HISTORY_CHUNK_ENTRIES {
                return Slice::default();
            }
            let mut chunk = std::mem::take(&mut self.filling);
            chunk.sort_unstable_by(|a, b| b.0.cmp(&a.0));
            self.slice_entries =
                HISTORY_SLICE_ENTRIES.max(chunk.len().div_ceil(HISTORY_SLICES_PER_CHUNK));
            self.draining = chunk;
            self.draining_through = current;
        }
        let keep = self.draining.len().saturating_sub(self.slice_entries);
        let mut entries = self.draining.split_off(keep);
        entries.reverse();
        Slice {
            entries,
            through: self.draining.is_empty().then_some(self.draining_through),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], main: i64) -> (Vec<u8>, Vec<u8>) {
        let change = Change::Put {
            create_revision: main,
            version: 1,
            lease: 0,
        };
        encode(key, Revision::new(main, 0), change)
    }

    #[test]
    fn entries_sort_by_key_then_revision_whatever_bytes_keys_hold() {
        let keys: [&[u8]; 7] = [b"", b"\0", b"\0\0", b"a", b"a\0", b"a\0b", b"a\x01"];
        let mut entries = Vec::new();
        for k in keys {
            for main in [9, 300] {
                entries.push((entry_key(k, Revision::new(main, 0), false), k, main));
            }
        }
        let mut sorted = entries.clone();
        sorted.sort();
        let order: Vec<_> = sorted.iter().map(|(_, k, m)| (*k, *m)).collect();
        let expected: Vec<_> = entries.iter().map(|(_, k, m)| (*k, *m)).collect();
        assert_eq!(order, expected, "user key order, then revision order");
        for k in keys {
            let (start, end) = (key_start(k), key_end(k));
            let inside: Vec<_> = sorted
                .iter()
                .filter(|(e, ..)| *e >= start && *e < end)
                .map(|(_, key, _)| *key)
                .collect();
            assert_eq!(inside, vec![k, k], "{k:?}'s bounds hold its entries only");
        }
    }

    /// Entries are held until a chunk is collected, then written sorted, a
    /// slice per commit, the mark with the last slice at the revision the
    /// chunk was cut at; entries collected meanwhile wait for the next
    /// chunk; writing everything returns each run sorted and the mark at
    /// the current revision.
    #[test]
    fn pending_entries_go_out_in_sorted_chunks_a_slice_per_commit() {
        let mut pending = Pending::default();
        // Keys in an order that is not the entries' order.
        let key = |i: usize| format!("k{:08}", (i * 7919) % HISTORY_CHUNK_ENTRIES);
        for i in 0..HISTORY_CHUNK_ENTRIES - 1 {
            pending.push(put(key(i).as_bytes(), i as i64 + 2));
        }
        let early = pending.take(HISTORY_CHUNK_ENTRIES as i64, false);
        assert!(early.entries.is_empty() && early.through.is_none());
        pending.push(put(key(HISTORY_CHUNK_ENTRIES - 1).as_bytes(), 100_000));
        let mut written = Vec::new();
        let mut commits = 0;
        let through = loop {
            let slice = pending.take(100_000 + commits, false);
            assert!(slice.entries.len() <= HISTORY_SLICE_ENTRIES);
            written.extend(slice.entries);
            commits += 1;
            // Collected while the chunk drains: not part of it.
            pending.push(put(b"later", 200_000 + commits));
            if let Some(through) = slice.through {
                break through;
            }
        };
        assert_eq!(through, 100_000, "the revision the chunk was cut at");
        assert_eq!(
            commits as usize,
            HISTORY_CHUNK_ENTRIES / HISTORY_SLICE_ENTRIES
        );
        assert_eq!(written.len(), HISTORY_CHUNK_ENTRIES);
        assert!(
            written.windows(2).all(|w| w[0].0 < w[1].0),
            "in entry order"
        );
        assert_eq!(pending.len(), commits as usize);
        let rest = pending.take(300_000, true);
        assert_eq!(rest.through, Some(300_000));
        assert_eq!(rest.entries.len(), commits as usize);
        assert!(rest.entries.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(pending.is_empty());
        let none = pending.take(300_001, false);
        assert!(none.entries.is_empty() && none.through.is_none());
    }

    /// A chunk of four chunks' entries (one large transaction) is still
    /// written in [`HISTORY_SLICES_PER_CHUNK`] commits.
    #[test]
    fn a_large_chunk_goes_out_in_as_many_commits_as_a_normal_one() {
        let mut pending = Pending::default();
        let entries = 4 * HISTORY_CHUNK_ENTRIES;
        for i in 0..entries {
            pending.push(put(format!("k{i:08}").as_bytes(), 2));
        }
        let mut commits = 0;
        let mut written = 0;
        loop {
            let slice = pending.take(3, false);
            commits += 1;
            written += slice.entries.len();
            if slice.through.is_some() {
                break;
            }
        }
        assert_eq!(commits, HISTORY_SLICES_PER_CHUNK);
        assert_eq!(written, entries);
    }

    #[test]
    fn entries_round_trip() {
        let (k, v) = put(b"a\0b", 7);
        assert_eq!(
            decode(&k, &v),
            Some(Entry {
                key: b"a\0b".to_vec(),
                rev: Revision::new(7, 0),
                change: Change::Put {
                    create_revision: 7,
                    version: 1,
                    lease: 0
                },
            })
        );
        let t = entry_key(b"a", Revision::new(8, 2), true);
        assert_eq!(
            decode(&t, &[]).map(|e| (e.rev, e.change)),
            Some((Revision::new(8, 2), Change::Tombstone))
        );
        // Not entries: another meta key, a bad escape, a short value.
        assert_eq!(decode(b"mvcc/currentRev", &[0; 8]), None);
        assert_eq!(decode(b"mvcc/keyHistory/a\0\x02", &[]), None);
        assert_eq!(decode(&k, &v[..8]), None);
        assert_eq!(decode(&t, &v), None);
    }

    #[test]
    fn range_bounds_cover_exactly_the_range() {
        let (a, b, c) = (put(b"a", 2).0, put(b"b", 3).0, put(b"c", 4).0);
        let (s, e) = bounds(&KeyRange::Between(b"b".to_vec(), b"c".to_vec())).unwrap();
        assert!(a < s && s <= b && b < e && e <= c);
        let (s, e) = bounds(&KeyRange::From(b"b".to_vec())).unwrap();
        assert!(a < s && b < e && c < e);
        assert!(HISTORY_PREFIX < s.as_slice() && e.as_slice() == HISTORY_END);
        assert!(bounds(&KeyRange::Between(b"c".to_vec(), b"a".to_vec())).is_none());
        // The markers are outside every entry's range.
        for marker in [META_HISTORY_REV, META_HISTORY_COMPACT_REV] {
            assert!(marker < HISTORY_PREFIX || marker >= HISTORY_END);
        }
    }
}

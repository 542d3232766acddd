//! The in-memory key index: key -> [`KeyIndex`], ordered by key and hashed.
//!
//! Ranges are resolved here first (which revision of which key is visible
//! at the read revision); values are then fetched from the engine by
//! revision. The index is rebuilt from the engine at start-up.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasher, RandomState};

use hashbrown::hash_table::{Entry, HashTable};
use std::ops::Bound;
use std::sync::Arc;

use super::key_index::{KeyAt, KeyIndex};
use super::revision::Revision;

/// Which keys a request covers, decoded from etcd's `key`/`range_end` pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRange {
    /// Exactly one key (`range_end` empty).
    Single(Vec<u8>),
    /// Every key `>= start` (`range_end` is `"\0"`).
    From(Vec<u8>),
    /// Keys in `[start, end)`.
    Between(Vec<u8>, Vec<u8>),
}

impl KeyRange {
    /// Decodes etcd's convention: empty end = one key, `"\0"` = to the end
    /// of the key space, otherwise a half-open interval.
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        match range_end {
            [] => KeyRange::Single(key.to_vec()),
            [0] => KeyRange::From(key.to_vec()),
            end => KeyRange::Between(key.to_vec(), end.to_vec()),
        }
    }

    /// True if `key` falls in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k.as_slice() == key,
            KeyRange::From(s) => key >= s.as_slice(),
            KeyRange::Between(s, e) => key >= s.as_slice() && key < e.as_slice(),
        }
    }

    fn bounds(&self) -> Option<KeyBounds<'_>> {
        match self {
            KeyRange::Single(k) => Some((Bound::Included(k), Bound::Included(k))),
            KeyRange::From(s) => Some((Bound::Included(s), Bound::Unbounded)),
            KeyRange::Between(s, e) if s < e => Some((Bound::Included(s), Bound::Excluded(e))),
            KeyRange::Between(..) => None,
        }
    }
}

/// Lower and upper bound of a key range, for `BTreeMap::range`.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// A key visible at some revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleKey {
    /// The user key.
    pub key: Vec<u8>,
    /// Its state at the read revision.
    pub at: KeyAt,
}

/// Where a key's history lives in [`TreeIndex`]'s slab.
type Slot = u32;

/// All keys' histories.
///
/// Two maps share one slab of histories: a hash map finds a key's history
/// for the point operations every write makes (put, delete, a single-key
/// get), a B-tree keeps the keys in order for ranges, range deletes and
/// compaction. A put of an existing key (most of a write load) touches only
/// the hash map: one hash of the key and one key comparison, where a search
/// of a B-tree over `Vec<u8>` keys compared the key with ~20 others, each
/// behind its own pointer (over 100,000 keys, ~2.6 us of each put on a
/// loaded member, 7% of a follower's CPU). Keys are shared by both maps
/// (`Arc<[u8]>`); the hash map's hasher is seeded per process, so clients
/// cannot choose colliding keys.
#[derive(Debug, Default)]
pub struct TreeIndex {
    /// Key order: key -> slot.
    ordered: BTreeMap<Arc<[u8]>, Slot>,
    /// Point lookups: key -> slot (the same keys as `ordered`).
    by_key: KeyTable,
    /// Histories by slot; slots of compacted keys are in `free`.
    histories: Vec<KeyIndex>,
    /// Slots to reuse.
    free: Vec<Slot>,
    /// Keys live now (etcd's `keysGauge`): kept as puts, deletions and
    /// rebuilds change it, so reading it costs nothing.
    live: usize,
}

impl TreeIndex {
    /// Number of keys with any history.
    pub fn len(&self) -> usize {
        self.ordered.len()
    }

    /// True if the index holds no key.
    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    fn history(&self, key: &[u8]) -> Option<&KeyIndex> {
        let slot = self.by_key.get(key)?;
        Some(&self.histories[slot as usize])
    }

    fn history_mut(&mut self, key: &[u8]) -> Option<&mut KeyIndex> {
        let slot = self.by_key.get(key)?;
        Some(&mut self.histories[slot as usize])
    }

    /// The history of `key`, created empty (in the hash table and the
    /// B-tree) if the key has none; the key is hashed once either way.
    fn history_or_new(&mut self, key: &[u8]) -> &mut KeyIndex {
        let (histories, free, ordered) = (&mut self.histories, &mut self.free, &mut self.ordered);
        let slot = self.by_key.get_or_insert_with(key, |key| {
            let slot = new_slot(histories, free);
            ordered.insert(Arc::clone(key), slot);
            slot
        });
        &mut self.histories[slot as usize]
    }

    /// Records a put at `rev` and returns the key's state just before it
    /// (what `get(key, rev.main)` answered before the call), with one
    /// lookup of the key.
    pub fn put(&mut self, key: &[u8], rev: Revision) -> Option<KeyAt> {
        let ki = self.history_or_new(key);
        let previous = ki.get(rev.main);
        ki.put(rev);
        if previous.is_none() {
            self.live += 1;
        }
        previous
    }

    /// Number of keys live now.
    pub fn live_len(&self) -> usize {
        self.live
    }

    /// Records a deletion; false if the key was not live.
    pub fn tombstone(&mut self, key: &[u8], rev: Revision) -> bool {
        let deleted = self.history_mut(key).is_some_and(|ki| ki.tombstone(rev));
        if deleted {
            self.live -= 1;
        }
        deleted
    }

    /// An empty index to rebuild from stored revisions ([`Rebuild`]).
    pub fn rebuild() -> Rebuild {
        Rebuild::default()
    }

    /// The key as of `at`.
    pub fn get(&self, key: &[u8], at: i64) -> Option<KeyAt> {
        self.history(key).and_then(|ki| ki.get(at))
    }

    /// The keys of `bounds` in order, each with its history.
    fn in_bounds<'a>(
        &'a self,
        bounds: KeyBounds<'a>,
    ) -> impl Iterator<Item = (&'a Arc<[u8]>, &'a KeyIndex)> + 'a {
        self.ordered
            .range::<[u8], _>(bounds)
            .map(|(key, slot)| (key, &self.histories[*slot as usize]))
    }

    /// True if the index holds `key`'s history.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.by_key.get(key).is_some()
    }

    /// Adds `key` with `history`, read from the engine, unless the index
    /// holds the key already (its history then is as new or newer) or the
    /// history is empty; true if added.
    pub fn insert_loaded(&mut self, key: &[u8], history: KeyIndex) -> bool {
        if history.generations.is_empty() || self.contains(key) {
            return false;
        }
        self.live += usize::from(history.is_live());
        *self.history_or_new(key) = history;
        true
    }

    /// Keys in `range` visible at `at`, in key order; stops after `limit`
    /// matches (0 = all) but always returns the exact total count.
    pub fn range(&self, range: &KeyRange, at: i64, limit: usize) -> (Vec<VisibleKey>, usize) {
        self.range_counting(range, at, limit, false)
    }

    /// [`TreeIndex::range`] that stops at the first match past `limit`
    /// (when `limit` is not 0): the count is then at most `limit + 1`, and
    /// a read of the first keys of a large range walks no further.
    pub fn range_to_limit(
        &self,
        range: &KeyRange,
        at: i64,
        limit: usize,
    ) -> (Vec<VisibleKey>, usize) {
        self.range_counting(range, at, limit, true)
    }

    fn range_counting(
        &self,
        range: &KeyRange,
        at: i64,
        limit: usize,
        stop_past_limit: bool,
    ) -> (Vec<VisibleKey>, usize) {
        let Some(bounds) = range.bounds() else {
            return (Vec::new(), 0);
        };
        let mut out = Vec::new();
        let mut total = 0;
        for (key, ki) in self.in_bounds(bounds) {
            if let Some(at) = ki.get(at) {
                if stop_past_limit && limit != 0 && total == limit {
                    return (out, total + 1);
                }
                total += 1;
                if limit == 0 || out.len() < limit {
                    out.push(VisibleKey {
                        key: key.to_vec(),
                        at,
                    });
                }
            }
        }
        (out, total)
    }

    /// Live keys in `range` right now (for deletes), in key order.
    pub fn live_keys(&self, range: &KeyRange) -> Vec<Vec<u8>> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.in_bounds(bounds)
            .filter(|(_, ki)| ki.is_live())
            .map(|(k, _)| k.to_vec())
            .collect()
    }

    /// Compacts at `at` the keys after `after` (from the first key when
    /// None), one key at a time, until `max_keys` keys are done or
    /// `max_dropped` revisions were dropped; adds each dropped revision, with its key, to
    /// `dropped` ([`KeyIndex::compact_dropping`]). Keys left with no
    /// history leave both maps and free their slot. Returns the last key
    /// done when keys may remain, None when the index is done.
    ///
    /// A compaction is so cut into short steps, each under the store's
    /// write lock for a bounded time (at a million keys, compacting the
    /// whole index at once held writes for over a second). Reads need no
    /// step to be done: one at or above the compaction revision sees the
    /// same revisions in a compacted history as in the whole one.
    pub fn compact_some(
        &mut self,
        at: i64,
        after: Option<&[u8]>,
        max_keys: usize,
        max_dropped: usize,
        dropped: &mut Vec<(Arc<[u8]>, Revision, bool)>,
    ) -> Option<Arc<[u8]>> {
        assert!(max_keys > 0 && max_dropped > 0, "a step does some work");
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = None;
        let mut done_keys = 0;
        let start = dropped.len();
        let mut revs = Vec::new();
        loop {
            if done_keys >= max_keys || dropped.len() - start >= max_dropped {
                return last;
            }
            let bounds = (
                last.as_deref().map_or(lower, Bound::Excluded),
                Bound::Unbounded,
            );
            let (key, slot) = self
                .ordered
                .range::<[u8], _>(bounds)
                .next()
                .map(|(k, s)| (k.clone(), *s))?;
            let ki = &mut self.histories[slot as usize];
            if ki.compact_dropping(at, &mut revs) {
                *ki = KeyIndex::default();
                self.ordered.remove(&*key);
                self.by_key.remove(&key);
                self.free.push(slot);
            }
            dropped.extend(revs.drain(..).map(|(rev, t)| (Arc::clone(&key), rev, t)));
            done_keys += 1;
            last = Some(key);
        }
    }

    /// Revisions `<= at` still needed to read at `at` (HashKV's view).
    pub fn keep_at(&self, at: i64) -> HashSet<Revision> {
        let mut keep = HashSet::new();
        for slot in self.ordered.values() {
            let mut copy = self.histories[*slot as usize].clone();
            copy.compact(at, &mut keep);
        }
        keep
    }
}

/// The hash side of [`TreeIndex`]: key -> slot, each entry keeping its
/// key's hash. Keys are hashed with SipHash under a per-process key (std's
/// `RandomState`), so clients cannot choose colliding keys; each operation
/// hashes its key once, and growing the table reuses the kept hashes
/// instead of hashing every key again (a million-key rebuild spent a sixth
/// of its time in SipHash, half of it rehashing as the table grew).
#[derive(Debug)]
struct KeyTable {
    entries: HashTable<(u64, Arc<[u8]>, Slot)>,
    hasher: RandomState,
}

impl Default for KeyTable {
    fn default() -> Self {
        Self {
            entries: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

impl KeyTable {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// A table of `keys` (no two equal), each with its hash by `hasher`,
    /// sized for them at once.
    fn with_hashed_keys(hasher: RandomState, keys: &[(u64, Arc<[u8]>, Slot)]) -> Self {
        let mut entries = HashTable::with_capacity(keys.len());
        for (hash, key, slot) in keys {
            debug_assert_eq!(*hash, hasher.hash_one(&key[..]));
            entries.insert_unique(*hash, (*hash, Arc::clone(key), *slot), |e| e.0);
        }
        Self { entries, hasher }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn get(&self, key: &[u8]) -> Option<Slot> {
        let hash = self.hash(key);
        let found = self.entries.find(hash, |e| *e.1 == *key)?;
        Some(found.2)
    }

    /// The slot of `key`; if absent, the key is inserted with the slot
    /// `new` gives for the shared copy of the key.
    fn get_or_insert_with(&mut self, key: &[u8], new: impl FnOnce(&Arc<[u8]>) -> Slot) -> Slot {
        let hash = self.hash(key);
        match self.entries.entry(hash, |e| *e.1 == *key, |e| e.0) {
            Entry::Occupied(o) => o.get().2,
            Entry::Vacant(v) => {
                let key: Arc<[u8]> = Arc::from(key);
                let slot = new(&key);
                v.insert((hash, key, slot));
                slot
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        let hash = self.hash(key);
        if let Ok(found) = self.entries.find_entry(hash, |e| *e.1 == *key) {
            found.remove();
        }
    }
}

/// A slot for a new key's (empty) history: a free one, else a new one.
fn new_slot(histories: &mut Vec<KeyIndex>, free: &mut Vec<Slot>) -> Slot {
    let slot = match free.pop() {
        Some(slot) => slot,
        None => {
            let slot = Slot::try_from(histories.len()).expect("fewer than 2^32 keys in the index");
            histories.push(KeyIndex::default());
            slot
        }
    };
    debug_assert!(histories[slot as usize].generations.is_empty());
    slot
}

/// The sort key of [`Rebuild::finish`]: the 8 bytes of `key` from `skip`
/// (the length every key shares), zero-padded, big-endian. Two keys whose
/// words differ are in the order of their words; equal words need the
/// whole keys compared (a key that ends early pads with zeros, as a key
/// with real zeros there would).
fn sort_word(key: &[u8], skip: usize) -> u64 {
    let mut word = [0u8; 8];
    let rest = key.get(skip..).unwrap_or_default();
    let n = rest.len().min(8);
    word[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(word)
}

/// Length of the prefix `a` and `b` share.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// An index being rebuilt from the stored revisions in revision order
/// (start-up, a snapshot as it arrives).
///
/// The revisions are only collected as they come: each key's bytes go to
/// one buffer and its fields to one flat record, so taking a revision is a
/// copy, with no hashing and no allocation of its own. [`Rebuild::finish`]
/// then sorts the records by key (a stable order keeps each key's
/// revisions oldest first), replays each key's revisions into its history
/// in one go, and builds both maps from the sorted keys: the B-tree in one
/// pass, the hash table at its final size on a second thread meanwhile.
/// Looking every revision up in a growing hash table instead (hashing the
/// key, comparing it, rehashing as the table grew, page-faulting the
/// table's new memory) was most of a million-key rebuild's time.
#[derive(Debug, Default)]
pub struct Rebuild {
    /// Every record's key, one after another.
    keys: Vec<u8>,
    /// One per stored revision, in the order they came.
    records: Vec<RebuildRecord>,
    /// The prefix every key so far shares with the first.
    shared: usize,
}

/// One stored revision in [`Rebuild`].
#[derive(Debug, Clone, Copy)]
struct RebuildRecord {
    /// Where its key starts in [`Rebuild::keys`].
    key_start: usize,
    /// Its key's length.
    key_len: u32,
    /// A deletion (the other fields but `modified` unused).
    tombstone: bool,
    modified: Revision,
    created: Revision,
    version: i64,
}

impl Rebuild {
    /// Records a stored put ([`KeyIndex::restore`]). Revisions come in
    /// revision order.
    pub fn restore(&mut self, key: &[u8], created: Revision, modified: Revision, version: i64) {
        self.push(key, false, modified, created, version);
    }

    /// Records a stored deletion; one of a key that is not live then (its
    /// puts were compacted away) changes nothing.
    pub fn tombstone(&mut self, key: &[u8], rev: Revision) {
        self.push(key, true, rev, Revision::default(), 0);
    }

    fn push(
        &mut self,
        key: &[u8],
        tombstone: bool,
        modified: Revision,
        created: Revision,
        version: i64,
    ) {
        let key_len = u32::try_from(key.len()).expect("a stored key is shorter than 4 GiB");
        let key_start = self.keys.len();
        self.shared = match self.records.first() {
            None => key.len(),
            Some(first) => self.shared.min(common_prefix(self.key_of(first), key)),
        };
        self.keys.extend_from_slice(key);
        self.records.push(RebuildRecord {
            key_start,
            key_len,
            tombstone,
            modified,
            created,
            version,
        });
    }

    fn key_of(&self, r: &RebuildRecord) -> &[u8] {
        &self.keys[r.key_start..r.key_start + r.key_len as usize]
    }

    /// The records' positions in key order, each key's oldest first. They
    /// are sorted by an 8-byte word read past the prefix every key shares
    /// ([`sort_word`]), so most comparisons are one integer comparison
    /// instead of a `memcmp` through two pointers over that shared prefix
    /// (Kubernetes keys share `/registry/`).
    fn key_order(&self) -> Vec<(u64, u32)> {
        let mut order: Vec<(u64, u32)> = self
            .records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let i = u32::try_from(i).expect("fewer than 2^32 revisions to rebuild");
                (sort_word(self.key_of(r), self.shared), i)
            })
            .collect();
        order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| {
                    let (ra, rb) = (&self.records[a.1 as usize], &self.records[b.1 as usize]);
                    self.key_of(ra).cmp(self.key_of(rb))
                })
                .then(a.1.cmp(&b.1))
        });
        order
    }

    /// Each key of `order` (record positions in key order, no key split
    /// from its other records) with its history replayed.
    fn replay_keys(&self, order: &[(u64, u32)], hasher: &RandomState) -> Replayed {
        let mut out = Replayed {
            keys: Vec::with_capacity(order.len()),
            histories: Vec::with_capacity(order.len()),
            live: 0,
        };
        let mut group = order
            .iter()
            .map(|(_, i)| &self.records[*i as usize])
            .peekable();
        while let Some(first) = group.next() {
            let key = self.key_of(first);
            let mut ki = KeyIndex::default();
            replay(&mut ki, first);
            while let Some(next) = group.next_if(|r| self.key_of(r) == key) {
                replay(&mut ki, next);
            }
            if ki.generations.is_empty() {
                // Only tombstones of puts compacted away: no history.
                continue;
            }
            out.live += usize::from(ki.is_live());
            let slot =
                Slot::try_from(out.histories.len()).expect("fewer than 2^32 keys in the index");
            out.histories.push(ki);
            out.keys.push((hasher.hash_one(key), Arc::from(key), slot));
        }
        out
    }

    /// The finished index.
    pub fn finish(self) -> TreeIndex {
        let order = self.key_order();
        // Two halves, split between keys, replayed on two threads.
        let mut mid = order.len() / 2;
        while mid > 0
            && mid < order.len()
            && self.key_of(&self.records[order[mid].1 as usize])
                == self.key_of(&self.records[order[mid - 1].1 as usize])
        {
            mid += 1;
        }
        let (low, high) = order.split_at(mid);
        let hasher = RandomState::new();
        let (mut first, second) = std::thread::scope(|scope| {
            let second = scope.spawn(|| self.replay_keys(high, &hasher));
            let first = self.replay_keys(low, &hasher);
            let second = second
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (first, second)
        });
        let offset =
            Slot::try_from(first.histories.len()).expect("fewer than 2^32 keys in the index");
        first
            .keys
            .extend(second.keys.into_iter().map(|(h, k, s)| (h, k, s + offset)));
        first.histories.extend(second.histories);
        let Replayed {
            keys,
            histories,
            live,
        } = first;
        let live = live + second.live;
        drop(order);
        drop(self);
        let (ordered, by_key) = std::thread::scope(|scope| {
            let hashed = scope.spawn(|| KeyTable::with_hashed_keys(hasher, &keys));
            let ordered: BTreeMap<Arc<[u8]>, Slot> =
                keys.iter().map(|(_, k, s)| (Arc::clone(k), *s)).collect();
            let by_key = hashed
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (ordered, by_key)
        });
        debug_assert_eq!(ordered.len(), by_key.len());
        TreeIndex {
            ordered,
            by_key,
            histories,
            free: Vec::new(),
            live,
        }
    }
}

/// Part of a rebuilt index: keys in order with their slots in `histories`.
struct Replayed {
    /// Each key with its hash ([`KeyTable`]'s) and slot.
    keys: Vec<(u64, Arc<[u8]>, Slot)>,
    histories: Vec<KeyIndex>,
    /// Keys live now.
    live: usize,
}

/// Replays one stored revision of a key into its history, oldest first: a
/// put on a live key adds a revision; one on a deleted or new key starts a
/// generation with the stored creation revision and version (older
/// revisions may have been compacted away); a tombstone ends a live
/// generation.
fn replay(ki: &mut KeyIndex, r: &RebuildRecord) {
    ki.replay_stored(r.tombstone, r.created, r.modified, r.version);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// The rebuilt B-tree is in key order whatever the keys share: a long
    /// common prefix, keys that are prefixes of others, zero bytes where
    /// the sort pads shorter keys with zeros.
    #[test]
    fn rebuild_orders_keys_past_their_shared_prefix() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut rebuild = TreeIndex::rebuild();
        let mut expected = std::collections::BTreeSet::new();
        for main in 1..2000 {
            let mut key = b"/registry/pods/".to_vec();
            let len = rng.gen_range(0..14);
            key.extend((0..len).map(|_| [0u8, 1, b'a', 0xff][rng.gen_range(0..4)]));
            rebuild.restore(&key, r(main), r(main), 1);
            expected.insert(key);
        }
        let index = rebuild.finish();
        let got: Vec<Vec<u8>> = index.ordered.keys().map(|k| k.to_vec()).collect();
        assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
        assert_eq!(index.by_key.len(), got.len());
    }

    #[test]
    fn sort_words_pad_short_keys() {
        assert_eq!(common_prefix(b"ab1", b"ab\0\0"), 2);
        assert_eq!(common_prefix(b"", b"ab"), 0);
        assert_eq!(sort_word(b"ab", 2), 0);
        assert_eq!(sort_word(b"ab\x01", 2), 1 << 56);
        assert!(sort_word(b"xx123456789", 2) == sort_word(b"xx12345678", 2));
    }

    #[test]
    fn key_range_decoding() {
        assert_eq!(KeyRange::new(b"a", b""), KeyRange::Single(b"a".to_vec()));
        assert_eq!(KeyRange::new(b"a", b"\0"), KeyRange::From(b"a".to_vec()));
        assert!(KeyRange::new(b"a", b"c").contains(b"b"));
        assert!(!KeyRange::new(b"a", b"c").contains(b"c"));
        assert!(KeyRange::new(b"a", b"\0").contains(b"zzz"));
    }

    #[test]
    fn range_counts_past_the_limit() {
        let mut idx = TreeIndex::default();
        for (i, k) in [b"a", b"b", b"c", b"d"].iter().enumerate() {
            idx.put(&k[..], r(i as i64 + 2));
        }
        assert!(idx.tombstone(b"b", r(6)));
        let (keys, total) = idx.range(&KeyRange::new(b"a", b"\0"), 6, 2);
        assert_eq!(total, 3);
        assert_eq!(
            keys.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
            vec![b"a".to_vec(), b"c".to_vec()]
        );
        let (_, total_at_5) = idx.range(&KeyRange::new(b"a", b"\0"), 5, 0);
        assert_eq!(total_at_5, 4, "b still existed at 5");
        assert_eq!(
            idx.range(&KeyRange::new(b"c", b"a"), 6, 0).1,
            0,
            "inverted range"
        );
    }

    /// A put answers what `get` at its revision answered just before it:
    /// nothing for a new key or one deleted, else the live generation's
    /// creation and version; the put is recorded either way.
    #[test]
    fn put_returns_the_state_before_it() {
        let mut idx = TreeIndex::default();
        assert_eq!(idx.put(b"k", r(2)), None);
        for (main, version) in [(3, 1), (4, 2)] {
            let expected = idx.get(b"k", main);
            let before = idx.put(b"k", r(main));
            assert_eq!(before, expected);
            let before = before.expect("the key is live");
            assert_eq!((before.created, before.version), (r(2), version));
        }
        assert!(idx.tombstone(b"k", r(5)));
        assert_eq!(idx.put(b"k", r(6)), None);
        let now = idx.get(b"k", 6).expect("put at 6");
        assert_eq!((now.created, now.modified, now.version), (r(6), r(6), 1));
    }

    impl TreeIndex {
        /// Compacts every key at `at` in steps of `keys`; returns what was
        /// dropped.
        fn compact(&mut self, at: i64, keys: usize) -> Vec<(Arc<[u8]>, Revision, bool)> {
            let mut dropped = Vec::new();
            let mut after = None;
            loop {
                let next = self.compact_some(at, after.as_deref(), keys, usize::MAX, &mut dropped);
                match next {
                    Some(key) => after = Some(key),
                    None => return dropped,
                }
            }
        }
    }

    /// The live count follows puts, deletions, re-creations, compaction
    /// and a rebuild: always the count of a range over every key now.
    #[test]
    fn the_live_count_is_the_count_of_every_key() {
        let all = KeyRange::new(b"\0", b"\0");
        let check = |idx: &TreeIndex, step: &str| {
            assert_eq!(idx.live_len(), idx.range(&all, i64::MAX, 0).1, "{step}");
        };
        let mut idx = TreeIndex::default();
        let mut rebuild = TreeIndex::rebuild();
        let mut rev = 1;
        for round in 0..4u8 {
            for k in 0..6u8 {
                rev += 1;
                let key = [b'k', k];
                if (k + round) % 3 == 0 {
                    idx.tombstone(&key, r(rev));
                    rebuild.tombstone(&key, r(rev));
                } else {
                    idx.put(&key, r(rev));
                    rebuild.restore(&key, r(rev), r(rev), 1);
                }
                check(&idx, &format!("round {round} key {k}"));
            }
        }
        let rebuilt = rebuild.finish();
        assert_eq!(rebuilt.live_len(), idx.live_len());
        check(&rebuilt, "rebuilt");
        idx.compact(rev, 2);
        check(&idx, "compacted");
        assert!(idx.live_len() > 0 && idx.live_len() < 6);
    }

    /// A rebuilt index answers as the one its stored puts were made in.
    #[test]
    fn a_rebuild_answers_as_the_index_it_restores() {
        let mut one_by_one = TreeIndex::default();
        let mut rebuild = TreeIndex::rebuild();
        for (i, key) in [&b"m"[..], b"c", b"x", b"c", b"a"].iter().enumerate() {
            let rev = r(2 + i as i64);
            let before = one_by_one.put(key, rev);
            let created = before.map_or(rev, |b| b.created);
            let version = before.map_or(1, |b| b.version + 1);
            rebuild.restore(key, created, rev, version);
        }
        assert!(one_by_one.tombstone(b"x", r(9)));
        rebuild.tombstone(b"x", r(9));
        let rebuilt = rebuild.finish();
        let all = KeyRange::new(b"a", b"\0");
        for at in 2..=9 {
            assert_eq!(
                rebuilt.range(&all, at, 0),
                one_by_one.range(&all, at, 0),
                "at {at}"
            );
        }
        assert_eq!(rebuilt.len(), 4);
    }

    /// A rebuild from the revisions a history of random puts and deletes
    /// left after a compaction answers as the compacted index at every
    /// revision from the compaction on; keys whose only stored revision is
    /// a tombstone (their puts compacted away) are dropped.
    #[test]
    fn a_rebuild_from_compacted_revisions_answers_as_the_compacted_index() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut idx = TreeIndex::default();
        // Every stored revision: key, tombstone, created, version.
        let mut stored = std::collections::BTreeMap::new();
        let keys: Vec<Vec<u8>> = (0..12u8).map(|k| vec![b'k', k]).collect();
        let mut rev = 1;
        for _ in 0..400 {
            rev += 1;
            let key = &keys[rng.gen_range(0..keys.len())];
            if rng.gen_bool(0.3) {
                if idx.tombstone(key, r(rev)) {
                    stored.insert(rev, (key.clone(), true, 0, 0));
                } else {
                    rev -= 1;
                }
            } else {
                let before = idx.put(key, r(rev));
                let created = before.map_or(rev, |b| b.created.main);
                let version = before.map_or(1, |b| b.version + 1);
                stored.insert(rev, (key.clone(), false, created, version));
            }
        }
        let at = rev / 2;
        for (_, dropped, _) in idx.compact(at, usize::MAX) {
            assert!(stored.remove(&dropped.main).is_some());
        }
        let mut rebuild = TreeIndex::rebuild();
        for (main, (key, tombstone, created, version)) in &stored {
            if *tombstone {
                rebuild.tombstone(key, r(*main));
            } else {
                rebuild.restore(key, r(*created), r(*main), *version);
            }
        }
        let rebuilt = rebuild.finish();
        let all = KeyRange::new(b"\0", b"\0");
        for read_at in at..=rev {
            assert_eq!(
                rebuilt.range(&all, read_at, 0),
                idx.range(&all, read_at, 0),
                "at {read_at}"
            );
        }
        assert_eq!(rebuilt.live_len(), idx.live_len());
        let names = |i: &TreeIndex| i.ordered.keys().map(|k| k.to_vec()).collect::<Vec<_>>();
        assert_eq!(names(&rebuilt), names(&idx));
        for key in &keys {
            assert_eq!(rebuilt.get(key, i64::MAX), idx.get(key, i64::MAX));
        }
    }

    #[test]
    fn compaction_drops_dead_keys() {
        let mut idx = TreeIndex::default();
        idx.put(b"a", r(2));
        idx.put(b"b", r(3));
        assert!(idx.tombstone(b"a", r(4)));
        let a: Arc<[u8]> = Arc::from(&b"a"[..]);
        assert_eq!(
            idx.compact(4, 100),
            vec![(a.clone(), r(2), false), (a, r(4), true)]
        );
        assert_eq!(idx.len(), 1);
    }

    /// In steps of one key or of one revision, compaction drops the same
    /// revisions as in one step, and a step's cursor survives the removal
    /// of the key it names.
    #[test]
    fn compaction_in_steps_drops_the_same() {
        let build = || {
            let mut idx = TreeIndex::default();
            for (i, k) in [b"a", b"b", b"c", b"d"].iter().enumerate() {
                idx.put(&k[..], r(2 + i as i64));
                idx.put(&k[..], r(10 + i as i64));
            }
            assert!(idx.tombstone(b"b", r(20)));
            assert!(idx.tombstone(b"c", r(30)));
            idx
        };
        let whole = build().compact(25, usize::MAX);
        assert_eq!(build().compact(25, 1), whole);
        let mut idx = build();
        let mut dropped = Vec::new();
        let mut after = None;
        let mut steps = 0;
        while let Some(key) = idx.compact_some(25, after.as_deref(), usize::MAX, 1, &mut dropped) {
            after = Some(key);
            steps += 1;
        }
        assert_eq!(dropped, whole);
        assert!(steps >= 3, "{steps} steps");
        assert_eq!(idx.len(), 3, "b is gone");
        assert_eq!(idx.get(b"c", 25).map(|k| k.modified), Some(r(12)));
    }

    /// A compacted key's slot goes to the next new key: the old key is gone
    /// from both maps, the new one starts a fresh history, and ranges still
    /// see the keys in order.
    #[test]
    fn compaction_frees_slots_for_new_keys() {
        let mut idx = TreeIndex::default();
        idx.put(b"b", r(2));
        idx.put(b"c", r(3));
        assert!(idx.tombstone(b"b", r(4)));
        idx.compact(4, 1);
        assert_eq!(idx.free.len(), 1);
        assert_eq!(idx.get(b"b", 4), None);
        assert!(!idx.tombstone(b"b", r(5)), "b is gone");

        assert_eq!(idx.put(b"a", r(5)), None);
        assert!(idx.free.is_empty(), "a took b's slot");
        assert_eq!(idx.histories.len(), 2);
        let a = idx.get(b"a", 5).expect("a put at 5");
        assert_eq!((a.created, a.version), (r(5), 1));
        let (keys, total) = idx.range(&KeyRange::new(b"a", b"\0"), 5, 0);
        assert_eq!(total, 2);
        assert_eq!(
            keys.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
            vec![b"a".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            idx.live_keys(&KeyRange::new(b"b", b"d")),
            vec![b"c".to_vec()]
        );
    }
}

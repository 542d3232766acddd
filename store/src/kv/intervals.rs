//! A set of byte-string key ranges with `O(log n)` membership, for the txn
//! put/delete overlap check (etcd's `checkIntervals`, which uses an
//! interval tree for the same reason: a txn may hold thousands of
//! operations when `--max-txn-ops` is raised, and checking every put
//! against every delete would be quadratic).
//!
//! Ranges are half-open `[start, end)` in byte order; a single key `k` is
//! `[k, k ++ 0x00)`, since `k ++ 0x00` is the next key after `k`. The set
//! keeps disjoint ranges keyed by start, merging on insert, so a lookup is
//! one `BTreeMap` search: the last range starting at or before the key
//! covers it if the key is below its end. Empty or inverted ranges
//! (`end <= start`) cover nothing, as in etcd.
//!
//! Worked example: insert `[b, d)`, then `c` (= `[c, c\0)`, inside), then
//! `[d, f)` (touching, merged): the set is `{[b, f)}`; `e` is covered, `f`
//! and `a` are not.

use std::collections::BTreeMap;

/// Disjoint half-open key ranges (module docs).
#[derive(Debug, Default, Clone)]
pub struct KeyIntervals {
    /// start -> end, disjoint and not touching.
    ranges: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl KeyIntervals {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the single key `key`.
    pub fn insert_key(&mut self, key: &[u8]) {
        let mut end = key.to_vec();
        end.push(0);
        self.insert(key.to_vec(), end);
    }

    /// Adds `[start, end)`; nothing if `end <= start`.
    pub fn insert(&mut self, mut start: Vec<u8>, mut end: Vec<u8>) {
        if end <= start {
            return;
        }
        // A range starting before `start` that reaches it merges in.
        if let Some((s, e)) = self.ranges.range(..=start.clone()).next_back() {
            if *e >= start {
                start = s.clone();
                end = end.max(e.clone());
            }
        }
        // Ranges starting inside (or at the end of) the new one merge in.
        let inside: Vec<Vec<u8>> = self
            .ranges
            .range(start.clone()..=end.clone())
            .map(|(s, _)| s.clone())
            .collect();
        for s in inside {
            if let Some(e) = self.ranges.remove(&s) {
                end = end.max(e);
            }
        }
        self.ranges.insert(start, end);
    }

    /// Adds every range of `other`.
    pub fn extend(&mut self, other: KeyIntervals) {
        for (s, e) in other.ranges {
            self.insert(s, e);
        }
    }

    /// True if some range holds `key`.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.ranges
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(key)))
            .next_back()
            .is_some_and(|(_, end)| key < end.as_slice())
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// True if nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example() {
        let mut s = KeyIntervals::new();
        s.insert(b"b".to_vec(), b"d".to_vec());
        s.insert_key(b"c");
        s.insert(b"d".to_vec(), b"f".to_vec());
        assert_eq!(s.len(), 1);
        assert!(s.covers(b"e") && s.covers(b"b") && s.covers(b"c\xff"));
        assert!(!s.covers(b"f") && !s.covers(b"a"));
    }

    #[test]
    fn inverted_and_empty_ranges_cover_nothing() {
        let mut s = KeyIntervals::new();
        s.insert(b"d".to_vec(), b"b".to_vec());
        s.insert(b"d".to_vec(), b"d".to_vec());
        // etcd's "\0" range end is literal: below "\0" only the empty key.
        s.insert(b"k".to_vec(), vec![0]);
        assert!(s.is_empty());
        assert!(!s.covers(b"d"));
    }

    /// Agrees with the quadratic definition on seeded random ranges.
    #[test]
    fn agrees_with_checking_every_range() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let mut set = KeyIntervals::new();
            let mut plain: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
            for _ in 0..next(30) {
                let a = vec![b'a' + next(8) as u8, b'a' + next(3) as u8];
                if next(2) == 0 {
                    set.insert_key(&a);
                    plain.push((a, None));
                } else {
                    let b = vec![b'a' + next(8) as u8];
                    set.insert(a.clone(), b.clone());
                    plain.push((a, Some(b)));
                }
            }
            for x in 0..8u8 {
                for y in 0..=3u8 {
                    let mut k = vec![b'a' + x];
                    if y > 0 {
                        k.push(b'a' + y - 1);
                    }
                    let want = plain.iter().any(|(s, e)| match e {
                        None => *s == k,
                        Some(e) => k >= *s && k < *e,
                    });
                    assert_eq!(set.covers(&k), want, "key {k:?} in {plain:?}");
                }
            }
        }
    }
}

//! The tail cache ([`TailCache`]): the newest entries kept in memory as
//! they are appended, so replication and apply read them without the
//! segment files (see the [module docs](super)).

use std::collections::VecDeque;

use crate::raft::Entry;

/// The newest log entries in memory, with their encoded sizes: a
/// contiguous run of indexes ending at the log's last entry, or empty.
/// Every append pushes its entries; every truncation and purge removes
/// theirs, so a cached entry is always the one the segment files hold at
/// its index.
#[derive(Debug)]
pub(super) struct TailCache {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    limit: usize,
    /// Reads served from memory (the tests check that the cache serves).
    hits: u64,
}

impl TailCache {
    pub(super) fn new(limit: usize) -> Self {
        TailCache {
            entries: VecDeque::new(),
            bytes: 0,
            limit,
            hits: 0,
        }
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Adds the entry appended after the current last one. An entry that
    /// does not follow it (the log was truncated or jumped past a snapshot
    /// without this cache seeing it) starts a new run; one larger than the
    /// whole cache leaves it empty. The oldest entries go past the limit.
    pub(super) fn push(&mut self, entry: Entry, size: usize) {
        let follows = self
            .entries
            .back()
            .is_none_or(|(last, _)| last.log_id.index.checked_add(1) == Some(entry.log_id.index));
        if !follows || size > self.limit {
            self.clear();
        }
        if size > self.limit {
            return;
        }
        self.bytes += size;
        self.entries.push_back((entry, size));
        while self.bytes > self.limit {
            let Some((_, oldest)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= oldest;
        }
    }

    /// Drops the entries after `last` (all of them for `None`).
    pub(super) fn truncate_after(&mut self, last: Option<u64>) {
        while let Some((entry, size)) = self.entries.back() {
            if last.is_some_and(|last| entry.log_id.index <= last) {
                break;
            }
            self.bytes -= size;
            self.entries.pop_back();
        }
    }

    /// Drops the entries up to and including `upto`.
    pub(super) fn purge(&mut self, upto: u64) {
        while let Some((entry, size)) = self.entries.front() {
            if entry.log_id.index > upto {
                break;
            }
            self.bytes -= size;
            self.entries.pop_front();
        }
    }

    /// The entries in `[start, end)` (`end` `None`: to the last) under the
    /// same byte rule as the engine read, if the cache holds all of them.
    pub(super) fn read(
        &mut self,
        start: u64,
        end: Option<u64>,
        max_bytes: usize,
    ) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.0.log_id.index;
        let after_last = self.entries.back()?.0.log_id.index + 1;
        let end = end.unwrap_or(after_last);
        if start < first || end > after_last {
            return None;
        }
        self.hits += 1;
        if start >= end {
            return Some(Vec::new());
        }
        let mut entries = Vec::new();
        let mut bytes = 0;
        let from = usize::try_from(start - first).ok()?;
        for (entry, size) in self.entries.range(from..) {
            if entry.log_id.index >= end {
                break;
            }
            entries.push(entry.clone());
            bytes += size;
            if bytes >= max_bytes {
                break;
            }
        }
        Some(entries)
    }
}

#[cfg(test)]
impl TailCache {
    /// Reads served from memory so far.
    pub(super) fn hits(&self) -> u64 {
        self.hits
    }

    /// Asserts that the byte count is the cached entries' and within the
    /// bound.
    pub(super) fn assert_consistent(&self) {
        assert!(self.bytes <= self.limit);
        assert_eq!(
            self.bytes,
            self.entries.iter().map(|(_, size)| size).sum::<usize>()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::log_store::testing::{entry_of, indexes};

    #[test]
    fn the_tail_cache_keeps_a_contiguous_run_within_its_bound() {
        let mut tail = TailCache::new(1_000);
        for index in 1..=5 {
            tail.push(entry_of(1, index, 10), 300);
        }
        let held = |tail: &TailCache| -> Vec<u64> {
            tail.entries.iter().map(|(e, _)| e.log_id.index).collect()
        };
        assert_eq!(held(&tail), vec![3, 4, 5], "the oldest go past the bound");
        assert_eq!(tail.read(2, None, usize::MAX), None, "not all cached");
        assert_eq!(
            tail.read(7, None, usize::MAX),
            Some(Vec::new()),
            "past the last"
        );
        let read = tail.read(3, Some(5), usize::MAX).expect("cached");
        assert_eq!(indexes(&read), vec![3, 4]);
        tail.push(entry_of(2, 9, 10), 300);
        assert_eq!(held(&tail), vec![9], "a gap starts a new run");
        tail.push(entry_of(2, 10, 10), 2_000);
        assert_eq!(held(&tail), Vec::<u64>::new(), "larger than the cache");
        tail.push(entry_of(2, 11, 10), 300);
        tail.push(entry_of(2, 12, 10), 300);
        tail.truncate_after(Some(11));
        assert_eq!(held(&tail), vec![11]);
        tail.purge(11);
        assert_eq!((held(&tail), tail.bytes), (Vec::new(), 0));
    }
}

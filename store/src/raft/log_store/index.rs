//! The log's state in memory ([`LogIndex`]): what its records say, replayed
//! at open and kept up to date by every write.

use std::collections::VecDeque;
use std::io;

use super::records::{
    decode, entry_log_id, KIND_COMMITTED, KIND_ENTRY, KIND_PURGED, KIND_TRUNCATE, KIND_VOTE,
};
use crate::raft::{LogId, Vote};
use crate::wal::Location;

/// The log's state, as replayed from its records and kept since.
#[derive(Debug, Default)]
pub(super) struct LogIndex {
    /// Where each live entry is, the first at index `first`.
    pub(super) locations: VecDeque<Location>,
    pub(super) first: u64,
    /// The last live entry's log id.
    pub(super) last: Option<LogId>,
    pub(super) purged: Option<LogId>,
    pub(super) vote: Option<Vote>,
    pub(super) committed: Option<LogId>,
    /// `committed` changed since it was last written.
    pub(super) committed_unwritten: bool,
}

impl LogIndex {
    /// Takes one record into the state (opening, and every write).
    pub(super) fn apply(&mut self, kind: u8, payload: &[u8], at: Location) -> io::Result<()> {
        match kind {
            KIND_ENTRY => {
                let log_id = entry_log_id(payload)?;
                self.push_entry(log_id, at);
            }
            KIND_TRUNCATE => self.truncate_after(decode(payload, "a truncation")?),
            KIND_VOTE => self.vote = Some(decode(payload, "the vote")?),
            KIND_COMMITTED => self.committed = decode(payload, "the commit index")?,
            KIND_PURGED => self.purge(decode(payload, "the purge point")?),
            other => {
                return Err(io::Error::other(format!(
                    "raft log: unknown record kind {other}"
                )))
            }
        }
        Ok(())
    }

    pub(super) fn next_index(&self) -> u64 {
        self.first + self.locations.len() as u64
    }

    /// An entry follows the last one; one at or before it replaces the
    /// entries from its index; one after a gap starts the log again there
    /// (older segments were removed; [`LogIndex::check`] says whether the
    /// purge point explains the gap).
    fn push_entry(&mut self, log_id: LogId, at: Location) {
        let index = log_id.index;
        if self.locations.is_empty() || index < self.first || index > self.next_index() {
            self.locations.clear();
            self.first = index;
        } else {
            self.locations.truncate((index - self.first) as usize);
        }
        self.locations.push_back(at);
        self.last = Some(log_id);
    }

    fn truncate_after(&mut self, last: Option<LogId>) {
        let keep = last
            .map_or(0, |l| l.index + 1)
            .saturating_sub(self.first)
            .min(self.locations.len() as u64);
        if keep as usize == self.locations.len() {
            return;
        }
        self.locations.truncate(keep as usize);
        self.last = if self.locations.is_empty() {
            None
        } else {
            last
        };
    }

    fn purge(&mut self, upto: LogId) {
        let drop = (upto.index + 1)
            .saturating_sub(self.first)
            .min(self.locations.len() as u64);
        self.locations.drain(..drop as usize);
        self.first = self.first.max(upto.index + 1);
        if self.locations.is_empty() {
            self.last = None;
        }
        self.purged = Some(upto);
    }

    /// After opening: the live entries start right after the purge point.
    pub(super) fn check(&self) -> io::Result<()> {
        if let (Some(purged), false) = (self.purged, self.locations.is_empty()) {
            if self.first != purged.index + 1 {
                return Err(io::Error::other(format!(
                    "raft log: entries start at {} but the purge point is {}: a segment is missing",
                    self.first, purged.index
                )));
            }
        }
        Ok(())
    }
}

//! The log itself ([`Log`]): its segment files and the state their records
//! give, opened by replaying them; writing records, and finding entries.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::index::LogIndex;
use super::records::{entry_record, ENTRY_PREFIX_BYTES, KIND_COMMITTED, KIND_ENTRY, STICKY_KINDS};
use crate::codec;
use crate::raft::Entry;
use crate::wal::{Location, Wal, WalOptions};

/// The log: its files and what their records say.
#[derive(Debug)]
pub(super) struct Log {
    pub(super) wal: Wal,
    pub(super) index: LogIndex,
}

impl Log {
    /// Writes records and takes them into the state.
    pub(super) fn write(&mut self, records: &[(u8, &[u8])]) -> io::Result<()> {
        let locations = self.wal.append(records)?;
        for ((kind, payload), at) in records.iter().zip(locations) {
            self.index.apply(*kind, payload, at)?;
        }
        Ok(())
    }

    /// The files and places of the live entries in `[start, end)` (`end`
    /// `None`: to the last), up to the one that brings their encoded size
    /// to `max_bytes`.
    pub(super) fn locate(
        &self,
        start: u64,
        end: Option<u64>,
        max_bytes: usize,
    ) -> io::Result<Vec<(Arc<std::fs::File>, Location)>> {
        let index = &self.index;
        let start = start.max(index.first);
        let end = end.map_or(index.next_index(), |e| e.min(index.next_index()));
        let mut found = Vec::new();
        let mut bytes = 0;
        for i in start..end {
            let at = index.locations[(i - index.first) as usize];
            found.push((self.wal.file_of(at)?, at));
            bytes += at.len as usize - ENTRY_PREFIX_BYTES;
            if bytes >= max_bytes {
                break;
            }
        }
        Ok(found)
    }

    /// The segment holding the oldest live entry (the one written to when
    /// no entry is live): every older segment can go.
    pub(super) fn oldest_needed_segment(&self) -> u64 {
        self.index
            .locations
            .front()
            .map_or(self.wal.current_segment(), |at| at.segment)
    }
}

pub(super) fn lock_log(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn open_log(dir: &Path, options: WalOptions) -> io::Result<Log> {
    let mut index = LogIndex::default();
    let wal = Wal::open(dir, options, &mut |kind, payload, at| {
        index.apply(kind, payload, at)
    })?;
    index.check()?;
    Ok(Log { wal, index })
}

pub(super) fn log_options() -> WalOptions {
    WalOptions {
        sticky_kinds: STICKY_KINDS.to_vec(),
        ..WalOptions::default()
    }
}

/// Appends entry records (and the commit index, when it changed) unsynced.
/// Returns each entry's encoded size.
pub(super) fn write_entries(log: &mut Log, entries: &[Entry]) -> io::Result<Vec<usize>> {
    let encoded: Vec<(Vec<u8>, usize)> = entries.iter().map(entry_record).collect();
    let committed = log
        .index
        .committed_unwritten
        .then(|| codec::encode(&log.index.committed));
    let mut records: Vec<(u8, &[u8])> = Vec::with_capacity(entries.len() + 1);
    if let Some(committed) = &committed {
        records.push((KIND_COMMITTED, committed));
    }
    records.extend(encoded.iter().map(|(p, _)| (KIND_ENTRY, &p[..])));
    log.write(&records)?;
    log.index.committed_unwritten = false;
    Ok(encoded.into_iter().map(|(_, size)| size).collect())
}

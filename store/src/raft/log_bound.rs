//! The Raft log bounded in bytes as well as in entries.
//!
//! openraft snapshots the state machine every `--snapshot-count` entries.
//! Entries are batches of proposals, so an entry count says little about
//! bytes: under a put load of 1 KiB values, 10,000 entries held about
//! 140 MB, and a log that never reached the count was never purged
//! (1.6 GiB after a million puts). This task does the purging (openraft's
//! own, after each snapshot, is off: it could not hold entries for a
//! member being caught up).
//!
//! Every [`CHECK_INTERVAL`], it looks at the log:
//! - past the last snapshot, more than [`LOG_BYTES_PER_SNAPSHOT`]: it asks
//!   openraft for a snapshot (as the entry count would);
//! - at or below the last snapshot, it purges what lies beyond
//!   [`CATCH_UP_LOG_BYTES`] or beyond `SNAPSHOT_CATCH_UP_ENTRIES` entries
//!   (at most `--snapshot-count`), whichever purges more (a follower
//!   further behind gets the snapshot instead);
//! - on the leader, no purge past the lowest snapshot being sent to a
//!   member ([`super::snapshot_holds`]), unless that keeps more than
//!   [`HELD_LOG_BYTES`] behind the last snapshot.
//!
//! Worked example, 14 KB entries: 64 MiB past the snapshot is about 4,800
//! entries, so a snapshot comes every ~4,800 entries instead of every
//! 10,000; after it, 64 MiB of entries (~4,800) stay behind it, fewer than
//! the 5,000 the entry bound would keep, and the log's files stay under
//! about 128 MiB plus one segment. The snapshot is a checkpoint of the
//! engine (hard links), so its cost does not grow with how often it runs.

use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::watch;

use super::log_store::LogStore;
use super::snapshot_holds::SnapshotHolds;
use super::snapshot_holds::HELD_LOG_BYTES;
use super::Raft;

/// Bytes of log entries past the last snapshot that make the next one.
pub const LOG_BYTES_PER_SNAPSHOT: u64 = 64 * 1024 * 1024;
/// Bytes of log entries kept at or below the last snapshot, so a follower
/// a little behind catches up from the log rather than a snapshot.
pub const CATCH_UP_LOG_BYTES: u64 = 64 * 1024 * 1024;
/// How often the bounds are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What to ask openraft for, from the log's bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Actions {
    /// Build a snapshot now.
    pub snapshot: bool,
    /// Purge the log up to this index.
    pub purge_upto: Option<u64>,
}

/// The log's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// [`LOG_BYTES_PER_SNAPSHOT`].
    pub per_snapshot: u64,
    /// [`CATCH_UP_LOG_BYTES`].
    pub catch_up: u64,
    /// Entries kept behind the last snapshot.
    pub catch_up_entries: u64,
    /// [`HELD_LOG_BYTES`].
    pub held: u64,
}

impl Bounds {
    /// A member's bounds, keeping `catch_up_entries` entries behind the
    /// last snapshot.
    pub fn member(catch_up_entries: u64) -> Bounds {
        Bounds {
            per_snapshot: LOG_BYTES_PER_SNAPSHOT,
            catch_up: CATCH_UP_LOG_BYTES,
            catch_up_entries,
            held: HELD_LOG_BYTES,
        }
    }
}

/// Decides from the snapshot's index, the purge point, the lowest index
/// held for a member being sent a snapshot, and the log store.
pub fn decide(
    log: &LogStore,
    bounds: Bounds,
    snapshot: Option<u64>,
    purged: Option<u64>,
    held: Option<u64>,
) -> Actions {
    let past = log.bytes_after(snapshot.unwrap_or(0));
    let purge_upto = snapshot
        .and_then(|at| {
            let by_bytes = log.purge_point_keeping(at, bounds.catch_up);
            // Purging up to `at - n` keeps the `n` entries up to `at`.
            let by_entries = at.checked_sub(bounds.catch_up_entries);
            let bounded = by_bytes.max(by_entries)?;
            let Some(held) = held else {
                return Some(bounded);
            };
            // Past `bounds.held` bytes, the member gets a newer snapshot.
            let allowed = match log.purge_point_keeping(at, bounds.held) {
                Some(beyond) => held.max(beyond),
                None => held,
            };
            Some(bounded.min(allowed))
        })
        .filter(|upto| purged.is_none_or(|p| *upto > p));
    Actions {
        snapshot: past > bounds.per_snapshot,
        purge_upto,
    }
}

/// Checks the bounds every [`CHECK_INTERVAL`] until `stop` turns true.
pub fn spawn(
    raft: Raft,
    log: LogStore,
    bounds: Bounds,
    holds: SnapshotHolds,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut requested_at: Option<u64> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_INTERVAL) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let metrics = raft.metrics().borrow_watched().clone();
            let snapshot = metrics.snapshot.map(|l| l.index);
            let purged = metrics.purged.map(|l| l.index);
            // Only a leader has replication metrics, and holds.
            let held = metrics.replication.as_ref().and_then(|replication| {
                let matched = replication
                    .iter()
                    .map(|(id, m)| (*id, m.as_ref().map(|l| l.index)))
                    .collect();
                holds.lowest(&matched, Instant::now())
            });
            let actions = decide(&log, bounds, snapshot, purged, held);
            // One request per snapshot: a snapshot being built is not in
            // the metrics yet, and asking again would queue another.
            if actions.snapshot && requested_at != Some(snapshot.unwrap_or(0)) {
                requested_at = Some(snapshot.unwrap_or(0));
                tracing::info!(
                    bytes = log.bytes_after(snapshot.unwrap_or(0)),
                    "raft log past its byte bound; snapshotting"
                );
                if raft.trigger().snapshot().await.is_err() {
                    return;
                }
            }
            if let Some(upto) = actions.purge_upto {
                if raft.trigger().purge_log(upto).await.is_err() {
                    return;
                }
            }
        }
    });
}

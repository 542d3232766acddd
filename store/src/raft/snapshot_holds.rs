//! Log entries the leader keeps for a member that a snapshot is catching
//! up.
//!
//! A member sent the snapshot at index `S` goes on from the log at `S + 1`.
//! The log's bounds ([`super::log_bound`]) purge behind the leader's
//! *newest* snapshot, and under writes the leader snapshots every 64 MiB of
//! log: more often than a large snapshot takes to send (2.6 s at a million
//! keys of 1 KiB, tens of seconds at eight million). Without a hold the
//! entries after `S` were gone by the time the member had installed it, and
//! the leader sent it a second whole snapshot: a learner that joined at the
//! end of a load was promoted after 2.7 s and served after 5.6 s, its data
//! directory twice the store's size (and under a steady load a member
//! could chase snapshots for good).
//!
//! So [`super::network`] records a hold at `S` when it starts sending a
//! snapshot, and the log bound purges no entry after the lowest hold,
//! unless that would keep more than [`HELD_LOG_BYTES`] (a member that far
//! behind gets a newer snapshot, as before). A hold ends once the member's
//! matched index (openraft's replication metrics) reaches `S`, once the
//! member is no longer replicated to (removed), or after [`HOLD_MAX_AGE`]
//! (a send that failed and was never retried).
//!
//! Worked example: the leader sends snapshot 39,199 to a learner; during
//! the 2.6 s send it snapshots again at 42,517 and would purge up to 40,000
//! (64 MiB behind 42,517). The hold caps the purge at 39,199: once the
//! learner has installed the snapshot it replicates 39,200 onward from the
//! log; when its matched index reaches 39,199 the hold ends and the next
//! check purges as usual.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::types::NodeId;

/// Most bytes of entries behind the newest snapshot the leader keeps for a
/// member being caught up (beside the 64 MiB it always keeps).
pub const HELD_LOG_BYTES: u64 = 1024 * 1024 * 1024;
/// Longest a hold lasts without the member reaching it.
pub const HOLD_MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// The leader's holds, one per member being sent a snapshot (cheap to
/// clone: one shared map).
#[derive(Clone, Debug, Default)]
pub struct SnapshotHolds(Arc<Mutex<BTreeMap<NodeId, Hold>>>);

/// One member's hold.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// The index of the snapshot sent: entries after it are held.
    index: u64,
    since: Instant,
}

impl SnapshotHolds {
    /// Holds the entries after `index` for `member` (replacing its hold,
    /// if it had one).
    pub fn hold(&self, member: NodeId, index: u64) {
        self.map().insert(
            member,
            Hold {
                index,
                since: Instant::now(),
            },
        );
    }

    /// The lowest index still held, at `now`, given each replicated
    /// member's matched index (`matched`; None: nothing matched yet). A
    /// hold ends first if its member has reached its snapshot, is no longer
    /// replicated to (removed), or the hold is older than [`HOLD_MAX_AGE`].
    pub fn lowest(&self, matched: &BTreeMap<NodeId, Option<u64>>, now: Instant) -> Option<u64> {
        let mut holds = self.map();
        holds.retain(|member, hold| {
            let waiting = matched
                .get(member)
                .is_some_and(|m| m.is_none_or(|m| m < hold.index));
            waiting && now.saturating_duration_since(hold.since) < HOLD_MAX_AGE
        });
        holds.values().map(|h| h.index).min()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Hold>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lasts_until_the_member_matches_it_or_it_ages() {
        let holds = SnapshotHolds::default();
        holds.hold(4, 39_199);
        holds.hold(5, 40_000);
        holds.hold(6, 1);
        let now = Instant::now();
        let mut matched = BTreeMap::from([(4, None), (5, Some(10))]);
        assert_eq!(holds.lowest(&matched, now), Some(39_199), "6 was removed");
        matched.insert(4, Some(39_199));
        assert_eq!(
            holds.lowest(&matched, now),
            Some(40_000),
            "4 reached its snapshot"
        );
        assert_eq!(
            holds.lowest(&matched, now + HOLD_MAX_AGE),
            None,
            "5 aged out"
        );
        assert_eq!(holds.lowest(&matched, now), None);
    }
}

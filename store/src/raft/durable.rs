//! The durable end of the local log, so the leader can replicate an entry
//! while its own fsync of that entry is still running.
//!
//! openraft 0.9's core awaits the log store's flush callback before it
//! hands new entries to the replication tasks. Had the leader's callback
//! waited for its fsync, every write would pay two fsyncs in series (the
//! leader's, then a follower's) plus a round trip, and the core would sit
//! idle during each leader fsync. etcd writes its WAL and sends to
//! followers in parallel. We do the same, without weakening what an
//! acknowledged write means:
//!
//! 1. **Early flush on the leader.** When the leader appends entries of its
//!    own term ([`super::log_store`] checks the entries' leader id against
//!    the vote it last saved), the log store writes them unsynced, queues
//!    them for the group-commit flusher and completes openraft's callback at
//!    once. openraft counts the leader in the quorum from then on, so it may
//!    consider an entry committed when one follower has it on disk while the
//!    leader's own fsync is still in flight.
//! 2. **Nothing is applied before a quorum has it on disk.** The state
//!    machine applies an entry only after [`DurableLog::wait`] says the local
//!    log is durable up to it. On the leader, committed (a follower has it
//!    synced) plus durable here means two synced copies: a majority of
//!    three, and in general the leader plus a majority minus one. Answers to
//!    clients, watch events and reads all come from applied state, so none
//!    of them can show a write that a crash of the machines could still lose.
//! 3. **Followers never learn a commit index beyond the leader's durable
//!    end.** Followers apply what the leader says is committed. The peer
//!    client clamps `leader_commit` of every AppendEntries to
//!    [`DurableLog::clamp_commit`], so a follower's applied state too only
//!    holds entries synced on the leader and on itself. When a clamp held a
//!    follower back, the flusher's next sync wakes the announcer
//!    ([`DurableLog::spawn_announcer`]), which asks openraft for a heartbeat
//!    carrying the now-durable commit index, so a follower does not wait a
//!    heartbeat interval for it.
//!
//! Followers' appends keep the plain protocol: the callback completes after
//! the fsync, because a follower's acknowledgement counts towards commit.
//! If the leader loses power before its fsync, it loses entries nobody has
//! applied, exactly like uncommitted entries in plain Raft. The WAL is one
//! file shared with the state machine's writes, and RocksDB recovers a
//! prefix of it, so an applied write that survives a crash implies its log
//! entry survived too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use openraft::LogId;
use tokio::sync::{watch, Notify};

use super::types::NodeId;
use super::Raft;

/// What is durable in the local log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    /// The last log id known to be on disk.
    pub last: Option<LogId<NodeId>>,
    /// A sync failed: nothing after `last` will ever become durable.
    pub failed: bool,
    /// Bumped by every truncation: a sync of appends made before a
    /// truncation says nothing about the entries that replaced them.
    pub generation: u64,
}

/// Why a wait for durability ended without it.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// An fsync of the log failed.
    #[error("syncing the raft log failed")]
    SyncFailed,
    /// The log store (and its flusher) is gone.
    #[error("the raft log was closed")]
    Closed,
}

/// The durable end of the local log, shared by the log store (which
/// advances it), the state machine (which waits for it) and the peer client
/// (which clamps the commit index it sends to it).
pub struct DurableLog {
    state: watch::Sender<Durable>,
    /// A commit index was clamped since the last sync.
    clamped: AtomicBool,
    /// Wakes the announcer (after a sync that follows a clamp, or on close).
    announce: Notify,
    closed: AtomicBool,
}

impl DurableLog {
    /// A log whose entries up to `last` are durable.
    pub fn new(last: Option<LogId<NodeId>>) -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(Durable {
                last,
                failed: false,
                generation: 0,
            }),
            clamped: AtomicBool::new(false),
            announce: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// What is durable now.
    pub fn current(&self) -> Durable {
        *self.state.borrow()
    }

    /// A sync made everything up to `upto`, appended in `generation`,
    /// durable. Never moves backwards, and ignores appends of an earlier
    /// generation (cut off by a truncation since).
    pub fn advance(&self, upto: LogId<NodeId>, generation: u64) {
        self.state.send_if_modified(|d| {
            let newer =
                d.generation == generation && d.last.is_none_or(|last| upto.index > last.index);
            if newer {
                d.last = Some(upto);
            }
            newer
        });
        if self.clamped.swap(false, Ordering::AcqRel) {
            self.announce.notify_one();
        }
    }

    /// The log was cut back to end at `last` by a synced write: everything
    /// it still holds is durable, and nothing beyond `last` is.
    pub fn truncated_to(&self, last: Option<LogId<NodeId>>) {
        self.state.send_modify(|d| {
            d.last = last;
            d.generation += 1;
        });
    }

    /// A sync failed; every waiter fails from now on.
    pub fn fail(&self) {
        self.state.send_modify(|d| d.failed = true);
    }

    /// The log store is gone: the announcer stops.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.announce.notify_one();
    }

    /// Waits until the log is durable up to `index`.
    pub async fn wait(&self, index: u64) -> Result<(), DurableError> {
        let mut rx = self.state.subscribe();
        let durable = rx
            .wait_for(|d| d.failed || d.last.is_some_and(|l| l.index >= index))
            .await
            .map_err(|_| DurableError::Closed)?;
        if durable.last.is_some_and(|l| l.index >= index) {
            Ok(())
        } else {
            Err(DurableError::SyncFailed)
        }
    }

    /// The commit index the leader may tell followers: `commit`, or the
    /// durable end of its own log when that is behind (see the module docs).
    pub fn clamp_commit(&self, commit: Option<LogId<NodeId>>) -> Option<LogId<NodeId>> {
        let c = commit?;
        let durable = self.current().last;
        if durable.is_some_and(|d| d.index >= c.index) {
            return commit;
        }
        self.clamped.store(true, Ordering::Release);
        // A sync may have advanced between the read and the flag; check
        // again so a follower is never left waiting for an announcement.
        let durable = self.current().last;
        if durable.is_some_and(|d| d.index >= c.index) {
            return commit;
        }
        durable
    }

    /// Spawns the task that sends a heartbeat after a sync that follows a
    /// clamp, so followers learn the commit index without waiting for the
    /// next write or heartbeat. Ends when the log store closes.
    pub fn spawn_announcer(self: &Arc<Self>, raft: Raft) {
        let log = self.clone();
        tokio::spawn(async move {
            loop {
                log.announce.notified().await;
                if log.closed.load(Ordering::Acquire) {
                    return;
                }
                if raft.trigger().heartbeat().await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[tokio::test]
    async fn waits_until_durable_and_never_moves_back() {
        let log = DurableLog::new(Some(id(1, 3)));
        log.wait(3).await.unwrap();
        let waiter = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.wait(5).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        log.advance(id(1, 4), 0);
        log.advance(id(1, 2), 0);
        assert_eq!(log.current().last, Some(id(1, 4)));
        log.advance(id(2, 5), 0);
        waiter.await.unwrap().unwrap();
        log.truncated_to(Some(id(1, 4)));
        assert_eq!(log.current().last, Some(id(1, 4)));
        log.truncated_to(Some(id(1, 3)));
        assert_eq!(log.current().last, Some(id(1, 3)));
        log.advance(id(1, 9), 0);
        assert_eq!(
            log.current().last,
            Some(id(1, 3)),
            "appended before a truncation"
        );
        log.advance(id(3, 9), 2);
        assert_eq!(log.current().last, Some(id(3, 9)));
    }

    #[tokio::test]
    async fn a_failed_sync_fails_waiters() {
        let log = DurableLog::new(None);
        let waiter = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.wait(1).await })
        };
        tokio::task::yield_now().await;
        log.fail();
        assert!(matches!(
            waiter.await.unwrap(),
            Err(DurableError::SyncFailed)
        ));
    }

    #[test]
    fn commit_is_clamped_to_the_durable_end() {
        let log = DurableLog::new(Some(id(1, 5)));
        assert_eq!(log.clamp_commit(None), None);
        assert_eq!(log.clamp_commit(Some(id(1, 4))), Some(id(1, 4)));
        assert_eq!(log.clamp_commit(Some(id(1, 5))), Some(id(1, 5)));
        assert_eq!(log.clamp_commit(Some(id(1, 7))), Some(id(1, 5)));
        assert!(log.clamped.load(Ordering::Acquire));
        log.advance(id(1, 7), 0);
        assert!(!log.clamped.load(Ordering::Acquire), "a sync announces");
        assert_eq!(log.clamp_commit(Some(id(1, 7))), Some(id(1, 7)));
    }
}

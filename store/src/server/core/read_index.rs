//! The linearizable read barrier (ReadIndex), on every member.
//!
//! The leader confirms it is still leader with a quorum heartbeat round and
//! takes its commit index as the read index (openraft's
//! `get_read_log_id`); a follower asks the leader for that index over the
//! peer protocol. The serving member then waits until it has applied up to
//! the read index and reads its own state. Serializable reads skip this.
//!
//! Rounds are shared ([`crate::raft::read_index`]): every linearizable read
//! queued on the leader while a round runs joins the next round, so N
//! concurrent readers cost one quorum round, not N.
//!
//! On a follower, the reads that queue while earlier ReadIndex requests
//! are out share the next one ([`crate::server::to_leader::read_index_batch`]).
//!
//! A read whose ReadIndex is still outstanding when this member sees the
//! leader change (a new leader, or none while an election runs) does not
//! wait for an answer from a leader that may be stopped or cut off: it asks
//! again, of the next leader, within its deadline (a read is safe to
//! retry, and the new ReadIndex is taken after the call began, so the read
//! stays linearizable). etcd fails such a read at once with `etcdserver:
//! leader changed` and leaves the retry to its clients; clients that do not
//! retry (etcdctl, the Rust and Python clients) saw it fail during every
//! leadership hand-over, a rolling upgrade's included. If no leader emerges
//! before the deadline the read still fails with etcd's `leader changed`.

use openraft::async_runtime::WatchReceiver as _;
use tokio::time::Instant;

use crate::errors::EtcdError;
use crate::raft::read_index::ReadIndexError;
use crate::raft::NodeId;
use crate::server::core::Core;
use crate::server::to_leader::forward::ForwardError;

impl Core {
    /// Passes a linearizable read barrier: afterwards this member's state
    /// includes every write acknowledged before the call began.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let mut leader_changed = false;
        loop {
            let Some(leader) = self.wait_leader(deadline).await else {
                return Err(if leader_changed {
                    EtcdError::LeaderChanged
                } else {
                    EtcdError::NoLeader
                });
            };
            let attempt = async {
                if leader == self.config.member_id {
                    self.read_index_local().await
                } else {
                    self.read_index_remote(leader, deadline).await
                }
            };
            let index = tokio::select! {
                index = attempt => index,
                () = self.leader_changed_from(leader, deadline) => {
                    leader_changed = true;
                    continue;
                }
            };
            match index {
                Ok(index) => return self.wait_applied(index, deadline).await,
                Err(e) => self.before_retry(e, deadline).await?,
            }
        }
    }

    /// Returns once this member's view of the leader is no longer `leader`;
    /// never returns before `deadline` otherwise (the read times out on its own).
    pub(in crate::server) async fn leader_changed_from(&self, leader: NodeId, deadline: Instant) {
        let changed = tokio::time::timeout_at(deadline, self.leader_watch.changed_from(leader));
        if changed.await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// ReadIndex on the leader: confirm leadership, return the read index.
    /// Concurrent callers share one confirmation round: a caller joins the
    /// next round to start after it arrived (never one already in flight,
    /// which might predate a write the caller saw acknowledged).
    pub async fn read_index_local(&self) -> Result<u64, ForwardError> {
        self.read_rounds.read_index().await.map_err(|e| match e {
            ReadIndexError::NotLeader(leader) => ForwardError::NotLeader(leader),
            ReadIndexError::Timeout => ForwardError::Etcd(EtcdError::Timeout),
            ReadIndexError::Stopped => ForwardError::Etcd(EtcdError::Stopped),
        })
    }

    /// ReadIndex from `leader`, shared with the other reads waiting on this
    /// member (see [`crate::server::to_leader::read_index_batch`]).
    async fn read_index_remote(
        &self,
        leader: NodeId,
        deadline: Instant,
    ) -> Result<u64, ForwardError> {
        let client = self.peer(leader)?;
        self.remote_reads.read_index(leader, client, deadline).await
    }

    /// Waits until this member has applied `index` (or `deadline`).
    pub async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), EtcdError> {
        let applied = self
            .raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map_or(0, |l| l.index);
        if applied >= index {
            return Ok(());
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|_| EtcdError::Timeout)
    }
}

//! ReadIndex rounds on the leader, shared by concurrent readers.
//!
//! A round confirms leadership with one quorum heartbeat round (openraft's
//! `get_read_log_id`) and yields the commit index as the read index. Every
//! reader that queued while a round ran joins the next one: never a round
//! already in flight, which might predate a write the reader saw
//! acknowledged. So N concurrent readers cost one quorum round, not N.

use std::time::Duration;

use openraft::error::{LinearizableReadError, RaftError};
use openraft::ReadPolicy;
use tokio::sync::{mpsc, oneshot};

use super::elections::TransferGate;
use super::{NodeId, Raft};

/// Why a ReadIndex round gave no index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadIndexError {
    /// This member does not lead (it may know who does).
    NotLeader(Option<NodeId>),
    /// No quorum confirmed leadership in time.
    Timeout,
    /// Raft stopped.
    Stopped,
}

type Waiter = oneshot::Sender<Result<u64, ReadIndexError>>;

/// Linearizable reads waiting for the next ReadIndex round on this member;
/// beyond this, readers wait to enqueue (backpressure, not memory).
pub const READ_INDEX_QUEUE: usize = 16_384;

/// The queue of readers waiting for the next round (one per member).
pub struct ReadRounds {
    waiters: mpsc::Sender<Waiter>,
}

impl ReadRounds {
    /// Starts the task that runs rounds; each round passes `gate` and is
    /// bounded by `round_timeout`.
    pub fn spawn(raft: Raft, gate: TransferGate, round_timeout: Duration) -> Self {
        let (waiters, rx) = mpsc::channel(READ_INDEX_QUEUE);
        tokio::spawn(run_rounds(raft, gate, round_timeout, rx));
        Self { waiters }
    }

    /// Joins the next round and returns its read index.
    pub async fn read_index(&self) -> Result<u64, ReadIndexError> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .send(tx)
            .await
            .map_err(|_| ReadIndexError::Stopped)?;
        rx.await.map_err(|_| ReadIndexError::Stopped)?
    }
}

/// Runs rounds: takes every waiter queued so far, confirms leadership once
/// for all of them, answers them all.
async fn run_rounds(
    raft: Raft,
    gate: TransferGate,
    round_timeout: Duration,
    mut rx: mpsc::Receiver<Waiter>,
) {
    let mut waiters = Vec::new();
    while rx.recv_many(&mut waiters, READ_INDEX_QUEUE).await > 0 {
        // A leadership transfer holds rounds back: their heartbeats would
        // renew the followers' leader lease (see crate::server::transfer).
        let round = async {
            let _gate = gate.enter().await;
            confirm(&raft).await
        };
        let result = tokio::time::timeout(round_timeout, round)
            .await
            .unwrap_or(Err(ReadIndexError::Timeout));
        for w in waiters.drain(..) {
            let _ = w.send(result);
        }
    }
}

async fn confirm(raft: &Raft) -> Result<u64, ReadIndexError> {
    // ReadIndex: the answer comes once a quorum acknowledged a heartbeat
    // sent after the request (no lease-based shortcut).
    match raft.get_read_log_id(ReadPolicy::ReadIndex).await {
        Ok((read_log_id, _applied)) => Ok(read_log_id.index()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
            Err(ReadIndexError::NotLeader(f.leader_id))
        }
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
            Err(ReadIndexError::Timeout)
        }
        Err(RaftError::Fatal(_)) => Err(ReadIndexError::Stopped),
    }
}

//! ReadIndex rounds on the leader, shared by concurrent readers.
//!
//! A round confirms leadership with one quorum heartbeat round (openraft's
//! `get_read_log_id`) and yields the commit index as the read index. Every
//! reader that queued while a round ran joins the next one: never a round
//! already in flight, which might predate a write the reader saw
//! acknowledged. So N concurrent readers cost one quorum round, not N.
//!
//! A round that no quorum confirms within [`READ_INDEX_RETRY`] is sent
//! again (a new heartbeat round), as etcd's read loop re-sends its
//! ReadIndex every `readIndexRetryTime`, until the round's timeout (etcd's
//! request timeout): a member starved of CPU for a moment, a heartbeat lost
//! or late, delays reads instead of failing them. openraft alone would fail
//! the read once its leader lease (`election_timeout_max`, 500 ms at etcd's
//! default election timeout) passed without a quorum's acknowledgement;
//! under a heavy load that answered some reads "request timed out" after
//! about a second. As in etcd, each re-send is logged ("waiting for ReadIndex
//! response took too long, retrying"), a round that times out counts in
//! `etcd_server_slow_read_indexes_total` and one that ends because this
//! member does not lead in `etcd_server_read_indexes_failed_total`.

use std::time::Duration;

use openraft::error::{LinearizableReadError, RaftError};
use openraft::LinearizerOption;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

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

/// How long one attempt of a round waits for a quorum to acknowledge a
/// heartbeat sent after it, before the round sends another (etcd's
/// `readIndexRetryTime`, 500 ms).
pub const READ_INDEX_RETRY: Duration = Duration::from_millis(500);

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
        let server = &crate::metrics::global().server;
        match result {
            Err(ReadIndexError::Timeout) => {
                server.slow_read_indexes.inc();
            }
            Err(ReadIndexError::NotLeader(_)) => {
                server.read_indexes_failed.inc();
            }
            Ok(_) | Err(ReadIndexError::Stopped) => {}
        }
        for w in waiters.drain(..) {
            let _ = w.send(result);
        }
    }
}

/// One round: attempts until one gets a quorum's confirmation (the
/// caller bounds the whole round with its timeout).
async fn confirm(raft: &Raft) -> Result<u64, ReadIndexError> {
    loop {
        let started = Instant::now();
        match attempt(raft).await {
            Attempt::Confirmed(index) => return Ok(index),
            Attempt::Failed(e) => return Err(e),
            Attempt::Unconfirmed => {
                tracing::warn!(
                    retry_timeout_ms = READ_INDEX_RETRY.as_millis() as u64,
                    "waiting for ReadIndex response took too long, retrying"
                );
                // Attempts start at most one per READ_INDEX_RETRY, even if
                // one came back early.
                tokio::time::sleep_until(started + READ_INDEX_RETRY).await;
            }
        }
    }
}

/// What one ReadIndex attempt came to.
enum Attempt {
    Confirmed(u64),
    /// No quorum acknowledged a heartbeat sent after the attempt in time.
    Unconfirmed,
    Failed(ReadIndexError),
}

async fn attempt(raft: &Raft) -> Attempt {
    // ReadIndex: the answer comes once a quorum acknowledged a heartbeat
    // sent after the request (no lease-based shortcut), waiting at most
    // READ_INDEX_RETRY for it.
    let option =
        LinearizerOption::new(Some(Duration::ZERO), true).with_wait_timeout(READ_INDEX_RETRY);
    match raft.get_read_log_id(option).await {
        Ok((read_log_id, _applied)) => Attempt::Confirmed(read_log_id.index()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
            Attempt::Failed(ReadIndexError::NotLeader(f.leader_id))
        }
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => Attempt::Unconfirmed,
        Err(RaftError::Fatal(_)) => Attempt::Failed(ReadIndexError::Stopped),
    }
}

//! Batched forwarding on followers: concurrent proposals travel to the
//! leader in one message of the follower's forward stream
//! ([`crate::server::to_leader::forward_stream`]; a unary `Forward` call when the leader has
//! none).
//!
//! A follower serving many writers would otherwise send one peer request
//! per write, and the leader would decode, schedule and answer each one. The
//! forward batcher queues proposals and sends everything queued so far (for
//! the same leader, up to [`MAX_PROPOSALS_PER_FORWARD`] proposals and
//! [`MAX_FORWARD_BYTES`]) as one [`LeaderRequest::ProposeBatch`]; the leader
//! proposes them all at once, so they usually share one log entry (see
//! [`crate::raft::batcher`]), and answers each. At most
//! [`MAX_FORWARDS_IN_FLIGHT`] batches are in flight; while they are,
//! proposals queue and form the next batch, so a lone writer waits for no
//! timer.
//!
//! Failures keep the single-proposal rules: a batch that provably never
//! reached the leader is retried by every proposer (after the leader is
//! re-learned); any other transport failure answers each with etcd's
//! timeout error, since the batch may have been applied.

use std::sync::Arc;

use crate::raft::network::PeerClient;
use tokio::time::Instant;

use crate::errors::EtcdError;
use crate::raft::{CommandResponse, NodeId, Proposal};
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};
use crate::server::to_leader::forward_stream::ForwardStreams;
use crate::server::to_leader::leader_lane::{forward_batch, LeaderLane, ToLeader};

/// Proposals per forwarded batch, at most.
pub const MAX_PROPOSALS_PER_FORWARD: usize = 1_024;

/// Encoded proposal bytes per forwarded batch, at most (a batch holds at
/// least one proposal): the size of a log entry's batch.
pub const MAX_FORWARD_BYTES: usize = crate::raft::batcher::MAX_ENTRY_BYTES;

/// Batches sent to the leader and not yet answered. Each forward costs
/// per batch (the message, the leader's scheduling, the answers'
/// wake-ups), so fewer and larger batches cost less per write. Measured
/// with two clusters loaded at the same time (so that the machine's speed
/// swings hit both, `scripts/ab-cpu.sh`), 128 and 256 clients spread over
/// the members, when each batch was a unary peer call: 2 took 4-7% less
/// CPU per put than 4 at the same throughput; 1 was mixed (throughput -2%
/// to +3%).
pub const MAX_FORWARDS_IN_FLIGHT: usize = 2;

/// Proposals waiting to be forwarded; beyond this, proposers wait to
/// enqueue (backpressure, not memory).
pub const FORWARD_QUEUE: usize = 16_384;

/// A follower's forwarding queue (one per member; idle on the leader).
pub struct ForwardBatcher {
    lane: LeaderLane<Proposal, CommandResponse>,
    streams: Arc<ForwardStreams>,
}

impl ForwardBatcher {
    /// Starts the forwarding task; batches go on `streams` when they can.
    pub fn spawn(streams: Arc<ForwardStreams>) -> Self {
        let sending = streams.clone();
        let lane = LeaderLane::spawn(
            (FORWARD_QUEUE, MAX_FORWARDS_IN_FLIGHT),
            (MAX_PROPOSALS_PER_FORWARD, MAX_FORWARD_BYTES),
            |item: &ToLeader<Proposal, CommandResponse>| item.payload.size_bytes(),
            move |items| send(items, sending.clone()),
        );
        Self { lane, streams }
    }

    /// Forwards `proposal` to `leader` (through `client`) in the next batch,
    /// or alone from this task when nothing is queued and no batch is out
    /// (see [`crate::batching::Lane::direct_permit`]); the leader's answer.
    pub async fn forward(
        &self,
        leader: NodeId,
        client: PeerClient,
        proposal: Proposal,
        deadline: Instant,
    ) -> Result<CommandResponse, ForwardError> {
        self.lane
            .ask((leader, client), proposal, deadline, |items| {
                send(items, self.streams.clone())
            })
            .await
    }
}

async fn send(items: Vec<ToLeader<Proposal, CommandResponse>>, streams: Arc<ForwardStreams>) {
    forward_batch(
        items,
        &streams,
        LeaderRequest::ProposeBatch,
        |reply, count| match reply {
            LeaderReply::AppliedBatch(results) if results.len() == count => Ok(results),
            other => {
                tracing::error!(
                    ?other,
                    "the leader answered a forwarded batch with another reply"
                );
                Err(ForwardError::Etcd(EtcdError::Timeout))
            }
        },
    )
    .await;
}

//! Batched lease renewals on followers: concurrent KeepAlives travel to the
//! leader in one forwarded request (a message of the forward stream,
//! [`crate::server::to_leader::forward_stream`]).
//!
//! A KeepAlive renews its lease on the leader, so a follower forwards it.
//! One peer RPC per renewal made a follower's KeepAlives cost 2-3x the
//! leader's: 64 clients renewing through one follower got 13,000-18,000
//! renewals/s, through the leader 36,000-42,000/s (3 members, 2 cores). The
//! renewals queue on a [`crate::server::to_leader::leader_lane`]: everything queued while
//! earlier requests are out goes to the leader as one
//! [`LeaderRequest::LeaseRenewBatch`] (at most [`MAX_RENEWS_PER_FORWARD`]),
//! at most [`MAX_RENEW_FORWARDS_IN_FLIGHT`] at a time; the leader confirms
//! its leadership once for the batch and renews each lease. A lone renewal
//! goes at once, as [`LeaderRequest::LeaseRenew`].
//!
//! A renewal is idempotent (it restarts the same clock), so a failed batch
//! answers every renewal with the failure and the callers retry as they
//! would a single one.

use std::sync::Arc;

use crate::raft::network::PeerClient;
use tokio::time::Instant;

use crate::errors::EtcdError;
use crate::raft::NodeId;
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};
use crate::server::to_leader::forward_stream::ForwardStreams;
use crate::server::to_leader::leader_lane::{forward_batch, Answers, LeaderLane, ToLeader};

/// Renewals per forwarded batch, at most (8 bytes each).
pub const MAX_RENEWS_PER_FORWARD: usize = 4_096;

/// Batches sent to the leader and not yet answered (as for forwarded
/// writes, [`crate::server::to_leader::forward_batch::MAX_FORWARDS_IN_FLIGHT`]).
pub const MAX_RENEW_FORWARDS_IN_FLIGHT: usize = 2;

/// Renewals waiting to be forwarded; beyond this, callers wait to enqueue
/// (backpressure, not memory).
pub const RENEW_QUEUE: usize = 16_384;

/// A lease's TTL after a renewal, or `None` if it does not exist.
type Renewed = Option<i64>;

/// A follower's queue of lease renewals (one per member; idle on the
/// leader).
pub struct KeepAliveBatcher {
    lane: LeaderLane<i64, Renewed>,
    streams: Arc<ForwardStreams>,
}

impl KeepAliveBatcher {
    /// Starts the batching task; batches go on `streams` when they can.
    pub fn spawn(streams: Arc<ForwardStreams>) -> Self {
        let sending = streams.clone();
        let lane = LeaderLane::spawn(
            (RENEW_QUEUE, MAX_RENEW_FORWARDS_IN_FLIGHT),
            (MAX_RENEWS_PER_FORWARD, usize::MAX),
            |_: &ToLeader<i64, Renewed>| 0,
            move |items| send(items, sending.clone()),
        );
        Self { lane, streams }
    }

    /// Renews lease `id` on `leader` (through `client`): alone from this
    /// task when nothing is queued and no batch is out, else in the next
    /// batch.
    pub async fn renew(
        &self,
        leader: NodeId,
        client: PeerClient,
        id: i64,
        deadline: Instant,
    ) -> Result<Renewed, ForwardError> {
        let streams = self.streams.clone();
        let send_now = |items| send(items, streams);
        self.lane
            .ask((leader, client), id, deadline, send_now)
            .await
    }
}

/// The request for `ids`: a lone renewal as a single one.
fn request_for(ids: Vec<i64>) -> LeaderRequest {
    match ids[..] {
        [id] => LeaderRequest::LeaseRenew(id),
        _ => LeaderRequest::LeaseRenewBatch(ids),
    }
}

/// The renewals in `reply`, if it answers a request for `count` of them.
fn renewals(reply: LeaderReply, count: usize) -> Answers<Renewed> {
    let ttls = match reply {
        LeaderReply::LeaseRenewed(ttl) if count == 1 => vec![ttl],
        LeaderReply::LeaseRenewedBatch(ttls) if ttls.len() == count => ttls,
        other => {
            tracing::error!(
                ?other,
                "the leader answered forwarded renewals with another reply"
            );
            return Err(ForwardError::Etcd(EtcdError::Timeout));
        }
    };
    Ok(ttls.into_iter().map(Ok).collect())
}

async fn send(items: Vec<ToLeader<i64, Renewed>>, streams: Arc<ForwardStreams>) {
    forward_batch(items, &streams, request_for, renewals).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_renewal_travels_as_a_single_one() {
        assert!(matches!(request_for(vec![7]), LeaderRequest::LeaseRenew(7)));
        assert!(matches!(
            request_for(vec![7, 8]),
            LeaderRequest::LeaseRenewBatch(ids) if ids == vec![7, 8]
        ));
    }

    #[test]
    fn a_reply_must_answer_every_renewal() {
        let ttls = |r: Answers<Renewed>| -> Vec<Renewed> {
            r.unwrap().into_iter().map(Result::unwrap).collect()
        };
        assert_eq!(
            ttls(renewals(LeaderReply::LeaseRenewed(Some(5)), 1)),
            vec![Some(5)]
        );
        let batch = LeaderReply::LeaseRenewedBatch(vec![Some(5), None]);
        assert_eq!(ttls(renewals(batch, 2)), vec![Some(5), None]);
        let short = LeaderReply::LeaseRenewedBatch(vec![Some(5)]);
        assert!(renewals(short, 2).is_err());
        assert!(renewals(LeaderReply::LeaseRenewed(Some(5)), 2).is_err());
        assert!(renewals(LeaderReply::ClusterId(1), 1).is_err());
    }
}

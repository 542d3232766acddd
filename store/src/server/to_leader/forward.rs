//! What a member asks of the leader over `storepeer.RaftPeer/Forward` (or a
//! message of `ForwardStream`, [`crate::server::to_leader::forward_stream`]), what
//! the leader answers, and how a failed forward is classified.
//!
//! A follower never applies a write itself: it forwards the proposal (or a
//! lease renewal, a membership change, ...) to the leader it knows and waits
//! for the leader's answer. Whether a failed forward may be retried is
//! decided from the failure's kind ([`ForwardError::retryable`]), never from
//! message text: a request that provably never reached the leader is
//! retried once the leader is re-learned; one that may have reached it is
//! answered with etcd's timeout error, so a write is never applied twice.

use etcd_proto::storepeer::RaftMessage;
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::errors::EtcdError;
use crate::raft::{CommandResponse, MemberInfo, NodeId, Proposal};

/// Why the leader refused a forwarded request or read index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardError {
    /// The receiver is not the leader (it may know who is), or the request
    /// provably never reached it: retry once the leader is known.
    NotLeader(Option<NodeId>),
    /// An etcd error to return to the client as is.
    Etcd(EtcdError),
}

impl ForwardError {
    /// True if the request did not take effect and may be sent again.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::NotLeader(_))
    }
}

impl From<EtcdError> for ForwardError {
    fn from(e: EtcdError) -> Self {
        Self::Etcd(e)
    }
}

/// What a member asks of the leader over `storepeer.RaftPeer/Forward`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LeaderRequest {
    /// Replicate a command.
    Propose(Proposal),
    /// Replicate several commands (a follower's batch, see
    /// [`crate::server::to_leader::forward_batch`]); each is answered on its own.
    ProposeBatch(Vec<Proposal>),
    /// Restart a lease's clock (KeepAlive).
    LeaseRenew(i64),
    /// Read a lease's remaining time (TimeToLive).
    LeaseTimeToLive(i64),
    /// Change the Raft membership (MemberAdd, MemberRemove, MemberUpdate).
    ChangeMembership(ChangeMembers<NodeId, MemberInfo>),
    /// Promote a learner that has caught up (MemberPromote).
    Promote(NodeId),
    /// The cluster id; any member answers (used by joining members).
    ClusterId,
    /// The member's HashKV at a revision (0: its current one); any member
    /// answers (the corruption checks of [`crate::server::duties::corruption`]).
    HashKv(i64),
    /// Restart several leases' clocks (a follower's batch of KeepAlives,
    /// see [`crate::server::to_leader::keepalive_batch`]); each is answered on its own.
    LeaseRenewBatch(Vec<i64>),
    /// The member's server version; any member answers (the leader's
    /// cluster version monitor, [`crate::server::duties::versions`]).
    ServerVersion,
}

impl LeaderRequest {
    /// True if sending the request again cannot change its effect: a
    /// renewal restarts the same clock, the others only read.
    pub fn idempotent(&self) -> bool {
        match self {
            LeaderRequest::LeaseRenew(_)
            | LeaderRequest::LeaseRenewBatch(_)
            | LeaderRequest::LeaseTimeToLive(_)
            | LeaderRequest::ClusterId
            | LeaderRequest::ServerVersion
            | LeaderRequest::HashKv(_) => true,
            LeaderRequest::Propose(_)
            | LeaderRequest::ProposeBatch(_)
            | LeaderRequest::ChangeMembership(_)
            | LeaderRequest::Promote(_) => false,
        }
    }
}

/// A member's HashKV answer, for the corruption checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerHash {
    /// The member that hashed.
    pub member_id: NodeId,
    /// etcd's HashKV.
    pub hash: u32,
    /// The member's compaction revision.
    pub compact_revision: i64,
    /// The revision hashed.
    pub revision: i64,
}

/// A lease's time to live as the leader knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTtl {
    /// The TTL it was granted with, in seconds.
    pub granted_ttl_seconds: i64,
    /// Seconds left.
    pub remaining_seconds: i64,
    /// The keys attached to it.
    pub keys: Vec<Vec<u8>>,
}

/// The leader's answer to a [`LeaderRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LeaderReply {
    /// The state machine's answer to a proposed command.
    Applied(CommandResponse),
    /// The answers to a [`LeaderRequest::ProposeBatch`], in its order.
    AppliedBatch(Vec<Result<CommandResponse, ForwardError>>),
    /// The lease's TTL, or None if it does not exist.
    LeaseRenewed(Option<i64>),
    /// The lease's time to live, or None if it does not exist.
    LeaseTtl(Option<LeaseTtl>),
    /// A membership change was committed.
    MembershipChanged,
    /// The cluster id.
    ClusterId(u64),
    /// A HashKV answer, or None if that revision cannot be hashed there.
    HashKv(Option<PeerHash>),
    /// The answers to a [`LeaderRequest::LeaseRenewBatch`], in its order:
    /// each lease's TTL, or None if it does not exist.
    LeaseRenewedBatch(Vec<Option<i64>>),
    /// A member's server version (`3.6.14`).
    ServerVersion(String),
}

/// A [`LeaderReply`] of the kind one [`LeaderRequest`] expects.
pub trait ReplyKind: Sized {
    /// The expected answer inside `reply`, or `reply` back if it is of
    /// another kind.
    fn from_reply(reply: LeaderReply) -> Result<Self, LeaderReply>;
}

macro_rules! reply_kind {
    ($t:ty, $variant:ident) => {
        impl ReplyKind for $t {
            fn from_reply(reply: LeaderReply) -> Result<Self, LeaderReply> {
                match reply {
                    LeaderReply::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}

reply_kind!(CommandResponse, Applied);
reply_kind!(Option<i64>, LeaseRenewed);
reply_kind!(Option<LeaseTtl>, LeaseTtl);
reply_kind!(u64, ClusterId);

impl ReplyKind for () {
    fn from_reply(reply: LeaderReply) -> Result<Self, LeaderReply> {
        match reply {
            LeaderReply::MembershipChanged => Ok(()),
            other => Err(other),
        }
    }
}

/// Decodes the leader's answer to a forwarded request. An answer that does
/// not decode leaves the outcome unknown: etcd's timeout error.
pub fn decode_reply(payload: &[u8]) -> Result<LeaderReply, ForwardError> {
    codec::decode::<Result<LeaderReply, ForwardError>>(payload).map_err(|error| {
        tracing::error!(%error, "a forwarded request's answer does not decode");
        ForwardError::Etcd(EtcdError::Timeout)
    })?
}

/// Encodes a forwarded request for the peer RPC.
pub fn encode_request(req: &LeaderRequest) -> RaftMessage {
    RaftMessage {
        payload: codec::encode(req),
    }
}

/// A failed peer call. A connection that could not be made, and a request
/// the leader refused for its peer protocol (a leader restarted on a build
/// that speaks less, see [`crate::raft::peer_protocol`]), delivered
/// nothing, so retrying (after the leader is re-learned, in the protocol
/// its refusal announced) is safe; any other failure may have delivered
/// the write, so the client gets etcd's timeout error instead of a
/// possible duplicate.
pub fn transport_failure(status: &tonic::Status) -> ForwardError {
    let unconnected = status.code() == tonic::Code::Unavailable && never_connected(status);
    if unconnected || crate::raft::peer_protocol::refused(status) {
        ForwardError::NotLeader(None)
    } else {
        ForwardError::Etcd(EtcdError::TimeoutDueToConnectionLost)
    }
}

/// True if `status` was caused by a connection that was never established
/// (refused, unreachable, or timed out while connecting): the I/O error at
/// the bottom of its source chain says so.
fn never_connected(status: &tonic::Status) -> bool {
    use std::io::ErrorKind;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::AddrNotAvailable
            );
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::storepeer::raft_peer_client::RaftPeerClient;

    #[tokio::test]
    async fn a_refused_connection_is_retryable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy();
        let status = RaftPeerClient::new(channel)
            .forward(encode_request(&LeaderRequest::ClusterId))
            .await
            .expect_err("nothing listens there");
        assert!(
            transport_failure(&status).retryable(),
            "a refused connection delivered nothing: {status:?}"
        );
    }

    /// A member that refused the request's protocol read nothing of it.
    #[test]
    fn a_refused_protocol_is_retryable() {
        let refused = crate::server::peer::check_peer_protocol({
            let mut request = tonic::Request::new(());
            let agent = "etcd-rs-store/9.9.9 peer-protocol/99"
                .parse()
                .expect("ascii");
            request.metadata_mut().insert("user-agent", agent);
            request
        })
        .expect_err("protocol 99 is refused");
        assert!(transport_failure(&refused).retryable(), "{refused:?}");
        let other = tonic::Status::failed_precondition("something else");
        assert!(!transport_failure(&other).retryable());
    }

    #[test]
    fn other_failures_are_not_retried() {
        let status = tonic::Status::unavailable("connection reset while reading the answer");
        assert!(!transport_failure(&status).retryable());
        let status = tonic::Status::deadline_exceeded("timeout");
        assert!(!transport_failure(&status).retryable());
    }

    #[test]
    fn replies_of_another_kind_are_told_apart() {
        assert_eq!(u64::from_reply(LeaderReply::ClusterId(7)).ok(), Some(7));
        assert!(<()>::from_reply(LeaderReply::ClusterId(7)).is_err());
        assert!(decode_reply(&[0xff, 0xff]).is_err());
    }
}

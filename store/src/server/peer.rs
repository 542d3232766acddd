//! `storepeer.RaftPeer`, the member-to-member service (kept apart from the
//! client services): hands Raft messages to openraft, runs forwarded
//! requests and ReadIndex on the leader, and takes leadership-transfer
//! messages.

use std::sync::Arc;

use etcd_proto::storepeer::raft_peer_server::RaftPeer;
use etcd_proto::storepeer::RaftMessage;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::core::Core;
use super::corruption::own_hash;
use super::forward::{ForwardError, LeaderReply, LeaderRequest};
use super::transfer;
use crate::codec;
use crate::raft::{NodeId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

/// Serves `storepeer.RaftPeer` for one member.
pub struct PeerService {
    core: Arc<Core>,
}

impl PeerService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

/// Counts a Raft message's bytes in `etcd_network_peer_received_bytes_total`
/// under the sender's id in hex (`From`; "0" when the message names none).
fn count_received(from: Option<NodeId>, bytes: usize) {
    let from = vec![("From", format!("{:x}", from.unwrap_or(0)))];
    crate::metrics::global()
        .network
        .peer_received
        .get_or_create(&from)
        .inc_by(bytes as u64);
}

/// [`reply`] to a Raft message, counting the answer's bytes in
/// `etcd_network_peer_sent_bytes_total` under the sender's id (`To`).
fn counted_reply<T: serde::Serialize>(
    to: Option<NodeId>,
    value: &T,
) -> Result<Response<RaftMessage>, Status> {
    let answer = reply(value)?;
    let to = vec![("To", format!("{:x}", to.unwrap_or(0)))];
    crate::metrics::global()
        .network
        .peer_sent
        .get_or_create(&to)
        .inc_by(answer.get_ref().payload.len() as u64);
    Ok(answer)
}

fn decode<T: serde::de::DeserializeOwned>(req: Request<RaftMessage>) -> Result<T, Status> {
    codec::decode(&req.into_inner().payload)
        .map_err(|e| Status::invalid_argument(format!("bad peer payload: {e}")))
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    Ok(Response::new(RaftMessage {
        payload: codec::encode(value),
    }))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let bytes = req.get_ref().payload.len();
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        let from = rpc.vote.leader_id().voted_for();
        count_received(from, bytes);
        counted_reply(from, &self.core.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let bytes = req.get_ref().payload.len();
        let rpc: VoteRequest<NodeId> = decode(req)?;
        let from = rpc.vote.leader_id().voted_for();
        count_received(from, bytes);
        counted_reply(from, &self.core.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let bytes = req.get_ref().payload.len();
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req)?;
        let from = rpc.vote.leader_id().voted_for();
        count_received(from, bytes);
        counted_reply(from, &self.core.raft.install_snapshot(rpc).await)
    }

    async fn forward(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let request: LeaderRequest = decode(req)?;
        let result = if matches!(request, LeaderRequest::ClusterId) {
            Ok(LeaderReply::ClusterId(self.core.config.cluster_id))
        } else if let LeaderRequest::HashKv(rev) = request {
            Ok(LeaderReply::HashKv(own_hash(&self.core, rev)))
        } else if self.core.leader() == Some(self.core.config.member_id) {
            let deadline = Instant::now() + self.core.config.request_timeout;
            self.core.serve_as_leader(request, deadline).await
        } else {
            Err(ForwardError::NotLeader(self.core.leader()))
        };
        reply(&result)
    }

    async fn read_index(
        &self,
        _req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        reply(&self.core.read_index_local().await)
    }

    async fn leader_transfer(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        reply(&transfer::serve_peer(&self.core, decode(req)?))
    }
}

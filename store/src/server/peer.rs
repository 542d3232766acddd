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
use super::forward::{ForwardError, LeaderReply, LeaderRequest};
use super::transfer;
use crate::codec;

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
        let rpc = decode(req)?;
        reply(&self.core.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(req)?;
        reply(&self.core.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(req)?;
        reply(&self.core.raft.install_snapshot(rpc).await)
    }

    async fn forward(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let request: LeaderRequest = decode(req)?;
        let result = if matches!(request, LeaderRequest::ClusterId) {
            Ok(LeaderReply::ClusterId(self.core.config.cluster_id))
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

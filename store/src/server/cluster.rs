//! `etcdserverpb.Cluster`: MemberList from Raft membership and the
//! attributes members publish after start. Membership changes belong to the
//! cluster-management work and answer `Unimplemented` until then.

use std::sync::Arc;

use etcd_proto::etcdserverpb::cluster_server::Cluster;
use etcd_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use super::core::Core;
use crate::raft::state_machine::published_members;

/// Serves the Cluster API of one member.
pub struct ClusterService {
    core: Arc<Core>,
}

impl ClusterService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    fn members(&self) -> Result<Vec<Member>, Status> {
        let metrics = self.core.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let published = published_members(self.core.mvcc.engine().as_ref())
            .map_err(|e| Status::internal(e.to_string()))?;
        let voters: Vec<u64> = membership.voter_ids().collect();
        let mut out = Vec::new();
        for (id, node) in membership.nodes() {
            let attrs = published.iter().find(|a| a.id == *id);
            out.push(Member {
                id: *id,
                name: attrs.map(|a| a.name.clone()).unwrap_or_default(),
                peer_ur_ls: node.peer_urls.clone(),
                client_ur_ls: attrs.map(|a| a.client_urls.clone()).unwrap_or_default(),
                is_learner: !voters.contains(id),
            });
        }
        Ok(out)
    }
}

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not implemented yet"))
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        _r: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(not_yet("MemberAdd"))
    }

    async fn member_remove(
        &self,
        _r: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(not_yet("MemberRemove"))
    }

    async fn member_update(
        &self,
        _r: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(not_yet("MemberUpdate"))
    }

    async fn member_list(
        &self,
        r: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if r.into_inner().linearizable {
            self.core.read_barrier().await?;
        }
        Ok(Response::new(MemberListResponse {
            header: Some(self.core.header(self.core.mvcc.current_revision())),
            members: self.members()?,
        }))
    }

    async fn member_promote(
        &self,
        _r: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(not_yet("MemberPromote"))
    }
}

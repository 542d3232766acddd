//! `etcdserverpb.Cluster`: membership as etcd shows it, backed by openraft
//! membership changes (joint consensus).
//!
//! - MemberAdd: the new member's id is etcd's derivation from its peer URLs
//!   and the cluster token, so the member computes the same id when it starts
//!   with `--initial-cluster-state existing`. A learner is added as an
//!   openraft learner; a voter is added as a learner and then promoted.
//! - MemberPromote: refused until the learner's log matches 90% of the
//!   leader's, as etcd.
//! - MemberRemove: a voter is demoted, then removed; the last voter cannot be.
//! - MemberUpdate: replaces the member's peer URLs.
//! - MemberList: Raft membership plus the name and client URLs each member
//!   publishes after it starts.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;

use etcd_proto::etcdserverpb::cluster_server::Cluster;
use etcd_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::errors::EtcdError;
use crate::identity::member_id;
use crate::raft::state_machine::members::published_members;
use crate::raft::{MemberInfo, NodeId};
use crate::server::core::Core;
use openraft::ChangeMembers;

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
        let metrics = self.core.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let published = published_members(self.core.mvcc.engine().as_ref())?;
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

fn check_peer_urls(urls: &[String]) -> Result<(), EtcdError> {
    if urls.is_empty() {
        return Err(EtcdError::MemberBadUrls);
    }
    for u in urls {
        let parsed = url::Url::parse(u).map_err(|_| EtcdError::MemberBadUrls)?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none()
            || parsed.port().is_none()
        {
            return Err(EtcdError::MemberBadUrls);
        }
    }
    Ok(())
}

impl ClusterService {
    /// etcd's cluster server header: cluster, member and term, no revision.
    fn header(&self) -> Option<etcd_proto::etcdserverpb::ResponseHeader> {
        Some(self.core.header(0))
    }

    async fn change(&self, changes: ChangeMembers<NodeId, MemberInfo>) -> Result<(), Status> {
        Ok(self.core.change_members(changes).await?)
    }

    /// Waits until this member has applied a membership that satisfies
    /// `done` (a follower learns of the change a moment after the leader).
    async fn wait_membership(
        &self,
        done: impl Fn(&[Member]) -> bool,
    ) -> Result<Vec<Member>, Status> {
        let deadline = tokio::time::Instant::now() + self.core.config.request_timeout;
        let mut metrics = self.core.raft.metrics();
        loop {
            let members = self.members()?;
            if done(&members) {
                return Ok(members);
            }
            if tokio::time::timeout_at(deadline, metrics.changed())
                .await
                .is_err()
            {
                return Err(EtcdError::Timeout.into());
            }
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        r: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.core.check_admin(&r).await?;
        let r = r.into_inner();
        check_peer_urls(&r.peer_ur_ls)?;
        let current = self.members()?;
        if current
            .iter()
            .any(|m| m.peer_ur_ls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(EtcdError::PeerUrlExist.into());
        }
        let id = member_id(&r.peer_ur_ls, &self.core.config.cluster_token);
        if current.iter().any(|m| m.id == id) {
            return Err(EtcdError::MemberExist.into());
        }
        let learners = current.iter().filter(|m| m.is_learner).count();
        if r.is_learner && learners >= self.core.config.max_learners {
            return Err(EtcdError::TooManyLearners.into());
        }
        let info = MemberInfo {
            name: String::new(),
            peer_urls: r.peer_ur_ls.clone(),
            client_urls: Vec::new(),
        };
        self.change(ChangeMembers::AddNodes([(id, info)].into_iter().collect()))
            .await?;
        if !r.is_learner {
            self.change(ChangeMembers::AddVoterIds([id].into_iter().collect()))
                .await?;
        }
        let learner = r.is_learner;
        let members = self
            .wait_membership(|ms| ms.iter().any(|m| m.id == id && m.is_learner == learner))
            .await?;
        let member = members.iter().find(|m| m.id == id).cloned();
        Ok(Response::new(MemberAddResponse {
            header: self.header(),
            member,
            members,
        }))
    }

    async fn member_remove(
        &self,
        r: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.core.check_admin(&r).await?;
        let id = r.into_inner().id;
        let current = self.members()?;
        let target = current
            .iter()
            .find(|m| m.id == id)
            .ok_or(EtcdError::MemberNotFound)?;
        if !target.is_learner {
            let voters = current.iter().filter(|m| !m.is_learner).count();
            if voters <= 1 {
                return Err(EtcdError::MemberNotEnoughStarted.into());
            }
            self.change(ChangeMembers::RemoveVoters([id].into_iter().collect()))
                .await?;
        }
        self.change(ChangeMembers::RemoveNodes([id].into_iter().collect()))
            .await?;
        let members = self
            .wait_membership(|ms| ms.iter().all(|m| m.id != id))
            .await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_update(
        &self,
        r: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.core.check_admin(&r).await?;
        let r = r.into_inner();
        check_peer_urls(&r.peer_ur_ls)?;
        let metrics = self.core.raft.metrics().borrow_watched().clone();
        let mut info = metrics
            .membership_config
            .membership()
            .get_node(&r.id)
            .cloned()
            .ok_or(EtcdError::MemberNotFound)?;
        if self
            .members()?
            .iter()
            .any(|m| m.id != r.id && m.peer_ur_ls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(EtcdError::PeerUrlExist.into());
        }
        info.peer_urls = r.peer_ur_ls.clone();
        self.change(ChangeMembers::SetNodes(
            [(r.id, info)].into_iter().collect(),
        ))
        .await?;
        let urls = r.peer_ur_ls.clone();
        let members = self
            .wait_membership(|ms| ms.iter().any(|m| m.id == r.id && m.peer_ur_ls == urls))
            .await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_list(
        &self,
        r: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if r.into_inner().linearizable {
            self.core.read_barrier().await?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: self.members()?,
        }))
    }

    async fn member_promote(
        &self,
        r: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.core.check_admin(&r).await?;
        let id = r.into_inner().id;
        self.core.promote(id).await?;
        let members = self
            .wait_membership(|ms| ms.iter().any(|m| m.id == id && !m.is_learner))
            .await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members,
        }))
    }
}

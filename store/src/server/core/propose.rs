//! Typed proposals: one method per command kind, each answering its own
//! response type or an [`EtcdError`] (a refusal by the state machine, such
//! as a Put naming an unknown lease, is folded into the error). A service
//! handler is check -> propose -> fill header, as etcd's `key.go` Put.

use etcd_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse,
};
use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::auth::{AuthCommand, AuthInfo, AuthReply};
use crate::errors::EtcdError;
use crate::raft::types::{Answer, MemberAttributes};
use crate::raft::{Command, CommandResponse, MemberInfo, NodeId, Proposal};
use crate::server::core::{wrong_kind, Core};
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest, LeaseTtl};

impl Core {
    /// KV.Put on behalf of `by`.
    pub async fn put(&self, by: AuthInfo, r: PutRequest) -> Result<PutResponse, EtcdError> {
        self.propose_as(by, Command::Put(r)).await
    }

    /// KV.DeleteRange on behalf of `by`.
    pub async fn delete_range(
        &self,
        by: AuthInfo,
        r: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EtcdError> {
        self.propose_as(by, Command::DeleteRange(r)).await
    }

    /// KV.Txn (one that writes) on behalf of `by`.
    pub async fn txn(&self, by: AuthInfo, r: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.propose_as(by, Command::Txn(r)).await
    }

    /// KV.Compact on behalf of `by`.
    pub async fn compact(
        &self,
        by: AuthInfo,
        r: CompactionRequest,
    ) -> Result<CompactionResponse, EtcdError> {
        self.propose_as(by, Command::Compact(r)).await
    }

    /// A compaction this member decided on (auto-compaction).
    pub async fn compact_own(&self, r: CompactionRequest) -> Result<CompactionResponse, EtcdError> {
        self.propose_own(Command::Compact(r)).await
    }

    /// Lease.LeaseGrant (id and TTL already chosen) on behalf of `by`.
    pub async fn lease_grant(
        &self,
        by: AuthInfo,
        r: LeaseGrantRequest,
    ) -> Result<LeaseGrantResponse, EtcdError> {
        self.propose_as(by, Command::LeaseGrant(r)).await
    }

    /// Lease.LeaseRevoke on behalf of `by`.
    pub async fn lease_revoke(
        &self,
        by: AuthInfo,
        r: LeaseRevokeRequest,
    ) -> Result<LeaseRevokeResponse, EtcdError> {
        self.propose_as(by, Command::LeaseRevoke(r)).await
    }

    /// Revokes a lease this member, as the leader, found expired: proposed
    /// here or not at all, never forwarded and never retried. The caller has
    /// confirmed leadership first ([`Core::confirm_leadership`]); should this
    /// member stop leading after that, the proposal fails (or its entry,
    /// from a superseded term, never commits). Forwarding would let a member
    /// whose deadlines are stale (a leader that was cut off while the new
    /// leader took the keep-alives) revoke, through the real leader, a lease
    /// that is being kept alive.
    pub async fn revoke_expired_lease(&self, id: i64) -> Result<(), ForwardError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let proposal = Proposal {
            by: None,
            cmd: Command::LeaseRevoke(LeaseRevokeRequest { id }),
        };
        match self
            .serve_as_leader(LeaderRequest::Propose(proposal), deadline)
            .await?
        {
            LeaderReply::Applied(CommandResponse::Error(e)) => Err(ForwardError::Etcd(e)),
            LeaderReply::Applied(_) => Ok(()),
            other => Err(ForwardError::Etcd(wrong_kind("a lease revoke", &other))),
        }
    }

    /// Maintenance.Alarm, or this member raising NOSPACE.
    pub async fn alarm(&self, r: AlarmRequest) -> Result<AlarmResponse, EtcdError> {
        self.propose_own(Command::Alarm(r)).await
    }

    /// A change to users, roles or the auth switch on behalf of `by`, or an
    /// Authenticate after the password check (`by` None).
    pub async fn auth(
        &self,
        by: Option<AuthInfo>,
        cmd: AuthCommand,
    ) -> Result<AuthReply, EtcdError> {
        self.submit(Proposal {
            by,
            cmd: Command::Auth(cmd),
        })
        .await
    }

    /// Authenticate, after the password check: the simple token (None with
    /// JWT, which the serving member signs) and the auth revision it was
    /// issued at.
    pub async fn authenticate(&self, cmd: AuthCommand) -> Result<(Option<String>, u64), EtcdError> {
        match self.auth(None, cmd).await? {
            AuthReply::Authenticated {
                simple_token,
                revision,
            } => Ok((simple_token, revision)),
            other => Err(wrong_kind("an Authenticate", &other)),
        }
    }

    /// Publishes this member's name and client URLs (etcd's "publish").
    pub async fn publish_member(&self, attributes: MemberAttributes) -> Result<(), EtcdError> {
        self.propose_own(Command::PublishMember(attributes)).await
    }

    /// Restarts a lease's clock on the leader: its TTL, None if it does not
    /// exist.
    pub async fn renew_lease(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        self.ask_leader(LeaderRequest::LeaseRenew(id)).await
    }

    /// A lease's time to live as the leader knows it.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<Option<LeaseTtl>, EtcdError> {
        self.ask_leader(LeaderRequest::LeaseTimeToLive(id)).await
    }

    /// Changes the Raft membership.
    pub async fn change_members(
        &self,
        changes: ChangeMembers<NodeId, MemberInfo>,
    ) -> Result<(), EtcdError> {
        self.ask_leader(LeaderRequest::ChangeMembership(changes))
            .await
    }

    /// Promotes a learner that has caught up.
    pub async fn promote(&self, id: NodeId) -> Result<(), EtcdError> {
        self.ask_leader(LeaderRequest::Promote(id)).await
    }

    /// Replicates a command of this member's own (no sender to check).
    pub(in crate::server) async fn propose_own<T: Answer>(
        &self,
        cmd: Command,
    ) -> Result<T, EtcdError> {
        self.submit(Proposal { by: None, cmd }).await
    }

    async fn propose_as<T: Answer>(&self, by: AuthInfo, cmd: Command) -> Result<T, EtcdError> {
        self.submit(Proposal { by: Some(by), cmd }).await
    }

    async fn submit<T: Answer>(&self, proposal: Proposal) -> Result<T, EtcdError> {
        let response: CommandResponse = self.ask_leader(LeaderRequest::Propose(proposal)).await?;
        match response {
            CommandResponse::Error(e) => Err(e),
            other => T::from_response(other).map_err(|other| wrong_kind("a proposal", &other)),
        }
    }
}

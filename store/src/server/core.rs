//! The member's core: what every client-facing service needs: propose a
//! write (locally on the leader, forwarded by followers), pass a
//! linearizable read barrier (ReadIndex), fill response headers.
//!
//! Write path: client -> any member -> (forward over the peer protocol if
//! not leader) -> leader `client_write` -> log append (group commit fsync)
//! -> replication to a quorum -> commit -> apply on the leader's state
//! machine -> response back along the same path.
//!
//! Linearizable reads: the leader confirms it is still leader with a quorum
//! heartbeat round and takes its commit index as the read index (openraft's
//! `get_read_log_id`); a follower asks the leader for that index over the
//! peer protocol. The serving member then waits until it has applied up to
//! the read index and reads its own state. Serializable reads skip this.

use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::ResponseHeader;
use etcd_proto::storepeer::raft_peer_client::RaftPeerClient;
use etcd_proto::storepeer::RaftMessage;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::transfer::{LeaderTransfer, TransferGate};
use crate::auth::{AuthInfo, AuthStore};
use crate::errors::EtcdError;
use crate::lease::Lessor;
use crate::mvcc::MvccStore;
use crate::raft::codec;
use crate::raft::network::{peer_client, PeerNetworkFactory};
use crate::raft::state_machine::nospace_raised;
use crate::raft::{Command, CommandResponse, MemberInfo, NodeId, Proposal, Raft};
use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::{AlarmRequest, AlarmType};

/// Why the leader refused a forwarded request or read index.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum ForwardError {
    /// The receiver is not the leader (it may know who is).
    NotLeader(Option<NodeId>),
    /// An etcd error to return to the client as is.
    Etcd(EtcdError),
}

/// What a member asks of the leader over `storepeer.RaftPeer/Forward`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum LeaderRequest {
    /// Replicate a command.
    Propose(Proposal),
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
}

/// The leader's answer to a [`LeaderRequest`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum LeaderReply {
    /// The state machine's answer to a proposed command.
    Applied(CommandResponse),
    /// The lease's TTL, or None if it does not exist.
    LeaseRenewed(Option<i64>),
    /// (granted TTL, remaining seconds, keys), or None if it does not exist.
    LeaseTtl(Option<(i64, i64, Vec<Vec<u8>>)>),
    /// A membership change was committed.
    MembershipChanged,
    /// The cluster id.
    ClusterId(u64),
}

/// etcd promotes a learner only once its log matches at least this share of
/// the leader's (`readyPercent = 0.9`).
const LEARNER_READY_PERCENT: u64 = 90;

/// Pause before retrying a proposal after the leader changed or is unknown:
/// a fraction of the heartbeat interval, so a new leader is found quickly
/// without spinning.
const LEADER_RETRY_PAUSE_MS: u64 = 20;

/// Static facts and limits the services need.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// This member.
    pub member_id: NodeId,
    /// The cluster.
    pub cluster_id: u64,
    /// `--initial-cluster-token` (member ids of added members derive from it).
    pub cluster_token: String,
    /// How long a request may wait for Raft.
    pub request_timeout: Duration,
    /// `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--quota-backend-bytes` (effective).
    pub quota_bytes: u64,
}

/// Shared by all services of one member.
pub struct Core {
    /// Static configuration.
    pub config: CoreConfig,
    /// The Raft handle.
    pub raft: Raft,
    /// The local state.
    pub mvcc: Arc<MvccStore>,
    /// The leases.
    pub lessor: Arc<Lessor>,
    /// Users, roles, tokens.
    pub auth: Arc<AuthStore>,
    peers: PeerNetworkFactory,
    read_rounds: mpsc::Sender<ReadIndexWaiter>,
    /// Leadership transfer (MoveLeader) state, see [`super::transfer`].
    pub transfer: LeaderTransfer,
}

type ReadIndexWaiter = oneshot::Sender<Result<u64, ForwardError>>;

/// Linearizable reads waiting for the next ReadIndex round on this member;
/// beyond this, readers wait to enqueue (backpressure, not memory).
const READ_INDEX_QUEUE: usize = 16_384;

/// Runs ReadIndex rounds: takes every waiter queued so far, confirms
/// leadership once for all of them, answers them all.
async fn run_read_rounds(
    raft: Raft,
    gate: TransferGate,
    round_timeout: Duration,
    mut rx: mpsc::Receiver<ReadIndexWaiter>,
) {
    let mut waiters = Vec::new();
    while rx.recv_many(&mut waiters, READ_INDEX_QUEUE).await > 0 {
        // A leadership transfer holds rounds back: their heartbeats would
        // renew the followers' leader lease (see super::transfer).
        let round = async {
            let _gate = gate.enter().await;
            Core::confirm_read_index(&raft).await
        };
        let result = match tokio::time::timeout(round_timeout, round).await {
            Ok(r) => r,
            Err(_) => Err(ForwardError::Etcd(EtcdError::Timeout)),
        };
        for w in waiters.drain(..) {
            let _ = w.send(result.clone());
        }
    }
}

impl Core {
    /// Wires the core.
    pub fn new(
        config: CoreConfig,
        raft: Raft,
        mvcc: Arc<MvccStore>,
        lessor: Arc<Lessor>,
        auth: Arc<AuthStore>,
        peers: PeerNetworkFactory,
    ) -> Arc<Self> {
        let (read_rounds, rx) = mpsc::channel(READ_INDEX_QUEUE);
        let transfer = LeaderTransfer::default();
        let gate = transfer.gate().clone();
        tokio::spawn(run_read_rounds(
            raft.clone(),
            gate,
            config.request_timeout,
            rx,
        ));
        Arc::new(Self {
            config,
            raft,
            mvcc,
            lessor,
            auth,
            peers,
            read_rounds,
            transfer,
        })
    }

    /// A response header for `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.config.cluster_id,
            member_id: self.config.member_id,
            revision,
            raft_term: self.raft.metrics().borrow().current_term,
        }
    }

    /// Fills cluster, member and term into a header the state machine made.
    pub fn fill(&self, header: &mut Option<ResponseHeader>) {
        let revision = header
            .as_ref()
            .map_or_else(|| self.mvcc.current_revision(), |h| h.revision);
        *header = Some(self.header(revision));
    }

    /// The current leader, if known.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// A client for member `id`. A member missing from this member's view
    /// of the membership (a leader that was just removed, or one not yet
    /// learned) is answered as "not leader", so callers retry once the
    /// leader is re-learned instead of failing the request.
    pub(crate) fn peer(&self, id: NodeId) -> Result<RaftPeerClient<Channel>, ForwardError> {
        let metrics = self.raft.metrics().borrow().clone();
        let node = metrics
            .membership_config
            .membership()
            .get_node(&id)
            .cloned();
        let channel = node
            .and_then(|node| self.peers.channel(id, &node).ok())
            .ok_or(ForwardError::NotLeader(None))?;
        Ok(peer_client(channel))
    }

    /// Waits (until `deadline`) for a known leader.
    async fn wait_leader(&self, deadline: Instant) -> Option<NodeId> {
        let mut rx = self.raft.metrics();
        loop {
            if let Some(l) = rx.borrow().current_leader {
                return Some(l);
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Replicates a command of this member's own (no sender to check) and
    /// returns the state machine's answer.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResponse, EtcdError> {
        self.submit(Proposal { by: None, cmd }).await
    }

    /// Replicates a client's command, checked against `by`'s permissions
    /// when applied.
    pub async fn propose_as(
        &self,
        by: AuthInfo,
        cmd: Command,
    ) -> Result<CommandResponse, EtcdError> {
        self.submit(Proposal { by: Some(by), cmd }).await
    }

    async fn submit(&self, proposal: Proposal) -> Result<CommandResponse, EtcdError> {
        match self.on_leader(LeaderRequest::Propose(proposal)).await? {
            LeaderReply::Applied(resp) => Ok(resp),
            other => unreachable!("the leader answered a proposal with {other:?}"),
        }
    }

    /// Runs `req` on the leader: here if this member leads, else forwarded.
    /// Retried while the leader is unknown or moving, until the request
    /// timeout.
    pub async fn on_leader(&self, req: LeaderRequest) -> Result<LeaderReply, EtcdError> {
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            let leader = self.wait_leader(deadline).await.ok_or(EtcdError::Timeout)?;
            let attempt = if leader == self.config.member_id {
                self.serve_as_leader(req.clone(), deadline).await
            } else {
                self.forward(leader, &req, deadline).await
            };
            match attempt {
                Ok(reply) => return Ok(reply),
                Err(ForwardError::Etcd(e)) => return Err(e),
                Err(ForwardError::NotLeader(_)) => {
                    if Instant::now() >= deadline {
                        return Err(EtcdError::Timeout);
                    }
                    tokio::time::sleep(Duration::from_millis(LEADER_RETRY_PAUSE_MS)).await;
                }
            }
        }
    }

    /// Serves a leader request on this member, if it leads.
    pub async fn serve_as_leader(
        &self,
        req: LeaderRequest,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        // A leadership transfer holds log writes back (see super::transfer).
        let _gate = self.transfer.gate().enter_until(deadline).await?;
        match req {
            LeaderRequest::Propose(cmd) => self
                .propose_local(cmd, deadline)
                .await
                .map(LeaderReply::Applied),
            LeaderRequest::LeaseRenew(id) => {
                self.require_primary()?;
                Ok(LeaderReply::LeaseRenewed(self.lessor.renew(id)))
            }
            LeaderRequest::LeaseTimeToLive(id) => {
                self.require_primary()?;
                Ok(LeaderReply::LeaseTtl(self.lessor.time_to_live(id)))
            }
            LeaderRequest::ChangeMembership(changes) => {
                self.change_membership(changes, deadline).await
            }
            LeaderRequest::Promote(id) => {
                self.check_learner_ready(id)?;
                let changes = ChangeMembers::AddVoterIds([id].into_iter().collect());
                self.change_membership(changes, deadline).await
            }
            LeaderRequest::ClusterId => Ok(LeaderReply::ClusterId(self.config.cluster_id)),
        }
    }

    async fn change_membership(
        &self,
        changes: ChangeMembers<NodeId, MemberInfo>,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        let change = self.raft.change_membership(changes, false);
        match tokio::time::timeout_at(deadline, change).await {
            Err(_) => Err(ForwardError::Etcd(EtcdError::Timeout)),
            Ok(Ok(_)) => Ok(LeaderReply::MembershipChanged),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ForwardError::NotLeader(f.leader_id))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                tracing::warn!(error = %e, "membership change refused");
                Err(ForwardError::Etcd(EtcdError::MemberNotFound))
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ForwardError::Etcd(EtcdError::Stopped)),
        }
    }

    /// etcd's `isLearnerReady`: the learner's matched log index is at
    /// least [`LEARNER_READY_PERCENT`] of the leader's last log index.
    fn check_learner_ready(&self, id: NodeId) -> Result<(), ForwardError> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(ForwardError::Etcd(EtcdError::MemberNotFound));
        }
        if membership.voter_ids().any(|v| v == id) {
            return Err(ForwardError::Etcd(EtcdError::MemberNotLearner));
        }
        let leader_index = m.last_log_index.unwrap_or(0);
        let matched = matched_index(&m, id);
        if matched * 100 < leader_index * LEARNER_READY_PERCENT {
            return Err(ForwardError::Etcd(EtcdError::LearnerNotReady));
        }
        Ok(())
    }

    fn require_primary(&self) -> Result<(), ForwardError> {
        if self.lessor.is_primary() {
            Ok(())
        } else {
            Err(ForwardError::NotLeader(self.leader()))
        }
    }

    /// Proposes on this member, which believes it is the leader.
    pub async fn propose_local(
        &self,
        cmd: Proposal,
        deadline: Instant,
    ) -> Result<CommandResponse, ForwardError> {
        match tokio::time::timeout_at(deadline, self.raft.client_write(cmd)).await {
            Err(_) => Err(ForwardError::Etcd(EtcdError::Timeout)),
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ForwardError::NotLeader(f.leader_id))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(_)))) => {
                Err(ForwardError::Etcd(EtcdError::NotCapable))
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ForwardError::Etcd(EtcdError::Stopped)),
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        req: &LeaderRequest,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        let mut client = self.peer(leader)?;
        let mut request = tonic::Request::new(RaftMessage {
            payload: codec::encode(req),
        });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match client.forward(request).await {
            Ok(reply) => decode_forward(&reply.into_inner().payload),
            Err(status) => Err(transport_failure(&status)),
        }
    }

    /// etcd's quota check before a write that grows the database: refused
    /// with NOSPACE while the alarm is raised, and raising it when the
    /// database plus this request would pass `--quota-backend-bytes`.
    pub async fn check_quota(&self, cost_bytes: u64) -> Result<(), tonic::Status> {
        let engine = self.mvcc.engine();
        if nospace_raised(engine.as_ref()).map_err(|e| tonic::Status::internal(e.to_string()))? {
            return Err(EtcdError::NoSpace.into());
        }
        let used = engine.tables_size_bytes(&crate::engine::Table::STATE_MACHINE);
        if used + cost_bytes <= self.config.quota_bytes {
            return Ok(());
        }
        let raise = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.config.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        self.propose(Command::Alarm(raise)).await?;
        Err(EtcdError::NoSpace.into())
    }

    /// Passes a linearizable read barrier: afterwards this member's state
    /// includes every write acknowledged before the call began.
    pub async fn read_barrier(&self) -> Result<(), EtcdError> {
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            let leader = self
                .wait_leader(deadline)
                .await
                .ok_or(EtcdError::NoLeader)?;
            let index = if leader == self.config.member_id {
                self.read_index_local().await
            } else {
                self.read_index_remote(leader, deadline).await
            };
            match index {
                Ok(index) => return self.wait_applied(index, deadline).await,
                Err(ForwardError::Etcd(e)) => return Err(e),
                Err(ForwardError::NotLeader(_)) => {
                    if Instant::now() >= deadline {
                        return Err(EtcdError::Timeout);
                    }
                    tokio::time::sleep(Duration::from_millis(LEADER_RETRY_PAUSE_MS)).await;
                }
            }
        }
    }

    /// ReadIndex on the leader: confirm leadership, return the read index.
    /// Concurrent callers share one confirmation round: a caller joins the
    /// next round to start after it arrived (never one already in flight,
    /// which might predate a write the caller saw acknowledged).
    pub async fn read_index_local(&self) -> Result<u64, ForwardError> {
        let (tx, rx) = oneshot::channel();
        self.read_rounds
            .send(tx)
            .await
            .map_err(|_| ForwardError::Etcd(EtcdError::Stopped))?;
        rx.await
            .map_err(|_| ForwardError::Etcd(EtcdError::Stopped))?
    }

    async fn confirm_read_index(raft: &Raft) -> Result<u64, ForwardError> {
        match raft.get_read_log_id().await {
            Ok((read_log_id, _applied)) => Ok(read_log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(e)) => match e {
                openraft::error::CheckIsLeaderError::ForwardToLeader(f) => {
                    Err(ForwardError::NotLeader(f.leader_id))
                }
                openraft::error::CheckIsLeaderError::QuorumNotEnough(_) => {
                    Err(ForwardError::Etcd(EtcdError::Timeout))
                }
            },
            Err(RaftError::Fatal(_)) => Err(ForwardError::Etcd(EtcdError::Stopped)),
        }
    }

    async fn read_index_remote(
        &self,
        leader: NodeId,
        deadline: Instant,
    ) -> Result<u64, ForwardError> {
        let mut client = self.peer(leader)?;
        let mut req = tonic::Request::new(RaftMessage {
            payload: Vec::new(),
        });
        req.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match client.read_index(req).await {
            Ok(reply) => codec::decode::<Result<u64, ForwardError>>(&reply.into_inner().payload)
                .map_err(|_| ForwardError::Etcd(EtcdError::Timeout))?,
            Err(status) => Err(transport_failure(&status)),
        }
    }

    /// Waits until this member has applied `index` (or `deadline`).
    pub async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), EtcdError> {
        let applied = self
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index);
        if applied >= index {
            return Ok(());
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|_| EtcdError::Timeout)
    }
}

/// A member's matched log index, as the leader's metrics report it (0 if
/// unknown or if this member does not lead).
pub fn matched_index(m: &openraft::RaftMetrics<NodeId, MemberInfo>, id: NodeId) -> u64 {
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map_or(0, |l| l.index)
}

fn decode_forward(payload: &[u8]) -> Result<LeaderReply, ForwardError> {
    codec::decode::<Result<LeaderReply, ForwardError>>(payload)
        .map_err(|_| ForwardError::Etcd(EtcdError::Timeout))?
}

/// A failed peer call. A connection that could not be made delivered
/// nothing, so retrying (after the leader is re-learned) is safe; any other
/// failure may have delivered the write, so the client gets etcd's timeout
/// error instead of a possible duplicate.
fn transport_failure(status: &tonic::Status) -> ForwardError {
    let not_delivered = status.code() == tonic::Code::Unavailable
        && (status.message().contains("connect")
            || status.message().contains("Connection refused"));
    if not_delivered {
        ForwardError::NotLeader(None)
    } else {
        ForwardError::Etcd(EtcdError::TimeoutDueToConnectionLost)
    }
}

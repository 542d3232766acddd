//! The member's core (etcd's `EtcdServer`): what every service needs. It
//! routes work to the leader (locally on the leader, forwarded by
//! followers), runs it there, and fills response headers. The typed
//! proposals are in [`crate::server::core::propose`], the read barrier in
//! [`crate::server::core::read_index`].
//!
//! Write path: service -> [`Core::put`] (and its siblings) -> `ask_leader`
//! -> here if this member leads, else forwarded over the peer protocol
//! ([`crate::server::to_leader::forward`]) to the leader's `serve_as_leader` -> openraft
//! `client_write` -> log append (group commit fsync) -> replication to a
//! quorum -> commit -> apply on the leader's state machine -> the typed
//! answer back along the same path.

pub mod caller;
pub mod propose;
pub mod quota;
pub mod read_index;
pub mod status;

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::{AlarmRequest, AlarmType, ResponseHeader};

use futures::future::join_all;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::alarm::RaisedCache;
use crate::auth::AuthStore;
use crate::cluster_version::ClusterStateCache;
use crate::engine::Table;
use crate::errors::EtcdError;
use crate::kv::KvError;
use crate::lease::Lessor;
use crate::mvcc::MvccStore;
use crate::raft::batcher::{BatchError, Batcher};
use crate::raft::elections::ElectionControl;
use crate::raft::leadership::LeaderContact;
use crate::raft::metrics::{self, matched_index, LeaderWatch};
use crate::raft::network::{peer_client, PeerClient, PeerNetworkFactory};
use crate::raft::peer_protocol::PeerChannel;
use crate::raft::read_index::ReadRounds;
use crate::raft::{Command, CommandResponse, MemberInfo, NodeId, Proposal, Raft};
use crate::server::core::quota::SizeGauge;
use crate::server::to_leader::forward::{
    decode_reply, encode_request, transport_failure, ForwardError, LeaderReply, LeaderRequest,
    LeaseTtl, PeerHash, ReplyKind,
};
use crate::server::to_leader::forward_batch::ForwardBatcher;
use crate::server::to_leader::forward_stream::ForwardStreams;
use crate::server::to_leader::keepalive_batch::KeepAliveBatcher;
use crate::server::to_leader::read_index_batch::ReadIndexBatcher;

/// etcd promotes a learner only once its log matches at least this share of
/// the leader's (`readyPercent = 0.9`).
const LEARNER_READY_PERCENT: u64 = 90;
/// Longest a MemberAdd waits for the snapshot the new member will get
/// ([`Core::snapshot_for_new_member`]).
const NEW_MEMBER_SNAPSHOT_WAIT: Duration = Duration::from_secs(2);

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
    /// `--election-timeout`.
    pub election_timeout: Duration,
    /// `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--quota-backend-bytes` (effective).
    pub quota_bytes: u64,
    /// `--max-learners`: learners MemberAdd may add.
    pub max_learners: usize,
    /// Where `Maintenance.Snapshot` writes the backup it streams (the data
    /// dir's `member/snap`; `None`: the system's temporary directory).
    pub snapshot_dir: Option<std::path::PathBuf>,
}

impl CoreConfig {
    /// Where snapshot files are written: `snapshot_dir`, else the
    /// system's temporary directory.
    pub fn snapshot_dir_or_temp(&self) -> std::path::PathBuf {
        self.snapshot_dir.clone().unwrap_or_else(std::env::temp_dir)
    }
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
    /// The raised alarms, kept current by the state machine.
    pub alarms: Arc<RaisedCache>,
    /// The cluster version and downgrade state, kept current by the state
    /// machine.
    pub cluster: Arc<ClusterStateCache>,
    peers: PeerNetworkFactory,
    pub(super) read_rounds: ReadRounds,
    batcher: Batcher,
    forwards: ForwardBatcher,
    /// A follower's queue of lease renewals for the leader.
    keepalives: KeepAliveBatcher,
    /// A follower's linearizable reads, sharing ReadIndex requests to the
    /// leader.
    pub(super) remote_reads: ReadIndexBatcher,
    /// Election control for leadership transfer (MoveLeader), see
    /// [`crate::server::peer::transfer`].
    pub elections: ElectionControl,
    /// When this member last heard from its leader (recorded by
    /// [`crate::server::peer`]).
    pub leader_contact: LeaderContact,
    /// openraft's view of the leader, notified only on changes.
    pub(super) leader_watch: LeaderWatch,
    /// The state machine's size for the quota check, measured at most
    /// every `QUOTA_SIZE_REFRESH` (see [`crate::server::core::quota`]).
    db_size: SizeGauge,
}

/// The member's copies of replicated state that the state machine keeps
/// current (see [`RaisedCache`], [`ClusterStateCache`]).
pub struct ReplicatedCaches {
    /// The raised alarms.
    pub alarms: Arc<RaisedCache>,
    /// The cluster version and downgrade state.
    pub cluster: Arc<ClusterStateCache>,
}

impl Core {
    /// Wires the core.
    pub fn new(
        config: CoreConfig,
        raft: Raft,
        mvcc: Arc<MvccStore>,
        lessor: Arc<Lessor>,
        auth: Arc<AuthStore>,
        caches: ReplicatedCaches,
        peers: PeerNetworkFactory,
    ) -> Arc<Self> {
        let elections = ElectionControl::default();
        let read_rounds = ReadRounds::spawn(
            raft.clone(),
            elections.gate().clone(),
            config.request_timeout,
            peers.clone(),
            config.member_id,
        );
        let batcher = Batcher::spawn(raft.clone());
        let leader_contact = LeaderContact::new(config.election_timeout);
        let leader_watch = LeaderWatch::spawn(&raft);
        let forward_streams = Arc::new(ForwardStreams::new());
        Arc::new(Self {
            leader_contact,
            leader_watch,
            batcher,
            forwards: ForwardBatcher::spawn(forward_streams.clone()),
            keepalives: KeepAliveBatcher::spawn(forward_streams),
            remote_reads: ReadIndexBatcher::spawn(),
            config,
            raft,
            mvcc,
            lessor,
            auth,
            alarms: caches.alarms,
            cluster: caches.cluster,
            peers,
            read_rounds,
            elections,
            db_size: SizeGauge::default(),
        })
    }

    /// A response header for `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.config.cluster_id,
            member_id: self.config.member_id,
            revision,
            raft_term: self.raft.metrics().borrow_watched().current_term,
        }
    }

    /// Every member (voters and learners) of the membership this member
    /// knows.
    pub fn member_ids(&self) -> Vec<NodeId> {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    }

    /// A response header at the current revision.
    pub fn current_header(&self) -> Option<ResponseHeader> {
        Some(self.header(self.mvcc.current_revision()))
    }

    /// Fills cluster, member and term into a header the state machine made.
    pub fn fill(&self, header: &mut Option<ResponseHeader>) {
        let revision = header
            .as_ref()
            .map_or_else(|| self.mvcc.current_revision(), |h| h.revision);
        *header = Some(self.header(revision));
    }

    /// Ends the replication streams' commit holds now (see
    /// `raft::commit_hold`).
    pub(crate) fn release_commit_holds(&self) {
        self.peers.release_commit_holds();
    }

    /// The log entries kept for members being sent a snapshot (see
    /// `raft::snapshot_holds`).
    pub(crate) fn snapshot_holds(&self) -> crate::raft::snapshot_holds::SnapshotHolds {
        self.peers.snapshot_holds()
    }

    /// Sends peer protocol `protocol` from now on; answers the one before.
    pub(super) fn set_peer_protocol(&self, protocol: u32) -> u32 {
        self.peers.set_protocol(protocol)
    }

    /// The current leader, if known (a follower that has not heard from
    /// its leader for an election timeout knows none, as etcd's).
    pub fn leader(&self) -> Option<NodeId> {
        self.leader_contact
            .leader(&self.raft.metrics().borrow_watched())
    }

    /// A client for member `id`. A member missing from this member's view
    /// of the membership (a leader that was just removed, or one not yet
    /// learned) is answered as "not leader", so callers retry once the
    /// leader is re-learned instead of failing the request. A member whose
    /// URL or TLS settings allow no channel is etcd's "request timed out,
    /// possibly due to connection lost", at once and logged with the cause.
    pub(crate) fn peer(&self, id: NodeId) -> Result<PeerClient, ForwardError> {
        self.peer_channel(id).map(peer_client)
    }

    /// The channel [`Self::peer`]'s client uses (which knows the peer
    /// protocol its requests are in).
    pub(crate) fn peer_channel(&self, id: NodeId) -> Result<PeerChannel, ForwardError> {
        // This runs for every forwarded request: openraft's metrics (with
        // the replication map) are borrowed, not cloned; only the member is,
        // and the borrow ends before the channel cache's lock is taken.
        let node = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .get_node(&id)
            .cloned();
        let node = node.ok_or(ForwardError::NotLeader(None))?;
        match self.peers.channel(id, &node) {
            Ok(channel) => Ok(channel),
            // Not a missing leader: no retry mends a bad URL or TLS setting.
            Err(error) => {
                tracing::warn!(member = format!("{id:x}"), %error, "cannot reach a member");
                Err(ForwardError::Etcd(EtcdError::TimeoutDueToConnectionLost))
            }
        }
    }

    /// Waits (until `deadline`) for a known leader.
    pub(super) async fn wait_leader(&self, deadline: Instant) -> Option<NodeId> {
        let mut leader = None;
        metrics::wait_until(&self.raft, deadline, |m| {
            leader = m.current_leader;
            leader.is_some()
        })
        .await
        .ok()?;
        leader
    }

    /// Before another attempt at something the leader refused or never
    /// received: waits a moment, or gives up with `error`'s etcd error (or
    /// etcd's timeout at `deadline`).
    pub(super) async fn before_retry(
        &self,
        error: ForwardError,
        deadline: Instant,
    ) -> Result<(), EtcdError> {
        match error {
            ForwardError::Etcd(e) => Err(e),
            ForwardError::NotLeader(_) if Instant::now() >= deadline => Err(EtcdError::Timeout),
            ForwardError::NotLeader(_) => {
                tokio::time::sleep(Duration::from_millis(LEADER_RETRY_PAUSE_MS)).await;
                Ok(())
            }
        }
    }

    /// Runs `req` on the leader (here if this member leads, else forwarded)
    /// and returns its answer of the kind `T` that `req` expects. Retried
    /// while the leader is unknown or moving, until the request timeout.
    pub(super) async fn ask_leader<T: ReplyKind>(
        &self,
        req: LeaderRequest,
    ) -> Result<T, EtcdError> {
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            let leader = self.wait_leader(deadline).await.ok_or(EtcdError::Timeout)?;
            let attempt = if leader == self.config.member_id {
                self.serve_as_leader(req.clone(), deadline).await
            } else if req.idempotent() {
                // As a read's ReadIndex: once this member sees another
                // leader, it stops waiting for the old one (which may be
                // cut off until the deadline) and asks the new one. A
                // keep-alive forwarded to a leader just cut off would
                // otherwise hold its stream for the whole request timeout,
                // longer than the new leader counts the lease down.
                tokio::select! {
                    reply = Box::pin(self.forward(leader, &req, deadline)) => reply,
                    () = self.leader_changed_from(leader, deadline) => {
                        Err(ForwardError::NotLeader(None))
                    }
                }
            } else {
                // Boxed: a tonic call's future is large, and every write's
                // future on the leader would otherwise carry (and copy) it.
                Box::pin(self.forward(leader, &req, deadline)).await
            };
            match attempt {
                Ok(reply) => {
                    return T::from_reply(reply)
                        .map_err(|other| wrong_kind("a leader request", &other))
                }
                Err(e) => self.before_retry(e, deadline).await?,
            }
        }
    }

    /// Serves a leader request on this member, if it leads.
    pub async fn serve_as_leader(
        &self,
        req: LeaderRequest,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        if let Some(reply) = self.answer_anywhere(&req) {
            return Ok(reply);
        }
        // A leadership transfer holds log writes back (see crate::server::peer::transfer).
        let _gate = self.elections.gate().enter_until(deadline).await?;
        match req {
            LeaderRequest::Propose(cmd) => self
                .propose_local(cmd, deadline)
                .await
                .map(LeaderReply::Applied),
            LeaderRequest::ProposeBatch(proposals) => {
                // All queued at once, so they share the next log entry.
                let answers = proposals
                    .into_iter()
                    .map(|p| self.propose_local(p, deadline));
                Ok(LeaderReply::AppliedBatch(join_all(answers).await))
            }
            // Boxed, so the futures of writes stay small (see `ask_leader`).
            other => Box::pin(self.serve_rare_as_leader(other, deadline)).await,
        }
    }

    /// The leader requests other than proposals (see `serve_as_leader`).
    async fn serve_rare_as_leader(
        &self,
        req: LeaderRequest,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        match req {
            LeaderRequest::Propose(_) | LeaderRequest::ProposeBatch(_) => {
                unreachable!("proposals are served by serve_as_leader")
            }
            LeaderRequest::LeaseRenew(id) => {
                // A leader cut off from the quorum otherwise keeps renewing
                // leases that the new leader (which restarts every lease
                // when it takes over) is already counting down, and the
                // holder of an election lease believes it holds it longer
                // than it does (the gateway's VIP fencing relies on it).
                self.confirm_leadership().await?;
                Ok(LeaderReply::LeaseRenewed(self.lessor.renew(id)))
            }
            LeaderRequest::LeaseRenewBatch(ids) => {
                // One confirmation for the batch: each renewal arrived
                // before it began.
                self.confirm_leadership().await?;
                let ttls = ids.into_iter().map(|id| self.lessor.renew(id));
                Ok(LeaderReply::LeaseRenewedBatch(ttls.collect()))
            }
            LeaderRequest::LeaseTimeToLive(id) => {
                self.require_primary()?;
                // The lessor knows every attached key once the index is
                // loaded.
                if let Err(error) = self.mvcc.load_all() {
                    tracing::error!(%error, "loading the key index for a lease's keys failed");
                    return Err(ForwardError::Etcd(EtcdError::Corrupt));
                }
                let ttl = self
                    .lessor
                    .time_to_live(id)
                    .map(|(granted, remaining, keys)| LeaseTtl {
                        granted_ttl_seconds: granted,
                        remaining_seconds: remaining,
                        keys,
                    });
                Ok(LeaderReply::LeaseTtl(ttl))
            }
            LeaderRequest::ChangeMembership(changes) => {
                if matches!(changes, ChangeMembers::AddNodes(_)) {
                    self.snapshot_for_new_member(deadline).await;
                }
                self.change_membership(changes, deadline).await
            }
            LeaderRequest::Promote(id) => {
                self.check_learner_ready(id)?;
                let changes = ChangeMembers::AddVoterIds([id].into_iter().collect());
                self.change_membership(changes, deadline).await
            }
            // Answered above, before the gate.
            LeaderRequest::ClusterId | LeaderRequest::HashKv(_) | LeaderRequest::ServerVersion => {
                Err(ForwardError::Etcd(EtcdError::UnknownMethod))
            }
        }
    }

    /// The answer to a request any member serves (the cluster id, its
    /// HashKV, its server version), None for one only the leader serves.
    pub(super) fn answer_anywhere(&self, req: &LeaderRequest) -> Option<LeaderReply> {
        match *req {
            LeaderRequest::ClusterId => Some(LeaderReply::ClusterId(self.config.cluster_id)),
            LeaderRequest::HashKv(rev) => Some(LeaderReply::HashKv(self.own_hash(rev))),
            LeaderRequest::ServerVersion => Some(LeaderReply::ServerVersion(
                crate::cluster_version::server_version_text().to_string(),
            )),
            _ => None,
        }
    }

    /// This member's HashKV at `rev` (0: the current revision), or None if
    /// it cannot hash that revision (compacted, or not applied yet).
    pub(super) fn own_hash(&self, rev: i64) -> Option<PeerHash> {
        let (hash, compact_revision, revision) = self.mvcc.hash_kv(rev).ok()?;
        Some(PeerHash {
            member_id: self.config.member_id,
            hash,
            compact_revision,
            revision,
        })
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
            Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)))) => {
                Err(ForwardError::Etcd(EtcdError::TimeoutDueToLeaderFail))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::PreconditionFailed(e)))) => {
                tracing::warn!(error = %e, "membership change refused");
                Err(ForwardError::Etcd(EtcdError::NotCapable))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                tracing::warn!(error = %e, "membership change refused");
                Err(ForwardError::Etcd(EtcdError::MemberNotFound))
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ForwardError::Etcd(EtcdError::Stopped)),
        }
    }

    /// Before a member is added: a snapshot of everything applied, unless
    /// the newest one is, waited for up to [`NEW_MEMBER_SNAPSHOT_WAIT`].
    ///
    /// A new member catches up from the newest snapshot and then from the
    /// log after it, applying every entry since. Right after a load of a
    /// million keys that tail was ~46,000 puts: a learner promoted as soon
    /// as it had the snapshot (its matched index within etcd's 10%) served
    /// its first linearizable read 1.8 s later. The snapshot is a checkpoint
    /// (hard links and a memtable flush), a fraction of a second whatever
    /// the store's size.
    async fn snapshot_for_new_member(&self, deadline: Instant) {
        let m = self.raft.metrics().borrow_watched().clone();
        let applied = m.last_applied.map_or(0, |l| l.index);
        if m.snapshot.is_some_and(|s| s.index >= applied) {
            return;
        }
        if self.raft.trigger().snapshot().await.is_err() {
            return;
        }
        let bound = deadline.min(Instant::now() + NEW_MEMBER_SNAPSHOT_WAIT);
        let built = metrics::wait_until(&self.raft, bound, |m| {
            m.snapshot.is_some_and(|s| s.index >= applied)
        })
        .await;
        if let Err(e) = built {
            tracing::warn!(error = ?e, "adding a member without a fresh snapshot");
        }
    }

    /// etcd's `isLearnerReady`: the learner's matched log index is at
    /// least [`LEARNER_READY_PERCENT`] of the leader's last log index.
    fn check_learner_ready(&self, id: NodeId) -> Result<(), ForwardError> {
        let m = self.raft.metrics().borrow_watched().clone();
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

    /// True when this member is a learner in the membership it knows: it
    /// then serves only what etcd's learner serves
    /// ([`crate::server::transport::learner_guard`]).
    pub fn is_learner(&self) -> bool {
        crate::raft::leadership::is_learner(&self.raft.metrics().borrow_watched())
    }

    /// etcd 3.5's `ensureLeadership` (3.5.13 on): a quorum confirms that
    /// this member still leads, and its lessor still keeps the deadlines.
    /// Lease renewals and expiry revokes act on the leader's deadlines, which
    /// only the current leader's are right.
    pub async fn confirm_leadership(&self) -> Result<(), ForwardError> {
        self.require_primary()?;
        self.read_index_local().await?;
        self.require_primary()
    }

    fn require_primary(&self) -> Result<(), ForwardError> {
        if self.lessor.is_primary() {
            Ok(())
        } else {
            Err(ForwardError::NotLeader(self.leader()))
        }
    }

    /// Proposes on this member, which believes it is the leader, through
    /// the next batched log entry (see [`crate::raft::batcher`]).
    async fn propose_local(
        &self,
        cmd: Proposal,
        deadline: Instant,
    ) -> Result<CommandResponse, ForwardError> {
        match tokio::time::timeout_at(deadline, self.batcher.propose(cmd)).await {
            Err(_) => Err(ForwardError::Etcd(EtcdError::Timeout)),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(BatchError::NotLeader(leader))) => Err(ForwardError::NotLeader(leader)),
            Ok(Err(BatchError::NotCapable)) => Err(ForwardError::Etcd(EtcdError::NotCapable)),
            // Unknown outcome: etcd's answer when the leader fails under a proposal.
            Ok(Err(BatchError::Discarded)) => {
                Err(ForwardError::Etcd(EtcdError::TimeoutDueToLeaderFail))
            }
            Ok(Err(BatchError::Stopped)) => Err(ForwardError::Etcd(EtcdError::Stopped)),
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        req: &LeaderRequest,
        deadline: Instant,
    ) -> Result<LeaderReply, ForwardError> {
        let mut client = self.peer(leader)?;
        if let LeaderRequest::Propose(proposal) = req {
            let forwarded = self
                .forwards
                .forward(leader, client, proposal.clone(), deadline);
            return forwarded.await.map(LeaderReply::Applied);
        }
        if let LeaderRequest::LeaseRenew(id) = req {
            let renewed = self.keepalives.renew(leader, client, *id, deadline);
            return renewed.await.map(LeaderReply::LeaseRenewed);
        }
        let mut request = tonic::Request::new(encode_request(req));
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match client.forward(request).await {
            Ok(reply) => decode_reply(&reply.into_inner().payload),
            Err(status) => Err(transport_failure(&status)),
        }
    }

    /// etcd's quota check before a write that grows the database: refused
    /// with NOSPACE while the alarm is raised, and raising it when the
    /// database plus this request would pass `--quota-backend-bytes`.
    pub async fn check_quota(&self, cost_bytes: u64) -> Result<(), KvError> {
        let engine = self.mvcc.engine();
        if self.alarms.get().nospace {
            return Err(EtcdError::NoSpace.into());
        }
        let measure = || engine.tables_size_bytes(&Table::STATE_MACHINE);
        if self
            .db_size
            .fits(cost_bytes, self.config.quota_bytes, measure)
        {
            return Ok(());
        }
        let raise = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.config.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let propose =
            self.propose_own::<etcd_proto::etcdserverpb::AlarmResponse>(Command::Alarm(raise));
        Box::pin(propose).await?;
        Err(EtcdError::NoSpace.into())
    }
}

/// The leader answered a request with a reply of another kind: only a
/// member running a different build could, so the outcome is unknown and
/// the client gets etcd's timeout error (as for an answer that does not
/// decode).
pub(super) fn wrong_kind(what: &str, reply: &dyn std::fmt::Debug) -> EtcdError {
    tracing::error!(
        ?reply,
        "the leader answered {what} with a reply of another kind"
    );
    EtcdError::Timeout
}

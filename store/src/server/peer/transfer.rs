//! Leadership transfer: etcd's `Maintenance.MoveLeader` on openraft's
//! handoff message, with ordinary elections as the fallback.
//!
//! # The constraint
//!
//! openraft's voters refuse every
//! vote request while the leader lease they last saw may still hold
//! (`Engine::handle_vote_req`: the voter's vote is committed and
//! `now <= vote_utime + leader_lease`, with `leader_lease =
//! election_timeout_max`). A follower refreshes `vote_utime` whenever it
//! hears from the leader: heartbeats and replication (a ReadIndex round's
//! poll is a message of ours and refreshes nothing). So while the leader
//! is active, a follower that
//! simply campaigns (`raft.trigger().elect(false)`) is refused by every voter.
//!
//! The leader itself is different: nothing refreshes its own `vote_utime`
//! after it was elected, so once it has led for longer than the lease it
//! grants the vote of any candidate with a higher term and a log at least as
//! long as its own, and steps down. In a 3-member cluster that vote plus the
//! candidate's own is a quorum.
//!
//! openraft 0.10's handoff lifts the constraint: a voter that receives a
//! `TransferLeaderRequest` carrying the vote of the leader it follows drops
//! that leader's lease (it may vote at once), and the member the request
//! names campaigns as soon as its log holds the leader's last entry
//! (`Raft::handle_transfer_leader`). openraft's own sender,
//! `trigger().transfer_leader()`, also marks the leader as handing over,
//! which stops its proposals and heartbeats until it steps down, with no way
//! back: a transfer to a member that died would end in an election. etcd's
//! leader aborts a transfer that does not complete and goes on leading, so
//! this module sends the request itself (`storepeer.RaftPeer/TransferLeader`)
//! and keeps the rest in its own hands.
//!
//! # The algorithm
//!
//! [`move_leader`] runs on the leader L for a target T (etcd's checks first:
//! `not leader` if L does not lead, `bad leader transferee` if T is not a
//! voter, success at once if T already leads). Then, in a task of its own
//! (so a client that gives up cannot cancel it half-way), bounded as a whole
//! by [`TRANSFER_TIMEOUT_ELECTION_TIMEOUTS`] election timeouts:
//!
//! 1. **Catch up, writes still flowing**: wait until T has matched the log
//!    index L had when the transfer began (a lagging T catches up without
//!    stalling clients).
//! 2. **Quiesce**: stop every source of traffic that would refresh the
//!    followers' leases or grow L's log: heartbeats off
//!    (`runtime_config().heartbeat(false)`), L's own elections held, and the
//!    [`TransferGate`] closed: new log writes (`Core::serve_as_leader`, which
//!    every proposal, forwarded or local, goes through) and ReadIndex rounds
//!    wait until the transfer ends; closing waits for those in flight.
//! 3. **Catch up exactly**: wait until T's matched index equals L's last log
//!    index. From here on L's log does not grow, so T's log is as up to date
//!    as any voter's and every voter whose lease has expired will grant T.
//! 4. **Hand over**: every other voter is told to hold its elections for the
//!    rest of the transfer (peer message [`TransferMessage::HoldElections`];
//!    the member re-enables them by its own timer, so a leader that dies
//!    mid-transfer cannot leave them disabled: L's heartbeats are off); then
//!    openraft's handoff request goes to the other voters (they drop L's
//!    lease) and then to T, which campaigns at once and wins with their
//!    votes. This usually ends the transfer within a few milliseconds.
//!    **Campaign** if L still leads one election timeout later (a lost
//!    message, a target that refused): T is told to campaign
//!    ([`TransferMessage::Campaign`]): it calls `trigger().elect(false)` (no pre-vote) every
//!    [`CAMPAIGN_RETRY_HEARTBEATS`] heartbeat intervals until it leads or its
//!    time is up. Refused rounds are expected while leases still hold; the
//!    round after the last lease expired (at most about
//!    `election_timeout_max` after L's last message) wins.
//! 5. **Wait** until L sees T as leader, then, on every path (success,
//!    failure, timeout, a panic in the task): heartbeats back on, L's
//!    elections back on, the gate open, the other voters' holds lifted.
//!    Writes held by the gate then fail over to T like after any leader
//!    change (`ForwardToLeader`, retried by `Core::ask_leader`); none was in
//!    flight during the election, so none is lost or duplicated. At the
//!    deadline the client gets etcd's `request timed out, leader transfer took
//!    too long`.
//!
//! Safety never depends on any of this: T wins an ordinary Raft election.
//! The steps only arrange that T is the one that can win it, soon.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use crate::raft::RaftMetrics;
use etcd_proto::storepeer::RaftMessage;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::codec;
use crate::errors::EtcdError;
use crate::limits::PEER_RPC_TIMEOUT_MS;
use crate::raft::elections::after;
use crate::raft::metrics::{self, matched_index, WaitError};
use crate::raft::network::peer_client;
use crate::raft::peer_protocol::{decode_answer, PeerChannel, RaftFailure};
use crate::raft::{NodeId, Raft, TypeConfig};
use crate::server::core::Core;
use openraft::raft::{TransferLeaderError, TransferLeaderRequest, TransferLeaderResponse};

/// Bound of a whole transfer, in leader leases (openraft's
/// `election_timeout_max`, half of `--election-timeout`). A transfer
/// normally takes one vote round, or at most about one lease when the
/// voters' leases must expire first; 8 leases (4 s at etcd's default 1 s
/// election timeout) leave room for a target that needs to catch up and a
/// loaded machine, and stay under etcdctl's default 5 s
/// `--command-timeout`, so etcdctl reports our error rather than its own.
pub const TRANSFER_TIMEOUT_ELECTION_TIMEOUTS: u32 = 8;

/// Extra time, in leader leases, that the other voters hold their
/// elections beyond the transfer's deadline (the leader lifts the hold as
/// soon as the transfer ends; this only matters if it cannot).
pub const HOLD_MARGIN_ELECTION_TIMEOUTS: u32 = 2;

/// Longest hold or campaign a peer may ask of a member, in leader leases:
/// a bound on what a bad or buggy request can do.
pub const MAX_PEER_REQUEST_ELECTION_TIMEOUTS: u32 = 20;

/// A message of the leadership-transfer peer RPC
/// (`storepeer.RaftPeer/LeaderTransfer`). Durations, not instants: members
/// do not share a clock. The answer is `Result<(), TransferRefusal>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TransferMessage {
    /// Start no election for `duration_ms` (0: start them again now). The
    /// latest message wins; the member lifts the hold by itself when the
    /// time is up.
    HoldElections {
        /// How long, in milliseconds.
        duration_ms: u64,
    },
    /// Campaign until this member leads or `duration_ms` has passed.
    Campaign {
        /// How long, in milliseconds.
        duration_ms: u64,
    },
}

/// Why a member refused a [`TransferMessage`] (sent back to the leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum TransferRefusal {
    /// Only a voter can campaign.
    #[error("member {0:x} is not a voter")]
    NotVoter(NodeId),
}

/// Why a [`TransferMessage`] had no effect on the member it was sent to.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The member is not in this member's view of the membership.
    #[error("member {0:x} is not in this member's membership")]
    NotMember(NodeId),
    /// No answer in time.
    #[error("member {member:x} did not answer within {timeout:?}")]
    NoAnswer {
        /// The member.
        member: NodeId,
        /// How long we waited.
        timeout: Duration,
    },
    /// The RPC failed.
    #[error("member {member:x}: {source}")]
    Rpc {
        /// The member.
        member: NodeId,
        /// The RPC's status.
        source: tonic::Status,
    },
    /// The answer does not decode.
    #[error("member {member:x} answered garbage: {source}")]
    Garbage {
        /// The member.
        member: NodeId,
        /// The decoding error.
        source: bincode::Error,
    },
    /// The member refused.
    #[error(transparent)]
    Refused(#[from] TransferRefusal),
    /// The member's Raft has stopped.
    #[error("member {member:x}: {failure}")]
    Failed {
        /// The member.
        member: NodeId,
        /// Why its Raft stopped.
        failure: RaftFailure,
    },
    /// The member's Raft refused the handoff (its vote or log differs).
    #[error("member {member:x} refused the handoff: {source}")]
    HandoffRefused {
        /// The member.
        member: NodeId,
        /// openraft's reason.
        source: TransferLeaderError<TypeConfig>,
    },
}

/// Timing of a transfer, from the Raft configuration.
#[derive(Clone, Copy)]
struct Timing {
    election_timeout: Duration,
    transfer: Duration,
}

impl Timing {
    fn of(raft: &Raft) -> Self {
        let election_timeout = Duration::from_millis(raft.config().election_timeout_max);
        Self {
            election_timeout,
            transfer: election_timeout.saturating_mul(TRANSFER_TIMEOUT_ELECTION_TIMEOUTS),
        }
    }

    fn max_peer_request(self) -> Duration {
        self.election_timeout
            .saturating_mul(MAX_PEER_REQUEST_ELECTION_TIMEOUTS)
    }
}

/// etcd's `MoveLeader`: makes `target` the leader (see the module
/// documentation). Must run on the leader.
pub async fn move_leader(core: &Arc<Core>, target: NodeId) -> Result<(), EtcdError> {
    if !admit(core, target)? {
        return Ok(());
    }
    // In a task of its own: dropping the client's request must not stop a
    // transfer half-way (it always restores what it changed, at its end).
    tokio::spawn(transfer(core.clone(), target))
        .await
        .unwrap_or(Err(EtcdError::Stopped))
}

/// On a graceful stop (SIGTERM), as etcd's `EtcdServer.Stop`: if this member
/// leads and has another voter, hands leadership to the follower with the
/// most of its log, so the cluster keeps a leader instead of waiting out an
/// election timeout. A failure is logged; the stop goes on.
pub async fn hand_over_on_stop(core: &Arc<Core>) {
    let me = core.config.member_id;
    let target = {
        let m = core.raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(me) {
            return;
        }
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter(|&v| v != me)
            .max_by_key(|&v| (matched_index(&m, v), std::cmp::Reverse(v)))
    };
    let Some(target) = target else {
        return;
    };
    tracing::info!(
        target = format!("{target:x}"),
        "leader is stopping, transferring leadership"
    );
    if let Err(error) = move_leader(core, target).await {
        tracing::warn!(%error, "leadership transfer on stop failed; stopping anyway");
    }
}

/// etcd's checks: this member leads, the target is a voter. `Ok(false)` if
/// the target already leads.
fn admit(core: &Core, target: NodeId) -> Result<bool, EtcdError> {
    let me = core.config.member_id;
    let m = core.raft.metrics().borrow_watched().clone();
    if m.current_leader != Some(me) {
        return Err(EtcdError::NotLeader);
    }
    if !m
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == target)
    {
        return Err(EtcdError::BadLeaderTransferee);
    }
    Ok(target != me)
}

async fn transfer(core: Arc<Core>, target: NodeId) -> Result<(), EtcdError> {
    let started = Instant::now();
    let timing = Timing::of(&core.raft);
    let deadline = after(timing.transfer);
    let _one = tokio::time::timeout_at(deadline, core.elections.running.lock())
        .await
        .map_err(|_| EtcdError::LeaderTransferTimeout)?;
    // A transfer that ran meanwhile may have moved the leadership.
    if raft_leader(&core) == Some(target) || !admit(&core, target)? {
        return Ok(());
    }
    let me = core.config.member_id;
    tracing::info!(
        target = format!("{target:x}"),
        "leadership transfer starting"
    );

    // 1. Catch up to the log as it is now, writes still flowing.
    let goal = core
        .raft
        .metrics()
        .borrow_watched()
        .last_log_index
        .unwrap_or(0);
    wait_for(&core.raft, deadline, |m| {
        m.current_leader != Some(me) || matched_index(m, target) >= goal
    })
    .await?;

    // 2. Quiesce. `_restore` undoes this on every path, `_closed` reopens.
    let hold = deadline
        .saturating_duration_since(Instant::now())
        .saturating_add(timing.election_timeout);
    let _restore = Restore::start(&core, hold);
    let _closed = tokio::time::timeout_at(deadline, core.elections.gate().close())
        .await
        .map_err(|_| EtcdError::LeaderTransferTimeout)?;

    // 3. Catch up exactly.
    wait_for(&core.raft, deadline, |m| {
        m.current_leader != Some(me) || matched_index(m, target) >= m.last_log_index.unwrap_or(0)
    })
    .await?;

    // 4 and 5. Hand over, else campaign; lift the holds whatever happened.
    let others: Vec<NodeId> = {
        let m = core.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter(|&v| v != me && v != target && membership.get_node(&v).is_some())
            .collect()
    };
    let result = hand_over_or_campaign(&core, target, &others, timing, deadline).await;
    for &id in &others {
        send_in_background(&core, id, TransferMessage::HoldElections { duration_ms: 0 });
    }
    report(started, target, result)
}

/// Logs how the transfer ended and passes the outcome on.
fn report(
    started: Instant,
    target: NodeId,
    result: Result<(), EtcdError>,
) -> Result<(), EtcdError> {
    match &result {
        Ok(()) => tracing::info!(
            target = format!("{target:x}"),
            took_ms = started.elapsed().as_millis() as u64,
            "leadership transfer finished"
        ),
        Err(error) => tracing::warn!(
            target = format!("{target:x}"),
            %error,
            took_ms = started.elapsed().as_millis() as u64,
            "leadership transfer failed"
        ),
    }
    result
}

/// Step 4, openraft's handoff message (`TransferLeaderRequest`, served by
/// `Raft::handle_transfer_leader`), sent by this module rather than by
/// `trigger().transfer_leader()`, which would leave this leader unable to
/// propose until it steps down, so a failed transfer would end in an
/// election (etcd's leader aborts the transfer and goes on leading). First
/// the other voters: each drops this leader's lease, so it may vote at once;
/// then the target, which campaigns as soon as its log holds this leader's
/// last entry (step 3 made sure of that). `Ok(true)` once this member no
/// longer leads and knows a leader; `Ok(false)` if that did not happen
/// within one election timeout (a message lost, the target dead or slow).
async fn hand_over(
    core: &Arc<Core>,
    target: NodeId,
    others: &[NodeId],
    timing: Timing,
    deadline: Instant,
) -> Result<bool, EtcdError> {
    let me = core.config.member_id;
    let request = {
        let m = core.raft.metrics().borrow_watched().clone();
        let last = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&target).cloned().flatten());
        TransferLeaderRequest::<TypeConfig>::new(m.vote, target, last)
    };
    let sends = others
        .iter()
        .map(|&id| send_handoff(core, id, &request, deadline));
    for (result, id) in futures::future::join_all(sends)
        .await
        .into_iter()
        .zip(others)
    {
        if let Err(error) = result {
            tracing::debug!(member = format!("{id:x}"), %error, "leadership handoff not delivered");
        }
    }
    if let Err(error) = send_handoff(core, target, &request, deadline).await {
        tracing::warn!(
            target = format!("{target:x}"),
            %error,
            "leadership handoff refused; campaigning instead"
        );
        return Ok(false);
    }
    let until = after(timing.election_timeout).min(deadline);
    match wait_for(&core.raft, until, |m| {
        m.current_leader.is_some_and(|l| l != me)
    })
    .await
    {
        Ok(()) => Ok(true),
        Err(EtcdError::LeaderTransferTimeout) if Instant::now() < deadline => Ok(false),
        Err(error) => Err(error),
    }
}

/// Holds the other voters' elections, then hands over ([`hand_over`]), and
/// if that did not move the leadership, campaigns ([`campaign_and_wait`]).
async fn hand_over_or_campaign(
    core: &Arc<Core>,
    target: NodeId,
    others: &[NodeId],
    timing: Timing,
    deadline: Instant,
) -> Result<(), EtcdError> {
    hold_others(core, others, timing, deadline);
    if hand_over(core, target, others, timing, deadline).await? {
        return finished(core, target);
    }
    campaign_and_wait(core, target, deadline).await
}

/// Tells every voter in `others` to start no election until the transfer's
/// deadline (plus a margin): with this leader's heartbeats off, their
/// election timers would otherwise fire during the transfer.
fn hold_others(core: &Arc<Core>, others: &[NodeId], timing: Timing, deadline: Instant) {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let margin = timing
        .election_timeout
        .saturating_mul(HOLD_MARGIN_ELECTION_TIMEOUTS);
    let hold = millis(remaining.saturating_add(margin));
    for &id in others {
        send_in_background(
            core,
            id,
            TransferMessage::HoldElections { duration_ms: hold },
        );
    }
}

/// Sends openraft's handoff message to member `to` and returns its answer.
async fn send_handoff(
    core: &Core,
    to: NodeId,
    request: &TransferLeaderRequest<TypeConfig>,
    deadline: Instant,
) -> Result<(), SendError> {
    let channel = core
        .peer_channel(to)
        .map_err(|_| SendError::NotMember(to))?;
    let protocol = channel.protocol();
    let payload = codec::encode(request);
    let answer = call_on(channel, to, PeerCall::Handoff, payload, deadline).await?;
    let answer: Result<TransferLeaderResponse<TypeConfig>, RaftFailure> =
        decode_answer(protocol, &answer)
            .map_err(|source| SendError::Garbage { member: to, source })?;
    answer
        .map_err(|failure| SendError::Failed {
            member: to,
            failure,
        })?
        .map_err(|source| SendError::HandoffRefused { member: to, source })
}

/// The two peer RPCs of a transfer.
#[derive(Clone, Copy)]
enum PeerCall {
    /// `storepeer.RaftPeer/LeaderTransfer`: a [`TransferMessage`].
    Transfer,
    /// `storepeer.RaftPeer/TransferLeader`: openraft's handoff request.
    Handoff,
}

/// Calls `rpc` on member `to` with `payload`, bounded by the peer RPC
/// timeout and `deadline`, and decodes the answer.
async fn call<A: serde::de::DeserializeOwned>(
    core: &Core,
    to: NodeId,
    rpc: PeerCall,
    payload: Vec<u8>,
    deadline: Instant,
) -> Result<A, SendError> {
    let channel = core
        .peer_channel(to)
        .map_err(|_| SendError::NotMember(to))?;
    let answer = call_on(channel, to, rpc, payload, deadline).await?;
    codec::decode(&answer).map_err(|source| SendError::Garbage { member: to, source })
}

/// Calls `rpc` on member `to` over `channel` with `payload`, bounded by
/// the peer RPC timeout and `deadline`; the answer's payload.
async fn call_on(
    channel: PeerChannel,
    to: NodeId,
    rpc: PeerCall,
    payload: Vec<u8>,
    deadline: Instant,
) -> Result<Vec<u8>, SendError> {
    let mut client = peer_client(channel);
    let timeout = Duration::from_millis(PEER_RPC_TIMEOUT_MS)
        .min(deadline.saturating_duration_since(Instant::now()));
    let mut request = tonic::Request::new(RaftMessage { payload });
    request.set_timeout(timeout);
    let reply = async {
        match rpc {
            PeerCall::Transfer => client.leader_transfer(request).await,
            PeerCall::Handoff => client.transfer_leader(request).await,
        }
    };
    let reply = tokio::time::timeout(timeout, reply)
        .await
        .map_err(|_| SendError::NoAnswer {
            member: to,
            timeout,
        })?
        .map_err(|source| SendError::Rpc { member: to, source })?;
    Ok(reply.into_inner().payload)
}

/// Step 5, when the handoff did not move the leadership: tells the target
/// to campaign until it leads, and waits.
async fn campaign_and_wait(
    core: &Arc<Core>,
    target: NodeId,
    deadline: Instant,
) -> Result<(), EtcdError> {
    let me = core.config.member_id;
    if core.leader() != Some(me) {
        return finished(core, target);
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let campaign = TransferMessage::Campaign {
        duration_ms: millis(remaining),
    };
    if let Err(error) = send(core, target, &campaign, deadline).await {
        tracing::warn!(
            target = format!("{target:x}"),
            %error,
            "leadership transfer: the target cannot campaign"
        );
        return Err(EtcdError::LeaderTransferTimeout);
    }
    // Until the target leads, or leadership went to a third member.
    wait_for(&core.raft, deadline, |m| {
        m.current_leader.is_some_and(|l| l == target || l != me)
    })
    .await?;
    finished(core, target)
}

/// The outcome once this member no longer leads. openraft's own view of
/// the leader, not [`Core::leader`]: this member stepped down a moment ago
/// and may not have heard from the new leader yet.
fn finished(core: &Core, target: NodeId) -> Result<(), EtcdError> {
    if raft_leader(core) == Some(target) {
        Ok(())
    } else {
        Err(EtcdError::LeaderTransferTimeout)
    }
}

/// The leader as openraft reports it.
fn raft_leader(core: &Core) -> Option<NodeId> {
    core.raft.metrics().borrow_watched().current_leader
}

/// Waits until `done` holds for the Raft metrics; the transfer's timeout
/// error at `deadline`.
async fn wait_for(
    raft: &Raft,
    deadline: Instant,
    done: impl FnMut(&RaftMetrics) -> bool,
) -> Result<(), EtcdError> {
    metrics::wait_until(raft, deadline, done)
        .await
        .map_err(|e| match e {
            WaitError::Deadline => EtcdError::LeaderTransferTimeout,
            WaitError::Stopped => EtcdError::Stopped,
        })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Heartbeats off and this member's elections held while alive; both back
/// on when dropped (also when the transfer task fails or panics).
struct Restore {
    core: Arc<Core>,
}

impl Restore {
    fn start(core: &Arc<Core>, hold: Duration) -> Self {
        core.raft.runtime_config().heartbeat(false);
        core.elections.hold_elections(&core.raft, hold);
        Self { core: core.clone() }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.core.raft.runtime_config().heartbeat(true);
        self.core
            .elections
            .hold_elections(&self.core.raft, Duration::ZERO);
    }
}

/// Sends a transfer message to member `to` and returns its answer.
async fn send(
    core: &Core,
    to: NodeId,
    message: &TransferMessage,
    deadline: Instant,
) -> Result<(), SendError> {
    let answer: Result<(), TransferRefusal> = call(
        core,
        to,
        PeerCall::Transfer,
        codec::encode(message),
        deadline,
    )
    .await?;
    Ok(answer?)
}

/// [`send`] without waiting for the answer (best effort: a hold ends by
/// itself anyway).
fn send_in_background(core: &Arc<Core>, to: NodeId, message: TransferMessage) {
    let core = core.clone();
    tokio::spawn(async move {
        let deadline = after(Duration::from_millis(PEER_RPC_TIMEOUT_MS));
        if let Err(error) = send(&core, to, &message, deadline).await {
            tracing::debug!(%error, ?message, "leadership transfer message not delivered");
        }
    });
}

/// Serves a [`TransferMessage`] from the leader (the receiving side of
/// `storepeer.RaftPeer/LeaderTransfer`).
pub fn serve_peer(core: &Core, message: TransferMessage) -> Result<(), TransferRefusal> {
    let cap = Timing::of(&core.raft).max_peer_request();
    match message {
        TransferMessage::HoldElections { duration_ms } => {
            let duration = Duration::from_millis(duration_ms).min(cap);
            core.elections.hold_elections(&core.raft, duration);
            Ok(())
        }
        TransferMessage::Campaign { duration_ms } => {
            let me = core.config.member_id;
            let m = core.raft.metrics().borrow_watched().clone();
            if !m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == me)
            {
                return Err(TransferRefusal::NotVoter(me));
            }
            // A hold left by an earlier transfer must not slow this one.
            core.elections.hold_elections(&core.raft, Duration::ZERO);
            let duration = Duration::from_millis(duration_ms).min(cap);
            core.elections.campaign(&core.raft, duration);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_messages_round_trip() {
        let message = TransferMessage::HoldElections { duration_ms: 1500 };
        let decoded: TransferMessage = codec::decode(&codec::encode(&message)).expect("decodes");
        assert!(matches!(
            decoded,
            TransferMessage::HoldElections { duration_ms: 1500 }
        ));
        assert!(codec::decode::<TransferMessage>(&[0xff; 3]).is_err());
    }
}

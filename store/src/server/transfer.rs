//! Leadership transfer: etcd's `Maintenance.MoveLeader` on openraft 0.9.
//!
//! # The constraint
//!
//! openraft 0.9 has no leadership-transfer API, and its voters refuse every
//! vote request while the leader lease they last saw may still hold
//! (`Engine::handle_vote_req`: the voter's vote is committed and
//! `now <= vote_utime + leader_lease`, with `leader_lease =
//! election_timeout_max`). A follower refreshes `vote_utime` whenever it
//! hears from the leader: heartbeats, replication, and the AppendEntries of
//! every ReadIndex round. So while the leader is active, a follower that
//! simply campaigns (`raft.trigger().elect()`) is refused by every voter.
//!
//! The leader itself is different: nothing refreshes its own `vote_utime`
//! after it was elected, so once it has led for longer than the lease it
//! grants the vote of any candidate with a higher term and a log at least as
//! long as its own, and steps down. In a 3-member cluster that vote plus the
//! candidate's own is a quorum.
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
//! 4. **Campaign**: every other voter is told to hold its elections for the
//!    rest of the transfer (peer message [`TransferMessage::HoldElections`];
//!    the member re-enables them by its own timer, so a leader that dies
//!    mid-transfer cannot leave them disabled), and T is told to campaign
//!    ([`TransferMessage::Campaign`]): it calls `trigger().elect()` every
//!    [`CAMPAIGN_RETRY_HEARTBEATS`] heartbeat intervals until it leads or its
//!    time is up. Refused rounds are expected while leases still hold; the
//!    round after the last lease expired (at most about
//!    `election_timeout_max` after L's last message) wins.
//! 5. **Wait** until L sees T as leader, then, on every path (success,
//!    failure, timeout, a panic in the task): heartbeats back on, L's
//!    elections back on, the gate open, the other voters' holds lifted.
//!    Writes held by the gate then fail over to T like after any leader
//!    change (`ForwardToLeader`, retried by `Core::on_leader`); none was in
//!    flight during the election, so none is lost or duplicated. At the
//!    deadline the client gets etcd's `request timed out, leader transfer took
//!    too long`.
//!
//! Safety never depends on any of this: T wins an ordinary Raft election.
//! The steps only arrange that T is the one that can win it, soon.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_proto::storepeer::RaftMessage;
use openraft::{RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio::time::Instant;

use super::core::{matched_index, Core, ForwardError};
use crate::errors::EtcdError;
use crate::limits::PEER_RPC_TIMEOUT_MS;
use crate::raft::{codec, MemberInfo, NodeId, Raft};

/// Bound of a whole transfer, in election timeouts (`election_timeout_max`).
/// A transfer normally takes one vote round, or at most about one election
/// timeout when the voters' leases must expire first; 4 leaves room for a
/// target that needs to catch up and a loaded machine, and with etcd's
/// default 1 s election timeout it stays under etcdctl's default 5 s
/// `--command-timeout`, so etcdctl reports our error rather than its own.
pub const TRANSFER_TIMEOUT_ELECTION_TIMEOUTS: u32 = 4;

/// Extra time, in election timeouts, that the other voters hold their
/// elections beyond the transfer's deadline (the leader lifts the hold as
/// soon as the transfer ends; this only matters if it cannot).
pub const HOLD_MARGIN_ELECTION_TIMEOUTS: u32 = 1;

/// Longest hold or campaign a peer may ask of a member, in election
/// timeouts: a bound on what a bad or buggy request can do.
pub const MAX_PEER_REQUEST_ELECTION_TIMEOUTS: u32 = 10;

/// Pause between two elections the target starts, in heartbeat intervals.
/// A vote round on a healthy network takes far less (one RPC and one vote
/// fsync per voter), and a refused round is retried this soon after the
/// voters' leases expire.
pub const CAMPAIGN_RETRY_HEARTBEATS: u32 = 1;

/// A message of the leadership-transfer peer RPC
/// (`storepeer.RaftPeer/LeaderTransfer`). Durations, not instants: members
/// do not share a clock. The answer is `Result<(), String>`.
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

/// Closed by a leadership transfer; every log write and ReadIndex round of
/// the leader passes it. A fair read-write lock: closing waits for the
/// writes and rounds in flight, and once a transfer waits to close it, new
/// ones wait behind it.
#[derive(Clone, Default)]
pub struct TransferGate(Arc<RwLock<()>>);

impl TransferGate {
    /// Passes the gate; the guard keeps it from closing until dropped.
    pub async fn enter(&self) -> OwnedRwLockReadGuard<()> {
        self.0.clone().read_owned().await
    }

    /// [`Self::enter`], or etcd's timeout error at `deadline`.
    pub async fn enter_until(
        &self,
        deadline: Instant,
    ) -> Result<OwnedRwLockReadGuard<()>, ForwardError> {
        tokio::time::timeout_at(deadline, self.enter())
            .await
            .map_err(|_| ForwardError::Etcd(EtcdError::Timeout))
    }

    async fn close(&self) -> OwnedRwLockWriteGuard<()> {
        self.0.clone().write_owned().await
    }
}

/// A member's leadership-transfer state (one per [`Core`]).
#[derive(Default)]
pub struct LeaderTransfer {
    gate: TransferGate,
    /// One transfer at a time on this member.
    running: tokio::sync::Mutex<()>,
    /// Until when this member's elections are held, if they are.
    hold_until: Arc<Mutex<Option<Instant>>>,
    /// Until when this member campaigns, while a campaign runs.
    campaign_until: Arc<Mutex<Option<Instant>>>,
}

impl LeaderTransfer {
    /// The gate that log writes and ReadIndex rounds pass.
    pub fn gate(&self) -> &TransferGate {
        &self.gate
    }

    /// Holds this member's elections for `duration` (zero: lifts the hold).
    /// A timer lifts it when the time is up unless a later call replaced it.
    fn hold_elections(&self, raft: &Raft, duration: Duration) {
        let mut hold = lock(&self.hold_until);
        if duration.is_zero() {
            *hold = None;
            raft.runtime_config().elect(true);
            return;
        }
        let until = after(duration);
        *hold = Some(until);
        raft.runtime_config().elect(false);
        let (raft, hold_until) = (raft.clone(), self.hold_until.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut hold = lock(&hold_until);
            if *hold == Some(until) {
                *hold = None;
                raft.runtime_config().elect(true);
            }
        });
    }

    /// Campaigns for `duration` (or extends a running campaign to it).
    fn campaign(&self, raft: &Raft, duration: Duration) {
        let until = after(duration);
        {
            let mut current = lock(&self.campaign_until);
            let running = current.is_some();
            *current = Some(until);
            if running {
                return;
            }
        }
        let (raft, campaign_until) = (raft.clone(), self.campaign_until.clone());
        tokio::spawn(async move {
            let retry = Duration::from_millis(
                raft.config()
                    .heartbeat_interval
                    .saturating_mul(u64::from(CAMPAIGN_RETRY_HEARTBEATS)),
            );
            loop {
                let leading = raft.metrics().borrow().state == ServerState::Leader;
                {
                    let mut current = lock(&campaign_until);
                    if leading || current.is_none_or(|until| Instant::now() >= until) {
                        *current = None;
                        return;
                    }
                }
                if let Err(error) = raft.trigger().elect().await {
                    tracing::warn!(%error, "leadership transfer: cannot campaign");
                    *lock(&campaign_until) = None;
                    return;
                }
                tokio::time::sleep(retry).await;
            }
        });
    }
}

/// `duration` from now (a far-off instant rather than an overflow).
fn after(duration: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(FAR_FUTURE_SECS))
}

/// What [`after`] answers for a duration past the clock's range: a year.
const FAR_FUTURE_SECS: u64 = 365 * 24 * 3600;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

/// etcd's checks: this member leads, the target is a voter. `Ok(false)` if
/// the target already leads.
fn admit(core: &Core, target: NodeId) -> Result<bool, EtcdError> {
    let me = core.config.member_id;
    let m = core.raft.metrics().borrow().clone();
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
    let _one = tokio::time::timeout_at(deadline, core.transfer.running.lock())
        .await
        .map_err(|_| EtcdError::LeaderTransferTimeout)?;
    // A transfer that ran meanwhile may have moved the leadership.
    if core.leader() == Some(target) || !admit(&core, target)? {
        return Ok(());
    }
    let me = core.config.member_id;
    tracing::info!(
        target = format!("{target:x}"),
        "leadership transfer starting"
    );

    // 1. Catch up to the log as it is now, writes still flowing.
    let goal = core.raft.metrics().borrow().last_log_index.unwrap_or(0);
    wait_for(&core.raft, deadline, |m| {
        m.current_leader != Some(me) || matched_index(m, target) >= goal
    })
    .await?;

    // 2. Quiesce. `_restore` undoes this on every path, `_closed` reopens.
    let hold = deadline
        .saturating_duration_since(Instant::now())
        .saturating_add(timing.election_timeout);
    let _restore = Restore::start(&core, hold);
    let _closed = tokio::time::timeout_at(deadline, core.transfer.gate.close())
        .await
        .map_err(|_| EtcdError::LeaderTransferTimeout)?;

    // 3. Catch up exactly.
    wait_for(&core.raft, deadline, |m| {
        m.current_leader != Some(me) || matched_index(m, target) >= m.last_log_index.unwrap_or(0)
    })
    .await?;

    // 4 and 5. Campaign, wait; lift the holds whatever happened.
    let others: Vec<(NodeId, MemberInfo)> = {
        let m = core.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter(|&v| v != me && v != target)
            .filter_map(|v| membership.get_node(&v).map(|n| (v, n.clone())))
            .collect()
    };
    let result = campaign_and_wait(&core, target, &others, timing, deadline).await;
    for (id, _) in &others {
        send_in_background(
            &core,
            *id,
            TransferMessage::HoldElections { duration_ms: 0 },
        );
    }
    match result {
        Ok(()) => tracing::info!(
            target = format!("{target:x}"),
            took_ms = started.elapsed().as_millis() as u64,
            "leadership transferred"
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

async fn campaign_and_wait(
    core: &Arc<Core>,
    target: NodeId,
    others: &[(NodeId, MemberInfo)],
    timing: Timing,
    deadline: Instant,
) -> Result<(), EtcdError> {
    let me = core.config.member_id;
    if core.leader() != Some(me) {
        return finished(core, target);
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let margin = timing
        .election_timeout
        .saturating_mul(HOLD_MARGIN_ELECTION_TIMEOUTS);
    let hold = millis(remaining.saturating_add(margin));
    for (id, _) in others {
        send_in_background(
            core,
            *id,
            TransferMessage::HoldElections { duration_ms: hold },
        );
    }
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

/// The outcome once this member no longer leads.
fn finished(core: &Core, target: NodeId) -> Result<(), EtcdError> {
    if core.leader() == Some(target) {
        Ok(())
    } else {
        Err(EtcdError::LeaderTransferTimeout)
    }
}

/// Waits until `done` holds for the Raft metrics; the transfer's timeout
/// error at `deadline`.
async fn wait_for(
    raft: &Raft,
    deadline: Instant,
    mut done: impl FnMut(&RaftMetrics<NodeId, MemberInfo>) -> bool,
) -> Result<(), EtcdError> {
    let mut rx = raft.metrics();
    loop {
        if done(&rx.borrow_and_update()) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Err(_) => return Err(EtcdError::LeaderTransferTimeout),
            Ok(Err(_)) => return Err(EtcdError::Stopped),
            Ok(Ok(())) => {}
        }
    }
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
        core.transfer.hold_elections(&core.raft, hold);
        Self { core: core.clone() }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.core.raft.runtime_config().heartbeat(true);
        self.core
            .transfer
            .hold_elections(&self.core.raft, Duration::ZERO);
    }
}

/// Sends a transfer message to member `to` and returns its answer.
async fn send(
    core: &Core,
    to: NodeId,
    message: &TransferMessage,
    deadline: Instant,
) -> Result<(), String> {
    let mut client = core
        .peer(to)
        .map_err(|_| format!("member {to:x} is not in this member's membership"))?;
    let timeout = Duration::from_millis(PEER_RPC_TIMEOUT_MS)
        .min(deadline.saturating_duration_since(Instant::now()));
    let mut request = tonic::Request::new(RaftMessage {
        payload: codec::encode(message),
    });
    request.set_timeout(timeout);
    let reply = tokio::time::timeout(timeout, client.leader_transfer(request))
        .await
        .map_err(|_| format!("member {to:x} did not answer within {timeout:?}"))?
        .map_err(|status| format!("member {to:x}: {status}"))?;
    codec::decode::<Result<(), String>>(&reply.into_inner().payload)
        .map_err(|e| format!("member {to:x} answered garbage: {e}"))?
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
pub fn serve_peer(core: &Core, message: TransferMessage) -> Result<(), String> {
    let cap = Timing::of(&core.raft).max_peer_request();
    match message {
        TransferMessage::HoldElections { duration_ms } => {
            let duration = Duration::from_millis(duration_ms).min(cap);
            core.transfer.hold_elections(&core.raft, duration);
            Ok(())
        }
        TransferMessage::Campaign { duration_ms } => {
            let me = core.config.member_id;
            let m = core.raft.metrics().borrow().clone();
            if !m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == me)
            {
                return Err(format!("member {me:x} is not a voter"));
            }
            // A hold left by an earlier transfer must not slow this one.
            core.transfer.hold_elections(&core.raft, Duration::ZERO);
            let duration = Duration::from_millis(duration_ms).min(cap);
            core.transfer.campaign(&core.raft, duration);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long the tests wait to see that something stays blocked (paused
    /// clock: no real time passes).
    const BLOCKED_MS: u64 = 50;

    #[tokio::test(start_paused = true)]
    async fn closing_waits_for_passes_and_holds_new_ones_back() {
        let gate = TransferGate::default();
        let in_flight = gate.enter().await;
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close().await }
        });
        tokio::time::sleep(Duration::from_millis(BLOCKED_MS)).await;
        assert!(!closing.is_finished(), "closed under a pass in flight");

        // A transfer is waiting to close: newcomers queue behind it.
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(matches!(
            gate.enter_until(deadline).await,
            Err(ForwardError::Etcd(EtcdError::Timeout))
        ));

        drop(in_flight);
        let closed = closing.await.expect("closing task");
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(
            gate.enter_until(deadline).await.is_err(),
            "passed a closed gate"
        );
        drop(closed);
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(
            gate.enter_until(deadline).await.is_ok(),
            "gate did not reopen"
        );
    }

    #[test]
    fn after_never_overflows() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            assert!(after(Duration::MAX) > Instant::now());
        });
    }

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

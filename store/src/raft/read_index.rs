//! ReadIndex rounds on the leader, shared by concurrent readers.
//!
//! A round takes the read index from openraft (its commit index, or its
//! term's first entry until that commits: `get_read_log_id`) and then, in
//! the same term, confirms leadership by polling the voters: each answers
//! whether its vote is still this leader's
//! (`storepeer.RaftPeer/ConfirmLeader`, [`follows`]), and the
//! round is confirmed once a majority of every voter configuration (joint
//! ones included, this member counting for itself) said yes. The poll is
//! sent after every reader of the round arrived, so a yes proves that, at
//! some moment after the read began, that voter had not voted for a newer
//! leader; a newer leader needs a majority, which meets the yes quorum, and
//! votes only grow. So no write a newer leader committed can predate the
//! read. Every reader that queued while a round ran joins the next one:
//! never a round already in flight, which might predate a write the reader
//! saw acknowledged. So N concurrent readers cost one poll, not N.
//!
//! Why not openraft's own confirmation (a heartbeat round and its
//! acknowledgement clock): with pipelined replication, openraft credits an
//! answer to an append with the send time of every later request it had
//! queued that adds no entry (`InflightAppendQueue::drain_acked` drains all
//! requests whose last log id the answer's match covers), such as a
//! commit-index update sent after the read arrived. A follower's answer
//! written before it stopped then confirmed a read that arrived afterwards:
//! once in CI a leader answered a linearizable read while both followers
//! were SIGSTOPped. The poll's answers are one per request, on their own
//! calls, so none is credited to a later one.
//!
//! A round that no quorum confirms within [`READ_INDEX_RETRY`] is tried
//! again (a new read index and a new poll), as etcd's read loop re-sends its
//! ReadIndex every `readIndexRetryTime`, until the round's timeout (etcd's
//! request timeout): a member starved of CPU for a moment, an answer lost
//! or late, delays reads instead of failing them. openraft alone would fail
//! the read once its leader lease (`election_timeout_max`, 500 ms at etcd's
//! default election timeout) passed without a quorum's acknowledgement;
//! under a heavy load that answered some reads "request timed out" after
//! about a second. As in etcd, each re-send is logged ("waiting for ReadIndex
//! response took too long, retrying"), a round that times out counts in
//! `etcd_server_slow_read_indexes_total` and one that ends because this
//! member does not lead in `etcd_server_read_indexes_failed_total`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use openraft::error::{Fatal, LinearizableReadError, RaftError};
use openraft::LinearizerOption;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::elections::TransferGate;
use super::network::PeerNetworkFactory;
use super::{LeaderId, MemberInfo, NodeId, Raft, TypeConfig, Vote};

/// Why a ReadIndex round gave no index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadIndexError {
    /// This member does not lead (it may know who does).
    NotLeader(Option<NodeId>),
    /// No quorum confirmed leadership in time.
    Timeout,
    /// Raft stopped.
    Stopped,
}

type Waiter = oneshot::Sender<Result<u64, ReadIndexError>>;

/// How long one attempt of a round waits for its read index and a quorum's
/// answers to its poll, before the round tries again (etcd's
/// `readIndexRetryTime`, 500 ms).
pub const READ_INDEX_RETRY: Duration = Duration::from_millis(500);

/// The age openraft's acknowledgement clock may have when it gives the read
/// index: any. openraft is asked for the index only; [`VoterPoll`]
/// confirms leadership (module docs).
const READ_LOG_ID_ANY_ACK_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Linearizable reads waiting for the next ReadIndex round on this member;
/// beyond this, readers wait to enqueue (backpressure, not memory).
pub const READ_INDEX_QUEUE: usize = 16_384;

/// The queue of readers waiting for the next round (one per member).
pub struct ReadRounds {
    waiters: mpsc::Sender<Waiter>,
}

impl ReadRounds {
    /// Starts the task that runs rounds; each round passes `gate`, is
    /// bounded by `round_timeout` and polls the voters through `peers`
    /// (this member is `me`).
    pub fn spawn(
        raft: Raft,
        gate: TransferGate,
        round_timeout: Duration,
        peers: PeerNetworkFactory,
        me: NodeId,
    ) -> Self {
        let (waiters, rx) = mpsc::channel(READ_INDEX_QUEUE);
        let poll = VoterPoll { peers, me };
        tokio::spawn(run_rounds(raft, poll, gate, round_timeout, rx));
        Self { waiters }
    }

    /// Joins the next round and returns its read index.
    pub async fn read_index(&self) -> Result<u64, ReadIndexError> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .send(tx)
            .await
            .map_err(|_| ReadIndexError::Stopped)?;
        rx.await.map_err(|_| ReadIndexError::Stopped)?
    }
}

/// Runs rounds: takes every waiter queued so far, confirms leadership once
/// for all of them, answers them all.
async fn run_rounds(
    raft: Raft,
    poll: VoterPoll,
    gate: TransferGate,
    round_timeout: Duration,
    mut rx: mpsc::Receiver<Waiter>,
) {
    let mut waiters = Vec::new();
    while rx.recv_many(&mut waiters, READ_INDEX_QUEUE).await > 0 {
        // A leadership transfer holds rounds back, as it holds writes
        // (see crate::server::peer::transfer): reads resume on the new leader.
        let round = async {
            let _gate = gate.enter().await;
            confirm(&raft, &poll).await
        };
        let result = tokio::time::timeout(round_timeout, round)
            .await
            .unwrap_or(Err(ReadIndexError::Timeout));
        let server = &crate::metrics::global().server;
        match result {
            Err(ReadIndexError::Timeout) => {
                server.slow_read_indexes.inc();
            }
            Err(ReadIndexError::NotLeader(_)) => {
                server.read_indexes_failed.inc();
            }
            Ok(_) | Err(ReadIndexError::Stopped) => {}
        }
        for w in waiters.drain(..) {
            let _ = w.send(result);
        }
    }
}

/// One round: attempts until one gets a quorum's confirmation (the
/// caller bounds the whole round with its timeout).
async fn confirm(raft: &Raft, poll: &VoterPoll) -> Result<u64, ReadIndexError> {
    loop {
        let started = Instant::now();
        match attempt(raft, poll).await {
            Attempt::Confirmed(index) => return Ok(index),
            Attempt::Failed(e) => return Err(e),
            Attempt::Unconfirmed => {
                tracing::warn!(
                    retry_timeout_ms = READ_INDEX_RETRY.as_millis() as u64,
                    "waiting for ReadIndex response took too long, retrying"
                );
                // Attempts start at most one per READ_INDEX_RETRY, even if
                // one came back early.
                tokio::time::sleep_until(started + READ_INDEX_RETRY).await;
            }
        }
    }
}

/// What one ReadIndex attempt came to.
enum Attempt {
    Confirmed(u64),
    /// No quorum confirmed leadership in time.
    Unconfirmed,
    Failed(ReadIndexError),
}

/// One attempt within [`READ_INDEX_RETRY`]: the read index from openraft,
/// then the voters' poll.
///
/// In that order, and the poll's vote must be the one the read index was
/// taken under (the index's entry is of the leader's term: openraft's read
/// index is at least its term's first entry). A leader deposed and elected
/// again between the two would otherwise confirm, in its new term, an
/// index taken while it was stale, which may miss a write the leader in
/// between committed before the read arrived.
async fn attempt(raft: &Raft, poll: &VoterPoll) -> Attempt {
    let deadline = Instant::now() + READ_INDEX_RETRY;
    let option = LinearizerOption::new(Some(READ_LOG_ID_ANY_ACK_AGE), false)
        .with_wait_timeout(READ_INDEX_RETRY);
    let read_log_id = match raft.get_read_log_id(option).await {
        Ok((read_log_id, _applied)) => read_log_id,
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
            return Attempt::Failed(ReadIndexError::NotLeader(f.leader_id))
        }
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
            return Attempt::Unconfirmed
        }
        Err(RaftError::Fatal(_)) => return Attempt::Failed(ReadIndexError::Stopped),
    };
    let index = read_log_id.index();
    match poll
        .confirm(raft, read_log_id.committed_leader_id(), deadline)
        .await
    {
        Ok(true) => Attempt::Confirmed(index),
        Ok(false) => Attempt::Unconfirmed,
        Err(e) => Attempt::Failed(e),
    }
}

/// Whether this member's vote is for `vote`'s leader (in `vote`'s term): a
/// voter's answer to a leader's [`VoterPoll`]. Read inside openraft's core,
/// so a vote granted to a newer candidate is seen as soon as it is sent.
pub async fn follows(raft: &Raft, vote: &Vote) -> Result<bool, Fatal<TypeConfig>> {
    let leader = vote.leader_id;
    raft.with_raft_state(move |st| st.vote_ref().leader_id == leader)
        .await
}

/// The leader's side of the poll.
struct VoterPoll {
    peers: PeerNetworkFactory,
    me: NodeId,
}

/// What the leader polls with: its vote, the voter configurations (one, or
/// two while joint) and where the voters are.
struct PollPlan {
    vote: Vote,
    configs: Vec<BTreeSet<NodeId>>,
    nodes: BTreeMap<NodeId, MemberInfo>,
}

impl VoterPoll {
    /// True once a majority of every configuration answered yes to this
    /// member's vote, false if that had not happened by `deadline` or the
    /// vote is no longer `read_leader` (the leader id the read index was
    /// taken under); an error if this member no longer leads.
    async fn confirm(
        &self,
        raft: &Raft,
        read_leader: &LeaderId,
        deadline: Instant,
    ) -> Result<bool, ReadIndexError> {
        let plan = raft
            .with_raft_state(|st| {
                let membership = st.membership_state.effective().membership();
                PollPlan {
                    vote: *st.vote_ref(),
                    configs: membership.get_joint_config().clone(),
                    nodes: membership.nodes().map(|(id, n)| (*id, n.clone())).collect(),
                }
            })
            .await
            .map_err(|_| ReadIndexError::Stopped)?;
        if !plan.vote.committed || plan.vote.leader_id.node_id != self.me {
            return Err(ReadIndexError::NotLeader(None));
        }
        if plan.vote.leader_id != *read_leader {
            return Ok(false);
        }
        let mut yes = BTreeSet::from([self.me]);
        if has_quorum(&plan.configs, &yes) {
            return Ok(true);
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        let voters: BTreeSet<NodeId> = plan.configs.iter().flatten().copied().collect();
        let mut answers: FuturesUnordered<_> = voters
            .into_iter()
            .filter(|id| *id != self.me)
            .filter_map(|id| Some((id, plan.nodes.get(&id)?)))
            .map(|(id, node)| async move {
                let said_yes = self
                    .peers
                    .confirm_leader(id, node, &plan.vote, timeout)
                    .await;
                (id, said_yes)
            })
            .collect();
        while let Ok(Some((id, said_yes))) = tokio::time::timeout_at(deadline, answers.next()).await
        {
            if said_yes {
                yes.insert(id);
                if has_quorum(&plan.configs, &yes) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

/// A majority of every configuration in `yes`.
fn has_quorum(configs: &[BTreeSet<NodeId>], yes: &BTreeSet<NodeId>) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|config| 2 * config.intersection(yes).count() > config.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    /// A quorum is a strict majority of each configuration: two of three,
    /// three of four, and while joint a majority of the old and of the new.
    #[test]
    fn a_quorum_is_a_majority_of_every_configuration() {
        let three = vec![set(&[1, 2, 3])];
        assert!(!has_quorum(&three, &set(&[1])));
        assert!(has_quorum(&three, &set(&[1, 3])));
        let four = vec![set(&[1, 2, 3, 4])];
        assert!(!has_quorum(&four, &set(&[1, 2])));
        assert!(has_quorum(&four, &set(&[1, 2, 4])));
        let joint = vec![set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!has_quorum(&joint, &set(&[1, 2])), "no majority of the new");
        assert!(
            !has_quorum(&joint, &set(&[3, 4, 5])),
            "no majority of the old"
        );
        assert!(has_quorum(&joint, &set(&[1, 3, 4])));
        assert!(has_quorum(&[set(&[7])], &set(&[7])), "a member alone");
        assert!(!has_quorum(&[], &set(&[1])), "no configuration, no quorum");
    }
}

//! Proposal batching on the leader: concurrent proposals become one log
//! entry.
//!
//! With one log entry per client command, every write costs its own append,
//! its own share of the fsyncs and its own AppendEntries, and the Raft core
//! handles each separately. The batcher puts every proposal that arrives
//! while earlier entries are in flight into the next entry ([`Batch`]): N
//! concurrent writers cost one append, one fsync and one replication round,
//! not N. Each proposal
//! still gets its own revision and its own answer (the state machine
//! applies a batch's proposals in order and answers each).
//!
//! The algorithm ([`crate::batching::Lane`]): callers queue `(proposal,
//! answer channel)`; one task waits until fewer than
//! [`MAX_ENTRIES_IN_FLIGHT`] entries are between `client_write` and its
//! answer, then takes everything queued so far, up to
//! [`MAX_PROPOSALS_PER_ENTRY`] proposals and [`MAX_ENTRY_BYTES`], and
//! submits it as one entry. While entries are in flight, proposals keep
//! queueing and form the next entry. A lone client therefore waits for no
//! timer: its proposal is submitted at once.
//!
//! **The direct path** ([`crate::batching::Lane::direct_permit`]). When
//! nothing is queued and no entry is out (a lone writer), the caller's own
//! task submits its proposal as an entry (`client_write_ff`) and waits for the answer
//! itself, instead of handing it to the batching task, which would hand it
//! to a task of its own, whose answer would travel back the same way. A
//! lone writer's put thus crosses two tasks fewer each way (on two shared
//! cores every such hop is a wake-up of the other runtime thread). The
//! entry's permit travels inside its responder ([`EntryResponder`]):
//! openraft drops or completes the responder when the entry is answered or
//! abandoned, so a caller that gives up (timeout, cancelled RPC) does not
//! release the permit of an entry still in the pipeline. Both paths share
//! one semaphore, so the bound on entries in flight holds for their sum.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::responder::Responder;
use openraft::OptionalSend;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::Raft;
use super::{Batch, CommandResponse, NodeId, Proposal, TypeConfig};
use crate::batching;

/// Proposals per log entry, at most: bounds an entry's apply time and the
/// answers held while it is in flight.
pub const MAX_PROPOSALS_PER_ENTRY: usize = 1_024;

/// Encoded proposal bytes per log entry, at most (an entry holds at least
/// one proposal, which may alone be up to `--max-request-bytes`): keeps
/// AppendEntries messages near etcd's 1 MiB `MaxSizePerMsg`.
pub const MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// Entries submitted to openraft and not yet answered. Entries in flight
/// let the next batch grow while the current ones are flushed and
/// replicated; openraft 0.10 pipelines them (the leader's append, its fsync
/// and the followers' appends of consecutive entries overlap), so more than
/// one keeps that pipeline busy. Measured on 2 cores (3 members, h2load
/// with 1 to 1,000 streams): 2 and 4 are equal within the run-to-run noise
/// (about 15%); 4 leaves room for the deeper pipeline.
pub const MAX_ENTRIES_IN_FLIGHT: usize = 4;

/// Proposals waiting for the batcher; beyond this, proposers wait to
/// enqueue (backpressure, not memory).
pub const PROPOSAL_QUEUE: usize = 16_384;

/// Why a batched proposal has no answer.
#[derive(Debug, Clone)]
pub enum BatchError {
    /// This member does not lead (it may know who does).
    NotLeader(Option<NodeId>),
    /// openraft refused the entry for another reason (a membership change
    /// in progress).
    NotCapable,
    /// The entry was proposed but the leader lost leadership before it
    /// committed; a later leader may still commit it.
    Discarded,
    /// Raft stopped.
    Stopped,
}

type Answer = oneshot::Sender<Result<CommandResponse, BatchError>>;

/// A proposal and where its answer goes.
struct Queued {
    proposal: Proposal,
    answer: Answer,
}

/// The leader's proposal queue (one per member; idle on followers).
pub struct Batcher {
    lane: batching::Lane<Queued>,
    raft: Raft,
}

impl Batcher {
    /// Starts the batching task for `raft`.
    pub fn spawn(raft: Raft) -> Self {
        let bounds = batching::Bounds {
            items: MAX_PROPOSALS_PER_ENTRY,
            bytes: MAX_ENTRY_BYTES,
            size: |q: &Queued| q.proposal.size_bytes(),
            joins: |_, _| true,
        };
        let sender = raft.clone();
        let send = move |queued: Vec<Queued>| {
            let raft = sender.clone();
            async move {
                let (proposals, answers): (Vec<Proposal>, Vec<_>) =
                    queued.into_iter().map(|q| (q.proposal, q.answer)).unzip();
                let result = raft
                    .client_write(Batch {
                        proposals: proposals.into(),
                    })
                    .await;
                answer_all(answers, result.map(|r| r.data));
            }
        };
        let lane = batching::Lane::spawn(PROPOSAL_QUEUE, MAX_ENTRIES_IN_FLIGHT, bounds, send);
        Self { lane, raft }
    }

    /// Proposes through the next entry; the state machine's answer.
    pub async fn propose(&self, proposal: Proposal) -> Result<CommandResponse, BatchError> {
        let metrics = &crate::metrics::global().server;
        let _pending = crate::metrics::GaugeGuard::new(&metrics.proposals_pending);
        let result = match self.lane.direct_permit() {
            Some(permit) => self.propose_direct(proposal, permit).await,
            None => self.propose_queued(proposal).await,
        };
        if result.is_err() {
            metrics.proposals_failed.inc();
        }
        result
    }

    async fn propose_direct(
        &self,
        proposal: Proposal,
        permit: OwnedSemaphorePermit,
    ) -> Result<CommandResponse, BatchError> {
        let (responder, answer) = EntryResponder::new(permit);
        let batch = Batch {
            proposals: Arc::new([proposal]),
        };
        self.raft
            .client_write_ff(batch, Some(responder))
            .await
            .map_err(|_| BatchError::Stopped)?;
        let written = answer.await.map_err(|_| BatchError::Stopped)?;
        let mut responses = written.map_err(batch_error)?.data;
        assert_eq!(
            responses.len(),
            1,
            "the state machine answers every proposal of an entry"
        );
        Ok(responses.pop().expect("one answer"))
    }

    async fn propose_queued(&self, proposal: Proposal) -> Result<CommandResponse, BatchError> {
        let (answer, rx) = oneshot::channel();
        self.lane
            .enqueue(Queued { proposal, answer })
            .await
            .map_err(|_| BatchError::Stopped)?;
        rx.await.map_err(|_| BatchError::Stopped)?
    }
}

/// The responder of a directly submitted entry: sends openraft's result to
/// the waiting caller and holds the entry's permit until openraft completes
/// or drops it.
pub struct EntryResponder<T> {
    answer: oneshot::Sender<T>,
    _permit: OwnedSemaphorePermit,
}

impl<T> EntryResponder<T> {
    /// A responder holding `permit`, and the receiver of its answer.
    fn new(permit: OwnedSemaphorePermit) -> (Self, oneshot::Receiver<T>) {
        let (answer, rx) = oneshot::channel();
        let responder = EntryResponder {
            answer,
            _permit: permit,
        };
        (responder, rx)
    }
}

impl<T> Responder<TypeConfig, T> for EntryResponder<T>
where
    T: OptionalSend + 'static,
{
    fn on_complete(self, result: T) {
        let _ = self.answer.send(result);
    }
}

fn answer_all(
    answers: Vec<Answer>,
    result: Result<Vec<CommandResponse>, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>,
) {
    match result {
        Ok(responses) => {
            assert_eq!(
                responses.len(),
                answers.len(),
                "the state machine answers every proposal of an entry"
            );
            for (answer, response) in answers.into_iter().zip(responses) {
                let _ = answer.send(Ok(response));
            }
        }
        Err(e) => {
            let error = match e {
                RaftError::APIError(e) => batch_error(e),
                RaftError::Fatal(_) => BatchError::Stopped,
            };
            for answer in answers {
                let _ = answer.send(Err(error.clone()));
            }
        }
    }
}

/// Why openraft refused or abandoned an entry.
fn batch_error(error: ClientWriteError<TypeConfig>) -> BatchError {
    match error {
        ClientWriteError::ForwardToLeader(f) => BatchError::NotLeader(f.leader_id),
        // The leader lost leadership before the entry committed: it may
        // still commit under the next leader (etcd answers the same
        // uncertainty with a timeout).
        ClientWriteError::LogEntryDiscarded(_) => BatchError::Discarded,
        ClientWriteError::ChangeMembershipError(_) | ClientWriteError::PreconditionFailed(_) => {
            BatchError::NotCapable
        }
    }
}

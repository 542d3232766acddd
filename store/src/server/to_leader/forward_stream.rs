//! A follower's forwarded batches on one long-lived stream per leader.
//!
//! A unary `storepeer.RaftPeer/Forward` call per batch costs both members
//! an HTTP/2 stream each time: the request's and the answer's headers
//! (HPACK-coded), the trailers, a task on the leader, tonic's request and
//! response set-up. The batches themselves are small (at 256 writers a
//! follower's batch held 12-13 proposals), so that per-call work was a
//! large part of what forwarding cost. Here a follower opens one
//! `storepeer.RaftPeer/ForwardStream` to the leader and sends each batch as
//! one message, `(id, LeaderRequest)`; the leader serves the messages as
//! they arrive, several at once ([`MAX_SERVED_PER_STREAM`]), and answers
//! each with `(id, Result<LeaderReply, ForwardError>)`, in whatever order
//! they finish.
//!
//! Failure keeps the unary call's rules (see [`crate::server::to_leader::forward`]):
//! - [`ForwardStreams::ask`] answers `None` only when the batch was not
//!   sent: no stream could be opened, or it had ended; the caller then
//!   makes the unary call, whose own failure says whether to retry.
//! - a stream that fails while batches are out answers each with etcd's
//!   "timed out due to connection lost": they may have been applied;
//! - a stream the leader ends cleanly (OK status) has answered every batch
//!   it took: a leader that stops takes no more messages, finishes the ones
//!   it serves, answers them and then ends the stream. A batch still owed an
//!   answer then never reached the leader's service (it was in flight, or
//!   waiting in h2, when the leader stopped taking) and is answered
//!   [`ForwardError::NotLeader`]: sent again once a leader is known. Without
//!   this, each rolling restart of a leader failed the writes a follower
//!   was forwarding at that moment with "request timed out, possibly due to
//!   connection lost" though none had been applied;
//! - a batch not answered within its timeout gets the same error, as a
//!   unary call past its deadline does.
//!
//! A leader that does not know the method (an older build during a rolling
//! upgrade) answers `Unimplemented`; it is then asked with unary calls for
//! [`UNSUPPORTED_RETRY`] before a stream is tried again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::raft::network::PeerClient;
use etcd_proto::storepeer::RaftMessage;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

use crate::codec;
use crate::errors::EtcdError;
use crate::raft::NodeId;
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};

/// Batches queued for one stream's sending side at most. The lanes that
/// use a stream keep a few batches in flight each, so a full queue means
/// the stream is stuck; the batch then goes as a unary call.
pub const STREAM_QUEUE: usize = 64;

/// Forwarded batches the leader serves at once on one stream (beyond it,
/// the stream's flow control holds the follower's next messages).
pub const MAX_SERVED_PER_STREAM: usize = 64;

/// How long a leader that answered `Unimplemented` is asked with unary
/// calls before a stream is tried again.
pub const UNSUPPORTED_RETRY: Duration = Duration::from_secs(30);

/// The leader's answer to one forwarded request.
pub type Reply = Result<LeaderReply, ForwardError>;

/// What a request message carries: its id and the request.
pub type StreamedRequest = (u64, LeaderRequest);

/// What an answer message carries: the id of the request it answers and
/// the answer.
pub type StreamedReply = (u64, Reply);

/// The message carrying request `id`.
pub fn encode_request(id: u64, request: &LeaderRequest) -> RaftMessage {
    RaftMessage {
        payload: codec::encode(&(id, request)),
    }
}

/// The message answering request `id`.
pub fn encode_reply(id: u64, reply: &Reply) -> RaftMessage {
    RaftMessage {
        payload: codec::encode(&(id, reply)),
    }
}

fn lost() -> ForwardError {
    ForwardError::Etcd(EtcdError::TimeoutDueToConnectionLost)
}

/// The answer to a batch the leader never took (see the module docs).
fn not_taken() -> ForwardError {
    ForwardError::NotLeader(None)
}

/// How a stream's answers ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The leader ended them with an OK status, after answering every
    /// batch it took.
    Cleanly,
    /// With an error, or an answer that did not decode.
    Failed,
}

/// What is known of one leader's stream.
enum State {
    /// Open (while its `alive` flag holds).
    Open(Arc<Link>),
    /// The leader answered `Unimplemented` at this time.
    Unsupported(Instant),
}

/// One leader's state; its lock is held while a stream to it opens, so
/// its concurrent batches wait for that stream rather than each opening
/// one, and batches for another leader do not wait at all.
type Slot = Arc<tokio::sync::Mutex<Option<State>>>;

/// The follower's streams, one per leader it forwarded to.
#[derive(Default)]
pub struct ForwardStreams {
    slots: Mutex<HashMap<NodeId, Slot>>,
}

impl ForwardStreams {
    /// No streams yet; each opens with its leader's first batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// `request`'s answer from `leader` (reached through `client`) over its
    /// stream, by `deadline`; `None` if the request was not sent (see the
    /// module docs), and the caller should make a unary call. Finding or
    /// opening the stream takes at most half the time left, so a unary
    /// call still has time after a failure.
    pub async fn ask(
        &self,
        leader: NodeId,
        client: &PeerClient,
        request: &LeaderRequest,
        deadline: Instant,
    ) -> Option<Reply> {
        let wait = deadline.saturating_duration_since(Instant::now()) / 2;
        let link = tokio::time::timeout(wait, self.link(leader, client))
            .await
            .ok()??;
        link.ask(request, deadline).await
    }

    fn slot(&self, leader: NodeId) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.entry(leader).or_default().clone()
    }

    /// The open stream to `leader`, opened now if there is none.
    async fn link(&self, leader: NodeId, client: &PeerClient) -> Option<Arc<Link>> {
        let slot = self.slot(leader);
        let mut state = slot.lock().await;
        match &*state {
            Some(State::Open(link)) if link.alive.load(Ordering::SeqCst) => {
                return Some(link.clone())
            }
            Some(State::Unsupported(since)) if since.elapsed() < UNSUPPORTED_RETRY => return None,
            _ => {}
        }
        // Left empty if the caller gives up while the stream opens.
        *state = None;
        match Link::open(client.clone()).await {
            Ok(link) => {
                *state = Some(State::Open(link.clone()));
                Some(link)
            }
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::info!(leader, "the leader has no forward stream: unary forwards");
                *state = Some(State::Unsupported(Instant::now()));
                None
            }
            Err(status) => {
                tracing::debug!(leader, %status, "opening the forward stream failed");
                None
            }
        }
    }
}

/// One open stream: its sending side and the requests it owes answers.
struct Link {
    requests: mpsc::Sender<RaftMessage>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    /// Cleared when the answers end, before the pending requests are
    /// failed: a request registered after that sees it and is not sent.
    alive: AtomicBool,
}

impl Link {
    /// Opens a stream through `client` and starts reading its answers.
    async fn open(mut client: PeerClient) -> Result<Arc<Link>, tonic::Status> {
        let (requests, outgoing) = mpsc::channel(STREAM_QUEUE);
        let answers = client
            .forward_stream(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        let link = Arc::new(Link {
            requests,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            alive: AtomicBool::new(true),
        });
        tokio::spawn(read_answers(link.clone(), answers));
        Ok(link)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Reply>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, id: u64) -> Option<oneshot::Sender<Reply>> {
        self.pending().remove(&id)
    }

    async fn ask(&self, request: &LeaderRequest, deadline: Instant) -> Option<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.pending().insert(id, answer);
        if !self.alive.load(Ordering::SeqCst)
            || self.requests.try_send(encode_request(id, request)).is_err()
        {
            // Not sent: the stream ended or is stuck.
            self.take(id);
            return None;
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(reply)) => Some(reply),
            Ok(Err(_)) => Some(Err(lost())),
            Err(_elapsed) => {
                self.take(id);
                Some(Err(lost()))
            }
        }
    }

    /// The answers ended: no new request is sent on this stream, and each
    /// one it owes is answered with [`not_taken`] if the leader ended the
    /// stream cleanly, else with [`lost`].
    fn close(&self, ended: Ended) {
        self.alive.store(false, Ordering::SeqCst);
        let owed: Vec<_> = self.pending().drain().map(|(_, answer)| answer).collect();
        for answer in owed {
            let error = match ended {
                Ended::Cleanly => not_taken(),
                Ended::Failed => lost(),
            };
            let _ = answer.send(Err(error));
        }
    }
}

/// Hands each answer to its request until the stream ends.
async fn read_answers(link: Arc<Link>, mut answers: Streaming<RaftMessage>) {
    let ended = loop {
        match answers.message().await {
            Ok(Some(message)) => match codec::decode::<StreamedReply>(&message.payload) {
                Ok((id, reply)) => {
                    if let Some(answer) = link.take(id) {
                        let _ = answer.send(reply);
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "an answer on the forward stream does not decode");
                    break Ended::Failed;
                }
            },
            Ok(None) => break Ended::Cleanly,
            Err(status) => {
                tracing::debug!(%status, "the forward stream ended");
                break Ended::Failed;
            }
        }
    };
    link.close(ended);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::server::to_leader::fake_leader::{FakeLeader, StreamMode};

    const TIMEOUT: Duration = Duration::from_secs(10);

    fn fake(stream: StreamMode) -> FakeLeader {
        FakeLeader {
            stream,
            ..FakeLeader::default()
        }
    }

    /// `leader`'s answer to `HashKv(n)` within [`TIMEOUT`].
    async fn ask(
        streams: &ForwardStreams,
        leader: NodeId,
        client: &PeerClient,
        n: i64,
    ) -> Option<Reply> {
        let deadline = Instant::now() + TIMEOUT;
        streams
            .ask(leader, client, &LeaderRequest::HashKv(n), deadline)
            .await
    }

    #[tokio::test]
    async fn each_answer_reaches_its_request_on_one_stream() {
        let fake = fake(StreamMode::Answer);
        let client = fake.serve().await;
        let streams = Arc::new(ForwardStreams::new());
        let asks = (0..40).map(|n| {
            let (streams, client) = (streams.clone(), client.clone());
            tokio::spawn(async move {
                let reply = ask(&streams, 7, &client, n).await;
                (n, reply)
            })
        });
        for task in asks.collect::<Vec<_>>() {
            let (n, reply) = task.await.expect("ask task");
            let want = u64::try_from(n).expect("n >= 0");
            assert!(
                matches!(reply, Some(Ok(LeaderReply::ClusterId(got))) if got == want),
                "request {n}: {reply:?}"
            );
        }
        assert_eq!(fake.stream_calls.load(Ordering::SeqCst), 1, "one stream");
    }

    #[tokio::test]
    async fn a_leader_without_the_stream_is_left_to_unary_calls() {
        let fake = fake(StreamMode::Unimplemented);
        let client = fake.serve().await;
        let streams = ForwardStreams::new();
        for _ in 0..3 {
            let reply = ask(&streams, 7, &client, 1).await;
            assert!(reply.is_none(), "not sent: {reply:?}");
        }
        assert_eq!(
            fake.stream_calls.load(Ordering::SeqCst),
            1,
            "asked once, then not again within UNSUPPORTED_RETRY"
        );
    }

    /// A request the stream took may have been applied: when the stream
    /// ends unanswered, it gets etcd's connection-lost timeout, not a retry;
    /// the next request opens a new stream.
    #[tokio::test]
    async fn a_stream_that_ends_fails_what_it_owes_and_is_opened_again() {
        let fake = fake(StreamMode::HangUp);
        let client = fake.serve().await;
        let streams = ForwardStreams::new();
        for opened in 1..=2 {
            let reply = ask(&streams, 7, &client, 1).await;
            assert!(
                matches!(
                    reply,
                    Some(Err(ForwardError::Etcd(
                        EtcdError::TimeoutDueToConnectionLost
                    )))
                ),
                "{reply:?}"
            );
            assert_eq!(fake.stream_calls.load(Ordering::SeqCst), opened);
        }
    }

    /// A leader that stops ends its stream cleanly after answering what it
    /// took: a batch it never took is answered "not leader" (sent again),
    /// not "connection lost".
    #[tokio::test]
    async fn a_batch_a_stopping_leader_did_not_take_is_sent_again() {
        let fake = fake(StreamMode::Stop);
        let client = fake.serve().await;
        let streams = ForwardStreams::new();
        let reply = ask(&streams, 7, &client, 1).await;
        assert!(
            matches!(reply, Some(Err(ForwardError::NotLeader(None)))),
            "{reply:?}"
        );
        assert!(reply.is_some_and(|r| r.is_err_and(|e| e.retryable())));
    }

    /// A leader whose stream does not open holds a batch for half its
    /// time at most (the rest is the unary call's), and batches for another
    /// leader do not wait for it.
    #[tokio::test]
    async fn a_stream_that_does_not_open_holds_half_the_time_and_no_other_leader() {
        let stalled = fake(StreamMode::Stall).serve().await;
        let healthy = fake(StreamMode::Answer).serve().await;
        let streams = Arc::new(ForwardStreams::new());
        let deadline = Instant::now() + Duration::from_secs(4);
        let stalled_ask = {
            let streams = streams.clone();
            tokio::spawn(async move {
                let reply = streams
                    .ask(1, &stalled, &LeaderRequest::HashKv(1), deadline)
                    .await;
                (reply, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let other = ask(&streams, 2, &healthy, 3).await;
        assert!(
            matches!(other, Some(Ok(LeaderReply::ClusterId(3)))),
            "{other:?}"
        );
        let answered_other = Instant::now();
        let (reply, at) = stalled_ask.await.expect("ask task");
        assert!(reply.is_none(), "not sent: {reply:?}");
        assert!(at < deadline, "the unary call keeps time");
        assert!(answered_other < at, "the other leader did not wait");
    }

    /// Through the lane's send: a leader without the stream still gets the
    /// batch, as one unary call.
    #[tokio::test]
    async fn a_batch_falls_back_to_a_unary_call() {
        let fake = fake(StreamMode::Unimplemented);
        let client = fake.serve().await;
        let streams = ForwardStreams::new();
        let (answer, answered) = oneshot::channel();
        let item = crate::server::to_leader::leader_lane::ToLeader {
            leader: 7,
            client,
            payload: 5_i64,
            deadline: Instant::now() + TIMEOUT,
            answer,
        };
        crate::server::to_leader::leader_lane::forward_batch(
            vec![item],
            &streams,
            |payloads: Vec<i64>| LeaderRequest::HashKv(payloads[0]),
            |reply, _| match reply {
                LeaderReply::ClusterId(id) => Ok(vec![Ok(id)]),
                _ => Err(ForwardError::Etcd(EtcdError::Timeout)),
            },
        )
        .await;
        let got = answered.await.expect("answered");
        assert!(matches!(got, Ok(u64::MAX)), "{got:?}");
        assert_eq!(fake.forward_calls.load(Ordering::SeqCst), 1);
    }
}

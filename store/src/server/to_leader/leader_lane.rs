//! A follower's batched requests to the leader: its forwarded writes
//! ([`crate::server::to_leader::forward_batch`]), its ReadIndex requests
//! ([`crate::server::to_leader::read_index_batch`]) and its lease renewals
//! ([`crate::server::to_leader::keepalive_batch`]) queue on a [`batching::Lane`] as
//! [`ToLeader`] items. A batch holds items for one leader only, travels in
//! one peer request before the earliest of its deadlines (forwards and
//! renewals as a message of the leader's forward stream,
//! [`crate::server::to_leader::forward_stream`]), and every item gets its own answer.

use std::future::Future;
use std::time::Duration;

use crate::raft::network::PeerClient;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::batching;
use crate::errors::EtcdError;
use crate::raft::NodeId;
use crate::server::to_leader::forward::{
    decode_reply, encode_request, transport_failure, ForwardError, LeaderReply, LeaderRequest,
};
use crate::server::to_leader::forward_stream::ForwardStreams;

/// Where one item's answer goes.
pub type Answer<A> = oneshot::Sender<Result<A, ForwardError>>;

/// One request queued for the leader.
pub struct ToLeader<P, A> {
    /// The leader it is meant for: a batch holds one leader's items.
    pub leader: NodeId,
    /// The peer client of that leader.
    pub client: PeerClient,
    /// What is asked.
    pub payload: P,
    /// When the caller stops waiting.
    pub deadline: Instant,
    /// Where the answer goes.
    pub answer: Answer<A>,
}

/// A batch taken apart for sending: the earliest deadline, the leader and
/// its client, the payloads and their answers in the same order.
pub struct Batch<P, A> {
    /// The earliest of the items' deadlines.
    pub deadline: Instant,
    /// The leader (every item names the same one).
    pub leader: NodeId,
    /// The leader's client.
    pub client: PeerClient,
    /// The items' payloads.
    pub payloads: Vec<P>,
    /// The items' answers, in the payloads' order.
    pub answers: Vec<Answer<A>>,
}

impl<P, A> Batch<P, A> {
    /// Takes `items` (at least one) apart, as it is sent.
    pub fn of(items: Vec<ToLeader<P, A>>) -> Self {
        let deadline = items.iter().map(|item| item.deadline).min();
        let deadline = deadline.expect("a batch holds at least one item");
        let (leader, client) = (items[0].leader, items[0].client.clone());
        let mut payloads = Vec::with_capacity(items.len());
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            payloads.push(item.payload);
            answers.push(item.answer);
        }
        Self {
            deadline,
            leader,
            client,
            payloads,
            answers,
        }
    }

    /// The time left until the deadline.
    pub fn timeout(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// Answers every item with `result`.
pub fn answer_all<A: Clone>(answers: Vec<Answer<A>>, result: &Result<A, ForwardError>) {
    for answer in answers {
        let _ = answer.send(result.clone());
    }
}

/// The answers in a leader's reply to a batch of `count` items, one per
/// item in order, or why there are none.
pub type Answers<A> = Result<Vec<Result<A, ForwardError>>, ForwardError>;

/// Sends a batch as one message on the leader's forward stream (see
/// [`crate::server::to_leader::forward_stream`]), or as one `storepeer.RaftPeer/Forward` call
/// when no stream takes it: `request` makes the leader request of the
/// payloads, `answers` takes the reply apart (given the number of items).
/// A transport failure, an answer that does not decode or does not fit
/// answers every item with the failure.
pub async fn forward_batch<P, A: Clone>(
    items: Vec<ToLeader<P, A>>,
    streams: &ForwardStreams,
    request: impl FnOnce(Vec<P>) -> LeaderRequest,
    answers: impl FnOnce(LeaderReply, usize) -> Answers<A>,
) {
    let batch = Batch::of(items);
    let count = batch.payloads.len();
    let (deadline, leader, mut client) = (batch.deadline, batch.leader, batch.client);
    let request = request(batch.payloads);
    let waiting = batch.answers;
    let reply = match streams.ask(leader, &client, &request, deadline).await {
        Some(reply) => reply,
        None => {
            let mut call = tonic::Request::new(encode_request(&request));
            call.set_timeout(deadline.saturating_duration_since(Instant::now()));
            match client.forward(call).await {
                Err(status) => Err(transport_failure(&status)),
                Ok(reply) => decode_reply(&reply.into_inner().payload),
            }
        }
    };
    let results = reply.and_then(|r| answers(r, count));
    match results {
        Ok(results) if results.len() == count => {
            for (answer, result) in waiting.into_iter().zip(results) {
                let _ = answer.send(result);
            }
        }
        Ok(_) => answer_all(waiting, &Err(ForwardError::Etcd(EtcdError::Timeout))),
        Err(e) => answer_all(waiting, &Err(e)),
    }
}

/// A lane of [`ToLeader`] items.
pub struct LeaderLane<P, A> {
    lane: batching::Lane<ToLeader<P, A>>,
}

impl<P: Send + 'static, A: Send + 'static> LeaderLane<P, A> {
    /// A lane of `queue_len` waiting items, at most `in_flight` batches out,
    /// each within `items` and `bytes` (by `size`), sent by `send`.
    pub fn spawn<Fut>(
        (queue_len, in_flight): (usize, usize),
        (items, bytes): (usize, usize),
        size: fn(&ToLeader<P, A>) -> usize,
        send: impl Fn(Vec<ToLeader<P, A>>) -> Fut + Send + 'static,
    ) -> Self
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let bounds = batching::Bounds {
            items,
            bytes,
            size,
            joins: |first, next| next.leader == first.leader,
        };
        let lane = batching::Lane::spawn(queue_len, in_flight, bounds, send);
        Self { lane }
    }

    /// Asks `leader` (through `client`) for `payload` in the next batch, or
    /// alone through `send` from this task when nothing is queued and no
    /// batch is out (see [`batching::Lane::direct_permit`]); the answer.
    pub async fn ask<Fut>(
        &self,
        (leader, client): (NodeId, PeerClient),
        payload: P,
        deadline: Instant,
        send: impl FnOnce(Vec<ToLeader<P, A>>) -> Fut,
    ) -> Result<A, ForwardError>
    where
        Fut: Future<Output = ()>,
    {
        let (answer, rx) = oneshot::channel();
        let item = ToLeader {
            leader,
            client,
            payload,
            deadline,
            answer,
        };
        let stopped = || ForwardError::Etcd(EtcdError::Stopped);
        self.lane.submit(item, send).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

//! A fake leader for the tests of a follower's batched requests: a
//! `storepeer.RaftPeer` server on a loopback port whose ReadIndex, Forward
//! and ForwardStream answer as the test says, counting the calls.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::storepeer::raft_peer_server::{RaftPeer, RaftPeerServer};
use etcd_proto::storepeer::RaftMessage;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::raft::network::{peer_client, PeerClient};
use crate::raft::peer_protocol::PeerChannel;
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};
use crate::server::to_leader::forward_stream;

/// How the fake answers `ForwardStream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// As a leader of an older build: `Unimplemented`.
    Unimplemented,
    /// Each request `HashKv(n)` is answered `ClusterId(n)` after
    /// `(10 - n % 10)` ms, so later requests often finish first.
    Answer,
    /// The first message ends the stream with an error, unanswered.
    HangUp,
    /// As a leader that stops: the stream ends cleanly (OK) after the first
    /// message arrives, which it does not serve.
    Stop,
    /// The stream never opens: the call does not answer.
    Stall,
}

/// What the fake answers, and its call counters.
#[derive(Clone)]
pub struct FakeLeader {
    /// ReadIndex answers this after `read_index_delay`.
    pub read_index: Result<u64, ForwardError>,
    /// How long a ReadIndex call takes.
    pub read_index_delay: Duration,
    /// How ForwardStream answers.
    pub stream: StreamMode,
    /// ReadIndex calls.
    pub read_index_calls: Arc<AtomicUsize>,
    /// ForwardStream calls (streams opened or refused).
    pub stream_calls: Arc<AtomicUsize>,
    /// Unary Forward calls (each answered `ClusterId(u64::MAX)`).
    pub forward_calls: Arc<AtomicUsize>,
}

impl Default for FakeLeader {
    fn default() -> Self {
        Self {
            read_index: Ok(0),
            read_index_delay: Duration::ZERO,
            stream: StreamMode::Answer,
            read_index_calls: Arc::default(),
            stream_calls: Arc::default(),
            forward_calls: Arc::default(),
        }
    }
}

impl FakeLeader {
    /// Serves the fake on a loopback port; a client of it.
    pub async fn serve(&self) -> PeerClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(self.clone()))
                .serve_with_incoming(incoming),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .expect("endpoint")
            .connect_lazy();
        let announced = Arc::new(std::sync::atomic::AtomicU32::new(1));
        peer_client(PeerChannel::new(channel, 1, 0, announced))
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send>>;

fn unused<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not in this test"))
}

/// The fake's answer to one streamed request.
async fn answer_streamed(message: Result<RaftMessage, Status>) -> Result<RaftMessage, Status> {
    let (id, request): forward_stream::StreamedRequest =
        codec::decode(&message?.payload).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let LeaderRequest::HashKv(n) = request else {
        return Err(Status::invalid_argument("the fake answers HashKv only"));
    };
    let n = u64::try_from(n).expect("a test sends n >= 0");
    tokio::time::sleep(Duration::from_millis(10 - n % 10)).await;
    Ok(forward_stream::encode_reply(
        id,
        &Ok(LeaderReply::ClusterId(n)),
    ))
}

#[tonic::async_trait]
impl RaftPeer for FakeLeader {
    type StreamAppendStream = Answers;
    async fn append_entries(
        &self,
        _: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn stream_append(
        &self,
        _: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<Answers>, Status> {
        unused()
    }
    async fn vote(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn pre_vote(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn install_snapshot(
        &self,
        _: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn forward(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.forward_calls.fetch_add(1, Ordering::SeqCst);
        let reply: Result<LeaderReply, ForwardError> = Ok(LeaderReply::ClusterId(u64::MAX));
        Ok(Response::new(RaftMessage {
            payload: codec::encode(&reply),
        }))
    }
    type ForwardStreamStream = Answers;
    async fn forward_stream(
        &self,
        req: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<Answers>, Status> {
        self.stream_calls.fetch_add(1, Ordering::SeqCst);
        let requests = req.into_inner();
        match self.stream {
            StreamMode::Unimplemented => unused(),
            StreamMode::Answer => Ok(Response::new(Box::pin(
                requests.map(answer_streamed).buffer_unordered(64),
            ))),
            StreamMode::Stall => {
                std::future::pending::<()>().await;
                unused()
            }
            StreamMode::HangUp => Ok(Response::new(Box::pin(
                requests
                    .take(1)
                    .map(|_| Err(Status::unavailable("hung up"))),
            ))),
            // Ends once the first message has arrived, so that the follower
            // owes it an answer; the message is not served.
            StreamMode::Stop => Ok(Response::new(Box::pin(
                requests.take(1).filter_map(|_| std::future::ready(None)),
            ))),
        }
    }
    async fn read_index(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.read_index_calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.read_index_delay).await;
        Ok(Response::new(RaftMessage {
            payload: codec::encode(&self.read_index),
        }))
    }
    async fn leader_transfer(
        &self,
        _: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn confirm_leader(
        &self,
        _: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
    async fn transfer_leader(
        &self,
        _: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        unused()
    }
}

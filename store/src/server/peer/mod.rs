//! `storepeer.RaftPeer`, the member-to-member service (kept apart from the
//! client services): hands Raft messages to openraft, runs forwarded
//! requests and ReadIndex on the leader, and takes leadership-transfer
//! messages.

pub mod transfer;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etcd_proto::storepeer::raft_peer_server::RaftPeer;
use etcd_proto::storepeer::RaftMessage;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::raft::network::{SnapshotHeader, SnapshotOpening};
use crate::raft::peer_protocol::{encode_answer, fatal, MARKED_SNAPSHOTS_SINCE, REFUSAL_PREFIX};
use crate::raft::state_machine::snapshot_file::{SnapshotData, SnapshotReceiver};
use crate::raft::{NodeId, Snapshot, TypeConfig, Vote};
use crate::server::core::Core;
use crate::server::to_leader::forward::{ForwardError, LeaderReply, LeaderRequest};
use crate::server::to_leader::forward_stream;
use openraft::error::Fatal;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, StreamAppendError, TransferLeaderRequest,
    VoteRequest,
};

/// The peer protocol a request is in (a request extension set by
/// [`check_peer_protocol`]); its answer is in the same.
#[derive(Debug, Clone, Copy)]
struct SentProtocol(u32);

/// The protocol `req` is in (protocol 1 if no check ran).
fn protocol_of<T>(req: &Request<T>) -> u32 {
    req.extensions()
        .get::<SentProtocol>()
        .map_or(crate::version::OLDEST_PEER_PROTOCOL, |p| p.0)
}

/// Refuses a request in a peer protocol this member does not speak (see
/// [`crate::version::speaks_peer_protocol`]), before its message is read:
/// a member of a newer build must not be misread by an older one. A
/// request it takes carries its protocol on ([`SentProtocol`]).
pub fn check_peer_protocol(mut req: Request<()>) -> Result<Request<()>, Status> {
    use crate::version::{peer_protocol_of, release, speaks_peer_protocol, OLDEST_PEER_PROTOCOL};
    let agent = req
        .metadata()
        .get("user-agent")
        .and_then(|v| v.to_str().ok());
    match peer_protocol_of(agent) {
        Some(v) if speaks_peer_protocol(v) => {
            req.extensions_mut().insert(SentProtocol(v));
            Ok(req)
        }
        found => Err(Status::failed_precondition(format!(
            "{REFUSAL_PREFIX}{} is not one this member speaks ({OLDEST_PEER_PROTOCOL} to {}): the \
             peer runs a build this member cannot serve; upgrade this member (user-agent {:?})",
            found.map_or_else(|| "unknown".to_string(), |v| v.to_string()),
            release().newest_peer_protocol,
            agent.unwrap_or_default()
        ))),
    }
}

/// Announces the newest peer protocol this member speaks on every peer
/// answer, refusals included ([`crate::version::PEER_PROTOCOL_HEADER`]):
/// the sender learns from it what it may send (see
/// [`crate::raft::peer_protocol`]).
pub fn announce_peer_protocol<B>(mut answer: http::Response<B>) -> http::Response<B> {
    let release = crate::version::release();
    if release.announces_peer_protocol {
        answer.headers_mut().insert(
            crate::version::PEER_PROTOCOL_HEADER,
            http::HeaderValue::from(release.newest_peer_protocol),
        );
    }
    answer
}

/// The `storepeer.RaftPeer` methods whose request is one message (all but
/// the `StreamAppend`, `InstallSnapshot` and `ForwardStream` streams).
const ONE_MESSAGE_METHODS: [&str; 8] = [
    "/storepeer.RaftPeer/AppendEntries",
    "/storepeer.RaftPeer/Vote",
    "/storepeer.RaftPeer/PreVote",
    "/storepeer.RaftPeer/Forward",
    "/storepeer.RaftPeer/ReadIndex",
    "/storepeer.RaftPeer/LeaderTransfer",
    "/storepeer.RaftPeer/TransferLeader",
    "/storepeer.RaftPeer/ConfirmLeader",
];

/// Ends the body of a one-message peer call after its message, so the call
/// runs without waiting for the sender's separate end-of-stream frame: a
/// forwarded write or ReadIndex would otherwise wait a turn of the
/// follower's connection task (see [`crate::server::transport::frame_limit`]). Other calls
/// pass unchanged (tonic limits their messages).
pub fn end_after_one_message(
    req: http::Request<tonic::body::Body>,
) -> http::Request<tonic::body::Body> {
    if !ONE_MESSAGE_METHODS.contains(&req.uri().path()) {
        return req;
    }
    req.map(|body| {
        let limit = crate::raft::network::MAX_PEER_MESSAGE_BYTES;
        tonic::body::Body::new(crate::server::transport::frame_limit::FrameLimited::new(
            body, limit, true,
        ))
    })
}

/// Serves `storepeer.RaftPeer` for one member.
pub struct PeerService {
    core: Arc<Core>,
    /// Turns true when the member stops: open append streams end then, so
    /// the server's graceful drain does not wait for the leader to hang up.
    shutdown: watch::Receiver<bool>,
}

impl PeerService {
    /// A service over `core` whose streams end when `shutdown` turns true.
    pub fn new(core: Arc<Core>, shutdown: watch::Receiver<bool>) -> Self {
        Self { core, shutdown }
    }
}

/// Counts a Raft message's bytes in `etcd_network_peer_received_bytes_total`
/// under the sender's id in hex (`From`; "0" when the message names none).
fn count_received(from: Option<NodeId>, bytes: usize) {
    let from = vec![("From", format!("{:x}", from.unwrap_or(0)))];
    crate::metrics::global()
        .network
        .peer_received
        .get_or_create(&from)
        .inc_by(bytes as u64);
}

/// The answer to a Raft message in `protocol` (see
/// [`crate::raft::peer_protocol`]), counting its bytes in
/// `etcd_network_peer_sent_bytes_total` under the sender's id (`To`).
fn counted_reply<T: serde::Serialize>(
    to: Option<NodeId>,
    protocol: u32,
    result: Result<T, Fatal<TypeConfig>>,
) -> Result<Response<RaftMessage>, Status> {
    let payload = encode_answer(protocol, result);
    count_sent(to, payload.len());
    Ok(Response::new(RaftMessage { payload }))
}

/// Counts an answer's bytes in `etcd_network_peer_sent_bytes_total` under
/// the id of the member it goes to, in hex (`To`; "0" when unknown).
fn count_sent(to: Option<NodeId>, bytes: usize) {
    let to = vec![("To", format!("{:x}", to.unwrap_or(0)))];
    crate::metrics::global()
        .network
        .peer_sent
        .get_or_create(&to)
        .inc_by(bytes as u64);
}

fn decode<T: serde::de::DeserializeOwned>(req: Request<RaftMessage>) -> Result<T, Status> {
    decode_payload(&req.into_inner().payload)
}

fn decode_payload<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    codec::decode(payload).map_err(|e| Status::invalid_argument(format!("bad peer payload: {e}")))
}

/// The answers of one append stream, as gRPC sends them.
type AnswerStream = Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send + 'static>>;

/// A request a follower forwarded: the cluster id and HashKV from any
/// member, everything else from the leader only.
async fn serve_forwarded(core: &Core, request: LeaderRequest) -> Result<LeaderReply, ForwardError> {
    if let Some(reply) = core.answer_anywhere(&request) {
        Ok(reply)
    } else if core.leader() == Some(core.config.member_id) {
        let deadline = Instant::now() + core.config.request_timeout;
        core.serve_as_leader(request, deadline).await
    } else {
        Err(ForwardError::NotLeader(core.leader()))
    }
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    Ok(Response::new(RaftMessage {
        payload: codec::encode(value),
    }))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let (bytes, protocol) = (req.get_ref().payload.len(), protocol_of(&req));
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        let from = Some(rpc.vote.leader_id.node_id);
        count_received(from, bytes);
        let result = self.core.raft.append_entries(rpc).await;
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.core.leader_contact.record();
        }
        counted_reply(from, protocol, result.map_err(fatal))
    }

    type StreamAppendStream = AnswerStream;

    /// Feeds the requests to openraft's pipelined append as they arrive
    /// and sends its answers back in order. A request that does not decode
    /// ends the stream with an error.
    async fn stream_append(
        &self,
        req: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<AnswerStream>, Status> {
        let protocol = protocol_of(&req);
        let (bad_tx, bad_rx) = tokio::sync::oneshot::channel::<Status>();
        let mut bad_tx = Some(bad_tx);
        // The leader the answers go to (for the sent-bytes counter).
        let leader = Arc::new(AtomicU64::new(0));
        let sender = leader.clone();
        let requests = req.into_inner().scan((), move |_, message| {
            let request = message.and_then(|m| {
                let request: AppendEntriesRequest<TypeConfig> = decode_payload(&m.payload)?;
                let from = request.vote.leader_id.node_id;
                sender.store(from, Ordering::Relaxed);
                count_received(Some(from), m.payload.len());
                Ok(request)
            });
            std::future::ready(match request {
                Ok(r) => Some(r),
                Err(status) => {
                    if let Some(tx) = bad_tx.take() {
                        let _ = tx.send(status);
                    }
                    None
                }
            })
        });
        // The input ends when this member stops; openraft then ends the
        // answers, and the leader's stream sees a clean end.
        let mut shutdown = self.shutdown.clone();
        let requests = requests.take_until(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        });
        let contact = self.core.leader_contact.clone();
        let answers = self.core.raft.stream_append(requests).map(move |result| {
            // Accepted (or a log conflict with the same leader): the
            // leader is alive.
            if !matches!(result, Ok(Err(StreamAppendError::HigherVote(_))) | Err(_)) {
                contact.record();
            }
            let payload = encode_answer(protocol, result);
            count_sent(Some(leader.load(Ordering::Relaxed)), payload.len());
            Ok(RaftMessage { payload })
        });
        // After the last answer: the decode failure that ended the input, if any.
        let failure = futures::stream::once(bad_rx).filter_map(|r| async move { r.ok().map(Err) });
        Ok(Response::new(Box::pin(answers.chain(failure))))
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (bytes, protocol) = (req.get_ref().payload.len(), protocol_of(&req));
        let rpc: VoteRequest<TypeConfig> = decode(req)?;
        let from = Some(rpc.vote.leader_id.node_id);
        count_received(from, bytes);
        let result = self.core.raft.vote(rpc).await;
        counted_reply(from, protocol, result.map_err(fatal))
    }

    async fn pre_vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let (bytes, protocol) = (req.get_ref().payload.len(), protocol_of(&req));
        let rpc: VoteRequest<TypeConfig> = decode(req)?;
        let from = Some(rpc.vote.leader_id.node_id);
        count_received(from, bytes);
        let result = self.core.raft.pre_vote(rpc).await;
        counted_reply(from, protocol, result.map_err(fatal))
    }

    /// Receives a snapshot (a header, then raw chunks; in peer protocol 2
    /// and later, then an end mark: [`SnapshotOpening`]) into a file in
    /// the snapshot directory and installs it.
    async fn install_snapshot(
        &self,
        req: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<RaftMessage>, Status> {
        let protocol = protocol_of(&req);
        let mut chunks = req.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let (opening, bytes) = if protocol >= MARKED_SNAPSHOTS_SINCE {
            let opening: SnapshotOpening = decode_payload(&first.payload)?;
            (opening, None)
        } else {
            let sized: SnapshotHeader = decode_payload(&first.payload)?;
            let opening = SnapshotOpening {
                vote: sized.vote,
                meta: sized.meta,
            };
            (opening, Some(sized.bytes))
        };
        let from = Some(opening.vote.leader_id.node_id);
        let dir = self.core.config.snapshot_dir_or_temp();
        let engine = self.core.mvcc.engine().clone();
        let mut receiver = blocking(move || {
            let mut receiver = SnapshotReceiver::create(&dir, bytes)?;
            receiver.prepare_install(engine)?;
            Ok(receiver)
        })
        .await?;
        let mut received = first.payload.len();
        while let Some(chunk) = chunks.message().await? {
            received += chunk.payload.len();
            if chunk.payload.is_empty() && bytes.is_none() {
                receiver.end().map_err(snapshot_refused)?;
                continue;
            }
            receiver =
                blocking(move || receiver.write_owned(chunk.payload).map(|()| receiver)).await?;
        }
        count_received(from, received);
        let data = blocking(move || receiver.finish()).await?;
        let snapshot = Snapshot {
            meta: opening.meta,
            snapshot: SnapshotData::File(Arc::new(data)),
        };
        let result = self
            .core
            .raft
            .install_full_snapshot(opening.vote, snapshot)
            .await;
        if result.is_ok() {
            self.core.leader_contact.record();
        }
        counted_reply(from, protocol, result)
    }

    async fn forward(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        reply(&serve_forwarded(&self.core, decode(req)?).await)
    }

    type ForwardStreamStream = AnswerStream;

    /// Serves a follower's forwarded batches as they arrive, several at
    /// once, and answers each with its id as it finishes (see
    /// [`crate::server::to_leader::forward_stream`]). A message that does not decode ends the
    /// stream with an error; the stream ends when this member stops.
    async fn forward_stream(
        &self,
        req: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<AnswerStream>, Status> {
        let mut shutdown = self.shutdown.clone();
        let requests = req.into_inner().take_until(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        });
        let core = self.core.clone();
        let answers = requests
            .map(move |message| {
                let core = core.clone();
                async move {
                    let (id, request): forward_stream::StreamedRequest =
                        decode_payload(&message?.payload)?;
                    let reply = serve_forwarded(&core, request).await;
                    Ok(forward_stream::encode_reply(id, &reply))
                }
            })
            .buffer_unordered(forward_stream::MAX_SERVED_PER_STREAM);
        Ok(Response::new(Box::pin(answers)))
    }

    async fn read_index(
        &self,
        _req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let index = self.core.read_index_local().await;
        if index.is_ok() {
            // The follower waits to apply up to this index: send it the
            // commit index now rather than after a commit hold.
            self.core.release_commit_holds();
        }
        reply(&index)
    }

    async fn leader_transfer(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        reply(&transfer::serve_peer(&self.core, decode(req)?))
    }

    async fn transfer_leader(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let protocol = protocol_of(&req);
        let rpc: TransferLeaderRequest<TypeConfig> = decode(req)?;
        let result = self.core.raft.handle_transfer_leader(rpc).await;
        Ok(Response::new(RaftMessage {
            payload: encode_answer(protocol, result),
        }))
    }

    async fn confirm_leader(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let vote: Vote = decode(req)?;
        let follows = crate::raft::read_index::follows(&self.core.raft, &vote)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        reply(&follows)
    }
}

/// A snapshot stream refused for `e` (what it holds breaks the format or
/// what its sender announced).
fn snapshot_refused(e: std::io::Error) -> Status {
    Status::invalid_argument(format!("snapshot: {e}"))
}

/// Runs blocking file work for a snapshot receive off the async workers;
/// a failure refuses the stream.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(snapshot_refused(e)),
        Err(e) => Err(Status::internal(format!("snapshot: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proto's `rpc Name(stream? RaftMessage)` lines: each method and
    /// whether its request is a stream.
    fn proto_methods() -> Vec<(String, bool)> {
        let proto = include_str!("../../../../proto/proto/storepeer/peer.proto");
        proto
            .lines()
            .filter_map(|line| line.trim().strip_prefix("rpc "))
            .map(|rpc| {
                let (name, rest) = rpc.split_once('(').expect("rpc Name(...)");
                (name.trim().to_string(), rest.starts_with("stream "))
            })
            .collect()
    }

    #[test]
    fn every_peer_method_whose_request_is_one_message_ends_after_it() {
        let methods = proto_methods();
        assert_eq!(methods.len(), 11, "{methods:?}");
        for (name, streamed) in methods {
            let path = format!("/storepeer.RaftPeer/{name}");
            assert_eq!(
                ONE_MESSAGE_METHODS.contains(&path.as_str()),
                !streamed,
                "{path}"
            );
        }
    }
}

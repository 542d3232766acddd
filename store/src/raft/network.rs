//! The client side of the peer protocol (`storepeer.RaftPeer`).
//!
//! openraft asks for one [`PeerNetwork`] per target member and purpose
//! (replication, heartbeats, snapshots); each holds a clone of one lazily
//! connected tonic channel per target, so all of them share one HTTP/2
//! connection. Payloads are bincode (see [`crate::codec`]).
//!
//! Replication is pipelined: openraft hands [`PeerNetwork::stream_append`]
//! a stream of AppendEntries requests and reads the answers from another
//! stream; both travel over one bidirectional gRPC stream, so the leader
//! sends the next entries while the follower is still writing the previous
//! ones (etcd's rafthttp pipelines its appends the same way). A Raft
//! failure on the receiving member comes back inside the answer
//! ([`super::peer_protocol::RaftFailure`]); it and transport failures are
//! `Unreachable`, so openraft backs off.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_proto::storepeer::raft_peer_client::RaftPeerClient;
use etcd_proto::storepeer::RaftMessage;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::{OptionalSend, RaftNetworkV2};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::commit_hold::{CommitHold, CommitRelease};
use super::peer_protocol::PeerChannel;
use super::snapshot_holds::SnapshotHolds;
use super::state_machine::snapshot_file::{SnapshotFile, SnapshotSource};
use super::{MemberInfo, NodeId, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};
use crate::codec;
use crate::limits::{PEER_RPC_TIMEOUT_MS, SNAPSHOT_CHUNK_BYTES, SNAPSHOT_SEND_CHUNKS_IN_FLIGHT};

/// Builds peer clients for openraft. Channels are cached per member and
/// peer URL: openraft asks for a new client per replication stream and per
/// heartbeat worker, and a tonic channel multiplexes all of them over one
/// HTTP/2 connection, so no round pays for a new connection.
///
/// Every channel announces the peer protocol its requests are in
/// ([`crate::version::peer_user_agent`]): the newest the cluster version
/// allows ([`Self::set_protocol`]) and the member announced
/// ([`super::peer_protocol`]). When it changes, the next call to the
/// member opens a new channel in the new protocol; a stream opened before
/// (a replication or forwarding stream) keeps the protocol it was opened
/// in until it ends.
#[derive(Clone)]
pub struct PeerNetworkFactory {
    peers: Arc<Mutex<HashMap<NodeId, Peer>>>,
    protocol: Arc<AtomicU32>,
    tls: Option<ClientTlsConfig>,
    /// Ends every replication stream's commit hold (see [`CommitHold`]).
    commit_release: Arc<CommitRelease>,
    /// The log entries kept for members being sent a snapshot.
    snapshot_holds: SnapshotHolds,
}

/// What the factory keeps of one member.
struct Peer {
    /// The newest protocol the member announced (see
    /// [`super::peer_protocol`]); unknown until it answers.
    announced: Arc<AtomicU32>,
    /// The channel to it, if one was made.
    cached: Option<CachedChannel>,
}

/// A cached channel: the peer URL it dials and the channel (which knows
/// its protocol).
struct CachedChannel {
    url: String,
    channel: PeerChannel,
}

impl Default for PeerNetworkFactory {
    fn default() -> Self {
        Self::new(None)
    }
}

impl PeerNetworkFactory {
    /// A factory dialing `https://` peers with `tls`, sending the oldest
    /// peer protocol until [`Self::set_protocol`].
    pub fn new(tls: Option<ClientTlsConfig>) -> Self {
        Self {
            peers: Arc::default(),
            protocol: Arc::new(AtomicU32::new(crate::version::OLDEST_PEER_PROTOCOL)),
            tls,
            commit_release: Arc::default(),
            snapshot_holds: SnapshotHolds::default(),
        }
    }

    /// The log entries kept for members being sent a snapshot (the log
    /// bound reads them).
    pub fn snapshot_holds(&self) -> SnapshotHolds {
        self.snapshot_holds.clone()
    }

    /// Sends `protocol` from now on; answers the one sent before.
    pub fn set_protocol(&self, protocol: u32) -> u32 {
        self.protocol.swap(protocol, Ordering::Relaxed)
    }

    /// Sends the commit-only AppendEntries every replication stream holds
    /// now (see [`CommitHold`]): a follower that was just given a read
    /// index learns the commit index it waits for without the hold.
    pub fn release_commit_holds(&self) {
        self.commit_release.release();
    }

    /// The cached channel to `target` at its first peer URL (a new one if
    /// the URL or the protocol to send it changed). Shared by Raft
    /// replication and by the member's forwarding and ReadIndex calls.
    pub fn channel(&self, target: NodeId, node: &MemberInfo) -> Result<PeerChannel, ChannelError> {
        let url = node.peer_urls.first().map_or("", String::as_str);
        let allowed = self.protocol.load(Ordering::Relaxed);
        let mut peers = self.peers.lock().expect("peer channel cache lock");
        let peer = peers.entry(target).or_insert_with(|| Peer {
            announced: Arc::new(AtomicU32::new(super::peer_protocol::UNKNOWN)),
            cached: None,
        });
        let protocol = allowed
            .min(peer.announced.load(Ordering::Relaxed))
            .max(crate::version::OLDEST_PEER_PROTOCOL);
        if let Some(cached) = &peer.cached {
            if cached.url == url && cached.channel.protocol() == protocol {
                return Ok(cached.channel.clone());
            }
        }
        let inner = peer_channel(node, protocol, self.tls.as_ref())?;
        let channel = PeerChannel::new(inner, protocol, target, peer.announced.clone());
        peer.cached = Some(CachedChannel {
            url: url.to_string(),
            channel: channel.clone(),
        });
        Ok(channel)
    }

    /// Asks voter `target` whether its vote is still `vote`'s leader
    /// (`storepeer.RaftPeer/ConfirmLeader`, see [`super::read_index`]);
    /// false for "no", and for no answer within `timeout`.
    pub async fn confirm_leader(
        &self,
        target: NodeId,
        node: &MemberInfo,
        vote: &Vote,
        timeout: Duration,
    ) -> bool {
        let Ok(channel) = self.channel(target, node) else {
            return false;
        };
        let mut request = tonic::Request::new(RaftMessage {
            payload: codec::encode(vote),
        });
        request.set_timeout(timeout);
        match peer_client(channel).confirm_leader(request).await {
            Ok(reply) => codec::decode::<bool>(&reply.into_inner().payload).unwrap_or(false),
            Err(_) => false,
        }
    }
}

/// Largest peer message in either direction: a snapshot chunk or a batch of
/// entries, each bounded well below this (1.5 MiB requests x 512 entries
/// would exceed it only for pathological batches, which openraft splits).
pub const MAX_PEER_MESSAGE_BYTES: usize = 1024 * 1024 * 1024;

/// Why no channel to a member could be made. Channels connect lazily, so
/// these are faults of the member's URL or of this member's peer TLS
/// settings, which no retry mends (an unreachable member is an error of
/// the calls on the channel instead).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The member has no peer URL.
    #[error("member {0:?} has no peer URL")]
    NoPeerUrl(String),
    /// Its first peer URL is not a URI.
    #[error("bad peer URL {url}: {source}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why it does not parse.
        source: tonic::transport::Error,
    },
    /// The endpoint refused a setting: the user agent, or the TLS settings
    /// of an `https://` URL.
    #[error("peer URL {url}: {source}")]
    Endpoint {
        /// The URL.
        url: String,
        /// tonic's error.
        source: tonic::transport::Error,
    },
}

/// A lazily connected channel to a member's first peer URL, announcing
/// peer protocol `protocol`.
fn peer_channel(
    node: &MemberInfo,
    protocol: u32,
    tls: Option<&ClientTlsConfig>,
) -> Result<Channel, ChannelError> {
    let url = node
        .peer_urls
        .first()
        .ok_or_else(|| ChannelError::NoPeerUrl(node.name.clone()))?;
    let refused = |source| ChannelError::Endpoint {
        url: url.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|source| ChannelError::BadUrl {
            url: url.clone(),
            source,
        })?
        .connect_timeout(Duration::from_millis(PEER_RPC_TIMEOUT_MS))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .user_agent(crate::version::peer_user_agent(protocol))
        .map_err(refused)?;
    if url.starts_with("https://") {
        let tls = tls.cloned().unwrap_or_default();
        endpoint = endpoint.tls_config(tls).map_err(refused)?;
    }
    Ok(endpoint.connect_lazy())
}

/// A client of a member's peer service.
pub type PeerClient = RaftPeerClient<PeerChannel>;

/// A peer client with our message size limits.
pub fn peer_client(channel: PeerChannel) -> PeerClient {
    RaftPeerClient::new(channel)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
}

impl RaftNetworkFactory<TypeConfig> for PeerNetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &MemberInfo) -> Self::Network {
        PeerNetwork {
            factory: self.clone(),
            target,
            node: node.clone(),
            commit_release: self.commit_release.clone(),
            counters: Arc::new(PeerCounters::new(target)),
        }
    }
}

/// The first message of an InstallSnapshot stream in peer protocol 1; the
/// snapshot's bytes follow in raw chunks of at most
/// [`SNAPSHOT_CHUNK_BYTES`].
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The sending leader's vote.
    pub vote: Vote,
    /// What the snapshot covers.
    pub meta: SnapshotMeta,
    /// The snapshot's size: the receiver refuses a stream that ends
    /// before (a sender that failed to read its file) or runs past it.
    pub bytes: u64,
}

/// The first message of an InstallSnapshot stream in peer protocol 2 and
/// later: the snapshot's bytes follow in raw chunks of at most
/// [`SNAPSHOT_CHUNK_BYTES`], then an empty message marks their end (the
/// sender streams a checkpoint's records as it reads them, so it does not
/// know their length before; protocol 1 measured them in a pass of its
/// own). A stream that ends without the mark (its sender failed to read
/// the snapshot) is refused.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotOpening {
    /// The sending leader's vote.
    pub vote: Vote,
    /// What the snapshot covers.
    pub meta: SnapshotMeta,
}

/// The connection to one member.
pub struct PeerNetwork {
    /// Where each call takes its channel (in the protocol sent now).
    factory: PeerNetworkFactory,
    target: NodeId,
    node: MemberInfo,
    counters: Arc<PeerCounters>,
    commit_release: Arc<CommitRelease>,
}

/// This connection's `etcd_network_peer_sent_bytes_total` (requests),
/// `etcd_network_peer_received_bytes_total` (their answers) and
/// `etcd_network_peer_round_trip_time_seconds` (labels `To` / `From`: the
/// peer's id in hex), looked up once per connection. The round trip is
/// that of each unary Raft RPC (etcd measures it with a separate prober).
struct PeerCounters {
    sent: prometheus_client::metrics::counter::Counter,
    received: prometheus_client::metrics::counter::Counter,
    rtt: crate::metrics::AtomicHistogram,
}

impl PeerCounters {
    fn new(target: NodeId) -> Self {
        let network = &crate::metrics::global().network;
        let to = vec![("To", format!("{target:x}"))];
        let from = vec![("From", format!("{target:x}"))];
        PeerCounters {
            sent: network.peer_sent.get_or_create_owned(&to),
            received: network.peer_received.get_or_create_owned(&from),
            rtt: network.peer_rtt.get_or_create_owned(&to),
        }
    }
}

type RpcResult<T> = Result<T, RPCError<TypeConfig>>;

/// A failed gRPC call as openraft's error: a transport failure makes
/// openraft back off and retry; anything else is a network error.
fn status_error(status: tonic::Status) -> RPCError<TypeConfig> {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            RPCError::Unreachable(Unreachable::new(&status))
        }
        _ => RPCError::Network(NetworkError::new(&status)),
    }
}

/// An answer's payload in `protocol`: the value, or the remote member's
/// Raft failure, after which openraft backs off (see
/// [`super::peer_protocol`]).
fn decode_answer<T: DeserializeOwned>(protocol: u32, payload: &[u8]) -> RpcResult<T> {
    super::peer_protocol::decode_answer(protocol, payload)
        .map_err(|e| RPCError::Network(NetworkError::new(&e)))?
        .map_err(|failure| RPCError::Unreachable(Unreachable::new(&failure)))
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    PreVote,
}

impl PeerNetwork {
    /// A client, and the protocol its requests (and their answers) are in.
    fn client(&self) -> RpcResult<(PeerClient, u32)> {
        let channel = self.channel()?;
        let protocol = channel.protocol();
        Ok((peer_client(channel), protocol))
    }

    fn channel(&self) -> RpcResult<PeerChannel> {
        self.factory
            .channel(self.target, &self.node)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        kind: Rpc,
        req: &Req,
        timeout: Duration,
    ) -> RpcResult<Resp> {
        let (mut client, protocol) = self.client()?;
        let payload = codec::encode(req);
        self.counters.sent.inc_by(payload.len() as u64);
        let mut request = tonic::Request::new(RaftMessage { payload });
        request.set_timeout(timeout);
        let started = std::time::Instant::now();
        let reply = match kind {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::PreVote => client.pre_vote(request).await,
        }
        .map_err(status_error)?;
        self.counters.rtt.observe(started.elapsed().as_secs_f64());
        let payload = reply.into_inner().payload;
        self.counters.received.inc_by(payload.len() as u64);
        decode_answer(protocol, &payload)
    }

    /// The bidirectional append stream: `input` encoded on the way out,
    /// each answer decoded on the way back.
    ///
    /// The answers' stream is returned at once and the gRPC stream is opened
    /// lazily, when it is first polled and `input` yields its first request.
    /// openraft waits out its backoff inside the request stream, so a peer
    /// that refuses connections (a killed member) is retried at openraft's
    /// backoff pace rather than as fast as connects fail, and a failed
    /// connect arrives as the first answer, where openraft counts it
    /// towards the backoff. Returning at once also leaves openraft free to
    /// cancel the session (leader change, shutdown) while it waits.
    fn append_stream<S>(
        &mut self,
        input: S,
    ) -> RpcResult<BoxStream<'static, RpcResult<StreamAppendResult<TypeConfig>>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let (mut client, protocol) = self.client()?;
        let counters = self.counters.clone();
        let mut input = CommitHold::new(input, self.commit_release.clone());
        let opened = async move {
            let Some(first) = input.next().await else {
                return futures::stream::empty().boxed();
            };
            let sent = counters.clone();
            let outgoing = futures::stream::once(std::future::ready(first))
                .chain(input)
                .map(move |req| {
                    let payload = codec::encode(&req);
                    sent.sent.inc_by(payload.len() as u64);
                    RaftMessage { payload }
                });
            match client.stream_append(outgoing).await {
                Ok(answers) => answers
                    .into_inner()
                    .map(move |answer| {
                        let payload = answer.map_err(status_error)?.payload;
                        counters.received.inc_by(payload.len() as u64);
                        decode_answer(protocol, &payload)
                    })
                    .boxed(),
                Err(status) => {
                    futures::stream::once(std::future::ready(Err(status_error(status)))).boxed()
                }
            }
        };
        Ok(futures::stream::once(opened).flatten().boxed())
    }

    /// Sends `snapshot` as a header and raw chunks on one client stream,
    /// reading each chunk from the file as the stream asks for it; in peer
    /// protocol 2 and later, with no length first and an end mark after
    /// ([`SnapshotOpening`]).
    async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
    ) -> RpcResult<SnapshotResponse<TypeConfig>> {
        let channel = self.channel()?;
        if !channel.knows_peer() {
            // Sent in protocol 1, the snapshot would be read once more
            // first (see `peer_protocol`); openraft retries after its
            // backoff, by when a heartbeat has taught the protocol.
            return Err(RPCError::Unreachable(Unreachable::new(&UnknownPeer(
                self.target,
            ))));
        }
        let protocol = channel.protocol();
        let mut client = peer_client(channel);
        if let Some(sent) = &snapshot.meta.last_log_id {
            self.factory.snapshot_holds.hold(self.target, sent.index);
        }
        let marked = protocol >= super::peer_protocol::MARKED_SNAPSHOTS_SINCE;
        let network = |e: std::io::Error| RPCError::Network(NetworkError::new(&e));
        let data = snapshot.snapshot;
        let source = tokio::task::spawn_blocking(move || data.source(!marked))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(network)?;
        let header = if marked {
            codec::encode(&SnapshotOpening {
                vote,
                meta: snapshot.meta,
            })
        } else {
            let bytes = source
                .known_len()
                .ok_or_else(|| network(std::io::Error::other("an unmeasured snapshot")))?;
            codec::encode(&SnapshotHeader {
                vote,
                meta: snapshot.meta,
                bytes,
            })
        };
        let read_failure = Arc::new(Mutex::new(None));
        let chunks = match source {
            SnapshotSource::File(file) => file_chunks(file, read_failure.clone()).left_stream(),
            SnapshotSource::Checkpoint { checkpoint, .. } => {
                let produced = checkpoint.produce(
                    SNAPSHOT_CHUNK_BYTES as usize,
                    SNAPSHOT_SEND_CHUNKS_IN_FLIGHT,
                );
                produced_chunks(produced, read_failure.clone()).right_stream()
            }
        };
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(header.len() as u64));
        let counted = sent.clone();
        let chunks = chunks.inspect(move |chunk| {
            counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
        let messages = futures::stream::once(std::future::ready(header))
            .chain(chunks)
            .chain(end_mark(marked, read_failure.clone()))
            .map(|payload| RaftMessage { payload });
        let reply = client.install_snapshot(messages).await;
        if let Some(e) = read_failure.lock().ok().and_then(|mut f| f.take()) {
            return Err(network(e));
        }
        let reply = reply.map_err(status_error)?;
        self.counters.sent.inc_by(sent.load(Ordering::Relaxed));
        let payload = reply.into_inner().payload;
        self.counters.received.inc_by(payload.len() as u64);
        decode_answer(protocol, &payload)
    }
}

/// A snapshot waits for the member to answer (see
/// [`super::peer_protocol`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "member {0:x} has not answered since it was last reached: its peer protocol is not known yet"
)]
struct UnknownPeer(NodeId);

/// The end mark of a snapshot stream ([`SnapshotOpening`]), sent when
/// `marked` once the chunks ended without a read failure: an empty
/// message. The chunks before are never empty.
fn end_mark(
    marked: bool,
    failure: Arc<Mutex<Option<std::io::Error>>>,
) -> impl Stream<Item = Vec<u8>> {
    futures::stream::iter(marked.then_some(())).filter_map(move |()| {
        let failed = failure.lock().map_or(true, |f| f.is_some());
        std::future::ready((!failed).then(Vec::new))
    })
}

/// The snapshot's chunks of [`SNAPSHOT_CHUNK_BYTES`], each read when the
/// stream is polled for it. A read error ends the stream early (the
/// receiver then refuses the short snapshot) and is left in `failure`.
fn file_chunks(
    snapshot: Arc<SnapshotFile>,
    failure: Arc<Mutex<Option<std::io::Error>>>,
) -> impl Stream<Item = Vec<u8>> {
    futures::stream::unfold(0u64, move |offset| {
        let snapshot = snapshot.clone();
        let failure = failure.clone();
        async move {
            if offset >= snapshot.len() {
                return None;
            }
            let read = tokio::task::spawn_blocking(move || {
                snapshot.chunk_at(offset, SNAPSHOT_CHUNK_BYTES)
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
            match read {
                Ok(chunk) => {
                    let next = offset + chunk.len() as u64;
                    Some((chunk, next))
                }
                Err(e) => {
                    if let Ok(mut slot) = failure.lock() {
                        *slot = Some(e);
                    }
                    None
                }
            }
        }
    })
}

/// The chunks a checkpoint's producer queues ([`Checkpoint::produce`]),
/// until its queue ends or an error, which ends the stream early (the
/// receiver then refuses the short snapshot) and is left in `failure`.
fn produced_chunks(
    produced: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    failure: Arc<Mutex<Option<std::io::Error>>>,
) -> impl Stream<Item = Vec<u8>> {
    futures::stream::unfold(produced, move |mut produced| {
        let failure = failure.clone();
        async move {
            match produced.recv().await? {
                Ok(chunk) => Some((chunk, produced)),
                Err(e) => {
                    if let Ok(mut slot) = failure.lock() {
                        *slot = Some(e);
                    }
                    None
                }
            }
        }
    })
}

/// A failed snapshot send as openraft's streaming error.
fn streaming_error(e: RPCError<TypeConfig>) -> StreamingError<TypeConfig> {
    match e {
        RPCError::Timeout(t) => StreamingError::Timeout(t),
        RPCError::Unreachable(u) => StreamingError::Unreachable(u),
        RPCError::Network(n) => StreamingError::Network(n),
        RPCError::RemoteError(r) => StreamingError::Network(NetworkError::new(&r)),
    }
}

impl RaftNetworkV2<TypeConfig> for PeerNetwork {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
        self.call(Rpc::Append, &rpc, option.hard_ttl()).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        _option: RPCOption,
    ) -> BoxFuture<'s, RpcResult<BoxStream<'s, RpcResult<StreamAppendResult<TypeConfig>>>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let answers = self
            .append_stream(input)
            .map(|answers| -> BoxStream<'s, _> { answers });
        Box::pin(std::future::ready(answers))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        self.call(Rpc::Vote, &rpc, option.hard_ttl()).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        self.call(Rpc::PreVote, &rpc, option.hard_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = self.send_snapshot(vote, snapshot) => sent.map_err(streaming_error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(urls: &[&str]) -> MemberInfo {
        MemberInfo {
            name: "m1".to_string(),
            peer_urls: urls.iter().map(|u| u.to_string()).collect(),
            client_urls: Vec::new(),
        }
    }

    /// A channel that cannot be made says why, typed, with the URL.
    #[tokio::test]
    async fn channel_faults_are_typed() {
        let factory = PeerNetworkFactory::new(None);
        let none = factory.channel(1, &member(&[])).unwrap_err();
        assert!(
            matches!(&none, ChannelError::NoPeerUrl(name) if name == "m1"),
            "{none}"
        );
        let bad = factory.channel(1, &member(&["http://[::1"])).unwrap_err();
        assert!(
            matches!(&bad, ChannelError::BadUrl { url, .. } if url == "http://[::1"),
            "{bad}"
        );
        assert!(
            bad.to_string().starts_with("bad peer URL http://[::1: "),
            "{bad}"
        );
        assert!(factory
            .channel(1, &member(&["http://127.0.0.1:2380"]))
            .is_ok());
    }

    /// A new protocol opens a new channel; the same one reuses the cached.
    #[tokio::test]
    async fn the_protocol_is_per_channel() {
        let factory = PeerNetworkFactory::new(None);
        let node = member(&["http://127.0.0.1:2380"]);
        let first = factory.channel(1, &node).unwrap();
        assert_eq!(first.protocol(), 1);
        assert!(!first.knows_peer(), "the member has not answered");
        assert_eq!(
            factory.set_protocol(2),
            crate::version::OLDEST_PEER_PROTOCOL
        );
        assert_eq!(
            factory.channel(1, &node).unwrap().protocol(),
            1,
            "the member has announced nothing yet"
        );
        let announced = |f: &PeerNetworkFactory| f.peers.lock().unwrap()[&1].announced.clone();
        announced(&factory).store(3, Ordering::Relaxed);
        assert!(first.knows_peer(), "every channel to the member shares it");
        assert_eq!(
            factory.channel(1, &node).unwrap().protocol(),
            2,
            "capped by the cluster version's"
        );
        factory.set_protocol(3);
        assert_eq!(factory.channel(1, &node).unwrap().protocol(), 3);
    }
}

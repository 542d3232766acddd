//! The client side of the peer protocol (`storepeer.RaftPeer`).
//!
//! openraft asks for one [`PeerNetwork`] per target member; each holds a
//! lazily connected tonic channel to the target's first peer URL. Payloads
//! are bincode (see [`crate::codec`]); a remote Raft error comes back inside
//! the payload as `Err(..)` and is surfaced as `RPCError::RemoteError`,
//! while transport failures are `Unreachable` so openraft backs off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use etcd_proto::storepeer::raft_peer_client::RaftPeerClient;
use etcd_proto::storepeer::RaftMessage;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::durable::DurableLog;
use super::types::{MemberInfo, NodeId, TypeConfig};
use crate::codec;
use crate::limits::PEER_RPC_TIMEOUT_MS;

/// Builds peer clients for openraft. Channels are cached per member and
/// peer URL: openraft asks for a new client per replication stream and per
/// ReadIndex round, and a tonic channel multiplexes all of them over one
/// HTTP/2 connection, so no round pays for a new connection.
#[derive(Clone, Default)]
pub struct PeerNetworkFactory {
    channels: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
    tls: Option<ClientTlsConfig>,
    /// The local log's durable end; the commit index sent to followers is
    /// clamped to it (see [`crate::raft::durable`]).
    durable: Arc<OnceLock<Arc<DurableLog>>>,
}

impl PeerNetworkFactory {
    /// A factory dialing `https://` peers with `tls`.
    pub fn new(tls: Option<ClientTlsConfig>) -> Self {
        Self {
            channels: Arc::default(),
            tls,
            durable: Arc::default(),
        }
    }

    /// Clamps the commit index of every AppendEntries (from all clones of
    /// this factory) to `log`'s durable end. Set once, before Raft starts.
    pub fn clamp_commit_to(&self, log: Arc<DurableLog>) {
        let _ = self.durable.set(log);
    }

    /// The cached channel to `target` at its first peer URL (a new one if
    /// the URL changed). Shared by Raft replication and by the member's
    /// forwarding and ReadIndex calls.
    pub fn channel(&self, target: NodeId, node: &MemberInfo) -> Result<Channel, String> {
        let url = node.peer_urls.first().cloned().unwrap_or_default();
        let mut cache = self.channels.lock().expect("peer channel cache lock");
        if let Some((cached_url, channel)) = cache.get(&target) {
            if *cached_url == url {
                return Ok(channel.clone());
            }
        }
        let channel = peer_channel(node, self.tls.as_ref())?;
        cache.insert(target, (url, channel.clone()));
        Ok(channel)
    }
}

/// Largest peer message in either direction: a snapshot chunk or a batch of
/// entries, each bounded well below this (1.5 MiB requests x 512 entries
/// would exceed it only for pathological batches, which openraft splits).
pub const MAX_PEER_MESSAGE_BYTES: usize = 1024 * 1024 * 1024;

/// A lazily connected channel to a member's first peer URL.
fn peer_channel(node: &MemberInfo, tls: Option<&ClientTlsConfig>) -> Result<Channel, String> {
    let url = node
        .peer_urls
        .first()
        .ok_or_else(|| format!("member {} has no peer URL", node.name))?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("bad peer URL {url}: {e}"))?
        .connect_timeout(Duration::from_millis(PEER_RPC_TIMEOUT_MS))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        let tls = tls.cloned().unwrap_or_default();
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS for peer URL {url}: {e}"))?;
    }
    Ok(endpoint.connect_lazy())
}

/// A peer client with our message size limits.
pub fn peer_client(channel: Channel) -> RaftPeerClient<Channel> {
    RaftPeerClient::new(channel)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
}

impl RaftNetworkFactory<TypeConfig> for PeerNetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &MemberInfo) -> Self::Network {
        PeerNetwork {
            target,
            durable: self.durable.get().cloned(),
            client: self.channel(target, node).map(peer_client),
            counters: PeerCounters::new(target),
        }
    }
}

/// The connection to one member.
pub struct PeerNetwork {
    target: NodeId,
    durable: Option<Arc<DurableLog>>,
    client: Result<RaftPeerClient<Channel>, String>,
    counters: PeerCounters,
}

/// This connection's `etcd_network_peer_sent_bytes_total` (requests),
/// `etcd_network_peer_received_bytes_total` (their answers) and
/// `etcd_network_peer_round_trip_time_seconds` (labels `To` / `From`: the
/// peer's id in hex), looked up once per connection. The round trip is
/// that of each Raft RPC (etcd measures it with a separate prober).
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

type RpcResult<T, E> = Result<T, RPCError<NodeId, MemberInfo, RaftError<NodeId, E>>>;

impl PeerNetwork {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: Rpc,
        req: &Req,
        timeout: Duration,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::other(e.clone()),
                )))
            }
        };
        let payload = codec::encode(req);
        self.counters.sent.inc_by(payload.len() as u64);
        let mut request = tonic::Request::new(RaftMessage { payload });
        request.set_timeout(timeout);
        let started = std::time::Instant::now();
        let reply = match kind {
            Rpc::Append => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Snapshot => client.install_snapshot(request).await,
        };
        if reply.is_ok() {
            self.counters.rtt.observe(started.elapsed().as_secs_f64());
        }
        let reply = reply.map_err(|status| match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                RPCError::Unreachable(Unreachable::new(&status))
            }
            _ => RPCError::Network(NetworkError::new(&status)),
        })?;
        let payload = reply.into_inner().payload;
        self.counters.received.inc_by(payload.len() as u64);
        let result: Result<Resp, RaftError<NodeId, E>> =
            codec::decode(&payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if let Some(durable) = &self.durable {
            rpc.leader_commit = durable.clamp_commit(rpc.leader_commit);
        }
        self.call(Rpc::Append, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Rpc::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, option.hard_ttl()).await
    }
}

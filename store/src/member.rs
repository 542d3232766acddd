//! Starting and stopping a member: the embedding API.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let config = store::Config::from_flags(["store", "--data-dir", "/tmp/m1.etcd"])?;
//! let member = store::Member::start(config).await?;
//! println!("serving etcd clients at {:?}", member.client_endpoints());
//! member.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Start-up, in order: open the engine under `<data-dir>/member/db`;
//! rebuild the MVCC index; on a fresh data directory record the member and
//! cluster identity and (with `--initial-cluster-state new`) initialize Raft
//! with the `--initial-cluster` membership, which every member does with
//! the same configuration; start openraft; serve the peer protocol on
//! `--listen-peer-urls` and the etcd API (gRPC plus the HTTP `/health` and
//! `/version` endpoints) on `--listen-client-urls`. A restart reads
//! everything from disk alone.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::auth_server::AuthServer;
use etcd_proto::etcdserverpb::cluster_server::ClusterServer;
use etcd_proto::etcdserverpb::lease_server::LeaseServer;
use etcd_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use etcd_proto::etcdserverpb::watch_server::WatchServer;
use etcd_proto::storepeer::raft_peer_server::RaftPeerServer;
use etcd_proto::v3electionpb::election_server::ElectionServer;
use etcd_proto::v3lockpb::lock_server::LockServer;
use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use crate::auth::{AuthStore, TokenProvider};
use crate::cluster_version::ClusterStateCache;
use crate::config::{listen_addrs, split_urls, Config, GrpcServerOptions, ListenAddr};
use crate::engine::rocks::RocksEngine;
use crate::engine::{Engine, Table, WriteBatch};
use crate::identity::cluster_id;
use crate::lease::Lessor;
use crate::limits::{
    GRPC_OVERHEAD_BYTES, MAX_APPEND_ENTRIES_PER_RPC, MAX_SEND_BYTES, PEER_RPC_TIMEOUT_MS,
    REQUEST_TIMEOUT_BASE_MS, SNAPSHOT_CATCH_UP_ENTRIES, TRANSPORT_MAX_DECODE_BYTES,
};
use crate::mvcc::compactor::spawn_compactor;
use crate::mvcc::MvccStore;
use crate::raft::log_bound::Bounds;
use crate::raft::log_store::LogStore;
use crate::raft::network::{peer_client, PeerNetworkFactory, MAX_PEER_MESSAGE_BYTES};
use crate::raft::recovery::force_new_cluster;
use crate::raft::state_machine::StateMachine;
use crate::raft::types::MemberAttributes;
use crate::raft::{MemberInfo, NodeId, Raft};
use crate::server::core::{Core, CoreConfig, ReplicatedCaches};
use crate::server::duties::auto_compaction::AutoCompaction;
use crate::server::duties::{auto_compaction, corruption, versions};
use crate::server::http;
use crate::server::peer::PeerService;
use crate::server::to_leader::forward::{decode_reply, encode_request, LeaderReply, LeaderRequest};
use crate::server::transport::conn;
use crate::server::transport::grpc_dispatch::{GrpcDispatch, GrpcServices};
use crate::server::v3rpc::auth::AuthService;
use crate::server::v3rpc::cluster::ClusterService;
use crate::server::v3rpc::election::ElectionService;
use crate::server::v3rpc::kv::KvRoutes;
use crate::server::v3rpc::lease::{spawn_lease_tasks, LeaseService};
use crate::server::v3rpc::lock::LockService;
use crate::server::v3rpc::maintenance::MaintenanceService;
use crate::server::v3rpc::watch::WatchService;
use crate::tls::{TlsFiles, TlsListener};
use crate::watch::WatchHub;

const KEY_MEMBER_ID: &[u8] = b"identity/member_id";
const KEY_CLUSTER_ID: &[u8] = b"identity/cluster_id";

/// A running member.
pub struct Member {
    core: Arc<Core>,
    client_addrs: Vec<SocketAddr>,
    peer_addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    /// Set once this member's attributes are published (etcd's
    /// `ReadyNotify`): client listeners serve only from then on.
    ready: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Identity persisted in the data directory on first start.
struct Identity {
    member_id: NodeId,
    cluster_id: u64,
    fresh: bool,
}

async fn load_identity(
    engine: &dyn Engine,
    config: &Config,
    peers: &PeerNetworkFactory,
) -> anyhow::Result<(Identity, BTreeMap<NodeId, MemberInfo>)> {
    let members: BTreeMap<NodeId, MemberInfo> = config.initial_members()?.into_iter().collect();
    let stored = engine.get(Table::RaftState, KEY_MEMBER_ID)?;
    if let Some(id) = stored {
        let member_id = u64::from_be_bytes(id.as_slice().try_into()?);
        let cid = engine
            .get(Table::RaftState, KEY_CLUSTER_ID)?
            .unwrap_or_default();
        let cluster_id = u64::from_be_bytes(cid.as_slice().try_into()?);
        return Ok((
            Identity {
                member_id,
                cluster_id,
                fresh: false,
            },
            members,
        ));
    }
    if let Some(flag) = discovery_flag(config) {
        anyhow::bail!(
            "{flag} is not supported by this store: bootstrap with --initial-cluster (etcd's \
             static configuration), listing every member's name and peer URL"
        );
    }
    let member_id = config.member_id();
    let cid = if config.initial_cluster_state == "existing" {
        fetch_cluster_id(&members, member_id, peers).await?
    } else {
        let ids: Vec<NodeId> = members.keys().copied().collect();
        cluster_id(&ids)
    };
    Ok((
        Identity {
            member_id,
            cluster_id: cid,
            fresh: true,
        },
        members,
    ))
}

/// The discovery flag given, if any. etcd bootstraps a fresh member
/// through it; once a member has data, etcd ignores it, and so do we.
fn discovery_flag(config: &Config) -> Option<&'static str> {
    [
        ("--discovery", &config.discovery),
        ("--discovery-srv", &config.discovery_srv),
        ("--discovery-endpoints", &config.discovery_endpoints),
        ("--discovery-token", &config.discovery_token),
    ]
    .into_iter()
    .find(|(_, value)| value.as_deref().is_some_and(|v| !v.is_empty()))
    .map(|(flag, _)| flag)
}

/// Records a fresh member's identity, once it serves: listeners bound and,
/// for a new cluster, Raft initialized. A first start that fails before
/// this leaves no identity, so the next start bootstraps again instead of
/// coming up as an uninitialized member that never joins.
fn save_identity(engine: &dyn Engine, identity: &Identity) -> anyhow::Result<()> {
    let mut b = WriteBatch::new();
    b.put(
        Table::RaftState,
        KEY_MEMBER_ID.to_vec(),
        identity.member_id.to_be_bytes().to_vec(),
    );
    b.put(
        Table::RaftState,
        KEY_CLUSTER_ID.to_vec(),
        identity.cluster_id.to_be_bytes().to_vec(),
    );
    engine.write(b, true)?;
    Ok(())
}

/// How long a member joining an existing cluster keeps asking the peers of
/// `--initial-cluster` for the cluster id before giving up.
const JOIN_CLUSTER_ID_WAIT: Duration = Duration::from_secs(30);

/// Pause between rounds of asking peers for the cluster id.
const JOIN_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A member started with `--initial-cluster-state existing` learns the
/// cluster id from any running member of `--initial-cluster`.
async fn fetch_cluster_id(
    members: &BTreeMap<NodeId, MemberInfo>,
    me: NodeId,
    peers: &PeerNetworkFactory,
) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + JOIN_CLUSTER_ID_WAIT;
    loop {
        for (id, info) in members {
            if *id == me {
                continue;
            }
            let channel = match peers.channel(*id, info) {
                Ok(channel) => channel,
                Err(error) => {
                    tracing::warn!(member = format!("{id:x}"), %error, "cannot reach a member");
                    continue;
                }
            };
            let mut client = peer_client(channel);
            let mut req = tonic::Request::new(encode_request(&LeaderRequest::ClusterId));
            req.set_timeout(Duration::from_millis(PEER_RPC_TIMEOUT_MS));
            let Ok(reply) = client.forward(req).await else {
                continue;
            };
            if let Ok(LeaderReply::ClusterId(cid)) = decode_reply(&reply.into_inner().payload) {
                return Ok(cid);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "could not reach any member of --initial-cluster to join the existing cluster"
            );
        }
        tokio::time::sleep(JOIN_RETRY_PAUSE).await;
    }
}

fn raft_config(config: &Config) -> anyhow::Result<openraft::Config> {
    let raft = openraft::Config {
        cluster_name: config.initial_cluster_token.clone(),
        heartbeat_interval: config.heartbeat_interval,
        // etcd's --election-timeout is how long a follower goes without a
        // heartbeat before it campaigns (randomized in [et, 2 x et), and
        // with pre-vote the first candidate usually wins: about 1 s at the
        // default). openraft (0.9 and 0.10) instead extends a follower's lease to
        // `now + leader_lease + election_timeout` on every heartbeat, with
        // `leader_lease = election_timeout_max` and the timeout randomized
        // in [min, max]: a follower campaigns after max + [min, max] of
        // silence, when every voter's lease has expired, so the first
        // candidate wins. With [et/4, et/2] that is [0.75, 1] x et, etcd's
        // window (measured: leader kill -9 to the first write ~0.94 s at
        // et = 1000 ms; [et/2, et] took ~1.9 s).
        election_timeout_min: (config.election_timeout / 4).max(2 * config.heartbeat_interval),
        election_timeout_max: (config.election_timeout / 2).max(3 * config.heartbeat_interval),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_count.max(1)),
        // The log bound purges, by entries as well as bytes, and holds what
        // a member being sent a snapshot needs (`raft::log_bound`); openraft's
        // own purge after each snapshot would not hold it.
        max_in_snapshot_log_to_keep: u64::MAX,
        max_payload_entries: MAX_APPEND_ENTRIES_PER_RPC,
        install_snapshot_timeout: crate::limits::PEER_SNAPSHOT_CHUNK_TIMEOUT_MS,
        // etcd 3.5 runs a pre-vote round before a real election (--pre-vote
        // defaults to true): a member that was cut off does not bump the
        // term and depose a healthy leader when it comes back.
        enable_pre_vote: Some(config.pre_vote),
        // Replicate an entry as soon as its append is submitted, rather than
        // after the core drains its queue: a lone writer's entry reaches
        // the followers sooner (batching already happens in raft::batcher).
        broadcast_submitted_on_append: Some(true),
        ..Default::default()
    };
    Ok(raft.validate()?)
}

/// The data directory, and the flags whose values only tasks started
/// later read, checked before anything is bound or written.
struct StartFlags {
    data_dir: std::path::PathBuf,
    auto_compaction: Option<AutoCompaction>,
    corrupt_check_periods: Vec<Duration>,
    downgrade_check: Duration,
    grpc_options: GrpcServerOptions,
    progress_interval: Duration,
    /// Entries the log keeps behind the last snapshot (etcd's
    /// `SnapshotCatchUpEntries`, at most `--snapshot-count`).
    catch_up_entries: u64,
}

impl StartFlags {
    fn read(config: &Config) -> anyhow::Result<Self> {
        let flags = Self {
            data_dir: config.data_dir(),
            auto_compaction: config.auto_compaction()?,
            corrupt_check_periods: config.corrupt_check_periods()?,
            downgrade_check: config.downgrade_check_interval()?,
            grpc_options: config.grpc_server_options()?,
            progress_interval: config.progress_notify_interval()?,
            catch_up_entries: SNAPSHOT_CATCH_UP_ENTRIES.min(config.snapshot_count),
        };
        crate::metrics::global().set_feature_gates(&config.gates);
        Ok(flags)
    }
}

/// The member's bound listeners.
struct Listeners {
    peer: Vec<Bound>,
    client: Vec<Bound>,
    metrics: Vec<Bound>,
}

impl Listeners {
    async fn bind(config: &Config) -> anyhow::Result<Self> {
        let peer_addrs = listen_addrs("listen-peer-urls", &config.listen_peer_urls)?;
        let peer = bind_all(&peer_addrs, &config.peer_tls(), "--peer-").await?;
        let client_addrs = listen_addrs("listen-client-urls", &config.listen_client_urls)?;
        let client = bind_all(&client_addrs, &config.client_tls(), "--").await?;
        let metrics_addrs = listen_addrs("listen-metrics-urls", &config.listen_metrics_urls)?;
        let metrics = bind_all(&metrics_addrs, &config.client_tls(), "--").await?;
        Ok(Self {
            peer,
            client,
            metrics,
        })
    }
}

/// The addresses `bound` listen on.
fn local_addrs(bound: &[Bound]) -> std::io::Result<Vec<SocketAddr>> {
    bound.iter().map(|b| b.listener.local_addr()).collect()
}

/// What the data directory holds, opened: the engine, the member's
/// identity, the MVCC store with its compactor, the Raft log, the lessor,
/// auth, alarms and the cluster's versions, and the peer client.
struct Storage {
    engine: Arc<dyn Engine>,
    peers: PeerNetworkFactory,
    identity: Identity,
    members: BTreeMap<NodeId, MemberInfo>,
    mvcc: Arc<MvccStore>,
    compactor: tokio::sync::mpsc::Sender<crate::mvcc::CompactionJob>,
    log_store: LogStore,
    lessor: Arc<Lessor>,
    auth: Arc<AuthStore>,
    alarms: Arc<crate::alarm::RaisedCache>,
    cluster: Arc<ClusterStateCache>,
}

impl Storage {
    async fn open(config: &Config, data_dir: &std::path::Path) -> anyhow::Result<Self> {
        let opening = std::time::Instant::now();
        let engine: Arc<dyn Engine> = Arc::new(RocksEngine::open(
            &data_dir.join(crate::data_dir::ENGINE_DIR),
        )?);
        tracing::info!(
            took_ms = opening.elapsed().as_millis() as u64,
            "opened the storage engine"
        );
        let peer_tls = if config.peer_tls().enabled() || config.peer_trusted_ca_file.is_some() {
            Some(config.peer_tls().tonic_client()?)
        } else {
            None
        };
        let peers = PeerNetworkFactory::new(peer_tls);
        let (identity, members) = load_identity(engine.as_ref(), config, &peers).await?;
        let (mvcc, pending) = MvccStore::open_with_pending(engine.clone())?;
        let mvcc = Arc::new(mvcc);
        let compactor = spawn_compactor(mvcc.clone(), pending);
        let opening = std::time::Instant::now();
        let mut log_store =
            LogStore::open(engine.clone(), &data_dir.join(crate::data_dir::LOG_DIR))?;
        tracing::info!(
            took_ms = opening.elapsed().as_millis() as u64,
            "opened the raft log"
        );
        if config.force_new_cluster && !identity.fresh {
            let forced =
                force_new_cluster(&mut log_store, engine.as_ref(), identity.member_id).await?;
            tracing::warn!(
                removed = ?forced.removed.iter().map(|id| format!("{id:x}")).collect::<Vec<_>>(),
                index = forced.index,
                "forcing restart as a one-member cluster (--force-new-cluster)"
            );
        }
        let lessor = Arc::new(Lessor::new(Duration::from_millis(config.election_timeout)));
        lessor.reload_from_store(&mvcc)?;
        let attach = lessor.clone();
        mvcc.set_lease_sink(Box::new(move |keys| attach.attach_loaded(keys)));
        mvcc.load_in_background()?;
        let tokens = TokenProvider::from_flag(
            &config.auth_token,
            Duration::from_secs(config.auth_token_ttl),
        )?;
        let auth = Arc::new(AuthStore::new(tokens, config.bcrypt_cost));
        auth.load(engine.as_ref())?;
        let alarms = Arc::new(crate::alarm::RaisedCache::load(engine.as_ref())?);
        let cluster = Arc::new(ClusterStateCache::load(engine.as_ref())?);
        // etcd's MustDetectDowngrade: an older binary may not serve a
        // cluster whose version is already past it.
        crate::cluster_version::check_binary_allowed(&cluster.get()).map_err(anyhow::Error::msg)?;
        peers.set_protocol(versions::peer_protocol(&cluster.get()));
        Ok(Self {
            engine,
            peers,
            identity,
            members,
            mvcc,
            compactor,
            log_store,
            lessor,
            auth,
            alarms,
            cluster,
        })
    }
}

/// A member whose Raft runs, before its tasks and servers start.
struct Started {
    core: Arc<Core>,
    hub: Arc<WatchHub>,
    log_reader: LogStore,
    identity: Identity,
    /// The storage format the data directory holds now.
    recorded_format: u32,
}

/// Starts Raft over `storage` (a fresh member of a new cluster bootstraps
/// it), records the member's identity and the data directory's format,
/// and builds the core.
async fn start_raft(
    config: &Config,
    data_dir: &std::path::Path,
    format: crate::data_dir::Found,
    storage: Storage,
) -> anyhow::Result<Started> {
    let Storage {
        engine,
        peers,
        identity,
        members,
        mvcc,
        compactor,
        log_store,
        lessor,
        auth,
        alarms,
        cluster,
    } = storage;
    let hub = WatchHub::new();
    let snapshot_dir = data_dir.join(crate::data_dir::SNAPSHOT_DIR);
    crate::raft::state_machine::snapshot_file::remove_leftovers(&snapshot_dir)?;
    let sm = StateMachine::new(
        mvcc.clone(),
        snapshot_dir.clone(),
        compactor,
        hub.clone(),
        lessor.clone(),
        auth.clone(),
    )
    .keeping_alarms_in(alarms.clone())
    .keeping_cluster_state_in(cluster.clone());
    let log_reader = log_store.clone();
    let raft = Raft::new(
        identity.member_id,
        Arc::new(raft_config(config)?),
        peers.clone(),
        log_store,
        sm,
    )
    .await?;
    if identity.fresh && config.initial_cluster_state == "new" {
        initialize(&raft, members).await?;
    }
    if identity.fresh {
        save_identity(engine.as_ref(), &identity)?;
    }
    // Everything is open (an older format brought up by the opening
    // itself): record what the directory holds now.
    let recorded_format = crate::data_dir::format_after_start(format);
    if format != crate::data_dir::Found::Format(recorded_format) {
        crate::data_dir::record_format(data_dir, recorded_format)?;
        tracing::info!(found = ?format, format = recorded_format, "recorded the data directory's storage format");
    }
    let core = Core::new(
        CoreConfig {
            member_id: identity.member_id,
            cluster_id: identity.cluster_id,
            cluster_token: config.initial_cluster_token.clone(),
            request_timeout: Duration::from_millis(
                REQUEST_TIMEOUT_BASE_MS + 2 * config.election_timeout,
            ),
            election_timeout: Duration::from_millis(config.election_timeout),
            max_request_bytes: config.max_request_bytes,
            max_txn_ops: config.max_txn_ops,
            quota_bytes: config.quota_bytes(),
            max_learners: usize::try_from(config.max_learners).unwrap_or(0),
            snapshot_dir: Some(snapshot_dir),
        },
        raft,
        mvcc,
        lessor,
        auth,
        ReplicatedCaches { alarms, cluster },
        peers,
    );
    Ok(Started {
        core,
        hub,
        log_reader,
        identity,
        recorded_format,
    })
}

/// A bound listener, with the TLS configuration if its URL is `https://`.
struct Bound {
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
}

async fn bind_all(
    addrs: &[ListenAddr],
    tls: &TlsFiles,
    side: &'static str,
) -> anyhow::Result<Vec<Bound>> {
    let mut out = Vec::new();
    for (a, https) in addrs {
        let tls = if *https {
            Some(tls.server_config(side)?)
        } else {
            None
        };
        let listener = TcpListener::bind(a)
            .await
            .map_err(|e| anyhow::anyhow!("listen on {a}: {e}"))?;
        out.push(Bound { listener, tls });
    }
    Ok(out)
}

/// A future of this API, boxed where it is made (in this crate).
///
/// The public `async` methods return boxed futures on purpose: rustc
/// compiles an `async` body (a coroutine) in every crate that polls it, as
/// it does generic code, so each binary or test that awaited
/// `Member::start` compiled the whole member again (the `store` binary and
/// one test took ~140 s each in the release profile). A boxed future is
/// made, and its body compiled, here only.
pub type MemberFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Member {
    /// Starts a member as `config` says; resolves once it is serving.
    pub fn start(config: Config) -> MemberFuture<'static, anyhow::Result<Member>> {
        Box::pin(Self::start_serving(config))
    }

    /// Starts a member in phases: the flags later tasks read, the
    /// listeners (bound before anything is written, as etcd: a port in
    /// use or a bad certificate fails the start first), the storage, Raft
    /// and the core, then the tasks and servers.
    async fn start_serving(config: Config) -> anyhow::Result<Member> {
        let flags = StartFlags::read(&config)?;
        let data_dir = flags.data_dir.clone();
        let format = crate::data_dir::prepare(&data_dir, crate::version::release().newest_format)?;
        let listeners = Listeners::bind(&config).await?;
        let storage = Storage::open(&config, &data_dir).await?;
        let started = start_raft(&config, &data_dir, format, storage).await?;
        Self::serve(config, flags, listeners, started).await
    }

    /// The last phase of [`Member::start_serving`]: the member's tasks and
    /// its peer, client and metrics servers.
    async fn serve(
        config: Config,
        flags: StartFlags,
        listeners: Listeners,
        started: Started,
    ) -> anyhow::Result<Member> {
        let Started {
            core,
            hub,
            log_reader,
            identity,
            recorded_format,
        } = started;
        let election_timeout = Duration::from_millis(config.election_timeout);
        // Every gRPC method's rows, at zero, before the metrics are served.
        crate::server::transport::grpc_metrics::preregister();
        let http_state =
            http::HttpState::start(core.clone(), election_timeout, config.quota_bytes());
        let grpc_health = grpc_health_service().await;
        let (shutdown, _) = watch::channel(false);
        let (ready_tx, ready) = watch::channel(false);
        let mut member = Member {
            core: core.clone(),
            client_addrs: local_addrs(&listeners.client)?,
            peer_addrs: local_addrs(&listeners.peer)?,
            shutdown,
            ready,
            tasks: Vec::new(),
        };
        spawn_lease_tasks(core.clone(), election_timeout, member.shutdown.subscribe());
        spawn_publish(
            core.clone(),
            MemberAttributes {
                id: identity.member_id,
                name: config.name.clone(),
                client_urls: split_urls(&config.advertise_client_urls),
            },
            ready_tx,
            member.shutdown.subscribe(),
        );
        for b in listeners.peer {
            let tls = match b.tls {
                Some(_) => Some(config.peer_tls().tonic_server()?),
                None => None,
            };
            member.tasks.push(tokio::spawn(serve_peer(
                b.listener,
                tls,
                core.clone(),
                member.shutdown.subscribe(),
            )));
        }
        if config.gates.initial_corrupt_check() {
            if let Err(e) = corruption::initial_check(&core).await {
                member.shutdown().await;
                return Err(e.into());
            }
        }
        member.spawn_duties(&flags, recorded_format, log_reader);
        let services = ClientServices {
            core: core.clone(),
            hub,
            max_request_bytes: config.max_request_bytes,
            progress_interval: flags.progress_interval,
            election_timeout,
            grpc_options: flags.grpc_options,
            http: http_state,
            grpc_health,
        };
        member.serve_clients(listeners.client, listeners.metrics, services);
        tracing::info!(
            name = %config.name,
            member_id = format_args!("{:x}", identity.member_id),
            cluster_id = format_args!("{:x}", identity.cluster_id),
            clients = ?member.client_addrs,
            peers = ?member.peer_addrs,
            "member started"
        );
        Ok(member)
    }

    /// Starts what a member does on its own: auto-compaction, the periodic
    /// corruption checks, the version monitor and gates, the log's bound.
    fn spawn_duties(&self, flags: &StartFlags, recorded_format: u32, log_reader: LogStore) {
        let core = &self.core;
        if let Some(policy) = flags.auto_compaction {
            auto_compaction::spawn(core.clone(), policy, self.shutdown.subscribe());
        }
        for every in &flags.corrupt_check_periods {
            corruption::spawn_periodic_check(core.clone(), *every, self.shutdown.subscribe());
        }
        versions::spawn_monitor(
            core.clone(),
            flags.downgrade_check,
            self.shutdown.subscribe(),
        );
        versions::spawn_gates(
            core.clone(),
            flags.data_dir.clone(),
            recorded_format,
            self.shutdown.subscribe(),
        );
        crate::raft::log_bound::spawn(
            core.raft.clone(),
            log_reader,
            Bounds::member(flags.catch_up_entries),
            core.snapshot_holds(),
            self.shutdown.subscribe(),
        );
    }

    /// Serves `services` on each client listener and the metrics on each
    /// metrics listener.
    fn serve_clients(&mut self, client: Vec<Bound>, metrics: Vec<Bound>, services: ClientServices) {
        for Bound { listener, tls } in client {
            self.tasks.push(tokio::spawn(serve_client(
                listener,
                tls,
                services.clone(),
                self.ready.clone(),
                self.shutdown.subscribe(),
            )));
        }
        for b in metrics {
            self.tasks.push(tokio::spawn(http::serve_metrics(
                b.listener,
                b.tls,
                services.http.clone(),
                stopped(self.shutdown.subscribe()),
            )));
        }
    }

    /// Waits until this member has published its name and client URLs
    /// through Raft and serves clients (etcd's `ReadyNotify`). Never
    /// returns while the cluster has no quorum.
    pub fn ready(&self) -> MemberFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.ready.clone().wait_for(|r| *r).await;
        })
    }

    /// This member's id.
    pub fn id(&self) -> NodeId {
        self.core.config.member_id
    }

    /// The cluster's id.
    pub fn cluster_id(&self) -> u64 {
        self.core.config.cluster_id
    }

    /// The addresses clients can reach this member at (`http://ip:port`).
    pub fn client_endpoints(&self) -> Vec<String> {
        self.client_addrs
            .iter()
            .map(|a| format!("http://{a}"))
            .collect()
    }

    /// The addresses peers reach this member at.
    pub fn peer_addrs(&self) -> &[SocketAddr] {
        &self.peer_addrs
    }

    /// The Raft handle (metrics, leadership).
    pub fn raft(&self) -> &Raft {
        &self.core.raft
    }

    /// Resolves, with the reason, when Raft stops on its own: a storage
    /// error (a full or failing disk: the log or the state machine could
    /// not be written) or a panic in its core. The member can then neither
    /// apply nor vote nor serve a linearizable request again; etcd exits on
    /// such errors (`failed to commit tx`, `failed to save Raft hard state
    /// and entries`) so that its supervisor restarts it once the disk is
    /// fixed, and the binary does the same. Never resolves while Raft runs.
    pub fn failed(&self) -> MemberFuture<'_, String> {
        Box::pin(self.failure())
    }

    async fn failure(&self) -> String {
        use openraft::async_runtime::WatchReceiver as _;
        // The server metrics change with elections only (the full metrics
        // with every write); their sender goes away with Raft's core, after
        // it recorded why it stopped in the full metrics.
        let mut server = self.core.raft.server_metrics();
        let mut core_gone = false;
        loop {
            if let Err(fatal) = &self.core.raft.metrics().borrow_watched().running_state {
                return fatal.to_string();
            }
            if core_gone {
                return "raft stopped".to_string();
            }
            core_gone = server.changed().await.is_err();
        }
    }

    /// Hands leadership over if this member leads (as etcd's `Stop`), stops
    /// serving, then stops Raft. Open requests and streams get etcd's
    /// request timeout (5 s + 2 x election timeout, the bound etcd gives its
    /// servers' graceful stop) to finish; then they are cut off.
    pub fn shutdown(self) -> MemberFuture<'static, ()> {
        Box::pin(async move {
            crate::server::peer::transfer::hand_over_on_stop(&self.core).await;
            let grace = self.core.config.request_timeout;
            self.stop(grace).await;
        })
    }

    /// Stops a member whose Raft core has failed ([`Self::failed`]) at once,
    /// as etcd exits on a fatal storage error: no open request can complete
    /// any more, so waiting for them only delays the supervisor's restart
    /// (the store used to hold a member with a full disk for the whole
    /// request timeout, 7 s, while its peers went on without it).
    pub fn shutdown_failed(self) -> MemberFuture<'static, ()> {
        Box::pin(self.stop(Duration::ZERO))
    }

    /// Stops serving, gives open requests and streams `grace` to finish,
    /// cuts them off, then stops Raft.
    async fn stop(mut self, grace: Duration) {
        self.shutdown.send_replace(true);
        let drained = tokio::time::timeout(grace, async {
            for t in self.tasks.iter_mut() {
                let _ = t.await;
            }
        })
        .await;
        if drained.is_err() {
            if !grace.is_zero() {
                tracing::warn!(
                    grace_ms = grace.as_millis() as u64,
                    "open client connections did not finish in time; closing them"
                );
            }
            for t in &self.tasks {
                t.abort();
            }
        }
        if let Err(e) = self.core.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Err(e) = self.core.mvcc.write_collected_history() {
            tracing::warn!(error = %e, "writing the key history at stop");
        }
        // What was applied reaches the engine's files before the process
        // ends (its WAL buffer is otherwise written out only within
        // `engine::rocks::WAL_FLUSH_DELAY`).
        if let Err(e) = self.core.mvcc.engine().sync() {
            tracing::warn!(error = %e, "syncing the state machine at stop");
        }
    }
}

async fn initialize(raft: &Raft, members: BTreeMap<NodeId, MemberInfo>) -> anyhow::Result<()> {
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another member's initialization reached us first: same config.
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Pause between attempts to publish this member's attributes while the
/// cluster has no leader yet.
const PUBLISH_RETRY_MS: u64 = 500;

/// Publishes this member's name and client URLs through Raft once a leader
/// exists (etcd's publish step), retrying until it succeeds or the member
/// stops; then marks the member `ready`. As in etcd, client listeners wait
/// for it, so no client sees this member unnamed in its own member list.
fn spawn_publish(
    core: Arc<Core>,
    attrs: MemberAttributes,
    ready: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                result = core.publish_member(attrs.clone()) => match result {
                    Ok(_) => {
                        ready.send_replace(true);
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e, "publishing member attributes"),
                },
                _ = stop.changed() => return,
            }
            tokio::time::sleep(Duration::from_millis(PUBLISH_RETRY_MS)).await;
        }
    });
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// HTTP/2 receive windows of the peer listener, per stream and per
/// connection: what a member lets a peer send ahead of what it has read.
/// With hyper's 1 MiB defaults a snapshot stream of 1 MiB chunks waited for
/// a window update after every chunk and moved about 140 MB/s on loopback
/// (a 1 GB snapshot took 7 s to cross).
const PEER_STREAM_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
const PEER_CONNECTION_WINDOW_BYTES: u32 = 32 * 1024 * 1024;

async fn serve_peer(
    listener: TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
    core: Arc<Core>,
    shutdown: watch::Receiver<bool>,
) {
    let svc = RaftPeerServer::new(PeerService::new(core, shutdown.clone()))
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
    let svc = tonic::service::interceptor::InterceptedService::new(
        svc,
        crate::server::peer::check_peer_protocol,
    );
    // tonic applies its `tcp_nodelay` only to listeners it binds itself:
    // accepted peer connections get it here. With Nagle's algorithm on, a
    // forwarded write's small answer waited for the follower's delayed ACK
    // (measured: writes through a follower p50 52 ms, max 101 ms, instead
    // of ~10 ms).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |accepted| {
            accepted.inspect(|tcp| {
                let _ = tcp.set_nodelay(true);
            })
        },
    );
    let mut builder = tonic::transport::Server::builder()
        .initial_stream_window_size(PEER_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(PEER_CONNECTION_WINDOW_BYTES);
    if let Some(tls) = tls {
        builder = match builder.tls_config(tls) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "peer TLS configuration");
                return;
            }
        };
    }
    let result = builder
        .layer(tower::util::MapRequestLayer::new(
            crate::server::peer::end_after_one_message,
        ))
        .layer(tower::util::MapResponseLayer::new(
            crate::server::peer::announce_peer_protocol,
        ))
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, stopped(shutdown))
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "peer server failed");
    }
}

/// What the client port serves.
#[derive(Clone)]
struct ClientServices {
    core: Arc<Core>,
    hub: Arc<WatchHub>,
    max_request_bytes: usize,
    progress_interval: Duration,
    election_timeout: Duration,
    grpc_options: GrpcServerOptions,
    http: http::HttpState,
    grpc_health: HealthServer<HealthService>,
}

/// The `grpc.health.v1.Health` service etcd registers: SERVING for the
/// service `""` (all services) once the member serves. (etcd turns it
/// NOT_SERVING only around a defragmentation when
/// `--experimental-stop-grpc-service-on-defrag` is set, which this store
/// does not have.)
async fn grpc_health_service() -> HealthServer<HealthService> {
    let reporter = tonic_health::server::HealthReporter::new();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    HealthServer::new(HealthService::from_health_reporter(reporter))
}

async fn serve_client(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    services: ClientServices,
    mut ready: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) {
    // etcd binds its client listeners at start but serves them only once
    // the member is ready: connections wait in the accept backlog.
    tokio::select! {
        r = ready.wait_for(|r| *r) => if r.is_err() { return },
        _ = stopped(shutdown.clone()) => return,
    }
    tracing::info!(address = ?listener.local_addr().ok(), "ready to serve client requests");
    let ClientServices {
        core,
        hub,
        max_request_bytes,
        progress_interval,
        election_timeout,
        grpc_options,
        http: http_state,
        grpc_health,
    } = services;
    let max_recv = TRANSPORT_MAX_DECODE_BYTES.max(max_request_bytes + GRPC_OVERHEAD_BYTES);
    let kv = KvRoutes::new(core.clone(), max_recv, MAX_SEND_BYTES);
    let maintenance = MaintenanceServer::new(MaintenanceService::new(core.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    let watch = WatchServer::new(WatchService::new(
        core.clone(),
        hub,
        progress_interval,
        election_timeout,
    ))
    .max_decoding_message_size(max_recv)
    .max_encoding_message_size(MAX_SEND_BYTES);
    let lease = LeaseServer::new(LeaseService::new(core.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    let cluster = ClusterServer::new(ClusterService::new(core.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    let auth = AuthServer::new(AuthService::new(core.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    // The services the Lock and Election recipes call, as etcd's
    // in-process client calls its own (no gRPC metrics layer).
    let recipes = GrpcDispatch::default()
        .with_service(kv.clone())
        .with_service(watch.clone())
        .with_service(lease.clone());
    let lock = LockServer::new(LockService::new(recipes.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    let election = ElectionServer::new(ElectionService::new(recipes))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(MAX_SEND_BYTES);
    let dispatch = GrpcDispatch::default()
        .with_service(kv)
        .with_service(auth)
        .with_service(maintenance)
        .with_service(watch)
        .with_service(lease)
        .with_service(cluster)
        .with_service(lock)
        .with_service(election)
        .with_service(grpc_health);
    // grpc-go's receive limit as etcd sets it, checked on each message's
    // header before the message is buffered (server::frame_limit).
    let learner = core.clone();
    let grpc = GrpcServices::new(
        dispatch,
        max_request_bytes + GRPC_OVERHEAD_BYTES,
        Arc::new(move || learner.is_learner()),
    );
    // A request for a gRPC method without gRPC's content type goes to the
    // HTTP router, which answers 404 as etcd's HTTP mux does.
    let app = conn::ClientApp {
        http: http::client_routes(http_state)
            .merge(crate::server::http::json_gateway::routes(
                grpc.clone(),
                max_recv,
            ))
            .fallback(http::not_found)
            .layer(axum::middleware::from_fn(http::cors)),
        grpc,
    };
    match tls {
        Some(config) => match TlsListener::new(listener, config) {
            Ok(l) => conn::serve(l, app, grpc_options, shutdown).await,
            Err(e) => tracing::error!(error = %e, "client server failed"),
        },
        None => {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            conn::serve(listener, app, grpc_options, shutdown).await
        }
    }
}

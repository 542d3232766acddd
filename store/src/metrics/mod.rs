//! The member's Prometheus metrics, with etcd 3.5's names, help texts,
//! types, label names and histogram buckets, so dashboards and alerts
//! written for etcd (kube-prometheus' etcd mixin, kubeadm's probes) work
//! unchanged.
//!
//! Like etcd, which registers its metrics in the Go client's process-wide
//! default registry, there is one registry per process ([`global`]). Domain
//! modules update typed handles ([`Metrics::server`], [`Metrics::mvcc`],
//! ...) with atomic operations only: a counter increment, a gauge set, a
//! histogram observation ([`AtomicHistogram`]: an atomic add per bucket).
//! Nothing on the write path takes a lock. Values that are a function of state rather than of
//! events (who leads, database size, live keys) are set from that state
//! when `/metrics` is scraped, by the edge (`server::http`), which also
//! encodes the registry ([`exposition`]).
//!
//! Families, by the module that feeds them:
//! - [`ServerMetrics`] (`etcd_server_*`, `etcd_cluster_version`): Raft
//!   leadership and proposals (`raft::leadership`, `raft::batcher`, the
//!   state machine), the quota, versions, health checks.
//! - [`MvccMetrics`] (`etcd_mvcc_*`, `etcd_debugging_mvcc_*`): operations
//!   counted as the KV layer applies them, watchers and watch streams.
//! - [`DiskMetrics`] (`etcd_disk_*`): the Raft log's group-commit fsync and
//!   the state machine's engine commits.
//! - [`NetworkMetrics`] (`etcd_network_*`): peer traffic and round trips
//!   (`raft::network`, `server::peer`), client gRPC bytes.
//! - [`GrpcMetrics`] (`grpc_server_*`): go-grpc-prometheus' counters, kept
//!   by the `server::grpc_metrics` tower layer.
//! - [`process`]: the `process_*` family, read from `/proc/self` at scrape
//!   time.

pub mod exposition;
pub mod histogram;
pub mod process;

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

pub use histogram::AtomicHistogram;

/// etcd's disk latency buckets: 1 ms doubling 14 times (to 8.192 s), for
/// `etcd_disk_wal_fsync_duration_seconds` and
/// `etcd_disk_backend_commit_duration_seconds`.
const DISK_BUCKET_START_SECONDS: f64 = 0.001;
/// Number of disk latency buckets (besides `+Inf`).
const DISK_BUCKETS: u16 = 14;

/// etcd's peer round-trip buckets: 100 µs doubling 16 times (to ~3.3 s).
const RTT_BUCKET_START_SECONDS: f64 = 0.0001;
/// Number of round-trip buckets (besides `+Inf`).
const RTT_BUCKETS: u16 = 16;

/// An apply slower than this counts in `etcd_server_slow_apply_total`
/// (etcd's default `--experimental-warning-apply-duration`, 100 ms).
pub const SLOW_APPLY_MILLIS: u128 = 100;

/// An integer gauge.
pub type IntGauge = Gauge<i64, AtomicI64>;
/// A floating-point gauge.
pub type FloatGauge = Gauge<f64, AtomicU64>;
/// A label set: (name, value) pairs.
pub type Labels = Vec<(&'static str, String)>;

/// `etcd_server_*` and `etcd_cluster_version`.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Whether a leader exists (1) or not (0).
    pub has_leader: IntGauge,
    /// Whether this member leads.
    pub is_leader: IntGauge,
    /// Whether this member is a learner.
    pub is_learner: IntGauge,
    /// Leader changes this member has seen.
    pub leader_changes_seen: Counter,
    /// Raft's commit index as this member knows it.
    pub proposals_committed: IntGauge,
    /// This member's applied index.
    pub proposals_applied: IntGauge,
    /// Proposals waiting to commit.
    pub proposals_pending: IntGauge,
    /// Proposals that failed (timeout, lost leadership, ...).
    pub proposals_failed: Counter,
    /// Applies that took longer than [`SLOW_APPLY_MILLIS`].
    pub slow_apply: Counter,
    /// ReadIndex rounds that no quorum confirmed within the request timeout.
    pub slow_read_indexes: Counter,
    /// ReadIndex rounds that ended because this member does not lead.
    pub read_indexes_failed: Counter,
    /// `--quota-backend-bytes` in effect.
    pub quota_backend_bytes: FloatGauge,
    /// 1 for the running server version.
    pub version: Family<Labels, IntGauge>,
    /// 1 for the cluster version.
    pub cluster_version: Family<Labels, IntGauge>,
    /// 1 for this member's id (hex).
    pub id: Family<Labels, IntGauge>,
    /// 1 or 0 for each feature gate (etcd 3.6), by name and stage.
    pub feature_enabled: Family<Labels, IntGauge>,
    /// 1 for each raised alarm, by member (hex) and type (etcd 3.6's
    /// `etcd_debugging_server_alarms`).
    pub alarms: Family<Labels, IntGauge>,
    /// Result (1 ok, 0 failed) of each `/livez` and `/readyz` check.
    pub healthcheck: Family<Labels, IntGauge>,
    /// Runs of each `/livez` and `/readyz` check, by result.
    pub healthchecks: Family<Labels, Counter>,
}

/// `etcd_mvcc_*` and `etcd_debugging_mvcc_*`.
#[derive(Debug, Default)]
pub struct MvccMetrics {
    /// Bytes the engine occupies on disk.
    pub db_total_size: IntGauge,
    /// Bytes of live data in the engine.
    pub db_total_size_in_use: IntGauge,
    /// Live keys.
    pub keys: IntGauge,
    /// Puts applied.
    pub put: Counter,
    /// Ranges served (each range of a transaction too).
    pub range: Counter,
    /// Transactions with more than one operation.
    pub txn: Counter,
    /// Delete-ranges applied.
    pub delete: Counter,
    /// Open watchers.
    pub watchers: IntGauge,
    /// Open watch streams.
    pub watch_streams: IntGauge,
}

/// `etcd_disk_*`.
#[derive(Debug)]
pub struct DiskMetrics {
    /// Raft log fsync latency.
    pub wal_fsync: AtomicHistogram,
    /// Engine commit latency of applied entries.
    pub backend_commit: AtomicHistogram,
}

/// `etcd_network_*`.
#[derive(Debug)]
pub struct NetworkMetrics {
    /// Bytes sent to each peer (`To`).
    pub peer_sent: Family<Labels, Counter>,
    /// Bytes received from each peer (`From`).
    pub peer_received: Family<Labels, Counter>,
    /// Round trips to each peer (`To`).
    pub peer_rtt: Family<Labels, AtomicHistogram>,
    /// 1 for each member this one knows (`Local`, `Remote`: hex ids).
    pub known_peers: Family<Labels, IntGauge>,
    /// gRPC bytes sent to clients.
    pub client_grpc_sent: Counter,
    /// gRPC bytes received from clients.
    pub client_grpc_received: Counter,
}

/// `grpc_server_*` (go-grpc-prometheus).
#[derive(Debug, Default)]
pub struct GrpcMetrics {
    /// RPCs started, by `grpc_type`, `grpc_service`, `grpc_method`.
    pub started: Family<Labels, Counter>,
    /// RPCs completed, by those and `grpc_code`.
    pub handled: Family<Labels, Counter>,
    /// Request messages received, by `grpc_type`, `grpc_service`,
    /// `grpc_method`.
    pub msg_received: Family<Labels, Counter>,
    /// Response messages sent, by the same labels.
    pub msg_sent: Family<Labels, Counter>,
}

/// Every metric of the process, and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    /// `etcd_server_*`.
    pub server: ServerMetrics,
    /// `etcd_mvcc_*`.
    pub mvcc: MvccMetrics,
    /// `etcd_disk_*`.
    pub disk: DiskMetrics,
    /// `etcd_network_*`.
    pub network: NetworkMetrics,
    /// `grpc_server_*`.
    pub grpc: GrpcMetrics,
    /// `etcd_server_range_duration_seconds` (etcd 3.6's txn metrics).
    pub txn: TxnMetrics,
    registry: Registry,
}

/// etcd 3.6's `txn` package metrics.
#[derive(Debug)]
pub struct TxnMetrics {
    /// Latency of Range, by `success` (`true`/`false`).
    pub range_duration: Family<Labels, AtomicHistogram>,
    /// The two series, looked up on a Range's first observation of each
    /// (so, as in etcd, a series shows once it has a sample) and kept, so
    /// a Range allocates no labels.
    range_series: [std::sync::OnceLock<AtomicHistogram>; 2],
}

impl TxnMetrics {
    /// Records one Range's latency.
    pub fn observe_range(&self, success: bool, seconds: f64) {
        self.range_series[usize::from(success)]
            .get_or_init(|| {
                let label = if success { "true" } else { "false" };
                self.range_duration
                    .get_or_create_owned(&vec![("success", label.to_string())])
            })
            .observe(seconds);
    }
}

/// etcd's buckets for `etcd_server_range_duration_seconds`: 100 us
/// doubling 20 times.
const RANGE_BUCKET_START_SECONDS: f64 = 0.0001;
/// How many buckets (before `+Inf`).
const RANGE_BUCKETS: u16 = 20;

fn range_histogram() -> AtomicHistogram {
    AtomicHistogram::new(exponential_buckets(
        RANGE_BUCKET_START_SECONDS,
        2.0,
        RANGE_BUCKETS,
    ))
}

/// The process's metrics (etcd: the default Prometheus registry).
pub fn global() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

fn disk_histogram() -> AtomicHistogram {
    AtomicHistogram::new(exponential_buckets(
        DISK_BUCKET_START_SECONDS,
        2.0,
        DISK_BUCKETS,
    ))
}

fn rtt_histogram() -> AtomicHistogram {
    AtomicHistogram::new(exponential_buckets(
        RTT_BUCKET_START_SECONDS,
        2.0,
        RTT_BUCKETS,
    ))
}

impl Metrics {
    fn new() -> Self {
        let mut m = Metrics {
            server: ServerMetrics::default(),
            mvcc: MvccMetrics::default(),
            disk: DiskMetrics {
                wal_fsync: disk_histogram(),
                backend_commit: disk_histogram(),
            },
            network: NetworkMetrics {
                peer_sent: Family::default(),
                peer_received: Family::default(),
                peer_rtt: Family::new_with_constructor(rtt_histogram),
                known_peers: Family::default(),
                client_grpc_sent: Counter::default(),
                client_grpc_received: Counter::default(),
            },
            grpc: GrpcMetrics::default(),
            txn: TxnMetrics {
                range_duration: Family::new_with_constructor(range_histogram),
                range_series: Default::default(),
            },
            registry: Registry::default(),
        };
        m.server
            .version
            .get_or_create(&vec![(
                "server_version",
                crate::version::presented_server_version().to_string(),
            )])
            .set(1);
        m.register();
        m
    }

    /// The registry holding every family (for encoding).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records the feature gates in force (once, at start), one series
    /// per gate as etcd 3.6 does.
    pub fn set_feature_gates(&self, gates: &crate::features::FeatureGates) {
        self.server.feature_enabled.clear();
        for gate in crate::features::GATES {
            let labels = vec![
                ("name", gate.name.to_string()),
                ("stage", gate.stage.label().to_string()),
            ];
            let on = gates.enabled(gate.name);
            self.server
                .feature_enabled
                .get_or_create(&labels)
                .set(i64::from(on));
        }
    }

    /// Records the cluster version (major.minor) once decided, as etcd
    /// does on every change.
    pub fn set_cluster_version(&self, version: Option<String>) {
        self.server.cluster_version.clear();
        if let Some(v) = version {
            self.server
                .cluster_version
                .get_or_create(&vec![("cluster_version", v)])
                .set(1);
        }
    }

    /// Records this member's identity and quota (once, at start).
    pub fn set_member(&self, member_id: u64, quota_bytes: u64) {
        self.server.id.clear();
        self.server
            .id
            .get_or_create(&vec![("server_id", format!("{member_id:x}"))])
            .set(1);
        self.server.quota_backend_bytes.set(quota_bytes as f64);
    }

    fn register(&mut self) {
        // Help texts are etcd's, byte for byte (see `exposition` for the
        // period prometheus-client appends).
        let mut r = Registry::default();
        self.register_server(&mut r);
        self.register_mvcc(&mut r);
        self.register_disk_and_network(&mut r);
        self.register_grpc(&mut r);
        r.register_collector(Box::new(process::ProcessCollector::new()));
        self.registry = r;
    }

    fn register_server(&self, r: &mut Registry) {
        r.register(
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            self.server.has_leader.clone(),
        );
        r.register(
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            self.server.is_leader.clone(),
        );
        r.register(
            "etcd_server_is_learner",
            "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            self.server.is_learner.clone(),
        );
        r.register(
            "etcd_server_leader_changes_seen",
            "The number of leader changes seen.",
            self.server.leader_changes_seen.clone(),
        );
        r.register(
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            self.server.proposals_committed.clone(),
        );
        r.register(
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            self.server.proposals_applied.clone(),
        );
        r.register(
            "etcd_server_proposals_pending",
            "The current number of pending proposals to commit.",
            self.server.proposals_pending.clone(),
        );
        r.register(
            "etcd_server_proposals_failed",
            "The total number of failed proposals seen.",
            self.server.proposals_failed.clone(),
        );
        r.register(
            "etcd_server_slow_apply",
            "The total number of slow apply requests (likely overloaded from slow disk).",
            self.server.slow_apply.clone(),
        );
        r.register(
            "etcd_server_slow_read_indexes",
            "The total number of pending read indexes not in sync with leader's or timed out read index requests.",
            self.server.slow_read_indexes.clone(),
        );
        r.register(
            "etcd_server_read_indexes_failed",
            "The total number of failed read indexes seen.",
            self.server.read_indexes_failed.clone(),
        );
        r.register(
            "etcd_server_quota_backend_bytes",
            "Current backend storage quota size in bytes.",
            self.server.quota_backend_bytes.clone(),
        );
        r.register(
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            self.server.version.clone(),
        );
        r.register(
            "etcd_server_feature_enabled",
            "Whether or not a feature is enabled. 1 is enabled, 0 is not.",
            self.server.feature_enabled.clone(),
        );
        r.register(
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            self.server.cluster_version.clone(),
        );
        r.register(
            "etcd_server_id",
            "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            self.server.id.clone(),
        );
        r.register(
            "etcd_server_healthcheck",
            "The result of each kind of healthcheck.",
            self.server.healthcheck.clone(),
        );
        r.register(
            "etcd_server_healthchecks",
            "The total number of each kind of healthcheck.",
            self.server.healthchecks.clone(),
        );
    }

    fn register_mvcc(&self, r: &mut Registry) {
        r.register(
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            self.mvcc.db_total_size.clone(),
        );
        r.register(
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes.",
            self.mvcc.db_total_size_in_use.clone(),
        );
        r.register(
            "etcd_debugging_mvcc_keys_total",
            "Total number of keys.",
            self.mvcc.keys.clone(),
        );
        r.register(
            "etcd_mvcc_put",
            "Total number of puts seen by this member.",
            self.mvcc.put.clone(),
        );
        r.register(
            "etcd_mvcc_range",
            "Total number of ranges seen by this member.",
            self.mvcc.range.clone(),
        );
        r.register(
            "etcd_mvcc_txn",
            "Total number of txns seen by this member.",
            self.mvcc.txn.clone(),
        );
        r.register(
            "etcd_mvcc_delete",
            "Total number of deletes seen by this member.",
            self.mvcc.delete.clone(),
        );
        r.register(
            "etcd_debugging_mvcc_watcher_total",
            "Total number of watchers.",
            self.mvcc.watchers.clone(),
        );
        r.register(
            "etcd_debugging_mvcc_watch_stream_total",
            "Total number of watch streams.",
            self.mvcc.watch_streams.clone(),
        );
    }

    fn register_disk_and_network(&self, r: &mut Registry) {
        r.register(
            "etcd_disk_wal_fsync_duration_seconds",
            "The latency distributions of fsync called by WAL.",
            self.disk.wal_fsync.clone(),
        );
        r.register(
            "etcd_disk_backend_commit_duration_seconds",
            "The latency distributions of commit called by backend.",
            self.disk.backend_commit.clone(),
        );
        r.register(
            "etcd_network_peer_sent_bytes",
            "The total number of bytes sent to peers.",
            self.network.peer_sent.clone(),
        );
        r.register(
            "etcd_network_peer_received_bytes",
            "The total number of bytes received from peers.",
            self.network.peer_received.clone(),
        );
        r.register(
            "etcd_network_known_peers",
            "The current number of known peers.",
            self.network.known_peers.clone(),
        );
        r.register(
            "etcd_debugging_server_alarms",
            "Alarms for every member in cluster. 1 for 'server_id' label with current ID. 2 for 'alarm_type' label with type of this alarm",
            self.server.alarms.clone(),
        );
        r.register(
            "etcd_server_range_duration_seconds",
            "The latency distributions of txn.Range",
            self.txn.range_duration.clone(),
        );
        r.register(
            "etcd_network_peer_round_trip_time_seconds",
            "Round-Trip-Time histogram between peers",
            self.network.peer_rtt.clone(),
        );
        r.register(
            "etcd_network_client_grpc_sent_bytes",
            "The total number of bytes sent to grpc clients.",
            self.network.client_grpc_sent.clone(),
        );
        r.register(
            "etcd_network_client_grpc_received_bytes",
            "The total number of bytes received from grpc clients.",
            self.network.client_grpc_received.clone(),
        );
    }

    fn register_grpc(&self, r: &mut Registry) {
        r.register(
            "grpc_server_started",
            "Total number of RPCs started on the server.",
            self.grpc.started.clone(),
        );
        r.register(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            self.grpc.handled.clone(),
        );
        r.register(
            "grpc_server_msg_received",
            "Total number of RPC stream messages received on the server.",
            self.grpc.msg_received.clone(),
        );
        r.register(
            "grpc_server_msg_sent",
            "Total number of gRPC stream messages sent by the server.",
            self.grpc.msg_sent.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_buckets_are_etcds() {
        let b: Vec<f64> =
            exponential_buckets(DISK_BUCKET_START_SECONDS, 2.0, DISK_BUCKETS).collect();
        assert_eq!(b.first(), Some(&0.001));
        assert_eq!(b.last(), Some(&8.192));
    }
}

/// Counts one open thing in a gauge for as long as it lives (a watcher, a
/// watch stream, a pending proposal): +1 when made, -1 when dropped.
#[derive(Debug)]
pub struct GaugeGuard(&'static IntGauge);

impl GaugeGuard {
    /// Adds one to `gauge` until the guard drops.
    pub fn new(gauge: &'static IntGauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

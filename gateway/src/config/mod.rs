//! Configuration: the validated model the gateway runs on.
//!
//! Two sources produce a [`Config`]: a TOML file ([`Config::from_toml`], see `README.md` for
//! the reference) and, for the simple case, command-line flags (`crate::cli`). Every value
//! is validated once, here, so the runtime never sees an impossible setting. File errors
//! carry the line and column of the offending value ([`ConfigError`]).
//!
//! Defaults follow HAProxy where HAProxy has one (`inter 2s`, `fall 3`, `rise 2`,
//! `timeout connect 5s`) and otherwise fit the kube-apiserver role: the idle timeout is one
//! hour because watches and `kubectl logs -f` stay quiet for long stretches, and the check
//! probes `/readyz`, which kube-apiserver fails as soon as it starts shutting down.

mod duration;
mod error;
mod file;
mod vip;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use duration::parse_duration;
pub use error::ConfigError;
pub use vip::{
    default_name, default_prefix, parse_election_endpoints, parse_vip_address, validate_interface,
    validate_lease_ttl, validate_name, validate_prefix, ElectionTls, VipConfig,
    DEFAULT_VIP_LEASE_TTL, MAX_VIP_LEASE_TTL, MIN_VIP_LEASE_TTL,
};

/// Default admin/metrics listen address. Loopback so the drain/disable API is not exposed by
/// accident; Prometheus usually scrapes through a node-local agent or a changed address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9100";
/// HAProxy's `inter` default: the period between two health checks of a backend.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// HAProxy's `fall` default: consecutive failed checks that mark a backend down.
pub const DEFAULT_FALL: u32 = 3;
/// HAProxy's `rise` default: consecutive successful checks that mark a backend up again.
pub const DEFAULT_RISE: u32 = 2;
/// Ramp-up period after a backend comes back up: a freshly started apiserver has cold caches,
/// so it receives a growing share of new connections instead of every one at once.
pub const DEFAULT_SLOW_START: Duration = Duration::from_secs(10);
/// HAProxy's `timeout connect` in kubeadm's guide: a TCP handshake on a LAN that takes longer
/// than this is a dead or overloaded backend.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle timeout of an established connection (HAProxy's `timeout tunnel`). Watches,
/// `kubectl logs -f` and `exec` sessions can stay silent far longer than HAProxy's 35-50 s
/// client/server timeouts that break them (kubeadm#2227); client-go's own HTTP/2 ping
/// detects dead peers, so the gateway only reaps connections that are truly abandoned.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// How long a new connection may wait for a backend below its connection limit (HAProxy's
/// `timeout queue` is 20 s in kubeadm's guide; clients retry sooner than that on their own).
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// Redispatch attempts after a failed connect. Two covers a three-member control plane: every
/// member is tried once before the client sees an error.
pub const DEFAULT_RETRIES: u32 = 2;
/// Idle time before the first TCP keepalive probe on both legs. Below the 350 s idle timeout
/// of common cloud NATs/load balancers, so middleboxes keep the flow.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// Frontend connection limit (HAProxy's `maxconn`). A control plane of a 5000-node cluster
/// holds roughly 4 long-lived connections per node; this leaves headroom for bursts.
pub const DEFAULT_MAX_CONNECTIONS: usize = 50_000;
/// Time SIGTERM gives established connections to finish before they are closed. Long enough
/// for in-flight requests, short enough for a rolling restart of the gateway.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default backend weight, HAProxy's default too.
pub const DEFAULT_WEIGHT: u32 = 100;
/// Largest accepted backend weight (HAProxy's limit), so weight ratios stay meaningful.
pub const MAX_WEIGHT: u32 = 256;
/// Largest `fall`/`rise`: beyond this a state change would take minutes at default intervals.
pub const MAX_FALL_RISE: u32 = 100;
/// Shortest accepted check interval: below it the checks themselves load the backends.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Largest redispatch count: each attempt may cost a connect timeout.
pub const MAX_RETRIES: u32 = 10;
/// Most frontends or backends per frontend: the runtime scans backend lists linearly.
pub const MAX_ENTRIES: usize = 256;

/// The whole gateway configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address of the admin API, metrics and status page (`None`: admin API disabled).
    pub admin_listen: Option<SocketAddr>,
    /// Drain deadline on SIGTERM.
    pub shutdown_grace: Duration,
    /// Listeners and their backends.
    pub frontends: Vec<FrontendConfig>,
    /// The virtual IP this gateway competes for (`None`: no VIP).
    pub vip: Option<VipConfig>,
}

/// How a frontend picks a backend for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalancePolicy {
    /// Power of two choices on open connections (HAProxy `leastconn`); best for watches.
    LeastConnections,
    /// Power of two choices on peak-EWMA connect latency times open connections.
    PeakEwma,
    /// Smooth weighted round robin (HAProxy `roundrobin`).
    RoundRobin,
}

/// What happens to established connections of a backend that health checks mark down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMarkedDown {
    /// Keep them (default): kube-apiserver drains its own connections with GOAWAY.
    KeepSessions,
    /// Close them at once (HAProxy `on-marked-down shutdown-sessions`).
    ShutdownSessions,
}

/// One listener and the backends it balances across.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontendConfig {
    /// Unique name (metrics label, admin API path).
    pub name: String,
    /// Listen address.
    pub listen: SocketAddr,
    /// Balancing policy.
    pub balance: BalancePolicy,
    /// Most concurrent client connections; over it new connections are closed at once.
    pub max_connections: usize,
    /// TCP connect timeout towards a backend.
    pub connect_timeout: Duration,
    /// Idle timeout of an established connection (no byte in either direction).
    pub idle_timeout: Duration,
    /// How long a new connection may wait for a backend below its limit.
    pub queue_timeout: Duration,
    /// Redispatch attempts on another backend after a failed connect.
    pub retries: u32,
    /// TCP keepalive idle time on both legs.
    pub tcp_keepalive: Duration,
    /// The relayed protocol's client sends first (TLS, the default): accepts wait for the
    /// first bytes and handshake ACKs ride on data (`crate::net`).
    pub client_speaks_first: bool,
    /// Behaviour for established connections when a backend is marked down.
    pub on_marked_down: OnMarkedDown,
    /// Active health check, shared by the frontend's backends.
    pub check: CheckConfig,
    /// The backends.
    pub backends: Vec<BackendConfig>,
}

/// Protocol of the active health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// No active check: backends are always up (passive detection still applies).
    None,
    /// A TCP connect succeeds.
    Tcp,
    /// Plain HTTP GET on `path` answers 2xx.
    Http,
    /// HTTPS GET on `path` answers 2xx (kube-apiserver `/readyz`).
    Https,
    /// Plain HTTP GET on etcd's `/health` answers 200 with `"health":"true"`.
    EtcdHttp,
    /// HTTPS GET on etcd's `/health` answers 200 with `"health":"true"`.
    EtcdHttps,
}

impl CheckKind {
    /// Whether the probe speaks TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, CheckKind::Https | CheckKind::EtcdHttps)
    }

    /// The path probed when none is configured.
    pub fn default_path(self) -> &'static str {
        match self {
            CheckKind::EtcdHttp | CheckKind::EtcdHttps => "/health",
            _ => "/readyz",
        }
    }
}

/// How the HTTPS check verifies the backend's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// Accept any certificate (HAProxy `verify none`, kubeadm's choice).
    None,
    /// Verify against the CA bundle in this PEM file.
    CaFile(PathBuf),
}

/// TLS settings of the health-check client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTls {
    /// Server certificate verification.
    pub verify: Verify,
    /// Client certificate and key (PEM) for backends that require one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// SNI and verification name; the backend's host when unset.
    pub server_name: Option<String>,
}

/// The active health check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckConfig {
    /// Protocol.
    pub kind: CheckKind,
    /// HTTP path.
    pub path: String,
    /// Period between checks.
    pub interval: Duration,
    /// Deadline of one check.
    pub timeout: Duration,
    /// Consecutive failures that mark a backend down.
    pub fall: u32,
    /// Consecutive successes that mark a backend up.
    pub rise: u32,
    /// Weight ramp after a backend comes up (zero disables).
    pub slow_start: Duration,
    /// TLS client settings for HTTPS checks.
    pub tls: CheckTls,
}

impl CheckConfig {
    /// The check for `kind` with HAProxy's default timings.
    pub fn with_kind(kind: CheckKind) -> Self {
        CheckConfig {
            kind,
            path: kind.default_path().to_string(),
            interval: DEFAULT_CHECK_INTERVAL,
            timeout: DEFAULT_CHECK_INTERVAL,
            fall: DEFAULT_FALL,
            rise: DEFAULT_RISE,
            slow_start: DEFAULT_SLOW_START,
            tls: CheckTls {
                verify: Verify::None,
                client_cert: None,
                server_name: None,
            },
        }
    }
}

/// One backend server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// Unique name within the frontend.
    pub name: String,
    /// `HOST:PORT` to relay to.
    pub address: String,
    /// `HOST:PORT` to health check, when it differs from `address`.
    pub check_address: Option<String>,
    /// Relative weight, 0..=[`MAX_WEIGHT`]; 0 takes no new connections.
    pub weight: u32,
    /// Most concurrent connections to this backend (`None`: unlimited).
    pub max_connections: Option<usize>,
}

impl Config {
    /// Parses and validates a TOML configuration; errors name the line and column.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        file::parse(text)
    }

    /// Reads and parses a TOML configuration file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text)
    }
}

/// Checks that `address` has the form `HOST:PORT` with a non-empty host and a valid port.
pub fn validate_host_port(address: &str) -> Result<(), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("address `{address}` must be HOST:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("address `{address}` has an empty host"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("address `{address}` has an invalid port `{port}`")),
        Ok(_) => Ok(()),
    }
}

impl FrontendConfig {
    /// The TCP settings of this frontend's sockets.
    pub fn socket_options(&self) -> crate::net::SocketOptions {
        crate::net::SocketOptions {
            keepalive_idle: self.tcp_keepalive,
            client_speaks_first: self.client_speaks_first,
        }
    }
}

//! Member configuration with etcd 3.6's flag names, defaults and `ETCD_*`
//! environment variables, so the binary drops into an etcd static-pod
//! manifest unchanged.
//!
//! The arguments are first read as etcd reads them ([`crate::etcd_flags`]:
//! every flag of etcd 3.6, Go's syntax, a flag etcd does not have is an
//! error). Flags that only tune etcd internals (WAL, bbolt, Go runtime...)
//! are then set aside with a warning; the rest are parsed into [`Config`].
//! Last come 3.6's rules for the old `--experimental-*` spellings: the
//! feature-gate flags feed [`FeatureGates`] and may not be given with
//! `--feature-gates` naming the same gate; a renamed flag sets its new
//! name and may not be given with it.
//!
//! `--config-file` (or `ETCD_CONFIG_FILE`) replaces all of it: the YAML
//! file's keys become the configuration and every other flag and `ETCD_*`
//! variable is ignored, as in etcd ([`crate::config_file`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};

use crate::config_file::{self, ConfigFileError};
use crate::duration::parse_go_duration;
use crate::etcd_flags::{self, Handling, Scan, ScanError};
use crate::features::{FeatureGates, GateError};
use crate::identity::member_id;
use crate::limits::{
    DEFAULT_ELECTION_TIMEOUT_MS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_MAX_LEARNERS,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, DEFAULT_QUOTA_BACKEND_BYTES,
    DEFAULT_SNAPSHOT_COUNT,
};
use crate::raft::types::{MemberInfo, NodeId};
use crate::server::duties::auto_compaction::AutoCompaction;

/// A member's configuration (etcd's flags).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "store",
    disable_version_flag = true,
    about = "A Raft-replicated key-value store that speaks the etcd v3 API (etcd 3.6's flags)"
)]
pub struct Config {
    /// Path to the server configuration file (YAML, etcd's keys). Other
    /// command line flags and environment variables are then ignored.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// Print the version and exit.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub version: bool,
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: "<name>.etcd").
    #[arg(long, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// List of URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub listen_client_urls: String,
    /// List of URLs to listen on for the metrics and health endpoints.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
    /// List of this member's client URLs to advertise to the public.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub advertise_client_urls: String,
    /// List of URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub listen_peer_urls: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping (default: "<name>=<initial-advertise-peer-urls>").
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Initial cluster state ('new' or 'existing').
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new", value_parser = ["new", "existing"])]
    pub initial_cluster_state: String,
    /// Initial cluster token for the cluster during bootstrap.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = DEFAULT_SNAPSHOT_COUNT)]
    pub snapshot_count: u64,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = DEFAULT_HEARTBEAT_INTERVAL_MS)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = DEFAULT_ELECTION_TIMEOUT_MS)]
    pub election_timeout: u64,
    /// Raise alarms when backend size exceeds the given quota (0 defaults to low space quota).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: u64,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = DEFAULT_MAX_TXN_OPS)]
    pub max_txn_ops: usize,
    /// Path to the client server TLS cert file.
    #[arg(long, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Enable client cert authentication.
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub client_cert_auth: bool,
    /// Path to the peer server TLS cert file.
    #[arg(long, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Enable peer client cert authentication.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub peer_client_cert_auth: bool,
    /// Specify auth token type and its options ('simple' or 'jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...').
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// The lifetime in seconds of a simple auth token since its last use.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// Specify bcrypt algorithm cost factor for auth password hashing.
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = crate::auth::DEFAULT_BCRYPT_COST,
          value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,
    /// Duration of periodic watch progress notifications.
    #[arg(
        long,
        env = "ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m"
    )]
    pub watch_progress_notify_interval: String,
    /// Deprecated in etcd 3.6: `--watch-progress-notify-interval`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub experimental_watch_progress_notify_interval: Option<String>,
    /// A set of key=value pairs that describe server level feature gates
    /// (see `docs/compatibility.md`).
    #[arg(long, env = "ETCD_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// The gates in force (from `--feature-gates` and the deprecated
    /// `--experimental-*` gate flags).
    #[arg(skip)]
    pub gates: FeatureGates,
    /// Set the max number of learner members allowed in the cluster membership.
    #[arg(long, env = "ETCD_MAX_LEARNERS", default_value_t = DEFAULT_MAX_LEARNERS)]
    pub max_learners: i64,
    /// Duration of time between two downgrade status checks.
    #[arg(long, env = "ETCD_DOWNGRADE_CHECK_TIME", default_value = "5s")]
    pub downgrade_check_time: String,
    /// Deprecated in etcd 3.6: `--downgrade-check-time`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_DOWNGRADE_CHECK_TIME")]
    pub experimental_downgrade_check_time: Option<String>,
    /// Client TLS using generated certificates (not supported: refused when true).
    #[arg(long, env = "ETCD_AUTO_TLS", num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub auto_tls: bool,
    /// Peer TLS using generated certificates (not supported: refused when true).
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = go_bool)]
    pub peer_auto_tls: bool,
    /// Discovery URL used to bootstrap the cluster. Not supported: a fresh
    /// member given it refuses to start (see `Member::start`).
    #[arg(long, env = "ETCD_DISCOVERY")]
    pub discovery: Option<String>,
    /// DNS SRV domain used to bootstrap the cluster. Not supported, as
    /// `--discovery`.
    #[arg(long, env = "ETCD_DISCOVERY_SRV")]
    pub discovery_srv: Option<String>,
    /// V3 discovery: discovery token. Not supported, as `--discovery`.
    #[arg(long, env = "ETCD_DISCOVERY_TOKEN")]
    pub discovery_token: Option<String>,
    /// V3 discovery: gRPC endpoints of the discovery service. Not
    /// supported, as `--discovery`.
    #[arg(long, env = "ETCD_DISCOVERY_ENDPOINTS")]
    pub discovery_endpoints: Option<String>,
    /// Configures log level. Only supports debug, info, warn, error, panic, or fatal.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info",
          value_parser = ["debug", "info", "warn", "error", "panic", "fatal"])]
    pub log_level: String,
    /// Currently only supports 'zap' for structured logging.
    #[arg(long, env = "ETCD_LOGGER", default_value = "zap")]
    pub logger: String,
    /// Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd, or list of comma separated output targets.
    #[arg(long, env = "ETCD_LOG_OUTPUTS", default_value = "default")]
    pub log_outputs: String,
    /// Configures log format. Only supports json, console.
    #[arg(long, env = "ETCD_LOG_FORMAT", default_value = "json", value_parser = ["json", "console"])]
    pub log_format: String,
    /// Deprecated in etcd 3.6: `--feature-gates=InitialCorruptCheck=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_initial_corrupt_check: Option<bool>,
    /// Deprecated in etcd 3.6: `--feature-gates=CompactHashCheck=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_compact_hash_check_enabled: Option<bool>,
    /// Deprecated in etcd 3.6: `--feature-gates=LeaseCheckpoint=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_enable_lease_checkpoint: Option<bool>,
    /// Deprecated in etcd 3.6: `--feature-gates=LeaseCheckpointPersist=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT_PERSIST", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_enable_lease_checkpoint_persist: Option<bool>,
    /// Deprecated in etcd 3.6: `--feature-gates=TxnModeWriteWithSharedBuffer=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_TXN_MODE_WRITE_WITH_SHARED_BUFFER", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_txn_mode_write_with_shared_buffer: Option<bool>,
    /// Deprecated in etcd 3.6: `--feature-gates=StopGRPCServiceOnDefrag=true`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_STOP_GRPC_SERVICE_ON_DEFRAG", num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub experimental_stop_grpc_service_on_defrag: Option<bool>,
    /// Duration of time between cluster corruption check passes.
    #[arg(long, env = "ETCD_CORRUPT_CHECK_TIME", default_value = "0s")]
    pub corrupt_check_time: String,
    /// Deprecated in etcd 3.6: `--corrupt-check-time`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME")]
    pub experimental_corrupt_check_time: Option<String>,
    /// Duration of time between leader checks followers compaction hashes.
    #[arg(long, env = "ETCD_COMPACT_HASH_CHECK_TIME", default_value = "1m")]
    pub compact_hash_check_time: String,
    /// Deprecated in etcd 3.6: `--compact-hash-check-time`.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_TIME")]
    pub experimental_compact_hash_check_time: Option<String>,
    /// Interpret 'auto-compaction-retention' one of: periodic|revision. 'periodic' for duration based retention, defaulting to hours if no time unit is provided (e.g. '5m'). 'revision' for revision number based retention.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention for mvcc key value store. 0 means disable auto compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// Force to create a new one-member cluster.
    #[arg(long, env = "ETCD_FORCE_NEW_CLUSTER", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub force_new_cluster: bool,
    /// Enable to run an additional Raft election phase.
    #[arg(long, env = "ETCD_PRE_VOTE", num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    pub pre_vote: bool,
    /// Maximum concurrent streams that each client can open at a time (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS on the client port; 0 means no limit, as
    /// in grpc-go).
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Minimum duration interval that a client should wait before pinging server.
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_MIN_TIME", default_value = "5s")]
    pub grpc_keepalive_min_time: String,
    /// Frequency duration of server-to-client ping to check if a connection is alive (0 to disable).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_INTERVAL", default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// Additional duration of wait before closing a non-responsive connection (0 to disable).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s")]
    pub grpc_keepalive_timeout: String,
}

/// Go's `strconv.ParseBool`, for clap.
fn go_bool(v: &str) -> Result<bool, String> {
    etcd_flags::parse_go_bool(v).ok_or_else(|| format!("invalid boolean value {v:?}"))
}

/// Environment variable naming the config file (etcd reads it even though
/// every other `ETCD_*` variable is ignored when a file is given).
pub const CONFIG_FILE_ENV: &str = "ETCD_CONFIG_FILE";

/// The outcome of parsing the process arguments.
#[derive(Debug)]
pub struct Parsed {
    /// The configuration.
    pub config: Config,
    /// etcd flags (or config-file keys) accepted without effect, as given.
    pub ignored: Vec<String>,
    /// Config-file keys etcd does not know either (etcd drops them).
    pub unknown_keys: Vec<String>,
    /// etcd 3.6's deprecation warnings for the flags given.
    pub deprecations: Vec<&'static str>,
}

/// Why the arguments give no configuration.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A flag or value Go's flag package refuses: etcd prints it with its
    /// usage and exits with status 2.
    #[error(transparent)]
    Syntax(#[from] etcd_flags::FlagError),
    /// A flag or value the parser refuses (clap prints these itself).
    #[error(transparent)]
    Flags(#[from] clap::Error),
    /// The config file cannot be used.
    #[error(transparent)]
    File(#[from] ConfigFileError),
    /// The flags parse but do not make a configuration (etcd logs `failed
    /// to verify flags` and exits with status 1).
    #[error("{0}")]
    Invalid(String),
}

impl From<ScanError> for ArgsError {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Flag(f) => ArgsError::Syntax(f),
            other => ArgsError::Invalid(other.to_string()),
        }
    }
}

impl From<GateError> for ArgsError {
    fn from(e: GateError) -> Self {
        ArgsError::Invalid(e.to_string())
    }
}

/// The client port's gRPC server options: keepalive (etcd's
/// `--grpc-keepalive-*`; a zero interval or timeout disables pinging) and
/// `--max-concurrent-streams`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcServerOptions {
    /// Clients pinging more often than this are sent GOAWAY.
    pub min_time: Duration,
    /// `--max-concurrent-streams`: streams one client connection may have
    /// open at once (never 0: etcd's 0 means no limit, as grpc-go's).
    pub max_concurrent_streams: u32,
    /// Idle time after which the server pings the client.
    pub interval: Duration,
    /// How long the server waits for the ping's answer before closing.
    pub timeout: Duration,
}

/// Configuration problems found before start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A URL flag holds something that is not a usable URL.
    #[error("invalid URL {url:?} in --{flag}: {reason}")]
    BadUrl {
        /// The flag.
        flag: &'static str,
        /// The value.
        url: String,
        /// Why it is unusable.
        reason: String,
    },
    /// A flag's value is malformed, or `--initial-cluster` does not name
    /// this member.
    #[error("{0}")]
    Invalid(String),
}

/// Splits a comma-separated URL list.
pub fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Resolves listen URLs (`http://host:port`) to socket addresses.
/// A listen address and whether it serves TLS (`https://`).
pub type ListenAddr = (SocketAddr, bool);

/// Resolves listen URLs (`http://` or `https://host:port`) to addresses.
pub fn listen_addrs(flag: &'static str, list: &str) -> Result<Vec<ListenAddr>, ConfigError> {
    let mut out = Vec::new();
    for u in split_urls(list) {
        let bad = |reason: String| ConfigError::BadUrl {
            flag,
            url: u.clone(),
            reason,
        };
        let parsed = url::Url::parse(&u).map_err(|e| bad(e.to_string()))?;
        let tls = match parsed.scheme() {
            "http" => false,
            "https" => true,
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        let host = parsed.host_str().ok_or_else(|| bad("no host".into()))?;
        let port = parsed.port().ok_or_else(|| bad("no port".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map_err(|e| bad(e.to_string()))?;
        // "localhost" resolves to both 127.0.0.1 and ::1; etcd binds the first.
        let first = addrs
            .into_iter()
            .min_by_key(|a| !a.is_ipv4())
            .ok_or_else(|| bad("resolves to nothing".into()))?;
        if !out.iter().any(|(a, _)| *a == first) {
            out.push((first, tls));
        }
    }
    Ok(out)
}

impl Config {
    /// Client TLS files.
    pub fn client_tls(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
            trusted_ca: self.trusted_ca_file.clone(),
            client_cert_auth: self.client_cert_auth,
        }
    }

    /// Peer TLS files.
    pub fn peer_tls(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.peer_cert_file.clone(),
            key: self.peer_key_file.clone(),
            trusted_ca: self.peer_trusted_ca_file.clone(),
            client_cert_auth: self.peer_client_cert_auth,
        }
    }

    /// `--watch-progress-notify-interval` as a duration.
    pub fn progress_notify_interval(&self) -> Result<Duration, ConfigError> {
        let d = parse_go_duration(&self.watch_progress_notify_interval)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if d.is_zero() {
            return Err(ConfigError::Invalid(
                "--watch-progress-notify-interval must be > 0".into(),
            ));
        }
        Ok(d)
    }

    /// `--downgrade-check-time` as a duration (zero: no checks).
    pub fn downgrade_check_interval(&self) -> Result<Duration, ConfigError> {
        parse_go_duration(&self.downgrade_check_time)
            .map_err(|e| ConfigError::Invalid(format!("--downgrade-check-time: {e}")))
    }

    /// `--auto-compaction-mode` and `--auto-compaction-retention`, parsed
    /// as etcd parses them: a bare integer is hours (periodic) or
    /// revisions (revision), anything else a Go duration (in revision mode
    /// its nanoseconds count as revisions, as in etcd). None: disabled.
    pub fn auto_compaction(&self) -> Result<Option<AutoCompaction>, ConfigError> {
        let retention = self.auto_compaction_retention.trim();
        let periodic = match self.auto_compaction_mode.as_str() {
            "periodic" => true,
            "revision" => false,
            other => {
                return Err(ConfigError::Invalid(format!(
                    "unsupported compaction mode {other}"
                )))
            }
        };
        let amount = match retention.parse::<u64>() {
            Ok(n) if periodic => Duration::from_secs(n.saturating_mul(3600)),
            Ok(n) => Duration::from_nanos(n),
            Err(_) => parse_go_duration(retention).map_err(|e| {
                ConfigError::Invalid(format!("error parsing CompactionRetention: {e}"))
            })?,
        };
        if amount.is_zero() {
            return Ok(None);
        }
        Ok(Some(if periodic {
            AutoCompaction::Periodic(amount)
        } else {
            let revisions = i64::try_from(amount.as_nanos()).unwrap_or(i64::MAX);
            AutoCompaction::Revision(revisions)
        }))
    }

    /// Periods of the leader's corruption checks (`--corrupt-check-time`,
    /// and `--compact-hash-check-time` with the CompactHashCheck gate);
    /// zero periods are left out.
    pub fn corrupt_check_periods(&self) -> Result<Vec<Duration>, ConfigError> {
        let parse = |flag: &str, v: &str| {
            parse_go_duration(v).map_err(|e| ConfigError::Invalid(format!("--{flag}: {e}")))
        };
        let mut out = vec![parse("corrupt-check-time", &self.corrupt_check_time)?];
        if self.gates.compact_hash_check() {
            out.push(parse(
                "compact-hash-check-time",
                &self.compact_hash_check_time,
            )?);
        }
        out.retain(|d| !d.is_zero());
        Ok(out)
    }

    /// The logging flags.
    pub fn log_settings(&self) -> crate::logging::LogSettings {
        crate::logging::LogSettings {
            logger: self.logger.clone(),
            outputs: self.log_outputs.clone(),
            format: self.log_format.clone(),
            level: self.log_level.clone(),
        }
    }

    /// The `--grpc-keepalive-*` flags as durations, and the stream limit.
    pub fn grpc_server_options(&self) -> Result<GrpcServerOptions, ConfigError> {
        let parse = |flag: &str, v: &str| {
            parse_go_duration(v).map_err(|e| ConfigError::Invalid(format!("--{flag}: {e}")))
        };
        Ok(GrpcServerOptions {
            min_time: parse("grpc-keepalive-min-time", &self.grpc_keepalive_min_time)?,
            max_concurrent_streams: match self.max_concurrent_streams {
                0 => u32::MAX,
                n => n,
            },
            interval: parse("grpc-keepalive-interval", &self.grpc_keepalive_interval)?,
            timeout: parse("grpc-keepalive-timeout", &self.grpc_keepalive_timeout)?,
        })
    }

    /// The configuration `args` give (program name first), read as etcd
    /// 3.6 reads a command line, `ETCD_*` variables and a config file
    /// included: the embedding API's way in (`Member::start`).
    pub fn from_flags<I, S>(args: I) -> Result<Config, ArgsError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(Self::from_args(args.into_iter().map(Into::into).collect())?.config)
    }

    /// Parses the process arguments as etcd 3.6 does. With
    /// `--config-file` or `ETCD_CONFIG_FILE`, the flags are still checked
    /// but the configuration is the file's alone.
    pub fn from_args(args: Vec<String>) -> Result<Parsed, ArgsError> {
        let program = args.first().cloned().unwrap_or_else(|| "store".into());
        let rest = args.get(1..).unwrap_or_default();
        let mut scanned = etcd_flags::scan(rest)?;
        if scanned.help {
            // clap answers with the help text (`ArgsError::Flags`).
            Self::parse_with(vec![program.clone(), "--help".to_string()], false)?;
        }
        let flags_only = Self::parse_with(with_program(&program, &scanned.served), false)?;
        if flags_only.version {
            // etcd prints its version before it reads or checks anything
            // else.
            return Ok(Parsed {
                config: flags_only,
                ignored: Vec::new(),
                unknown_keys: Vec::new(),
                deprecations: Vec::new(),
            });
        }
        let file = flags_only
            .config_file
            .clone()
            .or_else(|| std::env::var_os(CONFIG_FILE_ENV).map(PathBuf::from));
        let Some(file) = file else {
            add_env_flags(&mut scanned)?;
            let config = Self::parse_with(with_program(&program, &scanned.served), true)?;
            return finish(config, &scanned, Vec::new(), Vec::new());
        };
        let from_file = config_file::load(&file)?;
        let mut file_args = vec![format!("--config-file={}", file.display())];
        file_args.extend(from_file.args);
        let scanned = etcd_flags::scan(&file_args)?;
        let config = Self::parse_with(with_program(&program, &scanned.served), false)?;
        finish(config, &scanned, from_file.ignored, from_file.unknown)
    }

    /// Parses `args`, reading `ETCD_*` variables only if `with_env`.
    fn parse_with(args: Vec<String>, with_env: bool) -> Result<Self, clap::Error> {
        let mut command = Self::command();
        if !with_env {
            command = command.mut_args(|a| a.env(None));
        }
        let matches = command.try_get_matches_from(args)?;
        Self::from_arg_matches(&matches)
    }

    /// 3.6's rules for the deprecated spellings, given what was set
    /// explicitly: gate flags into [`FeatureGates`], renamed flags into
    /// their new names; each with its conflict error.
    fn resolve_deprecated(&mut self, given: &Scan) -> Result<(), ArgsError> {
        let mut gates = FeatureGates::parse(&self.feature_gates)?;
        let mut from_flags = Vec::new();
        for (flag, gate) in etcd_flags::GATE_FLAGS {
            let Some(value) = self.gate_flag(flag) else {
                continue;
            };
            // etcd looks for the gate's name anywhere in the value.
            if self.feature_gates.contains(gate) {
                let now = gates.enabled(gate);
                return Err(ArgsError::Invalid(format!(
                    "cannot specify both flags: --{flag}={value} and --feature-gates={gate}={now} \
                     at the same time, please just use --feature-gates={gate}={now}"
                )));
            }
            from_flags.push((gate.to_string(), value));
        }
        gates.set_from(&from_flags)?;
        gates.validate()?;
        self.gates = gates;
        for (old, new) in etcd_flags::RENAMED_FLAGS {
            if given.was_given(old) && given.was_given(new) {
                return Err(ArgsError::Invalid(etcd_flags::rename_conflict(old, new)));
            }
        }
        let renamed = [
            (
                &self.experimental_watch_progress_notify_interval,
                &mut self.watch_progress_notify_interval,
            ),
            (
                &self.experimental_corrupt_check_time,
                &mut self.corrupt_check_time,
            ),
            (
                &self.experimental_compact_hash_check_time,
                &mut self.compact_hash_check_time,
            ),
            (
                &self.experimental_downgrade_check_time,
                &mut self.downgrade_check_time,
            ),
        ];
        for (old, new) in renamed {
            if let Some(v) = old {
                new.clone_from(v);
            }
        }
        Ok(())
    }

    /// The value of a deprecated gate flag, if given.
    fn gate_flag(&self, flag: &str) -> Option<bool> {
        match flag {
            "experimental-initial-corrupt-check" => self.experimental_initial_corrupt_check,
            "experimental-compact-hash-check-enabled" => {
                self.experimental_compact_hash_check_enabled
            }
            "experimental-enable-lease-checkpoint" => self.experimental_enable_lease_checkpoint,
            "experimental-enable-lease-checkpoint-persist" => {
                self.experimental_enable_lease_checkpoint_persist
            }
            "experimental-txn-mode-write-with-shared-buffer" => {
                self.experimental_txn_mode_write_with_shared_buffer
            }
            "experimental-stop-grpc-service-on-defrag" => {
                self.experimental_stop_grpc_service_on_defrag
            }
            other => unreachable!("{other} is not a gate flag"),
        }
    }

    /// etcd's checks of values it takes but the store does not act on,
    /// and of the durations that must be positive.
    fn validate(&self, given: &Scan) -> Result<(), ArgsError> {
        let unary = [
            "experimental-warning-unary-request-duration",
            "warning-unary-request-duration",
        ];
        let nonzero = |name: &str| {
            given
                .accepted
                .iter()
                .any(|(n, v)| *n == name && parse_go_duration(v).is_ok_and(|d| !d.is_zero()))
        };
        if unary.iter().all(|n| nonzero(n)) {
            return Err(ArgsError::Invalid(
                "both --experimental-warning-unary-request-duration and \
                 --warning-unary-request-duration flags are set. Use only \
                 --warning-unary-request-duration"
                    .into(),
            ));
        }
        if given
            .accepted
            .iter()
            .any(|(n, v)| *n == "discovery-fallback" && v == "proxy")
        {
            return Err(ArgsError::Invalid(
                "v2 proxy is deprecated, and --discovery-fallback can't be configured as \"proxy\""
                    .into(),
            ));
        }
        let hash_time = parse_go_duration(&self.compact_hash_check_time)
            .map_err(|e| ArgsError::Invalid(format!("--compact-hash-check-time: {e}")))?;
        if hash_time.is_zero() {
            return Err(ArgsError::Invalid(format!(
                "--compact-hash-check-time must be >0 (set to {})",
                self.compact_hash_check_time
            )));
        }
        if self.auto_tls || self.peer_auto_tls {
            return Err(ArgsError::Invalid(
                "--auto-tls and --peer-auto-tls are not supported: automatic self-signed \
                 certificates are not generated; give --cert-file and --key-file"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", self.name)))
    }

    /// The effective backend quota in bytes.
    pub fn quota_bytes(&self) -> u64 {
        if self.quota_backend_bytes == 0 {
            DEFAULT_QUOTA_BACKEND_BYTES
        } else {
            self.quota_backend_bytes
        }
    }

    /// This member's advertised peer URLs.
    pub fn peer_urls(&self) -> Vec<String> {
        split_urls(&self.initial_advertise_peer_urls)
    }

    /// This member's id (etcd's derivation from its peer URLs and token).
    pub fn member_id(&self) -> NodeId {
        member_id(&self.peer_urls(), &self.initial_cluster_token)
    }

    /// The members named by `--initial-cluster`, by id.
    pub fn initial_members(&self) -> Result<Vec<(NodeId, MemberInfo)>, ConfigError> {
        let spec = self
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{}={}", self.name, self.initial_advertise_peer_urls));
        let mut by_name: Vec<(String, Vec<String>)> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, url) = part.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!("invalid value {part:?} in --initial-cluster"))
            })?;
            url::Url::parse(url).map_err(|e| ConfigError::BadUrl {
                flag: "initial-cluster",
                url: url.to_string(),
                reason: e.to_string(),
            })?;
            match by_name.iter_mut().find(|(n, _)| n == name) {
                Some((_, urls)) => urls.push(url.to_string()),
                None => by_name.push((name.to_string(), vec![url.to_string()])),
            }
        }
        let mut members = Vec::new();
        for (name, peer_urls) in by_name {
            let id = member_id(&peer_urls, &self.initial_cluster_token);
            let client_urls = if name == self.name {
                split_urls(&self.advertise_client_urls)
            } else {
                Vec::new()
            };
            members.push((
                id,
                MemberInfo {
                    name,
                    peer_urls,
                    client_urls,
                },
            ));
        }
        let me = members
            .iter()
            .find(|(_, m)| m.name == self.name)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "couldn't find local name {:?} in the initial cluster configuration",
                    self.name
                ))
            })?;
        let mut mine = me.1.peer_urls.clone();
        let mut advertised = self.peer_urls();
        mine.sort();
        advertised.sort();
        if mine != advertised {
            return Err(ConfigError::Invalid(format!(
                "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={}",
                self.name,
                mine.join(","),
                advertised.join(",")
            )));
        }
        Ok(members)
    }
}

/// `args` behind the program name.
fn with_program(program: &str, args: &[String]) -> Vec<String> {
    std::iter::once(program.to_string())
        .chain(args.iter().cloned())
        .collect()
}

/// etcd's `SetFlagsFromEnv`: `ETCD_<FLAG>` for each flag not on the
/// command line. Served flags read theirs through clap; here the accepted
/// ones are checked and recorded, and every one is marked as given.
fn add_env_flags(scanned: &mut Scan) -> Result<(), ArgsError> {
    for flag in etcd_flags::FLAGS {
        // ETCD_CONFIG_FILE is read on its own; etcd refuses to take
        // ETCD_VERSION as `--version` (container images set it).
        let special = ["config-file", "version"].contains(&flag.name);
        if scanned.was_given(flag.name) || special {
            continue;
        }
        let Ok(value) = std::env::var(etcd_flags::env_name(flag.name)) else {
            continue;
        };
        match flag.handling {
            Handling::Served => {
                etcd_flags::check_value(flag, &value)?;
                scanned.given.push(flag.name);
            }
            Handling::Accepted(_) => scanned.record(flag, Some(value))?,
        }
    }
    Ok(())
}

/// The configuration after 3.6's rules and checks, with what to warn about.
fn finish(
    mut config: Config,
    given: &Scan,
    mut ignored: Vec<String>,
    unknown_keys: Vec<String>,
) -> Result<Parsed, ArgsError> {
    config.resolve_deprecated(given)?;
    config.validate(given)?;
    let mut accepted: Vec<String> = given
        .accepted
        .iter()
        .map(|(name, value)| format!("--{name}={value}"))
        .collect();
    accepted.append(&mut ignored);
    let deprecations = etcd_flags::DEPRECATION_WARNINGS
        .iter()
        .filter(|(flag, _)| given.was_given(flag))
        .map(|(_, message)| *message)
        .collect();
    Ok(Parsed {
        config,
        ignored: accepted,
        unknown_keys,
        deprecations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        let mut v = vec!["store".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Config::from_args(v).expect("parses").config
    }

    #[test]
    fn defaults_are_etcds() {
        let c = parse(&[]);
        assert_eq!(c.name, "default");
        assert_eq!(c.data_dir(), PathBuf::from("default.etcd"));
        assert_eq!(c.listen_client_urls, "http://localhost:2379");
        assert_eq!(c.max_request_bytes, 1_572_864);
        // etcd 3.6's default; 3.5's was 100,000.
        assert_eq!(c.snapshot_count, 10_000);
        assert_eq!(c.initial_members().unwrap().len(), 1);
    }

    fn try_parse(args: &[&str]) -> Result<Parsed, ArgsError> {
        let mut v = vec!["store".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Config::from_args(v)
    }

    fn error_of(args: &[&str]) -> String {
        try_parse(args).expect_err("refused").to_string()
    }

    #[test]
    fn tuning_flags_are_ignored_and_single_dash_works() {
        let args = ["--max-wals", "5", "-name", "n1", "--unsafe-no-fsync"];
        let parsed = try_parse(&args).unwrap();
        assert_eq!(parsed.config.name, "n1");
        assert_eq!(parsed.ignored, ["--max-wals=5", "--unsafe-no-fsync=true"]);
    }

    /// Every flag of `etcd --help` (v3.6.14), given its default value,
    /// parses, and every flag of the store's table is in etcd's help or
    /// one of the few it leaves out.
    #[test]
    fn every_flag_of_etcd_36_help_is_taken() {
        let fixture = include_str!("../testdata/etcd-3.6.14-flags.txt");
        let command = Config::command();
        let mut help = Vec::new();
        for line in fixture.lines().filter(|l| !l.starts_with('#')) {
            let (name, default) = line.split_once(' ').expect("name default");
            help.push(name);
            let flag = etcd_flags::find(name)
                .unwrap_or_else(|| panic!("--{name} of etcd 3.6 is missing from the table"));
            let value = match (default, flag.kind) {
                ("-", _) => continue,
                ("''", etcd_flags::Kind::Duration) => "0s",
                ("''", etcd_flags::Kind::Bool) => "false",
                ("''", _) => "",
                (d, _) => d,
            };
            // A served flag's own default is etcd 3.6's.
            let ours = command
                .get_arguments()
                .find(|a| a.get_long() == Some(name))
                .and_then(|a| a.get_default_values().first().cloned());
            if let Some(ours) = ours {
                assert_eq!(ours.to_str(), Some(value), "default of --{name}");
            }
            let arg = format!("--{name}={value}");
            let parsed = try_parse(&[&arg]).unwrap_or_else(|e| panic!("{arg}: {e}"));
            match flag.handling {
                Handling::Served => assert!(parsed.ignored.is_empty(), "{arg}"),
                Handling::Accepted(_) => assert_eq!(parsed.ignored, std::slice::from_ref(&arg)),
            }
        }
        let left_out = ["config-file", "version"];
        for flag in etcd_flags::FLAGS {
            let etcd_ignores = flag.handling == Handling::Accepted(etcd_flags::ETCD_IGNORES);
            assert!(
                help.contains(&flag.name) || left_out.contains(&flag.name) || etcd_ignores,
                "--{} is not a flag of etcd 3.6",
                flag.name
            );
        }
        let clap_args: Vec<String> = Config::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        for flag in etcd_flags::FLAGS {
            let served = flag.handling == Handling::Served;
            assert_eq!(
                served,
                clap_args.iter().any(|a| a == flag.name),
                "--{}: served flags, and only they, are Config's fields",
                flag.name
            );
        }
    }

    #[test]
    fn every_feature_gate_of_etcd_36_is_taken() {
        for gate in crate::features::GATES {
            let arg = match gate.name {
                "LeaseCheckpointPersist" => {
                    "--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true".to_string()
                }
                name => format!("--feature-gates={name}=true"),
            };
            let c = try_parse(&[&arg])
                .unwrap_or_else(|e| panic!("{arg}: {e}"))
                .config;
            assert!(c.gates.enabled(gate.name), "{arg}");
        }
    }

    #[test]
    fn kubeadm_136_and_135_spellings_configure_the_same() {
        let new = parse(&[
            "--feature-gates=InitialCorruptCheck=true",
            "--watch-progress-notify-interval=5s",
        ]);
        let parsed = try_parse(&[
            "--experimental-initial-corrupt-check=true",
            "--experimental-watch-progress-notify-interval=5s",
        ])
        .unwrap();
        let old = &parsed.config;
        for c in [&new, old] {
            assert!(c.gates.initial_corrupt_check());
            assert_eq!(
                c.progress_notify_interval().unwrap(),
                Duration::from_secs(5)
            );
        }
        assert_eq!(
            parsed.deprecations,
            [
                "--experimental-watch-progress-notify-interval is deprecated in v3.6 and will be \
              decommissioned in v3.7. Use '--watch-progress-notify-interval' instead."
            ]
        );
        assert!(!parse(&[]).gates.initial_corrupt_check());
    }

    #[test]
    fn deprecated_and_new_spellings_conflict_as_in_etcd_36() {
        assert_eq!(
            error_of(&[
                "--experimental-initial-corrupt-check=true",
                "--feature-gates=InitialCorruptCheck=false",
            ]),
            "cannot specify both flags: --experimental-initial-corrupt-check=true and \
             --feature-gates=InitialCorruptCheck=false at the same time, please just use \
             --feature-gates=InitialCorruptCheck=false"
        );
        assert_eq!(
            error_of(&[
                "--experimental-corrupt-check-time=1m",
                "--corrupt-check-time=2m"
            ]),
            "cannot set --experimental-corrupt-check-time and --corrupt-check-time at the same \
             time, please use --corrupt-check-time only"
        );
        assert_eq!(
            error_of(&["--experimental-memory-mlock", "--memory-mlock"]),
            "cannot set --experimental-memory-mlock and --memory-mlock at the same time, please \
             use --memory-mlock only"
        );
        let c = parse(&[
            "--experimental-compact-hash-check-enabled",
            "--compact-hash-check-time=2m",
        ]);
        assert_eq!(
            c.corrupt_check_periods().unwrap(),
            [Duration::from_secs(120)]
        );
        assert_eq!(
            error_of(&["--compact-hash-check-time=0s"]),
            "--compact-hash-check-time must be >0 (set to 0s)"
        );
        assert_eq!(
            error_of(&["--feature-gates=LeaseCheckpointPersist=true"]),
            "enabling feature gate LeaseCheckpointPersist requires enabling feature gate \
             LeaseCheckpoint"
        );
    }

    #[test]
    fn what_etcd_36_removed_is_refused_as_it_refuses_it() {
        for (arg, flag) in [
            ("--enable-v2=false", "enable-v2"),
            ("--experimental-enable-v2v3=/v2", "experimental-enable-v2v3"),
            ("--proxy=off", "proxy"),
            ("--proxy-dial-timeout=1000", "proxy-dial-timeout"),
            (
                "--experimental-wait-cluster-ready-timeout=5s",
                "experimental-wait-cluster-ready-timeout",
            ),
            ("--debug", "debug"),
        ] {
            assert_eq!(
                error_of(&[arg]),
                format!("flag provided but not defined: -{flag}")
            );
        }
        assert_eq!(
            error_of(&["--v2-deprecation=not-yet"]),
            "invalid value \"not-yet\" for flag -v2-deprecation: invalid value \"not-yet\""
        );
        assert_eq!(
            error_of(&["--discovery-fallback=proxy"]),
            "v2 proxy is deprecated, and --discovery-fallback can't be configured as \"proxy\""
        );
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value_as_in_go() {
        assert_eq!(parse(&["--name=a", "--name", "b"]).name, "b");
    }

    #[test]
    fn pre_vote_defaults_on_and_can_be_turned_off() {
        assert!(parse(&[]).pre_vote);
        assert!(parse(&["--pre-vote"]).pre_vote);
        assert!(!parse(&["--pre-vote=false"]).pre_vote);
    }

    #[test]
    fn unknown_flags_are_errors() {
        let args = ["store", "--no-such-flag=1"];
        assert!(Config::from_args(args.iter().map(|s| s.to_string()).collect()).is_err());
    }

    #[test]
    fn initial_cluster_must_name_this_member() {
        let c = parse(&[
            "--name",
            "a",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-cluster",
            "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380",
        ]);
        let members = c.initial_members().unwrap();
        assert_eq!(members.len(), 2);
        assert!(members.iter().any(|(id, _)| *id == c.member_id()));
        let c = parse(&[
            "--name",
            "z",
            "--initial-cluster",
            "a=http://127.0.0.1:2380",
        ]);
        assert!(c.initial_members().is_err());
    }
}

//! Member configuration with etcd's flag names, defaults and `ETCD_*`
//! environment variables, so the binary drops into an etcd static-pod
//! manifest unchanged.
//!
//! etcd flags that only tune etcd internals (WAL, bbolt, Go runtime, v2
//! API...) are accepted and ignored with a warning ([`IGNORED_ETCD_FLAGS`]);
//! a flag etcd itself does not know is an error, as in etcd.
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
use crate::identity::member_id;
use crate::limits::{
    DEFAULT_ELECTION_TIMEOUT_MS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TXN_OPS, DEFAULT_QUOTA_BACKEND_BYTES, DEFAULT_SNAPSHOT_COUNT,
};
use crate::raft::types::{MemberInfo, NodeId};
use crate::server::auto_compaction::AutoCompaction;

/// A member's configuration (etcd's flags).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "store",
    version,
    about = "A Raft-replicated key-value store that speaks the etcd v3 API"
)]
pub struct Config {
    /// Path to the server configuration file (YAML, etcd's keys). Other
    /// command line flags and environment variables are then ignored.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
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
        env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m"
    )]
    pub experimental_watch_progress_notify_interval: String,
    /// Discovery URL used to bootstrap the cluster. Not supported: a fresh
    /// member given it refuses to start (see `Member::start`).
    #[arg(long, env = "ETCD_DISCOVERY")]
    pub discovery: Option<String>,
    /// DNS SRV domain used to bootstrap the cluster. Not supported, as
    /// `--discovery`.
    #[arg(long, env = "ETCD_DISCOVERY_SRV")]
    pub discovery_srv: Option<String>,
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
    /// Enable to check data corruption before serving any client/peer traffic.
    #[arg(long, env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub experimental_initial_corrupt_check: bool,
    /// Duration of time between cluster corruption check passes.
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "0s"
    )]
    pub experimental_corrupt_check_time: String,
    /// Enable leader to periodically check followers compaction hashes.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub experimental_compact_hash_check_enabled: bool,
    /// Duration of time between leader checks followers compaction hashes.
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_TIME",
        default_value = "1m"
    )]
    pub experimental_compact_hash_check_time: String,
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

/// etcd 3.5 flags that tune etcd internals: accepted, ignored, warned about.
/// Each may be given as `--flag value` or `--flag=value` (booleans alone).
pub const IGNORED_ETCD_FLAGS: &[&str] = &[
    "backend-batch-interval",
    "backend-batch-limit",
    "backend-bbolt-freelist-type",
    "cipher-suites",
    "cors",
    "discovery-fallback",
    "discovery-proxy",
    "discovery-srv-name",
    "enable-grpc-gateway",
    "enable-log-rotation",
    "enable-pprof",
    "enable-v2",
    "experimental-compaction-batch-limit",
    "experimental-compaction-sleep-interval",
    "experimental-downgrade-check-time",
    "experimental-enable-distributed-tracing",
    "experimental-enable-lease-checkpoint",
    "experimental-enable-lease-checkpoint-persist",
    "experimental-enable-v2v3",
    "experimental-memory-mlock",
    "experimental-peer-skip-client-san-verification",
    "experimental-txn-mode-write-with-shared-buffer",
    "experimental-wait-cluster-ready-timeout",
    "experimental-warning-apply-duration",
    "host-whitelist",
    "initial-election-tick-advance",
    "log-rotation-config-json",
    "max-snapshots",
    "max-wals",
    "metrics",
    "proxy",
    "proxy-dial-timeout",
    "proxy-failure-wait",
    "proxy-read-timeout",
    "proxy-refresh-interval",
    "proxy-write-timeout",
    "socket-reuse-address",
    "socket-reuse-port",
    "strict-reconfig-check",
    "unsafe-no-fsync",
    "v2-deprecation",
    "wal-dir",
    "debug",
];

/// Splits etcd's ignored tuning flags out of `args`; returns the remaining
/// arguments and the ignored flags (for warnings).
pub fn strip_ignored_flags(args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut ignored = Vec::new();
    let mut iter = args.into_iter().peekable();
    if let Some(program) = iter.next() {
        kept.push(program);
    }
    while let Some(arg) = iter.next() {
        let name = arg.trim_start_matches('-');
        let (flag, has_value) = match name.split_once('=') {
            Some((f, _)) => (f, true),
            None => (name, false),
        };
        if arg.starts_with('-') && IGNORED_ETCD_FLAGS.contains(&flag) {
            ignored.push(arg.clone());
            let next_is_value = iter.peek().is_some_and(|n| !n.starts_with('-'));
            if !has_value && next_is_value {
                ignored.push(iter.next().expect("peeked"));
            }
            continue;
        }
        // Go's flag package accepts a single dash; clap wants two.
        if arg.starts_with('-') && !arg.starts_with("--") && arg.len() > 2 {
            kept.push(format!("-{arg}"));
        } else {
            kept.push(arg);
        }
    }
    (kept, ignored)
}

/// Environment variable naming the config file (etcd reads it even though
/// every other `ETCD_*` variable is ignored when a file is given).
pub const CONFIG_FILE_ENV: &str = "ETCD_CONFIG_FILE";

/// The outcome of parsing the process arguments.
#[derive(Debug)]
pub struct Parsed {
    /// The configuration.
    pub config: Config,
    /// etcd flags (or config-file keys) accepted and ignored.
    pub ignored: Vec<String>,
    /// Config-file keys etcd does not know either (etcd drops them).
    pub unknown_keys: Vec<String>,
}

/// Why the arguments give no configuration.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A flag or value the parser refuses (clap prints these itself).
    #[error(transparent)]
    Flags(#[from] clap::Error),
    /// The config file cannot be used.
    #[error(transparent)]
    File(#[from] ConfigFileError),
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

    /// `--experimental-watch-progress-notify-interval` as a duration.
    pub fn progress_notify_interval(&self) -> Result<Duration, ConfigError> {
        let d = parse_go_duration(&self.experimental_watch_progress_notify_interval)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if d.is_zero() {
            return Err(ConfigError::Invalid(
                "--experimental-watch-progress-notify-interval must be > 0".into(),
            ));
        }
        Ok(d)
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

    /// Periods of the leader's corruption checks
    /// (`--experimental-corrupt-check-time`, and
    /// `--experimental-compact-hash-check-time` if enabled); zero periods
    /// are left out.
    pub fn corrupt_check_periods(&self) -> Result<Vec<Duration>, ConfigError> {
        let parse = |flag: &str, v: &str| {
            parse_go_duration(v).map_err(|e| ConfigError::Invalid(format!("--{flag}: {e}")))
        };
        let mut out = vec![parse(
            "experimental-corrupt-check-time",
            &self.experimental_corrupt_check_time,
        )?];
        if self.experimental_compact_hash_check_enabled {
            out.push(parse(
                "experimental-compact-hash-check-time",
                &self.experimental_compact_hash_check_time,
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

    /// Parses the process arguments (after dropping ignored etcd flags).
    /// With `--config-file` or `ETCD_CONFIG_FILE`, the flags are still
    /// checked but the configuration is the file's alone.
    pub fn from_args(args: Vec<String>) -> Result<Parsed, ArgsError> {
        let program = args.first().cloned().unwrap_or_else(|| "store".into());
        let (kept, mut ignored) = strip_ignored_flags(args);
        let flags_only = Self::parse_with(kept.clone(), false)?;
        let file = flags_only
            .config_file
            .clone()
            .or_else(|| std::env::var_os(CONFIG_FILE_ENV).map(PathBuf::from));
        let Some(file) = file else {
            let config = Self::parse_with(kept, true)?;
            return Ok(Parsed {
                config,
                ignored,
                unknown_keys: Vec::new(),
            });
        };
        let from_file = config_file::load(&file)?;
        let mut file_args = vec![program, format!("--config-file={}", file.display())];
        file_args.extend(from_file.args);
        let (kept, ignored_keys) = strip_ignored_flags(file_args);
        ignored.extend(ignored_keys);
        ignored.extend(from_file.ignored);
        Ok(Parsed {
            config: Self::parse_with(kept, false)?,
            ignored,
            unknown_keys: from_file.unknown,
        })
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
        assert_eq!(c.initial_members().unwrap().len(), 1);
    }

    #[test]
    fn tuning_flags_are_ignored_and_single_dash_works() {
        let args = [
            "store",
            "--enable-v2=false",
            "--max-wals",
            "5",
            "-name",
            "n1",
            "--experimental-enable-lease-checkpoint=true",
        ];
        let parsed = Config::from_args(args.iter().map(|s| s.to_string()).collect()).unwrap();
        assert_eq!(parsed.config.name, "n1");
        assert_eq!(parsed.ignored.len(), 4);
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

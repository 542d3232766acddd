//! Member configuration with etcd's flag names, defaults and `ETCD_*`
//! environment variables, so the binary drops into an etcd static-pod
//! manifest unchanged.
//!
//! etcd flags that only tune etcd internals (WAL, bbolt, Go runtime, v2
//! API...) are accepted and ignored with a warning ([`IGNORED_ETCD_FLAGS`]);
//! a flag etcd itself does not know is an error, as in etcd.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::duration::parse_go_duration;
use crate::identity::member_id;
use crate::limits::{
    DEFAULT_ELECTION_TIMEOUT_MS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TXN_OPS, DEFAULT_QUOTA_BACKEND_BYTES, DEFAULT_SNAPSHOT_COUNT,
};
use crate::raft::types::{MemberInfo, NodeId};

/// A member's configuration (etcd's flags).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "store",
    version,
    about = "A Raft-replicated key-value store that speaks the etcd v3 API"
)]
pub struct Config {
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
    /// Configures log level. Only supports debug, info, warn, error, panic, or fatal.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info",
          value_parser = ["debug", "info", "warn", "error", "panic", "fatal"])]
    pub log_level: String,
}

/// etcd 3.5 flags that tune etcd internals: accepted, ignored, warned about.
/// Each may be given as `--flag value` or `--flag=value` (booleans alone).
pub const IGNORED_ETCD_FLAGS: &[&str] = &[
    "auto-compaction-mode",
    "auto-compaction-retention",
    "backend-batch-interval",
    "backend-batch-limit",
    "backend-bbolt-freelist-type",
    "cipher-suites",
    "cors",
    "discovery",
    "discovery-fallback",
    "discovery-proxy",
    "discovery-srv",
    "discovery-srv-name",
    "enable-grpc-gateway",
    "enable-log-rotation",
    "enable-pprof",
    "enable-v2",
    "experimental-compact-hash-check-enabled",
    "experimental-compact-hash-check-time",
    "experimental-compaction-batch-limit",
    "experimental-compaction-sleep-interval",
    "experimental-corrupt-check-time",
    "experimental-downgrade-check-time",
    "experimental-enable-distributed-tracing",
    "experimental-enable-lease-checkpoint",
    "experimental-enable-lease-checkpoint-persist",
    "experimental-enable-v2v3",
    "experimental-initial-corrupt-check",
    "experimental-memory-mlock",
    "experimental-peer-skip-client-san-verification",
    "experimental-txn-mode-write-with-shared-buffer",
    "experimental-wait-cluster-ready-timeout",
    "experimental-warning-apply-duration",
    "force-new-cluster",
    "grpc-keepalive-interval",
    "grpc-keepalive-min-time",
    "grpc-keepalive-timeout",
    "host-whitelist",
    "initial-election-tick-advance",
    "listen-metrics-urls",
    "log-outputs",
    "log-rotation-config-json",
    "logger",
    "max-concurrent-streams",
    "max-snapshots",
    "max-wals",
    "metrics",
    "pre-vote",
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

    /// Parses the process arguments (after dropping ignored etcd flags).
    pub fn from_args(args: Vec<String>) -> Result<(Self, Vec<String>), clap::Error> {
        let (kept, ignored) = strip_ignored_flags(args);
        Ok((Config::try_parse_from(kept)?, ignored))
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
        Config::from_args(v).expect("parses").0
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
            "--logger",
            "zap",
            "-name",
            "n1",
            "--experimental-initial-corrupt-check=true",
        ];
        let (c, ignored) = Config::from_args(args.iter().map(|s| s.to_string()).collect()).unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(ignored.len(), 4);
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

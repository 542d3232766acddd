//! etcd 3.6's command line, one row per flag: what kind of value it takes
//! and what it does in this store.
//!
//! The store takes exactly the flags of etcd 3.6.14 (`etcd --help`, its
//! `embed.Config.AddFlags` and `etcdmain.newConfig`), so a static pod,
//! systemd unit or config file written for etcd 3.6 starts it unchanged,
//! and so does one written for etcd 3.5 (3.6 still accepts 3.5's
//! `--experimental-*` spellings, with a deprecation warning). What 3.6
//! removed (the v2 API and v2 proxy flags: `--enable-v2`, `--proxy*`,
//! `--experimental-enable-v2v3`, ...) is refused as 3.6 refuses it: `flag
//! provided but not defined`.
//!
//! A flag is either [`Handling::Served`] (a field of
//! [`crate::config::Config`] the store acts on) or
//! [`Handling::Accepted`]: it tunes something etcd has and the store does
//! not (the WAL, bbolt, Go's runtime, ...), so its value is checked as
//! etcd checks it and then set aside with the reason given here, which
//! `docs/compatibility.md` repeats. Worked example, kubeadm 1.37's
//! command line:
//!
//! ```text
//! --feature-gates=InitialCorruptCheck=true   served: a gate (FeatureGates)
//! --watch-progress-notify-interval=5s        served
//! --snapshot-count=10000                     served
//! ```
//!
//! and etcd 3.5's spelling of the same, `--experimental-initial-corrupt-check=true
//! --experimental-watch-progress-notify-interval=5s`, ends in the same
//! configuration, with 3.6's deprecation warning for the second flag.
//!
//! The conflict rules are 3.6's: an `--experimental-*` flag that became a
//! feature gate may not be given together with `--feature-gates` naming
//! that gate ([`GATE_FLAGS`]); one that was renamed may not be given
//! together with its new name ([`RENAMED_FLAGS`]); given alone, the old
//! spelling sets the new one.

use crate::duration::parse_go_duration;

use crate::version::SERVER_VERSION as ETCD_VERSION;

/// What Go's flag package prints after a flag error (etcd's `Usage`).
pub const USAGE: &str = "Usage:

  store [flags]
    Start a store member (an etcd 3.6 member to its clients and peers).

  store --version
    Show the version of etcd this member presents.

  store -h | --help
    Show the help information.

  store --config-file
    Path to the server configuration file. Note that if a configuration file is provided, \
other command line flags and environment variables will be ignored.
";

/// `store --version`, in etcd's format (what scripts parse: `etcd
/// Version: X`). The Git SHA comes from `STORE_GIT_SHA` at build time; the
/// Go lines name the build's Rust target instead, under etcd's labels.
pub fn version_text() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        "etcd Version: {ETCD_VERSION}\nGit SHA: {}\nGo Version: none (store {}, Rust)\n\
         Go OS/Arch: {}/{arch}\n",
        option_env!("STORE_GIT_SHA").unwrap_or("Not provided (set STORE_GIT_SHA when building)"),
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
    )
}

/// Go's type for a flag's value: how the value is taken from the command
/// line and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `bool`: `--flag` alone means true; a value only as `--flag=value`.
    Bool,
    /// `string`, `[]string`, URL lists: any text.
    Str,
    /// `int` / `int64`.
    Int,
    /// `uint` / `uint32` / `uint64`.
    Uint,
    /// `time.Duration` in Go's syntax (`5s`, `1m30s`).
    Duration,
}

/// What the store does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Acted on: a field of [`crate::config::Config`].
    Served,
    /// Checked as etcd checks it, then without effect, for the reason given.
    Accepted(&'static str),
}

/// One flag of etcd 3.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdFlag {
    /// The name, without dashes.
    pub name: &'static str,
    /// Its value's type.
    pub kind: Kind,
    /// What the store does with it.
    pub handling: Handling,
}

/// etcd's WAL, bbolt and snapshot-file tuning.
const STORAGE: &str = "etcd's WAL, bbolt and snapshot files; the store keeps its Raft log in \
     `member/log` and its data in RocksDB (`member/db`), syncs every acknowledged write and \
     compacts in bounded background batches";
/// etcd/raft and rafthttp tuning.
const RAFT: &str = "etcd/raft and rafthttp options; openraft's leader lease guards elections, \
     membership changes are always checked, and peers talk gRPC over one HTTP/2 connection";
/// The v3 discovery service's client options.
const DISCOVERY: &str = "options of discovery bootstrapping, which the store does not do \
     (`--discovery`, `--discovery-srv` and `--discovery-endpoints` are refused on a fresh member)";
/// TLS options rustls decides itself.
const TLS: &str = "rustls decides cipher suites and versions (TLS 1.2 and 1.3), and checks client \
     certificates against the CA only: no SAN, CN or CRL checks, no self-signed certificates";
/// Go profiling, tracing and metric levels.
const OBSERVABILITY: &str =
    "Go profiling, the `extensive` gRPC histograms and OpenTelemetry tracing";
/// Logging options beyond level, format and outputs.
const LOGGING: &str = "log files are appended to; rotate them with logrotate (`copytruncate`); \
     no slow-request warnings";
/// Listener socket options.
const SOCKETS: &str = "listeners are bound once, without `SO_REUSEPORT`/`SO_REUSEADDR`";
/// HTTP filtering of etcd's gateway.
const HTTP_FILTER: &str = "origin and host filtering of etcd's HTTP handlers; not applied";
/// The JSON gateway.
const GATEWAY: &str = "the JSON gateway is always served on the client URLs (etcd's default)";
/// The v2 store's deprecation phase.
const V2: &str = "the v2 store, which the store never had; checked as 3.6 checks it";
/// Flags etcd itself ignores (pub: the help-text test tells them apart).
pub const ETCD_IGNORES: &str = "flags of etcd 2 that etcd 3.6 itself accepts and ignores";
/// Memory locking.
const MLOCK: &str = "the store does not lock its pages in RAM";
/// Bootstrap defragmentation.
const BOOTSTRAP_DEFRAG: &str =
    "RocksDB reclaims space by compaction as it goes; there is no bbolt file to defragment at start";
/// Listener split for HTTP-only clients.
const HTTP_ONLY_URLS: &str = "HTTP (JSON gateway, health, metrics) is served on every client URL; \
     a separate HTTP-only listener is not offered";
/// Learner catch-up.
const CATCHUP: &str =
    "a lagging follower catches up from the log while it has the entries, else by snapshot";
/// Compaction pacing.
const COMPACTION: &str = "the store paces compaction itself, in bounded batches in the background";
/// Slow-apply warnings.
const APPLY_WARNING: &str = "no slow-apply warning is logged";
/// Strict reconfiguration.
const RECONFIG: &str = "membership changes that would lose quorum are always refused";

const fn served(name: &'static str, kind: Kind) -> EtcdFlag {
    EtcdFlag {
        name,
        kind,
        handling: Handling::Served,
    }
}

const fn accepted(name: &'static str, kind: Kind, why: &'static str) -> EtcdFlag {
    EtcdFlag {
        name,
        kind,
        handling: Handling::Accepted(why),
    }
}

use Kind::{Bool, Duration, Int, Str, Uint};

/// Every flag of etcd 3.6.14, in `etcd --help`'s order, then the ones its
/// help text leaves out (`--config-file`, `--version`, the v3.5 spelling
/// `--experimental-warning-unary-request-duration`, and etcd 2's flags it
/// ignores).
pub const FLAGS: &[EtcdFlag] = &[
    // Member.
    served("name", Str),
    served("data-dir", Str),
    accepted("wal-dir", Str, STORAGE),
    served("snapshot-count", Uint),
    served("heartbeat-interval", Uint),
    served("election-timeout", Uint),
    accepted("initial-election-tick-advance", Bool, RAFT),
    served("listen-peer-urls", Str),
    served("listen-client-urls", Str),
    accepted("listen-client-http-urls", Str, HTTP_ONLY_URLS),
    accepted("max-snapshots", Uint, STORAGE),
    accepted("max-wals", Uint, STORAGE),
    accepted("memory-mlock", Bool, MLOCK),
    served("quota-backend-bytes", Int),
    accepted("backend-bbolt-freelist-type", Str, STORAGE),
    accepted("backend-batch-interval", Duration, STORAGE),
    accepted("backend-batch-limit", Int, STORAGE),
    served("max-txn-ops", Uint),
    served("max-request-bytes", Uint),
    served("max-concurrent-streams", Uint),
    served("grpc-keepalive-min-time", Duration),
    served("grpc-keepalive-interval", Duration),
    served("grpc-keepalive-timeout", Duration),
    accepted("socket-reuse-port", Bool, SOCKETS),
    accepted("socket-reuse-address", Bool, SOCKETS),
    accepted("enable-grpc-gateway", Bool, GATEWAY),
    accepted("raft-read-timeout", Duration, RAFT),
    accepted("raft-write-timeout", Duration, RAFT),
    served("feature-gates", Str),
    // Clustering.
    served("initial-advertise-peer-urls", Str),
    served("initial-cluster", Str),
    served("initial-cluster-state", Str),
    served("initial-cluster-token", Str),
    served("advertise-client-urls", Str),
    served("discovery", Str),
    served("discovery-token", Str),
    served("discovery-endpoints", Str),
    accepted("discovery-dial-timeout", Duration, DISCOVERY),
    accepted("discovery-request-timeout", Duration, DISCOVERY),
    accepted("discovery-keepalive-time", Duration, DISCOVERY),
    accepted("discovery-keepalive-timeout", Duration, DISCOVERY),
    accepted("discovery-insecure-transport", Bool, DISCOVERY),
    accepted("discovery-insecure-skip-tls-verify", Bool, DISCOVERY),
    accepted("discovery-cert", Str, DISCOVERY),
    accepted("discovery-key", Str, DISCOVERY),
    accepted("discovery-cacert", Str, DISCOVERY),
    accepted("discovery-user", Str, DISCOVERY),
    accepted("discovery-password", Str, DISCOVERY),
    accepted("discovery-fallback", Str, DISCOVERY),
    accepted("discovery-proxy", Str, DISCOVERY),
    served("discovery-srv", Str),
    accepted("discovery-srv-name", Str, DISCOVERY),
    accepted("strict-reconfig-check", Bool, RECONFIG),
    served("pre-vote", Bool),
    served("auto-compaction-retention", Str),
    served("auto-compaction-mode", Str),
    accepted("v2-deprecation", Str, V2),
    // Security.
    served("cert-file", Str),
    served("key-file", Str),
    served("client-cert-auth", Bool),
    accepted("client-cert-file", Str, TLS),
    accepted("client-key-file", Str, TLS),
    accepted("client-crl-file", Str, TLS),
    accepted("client-cert-allowed-hostname", Str, TLS),
    served("trusted-ca-file", Str),
    served("auto-tls", Bool),
    served("peer-cert-file", Str),
    served("peer-key-file", Str),
    served("peer-client-cert-auth", Bool),
    accepted("peer-client-cert-file", Str, TLS),
    accepted("peer-client-key-file", Str, TLS),
    served("peer-trusted-ca-file", Str),
    accepted("peer-cert-allowed-cn", Str, TLS),
    accepted("peer-cert-allowed-hostname", Str, TLS),
    served("peer-auto-tls", Bool),
    accepted("self-signed-cert-validity", Uint, TLS),
    accepted("peer-crl-file", Str, TLS),
    accepted("cipher-suites", Str, TLS),
    accepted("cors", Str, HTTP_FILTER),
    accepted("host-whitelist", Str, HTTP_FILTER),
    accepted("tls-min-version", Str, TLS),
    accepted("tls-max-version", Str, TLS),
    // Auth.
    served("auth-token", Str),
    served("bcrypt-cost", Uint),
    served("auth-token-ttl", Uint),
    // Profiling and monitoring.
    accepted("enable-pprof", Bool, OBSERVABILITY),
    accepted("metrics", Str, OBSERVABILITY),
    served("listen-metrics-urls", Str),
    // Logging.
    served("logger", Str),
    served("log-outputs", Str),
    served("log-level", Str),
    served("log-format", Str),
    accepted("enable-log-rotation", Bool, LOGGING),
    accepted("log-rotation-config-json", Str, LOGGING),
    accepted("warning-unary-request-duration", Duration, LOGGING),
    // Distributed tracing.
    accepted(
        "experimental-enable-distributed-tracing",
        Bool,
        OBSERVABILITY,
    ),
    accepted("enable-distributed-tracing", Bool, OBSERVABILITY),
    accepted(
        "experimental-distributed-tracing-address",
        Str,
        OBSERVABILITY,
    ),
    accepted("distributed-tracing-address", Str, OBSERVABILITY),
    accepted(
        "experimental-distributed-tracing-service-name",
        Str,
        OBSERVABILITY,
    ),
    accepted("distributed-tracing-service-name", Str, OBSERVABILITY),
    accepted(
        "experimental-distributed-tracing-instance-id",
        Str,
        OBSERVABILITY,
    ),
    accepted("distributed-tracing-instance-id", Str, OBSERVABILITY),
    accepted(
        "experimental-distributed-tracing-sampling-rate",
        Int,
        OBSERVABILITY,
    ),
    accepted("distributed-tracing-sampling-rate", Int, OBSERVABILITY),
    // Experimental features (3.5's spellings) and their 3.6 names.
    served("experimental-initial-corrupt-check", Bool),
    served("experimental-corrupt-check-time", Duration),
    served("corrupt-check-time", Duration),
    served("experimental-compact-hash-check-enabled", Bool),
    served("experimental-compact-hash-check-time", Duration),
    served("compact-hash-check-time", Duration),
    served("experimental-enable-lease-checkpoint", Bool),
    accepted("experimental-compaction-batch-limit", Int, COMPACTION),
    accepted("compaction-batch-limit", Int, COMPACTION),
    accepted("experimental-peer-skip-client-san-verification", Bool, TLS),
    accepted("peer-skip-client-san-verification", Bool, TLS),
    served("experimental-watch-progress-notify-interval", Duration),
    served("watch-progress-notify-interval", Duration),
    accepted(
        "experimental-warning-apply-duration",
        Duration,
        APPLY_WARNING,
    ),
    accepted("warning-apply-duration", Duration, APPLY_WARNING),
    served("experimental-txn-mode-write-with-shared-buffer", Bool),
    accepted(
        "experimental-bootstrap-defrag-threshold-megabytes",
        Uint,
        BOOTSTRAP_DEFRAG,
    ),
    accepted(
        "bootstrap-defrag-threshold-megabytes",
        Uint,
        BOOTSTRAP_DEFRAG,
    ),
    accepted(
        "experimental-warning-unary-request-duration",
        Duration,
        LOGGING,
    ),
    served("max-learners", Int),
    accepted(
        "experimental-compaction-sleep-interval",
        Duration,
        COMPACTION,
    ),
    accepted("compaction-sleep-interval", Duration, COMPACTION),
    served("experimental-downgrade-check-time", Duration),
    served("downgrade-check-time", Duration),
    served("experimental-enable-lease-checkpoint-persist", Bool),
    accepted("experimental-memory-mlock", Bool, MLOCK),
    accepted("experimental-snapshot-catchup-entries", Uint, CATCHUP),
    accepted("snapshot-catchup-entries", Uint, CATCHUP),
    served("experimental-stop-grpc-service-on-defrag", Bool),
    // Unsafe.
    served("force-new-cluster", Bool),
    accepted("unsafe-no-fsync", Bool, STORAGE),
    // Not in the help text.
    served("config-file", Str),
    served("version", Bool),
    accepted("cluster-active-size", Bool, ETCD_IGNORES),
    accepted("cluster-remove-delay", Bool, ETCD_IGNORES),
    accepted("cluster-sync-interval", Bool, ETCD_IGNORES),
    accepted("config", Bool, ETCD_IGNORES),
    accepted("force", Bool, ETCD_IGNORES),
    accepted("max-result-buffer", Bool, ETCD_IGNORES),
    accepted("max-retry-attempts", Bool, ETCD_IGNORES),
    accepted("peer-heartbeat-interval", Bool, ETCD_IGNORES),
    accepted("peer-election-timeout", Bool, ETCD_IGNORES),
    accepted("retry-interval", Bool, ETCD_IGNORES),
    accepted("snapshot", Bool, ETCD_IGNORES),
    accepted("v", Bool, ETCD_IGNORES),
    accepted("vv", Bool, ETCD_IGNORES),
];

/// etcd 3.5's names that 3.6 renamed: (old, new). Given alone, the old one
/// sets the new; given together they are an error.
pub const RENAMED_FLAGS: &[(&str, &str)] = &[
    (
        "experimental-compact-hash-check-time",
        "compact-hash-check-time",
    ),
    ("experimental-corrupt-check-time", "corrupt-check-time"),
    (
        "experimental-compaction-batch-limit",
        "compaction-batch-limit",
    ),
    (
        "experimental-watch-progress-notify-interval",
        "watch-progress-notify-interval",
    ),
    (
        "experimental-warning-apply-duration",
        "warning-apply-duration",
    ),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        "bootstrap-defrag-threshold-megabytes",
    ),
    ("experimental-memory-mlock", "memory-mlock"),
    (
        "experimental-snapshot-catchup-entries",
        "snapshot-catchup-entries",
    ),
    (
        "experimental-compaction-sleep-interval",
        "compaction-sleep-interval",
    ),
    ("experimental-downgrade-check-time", "downgrade-check-time"),
    (
        "experimental-peer-skip-client-san-verification",
        "peer-skip-client-san-verification",
    ),
    (
        "experimental-enable-distributed-tracing",
        "enable-distributed-tracing",
    ),
    (
        "experimental-distributed-tracing-address",
        "distributed-tracing-address",
    ),
    (
        "experimental-distributed-tracing-service-name",
        "distributed-tracing-service-name",
    ),
    (
        "experimental-distributed-tracing-instance-id",
        "distributed-tracing-instance-id",
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        "distributed-tracing-sampling-rate",
    ),
];

/// etcd 3.5's boolean flags that became feature gates in 3.6: (flag, gate).
pub const GATE_FLAGS: &[(&str, &str)] = &[
    (
        "experimental-stop-grpc-service-on-defrag",
        "StopGRPCServiceOnDefrag",
    ),
    ("experimental-initial-corrupt-check", "InitialCorruptCheck"),
    (
        "experimental-compact-hash-check-enabled",
        "CompactHashCheck",
    ),
    (
        "experimental-txn-mode-write-with-shared-buffer",
        "TxnModeWriteWithSharedBuffer",
    ),
    ("experimental-enable-lease-checkpoint", "LeaseCheckpoint"),
    (
        "experimental-enable-lease-checkpoint-persist",
        "LeaseCheckpointPersist",
    ),
];

/// etcd 3.6's deprecation warnings, logged once per flag given.
pub const DEPRECATION_WARNINGS: &[(&str, &str)] = &[
    ("max-snapshots", "--max-snapshots is deprecated in 3.6 and will be decommissioned in 3.8."),
    ("v2-deprecation", "--v2-deprecation is deprecated and scheduled for removal in v3.8. The default value is enforced, ignoring user input."),
    ("experimental-compact-hash-check-enabled", "--experimental-compact-hash-check-enabled is deprecated in 3.6 and will be decommissioned in 3.7. Use '--feature-gates=CompactHashCheck=true' instead."),
    ("experimental-compact-hash-check-time", "--experimental-compact-hash-check-time is deprecated in 3.6 and will be decommissioned in 3.7. Use '--compact-hash-check-time' instead."),
    ("experimental-txn-mode-write-with-shared-buffer", "--experimental-txn-mode-write-with-shared-buffer is deprecated in v3.6 and will be decommissioned in v3.7. Use '--feature-gates=TxnModeWriteWithSharedBuffer=true' instead."),
    ("experimental-corrupt-check-time", "--experimental-corrupt-check-time is deprecated in v3.6 and will be decommissioned in v3.7. Use '--corrupt-check-time' instead."),
    ("experimental-compaction-batch-limit", "--experimental-compaction-batch-limit is deprecated in v3.6 and will be decommissioned in v3.7. Use '--compaction-batch-limit' instead."),
    ("experimental-watch-progress-notify-interval", "--experimental-watch-progress-notify-interval is deprecated in v3.6 and will be decommissioned in v3.7. Use '--watch-progress-notify-interval' instead."),
    ("experimental-warning-apply-duration", "--experimental-warning-apply-duration is deprecated in v3.6 and will be decommissioned in v3.7. Use '--warning-apply-duration' instead."),
    ("experimental-bootstrap-defrag-threshold-megabytes", "--experimental-bootstrap-defrag-threshold-megabytes is deprecated in v3.6 and will be decommissioned in v3.7. Use '--bootstrap-defrag-threshold-megabytes' instead."),
    ("experimental-memory-mlock", "--experimental-memory-mlock is deprecated in v3.6 and will be decommissioned in v3.7. Use '--memory-mlock' instead."),
    ("experimental-snapshot-catchup-entries", "--experimental-snapshot-catchup-entries is deprecated in v3.6 and will be decommissioned in v3.7. Use '--snapshot-catchup-entries' instead."),
    ("experimental-compaction-sleep-interval", "--experimental-compaction-sleep-interval is deprecated in v3.6 and will be decommissioned in v3.7. Use 'compaction-sleep-interval' instead."),
    ("experimental-downgrade-check-time", "--experimental-downgrade-check-time is deprecated in v3.6 and will be decommissioned in v3.7. Use '--downgrade-check-time' instead."),
    ("experimental-enable-distributed-tracing", "--experimental-enable-distributed-tracing is deprecated in 3.6 and will be decommissioned in 3.7. Use --enable-distributed-tracing instead."),
    ("experimental-distributed-tracing-address", "--experimental-distributed-tracing-address is deprecated in 3.6 and will be decommissioned in 3.7. Use --distributed-tracing-address instead."),
    ("experimental-distributed-tracing-service-name", "--experimental-distributed-tracing-service-name is deprecated in 3.6 and will be decommissioned in 3.7. Use --distributed-tracing-service-name instead."),
    ("experimental-distributed-tracing-instance-id", "--experimental-distributed-tracing-instance-id is deprecated in 3.6 and will be decommissioned in 3.7. Use --distributed-tracing-instance-id instead."),
    ("experimental-distributed-tracing-sampling-rate", "--experimental-distributed-tracing-sampling-rate is deprecated in 3.6 and will be decommissioned in 3.7. Use --distributed-tracing-sampling-rate instead."),
];

/// The row for `name`, if etcd 3.6 has such a flag.
pub fn find(name: &str) -> Option<&'static EtcdFlag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// Why a flag's value is refused: Go's `flag` package's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A flag etcd 3.6 does not have.
    #[error("flag provided but not defined: -{0}")]
    NotDefined(String),
    /// `---x`, `-=x` and the like.
    #[error("bad flag syntax: {0}")]
    BadSyntax(String),
    /// A value-taking flag at the end of the arguments.
    #[error("flag needs an argument: -{0}")]
    NeedsArgument(String),
    /// A boolean flag with a value `strconv.ParseBool` refuses.
    #[error("invalid boolean value {value:?} for -{flag}: parse error")]
    Bool {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
    },
    /// A number or duration that does not parse.
    #[error("invalid value {value:?} for flag -{flag}: parse error")]
    Value {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
    },
    /// A value outside a selective flag's choices (`--v2-deprecation`,
    /// `--discovery-fallback`).
    #[error("invalid value {value:?} for flag -{flag}: invalid value {value:?}")]
    Choice {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
    },
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `--v2-deprecation`'s values in 3.6 (3.5's `not-yet` is gone).
const V2_DEPRECATION_VALUES: &[&str] = &[
    "write-only",
    "write-only-skip-check",
    "write-only-drop-data",
    "gone",
];

/// `--discovery-fallback`'s values (`proxy` parses, then fails validation).
const DISCOVERY_FALLBACK_VALUES: &[&str] = &["exit", "proxy"];

/// Checks `value` for `flag` as etcd's flag set would.
pub fn check_value(flag: &EtcdFlag, value: &str) -> Result<(), FlagError> {
    let value_error = || FlagError::Value {
        flag: flag.name.to_string(),
        value: value.to_string(),
    };
    let choices = match flag.name {
        "v2-deprecation" => Some(V2_DEPRECATION_VALUES),
        "discovery-fallback" => Some(DISCOVERY_FALLBACK_VALUES),
        _ => None,
    };
    if let Some(choices) = choices {
        // SelectiveStringsValue takes a comma-separated list.
        if !value.split(',').all(|v| choices.contains(&v)) {
            return Err(FlagError::Choice {
                flag: flag.name.to_string(),
                value: value.to_string(),
            });
        }
        return Ok(());
    }
    match flag.kind {
        Kind::Bool => parse_go_bool(value).map(|_| ()).ok_or(FlagError::Bool {
            flag: flag.name.to_string(),
            value: value.to_string(),
        }),
        Kind::Str => Ok(()),
        Kind::Int => value.parse::<i64>().map(|_| ()).map_err(|_| value_error()),
        Kind::Uint => value.parse::<u64>().map(|_| ()).map_err(|_| value_error()),
        Kind::Duration => parse_go_duration(value)
            .map(|_| ())
            .map_err(|_| value_error()),
    }
}

/// The configuration error 3.6 reports when an experimental flag and its
/// replacement are both given.
pub fn rename_conflict(old: &str, new: &str) -> String {
    format!("cannot set --{old} and --{new} at the same time, please use --{new} only")
}

/// The arguments after a pass in the manner of Go's `flag` package.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Served flags as `--name=value` (`--name` for a bare boolean), one
    /// per flag: a flag given twice keeps its last value, as in Go.
    pub served: Vec<String>,
    /// Accepted flags with their values, in the order given.
    pub accepted: Vec<(&'static str, String)>,
    /// Every flag given, by name.
    pub given: Vec<&'static str>,
    /// `-h`/`--help` was given.
    pub help: bool,
}

impl Scan {
    /// Whether `name` was given.
    pub fn was_given(&self, name: &str) -> bool {
        self.given.contains(&name)
    }

    /// Records `flag` = `value` (`None`: a bare boolean).
    pub fn record(
        &mut self,
        flag: &'static EtcdFlag,
        value: Option<String>,
    ) -> Result<(), FlagError> {
        if let Some(v) = &value {
            check_value(flag, v)?;
        }
        if !self.was_given(flag.name) {
            self.given.push(flag.name);
        }
        match flag.handling {
            Handling::Accepted(_) => {
                self.accepted
                    .push((flag.name, value.unwrap_or_else(|| "true".into())));
            }
            Handling::Served => {
                let prefix = format!("--{}=", flag.name);
                let bare = format!("--{}", flag.name);
                self.served
                    .retain(|a| !a.starts_with(&prefix) && *a != bare);
                match value {
                    // An empty text value is Go's zero value: the flag is
                    // unset (`--cert-file=`: no TLS file).
                    Some(v) if v.is_empty() && flag.kind == Kind::Str => {}
                    Some(v) => self.served.push(format!("{prefix}{v}")),
                    None => self.served.push(bare),
                }
            }
        }
        Ok(())
    }
}

/// Why the command line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// A flag or value Go's flag package refuses (it prints the usage and
    /// exits with status 2).
    #[error(transparent)]
    Flag(#[from] FlagError),
    /// An argument that is not a flag (etcd: `"x" is not a valid flag`,
    /// exit status 1).
    #[error("{0:?} is not a valid flag")]
    NotAFlag(String),
}

/// Walks `args` (without the program name) as Go's `flag` package does:
/// one or two dashes, `--name=value` or `--name value` (booleans take a
/// value only after `=`), parsing stops at the first argument that is not
/// a flag, or after `--`.
pub fn scan(args: &[String]) -> Result<Scan, ScanError> {
    let mut out = Scan::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            if let Some(next) = rest.next() {
                return Err(ScanError::NotAFlag(next.clone()));
            }
            break;
        }
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(ScanError::NotAFlag(arg.clone()));
        };
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(FlagError::BadSyntax(arg.clone()).into());
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        if name == "h" || name == "help" {
            out.help = true;
            continue;
        }
        let flag = find(name).ok_or_else(|| FlagError::NotDefined(name.to_string()))?;
        let value = match (inline, flag.kind) {
            (Some(v), _) => Some(v),
            (None, Kind::Bool) => None,
            (None, _) => Some(
                rest.next()
                    .cloned()
                    .ok_or_else(|| FlagError::NeedsArgument(name.to_string()))?,
            ),
        };
        out.record(flag, value)?;
    }
    Ok(out)
}

/// The `ETCD_*` variable for a flag (`--initial-cluster-token`:
/// `ETCD_INITIAL_CLUSTER_TOKEN`).
pub fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.replace('-', "_").to_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_rename_and_gate_flag_is_a_flag() {
        let mut names: Vec<_> = FLAGS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a flag is listed twice");
        for (old, new) in RENAMED_FLAGS {
            assert_eq!(
                find(old).map(|f| f.kind),
                find(new).map(|f| f.kind),
                "{old}"
            );
        }
        for (flag, _) in GATE_FLAGS {
            assert_eq!(find(flag).map(|f| f.kind), Some(Kind::Bool), "{flag}");
        }
        for (flag, _) in DEPRECATION_WARNINGS {
            assert!(find(flag).is_some(), "{flag}");
        }
    }

    /// docs/compatibility.md names every flag and gate, so the table users
    /// read cannot fall behind this one.
    #[test]
    fn the_compatibility_doc_lists_every_flag_and_gate() {
        let doc = include_str!("../../docs/compatibility.md");
        for flag in FLAGS {
            assert!(
                doc.contains(&format!("`--{}`", flag.name)),
                "--{}",
                flag.name
            );
        }
        for gate in crate::features::GATES {
            assert!(doc.contains(&format!("`{}`", gate.name)), "{}", gate.name);
        }
    }

    fn scan_of(args: &[&str]) -> Result<Scan, ScanError> {
        scan(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn scanning_follows_gos_flag_package() {
        let s = scan_of(&[
            "-name",
            "a",
            "--max-wals=5",
            "--wal-dir",
            "/w",
            "--pre-vote",
            "--name=b",
            "--unsafe-no-fsync",
        ])
        .unwrap();
        assert_eq!(s.served, ["--pre-vote", "--name=b"]);
        assert_eq!(
            s.accepted,
            [
                ("max-wals", "5".to_string()),
                ("wal-dir", "/w".to_string()),
                ("unsafe-no-fsync", "true".to_string())
            ]
        );
        assert!(s.was_given("name") && !s.was_given("data-dir"));
        let err = |args: &[&str]| scan_of(args).unwrap_err().to_string();
        assert_eq!(
            err(&["--enable-v2=false"]),
            "flag provided but not defined: -enable-v2"
        );
        assert_eq!(
            err(&["--proxy", "off"]),
            "flag provided but not defined: -proxy"
        );
        assert_eq!(err(&["--name"]), "flag needs an argument: -name");
        assert_eq!(err(&["--pre-vote", "true"]), "\"true\" is not a valid flag");
        assert_eq!(err(&["---name=x"]), "bad flag syntax: ---name=x");
        assert!(scan_of(&["-h"]).unwrap().help);
    }

    #[test]
    fn values_are_checked_as_gos_flag_package_checks_them() {
        let f = |n| find(n).expect("flag");
        assert_eq!(check_value(f("unsafe-no-fsync"), "T"), Ok(()));
        assert_eq!(
            check_value(f("unsafe-no-fsync"), "yes")
                .unwrap_err()
                .to_string(),
            "invalid boolean value \"yes\" for -unsafe-no-fsync: parse error"
        );
        assert_eq!(
            check_value(f("backend-batch-limit"), "x")
                .unwrap_err()
                .to_string(),
            "invalid value \"x\" for flag -backend-batch-limit: parse error"
        );
        assert!(check_value(f("backend-batch-interval"), "10ms").is_ok());
        assert!(check_value(f("max-wals"), "-1").is_err());
        assert!(check_value(f("v2-deprecation"), "write-only").is_ok());
        assert_eq!(
            check_value(f("v2-deprecation"), "not-yet")
                .unwrap_err()
                .to_string(),
            "invalid value \"not-yet\" for flag -v2-deprecation: invalid value \"not-yet\""
        );
    }
}

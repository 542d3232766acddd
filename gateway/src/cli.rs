//! Command-line flags.
//!
//! Two ways to run: `gateway --config FILE` (everything, reloadable), or for the simple case
//! `gateway --listen ADDR --backend HOST:PORT ... --check https:/readyz`, which builds a
//! one-frontend configuration with the same defaults as the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::Parser;

use crate::affinity;
use crate::config::{
    default_name, default_prefix, parse_duration, parse_election_endpoints, parse_vip_address,
    validate_host_port, validate_interface, validate_lease_ttl, validate_name, validate_prefix,
    BackendConfig, BalancePolicy, CheckConfig, CheckKind, Config, ConfigError, ElectionTls,
    FrontendConfig, OnMarkedDown, Verify, VipConfig, DEFAULT_ADMIN_LISTEN, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_QUEUE_TIMEOUT, DEFAULT_RETRIES, DEFAULT_SHUTDOWN_GRACE, DEFAULT_TCP_KEEPALIVE,
    DEFAULT_WEIGHT, MAX_ENTRIES, MAX_FALL_RISE, MIN_CHECK_INTERVAL,
};
use crate::supervisor::{ConfigSource, RunOptions};

/// L4 load balancer with TLS passthrough for kube-apiservers and store members.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about)]
pub struct Cli {
    /// TOML configuration file (reloaded on SIGHUP or when it changes).
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with_all = ["listen", "backends"])]
    pub config: Option<PathBuf>,
    /// Listen address of the single frontend (flags mode).
    #[arg(long, value_name = "ADDR", requires = "backends")]
    pub listen: Option<SocketAddr>,
    /// Backend address; repeat for each backend (flags mode).
    #[arg(long = "backend", value_name = "HOST:PORT", requires = "listen")]
    pub backends: Vec<String>,
    /// Health check: https:PATH, http:PATH, tcp, none, etcd (https /health) or etcd-http.
    #[arg(long, value_name = "SPEC", default_value = "https:/readyz", value_parser = parse_check)]
    pub check: CheckSpec,
    /// Check interval (flags mode).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub check_interval: Duration,
    /// Consecutive failed checks that mark a backend down (flags mode).
    #[arg(long, default_value_t = 3)]
    pub fall: u32,
    /// Consecutive successful checks that mark a backend up (flags mode).
    #[arg(long, default_value_t = 2)]
    pub rise: u32,
    /// Slow-start ramp after a backend comes up (flags mode).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub slow_start: Duration,
    /// CA bundle to verify backends' certificates in HTTPS checks (default: verify none).
    #[arg(long, value_name = "FILE")]
    pub check_ca: Option<PathBuf>,
    /// Client certificate for HTTPS checks (needs --check-key).
    #[arg(long, value_name = "FILE", requires = "check_key")]
    pub check_cert: Option<PathBuf>,
    /// Client key for HTTPS checks.
    #[arg(long, value_name = "FILE", requires = "check_cert")]
    pub check_key: Option<PathBuf>,
    /// Balancing: least-connections, peak-ewma or round-robin (flags mode).
    #[arg(long, default_value = "least-connections", value_parser = parse_balance)]
    pub balance: BalancePolicy,
    /// Idle timeout of established connections (flags mode).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// The relayed protocol's server sends first (SMTP, MySQL; flags mode): accept connections
    /// at once and acknowledge handshakes at once. By default the gateway expects the client
    /// to send first, as TLS does, and defers accepts until the first bytes arrive.
    #[arg(long)]
    pub server_speaks_first: bool,
    /// Connect timeout (flags mode).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// Admin API, metrics and status page address, or `off` [default: 127.0.0.1:9100, or the
    /// file's `admin`].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// Validate the configuration and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Virtual IP to hold while elected, `IPV4[/PREFIX]` or `IPV6[/PREFIX]` (flags mode; the
    /// file has `[vip]`).
    #[arg(long, value_name = "ADDR/PREFIX", requires_all = ["vip_interface", "vip_election"], conflicts_with = "config")]
    pub vip: Option<String>,
    /// Interface that gets the VIP.
    #[arg(long, value_name = "NAME", requires = "vip")]
    pub vip_interface: Option<String>,
    /// Store members that run the election: etcd://HOST:PORT[,HOST:PORT] (etcds:// for TLS).
    #[arg(long, value_name = "URLS", requires = "vip")]
    pub vip_election: Option<String>,
    /// Election key prefix [default: /gateway/vip/<VIP>].
    #[arg(long, value_name = "KEY", requires = "vip")]
    pub vip_election_prefix: Option<String>,
    /// Lease TTL of the election: bounds the takeover after a holder dies (whole seconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub vip_lease_ttl: Duration,
    /// This candidate's name in the election [default: the host name].
    #[arg(long, value_name = "NAME", requires = "vip")]
    pub vip_name: Option<String>,
    /// CA bundle of the store members' certificates (etcds:// endpoints).
    #[arg(long, value_name = "FILE", requires = "vip")]
    pub vip_election_ca: Option<PathBuf>,
    /// Client certificate towards the store (needs --vip-election-key).
    #[arg(long, value_name = "FILE", requires_all = ["vip", "vip_election_key"])]
    pub vip_election_cert: Option<PathBuf>,
    /// Client key towards the store.
    #[arg(long, value_name = "FILE", requires_all = ["vip", "vip_election_cert"])]
    pub vip_election_key: Option<PathBuf>,
    /// Threads that accept and relay connections (HAProxy's `nbthread`), 1 to 64; default: one
    /// per CPU. With one, everything runs on it; with more, each has a listener of its own per
    /// frontend (`SO_REUSEPORT`) and relays the connections it accepts (see `gateway::relays`).
    #[arg(
        long,
        value_name = "N",
        default_value_t = default_threads(),
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_THREADS as u64)
    )]
    pub threads: usize,
    /// Placement of the relay threads (HAProxy's `cpu-map`): `auto` pins each to a CPU of its
    /// own when there is one relay thread per CPU the process may run on (the default of
    /// --threads); `none` leaves them to the kernel (see `gateway::affinity`).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = affinity::Mode::Auto)]
    pub cpu_affinity: affinity::Mode,
    /// Seed of the p2c random generator (reproducible balancing decisions).
    #[arg(long, hide = true)]
    pub seed: Option<u64>,
}

/// Default of `--threads`: one relay thread per CPU the process may run on
/// (`std::thread::available_parallelism`, which follows the CPU affinity and a cgroup's CPU
/// quota), at most [`MAX_THREADS`]: HAProxy's default `nbthread`.
///
/// Measured against HAProxy (its two threads) in the same `bench gateway` runs on a 2-core
/// machine (docs/benchmarks.md, 2026-11-26): two relay threads, each accepting on a listener
/// of its own, relay 1.01-1.03x HAProxy's maximum requests/s at 1.00-1.02x its CPU per new
/// connection; one thread 0.86-0.90x at 0.88-0.92x. Handing connections from one accepting
/// thread to the relay threads had cost 1.2-1.5x HAProxy's CPU per new connection, and a
/// multi-thread tokio runtime with a worker per core 1.05-1.18x (work stealing), so one
/// thread was the default until each relay thread accepted its own connections.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |cpus| cpus.get())
        .min(MAX_THREADS)
}

/// Upper bound of `--threads` (HAProxy's `nbthread` limit on 64-bit builds).
pub const MAX_THREADS: usize = 64;

/// A parsed `--check` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckSpec {
    /// The protocol.
    pub kind: CheckKind,
    /// The path, for HTTP kinds.
    pub path: String,
}

fn parse_check(text: &str) -> Result<CheckSpec, String> {
    let (kind_text, path) = match text.split_once(':') {
        Some((kind, path)) => (kind, Some(path)),
        None => (text, None),
    };
    let kind = match kind_text {
        "none" => CheckKind::None,
        "tcp" => CheckKind::Tcp,
        "http" => CheckKind::Http,
        "https" => CheckKind::Https,
        "etcd" | "etcd-https" => CheckKind::EtcdHttps,
        "etcd-http" => CheckKind::EtcdHttp,
        other => {
            return Err(format!(
                "unknown check `{other}`: use https:PATH, http:PATH, tcp, none, etcd or etcd-http"
            ))
        }
    };
    let path = match path {
        Some(path) if !path.starts_with('/') => {
            return Err(format!("check path `{path}` must start with `/`"))
        }
        Some(_) if matches!(kind, CheckKind::None | CheckKind::Tcp) => {
            return Err(format!("check `{kind_text}` takes no path"))
        }
        Some(path) => path.to_string(),
        None => kind.default_path().to_string(),
    };
    Ok(CheckSpec { kind, path })
}

fn parse_balance(text: &str) -> Result<BalancePolicy, String> {
    match text {
        "least-connections" | "leastconn" => Ok(BalancePolicy::LeastConnections),
        "peak-ewma" => Ok(BalancePolicy::PeakEwma),
        "round-robin" | "roundrobin" => Ok(BalancePolicy::RoundRobin),
        other => Err(format!(
            "unknown balance `{other}`: use least-connections, peak-ewma or round-robin"
        )),
    }
}

impl Cli {
    /// Turns the flags into run options, validating flags-mode values.
    pub fn run_options(&self) -> Result<RunOptions, ConfigError> {
        let admin = match self.admin.as_deref() {
            None => None,
            Some("off") => Some(None),
            Some(text) => Some(Some(text.parse().map_err(|_| {
                ConfigError::Arguments(format!(
                    "--admin `{text}` is not an IP:PORT address or `off`"
                ))
            })?)),
        };
        let source = match &self.config {
            Some(path) => ConfigSource::File(path.clone()),
            None => ConfigSource::Flags(Box::new(self.flags_config()?)),
        };
        Ok(RunOptions {
            source,
            admin,
            seed: self.seed,
        })
    }

    fn flags_config(&self) -> Result<Config, ConfigError> {
        let listen = self.listen.ok_or_else(|| {
            ConfigError::Arguments(
                "give --config FILE, or --listen ADDR with --backend HOST:PORT".into(),
            )
        })?;
        if self.backends.len() > MAX_ENTRIES {
            return Err(ConfigError::Arguments(format!(
                "more than {MAX_ENTRIES} backends"
            )));
        }
        for address in &self.backends {
            validate_host_port(address)
                .map_err(|message| ConfigError::Arguments(format!("--backend: {message}")))?;
        }
        let in_range = |value: u32| (1..=MAX_FALL_RISE).contains(&value);
        if !in_range(self.fall) || !in_range(self.rise) {
            return Err(ConfigError::Arguments(format!(
                "--fall and --rise must be between 1 and {MAX_FALL_RISE}"
            )));
        }
        if self.check_interval < MIN_CHECK_INTERVAL {
            return Err(ConfigError::Arguments(format!(
                "--check-interval must be at least {MIN_CHECK_INTERVAL:?}"
            )));
        }
        let mut check = CheckConfig::with_kind(self.check.kind);
        check.path = self.check.path.clone();
        check.interval = self.check_interval;
        check.timeout = self.check_interval;
        check.fall = self.fall;
        check.rise = self.rise;
        check.slow_start = self.slow_start;
        if let Some(ca) = &self.check_ca {
            check.tls.verify = Verify::CaFile(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.check_cert, &self.check_key) {
            check.tls.client_cert = Some((cert.clone(), key.clone()));
        }
        let backends = self
            .backends
            .iter()
            .enumerate()
            .map(|(index, address)| BackendConfig {
                name: format!("backend{}", index + 1),
                address: address.clone(),
                check_address: None,
                weight: DEFAULT_WEIGHT,
                max_connections: None,
            })
            .collect();
        Ok(Config {
            admin_listen: Some(
                DEFAULT_ADMIN_LISTEN
                    .parse()
                    .expect("default admin address parses"),
            ),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            frontends: vec![FrontendConfig {
                name: "default".to_string(),
                listen,
                balance: self.balance,
                max_connections: DEFAULT_MAX_CONNECTIONS,
                connect_timeout: self.connect_timeout,
                idle_timeout: self.idle_timeout,
                queue_timeout: DEFAULT_QUEUE_TIMEOUT,
                retries: DEFAULT_RETRIES,
                tcp_keepalive: DEFAULT_TCP_KEEPALIVE,
                client_speaks_first: !self.server_speaks_first,
                on_marked_down: OnMarkedDown::KeepSessions,
                check,
                backends,
            }],
            vip: self.vip_config()?,
        })
    }

    fn vip_config(&self) -> Result<Option<VipConfig>, ConfigError> {
        let Some(address) = &self.vip else {
            return Ok(None);
        };
        let invalid =
            |flag: &str, message: String| ConfigError::Arguments(format!("{flag}: {message}"));
        let (address, prefix_len) =
            parse_vip_address(address).map_err(|message| invalid("--vip", message))?;
        let interface = self
            .vip_interface
            .clone()
            .ok_or_else(|| ConfigError::Arguments("--vip needs --vip-interface".into()))?;
        validate_interface(&interface).map_err(|message| invalid("--vip-interface", message))?;
        let election = self
            .vip_election
            .as_deref()
            .ok_or_else(|| ConfigError::Arguments("--vip needs --vip-election".into()))?;
        let (endpoints, uses_tls) = parse_election_endpoints(election)
            .map_err(|message| invalid("--vip-election", message))?;
        let prefix = match &self.vip_election_prefix {
            None => default_prefix(address),
            Some(prefix) => {
                validate_prefix(prefix)
                    .map_err(|message| invalid("--vip-election-prefix", message))?;
                prefix.clone()
            }
        };
        validate_lease_ttl(self.vip_lease_ttl)
            .map_err(|message| invalid("--vip-lease-ttl", message))?;
        let name = match &self.vip_name {
            None => default_name(),
            Some(name) => {
                validate_name(name).map_err(|message| invalid("--vip-name", message))?;
                name.clone()
            }
        };
        let client_cert = match (&self.vip_election_cert, &self.vip_election_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            _ => None,
        };
        let has_tls_files = self.vip_election_ca.is_some() || client_cert.is_some();
        let tls = match (uses_tls, has_tls_files) {
            (true, _) => Some(ElectionTls {
                ca_file: self.vip_election_ca.clone(),
                client_cert,
            }),
            (false, false) => None,
            (false, true) => {
                return Err(ConfigError::Arguments(
                    "--vip-election-ca/-cert/-key need etcds:// endpoints".into(),
                ))
            }
        };
        Ok(Some(VipConfig {
            address,
            prefix_len,
            interface,
            endpoints,
            prefix,
            lease_ttl: self.vip_lease_ttl,
            name,
            tls,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT};

    #[test]
    fn documented_contract_parses() {
        let cli = Cli::try_parse_from([
            "gateway",
            "--listen",
            "127.0.0.1:6443",
            "--backend",
            "127.0.0.2:8443",
            "--backend",
            "127.0.0.3:8443",
            "--check",
            "https:/readyz",
        ])
        .expect("valid flags");
        let options = cli.run_options().expect("valid");
        let ConfigSource::Flags(config) = options.source else {
            panic!("flags mode");
        };
        let frontend = &config.frontends[0];
        assert_eq!(frontend.backends.len(), 2);
        assert_eq!(frontend.check.kind, CheckKind::Https);
        assert_eq!(frontend.check.path, "/readyz");
        assert_eq!(frontend.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        assert_eq!(frontend.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert!(frontend.client_speaks_first);
        let cli = Cli::try_parse_from([
            "gateway",
            "--listen",
            "127.0.0.1:25",
            "--backend",
            "127.0.0.2:25",
            "--server-speaks-first",
        ])
        .expect("valid flags");
        let ConfigSource::Flags(config) = cli.run_options().expect("valid").source else {
            panic!("flags mode");
        };
        assert!(!config.frontends[0].client_speaks_first);
    }

    /// Parses a one-frontend command line with `extra` flags.
    fn parse(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut args = vec!["gateway", "--listen", "127.0.0.1:6443", "--backend", "a:1"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)
    }

    #[test]
    fn threads_default_to_one_and_are_bounded() {
        assert_eq!(parse(&[]).expect("defaults").threads, default_threads());
        assert_eq!(parse(&["--threads", "4"]).expect("four").threads, 4);
        for bad in ["0", "65", "two"] {
            let error = parse(&["--threads", bad]).expect_err(bad).to_string();
            assert!(error.contains("--threads"), "{bad}: {error}");
        }
    }

    #[test]
    fn cpu_affinity_defaults_to_auto() {
        assert_eq!(parse(&[]).unwrap().cpu_affinity, affinity::Mode::Auto);
        let none = parse(&["--cpu-affinity", "none"]).unwrap();
        assert_eq!(none.cpu_affinity, affinity::Mode::None);
        let error = parse(&["--cpu-affinity", "all"]).expect_err("unknown mode");
        assert!(error.to_string().contains("--cpu-affinity"), "{error}");
    }

    #[test]
    fn check_specs() {
        assert_eq!(parse_check("tcp").unwrap().kind, CheckKind::Tcp);
        assert_eq!(parse_check("http:/healthz").unwrap().path, "/healthz");
        assert_eq!(parse_check("etcd").unwrap().path, "/health");
        assert!(parse_check("tcp:/x").is_err());
        assert!(parse_check("https:readyz").is_err());
        assert!(parse_check("grpc").is_err());
    }

    #[test]
    fn vip_flags() {
        let base = [
            "gateway",
            "--listen",
            "0.0.0.0:6443",
            "--backend",
            "10.0.0.1:8443",
        ];
        let parse = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Cli::try_parse_from(args)
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.run_options().map_err(|e| e.to_string()))
        };
        let options = parse(&[
            "--vip",
            "10.0.0.100/32",
            "--vip-interface",
            "eth0",
            "--vip-election",
            "etcd://10.0.0.1:2379,10.0.0.2:2379",
            "--vip-lease-ttl",
            "3s",
        ])
        .expect("valid");
        let ConfigSource::Flags(config) = options.source else {
            panic!("flags mode");
        };
        let vip = config.vip.expect("a VIP");
        assert_eq!(vip.lease_ttl, Duration::from_secs(3));
        assert_eq!(vip.endpoints[1], "http://10.0.0.2:2379");
        assert!(parse(&["--vip", "10.0.0.100/32"]).is_err());
        let error = parse(&[
            "--vip",
            "10.0.0.100/32",
            "--vip-interface",
            "eth0",
            "--vip-election",
            "etcd://10.0.0.1:2379",
            "--vip-lease-ttl",
            "1s",
        ])
        .unwrap_err();
        assert!(error.contains("--vip-lease-ttl"), "{error}");
    }

    #[test]
    fn config_conflicts_with_listen() {
        let result = Cli::try_parse_from([
            "gateway",
            "--config",
            "x.toml",
            "--listen",
            "127.0.0.1:1",
            "--backend",
            "a:1",
        ]);
        assert!(result.is_err());
    }
}

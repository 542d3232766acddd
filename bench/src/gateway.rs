//! `gateway`: direct vs our gateway vs HAProxy, in front of the same nginx.
//!
//! One nginx (`daemon off`, own prefix in a temp dir, self-signed ECDSA
//! certificate from `openssl`) serves HTTPS on two loopback backends
//! `<subnet>.2:8443` and `<subnet>.3:8443`. HAProxy (`mode tcp`, round
//! robin, HTTPS health checks on /readyz) and our gateway (`--check
//! https:/readyz`) listen on `<subnet>.1` and pass TLS through. The same
//! client then measures, path after path (direct = round robin over both
//! backends):
//!
//! * added latency: open-loop keep-alive GETs at each `--rates` value
//!   (below saturation) over `--conns` connections; latency from the
//!   intended send time; reported as p50/p99 and their difference to direct;
//! * maximum throughput: closed-loop keep-alive GETs over `--conns` connections;
//! * new connections per second: `--conn-clients` loops of TCP connect,
//!   TLS handshake, one GET, close;
//! * memory: resident set size of each proxy before and while holding
//!   `--idle-conns` idle client connections (fd limits are raised first).
//!
//! The load runs repeat in `--rounds` interleaved rounds. Within a round each
//! load runs on every path back to back before the next load starts (the
//! paths' latency runs at one rate are adjacent, not a minute apart), the
//! order of the paths rotated by one every round (round 1: direct, gateway,
//! HAProxy; round 2: gateway, HAProxy, direct; ...), so a slow stretch of a
//! shared machine hits every path instead of whichever ran then. A path's
//! figures pool its rounds: latency quantiles over every round's samples
//! (histograms merged), throughput as all operations over all run time, CPU
//! per operation as all CPU over all operations. Memory is measured once per
//! proxy, after the last round.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::bins::{default_release_bin, require_executable, DEFAULT_HAPROXY, DEFAULT_NGINX};
use crate::https::{connect, connector};
use crate::pace::{Pacer, Stop};
use crate::plot::{line_chart, Chart, Series};
use crate::procs::{self, open_fds, raise_fd_limit, rss_kib, Proc};
use crate::report::{image, table, text_table, OutArgs, Outcome};
use crate::stats::{OpResult, Recorder};
use crate::systems::{check_loopback_subnet, check_ports_free};

/// Default subnet of `gateway`.
pub const DEFAULT_SUBNET: &str = "127.0.70";
/// Backend HTTPS port.
const BACKEND_PORT: u16 = 8443;
/// Our gateway's listen port.
const GATEWAY_PORT: u16 = 6443;
/// HAProxy's listen port.
const HAPROXY_PORT: u16 = 6444;
/// Our gateway's admin port.
const GATEWAY_ADMIN_PORT: u16 = 6445;
/// Open files wanted for 10,000 idle connections through a proxy (×2 in the proxy).
const FD_LIMIT: u64 = 65_536;
/// How long nginx and each proxy may take to serve their first request.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(100);
/// File descriptors kept free for listeners, logs and health checks when
/// sizing idle connections and HAProxy's maxconn to the fd limit.
const FD_RESERVE: u64 = 1_000;
/// HAProxy's maxconn when the fd limit allows it.
const HAPROXY_MAX_MAXCONN: u64 = 30_000;
/// Time for a proxy to settle (accept and dial backends) before reading its RSS.
const IDLE_SETTLE: Duration = Duration::from_secs(2);
/// Longest wait for a proxy to hold every idle connection (a listener with `TCP_DEFER_ACCEPT`
/// queues a silent connection for `accept` only when its deferral period ends).
const IDLE_HOLD_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval of that wait.
const IDLE_HOLD_POLL: Duration = Duration::from_millis(100);
/// Descriptors a proxy holds per relayed connection: the client's socket and the backend's.
const FDS_PER_RELAYED_CONN: usize = 2;
/// Concurrent connects while opening idle connections.
const IDLE_CONNECT_CONCURRENCY: usize = 256;
/// Timeout of one idle TCP connect.
const IDLE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Path requested by the load.
const REQUEST_PATH: &str = "/";
/// Smoke mode settings.
const SMOKE_RATE: f64 = 50.0;
const SMOKE_DURATION: Duration = Duration::from_secs(1);
const SMOKE_CONNS: usize = 2;
const SMOKE_IDLE_CONNS: usize = 50;
/// Rounds by default: three runs of each load per path, 3 x 3 x 20 s at the default rates.
const DEFAULT_ROUNDS: usize = 3;
/// Most rounds: each costs a minute per path at the defaults.
const MAX_ROUNDS: u64 = 20;

/// A proxy that can be left out (smoke runs without it only when asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
pub enum Side {
    Gateway,
    Haproxy,
}

/// Options of `bench gateway`.
#[derive(Args, Clone, Debug)]
pub struct GatewayArgs {
    /// Our gateway binary.
    #[arg(long, env = "GATEWAY_BIN", default_value_os_t = default_release_bin("gateway"))]
    pub gateway_bin: PathBuf,
    /// HAProxy binary.
    #[arg(long, default_value = DEFAULT_HAPROXY)]
    pub haproxy_bin: PathBuf,
    /// nginx binary.
    #[arg(long, default_value = DEFAULT_NGINX)]
    pub nginx_bin: PathBuf,
    /// Leave out a proxy (repeatable). Only for runs where it is unavailable.
    #[arg(long, value_enum)]
    pub skip: Vec<Side>,
    /// First three octets of the loopback addresses used.
    #[arg(long, default_value = DEFAULT_SUBNET)]
    pub subnet: String,
    /// Fixed request rates (requests/s, open loop) for the latency runs.
    #[arg(long, value_delimiter = ',', default_values_t = [1000.0, 4000.0])]
    pub rates: Vec<f64>,
    /// Keep-alive connections of the latency and throughput runs.
    #[arg(long, default_value_t = 32)]
    pub conns: usize,
    /// Concurrent connect-handshake-request-close loops.
    #[arg(long, default_value_t = 16)]
    pub conn_clients: usize,
    /// Length of each run.
    #[arg(long, default_value = "5s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Idle connections held open through each proxy for the RSS measurement.
    #[arg(long, default_value_t = 10_000)]
    pub idle_conns: usize,
    /// Interleaved rounds; every round runs each load on each path once.
    #[arg(long, default_value_t = DEFAULT_ROUNDS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_ROUNDS))]
    pub rounds: usize,
    /// Tiny runs (CI): 1 round, 50 req/s, 1 s runs, 2 connections, 50 idle connections.
    #[arg(long)]
    pub smoke: bool,
    #[command(flatten)]
    pub out: OutArgs,
}

/// Latency at one fixed rate.
#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    pub rate: f64,
    pub result: OpResult,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
}

/// Memory of a proxy holding idle connections.
#[derive(Clone, Debug, Serialize)]
pub struct Memory {
    pub idle_conns_opened: usize,
    pub rss_before_kib: u64,
    pub rss_idle_kib: u64,
    pub kib_per_conn: f64,
}

/// One round's run of one load on one path.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RoundFigures {
    pub throughput_ops_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// A path's figures round by round (the pooled ones hide how far rounds differ).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PerRound {
    /// Per `--rates` value, one entry per round.
    pub rates: Vec<Vec<RoundFigures>>,
    /// The new-connection runs, one per round.
    pub new_conns: Vec<RoundFigures>,
}

/// Everything measured on one path.
#[derive(Clone, Debug, Serialize)]
pub struct PathResult {
    pub path: String,
    pub rates: Vec<RatePoint>,
    pub per_round: PerRound,
    pub max_throughput: OpResult,
    pub new_conns: OpResult,
    /// The proxy's CPU per request of the max-throughput run (none on the direct path).
    pub cpu_us_per_request: Option<f64>,
    /// The proxy's CPU per connection of the new-connection run.
    pub cpu_us_per_conn: Option<f64>,
    pub memory: Option<Memory>,
}

/// The whole gateway benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayOutcome {
    pub seed: u64,
    pub rounds: usize,
    pub conns: usize,
    pub conn_clients: usize,
    pub duration_s: f64,
    pub idle_conns: usize,
    pub fd_limit: u64,
    pub skipped: Vec<Side>,
    pub paths: Vec<PathResult>,
}

struct Plan {
    rounds: usize,
    rates: Vec<f64>,
    conns: usize,
    conn_clients: usize,
    duration: Duration,
    idle_conns: usize,
    progress: bool,
}

/// A way to reach the backends.
struct Route {
    name: &'static str,
    addrs: Vec<SocketAddr>,
    proxy: Option<Proc>,
}

/// Runs the benchmark.
pub async fn run(args: &GatewayArgs, seed: u64, progress: bool) -> Result<GatewayOutcome> {
    check_loopback_subnet(&args.subnet)?;
    check_binaries(args)?;
    let fd_limit = raise_fd_limit(FD_LIMIT)?;
    let plan = plan(args, progress, fd_limit);
    let dir = tempfile::Builder::new()
        .prefix("bench-gateway-")
        .tempdir()?;
    let backends = [
        addr(&args.subnet, 2, BACKEND_PORT)?,
        addr(&args.subnet, 3, BACKEND_PORT)?,
    ];
    let mut listening = backends.to_vec();
    for port in [GATEWAY_PORT, GATEWAY_ADMIN_PORT, HAPROXY_PORT] {
        listening.push(addr(&args.subnet, 1, port)?);
    }
    check_ports_free(&listening)?;
    let tls = connector()?;
    let _nginx = start_nginx(&args.nginx_bin, dir.path(), &backends, &tls, fd_limit).await?;
    let mut paths = vec![Route {
        name: "direct",
        addrs: backends.to_vec(),
        proxy: None,
    }];
    if !args.skip.contains(&Side::Gateway) {
        paths.push(start_gateway(args, dir.path(), &backends, &tls).await?);
    }
    if !args.skip.contains(&Side::Haproxy) {
        paths.push(start_haproxy(args, dir.path(), &backends, &tls, fd_limit).await?);
    }
    let mut pooled: Vec<Pooled> = paths.iter().map(|_| Pooled::new(&plan)).collect();
    for round in 0..plan.rounds {
        eprintln!("bench: gateway round {}/{}", round + 1, plan.rounds);
        let order: Vec<usize> = round_order(round, paths.len()).collect();
        for load in Load::all(&plan) {
            for &i in &order {
                measure(&paths[i], load, &plan, &tls, &mut pooled[i]).await?;
            }
        }
    }
    let mut results = Vec::new();
    for (p, pool) in paths.iter().zip(pooled) {
        let memory = match &p.proxy {
            Some(proxy) => Some(idle_memory(proxy.pid(), p.addrs[0], plan.idle_conns).await?),
            None => None,
        };
        results.push(pool.result(p, &plan, memory));
    }
    add_overheads(&mut results);
    Ok(GatewayOutcome {
        seed,
        rounds: plan.rounds,
        conns: plan.conns,
        conn_clients: plan.conn_clients,
        duration_s: plan.duration.as_secs_f64(),
        idle_conns: plan.idle_conns,
        fd_limit,
        skipped: args.skip.clone(),
        paths: results,
    })
}

fn plan(args: &GatewayArgs, progress: bool, fd_limit: u64) -> Plan {
    let idle_max = idle_capacity(fd_limit);
    if args.idle_conns > idle_max && !args.smoke {
        eprintln!(
            "bench: gateway: open-file limit {fd_limit} (hard limit; raising it needs CAP_SYS_RESOURCE) \
             lets a proxy hold only {idle_max} idle connections (2 fds each); measuring {idle_max} instead of {}",
            args.idle_conns
        );
    }
    if args.smoke {
        return Plan {
            rounds: 1,
            rates: vec![SMOKE_RATE],
            conns: SMOKE_CONNS,
            conn_clients: SMOKE_CONNS,
            duration: SMOKE_DURATION,
            idle_conns: SMOKE_IDLE_CONNS,
            progress,
        };
    }
    Plan {
        rounds: args.rounds,
        rates: args.rates.clone(),
        conns: args.conns.max(1),
        conn_clients: args.conn_clients.max(1),
        duration: args.duration,
        idle_conns: args.idle_conns.min(idle_max),
        progress,
    }
}

/// Idle client connections a proxy can hold with `fd_limit` open files
/// (each takes a client and a backend socket).
fn idle_capacity(fd_limit: u64) -> usize {
    usize::try_from(fd_limit.saturating_sub(FD_RESERVE) / 2).unwrap_or(usize::MAX)
}

/// HAProxy's maxconn for `fd_limit` (it needs about two fds per connection).
fn haproxy_maxconn(fd_limit: u64) -> u64 {
    (fd_limit.saturating_sub(FD_RESERVE / 2) / 2).min(HAPROXY_MAX_MAXCONN)
}

fn check_binaries(args: &GatewayArgs) -> Result<()> {
    require_executable(&args.nginx_bin, "nginx", "apt-get install nginx-light")?;
    if !args.skip.contains(&Side::Haproxy) {
        require_executable(
            &args.haproxy_bin,
            "HAProxy",
            "apt-get install haproxy, or pass --skip haproxy",
        )?;
    }
    if !args.skip.contains(&Side::Gateway) {
        require_executable(
            &args.gateway_bin,
            "our gateway",
            "build it with `cargo build --release -p gateway`, set GATEWAY_BIN, or pass --skip gateway",
        )?;
    }
    Ok(())
}

fn addr(subnet: &str, host: u8, port: u16) -> Result<SocketAddr> {
    format!("{subnet}.{host}:{port}")
        .parse()
        .context("bad address")
}

fn make_cert(dir: &Path) -> Result<()> {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args([
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .context("running openssl (apt-get install openssl)")?;
    if !out.status.success() {
        bail!("openssl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn nginx_conf(dir: &Path, backends: &[SocketAddr], fd_limit: u64) -> String {
    let d = dir.display();
    let worker_connections = fd_limit.saturating_sub(FD_RESERVE);
    let listens: String = backends
        .iter()
        .map(|b| format!("    listen {b} ssl;\n"))
        .collect();
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         worker_rlimit_nofile {fd_limit};\nevents {{ worker_connections {worker_connections}; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/tmp-body;\nproxy_temp_path {d}/tmp-proxy;\n\
         fastcgi_temp_path {d}/tmp-fcgi;\nuwsgi_temp_path {d}/tmp-uwsgi;\nscgi_temp_path {d}/tmp-scgi;\n\
         keepalive_requests 10000000;\nkeepalive_timeout 300s;\n\
         server {{\n{listens}    ssl_certificate {d}/cert.pem;\n    ssl_certificate_key {d}/key.pem;\n\
         location = /readyz {{ return 200 \"ok\\n\"; }}\n    location / {{ return 200 \"hello from nginx\\n\"; }}\n  }}\n}}\n"
    )
}

async fn start_nginx(
    bin: &Path,
    dir: &Path,
    backends: &[SocketAddr],
    tls: &TlsConnector,
    fd_limit: u64,
) -> Result<Proc> {
    make_cert(dir)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, backends, fd_limit))?;
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("nginx-error.log"));
    let mut proc = Proc::spawn("nginx", cmd, &dir.join("nginx.log"))?;
    for b in backends {
        wait_serving(&mut proc, *b, tls).await?;
    }
    Ok(proc)
}

async fn start_gateway(
    args: &GatewayArgs,
    dir: &Path,
    backends: &[SocketAddr],
    tls: &TlsConnector,
) -> Result<Route> {
    let listen = addr(&args.subnet, 1, GATEWAY_PORT)?;
    let admin = addr(&args.subnet, 1, GATEWAY_ADMIN_PORT)?;
    let mut cmd = Command::new(&args.gateway_bin);
    cmd.arg("--listen").arg(listen.to_string());
    for b in backends {
        cmd.arg("--backend").arg(b.to_string());
    }
    cmd.args(["--check", "https:/readyz", "--admin", &admin.to_string()]);
    let mut proc = Proc::spawn("gateway", cmd, &dir.join("gateway.log"))?;
    wait_serving(&mut proc, listen, tls).await?;
    Ok(Route {
        name: "gateway",
        addrs: vec![listen],
        proxy: Some(proc),
    })
}

fn haproxy_conf(listen: SocketAddr, backends: &[SocketAddr], maxconn: u64) -> String {
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("  server b{i} {b} check check-ssl verify none inter 2s\n"))
        .collect();
    format!(
        "global\n  maxconn {maxconn}\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 300s\n  \
         timeout server 300s\n\nfrontend fe\n  bind {listen}\n  default_backend be\n\nbackend be\n  \
         balance roundrobin\n  option httpchk GET /readyz\n{servers}"
    )
}

async fn start_haproxy(
    args: &GatewayArgs,
    dir: &Path,
    backends: &[SocketAddr],
    tls: &TlsConnector,
    fd_limit: u64,
) -> Result<Route> {
    let listen = addr(&args.subnet, 1, HAPROXY_PORT)?;
    let conf = dir.join("haproxy.cfg");
    std::fs::write(
        &conf,
        haproxy_conf(listen, backends, haproxy_maxconn(fd_limit)),
    )?;
    let mut cmd = Command::new(&args.haproxy_bin);
    cmd.arg("-db").arg("-f").arg(&conf);
    let mut proc = Proc::spawn("haproxy", cmd, &dir.join("haproxy.log"))?;
    wait_serving(&mut proc, listen, tls).await?;
    Ok(Route {
        name: "haproxy",
        addrs: vec![listen],
        proxy: Some(proc),
    })
}

/// Waits until an HTTPS GET through `addr` succeeds, failing early if `proc` exits.
async fn wait_serving(proc: &mut Proc, addr: SocketAddr, tls: &TlsConnector) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last_err = String::new();
    while Instant::now() < deadline {
        if !proc.is_running() {
            bail!(
                "{} exited while starting; last output:\n{}",
                proc.name(),
                proc.log_tail()
            );
        }
        match try_get(addr, tls).await {
            Ok(()) => return Ok(()),
            Err(e) => last_err = format!("{e:#}"),
        }
        tokio::time::sleep(READY_POLL).await;
    }
    bail!(
        "{} did not serve HTTPS on {addr} within {READY_TIMEOUT:?} ({last_err}); last output:\n{}",
        proc.name(),
        proc.log_tail()
    )
}

async fn try_get(addr: SocketAddr, tls: &TlsConnector) -> Result<()> {
    let mut c = connect(addr, tls).await?;
    c.get(REQUEST_PATH).await?;
    c.close().await;
    Ok(())
}

/// Path indices in the order of `round`: rotated by one each round.
fn round_order(round: usize, paths: usize) -> impl Iterator<Item = usize> {
    (0..paths).map(move |i| (i + round) % paths)
}

/// One load's runs on one path, pooled over rounds.
struct PooledRuns {
    recorder: Recorder,
    elapsed: Duration,
    /// The proxy's CPU over these runs (zero on the direct path).
    cpu_s: f64,
    /// Each run's own figures, in round order.
    rounds: Vec<RoundFigures>,
}

impl PooledRuns {
    fn new() -> Self {
        PooledRuns {
            recorder: Recorder::new(),
            elapsed: Duration::ZERO,
            cpu_s: 0.0,
            rounds: Vec::new(),
        }
    }

    /// Pools one round's run and answers its own figures.
    fn add(&mut self, recorder: &Recorder, elapsed: Duration, cpu_s: f64) -> RoundFigures {
        let run = recorder.result("run", elapsed);
        let figures = RoundFigures {
            throughput_ops_s: run.throughput_ops_s,
            p50_ms: run.latency.p50_ms,
            p99_ms: run.latency.p99_ms,
        };
        self.rounds.push(figures);
        self.recorder.merge(recorder);
        self.elapsed += elapsed;
        self.cpu_s += cpu_s;
        figures
    }

    fn result(&self, name: &str) -> OpResult {
        self.recorder.result(name, self.elapsed)
    }

    /// Microseconds of the proxy's CPU per completed operation; `None` on the direct path or
    /// when nothing completed.
    fn cpu_us_per_op(&self, proxied: bool) -> Option<f64> {
        let ok = self.recorder.ok();
        (proxied && ok > 0).then(|| self.cpu_s * 1e6 / ok as f64)
    }
}

/// Everything measured on one path so far.
struct Pooled {
    rates: Vec<PooledRuns>,
    max_throughput: PooledRuns,
    new_conns: PooledRuns,
}

impl Pooled {
    fn new(plan: &Plan) -> Self {
        Pooled {
            rates: plan.rates.iter().map(|_| PooledRuns::new()).collect(),
            max_throughput: PooledRuns::new(),
            new_conns: PooledRuns::new(),
        }
    }

    fn result(&self, route: &Route, plan: &Plan, memory: Option<Memory>) -> PathResult {
        let proxied = route.proxy.is_some();
        PathResult {
            path: route.name.to_string(),
            rates: plan
                .rates
                .iter()
                .zip(&self.rates)
                .map(|(&rate, runs)| RatePoint {
                    rate,
                    result: runs.result("request"),
                    added_p50_ms: 0.0,
                    added_p99_ms: 0.0,
                })
                .collect(),
            per_round: PerRound {
                rates: self.rates.iter().map(|runs| runs.rounds.clone()).collect(),
                new_conns: self.new_conns.rounds.clone(),
            },
            max_throughput: self.max_throughput.result("request"),
            new_conns: self.new_conns.result("connection"),
            cpu_us_per_request: self.max_throughput.cpu_us_per_op(proxied),
            cpu_us_per_conn: self.new_conns.cpu_us_per_op(proxied),
            memory,
        }
    }
}

/// One of a round's loads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    /// Open-loop requests at `plan.rates[index]`.
    Rate(usize),
    /// Closed-loop requests as fast as they go.
    Max,
    /// Connect, handshake, one request, close, in loops.
    NewConns,
}

impl Load {
    /// A round's loads in order.
    fn all(plan: &Plan) -> Vec<Load> {
        let rates = (0..plan.rates.len()).map(Load::Rate);
        rates.chain([Load::Max, Load::NewConns]).collect()
    }
}

/// One run of `load` on `path`, added to `pooled`.
async fn measure(
    path: &Route,
    load: Load,
    plan: &Plan,
    tls: &TlsConnector,
    pooled: &mut Pooled,
) -> Result<()> {
    match load {
        Load::Rate(index) => {
            let rate = plan.rates[index];
            let label = format!("{} @{rate}/s", path.name);
            let (rec, elapsed) =
                keepalive_load(&path.addrs, tls, plan.conns, Some(rate), plan, &label).await;
            let run = pooled.rates[index].add(&rec, elapsed, 0.0);
            eprintln!(
                "bench: gateway {label}: p50 {:.3} ms p99 {:.3} ms",
                run.p50_ms, run.p99_ms
            );
        }
        Load::Max => {
            let label = format!("{} max", path.name);
            let cpu = ProxyCpu::start(path)?;
            let (rec, elapsed) =
                keepalive_load(&path.addrs, tls, plan.conns, None, plan, &label).await;
            let run = pooled.max_throughput.add(&rec, elapsed, cpu.used_s()?);
            eprintln!("bench: gateway {label}: {:.0} req/s", run.throughput_ops_s);
        }
        Load::NewConns => {
            let cpu = ProxyCpu::start(path)?;
            let (rec, elapsed) = new_conn_load(&path.addrs, tls, plan).await;
            let run = pooled.new_conns.add(&rec, elapsed, cpu.used_s()?);
            eprintln!(
                "bench: gateway {} new connections: {:.0}/s",
                path.name, run.throughput_ops_s
            );
        }
    }
    Ok(())
}

/// The CPU time a proxy spends during one run (user + system, all its threads), so runs on a
/// busy machine compare the proxies' cost per operation and not only how much of the machine
/// each got.
struct ProxyCpu {
    pid: Option<u32>,
    start_s: f64,
}

impl ProxyCpu {
    fn start(path: &Route) -> Result<ProxyCpu> {
        let pid = path.proxy.as_ref().map(Proc::pid);
        let start_s = pid.map(procs::cpu_seconds).transpose()?.unwrap_or(0.0);
        Ok(ProxyCpu { pid, start_s })
    }

    /// Seconds of the proxy's CPU since `start`; zero on the direct path.
    fn used_s(&self) -> Result<f64> {
        match self.pid {
            Some(pid) => Ok(procs::cpu_seconds(pid)? - self.start_s),
            None => Ok(0.0),
        }
    }
}

/// Keep-alive GETs over `conns` connections; open loop with `rate`.
async fn keepalive_load(
    addrs: &[SocketAddr],
    tls: &TlsConnector,
    conns: usize,
    rate: Option<f64>,
    plan: &Plan,
    label: &str,
) -> (Recorder, Duration) {
    let pacer = Arc::new(Pacer::new(
        rate,
        Stop::new(None, Some(plan.duration)),
        plan.progress,
        label,
    ));
    let tasks: Vec<_> = (0..conns)
        .map(|i| {
            tokio::spawn(keepalive_conn(
                addrs[i % addrs.len()],
                tls.clone(),
                pacer.clone(),
            ))
        })
        .collect();
    let rec = join_recorders(tasks).await;
    pacer.finish();
    (rec, pacer.start().elapsed())
}

async fn keepalive_conn(addr: SocketAddr, tls: TlsConnector, pacer: Arc<Pacer>) -> Recorder {
    let mut rec = Recorder::new();
    let mut conn = None;
    while let Some(t) = pacer.next().await {
        let outcome = async {
            if conn.is_none() {
                conn = Some(connect(addr, &tls).await?);
            }
            let c = conn.as_mut().context("no connection")?;
            tokio::time::timeout(crate::load::OP_TIMEOUT, c.get(REQUEST_PATH))
                .await
                .context("timeout")?
        }
        .await;
        match outcome {
            Ok(()) => rec.record(t.intended.elapsed()),
            Err(e) => {
                rec.error(format!("{e:#}"));
                conn = None;
            }
        }
        pacer.done();
    }
    if let Some(c) = conn {
        c.close().await;
    }
    rec
}

/// Connect, handshake, one GET, close — in `conn_clients` closed loops.
async fn new_conn_load(
    addrs: &[SocketAddr],
    tls: &TlsConnector,
    plan: &Plan,
) -> (Recorder, Duration) {
    let label = "new connections";
    let pacer = Arc::new(Pacer::new(
        None,
        Stop::new(None, Some(plan.duration)),
        plan.progress,
        label,
    ));
    let tasks: Vec<_> = (0..plan.conn_clients)
        .map(|i| {
            let (addr, tls, pacer) = (addrs[i % addrs.len()], tls.clone(), pacer.clone());
            tokio::spawn(async move {
                let mut rec = Recorder::new();
                while let Some(t) = pacer.next().await {
                    match tokio::time::timeout(crate::load::OP_TIMEOUT, try_get(addr, &tls)).await {
                        Ok(Ok(())) => rec.record(t.intended.elapsed()),
                        Ok(Err(e)) => rec.error(format!("{e:#}")),
                        Err(_) => rec.error("timeout"),
                    }
                    pacer.done();
                }
                rec
            })
        })
        .collect();
    let rec = join_recorders(tasks).await;
    pacer.finish();
    (rec, pacer.start().elapsed())
}

async fn join_recorders(tasks: Vec<tokio::task::JoinHandle<Recorder>>) -> Recorder {
    let mut all = Recorder::new();
    for t in tasks {
        match t.await {
            Ok(r) => all.merge(&r),
            Err(e) => all.error(e),
        }
    }
    all
}

/// RSS of `pid` before and while `n` idle TCP connections to `addr` are open and relayed (the
/// proxy holds a client and a backend socket for each, or [`IDLE_HOLD_TIMEOUT`] passed).
async fn idle_memory(pid: u32, addr: SocketAddr, n: usize) -> Result<Memory> {
    let rss_before_kib = rss_kib(pid)?;
    let fds_before = open_fds(pid)?;
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for chunk_start in (0..n).step_by(IDLE_CONNECT_CONCURRENCY) {
        let batch = IDLE_CONNECT_CONCURRENCY.min(n - chunk_start);
        let connects: Vec<_> = (0..batch)
            .map(|_| {
                tokio::spawn(tokio::time::timeout(
                    IDLE_CONNECT_TIMEOUT,
                    TcpStream::connect(addr),
                ))
            })
            .collect();
        for c in connects {
            match c.await {
                Ok(Ok(Ok(s))) => held.push(s),
                _ => failed += 1,
            }
        }
    }
    let opened = held.len();
    let wanted = FDS_PER_RELAYED_CONN * opened;
    let deadline = Instant::now() + IDLE_HOLD_TIMEOUT;
    let mut held_fds = open_fds(pid)?.saturating_sub(fds_before);
    while held_fds < wanted && Instant::now() < deadline {
        tokio::time::sleep(IDLE_HOLD_POLL).await;
        held_fds = open_fds(pid)?.saturating_sub(fds_before);
    }
    if held_fds < wanted {
        eprintln!(
            "bench: gateway: pid {pid} holds {held_fds} descriptors for {opened} idle connections \
             after {IDLE_HOLD_TIMEOUT:?}"
        );
    }
    tokio::time::sleep(IDLE_SETTLE).await;
    let rss_idle_kib = rss_kib(pid)?;
    drop(held);
    if failed > 0 {
        eprintln!("bench: gateway: {failed} of {n} idle connections to {addr} failed");
    }
    Ok(Memory {
        idle_conns_opened: opened,
        rss_before_kib,
        rss_idle_kib,
        kib_per_conn: (rss_idle_kib as f64 - rss_before_kib as f64) / opened.max(1) as f64,
    })
}

/// Fills in latency added over the direct path at each rate.
fn add_overheads(results: &mut [PathResult]) {
    let Some(direct) = results.iter().find(|r| r.path == "direct").cloned() else {
        return;
    };
    for r in results.iter_mut() {
        for (p, d) in r.rates.iter_mut().zip(&direct.rates) {
            p.added_p50_ms = p.result.latency.p50_ms - d.result.latency.p50_ms;
            p.added_p99_ms = p.result.latency.p99_ms - d.result.latency.p99_ms;
        }
    }
}

/// The gateway against HAProxy in one round: new connections/s as a ratio, and per rate the
/// added p50 and p99 of both (each path's quantile minus the direct path's in the same round).
#[derive(Clone, Debug, PartialEq)]
struct RoundVerdict {
    new_conns_ratio: f64,
    /// Per rate: (gateway added p50, HAProxy added p50, gateway added p99, HAProxy added p99), ms.
    added: Vec<(f64, f64, f64, f64)>,
}

impl RoundVerdict {
    /// Whether the gateway is at or better than HAProxy on every figure of the round.
    fn gateway_at_or_better(&self) -> bool {
        self.new_conns_ratio >= 1.0
            && self
                .added
                .iter()
                .all(|&(g50, h50, g99, h99)| g50 <= h50 && g99 <= h99)
    }
}

/// The rounds compared, when the run has the direct path, the gateway and HAProxy.
fn round_verdicts(direct: &PerRound, gateway: &PerRound, haproxy: &PerRound) -> Vec<RoundVerdict> {
    let rounds = gateway.new_conns.len().min(haproxy.new_conns.len());
    (0..rounds)
        .map(|round| RoundVerdict {
            new_conns_ratio: gateway.new_conns[round].throughput_ops_s
                / haproxy.new_conns[round].throughput_ops_s,
            added: (direct.rates.iter().zip(&gateway.rates).zip(&haproxy.rates))
                .filter_map(|((d, g), h)| Some((d.get(round)?, g.get(round)?, h.get(round)?)))
                .map(|(d, g, h)| {
                    (
                        g.p50_ms - d.p50_ms,
                        h.p50_ms - d.p50_ms,
                        g.p99_ms - d.p99_ms,
                        h.p99_ms - d.p99_ms,
                    )
                })
                .collect(),
        })
        .collect()
}

impl GatewayOutcome {
    fn path(&self, name: &str) -> Option<&PathResult> {
        self.paths.iter().find(|p| p.path == name)
    }

    fn verdicts(&self) -> Vec<RoundVerdict> {
        match (
            self.path("direct"),
            self.path("gateway"),
            self.path("haproxy"),
        ) {
            (Some(d), Some(g), Some(h)) => round_verdicts(&d.per_round, &g.per_round, &h.per_round),
            _ => Vec::new(),
        }
    }

    fn round_headers(&self) -> Vec<String> {
        let mut headers = vec!["round".to_string(), "new conns/s gw/ha".to_string()];
        for rate in self
            .paths
            .first()
            .map(|p| p.rates.as_slice())
            .unwrap_or_default()
        {
            let r = rate.rate;
            headers.push(format!("added p50 @{r:.0} gw / ha ms"));
            headers.push(format!("added p99 @{r:.0} gw / ha ms"));
        }
        headers.push("gateway at or better".to_string());
        headers
    }

    fn round_rows(verdicts: &[RoundVerdict]) -> Vec<Vec<String>> {
        verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut row = vec![(i + 1).to_string(), format!("{:.3}", v.new_conns_ratio)];
                for &(g50, h50, g99, h99) in &v.added {
                    row.push(format!("{g50:+.3} / {h50:+.3}"));
                    row.push(format!("{g99:+.3} / {h99:+.3}"));
                }
                let yes = if v.gateway_at_or_better() {
                    "yes"
                } else {
                    "no"
                };
                row.push(yes.to_string());
                row
            })
            .collect()
    }

    /// The per-round comparison and how many rounds had the gateway at or better everywhere;
    /// empty without the three paths.
    fn rounds_text(&self, render: fn(&[&str], &[Vec<String>]) -> String) -> String {
        let verdicts = self.verdicts();
        if verdicts.is_empty() {
            return String::new();
        }
        let headers = self.round_headers();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let better = verdicts.iter().filter(|v| v.gateway_at_or_better()).count();
        format!(
            "Round by round, the gateway at or better than HAProxy on new connections/s and on every \
             added p50 and p99 in {better} of {} rounds:\n\n{}",
            verdicts.len(),
            render(&headers, &Self::round_rows(&verdicts))
        )
    }

    fn latency_rows(&self) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for p in &self.paths {
            for r in &p.rates {
                rows.push(vec![
                    p.path.clone(),
                    format!("{:.0}", r.rate),
                    format!("{:.3}", r.result.latency.p50_ms),
                    format!("{:.3}", r.result.latency.p99_ms),
                    format!("{:+.3}", r.added_p50_ms),
                    format!("{:+.3}", r.added_p99_ms),
                    r.result.errors.to_string(),
                ]);
            }
        }
        rows
    }

    fn capacity_rows(&self) -> Vec<Vec<String>> {
        self.paths
            .iter()
            .map(|p| {
                let mem = p.memory.as_ref();
                vec![
                    p.path.clone(),
                    format!("{:.0}", p.max_throughput.throughput_ops_s),
                    format!("{:.0}", p.new_conns.throughput_ops_s),
                    format!("{:.3}", p.new_conns.latency.p99_ms),
                    p.cpu_us_per_request
                        .map_or("-".into(), |us| format!("{us:.1}")),
                    p.cpu_us_per_conn
                        .map_or("-".into(), |us| format!("{us:.1}")),
                    mem.map_or("-".into(), |m| {
                        format!("{:.1}", m.rss_before_kib as f64 / 1024.0)
                    }),
                    mem.map_or("-".into(), |m| {
                        format!(
                            "{:.1} ({} conns)",
                            m.rss_idle_kib as f64 / 1024.0,
                            m.idle_conns_opened
                        )
                    }),
                    mem.map_or("-".into(), |m| format!("{:.2}", m.kib_per_conn)),
                    (p.max_throughput.errors + p.new_conns.errors).to_string(),
                ]
            })
            .collect()
    }

    fn cdf_plot(&self, dir: &Path, rate_index: usize) -> Result<String> {
        let series: Vec<Series> = self
            .paths
            .iter()
            .filter_map(|p| p.rates.get(rate_index).map(|r| (p, r)))
            .map(|(p, r)| Series {
                name: p.path.clone(),
                points: r
                    .result
                    .cdf
                    .iter()
                    .map(|c| (c.latency_ms, c.quantile))
                    .collect(),
            })
            .collect();
        let rate = self
            .paths
            .first()
            .and_then(|p| p.rates.get(rate_index))
            .map_or(0.0, |r| r.rate);
        let title = format!("HTTPS GET latency CDF at {rate:.0} req/s");
        let file = format!("gateway-cdf-{rate:.0}.svg");
        let chart = Chart {
            title: &title,
            x_label: "latency (ms)",
            y_label: "quantile",
            log_x: true,
            series: &series,
        };
        line_chart(&dir.join(&file), &chart)?;
        Ok(image(&title, &file))
    }
}

const LATENCY_HEADERS: [&str; 7] = [
    "path",
    "rate req/s",
    "p50 ms",
    "p99 ms",
    "added p50 ms",
    "added p99 ms",
    "errors",
];
const CAPACITY_HEADERS: [&str; 10] = [
    "path",
    "max req/s",
    "new conns/s",
    "new conn p99 ms",
    "CPU us/req",
    "CPU us/conn",
    "RSS MiB",
    "RSS MiB idle",
    "KiB/conn",
    "errors",
];

impl Outcome for GatewayOutcome {
    fn title(&self) -> String {
        "gateway: direct vs gateway vs HAProxy (TLS passthrough to nginx)".into()
    }

    fn text(&self) -> String {
        let skipped = if self.skipped.is_empty() {
            String::new()
        } else {
            format!("skipped: {:?}\n", self.skipped)
        };
        let rounds = self.rounds_text(text_table);
        let rounds = if rounds.is_empty() {
            rounds
        } else {
            format!("\n{rounds}")
        };
        format!(
            "gateway ({} rounds pooled, {} keep-alive conns, {} connect loops, {:.1}s runs, fd limit {})\n{skipped}{}\n{}{rounds}",
            self.rounds,
            self.conns,
            self.conn_clients,
            self.duration_s,
            self.fd_limit,
            text_table(&LATENCY_HEADERS, &self.latency_rows()),
            text_table(&CAPACITY_HEADERS, &self.capacity_rows())
        )
    }

    fn markdown(&self, dir: &Path) -> Result<String> {
        let mut md = format!(
            "nginx (1 worker) serves HTTPS on two loopback backends; HAProxy (`mode tcp`) and our gateway pass TLS \
             through. Open-loop keep-alive GETs over {} connections at fixed rates (latency from the intended send \
             time), closed-loop maximum throughput, {} connect+handshake+GET+close loops for new connections/s, \
             and proxy RSS while holding {} idle connections. Runs of {:.1} s in {} interleaved rounds (in a \
             round each load runs on every path back to back, the order of the paths rotated every round); \
             each figure pools the rounds: latency quantiles over all samples, throughput and CPU per \
             operation over all runs.\n\n",
            self.conns, self.conn_clients, self.idle_conns, self.duration_s, self.rounds
        );
        if !self.skipped.is_empty() {
            md.push_str(&format!("**Skipped on request:** {:?}\n\n", self.skipped));
        }
        md.push_str(&table(&LATENCY_HEADERS, &self.latency_rows()));
        md.push('\n');
        md.push_str(&table(&CAPACITY_HEADERS, &self.capacity_rows()));
        md.push('\n');
        let rounds = self.rounds_text(table);
        if !rounds.is_empty() {
            md.push_str(&rounds);
            md.push('\n');
        }
        let rates = self.paths.first().map_or(0, |p| p.rates.len());
        for i in 0..rates {
            md.push_str(&self.cdf_plot(dir, i)?);
        }
        Ok(md)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_mention_every_backend() {
        let b: Vec<SocketAddr> = vec![
            "127.0.70.2:8443".parse().unwrap(),
            "127.0.70.3:8443".parse().unwrap(),
        ];
        let n = nginx_conf(Path::new("/tmp/x"), &b, 20_000);
        assert!(n.contains("listen 127.0.70.2:8443 ssl;") && n.contains("daemon off;"));
        let h = haproxy_conf("127.0.70.1:6444".parse().unwrap(), &b, 9_000);
        assert!(h.contains("mode tcp") && h.contains("server b1 127.0.70.3:8443"));
        assert!(h.contains("maxconn 9000"));
        assert_eq!(idle_capacity(20_000), 9_500);
        assert_eq!(haproxy_maxconn(20_000), 9_750);
        assert_eq!(haproxy_maxconn(1_000_000), HAPROXY_MAX_MAXCONN);
    }

    #[test]
    fn every_round_runs_each_path_once_and_rotates_who_goes_first() {
        let orders: Vec<Vec<usize>> = (0..4).map(|r| round_order(r, 3).collect()).collect();
        assert_eq!(orders, [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]);
        assert_eq!(round_order(5, 1).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn a_round_runs_each_load_on_every_path_before_the_next_load() {
        let plan = Plan {
            rounds: 1,
            rates: vec![1000.0, 4000.0],
            conns: 1,
            conn_clients: 1,
            duration: Duration::from_secs(1),
            idle_conns: 1,
            progress: false,
        };
        assert_eq!(
            Load::all(&plan),
            [Load::Rate(0), Load::Rate(1), Load::Max, Load::NewConns]
        );
    }

    fn figures(throughput_ops_s: f64, p50_ms: f64, p99_ms: f64) -> RoundFigures {
        RoundFigures {
            throughput_ops_s,
            p50_ms,
            p99_ms,
        }
    }

    /// One rate; each path's (new conns/s, p50, p99) per round.
    fn per_round(rounds: &[(f64, f64, f64)]) -> PerRound {
        PerRound {
            rates: vec![rounds
                .iter()
                .map(|&(_, p50, p99)| figures(0.0, p50, p99))
                .collect()],
            new_conns: rounds
                .iter()
                .map(|&(c, _, _)| figures(c, 0.0, 0.0))
                .collect(),
        }
    }

    #[test]
    fn rounds_compare_added_latency_against_the_same_rounds_direct_path() {
        let direct = per_round(&[(4000.0, 0.25, 1.0), (4000.0, 0.30, 3.0)]);
        // Round 1: more connections, lower added p50 and p99: at or better.
        // Round 2: equal connections and p50, but the added p99 1 ms above HAProxy's.
        let gateway = per_round(&[(3100.0, 0.33, 1.5), (3000.0, 0.40, 5.0)]);
        let haproxy = per_round(&[(3000.0, 0.35, 2.0), (3000.0, 0.40, 4.0)]);
        let verdicts = round_verdicts(&direct, &gateway, &haproxy);
        assert_eq!(verdicts.len(), 2);
        let (g50, h50, g99, h99) = verdicts[0].added[0];
        assert!((g50 - 0.08).abs() < 1e-9 && (h50 - 0.10).abs() < 1e-9);
        assert!((g99 - 0.5).abs() < 1e-9 && (h99 - 1.0).abs() < 1e-9);
        assert!((verdicts[0].new_conns_ratio - 3100.0 / 3000.0).abs() < 1e-9);
        assert!(verdicts[0].gateway_at_or_better());
        assert!((verdicts[1].new_conns_ratio - 1.0).abs() < 1e-9);
        assert!(
            !verdicts[1].gateway_at_or_better(),
            "p99 +2.0 against +1.0 ms"
        );
    }

    #[test]
    fn pooled_runs_keep_each_rounds_figures() {
        let mut runs = PooledRuns::new();
        for millis in [1, 3] {
            let mut recorder = Recorder::new();
            for _ in 0..100 {
                recorder.record(Duration::from_millis(millis));
            }
            let figures = runs.add(&recorder, Duration::from_secs(1), 0.0);
            assert_eq!(runs.rounds.last(), Some(&figures));
        }
        assert_eq!(runs.rounds.len(), 2);
        assert!((runs.rounds[0].throughput_ops_s - 100.0).abs() < 1e-9);
        assert!(runs.rounds[0].p50_ms < 1.1 && runs.rounds[1].p50_ms > 2.9);
    }

    #[test]
    fn pooled_runs_add_operations_time_and_cpu() {
        let mut runs = PooledRuns::new();
        let mut first = Recorder::new();
        for _ in 0..300 {
            first.record(Duration::from_micros(500));
        }
        let mut second = Recorder::new();
        for _ in 0..100 {
            second.record(Duration::from_millis(2));
        }
        second.error("reset");
        runs.add(&first, Duration::from_secs(1), 0.03);
        runs.add(&second, Duration::from_secs(1), 0.01);
        let result = runs.result("request");
        assert_eq!((result.ok, result.errors), (400, 1));
        assert!((result.throughput_ops_s - 200.0).abs() < 1e-9);
        // Three quarters of the samples took 0.5 ms, so the median is the first run's.
        assert!((result.latency.p50_ms - 0.5).abs() < 0.01, "{result:?}");
        assert!((result.latency.p99_ms - 2.0).abs() < 0.01, "{result:?}");
        assert_eq!(runs.cpu_us_per_op(false), None);
        let us = runs.cpu_us_per_op(true).expect("proxied");
        assert!((us - 100.0).abs() < 1e-9, "{us}");
    }
}

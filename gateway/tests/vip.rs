//! The virtual IP, for real: three "nodes" (network namespaces on one bridge, from the
//! harness's `netns` topology), each running a store member (kubeadm's stacked topology), an
//! nginx backend answering its node's name, and a gateway competing for the VIP through the
//! store. The test process, on the bridge's root side, is the client: it connects to
//! `VIP:6443` and reads which node answered.
//!
//! Faults on the holder, one after the other: SIGKILL of its gateway, SIGSTOP of it, cutting
//! its links to the other nodes (blackhole routes: its store member loses the quorum, the
//! client still reaches it), and SIGKILL of its only backend (the gateway must give the VIP
//! up and resign). After each:
//!
//! * a new connection through the VIP is answered by another node within the takeover bound
//!   derived from the configured lease TTL;
//! * never do two namespaces hold the VIP at once: a sampler reads `ip addr` of every node
//!   every [`SAMPLE_INTERVAL`] through the whole fault (an address on the interface is what
//!   makes the kernel answer ARP for it, so this is "never two answer ARP"). With SIGKILL and
//!   SIGSTOP the holder cannot remove the address itself: the kernel does, when the lifetime
//!   the gateway gave it ends, before the store can elect anyone else (`gateway::vip::fence`).
//!
//! Before the faults, each test checks that the holder's announcement reaches the client: the
//! client's neighbour entry for the VIP (made by its first connection) points to the holder's
//! MAC; the holder's gateway is killed, and with no traffic from the client the entry must
//! change to the successor's MAC, which only the successor's gratuitous ARP (IPv4) or
//! unsolicited neighbour advertisement (IPv6) can do. The IPv6 test runs the same lab with an
//! IPv6 VIP (`fd0a:...::100/128`) and the kill and pause faults.
//!
//! `keepalived_takeover_in_the_same_namespaces` runs keepalived (VRRP, advert_int 1 s) in the
//! same kind of setup and measures its takeover after SIGKILL and SIGSTOP of the master's VRRP
//! process, and how long the old master keeps the address (it cannot remove it), for the
//! comparison in the README.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use integration_tests::netns::Topology;
use integration_tests::{Binary, Cluster, ClusterConfig, Process};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{NGINX, POLL_INTERVAL, STARTUP_DEADLINE};

/// Gateways (and store members, and backends): one per node.
const NODES: usize = 3;
/// The election's lease TTL: the minimum the gateway accepts, for a short test.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// Last byte of the VIP in the topology's /24.
const VIP_HOST: u8 = 100;
/// The gateways' frontend port on the VIP.
const FRONTEND_PORT: u16 = 6443;
/// Each node's nginx port (on the node's own address).
const BACKEND_PORT: u16 = 8080;
/// Each gateway's admin port (on the node's own address).
const ADMIN_PORT: u16 = 9100;
/// The VIP's interface in every node namespace (the harness's name).
const INTERFACE: &str = "eth0";
/// Period of the address sampler: far below the fencing margins (hundreds of milliseconds)
/// by which the design keeps holders apart, so an overlap would be seen.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// Connect deadline of one probe through the VIP: a reachable holder answers in
/// milliseconds; a VIP nobody holds makes the connect hang on ARP.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// Deadline of one probe's HTTP exchange after the connect.
const PROBE_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1);
/// Period of the probes while waiting for a takeover.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// The store's lease expiry check period (etcd checks expired leases every 500 ms).
const STORE_EXPIRY_CHECK: Duration = Duration::from_millis(500);
/// Room for a loaded two-core CI machine: process scheduling, `ip` commands, the watch
/// notification and the first probe that gets through.
const TAKEOVER_SLACK: Duration = Duration::from_secs(3);
/// The gateways' check interval of their backend.
const CHECK_INTERVAL: Duration = Duration::from_millis(200);
/// Failed checks that mark a backend down.
const CHECK_FALL: u32 = 2;
/// The store's election timeout (the harness's default, etcd's 1 s).
const STORE_ELECTION_TIMEOUT: Duration = Duration::from_secs(1);
/// Fewest address samples one fault must yield for the no-overlap check to mean something.
const MIN_SAMPLES: usize = 20;
/// Largest gap allowed between two address samples: below the half-second fence margin that
/// separates holders, so an overlap cannot hide between samples.
const MAX_SAMPLE_GAP: Duration = Duration::from_millis(500);
/// How long sampling goes on after the old holder is back as a candidate: it must not take
/// the VIP back (a resumed or restarted gateway).
const SAMPLE_TAIL: Duration = Duration::from_secs(1);
/// keepalived's advertisement interval in the comparison.
const KEEPALIVED_ADVERT: Duration = Duration::from_secs(1);

/// Takeover bound after the holder dies or stops: its key lives one TTL after its last
/// keep-alive, the store notices the expiry within its check period.
fn takeover_bound_after_holder_loss() -> Duration {
    LEASE_TTL + STORE_EXPIRY_CHECK + TAKEOVER_SLACK
}

/// Takeover bound after cutting the holder's links: if its store member led the store, the
/// others first elect a leader, which renews every lease for a full TTL.
fn takeover_bound_after_cut() -> Duration {
    LEASE_TTL * 2 + STORE_ELECTION_TIMEOUT * 2 + STORE_EXPIRY_CHECK + TAKEOVER_SLACK
}

/// Takeover bound after the holder's backend dies: the checks mark it down (`fall` failed
/// checks), the controller sees it at its next health poll, releases and resigns, and the next
/// candidate is told by its watch at once.
fn takeover_bound_after_backend_loss() -> Duration {
    CHECK_INTERVAL * CHECK_FALL + gateway::vip::controller::HEALTH_POLL_INTERVAL + TAKEOVER_SLACK
}

/// keepalived's bound: a backup declares the master down after 3 adverts plus its skew time
/// (under one advert), then takes over.
fn keepalived_takeover_bound() -> Duration {
    KEEPALIVED_ADVERT * 4 + TAKEOVER_SLACK
}

/// The VIP in `topology`'s subnet.
fn vip_of(topology: &Topology) -> Ipv4Addr {
    let [a, b, c, _] = topology.ip(0).octets();
    Ipv4Addr::new(a, b, c, VIP_HOST)
}

/// The VIP of the IP version asked for, in `topology`'s subnets.
fn vip_of_version(topology: &Topology, ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(topology.ipv6_host(u16::from(VIP_HOST)))
    } else {
        IpAddr::V4(vip_of(topology))
    }
}

/// The VIP's prefix length as the gateways add it: one address.
fn host_prefix(vip: IpAddr) -> u8 {
    if vip.is_ipv4() {
        32
    } else {
        128
    }
}

/// `ip`'s family flag for `vip`.
fn family(vip: IpAddr) -> &'static str {
    if vip.is_ipv4() {
        "-4"
    } else {
        "-6"
    }
}

/// Whether the interface in `namespace` holds `vip` now (`ip -o addr show` lists it); an error
/// when `ip` cannot be run.
fn holds_vip(namespace: &str, vip: IpAddr) -> std::io::Result<bool> {
    let needle = format!(" {vip}/{} ", host_prefix(vip));
    let output = Command::new("ip")
        .args([
            "-n",
            namespace,
            family(vip),
            "-o",
            "addr",
            "show",
            "dev",
            INTERFACE,
        ])
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout).contains(&needle))
}

/// The nodes of `topology` whose interface holds `vip` now.
fn holders(topology: &Topology, vip: impl Into<IpAddr>) -> Vec<usize> {
    let vip = vip.into();
    (0..NODES)
        .filter(|&i| holds_vip(topology.namespace(i), vip).expect("run ip addr show"))
        .collect()
}

/// Node `i`'s MAC address on its bridge interface, as `ip` prints it (read with the gateway's
/// own parser of `ip -o link show`).
fn node_mac(topology: &Topology, i: usize) -> String {
    let output = Command::new("ip")
        .args([
            "-n",
            topology.namespace(i),
            "-o",
            "link",
            "show",
            "dev",
            INTERFACE,
        ])
        .output()
        .expect("run ip link show");
    let identity = gateway::vip::address::parse_link_line(&String::from_utf8_lossy(&output.stdout))
        .expect("an Ethernet interface");
    let bytes: Vec<String> = identity.mac.iter().map(|b| format!("{b:02x}")).collect();
    bytes.join(":")
}

/// The MAC address the test process's neighbour table holds for `vip`, if any.
fn client_neighbour_mac(topology: &Topology, vip: IpAddr) -> Option<String> {
    let output = Command::new("ip")
        .args([family(vip), "neigh", "show", &vip.to_string()])
        .args(["dev", topology.client_interface()])
        .output()
        .expect("run ip neigh show");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.find(|word| *word == "lladdr")?;
    words.next().map(str::to_string)
}

/// Asks the node behind the VIP for its name: `Some(node index)` when one answered.
async fn probe(vip: impl Into<IpAddr>) -> Option<usize> {
    let vip = vip.into();
    let address = (vip, FRONTEND_PORT);
    let mut stream = tokio::time::timeout(PROBE_CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .ok()?
        .ok()?;
    let exchange = async {
        stream
            .write_all(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(PROBE_EXCHANGE_TIMEOUT, exchange)
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&answer);
    let name = text.lines().last()?.trim().strip_prefix("node")?;
    name.parse().ok()
}

/// Reads every node's addresses every [`SAMPLE_INTERVAL`] in a thread of its own.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, Vec<usize>)>>,
}

impl Sampler {
    fn start(topology: &Topology, vip: impl Into<IpAddr>) -> Sampler {
        let vip = vip.into();
        let namespaces: Vec<String> = (0..NODES)
            .map(|i| topology.namespace(i).to_string())
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let at = Instant::now();
                let held: Vec<usize> = namespaces
                    .iter()
                    .enumerate()
                    .filter(|(_, ns)| holds_vip(ns, vip).unwrap_or(false))
                    .map(|(i, _)| i)
                    .collect();
                samples.push((at, held));
                std::thread::sleep(SAMPLE_INTERVAL);
            }
            samples
        });
        Sampler { stop, thread }
    }

    /// Stops sampling; returns (time, holders) samples.
    fn finish(self) -> Vec<(Instant, Vec<usize>)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler thread")
    }
}

/// The longest stretch during which two or more nodes held the VIP, measured from the first
/// sample that saw two to the next sample that did not (zero if no sample saw two).
fn longest_overlap(samples: &[(Instant, Vec<usize>)]) -> Duration {
    let mut longest = Duration::ZERO;
    let mut began: Option<Instant> = None;
    for (at, held) in samples {
        if held.len() > 1 {
            began.get_or_insert(*at);
        } else if let Some(start) = began.take() {
            longest = longest.max(at.duration_since(start));
        }
    }
    if let (Some(start), Some((last, _))) = (began, samples.last()) {
        longest = longest.max(last.duration_since(start).max(SAMPLE_INTERVAL));
    }
    longest
}

/// One node's nginx, answering `node<i>` on its own address.
fn start_nginx(topology: &Topology, i: usize, dir: &Path) -> Process {
    assert!(
        Path::new(NGINX).exists(),
        "{NGINX} not found: run scripts/setup.sh"
    );
    let node_dir = dir.join(format!("nginx{i}"));
    std::fs::create_dir_all(&node_dir).expect("nginx directory");
    let d = node_dir.display();
    let listen = format!("{}:{BACKEND_PORT}", topology.ip(i));
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
         http {{ access_log off; default_type text/plain; client_body_temp_path {d}/body;\n\
         proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi;\n\
         scgi_temp_path {d}/scgi;\n\
         server {{ listen {listen}; location / {{ return 200 \"node{i}\\n\"; }} }} }}\n"
    );
    let conf_path = node_dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("write nginx.conf");
    let mut command = topology.command(i, Path::new(NGINX));
    command.arg("-c").arg(&conf_path).arg("-p").arg(&node_dir);
    Process::spawn(
        &format!("nginx{i}"),
        command,
        &dir.join(format!("nginx{i}.log")),
    )
    .expect("start nginx")
}

/// Node `i`'s gateway: frontend on `listen`, its local nginx as the only backend, plus `extra`
/// flags.
fn start_gateway(
    topology: &Topology,
    i: usize,
    dir: &Path,
    listen: &str,
    extra: &[String],
    start: u32,
) -> Process {
    let mut command = topology.command(i, Path::new(env!("CARGO_BIN_EXE_gateway")));
    command
        .args(["--listen", listen])
        .args(["--backend", &format!("{}:{BACKEND_PORT}", topology.ip(i))])
        .args([
            "--check",
            "http:/",
            "--check-interval",
            "200ms",
            "--fall",
            "2",
            "--rise",
            "1",
        ])
        .args(["--admin", &format!("{}:{ADMIN_PORT}", topology.ip(i))])
        .args(extra)
        .env("GATEWAY_LOG", "info,gateway::vip=debug");
    Process::spawn_numbered(
        &format!("gateway{i}"),
        start,
        command,
        &dir.join(format!("gateway{i}.log")),
    )
    .expect("start the gateway")
}

/// Sends `signal` to `process` (by its pid).
fn signal(process: &Process, signal: i32) {
    let pid = process.pid().expect("the process runs");
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(
        result,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// Polls until exactly one node holds the VIP and a probe through it reaches that node.
async fn wait_single_holder(
    topology: &Topology,
    vip: impl Into<IpAddr>,
    deadline: Duration,
) -> usize {
    let vip = vip.into();
    let start = Instant::now();
    loop {
        let held = holders(topology, vip);
        if let [holder] = held[..] {
            if probe(vip).await == Some(holder) {
                return holder;
            }
        }
        assert!(
            start.elapsed() < deadline,
            "no single VIP holder after {deadline:?} (holders {held:?})"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Probes until a node other than `old` answers through the VIP; returns it and the time taken.
async fn wait_takeover(
    vip: impl Into<IpAddr>,
    old: usize,
    since: Instant,
    deadline: Duration,
) -> (usize, Duration) {
    let vip = vip.into();
    loop {
        if let Some(node) = probe(vip).await.filter(|&node| node != old) {
            return (node, since.elapsed());
        }
        assert!(
            since.elapsed() < deadline,
            "no takeover from node {old} within {deadline:?}"
        );
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Pause,
    Cut,
    /// The holder's only backend dies: its gateway must release the VIP and resign.
    BackendDown,
}

/// The stacked lab: store members, nginx and gateways in three namespaces.
struct Lab {
    // Dropped in order: gateways and nginx first, then the store cluster and its namespaces.
    gateways: Vec<Option<Process>>,
    starts: Vec<u32>,
    nginx: Vec<Process>,
    cluster: Cluster,
    dir: TempDir,
    vip: IpAddr,
}

impl Lab {
    /// The lab with an IPv4 VIP, or an IPv6 one.
    async fn start(ipv6: bool) -> Lab {
        let binary = Binary::candidate().expect("the store binary (cargo build --release)");
        let mut config = ClusterConfig::new(NODES);
        config.namespaces = true;
        let cluster = Cluster::start(binary, config)
            .await
            .expect("a 3-member store in namespaces");
        let dir = tempfile::Builder::new()
            .prefix("gateway-vip-")
            .tempdir()
            .expect("temp dir");
        let topology = cluster.network().expect("namespaces");
        let vip = vip_of_version(topology, ipv6);
        let nginx = (0..NODES)
            .map(|i| start_nginx(topology, i, dir.path()))
            .collect();
        let mut lab = Lab {
            gateways: (0..NODES).map(|_| None).collect(),
            starts: vec![0; NODES],
            nginx,
            cluster,
            dir,
            vip,
        };
        for i in 0..NODES {
            lab.start_gateway(i);
        }
        lab
    }

    fn topology(&self) -> &Topology {
        self.cluster.network().expect("namespaces")
    }

    fn start_gateway(&mut self, i: usize) {
        self.starts[i] += 1;
        let endpoints: Vec<String> = (0..NODES)
            .map(|n| format!("{}:2379", self.topology().ip(n)))
            .collect();
        let extra = [
            "--vip".to_string(),
            format!("{}/{}", self.vip, host_prefix(self.vip)),
            "--vip-interface".to_string(),
            INTERFACE.to_string(),
            "--vip-election".to_string(),
            format!("etcd://{}", endpoints.join(",")),
            "--vip-lease-ttl".to_string(),
            format!("{}s", LEASE_TTL.as_secs()),
            "--vip-name".to_string(),
            format!("node{i}"),
        ];
        let listen = SocketAddr::new(self.vip, FRONTEND_PORT).to_string();
        let process = start_gateway(
            self.topology(),
            i,
            self.dir.path(),
            &listen,
            &extra,
            self.starts[i],
        );
        self.gateways[i] = Some(process);
    }

    fn gateway(&self, i: usize) -> &Process {
        self.gateways[i].as_ref().expect("the gateway runs")
    }

    /// The state of node `i`'s VIP controller, from its admin API.
    async fn vip_state(&self, i: usize) -> Option<String> {
        let admin = std::net::SocketAddr::from((self.topology().ip(i), ADMIN_PORT));
        let (code, body) = crate::common::http_get(admin, "/api/vip").await.ok()?;
        if code != 200 {
            return None;
        }
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["state"].as_str().map(str::to_string)
    }

    async fn wait_candidate(&self, i: usize) {
        let start = Instant::now();
        while self.vip_state(i).await.as_deref() != Some("candidate") {
            assert!(
                start.elapsed() < STARTUP_DEADLINE,
                "gateway {i} did not become a candidate again:\n{}",
                self.gateway(i).log_tail()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn inject(&mut self, fault: Fault, holder: usize) {
        match fault {
            Fault::Kill => self.gateways[holder]
                .take()
                .expect("runs")
                .kill()
                .expect("SIGKILL"),
            Fault::Pause => signal(self.gateway(holder), libc::SIGSTOP),
            Fault::Cut => self
                .topology()
                .isolate(holder)
                .expect("cut the holder's links"),
            Fault::BackendDown => self.nginx[holder].kill().expect("SIGKILL nginx"),
        }
    }

    fn recover(&mut self, fault: Fault, holder: usize) {
        match fault {
            Fault::Kill => self.start_gateway(holder),
            Fault::Pause => signal(self.gateway(holder), libc::SIGCONT),
            Fault::Cut => self.topology().heal_all().expect("heal the links"),
            Fault::BackendDown => {
                self.nginx[holder] = start_nginx(self.topology(), holder, self.dir.path())
            }
        }
    }
}

/// What one fault showed.
struct Outcome {
    fault: Fault,
    takeover: Duration,
    samples: usize,
    overlap: Duration,
}

async fn run_fault(lab: &mut Lab, fault: Fault, bound: Duration) -> Outcome {
    let vip = lab.vip;
    let holder = wait_single_holder(lab.topology(), vip, STARTUP_DEADLINE).await;
    let sampler = Sampler::start(lab.topology(), vip);
    let since = Instant::now();
    lab.inject(fault, holder);
    let (successor, takeover) = wait_takeover(vip, holder, since, bound).await;
    lab.recover(fault, holder);
    // The old holder comes back as a candidate, and the successor keeps the VIP meanwhile.
    lab.wait_candidate(holder).await;
    tokio::time::sleep(SAMPLE_TAIL).await;
    let samples = sampler.finish();
    let gap = samples
        .windows(2)
        .map(|pair| pair[1].0.duration_since(pair[0].0))
        .max()
        .unwrap_or_default();
    assert!(
        gap <= MAX_SAMPLE_GAP,
        "{fault:?}: address samples {gap:?} apart"
    );
    let overlap = longest_overlap(&samples);
    // The successor usually keeps the VIP; after a healed cut the store may change leaders for
    // longer than the fence allows, and then the successor rightly lets the VIP go for a moment.
    // Either way, one node serves through the VIP again.
    let _ = successor;
    wait_single_holder(lab.topology(), vip, STARTUP_DEADLINE).await;
    Outcome {
        fault,
        takeover,
        samples: samples.len(),
        overlap,
    }
}

/// Kills the holder's gateway and waits, sending nothing to the VIP, until the client's
/// neighbour entry for the VIP holds the successor's MAC address: only the successor's
/// announcement changes it. Restarts the killed gateway; returns the time the entry took.
async fn announcement_reaches_the_client(lab: &mut Lab) -> Duration {
    let vip = lab.vip;
    let holder = wait_single_holder(lab.topology(), vip, STARTUP_DEADLINE).await;
    let old_mac = node_mac(lab.topology(), holder);
    assert_eq!(
        client_neighbour_mac(lab.topology(), vip).as_deref(),
        Some(old_mac.as_str()),
        "the client's probes resolved the VIP to its holder"
    );
    let since = Instant::now();
    lab.inject(Fault::Kill, holder);
    let bound = takeover_bound_after_holder_loss();
    let (successor, took) = loop {
        let seen = client_neighbour_mac(lab.topology(), vip);
        if let Some(mac) = seen.filter(|mac| *mac != old_mac) {
            let successor = (0..NODES)
                .find(|&i| node_mac(lab.topology(), i) == mac)
                .unwrap_or_else(|| panic!("the VIP was announced at {mac}, no node's MAC"));
            break (successor, since.elapsed());
        }
        assert!(
            since.elapsed() < bound,
            "the client still sends the VIP to node {holder} ({old_mac}) after {bound:?}: no \
             announcement reached it (holders now {:?})",
            holders(lab.topology(), vip)
        );
        tokio::time::sleep(PROBE_INTERVAL).await;
    };
    assert_eq!(holders(lab.topology(), vip), [successor]);
    lab.recover(Fault::Kill, holder);
    lab.wait_candidate(holder).await;
    eprintln!(
        "gateway VIP {vip}: the client's neighbour entry moved from node {holder} to node \
         {successor} {} ms after the kill, without traffic",
        took.as_millis()
    );
    took
}

/// Runs `faults` on `lab` one after the other and checks every outcome.
async fn faults_without_overlap(lab: &mut Lab, faults: &[(Fault, Duration)]) {
    let mut outcomes = Vec::new();
    for &(fault, bound) in faults {
        let outcome = run_fault(lab, fault, bound).await;
        eprintln!(
            "gateway VIP {}, {:?}: takeover {} ms (bound {} ms), {} address samples, longest overlap {} ms",
            lab.vip,
            outcome.fault,
            outcome.takeover.as_millis(),
            bound.as_millis(),
            outcome.samples,
            outcome.overlap.as_millis()
        );
        outcomes.push(outcome);
    }
    for outcome in &outcomes {
        assert!(
            outcome.samples >= MIN_SAMPLES,
            "{:?}: only {} samples",
            outcome.fault,
            outcome.samples
        );
        assert!(
            outcome.overlap.is_zero(),
            "{:?}: two nodes held the VIP for {:?}",
            outcome.fault,
            outcome.overlap
        );
    }
}

/// A lab with an IPv4 or IPv6 VIP: the announcement check, then `faults`.
async fn lab_run(ipv6: bool, faults: &[Fault]) {
    let mut lab = Lab::start(ipv6).await;
    announcement_reaches_the_client(&mut lab).await;
    let bounded: Vec<(Fault, Duration)> = faults
        .iter()
        .map(|&fault| {
            let bound = match fault {
                Fault::Kill | Fault::Pause => takeover_bound_after_holder_loss(),
                Fault::Cut => takeover_bound_after_cut(),
                Fault::BackendDown => takeover_bound_after_backend_loss(),
            };
            (fault, bound)
        })
        .collect();
    faults_without_overlap(&mut lab, &bounded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vip_moves_on_kill_pause_cut_and_backend_loss_without_overlap() {
    let faults = [Fault::Kill, Fault::Pause, Fault::Cut, Fault::BackendDown];
    lab_run(false, &faults).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_vip_is_announced_and_moves_on_kill_and_pause_without_overlap() {
    lab_run(true, &[Fault::Kill, Fault::Pause]).await;
}

/// keepalived's configuration for node `i` (priorities 100, 99, 98; node 0 starts as master).
fn keepalived_conf(i: usize, vip: Ipv4Addr, router_id: u8) -> String {
    format!(
        "global_defs {{\n  router_id node{i}\n}}\n\
         vrrp_instance VI_1 {{\n  state BACKUP\n  interface {INTERFACE}\n  virtual_router_id {router_id}\n\
         \x20 priority {}\n  advert_int {}\n  virtual_ipaddress {{\n    {vip}/32 dev {INTERFACE}\n  }}\n}}\n",
        100 - i,
        KEEPALIVED_ADVERT.as_secs()
    )
}

/// keepalived's VRRP child process pid, from its pid file.
async fn vrrp_pid(path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            start.elapsed() < STARTUP_DEADLINE,
            "no VRRP pid in {}",
            path.display()
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn signal_pid(pid: i32, signal: i32) {
    // SAFETY: kill(2) on the VRRP process of a keepalived this test started (it still runs).
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        result,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalived_takeover_in_the_same_namespaces() {
    let keepalived = PathBuf::from("/usr/sbin/keepalived");
    assert!(
        keepalived.exists(),
        "{} not found: run scripts/setup.sh",
        keepalived.display()
    );
    let topology = Topology::create(NODES).expect("namespaces");
    let vip = vip_of(&topology);
    let dir = tempfile::Builder::new()
        .prefix("gateway-keepalived-")
        .tempdir()
        .expect("temp dir");
    let _nginx: Vec<Process> = (0..NODES)
        .map(|i| start_nginx(&topology, i, dir.path()))
        .collect();
    // HAProxy's place: a gateway without a VIP on every node, listening on all addresses.
    let _gateways: Vec<Process> = (0..NODES)
        .map(|i| {
            start_gateway(
                &topology,
                i,
                dir.path(),
                &format!("0.0.0.0:{FRONTEND_PORT}"),
                &[],
                1,
            )
        })
        .collect();
    // A router id per test process, so concurrent runs on one bridge-less host never mix.
    let router_id = (std::process::id() % 250 + 1) as u8;
    let mut daemons = Vec::new();
    let mut vrrp_pids = Vec::new();
    for i in 0..NODES {
        let conf = dir.path().join(format!("keepalived{i}.conf"));
        std::fs::write(&conf, keepalived_conf(i, vip, router_id)).expect("write keepalived.conf");
        let pid_file = |kind: &str| dir.path().join(format!("keepalived{i}-{kind}.pid"));
        let mut command = topology.command(i, &keepalived);
        command
            .args([
                "--dont-fork",
                "--log-console",
                "--log-detail",
                "--no-syslog",
                "--vrrp",
                "--dont-respawn",
            ])
            .arg("--use-file")
            .arg(&conf)
            .arg("--pid")
            .arg(pid_file("main"))
            .arg("--vrrp_pid")
            .arg(pid_file("vrrp"));
        let log = dir.path().join(format!("keepalived{i}.log"));
        daemons.push(
            Process::spawn(&format!("keepalived{i}"), command, &log).expect("start keepalived"),
        );
        vrrp_pids.push(vrrp_pid(&pid_file("vrrp")).await);
    }
    let bound = keepalived_takeover_bound();
    for (name, signal) in [("SIGSTOP", libc::SIGSTOP), ("SIGKILL", libc::SIGKILL)] {
        let holder = wait_single_holder(&topology, vip, STARTUP_DEADLINE).await;
        let sampler = Sampler::start(&topology, vip);
        let since = Instant::now();
        signal_pid(vrrp_pids[holder], signal);
        let (_, takeover) = wait_takeover(vip, holder, since, bound).await;
        // What the old master does with its address meanwhile, over one more second.
        tokio::time::sleep(KEEPALIVED_ADVERT).await;
        let samples = sampler.finish();
        let overlap = longest_overlap(&samples);
        eprintln!(
            "keepalived, {name} of the master's VRRP process: takeover {} ms (bound {} ms), \
             {} address samples, longest overlap {} ms (the stopped or killed master keeps the VIP)",
            takeover.as_millis(),
            bound.as_millis(),
            samples.len(),
            overlap.as_millis()
        );
        if signal == libc::SIGSTOP {
            signal_pid(vrrp_pids[holder], libc::SIGCONT);
            // The resumed master hears a master of its own or lower priority and may take the
            // VIP back; wait until one holder remains.
            wait_single_holder(&topology, vip, STARTUP_DEADLINE).await;
        } else {
            // Nobody removes a killed master's VIP: do it so the namespaces go cleanly.
            let _ = Command::new("ip")
                .args([
                    "-n",
                    topology.namespace(holder),
                    "addr",
                    "del",
                    &format!("{vip}/32"),
                    "dev",
                    INTERFACE,
                ])
                .status();
        }
    }
    drop(daemons);
}

#[test]
fn overlaps_are_measured_between_samples() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let single = vec![(at(0), vec![0]), (at(20), vec![]), (at(40), vec![1])];
    assert_eq!(longest_overlap(&single), Duration::ZERO);
    let overlapping = vec![
        (at(0), vec![0]),
        (at(20), vec![0, 1]),
        (at(40), vec![0, 1]),
        (at(60), vec![1]),
    ];
    assert_eq!(longest_overlap(&overlapping), Duration::from_millis(40));
    let at_the_end = vec![(at(0), vec![0]), (at(20), vec![0, 1])];
    assert_eq!(longest_overlap(&at_the_end), SAMPLE_INTERVAL);
}

//! Multi-process clusters of any server that accepts etcd's flags.
//!
//! [`Cluster::start`] launches `size` members (1, 3 or 5) as child processes,
//! each on its own loopback address ([`crate::net`]) with the standard client
//! and peer ports, a data directory inside one temporary directory, and its
//! stdout/stderr appended to `m<i>.log` next to it. It returns once every
//! member reports a leader and serves a linearizable read.
//!
//! Fault injection works on real processes: [`Cluster::kill`] sends SIGKILL
//! and reaps the child; [`Cluster::restart`] starts the member again with
//! exactly the flags it was first started with (same data directory,
//! `--initial-cluster-state new`), as an operator restarting etcd does.
//!
//! Dropping the cluster SIGKILLs and reaps every member, also while a test
//! panics (the panic's unwinding runs the drop), so no server outlives its
//! test. During a panic the tail of every member's log is printed first.
//! Set `IT_KEEP_DATA=1` to keep the temporary directory for inspection.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions, StatusResponse};
use tempfile::TempDir;

use crate::binary::Binary;
use crate::client::{check_serving, connect};
use crate::disk::SmallDisk;
use crate::net::{allocate_ip, client_url, metrics_url, peer_url};
use crate::netns::Topology;
use crate::process::{signal, tail, Process};
use crate::relay::{Endpoint, Relay};
use crate::wait::{permanent, retry_until};

/// Deadline for a whole cluster (or a restarted member) to become healthy.
/// Generous: a loaded 2-core machine may run several clusters at once.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for the running members to agree on a leader.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--heartbeat-interval` (etcd's default).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
/// Default `--election-timeout` (etcd's default).
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(1000);
/// Lines of each member's log printed when a test fails.
pub const LOG_TAIL_LINES: usize = crate::process::LOG_TAIL_LINES;
/// Membership changes that etcd rejects before proposing anything (it
/// refuses reconfiguration until every voter has been connected for a
/// while), so retrying them is safe.
pub const TRANSIENT_RECONFIG_ERRORS: [&str; 2] = [
    "etcdserver: unhealthy cluster",
    "etcdserver: re-configuration failed due to not enough started members",
];
/// Cluster sizes the harness supports.
pub const SUPPORTED_SIZES: [usize; 3] = [1, 3, 5];

static NEXT_CLUSTER: AtomicU32 = AtomicU32::new(0);

/// How to start a cluster. Every field maps to an etcd flag.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of members: 1, 3 or 5.
    pub size: usize,
    /// `--snapshot-count`, if set.
    pub snapshot_count: Option<u64>,
    /// `--heartbeat-interval` (sent in milliseconds).
    pub heartbeat_interval: Duration,
    /// `--election-timeout` (sent in milliseconds).
    pub election_timeout: Duration,
    /// `--quota-backend-bytes`, if set.
    pub quota_backend_bytes: Option<u64>,
    /// `--max-request-bytes`, if set.
    pub max_request_bytes: Option<u64>,
    /// `--log-level`.
    pub log_level: String,
    /// `--listen-metrics-urls=http://<member's address>:2381` on every
    /// member ([`Cluster::metrics_url`]).
    pub metrics: bool,
    /// Run every member in a network namespace of its own
    /// ([`crate::netns`]), so that links between members can be cut
    /// ([`Cluster::network`]) and delayed (their peer traffic passes through
    /// [`Cluster::relay`]). Otherwise members share the loopback interface.
    pub namespaces: bool,
    /// More flags, given to every member after the ones above.
    pub extra_args: Vec<String>,
}

impl ClusterConfig {
    /// A cluster of `size` members with etcd's default timing.
    pub fn new(size: usize) -> Self {
        Self {
            size,
            snapshot_count: None,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            election_timeout: DEFAULT_ELECTION_TIMEOUT,
            quota_backend_bytes: None,
            max_request_bytes: None,
            log_level: "info".to_string(),
            metrics: false,
            namespaces: false,
            extra_args: Vec::new(),
        }
    }

    /// The same configuration with `--snapshot-count` set.
    pub fn with_snapshot_count(mut self, count: u64) -> Self {
        self.snapshot_count = Some(count);
        self
    }
}

/// One member: its identity, its fixed flags and (while running) its process.
struct Member {
    name: String,
    ip: Ipv4Addr,
    log_path: PathBuf,
    args: Vec<String>,
    process: Mutex<Option<Process>>,
    id: Mutex<Option<u64>>,
    starts: AtomicU32,
}

/// A running (or partly stopped) cluster. See the module documentation.
pub struct Cluster {
    binary: Binary,
    members: Vec<Member>,
    /// Small disks mounted over members' data directories during the run
    /// ([`Self::keep_disk`]): unmounted once the members are killed and
    /// before the temporary directory is removed (fields drop in order).
    disks: Mutex<Vec<SmallDisk>>,
    dir: Option<TempDir>,
    /// The members' namespaces, when started with
    /// [`ClusterConfig::namespaces`]; dropped after the members are killed.
    network: Option<Topology>,
    /// The relay of the members' peer traffic, with the namespaces.
    relay: Option<Relay>,
}

impl Cluster {
    /// Starts a cluster of `binary` and waits until every member is healthy.
    pub async fn start(binary: Binary, config: ClusterConfig) -> Result<Cluster> {
        let cluster = Self::spawn(binary, &config)?;
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    /// Starts the processes without waiting for health.
    fn spawn(binary: Binary, config: &ClusterConfig) -> Result<Cluster> {
        ensure!(
            SUPPORTED_SIZES.contains(&config.size),
            "cluster size {} is not one of {SUPPORTED_SIZES:?}",
            config.size
        );
        let dir = tempfile::Builder::new()
            .prefix("etcd-it-")
            .tempdir()
            .context("creating the cluster's temporary directory")?;
        let network = if config.namespaces {
            Some(Topology::create(config.size)?)
        } else {
            None
        };
        let ips = match &network {
            Some(network) => (0..config.size).map(|i| network.ip(i)).collect(),
            None => (0..config.size)
                .map(|_| allocate_ip())
                .collect::<Result<Vec<_>>>()?,
        };
        // Namespaced members are reached by their peers through the relay.
        let (relay, advertised) = match &network {
            Some(network) => {
                let endpoints: Vec<Endpoint> = (0..config.size)
                    .map(|i| Endpoint {
                        ip: network.ip(i),
                        relay_ip: network.relay_ip(i),
                    })
                    .collect();
                let advertised = endpoints.iter().map(|e| e.relay_ip).collect();
                (Some(Relay::start(endpoints)?), advertised)
            }
            None => (None, ips.clone()),
        };
        let peer_urls: Vec<String> = advertised.iter().map(|ip| peer_url(*ip)).collect();
        let initial_cluster = initial_cluster(&peer_urls);
        let token = new_token("it");
        let members = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                let mut flags =
                    MemberFlags::new(&member_name(i), *ip, dir.path(), &initial_cluster, &token);
                flags.advertise_peer_url = peer_urls[i].clone();
                if config.metrics {
                    flags.metrics_url = Some(metrics_url(*ip));
                }
                Member::new(i, *ip, dir.path(), flags.args(config))
            })
            .collect();
        let cluster = Cluster {
            binary,
            members,
            disks: Mutex::new(Vec::new()),
            dir: Some(dir),
            network,
            relay,
        };
        for i in 0..cluster.size() {
            cluster.launch(i)?;
        }
        Ok(cluster)
    }

    /// The server binary the members run.
    pub fn binary(&self) -> &Binary {
        &self.binary
    }

    /// Number of members (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The temporary directory holding data directories and logs.
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .unwrap_or(Path::new(""))
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        client_url(self.members[i].ip)
    }

    /// The address of member `i` (on the loopback interface, or inside
    /// its namespace).
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        self.members[i].ip
    }

    /// The members' namespaces, to cut and heal links between members; an
    /// error unless the cluster was started with [`ClusterConfig::namespaces`].
    pub fn network(&self) -> Result<&Topology> {
        self.network
            .as_ref()
            .context("the cluster was not started in network namespaces")
    }

    /// The relay of the members' peer traffic, to delay links; an error
    /// unless the cluster was started with [`ClusterConfig::namespaces`].
    pub fn relay(&self) -> Result<&Relay> {
        self.relay
            .as_ref()
            .context("the cluster was not started in network namespaces")
    }

    /// Peer URL member `i` advertises (its relay address in namespaces).
    pub fn peer_url(&self, i: usize) -> String {
        self.flag(i, "initial-advertise-peer-urls")
            .unwrap_or_else(|| peer_url(self.members[i].ip))
    }

    /// Member `i`'s metrics URL (served when the cluster was started with
    /// [`ClusterConfig::metrics`]).
    pub fn metrics_url(&self, i: usize) -> String {
        metrics_url(self.members[i].ip)
    }

    /// The value of `--<flag>=` that member `i` is started with (e.g.
    /// `initial-cluster-token`), if it has that flag.
    pub fn flag(&self, i: usize, flag: &str) -> Option<String> {
        let prefix = format!("--{flag}=");
        self.members[i]
            .args
            .iter()
            .find_map(|arg| arg.strip_prefix(&prefix).map(str::to_string))
    }

    /// Client URLs of all members, running or not.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URLs of the members whose process is running.
    pub fn running_endpoints(&self) -> Vec<String> {
        self.running()
            .into_iter()
            .map(|i| self.endpoint(i))
            .collect()
    }

    /// Indexes of the members whose process is running.
    pub fn running(&self) -> Vec<usize> {
        (0..self.size()).filter(|&i| self.is_running(i)).collect()
    }

    /// Whether member `i` has a live process (one that has not exited).
    pub fn is_running(&self, i: usize) -> bool {
        let process = self.members[i].process.lock().expect("member lock");
        process.as_ref().is_some_and(Process::is_running)
    }

    /// Process id of member `i`, if it is running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        if !self.is_running(i) {
            return None;
        }
        let process = self.members[i].process.lock().expect("member lock");
        process.as_ref().and_then(Process::pid)
    }

    /// Member `i`'s exit status once its process has ended by itself
    /// (None while it runs); an error if it was never started or was
    /// killed by the harness.
    pub fn exit_status(&self, i: usize) -> Result<Option<ExitStatus>> {
        let process = self.members[i].process.lock().expect("member lock");
        process
            .as_ref()
            .with_context(|| format!("member {i} was stopped by the test"))?
            .try_wait()
    }

    /// The data directory of member `i`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        data_dir(self.dir(), &member_name(i))
    }

    /// Keeps `disk` (mounted over a member's data directory) mounted until
    /// the cluster is dropped, after its members are killed: unmounting it
    /// under a running member would hide its files.
    pub fn keep_disk(&self, disk: SmallDisk) {
        self.disks.lock().expect("disks lock").push(disk);
    }

    /// SIGKILLs member `i` and reaps it. Killing a stopped member is an error.
    pub fn kill(&self, i: usize) -> Result<()> {
        let process = self.members[i].process.lock().expect("member lock").take();
        let process = process.with_context(|| format!("member {i} is not running"))?;
        process
            .kill()
            .with_context(|| format!("killing member {i}"))
    }

    /// SIGTERMs member `i` and waits up to `deadline` for it to exit by
    /// itself; its exit status. Afterwards the member counts as stopped (a
    /// member still running at the deadline is SIGKILLed, and an error).
    pub async fn terminate(&self, i: usize, deadline: Duration) -> Result<ExitStatus> {
        let process = self.members[i].process.lock().expect("member lock").take();
        let process = process.with_context(|| format!("member {i} is not running"))?;
        let pid = process
            .pid()
            .with_context(|| format!("member {i} has no pid"))?;
        signal(pid, "TERM")?;
        process.wait_exit(deadline).await
    }

    /// SIGKILLs every running member.
    pub fn kill_all(&self) -> Result<()> {
        for i in self.running() {
            self.kill(i)?;
        }
        Ok(())
    }

    /// Starts member `i` again with the flags of its first start (same data
    /// directory, `--initial-cluster-state new`). Does not wait for health.
    pub fn restart(&self, i: usize) -> Result<()> {
        self.launch(i)
    }

    /// Starts member `i` again as [`Self::restart`] does, but under
    /// `wrapper` (a program and its arguments, followed by the server and
    /// its flags), e.g. a fault injector; the member's pid is the wrapper's.
    /// Not for namespaced clusters.
    pub fn restart_under(&self, i: usize, wrapper: &[String]) -> Result<()> {
        ensure!(
            self.network.is_none(),
            "members in namespaces run under `ip netns exec`"
        );
        self.launch_with(i, wrapper)
    }

    /// Starts member `i`'s process with its fixed flags, unless it is running.
    fn launch(&self, i: usize) -> Result<()> {
        self.launch_with(i, &[])
    }

    /// [`Self::launch`] under `wrapper` (none when empty).
    fn launch_with(&self, i: usize, wrapper: &[String]) -> Result<()> {
        let member = &self.members[i];
        let mut slot = member.process.lock().expect("member lock");
        if slot.as_ref().is_some_and(Process::is_running) {
            bail!("member {i} is already running");
        }
        let command = match (&self.network, wrapper.split_first()) {
            (Some(network), _) => network.command(i, &self.binary.path),
            (None, Some((program, args))) => {
                let mut command = std::process::Command::new(program);
                command.args(args).arg(&self.binary.path);
                command
            }
            (None, None) => std::process::Command::new(&self.binary.path),
        };
        *slot = Some(member.spawn(command)?);
        Ok(())
    }

    /// Restarts member `i` and waits until it serves linearizable reads.
    pub async fn restart_and_wait(&self, i: usize) -> Result<()> {
        self.restart(i)?;
        self.wait_member_ready(i).await
    }

    /// Waits until every running member is healthy (see [`Self::wait_member_ready`]).
    pub async fn wait_healthy(&self) -> Result<()> {
        retry_until(
            "all running members to be healthy",
            STARTUP_TIMEOUT,
            || async {
                for i in self.running_or_fail()? {
                    self.member_ready(i).await?;
                }
                Ok(())
            },
        )
        .await
        .with_context(|| self.log_tails())
    }

    /// Waits until member `i` knows a leader and serves a linearizable read
    /// (which requires it to be connected to a quorum and caught up to the
    /// commit index at the time of the read).
    pub async fn wait_member_ready(&self, i: usize) -> Result<()> {
        retry_until(
            &format!("member {i} to be healthy"),
            STARTUP_TIMEOUT,
            || self.member_ready(i),
        )
        .await
        .with_context(|| self.log_tail(i))
    }

    async fn member_ready(&self, i: usize) -> Result<()> {
        self.ensure_running(i)?;
        let mut client = self.client(i).await?;
        let status = check_serving(&mut client)
            .await
            .with_context(|| format!("member {i}"))?;
        self.remember_id(i, &status);
        Ok(())
    }

    /// `Maintenance.Status` of member `i`.
    pub async fn status(&self, i: usize) -> Result<StatusResponse> {
        let status = self.client(i).await?.status().await?;
        self.remember_id(i, &status);
        Ok(status)
    }

    /// The member id of member `i` (asked from the member if not yet known).
    pub async fn member_id(&self, i: usize) -> Result<u64> {
        if let Some(id) = *self.members[i].id.lock().expect("member lock") {
            return Ok(id);
        }
        let status = self.status(i).await?;
        status
            .header()
            .map(|header| header.member_id())
            .context("status response without header")
    }

    /// Index of the leader, once all running members report the same,
    /// running, leader.
    pub async fn leader(&self) -> Result<usize> {
        retry_until(
            "a leader agreed on by the running members",
            LEADER_TIMEOUT,
            || self.leader_once(),
        )
        .await
        .with_context(|| self.log_tails())
    }

    async fn leader_once(&self) -> Result<usize> {
        let mut leaders = BTreeSet::new();
        for i in self.running_or_fail()? {
            leaders.insert(self.status(i).await?.leader());
        }
        let leader = match leaders.iter().collect::<Vec<_>>().as_slice() {
            [single] if **single != 0 => **single,
            _ => bail!("running members disagree on or lack a leader: {leaders:?}"),
        };
        for i in self.running() {
            if self.member_id(i).await? == leader {
                return Ok(i);
            }
        }
        bail!("leader {leader:x} is not a running member")
    }

    /// A follower: the first running member that is not the leader.
    pub async fn follower(&self) -> Result<usize> {
        let leader = self.leader().await?;
        self.running()
            .into_iter()
            .find(|&i| i != leader)
            .ok_or_else(|| anyhow!("no running follower"))
    }

    /// An etcd-client connected to member `i` only.
    pub async fn client(&self, i: usize) -> Result<Client> {
        connect(&[self.endpoint(i)]).await
    }

    /// An etcd-client connected to all members.
    pub async fn client_all(&self) -> Result<Client> {
        connect(&self.endpoints()).await
    }

    /// Reads `prefix` through member `i`, serializable (member-local) or linearizable.
    pub async fn get_prefix(
        &self,
        i: usize,
        prefix: &str,
        serializable: bool,
    ) -> Result<etcd_client::GetResponse> {
        let mut options = GetOptions::new().with_prefix();
        if serializable {
            options = options.with_serializable();
        }
        Ok(self.client(i).await?.get(prefix, Some(options)).await?)
    }

    /// Member `i`'s whole log, across its restarts.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log_path).unwrap_or_default()
    }

    /// The last [`LOG_TAIL_LINES`] lines of member `i`'s log, with a title.
    pub fn log_tail(&self, i: usize) -> String {
        let member = &self.members[i];
        let text = std::fs::read_to_string(&member.log_path).unwrap_or_default();
        format!(
            "==== last {LOG_TAIL_LINES} lines of {} ({}) ====\n{}\n",
            member.name,
            member.log_path.display(),
            tail(&text, LOG_TAIL_LINES)
        )
    }

    /// Log tails of all members.
    pub fn log_tails(&self) -> String {
        (0..self.size()).map(|i| self.log_tail(i)).collect()
    }

    fn remember_id(&self, i: usize, status: &StatusResponse) {
        if let Some(header) = status.header() {
            *self.members[i].id.lock().expect("member lock") = Some(header.member_id());
        }
    }

    /// A [`permanent`] error if member `i`'s process is gone: waiting longer
    /// cannot make it healthy.
    fn ensure_running(&self, i: usize) -> Result<()> {
        let process = self.members[i].process.lock().expect("member lock");
        match process.as_ref().map(Process::try_wait) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => Err(permanent(format!("member {i} exited: {status}"))),
            Some(Err(error)) => Err(permanent(format!(
                "member {i} cannot be waited for: {error}"
            ))),
            None => Err(permanent(format!(
                "member {i} was killed and not restarted"
            ))),
        }
    }

    /// Running members; an error if a member that should run has exited.
    fn running_or_fail(&self) -> Result<Vec<usize>> {
        for (i, member) in self.members.iter().enumerate() {
            let started = member.process.lock().expect("member lock").is_some();
            if started {
                self.ensure_running(i)?;
            }
        }
        Ok(self.running())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails());
        }
        for member in &self.members {
            let process = member
                .process
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take();
            if let Some(process) = process {
                let _ = process.kill();
            }
        }
        // Unmounted before the directory holding the mount points goes.
        self.disks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        if let Some(dir) = self.dir.take() {
            if std::env::var_os("IT_KEEP_DATA").is_some() {
                eprintln!("keeping cluster data in {}", dir.keep().display());
            } else {
                remove_dir(dir);
            }
        }
    }
}

/// Attempts at removing a cluster's directory, and the pause between them:
/// a mount point the kernel still holds (an unmount in progress) refuses
/// its removal for a moment.
const REMOVE_ATTEMPTS: u32 = 10;
const REMOVE_PAUSE: Duration = Duration::from_millis(100);

/// Removes a cluster's temporary directory, reporting what stays behind.
fn remove_dir(dir: TempDir) {
    let path = dir.keep();
    let mut last_error = None;
    for _ in 0..REMOVE_ATTEMPTS {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => last_error = Some(e),
        }
        std::thread::sleep(REMOVE_PAUSE);
    }
    if let Some(e) = last_error {
        eprintln!(
            "could not remove the cluster's directory {}: {e}",
            path.display()
        );
    }
}

impl Member {
    fn new(i: usize, ip: Ipv4Addr, dir: &Path, args: Vec<String>) -> Self {
        Self {
            name: member_name(i),
            ip,
            log_path: dir.join(format!("{}.log", member_name(i))),
            args,
            process: Mutex::new(None),
            id: Mutex::new(None),
            starts: AtomicU32::new(0),
        }
    }

    /// Starts `command` (the server, possibly inside a namespace) with
    /// this member's flags.
    fn spawn(&self, mut command: std::process::Command) -> Result<Process> {
        let start = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
        command.args(&self.args);
        Process::spawn_numbered(&self.name, start, command, &self.log_path)
    }
}

/// The data directory of member `name` in a cluster directory.
fn data_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.etcd"))
}

/// The name of member `i`: `m<i>`.
pub fn member_name(i: usize) -> String {
    format!("m{i}")
}

/// The etcd command line of one member: its name, data directory, URLs,
/// the initial cluster and token, and the timing, log level and limits of a
/// [`ClusterConfig`]. [`Cluster`] starts its members with it; tests that
/// start members themselves (https URLs, a member joining a running
/// cluster) change the fields and append their own flags.
#[derive(Clone, Debug)]
pub struct MemberFlags {
    /// `--name`.
    pub name: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--listen-client-urls` and `--advertise-client-urls`.
    pub client_url: String,
    /// `--listen-peer-urls`.
    pub peer_url: String,
    /// `--initial-advertise-peer-urls` (the same as `peer_url` unless
    /// something passes the traffic on).
    pub advertise_peer_url: String,
    /// `--initial-cluster`.
    pub initial_cluster: String,
    /// `--initial-cluster-state=existing` (a member joining a running
    /// cluster) instead of `new`.
    pub existing: bool,
    /// `--initial-cluster-token`.
    pub token: String,
    /// `--listen-metrics-urls`, if any.
    pub metrics_url: Option<String>,
}

impl MemberFlags {
    /// Member `name` on `ip` with plain http URLs and the data directory
    /// `<dir>/<name>.etcd`, starting a new cluster.
    pub fn new(name: &str, ip: Ipv4Addr, dir: &Path, initial_cluster: &str, token: &str) -> Self {
        Self {
            name: name.to_string(),
            data_dir: data_dir(dir, name),
            client_url: client_url(ip),
            peer_url: peer_url(ip),
            advertise_peer_url: peer_url(ip),
            initial_cluster: initial_cluster.to_string(),
            existing: false,
            token: token.to_string(),
            metrics_url: None,
        }
    }

    /// The flags, with `config`'s timing, log level and limits.
    pub fn args(&self, config: &ClusterConfig) -> Vec<String> {
        let state = if self.existing { "existing" } else { "new" };
        let mut args = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--listen-client-urls={}", self.client_url),
            format!("--advertise-client-urls={}", self.client_url),
            format!("--listen-peer-urls={}", self.peer_url),
            format!("--initial-advertise-peer-urls={}", self.advertise_peer_url),
            format!("--initial-cluster={}", self.initial_cluster),
            format!("--initial-cluster-state={state}"),
            format!("--initial-cluster-token={}", self.token),
            format!(
                "--heartbeat-interval={}",
                config.heartbeat_interval.as_millis()
            ),
            format!("--election-timeout={}", config.election_timeout.as_millis()),
            format!("--log-level={}", config.log_level),
        ];
        if let Some(count) = config.snapshot_count {
            args.push(format!("--snapshot-count={count}"));
        }
        if let Some(url) = &self.metrics_url {
            args.push(format!("--listen-metrics-urls={url}"));
        }
        if let Some(bytes) = config.quota_backend_bytes {
            args.push(format!("--quota-backend-bytes={bytes}"));
        }
        if let Some(bytes) = config.max_request_bytes {
            args.push(format!("--max-request-bytes={bytes}"));
        }
        args.extend(config.extra_args.iter().cloned());
        args
    }
}

/// A fresh `--initial-cluster-token` for a cluster of this process.
pub fn new_token(kind: &str) -> String {
    format!(
        "{kind}-{}-{}",
        std::process::id(),
        NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// `m0=URL0,m1=URL1,...` of [`member_name`]s and peer URLs.
pub fn initial_cluster(peer_urls: &[String]) -> String {
    peer_urls
        .iter()
        .enumerate()
        .map(|(i, url)| format!("{}={url}", member_name(i)))
        .collect::<Vec<_>>()
        .join(",")
}

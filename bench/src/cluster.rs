//! A 3-member cluster on loopback, started with etcd's own flags.
//!
//! The same command line starts our `store` and etcd 3.5: member `i` listens
//! on `http://<subnet>.<first_host+i>:2379` for clients and `:2380` for
//! peers, keeps its data in a temporary directory, and logs to
//! `<data dir>/<name>.log`. Starting waits (bounded) until every member
//! answers Status and they agree on a leader.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions, MemberAddOptions};

use crate::procs::Proc;

/// Members per cluster.
pub const MEMBERS: usize = 3;
/// Members a cluster may grow to with [`Cluster::add_learner`]: its
/// addresses are checked free at start.
const MAX_MEMBERS: usize = MEMBERS + 1;
/// What both systems answer to a MemberPromote of a learner that has not
/// caught up.
const LEARNER_NOT_READY: &str = "can only promote a learner member which is in sync with leader";
/// What etcd answers to a MemberAdd while a member has not been connected
/// long enough (the caller bounds the retries).
const UNHEALTHY_CLUSTER: &str = "etcdserver: unhealthy cluster";
/// Interval of MemberAdd and MemberPromote attempts while a learner catches up.
const PROMOTE_POLL: Duration = Duration::from_millis(100);
/// Client port of every member.
pub const CLIENT_PORT: u16 = 2379;
/// Peer port of every member.
pub const PEER_PORT: u16 = 2380;
/// How long a cluster may take to elect a leader after start.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval while waiting for a cluster.
const STARTUP_POLL: Duration = Duration::from_millis(100);
/// How long a leader lookup retries while members disagree or have no leader
/// (an election in progress).
const LEADER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout of control-plane clients (status, leader lookup).
pub const CONTROL_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Per-request timeout of control-plane clients.
pub const CONTROL_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Human name of the system ("store", "etcd").
    pub label: String,
    /// The member binary.
    pub bin: PathBuf,
    /// First three octets of the member addresses, e.g. "127.0.50".
    pub subnet: String,
    /// Last octet of the first member's address.
    pub first_host: u8,
    /// Value of --snapshot-count.
    pub snapshot_count: u64,
    /// Value of --quota-backend-bytes, if given.
    pub quota_backend_bytes: Option<u64>,
}

impl ClusterSpec {
    /// Loopback address of member `i`.
    pub fn ip(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, usize::from(self.first_host) + i)
    }
}

/// One running member.
pub struct Member {
    pub name: String,
    pub client_url: String,
    /// The member's `--data-dir` (`<cluster dir>/<name>.data`).
    pub data_dir: PathBuf,
    proc: Proc,
}

impl Member {
    /// The member's pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// A running cluster; dropping it kills every member.
pub struct Cluster {
    pub label: String,
    pub members: Vec<Member>,
    /// What the members were started from, to start one again ([`Cluster::restart`]).
    spec: ClusterSpec,
    token: String,
    /// How each member was bootstrapped (its `--initial-cluster` and
    /// state), in member order, to start it again with the same command line.
    boots: Vec<Boot>,
    /// The members' data directories and logs, removed on drop (after the
    /// members, which are dropped first and so killed first).
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts all members and waits until they have a leader.
    pub async fn start(spec: &ClusterSpec) -> Result<Cluster> {
        crate::bins::require_executable(
            &spec.bin,
            &format!("{} binary", spec.label),
            "build it or pass its path",
        )?;
        check_ports_free(spec)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("bench-{}-", spec.label))
            .tempdir()
            .context("creating cluster data dir")?;
        let token = format!("bench-{}-{}", spec.label, std::process::id());
        let boots = vec![Boot::new(spec, MEMBERS, "new"); MEMBERS];
        let mut members = Vec::with_capacity(MEMBERS);
        for (i, boot) in boots.iter().enumerate() {
            members.push(start_member(spec, i, boot, dir.path(), &token)?);
        }
        let mut cluster = Cluster {
            label: spec.label.clone(),
            members,
            spec: spec.clone(),
            token,
            dir,
            boots,
        };
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// Client endpoints of the members, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Index of the current leader among the members.
    pub async fn leader_index(&self) -> Result<usize> {
        let endpoints = self.endpoints();
        let (leader_id, ids) = statuses(&endpoints).await?;
        ids.iter()
            .position(|id| *id == Some(leader_id))
            .with_context(|| {
                format!(
                    "{}: leader {leader_id:x} is not a reachable member",
                    self.label
                )
            })
    }

    /// CPU time (user + system) the members have used so far, summed, in
    /// seconds; a member that is gone counts as zero.
    pub fn cpu_seconds(&self) -> f64 {
        self.members
            .iter()
            .map(|m| crate::procs::cpu_seconds(m.proc.pid()).unwrap_or(0.0))
            .sum()
    }

    /// SIGKILLs member `i`; returns the instant of the kill.
    pub fn kill9(&mut self, i: usize) -> Instant {
        let at = Instant::now();
        self.members[i].proc.kill9();
        at
    }

    /// Starts member `i` again with its original command line and data
    /// directory (SIGKILLing it first if it still runs); returns the instant
    /// of the spawn. Does not wait for the member to be ready.
    pub fn restart(&mut self, i: usize) -> Result<Instant> {
        self.members[i].proc.kill9();
        let at = Instant::now();
        let boot = &self.boots[i];
        self.members[i] = start_member(&self.spec, i, boot, self.dir.path(), &self.token)?;
        Ok(at)
    }

    /// Adds a learner with an empty data directory: MemberAdd as a learner
    /// through the members, then starts it with `--initial-cluster-state
    /// existing`. Returns its index and the instant of the MemberAdd.
    pub async fn add_learner(&mut self) -> Result<(usize, Instant)> {
        let i = self.members.len();
        if i >= MAX_MEMBERS {
            bail!("{}: already {i} members", self.label);
        }
        let peer_url = format!("http://{}:{PEER_PORT}", self.spec.ip(i));
        let mut client = control_client(&self.endpoints()).await?;
        let at = loop {
            let at = Instant::now();
            let opts = MemberAddOptions::new().with_is_learner();
            match client.member_add([peer_url.clone()], Some(opts)).await {
                Ok(_) => break at,
                // etcd's strict reconfiguration check: every member must
                // have been connected for a while (after a restart).
                Err(e) if e.to_string().contains(UNHEALTHY_CLUSTER) => {
                    tokio::time::sleep(PROMOTE_POLL).await
                }
                Err(e) => return Err(anyhow::Error::new(e).context("MemberAdd (learner)")),
            }
        };
        let boot = Boot::new(&self.spec, i + 1, "existing");
        let member = start_member(&self.spec, i, &boot, self.dir.path(), &self.token)?;
        self.members.push(member);
        self.boots.push(boot);
        Ok((i, at))
    }

    /// Promotes learner `i`, retrying every [`PROMOTE_POLL`] while the
    /// cluster refuses because it has not caught up (the caller bounds it).
    pub async fn promote(&self, i: usize) -> Result<()> {
        let voters = self.endpoints()[..i].to_vec();
        let id = loop {
            let (_, ids) = statuses(&self.endpoints()).await?;
            match ids.get(i).copied().flatten() {
                Some(id) => break id,
                None => tokio::time::sleep(PROMOTE_POLL).await,
            }
        };
        loop {
            let mut client = control_client(&voters).await?;
            match client.member_promote(id).await {
                Ok(_) => return Ok(()),
                Err(e) if e.to_string().contains(LEARNER_NOT_READY) => {
                    tokio::time::sleep(PROMOTE_POLL).await
                }
                Err(e) => return Err(anyhow::Error::new(e).context("MemberPromote")),
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let endpoints = self.endpoints();
        loop {
            self.check_alive()?;
            match statuses(&endpoints).await {
                Ok((leader, ids)) if leader != 0 && ids.iter().all(Option::is_some) => {
                    return Ok(())
                }
                Ok(_) | Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(STARTUP_POLL).await
                }
                Ok(_) => bail!("{}: no leader after {STARTUP_TIMEOUT:?}", self.label),
                Err(e) => {
                    return Err(e.context(format!(
                        "{}: not ready after {STARTUP_TIMEOUT:?}",
                        self.label
                    )))
                }
            }
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            if !m.proc.is_running() {
                bail!(
                    "{} member {} exited during startup; last log lines:\n{}",
                    self.label,
                    m.name,
                    m.proc.log_tail()
                );
            }
        }
        Ok(())
    }
}

fn check_ports_free(spec: &ClusterSpec) -> Result<()> {
    for i in 0..MAX_MEMBERS {
        for port in [CLIENT_PORT, PEER_PORT] {
            let addr = format!("{}:{port}", spec.ip(i));
            TcpListener::bind(&addr).with_context(|| {
                format!("{addr} is in use: stop whatever listens there or pick another --subnet")
            })?;
        }
    }
    Ok(())
}

/// A member's bootstrap flags: `--initial-cluster` (members `m1..mN`) and
/// `--initial-cluster-state`.
#[derive(Clone, Debug)]
struct Boot {
    initial_cluster: String,
    state: &'static str,
}

impl Boot {
    fn new(spec: &ClusterSpec, members: usize, state: &'static str) -> Boot {
        let initial_cluster = (0..members)
            .map(|j| format!("m{}=http://{}:{PEER_PORT}", j + 1, spec.ip(j)))
            .collect::<Vec<_>>()
            .join(",");
        Boot {
            initial_cluster,
            state,
        }
    }
}

fn start_member(
    spec: &ClusterSpec,
    i: usize,
    boot: &Boot,
    dir: &Path,
    token: &str,
) -> Result<Member> {
    let name = format!("m{}", i + 1);
    let ip = spec.ip(i);
    let client_url = format!("http://{ip}:{CLIENT_PORT}");
    let peer_url = format!("http://{ip}:{PEER_PORT}");
    let data_dir = dir.join(format!("{name}.data"));
    let mut cmd = Command::new(&spec.bin);
    cmd.arg("--name").arg(&name);
    cmd.arg("--data-dir").arg(&data_dir);
    cmd.args([
        "--listen-client-urls",
        &client_url,
        "--advertise-client-urls",
        &client_url,
    ]);
    cmd.args([
        "--listen-peer-urls",
        &peer_url,
        "--initial-advertise-peer-urls",
        &peer_url,
    ]);
    cmd.args([
        "--initial-cluster",
        &boot.initial_cluster,
        "--initial-cluster-state",
        boot.state,
    ]);
    cmd.args(["--initial-cluster-token", token]);
    cmd.args(["--snapshot-count", &spec.snapshot_count.to_string()]);
    if let Some(bytes) = spec.quota_backend_bytes {
        cmd.args(["--quota-backend-bytes", &bytes.to_string()]);
    }
    let proc = Proc::spawn(
        &format!("{}-{name}", spec.label),
        cmd,
        &dir.join(format!("{name}.log")),
    )?;
    Ok(Member {
        name,
        client_url,
        data_dir,
        proc,
    })
}

/// A control-plane client for `endpoints`.
pub async fn control_client(endpoints: &[String]) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(CONTROL_CONNECT_TIMEOUT)
        .with_timeout(CONTROL_REQUEST_TIMEOUT);
    Client::connect(endpoints, Some(opts))
        .await
        .with_context(|| format!("connecting to {}", endpoints.join(",")))
}

/// The leader id seen by the first member that answers, and each member's own id (None if unreachable).
pub async fn statuses(endpoints: &[String]) -> Result<(u64, Vec<Option<u64>>)> {
    let mut leader = 0;
    let mut ids = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let status = match control_client(std::slice::from_ref(ep)).await {
            Ok(mut c) => c.status().await.ok(),
            Err(_) => None,
        };
        if let Some(s) = &status {
            if leader == 0 {
                leader = s.leader();
            }
        }
        ids.push(status.and_then(|s| s.header().map(|h| h.member_id())));
    }
    if ids.iter().all(Option::is_none) {
        bail!("no endpoint of {} answered Status", endpoints.join(","));
    }
    Ok((leader, ids))
}

/// The endpoint of the current leader among `endpoints`, retrying for up to
/// [`LEADER_LOOKUP_TIMEOUT`] while an election is in progress.
pub async fn leader_endpoint(endpoints: &[String]) -> Result<String> {
    let deadline = Instant::now() + LEADER_LOOKUP_TIMEOUT;
    loop {
        let (leader, ids) = statuses(endpoints).await?;
        if let Some(i) = ids.iter().position(|id| *id == Some(leader)) {
            return Ok(endpoints[i].clone());
        }
        if Instant::now() >= deadline {
            bail!("leader {leader:x} is not among {}", endpoints.join(","));
        }
        tokio::time::sleep(STARTUP_POLL).await;
    }
}

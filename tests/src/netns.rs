//! Network namespaces for network faults: one namespace per member, joined
//! by a bridge, so links between members can be cut and healed while the
//! test's clients still reach every member.
//!
//! Loopback addresses cannot be partitioned without a packet filter (every
//! member's connections leave from 127.0.0.1, and this machine has neither
//! iptables nor netem), so a cluster that needs network faults runs each
//! member in a namespace of its own:
//!
//! ```text
//!   root namespace (the test process, its clients)
//!     eit<pid>n<k>c  10.<a>.<b>.254/24 ──┐ veth
//!   hub namespace  eit-<pid>-<k>-hub     │
//!     bridge br0 ─ c ────────────────────┘
//!             ├── m0 ── veth ── eth0 10.<a>.<b>.1/24  namespace eit-<pid>-<k>-m0 (member 0)
//!             ├── m1 ── veth ── eth0 10.<a>.<b>.2/24  namespace eit-<pid>-<k>-m1
//!             └── m2 ── veth ── eth0 10.<a>.<b>.3/24  namespace eit-<pid>-<k>-m2
//! ```
//!
//! A member's process runs under `ip netns exec <its namespace>`, which
//! `exec`s the server, so the pid the harness holds is the server's.
//!
//! The root-side interface also holds one *relay address* per member
//! (`10.<a>.<b>.<101 + i>/32`, [`Topology::relay_ip`]): members advertise
//! it as their peer URL and [`crate::relay`] passes the traffic on, with a
//! delay per link when a test asks for one.
//!
//! **Cutting a link** `a <-> b` adds blackhole routes for `b`'s addresses
//! (its own and its relay address) in `a`'s namespace and for `a`'s in
//! `b`'s: packets between them are dropped silently on the way out (as a
//! real partition: no reset, no error, connections time out), in both
//! directions, while the clients' address (`.254`) stays reachable from
//! both. Healing deletes the routes.
//!
//! Every interface also has an IPv6 address in `fd0a:<a>:<b>::/64` (hex; host part as in
//! IPv4, [`Topology::ipv6`]), added without duplicate address detection, for IPv6 tests.
//!
//! The subnet `10.<a>.<b>.0/24` is chosen per topology (from the process
//! id and a counter) among those no interface of the machine uses; all
//! traffic stays inside the namespaces this module made. Dropping the
//! topology deletes the namespaces and the root-side interface; the
//! members' processes must be gone first (the cluster kills them). A test
//! process killed outright leaves its namespaces behind: each new topology
//! first deletes those named after a test process that no longer runs
//! (`eit-<pid>-...` with no `/proc/<pid>`), which also removes their
//! interfaces.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use anyhow::{bail, ensure, Context, Result};

/// The second address byte is drawn from this many values above
/// [`SUBNET_SECOND_BYTE_BASE`] (10.200.x.x to 10.249.x.x).
const SUBNET_SECOND_BYTE_VALUES: u32 = 50;
/// Lowest second address byte of a topology's subnet.
const SUBNET_SECOND_BYTE_BASE: u32 = 200;
/// Subnets tried before giving up (each one that some interface uses is skipped).
const MAX_SUBNET_PROBES: u32 = 256;
/// Last address byte of the test process's (root-side) interface.
const CLIENT_HOST: u8 = 254;
/// Last address byte of member 0's relay address (member `i`: this + `i`).
const RELAY_HOST_BASE: u8 = 101;
/// Members one topology supports (addresses .1 to .N).
pub const MAX_MEMBERS: usize = 16;

static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(0);

/// Namespaces for `members` members and the links between them. See the
/// module documentation.
pub struct Topology {
    hub: String,
    members: Vec<String>,
    root_if: String,
    subnet: [u8; 3],
    /// Cut links, as (lower, higher) member index pairs.
    cut: Mutex<BTreeSet<(usize, usize)>>,
}

impl Topology {
    /// Creates the namespaces, the bridge and the interfaces.
    pub fn create(members: usize) -> Result<Topology> {
        ensure!(
            (1..=MAX_MEMBERS).contains(&members),
            "a topology holds 1 to {MAX_MEMBERS} members, not {members}"
        );
        remove_stale();
        let k = NEXT_TOPOLOGY.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let prefix = format!("{NAME_PREFIX}{pid}-{k}");
        let topology = Topology {
            hub: format!("{prefix}-hub"),
            members: (0..members).map(|i| format!("{prefix}-m{i}")).collect(),
            // Interface names hold at most 15 bytes.
            root_if: format!("eit{}n{}c", pid % 100_000, k % 100),
            subnet: free_subnet(pid, k)?,
            cut: Mutex::new(BTreeSet::new()),
        };
        // On failure, dropping `topology` removes whatever was made.
        topology
            .build()
            .with_context(|| format!("creating the network namespaces {prefix}-*"))?;
        Ok(topology)
    }

    fn build(&self) -> Result<()> {
        let hub = &self.hub;
        ip(&["netns", "add", hub])?;
        ip(&["-n", hub, "link", "add", "name", "br0", "type", "bridge"])?;
        ip(&["-n", hub, "link", "set", "br0", "up"])?;
        for (i, ns) in self.members.iter().enumerate() {
            let port = format!("m{i}");
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", hub, "link", "add", "name", &port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ])?;
            ip(&["-n", hub, "link", "set", &port, "master", "br0", "up"])?;
            let address = format!("{}/24", self.ip(i));
            ip(&["-n", ns, "addr", "add", &address, "dev", "eth0"])?;
            let address = format!("{}/64", self.ipv6(i));
            ip(&[
                "-n", ns, "-6", "addr", "add", &address, "dev", "eth0", "nodad",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        let root_if = &self.root_if;
        ip(&[
            "link", "add", "name", root_if, "type", "veth", "peer", "name", "c", "netns", hub,
        ])?;
        ip(&["-n", hub, "link", "set", "c", "master", "br0", "up"])?;
        let client = format!("{}/24", self.client_ip());
        ip(&["addr", "add", &client, "dev", root_if])?;
        let client = format!("{}/64", self.client_ipv6());
        ip(&["-6", "addr", "add", &client, "dev", root_if, "nodad"])?;
        for i in 0..self.members.len() {
            let relay = format!("{}/32", self.relay_ip(i));
            ip(&["addr", "add", &relay, "dev", root_if])?;
        }
        ip(&["link", "set", root_if, "up"])?;
        Ok(())
    }

    /// Member `i`'s address (inside its namespace).
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, i as u8 + 1)
    }

    /// Member `i`'s IPv6 address (inside its namespace).
    pub fn ipv6(&self, i: usize) -> Ipv6Addr {
        self.ipv6_host(u16::from(i as u8 + 1))
    }

    /// The IPv6 address of the test process's interface.
    pub fn client_ipv6(&self) -> Ipv6Addr {
        self.ipv6_host(u16::from(CLIENT_HOST))
    }

    /// `host` in the topology's IPv6 /64 (`fd0a:<a>:<b>::<host>`).
    pub fn ipv6_host(&self, host: u16) -> Ipv6Addr {
        let [a, b, c] = self.subnet;
        Ipv6Addr::new(
            0xfd00 | u16::from(a),
            u16::from(b),
            u16::from(c),
            0,
            0,
            0,
            0,
            host,
        )
    }

    /// The name of the test process's interface on the bridge (in the root namespace).
    pub fn client_interface(&self) -> &str {
        &self.root_if
    }

    /// Member `i`'s relay address (on the test process's interface): see
    /// [`crate::relay`].
    pub fn relay_ip(&self, i: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, RELAY_HOST_BASE + i as u8)
    }

    /// The address the test process's connections come from.
    pub fn client_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, CLIENT_HOST)
    }

    /// Member `i`'s namespace.
    pub fn namespace(&self, i: usize) -> &str {
        &self.members[i]
    }

    /// A command running `program` inside member `i`'s namespace.
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", self.namespace(i)])
            .arg(program);
        command
    }

    /// Cuts the link between members `a` and `b` (both directions).
    pub fn cut(&self, a: usize, b: usize) -> Result<()> {
        ensure!(a != b, "a member has no link to itself");
        let mut cut = self.cut.lock().expect("cut links lock");
        if !cut.insert((a.min(b), a.max(b))) {
            return Ok(());
        }
        self.route("add", a, b)?;
        self.route("add", b, a)
    }

    /// Heals the link between `a` and `b`.
    pub fn heal(&self, a: usize, b: usize) -> Result<()> {
        let mut cut = self.cut.lock().expect("cut links lock");
        if !cut.remove(&(a.min(b), a.max(b))) {
            return Ok(());
        }
        self.route("del", a, b)?;
        self.route("del", b, a)
    }

    /// Cuts every link of member `i`: it still reaches the clients, and
    /// nothing else.
    pub fn isolate(&self, i: usize) -> Result<()> {
        for other in (0..self.members.len()).filter(|&o| o != i) {
            self.cut(i, other)?;
        }
        Ok(())
    }

    /// Cuts the link between `a` and `b` if it is up, heals it if it is cut.
    pub fn toggle(&self, a: usize, b: usize) -> Result<()> {
        if self.cut_links().contains(&(a.min(b), a.max(b))) {
            self.heal(a, b)
        } else {
            self.cut(a, b)
        }
    }

    /// Heals every cut link.
    pub fn heal_all(&self) -> Result<()> {
        for (a, b) in self.cut_links() {
            self.heal(a, b)?;
        }
        Ok(())
    }

    /// The links cut now.
    pub fn cut_links(&self) -> Vec<(usize, usize)> {
        self.cut
            .lock()
            .expect("cut links lock")
            .iter()
            .copied()
            .collect()
    }

    /// `ip route <action> blackhole <address>` in `from`'s namespace, for
    /// both of `to`'s addresses.
    fn route(&self, action: &str, from: usize, to: usize) -> Result<()> {
        for address in [self.ip(to), self.relay_ip(to)] {
            let target = format!("{address}/32");
            ip(&[
                "-n",
                &self.members[from],
                "route",
                action,
                "blackhole",
                &target,
            ])?;
        }
        Ok(())
    }

    fn teardown(&self) {
        // Errors are ignored: part of the topology may never have existed.
        let _ = ip_quiet(&["link", "del", &self.root_if]);
        for ns in self.members.iter().chain(std::iter::once(&self.hub)) {
            let _ = ip_quiet(&["netns", "del", ns]);
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/var/run/netns";
/// Prefix of every namespace this module names (`eit-<pid>-<k>-...`).
const NAME_PREFIX: &str = "eit-";

/// Deletes the namespaces of test processes that no longer run.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NAME_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip_quiet(&["netns", "del", &name]);
        }
    }
}

/// Runs `ip ARGS`, failing with its standard error.
fn ip(args: &[&str]) -> Result<()> {
    crate::process::run_checked("ip", args).map(drop)
}

fn ip_quiet(args: &[&str]) -> Result<()> {
    let status = Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "ip {} failed", args.join(" "));
    Ok(())
}

/// A `/24` in 10.200.0.0-10.249.255.0 that no interface of this machine's
/// root namespace has an address in.
fn free_subnet(pid: u32, k: u32) -> Result<[u8; 3]> {
    let output = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .context("running ip -4 -o addr show (iproute2 installed?)")?;
    let used = String::from_utf8_lossy(&output.stdout).into_owned();
    let start = pid.wrapping_mul(7).wrapping_add(k.wrapping_mul(31));
    for probe in 0..MAX_SUBNET_PROBES {
        let n = start.wrapping_add(probe);
        let second = SUBNET_SECOND_BYTE_BASE + n % SUBNET_SECOND_BYTE_VALUES;
        let third = (n / SUBNET_SECOND_BYTE_VALUES) % 256;
        let subnet = [10, second as u8, third as u8];
        let prefix = format!(" 10.{second}.{third}.");
        if !used.contains(&prefix) {
            return Ok(subnet);
        }
    }
    bail!("no free 10.x.y.0/24 subnet after {MAX_SUBNET_PROBES} probes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_of_dead_test_processes_are_removed() {
        // Above the kernel's largest pid (2^22): no process has it.
        let stale = format!("{NAME_PREFIX}4194999-0-hub");
        ip(&["netns", "add", &stale]).expect("ip netns add (needs root and iproute2)");
        let live = Topology::create(1).expect("a topology");
        let names: Vec<String> = std::fs::read_dir(NETNS_DIR)
            .expect("netns dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.contains(&stale), "{names:?}");
        assert!(names.iter().any(|n| n == live.namespace(0)), "{names:?}");
    }

    #[test]
    fn subnets_avoid_used_prefixes_and_stay_private() {
        let subnet = free_subnet(1234, 0).unwrap();
        assert_eq!(subnet[0], 10);
        assert!((200..250).contains(&subnet[1]));
    }
}

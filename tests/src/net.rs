//! Loopback address allocation.
//!
//! Every member gets its own address in 127.0.0.0/8 and listens on the
//! standard etcd ports there (2379 client, 2380 peer), exactly like a real
//! deployment with one host per member. Addresses are derived from the process
//! id (so concurrently running test binaries use disjoint blocks) plus a
//! process-wide counter (so parallel tests in one binary never share one), and
//! each candidate is probed by binding both ports before it is handed out.
//! 127.0.x.x is never used, leaving 127.0.0.1 to other software.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Result};

/// Client port every member listens on, on its own address.
pub const CLIENT_PORT: u16 = 2379;
/// Peer port every member listens on, on its own address.
pub const PEER_PORT: u16 = 2380;
/// Metrics port of members started with metrics URLs (kubeadm's 2381).
pub const METRICS_PORT: u16 = 2381;

/// Usable values of the last address byte (1..=254, skipping .0 and .255).
const HOSTS_PER_BLOCK: u32 = 254;
/// Usable values of the third address byte.
const BLOCKS_PER_SECOND_BYTE: u32 = 256;
/// Usable values of the second address byte (1..=254, never 0).
const SECOND_BYTE_VALUES: u32 = 254;
/// Size of the whole address space we allocate from.
const ADDRESS_SPACE: u32 = HOSTS_PER_BLOCK * BLOCKS_PER_SECOND_BYTE * SECOND_BYTE_VALUES;
/// Addresses probed before giving up (each probe is two local binds).
const MAX_PROBES: u32 = 2_000;

static NEXT_ADDRESS: AtomicU32 = AtomicU32::new(0);

/// A fresh loopback address whose client and peer ports are currently free.
pub fn allocate_ip() -> Result<Ipv4Addr> {
    let base =
        (std::process::id() % (BLOCKS_PER_SECOND_BYTE * SECOND_BYTE_VALUES)) * HOSTS_PER_BLOCK;
    for _ in 0..MAX_PROBES {
        let offset = NEXT_ADDRESS.fetch_add(1, Ordering::Relaxed);
        let ip = ip_at(base.wrapping_add(offset) % ADDRESS_SPACE);
        if ports_free(ip) {
            return Ok(ip);
        }
    }
    bail!("no loopback address with free ports {CLIENT_PORT}/{PEER_PORT} after {MAX_PROBES} probes")
}

/// A fresh loopback address with its client port held by the returned
/// listener (a member started there fails to bind it). Allocation and
/// binding are one step: an address whose client port is taken between
/// the two (by a process outside this one) is skipped.
pub fn allocate_ip_with_client_port_taken() -> Result<(Ipv4Addr, TcpListener)> {
    for _ in 0..MAX_PROBES {
        let ip = allocate_ip()?;
        if let Ok(listener) = TcpListener::bind((ip, CLIENT_PORT)) {
            return Ok((ip, listener));
        }
    }
    bail!("no loopback address whose client port {CLIENT_PORT} could be held after {MAX_PROBES} probes")
}

/// The address with the given index in the allocation space.
fn ip_at(index: u32) -> Ipv4Addr {
    let host = index % HOSTS_PER_BLOCK;
    let block = index / HOSTS_PER_BLOCK;
    let third = block % BLOCKS_PER_SECOND_BYTE;
    let second = block / BLOCKS_PER_SECOND_BYTE;
    Ipv4Addr::new(127, (second + 1) as u8, third as u8, (host + 1) as u8)
}

fn ports_free(ip: Ipv4Addr) -> bool {
    [CLIENT_PORT, PEER_PORT]
        .iter()
        .all(|port| TcpListener::bind((ip, *port)).is_ok())
}

/// `http://IP:2379`
pub fn client_url(ip: Ipv4Addr) -> String {
    format!("http://{ip}:{CLIENT_PORT}")
}

/// `http://IP:2380`
pub fn peer_url(ip: Ipv4Addr) -> String {
    format!("http://{ip}:{PEER_PORT}")
}

/// `http://IP:2381`: kubeadm's `--listen-metrics-urls` port, on the
/// member's own address.
pub fn metrics_url(ip: Ipv4Addr) -> String {
    format!("http://{ip}:{METRICS_PORT}")
}

/// `https://IP:2379`
pub fn https_client_url(ip: Ipv4Addr) -> String {
    format!("https://{ip}:{CLIENT_PORT}")
}

/// `https://IP:2380`
pub fn https_peer_url(ip: Ipv4Addr) -> String {
    format!("https://{ip}:{PEER_PORT}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn addresses_stay_in_loopback_and_avoid_reserved_bytes() {
        for index in [0, 1, 253, 254, ADDRESS_SPACE - 1] {
            let octets = ip_at(index).octets();
            assert_eq!(octets[0], 127);
            assert!((1..=254).contains(&octets[1]), "{octets:?}");
            assert!((1..=254).contains(&octets[3]), "{octets:?}");
        }
    }

    #[test]
    fn allocations_are_unique() {
        let ips: Vec<_> = (0..20).map(|_| allocate_ip().unwrap()).collect();
        let unique: HashSet<_> = ips.iter().collect();
        assert_eq!(unique.len(), ips.len());
    }
}

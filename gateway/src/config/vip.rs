//! The `[vip]` section: a virtual IP this gateway holds while it is the elected holder.
//!
//! The values are parsed here once, for the file and for the flags, so both refuse the same
//! input with the same message. What the VIP does with them is explained in `crate::vip`.

use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Default lease TTL of the election (kube-vip's default lease duration): the longest time a
/// dead holder keeps the VIP unreachable.
pub const DEFAULT_VIP_LEASE_TTL: Duration = Duration::from_secs(5);
/// Shortest lease TTL: the holder refreshes the address lifetime every `TTL / 4` and the
/// lifetime must leave a whole second after the fence margins (see `crate::vip::fence`).
pub const MIN_VIP_LEASE_TTL: Duration = Duration::from_secs(3);
/// Longest lease TTL: beyond a minute a dead holder would leave the control-plane endpoint
/// unreachable for longer than clients' own timeouts.
pub const MAX_VIP_LEASE_TTL: Duration = Duration::from_secs(60);
/// Default key prefix of the election, followed by `/<the VIP>`.
pub const DEFAULT_VIP_PREFIX_ROOT: &str = "/gateway/vip";
/// Most election endpoints (store members); a control plane has 3 or 5.
pub const MAX_VIP_ENDPOINTS: usize = 16;
/// Longest interface name Linux accepts (`IFNAMSIZ` - 1 bytes).
pub const MAX_INTERFACE_NAME_BYTES: usize = 15;
/// Longest election prefix: keys stay far below the store's request limits.
pub const MAX_VIP_PREFIX_BYTES: usize = 256;
/// Longest candidate name (stored as the value of the election key).
pub const MAX_VIP_NAME_BYTES: usize = 253;

/// The virtual IP and its election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipConfig {
    /// The virtual address, IPv4 or IPv6 (see `crate::vip`).
    pub address: IpAddr,
    /// Its prefix length on the interface (32, or 128 for IPv6, for a VIP inside the node's
    /// subnet).
    pub prefix_len: u8,
    /// The interface that gets the address and sends the gratuitous ARPs (IPv4) or unsolicited
    /// neighbour advertisements (IPv6).
    pub interface: String,
    /// gRPC URLs of the store (or etcd) members: `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// Key prefix of the election; candidates' keys are `<prefix>/<lease id in hex>`.
    pub prefix: String,
    /// TTL of the candidate's lease (whole seconds).
    pub lease_ttl: Duration,
    /// This candidate's name, the value of its election key (the holder's name in status).
    pub name: String,
    /// TLS towards the store, for `etcds://` (or `https://`) endpoints.
    pub tls: Option<ElectionTls>,
}

/// TLS client settings of the election connection (kubeadm's etcd requires client certs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionTls {
    /// CA bundle (PEM) that signed the members' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Parses `10.0.0.100/32` (or `10.0.0.100`, meaning /32), or an IPv6 address such as
/// `fd00:10::100/128` (without a prefix: /128).
pub fn parse_vip_address(text: &str) -> Result<(IpAddr, u8), String> {
    let (ip_text, prefix_text) = match text.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (text, None),
    };
    let ip: IpAddr = ip_text
        .parse()
        .map_err(|_| format!("VIP `{text}` is not an IP address with an optional /PREFIX"))?;
    let unicast = match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() || v4.is_loopback())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast() || v6.is_loopback()),
    };
    if !unicast {
        return Err(format!("VIP `{text}` is not a unicast address"));
    }
    if let IpAddr::V6(v6) = ip {
        if is_link_local(v6) || v6.to_ipv4_mapped().is_some() {
            return Err(format!(
                "VIP `{text}` is link-local or IPv4-mapped: an IPv6 VIP must be routable"
            ));
        }
    }
    let max_len = if ip.is_ipv4() { 32 } else { 128 };
    let prefix_len = match prefix_text {
        None => max_len,
        Some(prefix) => match prefix.parse::<u8>() {
            Ok(len) if (1..=max_len).contains(&len) => len,
            _ => {
                return Err(format!(
                    "VIP `{text}` has an invalid prefix length `{prefix}`"
                ))
            }
        },
    };
    Ok((ip, prefix_len))
}

/// Whether `ip` is in fe80::/10.
fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// Checks a Linux interface name.
pub fn validate_interface(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME_BYTES
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "interface `{name}` is not a valid name (1 to {MAX_INTERFACE_NAME_BYTES} bytes, no `/`, `:` or spaces)"
        ))
    }
}

/// Parses `etcd://host:2379[,host2:2379]` (`etcds://` for TLS; `http://` and `https://` are
/// accepted too, and each element may repeat the scheme) into gRPC URLs and whether they use
/// TLS.
pub fn parse_election_endpoints(text: &str) -> Result<(Vec<String>, bool), String> {
    let mut scheme: Option<bool> = None;
    let mut endpoints = Vec::new();
    for element in text.split(',') {
        let element = element.trim();
        let (tls, address) = match element.split_once("://") {
            Some(("etcd" | "http", rest)) => (Some(false), rest),
            Some(("etcds" | "https", rest)) => (Some(true), rest),
            Some((other, _)) => {
                return Err(format!(
                    "election endpoint `{element}` has scheme `{other}`: use etcd:// or etcds://"
                ))
            }
            None => (None, element),
        };
        let tls = match (scheme, tls) {
            (None, None) => {
                return Err(format!(
                "election endpoints `{text}` need a scheme: etcd://HOST:PORT or etcds://HOST:PORT"
            ))
            }
            (Some(first), Some(this)) if first != this => {
                return Err(format!(
                    "election endpoints `{text}` mix TLS and plain schemes"
                ))
            }
            (_, Some(this)) => this,
            (Some(first), None) => first,
        };
        scheme = Some(tls);
        super::validate_host_port(address)
            .map_err(|message| format!("election endpoint: {message}"))?;
        let url_scheme = if tls { "https" } else { "http" };
        endpoints.push(format!("{url_scheme}://{address}"));
    }
    if endpoints.len() > MAX_VIP_ENDPOINTS {
        return Err(format!("more than {MAX_VIP_ENDPOINTS} election endpoints"));
    }
    Ok((endpoints, scheme.unwrap_or(false)))
}

/// Checks the lease TTL: whole seconds (etcd leases count seconds) within the bounds.
pub fn validate_lease_ttl(ttl: Duration) -> Result<(), String> {
    if ttl.subsec_nanos() != 0 {
        return Err(format!("lease TTL {ttl:?} must be whole seconds"));
    }
    if ttl < MIN_VIP_LEASE_TTL || ttl > MAX_VIP_LEASE_TTL {
        return Err(format!(
            "lease TTL {ttl:?} must be between {MIN_VIP_LEASE_TTL:?} and {MAX_VIP_LEASE_TTL:?}"
        ));
    }
    Ok(())
}

/// Checks the election prefix: an absolute-looking key without a trailing `/`.
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    let valid = prefix.starts_with('/')
        && prefix.len() > 1
        && prefix.len() <= MAX_VIP_PREFIX_BYTES
        && !prefix.ends_with('/')
        && prefix.bytes().all(|b| b.is_ascii_graphic());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "election prefix `{prefix}` must start with `/`, not end with `/`, hold printable ASCII and at most {MAX_VIP_PREFIX_BYTES} bytes"
        ))
    }
}

/// Checks a candidate name.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_VIP_NAME_BYTES
        || !name.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(format!(
            "VIP name `{name}` must be 1 to {MAX_VIP_NAME_BYTES} printable ASCII bytes"
        ));
    }
    Ok(())
}

/// The default election prefix for `address`.
pub fn default_prefix(address: IpAddr) -> String {
    format!("{DEFAULT_VIP_PREFIX_ROOT}/{address}")
}

/// The default candidate name: the host name (or `gateway` when it cannot be read).
pub fn default_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| validate_name(name).is_ok())
        .unwrap_or_else(|| "gateway".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_addresses() {
        assert_eq!(
            parse_vip_address("10.0.0.100/32").unwrap(),
            (IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 100)), 32)
        );
        assert_eq!(parse_vip_address("10.0.0.100").unwrap().1, 32);
        assert_eq!(parse_vip_address("10.0.0.100/24").unwrap().1, 24);
        assert!(parse_vip_address("10.0.0.100/33").is_err());
        assert!(parse_vip_address("10.0.0.100/0").is_err());
        let v6: IpAddr = "fd00:10::100".parse().unwrap();
        assert_eq!(parse_vip_address("fd00:10::100/128").unwrap(), (v6, 128));
        assert_eq!(parse_vip_address("fd00:10::100").unwrap(), (v6, 128));
        assert_eq!(parse_vip_address("fd00:10::100/64").unwrap().1, 64);
        assert!(parse_vip_address("fd00:10::100/129").is_err());
        assert!(parse_vip_address("fe80::1/128").is_err());
        assert!(parse_vip_address("::ffff:10.0.0.1").is_err());
        assert!(parse_vip_address("::1").is_err());
        assert!(parse_vip_address("ff02::1").is_err());
        assert!(parse_vip_address("::").is_err());
        assert!(parse_vip_address("0.0.0.0").is_err());
        assert!(parse_vip_address("224.0.0.18").is_err());
        assert!(parse_vip_address("eth0").is_err());
    }

    #[test]
    fn election_endpoints() {
        let (urls, tls) = parse_election_endpoints("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap();
        assert_eq!(urls, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        assert!(!tls);
        let (urls, tls) = parse_election_endpoints("etcds://a:2379").unwrap();
        assert_eq!(urls, ["https://a:2379"]);
        assert!(tls);
        assert!(parse_election_endpoints("10.0.0.1:2379").is_err());
        assert!(parse_election_endpoints("etcd://a:2379,etcds://b:2379").is_err());
        assert!(parse_election_endpoints("grpc://a:2379").is_err());
        assert!(parse_election_endpoints("etcd://a").is_err());
    }

    #[test]
    fn interfaces_ttls_prefixes_names() {
        assert!(validate_interface("eth0").is_ok());
        assert!(validate_interface("").is_err());
        assert!(validate_interface("a-very-long-interface").is_err());
        assert!(validate_interface("eth0:1").is_err());
        assert!(validate_lease_ttl(Duration::from_secs(5)).is_ok());
        assert!(validate_lease_ttl(Duration::from_millis(4500)).is_err());
        assert!(validate_lease_ttl(Duration::from_secs(2)).is_err());
        assert!(validate_lease_ttl(Duration::from_secs(61)).is_err());
        assert!(validate_prefix("/gateway/vip").is_ok());
        assert!(validate_prefix("gateway").is_err());
        assert!(validate_prefix("/gateway/").is_err());
        assert!(validate_name("node-1").is_ok());
        assert!(validate_name("a b").is_err());
    }
}

//! Announcements: telling the segment that the VIP now lives at this node's MAC address, by
//! gratuitous ARP (IPv4) or an unsolicited neighbour advertisement (IPv6).
//!
//! Neighbours (clients, routers) cache the VIP's MAC address; after a takeover they would keep
//! sending to the old holder until their cache entry goes stale (tens of seconds). For an IPv4
//! VIP the new holder broadcasts two unsolicited frames per round, as keepalived does, because
//! neighbours differ in which one they honour:
//!
//! * an ARP *request* for the VIP from the VIP (an "ARP announcement", RFC 5227 §2.3: target
//!   hardware address zero), and
//! * an ARP *reply* for the VIP, broadcast (the classic gratuitous reply).
//!
//! Linux updates an existing neighbour entry on either. The frames go out of an `AF_PACKET`
//! raw socket bound to nothing, addressed to the interface by index (needs `CAP_NET_RAW`).
//! Several rounds are sent because a single broadcast may be lost, and a neighbour ignores an
//! update that comes within its `locktime` (1 s on Linux) of the previous one.
//!
//! For an IPv6 VIP each round is one unsolicited neighbour advertisement (RFC 4861 §7.2.6):
//! ICMPv6 type 136 to the all-nodes group `ff02::1`, hop limit 255 (receivers drop neighbour
//! discovery from anything else), from the VIP, for the VIP as target, with the *override*
//! flag (replace the cached link-layer address), not *solicited*, and the target link-layer
//! address option carrying this interface's MAC. It goes out of a raw ICMPv6 socket (the
//! kernel fills in the checksum) bound to the VIP, which is usable at once because the
//! holder adds it with `nodad` (see `super::address`). Linux updates an existing neighbour
//! entry on it, as keepalived's and kube-vip's IPv6 takeovers rely on.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::address::InterfaceIdentity;
use crate::net::set_int_option;

/// Rounds of (request, reply) after taking the VIP.
pub const ANNOUNCE_ROUNDS: u32 = 3;
/// Time between rounds: spreads them past a neighbour's 1 s ARP `locktime`.
pub const ANNOUNCE_SPACING: Duration = Duration::from_millis(600);
/// Bytes of an Ethernet frame carrying an IPv4-over-Ethernet ARP packet (14 + 28).
pub const ARP_FRAME_BYTES: usize = 42;
/// The Ethernet broadcast address.
const BROADCAST_MAC: [u8; 6] = [0xff; 6];
/// EtherType of ARP.
const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv4 (ARP's protocol type).
const ETHERTYPE_IPV4: u16 = 0x0800;
/// ARP hardware type of Ethernet.
const HARDWARE_ETHERNET: u16 = 1;

/// The two ARP operations sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    /// ARP request (opcode 1), target hardware address zero.
    Request,
    /// ARP reply (opcode 2), target hardware address broadcast.
    Reply,
}

/// The broadcast frame announcing that `ip` is at `mac`.
pub fn gratuitous_arp(
    mac: [u8; 6],
    ip: Ipv4Addr,
    operation: ArpOperation,
) -> [u8; ARP_FRAME_BYTES] {
    let (opcode, target_mac) = match operation {
        ArpOperation::Request => (1u16, [0u8; 6]),
        ArpOperation::Reply => (2u16, BROADCAST_MAC),
    };
    let mut frame = [0u8; ARP_FRAME_BYTES];
    frame[0..6].copy_from_slice(&BROADCAST_MAC);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    frame[14..16].copy_from_slice(&HARDWARE_ETHERNET.to_be_bytes());
    frame[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    frame[18] = 6; // hardware address length
    frame[19] = 4; // protocol address length
    frame[20..22].copy_from_slice(&opcode.to_be_bytes());
    frame[22..28].copy_from_slice(&mac);
    frame[28..32].copy_from_slice(&ip.octets());
    frame[32..38].copy_from_slice(&target_mac);
    frame[38..42].copy_from_slice(&ip.octets());
    frame
}

/// An `AF_PACKET` socket that sends ARP frames out of one interface.
pub struct ArpSender {
    socket: OwnedFd,
    interface: InterfaceIdentity,
}

impl ArpSender {
    /// Opens the raw socket (needs `CAP_NET_RAW`).
    pub fn open(interface: InterfaceIdentity) -> io::Result<ArpSender> {
        let protocol = i32::from(ETHERTYPE_ARP.to_be());
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor that nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ArpSender { socket, interface })
    }

    /// Sends one frame to the broadcast address.
    pub fn send(&self, frame: &[u8; ARP_FRAME_BYTES]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_protocol = ETHERTYPE_ARP.to_be();
        address.sll_ifindex = i32::try_from(self.interface.index).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface index out of range")
        })?;
        address.sll_halen = 6;
        address.sll_addr[..6].copy_from_slice(&BROADCAST_MAC);
        // SAFETY: the buffer and the address outlive the call, their lengths are given exactly.
        let sent = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&address as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Bytes of an unsolicited neighbour advertisement: the 24-byte ICMPv6 message and one
/// 8-byte target link-layer address option.
pub const NEIGHBOUR_ADVERTISEMENT_BYTES: usize = 32;
/// ICMPv6 type of a neighbour advertisement.
const ICMPV6_NEIGHBOUR_ADVERTISEMENT: u8 = 136;
/// The advertisement's *override* flag (bit 29 of its flags word); *router* and *solicited*
/// stay clear.
const NA_FLAG_OVERRIDE: u32 = 0x2000_0000;
/// Neighbour discovery option type: target link-layer address.
const OPTION_TARGET_LINK_LAYER_ADDRESS: u8 = 2;
/// The all-nodes link-local multicast group.
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Hop limit of every neighbour discovery message (RFC 4861: receivers check it is 255).
const NEIGHBOUR_DISCOVERY_HOP_LIMIT: libc::c_int = 255;

/// The unsolicited neighbour advertisement that `ip` is at `mac`; its checksum is left zero
/// for the kernel to fill in.
pub fn unsolicited_neighbour_advertisement(
    mac: [u8; 6],
    ip: Ipv6Addr,
) -> [u8; NEIGHBOUR_ADVERTISEMENT_BYTES] {
    let mut message = [0u8; NEIGHBOUR_ADVERTISEMENT_BYTES];
    message[0] = ICMPV6_NEIGHBOUR_ADVERTISEMENT;
    // message[1]: code 0; message[2..4]: checksum, computed by the kernel.
    message[4..8].copy_from_slice(&NA_FLAG_OVERRIDE.to_be_bytes());
    message[8..24].copy_from_slice(&ip.octets());
    message[24] = OPTION_TARGET_LINK_LAYER_ADDRESS;
    message[25] = 1; // option length in units of 8 bytes
    message[26..32].copy_from_slice(&mac);
    message
}

/// A raw ICMPv6 socket, bound to the VIP, that sends neighbour advertisements to all nodes on
/// one interface.
pub struct NeighbourAdvertiser {
    socket: OwnedFd,
    interface: InterfaceIdentity,
}

impl NeighbourAdvertiser {
    /// Opens the raw socket (needs `CAP_NET_RAW`) and binds it to `ip`, which must be on the
    /// interface already.
    pub fn open(interface: InterfaceIdentity, ip: Ipv6Addr) -> io::Result<NeighbourAdvertiser> {
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET6,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMPV6,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor that nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let index = libc::c_int::try_from(interface.index).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "interface index out of range")
        })?;
        set_int_option(
            &socket,
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_HOPS,
            NEIGHBOUR_DISCOVERY_HOP_LIMIT,
        )?;
        set_int_option(&socket, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, index)?;
        let source = sockaddr_v6(ip, 0);
        // SAFETY: the address outlives the call and its length is given exactly.
        let bound = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&source as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NeighbourAdvertiser { socket, interface })
    }

    /// Sends one advertisement to `ff02::1` on the interface.
    pub fn send(&self, message: &[u8; NEIGHBOUR_ADVERTISEMENT_BYTES]) -> io::Result<()> {
        let destination = sockaddr_v6(ALL_NODES, self.interface.index);
        // SAFETY: the buffer and the address outlive the call, their lengths are given exactly.
        let sent = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
                (&destination as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn sockaddr_v6(ip: Ipv6Addr, scope_id: u32) -> libc::sockaddr_in6 {
    // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
    let mut address: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    address.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    address.sin6_addr.s6_addr = ip.octets();
    address.sin6_scope_id = scope_id;
    address
}

/// Sends [`ANNOUNCE_ROUNDS`] rounds of announcements for `ip` out of `interface`: gratuitous
/// ARP for IPv4, unsolicited neighbour advertisements for IPv6.
pub async fn announce(interface: InterfaceIdentity, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(ip) => announce_v4(interface, ip).await,
        IpAddr::V6(ip) => announce_v6(interface, ip).await,
    }
}

async fn announce_v4(interface: InterfaceIdentity, ip: Ipv4Addr) -> io::Result<()> {
    let sender = ArpSender::open(interface)?;
    for round in 0..ANNOUNCE_ROUNDS {
        if round > 0 {
            tokio::time::sleep(ANNOUNCE_SPACING).await;
        }
        for operation in [ArpOperation::Request, ArpOperation::Reply] {
            sender.send(&gratuitous_arp(interface.mac, ip, operation))?;
        }
    }
    Ok(())
}

async fn announce_v6(interface: InterfaceIdentity, ip: Ipv6Addr) -> io::Result<()> {
    let sender = NeighbourAdvertiser::open(interface, ip)?;
    let message = unsolicited_neighbour_advertisement(interface.mac, ip);
    for round in 0..ANNOUNCE_ROUNDS {
        if round > 0 {
            tokio::time::sleep(ANNOUNCE_SPACING).await;
        }
        sender.send(&message)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    #[test]
    fn request_frame_layout() {
        let frame = gratuitous_arp(MAC, Ipv4Addr::new(10, 0, 0, 100), ArpOperation::Request);
        let expected: [u8; ARP_FRAME_BYTES] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // destination: broadcast
            0x02, 0x11, 0x22, 0x33, 0x44, 0x55, // source: our MAC
            0x08, 0x06, // ARP
            0x00, 0x01, 0x08, 0x00, 6, 4, // Ethernet, IPv4, lengths
            0x00, 0x01, // request
            0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 10, 0, 0, 100, // sender: MAC, VIP
            0, 0, 0, 0, 0, 0, 10, 0, 0, 100, // target: zero MAC, VIP
        ];
        assert_eq!(frame, expected);
    }

    #[test]
    fn neighbour_advertisement_layout() {
        let ip: Ipv6Addr = "fd00:10::100".parse().unwrap();
        let message = unsolicited_neighbour_advertisement(MAC, ip);
        let mut expected = vec![
            136, 0, 0, 0, // neighbour advertisement, code 0, checksum left to the kernel
            0x20, 0, 0, 0, // override; not router, not solicited
        ];
        expected.extend_from_slice(&ip.octets()); // target
        expected.extend_from_slice(&[2, 1]); // target link-layer address option, 8 bytes
        expected.extend_from_slice(&MAC);
        assert_eq!(message.to_vec(), expected);
    }

    #[test]
    fn reply_frame_differs_in_opcode_and_target_mac() {
        let ip = Ipv4Addr::new(192, 168, 1, 7);
        let request = gratuitous_arp(MAC, ip, ArpOperation::Request);
        let reply = gratuitous_arp(MAC, ip, ArpOperation::Reply);
        assert_eq!(&reply[20..22], &[0, 2]);
        assert_eq!(&reply[32..38], &BROADCAST_MAC);
        assert_eq!(&reply[..20], &request[..20]);
        assert_eq!(&reply[22..32], &request[22..32]);
        assert_eq!(&reply[38..], &[192, 168, 1, 7]);
    }
}

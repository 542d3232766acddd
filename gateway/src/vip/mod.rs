//! The virtual IP: keepalived's role, built in.
//!
//! kubeadm's HA guide runs keepalived next to HAProxy on every control-plane node so that the
//! `--control-plane-endpoint` address moves to a live node. Here the gateways of the nodes
//! elect one *holder* of that virtual IP (VIP) through the store that the stacked topology
//! already runs on every node; the holder adds the VIP to its interface and announces it; the
//! others wait.
//!
//! * [`election`]: etcd's election recipe (lease, key per candidate, oldest key holds,
//!   candidates watch their predecessor) over the plain KV/Lease/Watch API, so it works
//!   against the store and against etcd 3.5 alike.
//! * [`fence`]: the fencing rule. The holder may keep the VIP only while it can prove its lease
//!   alive: the send time of its last acknowledged keep-alive plus the TTL bounds the lease's
//!   earliest expiry on the server; the holder drops the VIP half a second before that, and the
//!   address is added with a *kernel lifetime* that ends before it too, so even a holder that
//!   is killed (SIGKILL) or paused (SIGSTOP) loses the address by itself. A new holder is
//!   elected only after the old lease expired, hence two holders never hold the VIP at the
//!   same time (given the clock assumption stated there).
//! * [`address`]: `ip addr replace/del` with the lifetime (IPv6 with `nodad`); [`announce`]:
//!   gratuitous ARP for IPv4 (an ARP request and an ARP reply, broadcast from an `AF_PACKET`
//!   socket), an unsolicited neighbour advertisement to all nodes for IPv6.
//! * [`controller`]: the state machine: compete only while a backend is healthy, hold, and
//!   release at once when fenced, when the lease or the key disappears, when no backend is
//!   healthy, or on shutdown (releasing the address first, then revoking the lease so the next
//!   candidate takes over without waiting for the TTL).
//! * [`status`]: the admin API's `/api/vip` and the `gateway_vip_*` metrics.
//!
//! **Takeover time.** When the holder dies, its key lives until its lease expires: at most one
//! TTL after its last keep-alive, plus the store's expiry check (etcd checks every 500 ms),
//! plus the watch notification and an `ip addr add`. A holder that shuts down or loses its
//! backends resigns, and the next candidate takes over within milliseconds. A store leader
//! change renews every lease for a full TTL (etcd does this so that leases do not expire
//! because of the election), which can add one TTL to the takeover.
//!
//! **Why not VRRP.** keepalived's VRRP elects with multicast adverts among the nodes on one L2
//! segment: no shared state, sub-second adverts, but it cannot fence: a master that is paused
//! or killed keeps the address on its interface, and a partitioned master keeps announcing it
//! (split brain). The store is a consensus system already on every control-plane node, so a
//! lease there gives an election with a bounded, provable hand-over, at the price of depending
//! on a store quorum: without a quorum no gateway holds the VIP (and then the apiservers, which
//! need the same quorum, could not serve anyway).
//!
//! **IPv4 and IPv6.** An IPv6 VIP is added without duplicate address detection (`nodad`: DAD
//! would keep it unusable for a second, and the fenced election already keeps it unique) and
//! announced with unsolicited neighbour advertisements instead of gratuitous ARP; the
//! frontend binds it with `IPV6_FREEBIND` before it arrives, as `IP_FREEBIND` for IPv4.
//!
//! **Privileges.** Adding addresses needs `CAP_NET_ADMIN`, the raw ARP and ICMPv6 sockets
//! `CAP_NET_RAW`.

pub mod address;
pub mod announce;
pub mod controller;
pub mod election;
pub mod error;
pub mod fence;
pub mod status;

pub use controller::{Controller, HealthProbe};
pub use error::{AddressError, ElectionError};
pub use status::{ReleaseReason, VipMonitor, VipState, VipStatus};

//! Socket setup shared by listeners and backend connections.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream};

/// Accept backlog: absorbs a reconnect storm of every kubelet after a control-plane blip
/// (thousands of SYNs within a second) without the kernel dropping them.
pub const LISTEN_BACKLOG: i32 = 4096;
/// Interval between unanswered keepalive probes once probing started.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel declares the peer dead: with the 30 s default idle
/// time a vanished peer is detected after about one minute.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Binds a listener with `SO_REUSEADDR`, so a restarted gateway can bind while old
/// connections linger in `TIME_WAIT`.
pub fn bind_listener(address: SocketAddr) -> io::Result<TcpListener> {
    bind_listener_with(address, false)
}

/// [`bind_listener`], with `IP_FREEBIND` when `nonlocal`: the listener binds an address that
/// is not (yet) on any interface, the VIP on a gateway that does not hold it, and accepts
/// connections to it once the VIP arrives.
pub fn bind_listener_with(address: SocketAddr, nonlocal: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if nonlocal && address.is_ipv4() {
        socket.set_freebind_v4(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Disables Nagle (the gateway relays what it reads at once, TLS records included) and enables
/// TCP keepalive with `idle` before the first probe. Failures are logged, not fatal: the
/// connection still works without them.
pub fn configure_stream(stream: &TcpStream, idle: Duration) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
    let keepalive = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    if let Err(error) = SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "cannot enable TCP keepalive");
    }
}

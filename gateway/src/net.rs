//! Socket setup shared by listeners and backend connections.
//!
//! Accepted connections take their TCP options from the listener: Linux copies the listening
//! socket's `TCP_NODELAY` and keepalive settings (`SO_KEEPALIVE`, `TCP_KEEPIDLE`,
//! `TCP_KEEPINTVL`, `TCP_KEEPCNT`) into every socket it accepts. So the options are set once
//! per listener and frontend generation ([`configure_listener`]), not with five `setsockopt`
//! calls per accepted connection. Backend connections are set up one by one
//! ([`configure_stream`]).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use std::os::fd::AsFd;

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
    TcpListener::from_std(bind_std_listener(address, false, false)?)
}

/// Binds `count` listening sockets to `address` for one frontend: one without relay threads,
/// one per relay thread otherwise, all with `SO_REUSEPORT` so the kernel spreads the incoming
/// connections over them (see [`crate::relays`]). HAProxy sets `SO_REUSEPORT` on its
/// listeners too. With `nonlocal`, `IP_FREEBIND` (`IPV6_FREEBIND`): the listeners bind an
/// address that is not (yet) on any interface, the VIP on a gateway that does not hold it,
/// and accept connections to it once the VIP arrives. With port 0 the first socket picks the
/// port and the others join it.
pub fn bind_listeners(
    address: SocketAddr,
    nonlocal: bool,
    count: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    let reuse_port = count > 1;
    let first = bind_std_listener(address, nonlocal, reuse_port)?;
    let address = first.local_addr()?;
    let mut listeners = Vec::with_capacity(count);
    listeners.push(first);
    for _ in 1..count {
        listeners.push(bind_std_listener(address, nonlocal, reuse_port)?);
    }
    Ok(listeners)
}

/// A non-blocking listening socket, not yet registered with any reactor.
fn bind_std_listener(
    address: SocketAddr,
    nonlocal: bool,
    reuse_port: bool,
) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if nonlocal {
        if address.is_ipv4() {
            socket.set_freebind_v4(true)?;
        } else {
            socket.set_freebind_v6(true)?;
        }
    }
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Sets the options of [`configure_stream`] on `listener`, so every connection it accepts
/// from now on inherits them. Failures are logged, not fatal.
pub fn configure_listener(listener: &TcpListener, idle: Duration) {
    configure_socket(listener, idle);
}

/// Disables Nagle (the gateway relays what it reads at once, TLS records included) and enables
/// TCP keepalive with `idle` before the first probe. Failures are logged, not fatal: the
/// connection still works without them.
pub fn configure_stream(stream: &TcpStream, idle: Duration) {
    configure_socket(stream, idle);
}

fn configure_socket(socket: &impl AsFd, idle: Duration) {
    let socket = SockRef::from(socket);
    if let Err(error) = socket.set_tcp_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
    let keepalive = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    if let Err(error) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "cannot enable TCP keepalive");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keepalive idle time of the test listener, distinct from the kernel default (7200 s).
    const TEST_IDLE: Duration = Duration::from_secs(37);

    #[tokio::test]
    async fn accepted_connections_inherit_the_listener_options() {
        let listener = bind_listener("127.0.0.1:0".parse().expect("address")).expect("bind");
        configure_listener(&listener, TEST_IDLE);
        let address = listener.local_addr().expect("address");
        let (_client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        let (stream, _peer) = accepted.expect("accept");
        let socket = SockRef::from(&stream);
        assert!(socket.tcp_nodelay().expect("TCP_NODELAY"));
        assert!(socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            socket.tcp_keepalive_time().expect("TCP_KEEPIDLE"),
            TEST_IDLE
        );
        assert_eq!(
            socket.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            TCP_KEEPALIVE_INTERVAL
        );
        assert_eq!(
            socket.tcp_keepalive_retries().expect("TCP_KEEPCNT"),
            TCP_KEEPALIVE_RETRIES
        );
    }

    /// Accepts whatever is pending on `listener` (non-blocking).
    fn drain(listener: &std::net::TcpListener) -> usize {
        let mut accepted = 0;
        while listener.accept().is_ok() {
            accepted += 1;
        }
        accepted
    }

    #[test]
    fn a_frontends_listeners_share_the_address_and_the_connections() {
        const CONNECTIONS: usize = 64;
        let listeners =
            bind_listeners("127.0.0.1:0".parse().expect("address"), false, 2).expect("bind");
        let address = listeners[0].local_addr().expect("address");
        assert_eq!(listeners[1].local_addr().expect("address"), address);
        assert!(SockRef::from(&listeners[0])
            .reuse_port()
            .expect("SO_REUSEPORT"));
        let clients: Vec<_> = (0..CONNECTIONS)
            .map(|_| std::net::TcpStream::connect(address).expect("connect"))
            .collect();
        let per_listener: Vec<usize> = listeners.iter().map(drain).collect();
        assert_eq!(per_listener.iter().sum::<usize>(), clients.len());
        // Each connection lands on one by a hash of its ports: all 64 on one listener would
        // have a chance of 2^-63.
        assert!(per_listener.iter().all(|&n| n > 0), "{per_listener:?}");
    }

    #[test]
    fn a_single_listener_keeps_its_port_to_itself() {
        let listeners =
            bind_listeners("127.0.0.1:0".parse().expect("address"), false, 1).expect("bind");
        assert_eq!(listeners.len(), 1);
        let address = listeners[0].local_addr().expect("address");
        assert!(!SockRef::from(&listeners[0])
            .reuse_port()
            .expect("SO_REUSEPORT"));
        let second = bind_listeners(address, false, 1).expect_err("the port is taken");
        assert_eq!(second.kind(), io::ErrorKind::AddrInUse);
    }
}

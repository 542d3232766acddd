//! Socket setup shared by listeners and backend connections.
//!
//! Accepted connections take their TCP options from the listener: Linux copies the listening
//! socket's `TCP_NODELAY` and keepalive settings (`SO_KEEPALIVE`, `TCP_KEEPIDLE`,
//! `TCP_KEEPINTVL`, `TCP_KEEPCNT`) into every socket it accepts. So the options are set once
//! per listener and frontend generation ([`configure_listener`]), not with five `setsockopt`
//! calls per accepted connection. Backend connections are set up one by one: Nagle and
//! delayed ACKs before they connect ([`connect_stream`]), keepalive only once the relay has
//! lasted [`BACKEND_KEEPALIVE_AFTER`] ([`enable_keepalive`], run by the relay). Keepalive is
//! for connections that sit idle for long (watches); most connections through a control-plane
//! endpoint are shorter than a second and never pay its four `setsockopt` calls, and a
//! connection that falls silent at once has its first probe at most that second later.
//!
//! # One ACK fewer on each leg, the accept woken with the ClientHello in hand
//!
//! The gateway relays TLS, where the client speaks first. Unless a frontend says its protocol
//! is one where the server speaks first (`client_speaks_first = false`,
//! `--server-speaks-first`), three settings use that (HAProxy has each as an option, off in
//! its `mode tcp` by default: `bind ... defer-accept`, `option tcp-smart-accept`,
//! `option tcp-smart-connect`):
//!
//! - **`TCP_DEFER_ACCEPT`** on the listeners ([`DEFER_ACCEPT`]): the kernel drops the client's
//!   bare ACK that ends the handshake and queues the connection for `accept` when its first
//!   bytes arrive, so one wake-up accepts the connection with the ClientHello readable (no
//!   read that ends in `EAGAIN`). A client that stays silent is accepted anyway when the
//!   period ends (the kernel resends its SYN-ACK and takes the client's next ACK), so a
//!   server-speaks-first protocol still works, [`DEFER_ACCEPT`] late.
//! - **Delayed ACKs on the client leg** (`TCP_QUICKACK` off on the listeners; accepted sockets
//!   inherit it): the ClientHello is acknowledged by the first bytes the gateway sends back
//!   (the server's flight), not by a packet of its own.
//! - **Delayed handshake ACK on the backend leg** (`TCP_QUICKACK` off before `connect`): the
//!   ACK of the backend's SYN-ACK rides on the ClientHello that the relay writes as soon as
//!   the connect completes; the backend is woken once, with the connection and its first
//!   bytes. If nothing is written, the kernel sends the ACK on its delayed-ACK timer.
//!
//! On loopback every packet is a pass through the peer's TCP input on the sender's CPU, and
//! every separate arrival a wake-up of the receiver; docs/benchmarks.md has the measurement.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use std::os::fd::{AsFd, AsRawFd};

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Accept backlog: absorbs a reconnect storm of every kubelet after a control-plane blip
/// (thousands of SYNs within a second) without the kernel dropping them.
pub const LISTEN_BACKLOG: i32 = 4096;
/// Interval between unanswered keepalive probes once probing started.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel declares the peer dead: with the 30 s default idle
/// time a vanished peer is detected after about one minute.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// How long a relay runs before its backend socket gets TCP keepalive (module docs).
pub const BACKEND_KEEPALIVE_AFTER: Duration = Duration::from_secs(1);

/// How long the kernel holds a connection whose client has not sent anything before queueing
/// it for `accept` anyway (`TCP_DEFER_ACCEPT`, whole seconds; the kernel rounds it to SYN-ACK
/// retransmissions, the first of which is one second after the SYN).
pub const DEFER_ACCEPT: Duration = Duration::from_secs(1);

/// TCP settings of one frontend's sockets, both legs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// Keepalive idle time before the first probe.
    pub keepalive_idle: Duration,
    /// The protocol's client sends first (TLS, HTTP): defer accepts and delay ACKs (module
    /// docs). Off for protocols where the server sends first (SMTP, MySQL), which would
    /// otherwise wait [`DEFER_ACCEPT`] for the accept and the delayed-ACK timer for the
    /// backend's accept.
    pub client_speaks_first: bool,
}

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

/// Sets the options of [`connect_stream`] and keepalive on `listener`, so every connection it
/// accepts from now on inherits them (at no cost per connection), and (client speaks first)
/// defers each accept until the client's first bytes arrive ([`DEFER_ACCEPT`]); without,
/// clears a deferral set before (a reload may change it on a listener handed over). Failures
/// are logged, not fatal.
pub fn configure_listener(listener: &TcpListener, options: SocketOptions) {
    configure_socket(listener, options);
    enable_keepalive(listener, options.keepalive_idle);
    let seconds = if options.client_speaks_first {
        libc::c_int::try_from(DEFER_ACCEPT.as_secs()).unwrap_or(libc::c_int::MAX)
    } else {
        0
    };
    if let Err(error) = set_int_option(listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, seconds)
    {
        tracing::debug!(%error, "cannot set TCP_DEFER_ACCEPT");
    }
}

/// Connects to `address` (`host:port`; each resolved address in turn, as
/// `TcpStream::connect`) with the options of a relayed connection set before the SYN: Nagle
/// off (the gateway relays what it reads at once, TLS records included) and (client speaks
/// first) the handshake's last ACK left to ride on the first bytes written. Keepalive comes
/// later ([`enable_keepalive`]). Option failures are logged, not fatal: the connection works
/// without them.
pub async fn connect_stream(address: &str, options: SocketOptions) -> io::Result<TcpStream> {
    let mut last_error = None;
    for resolved in tokio::net::lookup_host(address).await? {
        let socket = if resolved.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        configure_socket(&socket, options);
        match socket.connect(resolved).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

/// `setsockopt(2)` of an `int` option: for the options that neither socket2 nor stable std
/// wrap (`TCP_DEFER_ACCEPT`, the VIP announcer's IPv6 multicast options).
pub(crate) fn set_int_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    let length = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .expect("an int's size fits socklen_t");
    // SAFETY: the descriptor is open for the borrow's duration; the kernel reads `length`
    // bytes from a live `c_int`.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(&value).cast(),
            length,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Nagle off, delayed ACKs if the client speaks first (see the module docs).
fn configure_socket(socket: &impl AsFd, options: SocketOptions) {
    let socket = SockRef::from(socket);
    if let Err(error) = socket.set_tcp_quickack(!options.client_speaks_first) {
        tracing::debug!(%error, "cannot set TCP_QUICKACK");
    }
    if let Err(error) = socket.set_tcp_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}

/// TCP keepalive: the first probe after `idle` without traffic, then every
/// [`TCP_KEEPALIVE_INTERVAL`], the peer declared dead after [`TCP_KEEPALIVE_RETRIES`]
/// unanswered. A failure is logged, not fatal.
pub fn enable_keepalive(socket: &impl AsFd, idle: Duration) {
    let keepalive = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    if let Err(error) = SockRef::from(socket).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "cannot enable TCP keepalive");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keepalive idle time of the test listener, distinct from the kernel default (7200 s).
    const TEST_IDLE: Duration = Duration::from_secs(37);
    /// Longest wait for a silent client's deferred accept: the deferral plus the kernel's
    /// SYN-ACK retransmission and the client's ACK, with room for a loaded machine.
    const DEFERRED_ACCEPT_DEADLINE: Duration = Duration::from_secs(10);

    fn options(client_speaks_first: bool) -> SocketOptions {
        SocketOptions {
            keepalive_idle: TEST_IDLE,
            client_speaks_first,
        }
    }

    fn int_option(socket: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut value: libc::c_int = -1;
        let mut length = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
            .expect("an int's size fits socklen_t");
        // SAFETY: the kernel writes at most `length` bytes into a live `c_int`.
        let result = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                level,
                name,
                std::ptr::from_mut(&mut value).cast(),
                &mut length,
            )
        };
        assert_eq!(result, 0, "getsockopt: {}", io::Error::last_os_error());
        value
    }

    /// Keepalive is on with the test idle time and the gateway's interval and retries.
    fn assert_keepalive(socket: &SockRef<'_>) {
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

    /// A listener configured with `options`, a client that sent `first_bytes`, the accepted end.
    async fn accepted(
        options: SocketOptions,
        first_bytes: &[u8],
    ) -> (TcpListener, TcpStream, TcpStream) {
        use tokio::io::AsyncWriteExt;
        let listener = bind_listener("127.0.0.1:0".parse().expect("address")).expect("bind");
        configure_listener(&listener, options);
        let mut client = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        client.write_all(first_bytes).await.expect("write");
        let (stream, _peer) = tokio::time::timeout(DEFERRED_ACCEPT_DEADLINE, listener.accept())
            .await
            .expect("accepted within the deadline")
            .expect("accept");
        (listener, client, stream)
    }

    #[tokio::test]
    async fn accepted_connections_inherit_the_listener_options() {
        let (listener, _client, stream) = accepted(options(true), b"hello").await;
        assert_eq!(
            int_option(&listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
            1,
            "the deferral is {DEFER_ACCEPT:?}"
        );
        let socket = SockRef::from(&stream);
        assert!(socket.tcp_nodelay().expect("TCP_NODELAY"));
        assert!(
            !socket.tcp_quickack().expect("TCP_QUICKACK"),
            "delayed ACKs are inherited"
        );
        assert_keepalive(&socket);
    }

    #[tokio::test]
    async fn a_server_first_listener_accepts_at_once_and_acknowledges_at_once() {
        let (listener, _client, stream) = accepted(options(false), b"").await;
        assert_eq!(
            int_option(&listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
            0
        );
        assert!(SockRef::from(&stream).tcp_quickack().expect("TCP_QUICKACK"));
    }

    #[tokio::test]
    async fn a_silent_client_is_accepted_when_the_deferral_ends() {
        let started = std::time::Instant::now();
        let (_listener, _client, _stream) = accepted(options(true), b"").await;
        assert!(
            started.elapsed() >= DEFER_ACCEPT / 2,
            "accepted after {:?}, before the client sent anything",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn connect_stream_sets_nagle_before_the_handshake_and_keepalive_comes_later() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (connected, accepted) =
            tokio::join!(connect_stream(&address, options(true)), listener.accept());
        let mut stream = connected.expect("connect");
        let (mut server, _peer) = accepted.expect("accept");
        let socket = SockRef::from(&stream);
        assert!(socket.tcp_nodelay().expect("TCP_NODELAY"));
        assert!(!socket.keepalive().expect("SO_KEEPALIVE"));
        enable_keepalive(&stream, TEST_IDLE);
        let socket = SockRef::from(&stream);
        assert_keepalive(&socket);
        stream.write_all(b"hello").await.expect("write");
        let mut hello = [0u8; 5];
        server.read_exact(&mut hello).await.expect("read");
        assert_eq!(&hello, b"hello");
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

//! A relay for the traffic between members that delays it on chosen links:
//! slow networks, without `netem` (this machine has none).
//!
//! In a namespaced cluster ([`crate::netns`]) every member advertises a
//! *relay address* as its peer URL instead of its own: member `i`'s peers
//! connect to `relay_ip(i):2380`, an address of the test process's
//! interface, where the relay accepts, recognizes the caller `j` by its
//! source address, and connects on to member `i`'s own address from
//! `relay_ip(j)`, so `i` sees the connection come from `j`'s relay
//! address. Cutting a link in the topology blackholes both addresses of
//! the other member, so partitions still apply to relayed connections.
//!
//! Each direction of a relayed connection is a queue: every chunk read is
//! stamped with the instant it may leave (read time plus the link's delay
//! at that moment) and written once that instant has passed, in order. A
//! delay that shrinks never reorders bytes (a later chunk waits for the
//! earlier ones), as TCP would not. A queue holds at most
//! [`MAX_QUEUED_CHUNKS`] chunks of [`CHUNK_BYTES`]; past that the relay
//! stops reading and TCP's flow control slows the sender.
//!
//! The relay's tasks run on the test's tokio runtime and stop when the
//! [`Relay`] is dropped (accept loops are aborted; a connection's pumps end
//! with their sockets).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::net::PEER_PORT;

/// Largest chunk read from one side before it is queued for the other.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks one direction of a connection holds before the relay stops
/// reading (at most 16 MiB per direction).
pub const MAX_QUEUED_CHUNKS: usize = 256;
/// Deadline for connecting on to the target member.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One member as the relay sees it.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint {
    /// The member's own address (it listens for peers there).
    pub ip: Ipv4Addr,
    /// The address its peers reach it through (the relay listens there).
    pub relay_ip: Ipv4Addr,
}

/// Per-link delays in microseconds, `members x members`, kept symmetric,
/// and the bytes relayed so far.
struct Delays {
    members: usize,
    micros: Vec<AtomicU64>,
    relayed: AtomicU64,
}

impl Delays {
    fn new(members: usize) -> Self {
        Self {
            members,
            micros: (0..members * members).map(|_| AtomicU64::new(0)).collect(),
            relayed: AtomicU64::new(0),
        }
    }

    fn get(&self, from: usize, to: usize) -> Duration {
        Duration::from_micros(self.micros[from * self.members + to].load(Ordering::Relaxed))
    }

    fn set(&self, a: usize, b: usize, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.micros[a * self.members + b].store(micros, Ordering::Relaxed);
        self.micros[b * self.members + a].store(micros, Ordering::Relaxed);
    }
}

/// The running relay. See the module documentation.
pub struct Relay {
    delays: Arc<Delays>,
    accept_loops: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Listens on every endpoint's relay address (port 2380); the relay
    /// addresses must already exist on an interface of this namespace.
    /// Must be called within a tokio runtime, which runs the relay.
    pub fn start(endpoints: Vec<Endpoint>) -> Result<Relay> {
        let endpoints = Arc::new(endpoints);
        let delays = Arc::new(Delays::new(endpoints.len()));
        // Every address is bound before any loop starts: a failed start
        // leaves no listener behind.
        let mut listeners = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints.iter() {
            let address = SocketAddrV4::new(endpoint.relay_ip, PEER_PORT);
            let listener = std::net::TcpListener::bind(address)
                .with_context(|| format!("the relay binding {address}"))?;
            listener.set_nonblocking(true)?;
            listeners.push(TcpListener::from_std(listener)?);
        }
        let mut accept_loops = Vec::with_capacity(endpoints.len());
        for (target, listener) in listeners.into_iter().enumerate() {
            accept_loops.push(tokio::spawn(accept_loop(
                listener,
                target,
                endpoints.clone(),
                delays.clone(),
            )));
        }
        Ok(Relay {
            delays,
            accept_loops,
        })
    }

    /// Delays everything between members `a` and `b`, both ways, by `delay`
    /// from now on (bytes already queued keep their instants).
    pub fn set_delay(&self, a: usize, b: usize, delay: Duration) -> Result<()> {
        let members = self.delays.members;
        ensure!(
            a != b && a < members && b < members,
            "no link between members {a} and {b} of {members}"
        );
        self.delays.set(a, b, delay);
        Ok(())
    }

    /// The delay between `a` and `b` now.
    pub fn delay(&self, a: usize, b: usize) -> Duration {
        self.delays.get(a, b)
    }

    /// Bytes passed on so far, both directions of every connection: a
    /// cluster whose members talk to each other through the relay has
    /// some, so a test can tell that its delays bite.
    pub fn relayed_bytes(&self) -> u64 {
        self.delays.relayed.load(Ordering::Relaxed)
    }

    /// No delay on any link from now on.
    pub fn clear_delays(&self) {
        let members = self.delays.members;
        for a in 0..members {
            for b in (a + 1)..members {
                self.delays.set(a, b, Duration::ZERO);
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for task in &self.accept_loops {
            task.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: usize,
    endpoints: Arc<Vec<Endpoint>>,
    delays: Arc<Delays>,
) {
    loop {
        let Ok((caller, from)) = listener.accept().await else {
            // Out of descriptors or similar: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let source = endpoints.iter().position(|e| match from {
            SocketAddr::V4(v4) => *v4.ip() == e.ip,
            SocketAddr::V6(_) => false,
        });
        let Some(source) = source else {
            // Only members connect to peer ports; anything else is dropped.
            continue;
        };
        tokio::spawn(relay_connection(
            caller,
            endpoints[source].relay_ip,
            endpoints[target].ip,
            Link {
                delays: delays.clone(),
                from: source,
                to: target,
            },
        ));
    }
}

/// One direction of a relayed connection: whose delay it takes.
#[derive(Clone)]
struct Link {
    delays: Arc<Delays>,
    from: usize,
    to: usize,
}

impl Link {
    fn reversed(&self) -> Link {
        Link {
            delays: self.delays.clone(),
            from: self.to,
            to: self.from,
        }
    }

    fn delay(&self) -> Duration {
        self.delays.get(self.from, self.to)
    }
}

/// Connects on to `target` from `source_ip` and pumps both directions until
/// both end; a failed connect closes the caller's connection.
async fn relay_connection(caller: TcpStream, source_ip: Ipv4Addr, target: Ipv4Addr, link: Link) {
    let Ok(upstream) = connect_from(source_ip, target).await else {
        return;
    };
    let _ = caller.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (caller_read, caller_write) = caller.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let back = link.reversed();
    tokio::join!(
        pump(caller_read, upstream_write, link),
        pump(upstream_read, caller_write, back),
    );
}

async fn connect_from(source_ip: Ipv4Addr, target: Ipv4Addr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::V4(SocketAddrV4::new(source_ip, 0)))?;
    let address = SocketAddr::V4(SocketAddrV4::new(target, PEER_PORT));
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(address))
        .await
        .context("connect timed out")??;
    Ok(stream)
}

/// Copies `from` to `to`, each chunk held back by the link's delay at the
/// time it was read. At end of input the queue drains and `to` is shut
/// down for writing; an error on either side ends both.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, link: Link) {
    let (queue, mut queued) = mpsc::channel::<(Instant, Vec<u8>)>(MAX_QUEUED_CHUNKS);
    let delays = link.delays.clone();
    let reader = async move {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            let n = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let due = Instant::now() + link.delay();
            if queue.send((due, buffer[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = queued.recv().await {
            // A chunk already due goes at once: tokio's timer would round
            // `due` up to its next 1 ms tick even with no delay set.
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            let bytes = chunk.len() as u64;
            delays.relayed.fetch_add(bytes, Ordering::Relaxed);
        }
        let _ = to.shutdown().await;
    };
    // The writer ends when the reader has dropped the queue and the queue
    // is drained, or at a write error (dropping the queue, so the reader's
    // next send fails and it stops too).
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::allocate_ip;

    /// Attempts at allocating the two members' addresses: an address is
    /// probed free when allocated, but a process outside this one may bind
    /// it before the relay does.
    const ALLOCATION_ATTEMPTS: usize = 3;

    /// Two "members" on loopback addresses, each with a relay address; a
    /// server on member 1's peer port answers every line with the caller's
    /// address and the line.
    async fn two_members() -> (Vec<Endpoint>, Relay) {
        let mut last_error = None;
        for _ in 0..ALLOCATION_ATTEMPTS {
            match try_two_members().await {
                Ok(members) => return members,
                Err(error) => last_error = Some(error),
            }
        }
        panic!("{:?}", last_error.expect("at least one attempt"));
    }

    async fn try_two_members() -> Result<(Vec<Endpoint>, Relay)> {
        let mut endpoints = Vec::with_capacity(2);
        for _ in 0..2 {
            endpoints.push(Endpoint {
                ip: allocate_ip()?,
                relay_ip: allocate_ip()?,
            });
        }
        let server = TcpListener::bind((endpoints[1].ip, PEER_PORT))
            .await
            .context("the server binding member 1's peer port")?;
        // The relay first: a failed attempt leaves no server task behind.
        let relay = Relay::start(endpoints.clone())?;
        tokio::spawn(async move {
            while let Ok((mut stream, from)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer).await {
                        if n == 0 {
                            return;
                        }
                        let answer = format!("{} ", from.ip());
                        let mut reply = answer.into_bytes();
                        reply.extend_from_slice(&buffer[..n]);
                        if stream.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok((endpoints, relay))
    }

    /// A connection from member 0's address to member 1's relay address,
    /// as a member's peer connection.
    async fn member_0_to_member_1(endpoints: &[Endpoint]) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::V4(SocketAddrV4::new(endpoints[0].ip, 0)))
            .unwrap();
        let relay = SocketAddrV4::new(endpoints[1].relay_ip, PEER_PORT);
        socket.connect(SocketAddr::V4(relay)).await.unwrap()
    }

    /// Member 0 sends `line` to member 1 through the relay; the answer and
    /// the round trip's duration.
    async fn round_trip(stream: &mut TcpStream, line: &str) -> (String, Duration) {
        let started = Instant::now();
        stream.write_all(line.as_bytes()).await.unwrap();
        let mut buffer = vec![0u8; 1024];
        let n = stream.read(&mut buffer).await.unwrap();
        (
            String::from_utf8_lossy(&buffer[..n]).into_owned(),
            started.elapsed(),
        )
    }

    #[tokio::test]
    async fn relayed_bytes_come_from_the_callers_relay_address_and_wait_out_the_delay() {
        let (endpoints, relay) = two_members().await;
        let mut stream = member_0_to_member_1(&endpoints).await;
        let (answer, _) = round_trip(&mut stream, "hello").await;
        assert_eq!(answer, format!("{} hello", endpoints[0].relay_ip));
        let relayed = "hello".len() + answer.len();
        assert_eq!(relay.relayed_bytes(), relayed as u64);

        let delay = Duration::from_millis(150);
        relay.set_delay(1, 0, delay).unwrap();
        assert_eq!(relay.delay(0, 1), delay);
        let (answer, took) = round_trip(&mut stream, "slow").await;
        assert_eq!(answer, format!("{} slow", endpoints[0].relay_ip));
        // Each way waits out the delay: never sooner than twice of it.
        assert!(took >= 2 * delay, "{took:?}");

        relay.clear_delays();
        assert_eq!(relay.delay(0, 1), Duration::ZERO);
        let (answer, _) = round_trip(&mut stream, "again").await;
        assert_eq!(answer, format!("{} again", endpoints[0].relay_ip));
        assert!(relay.set_delay(0, 0, delay).is_err());
        assert!(relay.set_delay(0, 2, delay).is_err());
    }

    #[tokio::test]
    async fn a_shrinking_delay_keeps_the_bytes_in_order() {
        let (endpoints, relay) = two_members().await;
        let mut stream = member_0_to_member_1(&endpoints).await;
        let (mut read, mut write) = stream.split();
        relay.set_delay(0, 1, Duration::from_millis(300)).unwrap();
        write.write_all(b"first;").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        relay.clear_delays();
        write.write_all(b"second;").await.unwrap();
        let mut got = Vec::new();
        let mut buffer = vec![0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("second;") {
            let n = read.read(&mut buffer).await.unwrap();
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buffer[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        let first = text.find("first;").expect("first line answered");
        assert!(first < text.find("second;").unwrap(), "{text}");
    }

    #[test]
    fn delays_are_symmetric_and_cleared() {
        let delays = Delays::new(3);
        delays.set(0, 2, Duration::from_millis(250));
        assert_eq!(delays.get(0, 2), Duration::from_millis(250));
        assert_eq!(delays.get(2, 0), Duration::from_millis(250));
        assert_eq!(delays.get(0, 1), Duration::ZERO);
        assert_eq!(delays.get(1, 2), Duration::ZERO);
    }
}

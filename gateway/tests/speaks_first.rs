//! Protocols where the server sends first still work through a gateway that defers accepts
//! until the client's first bytes (its default, for TLS), and `--server-speaks-first` accepts
//! them at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use gateway::net::DEFER_ACCEPT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the backend sends as soon as it accepts a connection (an SMTP-like greeting).
const BANNER: &[u8] = b"220 ready\r\n";
/// Longest wait for the banner: the gateway's deferral (1 s) and the kernel's SYN-ACK
/// retransmission, with room for a loaded machine.
const BANNER_DEADLINE: Duration = Duration::from_secs(10);

/// A backend that greets each connection with [`BANNER`], then echoes one line.
async fn greeting_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                stream.write_all(BANNER).await?;
                let mut line = [0u8; 64];
                let read = stream.read(&mut line).await?;
                stream.write_all(&line[..read]).await
            });
        }
    });
    address
}

/// Starts a gateway in front of a greeting backend; `extra` are more flags.
async fn gateway(extra: &[&str]) -> Gateway {
    let backend = greeting_backend().await;
    let listen = free_local_address();
    let mut args = vec![
        "--listen".to_string(),
        listen.to_string(),
        "--backend".to_string(),
        backend.to_string(),
        "--check".to_string(),
        "tcp".to_string(),
    ];
    args.extend(extra.iter().map(|flag| flag.to_string()));
    Gateway::start_with_args(listen, &args).await
}

/// Connects without sending, reads the banner, then checks one echoed line; returns how long
/// the banner took.
async fn greeted(address: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut client = TcpStream::connect(address).await.unwrap();
    let mut banner = vec![0u8; BANNER.len()];
    tokio::time::timeout(BANNER_DEADLINE, client.read_exact(&mut banner))
        .await
        .expect("the banner arrives")
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(banner, BANNER);
    client.write_all(b"ping\r\n").await.unwrap();
    let mut echo = [0u8; 6];
    client.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping\r\n");
    waited
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_first_protocol_works_through_a_deferring_frontend() {
    let gateway = gateway(&[]).await;
    let waited = greeted(gateway.listen).await;
    assert!(
        waited >= DEFER_ACCEPT / 2,
        "banner after {waited:?}: the accept was not deferred"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_speaks_first_accepts_at_once() {
    let gateway = gateway(&["--server-speaks-first"]).await;
    let waited = greeted(gateway.listen).await;
    assert!(
        waited < DEFER_ACCEPT,
        "banner after {waited:?}, as late as a deferred accept"
    );
}

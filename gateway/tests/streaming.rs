//! A watch-like streaming response through nginx and the gateway survives a silence longer
//! than every idle timeout that breaks `kubectl logs -f`/watches behind HAProxy: kubeadm's
//! guide (35 s client/server), kind/CAPD (50 s) and client-go's ping window (45 s).

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Silence between two events: longer than the longest HAProxy default in the kubeadm role
/// (50 s), so a gateway with HAProxy-like idle timeouts would cut the stream.
const SILENCE: Duration = Duration::from_secs(55);

/// A tiny HTTP/1.1 upstream that answers one chunked response: `event-1`, silence, `event-2`.
async fn watch_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut chunk = [0u8; 1024];
        while !request.windows(4).any(|window| window == b"\r\n\r\n") {
            let read = stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "request ended early");
            request.extend_from_slice(&chunk[..read]);
        }
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(b"8\r\nevent-1\n\r\n").await.unwrap();
        tokio::time::sleep(SILENCE).await;
        stream
            .write_all(b"8\r\nevent-2\n\r\n0\r\n\r\n")
            .await
            .unwrap();
        stream.shutdown().await.unwrap();
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_like_stream_survives_long_silence_with_default_timeouts() {
    let pki = Pki::new();
    let upstream = watch_upstream().await;
    let backend = Nginx::start(&pki, "cp1", Some(upstream)).await;
    let listen = free_local_address();
    // Flags mode with every timeout at its default.
    let args = vec![
        "--listen".to_string(),
        listen.to_string(),
        "--backend".to_string(),
        backend.host_port(),
        "--check".to_string(),
        "https:/readyz".to_string(),
    ];
    let gateway = Gateway::start_with_args(listen, &args).await;
    let mut client = TlsClient::connect(&pki, gateway.listen).await.unwrap();
    client
        .stream
        .write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let deadline = SILENCE + Duration::from_secs(60);
    let read_all = async {
        let mut chunk = [0u8; 1024];
        loop {
            let read = client.stream.read(&mut chunk).await?;
            if read == 0 {
                return Ok::<_, std::io::Error>(());
            }
            received.extend_from_slice(&chunk[..read]);
            if received.windows(5).any(|window| window == b"0\r\n\r\n") {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(deadline, read_all)
        .await
        .expect("stream finished")
        .expect("no error");
    let text = String::from_utf8_lossy(&received);
    assert!(text.contains("event-1"), "{text}");
    assert!(
        text.contains("event-2"),
        "the stream survived {SILENCE:?} of silence: {text}"
    );
}

/// `/proc/net/tcp`'s timer code of a socket whose keepalive timer is armed.
const KEEPALIVE_TIMER: u8 = 2;
/// `/proc/net/tcp`'s state code of an established socket.
const ESTABLISHED: u8 = 1;

/// Timer codes of the established IPv4 sockets connected to `remote`, from `/proc/net/tcp`
/// (addresses as little-endian hex, `tr` the active timer: 0 none, 1 retransmit, 2 keepalive).
fn timers_of_sockets_to(remote: SocketAddr) -> Vec<u8> {
    let SocketAddr::V4(remote) = remote else {
        panic!("the test backends are IPv4");
    };
    let wanted = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(remote.ip().octets()),
        remote.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
            let timer = u8::from_str_radix(fields.get(5)?.split(':').next()?, 16).ok()?;
            (fields.get(2)? == &wanted && state == ESTABLISHED).then_some(timer)
        })
        .collect()
}

/// The backend leg of a relayed connection gets TCP keepalive once the connection has
/// lasted a second (it is not set at connect, so short connections skip its system calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lasting_connection_gets_keepalive_on_its_backend_leg() {
    let pki = Pki::new();
    let backend = Nginx::start(&pki, "cp1", None).await;
    let listen = free_local_address();
    let gateway =
        Gateway::start_with_config(listen, &config_toml(listen, &[&backend], "", "")).await;
    let mut client = TlsClient::connect(&pki, gateway.listen).await.unwrap();
    assert_eq!(client.get("/").await.unwrap().trim(), "cp1");
    let nginx: SocketAddr = backend.host_port().parse().unwrap();
    wait_for(
        "keepalive armed on the backend leg",
        STARTUP_DEADLINE,
        || async { timers_of_sockets_to(nginx).contains(&KEEPALIVE_TIMER) },
    )
    .await;
    drop(client);
}

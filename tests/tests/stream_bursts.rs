//! Requests sent in a burst on one stream, each in an HTTP/2 DATA frame of
//! its own, by a client that reads no answer until it has sent them all.
//!
//! etcd clients send such bursts: `clientv3` multiplexes all of a client's
//! watchers onto one Watch stream, and sends the renewals of all its leases
//! on one LeaseKeepAlive stream every 500 ms. The scenarios speak HTTP/2
//! themselves (the `h2` crate) so that each request is a small DATA frame
//! of its own (a tonic client merges the messages that are ready together)
//! and so that the client's receive window is small
//! ([`CLIENT_WINDOW_BYTES`]): the server's answers stop after a few
//! kilobytes, and the server has to take in the rest of the burst while its
//! answers wait. The client pauses ([`BURST_SETTLE`]) so that the burst has
//! arrived, then reads: every request must get its answer, in order, on
//! the same stream.
//!
//! - `watch_creates_in_a_burst`: [`BURST`] creates of distinct keys; the
//!   created answers carry the server-chosen ids `0..BURST`, in order.
//! - `keepalives_in_a_burst`: [`BURST`] renewals of one lease; each answer
//!   carries the lease's id and a positive TTL.
//!
//! A server that stops reading a stream while its answers wait leaves the
//! burst's frames unread inside h2, which closes the whole connection
//! (GOAWAY `ENHANCE_YOUR_CALM`, `too_many_data_frames`) once the unread small
//! frames pass its budget, about 2,300 of these.
//!
//! Run: `STORE_BIN=/path/to/candidate cargo test -p integration-tests --test integration stream_bursts::`

use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use etcd_proto::etcdserverpb::watch_request::RequestUnion;
use etcd_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, WatchCreateRequest, WatchRequest, WatchResponse,
};
use integration_tests::{against_both, ClusterConfig, Server};
use prost::Message;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout};

/// Requests in one burst.
const BURST: usize = 10_000;

/// The client's HTTP/2 receive window, per stream and per connection
/// (HTTP/2's initial 64 KiB): room for ~1,300 answers before the server
/// has to wait for the client.
const CLIENT_WINDOW_BYTES: u32 = 65_535;

/// h2's budget for the small DATA frames the client itself holds unread:
/// enough for a full window of the server's answers, one frame each.
const CLIENT_FRAME_BUDGET_BYTES: usize = 256 * CLIENT_WINDOW_BYTES as usize;

/// Pause between the burst and the first read, so that the burst reaches
/// the server while its answers wait (the server passes whatever the pause).
const BURST_SETTLE: Duration = Duration::from_secs(1);

/// How long each answer may take once the client reads.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of a gRPC message's prefix: compressed flag and length.
const GRPC_PREFIX_BYTES: usize = 5;

/// One gRPC stream over a connection of its own, opened with `path`.
struct RawStream {
    send: h2::SendStream<Bytes>,
    response: h2::client::ResponseFuture,
}

impl RawStream {
    async fn open(endpoint: &str, path: &str) -> Result<Self> {
        let address = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("not an http:// endpoint: {endpoint}"))?;
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(CLIENT_WINDOW_BYTES)
            .initial_connection_window_size(CLIENT_WINDOW_BYTES)
            .data_frame_budget(CLIENT_FRAME_BUDGET_BYTES)
            .handshake::<_, Bytes>(tcp)
            .await
            .context("HTTP/2 handshake")?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("stream_bursts: the connection ended: {error}");
            }
        });
        let mut client = client.ready().await?;
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("{endpoint}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (response, send) = client.send_request(request, false)?;
        Ok(Self { send, response })
    }

    /// Sends each message in a DATA frame of its own.
    fn send_each(&mut self, messages: impl Iterator<Item = impl Message>) -> Result<()> {
        for message in messages {
            let mut frame = BytesMut::with_capacity(GRPC_PREFIX_BYTES + message.encoded_len());
            frame.put_u8(0);
            frame.put_u32(u32::try_from(message.encoded_len())?);
            message.encode(&mut frame)?;
            self.send.send_data(frame.freeze(), false)?;
        }
        Ok(())
    }

    /// Reads `count` answers, in order.
    async fn answers<M: Message + Default>(self, count: usize) -> Result<Vec<M>> {
        let response = timeout(ANSWER_TIMEOUT, self.response)
            .await
            .context("no response headers")??;
        ensure!(response.status() == 200, "status {}", response.status());
        let mut body = response.into_body();
        let mut buffer = BytesMut::new();
        let mut answers = Vec::with_capacity(count);
        while answers.len() < count {
            if let Some(message) = next_message(&mut buffer)? {
                answers.push(M::decode(message)?);
                continue;
            }
            let chunk = match timeout(ANSWER_TIMEOUT, body.data()).await {
                Err(_) => bail!("answer {} of {count} did not come", answers.len()),
                Ok(None) => bail!(
                    "the stream ended after {} of {count} answers (trailers: {:?})",
                    answers.len(),
                    body.trailers().await
                ),
                Ok(Some(chunk)) => chunk.with_context(|| {
                    format!(
                        "the stream failed after {} of {count} answers",
                        answers.len()
                    )
                })?,
            };
            body.flow_control().release_capacity(chunk.len())?;
            buffer.extend_from_slice(&chunk);
        }
        Ok(answers)
    }
}

/// The next whole gRPC message in `buffer`, taken out of it.
fn next_message(buffer: &mut BytesMut) -> Result<Option<Bytes>> {
    if buffer.len() < GRPC_PREFIX_BYTES {
        return Ok(None);
    }
    ensure!(buffer[0] == 0, "a compressed message");
    let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    if buffer.len() < GRPC_PREFIX_BYTES + length {
        return Ok(None);
    }
    buffer.advance(GRPC_PREFIX_BYTES);
    Ok(Some(buffer.split_to(length).freeze()))
}

async fn watch_creates_in_a_burst(server: Server) {
    let cluster = server.start(ClusterConfig::new(1)).await;
    let run = async {
        let mut stream = RawStream::open(&cluster.endpoint(0), "/etcdserverpb.Watch/Watch").await?;
        stream.send_each((0..BURST).map(|i| WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: format!("burst/{i:05}").into_bytes(),
                ..Default::default()
            })),
        }))?;
        sleep(BURST_SETTLE).await;
        let answers: Vec<WatchResponse> = stream.answers(BURST).await?;
        for (i, answer) in answers.iter().enumerate() {
            ensure!(
                answer.created && !answer.canceled && answer.watch_id == i as i64,
                "answer {i}: {answer:?}"
            );
        }
        Ok::<_, anyhow::Error>(())
    };
    run.await
        .unwrap_or_else(|e| panic!("{server:?}: {BURST} watch creates in a burst: {e:#}"));
}

async fn keepalives_in_a_burst(server: Server) {
    let cluster = server.start(ClusterConfig::new(1)).await;
    let run = async {
        let mut client = cluster.client(0).await?;
        let lease = client.lease_grant(600, None).await?.id();
        let mut stream =
            RawStream::open(&cluster.endpoint(0), "/etcdserverpb.Lease/LeaseKeepAlive").await?;
        stream.send_each((0..BURST).map(|_| LeaseKeepAliveRequest { id: lease }))?;
        sleep(BURST_SETTLE).await;
        let answers: Vec<LeaseKeepAliveResponse> = stream.answers(BURST).await?;
        for (i, answer) in answers.iter().enumerate() {
            ensure!(
                answer.id == lease && answer.ttl > 0,
                "answer {i}: {answer:?} (lease {lease})"
            );
        }
        Ok::<_, anyhow::Error>(())
    };
    run.await
        .unwrap_or_else(|e| panic!("{server:?}: {BURST} keepalives in a burst: {e:#}"));
}

against_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    watch_creates_in_a_burst,
    keepalives_in_a_burst,
);

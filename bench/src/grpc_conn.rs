//! Load connections: one HTTP/2 connection to one member, no balancer.
//!
//! etcd-client's `Client::connect` always puts its endpoints behind tonic's
//! balanced channel, even a single one: a request passes the balanced
//! channel's buffer task, a power-of-two-choices pick, the chosen
//! endpoint's own buffer task and then hyper's connection task. Those hops
//! cost the load generator about as much CPU per put as a member spends
//! (measured in docs/benchmarks.md), and on a two-core machine the
//! generator's CPU is taken from the members under test. Here each load
//! connection is a plain hyper HTTP/2 connection handed to etcd-client as
//! a raw channel: a request goes straight to the connection task.
//!
//! The connection's writes go through [`BatchedWrites`]: requests that
//! clients queue while the connection task waits its turn leave in one
//! system call, as a grpc-go client (kube-apiserver's, etcd's own
//! benchmark tool's) flushes its queued frames at once. Without it each
//! request was a loopback TCP send of its own, and the generator spent
//! 44-47 us of CPU per put at 256 clients instead of 27-33 (measured in
//! docs/benchmarks.md), CPU the members under test then lacked.
//!
//! Connections are spread over the endpoints round robin, and their number
//! is rounded up to a multiple of the endpoints' so that every member gets
//! the same share of the clients (clients use connection `i % conns`).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use batched_writes::BatchedWrites;
use etcd_client::{Channel, Client};
use http::uri::{Authority, Scheme};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower::util::BoxCloneSyncService;

/// Body of a gRPC request or response as tonic's generated clients use it.
type Body = tonic::body::Body;

/// Connections to open for `wanted` over `endpoints`: at least one, rounded
/// up to a multiple of the endpoints.
pub fn connection_count(wanted: usize, endpoints: usize) -> usize {
    let per = endpoints.max(1);
    wanted.max(1).div_ceil(per) * per
}

/// Opens [`connection_count`]`(n, endpoints.len())` clients, connection `i`
/// to `endpoints[i % len]`.
pub async fn connect_spread(
    endpoints: &[String],
    n: usize,
    timeout: Duration,
) -> Result<Vec<Client>> {
    if endpoints.is_empty() {
        bail!("no endpoints");
    }
    let count = connection_count(n, endpoints.len());
    let mut clients = Vec::with_capacity(count);
    for i in 0..count {
        let endpoint = &endpoints[i % endpoints.len()];
        let client = connect_one(endpoint, timeout)
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        clients.push(client);
    }
    Ok(clients)
}

/// One client over one HTTP/2 connection to a plain-text `endpoint`
/// (`http://host:port` or `host:port`).
pub async fn connect_one(endpoint: &str, timeout: Duration) -> Result<Client> {
    let authority = authority(endpoint)?;
    let stream = tokio::time::timeout(timeout, TcpStream::connect(authority.as_str()))
        .await
        .context("connect timed out")??;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Body>(TokioIo::new(BatchedWrites::new(stream)))
        .await
        .context("HTTP/2 handshake")?;
    // Ends when the last clone of `sender` is dropped or the peer closes.
    tokio::spawn(connection);
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let mut sender = sender.clone();
        let authority = authority.clone();
        async move {
            let request = with_origin(request, authority)?;
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            Ok::<_, tower::BoxError>(response.map(Body::new))
        }
    });
    let channel = Channel::Custom(BoxCloneSyncService::new(service));
    Ok(Client::from_channel(channel, None).await?)
}

/// The `host:port` of an endpoint; only plain-text endpoints are supported.
fn authority(endpoint: &str) -> Result<Authority> {
    let rest = match endpoint.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => {
            bail!("unsupported scheme {scheme:?} in {endpoint} (load connections are plain text)")
        }
        None => endpoint,
    };
    rest.trim_end_matches('/')
        .parse()
        .with_context(|| format!("bad endpoint {endpoint}"))
}

/// Sets the scheme and authority of a request whose URI is only a path
/// (tonic's generated clients leave them to the channel).
fn with_origin(
    request: http::Request<Body>,
    authority: Authority,
) -> Result<http::Request<Body>, http::Error> {
    let (mut parts, body) = request.into_parts();
    let mut uri = parts.uri.into_parts();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(authority);
    parts.uri = http::Uri::from_parts(uri).map_err(http::Error::from)?;
    Ok(http::Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_a_multiple_of_the_endpoints() {
        assert_eq!(connection_count(16, 3), 18);
        assert_eq!(connection_count(18, 3), 18);
        assert_eq!(connection_count(0, 3), 3);
        assert_eq!(connection_count(5, 1), 5);
        assert_eq!(connection_count(1, 0), 1);
    }

    #[test]
    fn endpoints_name_a_plain_text_authority() {
        assert_eq!(
            authority("http://127.0.0.1:2379").unwrap().as_str(),
            "127.0.0.1:2379"
        );
        assert_eq!(
            authority("127.0.0.1:2379/").unwrap().as_str(),
            "127.0.0.1:2379"
        );
        assert!(authority("https://127.0.0.1:2379").is_err());
    }

    #[test]
    fn a_path_only_request_gets_the_origin() {
        let request = http::Request::builder()
            .uri("/etcdserverpb.KV/Put")
            .body(Body::empty())
            .unwrap();
        let request = with_origin(request, "10.0.0.1:2379".parse().unwrap()).unwrap();
        assert_eq!(
            request.uri().to_string(),
            "http://10.0.0.1:2379/etcdserverpb.KV/Put"
        );
    }
}

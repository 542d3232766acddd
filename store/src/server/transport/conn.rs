//! Serving client connections (gRPC over HTTP/2 and the HTTP endpoints on
//! the same port) with etcd's gRPC keepalive settings.
//!
//! `axum::serve` offers no HTTP/2 settings, so each accepted connection is
//! served here with hyper's automatic HTTP/1.1-or-HTTP/2 builder:
//! `--grpc-keepalive-interval` is how long a connection may stay silent
//! before the server sends an HTTP/2 PING, and `--grpc-keepalive-timeout`
//! how long it then waits for the acknowledgement before closing the
//! connection (etcd's `keepalive.ServerParameters{Time, Timeout}`); zero
//! disables server pings, as in etcd. `--grpc-keepalive-min-time` (etcd's
//! enforcement policy, which answers clients that ping more often with
//! GOAWAY `too_many_pings`) has no counterpart in hyper's HTTP/2 server,
//! which acknowledges every ping: it is validated, not enforced.
//!
//! `--max-concurrent-streams` is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
//! the server announces. hyper's own default is 200 streams per connection;
//! etcd's is 2^32 - 1, and clients rely on it: kube-apiserver runs one watch
//! stream per resource over each etcd client's connection, and a client past
//! the limit waits for a stream to end before it opens another (for watches,
//! forever).
//!
//! HTTP/2 receive windows: [`CLIENT_STREAM_WINDOW_BYTES`] per stream and
//! [`CLIENT_CONNECTION_WINDOW_BYTES`] per connection (hyper's defaults: 1 MiB
//! each). h2 closes a connection (GOAWAY `ENHANCE_YOUR_CALM`,
//! `too_many_data_frames`) once the small DATA frames it holds unread cost
//! more than half the connection window, each frame under 256 bytes costing
//! 256 minus its size. gRPC clients send one small frame per message (a
//! lease renewal is 15 bytes, a watch create ~20-40), and h2 takes in what
//! the socket holds before any stream task reads it: a burst of 10,000
//! creates on one stream, 200 KB inside hyper's 1 MiB stream window,
//! closed the connection and every stream on it. With these windows one
//! stream's full window of 15-byte messages costs ~4 MiB of the 16 MiB
//! budget (of 7-byte messages, the smallest a client sends, ~9 MiB), and
//! streaming services read their requests ahead while they work
//! ([`crate::server::v3rpc::inbound`]), so frames do not stay unread.
//!
//! Each request carries the connection's peer as `ConnectInfo<L::Addr>`,
//! as `into_make_service_with_connect_info` does. On shutdown the listener
//! stops accepting, open connections are asked to finish (HTTP/2 GOAWAY)
//! and serving returns once they have; dropping the serving future (the
//! member's shutdown gives up after its grace period) closes them all.

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use axum::Router;
use batched_writes::BatchedWrites;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::GrpcServerOptions;
use crate::server::transport::authority_repair::AuthorityRepair;
use crate::server::transport::grpc_dispatch::GrpcServices;

/// HTTP/2 receive window of a client stream, bytes (see the module docs).
pub const CLIENT_STREAM_WINDOW_BYTES: u32 = 256 * 1024;

/// HTTP/2 receive window of a client connection, bytes: h2 allows half of
/// it as the cost of unread small DATA frames (see the module docs).
pub const CLIENT_CONNECTION_WINDOW_BYTES: u32 = 32 * 1024 * 1024;

/// The connection builder with the keepalive settings, stream limit and
/// windows applied.
fn builder(options: GrpcServerOptions) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    let pinging = !options.interval.is_zero() && !options.timeout.is_zero();
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(pinging.then_some(options.interval))
        .keep_alive_timeout(options.timeout)
        .max_concurrent_streams(options.max_concurrent_streams)
        .initial_stream_window_size(CLIENT_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CLIENT_CONNECTION_WINDOW_BYTES);
    builder
}

/// A client listener's routes: gRPC calls go straight to the gRPC
/// services ([`GrpcServices`]); everything else (the JSON gateway, `/health`, `/version`,
/// CORS) to the HTTP router. Routing every gRPC call through the merged
/// router and the CORS middleware (`from_fn` boxes a future and clones the
/// router per call) cost, measured A/B at 1,000 streams: 12-21% more leader
/// CPU per serializable range, 10-15% fewer puts/s.
#[derive(Clone)]
pub struct ClientApp {
    /// The gRPC services.
    pub grpc: GrpcServices,
    /// Everything else.
    pub http: Router,
}

impl<B> tower::Service<axum::http::Request<B>> for ClientApp
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The router and the gRPC services are always ready.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        if crate::server::http::is_grpc(req.headers()) {
            self.grpc.call(req)
        } else {
            Box::pin(self.http.call(req))
        }
    }
}

/// Serves `app` on every connection `listener` accepts until `shutdown`
/// turns true, then drains the open connections.
pub async fn serve<L>(
    mut listener: L,
    app: ClientApp,
    options: GrpcServerOptions,
    mut shutdown: watch::Receiver<bool>,
) where
    L: Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let builder = builder(options);
    let graceful = GracefulShutdown::new();
    // Connections live in a set owned by this future: if the caller gives
    // up on the drain (a watch stream a client keeps open), dropping the
    // future cuts them all off.
    let mut conns = JoinSet::new();
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = conns.join_next() => continue,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let service = tower::Layer::layer(&axum::Extension(ConnectInfo(peer)), app.clone());
        let service = TowerToHyperService::new(service);
        let io = TokioIo::new(BatchedWrites::new(AuthorityRepair::new(io)));
        let conn = builder.serve_connection_with_upgrades(io, service);
        let conn = graceful.watch(conn.into_owned());
        conns.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}

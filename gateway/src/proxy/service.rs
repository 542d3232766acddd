//! [`ProxyService`]: one request per client connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::retry::Retry;
use tower::util::BoxService;
use tower::{Service, ServiceExt};

use super::error::ProxyError;
use super::relay::{relay, LongLived, RelayOutcome};
use super::retry::Redispatch;
use super::shared::SharedBalancer;
use crate::balance::BoxBalancer;
use crate::endpoint::{BackendConnection, ConnectError, ConnectRequest};
use crate::failfast::{FailFast, NoHealthyBackend};
use crate::metrics::FrontendMetrics;
use crate::net;
use crate::BoxError;

/// The shared connect path: redispatch over the frontend's shared, fail-fast balancer.
pub type Connector = Retry<Redispatch, SharedBalancer>;

/// Builds the connect path of a frontend; `available` says whether any backend is eligible.
pub fn connector<A>(balancer: BoxBalancer, available: A, retries: u32) -> Connector
where
    A: Fn() -> bool + Send + 'static,
{
    let guarded = BoxService::new(FailFast::new(balancer, available));
    Retry::new(Redispatch::new(retries), SharedBalancer::new(guarded))
}

/// Timeouts of a frontend's connections.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Idle timeout of established connections.
    pub idle_timeout: Duration,
    /// Longest wait for a backend below its limit.
    pub queue_timeout: Duration,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Redispatch attempts.
    pub retries: u32,
    /// Keepalive idle time of the backend leg, armed once the relay has lasted
    /// [`net::BACKEND_KEEPALIVE_AFTER`].
    pub tcp_keepalive: Duration,
}

impl ProxySettings {
    /// Upper bound of the whole connect stage.
    pub fn connect_stage_budget(&self) -> Duration {
        self.queue_timeout + self.connect_timeout * (self.retries + 1)
    }
}

/// An accepted client connection.
#[derive(Debug)]
pub struct ClientConnection {
    /// The client's stream.
    pub stream: TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
}

/// The per-connection service of one frontend.
///
/// Each accept loop uses its own copy ([`ProxyService::for_accept_loop`]), whose
/// [`ConnectionContext`] only that loop's connections share: a connection takes one reference
/// count on memory its own relay thread owns, instead of a reference count per metric handle,
/// setting and token on memory that every relay thread writes.
#[derive(Clone)]
pub struct ProxyService {
    connector: Connector,
    context: Arc<ConnectionContext>,
}

/// What the connections of one accept loop share.
#[derive(Debug)]
struct ConnectionContext {
    settings: ProxySettings,
    /// A child of the gateway's shutdown token, one per accept loop: a connection registers
    /// with it, not with the token every relay thread's connections register with.
    shutdown: CancellationToken,
    metrics: Arc<FrontendMetrics>,
}

impl ProxyService {
    /// A proxy that connects through `connector`; `shutdown` closes relays at the drain deadline.
    pub fn new(
        connector: Connector,
        settings: ProxySettings,
        shutdown: CancellationToken,
        metrics: Arc<FrontendMetrics>,
    ) -> Self {
        ProxyService {
            connector,
            context: Arc::new(ConnectionContext {
                settings,
                shutdown,
                metrics,
            }),
        }
    }

    /// A copy for one accept loop: the same connector (balancer, redispatch) and settings,
    /// with a context of its own (see the type's docs).
    pub fn for_accept_loop(&self) -> Self {
        let context = &self.context;
        ProxyService {
            connector: self.connector.clone(),
            context: Arc::new(ConnectionContext {
                settings: context.settings.clone(),
                shutdown: context.shutdown.child_token(),
                metrics: Arc::clone(&context.metrics),
            }),
        }
    }

    /// The connection's future. It owns the connect attempt (which holds a clone of the
    /// connector only until it resolves) but not the connector itself, so an established
    /// connection keeps no handle to the balancer for its lifetime.
    async fn proxy(
        connection: ClientConnection,
        attempt: BoxFuture<'static, Result<BackendConnection, BoxError>>,
        context: Arc<ConnectionContext>,
    ) -> Result<RelayOutcome, ProxyError> {
        let ConnectionContext {
            settings,
            shutdown,
            metrics,
        } = &*context;
        metrics.active.inc();
        let _active = ActiveGuard(metrics);
        let BackendConnection { stream, slot } =
            connect(attempt, settings.connect_stage_budget(), metrics).await?;
        let backend = slot.backend();
        let backend_closed = backend.session_token();
        let backend_metrics = backend.metrics();
        let outcome = relay(
            connection.stream,
            stream,
            (
                &backend_metrics.bytes_to_backend,
                &backend_metrics.bytes_to_client,
            ),
            settings.idle_timeout,
            &backend_closed,
            shutdown,
            LongLived {
                after: net::BACKEND_KEEPALIVE_AFTER,
                setup: |stream: &TcpStream| net::enable_keepalive(stream, settings.tcp_keepalive),
            },
        )
        .await;
        tracing::debug!(client = %connection.peer, backend = %backend.name(), end = ?outcome.end, "connection ended");
        drop(slot);
        Ok(outcome)
    }

    /// The connect future, boxed outside any `async` body: boxing erases the retry and balancer
    /// future types, whose error conversions otherwise trip higher-ranked `Send` inference
    /// (rust-lang/rust#102211).
    fn connect_attempt(
        &self,
        client: SocketAddr,
    ) -> BoxFuture<'static, Result<BackendConnection, BoxError>> {
        Box::pin(self.connector.clone().oneshot(ConnectRequest { client }))
    }
}

/// Runs the connect stage within `budget` and counts a rejection.
async fn connect(
    attempt: BoxFuture<'static, Result<BackendConnection, BoxError>>,
    budget: Duration,
    metrics: &FrontendMetrics,
) -> Result<BackendConnection, ProxyError> {
    let result = match tokio::time::timeout(budget, attempt).await {
        Ok(Ok(connection)) => return Ok(connection),
        Err(_elapsed) => ProxyError::QueueTimeout,
        Ok(Err(error)) if error.is::<NoHealthyBackend>() => ProxyError::NoHealthyBackend,
        Ok(Err(error)) if error.is::<ConnectError>() => ProxyError::ConnectFailed(error),
        Ok(Err(error)) => ProxyError::BalancerClosed(error),
    };
    match result {
        ProxyError::NoHealthyBackend => metrics.rejected_no_backend.inc(),
        ProxyError::QueueTimeout => metrics.rejected_queue_timeout.inc(),
        _ => metrics.rejected_connect_failed.inc(),
    };
    Err(result)
}

struct ActiveGuard<'a>(&'a FrontendMetrics);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.active.dec();
    }
}

impl Service<ClientConnection> for ProxyService {
    type Response = RelayOutcome;
    type Error = ProxyError;
    type Future = Pin<Box<dyn Future<Output = Result<RelayOutcome, ProxyError>> + Send>>;

    /// Always ready: waiting for a backend happens inside the connection's own future, so a
    /// slow connect never stalls the accept loop.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, connection: ClientConnection) -> Self::Future {
        let attempt = self.connect_attempt(connection.peer);
        Box::pin(Self::proxy(connection, attempt, Arc::clone(&self.context)))
    }
}

//! [`Endpoint`]: the per-backend connect service.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_stream::wrappers::WatchStream;
use tower::load::Load;
use tower::Service;

use super::error::ConnectError;
use crate::backend::{Backend, ConnectionSlot};
use crate::net;

/// A request to open a connection on behalf of a client.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    /// The client's address (for logs).
    pub client: SocketAddr,
}

/// An open connection to a backend, counted against it until dropped.
#[derive(Debug)]
pub struct BackendConnection {
    /// The TCP stream to the backend.
    pub stream: TcpStream,
    /// The count of this connection in the backend's open connections.
    pub slot: ConnectionSlot,
}

/// The connect service of one backend.
pub struct Endpoint {
    backend: Arc<Backend>,
    changes: WatchStream<u64>,
    connect_timeout: Duration,
    socket_options: net::SocketOptions,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Endpoint")
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl Endpoint {
    /// The endpoint of `backend`.
    pub fn new(
        backend: Arc<Backend>,
        connect_timeout: Duration,
        socket_options: net::SocketOptions,
    ) -> Self {
        let changes = WatchStream::new(backend.subscribe());
        Endpoint {
            backend,
            changes,
            connect_timeout,
            socket_options,
        }
    }

    /// The backend behind this endpoint.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Load for Endpoint {
    type Metric = f64;

    fn load(&self) -> f64 {
        self.backend.cost()
    }
}

impl Service<ConnectRequest> for Endpoint {
    type Response = BackendConnection;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<BackendConnection, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        loop {
            if self.backend.is_ready() {
                return Poll::Ready(Ok(()));
            }
            // The stream yields once per change; `Pending` leaves the waker registered.
            // `None` means the backend was dropped: stay pending until the balancer evicts us.
            match self.changes.poll_next_unpin(cx) {
                Poll::Ready(Some(_)) => continue,
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn call(&mut self, request: ConnectRequest) -> Self::Future {
        let backend = Arc::clone(&self.backend);
        let connect_timeout = self.connect_timeout;
        let socket_options = self.socket_options;
        Box::pin(async move { connect(backend, request, connect_timeout, socket_options).await })
    }
}

async fn connect(
    backend: Arc<Backend>,
    request: ConnectRequest,
    connect_timeout: Duration,
    socket_options: net::SocketOptions,
) -> Result<BackendConnection, ConnectError> {
    let slot = backend.open_slot();
    let started = Instant::now();
    let connecting = net::connect_stream(backend.address(), socket_options);
    let result = tokio::time::timeout(connect_timeout, connecting).await;
    let error = match result {
        Ok(Ok(stream)) => {
            backend.record_connect_success(started.elapsed());
            tracing::debug!(client = %request.client, backend = %backend.name(), "connected");
            return Ok(BackendConnection { stream, slot });
        }
        Ok(Err(source)) => ConnectError::Failed {
            backend: backend.name().to_string(),
            address: backend.address().to_string(),
            source,
        },
        Err(_) => ConnectError::TimedOut {
            backend: backend.name().to_string(),
            address: backend.address().to_string(),
        },
    };
    drop(slot);
    backend.record_connect_failure(&error.to_string());
    tracing::info!(client = %request.client, %error, "redispatching");
    Err(error)
}

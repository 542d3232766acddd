//! Proxy errors: why a client connection was closed without reaching a backend.

/// Why a client connection got no backend.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No backend is healthy and enabled (fail fast).
    #[error("no healthy backend")]
    NoHealthyBackend,
    /// Every connect attempt failed.
    #[error("all connect attempts failed, last: {0}")]
    ConnectFailed(crate::BoxError),
    /// No backend below its connection limit within the queue timeout.
    #[error("no backend available within the queue timeout")]
    QueueTimeout,
    /// The frontend's balancer stopped (a reload replaced it while this connection waited).
    #[error("balancer unavailable: {0}")]
    BalancerClosed(crate::BoxError),
}

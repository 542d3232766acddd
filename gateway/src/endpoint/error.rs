//! Connect errors.

/// Why a connection to a backend could not be opened. The proxy redispatches these to another
/// backend, since no byte has been relayed yet.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The backend refused or reset the handshake, or the address did not resolve.
    #[error("connect to backend {backend} ({address}) failed: {source}")]
    Failed {
        /// Backend name.
        backend: String,
        /// Backend address.
        address: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The handshake did not finish within the connect timeout.
    #[error("connect to backend {backend} ({address}) timed out")]
    TimedOut {
        /// Backend name.
        backend: String,
        /// Backend address.
        address: String,
    },
}

//! Health-check errors.

use std::path::PathBuf;

/// Why one probe failed. The message is logged when the failure changes a backend's state.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The probe did not finish within the check timeout.
    #[error("check timed out")]
    Timeout,
    /// TCP connect failed.
    #[error("connect failed: {0}")]
    Connect(std::io::Error),
    /// The address did not resolve or has an invalid TLS server name.
    #[error("bad address {0}")]
    Address(String),
    /// The TLS handshake failed.
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    /// The response body exceeded the limit or broke off.
    #[error("cannot read response body: {0}")]
    Body(String),
    /// The backend answered with a failing status.
    #[error("unexpected HTTP status {0}")]
    Status(u16),
    /// etcd answered `/health` but is not healthy.
    #[error("etcd reports unhealthy: {0}")]
    EtcdUnhealthy(String),
}

/// Why the health-check TLS client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A PEM file could not be read or parsed.
    #[error("cannot load {what} from {path}: {message}")]
    Pem {
        /// Which file: CA bundle, client certificate or key.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// rustls refused the combination.
    #[error("TLS client configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

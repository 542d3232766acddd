//! Errors of the VIP: the address commands and the election.

use std::process::ExitStatus;
use std::time::Duration;

/// An `ip` command failed.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// `ip` could not be started (iproute2 missing?).
    #[error("cannot run `{command}` (is iproute2 installed?): {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `ip` did not finish in time.
    #[error("`{command}` did not finish within {timeout:?}")]
    Timeout {
        /// The command line.
        command: String,
        /// The deadline.
        timeout: Duration,
    },
    /// `ip` exited with an error.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its standard error.
        stderr: String,
    },
    /// `ip link show` printed something without an index and an Ethernet address.
    #[error("interface {interface} has no Ethernet address in `{output}`")]
    UnexpectedOutput {
        /// The interface.
        interface: String,
        /// What `ip` printed.
        output: String,
    },
}

/// The election could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The TLS files of the election could not be read.
    #[error("cannot read {path}: {source}")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A request to the store failed.
    #[error("{operation}: {source}")]
    Store {
        /// What was attempted.
        operation: &'static str,
        /// The client error.
        source: etcd_client::Error,
    },
    /// A request to the store did not answer in time.
    #[error("{operation}: no answer within {timeout:?}")]
    Timeout {
        /// What was attempted.
        operation: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The store answered without what the request must return.
    #[error("{0}: the store's answer lacks a required field")]
    MalformedAnswer(&'static str),
    /// The store granted a lease with a TTL other than the one asked for.
    #[error("the store granted a lease of {granted} s for a request of {requested} s")]
    UnexpectedTtl {
        /// Seconds asked for.
        requested: i64,
        /// Seconds granted.
        granted: i64,
    },
    /// A watch ended (stream closed, or cancelled by the store).
    #[error("the watch of {key} ended: {reason}")]
    WatchEnded {
        /// The watched key.
        key: String,
        /// Why.
        reason: String,
    },
}

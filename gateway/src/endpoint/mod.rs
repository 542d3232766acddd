//! The balancer endpoint of one backend: a [`tower::Service`] whose call opens a TCP
//! connection to the backend.
//!
//! Readiness is the backend's admission decision: [`Endpoint::poll_ready`] is `Ready` exactly
//! while the backend is healthy, enabled, not suspect and under its connection limit, and
//! otherwise `Pending` with the task registered on the backend's change channel. It never
//! returns an error, because tower's balancer permanently evicts endpoints whose readiness
//! fails; a down backend must stay in the set to come back.
//!
//! The call counts the connection against the backend *before* connecting (so concurrent
//! connects respect `max_connections` and the least-connections cost), bounds the handshake
//! by the connect timeout, feeds the latency to the peak-EWMA estimate, and reports a failure
//! to the backend's passive health detection.

mod error;
mod service;

pub use error::ConnectError;
pub use service::{BackendConnection, ConnectRequest, Endpoint};

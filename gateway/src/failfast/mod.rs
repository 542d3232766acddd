//! Fail fast when no backend can take a connection.
//!
//! tower's balancer is `Pending` for as long as no endpoint is ready, which for an L4 proxy
//! means a client connection held open with nothing behind it: exactly what confuses kubelets
//! behind HAProxy when every apiserver is down (kubernetes#99602). [`FailFast`] asks an
//! availability predicate first (are any backends eligible, ignoring connection limits?) and,
//! when none is, fails the request at once with [`NoHealthyBackend`].
//!
//! The refusal is delivered through the response future, not `poll_ready`: a `poll_ready`
//! error says the service itself failed (tower's `Buffer`, for one, closes on it), while a
//! failed response only ends this one connection. If backends are eligible but all at their limit,
//! the inner balancer stays pending and the caller's queue timeout bounds the wait.

mod error;
mod layer;
mod service;

pub use error::NoHealthyBackend;
pub use layer::FailFastLayer;
pub use service::FailFast;

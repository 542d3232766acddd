//! The per-connection proxy service: each accepted client connection is one request.
//!
//! [`ProxyService::call`] returns a future that lives as long as the client connection:
//!
//! 1. **Connect stage.** A [`ConnectRequest`](crate::endpoint::ConnectRequest) goes through
//!    `Retry(Redispatch) → SharedBalancer → FailFast → balancer`. A connect that fails is retried on
//!    another backend (the failed one is suspect, so not ready) up to `retries` times. This
//!    is safe because no client byte has been relayed yet: the client's TLS ClientHello waits
//!    in the kernel buffer. The whole stage is bounded by
//!    `queue_timeout + (retries + 1) × connect_timeout`.
//! 2. **Relay stage.** [`relay`] copies both directions until both have ended. A read EOF on
//!    one side becomes a write shutdown (FIN) on the other, so half-closed connections work
//!    (`kubectl exec` closing stdin while output still flows). The connection ends early on the
//!    idle timeout, when an operator disables the backend, or when the shutdown deadline
//!    passes.
//!
//! The future resolving is what releases the frontend's connection-limit permit
//! (`tower::limit::ConcurrencyLimit`) and the backend's open-connection slot.

mod error;
mod relay;
mod retry;
mod service;
mod shared;

pub use error::ProxyError;
pub use relay::{relay, RelayEnd, RelayOutcome};
pub use retry::Redispatch;
pub use service::{connector, ClientConnection, Connector, ProxyService, ProxySettings};
pub use shared::{GuardedBalancer, SharedBalancer};

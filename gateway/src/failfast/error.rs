//! The fail-fast error.

/// No backend is healthy and enabled: the connection is refused at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no healthy backend")]
pub struct NoHealthyBackend;

//! Active health checks: the [`Prober`] (TCP connect, HTTP or HTTPS GET on a path, or etcd's
//! `/health`) and the fall/rise [`HealthMachine`] its results feed. Each backend's check task,
//! which runs them, is `crate::backend::checks`.

mod error;
mod probe;
mod state;
mod tls;

pub use error::{ProbeError, TlsSetupError};
pub use probe::{host_of, Prober, SharedProber, MAX_CHECK_BODY_BYTES};
pub use state::{Health, HealthMachine, Transition};

//! A backend's check task.
//!
//! Each backend has one. It probes the backend every `interval` with the frontend's
//! [`Prober`](crate::health::Prober) and feeds the result to the backend's fall/rise
//! [`HealthMachine`](crate::health::HealthMachine). A backend whose checks start failing is
//! therefore out after at most `fall × interval` (plus one check timeout); a recovered one is
//! back after `rise × interval` and then ramps up its share over `slow_start`.
//!
//! Passive detection shares the machine: a failed connect from the proxy counts as a failed
//! check, makes the backend *suspect* (no new connections) and wakes the check task so the
//! next probe runs at once instead of at the next tick. A successful probe clears the suspect
//! mark. With `kind = "none"` there is no probe: the suspect mark is lifted after
//! [`SUSPECT_HOLD_WITHOUT_CHECKS`].

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Backend;
use crate::config::CheckKind;
use crate::health::SharedProber;

/// Without active checks, how long a backend whose connect failed stays out of rotation:
/// long enough not to retry a dead address for every new connection, short enough that a
/// restarted member is used again quickly (etcd's own gateway waits a whole minute).
pub const SUSPECT_HOLD_WITHOUT_CHECKS: Duration = Duration::from_secs(1);

/// Shortest time between two probes when failed connects wake the task repeatedly, so a
/// burst of connection failures does not turn into a burst of probes.
pub const MIN_PROBE_GAP: Duration = Duration::from_millis(100);

/// Starts the check task of `backend`; it ends when `stop` is cancelled.
pub fn spawn(
    backend: Arc<Backend>,
    prober: SharedProber,
    interval: Duration,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = run(backend, prober, interval) => {}
        }
    });
}

async fn run(backend: Arc<Backend>, prober: SharedProber, interval: Duration) {
    if prober.kind() == CheckKind::None {
        loop {
            backend.suspected().await;
            tokio::time::sleep(SUSPECT_HOLD_WITHOUT_CHECKS).await;
            backend.clear_suspect();
        }
    }
    let address = backend.check_address().to_string();
    loop {
        let result = prober.probe(&address).await;
        if let Err(error) = &result {
            tracing::debug!(frontend = %backend.frontend(), backend = %backend.name(), %error, "check failed");
        }
        backend.record_check(result.map_err(|error| error.to_string()));
        tokio::time::sleep(MIN_PROBE_GAP).await;
        tokio::select! {
            _ = tokio::time::sleep(interval.saturating_sub(MIN_PROBE_GAP)) => {}
            _ = backend.check_requested() => {}
        }
    }
}

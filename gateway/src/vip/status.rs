//! The VIP's observable state: the admin API's `/api/vip` and the metrics.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::VipConfig;
use crate::metrics::VipMetrics;

/// Where the VIP controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VipState {
    /// No backend of this gateway is healthy: not competing.
    Unhealthy,
    /// Connecting to the store and creating the candidate's lease and key.
    Joining,
    /// Waiting behind an earlier candidate.
    Candidate,
    /// Holding the VIP.
    Holder,
    /// Shut down.
    Stopped,
}

/// Why a holder gave the VIP up (a metric label and the admin API's `last_release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The last keep-alive proof got older than the fence allows.
    Fenced,
    /// The store says the lease is gone.
    LeaseExpired,
    /// The election key was deleted.
    KeyDeleted,
    /// No backend of this gateway is healthy any more.
    Unhealthy,
    /// The gateway shuts down.
    Shutdown,
    /// Adding or renewing the address failed.
    AddressFailed,
    /// The watch of the own election key broke and could not be reopened.
    WatchLost,
}

impl ReleaseReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            ReleaseReason::Fenced => "fenced",
            ReleaseReason::LeaseExpired => "lease_expired",
            ReleaseReason::KeyDeleted => "key_deleted",
            ReleaseReason::Unhealthy => "unhealthy",
            ReleaseReason::Shutdown => "shutdown",
            ReleaseReason::AddressFailed => "address_failed",
            ReleaseReason::WatchLost => "watch_lost",
        }
    }
}

/// A point-in-time view of the VIP (JSON of `GET /api/vip`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct VipStatus {
    /// `address/prefix`.
    pub address: String,
    /// The interface.
    pub interface: String,
    /// This candidate's name.
    pub name: String,
    /// The controller's state.
    pub state: VipState,
    /// Whether this gateway holds the VIP now.
    pub holder: bool,
    /// When `state` was entered (Unix time, milliseconds).
    pub since_unix_ms: u64,
    /// Times this gateway took the VIP.
    pub acquired: u64,
    /// Times this gateway gave the VIP up.
    pub released: u64,
    /// Why it gave it up last.
    pub last_release: Option<ReleaseReason>,
    /// The current holder's name as last seen in the store (while a candidate or holder).
    pub current_holder: Option<String>,
    /// The candidate's lease, hex (the last segment of its election key).
    pub lease_id: Option<String>,
    /// The last error of the election or of the address commands.
    pub last_error: Option<String>,
}

/// The shared status, updated by the controller.
pub struct VipMonitor {
    status: Mutex<VipStatus>,
    metrics: VipMetrics,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

impl VipMonitor {
    /// The initial status of `config`'s VIP.
    pub fn new(config: &VipConfig, metrics: VipMetrics) -> Self {
        metrics.holder.set(0);
        VipMonitor {
            status: Mutex::new(VipStatus {
                address: format!("{}/{}", config.address, config.prefix_len),
                interface: config.interface.clone(),
                name: config.name.clone(),
                state: VipState::Unhealthy,
                holder: false,
                since_unix_ms: unix_ms(),
                acquired: 0,
                released: 0,
                last_release: None,
                current_holder: None,
                lease_id: None,
                last_error: None,
            }),
            metrics,
        }
    }

    /// A copy of the status.
    pub fn snapshot(&self) -> VipStatus {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VipStatus> {
        self.status.lock().expect("VIP status lock poisoned")
    }

    /// Enters `state` (a holder uses [`Self::acquired`] and [`Self::released`] instead).
    pub fn set_state(&self, state: VipState) {
        let mut status = self.lock();
        if status.state != state {
            status.state = state;
            status.since_unix_ms = unix_ms();
        }
        if state != VipState::Candidate && state != VipState::Holder {
            status.current_holder = None;
        }
        if state == VipState::Unhealthy || state == VipState::Stopped {
            status.lease_id = None;
        }
    }

    /// Records the candidate's lease.
    pub fn set_lease(&self, lease_id: i64) {
        self.lock().lease_id = Some(format!("{lease_id:x}"));
    }

    /// Records who holds the VIP according to the store.
    pub fn set_current_holder(&self, name: Option<String>) {
        self.lock().current_holder = name;
    }

    /// Records an error (kept until the next one).
    pub fn set_error(&self, error: &dyn std::fmt::Display) {
        self.lock().last_error = Some(error.to_string());
    }

    /// This gateway took the VIP.
    pub fn acquired(&self) {
        let mut status = self.lock();
        status.state = VipState::Holder;
        status.holder = true;
        status.since_unix_ms = unix_ms();
        status.acquired += 1;
        status.current_holder = Some(status.name.clone());
        self.metrics.holder.set(1);
        self.metrics.acquired.inc();
    }

    /// This gateway gave the VIP up.
    pub fn released(&self, reason: ReleaseReason) {
        let mut status = self.lock();
        status.holder = false;
        status.released += 1;
        status.last_release = Some(reason);
        status.current_holder = None;
        self.metrics.holder.set(0);
        self.metrics.released(reason.label()).inc();
    }
}

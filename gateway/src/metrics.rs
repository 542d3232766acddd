//! Prometheus metrics (served by the admin API at `/metrics`).
//!
//! Per backend: active connections, connections opened, bytes each way, connect latency,
//! connect failures, health transitions and the current up/down state. Per frontend:
//! accepted, rejected (by reason) and active connections. Per process: reloads by result and
//! the virtual IP (whether this gateway holds it, times it took it, times it gave it up by
//! reason).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Smallest connect-latency bucket: a loopback handshake takes tens of microseconds.
const CONNECT_BUCKET_START_SECONDS: f64 = 0.000_1;
/// Bucket growth factor: doubling gives useful resolution over five decades.
const CONNECT_BUCKET_FACTOR: f64 = 2.0;
/// Bucket count: 0.1 ms × 2^16 ≈ 6.5 s covers the default 5 s connect timeout.
const CONNECT_BUCKET_COUNT: u16 = 17;

/// Labels of per-backend series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Frontend name.
    pub frontend: String,
    /// Backend name.
    pub backend: String,
}

/// Labels of per-backend byte counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    /// Frontend name.
    pub frontend: String,
    /// Backend name.
    pub backend: String,
    /// `to_backend` or `to_client`.
    pub direction: String,
}

/// Labels of health transition counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// Frontend name.
    pub frontend: String,
    /// Backend name.
    pub backend: String,
    /// `up` or `down`.
    pub to: String,
}

/// Labels of per-frontend series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrontendLabels {
    /// Frontend name.
    pub frontend: String,
}

/// Labels of rejected-connection counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// Frontend name.
    pub frontend: String,
    /// `no_healthy_backend`, `max_connections`, `connect_failed` or `queue_timeout`.
    pub reason: String,
}

/// Labels of the reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success` or `failure`.
    pub result: String,
}

/// Labels of the VIP release counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VipReleaseLabels {
    /// `fenced`, `lease_expired`, `key_deleted`, `unhealthy`, `shutdown`, `address_failed` or
    /// `watch_lost`.
    pub reason: String,
}

type HistogramFamily = Family<BackendLabels, Histogram, fn() -> Histogram>;

fn connect_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        CONNECT_BUCKET_START_SECONDS,
        CONNECT_BUCKET_FACTOR,
        CONNECT_BUCKET_COUNT,
    ))
}

/// All metric families of the process.
pub struct Metrics {
    registry: Registry,
    backend_active: Family<BackendLabels, Gauge>,
    backend_connections: Family<BackendLabels, Counter>,
    backend_bytes: Family<BytesLabels, Counter>,
    backend_connect_seconds: HistogramFamily,
    backend_connect_failures: Family<BackendLabels, Counter>,
    backend_up: Family<BackendLabels, Gauge>,
    backend_transitions: Family<TransitionLabels, Counter>,
    frontend_connections: Family<FrontendLabels, Counter>,
    frontend_active: Family<FrontendLabels, Gauge>,
    frontend_rejected: Family<RejectLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    vip_holder: Gauge,
    vip_acquired: Counter,
    vip_released: Family<VipReleaseLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every family.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("gateway");
        let metrics = Metrics {
            backend_active: Family::default(),
            backend_connections: Family::default(),
            backend_bytes: Family::default(),
            backend_connect_seconds: HistogramFamily::new_with_constructor(connect_histogram),
            backend_connect_failures: Family::default(),
            backend_up: Family::default(),
            backend_transitions: Family::default(),
            frontend_connections: Family::default(),
            frontend_active: Family::default(),
            frontend_rejected: Family::default(),
            reloads: Family::default(),
            vip_holder: Gauge::default(),
            vip_acquired: Counter::default(),
            vip_released: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "backend_active_connections",
            "Open connections to the backend",
            metrics.backend_active.clone(),
        );
        registry.register(
            "backend_connections",
            "Connections opened to the backend",
            metrics.backend_connections.clone(),
        );
        registry.register(
            "backend_bytes",
            "Bytes relayed, by direction",
            metrics.backend_bytes.clone(),
        );
        registry.register(
            "backend_connect_duration_seconds",
            "TCP connect latency to the backend",
            metrics.backend_connect_seconds.clone(),
        );
        registry.register(
            "backend_connect_failures",
            "Failed connects to the backend",
            metrics.backend_connect_failures.clone(),
        );
        registry.register(
            "backend_up",
            "1 when health checks consider the backend up",
            metrics.backend_up.clone(),
        );
        registry.register(
            "backend_health_transitions",
            "Health state changes, by new state",
            metrics.backend_transitions.clone(),
        );
        registry.register(
            "frontend_connections",
            "Client connections accepted",
            metrics.frontend_connections.clone(),
        );
        registry.register(
            "frontend_active_connections",
            "Open client connections",
            metrics.frontend_active.clone(),
        );
        registry.register(
            "frontend_rejected_connections",
            "Client connections closed without a backend, by reason",
            metrics.frontend_rejected.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads, by result",
            metrics.reloads.clone(),
        );
        registry.register(
            "vip_holder",
            "1 while this gateway holds the virtual IP",
            metrics.vip_holder.clone(),
        );
        registry.register(
            "vip_acquired",
            "Times this gateway took the virtual IP",
            metrics.vip_acquired.clone(),
        );
        registry.register(
            "vip_released",
            "Times this gateway gave the virtual IP up, by reason",
            metrics.vip_released.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Handles for one backend's series.
    pub fn backend(&self, frontend: &str, backend: &str) -> BackendMetrics {
        let labels = BackendLabels {
            frontend: frontend.to_string(),
            backend: backend.to_string(),
        };
        let bytes = |direction: &str| {
            self.backend_bytes
                .get_or_create(&BytesLabels {
                    frontend: frontend.to_string(),
                    backend: backend.to_string(),
                    direction: direction.to_string(),
                })
                .clone()
        };
        let transitions = |to: &str| {
            self.backend_transitions
                .get_or_create(&TransitionLabels {
                    frontend: frontend.to_string(),
                    backend: backend.to_string(),
                    to: to.to_string(),
                })
                .clone()
        };
        BackendMetrics {
            active: self.backend_active.get_or_create(&labels).clone(),
            connections: self.backend_connections.get_or_create(&labels).clone(),
            bytes_to_backend: bytes("to_backend"),
            bytes_to_client: bytes("to_client"),
            connect_seconds: self.backend_connect_seconds.get_or_create(&labels).clone(),
            connect_failures: self.backend_connect_failures.get_or_create(&labels).clone(),
            up: self.backend_up.get_or_create(&labels).clone(),
            went_up: transitions("up"),
            went_down: transitions("down"),
        }
    }

    /// Handles for one frontend's series, behind one reference count for its connections.
    pub fn frontend(&self, frontend: &str) -> Arc<FrontendMetrics> {
        let labels = FrontendLabels {
            frontend: frontend.to_string(),
        };
        let rejected = |reason: &str| {
            self.frontend_rejected
                .get_or_create(&RejectLabels {
                    frontend: frontend.to_string(),
                    reason: reason.to_string(),
                })
                .clone()
        };
        Arc::new(FrontendMetrics {
            connections: self.frontend_connections.get_or_create(&labels).clone(),
            active: self.frontend_active.get_or_create(&labels).clone(),
            rejected_no_backend: rejected("no_healthy_backend"),
            rejected_max_connections: rejected("max_connections"),
            rejected_connect_failed: rejected("connect_failed"),
            rejected_queue_timeout: rejected("queue_timeout"),
        })
    }

    /// Handles for the VIP series.
    pub fn vip(&self) -> VipMetrics {
        VipMetrics {
            holder: self.vip_holder.clone(),
            acquired: self.vip_acquired.clone(),
            released: self.vip_released.clone(),
        }
    }

    /// Counts one reload attempt.
    pub fn reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.reloads
            .get_or_create(&ReloadLabels {
                result: result.to_string(),
            })
            .inc();
    }
}

/// Per-backend series.
#[derive(Clone, Debug)]
pub struct BackendMetrics {
    /// Open connections.
    pub active: Gauge,
    /// Connections opened.
    pub connections: Counter,
    /// Bytes from clients to the backend.
    pub bytes_to_backend: Counter,
    /// Bytes from the backend to clients.
    pub bytes_to_client: Counter,
    /// Connect latency.
    pub connect_seconds: Histogram,
    /// Failed connects.
    pub connect_failures: Counter,
    /// 1 while up.
    pub up: Gauge,
    /// Transitions to up.
    pub went_up: Counter,
    /// Transitions to down.
    pub went_down: Counter,
}

/// Per-frontend series.
#[derive(Clone, Debug)]
pub struct FrontendMetrics {
    /// Accepted connections.
    pub connections: Counter,
    /// Open client connections.
    pub active: Gauge,
    /// Closed at once: no healthy backend.
    pub rejected_no_backend: Counter,
    /// Closed at once: frontend connection limit.
    pub rejected_max_connections: Counter,
    /// Closed: every connect attempt failed.
    pub rejected_connect_failed: Counter,
    /// Closed: no backend below its limit in time.
    pub rejected_queue_timeout: Counter,
}

/// The VIP series.
#[derive(Clone, Debug)]
pub struct VipMetrics {
    /// 1 while holding the VIP.
    pub holder: Gauge,
    /// Times the VIP was taken.
    pub acquired: Counter,
    released: Family<VipReleaseLabels, Counter>,
}

impl VipMetrics {
    /// The release counter of `reason`.
    pub fn released(&self, reason: &str) -> Counter {
        self.released
            .get_or_create(&VipReleaseLabels {
                reason: reason.to_string(),
            })
            .clone()
    }
}

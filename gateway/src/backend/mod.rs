//! Backends: the shared state of one backend server.
//!
//! A [`Backend`] is shared (`Arc`) by its health-check task, its balancer endpoint, the
//! connections relayed to it and the admin API. It survives a reload that leaves the backend's
//! address and limits unchanged, so open-connection counts, health state and operator
//! decisions (drain, disable, weight) carry over.
//!
//! A backend takes new connections (is *eligible*) when all of these hold: health checks say
//! up, the operator has it enabled (not draining, not disabled), its weight is above zero and
//! no recent connect failed (*suspect*). It is *ready* when eligible and under its own
//! connection limit. Every change of these inputs bumps a version on a `watch` channel, which
//! wakes the balancer endpoint waiting for readiness.
//!
//! Lock order: `state` before `sessions`; neither is held across an `.await`.

pub mod checks;
mod status;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use status::BackendStatus;

use crate::config::{
    BackendConfig, BalancePolicy, CheckKind, FrontendConfig, OnMarkedDown, MAX_WEIGHT,
};
use crate::health::{Health, HealthMachine, Transition};
use crate::load::{least_connections_cost, peak_ewma_cost, slow_start_share, PeakEwma};
use crate::metrics::BackendMetrics;

/// All backends of the running configuration, for the admin API and the VIP election.
pub type Directory = Arc<RwLock<Vec<Arc<Backend>>>>;

/// The operator's decision about a backend (admin API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminState {
    /// Normal operation.
    Enabled,
    /// No new connections; established ones continue (HAProxy `drain`).
    Draining,
    /// No new connections and established ones are closed (HAProxy `maint` with
    /// `shutdown sessions`).
    Disabled,
}

#[derive(Debug)]
struct State {
    health: HealthMachine,
    admin: AdminState,
    weight: u32,
    up_since: Instant,
    suspect: bool,
    latency: PeakEwma,
    last_check_error: Option<String>,
}

/// The shared state of one backend.
#[derive(Debug)]
pub struct Backend {
    frontend: String,
    config: BackendConfig,
    policy: BalancePolicy,
    slow_start: Duration,
    on_marked_down: OnMarkedDown,
    has_checks: bool,
    state: Mutex<State>,
    open: AtomicUsize,
    changes: watch::Sender<u64>,
    sessions: Mutex<CancellationToken>,
    check_requested: Notify,
    suspected: Notify,
    metrics: BackendMetrics,
}

impl Backend {
    /// A backend of `frontend`, optimistically up until its first check.
    pub fn new(
        frontend: &FrontendConfig,
        config: BackendConfig,
        metrics: BackendMetrics,
    ) -> Arc<Backend> {
        let now = Instant::now();
        metrics.up.set(1);
        Arc::new(Backend {
            frontend: frontend.name.clone(),
            policy: frontend.balance,
            slow_start: frontend.check.slow_start,
            on_marked_down: frontend.on_marked_down,
            has_checks: frontend.check.kind != CheckKind::None,
            state: Mutex::new(State {
                health: HealthMachine::new(frontend.check.fall, frontend.check.rise),
                admin: AdminState::Enabled,
                weight: config.weight,
                // Initial backends start at full weight: slow start is for recoveries.
                up_since: now.checked_sub(frontend.check.slow_start).unwrap_or(now),
                suspect: false,
                latency: PeakEwma::new(now),
                last_check_error: None,
            }),
            config,
            open: AtomicUsize::new(0),
            changes: watch::Sender::new(0),
            sessions: Mutex::new(CancellationToken::new()),
            check_requested: Notify::new(),
            suspected: Notify::new(),
            metrics,
        })
    }

    /// The frontend's name.
    pub fn frontend(&self) -> &str {
        &self.frontend
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The address connections are relayed to.
    pub fn address(&self) -> &str {
        &self.config.address
    }

    /// The address probed by health checks.
    pub fn check_address(&self) -> &str {
        self.config
            .check_address
            .as_deref()
            .unwrap_or(&self.config.address)
    }

    /// The configuration this backend was built from.
    pub fn config(&self) -> &BackendConfig {
        &self.config
    }

    /// Metric handles.
    pub fn metrics(&self) -> &BackendMetrics {
        &self.metrics
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("backend state lock poisoned")
    }

    fn bump(&self) {
        self.changes
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    /// A receiver that changes whenever eligibility or readiness may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Open connections (including ones still connecting).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Whether the backend may take new connections, ignoring its connection limit.
    pub fn is_eligible(&self) -> bool {
        let state = self.state();
        state.health.health() == Health::Up
            && state.admin == AdminState::Enabled
            && state.weight > 0
            && !state.suspect
    }

    /// Whether the backend may take a new connection now.
    pub fn is_ready(&self) -> bool {
        let under_limit = self
            .config
            .max_connections
            .is_none_or(|max| self.open_connections() < max);
        under_limit && self.is_eligible()
    }

    /// The weight scaled by slow start, at `now`.
    pub fn effective_weight(&self, now: Instant) -> f64 {
        let state = self.state();
        f64::from(state.weight)
            * slow_start_share(
                now.saturating_duration_since(state.up_since),
                self.slow_start,
            )
    }

    /// The balancing cost under the frontend's policy (lower is better).
    pub fn cost(&self) -> f64 {
        let now = Instant::now();
        let weight = self.effective_weight(now);
        let open = self.open_connections();
        match self.policy {
            BalancePolicy::PeakEwma => {
                peak_ewma_cost(self.state().latency.estimate(now), open, weight)
            }
            BalancePolicy::LeastConnections | BalancePolicy::RoundRobin => {
                least_connections_cost(open, weight)
            }
        }
    }

    /// Applies one active check result.
    pub fn record_check(&self, result: Result<(), String>) {
        let success = result.is_ok();
        let transition = {
            let mut state = self.state();
            if success {
                state.suspect = false;
            }
            state.last_check_error = result.err();
            state.health.record(success)
        };
        self.after_result(transition);
    }

    /// Records a failed connect (passive detection): the backend turns suspect until the next
    /// successful check, the failure counts towards `fall`, and a check is run at once.
    pub fn record_connect_failure(&self, error: &str) {
        self.metrics.connect_failures.inc();
        let transition = {
            let mut state = self.state();
            state.suspect = true;
            state.last_check_error = Some(format!("connect: {error}"));
            if self.has_checks {
                state.health.record(false)
            } else {
                None
            }
        };
        self.check_requested.notify_one();
        self.suspected.notify_one();
        self.after_result(transition);
    }

    /// Records a successful connect and its latency.
    pub fn record_connect_success(&self, latency: Duration) {
        self.metrics.connect_seconds.observe(latency.as_secs_f64());
        self.state().latency.observe(latency, Instant::now());
    }

    fn after_result(&self, transition: Option<Transition>) {
        match transition {
            Some(Transition::WentUp) => {
                self.state().up_since = Instant::now();
                self.metrics.up.set(1);
                self.metrics.went_up.inc();
                tracing::info!(frontend = %self.frontend, backend = %self.name(), "backend is up");
            }
            Some(Transition::WentDown) => {
                self.metrics.up.set(0);
                self.metrics.went_down.inc();
                let reason = self.state().last_check_error.clone().unwrap_or_default();
                tracing::warn!(frontend = %self.frontend, backend = %self.name(), %reason, "backend is down");
                if self.on_marked_down == OnMarkedDown::ShutdownSessions {
                    self.close_sessions();
                }
            }
            None => {}
        }
        self.bump();
    }

    /// Lifts the suspect mark (used when there are no active checks).
    pub fn clear_suspect(&self) {
        self.state().suspect = false;
        self.bump();
    }

    /// Resolves once the backend is suspect.
    pub async fn suspected(&self) {
        loop {
            let notified = self.suspected.notified();
            if self.state().suspect {
                return;
            }
            notified.await;
        }
    }

    /// Resolves when a failed connect asks for an immediate check.
    pub async fn check_requested(&self) {
        self.check_requested.notified().await;
    }

    /// Sets the operator state; `Disabled` closes established connections.
    pub fn set_admin_state(&self, admin: AdminState) {
        self.state().admin = admin;
        if admin == AdminState::Disabled {
            self.close_sessions();
        }
        tracing::info!(frontend = %self.frontend, backend = %self.name(), ?admin, "admin state changed");
        self.bump();
    }

    /// Sets the weight (0..=[`MAX_WEIGHT`]); 0 takes no new connections.
    pub fn set_weight(&self, weight: u32) {
        assert!(weight <= MAX_WEIGHT, "weight {weight} above {MAX_WEIGHT}");
        self.state().weight = weight;
        self.bump();
    }

    /// A token cancelled when this backend's established connections must close.
    pub fn session_token(&self) -> CancellationToken {
        self.sessions
            .lock()
            .expect("sessions lock poisoned")
            .child_token()
    }

    /// Closes every established connection to this backend.
    pub fn close_sessions(&self) {
        let mut sessions = self.sessions.lock().expect("sessions lock poisoned");
        sessions.cancel();
        *sessions = CancellationToken::new();
    }

    /// Counts a new connection until the returned slot is dropped.
    pub fn open_slot(self: &Arc<Self>) -> ConnectionSlot {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.metrics.active.inc();
        self.metrics.connections.inc();
        ConnectionSlot {
            backend: Arc::clone(self),
        }
    }

    /// A point-in-time view for the admin API and status page.
    pub fn status(&self) -> BackendStatus {
        let now = Instant::now();
        let weight = self.effective_weight(now);
        let state = self.state();
        BackendStatus {
            frontend: self.frontend.clone(),
            name: self.config.name.clone(),
            address: self.config.address.clone(),
            health: match state.health.health() {
                Health::Up => "up",
                Health::Down => "down",
            },
            admin: state.admin,
            weight: state.weight,
            effective_weight: weight,
            suspect: state.suspect,
            open_connections: self.open_connections(),
            max_connections: self.config.max_connections,
            last_check_error: state.last_check_error.clone(),
        }
    }
}

/// One counted connection to a backend; dropping it releases the count.
#[derive(Debug)]
pub struct ConnectionSlot {
    backend: Arc<Backend>,
}

impl ConnectionSlot {
    /// The backend this slot counts against.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let before = self.backend.open.fetch_sub(1, Ordering::AcqRel);
        assert!(
            before > 0,
            "backend {} open connection count underflow",
            self.backend.name()
        );
        self.backend.metrics.active.dec();
        if self.backend.config.max_connections.is_some() {
            self.backend.bump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CheckConfig, Config};
    use crate::metrics::Metrics;

    fn frontend() -> FrontendConfig {
        let mut config = Config::from_toml(
            "[[frontend]]\nname = \"f\"\nlisten = \"127.0.0.1:1\"\n[[frontend.backend]]\nname = \"b\"\naddress = \"127.0.0.1:2\"\nmax_connections = 1\n",
        )
        .expect("valid");
        let mut frontend = config.frontends.remove(0);
        frontend.check = CheckConfig {
            fall: 2,
            ..CheckConfig::with_kind(CheckKind::Tcp)
        };
        frontend
    }

    #[tokio::test(start_paused = true)]
    async fn eligibility_follows_health_admin_and_limit() {
        let frontend = frontend();
        let metrics = Metrics::new();
        let backend = Backend::new(
            &frontend,
            frontend.backends[0].clone(),
            metrics.backend("f", "b"),
        );
        assert!(backend.is_ready());
        let slot = backend.open_slot();
        assert!(
            backend.is_eligible() && !backend.is_ready(),
            "at its limit of 1"
        );
        drop(slot);
        backend.set_admin_state(AdminState::Draining);
        assert!(!backend.is_eligible());
        backend.set_admin_state(AdminState::Enabled);
        backend.record_check(Ok(()));
        backend.record_connect_failure("refused");
        assert!(!backend.is_eligible(), "suspect after a failed connect");
        backend.record_check(Ok(()));
        assert!(
            backend.is_eligible(),
            "a good check clears the suspect mark"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn recovered_backend_ramps_up() {
        let frontend = frontend();
        let metrics = Metrics::new();
        let backend = Backend::new(
            &frontend,
            frontend.backends[0].clone(),
            metrics.backend("f", "b"),
        );
        assert_eq!(backend.effective_weight(Instant::now()), 100.0);
        backend.record_check(Err("down".into()));
        backend.record_check(Ok(()));
        backend.record_check(Ok(()));
        assert!(backend.is_eligible());
        assert!((backend.effective_weight(Instant::now()) - 10.0).abs() < 1e-6);
        tokio::time::advance(frontend.check.slow_start).await;
        assert_eq!(backend.effective_weight(Instant::now()), 100.0);
    }
}

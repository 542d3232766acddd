//! The VIP controller: the loop that competes for the VIP, holds it and gives it up.
//!
//! ```text
//!            ┌───────────── healthy ─────────────┐
//!            │                                   ▼
//!   Unhealthy ◄── no healthy backend ── Joining (lease + key) ── Candidate (wait for turn)
//!            ▲                                                    │ oldest key
//!            │  fence / lease expired / key deleted / unhealthy   ▼
//!            └─────────────── release the address ◄──────────── Holder
//! ```
//!
//! Errors of the store (unreachable, timeouts) end the round; the next one starts after a
//! bounded, doubling pause. A holder leaves the address *before* it resigns, so the next
//! holder never overlaps with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::address::VipAddress;
use super::announce::announce;
use super::election::{connect, Candidacy, KeyWatch, LeaseState};
use super::error::{AddressError, ElectionError};
use super::fence::{address_lifetime, fence_deadline, lifetime_fits, LeaseProof};
use super::status::{ReleaseReason, VipMonitor, VipState};
use crate::config::VipConfig;

/// How often the gateway's own health (any backend up) is looked at while competing or holding.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// First pause after a failed round (store unreachable, request timed out).
pub const RETRY_PAUSE_MIN: Duration = Duration::from_millis(200);
/// Tries at setting an address lifetime that still fits once `ip` has run (each try is
/// shorter than the last; see `Controller::hold_address`).
pub const LIFETIME_ATTEMPTS: usize = 3;
/// Longest pause between failed rounds: a store that comes back is joined within this.
pub const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Whether this gateway can serve (at least one backend up and enabled).
pub type HealthProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// How a round ended.
enum Outcome {
    /// Back to the start: released the VIP or lost the candidacy.
    Again,
    /// The gateway shuts down.
    Stopped,
}

/// Competes for, holds and releases one VIP. See the module documentation.
pub struct Controller {
    config: VipConfig,
    address: VipAddress,
    monitor: Arc<VipMonitor>,
    healthy: HealthProbe,
    stop: CancellationToken,
    /// The store member a round starts with; a failed round moves to the next one.
    first_endpoint: AtomicUsize,
}

impl Controller {
    /// A controller of `config`'s VIP; it stops (releasing the VIP) when `stop` is cancelled.
    pub fn new(
        config: VipConfig,
        monitor: Arc<VipMonitor>,
        healthy: HealthProbe,
        stop: CancellationToken,
    ) -> Self {
        let address = VipAddress::new(config.address, config.prefix_len, &config.interface);
        Controller {
            config,
            address,
            monitor,
            healthy,
            stop,
            first_endpoint: AtomicUsize::new(0),
        }
    }

    /// Runs until stopped. A VIP left on the interface by an earlier process is removed first.
    pub async fn run(self) {
        match self.address.release().await {
            Ok(true) => {
                tracing::warn!(vip = %self.address.address(), "removed a VIP left by an earlier process")
            }
            Ok(false) => {}
            Err(error) => self.record_error(&error),
        }
        let mut pause = RETRY_PAUSE_MIN;
        while self.wait_healthy().await {
            self.monitor.set_state(VipState::Joining);
            match self.round().await {
                Ok(Outcome::Stopped) => break,
                Ok(Outcome::Again) => pause = RETRY_PAUSE_MIN,
                Err(error) => {
                    self.record_error(&error);
                    self.first_endpoint.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
            }
        }
        self.monitor.set_state(VipState::Stopped);
    }

    fn record_error(&self, error: &dyn std::fmt::Display) {
        tracing::warn!(vip = %self.address.address(), %error, "VIP election");
        self.monitor.set_error(error);
    }

    /// Waits until a backend is healthy; `false` when stopped first.
    async fn wait_healthy(&self) -> bool {
        let mut ticks = tokio::time::interval(HEALTH_POLL_INTERVAL);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = ticks.tick() => {}
            }
            if (self.healthy)() {
                return true;
            }
            self.monitor.set_state(VipState::Unhealthy);
        }
    }

    /// One candidacy: join, wait for the turn, hold.
    async fn round(&self) -> Result<Outcome, ElectionError> {
        let first = self.first_endpoint.load(Ordering::Relaxed);
        let clients = connect(&self.config, first).await?;
        let candidacy = Candidacy::join(clients, &self.config).await?;
        self.monitor.set_lease(candidacy.lease_id());
        self.monitor.set_state(VipState::Candidate);
        let mut lease = candidacy.lease();
        enum Waited {
            Turn(Result<(), ElectionError>),
            LeaseLost,
            Unhealthy,
            Stopped,
        }
        let waited = tokio::select! {
            biased;
            _ = self.stop.cancelled() => Waited::Stopped,
            _ = expired(&mut lease) => Waited::LeaseLost,
            _ = self.unhealthy() => Waited::Unhealthy,
            turn = candidacy.wait_for_turn(|holder| self.monitor.set_current_holder(holder)) => Waited::Turn(turn),
        };
        match waited {
            Waited::Turn(Ok(())) => self.hold(candidacy).await,
            Waited::Turn(Err(error)) => Err(error),
            Waited::LeaseLost => Ok(Outcome::Again),
            Waited::Unhealthy => {
                candidacy.resign().await;
                Ok(Outcome::Again)
            }
            Waited::Stopped => {
                candidacy.resign().await;
                Ok(Outcome::Stopped)
            }
        }
    }

    /// Returns when no backend is healthy.
    async fn unhealthy(&self) {
        let mut ticks = tokio::time::interval(HEALTH_POLL_INTERVAL);
        loop {
            ticks.tick().await;
            if !(self.healthy)() {
                return;
            }
        }
    }

    /// Holds the VIP until a reason to release it, releases it, then resigns when leaving
    /// voluntarily.
    async fn hold(&self, candidacy: Candidacy) -> Result<Outcome, ElectionError> {
        let mut lease = candidacy.lease();
        let LeaseState::Alive(proof) = *lease.borrow_and_update() else {
            return Ok(Outcome::Again);
        };
        let mut own_key = candidacy.watch_own_key(0).await?;
        let lifetime = match self.hold_address(proof).await {
            Ok(Some(lifetime)) => lifetime,
            Ok(None) => {
                self.release_address().await;
                return Ok(Outcome::Again);
            }
            Err(error) => {
                self.record_error(&error);
                self.release_address().await;
                candidacy.resign().await;
                return Ok(Outcome::Again);
            }
        };
        self.monitor.acquired();
        tracing::info!(vip = %self.address.address(), interface = self.address.interface(), lifetime_s = lifetime, "took the VIP");
        let announcer = self.spawn_announce();
        let reason = self
            .keep_holding(&mut lease, &mut own_key, &candidacy, proof)
            .await;
        announcer.abort();
        self.release_address().await;
        self.monitor.released(reason);
        tracing::info!(vip = %self.address.address(), reason = reason.label(), "released the VIP");
        match reason {
            ReleaseReason::Shutdown => {
                candidacy.resign().await;
                Ok(Outcome::Stopped)
            }
            ReleaseReason::Unhealthy | ReleaseReason::AddressFailed | ReleaseReason::WatchLost => {
                candidacy.resign().await;
                Ok(Outcome::Again)
            }
            ReleaseReason::Fenced | ReleaseReason::LeaseExpired | ReleaseReason::KeyDeleted => {
                Ok(Outcome::Again)
            }
        }
    }

    /// The holder's loop: renews the address lifetime on each proof, until a release reason.
    async fn keep_holding(
        &self,
        lease: &mut watch::Receiver<LeaseState>,
        own_key: &mut KeyWatch,
        candidacy: &Candidacy,
        mut proof: LeaseProof,
    ) -> ReleaseReason {
        enum Event {
            Fence,
            Stop,
            Lease(Option<LeaseState>),
            KeyGone(Result<(), ElectionError>),
            HealthTick,
        }
        let mut health = tokio::time::interval(HEALTH_POLL_INTERVAL);
        let mut watch_attempts = 0usize;
        loop {
            let event = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(fence_deadline(proof)) => Event::Fence,
                _ = self.stop.cancelled() => Event::Stop,
                changed = lease.changed() => Event::Lease(changed.ok().map(|()| *lease.borrow_and_update())),
                deleted = own_key.deleted() => Event::KeyGone(deleted),
                _ = health.tick() => Event::HealthTick,
            };
            match event {
                Event::Fence => return ReleaseReason::Fenced,
                Event::Stop => return ReleaseReason::Shutdown,
                Event::Lease(Some(LeaseState::Alive(next))) => {
                    proof = next;
                    match self.hold_address(proof).await {
                        Ok(Some(_)) => {}
                        Ok(None) => return ReleaseReason::Fenced,
                        Err(error) => {
                            self.record_error(&error);
                            return ReleaseReason::AddressFailed;
                        }
                    }
                }
                Event::Lease(_) => return ReleaseReason::LeaseExpired,
                Event::KeyGone(Ok(())) => return ReleaseReason::KeyDeleted,
                Event::KeyGone(Err(error)) => {
                    self.record_error(&error);
                    watch_attempts += 1;
                    match candidacy.watch_own_key(watch_attempts).await {
                        Ok(watch) => *own_key = watch,
                        Err(error) => {
                            self.record_error(&error);
                            return ReleaseReason::WatchLost;
                        }
                    }
                }
                Event::HealthTick if !(self.healthy)() => return ReleaseReason::Unhealthy,
                Event::HealthTick => {}
            }
        }
    }

    /// Adds or renews the address with a kernel lifetime that ends before `proof`'s fence
    /// deadline counted from when `ip` finished (see `super::fence`): when `ip` ran so late
    /// that it no longer does, a shorter lifetime is set, at most [`LIFETIME_ATTEMPTS`] times.
    /// `Ok(None)`: no lifetime fits (any more); the caller drops the address.
    async fn hold_address(&self, proof: LeaseProof) -> Result<Option<u32>, AddressError> {
        for _ in 0..LIFETIME_ATTEMPTS {
            let Some(lifetime) = address_lifetime(Instant::now(), proof) else {
                return Ok(None);
            };
            self.address.hold(lifetime).await?;
            if lifetime_fits(Instant::now(), lifetime, proof) {
                return Ok(Some(lifetime));
            }
            tracing::warn!(vip = %self.address.address(), lifetime_s = lifetime, "ip ran too late for the VIP's lifetime; setting a shorter one");
        }
        Ok(None)
    }

    /// Removes the address; a failure is logged (the kernel lifetime removes it anyway).
    async fn release_address(&self) {
        if let Err(error) = self.address.release().await {
            tracing::error!(vip = %self.address.address(), %error, "cannot remove the VIP; its lifetime ends it");
            self.monitor.set_error(&error);
        }
    }

    /// Announces the VIP's new MAC address in the background (aborted on release).
    fn spawn_announce(&self) -> JoinHandle<()> {
        let address = self.address.clone();
        let monitor = Arc::clone(&self.monitor);
        tokio::spawn(async move {
            let result = match address.interface_identity().await {
                Ok(identity) => announce(identity, address.address())
                    .await
                    .map_err(|error| {
                        let what = if address.address().is_ipv4() {
                            "gratuitous ARP"
                        } else {
                            "neighbour advertisement"
                        };
                        format!("{what} on {}: {error}", address.interface())
                    }),
                Err(error) => Err(error.to_string()),
            };
            if let Err(error) = result {
                tracing::warn!(%error, "VIP announcement");
                monitor.set_error(&error);
            }
        })
    }
}

/// Returns when the lease is known expired (or its keep-alive task is gone).
async fn expired(lease: &mut watch::Receiver<LeaseState>) {
    loop {
        if *lease.borrow_and_update() == LeaseState::Expired {
            return;
        }
        if lease.changed().await.is_err() {
            return;
        }
    }
}

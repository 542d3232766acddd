//! A member's control over its own elections, for leadership transfer
//! (the algorithm is in `crate::server::peer::transfer`; this is the state it
//! drives, kept below the server so the core can own it):
//!
//! - the [`TransferGate`], which every log write and ReadIndex round of the
//!   leader passes and which a transfer closes while the target campaigns;
//! - holding this member's elections for a while (the other voters during
//!   a transfer), lifted by a timer so a leader that dies mid-transfer
//!   cannot leave them held;
//! - campaigning repeatedly for a while (the target of a transfer).

use openraft::async_runtime::WatchReceiver as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio::time::Instant;

use super::Raft;
use crate::errors::EtcdError;

/// Pause between two elections the target starts, in heartbeat intervals.
/// A vote round on a healthy network takes far less (one RPC and one vote
/// fsync per voter), and a refused round is retried this soon after the
/// voters' leases expire.
pub const CAMPAIGN_RETRY_HEARTBEATS: u32 = 1;

/// Closed by a leadership transfer; every log write and ReadIndex round of
/// the leader passes it. A fair read-write lock: closing waits for the
/// writes and rounds in flight, and once a transfer waits to close it, new
/// ones wait behind it.
#[derive(Clone, Default)]
pub struct TransferGate(Arc<RwLock<()>>);

impl TransferGate {
    /// Passes the gate; the guard keeps it from closing until dropped.
    pub async fn enter(&self) -> OwnedRwLockReadGuard<()> {
        self.0.clone().read_owned().await
    }

    /// [`Self::enter`], or etcd's timeout error at `deadline`.
    pub async fn enter_until(
        &self,
        deadline: Instant,
    ) -> Result<OwnedRwLockReadGuard<()>, EtcdError> {
        tokio::time::timeout_at(deadline, self.enter())
            .await
            .map_err(|_| EtcdError::Timeout)
    }

    /// Closes the gate: waits for the passes in flight; new ones wait
    /// until the guard is dropped.
    pub async fn close(&self) -> OwnedRwLockWriteGuard<()> {
        self.0.clone().write_owned().await
    }
}

/// A member's control over its own elections, used by leadership transfer
/// (one per member).
#[derive(Default)]
pub struct ElectionControl {
    gate: TransferGate,
    /// One transfer at a time on this member.
    pub running: tokio::sync::Mutex<()>,
    /// Until when this member's elections are held, if they are.
    hold_until: Arc<Mutex<Option<Instant>>>,
    /// Until when this member campaigns, while a campaign runs.
    campaign_until: Arc<Mutex<Option<Instant>>>,
}

impl ElectionControl {
    /// The gate that log writes and ReadIndex rounds pass.
    pub fn gate(&self) -> &TransferGate {
        &self.gate
    }

    /// Holds this member's elections for `duration` (zero: lifts the hold).
    /// A timer lifts it when the time is up unless a later call replaced it.
    pub fn hold_elections(&self, raft: &Raft, duration: Duration) {
        let mut hold = lock(&self.hold_until);
        if duration.is_zero() {
            *hold = None;
            raft.runtime_config().elect(true);
            return;
        }
        let until = after(duration);
        *hold = Some(until);
        raft.runtime_config().elect(false);
        let (raft, hold_until) = (raft.clone(), self.hold_until.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut hold = lock(&hold_until);
            if *hold == Some(until) {
                *hold = None;
                raft.runtime_config().elect(true);
            }
        });
    }

    /// Campaigns for `duration` (or extends a running campaign to it).
    pub fn campaign(&self, raft: &Raft, duration: Duration) {
        let until = after(duration);
        {
            let mut current = lock(&self.campaign_until);
            let running = current.is_some();
            *current = Some(until);
            if running {
                return;
            }
        }
        let (raft, campaign_until) = (raft.clone(), self.campaign_until.clone());
        tokio::spawn(async move {
            let retry = Duration::from_millis(
                raft.config()
                    .heartbeat_interval
                    .saturating_mul(u64::from(CAMPAIGN_RETRY_HEARTBEATS)),
            );
            loop {
                let leading = raft.metrics().borrow_watched().state == ServerState::Leader;
                {
                    let mut current = lock(&campaign_until);
                    if leading || current.is_none_or(|until| Instant::now() >= until) {
                        *current = None;
                        return;
                    }
                }
                // A real election, no pre-vote round: the other voters hold
                // their elections but their leases of the old leader would
                // refuse a pre-vote (etcd's MoveLeader skips it too).
                if let Err(error) = raft.trigger().elect(false).await {
                    tracing::warn!(%error, "leadership transfer: cannot campaign");
                    *lock(&campaign_until) = None;
                    return;
                }
                tokio::time::sleep(retry).await;
            }
        });
    }
}

/// `duration` from now (a far-off instant rather than an overflow).
pub fn after(duration: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(FAR_FUTURE_SECS))
}

/// What [`after`] answers for a duration past the clock's range: a year.
const FAR_FUTURE_SECS: u64 = 365 * 24 * 3600;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long the tests wait to see that something stays blocked (paused
    /// clock: no real time passes).
    const BLOCKED_MS: u64 = 50;

    #[tokio::test(start_paused = true)]
    async fn closing_waits_for_passes_and_holds_new_ones_back() {
        let gate = TransferGate::default();
        let in_flight = gate.enter().await;
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close().await }
        });
        tokio::time::sleep(Duration::from_millis(BLOCKED_MS)).await;
        assert!(!closing.is_finished(), "closed under a pass in flight");

        // A transfer is waiting to close: newcomers queue behind it.
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(matches!(
            gate.enter_until(deadline).await,
            Err(EtcdError::Timeout)
        ));

        drop(in_flight);
        let closed = closing.await.expect("closing task");
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(
            gate.enter_until(deadline).await.is_err(),
            "passed a closed gate"
        );
        drop(closed);
        let deadline = Instant::now() + Duration::from_millis(BLOCKED_MS);
        assert!(
            gate.enter_until(deadline).await.is_ok(),
            "gate did not reopen"
        );
    }

    #[test]
    fn after_never_overflows() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            assert!(after(Duration::MAX) > Instant::now());
        });
    }
}

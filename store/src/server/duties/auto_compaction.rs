//! Automatic history compaction (etcd's `--auto-compaction-mode` and
//! `--auto-compaction-retention`, its `v3compactor` package).
//!
//! Only the leader compacts; on other members the task keeps sampling but
//! proposes nothing (etcd pauses its compactor on followers). A compaction
//! is an ordinary `Compact` proposal, so every member compacts the same
//! revision, and "already compacted" counts as success.
//!
//! **Periodic** (retention a duration, or a bare number of hours): the
//! task samples the current revision every `min(retention, 1h) / 10` and
//! keeps the last `retention / sample interval + 1` samples, so the oldest
//! is at least one retention old. The first compaction happens one
//! retention after start, then every `min(retention, 1h)`, each to the
//! oldest sample. Worked example, retention `10m`: samples every minute;
//! at 10:00 the revision sampled at 0:00 is compacted, at 20:00 the one of
//! 9:00, at 30:00 the one of 19:00. Retention `24h`: samples every 6
//! minutes, first compaction after 24 hours, then hourly, always keeping
//! at least 24 hours of history.
//!
//! **Revision** (retention a number of revisions): every
//! [`REVISION_CHECK_INTERVAL_SECS`], compact to `current - retention`
//! unless that is not positive or was the last compaction. With retention
//! 1000 and the revision at 5,300: compact 4,300.
//!
//! The scheduling is pure ([`Periodic`], [`ByRevision`]); [`spawn`] drives
//! it with the clock and the store.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::CompactionRequest;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::errors::EtcdError;
use crate::server::core::Core;

/// How often revision mode checks (etcd's `revInterval`).
pub const REVISION_CHECK_INTERVAL_SECS: u64 = 5 * 60;

/// Periodic mode compacts at most this often, and samples ten times per
/// this (etcd caps both at an hour for long retentions).
pub const PERIODIC_MAX_INTERVAL_SECS: u64 = 60 * 60;

/// Samples per compaction interval in periodic mode (etcd's
/// `retryDivisor`).
const SAMPLES_PER_INTERVAL: u32 = 10;

/// The configured policy (`Config::auto_compaction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much time of history.
    Periodic(Duration),
    /// Keep this many revisions of history.
    Revision(i64),
}

/// Periodic mode's schedule (module docs).
#[derive(Debug)]
pub struct Periodic {
    retention: Duration,
    /// Revisions sampled every `sample_interval`, oldest first.
    samples: VecDeque<i64>,
    /// The number of samples that span one retention.
    window: usize,
    /// Time that must pass after `last_success` before the next
    /// compaction: the retention at first, then the compaction interval.
    wait: Duration,
    last_success: Instant,
    last_revision: i64,
}

impl Periodic {
    /// A schedule for `retention` (non-zero), started at `now`.
    pub fn new(retention: Duration, now: Instant) -> Self {
        assert!(!retention.is_zero(), "a zero retention disables compaction");
        let sample = Self::interval_for(retention) / SAMPLES_PER_INTERVAL;
        let window = (retention.as_nanos() / sample.as_nanos().max(1)) as usize + 1;
        Self {
            retention,
            samples: VecDeque::with_capacity(window + 1),
            window,
            wait: retention,
            last_success: now,
            last_revision: 0,
        }
    }

    fn interval_for(retention: Duration) -> Duration {
        retention.min(Duration::from_secs(PERIODIC_MAX_INTERVAL_SECS))
    }

    /// How long to sleep between samples.
    pub fn sample_interval(&self) -> Duration {
        Self::interval_for(self.retention) / SAMPLES_PER_INTERVAL
    }

    /// Records the current revision; the window keeps the last retention's
    /// worth.
    pub fn sample(&mut self, revision: i64) {
        self.samples.push_back(revision);
        if self.samples.len() > self.window {
            self.samples.pop_front();
        }
    }

    /// The revision to compact now, if one is due.
    pub fn due(&mut self, now: Instant) -> Option<i64> {
        let oldest = *self.samples.front()?;
        if now.duration_since(self.last_success) < self.wait || oldest == self.last_revision {
            return None;
        }
        self.wait = Self::interval_for(self.retention);
        Some(oldest)
    }

    /// Records a compaction of `revision` that succeeded (or was already
    /// done).
    pub fn succeeded(&mut self, revision: i64, now: Instant) {
        self.last_revision = revision;
        self.last_success = now;
    }
}

/// Revision mode's schedule (module docs).
#[derive(Debug)]
pub struct ByRevision {
    retention: i64,
    last_revision: i64,
}

impl ByRevision {
    /// A schedule keeping `retention` (positive) revisions.
    pub fn new(retention: i64) -> Self {
        assert!(retention > 0, "a zero retention disables compaction");
        Self {
            retention,
            last_revision: 0,
        }
    }

    /// The revision to compact given the current one, if any.
    pub fn due(&self, current: i64) -> Option<i64> {
        let rev = current.saturating_sub(self.retention);
        (rev > 0 && rev != self.last_revision).then_some(rev)
    }

    /// Records a compaction of `revision` that succeeded (or was already
    /// done).
    pub fn succeeded(&mut self, revision: i64) {
        self.last_revision = revision;
    }
}

/// Proposes a compaction to `revision` if this member leads; true if the
/// history is now compacted there.
async fn compact(core: &Core, revision: i64, mode: &str) -> bool {
    tracing::info!(revision, mode, "starting auto {mode} compaction");
    let started = std::time::Instant::now();
    let r = CompactionRequest {
        revision,
        physical: false,
    };
    match core.compact_own(r).await {
        Ok(_) | Err(EtcdError::Compacted) => {
            tracing::info!(
                revision,
                took = ?started.elapsed(),
                "completed auto {mode} compaction"
            );
            true
        }
        Err(e) => {
            tracing::warn!(revision, error = %e, "failed auto {mode} compaction");
            false
        }
    }
}

fn leads(core: &Core) -> bool {
    core.leader() == Some(core.config.member_id)
}

/// Runs `policy` until `stop` (module docs).
pub fn spawn(core: Arc<Core>, policy: AutoCompaction, stop: watch::Receiver<bool>) {
    match policy {
        AutoCompaction::Periodic(retention) => {
            tokio::spawn(run_periodic(core, retention, stop));
        }
        AutoCompaction::Revision(retention) => {
            tokio::spawn(run_by_revision(core, retention, stop));
        }
    }
}

async fn run_periodic(core: Arc<Core>, retention: Duration, mut stop: watch::Receiver<bool>) {
    let mut schedule = Periodic::new(retention, Instant::now());
    loop {
        schedule.sample(core.mvcc.current_revision());
        tokio::select! {
            _ = tokio::time::sleep(schedule.sample_interval()) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !leads(&core) {
            continue;
        }
        let Some(rev) = schedule.due(Instant::now()) else {
            continue;
        };
        if compact(&core, rev, "periodic").await {
            schedule.succeeded(rev, Instant::now());
        }
    }
}

async fn run_by_revision(core: Arc<Core>, retention: i64, mut stop: watch::Receiver<bool>) {
    let mut schedule = ByRevision::new(retention);
    let every = Duration::from_secs(REVISION_CHECK_INTERVAL_SECS);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !leads(&core) {
            continue;
        }
        let Some(rev) = schedule.due(core.mvcc.current_revision()) else {
            continue;
        };
        if compact(&core, rev, "revision").await {
            schedule.succeeded(rev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    /// Drives a periodic schedule with a revision that grows by 100 per
    /// minute; returns (minute, revision) of each compaction.
    fn simulate(retention: Duration, minutes: u32) -> Vec<(u32, i64)> {
        let start = Instant::now();
        let mut s = Periodic::new(retention, start);
        let mut now = start;
        let mut out = Vec::new();
        let step = s.sample_interval();
        let mut elapsed = Duration::ZERO;
        while elapsed < MIN * minutes {
            let rev = 1 + (elapsed.as_secs() as i64 * 100) / 60;
            s.sample(rev);
            now += step;
            elapsed += step;
            if let Some(r) = s.due(now) {
                s.succeeded(r, now);
                out.push(((elapsed.as_secs() / 60) as u32, r));
            }
        }
        out
    }

    #[test]
    fn ten_minutes_compacts_every_ten_minutes_to_ten_minutes_ago() {
        let got = simulate(10 * MIN, 35);
        // Revision at minute m is 1 + 100m. The window holds eleven
        // samples, the newest a minute old when the compaction runs, so
        // the oldest is from eleven minutes ago (at least one retention).
        assert_eq!(got, vec![(10, 1), (20, 901), (30, 1901)]);
    }

    #[test]
    fn day_long_retention_compacts_hourly_keeping_a_day() {
        let got = simulate(24 * 60 * MIN, 27 * 60);
        let minutes: Vec<u32> = got.iter().map(|(m, _)| *m).collect();
        assert_eq!(minutes, vec![24 * 60, 25 * 60, 26 * 60, 27 * 60]);
        // Samples every 6 minutes; each compaction after the first keeps
        // 24 hours plus one sample interval.
        assert_eq!(got[0].1, 1);
        for (m, rev) in &got[1..] {
            assert_eq!(*rev, 1 + 100 * i64::from(m - 24 * 60 - 6), "at minute {m}");
        }
    }

    #[test]
    fn nothing_before_the_first_retention_and_no_repeat_without_writes() {
        let start = Instant::now();
        let mut s = Periodic::new(MIN, start);
        s.sample(5);
        assert_eq!(s.due(start + MIN / 2), None);
        assert_eq!(s.due(start + MIN), Some(5));
        s.succeeded(5, start + MIN);
        s.sample(5);
        assert_eq!(s.due(start + 3 * MIN), None, "same revision again");
    }

    #[test]
    fn revision_mode_keeps_the_retention() {
        let mut s = ByRevision::new(1000);
        assert_eq!(s.due(1000), None);
        assert_eq!(s.due(5300), Some(4300));
        s.succeeded(4300);
        assert_eq!(s.due(5300), None);
        assert_eq!(s.due(5301), Some(4301));
    }
}

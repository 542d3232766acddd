//! The database size behind etcd's quota check.
//!
//! Every write that grows the database asks whether the state machine's
//! tables plus the write's cost would pass `--quota-backend-bytes`
//! (`Core::check_quota`). Measuring the tables means several RocksDB
//! property reads per table (file sizes and memtable sizes, each a string
//! lookup under the database's mutex): about 5% of a leader's CPU at 1,000
//! concurrent puts when it was done for every write.
//!
//! etcd's quota compares against `backend.Size()`, which its backend only
//! refreshes when a batch transaction commits (every 100 ms by default), so
//! etcd's check already uses a size up to 100 ms old. [`SizeGauge`] does
//! the same: a measurement answers checks for [`QUOTA_SIZE_REFRESH`], and a
//! check that the cached size would refuse measures again first, so a
//! refusal (and the NOSPACE alarm it raises) is always based on a fresh
//! size: a defragmentation or compaction that freed space lets the next
//! write through at once.
//!
//! Worked example, quota 64 KiB: a measurement of 60 KiB at t = 0 answers
//! checks until t = 100 ms; a 1 KiB put at t = 50 ms passes on the cached
//! size; a 5 KiB put at t = 60 ms would pass the quota on the cached size,
//! so the gauge measures again (say 63 KiB) and the put is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a measured database size answers quota checks: etcd's default
/// batch interval, after which its backend refreshes the size it checks.
pub const QUOTA_SIZE_REFRESH: Duration = Duration::from_millis(100);

/// Marks "never measured" in [`SizeGauge::measured_at_us`].
const NEVER: u64 = u64::MAX;

/// A database size measured at most every [`QUOTA_SIZE_REFRESH`].
pub struct SizeGauge {
    /// How long a measurement answers checks.
    refresh: Duration,
    /// Zero point of `measured_at_us`.
    epoch: Instant,
    /// The last measured size in bytes.
    bytes: AtomicU64,
    /// Microseconds after `epoch` of the last measurement, or [`NEVER`].
    measured_at_us: AtomicU64,
}

impl Default for SizeGauge {
    fn default() -> Self {
        Self::new(QUOTA_SIZE_REFRESH)
    }
}

impl SizeGauge {
    /// A gauge whose measurements answer checks for `refresh`.
    pub fn new(refresh: Duration) -> Self {
        Self {
            refresh,
            epoch: Instant::now(),
            bytes: AtomicU64::new(0),
            measured_at_us: AtomicU64::new(NEVER),
        }
    }

    /// Whether `cost_bytes` more keeps the database within `quota_bytes`:
    /// on the cached size while it is fresh, and on a new measurement
    /// (`measure`) when it is stale or would refuse.
    pub fn fits(&self, cost_bytes: u64, quota_bytes: u64, measure: impl Fn() -> u64) -> bool {
        let fits = |used: u64| used.saturating_add(cost_bytes) <= quota_bytes;
        if let Some(used) = self.fresh() {
            if fits(used) {
                return true;
            }
        }
        fits(self.measure(measure))
    }

    /// The cached size, if measured less than [`QUOTA_SIZE_REFRESH`] ago.
    fn fresh(&self) -> Option<u64> {
        let at = self.measured_at_us.load(Ordering::Acquire);
        let refresh_us = u64::try_from(self.refresh.as_micros()).unwrap_or(NEVER);
        if at == NEVER || self.now_us().saturating_sub(at) >= refresh_us {
            return None;
        }
        Some(self.bytes.load(Ordering::Acquire))
    }

    /// Measures now and caches the result. Concurrent measurements may
    /// race; each stores a size that was true when it was taken.
    fn measure(&self, measure: impl Fn() -> u64) -> u64 {
        let used = measure();
        self.bytes.store(used, Ordering::Release);
        self.measured_at_us.store(self.now_us(), Ordering::Release);
        used
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(NEVER - 1)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const QUOTA: u64 = 64 * 1024;
    /// Longer than any test: every cached size stays fresh.
    const FOREVER: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn a_fresh_size_answers_without_measuring() {
        let gauge = SizeGauge::new(FOREVER);
        let calls = Cell::new(0);
        let measure = || {
            calls.set(calls.get() + 1);
            60 * 1024
        };
        assert!(gauge.fits(1024, QUOTA, measure), "first check measures");
        assert_eq!(calls.get(), 1);
        assert!(gauge.fits(1024, QUOTA, measure));
        assert!(gauge.fits(4 * 1024, QUOTA, measure));
        assert_eq!(calls.get(), 1, "checks within the refresh use the cache");
    }

    #[test]
    fn a_refusal_is_always_measured_again() {
        let gauge = SizeGauge::new(FOREVER);
        let size = Cell::new(60 * 1024);
        let calls = Cell::new(0);
        let measure = || {
            calls.set(calls.get() + 1);
            size.get()
        };
        assert!(gauge.fits(0, QUOTA, measure));
        // The database shrank (defragmented) since the cached measurement:
        // a write the cached size would refuse passes on a new one.
        size.set(10 * 1024);
        assert!(gauge.fits(8 * 1024, QUOTA, measure));
        assert_eq!(calls.get(), 2);
        // And one that does not fit either way is refused after measuring.
        size.set(63 * 1024);
        assert!(
            gauge.fits(1024, QUOTA, measure),
            "cached 10 KiB still fresh"
        );
        assert!(!gauge.fits(60 * 1024, QUOTA, measure));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn a_stale_size_is_measured_again() {
        let gauge = SizeGauge::new(Duration::ZERO);
        let size = Cell::new(1024);
        assert!(gauge.fits(0, QUOTA, || size.get()));
        size.set(QUOTA);
        assert!(
            !gauge.fits(1, QUOTA, || size.get()),
            "once the measurement is stale the growth is seen"
        );
    }

    #[test]
    fn an_overflowing_cost_does_not_fit() {
        let gauge = SizeGauge::default();
        assert!(!gauge.fits(u64::MAX, QUOTA, || 1));
    }
}

//! Load metrics compared by the power-of-two-choices balancer.
//!
//! p2c (Mitzenmacher, *The Power of Two Choices in Randomized Load Balancing*, 2001) samples
//! two ready backends at random and sends the connection to the one with the lower cost. It
//! gets exponentially better balance than one random choice while never herding every client
//! onto the single least-loaded backend, which stale load information would cause.
//!
//! Costs (lower is better) divide by the backend's *effective weight*, so weights and slow
//! start apply to every policy:
//!
//! * least connections: `(open + 1) / weight`. Open connections are the right load for
//!   kube-apiserver, where most connections are long-lived idle watches: request latency says
//!   nothing about how many watches a member already serves. The `+ 1` makes the weight
//!   matter between two idle backends.
//! * peak EWMA (Finagle's and tower's algorithm, applied to TCP connect latency):
//!   `rtt × (open + 1) / weight`, where `rtt` jumps to any higher observation at once and
//!   decays towards lower ones with time constant [`PEAK_EWMA_DECAY`]. A backend that starts to
//!   answer SYNs slowly (overloaded host, far zone) quickly stops receiving new connections.
//!
//! The counters live in the backend ([`crate::backend::Backend`]) rather than in tower's
//! `PendingRequests`/`PeakEwma` wrappers: those are per service instance and would forget
//! every open connection when a reload rebuilds the balancer, and their opaque metrics cannot
//! be divided by a weight.

use std::time::Duration;

use tokio::time::Instant;

/// RTT assumed for a backend before its first connect: a LAN handshake. Optimistic on purpose,
/// so a new backend is tried and measured soon.
pub const PEAK_EWMA_DEFAULT_RTT: Duration = Duration::from_millis(1);
/// Time constant of the EWMA decay (linkerd's default): after a latency spike, the estimate
/// needs about this long to forget it.
pub const PEAK_EWMA_DECAY: Duration = Duration::from_secs(10);
/// Share of the weight a backend gets the moment it comes up with slow start enabled; it then
/// grows linearly to 1. Not zero, so the backend is measured from the start.
pub const SLOW_START_INITIAL_SHARE: f64 = 0.1;

/// A peak-sensitive exponentially weighted moving average of connect latency.
#[derive(Debug, Clone)]
pub struct PeakEwma {
    estimate_nanos: f64,
    updated: Instant,
}

impl PeakEwma {
    /// An estimate that starts at [`PEAK_EWMA_DEFAULT_RTT`].
    pub fn new(now: Instant) -> Self {
        PeakEwma {
            estimate_nanos: PEAK_EWMA_DEFAULT_RTT.as_nanos() as f64,
            updated: now,
        }
    }

    /// Folds in one observed round trip.
    pub fn observe(&mut self, rtt: Duration, now: Instant) {
        let rtt_nanos = rtt.as_nanos() as f64;
        let decayed = self.estimate(now);
        self.estimate_nanos = if rtt_nanos > decayed {
            rtt_nanos
        } else {
            let weight = decay_weight(now.saturating_duration_since(self.updated));
            decayed * weight + rtt_nanos * (1.0 - weight)
        };
        self.updated = now;
    }

    /// The estimate in nanoseconds, decayed for the time since the last observation.
    pub fn estimate(&self, now: Instant) -> f64 {
        self.estimate_nanos * decay_weight(now.saturating_duration_since(self.updated))
    }
}

fn decay_weight(elapsed: Duration) -> f64 {
    (-(elapsed.as_nanos() as f64) / PEAK_EWMA_DECAY.as_nanos() as f64).exp()
}

/// Least-connections cost.
pub fn least_connections_cost(open: usize, effective_weight: f64) -> f64 {
    (open as f64 + 1.0) / effective_weight.max(f64::MIN_POSITIVE)
}

/// Peak-EWMA cost.
pub fn peak_ewma_cost(rtt_nanos: f64, open: usize, effective_weight: f64) -> f64 {
    rtt_nanos.max(1.0) * (open as f64 + 1.0) / effective_weight.max(f64::MIN_POSITIVE)
}

/// The share of its weight a backend gets `since_up` after coming up, with a `slow_start` ramp.
pub fn slow_start_share(since_up: Duration, slow_start: Duration) -> f64 {
    if slow_start.is_zero() || since_up >= slow_start {
        return 1.0;
    }
    let progress = since_up.as_secs_f64() / slow_start.as_secs_f64();
    SLOW_START_INITIAL_SHARE + (1.0 - SLOW_START_INITIAL_SHARE) * progress
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn peak_is_taken_at_once_and_decays() {
        let start = Instant::now();
        let mut ewma = PeakEwma::new(start);
        ewma.observe(Duration::from_millis(100), start);
        assert_eq!(ewma.estimate(start), 100_000_000.0);
        tokio::time::advance(PEAK_EWMA_DECAY).await;
        let later = Instant::now();
        ewma.observe(Duration::from_millis(1), later);
        let estimate = ewma.estimate(later);
        assert!(
            estimate < 100_000_000.0 / 2.0 && estimate > 1_000_000.0,
            "{estimate}"
        );
    }

    #[test]
    fn weight_scales_cost() {
        assert!(least_connections_cost(0, 200.0) < least_connections_cost(0, 100.0));
        assert!(least_connections_cost(1, 100.0) > least_connections_cost(0, 100.0));
        assert_eq!(peak_ewma_cost(10.0, 1, 1.0), 20.0);
    }

    #[test]
    fn slow_start_ramps_linearly() {
        let ramp = Duration::from_secs(10);
        assert_eq!(
            slow_start_share(Duration::ZERO, ramp),
            SLOW_START_INITIAL_SHARE
        );
        assert!((slow_start_share(Duration::from_secs(5), ramp) - 0.55).abs() < 1e-9);
        assert_eq!(slow_start_share(ramp, ramp), 1.0);
        assert_eq!(slow_start_share(Duration::ZERO, Duration::ZERO), 1.0);
    }
}

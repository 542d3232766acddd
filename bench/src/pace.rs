//! Issuing operations: closed-loop or open-loop, bounded in count and time.
//!
//! Closed loop (no `--rate`): each client sends its next request as soon as
//! the previous one returns; latency is measured from the actual send.
//!
//! Open loop (`--rate R`): request `i` is *intended* to start at
//! `start + i / R`, whatever happened before. A client that falls behind
//! sends late requests immediately, and their latency is still measured from
//! the intended time. A server stall therefore shows up in the percentiles
//! as the queueing delay every request scheduled during the stall would have
//! seen, instead of being hidden as a handful of slow requests (coordinated
//! omission).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Hard ceiling on any run, even when only `--total` is given (one hour).
pub const MAX_RUN_DURATION: Duration = Duration::from_secs(3600);
/// Hard ceiling on the number of operations of one run.
pub const MAX_TOTAL_OPS: u64 = 100_000_000;

/// When a run stops.
#[derive(Clone, Copy, Debug)]
pub struct Stop {
    /// Operations to issue (None: until `duration`).
    pub total: Option<u64>,
    /// Wall-clock limit of the run.
    pub duration: Duration,
}

impl Stop {
    /// A run of `total` operations, or `duration`, whichever comes first;
    /// both are capped by [`MAX_TOTAL_OPS`] and [`MAX_RUN_DURATION`].
    pub fn new(total: Option<u64>, duration: Option<Duration>) -> Stop {
        Stop {
            total: total.map(|t| t.min(MAX_TOTAL_OPS)),
            duration: duration.unwrap_or(MAX_RUN_DURATION).min(MAX_RUN_DURATION),
        }
    }
}

/// One scheduled operation.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    /// Sequence number of the operation within the run.
    pub index: u64,
    /// When the operation was meant to start: the origin of its latency.
    pub intended: Instant,
}

/// Hands out tickets to concurrent clients.
pub struct Pacer {
    start: Instant,
    rate: Option<f64>,
    stop: Stop,
    deadline: Instant,
    next: AtomicU64,
    progress: ProgressBar,
}

impl Pacer {
    /// A pacer starting now; `show_progress` draws a bar on stderr (if it is a terminal).
    pub fn new(rate: Option<f64>, stop: Stop, show_progress: bool, label: &str) -> Pacer {
        let start = Instant::now();
        Pacer {
            start,
            rate: rate.filter(|r| *r > 0.0),
            stop,
            deadline: start + stop.duration,
            next: AtomicU64::new(0),
            progress: progress_bar(stop, show_progress, label),
        }
    }

    /// The next operation to run, after waiting for its intended start;
    /// None once the run is over.
    pub async fn next(&self) -> Option<Ticket> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if self.stop.total.is_some_and(|t| index >= t) {
            return None;
        }
        let now = Instant::now();
        let intended = match self.rate {
            Some(r) => self.start + Duration::from_secs_f64(index as f64 / r),
            None => now,
        };
        if intended >= self.deadline || now >= self.deadline {
            return None;
        }
        // Only a future start waits: tokio's timer rounds every deadline up
        // to its next 1 ms tick, so sleeping until `now` would add ~1 ms to
        // each closed-loop operation (and to every late open-loop one).
        if intended > now {
            tokio::time::sleep_until(intended.into()).await;
        }
        Some(Ticket { index, intended })
    }

    /// Marks one operation as finished (advances the progress bar).
    pub fn done(&self) {
        if self.stop.total.is_some() {
            self.progress.inc(1);
        } else {
            let elapsed = self.start.elapsed().as_millis();
            self.progress
                .set_position(u64::try_from(elapsed).unwrap_or(u64::MAX));
        }
    }

    /// When the run started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Removes the progress bar.
    pub fn finish(&self) {
        self.progress.finish_and_clear();
    }
}

fn progress_bar(stop: Stop, show: bool, label: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let (len, unit) = match stop.total {
        Some(t) => (t, "ops"),
        None => (
            u64::try_from(stop.duration.as_millis()).unwrap_or(u64::MAX),
            "ms",
        ),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = format!("{{prefix}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar.set_prefix(label.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn total_bounds_tickets() {
        let p = Pacer::new(None, Stop::new(Some(5), None), false, "t");
        let mut n = 0;
        while p.next().await.is_some() {
            n += 1;
        }
        assert_eq!(n, 5);
    }

    /// A closed-loop ticket is ready at its first poll: it never waits on
    /// the timer (whose 1 ms tick would pace a lone client).
    #[tokio::test]
    async fn closed_loop_tickets_are_ready_at_once() {
        let p = Pacer::new(None, Stop::new(Some(3), None), false, "t");
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for index in 0..3 {
            let next = std::pin::pin!(p.next());
            match std::future::Future::poll(next, &mut cx) {
                std::task::Poll::Ready(Some(t)) => assert_eq!(t.index, index),
                other => panic!("ticket {index} not ready at once: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn open_loop_schedules_from_start() {
        let p = Pacer::new(Some(1000.0), Stop::new(Some(3), None), false, "t");
        let a = p.next().await.unwrap();
        let b = p.next().await.unwrap();
        assert_eq!(b.intended - a.intended, Duration::from_millis(1));
    }
}

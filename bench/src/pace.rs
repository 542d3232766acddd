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
//!
//! Open-loop tickets are released by a thread of their own, not by tokio's
//! timer: tokio rounds every sleep up to its next 1 ms tick, so at 1,000
//! ops/s every intended start shares one phase against that tick and each
//! operation would wait the same random 0-1 ms (fixed by when the run
//! happened to start) before it is sent. That offset moved a path's p50 by
//! up to a millisecond from run to run and drowned differences of a tenth
//! of one. The releasing thread sleeps with the kernel's high-resolution
//! timer (its timer slack cut to [`RELEASE_TIMER_SLACK_NS`]) and adds one
//! semaphore permit per intended start that has passed; a client takes a
//! permit *before* it draws its ticket's index, so ticket `k` is handed out
//! only after `k + 1` starts have passed and never early.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::Semaphore;

/// Hard ceiling on any run, even when only `--total` is given (one hour).
pub const MAX_RUN_DURATION: Duration = Duration::from_secs(3600);
/// Hard ceiling on the number of operations of one run.
pub const MAX_TOTAL_OPS: u64 = 100_000_000;
/// Timer slack of the thread releasing open-loop tickets, in nanoseconds
/// (Linux's default of 50,000 would let each release wake up to 50 us late).
const RELEASE_TIMER_SLACK_NS: libc::c_ulong = 1_000;
/// Permits added once every ticket is released, so that clients still
/// waiting wake, draw an index past the last ticket and stop.
const CLOSING_PERMITS: usize = 1 << 20;

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
    /// Open loop: one permit per intended start that has passed.
    released: Option<Release>,
    progress: ProgressBar,
}

/// The open-loop releasing thread's side of a [`Pacer`].
struct Release {
    permits: Arc<Semaphore>,
    /// Set when the pacer is dropped: the thread stops at its next wake-up.
    cancelled: Arc<AtomicBool>,
}

impl Pacer {
    /// A pacer starting now; `show_progress` draws a bar on stderr (if it is a terminal).
    pub fn new(rate: Option<f64>, stop: Stop, show_progress: bool, label: &str) -> Pacer {
        let start = Instant::now();
        let rate = rate.filter(|r| r.is_finite() && *r > 0.0);
        let released = rate.and_then(|r| Release::spawn(start, r, tickets(r, stop)));
        Pacer {
            start,
            rate,
            stop,
            deadline: start + stop.duration,
            next: AtomicU64::new(0),
            released,
            progress: progress_bar(stop, show_progress, label),
        }
    }

    /// The next operation to run, after waiting for its intended start;
    /// None once the run is over.
    pub async fn next(&self) -> Option<Ticket> {
        if let Some(release) = &self.released {
            // Never closed: the thread only adds permits.
            release.permits.acquire().await.ok()?.forget();
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if self.stop.total.is_some_and(|t| index >= t) {
            return None;
        }
        let intended = match self.rate {
            Some(r) => intended(self.start, r, index),
            None => Instant::now(),
        };
        let now = Instant::now();
        if intended >= self.deadline || now >= self.deadline {
            return None;
        }
        if intended > now {
            // Only without the releasing thread: tokio's 1 ms tick applies.
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

impl Drop for Pacer {
    fn drop(&mut self) {
        if let Some(release) = &self.released {
            release.cancelled.store(true, Ordering::Relaxed);
        }
    }
}

/// When open-loop operation `index` is meant to start.
fn intended(start: Instant, rate: f64, index: u64) -> Instant {
    start + Duration::from_secs_f64(index as f64 / rate)
}

/// Open-loop tickets of a run: those meant to start before its end.
fn tickets(rate: f64, stop: Stop) -> u64 {
    let in_time = (stop.duration.as_secs_f64() * rate)
        .ceil()
        .min(MAX_TOTAL_OPS as f64) as u64;
    stop.total.map_or(in_time, |t| t.min(in_time))
}

impl Release {
    /// Starts the thread releasing `tickets` permits at `rate` from `start`
    /// (None if no thread can be started: the pacer then sleeps on tokio's timer).
    fn spawn(start: Instant, rate: f64, tickets: u64) -> Option<Release> {
        let permits = Arc::new(Semaphore::new(0));
        let cancelled = Arc::new(AtomicBool::new(false));
        let (p, c) = (permits.clone(), cancelled.clone());
        let spawned = std::thread::Builder::new()
            .name("bench-pacer".into())
            .spawn(move || release_loop(start, rate, tickets, &p, &c));
        match spawned {
            Ok(_) => Some(Release { permits, cancelled }),
            Err(e) => {
                eprintln!(
                    "bench: cannot start the pacing thread ({e}); pacing on tokio's 1 ms timer"
                );
                None
            }
        }
    }
}

/// Adds a permit as each intended start passes, sleeping in between.
fn release_loop(
    start: Instant,
    rate: f64,
    tickets: u64,
    permits: &Semaphore,
    cancelled: &AtomicBool,
) {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, RELEASE_TIMER_SLACK_NS) };
    let mut released = 0u64;
    while released < tickets && !cancelled.load(Ordering::Relaxed) {
        let now = Instant::now();
        let mut due = released;
        while due < tickets && intended(start, rate, due) <= now {
            due += 1;
        }
        if due > released {
            permits.add_permits(usize::try_from(due - released).unwrap_or(usize::MAX));
            released = due;
        } else {
            std::thread::sleep(intended(start, rate, released).saturating_duration_since(now));
        }
    }
    permits.add_permits(CLOSING_PERMITS);
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

    /// Concurrent open-loop clients get every ticket once, none before its
    /// intended start (a client draws its index only after taking a
    /// released permit), and all of them stop after the last.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_tickets_are_never_early() {
        const TOTAL: u64 = 300;
        let p = Arc::new(Pacer::new(
            Some(3000.0),
            Stop::new(Some(TOTAL), None),
            false,
            "t",
        ));
        let clients: Vec<_> = (0..8)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    while let Some(t) = p.next().await {
                        assert!(Instant::now() >= t.intended, "ticket {} early", t.index);
                        seen.push(t.index);
                    }
                    seen
                })
            })
            .collect();
        let mut all = Vec::new();
        for c in clients {
            all.extend(c.await.unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0..TOTAL).collect::<Vec<_>>());
    }

    /// A run bounded by time releases the tickets meant to start before its end.
    #[tokio::test]
    async fn open_loop_run_ends_at_its_duration() {
        let stop = Stop::new(None, Some(Duration::from_millis(50)));
        assert_eq!(tickets(1000.0, stop), 50);
        let p = Pacer::new(Some(1000.0), stop, false, "t");
        let mut n = 0;
        while p.next().await.is_some() {
            n += 1;
        }
        assert!((1..=50).contains(&n), "{n} tickets");
    }

    #[tokio::test]
    async fn open_loop_schedules_from_start() {
        let p = Pacer::new(Some(1000.0), Stop::new(Some(3), None), false, "t");
        let a = p.next().await.unwrap();
        let b = p.next().await.unwrap();
        assert_eq!(b.intended - a.intended, Duration::from_millis(1));
    }
}

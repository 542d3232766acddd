//! Latency histograms, error counts and the serialisable result of one run.
//!
//! Every latency is recorded in microseconds into an HDR histogram with three
//! significant digits, so p50/p90/p99/p99.9/max are exact to 0.1 % whatever
//! the spread. Results keep a down-sampled CDF (latency at a fixed ladder of
//! quantiles) so reports can plot latency distributions without the raw data.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Significant decimal digits the histograms keep.
const LATENCY_SIGFIG: u8 = 3;
/// Largest latency a histogram can hold, in microseconds (one hour).
const MAX_LATENCY_US: u64 = 3_600_000_000;
/// Distinct error messages kept per recorder; further ones are counted as "other".
const MAX_ERROR_KINDS: usize = 32;
/// Longest error message kept, in characters.
const MAX_ERROR_CHARS: usize = 120;
/// The CDF ladder goes up to 1 - 10^-(CDF_STEPS / CDF_STEPS_PER_DECADE) = 0.9999.
const CDF_STEPS: u32 = 40;
/// Points per "nine" of the CDF ladder.
const CDF_STEPS_PER_DECADE: f64 = 10.0;

/// Collects latencies and errors of one kind of operation.
#[derive(Clone)]
pub struct Recorder {
    hist: Histogram<u64>,
    errors: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, MAX_LATENCY_US, LATENCY_SIGFIG)
            .expect("static histogram bounds are valid");
        Recorder {
            hist,
            errors: BTreeMap::new(),
        }
    }

    /// Records one successful operation that took `latency`.
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.hist.saturating_record(us);
    }

    /// Counts one failed operation under its (shortened) message.
    pub fn error(&mut self, err: impl Display) {
        self.error_n(err, 1);
    }

    /// Counts `n` failures under one message.
    pub fn error_n(&mut self, err: impl Display, n: u64) {
        if n == 0 {
            return;
        }
        let mut msg: String = err.to_string().chars().take(MAX_ERROR_CHARS).collect();
        if !self.errors.contains_key(&msg) && self.errors.len() >= MAX_ERROR_KINDS {
            msg = "other".to_string();
        }
        *self.errors.entry(msg).or_default() += n;
    }

    /// Adds everything `other` recorded.
    pub fn merge(&mut self, other: &Recorder) {
        self.hist.add(&other.hist).expect("histograms share bounds");
        for (msg, n) in &other.errors {
            self.error_n(msg, *n);
        }
    }

    /// Successful operations recorded.
    pub fn ok(&self) -> u64 {
        self.hist.len()
    }

    /// Failed operations recorded.
    pub fn errors(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The message most failures had, with their number (the first in
    /// message order among equals); None without failures.
    pub fn most_common_error(&self) -> Option<(&str, u64)> {
        self.errors
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(msg, n)| (msg.as_str(), *n))
    }

    /// The serialisable summary of this recorder, named `name`.
    pub fn result(&self, name: &str, elapsed: Duration) -> OpResult {
        OpResult {
            name: name.to_string(),
            ok: self.ok(),
            errors: self.errors(),
            error_kinds: self.errors.clone(),
            throughput_ops_s: per_second(self.ok(), elapsed),
            latency: self.summary(),
            cdf: self.cdf(),
        }
    }

    fn summary(&self) -> LatencySummary {
        let h = &self.hist;
        let ms = |us: u64| us as f64 / 1000.0;
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }

    fn cdf(&self) -> Vec<CdfPoint> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        let mut points: Vec<CdfPoint> = (0..=CDF_STEPS)
            .map(|i| 1.0 - 10f64.powf(-f64::from(i) / CDF_STEPS_PER_DECADE))
            .map(|q| CdfPoint {
                quantile: q,
                latency_ms: self.hist.value_at_quantile(q) as f64 / 1000.0,
            })
            .collect();
        points.push(CdfPoint {
            quantile: 1.0,
            latency_ms: self.hist.max() as f64 / 1000.0,
        });
        points
    }
}

/// `count / elapsed` in operations per second (0 for an empty interval).
pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        count as f64 / secs
    }
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatencySummary {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// One point of a latency CDF.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CdfPoint {
    pub quantile: f64,
    pub latency_ms: f64,
}

/// Summary of one kind of operation in a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpResult {
    pub name: String,
    pub ok: u64,
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    pub throughput_ops_s: f64,
    pub latency: LatencySummary,
    pub cdf: Vec<CdfPoint>,
}

/// Result of one workload run: the first entry of `ops` is the headline operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub workload: String,
    pub target: String,
    pub clients: usize,
    pub conns: usize,
    pub rate: Option<f64>,
    pub seed: u64,
    pub elapsed_s: f64,
    pub ops: Vec<OpResult>,
    /// Workload-specific counters (conflicts, missing deliveries, ...).
    pub counters: BTreeMap<String, f64>,
}

impl RunResult {
    /// The headline operation.
    pub fn main(&self) -> &OpResult {
        &self.ops[0]
    }

    /// Renders the run as human-readable text.
    pub fn to_text(&self) -> String {
        let rate = self
            .rate
            .map_or("closed-loop".to_string(), |r| format!("{r} ops/s"));
        let mut out = format!(
            "{} against {}: clients={} conns={} rate={} seed={} elapsed={:.2}s\n",
            self.workload, self.target, self.clients, self.conns, rate, self.seed, self.elapsed_s
        );
        for op in &self.ops {
            out.push_str(&op_text(op));
        }
        for (name, value) in &self.counters {
            out.push_str(&format!("  {name}: {value}\n"));
        }
        out
    }
}

fn op_text(op: &OpResult) -> String {
    let l = &op.latency;
    let mut out = format!(
        "  {:<16} ok={} errors={} throughput={:.1} ops/s\n  {:<16} latency ms: p50={:.3} p90={:.3} p99={:.3} p99.9={:.3} max={:.3} mean={:.3}\n",
        op.name, op.ok, op.errors, op.throughput_ops_s, "", l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms
    );
    for (msg, n) in &op.error_kinds {
        out.push_str(&format!("  {:<16} error x{n}: {msg}\n", ""));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_cdf_are_ordered() {
        let mut r = Recorder::new();
        for ms in 1..=1000u64 {
            r.record(Duration::from_micros(ms * 10));
        }
        r.error("boom");
        let res = r.result("put", Duration::from_secs(1));
        assert_eq!(res.ok, 1000);
        assert_eq!(res.errors, 1);
        assert!(res.latency.p50_ms <= res.latency.p99_ms);
        assert!(res
            .cdf
            .windows(2)
            .all(|w| w[0].latency_ms <= w[1].latency_ms));
        assert_eq!(res.cdf.last().unwrap().quantile, 1.0);
    }

    #[test]
    fn the_most_common_error_is_the_one_counted_most() {
        let mut r = Recorder::new();
        assert_eq!(r.most_common_error(), None);
        r.error_n("timeout", 2);
        r.error_n("database space exceeded", 5);
        r.error_n("another", 5);
        assert_eq!(r.most_common_error(), Some(("another", 5)));
        r.error("database space exceeded");
        assert_eq!(r.most_common_error(), Some(("database space exceeded", 6)));
    }

    #[test]
    fn error_kinds_are_bounded() {
        let mut r = Recorder::new();
        for i in 0..100 {
            r.error(format!("e{i}"));
        }
        assert_eq!(r.errors(), 100);
        assert!(r.errors.len() <= MAX_ERROR_KINDS + 1);
    }
}

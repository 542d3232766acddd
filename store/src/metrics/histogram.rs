//! A histogram updated with atomic operations only (prometheus-client's
//! own takes a lock per observation): one counter per bucket, the count,
//! and the sum as the bits of an `f64` updated by compare-and-swap. An
//! observation adds to the first bucket whose upper bound holds it (the
//! encoder makes the counts cumulative, `le="+Inf"` last). A scrape
//! during observations may see the count one ahead of the buckets, as a
//! scrape between two observations would have.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram with fixed buckets (cheap to clone: shared).
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds, ascending, ending with `f64::MAX` (`+Inf`).
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative).
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_bits: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with the given upper bounds (ascending) and `+Inf`.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let mut bounds: Vec<f64> = bounds.into_iter().collect();
        bounds.push(f64::MAX);
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram {
            inner: Arc::new(Inner {
                bounds,
                counts,
                count: AtomicU64::new(0),
                sum_bits: AtomicU64::new(0.0f64.to_bits()),
            }),
        }
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        let i = &self.inner;
        let bucket = i
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(i.bounds.len() - 1);
        i.counts[bucket].fetch_add(1, Ordering::Relaxed);
        i.count.fetch_add(1, Ordering::Relaxed);
        let _ = i
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// (sum, count, per-bucket counts with their upper bounds).
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let i = &self.inner;
        let buckets = i
            .bounds
            .iter()
            .zip(&i.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        let sum = f64::from_bits(i.sum_bits.load(Ordering::Relaxed));
        (sum, i.count.load(Ordering::Relaxed), buckets)
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn buckets_count_and_sum() {
        let h = AtomicHistogram::new([0.001, 0.002]);
        for v in [0.0005, 0.0015, 0.0015, 5.0] {
            h.observe(v);
        }
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, 4);
        assert!((sum - 5.0035).abs() < 1e-9);
        assert_eq!(buckets, vec![(0.001, 1), (0.002, 2), (f64::MAX, 1)]);
        let mut r = Registry::default();
        r.register("d", "h", h);
        let text = super::super::exposition::encode(&r);
        assert!(text.contains("d_bucket{le=\"0.002\"} 3\n"), "{text}");
        assert!(text.contains("d_bucket{le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("d_count 4\n"), "{text}");
    }
}

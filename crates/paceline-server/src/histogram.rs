//! A histogram for the hot path: it records without a lock, encodes as Prometheus's own,
//! and estimates quantiles for the dashboard from what it holds ([`Snapshot`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram that records without a lock: a count per bucket and the sum, each an
/// atomic. Every decision records into one (its policy's delays) and every request into
/// another (the store's latency); behind a mutex, as in `prometheus_client`'s own, the
/// service's threads would queue on it.
///
/// A scrape reads the buckets one by one, so under traffic it may count an observation
/// whose value is not yet in the sum; each series stays monotonic.
#[derive(Clone, Debug)]
pub(crate) struct Histogram(Arc<HistogramCells>);

#[derive(Debug)]
struct HistogramCells {
    /// Upper bounds, ascending, the last one infinite.
    bounds: Box<[f64]>,
    /// Observations per bucket (not cumulative).
    counts: Box<[AtomicU64]>,
    /// The sum of the values, as `f64` bits.
    sum: AtomicU64,
    /// The largest value, as `f64` bits (for values >= 0 the bits order as the values do).
    max: AtomicU64,
}

impl Histogram {
    /// A histogram with these finite upper bounds (ascending) and `+Inf`.
    pub(crate) fn new(bounds: impl IntoIterator<Item = f64>) -> Histogram {
        let bounds: Box<[f64]> = bounds.into_iter().chain([f64::INFINITY]).collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        Histogram(Arc::new(HistogramCells {
            bounds,
            counts,
            sum: AtomicU64::new(0f64.to_bits()),
            max: AtomicU64::new(0f64.to_bits()),
        }))
    }

    /// Records one value (NaN counts in `+Inf` only).
    pub(crate) fn observe(&self, value: f64) {
        let cells = &*self.0;
        let last = cells.counts.len() - 1;
        let bucket = cells
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(last);
        cells.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // Adding zero leaves the sum (+0.0 at the start, never -0.0) as it is: most admitted
        // decisions have no delay, and skip the update of a cell every thread shares.
        // A read first: the shared cell is written only by a new maximum, which is rare.
        if value > 0.0 && value.to_bits() > cells.max.load(Ordering::Relaxed) {
            cells.max.fetch_max(value.to_bits(), Ordering::Relaxed);
        }
        if !value.is_nan() && value != 0.0 {
            // The closure always answers, so the update cannot fail.
            let _ = cells
                .sum
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some((f64::from_bits(bits) + value).to_bits())
                });
        }
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let cells = &*self.0;
        let buckets: Vec<(f64, u64)> = cells
            .bounds
            .iter()
            .zip(cells.counts.iter())
            .map(|(&bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = f64::from_bits(cells.sum.load(Ordering::Relaxed));
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// What a [`Histogram`] holds at one moment.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Snapshot {
    /// Upper bounds, ascending, the last one infinite.
    pub(crate) bounds: Vec<f64>,
    /// Observations per bucket (not cumulative).
    pub(crate) counts: Vec<u64>,
    /// The largest value observed (0 without any above 0).
    pub(crate) max: f64,
}

impl Histogram {
    /// The buckets and the largest value, read one by one.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let cells = &*self.0;
        Snapshot {
            bounds: cells.bounds.to_vec(),
            counts: cells
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max: f64::from_bits(cells.max.load(Ordering::Relaxed)),
        }
    }
}

impl Snapshot {
    /// The `q` quantile (0 to 1), as Prometheus's `histogram_quantile` estimates it: linearly
    /// inside the bucket that holds it, from the previous bound (0 below the first), and
    /// never above the largest value observed (so a wide bucket cannot report more than was
    /// ever seen). `None` without observations.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        let mut estimate = self.max;
        for (i, (&bound, &count)) in self.bounds.iter().zip(&self.counts).enumerate() {
            if count > 0 && (below + count) as f64 >= rank {
                let lower = if i == 0 { 0.0 } else { self.bounds[i - 1] };
                estimate = if bound.is_infinite() {
                    self.max.max(lower)
                } else {
                    let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                    lower + (bound - lower) * within
                };
                break;
            }
            below += count;
        }
        Some(estimate.min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    /// Renders one registered histogram.
    fn render(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap_or_default();
        out
    }

    #[test]
    fn the_lock_free_histogram_reads_as_prometheus_clients_own() {
        let bounds = || [0.0, 0.001, 0.25, 1.0, 1e3];
        let ours = Histogram::new(bounds());
        let theirs = prometheus_client::metrics::histogram::Histogram::new(bounds());
        let values = [0.0, 0.0005, 0.001, 0.0011, 0.3, 1.0, 7.5, 1e3, 1e9, 0.1];
        for v in values {
            ours.observe(v);
            theirs.observe(v);
        }
        let text = render(|r| r.register("h", "help", ours.clone()));
        assert!(text.contains("h_bucket{le=\"+Inf\"} 10"), "{text}");
        assert!(text.contains("h_bucket{le=\"0.001\"} 3"), "{text}");
        assert_eq!(text, render(|r| r.register("h", "help", theirs.clone())));
        // NaN (never a duration) counts in +Inf and, unlike there, leaves the sum a number.
        ours.observe(f64::NAN);
        let text = render(|r| r.register("h", "help", ours.clone()));
        assert!(text.contains("h_bucket{le=\"+Inf\"} 11"), "{text}");
        assert!(text.contains("h_sum 1000001008.9026"), "{text}");
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket_and_stay_below_the_largest_value() {
        let h = Histogram::new([0.0, 1.0, 10.0, 100.0]);
        assert_eq!(h.snapshot().quantile(0.5), None);
        for _ in 0..50 {
            h.observe(0.0);
        }
        for v in [2.0, 4.0, 6.0, 8.0] {
            for _ in 0..10 {
                h.observe(v);
            }
        }
        for _ in 0..10 {
            h.observe(12.0);
        }
        let s = h.snapshot();
        assert_eq!(s.max, 12.0);
        // Half of 100 observations are 0.
        assert_eq!(s.quantile(0.5), Some(0.0));
        // Rank 70 of 100: 20 into the (1, 10] bucket of 40, halfway: 5.5.
        assert_eq!(s.quantile(0.7), Some(5.5));
        // Rank 99: 9 of 10 into (10, 100], which would say 91: capped at the 12 seen.
        assert_eq!(s.quantile(0.99), Some(12.0));
        h.observe(1e6);
        let s = h.snapshot();
        assert_eq!(
            s.quantile(1.0),
            Some(1e6),
            "the +Inf bucket answers the largest value"
        );
    }

    #[test]
    fn observations_from_many_threads_are_all_counted() {
        let h = Histogram::new([0.5]);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..10_000 {
                        h.observe(if i % 2 == 0 { 0.25 } else { 1.0 });
                    }
                });
            }
        });
        let text = render(|r| r.register("h", "help", h.clone()));
        for line in [
            "h_count 40000",
            "h_sum 25000.0",
            "h_bucket{le=\"0.5\"} 20000",
            "h_bucket{le=\"+Inf\"} 40000",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}

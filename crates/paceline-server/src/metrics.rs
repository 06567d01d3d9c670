//! Prometheus metrics: decisions by policy and outcome, the delays handed out, the store's
//! latency and errors; and what the dashboard reads of them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use paceline_store::Decision;

use crate::top_keys::RefusedKeys;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    pub(crate) policy: String,
    /// `allowed`, `rejected`, `fail_open`, `local`, or `error`.
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueEventLabels {
    queue: String,
    /// `enqueued`, `started`, `acked`, `failed`, `retried`, `dead`, `lease_expired`,
    /// `paused`.
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStateLabels {
    queue: String,
    /// `scheduled`, `waiting`, `active`, `dead`.
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    pub(crate) policy: String,
}

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

/// One policy's counts as the dashboard shows them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PolicyCounts {
    pub(crate) allowed: u64,
    pub(crate) rejected: u64,
    pub(crate) fail_open: u64,
    /// Every decision of the in-process stand-in (`local`), admitted or not...
    pub(crate) local: u64,
    /// ...and those of them that refused.
    pub(crate) local_rejected: u64,
    pub(crate) error: u64,
    /// The delays, in seconds.
    pub(crate) delay: Snapshot,
}

/// One policy's series, looked up once per policy and configuration, so that counting a
/// decision is an atomic add rather than a hash of its labels under the family's lock.
/// The handles share their values with the family's: `/metrics` shows every count.
#[derive(Clone)]
pub(crate) struct PolicyMetrics {
    /// The policy's name in responses and metrics.
    name: Arc<str>,
    /// The keys refused most, shared by every policy.
    refused: Arc<RefusedKeys>,
    allowed: Counter<u64, AtomicU64>,
    rejected: Counter<u64, AtomicU64>,
    fail_open: Counter<u64, AtomicU64>,
    local: Counter<u64, AtomicU64>,
    /// The `local` decisions that refused (the dashboard's; `/metrics` has `local` only).
    local_rejected: Arc<AtomicU64>,
    error: Counter<u64, AtomicU64>,
    delay: Histogram,
}

impl PolicyMetrics {
    /// Counts a decision for `key` (as the request gave it) by its outcome: if it admits,
    /// records its delay; if it refuses, counts the key in the sketch of keys refused most.
    pub(crate) fn decided(&self, decision: &Decision, key: &str) {
        let counter = match (decision.fallback, decision.allowed) {
            (Some(paceline_store::Fallback::Local), _) => &self.local,
            // `fail_open`, the only other fallback.
            (Some(_), _) => &self.fail_open,
            (None, true) => &self.allowed,
            (None, false) => &self.rejected,
        };
        counter.inc();
        if decision.fallback == Some(paceline_store::Fallback::Local) && !decision.allowed {
            self.local_rejected.fetch_add(1, Ordering::Relaxed);
        }
        if decision.allowed {
            self.delay.observe(decision.delay.as_secs_f64());
        } else {
            self.refused.refused(&self.name, key);
        }
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> PolicyCounts {
        PolicyCounts {
            allowed: self.allowed.get(),
            rejected: self.rejected.get(),
            fail_open: self.fail_open.get(),
            local: self.local.get(),
            local_rejected: self.local_rejected.load(Ordering::Relaxed),
            error: self.error.get(),
            delay: self.delay.snapshot(),
        }
    }

    /// Counts a decision the store could not make.
    pub(crate) fn failed(&self) {
        self.error.inc();
    }
}

/// Holds one count of a queue's waiting lease calls; gives it back when dropped.
pub(crate) struct WaitingGuard(Gauge<i64, AtomicI64>);

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The service's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter<u64, AtomicU64>>,
    delay: Family<PolicyLabel, Histogram, fn() -> Histogram>,
    pub(crate) store_latency: Histogram,
    pub(crate) store_errors: Counter<u64, AtomicU64>,
    queue_events: Family<QueueEventLabels, Counter<u64, AtomicU64>>,
    queue_jobs: Family<QueueStateLabels, Gauge<i64, AtomicI64>>,
    start_lag: Family<QueueLabel, Histogram, fn() -> Histogram>,
    waiting_workers: Family<QueueLabel, Gauge<i64, AtomicI64>>,
    /// One scrape at a time brings the queues' counters up to their totals.
    queue_sync: std::sync::Mutex<()>,
    /// The keys refused most (the dashboard's; not in `/metrics`, whose series would grow
    /// with the keys).
    pub(crate) refused: Arc<RefusedKeys>,
    /// Every policy's handles by name, for the dashboard (a policy dropped by a reload
    /// stays, as its series do in `/metrics`).
    by_policy: std::sync::Mutex<std::collections::BTreeMap<String, PolicyMetrics>>,
    /// When the service started.
    pub(crate) started: std::time::Instant,
}

fn lag_histogram() -> Histogram {
    // 1 ms to about 17 minutes.
    Histogram::new((0..11).map(|i| 0.001 * 4f64.powi(i)))
}

fn delay_histogram() -> Histogram {
    // 0 (immediate) and 1 ms to about 17 minutes.
    Histogram::new(
        [0.0]
            .into_iter()
            .chain((0..11).map(|i| 0.001 * 4f64.powi(i))),
    )
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("paceline");
        let decisions = Family::<DecisionLabels, Counter<u64, AtomicU64>>::default();
        registry.register(
            "decisions",
            "Decisions made, by policy and outcome (allowed, rejected, fail_open, local, error)",
            decisions.clone(),
        );
        let delay = Family::<PolicyLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            delay_histogram,
        );
        registry.register(
            "delay_seconds",
            "Delays of admitted decisions (the wait before acting), in seconds",
            delay.clone(),
        );
        let store_latency = Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        ]);
        registry.register(
            "store_latency_seconds",
            "Time the store took per request to the service",
            store_latency.clone(),
        );
        let store_errors = Counter::<u64, AtomicU64>::default();
        registry.register(
            "store_errors",
            "Store failures (whatever the failure policy answered)",
            store_errors.clone(),
        );
        let queue_events = Family::<QueueEventLabels, Counter<u64, AtomicU64>>::default();
        registry.register(
            "queue_jobs",
            "Job queue events, by queue: enqueued, started (every lease), acked, failed, retried, dead, lease_expired, paused",
            queue_events.clone(),
        );
        let queue_jobs = Family::<QueueStateLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "queue_jobs_current",
            "Jobs in each queue now, by state: scheduled, waiting, active, dead",
            queue_jobs.clone(),
        );
        let start_lag =
            Family::<QueueLabel, Histogram, fn() -> Histogram>::new_with_constructor(lag_histogram);
        registry.register(
            "queue_start_lag_seconds",
            "Time from when a job could start (its group's turn) to its lease, in seconds",
            start_lag.clone(),
        );
        let waiting_workers = Family::<QueueLabel, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "queue_waiting_leases",
            "Lease calls waiting for a job (their wait_ms), by queue",
            waiting_workers.clone(),
        );
        Metrics {
            registry,
            decisions,
            delay,
            store_latency,
            store_errors,
            waiting_workers,
            queue_events,
            queue_jobs,
            start_lag,
            queue_sync: std::sync::Mutex::new(()),
            refused: Arc::new(RefusedKeys::new()),
            by_policy: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            started: std::time::Instant::now(),
        }
    }

    /// Every policy's name and counts so far, by name.
    pub(crate) fn policy_counts(&self) -> Vec<(String, PolicyCounts)> {
        self.by_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(name, m)| (name.clone(), m.counts()))
            .collect()
    }

    /// The series of the policy called `name` in responses (`inline` for inline specs).
    /// Each starts at zero, so a policy's rate of rejections exists before the first one.
    pub(crate) fn policy(&self, name: &str) -> PolicyMetrics {
        let counter = |outcome: &'static str| {
            self.decisions
                .get_or_create(&DecisionLabels {
                    policy: name.to_string(),
                    outcome,
                })
                .clone()
        };
        let handles = PolicyMetrics {
            name: Arc::from(name),
            refused: Arc::clone(&self.refused),
            allowed: counter("allowed"),
            rejected: counter("rejected"),
            fail_open: counter(paceline_store::Fallback::FailOpen.name()),
            local: counter(paceline_store::Fallback::Local.name()),
            local_rejected: self
                .by_policy
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(name)
                .map_or_else(Arc::default, |m| Arc::clone(&m.local_rejected)),
            error: counter("error"),
            delay: self
                .delay
                .get_or_create(&PolicyLabel {
                    policy: name.to_string(),
                })
                .clone(),
        };
        self.by_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_string(), handles.clone());
        handles
    }

    /// Records how long a store call took: timed by the callers with `quanta::Instant` (the
    /// CPU's time-stamp counter where it is invariant: a few nanoseconds a read, where the
    /// system clock's costs tens, on every decision).
    pub(crate) fn observe_store(&self, took: Duration) {
        self.store_latency.observe(took.as_secs_f64());
    }

    /// Counts a lease call waiting for a job on `queue` until the guard is dropped.
    pub(crate) fn worker_waiting(&self, queue: &str) -> WaitingGuard {
        let gauge = self
            .waiting_workers
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .clone();
        gauge.inc();
        WaitingGuard(gauge)
    }

    /// Records a lease's start lag (its count comes from the queue's totals).
    pub(crate) fn queue_started(&self, queue: &str, job: &paceline_queue::Leased) {
        let lag = job.started.saturating_sub(job.eligible) as f64 / 1e6;
        self.start_lag
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .observe(lag);
    }

    /// Brings a queue's series up to its stats: the event counters to its totals (which
    /// only grow), the gauges to its counts.
    pub(crate) fn queue_stats(&self, queue: &str, stats: &paceline_queue::Stats) {
        let t = &stats.totals;
        let _one_at_a_time = self
            .queue_sync
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (event, total) in [
            ("enqueued", t.enqueued),
            ("started", t.started),
            ("acked", t.acked),
            ("failed", t.failed),
            ("retried", t.retried),
            ("dead", t.dead),
            ("lease_expired", t.lease_expiries),
            ("paused", t.pauses),
        ] {
            let counter = self.queue_events.get_or_create(&QueueEventLabels {
                queue: queue.to_string(),
                event,
            });
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
        for (state, n) in [
            ("scheduled", stats.scheduled),
            ("waiting", stats.waiting),
            ("active", stats.active),
            ("dead", stats.dead),
        ] {
            self.queue_jobs
                .get_or_create(&QueueStateLabels {
                    queue: queue.to_string(),
                    state,
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

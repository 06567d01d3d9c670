//! Prometheus metrics: decisions by policy and outcome, the delays handed out, the store's
//! latency and errors, Envoy's rate limit service by rule; and what the dashboard reads of
//! them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use paceline_store::Decision;

use crate::histogram::{Histogram, Snapshot};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    /// An RLS rule's id (`DOMAIN.key_value.key2`), or [`OTHER_RULES`].
    rule: String,
}

/// The most `rule` labels of the RLS metrics that hold values a request chose
/// (`detailed_metric`, `value_to_metric`, a request's own limit) one service gives series
/// of their own; beyond, such ids count under [`OTHER_RULES`]. Rule ids named by the rules
/// alone are bounded by the rules and always have their own.
pub const RLS_RULE_LABELS: usize = 1_000;

/// The `rule` label that counts the rule ids beyond [`RLS_RULE_LABELS`]. No rule id is
/// this: every id holds a `.` between the domain and a key.
pub const OTHER_RULES: &str = "(other)";

/// What one descriptor of an RLS request adds to its rule's counters, in hits (the
/// descriptor's `hits_addend`, or the request's; 0 for a check that counts nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RuleHits {
    /// Every hit the rule decided.
    pub(crate) hits: u64,
    /// Hits over the limit: refused, or let through by shadow mode.
    pub(crate) over_limit: u64,
    /// Hits charged to the limit that took its use past the near-limit threshold (see
    /// `decide::near_limit`); they are within the limit too.
    pub(crate) near_limit: u64,
    /// Hits within the limit (the descriptor's status `OK`, not by shadow mode).
    pub(crate) within_limit: u64,
    /// Hits over a shadow-mode limit, which answered `OK` all the same.
    pub(crate) shadow_mode: u64,
}

/// One rule's series.
#[derive(Clone)]
struct RuleCounters {
    hits: Counter<u64, AtomicU64>,
    over_limit: Counter<u64, AtomicU64>,
    near_limit: Counter<u64, AtomicU64>,
    within_limit: Counter<u64, AtomicU64>,
    shadow_mode: Counter<u64, AtomicU64>,
}

impl RuleCounters {
    fn add(&self, hits: RuleHits) {
        for (counter, n) in [
            (&self.hits, hits.hits),
            (&self.over_limit, hits.over_limit),
            (&self.near_limit, hits.near_limit),
            (&self.within_limit, hits.within_limit),
            (&self.shadow_mode, hits.shadow_mode),
        ] {
            counter.inc_by(n);
        }
    }
}

/// The rule ids with series so far, and how many of them hold a request's values.
#[derive(Default)]
struct RuleIds {
    by_id: HashMap<String, RuleCounters>,
    from_requests: usize,
}

/// The RLS service's counters by rule, as envoyproxy/ratelimit keeps its stats per rule:
/// hits, over limit, near limit, within limit and shadow mode. Each rule's handles are
/// looked up once under a read lock; a new id takes the write lock once.
pub(crate) struct RlsMetrics {
    hits: Family<RuleLabel, Counter<u64, AtomicU64>>,
    over_limit: Family<RuleLabel, Counter<u64, AtomicU64>>,
    near_limit: Family<RuleLabel, Counter<u64, AtomicU64>>,
    within_limit: Family<RuleLabel, Counter<u64, AtomicU64>>,
    shadow_mode: Family<RuleLabel, Counter<u64, AtomicU64>>,
    ids: RwLock<RuleIds>,
    /// The most ids holding a request's values with series of their own.
    cap: usize,
}

impl RlsMetrics {
    /// Families of their own (not registered), with at most `cap` ids from requests.
    fn new(cap: usize) -> RlsMetrics {
        RlsMetrics {
            hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            ids: RwLock::new(RuleIds::default()),
            cap,
        }
    }

    fn register(&self, registry: &mut Registry) {
        for (name, help, family) in [
            (
                "rls_hits",
                "RLS hits (hits_addend) decided, by rule",
                &self.hits,
            ),
            (
                "rls_over_limit",
                "RLS hits over the limit (refused, or let through by shadow mode), by rule",
                &self.over_limit,
            ),
            (
                "rls_near_limit",
                "RLS hits admitted past 80 % of the limit, by rule",
                &self.near_limit,
            ),
            (
                "rls_within_limit",
                "RLS hits within the limit, by rule",
                &self.within_limit,
            ),
            (
                "rls_shadow_mode",
                "RLS hits over a shadow-mode limit, answered OK, by rule",
                &self.shadow_mode,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
    }

    fn counters(&self, rule: &str) -> RuleCounters {
        let label = RuleLabel {
            rule: rule.to_string(),
        };
        RuleCounters {
            hits: self.hits.get_or_create(&label).clone(),
            over_limit: self.over_limit.get_or_create(&label).clone(),
            near_limit: self.near_limit.get_or_create(&label).clone(),
            within_limit: self.within_limit.get_or_create(&label).clone(),
            shadow_mode: self.shadow_mode.get_or_create(&label).clone(),
        }
    }

    /// Adds `hits` to the series of the rule `rule`. `from_request`: the id holds values
    /// the request chose; past the cap on such ids, a new one counts under
    /// [`OTHER_RULES`].
    pub(crate) fn count(&self, rule: &str, from_request: bool, hits: RuleHits) {
        {
            let ids = self.ids.read().unwrap_or_else(PoisonError::into_inner);
            let found = match ids.by_id.get(rule) {
                Some(c) => Some(c),
                None if from_request && ids.from_requests >= self.cap => ids.by_id.get(OTHER_RULES),
                None => None,
            };
            if let Some(counters) = found {
                counters.add(hits);
                return;
            }
        }
        let mut ids = self.ids.write().unwrap_or_else(PoisonError::into_inner);
        let label = if ids.by_id.contains_key(rule) {
            rule
        } else if from_request && ids.from_requests >= self.cap {
            OTHER_RULES
        } else {
            if from_request {
                ids.from_requests += 1;
            }
            rule
        };
        if !ids.by_id.contains_key(label) {
            let counters = self.counters(label);
            ids.by_id.insert(label.to_string(), counters);
        }
        if let Some(counters) = ids.by_id.get(label) {
            counters.add(hits);
        }
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
    /// Refusals that shadow mode answered as admitted.
    shadow_admitted: Counter<u64, AtomicU64>,
}

impl PolicyMetrics {
    /// Counts a refusal that shadow mode answered as admitted (the decision itself is
    /// counted by [`PolicyMetrics::decided`], as a refusal).
    pub(crate) fn shadow_admitted(&self) {
        self.shadow_admitted.inc();
    }

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
    /// Refusals a shadow-mode policy answered as admitted, by policy.
    shadow_admitted: Family<PolicyLabel, Counter<u64, AtomicU64>>,
    delay: Family<PolicyLabel, Histogram, fn() -> Histogram>,
    pub(crate) store_latency: Histogram,
    pub(crate) store_errors: Counter<u64, AtomicU64>,
    queue_events: Family<QueueEventLabels, Counter<u64, AtomicU64>>,
    queue_jobs: Family<QueueStateLabels, Gauge<i64, AtomicI64>>,
    start_lag: Family<QueueLabel, Histogram, fn() -> Histogram>,
    waiting_workers: Family<QueueLabel, Gauge<i64, AtomicI64>>,
    /// Envoy's rate limit service, by rule.
    pub(crate) rls: RlsMetrics,
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
        let shadow_admitted = Family::<PolicyLabel, Counter<u64, AtomicU64>>::default();
        registry.register(
            "shadow_admitted",
            "Refusals a shadow-mode policy answered as admitted, by policy (each also counted as rejected in paceline_decisions_total)",
            shadow_admitted.clone(),
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
        let rls = RlsMetrics::new(RLS_RULE_LABELS);
        rls.register(&mut registry);
        Metrics {
            registry,
            decisions,
            shadow_admitted,
            delay,
            store_latency,
            store_errors,
            waiting_workers,
            rls,
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
            shadow_admitted: self
                .shadow_admitted
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

    fn rendered(rls: &RlsMetrics) -> String {
        let mut registry = Registry::with_prefix("paceline");
        rls.register(&mut registry);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }

    #[test]
    fn ids_from_requests_beyond_the_cap_count_under_other() {
        let rls = RlsMetrics::new(2);
        let one = RuleHits {
            hits: 1,
            within_limit: 1,
            ..RuleHits::default()
        };
        for rule in ["d.k_a", "d.k_b", "d.k_c", "d.k_d", "d.k_a"] {
            rls.count(rule, true, one);
        }
        // Ids named by the rules alone are never capped.
        rls.count("d.rule", false, one);
        let text = rendered(&rls);
        for line in [
            "paceline_rls_hits_total{rule=\"d.k_a\"} 2",
            "paceline_rls_hits_total{rule=\"d.k_b\"} 1",
            "paceline_rls_hits_total{rule=\"(other)\"} 2",
            "paceline_rls_hits_total{rule=\"d.rule\"} 1",
            "paceline_rls_within_limit_total{rule=\"(other)\"} 2",
            "paceline_rls_over_limit_total{rule=\"(other)\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("d.k_c") && !text.contains("d.k_d"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let rls = RlsMetrics::new(10);
        rls.count("d.k_a\"}\n\\x", true, RuleHits::default());
        let text = rendered(&rls);
        assert!(
            text.contains("paceline_rls_hits_total{rule=\"d.k_a\\\"}\\n\\\\x\"} 0"),
            "{text}"
        );
    }
}

//! Prometheus metrics: decisions by policy and outcome, the delays handed out, the store's
//! latency and errors.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use paceline::Decision;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub(crate) policy: String,
    /// `allowed`, `rejected`, `fail_open`, `local`, or `error`.
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyLabel {
    pub(crate) policy: String,
}

/// One policy's series, looked up once per policy and configuration, so that counting a
/// decision is an atomic add rather than a hash of its labels under the family's lock.
/// The handles share their values with the family's: `/metrics` shows every count.
pub(crate) struct PolicyMetrics {
    allowed: Counter<u64, AtomicU64>,
    rejected: Counter<u64, AtomicU64>,
    fail_open: Counter<u64, AtomicU64>,
    local: Counter<u64, AtomicU64>,
    error: Counter<u64, AtomicU64>,
    delay: Histogram,
}

impl PolicyMetrics {
    /// Counts a decision by its outcome and, if it admits, records its delay.
    pub(crate) fn decided(&self, decision: &Decision) {
        let counter = match (decision.fallback, decision.allowed) {
            (Some(paceline::Fallback::Local), _) => &self.local,
            // `fail_open`, the only other fallback.
            (Some(_), _) => &self.fail_open,
            (None, true) => &self.allowed,
            (None, false) => &self.rejected,
        };
        counter.inc();
        if decision.allowed {
            self.delay.observe(decision.delay.as_secs_f64());
        }
    }

    /// Counts a decision the store could not make.
    pub(crate) fn failed(&self) {
        self.error.inc();
    }
}

/// The service's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) decisions: Family<DecisionLabels, Counter<u64, AtomicU64>>,
    pub(crate) delay: Family<PolicyLabel, Histogram, fn() -> Histogram>,
    pub(crate) store_latency: Histogram,
    pub(crate) store_errors: Counter<u64, AtomicU64>,
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
        Metrics {
            registry,
            decisions,
            delay,
            store_latency,
            store_errors,
        }
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
        PolicyMetrics {
            allowed: counter("allowed"),
            rejected: counter("rejected"),
            fail_open: counter("fail_open"),
            local: counter("local"),
            error: counter("error"),
            delay: self
                .delay
                .get_or_create(&PolicyLabel {
                    policy: name.to_string(),
                })
                .clone(),
        }
    }

    pub(crate) fn observe_store(&self, took: Duration) {
        self.store_latency.observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

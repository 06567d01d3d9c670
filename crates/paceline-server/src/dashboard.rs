//! The live dashboard: `GET /dashboard`, a page served from the binary (no CDN, nothing
//! downloaded), and `GET /v1/dashboard`, the JSON it polls every second.
//!
//! `paceline proxy` serves the same page on its admin address; its `/v1/dashboard` has a
//! `proxy` part (see [`crate::proxy`]), which the page shows instead of policies.
//!
//! The page holds no data: it is served to anyone, and reads everything from
//! `/v1/dashboard`, which asks for the service's token like every `/v1` endpoint. With a
//! token set, open `/dashboard#token=TOKEN` (a fragment never leaves the browser) or type it
//! into the page, which keeps it for the tab's session. Its Content-Security-Policy lets
//! only its own script run (by the script's hash) and lets it ask only this service.
//!
//! Its queue page reads and acts on one queue through the queue endpoints themselves
//! (`GET /v1/queues/{queue}`, `GET .../jobs?state=`, pause, resume, retry and purge; see
//! [`crate::queues`]) with the same token, and shows payloads, errors and results as text,
//! cut to their first 1,000 characters.
//!
//! `GET /v1/dashboard` answers:
//!
//! ```json
//! {
//!   "service": {"now_ms": 1764170000000, "uptime_s": 12.5, "store": "redis://127.0.0.1:6379",
//!               "ready": true, "store_message": null, "store_errors": 0,
//!               "store_latency_ms": {"count": 812, "p50": 0.09, "p99": 0.4}},
//!   "policies": [{"name": "discord-roles", "spec": "fixed_window:limit=10,window=10s",
//!                 "allowed": 700, "rejected": 112, "fail_open": 0, "local": 0,
//!                 "local_rejected": 0, "error": 0,
//!                 "delay_ms": {"count": 700, "p50": 0.0, "p90": 512.0, "p99": 3900.0}}],
//!   "refused_keys": [{"policy": "discord-roles", "key": "guild:42", "refusals": 90,
//!                     "overcount": 0}],
//!   "refusals_not_sampled": 0,
//!   "queues": [{"queue": "roles", "scheduled": 0, "waiting": 30, "active": 2, "dead": 0,
//!               "groups_total": 3, "groups": [{"group": "guild:42", "waiting": 12,
//!               "active": 1, "next_eligible_ms": 1764170000000}]}]
//! }
//! ```
//!
//! Counts are totals since the service started (the page turns two polls into a rate, on
//! the service's clock: `uptime_s`, read with the counts); `local` counts every decision of
//! the `local` failure policy's stand-in and `local_rejected` those that refused. Delays and
//! the store's latency are quantiles since the start, estimated from the histograms
//! `/metrics` exposes (linear inside a bucket, as Prometheus's `histogram_quantile`, and
//! never above the largest value seen). `refused_keys` are the 10 keys refused most, from a
//! bounded sketch ([`crate::top_keys`]: counts never below the truth, above it by at most
//! `overcount`); `refusals_not_sampled` counts the refusals it skipped because its shard
//! was busy (it samples rather than make a refusal wait). `queues` lists each configured
//! queue with its counts and its 10 groups with the most jobs waiting (the groups listed at
//! most every 5 s: listing them reads every group).

use std::sync::{Arc, PoisonError};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::dashboard_page::page;
use crate::error::Envelope;
use crate::extract::Authorized;
use crate::groups_cache::GroupsListing;
use crate::histogram::Snapshot;
use crate::metrics::PolicyCounts;
use crate::state::AppState;
use crate::top_keys::Counted;

/// Keys refused most, and groups per queue, that the data lists.
const TOP: usize = 10;

/// The dashboard's routes: the page and its data.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/dashboard", get(page))
        .route("/v1/dashboard", get(data))
}

/// `GET /v1/dashboard` (fields of every object in the order JSON objects print).
#[derive(Serialize, ToSchema)]
#[schema(as = Dashboard)]
struct DashboardBody {
    policies: Vec<PolicyRow>,
    queues: Vec<QueueRow>,
    refusals_not_sampled: u64,
    refused_keys: Vec<RefusedRow>,
    service: ServiceBody,
}

/// The service's own state.
#[derive(Serialize, ToSchema)]
#[schema(as = DashboardService)]
struct ServiceBody {
    now_ms: u64,
    ready: bool,
    store: String,
    store_errors: u64,
    store_latency_ms: LatencyMs,
    store_message: Option<String>,
    uptime_s: f64,
}

/// One policy's counts since the start, and its delays.
#[derive(Serialize, ToSchema)]
#[schema(as = DashboardPolicy)]
struct PolicyRow {
    allowed: u64,
    delay_ms: DelayMs,
    error: u64,
    fail_open: u64,
    local: u64,
    local_rejected: u64,
    name: String,
    rejected: u64,
    /// The configured policy's spec; `null` for `inline` (and for a policy a reload
    /// removed).
    spec: Option<String>,
}

/// One of the keys refused most.
#[derive(Serialize, ToSchema)]
#[schema(as = DashboardRefusedKey)]
struct RefusedRow {
    key: String,
    overcount: u64,
    policy: String,
    refusals: u64,
}

/// One queue: its counts and its groups with the most jobs waiting, or why not.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = DashboardQueue)]
enum QueueRow {
    Counted {
        active: u64,
        dead: u64,
        #[serde(serialize_with = "top_groups")]
        #[schema(value_type = Vec<crate::groups_cache::GroupRow>)]
        groups: Arc<GroupsListing>,
        groups_total: usize,
        queue: String,
        scheduled: u64,
        waiting: u64,
    },
    Unanswered {
        #[schema(value_type = String)]
        error: &'static str,
        queue: String,
    },
}

/// A queue's listed groups, as the rows the page shows.
fn top_groups<S: serde::Serializer>(
    listing: &Arc<GroupsListing>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    listing.top.serialize(serializer)
}

/// Quantiles of decisions' delays, in milliseconds (`null` before the first).
#[derive(Serialize, ToSchema)]
#[schema(as = DashboardDelays)]
struct DelayMs {
    count: u64,
    p50: Option<f64>,
    p90: Option<f64>,
    p99: Option<f64>,
}

/// Quantiles of the store's latency, in milliseconds (`null` before the first call).
#[derive(Serialize, ToSchema)]
#[schema(as = DashboardLatency)]
struct LatencyMs {
    count: u64,
    p50: Option<f64>,
    p99: Option<f64>,
}

/// Quantile `q` of a histogram of seconds, in milliseconds (to the microsecond).
fn quantile_ms(histogram: &Snapshot, q: f64) -> Option<f64> {
    histogram.quantile(q).map(|s| (s * 1e6).round() / 1e3)
}

/// How many values a histogram holds.
fn count(histogram: &Snapshot) -> u64 {
    histogram.counts.iter().sum()
}

impl PolicyRow {
    fn new(name: String, c: PolicyCounts, spec: Option<String>) -> PolicyRow {
        let delay = &c.delay;
        PolicyRow {
            allowed: c.allowed,
            delay_ms: DelayMs {
                count: count(delay),
                p50: quantile_ms(delay, 0.5),
                p90: quantile_ms(delay, 0.9),
                p99: quantile_ms(delay, 0.99),
            },
            error: c.error,
            fail_open: c.fail_open,
            local: c.local,
            local_rejected: c.local_rejected,
            name,
            rejected: c.rejected,
            spec,
        }
    }
}

impl From<Counted> for RefusedRow {
    fn from(c: Counted) -> RefusedRow {
        RefusedRow {
            key: c.key,
            overcount: c.overcount,
            policy: c.policy,
            refusals: c.refusals,
        }
    }
}

/// `GET /v1/dashboard`: the data the page polls (see the module docs).
#[utoipa::path(
    get,
    path = "/v1/dashboard",
    tag = "service",
    operation_id = "dashboard",
    responses(
        (status = 200, description = "The counts, delays and queues the dashboard shows", body = DashboardBody),
        (status = 401, description = "`unauthenticated`", body = Envelope),
    )
)]
async fn data(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
) -> impl IntoResponse {
    // The counts and the clock the page divides them by, read together (the store's
    // answers below take their time).
    let metrics = &state.metrics;
    let counts = metrics.policy_counts();
    let uptime_s = metrics.started.elapsed().as_secs_f64();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ready = state.store.ready().await;
    let store = {
        let base = state.base.lock().unwrap_or_else(PoisonError::into_inner);
        paceline_store::without_credentials(&base.store)
    };
    let policies: Vec<PolicyRow> = counts
        .into_iter()
        .map(|(name, c)| {
            let spec = live
                .policies
                .get(&name)
                .map(|configured| configured.policy().to_string());
            PolicyRow::new(name, c, spec)
        })
        .collect();
    let refused_keys: Vec<RefusedRow> = metrics
        .refused
        .top(TOP)
        .into_iter()
        .map(RefusedRow::from)
        .collect();
    // The counts every time (cheap, as for `/metrics`); the groups from the cache.
    let mut queues = Vec::with_capacity(state.queues.len());
    for (name, queue) in &state.queues {
        let counted = queue.counts().await;
        let listed = state.groups.listing(name, queue, TOP).await;
        let (Ok(stats), Some(groups)) = (counted, listed) else {
            queues.push(QueueRow::Unanswered {
                error: "the store did not answer",
                queue: name.clone(),
            });
            continue;
        };
        metrics.queue_stats(name, &stats);
        queues.push(QueueRow::Counted {
            active: stats.active,
            dead: stats.dead,
            groups_total: groups.total,
            groups,
            queue: name.clone(),
            scheduled: stats.scheduled,
            waiting: stats.waiting,
        });
    }
    let latency = metrics.store_latency.snapshot();
    let body = DashboardBody {
        policies,
        queues,
        refusals_not_sampled: metrics.refused.skipped(),
        refused_keys,
        service: ServiceBody {
            now_ms,
            ready: ready.is_ok(),
            store,
            store_errors: metrics.store_errors.get(),
            store_latency_ms: LatencyMs {
                count: count(&latency),
                p50: quantile_ms(&latency, 0.5),
                p99: quantile_ms(&latency, 0.99),
            },
            store_message: ready.err().map(|e| e.to_string()),
            uptime_s,
        },
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body))
}

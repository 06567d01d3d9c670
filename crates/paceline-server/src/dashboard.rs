//! The live dashboard: `GET /dashboard`, a page served from the binary (no CDN, nothing
//! downloaded), and `GET /v1/dashboard`, the JSON it polls every second.
//!
//! `paceline proxy` serves the same page on its admin address; its `/v1/dashboard` has a
//! `proxy` part (see [`crate::proxy`]), which the page shows instead of policies.
//!
//! The page holds no data: it is served to anyone, and reads everything from
//! `/v1/dashboard`, which asks for the service's token like every `/v1` endpoint. With a
//! token set, open `/dashboard#token=TOKEN` (a fragment never leaves the browser) or type it
//! into the page, which keeps it for the tab's session.
//!
//! `GET /v1/dashboard` answers:
//!
//! ```json
//! {
//!   "service": {"uptime_s": 12.5, "store": "redis://127.0.0.1:6379", "ready": true,
//!               "store_message": null, "store_errors": 0,
//!               "store_latency_ms": {"count": 812, "p50": 0.09, "p99": 0.4}},
//!   "policies": [{"name": "discord-roles", "spec": "fixed_window:limit=10,window=10s",
//!                 "allowed": 700, "rejected": 112, "fail_open": 0, "local": 0, "error": 0,
//!                 "delay_ms": {"count": 700, "p50": 0.0, "p90": 512.0, "p99": 3900.0}}],
//!   "refused_keys": [{"policy": "discord-roles", "key": "guild:42", "refusals": 90,
//!                     "overcount": 0}],
//!   "queues": [{"queue": "roles", "scheduled": 0, "waiting": 30, "active": 2, "dead": 0,
//!               "groups_total": 3, "groups": [{"group": "guild:42", "waiting": 12,
//!               "active": 1, "next_eligible_ms": 1764170000000}]}]
//! }
//! ```
//!
//! Counts are totals since the service started (the page turns them into rates between two
//! polls); delays and the store's latency are quantiles since the start, estimated from the
//! histograms `/metrics` exposes (linear inside a bucket, as Prometheus's
//! `histogram_quantile`, and never above the largest value seen); `refused_keys` are the 10 keys refused most, from a bounded sketch
//! ([`crate::top_keys`]: counts never below the truth, above it by at most `overcount`);
//! `queues` lists each configured queue with its 10 groups with the most jobs waiting.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::api::{AppState, Authorized};
use crate::metrics::Snapshot;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// Keys refused most, and groups per queue, that the data lists.
const TOP: usize = 10;

/// What the page may do: its own inline script and style, and requests to this service.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/dashboard", get(page))
        .route("/v1/dashboard", get(data))
}

/// The page (also on `paceline proxy`'s admin address, whose data has a `proxy` part).
pub(crate) async fn page() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        PAGE,
    )
        .into_response()
}

/// Quantiles of a histogram of seconds, in milliseconds (to the microsecond).
fn quantiles_ms(histogram: &Snapshot, qs: &[(&str, f64)]) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("count".into(), json!(histogram.counts.iter().sum::<u64>()));
    for &(name, q) in qs {
        let value = histogram.quantile(q).map(|s| (s * 1e6).round() / 1e3);
        out.insert(name.into(), json!(value));
    }
    Value::Object(out)
}

async fn data(State(state): State<Arc<AppState>>, Authorized(live): Authorized) -> Response {
    let ready = state.store.ready().await;
    let store = {
        let base = state
            .base
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        paceline_store::without_credentials(&base.store)
    };
    let metrics = &state.metrics;
    let policies: Vec<Value> = metrics
        .policy_counts()
        .into_iter()
        .map(|(name, c)| {
            let spec = live
                .policies
                .get(&name)
                .map(|configured| configured.policy().to_string());
            json!({
                "name": name,
                "spec": spec,
                "allowed": c.allowed,
                "rejected": c.rejected,
                "fail_open": c.fail_open,
                "local": c.local,
                "error": c.error,
                "delay_ms": quantiles_ms(&c.delay, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99)]),
            })
        })
        .collect();
    let refused: Vec<Value> = metrics
        .refused
        .top(TOP)
        .into_iter()
        .map(|c| {
            json!({
                "policy": c.policy,
                "key": c.key,
                "refusals": c.refusals,
                "overcount": c.overcount,
            })
        })
        .collect();
    let mut queues = Vec::new();
    for (name, queue) in &state.queues {
        let Ok(mut stats) = queue.stats().await else {
            queues.push(json!({"queue": name, "error": "the store did not answer"}));
            continue;
        };
        metrics.queue_stats(name, &stats);
        let groups_total = stats.groups.len();
        stats.groups.sort_by(|a, b| {
            b.waiting
                .cmp(&a.waiting)
                .then_with(|| a.group.cmp(&b.group))
        });
        let groups: Vec<Value> = stats
            .groups
            .iter()
            .take(TOP)
            .map(|g| {
                json!({
                    "group": g.group,
                    "waiting": g.waiting,
                    "active": g.active,
                    "next_eligible_ms": g.next_eligible.map(|us| us / 1_000),
                })
            })
            .collect();
        queues.push(json!({
            "queue": name,
            "scheduled": stats.scheduled,
            "waiting": stats.waiting,
            "active": stats.active,
            "dead": stats.dead,
            "groups_total": groups_total,
            "groups": groups,
        }));
    }
    let latency = metrics.store_latency.snapshot();
    let body = json!({
        "service": {
            "uptime_s": metrics.started.elapsed().as_secs_f64(),
            "store": store,
            "ready": ready.is_ok(),
            "store_message": ready.err().map(|e| e.to_string()),
            "store_errors": metrics.store_errors.get(),
            "store_latency_ms": quantiles_ms(&latency, &[("p50", 0.5), ("p99", 0.99)]),
        },
        "policies": policies,
        "refused_keys": refused,
        "queues": queues,
    });
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

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

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::api::{AppState, Authorized};
use crate::metrics::Snapshot;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// Keys refused most, and groups per queue, that the data lists.
const TOP: usize = 10;

/// How long the groups of a queue are kept for the dashboard: listing them reads every
/// group (on Redis, one script over all of them), so many open pages cost one listing a
/// while.
const GROUPS_TTL: Duration = Duration::from_secs(5);

/// What the page may do: run its own script (by its hash: an injected one would not run),
/// use its inline style, and ask this service.
static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hashes: Vec<String> = inline_scripts(PAGE)
        .map(|script| {
            let digest = ring::digest::digest(&ring::digest::SHA256, script.as_bytes());
            let encoded = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
            format!("'sha256-{encoded}'")
        })
        .collect();
    let policy = format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; connect-src 'self'; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes.join(" ")
    );
    // Base64 and ASCII punctuation: always a valid header value.
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// The text of each `<script>` element of `page`.
fn inline_scripts(page: &str) -> impl Iterator<Item = &str> {
    page.split("<script>")
        .skip(1)
        .filter_map(|rest| rest.split("</script>").next())
}

/// The groups of each queue as the dashboard lists them, and when they were listed.
#[derive(Default)]
pub(crate) struct GroupsCache(Mutex<HashMap<String, (Instant, Value)>>);

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
            (header::CONTENT_SECURITY_POLICY, CSP.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
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

/// A queue's [`TOP`] groups with the most jobs waiting, and how many it has, listed at most
/// every [`GROUPS_TTL`]; `None` when the store does not answer.
async fn groups(state: &AppState, name: &str, queue: &paceline_queue::Queue) -> Option<Value> {
    let now = Instant::now();
    let cached = state
        .groups
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .filter(|(at, _)| now.duration_since(*at) < GROUPS_TTL)
        .map(|(_, groups)| groups.clone());
    if cached.is_some() {
        return cached;
    }
    let mut stats = queue.stats().await.ok()?;
    let total = stats.groups.len();
    stats.groups.sort_by(|a, b| {
        b.waiting
            .cmp(&a.waiting)
            .then_with(|| a.group.cmp(&b.group))
    });
    let listed: Vec<Value> = stats
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
    let groups = json!({"groups_total": total, "groups": listed});
    state
        .groups
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.to_string(), (now, groups.clone()));
    Some(groups)
}

async fn data(State(state): State<Arc<AppState>>, Authorized(live): Authorized) -> Response {
    // The counts and the clock the page divides them by, read together (the store's
    // answers below take their time).
    let metrics = &state.metrics;
    let counts = metrics.policy_counts();
    let uptime_s = metrics.started.elapsed().as_secs_f64();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let ready = state.store.ready().await;
    let store = {
        let base = state.base.lock().unwrap_or_else(PoisonError::into_inner);
        paceline_store::without_credentials(&base.store)
    };
    let policies: Vec<Value> = counts
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
                "local_rejected": c.local_rejected,
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
        // The counts every time (cheap, as for `/metrics`); the groups from the cache.
        let counted = queue.counts().await;
        let listed = groups(&state, name, queue).await;
        let (Ok(stats), Some(groups)) = (counted, listed) else {
            queues.push(json!({"queue": name, "error": "the store did not answer"}));
            continue;
        };
        metrics.queue_stats(name, &stats);
        queues.push(json!({
            "queue": name,
            "scheduled": stats.scheduled,
            "waiting": stats.waiting,
            "active": stats.active,
            "dead": stats.dead,
            "groups_total": groups["groups_total"],
            "groups": groups["groups"],
        }));
    }
    let latency = metrics.store_latency.snapshot();
    let body = json!({
        "service": {
            "now_ms": now_ms,
            "uptime_s": uptime_s,
            "store": store,
            "ready": ready.is_ok(),
            "store_message": ready.err().map(|e| e.to_string()),
            "store_errors": metrics.store_errors.get(),
            "store_latency_ms": quantiles_ms(&latency, &[("p50", 0.5), ("p99", 0.99)]),
        },
        "policies": policies,
        "refused_keys": refused,
        "refusals_not_sampled": metrics.refused.skipped(),
        "queues": queues,
    });
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_lets_the_pages_own_script_run_and_nothing_else() {
        let csp = CSP.to_str().unwrap_or_default();
        let scripts: Vec<&str> = inline_scripts(PAGE).collect();
        assert_eq!(scripts.len(), 1, "the page has one script");
        let directive = |name: &str| {
            csp.split(';')
                .map(str::trim)
                .find(|d| d.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        let script_src = directive("script-src");
        assert!(script_src.starts_with("script-src 'sha256-"), "{csp}");
        assert!(!script_src.contains("unsafe"), "{csp}");
        assert_eq!(directive("default-src"), "default-src 'none'");
        assert_eq!(directive("connect-src"), "connect-src 'self'");
        // The hash is the script's own.
        let own = ring::digest::digest(&ring::digest::SHA256, scripts[0].as_bytes());
        let own = base64::engine::general_purpose::STANDARD.encode(own.as_ref());
        assert_eq!(script_src, format!("script-src 'sha256-{own}'"));
        // The hash of a changed script is another.
        let other = ring::digest::digest(&ring::digest::SHA256, b"alert(1)");
        let other = base64::engine::general_purpose::STANDARD.encode(other.as_ref());
        assert!(!csp.contains(&other));
    }
}

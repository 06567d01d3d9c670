//! The proxy's admin address: `/healthz`, `/metrics`, and the dashboard (`/dashboard`, the
//! page the service serves too, and its data `/v1/dashboard`: requests by outcome, the
//! upstream's 429s by scope, the buckets learned). Apart from the proxied paths, so they
//! never collide with the upstream's.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use paceline_client::{BucketView, Client};
use prometheus_client::encoding::text::encode;
use serde::Serialize;

use super::settings::shown;
use super::state::{Outcome, ProxyState, Refused};
use crate::dashboard_page::page;
use crate::units::ms;

/// The most buckets `/v1/dashboard` lists.
const DASHBOARD_BUCKETS: usize = 20;

/// The admin address's routes.
pub(super) fn routes() -> Router<Arc<ProxyState>> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/dashboard", get(page))
        .route("/v1/dashboard", get(dashboard))
}

/// `GET /metrics`: the proxy's metrics, OpenMetrics text.
async fn metrics(State(state): State<Arc<ProxyState>>) -> Result<impl IntoResponse, StatusCode> {
    let mut text = String::new();
    encode(&mut text, &state.metrics.registry).map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}

/// `GET /v1/dashboard` of the admin address: the parts of the service's the page reads,
/// empty, and the proxy's own (fields in the order JSON objects print).
#[derive(Serialize)]
struct DashboardBody {
    /// None: the proxy has no policies.
    policies: [(); 0],
    proxy: ProxyBody,
    /// None: the proxy has no queues.
    queues: [(); 0],
    /// None: the proxy refuses no keys of its own.
    refused_keys: [(); 0],
    service: ServiceBody,
}

/// The proxy as a service: always ready, no store calls of its own.
#[derive(Serialize)]
struct ServiceBody {
    ready: bool,
    store: String,
    store_errors: u64,
    store_latency_ms: NoLatency,
    store_message: Option<String>,
    uptime_s: f64,
}

/// The store's latency the service shows: none measured.
#[derive(Serialize)]
struct NoLatency {
    count: u64,
    p50: Option<f64>,
    p99: Option<f64>,
}

/// What the proxy did and knows.
#[derive(Serialize)]
struct ProxyBody {
    buckets: Vec<BucketRow>,
    buckets_in_redis: bool,
    buckets_total: usize,
    identities: usize,
    in_flight: usize,
    invalid_responses: u64,
    requests: BTreeMap<&'static str, u64>,
    retries: u64,
    upstream: String,
    upstream_429: BTreeMap<&'static str, u64>,
    waited_ms: f64,
    waiting: usize,
}

/// One bucket learned, by the identity whose it is (a name, never the token).
#[derive(Serialize)]
struct BucketRow {
    bucket: String,
    identity: String,
    in_flight: usize,
    known: bool,
    limit: Option<u64>,
    major: String,
    paused_for_ms: f64,
    remaining: Option<u64>,
    reset_in_ms: Option<f64>,
}

impl BucketRow {
    fn new(identity: String, b: BucketView) -> BucketRow {
        let us_ms = |us: u64| ms(Duration::from_micros(us));
        BucketRow {
            bucket: b.bucket,
            identity,
            in_flight: b.in_flight,
            known: b.known,
            limit: b.limit,
            major: b.major,
            paused_for_ms: us_ms(b.paused_for_us),
            remaining: b.remaining,
            reset_in_ms: b.reset_in_us.map(us_ms),
        }
    }
}

/// `GET /v1/dashboard` of the admin address: the proxy's outcomes, the upstream's 429s and
/// what it knows of the buckets, for the dashboard page ([`crate::dashboard_page`]).
async fn dashboard(State(state): State<Arc<ProxyState>>) -> impl IntoResponse {
    let m = &state.metrics;
    let requests = [
        "forwarded",
        "wait_exceeded",
        "invalid_budget",
        "upstream_error",
        "bad_request",
        "too_many_identities",
    ]
    .into_iter()
    .map(|outcome| {
        (
            outcome,
            m.requests.get_or_create(&Outcome { outcome }).get(),
        )
    })
    .collect();
    let refused = ["bucket", "shared", "global"]
        .into_iter()
        .map(|scope| {
            (
                scope,
                m.upstream_429.get_or_create(&Refused { scope }).get(),
            )
        })
        .collect();
    let clients: Vec<(String, Client)> = {
        let clients = state.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .iter()
            .map(|(token, (c, _))| (state.identity_name(token), c.clone()))
            .collect()
    };
    let (mut waiting, mut in_flight) = (0, 0);
    let mut buckets = Vec::new();
    let mut shared = false;
    for (identity, client) in &clients {
        let (w, f) = client.counts();
        waiting += w;
        in_flight += f;
        match client.buckets() {
            Some(views) => buckets.extend(views.into_iter().map(|b| (identity.clone(), b))),
            None => shared = true,
        }
    }
    let buckets_total = buckets.len();
    // The tightest first: paused, then the fewest requests left, then unknown ones.
    buckets.sort_by_key(|(identity, b)| {
        (
            std::cmp::Reverse(b.paused_for_us),
            b.remaining.unwrap_or(u64::MAX),
            identity.clone(),
            b.bucket.clone(),
        )
    });
    let listed = buckets
        .into_iter()
        .take(DASHBOARD_BUCKETS)
        .map(|(identity, b)| BucketRow::new(identity, b))
        .collect();
    let body = DashboardBody {
        policies: [],
        proxy: ProxyBody {
            buckets: listed,
            buckets_in_redis: shared,
            buckets_total,
            identities: clients.len(),
            in_flight,
            invalid_responses: m.invalid.get(),
            requests,
            retries: m.retries.get(),
            upstream: shown(&state.upstream),
            upstream_429: refused,
            waited_ms: ms(Duration::from_micros(m.wait_micros.get())),
            waiting,
        },
        queues: [],
        refused_keys: [],
        service: ServiceBody {
            ready: true,
            store: state.store.clone(),
            store_errors: 0,
            store_latency_ms: NoLatency {
                count: 0,
                p50: None,
                p99: None,
            },
            store_message: None,
            uptime_s: state.started.elapsed().as_secs_f64(),
        },
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body))
}

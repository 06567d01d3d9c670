//! What the service tells whoever runs it: `GET /healthz` (it serves), `GET /readyz` (it
//! can decide now, as its store answers) and `GET /metrics` (Prometheus, OpenMetrics text).
//! None of them asks for the service's token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use paceline_store::redis::Readiness;
use serde::Serialize;
use utoipa::ToSchema;

use crate::state::AppState;

/// The health routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// `GET /healthz`'s body: `{"status": "ok"}`.
#[derive(Serialize, ToSchema)]
struct Alive {
    /// `ok`.
    #[schema(value_type = String)]
    status: &'static str,
}

/// `GET /healthz`: the service serves requests.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    operation_id = "healthz",
    security(()),
    responses((status = 200, description = "The service serves requests", body = Alive))
)]
async fn healthz() -> Json<Alive> {
    Json(Alive { status: "ok" })
}

/// `GET /readyz`'s body (fields in the order JSON objects print); the parts about Redis
/// nodes only with a Redis store.
#[derive(Serialize, ToSchema)]
#[schema(as = Ready)]
struct ReadyBody {
    degraded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    failing: Option<Vec<FailingNode>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outages: Option<Vec<OutageBody>>,
    /// `ready`, `degraded` or `unavailable`.
    #[schema(value_type = String)]
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    uncovered_slots: Option<usize>,
}

/// A node that does not serve its keys now, and why.
#[derive(Serialize, ToSchema)]
struct FailingNode {
    error: String,
    node: String,
}

/// An outage this instance's decisions met that goes on.
#[derive(Serialize, ToSchema)]
#[schema(as = Outage)]
struct OutageBody {
    error: String,
    failed_decisions: u64,
    lasted_ms: u64,
    node: String,
}

/// `GET /readyz`: whether this instance can decide now, as its store answers.
///
/// * `200 {"status": "ready", "degraded": false}`: every Redis node (the one server, or each
///   cluster primary) serves its keys; the memory store is always ready.
/// * `200 {"status": "degraded", "degraded": true, "failing": [...], ...}`: some cluster
///   primaries do not serve their keys (down, unreachable, or a cluster that refuses them),
///   or some slots have no primary. Their keys are answered by the failure policy, the
///   others by Redis. Still ready: every instance shares the same Redis, so taking this one
///   out of rotation would not help.
/// * `503 {"status": "unavailable", "message", "failing": [...]}`: no node serves any key;
///   every decision is answered by the failure policy.
///
/// With Redis the body also says how many nodes were asked (`nodes`), each failing node and
/// why (`failing`: `node`, `error`), the slots without a primary (`uncovered_slots`), and
/// the outages this instance's decisions met that go on (`outages`: `node`, `lasted_ms`,
/// `failed_decisions`, `error`).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    operation_id = "readyz",
    security(()),
    responses(
        (status = 200, description = "`ready`, or `degraded` (some Redis Cluster primaries do not serve their keys)", body = ReadyBody),
        (status = 503, description = "`unavailable`: no store node serves any key", body = ReadyBody),
    )
)]
async fn readyz(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let Some(health) = state.store.health().await else {
        let ready = state.store.ready().await;
        let status = if ready.is_ok() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let body = ReadyBody {
            degraded: false,
            failing: None,
            message: ready.as_ref().err().map(ToString::to_string),
            nodes: None,
            outages: None,
            status: if ready.is_ok() {
                "ready"
            } else {
                "unavailable"
            },
            uncovered_slots: None,
        };
        return (status, Json(body));
    };
    let (status, name) = match health.readiness {
        Readiness::Ready => (StatusCode::OK, "ready"),
        Readiness::Degraded => (StatusCode::OK, "degraded"),
        Readiness::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let message = (health.readiness == Readiness::Unavailable).then(|| {
        let why: Vec<String> = health
            .failing
            .iter()
            .map(|f| format!("{}: {}", f.node, f.problem))
            .collect();
        format!("no Redis node serves keys now ({})", why.join("; "))
    });
    let failing = health
        .failing
        .into_iter()
        .map(|f| FailingNode {
            error: f.problem,
            node: f.node,
        })
        .collect();
    let outages = health
        .outages
        .into_iter()
        .map(|o| OutageBody {
            error: o.cause,
            failed_decisions: o.failed,
            lasted_ms: u64::try_from(o.lasted.as_millis()).unwrap_or(u64::MAX),
            node: o.node,
        })
        .collect();
    let body = ReadyBody {
        degraded: health.readiness == Readiness::Degraded,
        failing: Some(failing),
        message,
        nodes: Some(health.nodes),
        outages: Some(outages),
        status: name,
        uncovered_slots: Some(health.uncovered_slots),
    };
    (status, Json(body))
}

/// `GET /metrics`: the service's metrics, with each queue's counts read now.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    operation_id = "metrics",
    security(()),
    responses((status = 200, description = "Prometheus metrics",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String))
)]
async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    for (name, queue) in &state.queues {
        if let Ok(stats) = queue.counts().await {
            state.metrics.queue_stats(name, &stats);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

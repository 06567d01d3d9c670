//! The service's router: every route module's routes in one, the answers to a path or a
//! method no route takes, and the layers every request goes through (the body read
//! timeout, and the net that answers a handler's panic).
//!
//! Each route module (`decisions`, `leases`, `policies`, `queues`, `reload`, `dashboard`,
//! `health`, `openapi`, and `rls::json` for `POST /json`) owns its routes and handlers; this is the only place that knows
//! them all.

use std::sync::Arc;

use axum::Router;

use crate::catch_panic::CatchPanicLayer;
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use crate::{dashboard, decisions, health, leases, openapi, policies, queues, reload};

/// The service's routes, over `state`.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .merge(decisions::routes())
        .merge(policies::routes())
        .merge(reload::routes())
        .merge(queues::routes())
        .merge(leases::routes())
        .merge(dashboard::routes())
        .merge(health::routes())
        .merge(openapi::routes())
        .merge(crate::rls::json::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(CatchPanicLayer)
        .with_state(state)
}

/// A path no route takes.
async fn not_found() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "path",
        "no such endpoint; see GET /v1/policies, POST /v1/decisions",
    )
}

/// A route's path with a method it does not take.
async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "method",
        "this endpoint does not take that method",
    )
}

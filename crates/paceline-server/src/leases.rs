//! Concurrency leases over HTTP: a request in flight holds a lease of a `concurrency`
//! policy, and gives it back when it ends.
//!
//! | endpoint | answer |
//! |---|---|
//! | `POST /v1/leases` `{"policy", "key", "cost"}` | `201 {"lease", "expires_ms", ...}`, or `429` with `Retry-After` when `limit` leases are live |
//! | `POST /v1/leases/{lease}/extend` | `200 {"lease", "expires_ms"}`: it lives `lease` from now |
//! | `DELETE /v1/leases/{lease}` | `204` |
//!
//! A lease that is unknown, given back already or reclaimed (not given back by its expiry),
//! or whose policy is no longer configured as a `concurrency` one, is `404 unknown_lease`,
//! and so is a token of the right shape that this service did not sign; a token that is
//! not of that shape is `400` naming `lease` (an inline spec's token while inline specs are
//! turned off, `403`).
//!
//! A lease travels as a signed token ([`crate::lease_token`]), so that any instance sharing
//! the store can give it back or extend it. `POST /v1/decisions` with a `concurrency`
//! policy takes a lease too, and answers its token as `lease`.

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use paceline_store::{Op, SharedStore};
use serde::{Deserialize, Serialize};
use serde_json::Number;
use utoipa::ToSchema;

use crate::error::{ApiError, Envelope};
use crate::extract::{path_parts, Authorized, JsonBody, JsonSchema, MAX_BODY};
use crate::fields::{check_key, cost_field};
use crate::lease_token::{parse, token, unknown_lease, Token};
use crate::outcome::{rate_limited, settle, status_of, DecisionBody};
use crate::request::{self, Text};
use crate::state::{AppState, Live, Resolved, INLINE};
use crate::units::ms;

/// The lease routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/leases", post(take))
        .route("/v1/leases/{lease}", delete(give_back))
        .route("/v1/leases/{lease}/extend", post(extend))
}

/// `POST /v1/leases`'s body, as sent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with `policy` and `key`"
)]
#[schema(
    as = LeaseRequest,
    example = json!({"policy": "concurrency:limit=2,lease=30s", "key": "uploads"})
)]
struct RawTake<'a> {
    /// A `concurrency` policy's configured name, or its spec.
    #[serde(borrow)]
    #[schema(value_type = String, required = true, pattern = "^([^:]*|concurrency:limit=[1-9][0-9]{0,3},lease=[1-9][0-9]{0,2}(s|m))$")]
    policy: Option<Text<'a>>,
    /// The key whose leases are counted: 1 to 512 bytes.
    #[serde(borrow)]
    #[schema(value_type = String, required = true, min_length = 1, max_length = 512)]
    key: Option<Text<'a>>,
    /// How many of the `limit` leases it holds; 1 by default.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1_099_511_627_776_u64)]
    cost: Option<Number>,
}

/// What each field of `POST /v1/leases` takes, as an error message says it.
const ALLOWED: &[(&str, &str)] = &[
    (
        "policy",
        "a string: a `concurrency` policy's configured name or spec",
    ),
    ("key", "a string"),
    ("cost", "a whole number of at least 1"),
];

/// `POST /v1/leases`'s body: a JSON object of at most [`MAX_BODY`] bytes.
enum TakeSchema {}

impl JsonSchema for TakeSchema {
    const LIMIT: usize = MAX_BODY;
    type Value<'a> = RawTake<'a>;

    fn read(json: &str) -> Result<RawTake<'_>, ApiError> {
        Ok(request::object(
            json,
            "a JSON object with `policy` and `key`",
            ALLOWED,
        )?)
    }
}

/// A lease taken.
#[derive(Serialize, ToSchema)]
#[schema(as = Lease)]
struct LeaseBody<'a> {
    /// When the lease is reclaimed unless extended, in ms from now.
    expires_ms: f64,
    /// Set when the store failed and the failure policy answered: the lease is held
    /// nowhere shared.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    fallback: Option<&'static str>,
    /// The lease's token, for `extend` and `DELETE`; `null` when a failure policy admitted
    /// it without the store.
    lease: Option<String>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
}

/// `POST /v1/leases`: `201` with the lease, or `429` (with `Retry-After`) when the policy's
/// `limit` leases are live.
#[utoipa::path(
    post,
    path = "/v1/leases",
    tag = "leases",
    operation_id = "take_lease",
    request_body = RawTake,
    responses(
        (status = 201, description = "The lease, live for the policy's `lease` unless extended", body = LeaseBody,
            headers(
                ("RateLimit-Policy" = String, description = "Each limit: its name, quota and window (IETF RateLimit headers)"),
                ("RateLimit" = String, description = "Each limit's remaining units and seconds to reset")
            )),
        (status = 429, description = "The policy's `limit` leases are live", body = DecisionBody,
            headers(
                ("RateLimit-Policy" = String, description = "Each limit: its name, quota and window (IETF RateLimit headers)"),
                ("RateLimit" = String, description = "Each limit's remaining units and seconds to reset"),
                ("Retry-After" = String, description = "Seconds to wait before asking again")
            )),
        (status = 400, description = "`invalid_argument`: a field is wrong, or the policy is no `concurrency` one", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 403, description = "`inline_policies_disabled`", body = Envelope),
        (status = 404, description = "`unknown_policy`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 409, description = "`conflict`: a `cost` more than the policy's `limit` (it can never be admitted); no lease taken", body = Envelope),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn take(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: JsonBody<TakeSchema>,
) -> Result<axum::response::Response, ApiError> {
    let fields = body.read()?;
    let spec = fields.policy.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "policy",
            "is required: a `concurrency` policy's name or spec",
        )
    })?;
    let key = fields
        .key
        .as_deref()
        .ok_or_else(|| ApiError::invalid("key", "is required"))?;
    check_key(key, "key")?;
    let cost = cost_field(fields.cost.as_ref(), "cost")?.unwrap_or(1);
    let resolved = live.resolve(spec, key, "policy")?;
    let lease = resolved
        .policy
        .concurrency()
        .map_err(|e| ApiError::input(&e))?
        .lease();
    let name = resolved.name.unwrap_or(INLINE);
    let outcome = state
        .store
        .decide(&resolved.policy, &resolved.store_key, Op::Limit, cost)
        .await;
    let d = settle(&state, resolved.metrics, key, outcome)?;
    let limits = [(name, &d)];
    if !d.allowed {
        let body = DecisionBody::new(name, &d, None);
        return Ok(rate_limited(status_of(&d), body, &limits, &d));
    }
    let namespace = resolved.namespace(key);
    let body = LeaseBody {
        expires_ms: ms(lease),
        fallback: d.fallback.map(|f| f.name()),
        lease: d
            .lease
            .map(|id| token(&state.lease_key, namespace, key, id)),
        limit: d.limit,
        policy: name,
        remaining: d.remaining,
    };
    Ok(rate_limited(StatusCode::CREATED, body, &limits, &d))
}

/// An extension: the lease and its new life.
#[derive(Serialize, ToSchema)]
#[schema(as = LeaseExtended)]
struct ExtendedBody {
    /// When the lease is reclaimed unless extended again, in ms from now.
    expires_ms: f64,
    lease: String,
}

/// `POST /v1/leases/{lease}/extend`: the lease lives its policy's `lease` from now.
#[utoipa::path(
    post,
    path = "/v1/leases/{lease}/extend",
    tag = "leases",
    operation_id = "extend_lease",
    params(("lease" = String, Path, pattern = r"^[0-9]+\.([0-9a-fA-F]{2})+\.([0-9a-fA-F]{2})+\.[0-9a-fA-F]{32}$", description = "The lease's token, as `POST /v1/leases` answered it")),
    responses(
        (status = 200, description = "The lease lives its policy's `lease` from now", body = ExtendedBody),
        (status = 400, description = "`invalid_argument`: not a lease token", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 403, description = "`inline_policies_disabled`: an inline spec's lease while inline specs are off", body = Envelope),
        (status = 404, description = "`unknown_lease`: given back, reclaimed, or never taken here", body = Envelope),
        (status = 503, description = "`store_unavailable`", body = Envelope),
    )
)]
async fn extend(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ExtendedBody>, ApiError> {
    let (lease, left) = on_lease(&state, &live, path, |store, resolved, id| async move {
        store
            .extend(&resolved.policy, &resolved.store_key, id)
            .await
    })
    .await?;
    Ok(Json(ExtendedBody {
        expires_ms: ms(left),
        lease,
    }))
}

/// `DELETE /v1/leases/{lease}`: `204`.
#[utoipa::path(
    delete,
    path = "/v1/leases/{lease}",
    tag = "leases",
    operation_id = "release_lease",
    params(("lease" = String, Path, pattern = r"^[0-9]+\.([0-9a-fA-F]{2})+\.([0-9a-fA-F]{2})+\.[0-9a-fA-F]{32}$", description = "The lease's token")),
    responses(
        (status = 204, description = "Given back"),
        (status = 400, description = "`invalid_argument`: not a lease token", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 403, description = "`inline_policies_disabled`", body = Envelope),
        (status = 404, description = "`unknown_lease`", body = Envelope),
        (status = 503, description = "`store_unavailable`", body = Envelope),
    )
)]
async fn give_back(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    on_lease(&state, &live, path, |store, resolved, id| async move {
        let released = store
            .release(&resolved.policy, &resolved.store_key, id)
            .await?;
        Ok(released.then_some(()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The lease a token names: its id, and its key's policy as the live configuration has it.
/// A policy no longer configured makes the lease unknown.
fn find<'a>(
    live: &'a Live,
    state: &AppState,
    token: &str,
) -> Result<(u64, Resolved<'a>), ApiError> {
    let Token { id, namespace, key } = parse(&state.lease_key, token)?;
    let spec = namespace.strip_prefix('~').unwrap_or(&namespace);
    match live.resolve(spec, &key, "lease") {
        // A policy that is no longer a concurrency one (a reload changed it) holds no lease.
        Ok(resolved) if resolved.policy.concurrency().is_err() => Err(unknown_lease()),
        Ok(resolved) => Ok((id, resolved)),
        Err(e) if e.status() == StatusCode::NOT_FOUND => Err(unknown_lease()),
        Err(e) => Err(e),
    }
}

/// Finds the lease a path names and runs `call` on it with the store: its token and what
/// `call` answered, `404 unknown_lease` when it answered `None` (the lease is not live), or
/// the error of a bad token or a failed store.
async fn on_lease<'a, T, F, Fut>(
    state: &'a AppState,
    live: &'a Live,
    path: Result<Path<String>, PathRejection>,
    call: F,
) -> Result<(String, T), ApiError>
where
    F: FnOnce(&'a SharedStore, Resolved<'a>, u64) -> Fut,
    Fut: Future<Output = Result<Option<T>, paceline_store::Error>>,
{
    let token = path_parts(path, "the lease")?;
    let (id, resolved) = find(live, state, &token)?;
    match call(&state.store, resolved, id).await? {
        Some(answer) => Ok((token, answer)),
        None => Err(unknown_lease()),
    }
}

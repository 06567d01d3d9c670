//! Decisions over HTTP: `POST /v1/decisions` (one decision, or a set of limits decided as
//! one) and `POST /v1/decisions/batch` (up to [`MAX_BATCH`] single decisions, answered in
//! order).
//!
//! A decision answers `200` admitted or `429` refused, with its JSON body and the headers
//! `RateLimit-Policy`, `RateLimit` and, for a refusal, `Retry-After` ([`crate::outcome`]).
//! A policy in shadow mode ([`shadow`]) is decided and counted as usual, but its refusal
//! is answered `200` admitted with no wait, `"shadow": true` in the body, and the
//! `RateLimit` headers as the refusal left the limit.
//! A batch answers `200` with one entry per request, each with its own `status`: a
//! decision's body, or `{"error": {...}, "status"}` for a request that has none.

mod ask;
mod set;
pub(crate) mod shadow;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use paceline_store::{Decision, Request, StoreError, StoreErrorKind};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, Envelope, ErrorBody};
use crate::extract::{Authorized, JsonBody, JsonSchema, MAX_BODY};
use crate::outcome::{rate_limited, settle, status_of, DecisionBody};
use crate::request::{self, BodyError, RawAsk};
use crate::state::AppState;
use ask::Ask;
use set::SetAsk;
use set::SetBody;

/// The largest body of `POST /v1/decisions/batch`.
pub const MAX_BATCH_BODY: usize = 1024 * 1024;
/// The most requests in one batch.
pub const MAX_BATCH: usize = 1_000;

/// The decision routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/decisions", post(decide))
        .route("/v1/decisions/batch", post(batch))
}

/// `POST /v1/decisions`'s body: one request's fields, at most [`MAX_BODY`] bytes.
enum AskSchema {}

impl JsonSchema for AskSchema {
    const LIMIT: usize = MAX_BODY;
    type Value<'a> = RawAsk<'a>;

    fn read(json: &str) -> Result<RawAsk<'_>, ApiError> {
        Ok(request::ask(json)?)
    }
}

/// `POST /v1/decisions/batch`'s body: an array of at most [`MAX_BATCH`] requests, each
/// read on its own (a bad one is its own entry's error), at most [`MAX_BATCH_BODY`] bytes.
enum BatchSchema {}

impl JsonSchema for BatchSchema {
    const LIMIT: usize = MAX_BATCH_BODY;
    type Value<'a> = Vec<Result<RawAsk<'a>, BodyError>>;

    fn read(json: &str) -> Result<Vec<Result<RawAsk<'_>, BodyError>>, ApiError> {
        let items = request::batch(json)?;
        if items.len() > MAX_BATCH {
            return Err(ApiError::invalid(
                "body",
                format!("{} requests; at most {MAX_BATCH} per batch", items.len()),
            ));
        }
        Ok(items)
    }
}

/// One limit's answer: its decision, and whether shadow mode turned a refusal into it.
#[derive(Serialize, ToSchema)]
#[schema(as = LimitAnswer)]
struct Answered<'a> {
    #[serde(flatten)]
    decision: DecisionBody<'a>,
    /// Set (to `true`) only when the policy is in shadow mode (`shadow = true` in the
    /// service's config) and refused: the answer admits all the same, with no wait, and
    /// the `RateLimit` headers say the limit as the refusal left it.
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
}

impl<'a> Answered<'a> {
    fn new(decision: DecisionBody<'a>, shadowed: bool) -> Answered<'a> {
        Answered {
            decision,
            shadow: shadowed.then_some(true),
        }
    }
}

// For the OpenAPI document only: the handler writes one body or the other.
/// The answer to `POST /v1/decisions`: one limit's decision, or a set's.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = DecisionAnswer)]
#[allow(dead_code)]
enum DecisionAnswer<'a> {
    One(Answered<'a>),
    Set(SetBody<'a>),
}

/// `POST /v1/decisions`: one decision, or (with `limits`) a set of limits decided as one.
#[utoipa::path(
    post,
    path = "/v1/decisions",
    tag = "decisions",
    operation_id = "decide",
    request_body(content = RawAsk, description = "One limit (`policy`, `key`) or a set of limits decided as one (`limits`)"),
    responses(
        (status = 200, description = "Admitted (or, for `pace`, booked: wait `delay_ms` first; or refused by a policy in shadow mode and admitted all the same, `shadow` saying so)", body = DecisionAnswer,
            headers(
                ("RateLimit-Policy" = String, description = "Each limit: its name, quota and window (IETF RateLimit headers)"),
                ("RateLimit" = String, description = "Each limit's remaining units and seconds to reset")
            )),
        (status = 429, description = "Refused: nothing counted; retry after `delay_ms`", body = DecisionAnswer,
            headers(
                ("RateLimit-Policy" = String, description = "Each limit: its name, quota and window (IETF RateLimit headers)"),
                ("RateLimit" = String, description = "Each limit's remaining units and seconds to reset"),
                ("Retry-After" = String, description = "Seconds to wait before asking again")
            )),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`: the service's token is missing or wrong", body = Envelope),
        (status = 403, description = "`inline_policies_disabled`: an inline spec while the service takes configured names only", body = Envelope),
        (status = 404, description = "`unknown_policy`: no configured policy of that name", body = Envelope),
        (status = 408, description = "`request_timeout`: the body did not arrive in time", body = Envelope),
        (status = 409, description = "`conflict`: a cost more than its policy can ever admit (`field` names it: `cost`, `limits[i].cost`; the message says the most it admits), or a paced set whose limits' free slots do not meet (`op`); nothing counted", body = Envelope),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`: the store failed and the failure policy refuses", body = Envelope),
    )
)]
async fn decide(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: JsonBody<AskSchema>,
) -> Result<Response, ApiError> {
    let fields = body.read()?;
    if fields.limits.is_some() {
        return SetAsk::validate(&live, &fields)?.decide(&state).await;
    }
    let ask = Ask::validate(&live, &fields)?;
    let request = ask.request();
    let started = quanta::Instant::now();
    let outcome = state
        .store
        .decide(request.policy, request.key, request.op, request.cost)
        .await;
    state.metrics.observe_store(started.elapsed());
    let d = settle(&state, ask.metrics, ask.key(), outcome)?;
    let (answer, shadowed) = ask.answer(&d);
    let lease = d.lease.map(|id| ask.lease_token(&state.lease_key, id));
    let body = Answered::new(
        DecisionBody::new(ask.name, &answer, None).with_lease(lease),
        shadowed,
    );
    // The headers say the limit as decided; the answer's admit drops `Retry-After`.
    Ok(rate_limited(
        status_of(&answer),
        body,
        &[(ask.name, &d)],
        &answer,
    ))
}

/// A batch request's decision: the policy's name, the answer (see [`Ask::answer`]),
/// whether shadow mode turned a refusal into it, and its lease's token.
type Settled<'a> = (&'a str, Decision, bool, Option<String>);

/// One answer of a batch: a decision, or an error, each with its status.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = BatchDecision)]
enum BatchItem<'a> {
    Decision(Answered<'a>),
    Error { error: ErrorBody<'a>, status: u16 },
}

/// `POST /v1/decisions/batch`: every valid request decided in one call to the store, the
/// answers in the requests' order.
#[utoipa::path(
    post,
    path = "/v1/decisions/batch",
    tag = "decisions",
    operation_id = "decide_batch",
    request_body(content = Vec<RawAsk>, description = "Up to 1000 single-limit requests (no `limits`)"),
    responses(
        (status = 200, description = "One entry per request, in order, each with its own `status` (an error's as `POST /v1/decisions` answers it: `409 conflict` for a cost its policy can never admit)", body = Vec<BatchItem>),
        (status = 400, description = "`invalid_argument`: the body is no array, or holds over 1000 requests", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`: the body is over 1 MiB", body = Envelope),
    )
)]
async fn batch(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: JsonBody<BatchSchema>,
) -> Result<Response, ApiError> {
    let items = body.read()?;
    let asks: Vec<Result<Ask, ApiError>> = items
        .iter()
        .map(|item| match item {
            Ok(fields) => Ask::validate(&live, fields),
            Err(e) => Err(ApiError::invalid(e.field.clone(), e.message.clone())),
        })
        .collect();
    let valid: Vec<&Ask> = asks.iter().filter_map(|a| a.as_ref().ok()).collect();
    let started = quanta::Instant::now();
    let requests: Vec<Request> = valid.iter().map(|a| a.request()).collect();
    let mut outcomes = state.store.decide_batch(&requests).await.into_iter();
    if !valid.is_empty() {
        state.metrics.observe_store(started.elapsed());
    }
    // One result per request, in order: its decision, or why it has none.
    let settled: Vec<Result<Settled, ApiError>> = asks
        .into_iter()
        .map(|ask| {
            let ask = ask?;
            let outcome = outcomes.next().unwrap_or_else(|| {
                Err(StoreError::new(StoreErrorKind::Protocol, "no answer").into())
            });
            settle(&state, ask.metrics, ask.key(), outcome).map(|d| {
                let (answer, shadowed) = ask.answer(&d);
                let lease = d.lease.map(|id| ask.lease_token(&state.lease_key, id));
                (ask.name, answer, shadowed, lease)
            })
        })
        .collect();
    // The answers borrow from the results above, so the body is written out here.
    let items: Vec<BatchItem> = settled
        .iter()
        .map(|result| match result {
            Ok((name, d, shadowed, lease)) => BatchItem::Decision(Answered::new(
                DecisionBody::new(name, d, Some(status_of(d).as_u16())).with_lease(lease.clone()),
                *shadowed,
            )),
            Err(e) => BatchItem::Error {
                error: e.body(),
                status: e.status().as_u16(),
            },
        })
        .collect();
    Ok(Json(items).into_response())
}

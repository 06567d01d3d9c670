//! A decision's outcome: counted in the metrics ([`settle`]), and answered: `200` admitted
//! or `429` refused, its JSON body ([`DecisionBody`]), and the headers that say the limits
//! (`RateLimit-Policy`, `RateLimit` and, for a refusal, `Retry-After`: see
//! [`paceline_tower::headers`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use paceline_store::{Decision, Error};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::metrics::PolicyMetrics;
use crate::state::AppState;
use crate::units::ms;

/// One decision's JSON body (fields in alphabetical order, as the API has always printed
/// them); `status` only in batch answers.
#[derive(Serialize, ToSchema)]
#[schema(as = Decision)]
pub(crate) struct DecisionBody<'a> {
    /// Admitted (`pace`: the slot is booked; wait `delay_ms` first).
    allowed: bool,
    /// How long to wait: before acting (`pace`), or before asking again (a refusal).
    delay_ms: f64,
    /// Set when the store failed and the failure policy answered: `fail_open`,
    /// `fail_closed` or `local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    fallback: Option<&'static str>,
    /// The token of the lease a `concurrency` decision took, for `POST
    /// /v1/leases/{lease}/extend` and `DELETE /v1/leases/{lease}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    /// The policy's limit: requests (or units) per window, burst, or leases.
    limit: u64,
    /// The policy's name: its configured name, or `inline` for a spec.
    policy: &'a str,
    /// How many more units the limit admits now.
    remaining: u64,
    /// When the limit is whole again, in ms from now.
    reset_after_ms: f64,
    /// In a batch's answer only: the status this request alone would have had.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
}

impl<'a> DecisionBody<'a> {
    /// The body of decision `d` by `policy` (its name in answers); `status` for a batch's
    /// entry.
    pub(crate) fn new(policy: &'a str, d: &Decision, status: Option<u16>) -> DecisionBody<'a> {
        DecisionBody {
            allowed: d.allowed,
            delay_ms: ms(d.delay),
            fallback: d.fallback.map(|f| f.name()),
            lease: None,
            limit: d.limit,
            policy,
            remaining: d.remaining,
            reset_after_ms: ms(d.reset_after),
            status,
        }
    }

    /// The body with the token of the lease the decision took, if it took one.
    pub(crate) fn with_lease(mut self, lease: Option<String>) -> DecisionBody<'a> {
        self.lease = lease;
        self
    }
}

/// Counts a decision in the metrics and turns a failure into its API error.
pub(crate) fn settle(
    state: &AppState,
    metrics: &PolicyMetrics,
    key: &str,
    outcome: Result<Decision, Error>,
) -> Result<Decision, ApiError> {
    match outcome {
        Ok(decision) => {
            if decision.fallback.is_some() {
                state.metrics.store_errors.inc();
            }
            metrics.decided(&decision, key);
            Ok(decision)
        }
        // Bad input (a cost the policy can never admit) is the request's fault, not a
        // failed decision.
        Err(e @ Error::Input(_)) => Err(ApiError::from(e)),
        Err(e) => {
            metrics.failed();
            if matches!(e, Error::Store(_)) {
                state.metrics.store_errors.inc();
            }
            Err(ApiError::from(e))
        }
    }
}

/// 200 admitted, 429 rejected.
pub(crate) fn status_of(decision: &Decision) -> StatusCode {
    if decision.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

/// An answer with `status` and JSON `body` that also says the limits: `limits` (each by
/// its name in the answer) in `RateLimit-Policy` and `RateLimit`, and, when `combined`
/// refuses, `Retry-After`.
pub(crate) fn rate_limited(
    status: StatusCode,
    body: impl Serialize,
    limits: &[(&str, &Decision)],
    combined: &Decision,
) -> Response {
    let mut response = (status, Json(body)).into_response();
    paceline_tower::headers::insert(response.headers_mut(), limits, combined);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_store::Fallback;
    use serde_json::Value;

    #[test]
    fn a_decision_body_prints_its_fields_in_order_and_finite() {
        // Microseconds: zero, below a microsecond, fractional, large, and saturating.
        let times = [0.0, 0.001, 1.0, 1_500.5, 120_000.0, 3.15e13, f64::MAX];
        let names = ["discord-roles", "inline", "", "quote\"back\\slash\u{1}é"];
        for (i, &delay) in times.iter().enumerate() {
            for (j, name) in names.iter().enumerate() {
                let reset_after = times[(i + j) % times.len()];
                for (allowed, fallback, status) in [
                    (true, None, None),
                    (false, None, Some(429)),
                    (true, Some(Fallback::FailOpen), Some(200)),
                    (true, Some(Fallback::Local), None),
                ] {
                    let mut decision = Decision::from_micros(
                        allowed,
                        delay,
                        (i * 7 + j) as u64,
                        reset_after,
                        u64::MAX - i as u64,
                    );
                    decision.fallback = fallback;
                    let body = DecisionBody::new(name, &decision, status);
                    let text = serde_json::to_string(&body).unwrap_or_default();
                    // The fields in the order the API has always printed them.
                    let order: Vec<usize> = [
                        "\"allowed\"",
                        "\"delay_ms\"",
                        "\"limit\"",
                        "\"policy\"",
                        "\"remaining\"",
                        "\"reset_after_ms\"",
                    ]
                    .iter()
                    .map(|field| text.find(field).unwrap_or(usize::MAX))
                    .collect();
                    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    assert_eq!(v["policy"], *name, "{text}");
                    assert!(
                        v["delay_ms"].is_f64() && v["reset_after_ms"].is_f64(),
                        "{text}"
                    );
                    assert_eq!(v["fallback"].as_str(), fallback.map(|f| f.name()), "{text}");
                    assert_eq!(v["status"].as_u64(), status.map(u64::from), "{text}");
                }
            }
        }
    }
}

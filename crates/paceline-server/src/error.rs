//! The service's error answer: `{"error": {"code", "field", "message"}}` with a status.
//!
//! Every handler answers a failure as an [`ApiError`]: the [`ErrorCode`] says what kind of
//! failure it is (and so the status), `field` names the part of the request at fault
//! (`body`, `key`, `limits[2].policy`, `lease`, ...), and `message` tells the client what
//! to do next.
//!
//! ```json
//! {"error": {"code": "unknown_policy", "field": "policy",
//!            "message": "no policy named `uploads`; see GET /v1/policies"}}
//! ```

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use paceline_store::{InputError, StoreErrorKind};
use serde::Serialize;
use utoipa::ToSchema;

use crate::request::BodyError;

/// What kind of failure an error is: its `code` in the answer, which fixes its status.
///
/// | code | status | meaning |
/// |---|---|---|
/// | `invalid_argument` | 400 | a field (or the body) is not what the endpoint takes |
/// | `unauthenticated` | 401 | the service's token is missing or wrong |
/// | `inline_policies_disabled` | 403 | an inline policy spec while the service takes configured names only |
/// | `not_found` | 404 | no endpoint at that path |
/// | `unknown_policy` | 404 | no configured policy of that name |
/// | `unknown_lease` | 404 | no live concurrency lease of that token |
/// | `unknown_queue` | 404 | no queue of that name |
/// | `unknown_job` | 404 | no job of that id in the queue |
/// | `unknown_schedule` | 404 | no schedule of that name in the queue |
/// | `method_not_allowed` | 405 | the endpoint does not take that method |
/// | `request_timeout` | 408 | the body did not arrive within the service's `body_read_timeout` |
/// | `conflict` | 409 | the job's state does not allow the call; a cost more than its policy can ever admit (a limit's, a burst's; `field` names the cost), or a paced set whose limits' free slots do not meet (`op`); or a reload of a service started without a config file |
/// | `lease_lost` | 409 | the job's lease is no longer the one given: stop working on the job |
/// | `payload_too_large` | 413 | the body is over the endpoint's limit |
/// | `invalid_config` | 422 | the config file did not load on a reload |
/// | `rate_limited` | 429 | `paceline proxy` only: the request cannot be sent upstream in time (`Retry-After` says when to try again) |
/// | `internal` | 500 | the service failed on the request |
/// | `bad_gateway` | 502 | `paceline proxy` only: the upstream could not be reached or failed to answer |
/// | `store_full` | 503 | the store holds as much as it may |
/// | `store_unavailable` | 503 | the store does not answer |
/// | `gateway_timeout` | 504 | `paceline proxy` only: the upstream did not start its answer in time |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorCode {
    /// `400`: a field (or the body) is not what the endpoint takes.
    InvalidArgument,
    /// `401`: the service's token is missing or wrong.
    Unauthenticated,
    /// `403`: an inline policy spec while the service takes configured names only.
    InlinePoliciesDisabled,
    /// `404`: no endpoint at that path.
    NotFound,
    /// `404`: no configured policy of that name.
    UnknownPolicy,
    /// `404`: no live concurrency lease of that token.
    UnknownLease,
    /// `404`: no queue of that name.
    UnknownQueue,
    /// `404`: no job of that id in the queue.
    UnknownJob,
    /// `404`: no schedule of that name in the queue.
    UnknownSchedule,
    /// `405`: the endpoint does not take that method.
    MethodNotAllowed,
    /// `408`: the body did not arrive within the service's `body_read_timeout`.
    RequestTimeout,
    /// `409`: the job's state does not allow the call, a cost is more than its policy can
    /// ever admit, or there is no config to reload.
    Conflict,
    /// `409`: the job's lease is no longer the one given.
    LeaseLost,
    /// `413`: the body is over the endpoint's limit.
    PayloadTooLarge,
    /// `422`: the config file did not load on a reload.
    InvalidConfig,
    /// `429` (`paceline proxy` only): the request cannot be sent upstream in time.
    RateLimited,
    /// `500`: the service failed on the request.
    Internal,
    /// `502` (`paceline proxy` only): the upstream could not be reached or failed.
    BadGateway,
    /// `503`: the store holds as much as it may.
    StoreFull,
    /// `503`: the store does not answer.
    StoreUnavailable,
    /// `504` (`paceline proxy` only): the upstream did not start its answer in time.
    GatewayTimeout,
}

impl ErrorCode {
    /// The status an error of this code answers with.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::InlinePoliciesDisabled => StatusCode::FORBIDDEN,
            ErrorCode::NotFound
            | ErrorCode::UnknownPolicy
            | ErrorCode::UnknownLease
            | ErrorCode::UnknownQueue
            | ErrorCode::UnknownJob
            | ErrorCode::UnknownSchedule => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Conflict | ErrorCode::LeaseLost => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidConfig => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::BadGateway => StatusCode::BAD_GATEWAY,
            ErrorCode::StoreFull | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// A failed request, answered as `{"error": {"code", "field", "message"}}` with the code's
/// status (and, for `unauthenticated`, `WWW-Authenticate: Bearer`).
#[derive(Debug)]
pub(crate) struct ApiError {
    code: ErrorCode,
    field: String,
    message: String,
}

impl ApiError {
    /// An error of `code`, at `field`, saying `message`.
    pub(crate) fn new(
        code: ErrorCode,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            code,
            field: field.into(),
            message: message.into(),
        }
    }

    /// `400 invalid_argument` at `field`.
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidArgument, field, message)
    }

    /// Bad input, named by its field: `400 invalid_argument`, or `409 conflict` for a value
    /// more than its policy can ever admit ([`InputError::is_beyond_policy`]: a cost above
    /// a limit or a burst), which no request of that shape can fix but a policy changed can.
    pub(crate) fn input(e: &InputError) -> ApiError {
        let code = if e.is_beyond_policy() {
            ErrorCode::Conflict
        } else {
            ErrorCode::InvalidArgument
        };
        ApiError::new(code, e.field(), e.message())
    }

    /// `404 unknown_policy`: no policy `name`, named in `field`.
    pub(crate) fn unknown_policy(name: &str, field: &str) -> ApiError {
        ApiError::new(
            ErrorCode::UnknownPolicy,
            field,
            format!("no policy named `{name}`; see GET /v1/policies"),
        )
    }

    /// What went wrong, as the answer says it.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The status it answers with.
    pub(crate) fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// Its `{"code", "field", "message"}`, as an answer (or a batch's entry) prints it.
    pub(crate) fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            code: self.code,
            field: &self.field,
            message: &self.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(Envelope { error: self.body() })).into_response();
        if self.code == ErrorCode::Unauthenticated {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A body that did not read: `400` naming the field at fault.
impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> ApiError {
        ApiError::invalid(e.field, e.message)
    }
}

/// A store call that failed: bad input is `400` (`409` for a cost its policy can never
/// admit), a store that does not answer (or is
/// full) `503`, anything else `500`.
impl From<paceline_store::Error> for ApiError {
    fn from(e: paceline_store::Error) -> ApiError {
        use paceline_store::Error;
        match e {
            Error::Input(e) => ApiError::input(&e),
            Error::Store(e) => {
                let code = if e.kind() == StoreErrorKind::Capacity {
                    ErrorCode::StoreFull
                } else {
                    ErrorCode::StoreUnavailable
                };
                ApiError::new(code, "store", e.message())
            }
            other => ApiError::new(ErrorCode::Internal, "store", other.to_string()),
        }
    }
}

/// `{"error": {"code", "field", "message"}}`: the whole body of an error answer.
#[derive(Serialize, ToSchema)]
#[schema(as = ErrorAnswer)]
pub(crate) struct Envelope<'a> {
    error: ErrorBody<'a>,
}

/// `{"code", "field", "message"}` of an error (fields in the order JSON objects print).
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody<'a> {
    /// What kind of failure it is; it fixes the answer's status.
    code: ErrorCode,
    /// The part of the request at fault: `body`, a field's name or path
    /// (`limits[2].policy`), `lease`, `authorization`, `store`, ...
    field: &'a str,
    /// What went wrong, and what to do next.
    message: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_print_as_the_api_has_always_named_them() {
        for (code, name, status) in [
            (ErrorCode::InvalidArgument, "invalid_argument", 400),
            (ErrorCode::Unauthenticated, "unauthenticated", 401),
            (
                ErrorCode::InlinePoliciesDisabled,
                "inline_policies_disabled",
                403,
            ),
            (ErrorCode::NotFound, "not_found", 404),
            (ErrorCode::UnknownPolicy, "unknown_policy", 404),
            (ErrorCode::UnknownLease, "unknown_lease", 404),
            (ErrorCode::UnknownQueue, "unknown_queue", 404),
            (ErrorCode::UnknownJob, "unknown_job", 404),
            (ErrorCode::UnknownSchedule, "unknown_schedule", 404),
            (ErrorCode::MethodNotAllowed, "method_not_allowed", 405),
            (ErrorCode::RequestTimeout, "request_timeout", 408),
            (ErrorCode::Conflict, "conflict", 409),
            (ErrorCode::LeaseLost, "lease_lost", 409),
            (ErrorCode::PayloadTooLarge, "payload_too_large", 413),
            (ErrorCode::InvalidConfig, "invalid_config", 422),
            (ErrorCode::Internal, "internal", 500),
            (ErrorCode::StoreFull, "store_full", 503),
            (ErrorCode::StoreUnavailable, "store_unavailable", 503),
        ] {
            let printed = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(printed, format!("\"{name}\""));
            assert_eq!(code.status().as_u16(), status, "{name}");
        }
    }

    #[test]
    fn a_cost_beyond_its_policy_is_a_conflict_and_other_bad_input_invalid() {
        let beyond = InputError::beyond_policy("cost", "at most 10 at once");
        for (e, code, field) in [
            (beyond.clone(), ErrorCode::Conflict, "cost"),
            (
                beyond.renamed("limits[1].cost"),
                ErrorCode::Conflict,
                "limits[1].cost",
            ),
            (
                InputError::new("cost", "must be at least 1"),
                ErrorCode::InvalidArgument,
                "cost",
            ),
        ] {
            let answer = ApiError::input(&e);
            assert_eq!((answer.code, answer.field.as_str()), (code, field));
            assert_eq!(answer.message, e.message());
            let from_store = ApiError::from(paceline_store::Error::Input(e));
            assert_eq!(from_store.status(), code.status());
        }
    }

    #[test]
    fn an_error_prints_code_field_and_message_in_that_order() {
        let e = ApiError::unknown_policy("uploads", "policy");
        let text = serde_json::to_string(&Envelope { error: e.body() }).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"error":{"code":"unknown_policy","field":"policy","message":"no policy named `uploads`; see GET /v1/policies"}}"#
        );
        let answer =
            ApiError::new(ErrorCode::Unauthenticated, "authorization", "send it").into_response();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            answer.headers().get(header::WWW_AUTHENTICATE),
            Some(&HeaderValue::from_static("Bearer"))
        );
    }
}

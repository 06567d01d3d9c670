//! What handlers take from a request besides the state: the caller's right to ask
//! ([`Authorized`]), a JSON body read whole and checked ([`JsonBody`]), and a path's parts
//! as text ([`path_parts`]). Each refuses a request as an [`ApiError`].

use std::marker::PhantomData;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header;
use axum::http::request::Parts;
use subtle::ConstantTimeEq as _;

use crate::body_timeout::BodyTimedOut;
use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, Live};

/// The largest body of `POST /v1/decisions` (and of `POST /v1/leases`).
pub const MAX_BODY: usize = 64 * 1024;

/// The live configuration, for a request whose token it accepts: every `/v1` handler
/// takes one, so that none runs unauthenticated, and all of a request is decided under
/// the one configuration its token was checked against. Without the token (when the
/// service has one), `401 unauthenticated` with `WWW-Authenticate: Bearer`.
pub(crate) struct Authorized(pub(crate) Arc<Live>);

impl FromRequestParts<Arc<AppState>> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Authorized, ApiError> {
        let live = state.live();
        if let Some(token) = &live.auth_token {
            let given = parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer_token(v.as_bytes()));
            let accepted = given.is_some_and(|g| bool::from(g.ct_eq(token.as_bytes())));
            if !accepted {
                return Err(ApiError::new(
                    ErrorCode::Unauthenticated,
                    "authorization",
                    "send the service's token as `Authorization: Bearer TOKEN`",
                ));
            }
        }
        Ok(Authorized(live))
    }
}

/// The token of an `Authorization: Bearer TOKEN` header: the scheme in any case (RFC 9110
/// makes auth schemes case-insensitive), then one or more spaces.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let scheme = value.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let token = rest.trim_ascii_start();
    // At least one space between the scheme and the token.
    (token.len() < rest.len() && !token.is_empty()).then_some(token)
}

/// What an endpoint's JSON body is: how large it may be, and what it is read into.
///
/// ```text
/// enum AckSchema {}
/// impl JsonSchema for AckSchema {
///     const LIMIT: usize = 64 * 1024;
///     type Value<'a> = Ack<'a>;          // may borrow the body's text
///     fn read(json: &str) -> Result<Ack<'_>, ApiError> { ... }
/// }
/// async fn ack(body: JsonBody<AckSchema>) -> Result<..., ApiError> {
///     let ack = body.read()?;
/// ```
pub(crate) trait JsonSchema {
    /// The largest body, in bytes: a larger one is `413 payload_too_large`.
    const LIMIT: usize;
    /// What the body is read into; it may borrow the body's text.
    type Value<'a>;
    /// Reads the body's text, or says which field (or `body`) is wrong and how.
    fn read(json: &str) -> Result<Self::Value<'_>, ApiError>;
}

/// A request's JSON body, read whole: at most `S::LIMIT` bytes (else `413`). The router's
/// body timeout layer bounds how long its arrival may take (else `408`, see
/// [`crate::body_timeout`]); a route served without that layer has no such bound.
/// [`read`](Self::read) checks it is UTF-8 and reads it as `S` says (else `400`), borrowing
/// from it where `S` does, which is why reading is a step of the handler's own.
pub(crate) struct JsonBody<S> {
    bytes: Bytes,
    schema: PhantomData<fn() -> S>,
}

impl<S: JsonSchema, State: Send + Sync> FromRequest<State> for JsonBody<S> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _: &State) -> Result<JsonBody<S>, ApiError> {
        let bytes = read_body(request.into_body(), S::LIMIT).await?;
        Ok(JsonBody {
            bytes,
            schema: PhantomData,
        })
    }
}

impl<S: JsonSchema> JsonBody<S> {
    /// The body read as `S` says; JSON is UTF-8, so a body that is not is refused first.
    pub(crate) fn read(&self) -> Result<S::Value<'_>, ApiError> {
        let json = std::str::from_utf8(&self.bytes).map_err(|e| {
            ApiError::invalid("body", format!("not valid UTF-8, which JSON is: {e}"))
        })?;
        S::read(json)
    }
}

/// A request's whole body, at most `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|e| unread(&e, limit))
}

/// Why a body could not be read: over `limit` (`413`), too slow (`408`), or cut off.
fn unread(e: &axum::Error, limit: usize) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return ApiError::new(
                ErrorCode::PayloadTooLarge,
                "body",
                format!("the body is over {limit} bytes"),
            );
        }
        if let Some(BodyTimedOut { timeout }) = c.downcast_ref::<BodyTimedOut>() {
            return ApiError::new(
                ErrorCode::RequestTimeout,
                "body",
                format!(
                    "the body did not arrive within {timeout:?} (the service's body_read_timeout)"
                ),
            );
        }
        cause = c.source();
    }
    ApiError::invalid("body", "the body could not be read to its end")
}

/// A path's parts; a path that does not decode (percent-encoded bytes that are not UTF-8)
/// is answered like any bad input, as JSON, saying what the parts (`what`) must be.
pub(crate) fn path_parts<T>(
    path: Result<Path<T>, PathRejection>,
    what: &str,
) -> Result<T, ApiError> {
    path.map(|Path(parts)| parts).map_err(|e| {
        ApiError::invalid(
            "path",
            format!(
                "{what} must be UTF-8 text, percent-encoded in the URL: {}",
                e.body_text()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body_timeout::TimedBody;
    use axum::http::StatusCode;
    use std::time::Duration;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR   s3cret",
        ] {
            assert_eq!(
                bearer_token(header.as_bytes()),
                Some(&b"s3cret"[..]),
                "{header}"
            );
        }
        for header in [
            "Bearers3cret",
            "Basic s3cret",
            "Bearer",
            "Bearer   ",
            "Token s3cret",
            "",
        ] {
            assert_eq!(bearer_token(header.as_bytes()), None, "{header}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_body_over_its_limit_or_late_is_answered_by_what_went_wrong() {
        let large = read_body(Body::from("{\"key\": 1}"), 4).await.err();
        assert_eq!(
            large.map(|e| e.status()),
            Some(StatusCode::PAYLOAD_TOO_LARGE)
        );
        let (_sender, stalled) = tokio::sync::mpsc::channel::<Bytes>(1);
        let stalled = futures_util::stream::unfold(stalled, |mut rx| async move {
            rx.recv()
                .await
                .map(|bytes| (Ok::<_, std::io::Error>(bytes), rx))
        });
        let late = Body::new(TimedBody::new(
            Body::from_stream(stalled),
            Some(Duration::ZERO),
        ));
        let late = read_body(late, 1024).await.err();
        assert_eq!(late.map(|e| e.status()), Some(StatusCode::REQUEST_TIMEOUT));
        let fits = read_body(Body::from("{}"), 2).await.ok();
        assert_eq!(fits, Some(Bytes::from_static(b"{}")));
    }
}

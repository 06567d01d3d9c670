//! The proxied address: every request sent upstream once its identity's limiter admits
//! it, the upstream's answer streamed back as it is, and the proxy's own answers when it
//! does not send a request ([`Refusal`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use paceline_client::headers::{self as dialects, Scope};
use paceline_client::{After, ClientError};

use super::state::{ProxyState, Refused};
use super::target;
use crate::error::{ApiError, ErrorCode};

/// The largest request body the proxy keeps in memory so that it can send the request
/// again after a refusal: 1 MiB.
pub const RETRY_BODY_MAX: usize = 1 << 20;

/// Headers that belong to one connection, not to the message (RFC 9110 § 7.6.1), and
/// `host`, which the upstream's URL sets.
fn hop_by_hop(name: &HeaderName, connection: &[String]) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    ) || connection.iter().any(|c| c == name.as_str())
}

/// The headers of a message less its hop-by-hop ones (and those its `Connection` names).
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !hop_by_hop(name, &connection) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Why the proxy answered a request itself instead of sending it upstream: an error in the
/// service's shape (`{"error": {"code", "field", "message"}}`), with extra headers.
pub(super) struct Refusal {
    error: ApiError,
    headers: Vec<(&'static str, String)>,
}

impl Refusal {
    /// The proxy's own answer: an error of `code` at `field`, saying `message`.
    fn own(code: ErrorCode, field: &'static str, message: impl Into<String>) -> Refusal {
        Refusal::from(ApiError::new(code, field, message))
    }

    /// The answer with header `name: value` too.
    fn with_header(mut self, name: &'static str, value: String) -> Refusal {
        self.headers.push((name, value));
        self
    }
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal {
            error,
            headers: Vec::new(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = self.error.into_response();
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, v);
            }
        }
        response
    }
}

/// The answer to a request the limiter refused: `429 rate_limited` with `Retry-After` and
/// `x-paceline-proxy` saying why (`wait-exceeded`, naming `max_wait`; `invalid-budget`,
/// naming `authorization`, whose budget of invalid answers is spent; `closed`, naming
/// `upstream`).
fn refused(state: &ProxyState, e: &ClientError) -> Refusal {
    let (outcome, kind, field, retry_after) = match e {
        ClientError::WaitExceeded {
            max_wait,
            would_wait,
        } => (
            "wait_exceeded",
            "wait-exceeded",
            "max_wait",
            would_wait.unwrap_or(*max_wait),
        ),
        ClientError::InvalidBudget { retry_after } => (
            "invalid_budget",
            "invalid-budget",
            "authorization",
            *retry_after,
        ),
        _ => (
            "upstream_error",
            "closed",
            "upstream",
            Duration::from_secs(1),
        ),
    };
    state.metrics.count(outcome);
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    Refusal::own(ErrorCode::RateLimited, field, e.to_string())
        .with_header("retry-after", seconds.max(1).to_string())
        .with_header("x-paceline-proxy", kind.to_string())
}

/// Any request of the proxied address: sent upstream once the limiter admits it, and the
/// upstream's answer sent back as it is.
pub(super) async fn forward(
    State(state): State<Arc<ProxyState>>,
    request: Request,
) -> Result<Response, Refusal> {
    let (parts, body) = request.into_parts();
    // Before anything else: a path that would leave the base creates no identity and
    // waits for no turn.
    let target = match target::upstream_target(&state.upstream, &parts.uri) {
        Ok(t) => t,
        Err(refusal) => {
            state.metrics.count("bad_request");
            return Err(Refusal::from(ApiError::invalid("path", refusal)));
        }
    };
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let client = match state.client_for(&token, &target.path).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            state.metrics.count("too_many_identities");
            return Err(Refusal::own(
                ErrorCode::StoreFull,
                "authorization",
                "the proxy holds the limits of as many Authorization values as it may \
                 (--max-identities); retry later",
            )
            .with_header("retry-after", "60".to_string()));
        }
        Err(e) => {
            state.metrics.count("bad_request");
            return Err(Refusal::own(ErrorCode::Internal, "dialect", e.message()));
        }
    };
    let route = state.route(parts.method.as_str(), &target.path);
    let headers = end_to_end(&parts.headers);
    // A body small enough to keep is kept, so that a refused request can be sent again.
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
    let mut kept: Option<bytes::Bytes> = None;
    let mut streamed = None;
    if length.is_some_and(|n| n <= RETRY_BODY_MAX) || (length.is_none() && !chunked) {
        match http_body_util::Limited::new(body, RETRY_BODY_MAX)
            .collect()
            .await
        {
            Ok(b) => kept = Some(b.to_bytes()),
            Err(e) => {
                state.metrics.count("bad_request");
                return Err(Refusal::own(
                    ErrorCode::InvalidArgument,
                    "body",
                    e.to_string(),
                ));
            }
        }
    } else {
        streamed = Some(body);
    }
    let asked = client.now_micros();
    let mut permit = match client.acquire_within(route, state.max_wait).await {
        Ok(p) => p,
        Err(e) => return Err(refused(&state, &e)),
    };
    state
        .metrics
        .wait_micros
        .inc_by(client.now_micros().saturating_sub(asked));
    loop {
        let body = match (&kept, streamed.take()) {
            (Some(b), _) => reqwest::Body::from(b.clone()),
            (None, Some(s)) => reqwest::Body::wrap_stream(s.into_data_stream()),
            (None, None) => reqwest::Body::from(bytes::Bytes::new()),
        };
        permit.sent();
        let sending = state
            .http
            .request(parts.method.clone(), target.url.clone())
            .headers(headers.clone())
            .body(body)
            .send();
        let failure = match tokio::time::timeout(state.upstream_timeout, sending).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if e.is_timeout() => Err((ErrorCode::GatewayTimeout, upstream_failure(e))),
            Ok(Err(e)) => Err((ErrorCode::BadGateway, upstream_failure(e))),
            Err(_) => Err((
                ErrorCode::GatewayTimeout,
                format!(
                    "the upstream did not start its answer within {:?}",
                    state.upstream_timeout
                ),
            )),
        };
        let upstream = match failure {
            Ok(r) => r,
            Err((code, message)) => {
                permit.failed();
                state.metrics.count("upstream_error");
                return Err(Refusal::own(code, "upstream", message));
            }
        };
        let status = upstream.status().as_u16();
        // A refusal's small body is read, for the dialects that look into it (Discord's
        // `global`, GitHub's secondary limits), and sent on as it was.
        let (upstream, body) = if matches!(status, 403 | 429) {
            read_small_body(upstream).await
        } else {
            (Buffered::Streaming(upstream), None)
        };
        let mut view = dialects::Response::new(status, upstream.headers());
        if let Some(b) = &body {
            view = view.with_body(b);
        }
        let seen = client.dialect().read(&view, client.now_micros());
        if let Some(r) = seen.refusal {
            let scope = match r.scope {
                Scope::Bucket => "bucket",
                Scope::Shared => "shared",
                Scope::Global => "global",
            };
            state
                .metrics
                .upstream_429
                .get_or_create(&Refused { scope })
                .inc();
        }
        let shared = seen.refusal.is_some_and(|r| r.scope == Scope::Shared);
        if status == 401 || status == 403 || (seen.refusal.is_some() && !shared) {
            state.metrics.invalid.inc();
        }
        match permit.complete_with(status, &seen) {
            After::Retry(waiting) if kept.is_some() => {
                drop((upstream, body));
                state.metrics.retries.inc();
                permit = match waiting.admitted().await {
                    Ok(p) => p,
                    Err(e) => return Err(refused(&state, &e)),
                };
            }
            // A streamed body cannot be sent again: the refusal is the client's.
            _ => {
                state.metrics.count("forwarded");
                return Ok(answer(upstream, body));
            }
        }
    }
}

/// What went wrong sending a request upstream: reqwest's message and its causes, without
/// the URL (which may hold the upstream's credentials) and never the token.
fn upstream_failure(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The largest refusal body the proxy reads to show the dialect: 64 KiB.
const REFUSAL_BODY_MAX: usize = 64 << 10;

/// An upstream answer whose body is still coming, or whose head is kept beside its body.
enum Buffered {
    Streaming(reqwest::Response),
    Read {
        status: reqwest::StatusCode,
        headers: HeaderMap,
    },
}

impl Buffered {
    fn headers(&self) -> &HeaderMap {
        match self {
            Buffered::Streaming(r) => r.headers(),
            Buffered::Read { headers, .. } => headers,
        }
    }
}

/// Reads the body of a refusal if it is announced as at most [`REFUSAL_BODY_MAX`];
/// otherwise leaves it streaming.
async fn read_small_body(upstream: reqwest::Response) -> (Buffered, Option<bytes::Bytes>) {
    let small = upstream
        .content_length()
        .is_some_and(|n| n <= REFUSAL_BODY_MAX as u64);
    if !small {
        return (Buffered::Streaming(upstream), None);
    }
    let status = upstream.status();
    let headers = upstream.headers().clone();
    let body = upstream.bytes().await.unwrap_or_default();
    (Buffered::Read { status, headers }, Some(body))
}

/// The upstream's answer, as it is: its body streamed, or the bytes already read.
fn answer(upstream: Buffered, body: Option<bytes::Bytes>) -> Response {
    let (status, headers, body) = match upstream {
        Buffered::Streaming(r) => (
            r.status(),
            end_to_end(r.headers()),
            Body::from_stream(r.bytes_stream()),
        ),
        Buffered::Read { status, headers } => (
            status,
            end_to_end(&headers),
            Body::from(body.unwrap_or_default()),
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

//! A panic in a handler answers its own request with a `500` problem, and nothing else.
//!
//! Without this layer a panic unwinds through hyper's connection task: the client sees its
//! connection dropped with no reply, and every other request pipelined on that connection
//! is lost with it. With it, the request that panicked is answered
//! `500 {"error": {"code": "internal", "field": "request", ...}}`, the panic is logged at
//! ERROR with the method and the route (the route's pattern, never the raw path, which may
//! carry ids a client chose), and the service goes on serving.
//!
//! The handlers are written so that nothing a client sends can make them panic; this is
//! the net under that promise, not a way to report errors.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use crate::api::ApiError;

/// Runs the rest of the stack, turning a panic into a `500` for this request alone.
pub(crate) async fn catch_panic(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "(no route)".to_string(), |m| m.as_str().to_string());
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(panic) => {
            tracing::error!(
                method = %method,
                route = %route,
                panic = %panic_message(panic.as_ref()),
                "a handler panicked; answered 500 and kept serving"
            );
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "request",
                "the service failed on this request and logged it at ERROR; it goes on serving other requests",
            )
            .into_response()
        }
    }
}

/// A panic's message, when it carries one as text.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

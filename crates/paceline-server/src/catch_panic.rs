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
//! the net under that promise, not a way to report errors. It costs a request no
//! allocation: the handler's future is polled in place inside [`Answer`].

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use futures_util::future::CatchUnwind;
use futures_util::FutureExt;

use crate::error::{ApiError, ErrorCode};

/// The layer: wraps each route's service in a [`CatchPanic`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CatchPanicLayer;

impl<S> tower::Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic { inner }
    }
}

/// A route's service whose panics answer `500` (see the [module docs](self)).
#[derive(Clone, Debug)]
pub(crate) struct CatchPanic<S> {
    inner: S,
}

impl<S, E> tower::Service<Request> for CatchPanic<S>
where
    S: tower::Service<Request, Response = Response, Error = E>,
{
    type Response = Response;
    type Error = E;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Answer<S::Future> {
        let method = request.method().clone();
        let route = request.extensions().get::<MatchedPath>().cloned();
        Answer {
            inner: AssertUnwindSafe(self.inner.call(request)).catch_unwind(),
            method,
            route,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer: the handler's, or a `500` if it panicked.
    pub(crate) struct Answer<F> {
        #[pin]
        inner: CatchUnwind<AssertUnwindSafe<F>>,
        method: Method,
        route: Option<MatchedPath>,
    }
}

impl<F, E> Future for Answer<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match ready!(this.inner.poll(cx)) {
            Ok(answer) => Poll::Ready(answer),
            Err(panic) => Poll::Ready(Ok(internal(this.method, this.route.as_ref(), &*panic))),
        }
    }
}

/// Logs a handler's panic and answers its request.
fn internal(method: &Method, route: Option<&MatchedPath>, panic: &(dyn Any + Send)) -> Response {
    tracing::error!(
        method = %method,
        route = route.map_or("(no route)", MatchedPath::as_str),
        panic = panic_message(panic),
        "a handler panicked; answered 500 and kept serving"
    );
    ApiError::new(
        ErrorCode::Internal,
        "request",
        "the service failed on this request and logged it at ERROR; it goes on serving other requests",
    )
    .into_response()
}

/// A panic's message, when it carries one as text.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tower::ServiceExt;

    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_handler_answers_500_and_the_router_goes_on() {
        async fn boom() -> &'static str {
            panic!("a bug reached by a request")
        }
        let app = axum::Router::new()
            .route("/boom/{id}", get(boom))
            .route("/fine", get(|| async { "fine" }))
            .layer(CatchPanicLayer);
        let request = |path: &str| {
            Request::builder()
                .uri(path)
                .body(axum::body::Body::empty())
                .expect("a request")
        };
        let answer = app
            .clone()
            .oneshot(request("/boom/7"))
            .await
            .expect("an answer");
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .expect("a body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["error"]["code"], "internal");
        assert_eq!(body["error"]["field"], "request");
        let fine = app.oneshot(request("/fine")).await.expect("an answer");
        assert_eq!(fine.status(), StatusCode::OK);
    }
}

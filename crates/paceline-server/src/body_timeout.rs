//! The body read timeout, as a layer: a request's body must arrive within the service's
//! `body_read_timeout` once the handler starts reading it, so that a client that stops
//! mid-body cannot hold its connection (the header read and idle timeouts are the
//! connection's: see `conn`).
//!
//! The layer wraps each request's body in a [`TimedBody`]. A body that has already arrived
//! with the request's head is read without arming a timer (a clock read, and an entry in
//! the timer wheel put in and taken out); the timer starts the first time the body has to
//! wait for bytes, and covers the rest of it. When it fires the body fails with
//! [`BodyTimedOut`], which the reader of the body answers `408 request_timeout`
//! ([`crate::extract`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::Request;
use axum::BoxError;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

/// Bounds the time a request's body may take to arrive, once its reading has to wait
/// (`None`: no bound, as the proxy's connections have).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyTimeoutLayer {
    timeout: Option<Duration>,
}

impl BodyTimeoutLayer {
    /// A layer bounding each body's arrival by `timeout`.
    pub(crate) fn new(timeout: Option<Duration>) -> BodyTimeoutLayer {
        BodyTimeoutLayer { timeout }
    }
}

impl<S> tower::Layer<S> for BodyTimeoutLayer {
    type Service = BodyTimeout<S>;

    fn layer(&self, inner: S) -> BodyTimeout<S> {
        BodyTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service of a [`BodyTimeoutLayer`]: hands `inner` each request with its body in a
/// [`TimedBody`]. It sits in front of the router, on the connection, so that the body is
/// wrapped before the router boxes it: one allocation per request, as without it.
#[derive(Clone, Debug)]
pub(crate) struct BodyTimeout<S> {
    inner: S,
    timeout: Option<Duration>,
}

impl<S, B> tower::Service<Request<B>> for BodyTimeout<S>
where
    S: tower::Service<Request<TimedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let timeout = self.timeout;
        self.inner
            .call(request.map(|body| TimedBody::new(body, timeout)))
    }
}

/// Why a body failed: it did not arrive within `timeout`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyTimedOut {
    pub(crate) timeout: Duration,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body did not arrive within {:?}", self.timeout)
    }
}

impl std::error::Error for BodyTimedOut {}

pin_project_lite::pin_project! {
    /// A body that fails with [`BodyTimedOut`] when it has waited `timeout` since the
    /// first time it had to wait for bytes; the timer is armed only then.
    pub(crate) struct TimedBody<B> {
        #[pin]
        inner: B,
        timeout: Option<Duration>,
        #[pin]
        deadline: Option<Sleep>,
    }
}

impl<B> TimedBody<B> {
    /// `inner`, bounded by `timeout` (`None`: unbounded).
    pub(crate) fn new(inner: B, timeout: Option<Duration>) -> TimedBody<B> {
        TimedBody {
            inner,
            timeout,
            deadline: None,
        }
    }
}

impl<B> http_body::Body for TimedBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(axum::Error::new)));
        }
        let Some(timeout) = *this.timeout else {
            return Poll::Pending;
        };
        if this.deadline.is_none() {
            this.deadline.set(Some(tokio::time::sleep(timeout)));
        }
        match this.deadline.as_pin_mut().map(|deadline| deadline.poll(cx)) {
            Some(Poll::Ready(())) => {
                Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut { timeout }))))
            }
            _ => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;

    /// A body whose bytes never come.
    struct Stalled;

    impl http_body::Body for Stalled {
        type Data = Bytes;
        type Error = axum::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_body_that_came_is_read_and_one_that_stopped_coming_fails() {
        // A timeout of zero: a body already there needs no time at all.
        let whole = TimedBody::new(Body::from("{}"), Some(Duration::ZERO));
        let read = whole.collect().await.map(|b| b.to_bytes());
        assert_eq!(read.ok(), Some(Bytes::from_static(b"{}")));

        let stalled = TimedBody::new(Body::new(Stalled), Some(Duration::ZERO));
        let error = stalled.collect().await.err();
        let timed_out = error
            .as_ref()
            .and_then(|e| std::error::Error::source(e))
            .and_then(|e| e.downcast_ref::<BodyTimedOut>());
        assert_eq!(timed_out.map(|t| t.timeout), Some(Duration::ZERO));
    }
}

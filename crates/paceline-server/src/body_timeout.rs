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

use axum::body::{Body, Bytes};
use axum::extract::Request;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

/// The layer: gives every request's body `timeout` to arrive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyTimeoutLayer {
    timeout: Duration,
}

impl BodyTimeoutLayer {
    /// Bodies must arrive within `timeout` once their reading has to wait.
    pub(crate) fn new(timeout: Duration) -> BodyTimeoutLayer {
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

/// A route's service whose requests' bodies are [`TimedBody`]s.
#[derive(Clone, Debug)]
pub(crate) struct BodyTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S> tower::Service<Request> for BodyTimeout<S>
where
    S: tower::Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> S::Future {
        let timeout = self.timeout;
        self.inner.call(request.map(|body| {
            // A request without a body (most GETs) has nothing to wait for.
            if http_body::Body::is_end_stream(&body) {
                body
            } else {
                Body::new(TimedBody::new(body, timeout))
            }
        }))
    }
}

/// The error of a body that did not arrive in time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyTimedOut {
    /// The timeout it did not meet.
    pub(crate) timeout: Duration,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body did not arrive within {:?}", self.timeout)
    }
}

impl std::error::Error for BodyTimedOut {}

pin_project_lite::pin_project! {
    /// A body that fails with [`BodyTimedOut`] if, once it has had to wait for bytes, it
    /// does not end within its timeout.
    pub(crate) struct TimedBody {
        #[pin]
        inner: Body,
        timeout: Duration,
        // Armed the first time the body waits.
        #[pin]
        deadline: Option<Sleep>,
    }
}

impl TimedBody {
    pub(crate) fn new(inner: Body, timeout: Duration) -> TimedBody {
        TimedBody {
            inner,
            timeout,
            deadline: None,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.is_none() {
            this.deadline.set(Some(tokio::time::sleep(*this.timeout)));
        }
        match this.deadline.as_pin_mut().map(|deadline| deadline.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut {
                timeout: *this.timeout,
            })))),
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
        let whole = TimedBody::new(Body::from("{}"), Duration::ZERO);
        let read = whole.collect().await.map(|b| b.to_bytes());
        assert_eq!(read.ok(), Some(Bytes::from_static(b"{}")));

        let stalled = TimedBody::new(Body::new(Stalled), Duration::ZERO);
        let error = stalled.collect().await.err();
        let timed_out = error
            .as_ref()
            .and_then(|e| std::error::Error::source(e))
            .and_then(|e| e.downcast_ref::<BodyTimedOut>());
        assert_eq!(timed_out.map(|t| t.timeout), Some(Duration::ZERO));
    }
}

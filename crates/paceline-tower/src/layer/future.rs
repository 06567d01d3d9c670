//! The future of a [`RateLimit`] call: the inner service's future with the headers and the
//! leases added, an answer of the layer's own ready at once, or a boxed future of the
//! layer's when the decision waits on the store.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::body::{Bodies, LimitedBody};
use super::decision::LeaseGuard;
use super::Limited;
#[cfg(doc)]
use super::RateLimit;
use crate::headers;

/// What a [`RateLimit`] call answers.
type Answer<R, E> = Result<http::Response<LimitedBody<R>>, E>;

pin_project! {
    /// The future of a [`RateLimit`] call: `F` is the inner service's (this future is
    /// `Unpin` when `F` is).
    ///
    /// On a store that answers in place (the memory store, [`Store::as_sync`]) the limits
    /// are decided in `call` itself, as tower services may: the request counts from `call`,
    /// even if its future is dropped unpolled. An admitted request's future is then the
    /// inner service's, with the headers added to its answer, and a refusal is ready at
    /// once. A store across the network (or one behind a cache of refusals), an admission
    /// with a delay, a refusal in pace mode and a failed store are answered by a boxed
    /// future of the layer's.
    ///
    /// [`Store::as_sync`]: paceline_store::Store::as_sync
    pub struct ResponseFuture<F, R, E, M = Limited> {
        #[pin]
        state: Pending<F, R, E>,
        bodies: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = PendingProj]
    pub(super) enum Pending<F, R, E> {
        // Admitted: the inner service's answer, then the headers and the leases.
        Admitted {
            #[pin]
            inner: F,
            // `RateLimit-Policy` and `RateLimit`, unless the layer sends no headers.
            fields: (Option<http::HeaderValue>, Option<http::HeaderValue>),
            guard: Option<LeaseGuard>,
        },
        // An answer of the layer's own (a refusal, a problem), ready.
        Ready { response: Option<http::Response<LimitedBody<R>>> },
        // Decided later.
        Later { future: Pin<Box<dyn Future<Output = Answer<R, E>> + Send>> },
    }
}

impl<F, R, E, M> ResponseFuture<F, R, E, M> {
    pub(super) fn new(state: Pending<F, R, E>) -> ResponseFuture<F, R, E, M> {
        ResponseFuture {
            state,
            bodies: PhantomData,
        }
    }

    pub(super) fn ready(response: http::Response<LimitedBody<R>>) -> ResponseFuture<F, R, E, M> {
        ResponseFuture::new(Pending::Ready {
            response: Some(response),
        })
    }
}

impl<F, R, E, M> Future for ResponseFuture<F, R, E, M>
where
    F: Future<Output = Result<http::Response<R>, E>>,
    M: Bodies<R>,
{
    type Output = Result<http::Response<M::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Each answer's body made once, as `M` says.
        let limited = |response: http::Response<LimitedBody<R>>| response.map(M::body);
        match self.project().state.project() {
            PendingProj::Admitted {
                inner,
                fields,
                guard,
            } => {
                let mut response = match inner.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    Poll::Ready(Err(e)) => {
                        // The leases go back now, not when the future is dropped.
                        drop(guard.take());
                        return Poll::Ready(Err(e));
                    }
                    Poll::Pending => return Poll::Pending,
                };
                if let Some(policy) = fields.0.take() {
                    response
                        .headers_mut()
                        .insert(headers::RATELIMIT_POLICY, policy);
                }
                if let Some(state) = fields.1.take() {
                    response.headers_mut().insert(headers::RATELIMIT, state);
                }
                let guard = guard.take();
                Poll::Ready(Ok(
                    response.map(|body| M::body(LimitedBody::inner(body, guard)))
                ))
            }
            // Polled again after its answer: nothing more comes.
            PendingProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(limited(response))),
                None => Poll::Pending,
            },
            PendingProj::Later { future } => future.as_mut().poll(cx).map_ok(limited),
        }
    }
}

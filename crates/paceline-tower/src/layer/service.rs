//! The service a [`RateLimitLayer`] makes: [`RateLimit`], which decides every request (in
//! `call` itself on a store that answers in place) before the inner service sees it.

use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::body::Bodies;
use super::decision::{answer, Decided, Keys};
use super::future::{Pending, ResponseFuture};
#[cfg(doc)]
use super::RateLimitLayer;
use super::{Limited, Shared};
use crate::key::Head;

/// The service a [`RateLimitLayer`] makes: decides, then calls the inner service.
#[derive(Clone)]
pub struct RateLimit<S, M = Limited> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
    pub(super) bodies: PhantomData<fn() -> M>,
}

impl<S, M> std::fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RateLimit")
    }
}

impl<S, B, R, M> Service<http::Request<B>> for RateLimit<S, M>
where
    M: Bodies<R>,
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R, S::Error, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let shared = &self.shared;
        let keys = match shared.store_keys(&Head::of(&request)) {
            Ok(keys) => keys,
            Err(problem) => return ResponseFuture::ready(answer(&problem)),
        };
        // A store that answers in place decides here: no future of the layer's own.
        let mut first = None;
        if let Some(store) = shared.store.as_sync() {
            let op = shared.op();
            let outcome = match (shared.limits.as_slice(), &keys.keys) {
                // One limit (the common case): its decision alone, no set to build.
                ([limit], Keys::One(key)) => store
                    .decide_sync(
                        shared.policy(0, &keys).unwrap_or(&limit.policy),
                        key.as_str(),
                        op,
                        1,
                    )
                    .map(Decided::One),
                _ => store
                    .decide_all_sync(&shared.requests(&keys, op))
                    .map(Decided::Set),
            };
            match outcome {
                Ok(decided) if decided.allowed() && decided.combined().delay.is_zero() => {
                    let guard = shared.guard(decided.limits(), &keys);
                    let fields = shared.admitted_fields(decided.limits(), &keys);
                    return ResponseFuture::new(Pending::Admitted {
                        inner: self.inner.call(request),
                        fields,
                        guard,
                    });
                }
                Ok(decided) if !decided.allowed() && shared.pace.is_none() => {
                    return ResponseFuture::ready(shared.refusal(&decided.into_set(), &keys));
                }
                // Admitted after a wait: its leases held from now (a future dropped before
                // its first poll gives them back).
                Ok(decided) if decided.allowed() => {
                    let guard = shared.guard(decided.limits(), &keys);
                    first = Some((Ok(decided.into_set()), guard));
                }
                // A refusal in pace mode (beyond `max_wait`, or to wait and ask again), or a
                // failed store: answered below, from this outcome.
                outcome => first = Some((outcome.map(Decided::into_set), None)),
            }
        }
        // The service that was polled ready goes with this call; a fresh clone stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(shared);
        ResponseFuture::new(Pending::Later {
            future: Box::pin(async move { Shared::run(shared, inner, request, keys, first).await }),
        })
    }
}

//! The bodies of a layer's answers: [`LimitedBody`] (the inner service's body holding the
//! request's leases until it ends, or the layer's own answer), and how [`Bodies`] hands it
//! to the caller, as it is ([`Limited`]) or as axum's own body (`AxumBody`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::decision::LeaseGuard;
#[cfg(doc)]
use super::RateLimitLayer;

/// How a layer's answers carry their bodies: [`Limited`] (the default, for any service) or
/// `AxumBody` (for axum: `RateLimitLayer::for_axum`, feature `axum`). The trait is sealed:
/// those two are its only implementations.
pub trait Bodies<R>: sealed::Sealed {
    /// The body of the layer's answers.
    type Body;

    /// An answer's body, from the layer's [`LimitedBody`].
    fn body(body: LimitedBody<R>) -> Self::Body;
}

mod sealed {
    pub trait Sealed {}
}

/// Answers whose body is a [`LimitedBody`]: the inner service's body (holding the
/// request's places in flight until it ends), or the layer's own answer. Fits any service.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limited;

impl sealed::Sealed for Limited {}

impl<R> Bodies<R> for Limited {
    type Body = LimitedBody<R>;

    fn body(body: LimitedBody<R>) -> LimitedBody<R> {
        body
    }
}

/// Answers in axum's own body type, `axum::body::Body` ([`RateLimitLayer::for_axum`]): the
/// inner service's body as it is, unless it holds a place in flight (then wrapped in a
/// [`LimitedBody`], boxed), or the layer's own answer.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AxumBody;

#[cfg(feature = "axum")]
impl sealed::Sealed for AxumBody {}

#[cfg(feature = "axum")]
impl Bodies<axum::body::Body> for AxumBody {
    type Body = axum::body::Body;

    fn body(body: LimitedBody<axum::body::Body>) -> axum::body::Body {
        match body.kind {
            Kind::Inner { body, guard: None } => body,
            Kind::Answer { bytes } => axum::body::Body::from(bytes.unwrap_or_default()),
            held => axum::body::Body::new(LimitedBody { kind: held }),
        }
    }
}

pin_project! {
    /// A response body through the layer: the inner service's (holding the request's
    /// leases until it ends), or the layer's own answer.
    pub struct LimitedBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = Projected]
    enum Kind<B> {
        // The inner service's body, and the request's leases.
        Inner {
            #[pin]
            body: B,
            guard: Option<LeaseGuard>,
        },
        // The layer's answer (a refusal, or a problem).
        Answer { bytes: Option<Bytes> },
    }
}

impl<B> LimitedBody<B> {
    pub(super) fn inner(body: B, guard: Option<LeaseGuard>) -> LimitedBody<B> {
        LimitedBody {
            kind: Kind::Inner { body, guard },
        }
    }

    pub(super) fn answer(bytes: Bytes) -> LimitedBody<B> {
        LimitedBody {
            kind: Kind::Answer { bytes: Some(bytes) },
        }
    }
}

impl<B> std::fmt::Debug for LimitedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { guard, .. } => f
                .debug_struct("LimitedBody")
                .field("leases", &guard.as_ref().map_or(0, |g| g.leases.len()))
                .finish(),
            Kind::Answer { .. } => f.write_str("LimitedBody(answer)"),
        }
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            Projected::Inner { body, guard } => {
                let frame = body.poll_frame(cx);
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    // The body ended (or failed): the request is over.
                    guard.take();
                }
                frame
            }
            Projected::Answer { bytes } => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Answer { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Answer { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

//! The client limiter as a tower [`Layer`] for `http` clients (feature `tower`): hyper's
//! client, or any `tower::Service<http::Request<B>, Response = http::Response<R>>`.
//!
//! Each request waits for its turn, is sent through the inner service, and its response
//! (status and headers) teaches the limiter. A refusal comes back to the caller as the
//! upstream sent it (the limiter has paused what it names, so a retry, e.g. with tower's
//! retry layer, waits its turn); a request that would wait longer than `max_wait`, or
//! that the invalid-request budget refuses, fails with the [`ClientError`].
//!
//! Hooks: [`LimitedLayer::on_rate_limited`] hears of every request a limit holds back or
//! the upstream refuses ([`RateLimited`]). A request whose extensions hold
//! [`RequestOptions`] is admitted as they say (one that gives up fails at once with
//! [`ClientError::RateLimited`] instead of waiting); [`LimitedLayer::give_up`] makes that
//! every request's choice.
//!
//! The response's body is the caller's and is not read: a refusal said only in its body
//! (GitHub's secondary limits without `Retry-After`) is seen as a plain 403. Where that
//! matters, read the body and call [`Permit::complete`](crate::Permit::complete) with it,
//! or go through `paceline proxy`, which reads a refusal's small body.
//!
//! ```
//! use paceline_client::headers::Discord;
//! use paceline_client::layer::LimitedLayer;
//! use paceline_client::{Client, ClientConfig};
//! use tower::{Layer, Service, ServiceExt};
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Any service of http requests: here one that answers 200 at once.
//! let upstream = tower::service_fn(|_: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! let limits = Client::new(ClientConfig::discord(), Discord);
//! let mut service = LimitedLayer::discord(limits).layer(upstream);
//! let request = http::Request::post("https://discord.com/api/v10/channels/1/messages")
//!     .body(String::from("{}"))?;
//! let response = service.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service, ServiceExt};

use crate::client::Client;
use crate::error::ClientError;
use crate::hooks::{RateLimited, RequestOptions};
use crate::route::Route;

type Router = fn(&str, &str) -> Route;

/// Builds [`Limited`] services: one [`Client`] (one identity) and how requests map to
/// routes.
#[derive(Clone, Debug)]
pub struct LimitedLayer {
    client: Client,
    router: Router,
    max_wait: Option<Duration>,
    give_up: bool,
}

impl LimitedLayer {
    /// For Discord's API: routes by [`Route::discord`].
    pub fn discord(client: Client) -> LimitedLayer {
        LimitedLayer {
            client,
            router: Route::discord,
            max_wait: None,
            give_up: false,
        }
    }

    /// For any API: routes by [`Route::generic`].
    pub fn generic(client: Client) -> LimitedLayer {
        LimitedLayer {
            client,
            router: Route::generic,
            max_wait: None,
            give_up: false,
        }
    }

    /// The same layer failing requests that would wait longer than `max_wait`.
    pub fn max_wait(mut self, max_wait: Duration) -> LimitedLayer {
        self.max_wait = Some(max_wait);
        self
    }

    /// The same layer failing every request that a limit would hold back, with
    /// [`ClientError::RateLimited`], instead of waiting (a request's own
    /// [`RequestOptions`] extension says otherwise for it).
    pub fn give_up(mut self) -> LimitedLayer {
        self.give_up = true;
        self
    }

    /// The same layer, with `hook` told of every [`RateLimited`] event of its client
    /// ([`Client::on_rate_limited`]).
    ///
    /// ```
    /// use paceline_client::headers::Discord;
    /// use paceline_client::layer::LimitedLayer;
    /// use paceline_client::{Client, ClientConfig};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limited = Arc::new(AtomicU64::new(0));
    /// let count = Arc::clone(&limited);
    /// let layer = LimitedLayer::discord(Client::new(ClientConfig::discord(), Discord))
    ///     .on_rate_limited(move |_| {
    ///         count.fetch_add(1, Ordering::Relaxed);
    ///     });
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn on_rate_limited(
        self,
        hook: impl Fn(&RateLimited) + Send + Sync + 'static,
    ) -> LimitedLayer {
        self.client.on_rate_limited(hook);
        self
    }
}

impl<S> Layer<S> for LimitedLayer {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Limited<S> {
        Limited {
            inner,
            layer: self.clone(),
        }
    }
}

/// An http client service whose requests wait for the limiter (see the [module](self)).
#[derive(Clone, Debug)]
pub struct Limited<S> {
    inner: S,
    layer: LimitedLayer,
}

/// What a [`Limited`] service fails with: the limiter's refusal, or the inner service's
/// error.
#[derive(Debug, thiserror::Error)]
pub enum LimitedError<E> {
    /// The limiter will not send the request.
    #[error(transparent)]
    Limiter(ClientError),
    /// The inner service failed (the request's slot was released).
    #[error(transparent)]
    Inner(E),
}

impl<S, B, R> Service<http::Request<B>> for Limited<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = LimitedError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    /// Always ready: the inner service is made ready once the limiter admits the request,
    /// so that a capacity-limited inner service (a concurrency limit, a buffer) is not held
    /// through the wait.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        let layer = self.layer.clone();
        Box::pin(async move {
            let route = (layer.router)(request.method().as_str(), request.uri().path());
            let options = match request.extensions().get::<RequestOptions>() {
                Some(own) => *own,
                None => RequestOptions {
                    max_wait: layer.max_wait,
                    give_up: layer.give_up,
                },
            };
            let mut permit = layer
                .client
                .acquire_with(route, options)
                .await
                .map_err(LimitedError::Limiter)?;
            let ready = match inner.ready().await {
                Ok(ready) => ready,
                Err(e) => {
                    // Never sent: what the permit took goes back when it is dropped.
                    drop(permit);
                    return Err(LimitedError::Inner(e));
                }
            };
            permit.sent();
            match ready.call(request).await {
                Ok(response) => {
                    // A refusal's retry is the caller's: dropping the returned wait gives
                    // its place back.
                    let _ = permit.complete(response.status().as_u16(), response.headers(), None);
                    Ok(response)
                }
                Err(e) => {
                    permit.failed();
                    Err(LimitedError::Inner(e))
                }
            }
        })
    }
}

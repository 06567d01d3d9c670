//! The client limiters as `reqwest-middleware` middlewares (feature `reqwest`).
//!
//! One adapter, [`Gated`], sends every request through a [`Gate`]: the gate admits the
//! request (waiting for its turn), the request is sent, and its response goes back to the
//! gate, which may send it again after a refusal it waited out (when reqwest can clone the
//! request: a streamed body is sent once, and its refusal is the caller's). Two gates come
//! with it:
//!
//! * [`Limited`] (= `Gated<Learned>`): the API client limiter, whose limits are learned from
//!   response headers ([`Client`]). A request that would wait longer than `max_wait`, or
//!   that the invalid-request budget refuses, fails with the [`ClientError`].
//! * [`Paced`]: an outbound pacer: every request to a host (or a key of the caller's)
//!   reserves a slot of a paceline policy, on any store, and is sent when its slot comes.
//!   Processes sharing a Redis store pace their requests together.
//!
//! Hooks: [`Limited::on_rate_limited`](Gated::on_rate_limited) hears of every request a
//! limit holds back or the upstream refuses ([`RateLimited`]). A
//! request carrying [`RequestOptions`] as an extension
//! (`.with_extension(RequestOptions::new().give_up())`) is admitted as they say: one that
//! gives up fails at once with [`ClientError::RateLimited`] instead of waiting, and an
//! upstream's refusal is its answer rather than waited out;
//! [`Limited::give_up`](Gated::give_up) makes that every request's choice.
//!
//! ```no_run
//! use paceline_client::headers::Discord;
//! use paceline_client::middleware::Limited;
//! use paceline_client::{Client, ClientConfig, RequestOptions};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Client::new(ClientConfig::discord(), Discord);
//! let middleware = Limited::discord(limits).on_rate_limited(|event| {
//!     eprintln!("{} {:?} for {:?}", event.route.key(), event.scope, event.wait);
//! });
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(middleware)
//!     .build();
//! let response = http
//!     .get("https://discord.com/api/v10/channels/1/pins")
//!     .with_extension(RequestOptions::new().give_up())
//!     .send()
//!     .await?;
//! # let _ = response;
//! # Ok(()) }
//! ```
//!
//! The response's body is the caller's and is not read: a refusal said only in its body
//! (GitHub's secondary limits without `Retry-After`) is seen as a plain 403. Where that
//! matters, read the body and call [`Permit::complete`](crate::Permit::complete) with it,
//! or go through `paceline proxy`, which reads a refusal's small body.
//!
//! ```no_run
//! use paceline_client::headers::Discord;
//! use paceline_client::middleware::Limited;
//! use paceline_client::{Client, ClientConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Client::new(ClientConfig::discord(), Discord);
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(Limited::discord(limits))
//!     .build();
//! let response = http
//!     .patch("https://discord.com/api/v10/guilds/1/members/2")
//!     .header("authorization", "Bot TOKEN")
//!     .send()
//!     .await?;
//! println!("{}", response.status());
//! # Ok(()) }
//! ```
//!
//! Pacing every host at 10 requests per second, in this process:
//!
//! ```no_run
//! use paceline_client::middleware::Paced;
//! use paceline_store::MemoryStore;
//! use std::sync::Arc;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pacer = Paced::per_host("gcra:rate=10/s".parse()?, Arc::new(MemoryStore::new()))?;
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(pacer)
//!     .build();
//! let response = http.get("https://api.example.com/items").send().await?;
//! # let _ = response;
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap};
use paceline_store::{InputError, Limiter, Policy, SharedStore, Store};
use reqwest_middleware::{Middleware, Next};

use crate::client::{After, Client, Permit};
use crate::error::ClientError;
use crate::hooks::{RateLimited, RequestOptions};
use crate::route::Route;

/// Where a request goes, as a [`Gate`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The method, e.g. `PATCH`.
    pub method: &'a str,
    /// The URL's host (empty if it has none).
    pub host: &'a str,
    /// The URL's path.
    pub path: &'a str,
    /// The request's extensions (e.g. its [`RequestOptions`]).
    pub extensions: &'a Extensions,
}

/// What an adapter asks before it sends a request: the seam every client adapter shares.
#[async_trait::async_trait]
pub trait Gate: Send + Sync + 'static {
    /// What an admitted request holds while it is sent.
    type Ticket: Ticket;
    /// Why a request is not sent.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Waits for the turn of a request to `target`.
    async fn admit(&self, target: Target<'_>) -> Result<Self::Ticket, Self::Error>;
}

/// What an admitted request holds: told when the request is sent and how it ended.
#[async_trait::async_trait]
pub trait Ticket: Send + Sized + 'static {
    /// Why a request refused by its server is not sent again.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The request is being sent.
    fn sent(&mut self) {}

    /// The request got no response (a transport error).
    fn failed(self) {}

    /// The request's response: `None` when it is the caller's, or the ticket of its new
    /// turn to be sent again (only when `again` says the request can be sent again).
    async fn complete(
        self,
        status: u16,
        headers: &HeaderMap,
        again: bool,
    ) -> Result<Option<Self>, Self::Error>;
}

/// A `reqwest-middleware` middleware sending every request through a [`Gate`].
#[derive(Clone, Debug)]
pub struct Gated<G> {
    gate: G,
}

impl<G: Gate> Gated<G> {
    /// The middleware of `gate`.
    pub fn new(gate: G) -> Gated<G> {
        Gated { gate }
    }

    /// The gate.
    pub fn gate(&self) -> &G {
        &self.gate
    }
}

#[async_trait::async_trait]
impl<G: Gate> Middleware for Gated<G> {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let url = request.url();
        let target = Target {
            method: request.method().as_str(),
            host: url.host_str().unwrap_or_default(),
            path: url.path(),
            extensions,
        };
        let mut ticket = self
            .gate
            .admit(target)
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let mut request = request;
        loop {
            let copy = request.try_clone();
            ticket.sent();
            let response = match next.clone().run(request, extensions).await {
                Ok(r) => r,
                Err(e) => {
                    ticket.failed();
                    return Err(e);
                }
            };
            let again = ticket
                .complete(
                    response.status().as_u16(),
                    response.headers(),
                    copy.is_some(),
                )
                .await
                .map_err(reqwest_middleware::Error::middleware)?;
            match (again, copy) {
                (Some(turn), Some(copy)) => {
                    ticket = turn;
                    request = copy;
                }
                _ => return Ok(response),
            }
        }
    }
}

/// How a request maps to its route.
type Router = fn(&str, &str) -> Route;

/// The [`Gate`] of the API client limiter: one [`Client`] (one identity), how requests map
/// to routes, and how long a request may wait.
#[derive(Clone, Debug)]
pub struct Learned {
    client: Client,
    router: Router,
    max_wait: Option<Duration>,
    give_up: bool,
}

/// The API client limiter as a middleware (see the [module](self)).
pub type Limited = Gated<Learned>;

impl Gated<Learned> {
    /// For Discord's API: routes by [`Route::discord`].
    pub fn discord(client: Client) -> Limited {
        Gated::new(Learned {
            client,
            router: Route::discord,
            max_wait: None,
            give_up: false,
        })
    }

    /// For any API: routes by [`Route::generic`].
    pub fn generic(client: Client) -> Limited {
        Gated::new(Learned {
            client,
            router: Route::generic,
            max_wait: None,
            give_up: false,
        })
    }

    /// The same middleware failing requests that would wait longer than `max_wait`.
    pub fn max_wait(mut self, max_wait: Duration) -> Limited {
        self.gate.max_wait = Some(max_wait);
        self
    }

    /// The same middleware failing every request that a limit would hold back, with
    /// [`ClientError::RateLimited`], instead of waiting (a request's own
    /// [`RequestOptions`] extension says otherwise for it).
    pub fn give_up(mut self) -> Limited {
        self.gate.give_up = true;
        self
    }

    /// The same middleware, with `hook` told of every [`RateLimited`] event of its client
    /// ([`Client::on_rate_limited`]).
    pub fn on_rate_limited(self, hook: impl Fn(&RateLimited) + Send + Sync + 'static) -> Limited {
        self.gate.client.on_rate_limited(hook);
        self
    }
}

#[async_trait::async_trait]
impl Gate for Learned {
    type Ticket = Permit;
    type Error = ClientError;

    async fn admit(&self, target: Target<'_>) -> Result<Permit, ClientError> {
        let route = (self.router)(target.method, target.path);
        let options = match target.extensions.get::<RequestOptions>() {
            Some(own) => *own,
            None => RequestOptions {
                max_wait: self.max_wait,
                give_up: self.give_up,
            },
        };
        self.client.acquire_with(route, options).await
    }
}

#[async_trait::async_trait]
impl Ticket for Permit {
    type Error = ClientError;

    fn sent(&mut self) {
        Permit::sent(self);
    }

    fn failed(self) {
        Permit::failed(self);
    }

    async fn complete(
        self,
        status: u16,
        headers: &HeaderMap,
        again: bool,
    ) -> Result<Option<Permit>, ClientError> {
        match Permit::complete(self, status, headers, None) {
            // Waited out in its queue: admitted again when its turn comes.
            After::Retry(waiting) if again => waiting.admitted().await.map(Some),
            // A refusal whose request cannot be sent again: dropping the wait gives its
            // place back.
            _ => Ok(None),
        }
    }
}

type KeyFn = dyn Fn(&Target<'_>) -> String + Send + Sync;

/// An outbound pacer ([`Gate`]): every request reserves the next slot of a paceline policy
/// for its key (its host, unless [`key`](Gated::key) says otherwise) in a store, waits
/// until the slot (in the store's time), and is sent. With a Redis store, every process
/// pacing the same keys holds the policy's rate together. A request that would wait longer
/// than [`max_wait`](Gated::max_wait) fails with [`PaceError::WaitExceeded`], reserving
/// nothing. A request dropped while it waits (or whose sending fails) leaves its slot
/// unused: later requests are still paced around it; without a `max_wait`, waits have no
/// bound.
#[derive(Clone)]
pub struct Paced {
    /// The policy and the store, whose `acquire` and `try_acquire` pace each request.
    limiter: Limiter<dyn Store>,
    key: Arc<KeyFn>,
    max_wait: Option<Duration>,
}

impl std::fmt::Debug for Paced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("policy", &self.limiter.policy().to_string())
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl Paced {
    /// Paces each host by `policy`, in `store`; the middleware of it. Its keys in the
    /// store are `paced:HOST` (or `paced:` and what [`key`](Gated::key) gives).
    ///
    /// Errors: a `concurrency` policy, which counts requests in flight and cannot reserve
    /// a slot (naming `policy`).
    pub fn per_host(policy: Policy, store: SharedStore) -> Result<Gated<Paced>, InputError> {
        if let Policy::Concurrency(_) = policy {
            return Err(InputError::new(
                "policy",
                "a concurrency policy cannot pace (it reserves no slot); pace with a rate \
                 such as gcra:rate=10/s, and cap requests in flight on the server's side",
            ));
        }
        Ok(Gated::new(Paced {
            limiter: Limiter::with_store(policy, store),
            key: Arc::new(|target| target.host.to_string()),
            max_wait: None,
        }))
    }
}

impl Gated<Paced> {
    /// Paces by the key `key` gives each request instead of its host (e.g. the host and
    /// the method, or a path prefix).
    pub fn key<F>(mut self, key: F) -> Gated<Paced>
    where
        F: Fn(&Target<'_>) -> String + Send + Sync + 'static,
    {
        self.gate.key = Arc::new(key);
        self
    }

    /// Fails requests whose slot is more than `max_wait` away, reserving nothing for them.
    pub fn max_wait(mut self, max_wait: Duration) -> Gated<Paced> {
        self.gate.max_wait = Some(max_wait);
        self
    }
}

/// Why the pacer did not send a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PaceError {
    /// The request's slot is further away than its `max_wait`.
    #[error("the pace of `{key}` would delay this request by more than its max_wait of {max_wait:?} (retry in {retry_after:?}); retry later or raise max_wait")]
    WaitExceeded {
        /// The request's key.
        key: String,
        /// The longest wait allowed.
        max_wait: Duration,
        /// When a retry could be paced within `max_wait`.
        retry_after: Duration,
    },
    /// The store could not decide (or the policy refused the request's input).
    #[error(transparent)]
    Store(#[from] paceline_store::Error),
}

/// A paced request's ticket: sent once, its response the caller's.
#[derive(Debug)]
pub struct Slot;

#[async_trait::async_trait]
impl Ticket for Slot {
    type Error = Infallible;

    async fn complete(self, _: u16, _: &HeaderMap, _: bool) -> Result<Option<Slot>, Infallible> {
        Ok(None)
    }
}

#[async_trait::async_trait]
impl Gate for Paced {
    type Ticket = Slot;
    type Error = PaceError;

    async fn admit(&self, target: Target<'_>) -> Result<Slot, PaceError> {
        let key = format!("paced:{}", (self.key)(&target));
        let Some(max_wait) = self.max_wait else {
            // No bound on the wait: reserved and waited for (past a window policy's horizon,
            // asked again until it books).
            self.limiter.acquire(&key, 1).await?;
            return Ok(Slot);
        };
        let decision = self.limiter.try_acquire(&key, 1, max_wait).await?;
        if decision.allowed {
            return Ok(Slot);
        }
        Err(PaceError::WaitExceeded {
            key,
            max_wait,
            retry_after: decision.delay,
        })
    }
}

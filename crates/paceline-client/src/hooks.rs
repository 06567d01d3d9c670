//! What a caller hears when a limit holds a request back: [`RateLimited`], and the
//! per-request choice to give up rather than wait ([`RequestOptions::give_up`]).
//!
//! The core ([`ClientCore`](crate::ClientCore)) records one [`RateLimited`] when
//!
//! - a request must wait for its turn (at [`submit`](crate::ClientCore::submit) when the
//!   core can tell the wait, else at the [`poll`](crate::ClientCore::poll) that learns it;
//!   once per request, and once more after each refusal that requeues it);
//! - a request fails because of a limit: its wait passes its `max_wait`
//!   ([`ClientError::WaitExceeded`](crate::ClientError::WaitExceeded)), or it asked to give
//!   up ([`ClientError::RateLimited`](crate::ClientError::RateLimited));
//! - the upstream refused a request with a 429 (or a 403 its dialect reads as a limit):
//!   at [`complete`](crate::ClientCore::complete), with the refusal's scope.
//!
//! The core is pure: events wait in it until [`take_rate_limited`](crate::ClientCore::take_rate_limited)
//! takes them. The async [`Client`](crate::Client) takes them after every step and calls
//! the hooks given to [`Client::on_rate_limited`](crate::Client::on_rate_limited).
//!
//! ```
//! use paceline_client::{ClientConfig, ClientCore, ClientError, RequestOptions, Route, Then};
//! use paceline_client::headers::{Dialect, Discord, Response};
//! use std::time::Duration;
//!
//! let mut core = ClientCore::new(ClientConfig::new());
//! let route = Route::discord("GET", "/channels/1/pins");
//! let first = core.submit(route.clone(), 0, None)?;
//! core.poll(0);
//! let mut h = http::HeaderMap::new();
//! h.insert("x-ratelimit-bucket", "pins".parse().unwrap());
//! h.insert("x-ratelimit-remaining", "0".parse().unwrap());
//! h.insert("x-ratelimit-reset-after", "2".parse().unwrap());
//! core.complete(first, 200, &Discord.read(&Response::new(200, &h), 0), 0);
//!
//! // The next request waits 2 s for the reset: one event says so.
//! core.submit(route.clone(), 0, None)?;
//! let told = core.take_rate_limited();
//! assert_eq!(told[0].then, Then::Wait);
//! assert_eq!(told[0].wait, Some(Duration::from_secs(2)));
//! assert_eq!(told[0].bucket.as_deref(), Some("pins"));
//!
//! // One that would rather give up fails at once, naming the wait (behind the other).
//! let err = core.submit_with(route, 0, RequestOptions::new().give_up()).unwrap_err();
//! assert!(matches!(err, ClientError::RateLimited { wait: Some(w), .. } if w > Duration::from_secs(2)));
//! assert_eq!(core.take_rate_limited()[0].then, Then::Fail);
//! # Ok::<(), ClientError>(())
//! ```

use std::time::Duration;

use crate::core::RequestId;
use crate::headers::Scope;
use crate::route::Route;

/// A limit held a request back, or refused it: what a hook is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimited {
    /// The request's handle in its core.
    pub id: RequestId,
    /// The request's route. Its [`key`](Route::key) is a template without ids or tokens;
    /// its [`major`](Route::major) may hold a webhook's token: never log or label it.
    pub route: Route,
    /// The bucket id the server named for the route, when known.
    pub bucket: Option<String>,
    /// Whose limit: the route's bucket, its shared resource, or the global limit. `None`
    /// when the core cannot tell: a [shared](crate::ClientCore::shared) core is told only
    /// when to ask again by the knowledge in Redis, not which limit holds the request.
    pub scope: Option<Scope>,
    /// How long the request waits (or would have waited) from now, when known: at least
    /// this long for a request further back in its queue.
    pub wait: Option<Duration>,
    /// Whether the request waits or fails.
    pub then: Then,
    /// Who said so: this limiter, or the upstream's refusal.
    pub origin: Origin,
}

/// What becomes of a rate-limited request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Then {
    /// It waits for its turn (again, after a refusal) and is then sent.
    Wait,
    /// It does not wait: it fails with a [`ClientError`](crate::ClientError), or (a
    /// refusal of the upstream it will not wait out) the refusal is the caller's answer.
    Fail,
}

impl Then {
    /// `wait` or `fail`, as metrics and logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Then::Wait => "wait",
            Then::Fail => "fail",
        }
    }
}

/// Who held a request back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// This limiter, from what it knows of the limits, before sending the request.
    Local,
    /// The upstream, which refused the request.
    Upstream,
}

impl Origin {
    /// `local` or `upstream`, as metrics and logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Local => "local",
            Origin::Upstream => "upstream",
        }
    }
}

/// A scope as metrics and logs name it: `bucket`, `shared`, `global`, or `unknown`.
pub fn scope_name(scope: Option<Scope>) -> &'static str {
    match scope {
        Some(Scope::Bucket) => "bucket",
        Some(Scope::Shared) => "shared",
        Some(Scope::Global) => "global",
        None => "unknown",
    }
}

/// How one request meets the limits: its deadline, and whether it gives up rather than
/// wait.
///
/// ```
/// use paceline_client::RequestOptions;
/// use std::time::Duration;
/// let options = RequestOptions::new().max_wait(Duration::from_secs(5));
/// assert_eq!(options.max_wait, Some(Duration::from_secs(5)));
/// assert!(!options.give_up);
/// assert!(RequestOptions::new().give_up().give_up);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestOptions {
    /// Its deadline (`None`: the configuration's
    /// [`max_wait`](crate::ClientConfig::max_wait)).
    pub max_wait: Option<Duration>,
    /// Fail at once with [`ClientError::RateLimited`](crate::ClientError::RateLimited)
    /// instead of waiting for a limit, and take an upstream's refusal as the answer
    /// rather than wait it out and send again.
    pub give_up: bool,
}

impl RequestOptions {
    /// Wait as the configuration says.
    pub fn new() -> RequestOptions {
        RequestOptions::default()
    }

    /// The same options with this deadline.
    pub fn max_wait(mut self, max_wait: Duration) -> RequestOptions {
        self.max_wait = Some(max_wait);
        self
    }

    /// The same options giving up rather than waiting.
    pub fn give_up(mut self) -> RequestOptions {
        self.give_up = true;
        self
    }
}

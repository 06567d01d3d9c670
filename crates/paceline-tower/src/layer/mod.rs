//! [`RateLimitLayer`]: every request decided against a set of limits before it reaches the
//! service.
//!
//! The layer and what its services share are here; how it is configured is in `builder`
//! (and a limit whose policy each request chooses in `choice`), the service it makes in
//! `service`, that service's future in `future`, the bodies of its
//! answers in `body`, and how a request's limits are decided (and its leases held) in
//! `decision`.

mod body;
mod builder;
mod choice;
mod decision;
mod future;
mod service;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use paceline_core::Policy;
use paceline_store::{CachedRefusals, SharedStore};
use tower_layer::Layer;

use crate::key::Key;

#[cfg(feature = "axum")]
pub use body::AxumBody;
pub use body::{Bodies, Limited, LimitedBody};
pub use builder::Builder;
pub use choice::Choice;
pub use future::ResponseFuture;
pub use service::RateLimit;

/// What the layer does when the store cannot decide (Redis down, under the store's
/// `fail_closed` failure policy, or a full memory store).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFailure {
    /// Answer `503 Service Unavailable` (problem details naming the failure).
    #[default]
    Refuse,
    /// Let the request through, unlimited.
    Allow,
}

/// One limit of a layer: its name (in the headers and problem details), policy and key.
struct Limit {
    name: String,
    /// The name as a structured-field string, as the `RateLimit` header writes it.
    quoted: String,
    /// The policy (of a limit that chooses per request, its first one, never applied).
    policy: Policy,
    key: Key,
    /// Set for a limit whose policy each request chooses ([`Builder::limit_by`]).
    chooser: Option<choice::Chooser>,
}

/// What every clone of a layer's services shares: the store, the limits, the options.
struct Shared {
    store: SharedStore,
    /// The cache of refusals in front of the store, if any (the same object as `store`).
    cache: Option<Arc<CachedRefusals>>,
    limits: Vec<Limit>,
    pace: Option<Duration>,
    /// In pace mode, whether the limits book a slot in the store (a set every limit of
    /// which can book ahead, or one limit other than `concurrency`); otherwise a request
    /// waits for the retry-after and asks again.
    reserves: bool,
    on_failure: StoreFailure,
    headers: bool,
    /// `RateLimit-Policy`, the same for every answer (`None` as well when a limit chooses
    /// its policy per request: then it is written for each).
    policy_header: Option<http::HeaderValue>,
    /// Whether a limit chooses its policy per request.
    chooses: bool,
}

/// A tower [`Layer`] that decides every request against a set of limits, on any store,
/// before the inner service sees it.
///
/// * **One state for every clone**: the limits' state is in the store, which every service
///   the layer makes shares (axum clones a service per connection; the limits hold across
///   connections, processes and, on Redis, machines).
/// * **A set decided as one**: a request is admitted only if every limit admits it, and a
///   refused request counts against none ([`Store::decide_all`](paceline_store::Store::decide_all)).
///   Refused: `429 Too Many Requests`, `Retry-After`, and an RFC 9457
///   `application/problem+json` body naming the limits that refused.
/// * **Headers**: every answer carries `RateLimit-Policy` and `RateLimit` (the IETF draft's
///   structured fields) listing each limit under its name ([`headers`](Builder::headers)
///   turns them off).
/// * **Requests in flight**: a `concurrency` limit's lease is given back when the response
///   body ends, or when the request is dropped (the client went away); one not given back
///   (a crashed process) is reclaimed at its expiry. Give the policy a `lease` longer than
///   your longest response: a streamed response that outlives it loses its place (the
///   lease is not renewed), and an upgraded connection (`101`, a WebSocket) gives its place
///   back with its empty body. A refusal's `Retry-After` is when the soonest lease would
///   expire if none came back earlier.
/// * **Pace mode** ([`pace`](Builder::pace)): a request the limits would refuse waits up to
///   `max_wait` for its turn instead. The wait is a reservation (first come, first served)
///   at the earliest time every limit admits, booked on every limit at once; with a
///   `concurrency` limit, or a `pacer`, `exec_evenly` or `sliding_window` among several
///   (which cannot book ahead), the request waits the longest retry-after and asks again while `max_wait`
///   lasts (for a place in flight, asking every 50 ms, since a lease may come back before
///   its expiry).
/// * **A policy per request** ([`limit_by`](Builder::limit_by)): a limit may hold several
///   policies by name, a function of the request choosing which applies (an API key's
///   plan, a route), and possibly the key it counts under.
/// * **Store failures**: [`StoreFailure`].
/// * **Refusals remembered**: on a store across the network (Redis), a key refused with a
///   retry-after is refused again, until then, in this process, without a Redis call
///   ([`refusal_cache`](Builder::refusal_cache)).
///
/// Keys are stored as `{KEY}:NAME` (`{KEY}:NAME:POLICY` for a policy chosen per request,
/// so that each policy counts apart): a hash tag of the request's key, so on a Redis Cluster
/// every limit of a layer must use the same [`Key`] (a set is decided in one slot).
///
/// ```
/// use paceline_store::MemoryStore;
/// use paceline_tower::{Key, RateLimitLayer};
/// use std::sync::Arc;
/// let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
///     .limit("per-second", "gcra:rate=10/s,burst=20".parse()?, Key::header("x-api-key"))
///     .limit("per-day", "fixed_window:limit=10000,window=1d".parse()?, Key::header("x-api-key"))
///     .limit("in-flight", "concurrency:limit=4,lease=30s".parse()?, Key::header("x-api-key"))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), paceline_core::InputError>(())
/// ```
///
/// On axum, `for_axum()` (feature `axum`, on by default) makes the answers' body axum's
/// own.
#[derive(Clone)]
pub struct RateLimitLayer<M = Limited> {
    shared: Arc<Shared>,
    bodies: PhantomData<fn() -> M>,
}

impl<M> std::fmt::Debug for RateLimitLayer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.shared.limits.iter().map(|l| l.name.as_str()).collect();
        f.debug_struct("RateLimitLayer")
            .field("limits", &names)
            .field("pace", &self.shared.pace)
            .field("on_failure", &self.shared.on_failure)
            .finish()
    }
}

impl<M> RateLimitLayer<M> {
    /// How many requests the cache of refusals answered without asking the store (`None`
    /// when the layer has no cache; see [`Builder::refusal_cache`]).
    pub fn refusals_from_cache(&self) -> Option<u64> {
        self.shared.cache.as_ref().map(|c| c.hits())
    }
}

#[cfg(feature = "axum")]
impl RateLimitLayer {
    /// The same layer for axum: its answers' body is `axum::body::Body` itself
    /// ([`AxumBody`]). An admitted request's body then passes through as the inner service
    /// made it, where a [`LimitedBody`] around it would be boxed once more by axum; only a
    /// body holding a place in flight (a `concurrency` limit's lease) is wrapped. It fits
    /// any axum `Router` or `MethodRouter`, whose services answer with that body.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use paceline_store::MemoryStore;
    /// use paceline_tower::{Key, RateLimitLayer};
    /// use std::sync::Arc;
    /// let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
    ///     .limit("per-second", "gcra:rate=10/s,burst=20".parse()?, Key::peer_ip())
    ///     .build()?
    ///     .for_axum();
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// # let _ = app;
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn for_axum(self) -> RateLimitLayer<AxumBody> {
        RateLimitLayer {
            shared: self.shared,
            bodies: PhantomData,
        }
    }
}

impl<S, M> Layer<S> for RateLimitLayer<M> {
    type Service = RateLimit<S, M>;

    fn layer(&self, inner: S) -> RateLimit<S, M> {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
            bodies: PhantomData,
        }
    }
}

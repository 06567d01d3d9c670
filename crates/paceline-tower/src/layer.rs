//! [`RateLimitLayer`]: every request decided against a set of limits before it reaches the
//! service.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{header, StatusCode};
use http_body::{Body, Frame, SizeHint};
use paceline_core::{Decision, Error, InputError, Op, Policy};
use paceline_store::{
    CachedRefusals, Request, SetDecision, SharedStore, DEFAULT_REFUSALS, MAX_LIMITS,
};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::headers::{self, Names, Problem, PROBLEM_JSON};
use crate::key::{Head, Key, KeyText};

/// In pace mode, how often a request waiting for a place in flight asks for one (a lease
/// may come back before its expiry).
const LEASE_POLL: Duration = Duration::from_millis(50);

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
    policy: Policy,
    key: Key,
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
    /// `RateLimit-Policy`, the same for every answer.
    policy_header: Option<http::HeaderValue>,
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
/// * **Store failures**: [`StoreFailure`].
/// * **Refusals remembered**: on a store across the network (Redis), a key refused with a
///   retry-after is refused again, until then, in this process, without a Redis call
///   ([`refusal_cache`](Builder::refusal_cache)).
///
/// Keys are stored as `{KEY}:NAME`: a hash tag of the request's key, so on a Redis Cluster
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

/// Configures a [`RateLimitLayer`].
#[must_use]
pub struct Builder {
    store: SharedStore,
    refusal_cache: Option<usize>,
    limits: Vec<Limit>,
    pace: Option<Duration>,
    on_failure: StoreFailure,
    headers: bool,
}

impl RateLimitLayer {
    /// Starts a layer whose limits live in `store` (any store: `Arc::new(MemoryStore::new())`,
    /// or what [`paceline_store::open`] opens from a URL).
    pub fn builder(store: SharedStore) -> Builder {
        Builder {
            store,
            refusal_cache: None,
            limits: Vec::new(),
            pace: None,
            on_failure: StoreFailure::Refuse,
            headers: true,
        }
    }
}

impl Builder {
    /// Adds a limit: `policy` applied to each request's `key`. `name` (1 to 64 of
    /// `A-Z a-z 0-9 - _ .`) names it in the headers and problem details, and in the store.
    pub fn limit(mut self, name: impl Into<String>, policy: Policy, key: Key) -> Builder {
        let name = name.into();
        self.limits.push(Limit {
            quoted: headers::sf_string(&name),
            name,
            policy,
            key,
        });
        self
    }

    /// Pace mode: a request the limits would refuse waits up to `max_wait` for its turn
    /// (the task sleeps, in the store's time), and is refused only if its turn is further
    /// away.
    pub fn pace(mut self, max_wait: Duration) -> Builder {
        self.pace = Some(max_wait);
        self
    }

    /// What to do when the store cannot decide (default: [`StoreFailure::Refuse`], `503`).
    pub fn on_store_failure(mut self, failure: StoreFailure) -> Builder {
        self.on_failure = failure;
        self
    }

    /// How many refusals to remember in this process ([`CachedRefusals`]): a key refused
    /// with a retry-after is refused again, until then, without asking the store. On by
    /// default (10,000) for a store across the network (Redis), off for the memory store
    /// (which answers as fast as the cache would); `0` turns it off.
    pub fn refusal_cache(mut self, capacity: usize) -> Builder {
        self.refusal_cache = Some(capacity);
        self
    }

    /// Whether answers carry `RateLimit-Policy` and `RateLimit` (default: true; a refusal's
    /// `Retry-After` is always sent).
    pub fn headers(mut self, on: bool) -> Builder {
        self.headers = on;
        self
    }

    /// Checks the limits: 1 to [`MAX_LIMITS`], named distinctly.
    pub fn build(self) -> Result<RateLimitLayer, InputError> {
        if self.limits.is_empty() || self.limits.len() > MAX_LIMITS {
            return Err(InputError::new(
                "limits",
                format!(
                    "a layer holds 1 to {MAX_LIMITS} limits, not {}; add them with .limit(name, policy, key)",
                    self.limits.len()
                ),
            ));
        }
        for (i, limit) in self.limits.iter().enumerate() {
            let name = &limit.name;
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid {
                return Err(InputError::new(
                    "name",
                    format!("`{name}` is not a limit name; use 1 to 64 of A-Z a-z 0-9 - _ ."),
                ));
            }
            if self.limits[..i].iter().any(|l| &l.name == name) {
                return Err(InputError::new(
                    "name",
                    format!("two limits are named `{name}`; give each its own name"),
                ));
            }
            limit.policy.check_cost(Op::Limit, 1)?;
            if let Some(why) = limit.key.invalid() {
                return Err(InputError::new(
                    "key",
                    format!("the `{name}` limit's key can never be read: {why}"),
                ));
            }
        }
        let capacity = self.refusal_cache.unwrap_or(if self.store.is_remote() {
            DEFAULT_REFUSALS
        } else {
            0
        });
        let cache = (capacity > 0)
            .then(|| Arc::new(CachedRefusals::new(Arc::clone(&self.store), capacity)));
        let store: SharedStore = match &cache {
            Some(cache) => Arc::clone(cache) as SharedStore,
            None => self.store,
        };
        // A concurrency limit's places come back when leases do: never booked ahead.
        let reserves = match self.limits.as_slice() {
            [one] => !matches!(one.policy, Policy::Concurrency(_)),
            several => several
                .iter()
                .all(|l| l.policy.pace_from(&mut None, 0, 1, 0).is_ok()),
        };
        let quotas: Vec<(&str, u64)> = self
            .limits
            .iter()
            .map(|l| (l.name.as_str(), l.policy.limit()))
            .collect();
        let policy_header = headers::policy_field(&quotas);
        Ok(RateLimitLayer {
            bodies: PhantomData,
            shared: Arc::new(Shared {
                store,
                cache,
                policy_header,
                limits: self.limits,
                pace: self.pace,
                reserves,
                on_failure: self.on_failure,
                headers: self.headers,
            }),
        })
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

/// The service a [`RateLimitLayer`] makes: decides, then calls the inner service.
#[derive(Clone)]
pub struct RateLimit<S, M = Limited> {
    inner: S,
    shared: Arc<Shared>,
    bodies: PhantomData<fn() -> M>,
}

impl<S, M> std::fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RateLimit")
    }
}

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
    enum Pending<F, R, E> {
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
    fn new(state: Pending<F, R, E>) -> ResponseFuture<F, R, E, M> {
        ResponseFuture {
            state,
            bodies: PhantomData,
        }
    }

    fn ready(response: http::Response<LimitedBody<R>>) -> ResponseFuture<F, R, E, M> {
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
            let outcome = match (shared.limits.as_slice(), &keys) {
                // One limit (the common case): its decision alone, no set to build.
                ([limit], StoreKeys::One(key)) => store
                    .decide_sync(&limit.policy, key.as_str(), op, 1)
                    .map(Decided::One),
                _ => store
                    .decide_all_sync(&shared.requests(&keys, op))
                    .map(Decided::Set),
            };
            match outcome {
                Ok(decided) if decided.allowed() && decided.combined().delay.is_zero() => {
                    let guard = shared.guard(decided.limits(), &keys);
                    let fields = shared.admitted_fields(decided.limits());
                    return ResponseFuture::new(Pending::Admitted {
                        inner: self.inner.call(request),
                        fields,
                        guard,
                    });
                }
                Ok(decided) if !decided.allowed() && shared.pace.is_none() => {
                    return ResponseFuture::ready(shared.refusal(&decided.into_set()));
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

/// Each limit's key in the store, `{KEY}:NAME`: for one limit, one key on the stack (no
/// allocation while it is short, no vector).
enum StoreKeys {
    One(KeyText),
    Many(Vec<String>),
}

impl StoreKeys {
    fn len(&self) -> usize {
        match self {
            StoreKeys::One(_) => 1,
            StoreKeys::Many(keys) => keys.len(),
        }
    }

    fn get(&self, i: usize) -> Option<&str> {
        match self {
            StoreKeys::One(key) => (i == 0).then(|| key.as_str()),
            StoreKeys::Many(keys) => keys.get(i).map(String::as_str),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// An admission decided in `call`: one limit's decision (the combined decision is that
/// limit's own), or a set's.
enum Decided {
    One(Decision),
    Set(SetDecision),
}

impl Decided {
    fn allowed(&self) -> bool {
        self.combined().allowed
    }

    fn combined(&self) -> &Decision {
        match self {
            Decided::One(d) => d,
            Decided::Set(set) => &set.decision,
        }
    }

    fn limits(&self) -> &[Decision] {
        match self {
            Decided::One(d) => std::slice::from_ref(d),
            Decided::Set(set) => &set.limits,
        }
    }

    fn into_set(self) -> SetDecision {
        match self {
            Decided::One(d) => SetDecision::new(d.allowed, vec![d]),
            Decided::Set(set) => set,
        }
    }
}

impl Shared {
    /// Each limit's key in the store for a request, `{KEY}:NAME` (the key a hash tag);
    /// the problem to answer when a key cannot be read.
    fn store_keys(&self, head: &Head<'_>) -> Result<StoreKeys, Problem> {
        let key = |limit: &Limit| {
            let mut key = KeyText::new();
            key.push_str("{");
            limit.key.read_into(head, &mut key).map_err(|missing| {
                let status = if missing.request_fault {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                Problem::new(
                    status,
                    format!("the `{}` limit has no key: {}", limit.name, missing.what),
                )
            })?;
            key.push_str("}:");
            key.push_str(&limit.name);
            Ok(key)
        };
        match self.limits.as_slice() {
            [one] => key(one).map(StoreKeys::One),
            several => several
                .iter()
                .map(|limit| key(limit).map(KeyText::into_string))
                .collect::<Result<_, _>>()
                .map(StoreKeys::Many),
        }
    }

    /// The op every request asks its limits: a reservation in pace mode if they book
    /// ahead, else `limit`.
    fn op(&self) -> Op {
        match self.pace {
            Some(max_wait) if self.reserves => Op::pace_within(max_wait),
            _ => Op::Limit,
        }
    }

    /// The requests of `op` for each limit's key.
    fn requests<'a>(&'a self, keys: &'a StoreKeys, op: Op) -> Vec<Request<'a>> {
        self.limits
            .iter()
            .zip(keys.iter())
            .map(|(limit, key)| Request::new(&limit.policy, key, op, 1))
            .collect()
    }

    /// The leases an admission took (`limits`: each limit's decision), held until dropped
    /// (none: `None`).
    fn guard(self: &Arc<Self>, limits: &[Decision], keys: &StoreKeys) -> Option<LeaseGuard> {
        if limits.iter().all(|d| d.lease.is_none()) {
            return None;
        }
        let leases: Vec<(usize, String, u64)> = limits
            .iter()
            .zip(keys.iter())
            .enumerate()
            .filter_map(|(i, (d, key))| d.lease.map(|id| (i, key.to_string(), id)))
            .collect();
        Some(LeaseGuard {
            shared: Arc::clone(self),
            leases,
        })
    }

    /// Decides (after `first`, the outcome of a decision made already, if any), waits as
    /// pace mode says, then calls the inner service.
    async fn run<S, B, R>(
        shared: Arc<Shared>,
        mut inner: S,
        request: http::Request<B>,
        keys: StoreKeys,
        mut first: Option<(Result<SetDecision, Error>, Option<LeaseGuard>)>,
    ) -> Result<http::Response<LimitedBody<R>>, S::Error>
    where
        S: Service<http::Request<B>, Response = http::Response<R>>,
    {
        let store_keys = keys;
        let reserves = shared.reserves;
        let op = shared.op();
        let mut waited = Duration::ZERO;
        let mut held = None;
        let set = loop {
            let decided = match (first.take(), shared.limits.as_slice(), &store_keys) {
                (Some((outcome, guard)), _, _) => {
                    held = guard;
                    outcome
                }
                // One limit (the common case): no vector of requests.
                (None, [limit], StoreKeys::One(key)) => {
                    let request = Request::new(&limit.policy, key.as_str(), op, 1);
                    shared
                        .store
                        .decide_all(std::slice::from_ref(&request))
                        .await
                }
                (None, _, _) => {
                    let requests = shared.requests(&store_keys, op);
                    shared.store.decide_all(&requests).await
                }
            };
            match decided {
                Ok(set) if set.allowed() => break set,
                Ok(set) => {
                    // Pace mode without a reservation: wait for the longest retry-after
                    // while the budget lasts, then ask again; a place in flight may come
                    // back before its lease's expiry, so it is asked for every
                    // `LEASE_POLL` meanwhile.
                    let Some(max_wait) = shared.pace.filter(|_| !reserves) else {
                        return Ok(shared.refusal(&set));
                    };
                    let budget = max_wait.saturating_sub(waited);
                    let in_flight = set.refused().any(|i| {
                        matches!(
                            shared.limits.get(i).map(|l| &l.policy),
                            Some(Policy::Concurrency(_))
                        )
                    });
                    let retry = set.decision.delay;
                    let step = if in_flight {
                        retry.min(LEASE_POLL).min(budget)
                    } else {
                        retry
                    };
                    if step.is_zero() || step > budget {
                        return Ok(shared.refusal(&set));
                    }
                    shared.store.sleep(step).await;
                    waited = waited.saturating_add(step);
                }
                Err(Error::Store(_)) if shared.on_failure == StoreFailure::Allow => {
                    let response = inner.call(request).await?;
                    return Ok(response.map(|body| LimitedBody::inner(body, None)));
                }
                Err(e) => {
                    let status = match e {
                        Error::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    let problem =
                        Problem::new(status, format!("the limits could not be decided: {e}"));
                    return Ok(answer(&problem));
                }
            }
        };
        // Held from here (or from `call`): a request dropped while it waits for its slot
        // gives its leases back too.
        let guard = match held {
            Some(guard) => Some(guard),
            None => shared.guard(&set.limits, &store_keys),
        };
        if !set.decision.delay.is_zero() {
            shared.store.sleep(set.decision.delay).await;
        }
        // On an error the guard is dropped here, giving the leases back.
        let mut response = inner.call(request).await?;
        if shared.headers {
            shared.insert_headers(response.headers_mut(), &set.limits, &set.decision);
        }
        Ok(response.map(|body| LimitedBody::inner(body, guard)))
    }

    /// An admission's `RateLimit-Policy` and `RateLimit` (`limits`: each limit's decision),
    /// none if the layer sends no headers.
    fn admitted_fields(
        &self,
        limits: &[Decision],
    ) -> (Option<http::HeaderValue>, Option<http::HeaderValue>) {
        if !self.headers {
            return (None, None);
        }
        let names = self.limits.iter().map(|l| l.quoted.as_str());
        let state = headers::state_field(names.zip(limits), Names::Quoted);
        (self.policy_header.clone(), state)
    }

    /// Adds `RateLimit-Policy` (the same for every answer, written once and copied) and
    /// `RateLimit` of `limits`, each limit's decision, and `combined`.
    fn insert_headers(
        &self,
        headers: &mut http::HeaderMap,
        limits: &[Decision],
        combined: &Decision,
    ) {
        if let Some(policy) = &self.policy_header {
            headers.insert(headers::RATELIMIT_POLICY, policy.clone());
        }
        let names = self.limits.iter().map(|l| l.quoted.as_str());
        headers::insert_state_of(headers, names.zip(limits), Names::Quoted, combined);
    }

    /// The `429` of a refused set.
    fn refusal<R>(&self, set: &SetDecision) -> http::Response<LimitedBody<R>> {
        let violated = set
            .refused()
            .filter_map(|i| self.limits.get(i).map(|l| l.name.clone()))
            .collect();
        let delay = set.retry_after().unwrap_or_default();
        let mut response = answer(&Problem::too_many_requests(violated, delay));
        if self.headers {
            self.insert_headers(response.headers_mut(), &set.limits, &set.decision);
        } else {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                headers::seconds_up(delay).max(1).into(),
            );
        }
        response
    }
}

/// An answer of the layer's own: `problem` as `application/problem+json`.
fn answer<R>(problem: &Problem) -> http::Response<LimitedBody<R>> {
    let mut response = http::Response::new(LimitedBody::answer(problem.to_bytes()));
    *response.status_mut() =
        StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The leases a request holds, given back when dropped: with its response body (ended, or
/// dropped when the client went away), or with the request if it never got that far.
struct LeaseGuard {
    shared: Arc<Shared>,
    /// Each lease: its limit's index, its key in the store, its id.
    leases: Vec<(usize, String, u64)>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        for (index, key, id) in std::mem::take(&mut self.leases) {
            let Some(limit) = self.shared.limits.get(index) else {
                continue;
            };
            // The memory store gives it back here, at once; a remote store in a task of
            // the runtime (without one, the lease is reclaimed at its expiry).
            if !self.shared.store.is_remote() {
                let mut release = self.shared.store.release(&limit.policy, &key, id);
                let mut cx = Context::from_waker(Waker::noop());
                if Pin::new(&mut release).poll(&mut cx).is_ready() {
                    continue;
                }
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let shared = Arc::clone(&self.shared);
                runtime.spawn(async move {
                    if let Some(limit) = shared.limits.get(index) {
                        // A failed release leaves the lease to be reclaimed at its expiry.
                        let _ = shared.store.release(&limit.policy, &key, id).await;
                    }
                });
            }
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
    fn inner(body: B, guard: Option<LeaseGuard>) -> LimitedBody<B> {
        LimitedBody {
            kind: Kind::Inner { body, guard },
        }
    }

    fn answer(bytes: Bytes) -> LimitedBody<B> {
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

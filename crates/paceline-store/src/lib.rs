//! # paceline-store: where keys' state lives
//!
//! The [`Store`] seam and what stands on it: the in-process [`MemoryStore`], the Redis and
//! Redis Cluster store ([`redis::RedisStore`], with the `redis` feature), [`open`] to get
//! either from a URL as one [`SharedStore`], and the [`Limiter`] that applies one policy
//! through any of them. Users add the `paceline` crate (its root and `paceline::store`
//! re-export what they need); the front ends (the HTTP service, the CLI) build on this
//! crate directly.
//!
//! A store persists each key's state and applies a policy to it atomically; it holds no
//! algorithm logic of its own (that is `paceline-core`'s), so every store gives the same
//! decisions.
//!
//! ```
//! use paceline_store::{open, Request, StoreOptions};
//! use paceline_store::{Op, Policy};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline_store::Error> {
//! // Any store, chosen by URL: "memory", "redis://...", "redis-cluster://...".
//! let store = open("memory", &StoreOptions::default()).await?;
//! let policy: Policy = "gcra:rate=10/s,burst=2".parse()?;
//! let batch = [
//!     Request::new(&policy, "alice", Op::Limit, 1),
//!     Request::new(&policy, "alice", Op::Limit, 1),
//!     Request::new(&policy, "alice", Op::Limit, 1),
//! ];
//! let decisions = store.decide_batch(&batch).await;
//! let allowed: Vec<bool> = decisions
//!     .into_iter()
//!     .map(|d| d.map(|d| d.allowed))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(allowed, [true, true, false]); // a rejection is a decision, not an error
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

mod cache;
mod clock;
mod failure;
mod limiter;
mod memory;
mod open;
#[cfg(feature = "redis")]
pub mod redis;
pub mod secret;
pub mod set;

/// Installs rustls's `ring` crypto provider as the process's default, unless one is
/// installed already (which is as good): rustls needs one per process. Every TLS client of
/// paceline's goes through it: the Redis store's connections, the proxy's upstream.
// Called by paceline-server's proxy and the test kit; not part of the user's API.
#[cfg(feature = "redis")]
#[doc(hidden)]
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub use cache::{CachedRefusals, DEFAULT_REFUSALS};
pub use clock::{SystemClock, TokioClock};
pub use failure::FailurePolicy;
pub use limiter::Limiter;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use open::{check_store_url, open, unshared_store_error, without_credentials, StoreOptions};
pub use paceline_core::{
    policy, spec, Clock, Decision, Error, Fallback, InputError, ManualClock, Op, Policy, Rate,
    Sleep, State, StoreError, StoreErrorKind, ALGORITHMS,
};
pub use set::{Limits, SetDecision, MAX_LIMITS, MAX_PACE_ROUNDS, MAX_PACE_SET_DELAY_US};

/// Any store, shared: what [`open`] returns and what front ends hold.
pub type SharedStore = Arc<dyn Store>;

/// One decision to make: `op` with `cost` on `key` under `policy`.
///
/// ```
/// use paceline_store::{Op, Policy, Request};
/// let policy: Policy = "fixed_window:limit=10,window=10s".parse()?;
/// let request = Request::new(&policy, "guild:42", Op::Limit, 1);
/// assert_eq!(request.key, "guild:42");
/// # Ok::<(), paceline_store::InputError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The policy applied to the key.
    pub policy: &'a Policy,
    /// The key, as the caller names it (a store may add a prefix of its own).
    pub key: &'a str,
    /// What to do.
    pub op: Op,
    /// The request's weight (>= 1).
    pub cost: u64,
}

impl<'a> Request<'a> {
    /// A request of `op` with `cost` on `key` under `policy`.
    pub fn new(policy: &'a Policy, key: &'a str, op: Op, cost: u64) -> Request<'a> {
        Request {
            policy,
            key,
            op,
            cost,
        }
    }
}

/// Persists keys' state and applies policies to it atomically.
///
/// Implementations apply one request per key at a time (no lost updates), read "now" from
/// their clock, and treat a key whose `reset_after` has passed as idle (its state may then
/// be dropped). Every request is validated by the store that decides it, once
/// ([`Policy::check_cost`]): an invalid cost is that request's [`Error::Input`].
///
/// The trait is object safe: front ends hold a [`SharedStore`] (`Arc<dyn Store>`) and ask
/// only what it can do ([`is_remote`](Store::is_remote), [`as_sync`](Store::as_sync),
/// `functions` and `health` with the `redis` feature), never
/// which kind of store it is. Its futures are [`StoreFuture`]s, which cost no
/// allocation when the answer is ready at once (the memory store).
pub trait Store: Send + Sync + 'static {
    /// Applies `op` with `cost` to `key` under `policy`.
    fn decide<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        cost: u64,
    ) -> StoreFuture<'a, Result<Decision, Error>>;

    /// Decides `requests` in order, each with its own result, exactly as if they were made
    /// one after another. The default makes them one after another; the Redis store sends
    /// them in one call per Redis node.
    fn decide_batch<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Vec<Result<Decision, Error>>> {
        StoreFuture::boxed(async move {
            let mut out = Vec::with_capacity(requests.len());
            for r in requests {
                out.push(self.decide(r.policy, r.key, r.op, r.cost).await);
            }
            out
        })
    }

    /// Decides a set of limits as one ([`Limits`]): admitted only if every request admits,
    /// and then each counts it; refused otherwise, changing no key, with each limit's
    /// answer as of now. A set of one is decided as [`decide`](Store::decide) decides it.
    /// The requests share one op (`limit`, `peek`, or `pace`: the earliest time at which
    /// every limit admits, see [`set`]), name each key once, and number at most
    /// [`MAX_LIMITS`]; a Redis Cluster
    /// needs their keys in one hash slot. Anything else is an [`Error::Input`] naming the
    /// field.
    fn decide_all<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Result<SetDecision, Error>>;

    /// Gives back lease `lease` of `key` under `policy`, a
    /// [`concurrency`](paceline_core::policy::concurrency) policy (the lease an admitted
    /// decision's [`Decision::lease`] names): true if it was live, false if it is unknown,
    /// released or reclaimed already (no error: a late release changes nothing). Errors: a
    /// policy that holds no leases ([`Error::Input`] naming `policy`), a failed store
    /// (whatever its failure policy: a release cannot be made up).
    fn release<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<bool, Error>>;

    /// Renews lease `lease` of `key` under `policy` (a `concurrency` policy) to live the
    /// policy's lease duration from now: that duration, or `None` if the lease is not live
    /// (unknown, released or reclaimed already). Errors as [`release`](Store::release).
    fn extend<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<Option<Duration>, Error>>;

    /// Forgets `key`: its next request finds it idle.
    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>>;

    /// Whether the store can decide now (Redis: answers a `PING` within its response
    /// timeout), for readiness probes. The memory store is always ready.
    fn ready(&self) -> StoreFuture<'_, Result<(), Error>> {
        StoreFuture::ready(Ok(()))
    }

    /// The key that signs tokens of kind `name` (a job's lease, a concurrency lease): the
    /// same for every process that shares this store's state, so that a token one process
    /// signed is accepted by another (Redis: drawn once and kept in Redis under the store's
    /// prefix; a store of this process alone: drawn once per process). See
    /// [`secret`].
    ///
    /// ```
    /// use paceline_store::{open, StoreOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let store = open("memory", &StoreOptions::new()).await?;
    /// let key = store.token_key("doc-example").await?;
    /// let again = store.token_key("doc-example").await?;
    /// assert_eq!(key.tag(&[b"lease-7"]), again.tag(&[b"lease-7"]));
    /// # Ok(()) }
    /// ```
    fn token_key<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Result<secret::TokenKey, Error>> {
        StoreFuture::ready(secret::process_key(name).map_err(Error::Store))
    }

    /// Waits `duration` in the store's time: a real sleep, or an advance of a virtual clock.
    fn sleep(&self, duration: Duration) -> Sleep;

    /// The clock the store reads time from when it is one of this process's (the memory
    /// store's, or a clock injected into a Redis store); `None` when time comes from
    /// elsewhere (Redis's `TIME`). Caches in front of the store keep time with it.
    fn time_source(&self) -> Option<Arc<dyn Clock>> {
        None
    }

    /// True when a decision costs a round trip to another process (Redis), so that front
    /// ends put a [`CachedRefusals`] in front of it by default.
    fn is_remote(&self) -> bool {
        false
    }

    /// The store as a [`SyncStore`], if it answers without waiting on I/O (the in-memory
    /// store): front ends may then decide in place, without a future. Its decisions must be
    /// exactly this store's own; a wrapper that adds behaviour (such as a cache) answers
    /// `None`.
    fn as_sync(&self) -> Option<&dyn SyncStore> {
        None
    }

    /// Of `keys`, the first that cannot be decided in one set with `keys[0]`
    /// ([`decide_all`](Store::decide_all)): on a Redis Cluster, the first in another hash
    /// slot; `None` when all can (on any store that keeps them in one place). Front ends use
    /// it to name the offending key in their own terms.
    ///
    /// ```
    /// use paceline_store::{open, StoreOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let store = open("memory", &StoreOptions::new()).await?;
    /// assert_eq!(store.key_apart(&["user:1", "org:7"]), None);
    /// # Ok(()) }
    /// ```
    fn key_apart(&self, keys: &[&str]) -> Option<usize> {
        let _ = keys;
        None
    }

    /// The Redis behind this store as a host of a front end's function libraries, if the
    /// store keeps its state in Redis (a [`redis::RedisStore`], or a wrapper of one such as
    /// a [`CachedRefusals`]): for front ends that keep more than a key's state there (the
    /// job queue, the API client's shared knowledge), over the store's connections,
    /// timeouts and cluster routing. They take the store a user opened, whichever it is,
    /// and keep their state in this process when the answer is `None`.
    ///
    /// ```
    /// use paceline_store::{open, StoreOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let store = open("memory", &StoreOptions::new()).await?;
    /// assert!(store.functions().is_none());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    fn functions(&self) -> Option<crate::redis::FunctionHost> {
        None
    }

    /// The health of the Redis nodes behind this store (each node asked, the failing ones
    /// and why, the slots without a primary, the outages going on), if it keeps its state
    /// in Redis; `None` for a store of this process alone, which [`ready`](Store::ready)
    /// describes whole.
    #[cfg(feature = "redis")]
    fn health(&self) -> StoreFuture<'_, Option<crate::redis::Health>> {
        StoreFuture::ready(None)
    }
}

/// A store that answers without waiting on I/O (the in-memory store), so decisions can be
/// made from synchronous code.
pub trait SyncStore: Store {
    /// Applies `op` with `cost` to `key` under `policy`, synchronously.
    fn decide_sync(&self, policy: &Policy, key: &str, op: Op, cost: u64)
        -> Result<Decision, Error>;

    /// [`Store::decide_all`], synchronously.
    fn decide_all_sync(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error>;

    /// [`Store::release`], synchronously.
    fn release_sync(&self, policy: &Policy, key: &str, lease: u64) -> Result<bool, Error>;

    /// [`Store::extend`], synchronously.
    fn extend_sync(
        &self,
        policy: &Policy,
        key: &str,
        lease: u64,
    ) -> Result<Option<Duration>, Error>;

    /// Forgets `key`, synchronously.
    fn reset_sync(&self, key: &str) -> Result<(), Error>;
}

/// The future of a [`Store`] call: an answer already made (no allocation), or a boxed
/// future that makes it.
#[must_use = "a store call does nothing until awaited"]
pub struct StoreFuture<'a, T>(Inner<'a, T>);

enum Inner<'a, T> {
    Ready(Option<T>),
    Boxed(Pin<Box<dyn Future<Output = T> + Send + 'a>>),
}

impl<'a, T> StoreFuture<'a, T> {
    /// A future that answers `value` at its first poll.
    pub fn ready(value: T) -> Self {
        StoreFuture(Inner::Ready(Some(value)))
    }

    /// A future that runs `future`.
    pub fn boxed(future: impl Future<Output = T> + Send + 'a) -> Self {
        StoreFuture(Inner::Boxed(Box::pin(future)))
    }
}

// The value is moved out, never pinned in place, and the boxed future is pinned on the heap.
impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> Future for StoreFuture<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().0 {
            Inner::Ready(value) => match value.take() {
                Some(value) => Poll::Ready(value),
                None => panic!("a StoreFuture was polled after it completed"),
            },
            Inner::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> std::fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Ready(_) => "StoreFuture::Ready",
            Inner::Boxed(_) => "StoreFuture::Boxed",
        })
    }
}

//! [`open`]: any store from its URL, as one [`SharedStore`].

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, Error, InputError};

use crate::{FailurePolicy, MemoryStore, SharedStore};

/// How [`open`] builds a store. Every setting has a default; those a store does not use
/// are ignored by it (the memory store never fails, so it has no failure policy).
///
/// ```
/// use paceline_store::{FailurePolicy, StoreOptions};
/// use std::time::Duration;
/// let options = StoreOptions::new()
///     .failure_policy(FailurePolicy::FailOpen)
///     .prefix("myapp")
///     .auto_batch(Some(Duration::ZERO));
/// assert_eq!(options.get_failure_policy(), FailurePolicy::FailOpen);
/// ```
#[derive(Clone)]
#[must_use]
pub struct StoreOptions {
    failure_policy: FailurePolicy,
    clock: Option<Arc<dyn Clock>>,
    max_keys: Option<usize>,
    prefix: Option<String>,
    auto_batch: Option<Duration>,
    response_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    failure_backoff: Option<Duration>,
    ttl_slack: Option<Duration>,
    tls_root_certificate: Option<Vec<u8>>,
    refusal_cache: usize,
    sweep_every: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            failure_policy: FailurePolicy::FailClosed,
            clock: None,
            max_keys: None,
            prefix: None,
            auto_batch: None,
            response_timeout: None,
            connect_timeout: None,
            failure_backoff: None,
            ttl_slack: None,
            tls_root_certificate: None,
            refusal_cache: 0,
            sweep_every: None,
        }
    }
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("failure_policy", &self.failure_policy)
            .field("clock", &self.clock.as_ref().map(|_| "injected"))
            .field("max_keys", &self.max_keys)
            .field("prefix", &self.prefix)
            .field("auto_batch", &self.auto_batch)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("failure_backoff", &self.failure_backoff)
            .field("ttl_slack", &self.ttl_slack)
            .field("refusal_cache", &self.refusal_cache)
            .field("sweep_every", &self.sweep_every)
            .finish_non_exhaustive()
    }
}

impl StoreOptions {
    /// The defaults: fail closed, the real clock, no key cap, each store's own defaults.
    pub fn new() -> Self {
        StoreOptions::default()
    }

    /// What a networked store answers when it fails (default
    /// [`FailurePolicy::FailClosed`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// The failure policy set.
    pub fn get_failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }

    /// Reads time from `clock` instead of the real one (memory) or the server's `TIME`
    /// (Redis): for simulations and tests.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Memory store: hold at most this many active keys (see
    /// [`MemoryStoreBuilder::max_keys`](crate::MemoryStoreBuilder::max_keys)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// Redis: the key prefix (default `paceline`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Redis: coalesce concurrent decisions into one call per node, each waiting at most
    /// `linger` for others (`Some(Duration::ZERO)`: only those already queued); `None`
    /// (the default) sends one call per decision.
    pub fn auto_batch(mut self, linger: Option<Duration>) -> Self {
        self.auto_batch = linger;
        self
    }

    /// Redis: how long a call may wait for its answer (default 500 ms, at most an hour).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = Some(timeout);
        self
    }

    /// Redis: how long each connection attempt may take (default 2 s, at most an hour).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Redis: after a failure, how long calls answer by the failure policy without trying
    /// Redis (default 500 ms).
    pub fn failure_backoff(mut self, backoff: Duration) -> Self {
        self.failure_backoff = Some(backoff);
        self
    }

    /// Redis with an injected clock: the real time a key outlives its `reset_after`
    /// (default 60 s).
    pub fn ttl_slack(mut self, slack: Duration) -> Self {
        self.ttl_slack = Some(slack);
        self
    }

    /// Redis over TLS (`rediss://`): trust this CA (PEM) instead of the system's.
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// Puts a [`CachedRefusals`](crate::CachedRefusals) of `capacity` refusals in front of
    /// the store (default 0: none): a key refused with a retry-after is refused again,
    /// until then, without asking the store. Worth it for Redis, where each decision is a
    /// round trip.
    pub fn refusal_cache(mut self, capacity: usize) -> Self {
        self.refusal_cache = capacity;
        self
    }

    /// Memory store: also sweep idle keys every `period` from a task that [`open`] spawns
    /// on the current tokio runtime ([`MemoryStore::sweeper`]), so that their memory comes
    /// back even while no call arrives, e.g. after a burst of keys that then go quiet.
    /// `None` (the default): only calls sweep (see [`MemoryStore`]). The task ends once the
    /// store is dropped. Redis expires idle keys itself and ignores this. Opening a memory
    /// store with a period outside a tokio runtime is an input error naming `sweep_every`;
    /// the runtime needs its time driver (`enable_time`, on in `#[tokio::main]`), which the
    /// task's timer runs on.
    ///
    /// ```
    /// use paceline_store::{open, StoreOptions};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let options = StoreOptions::new().sweep_every(Some(Duration::from_secs(1)));
    /// assert_eq!(options.get_sweep_every(), Some(Duration::from_secs(1)));
    /// let store = open("memory", &options).await.unwrap(); // swept every second
    /// # drop(store);
    /// # }
    /// ```
    pub fn sweep_every(mut self, period: Option<Duration>) -> Self {
        self.sweep_every = period;
        self
    }

    /// The period of the memory store's sweeping task, if any.
    pub fn get_sweep_every(&self) -> Option<Duration> {
        self.sweep_every
    }
}

/// Opens the store named by `url`:
///
/// | URL | store |
/// |---|---|
/// | `memory` | a [`MemoryStore`] in this process |
/// | `redis://[user:password@]HOST:PORT[/DB]`, `rediss://...` (TLS) | one Redis server (feature `redis`) |
/// | `redis-cluster://[user:password@]HOST:PORT[,HOST:PORT...]`, `rediss-cluster://...` | a Redis Cluster (feature `redis`) |
///
/// A malformed URL or option is an [`Error::Input`] naming the field (`store` for the URL);
/// a store that cannot be reached is an [`Error::Store`].
///
/// ```
/// use paceline_store::{open, StoreOptions};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = open("memory", &StoreOptions::new()).await.unwrap();
/// assert!(store.ready().await.is_ok());
/// match open("mysql://db", &StoreOptions::new()).await {
///     Err(paceline_store::Error::Input(e)) => assert_eq!(e.field(), "store"),
///     _ => panic!("a bad URL is an input error"),
/// }
/// # }
/// ```
pub async fn open(url: &str, options: &StoreOptions) -> Result<SharedStore, Error> {
    let store = open_store(url.trim(), options).await?;
    if options.refusal_cache == 0 {
        return Ok(store);
    }
    Ok(Arc::new(crate::CachedRefusals::new(
        store,
        options.refusal_cache,
    )))
}

async fn open_store(url: &str, options: &StoreOptions) -> Result<SharedStore, Error> {
    match store_kind(url)? {
        StoreKind::Memory => {
            let mut builder = MemoryStore::builder();
            if let Some(clock) = &options.clock {
                builder = builder.shared_clock(Arc::clone(clock));
            }
            if let Some(max_keys) = options.max_keys {
                builder = builder.max_keys(max_keys);
            }
            let store = Arc::new(builder.build());
            if let Some(period) = options.sweep_every {
                let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                    InputError::new(
                        "sweep_every",
                        "sweeping a memory store needs a tokio runtime with the time driver \
                         to spawn its task on; open it from one, or leave `sweep_every` unset",
                    )
                })?;
                runtime.spawn(store.sweeper(period));
            }
            Ok(store)
        }
        StoreKind::Redis => open_redis(url, options).await,
    }
}

/// Where a store URL points (see [`open`] for the URLs): known to this module alone, so
/// that front ends ask a store what it can do, never which kind it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoreKind {
    /// `memory`: this process.
    Memory,
    /// `redis://`, `rediss://`, `redis-cluster://` or `rediss-cluster://`.
    Redis,
}

/// Checks that `url` is a store URL [`open`] takes, without connecting: for front ends that
/// check their settings before they start. A URL of no store is an input error naming the
/// field `store` and the URLs allowed (the URL quoted without its credentials).
///
/// ```
/// use paceline_store::check_store_url;
/// assert!(check_store_url("memory").is_ok());
/// assert!(check_store_url("redis-cluster://a:7000,b:7000").is_ok());
/// assert_eq!(check_store_url("mysql://u:pw@db").unwrap_err().field(), "store");
/// ```
pub fn check_store_url(url: &str) -> Result<(), InputError> {
    store_kind(url).map(|_| ())
}

/// The kind of store `url` names, or the input error [`check_store_url`] gives.
fn store_kind(url: &str) -> Result<StoreKind, InputError> {
    let url = url.trim();
    if url == "memory" || url == "memory://" {
        return Ok(StoreKind::Memory);
    }
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("redis" | "rediss" | "redis-cluster" | "rediss-cluster") => Ok(StoreKind::Redis),
        _ => Err(InputError::new(
            "store",
            format!(
                "`{}` is not a store URL; use `memory`, redis://HOST:PORT[/DB], \
                 rediss://HOST:PORT (TLS) or redis-cluster://HOST:PORT[,HOST:PORT...]",
                without_credentials(url)
            ),
        )),
    }
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str, options: &StoreOptions) -> Result<SharedStore, Error> {
    let mut builder = crate::redis::RedisStore::builder(url, options.failure_policy);
    if let Some(prefix) = &options.prefix {
        builder = builder.prefix(prefix.clone());
    }
    if let Some(clock) = &options.clock {
        builder = builder.clock(Arc::clone(clock));
    }
    if let Some(linger) = options.auto_batch {
        builder = builder.auto_batch(linger);
    }
    if let Some(timeout) = options.response_timeout {
        builder = builder.response_timeout(timeout);
    }
    if let Some(timeout) = options.connect_timeout {
        builder = builder.connect_timeout(timeout);
    }
    if let Some(backoff) = options.failure_backoff {
        builder = builder.failure_backoff(backoff);
    }
    if let Some(slack) = options.ttl_slack {
        builder = builder.ttl_slack(slack);
    }
    if let Some(pem) = &options.tls_root_certificate {
        builder = builder.tls_root_certificate(pem.clone());
    }
    Ok(Arc::new(builder.connect().await?))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(url: &str, _options: &StoreOptions) -> Result<SharedStore, Error> {
    Err(InputError::new(
        "store",
        format!(
            "`{}` needs the Redis store, which this build leaves out: enable the `redis` \
             feature (`cargo add paceline -F redis`)",
            without_credentials(url)
        ),
    )
    .into())
}

/// `url` without `user:password@`, for messages and logs.
///
/// ```
/// use paceline_store::without_credentials;
/// assert_eq!(without_credentials("redis://app:s3cret@db:6379/2"), "redis://db:6379/2");
/// assert_eq!(without_credentials("memory"), "memory");
/// ```
pub fn without_credentials(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, hosts))) => format!("{scheme}://{hosts}"),
        _ => url.to_string(),
    }
}

/// The error for a front end asked to keep `what` (e.g. "queue `emails`") on a store shared
/// across processes where it cannot: this build lacks its `redis` feature (`features` is
/// what to add), or the store does not hold Redis beneath it. Never state kept in this
/// process instead, which the other processes would not see.
///
/// ```
/// let e = paceline_store::unshared_store_error("queue `emails`", "queue,redis");
/// assert_eq!(e.field(), "store");
/// assert!(e.message().contains("`cargo add paceline -F queue,redis`"));
/// ```
pub fn unshared_store_error(what: &str, features: &str) -> InputError {
    InputError::new(
        "store",
        format!(
            "{what}: the store is shared across processes, but this build can share it only \
             in Redis, through the `redis` feature (`cargo add paceline -F {features}`), and \
             only on a store that is Redis or wraps it"
        ),
    )
}

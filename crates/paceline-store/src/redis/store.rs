//! [`RedisStore`]: keys' state in Redis or Redis Cluster, decided by the Lua twins. The
//! store composes the layers beside it: [`transport`](super::transport) (connection,
//! encoding, timeouts), [`routing`](super::routing) (which node runs what) and
//! [`resilience`](super::resilience) (the failure policy and backoff), plus auto-batching
//! ([`batch`](super::batch)).

use std::sync::Arc;
use std::time::Duration;

use paceline_core::policy::check_now;
use paceline_core::{
    Clock, Decision, Error, InputError, Op, Policy, Sleep, StoreError, StoreErrorKind,
};

use super::batch::Queue;
use super::functions::FunctionHost;
use super::health::{Health, Readiness};
use super::outage::Outage;
use super::resilience::{Resilience, LOCAL_LEASE};
use super::routing::{collect, Router};
use super::transport::{Connection, Target, Transport};
use crate::set::check_set;
use crate::{FailurePolicy, MemoryStore, Request, SetDecision, Store, StoreFuture, SyncStore};

/// The format version in every key: a change of the stored layout changes it, so an old
/// layout is never misread.
const FORMAT_VERSION: &str = "v2";

/// The longest auto-batching linger allowed.
const MAX_LINGER: Duration = Duration::from_millis(10);

/// The longest connect and response timeouts allowed: beyond it a caller would rather hang
/// than wait (and a deadline so far off no longer fits the clock's arithmetic).
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// A [`Store`] in Redis or Redis Cluster: any number of processes on any number of machines
/// share one limit, with the same decisions as the in-memory store.
///
/// * **One round trip per decision**: each decision is one call of paceline's Lua library
///   (the twin of the Rust algorithm, held equal to it by differential tests), on one key,
///   atomically: `FCALL` of a Redis function where the server has functions (Redis 7+;
///   loaded at connect and again whenever a server lacks it), else `EVALSHA` of the same code
///   as a script (reloaded after `NOSCRIPT`). With functions, `gcra` and `pacer` decisions
///   (single, or a batch of only these two) go to lean entry points that answer with each
///   key's state before its decision, from which this crate derives the decision with the
///   same Rust code the memory store runs. Many decisions can share one call:
///   [`decide_batch`](Self::decide_batch).
/// * **Time** comes from the Redis server's `TIME` (client clocks may be skewed), unless a
///   [`clock`](RedisStoreBuilder::clock) is injected for simulation and tests.
/// * **Keys** are `PREFIX:v2:KEY` (prefix `paceline` by default). State is stored exactly
///   (integers, and doubles in binary: `gcra` keeps its TAT, `pacer` its expiry and three
///   times, the others a MessagePack record) and expires when the key is idle, so Redis
///   holds only active keys. In a cluster, keys spread over slots by the caller's key; a
///   hash tag in it (`"{tenant42}:upload"`) pins related keys to one slot.
/// * **Failures** follow the [`FailurePolicy`] chosen when the store is built. A failure is
///   never reported as a rejection, and a call waits for Redis at most the
///   [`response timeout`](RedisStoreBuilder::response_timeout) (with auto-batching, a
///   queued call may also wait for a batch ahead of it: at most twice the timeout plus the
///   linger). After a failure, calls for the keys of the failed node (every key on a single
///   server, the slot in a cluster) skip Redis for the
///   [`failure backoff`](RedisStoreBuilder::failure_backoff), answering by the failure
///   policy at once, then try it again. A call that timed out after its command was sent
///   may still be applied by a slow or frozen Redis later, so its reservation may count
///   although the caller saw a failure (never the reverse: nothing admitted is lost).
///   A call whose connection could not be made, or whose connection had died with a
///   server since restarted, is sent again once on a fresh connection, so the first call
///   after a restart is answered; a call whose connection was cut while its server lives
///   on is not (it may have been applied).
/// * **Outages** (a node failing decisions for want of Redis) are logged once as they
///   begin (a warning) and once as they end (a note with their length and the decisions
///   answered without Redis meanwhile), and read by [`outages`](RedisStore::outages);
///   [`health`](RedisStore::health) asks every node whether it serves its keys (for
///   readiness probes). In a cluster each primary fails on its own: the others' keys are
///   still decided by Redis, and with auto-batching a node that does not answer delays
///   only its own keys' calls.
/// * **Requirements**: Redis 5 or newer (tested with 7.0). The store belongs to the tokio
///   runtime it was connected in: its connection (and batching) tasks run there.
///
/// ```no_run
/// use paceline_store::{redis::RedisStore, FailurePolicy, Limiter};
/// use std::sync::Arc;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_store::Error> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
///     .prefix("myapp")
///     .connect()
///     .await?;
/// let limiter = Limiter::with_store("gcra:rate=10/s,burst=5".parse()?, Arc::new(store));
/// let decision = limiter.limit("user:42", 1).await?;
/// println!("allowed: {}, remaining: {}", decision.allowed, decision.remaining);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    /// The auto-batching queue, if enabled.
    queue: Option<Queue>,
}

struct Inner {
    /// Transport and routing, shared with the auto-batching task.
    router: Arc<Router>,
    resilience: Resilience,
    clock: Option<Arc<dyn Clock>>,
    /// The auto-batching linger (zero when off).
    linger: Duration,
    /// See [`RedisStore::subscribers`].
    subscribers: Vec<redis::Client>,
}

/// The error for a set whose keys lie in different hash slots of a Redis Cluster, naming
/// the first key and one in another slot as `first` and `other` say (quoted, and however
/// the caller knows them: [`RedisStore::decide_all`] names its keys, `paceline serve` the
/// request's limits).
pub fn cross_slot_error(first: &str, other: &str) -> InputError {
    InputError::new(
        "limits",
        format!(
            "the keys {first} and {other} are in different hash slots of the Redis Cluster, \
             and a set is decided in one call on one node: give the keys of a set a common \
             hash tag, e.g. `{{tenant42}}:second` and `{{tenant42}}:day`"
        ),
    )
}

/// Configures and connects a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    failure: FailurePolicy,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    ttl_slack: Duration,
    failure_backoff: Duration,
    auto_batch: Option<Duration>,
    root_certificate: Option<Vec<u8>>,
    scripts_only: bool,
}

impl RedisStore {
    /// Starts configuring a store at `url` with the given failure policy.
    ///
    /// URLs: `redis://[user:password@]HOST:PORT[/DB]`, `rediss://...` (TLS), and
    /// `redis-cluster://[user:password@]HOST:PORT[,HOST:PORT...]` (or `rediss-cluster://`)
    /// naming one or more nodes of a cluster.
    pub fn builder(url: impl Into<String>, failure: FailurePolicy) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            failure,
            prefix: "paceline".to_string(),
            clock: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_millis(500),
            ttl_slack: Duration::from_secs(60),
            failure_backoff: Duration::from_millis(500),
            auto_batch: None,
            root_certificate: None,
            scripts_only: false,
        }
    }

    /// The failure policy chosen for this store.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.resilience.failure_policy()
    }

    /// True when the server runs paceline's Lua as a Redis function (`FCALL`; Redis 7 or
    /// newer, with permission to `FUNCTION LOAD`), false when it runs it as a script
    /// (`EVALSHA`). The decisions are the same; functions cost the server less per call.
    pub fn runs_as_functions(&self) -> bool {
        self.transport().runs_as_functions()
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.router.is_cluster()
    }

    /// The auto-batching linger, if auto-batching is on.
    pub fn auto_batch_linger(&self) -> Option<Duration> {
        self.queue.as_ref().map(|_| self.inner.linger)
    }

    /// Checks that Redis answers a `PING` within the response timeout (in a cluster, every
    /// primary the connection knows; see [`health`](Self::health) for a readiness that
    /// tells a degraded cluster from an unavailable one).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.transport()
            .query::<String>(&redis::cmd("PING"), "PING")
            .await
            .map(|_| ())
    }

    pub(super) fn transport(&self) -> &Transport {
        self.inner.router.transport()
    }

    pub(super) fn router(&self) -> &Router {
        &self.inner.router
    }

    /// Counts a function-host call on `key` (a full Redis key with its hash tag) in its
    /// node's outage, as decisions are.
    pub(super) fn observe_call(&self, key: &str, outcome: Result<(), &StoreError>) {
        let router = &self.inner.router;
        self.inner
            .resilience
            .observe(outcome, router.group_of(key), router);
    }

    /// The outages going on now: each Redis node that failed the store's last decision for
    /// its keys for want of Redis (unreachable, no answer within the response timeout,
    /// loading, a cluster down), with how long ago that began and how many decisions were
    /// answered without Redis since. Empty while every node answers. An outage's beginning
    /// and end are also logged (see `paceline::store` in the logs), once each.
    ///
    /// ```no_run
    /// # use paceline_store::{redis::RedisStore, FailurePolicy};
    /// # async fn f(store: RedisStore) {
    /// for outage in store.outages() {
    ///     eprintln!("{} failing for {:?}: {}", outage.node, outage.lasted, outage.cause);
    /// }
    /// # }
    /// ```
    pub fn outages(&self) -> Vec<Outage> {
        self.inner.resilience.outages()
    }

    /// Clients for connections of their own (subscriptions): the server's, or one per
    /// node of a cluster's seed list.
    pub(super) fn subscribers(&self) -> &[redis::Client] {
        &self.inner.subscribers
    }

    /// What every Redis key of this store starts with, e.g. `paceline:v2:` (front ends
    /// read it from their [`FunctionHost`]).
    pub(crate) fn key_prefix(&self) -> &str {
        self.transport().key_prefix()
    }

    /// The Redis key holding `key`'s state.
    ///
    /// ```no_run
    /// # use paceline_store::{redis::RedisStore, FailurePolicy};
    /// # async fn f() -> Result<(), paceline_store::Error> {
    /// let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
    ///     .connect()
    ///     .await?;
    /// assert_eq!(store.redis_key("user:42"), "paceline:v2:user:42");
    /// # Ok(()) }
    /// ```
    pub fn redis_key(&self, key: &str) -> String {
        let prefix = self.transport().key_prefix();
        let mut k = String::with_capacity(prefix.len() + key.len());
        k.push_str(prefix);
        k.push_str(key);
        k
    }

    /// Decides many requests in as few round trips as possible: one call per Redis node (in
    /// a cluster, one per node across its slots with functions, else one per slot), each
    /// carrying up to [`MAX_DECISIONS_PER_CALL`](super::MAX_DECISIONS_PER_CALL) decisions.
    /// The answers are exactly those of the same requests made one after another, in order;
    /// each request gets its own result (an input error fails only that request).
    ///
    /// ```no_run
    /// # use paceline_store::{redis::RedisStore, FailurePolicy, Request};
    /// # use paceline_store::{Op, Policy};
    /// # async fn f() -> Result<(), paceline_store::Error> {
    /// let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
    ///     .connect()
    ///     .await?;
    /// let policy: Policy = "fixed_window:limit=10,window=10s".parse()?;
    /// let requests: Vec<Request> = ["guild:1", "guild:2", "guild:1"]
    ///     .into_iter()
    ///     .map(|key| Request { policy: &policy, key, op: Op::Limit, cost: 1 })
    ///     .collect();
    /// for decision in store.decide_batch(&requests).await {
    ///     println!("{:?}", decision?);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn decide_batch(&self, requests: &[Request<'_>]) -> Vec<Result<Decision, Error>> {
        let (router, resilience) = (&self.inner.router, &self.inner.resilience);
        let now = match self.now() {
            Ok(now) => now,
            Err(e) => return requests.iter().map(|_| Err(e.clone().into())).collect(),
        };
        let mut results: Vec<Option<Result<Decision, Error>>> = vec![None; requests.len()];
        let mut valid = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            match r.policy.check_cost(r.op, r.cost) {
                Ok(()) => valid.push(i),
                Err(e) => results[i] = Some(Err(e.into())),
            }
        }
        // Each request's failure group, found once (a hash of its key in a cluster).
        let groups: Vec<usize> = requests.iter().map(|r| router.group_of(r.key)).collect();
        // Keys whose node failed moments ago are answered by the failure policy at once.
        let (waiting, to_send): (Vec<usize>, Vec<usize>) = valid
            .into_iter()
            .partition(|&i| resilience.in_backoff(groups[i]));
        for i in waiting {
            let error = resilience.skip(groups[i], router);
            results[i] = Some(resilience.fall_back(error, &requests[i]));
        }
        let batch: Vec<&Request> = to_send.iter().map(|&i| &requests[i]).collect();
        let deadline = router.transport().deadline();
        for (&i, outcome) in to_send
            .iter()
            .zip(router.run_valid(&batch, now, deadline).await)
        {
            results[i] = Some(resilience.settle(outcome, &requests[i], groups[i], router));
        }
        collect(results)
    }

    /// Applies `op` with `cost` to `key` under `policy`: one call to Redis (or a place in
    /// the next auto-batch), answered by the failure policy if Redis fails.
    pub async fn decide(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        let (router, resilience) = (&self.inner.router, &self.inner.resilience);
        let request = Request::new(policy, key, op, cost);
        policy.check_cost(op, cost)?;
        let now = self.now()?;
        let group = router.group_of(key);
        if resilience.in_backoff(group) {
            return resilience.fall_back(resilience.skip(group, router), &request);
        }
        let transport = router.transport();
        let outcome = match (&self.queue, transport.single_entry(policy)) {
            (Some(queue), _) => queue.decide(&request, now).await,
            (None, Some(function)) => transport.call_single(function, &request, now).await,
            (None, None) => transport
                .call(&[&request], now, false, transport.deadline())
                .await
                .and_then(|mut decisions| {
                    decisions.pop().ok_or_else(|| {
                        StoreError::new(StoreErrorKind::Protocol, "the script returned no decision")
                    })
                }),
        };
        resilience.settle(outcome, &request, group, router)
    }

    /// Decides a set of limits as one (see [`Store::decide_all`]): one call of the Lua
    /// library, which reads every key, decides on what it read and writes only if every
    /// limit admits. In a cluster the keys must share a hash slot (a common hash tag, e.g.
    /// `{tenant42}:second` and `{tenant42}:day`). If Redis fails, the failure policy
    /// answers for the whole set (`local`: the in-process stand-in decides it as a set).
    pub async fn decide_all(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        check_set(requests)?;
        if let [r] = requests {
            let decision = self.decide(r.policy, r.key, r.op, r.cost).await?;
            return Ok(SetDecision::new(decision.allowed, vec![decision]));
        }
        let (router, resilience) = (&self.inner.router, &self.inner.resilience);
        let first = requests[0].key;
        if let Some(i) = self.key_across_slots(requests.iter().map(|r| r.key)) {
            let other = requests[i].key;
            return Err(cross_slot_error(&format!("`{first}`"), &format!("`{other}`")).into());
        }
        let now = self.now()?;
        let group = router.group_of(first);
        if resilience.in_backoff(group) {
            return resilience.fall_back_all(resilience.skip(group, router), requests);
        }
        let batch: Vec<&Request> = requests.iter().collect();
        let outcome = router.transport().call_all(&batch, now).await;
        resilience.settle_all(outcome, requests, group, router)
    }

    /// In a Redis Cluster, the position of the first of `keys` whose hash slot is not the
    /// first key's: such keys cannot be decided as one set ([`RedisStore::decide_all`]
    /// refuses them with [`cross_slot_error`]). `None` on a single server, or when every key
    /// shares the first one's slot.
    pub fn key_across_slots<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Option<usize> {
        let router = &self.inner.router;
        if !router.is_cluster() {
            return None;
        }
        let mut keys = keys.into_iter();
        let slot = router.slot_of(keys.next()?);
        keys.position(|k| router.slot_of(k) != slot).map(|i| i + 1)
    }

    /// Gives back lease `lease` of `key` under `policy` (see [`Store::release`]): one call
    /// of the Lua library; or, for a lease the `local` failure policy's in-process stand-in
    /// took while Redis was down (its id marked), the stand-in gives it back. A failed
    /// Redis is an error.
    pub async fn release(&self, policy: &Policy, key: &str, lease: u64) -> Result<bool, Error> {
        policy.concurrency()?;
        if lease & LOCAL_LEASE != 0 {
            return match self.inner.resilience.local() {
                Some(local) => local.release_sync(policy, key, lease & !LOCAL_LEASE),
                None => Ok(false),
            };
        }
        let now = self.now()?;
        let reply = self
            .transport()
            .call_lease(policy, key, lease, false, now)
            .await?;
        Ok(reply == 1)
    }

    /// Renews lease `lease` of `key` under `policy` (see [`Store::extend`]), in Redis, or in
    /// the in-process stand-in that took it.
    pub async fn extend(
        &self,
        policy: &Policy,
        key: &str,
        lease: u64,
    ) -> Result<Option<Duration>, Error> {
        let duration = policy.concurrency()?.lease();
        if lease & LOCAL_LEASE != 0 {
            return match self.inner.resilience.local() {
                Some(local) => local.extend_sync(policy, key, lease & !LOCAL_LEASE),
                None => Ok(None),
            };
        }
        let now = self.now()?;
        let reply = self
            .transport()
            .call_lease(policy, key, lease, true, now)
            .await?;
        Ok((reply >= 0).then_some(duration))
    }

    /// Deletes the key. A store failure is returned whatever the failure policy (with
    /// `local`, the in-process stand-in forgets the key too).
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        if let Some(local) = self.inner.resilience.local() {
            local.reset_sync(key)?;
        }
        let mut del = redis::cmd("DEL");
        del.arg(self.redis_key(key));
        self.transport().query::<i64>(&del, "a reset").await?;
        Ok(())
    }

    /// The injected clock's time, or `None` to use the server's.
    fn now(&self) -> Result<Option<u64>, InputError> {
        let Some(clock) = &self.inner.clock else {
            return Ok(None);
        };
        let now = clock.now_micros();
        check_now(now)?;
        Ok(Some(now))
    }
}

impl RedisStoreBuilder {
    /// Prefixes every key with `PREFIX:v2:` (default `paceline`). Give each application
    /// sharing a Redis its own prefix. Braces are not allowed: they would form a hash tag.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Reads time from `clock` instead of the server's `TIME`: for simulation and tests.
    /// With a clock whose time does not follow the real one, keys live in Redis for their
    /// `reset_after` plus the [`ttl_slack`](Self::ttl_slack) in real time.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How long each connection attempt may take (default 2 s, at most an hour).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a call may wait for Redis's answer, reconnecting included (default 500 ms,
    /// at most an hour).
    /// Past it, the call fails with a [`StoreErrorKind::Timeout`] handled by the failure
    /// policy. It bounds a whole [`decide_batch`](RedisStore::decide_batch), however many
    /// calls of [`MAX_DECISIONS_PER_CALL`](super::MAX_DECISIONS_PER_CALL) decisions it takes.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// With an injected [`clock`](Self::clock): the real time a key outlives its
    /// `reset_after` in Redis (default 60 s), so a run whose virtual time moves slower than
    /// real time keeps the state it still needs (for up to this long).
    pub fn ttl_slack(mut self, slack: Duration) -> Self {
        self.ttl_slack = slack;
        self
    }

    /// After a failure, how long calls answer by the failure policy without trying Redis
    /// (default 500 ms; zero tries Redis on every call).
    pub fn failure_backoff(mut self, backoff: Duration) -> Self {
        self.failure_backoff = backoff;
        self
    }

    /// Coalesces concurrent decisions into one call per Redis node (as
    /// [`decide_batch`](RedisStore::decide_batch) groups them): a decision waits at most
    /// `linger` (at most 10 ms) for others to join its batch; with zero it leaves with those
    /// already queued. Batches also form by themselves under load, while earlier ones are in
    /// flight (at most [`MAX_BATCHES_IN_FLIGHT`](crate::redis::MAX_BATCHES_IN_FLIGHT) at
    /// once per Redis node, so a node that does not answer holds only its own keys' calls),
    /// so zero is the usual choice. A queued decision is answered within twice the
    /// response timeout plus the linger. tokio's timers count whole milliseconds, so a
    /// linger under a millisecond may wait up to about one. Decisions are exactly
    /// those of sequential calls. Off by default: the lowest latency for a single caller is
    /// one call per decision; under many concurrent callers, batching multiplies the
    /// decisions per second one Redis core can make.
    pub fn auto_batch(mut self, linger: Duration) -> Self {
        self.auto_batch = Some(linger);
        self
    }

    /// For `rediss://` URLs: trust the CA in `pem` (PEM text, e.g. read from `ca.crt`)
    /// instead of the system's certificate store, for servers with a private CA.
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// Runs paceline's Lua as a script (`EVALSHA`) even where the server has functions, e.g.
    /// where operators do not want libraries loaded into Redis. Same decisions; each call
    /// costs the server more.
    pub fn scripts_only(mut self) -> Self {
        self.scripts_only = true;
        self
    }

    /// Validates the settings and connects.
    pub async fn connect(self) -> Result<RedisStore, Error> {
        let target = Target::parse(&self.url)?;
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return Err(InputError::new(
                "prefix",
                format!(
                    "`{}`: use a non-empty prefix without braces, e.g. `myapp`",
                    self.prefix
                ),
            )
            .into());
        }
        for (field, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(InputError::new(field, "must be greater than zero, e.g. 500ms").into());
            }
            if value > MAX_TIMEOUT {
                return Err(InputError::new(
                    field,
                    format!("{value:?} is too long; use at most {MAX_TIMEOUT:?}, e.g. 500ms"),
                )
                .into());
            }
        }
        if let Some(linger) = self.auto_batch {
            if linger > MAX_LINGER {
                return Err(InputError::new(
                    "auto_batch",
                    format!("a linger of {linger:?} is too long; use at most {MAX_LINGER:?}, e.g. 0 (only the decisions already waiting)"),
                )
                .into());
            }
        }
        if self.root_certificate.is_some() && !target.uses_tls() {
            return Err(InputError::new(
                "tls_root_certificate",
                "is only used with TLS: use a rediss:// (or rediss-cluster://) URL",
            )
            .into());
        }
        let subscribers = target
            .clients(self.root_certificate.as_deref())
            .map_err(|e| super::transport::store_error(e, "a client"))?;
        let connection = Connection::open(
            &target,
            self.root_certificate.as_deref(),
            self.connect_timeout,
            self.response_timeout,
        )
        .await?;
        let local = (self.failure == FailurePolicy::Local).then(|| match &self.clock {
            Some(clock) => MemoryStore::builder()
                .shared_clock(Arc::clone(clock))
                .build(),
            None => MemoryStore::new(),
        });
        let ttl_slack_ms = if self.clock.is_some() {
            u64::try_from(self.ttl_slack.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let key_prefix = format!("{}:{FORMAT_VERSION}:", self.prefix);
        let transport = Transport::new(
            connection,
            key_prefix,
            ttl_slack_ms,
            self.response_timeout,
            self.scripts_only,
        )
        .await;
        let router = Arc::new(Router::new(transport, target.describe()).await);
        let resilience = Resilience::new(
            self.failure,
            local,
            self.failure_backoff,
            router.failure_groups(),
        );
        let linger = self.auto_batch.unwrap_or_default();
        // A queued call may wait for a batch ahead of it, then for its own, then the linger.
        let bound = self
            .response_timeout
            .saturating_mul(2)
            .saturating_add(linger);
        let queue = self
            .auto_batch
            .map(|_| Queue::spawn(Arc::clone(&router), linger, bound));
        let store = RedisStore {
            queue,
            inner: Arc::new(Inner {
                router,
                resilience,
                clock: self.clock,
                linger,
                subscribers,
            }),
        };
        Ok(store)
    }
}

impl Store for RedisStore {
    fn decide<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        cost: u64,
    ) -> StoreFuture<'a, Result<Decision, Error>> {
        StoreFuture::boxed(RedisStore::decide(self, policy, key, op, cost))
    }

    fn decide_batch<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Vec<Result<Decision, Error>>> {
        StoreFuture::boxed(RedisStore::decide_batch(self, requests))
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Result<SetDecision, Error>> {
        StoreFuture::boxed(RedisStore::decide_all(self, requests))
    }

    fn release<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<bool, Error>> {
        StoreFuture::boxed(RedisStore::release(self, policy, key, lease))
    }

    fn extend<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<Option<Duration>, Error>> {
        StoreFuture::boxed(RedisStore::extend(self, policy, key, lease))
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>> {
        StoreFuture::boxed(RedisStore::reset(self, key))
    }

    /// Ready unless no node serves any key ([`Readiness::Unavailable`] by
    /// [`health`](RedisStore::health)): a degraded cluster still decides most keys.
    fn ready(&self) -> StoreFuture<'_, Result<(), Error>> {
        StoreFuture::boxed(async move {
            let health = self.health().await;
            if health.readiness != Readiness::Unavailable {
                return Ok(());
            }
            let why: Vec<String> = health
                .failing
                .iter()
                .map(|f| format!("{}: {}", f.node, f.problem))
                .collect();
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("no Redis node serves keys now ({})", why.join("; ")),
            )
            .into())
        })
    }

    fn token_key<'a>(
        &'a self,
        name: &'a str,
    ) -> StoreFuture<'a, Result<crate::secret::TokenKey, Error>> {
        StoreFuture::boxed(RedisStore::token_key(self, name))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        match &self.inner.clock {
            Some(clock) => clock.sleep(duration),
            None => Box::pin(tokio::time::sleep(duration)),
        }
    }

    fn time_source(&self) -> Option<Arc<dyn Clock>> {
        self.inner.clock.clone()
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn functions(&self) -> Option<FunctionHost> {
        Some(FunctionHost::from(self.clone()))
    }

    fn health(&self) -> StoreFuture<'_, Option<Health>> {
        StoreFuture::boxed(async move { Some(RedisStore::health(self).await) })
    }

    fn key_apart(&self, keys: &[&str]) -> Option<usize> {
        self.key_across_slots(keys.iter().copied())
    }
}

//! [`RedisStore`]: keys' state in Redis or Redis Cluster, decided by the Lua twins.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use paceline_core::policy::check_now;
use paceline_core::{
    Clock, Decision, Error, Fallback, InputError, Op, Policy, Sleep, StoreError, StoreErrorKind,
};
use redis::{RedisResult, Value};

use super::args::{push_clock, push_params, push_policy, push_request, Prefixed};
use super::batch::{self, Job, Queue};
use super::connection::{crc16, error_kind, prefixed_slot, Connection, Target, SLOTS};
use super::script::{lean_decisions, parse_reply, single_decision, DECIDE, LIBRARY};
use crate::{FailurePolicy, MemoryStore, Request, Store, StoreFuture, SyncStore};

/// The format version in every key: a change of the stored layout changes it, so an old
/// layout is never misread.
const FORMAT_VERSION: &str = "v2";

/// The most decisions sent in one script call; larger batches are split, so one call never
/// holds the server for long.
pub const MAX_DECISIONS_PER_CALL: usize = 512;

/// The longest auto-batching linger allowed.
const MAX_LINGER: Duration = Duration::from_millis(10);

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
    /// The auto-batching queue, if enabled (absent in the batching task's own handle).
    queue: Option<Queue>,
}

struct Inner {
    connection: Connection,
    /// `PREFIX:v2:`.
    key_prefix: String,
    /// CRC16 of `key_prefix`, so a key's cluster slot needs no joined string.
    prefix_crc: u16,
    clock: Option<Arc<dyn Clock>>,
    ttl_slack_ms: u64,
    response_timeout: Duration,
    failure: FailurePolicy,
    /// The stand-in for [`FailurePolicy::Local`].
    local: Option<MemoryStore>,
    failure_backoff: Duration,
    /// Per node group (one for a single server, one per hash slot in a cluster): microseconds
    /// after `started` before which Redis is not tried again for those keys.
    down_until: Box<[AtomicU64]>,
    /// True from a failure until Redis answers again; the `local` stand-in starts afresh
    /// at each new outage.
    outage: AtomicBool,
    /// The failure that started the current backoff, quoted by calls that skip Redis.
    last_failure: Mutex<Option<StoreError>>,
    started: std::time::Instant,
    /// The auto-batching linger (zero when off).
    linger: Duration,
    /// True when the server runs paceline's Lua as a Redis function (`FCALL`, Redis 7+);
    /// false: as a script (`EVALSHA`).
    functions: bool,
    /// In a cluster run with functions: which node (a small number) serves each slot.
    nodes: RwLock<Option<Arc<[u16]>>>,
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
        self.inner.failure
    }

    /// True when the server runs paceline's Lua as a Redis function (`FCALL`; Redis 7 or
    /// newer, with permission to `FUNCTION LOAD`), false when it runs it as a script
    /// (`EVALSHA`). The decisions are the same; functions cost the server less per call.
    pub fn runs_as_functions(&self) -> bool {
        self.inner.functions
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.connection.is_cluster()
    }

    /// Checks that Redis answers a `PING` within the response timeout (for readiness
    /// probes).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.inner.connection.clone();
        self.bounded(
            redis::cmd("PING").query_async::<String>(&mut connection),
            "PING",
        )
        .await
        .map(|_| ())
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
        let mut k = String::with_capacity(self.inner.key_prefix.len() + key.len());
        k.push_str(&self.inner.key_prefix);
        k.push_str(key);
        k
    }

    /// Decides many requests in as few round trips as possible: one call per Redis node (in
    /// a cluster, one per node across its slots with functions, else one per slot), each
    /// carrying up to
    /// [`MAX_DECISIONS_PER_CALL`] decisions. The answers are exactly those of the same
    /// requests made one after another, in order; each request gets its own result (an input
    /// error fails only that request).
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
        // Keys whose node failed moments ago are answered by the failure policy at once.
        let (waiting, to_send): (Vec<usize>, Vec<usize>) = valid
            .into_iter()
            .partition(|&i| self.in_backoff(self.group_of(requests[i].key)));
        if !waiting.is_empty() {
            let error = self.backoff_error();
            for i in waiting {
                results[i] = Some(self.fall_back(error.clone(), &requests[i]));
            }
        }
        let batch: Vec<&Request> = to_send.iter().map(|&i| &requests[i]).collect();
        for (&i, outcome) in to_send.iter().zip(self.run_valid(&batch, now).await) {
            results[i] = Some(self.settle(outcome, &requests[i]));
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
        let request = Request::new(policy, key, op, cost);
        policy.check_cost(op, cost)?;
        let now = self.now()?;
        if self.in_backoff(self.group_of(key)) {
            return self.fall_back(self.backoff_error(), &request);
        }
        let outcome = match (&self.queue, self.single_entry(policy)) {
            (Some(queue), _) => self.through_queue(queue, &request, now).await,
            (None, Some(function)) => self.call_single(function, &request, now).await,
            (None, None) => {
                let deadline = Instant::now() + self.inner.response_timeout;
                self.call(&[&request], now, false, deadline)
                    .await
                    .and_then(|mut decisions| {
                        decisions.pop().ok_or_else(|| {
                            StoreError::new(
                                StoreErrorKind::Protocol,
                                "the script returned no decision",
                            )
                        })
                    })
            }
        };
        self.settle(outcome, &request)
    }

    /// Deletes the key. A store failure is returned whatever the failure policy (with
    /// `local`, the in-process stand-in forgets the key too).
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        if let Some(local) = &self.inner.local {
            local.reset_sync(key)?;
        }
        let mut connection = self.inner.connection.clone();
        let mut del = redis::cmd("DEL");
        del.arg(self.redis_key(key));
        self.bounded(del.query_async::<i64>(&mut connection), "a reset")
            .await?;
        Ok(())
    }

    /// Runs validated requests in as few calls as possible: grouped by the node that must
    /// run them (by slot in a cluster whose node map is unknown), in order, at most
    /// [`MAX_DECISIONS_PER_CALL`] per call. Groups run concurrently; a group's calls run
    /// one after another, since they may share keys. One result per request, in order.
    /// The response timeout bounds the whole run, however many calls it takes.
    pub(crate) async fn run_valid(
        &self,
        requests: &[&Request<'_>],
        now: Option<u64>,
    ) -> Vec<Result<Decision, StoreError>> {
        let deadline = Instant::now() + self.inner.response_timeout;
        // In a cluster whose slot map is known, one call per node: the library may touch
        // several slots of the node it runs on. Otherwise one call per slot.
        let nodes = self.node_map();
        let groups = self.groups(requests, nodes.as_deref());
        let stale = AtomicBool::new(false);
        let outcomes =
            futures_util::future::join_all(groups.into_iter().map(|(group, indices)| {
                self.run_group(requests, group, indices, now, deadline, &stale)
            }))
            .await;
        if stale.load(Ordering::Relaxed) {
            self.refresh_node_map().await;
        }
        let mut results: Vec<Option<Result<Decision, StoreError>>> = vec![None; requests.len()];
        for (i, outcome) in outcomes.into_iter().flatten() {
            results[i] = Some(outcome);
        }
        collect(results)
    }

    /// Runs one group's requests (`indices` into `requests`), in order, at most
    /// [`MAX_DECISIONS_PER_CALL`] per call, all answered by `deadline`; sets `stale` if the
    /// slot map proved stale.
    async fn run_group(
        &self,
        requests: &[&Request<'_>],
        group: Group,
        indices: Vec<usize>,
        now: Option<u64>,
        deadline: Instant,
        stale: &AtomicBool,
    ) -> Vec<(usize, Result<Decision, StoreError>)> {
        let spread = matches!(group, Group::Node(_));
        let mut outcomes = Vec::with_capacity(indices.len());
        for chunk in indices.chunks(MAX_DECISIONS_PER_CALL) {
            let batch: Vec<&Request> = chunk.iter().map(|&i| requests[i]).collect();
            match self.call(&batch, now, spread, deadline).await {
                // The slot map was stale (a slot moved): the call failed reading its keys,
                // before any write, so it is safe to send again, per slot.
                Err(e) if spread && is_redirect(&e) => {
                    stale.store(true, Ordering::Relaxed);
                    for indices in self.groups(&batch, None).into_values() {
                        let part: Vec<&Request> = indices.iter().map(|&i| batch[i]).collect();
                        let outcome = self.call(&part, now, false, deadline).await;
                        fan_out(&mut outcomes, indices.iter().map(|&i| chunk[i]), outcome);
                    }
                }
                outcome => fan_out(&mut outcomes, chunk.iter().copied(), outcome),
            }
        }
        outcomes
    }

    /// `requests`' indices by the group that must run them, each in order: by node when
    /// `nodes` (the slot-to-node map) is given, else by slot; one group on a single server.
    fn groups(
        &self,
        requests: &[&Request<'_>],
        nodes: Option<&[u16]>,
    ) -> BTreeMap<Group, Vec<usize>> {
        let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
        for (i, r) in requests.iter().enumerate() {
            let group = if self.is_cluster() {
                let slot = self.slot_of(r.key);
                match nodes.map(|n| n[usize::from(slot)]) {
                    Some(node) if node != NO_NODE => Group::Node(node),
                    _ => Group::Slot(slot),
                }
            } else {
                Group::Single
            };
            groups.entry(group).or_default().push(i);
        }
        groups
    }

    /// The cluster's slot-to-node map, if known (cluster with functions only).
    fn node_map(&self) -> Option<Arc<[u16]>> {
        self.inner
            .nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the slot-to-node map from the cluster (`CLUSTER SLOTS`); on failure, forgets
    /// it, so calls go per slot until the next refresh.
    pub(crate) async fn refresh_node_map(&self) {
        if !self.is_cluster() || !self.inner.functions {
            return;
        }
        let mut connection = self.inner.connection.clone();
        let reply: Result<Value, StoreError> = self
            .bounded(
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut connection),
                "CLUSTER SLOTS",
            )
            .await;
        let map = reply.ok().and_then(|v| slot_map(&v));
        *self
            .inner
            .nodes
            .write()
            .unwrap_or_else(PoisonError::into_inner) = map;
    }

    /// Hands `request` to the batching task and waits for its answer.
    async fn through_queue(
        &self,
        queue: &Queue,
        request: &Request<'_>,
        now: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            policy: request.policy.clone(),
            key: request.key.to_string(),
            op: request.op,
            cost: request.cost,
            now,
            reply,
        };
        if queue.send(job).is_err() {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the auto-batching task has stopped (its tokio runtime shut down)",
            ));
        }
        // The batch call itself is bounded by the response timeout; the linger and a queue
        // ahead of it come on top, bounded here.
        let limit = self
            .inner
            .response_timeout
            .saturating_mul(2)
            .saturating_add(self.inner.linger);
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the auto-batching task dropped the request (its tokio runtime shut down)",
            )),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer from the auto-batching queue within {limit:?}"),
            )),
        }
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

    /// One script call carrying `batch`, in order.
    ///
    /// `spread`: the keys may span several slots of one cluster node; they go in the
    /// arguments, with only the first declared as a key (which routes the call to its
    /// node), and the library, flagged `allow-cross-slot-keys`, reads them all before it
    /// writes any.
    async fn call(
        &self,
        batch: &[&Request<'_>],
        now: Option<u64>,
        spread: bool,
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        // Each distinct policy is sent once; decisions refer to it by number.
        let mut policies: Vec<&Policy> = Vec::new();
        let mut numbers = Vec::with_capacity(batch.len());
        for r in batch {
            let known = policies
                .iter()
                .rposition(|p| std::ptr::eq(*p, r.policy) || *p == r.policy);
            numbers.push(match known {
                Some(i) => i + 1,
                None => {
                    policies.push(r.policy);
                    policies.len()
                }
            });
        }
        // The lean batch answers `gcra` and `pacer` decisions with less work for the server;
        // it takes the same arguments (see `PL.read_batch` in `lua/prelude.lua`).
        let lean = self.inner.functions && policies.iter().all(|p| LIBRARY.single(p).is_some());
        let mut call = if self.inner.functions {
            let mut call = redis::cmd("FCALL");
            call.arg(if lean {
                &LIBRARY.lean_batch
            } else {
                &LIBRARY.function
            });
            call
        } else {
            let mut call = redis::cmd("EVALSHA");
            call.arg(DECIDE.get_hash());
            call
        };
        // The keys, each written under the prefix straight into the command.
        let prefix = self.inner.key_prefix.as_str();
        let push_keys = |call: &mut redis::Cmd| {
            call.arg(batch.len());
            for r in batch {
                call.arg(Prefixed(prefix, r.key));
            }
        };
        // (Node groups exist only on clusters running the library as functions.)
        let spread = spread && batch.len() > 1;
        if spread {
            call.arg(1).arg(Prefixed(prefix, batch[0].key));
        } else {
            push_keys(&mut call);
        }
        push_clock(now, self.inner.ttl_slack_ms, &mut call);
        if spread {
            push_keys(&mut call);
        } else {
            call.arg(0);
        }
        call.arg(policies.len());
        for policy in &policies {
            push_policy(policy, &mut call);
        }
        let runs = runs(batch, &numbers);
        call.arg(runs.len());
        for (start, count) in runs {
            call.arg(count).arg(numbers[start]);
            push_request(batch[start].op, batch[start].cost, &mut call);
        }
        let mut connection = self.inner.connection.clone();
        let reply = self
            .bounded_until(deadline, run_decide(&mut connection, &call), "a decision")
            .await?;
        if lean {
            lean_decisions(reply, batch, now)
        } else {
            parse_reply(reply, batch.iter().map(|r| r.policy.limit()))
        }
    }

    /// The single-decision entry point for `policy`'s algorithm, if the server has one
    /// (`gcra` and `pacer`, run as functions).
    fn single_entry(&self, policy: &Policy) -> Option<&'static str> {
        if !self.inner.functions {
            return None;
        }
        LIBRARY.single(policy)
    }

    /// One decision by a single-decision entry point (`function`, see `lua/lean.lua`):
    /// the server applies it and answers with the state it saw, from which the Rust
    /// algorithm derives the decision.
    async fn call_single(
        &self,
        function: &str,
        r: &Request<'_>,
        now: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let mut call = redis::cmd("FCALL");
        call.arg(function)
            .arg(1)
            .arg(Prefixed(&self.inner.key_prefix, r.key));
        push_clock(now, self.inner.ttl_slack_ms, &mut call);
        push_request(r.op, r.cost, &mut call);
        push_params(r.policy, &mut call);
        let mut connection = self.inner.connection.clone();
        let reply = self
            .bounded(run_decide(&mut connection, &call), "a decision")
            .await?;
        single_decision(reply, r, now)
    }

    /// Awaits `f` for at most the response timeout.
    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
        what: &str,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.inner.response_timeout;
        self.bounded_until(deadline, f, what).await
    }

    /// Awaits `f` until `deadline` at the latest (set by the response timeout).
    async fn bounded_until<T>(
        &self,
        deadline: Instant,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
        what: &str,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::new(
                error_kind(&e),
                format!("Redis failed {what}: {e}"),
            )),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "Redis did not answer {what} within {:?} (the store's response timeout)",
                    self.inner.response_timeout
                ),
            )),
        }
    }

    fn elapsed_us(&self) -> u64 {
        u64::try_from(self.inner.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The hash slot of `key`'s Redis key (in a cluster).
    fn slot_of(&self, key: &str) -> u16 {
        prefixed_slot(self.inner.prefix_crc, key.as_bytes())
    }

    /// The backoff group of `key`: its hash slot in a cluster, 0 on a single server.
    fn group_of(&self, key: &str) -> usize {
        if self.is_cluster() {
            usize::from(self.slot_of(key))
        } else {
            0
        }
    }

    /// The auto-batching linger (zero when off).
    pub(crate) fn linger(&self) -> Duration {
        self.inner.linger
    }

    fn in_backoff(&self, group: usize) -> bool {
        self.inner
            .down_until
            .get(group)
            .is_some_and(|until| self.elapsed_us() < until.load(Ordering::Relaxed))
    }

    /// A request's outcome from Redis: the decision, or the failure policy's answer.
    fn settle(
        &self,
        outcome: Result<Decision, StoreError>,
        request: &Request<'_>,
    ) -> Result<Decision, Error> {
        match outcome {
            Ok(decision) => {
                if self.inner.outage.load(Ordering::Relaxed) {
                    self.inner.outage.store(false, Ordering::Relaxed);
                }
                Ok(decision)
            }
            Err(e) => {
                self.mark_down(self.group_of(request.key), &e);
                self.fall_back(e, request)
            }
        }
    }

    fn mark_down(&self, group: usize, error: &StoreError) {
        // A script or reply error is not an outage: retrying at once is right.
        if !matches!(
            error.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        ) {
            return;
        }
        if !self.inner.outage.swap(true, Ordering::Relaxed) {
            // A new outage: the stand-in starts from idle keys, as documented, rather than
            // from what it saw during an earlier one.
            if let Some(local) = &self.inner.local {
                local.clear();
            }
        }
        *self
            .inner
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.clone());
        let backoff = u64::try_from(self.inner.failure_backoff.as_micros()).unwrap_or(u64::MAX);
        if let Some(until) = self.inner.down_until.get(group) {
            until.store(self.elapsed_us().saturating_add(backoff), Ordering::Relaxed);
        }
    }

    fn backoff_error(&self) -> StoreError {
        let last = self
            .inner
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (kind, cause) = match last {
            Some(e) => (e.kind(), e.message().to_string()),
            None => (StoreErrorKind::Unavailable, "unknown".to_string()),
        };
        StoreError::new(
            kind,
            format!(
                "Redis failed less than {:?} ago and is not retried before the store's failure \
                 backoff has passed; the failure: {cause}",
                self.inner.failure_backoff
            ),
        )
    }

    /// The failure policy's answer to a failed request.
    fn fall_back(&self, error: StoreError, r: &Request<'_>) -> Result<Decision, Error> {
        match self.inner.failure {
            FailurePolicy::FailClosed => Err(error.into()),
            FailurePolicy::FailOpen => Ok(Decision::from_micros(
                true,
                0.0,
                r.policy.limit().saturating_sub(r.cost),
                0.0,
                r.policy.limit(),
            )
            .with_fallback(Fallback::FailOpen)),
            FailurePolicy::Local => match &self.inner.local {
                Some(local) => local
                    .decide_sync(r.policy, r.key, r.op, r.cost)
                    .map(|d| d.with_fallback(Fallback::Local)),
                None => Err(error.into()),
            },
        }
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

    /// How long each connection attempt may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a call may wait for Redis's answer, reconnecting included (default 500 ms).
    /// Past it, the call fails with a [`StoreErrorKind::Timeout`] handled by the failure
    /// policy. It bounds a whole [`decide_batch`](RedisStore::decide_batch), however many
    /// calls of [`MAX_DECISIONS_PER_CALL`] decisions it takes.
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
    /// `linger` (at most 10 ms; e.g. 200 µs) for others to join its batch; with zero it
    /// leaves with those already queued. Batches also form
    /// by themselves under load, while earlier ones are in flight. Decisions are exactly
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
        }
        if let Some(linger) = self.auto_batch {
            if linger > MAX_LINGER {
                return Err(InputError::new(
                    "auto_batch",
                    format!("a linger of {linger:?} is too long; use at most {MAX_LINGER:?}, e.g. 200µs"),
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
        let groups = if connection.is_cluster() { SLOTS } else { 1 };
        let key_prefix = format!("{}:{FORMAT_VERSION}:", self.prefix);
        let functions = !self.scripts_only && load_library(&mut connection.clone()).await.is_ok();
        let mut store = RedisStore {
            queue: None,
            inner: Arc::new(Inner {
                connection,
                prefix_crc: crc16(0, key_prefix.as_bytes()),
                key_prefix,
                clock: self.clock,
                ttl_slack_ms,
                response_timeout: self.response_timeout,
                failure: self.failure,
                local,
                failure_backoff: self.failure_backoff,
                down_until: (0..groups).map(|_| AtomicU64::new(0)).collect(),
                outage: AtomicBool::new(false),
                last_failure: Mutex::new(None),
                started: std::time::Instant::now(),
                linger: self.auto_batch.unwrap_or_default(),
                functions,
                nodes: RwLock::new(None),
            }),
        };
        store.refresh_node_map().await;
        if self.auto_batch.is_some() {
            store.queue = Some(batch::spawn(store.clone()));
        }
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

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>> {
        StoreFuture::boxed(RedisStore::reset(self, key))
    }

    fn ready(&self) -> StoreFuture<'_, Result<(), Error>> {
        StoreFuture::boxed(async move { Ok(self.ping().await?) })
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        match &self.inner.clock {
            Some(clock) => clock.sleep(duration),
            None => Box::pin(tokio::time::sleep(duration)),
        }
    }
}

/// A slot without a known node.
const NO_NODE: u16 = u16::MAX;

/// The slot-to-node map from a `CLUSTER SLOTS` reply: `[start, end, [host, port, ...],
/// replicas...]` per range; nodes are numbered in order of first appearance.
fn slot_map(reply: &Value) -> Option<Arc<[u16]>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut map = vec![NO_NODE; usize::from(SLOTS)];
    let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (primary.first(), primary.get(1))
        else {
            return None;
        };
        let node = match nodes.iter().position(|(h, p)| h == host && p == port) {
            Some(i) => i,
            None => {
                nodes.push((host.clone(), *port));
                nodes.len() - 1
            }
        };
        let node = u16::try_from(node).ok()?;
        let start = usize::try_from(*start).ok()?;
        let end = usize::try_from(*end).ok()?;
        for slot in map.get_mut(start..=end)? {
            *slot = node;
        }
    }
    Some(map.into())
}

/// A batch's consecutive requests with the same policy (by its number in the call), op
/// (`max_wait` included) and cost, as (the first one's index, how many): each run is sent
/// once (see `PL.read_batch` in `lua/prelude.lua`).
fn runs(batch: &[&Request<'_>], numbers: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, (r, &number)) in batch.iter().zip(numbers).enumerate() {
        match runs.last_mut() {
            Some((start, count))
                if numbers[*start] == number
                    && batch[*start].op == r.op
                    && batch[*start].cost == r.cost =>
            {
                *count += 1
            }
            _ => runs.push((i, 1)),
        }
    }
    runs
}

/// True if Redis refused a call because its keys are not (all) served by the node it
/// reached: the call changed nothing (the library reads every key before writing).
fn is_redirect(e: &StoreError) -> bool {
    let m = e.message();
    ["CROSSSLOT", "MOVED ", "ASK ", "TRYAGAIN", "non local key"]
        .iter()
        .any(|code| m.contains(code))
}

/// Sends a decision call (`FCALL` or `EVALSHA`), loading the code first if the server
/// lacks it (a fresh or restarted server, or a cluster node that just took over), then
/// sending the call again.
async fn run_decide(connection: &mut Connection, call: &redis::Cmd) -> RedisResult<Value> {
    match call.query_async(connection).await {
        Err(e) if e.to_string().contains("Function not found") => {
            load_library(connection).await?;
            call.query_async(connection).await
        }
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            DECIDE.prepare_invoke().load_async(connection).await?;
            call.query_async(connection).await
        }
        other => other,
    }
}

/// Loads paceline's Lua library as Redis functions (on every primary of a cluster). A
/// library of the same name is the same code (the name carries its hash), so "already
/// exists" is success. Fails on servers without functions (before Redis 7) or without
/// permission to load them; the store then calls the same code as a script.
async fn load_library(connection: &mut Connection) -> RedisResult<()> {
    let loaded: RedisResult<Value> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&LIBRARY.code)
        .query_async(connection)
        .await;
    match loaded {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("already exists") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Which calls a request can share: one server, one cluster slot, or one cluster node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Single,
    Slot(u16),
    Node(u16),
}

/// The error for a request left without an answer (which would be a bug).
fn no_answer() -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, "no answer for a request")
}

/// Every request's result; a request left without one is an error.
fn collect<E: From<StoreError>>(
    results: Vec<Option<Result<Decision, E>>>,
) -> Vec<Result<Decision, E>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(no_answer().into())))
        .collect()
}

/// Records one call's outcome for the requests it carried (`indices`, in order).
fn fan_out(
    outcomes: &mut Vec<(usize, Result<Decision, StoreError>)>,
    indices: impl Iterator<Item = usize>,
    outcome: Result<Vec<Decision>, StoreError>,
) {
    match outcome {
        Ok(decisions) => outcomes.extend(indices.zip(decisions.into_iter().map(Ok))),
        Err(e) => outcomes.extend(indices.map(|i| (i, Err(e.clone())))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn the_slot_map_numbers_nodes_by_first_appearance() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "127.0.0.1", 7001),
            range(10923, 16383, "127.0.0.1", 7000),
        ]);
        let map = slot_map(&reply).expect("a valid reply");
        assert_eq!(
            (map[0], map[5460], map[5461], map[10923], map[16383]),
            (0, 0, 1, 0, 0)
        );
        // Slots nobody serves stay unknown; malformed replies give no map.
        let partial = slot_map(&Value::Array(vec![range(0, 99, "h", 1)])).expect("valid");
        assert_eq!((partial[99], partial[100]), (0, NO_NODE));
        assert!(slot_map(&Value::Array(vec![range(0, 16384, "h", 1)])).is_none());
        assert!(slot_map(&Value::Nil).is_none());
    }

    #[test]
    fn consecutive_alike_requests_form_runs() {
        let policy: Policy = "gcra:rate=10/s".parse().unwrap();
        let request = |op: Op, cost: u64| Request {
            policy: &policy,
            key: "k",
            op,
            cost,
        };
        let within = |ms: u64| Op::pace_within(Duration::from_millis(ms));
        let batch = [
            request(Op::Limit, 1),
            request(Op::Limit, 1),
            request(Op::Limit, 2),
            request(within(5), 1),
            request(within(5), 1),
            request(within(6), 1),
            request(within(6), 1),
            request(Op::Limit, 1),
        ];
        let refs: Vec<&Request> = batch.iter().collect();
        // The last request under another policy number: a run of its own.
        let numbers = [1, 1, 1, 1, 1, 1, 1, 2];
        assert_eq!(
            runs(&refs, &numbers),
            [(0, 2), (2, 1), (3, 2), (5, 2), (7, 1)]
        );
        assert!(runs(&[], &[]).is_empty());
    }

    #[test]
    fn only_refusals_before_any_write_count_as_redirects() {
        let e = |m: &str| StoreError::new(StoreErrorKind::Protocol, m);
        assert!(is_redirect(&e(
            "Redis failed a decision: MOVED 123 127.0.0.1:7001"
        )));
        assert!(is_redirect(&e(
            "... Script attempted to access a non local key in a cluster node"
        )));
        assert!(!is_redirect(&e("paceline: unknown algorithm x")));
    }
}

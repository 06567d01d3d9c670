//! The queue in Redis or Redis Cluster (feature `redis`): shared by every process that
//! opens it, durable as far as the Redis server is (its persistence settings decide).
//!
//! Every operation is one atomic call of a Redis function (`lua/queue.lua`), the Lua twin of
//! [`QueueCore`](crate::QueueCore): the same rules, the same order, the same numbers, which
//! a differential test checks on a virtual clock. The groups' policies run on paceline's
//! algorithm twins inside the same call, so a lease that starts a job has applied the
//! group's policy in the same atomic step. All of a queue's keys share the hash tag
//! `{q:NAME}`: a queue lives on one slot of a cluster, and many queues spread over it.
//!
//! Times are the Redis server's (`TIME`), so jobs started through different processes and
//! machines compare; [`QueueBackend::clock`] follows the server's clock (the local clock
//! plus the offset the last answer showed). Idle workers wait without polling: every call
//! that may let a job start publishes on the queue's channel, which each process follows
//! on one connection of its own.
//!
//! Every process sharing a queue must open it with the same configuration: the last to
//! open it sets it for all (a changed configuration applies as
//! [`QueueCore::set_config`](crate::QueueCore::set_config) does).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use paceline_core::{Clock, InputError, StoreError, StoreErrorKind};
use paceline_store::redis::{
    error_code, fingerprint, policy_args, CallFuture, Combiner, FunctionHost, Library, Messages,
    Reader, Reply, ServerClock,
};
use paceline_store::secret::TokenKey;
use tokio::sync::Notify;

use crate::config::QueueConfig;
use crate::core::{
    active_conflict, check_failure, check_lease_request, cut, micros_up, queue_full, Jitter,
    MAINTENANCE_BATCH,
};
use crate::error::QueueError;
use crate::job::{
    check_lease_length, check_request_id, not_before_too_late, Enqueued, FailOutcome, Failure,
    GroupStats, JobInfo, JobState, Leased, NewJob, Stats, Totals,
};
use crate::memory::check_queue_name;
use crate::queue::{QueueBackend, QueueFuture};
use crate::token::{LeaseToken, LEASE_KEY};

static LIBRARY: LazyLock<Library> =
    LazyLock::new(|| Library::new("queue", include_str!("../lua/queue.lua"), "queue_call"));

/// Who answers, in the errors of a reply that does not read.
const FUNCTION: &str = "the queue's Redis function";

/// A queue in Redis. See the [module docs](self).
pub struct RedisQueue {
    name: String,
    config: QueueConfig,
    caller: Arc<Caller>,
    /// The operations that change the queue, combined into calls with the concurrent ones.
    combiner: Combiner<QueueError>,
    changed: Arc<Notify>,
    listener: tokio::task::JoinHandle<()>,
    random: Jitter,
    /// Signs the leases' tokens: the store's, shared by every process opening this Redis.
    key: TokenKey,
}

/// What every call of the queue's function needs.
struct Caller {
    host: FunctionHost,
    /// `PREFIX{q:NAME}:`, the start of every key of the queue.
    base: String,
    clock: Arc<dyn Clock>,
    /// An injected clock's time goes with every call; else the server's `TIME` rules, and
    /// `server_clock` follows it.
    injected: bool,
    server_clock: Option<Arc<ServerClock>>,
    /// The `config` operation's arguments, sent again to a queue that lost its
    /// configuration (a Redis restarted without persistence, or flushed).
    config: Vec<Vec<u8>>,
}

/// The most operations one combined call carries.
const MAX_COMBINED: usize = 256;
/// The most combined calls in flight at once: two keep Redis busy (one runs while the next
/// is on its way) and let the operations that arrive meanwhile gather into the next call.
/// Each call costs the queue's function about as much as one more job does, so fewer,
/// fuller calls are cheaper: with 64 producers enqueueing one job at a time on one Redis,
/// two in flight made 15 % more jobs per second than four, and one 10 % fewer than two.
const MAX_IN_FLIGHT: usize = 2;

/// The operations that change the queue and tick its clock: concurrent ones go to Redis
/// combined, in one call (`multi`), as if each had been its own call at the same time.
const COMBINED: &[&str] = &[
    "enqueue",
    "lease",
    "ack",
    "fail",
    "extend",
    "cancel",
    "retry_dead",
];

/// Whether `op`'s answer starts with the queue's time: the operations that tick its clock
/// (`ticking` in `lua/queue.lua`).
fn ticks(op: &str) -> bool {
    COMBINED.contains(&op) || op == "counts" || op == "stats"
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("name", &self.name)
            .field("base", &self.caller.base)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisQueue {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl Caller {
    /// Calls the operation `op` with `args`; on a queue that has lost its configuration,
    /// sends this handle's and calls once more.
    async fn call(&self, op: &str, args: &[Vec<u8>]) -> Result<Reply, QueueError> {
        match self.call_once(op, args).await {
            Err(QueueError::Store(e))
                if op != "config" && error_code(&e) == Some("PACELINE_UNCONFIGURED") =>
            {
                self.call_once("config", &self.config).await?;
                self.call_once(op, args).await
            }
            other => other,
        }
    }

    /// Calls the operation `op` with `args` after the clock argument.
    async fn call_once(&self, op: &str, args: &[Vec<u8>]) -> Result<Reply, QueueError> {
        let clock = if self.injected {
            arg(format!("{} 0", self.clock.now_micros()))
        } else {
            Vec::new()
        };
        let head = [op.as_bytes(), clock.as_slice()];
        let all = head.into_iter().chain(args.iter().map(Vec::as_slice));
        let reply = self.host.call(&LIBRARY, &[&self.base], all).await?;
        // Every answer of a ticking operation starts with the server's time (a combined
        // call's, its first operation's).
        if let Some(server) = &self.server_clock {
            let first = match op {
                "multi" => reply.head_int(2),
                op if ticks(op) => reply.head_int(1),
                _ => None,
            };
            if let Some(now) = first.and_then(|n| u64::try_from(n).ok()) {
                server.observe(now);
            }
        }
        Ok(reply)
    }

    /// The combining task's call: an operation (or `multi`) made through this caller.
    fn combined(
        self: &Arc<Caller>,
    ) -> impl Fn(&'static str, Vec<Vec<u8>>) -> CallFuture<QueueError> {
        let caller = Arc::clone(self);
        move |op, args| {
            let caller = Arc::clone(&caller);
            Box::pin(async move { caller.call(op, &args).await })
        }
    }
}

/// The `config` operation's arguments for `c`: its fingerprint, the default policy's spec
/// and arguments, each group's own, and the settings.
fn config_args(c: &QueueConfig) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    let push_policy = |args: &mut Vec<Vec<u8>>, policy| {
        let list = policy_args(policy);
        args.push(arg(list.len()));
        args.extend(list);
    };
    args.push(arg(&c.group_policy));
    push_policy(&mut args, &c.group_policy);
    args.push(arg(c.groups.len()));
    for (group, policy) in &c.groups {
        args.push(group.clone().into_bytes());
        args.push(arg(policy));
        push_policy(&mut args, policy);
    }
    args.push(arg(c.group_concurrency));
    args.push(arg(c.max_attempts));
    args.push(arg(paceline_core::round_to_micros(c.lease)));
    args.push(arg(paceline_core::round_to_micros(c.retry_backoff)));
    args.push(arg(paceline_core::round_to_micros(c.retry_backoff_max)));
    args.push(arg(c.max_jobs));
    args.push(arg(c.max_payload));
    let mut all = vec![arg(fingerprint(&args))];
    all.extend(args);
    all
}

fn arg(x: impl ToString) -> Vec<u8> {
    x.to_string().into_bytes()
}

/// The reader of a reply of the queue's function.
fn reader(reply: Reply) -> Result<Reader, QueueError> {
    Ok(reply.reader(FUNCTION)?)
}

/// A protocol error: the queue's function answered `what` unexpectedly.
fn protocol(what: &str) -> QueueError {
    QueueError::Store(StoreError::new(
        StoreErrorKind::Protocol,
        format!("{FUNCTION} answered {what} unexpectedly"),
    ))
}

fn read_state(r: &mut Reader) -> Result<JobState, QueueError> {
    let name = r.text()?;
    JobState::from_name(&name).ok_or_else(|| protocol(&format!("an unknown job state `{name}`")))
}

fn read_job(r: &mut Reader) -> Result<JobInfo, QueueError> {
    let id = r.text()?;
    let group = r.text()?;
    let state = read_state(r)?;
    let attempts = r.u32()?;
    let max_attempts = r.u32()?;
    let has_error = r.int()? == 1;
    let error = r.text()?;
    let enqueued_at = r.u64()?;
    let not_before = r.time()?;
    let started = r.time()?;
    let lease_expires = r.time()?;
    let worker = r.text()?;
    let payload = r.bytes()?;
    Ok(JobInfo {
        id,
        group,
        state,
        attempts,
        max_attempts,
        last_error: has_error.then_some(error),
        enqueued_at,
        not_before,
        started,
        lease_expires,
        worker: (state == JobState::Active).then_some(worker),
        payload,
    })
}

fn read_counts(r: &mut Reader) -> Result<Stats, QueueError> {
    let _now = r.u64()?;
    let (scheduled, waiting, active, dead) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let totals = Totals {
        enqueued: r.u64()?,
        started: r.u64()?,
        acked: r.u64()?,
        failed: r.u64()?,
        retried: r.u64()?,
        dead: r.u64()?,
        lease_expiries: r.u64()?,
        pauses: r.u64()?,
    };
    Ok(Stats {
        scheduled,
        waiting,
        active,
        dead,
        groups: Vec::new(),
        totals,
    })
}

impl RedisQueue {
    /// Opens the queue `name` in the Redis (or Redis Cluster) behind `store`, setting its
    /// configuration, and follows its channel for wake-ups. `clock`: `None` for the server's
    /// time (what production uses); a virtual clock for tests, whose time then goes with
    /// every call.
    pub async fn open(
        store: impl Into<FunctionHost>,
        name: &str,
        config: QueueConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<RedisQueue, QueueError> {
        let queue = RedisQueue::follow(store.into(), name, config, clock).await?;
        queue.set_config().await?;
        Ok(queue)
    }

    /// The handle on the queue, following its channel, without setting its configuration.
    async fn follow(
        host: FunctionHost,
        name: &str,
        config: QueueConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<RedisQueue, QueueError> {
        check_queue_name(name)?;
        config.validate()?;
        let base = format!("{}{{q:{name}}}:", host.key_prefix());
        let key = host.token_key(LEASE_KEY).await?;
        let changed = Arc::new(Notify::new());
        let messages = host.subscribe(&format!("{base}changed")).await?;
        let listener = tokio::spawn(listen(
            host.clone(),
            format!("{base}changed"),
            messages,
            Arc::clone(&changed),
        ));
        let (clock, injected, server_clock): (Arc<dyn Clock>, bool, _) = match clock {
            Some(clock) => (clock, true, None),
            None => {
                let server = Arc::new(ServerClock::new());
                (server.clone(), false, Some(server))
            }
        };
        let seed = clock.now_micros();
        let caller = Arc::new(Caller {
            host,
            base,
            clock,
            injected,
            server_clock,
            config: config_args(&config),
        });
        let combiner = Combiner::spawn(caller.combined(), MAX_IN_FLIGHT, MAX_COMBINED);
        Ok(RedisQueue {
            name: name.to_string(),
            config,
            caller,
            combiner,
            changed,
            listener,
            random: Jitter::seeded(seed),
            key,
        })
    }

    /// The queue `name` as it is in the Redis behind `store`, with the configuration its
    /// last opener set (for tools that inspect or repair a queue: `paceline queue`). Fails
    /// with an `Input` error on `queue` if the store holds no queue of that name.
    pub async fn attach(
        store: impl Into<FunctionHost>,
        name: &str,
    ) -> Result<RedisQueue, QueueError> {
        check_queue_name(name)?;
        let host = store.into();
        let base = format!("{}{{q:{name}}}:", host.key_prefix());
        let reply = host
            .call(&LIBRARY, &[&base], [&b"read_config"[..], &[]])
            .await?;
        let mut r = reader(reply)?;
        if r.is_empty() {
            return Err(InputError::new(
                "queue",
                format!("this store holds no queue `{name}`; a queue is created by the first service or program that opens it with its configuration"),
            )
            .into());
        }
        let stored = |what: &str, e: InputError| {
            protocol(&format!("a stored {what} that does not read back ({e})"))
        };
        let spec = r.text()?;
        let mut config = QueueConfig::new(spec.parse().map_err(|e| stored("policy", e))?)
            .group_concurrency(r.u32()?)
            .max_attempts(r.u32()?)
            .lease(Duration::from_micros(r.u64()?));
        let (first, max) = (r.u64()?, r.u64()?);
        config = config
            .retry_backoff(Duration::from_micros(first), Duration::from_micros(max))
            .max_jobs(usize::try_from(r.u64()?).unwrap_or(usize::MAX))
            .max_payload(usize::try_from(r.u64()?).unwrap_or(usize::MAX));
        while !r.is_empty() {
            let group = r.text()?;
            let policy = r.text()?.parse().map_err(|e| stored("policy", e))?;
            config = config.group(group, policy);
        }
        RedisQueue::follow(host, name, config, None).await
    }

    /// The Redis key every key of this queue starts with (a hash tag, then `:`).
    pub fn key_base(&self) -> &str {
        &self.caller.base
    }

    /// How many groups the queue holds state for; see
    /// [`QueueCore::groups_held`](crate::QueueCore::groups_held).
    pub async fn groups_held(&self) -> Result<usize, QueueError> {
        match self.call("groups", Vec::new()).await?.int() {
            Some(n) => Ok(usize::try_from(n).unwrap_or(0)),
            None => Err(protocol("`groups` with a non-number")),
        }
    }

    async fn set_config(&self) -> Result<(), QueueError> {
        let reply = self.caller.call("config", &self.caller.config).await?;
        reader(reply)?.u64()?;
        Ok(())
    }

    /// Calls the operation `op` with `args`: combined with the concurrent ones if it
    /// changes the queue, else on its own.
    async fn call(&self, op: &'static str, args: Vec<Vec<u8>>) -> Result<Reply, QueueError> {
        if COMBINED.contains(&op) {
            self.combiner.call(op, args).await
        } else {
            self.caller.call(op, &args).await
        }
    }

    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Vec<Result<Enqueued, QueueError>> {
        let mut answers: Vec<Option<Result<Enqueued, QueueError>>> = Vec::new();
        let mut args = Vec::new();
        let mut sent = 0usize;
        for job in jobs {
            if let Err(e) = job.validate(self.config.max_payload) {
                answers.push(Some(Err(e.into())));
                continue;
            }
            answers.push(None);
            sent += 1;
            args.push(job.id.unwrap_or_default().into_bytes());
            args.push(job.group.into_bytes());
            args.push(job.payload);
            args.push(arg(paceline_core::round_to_micros(job.delay)));
            args.push(job.max_attempts.map(arg).unwrap_or_default());
            args.push(job.not_before.map(arg).unwrap_or_default());
        }
        if sent > 0 {
            let mut all = vec![arg(sent)];
            all.extend(args);
            let replies = match self.call("enqueue", all).await {
                Ok(reply) => self.read_enqueued(reply, sent),
                Err(e) => Err(e),
            };
            match replies {
                Ok(mut replies) => {
                    replies.reverse();
                    for slot in answers.iter_mut().filter(|a| a.is_none()) {
                        *slot = replies.pop();
                    }
                }
                Err(e) => {
                    for slot in answers.iter_mut().filter(|a| a.is_none()) {
                        *slot = Some(Err(e.clone()));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(InputError::new("jobs", "no answer").into())))
            .collect()
    }

    fn read_enqueued(
        &self,
        reply: Reply,
        count: usize,
    ) -> Result<Vec<Result<Enqueued, QueueError>>, QueueError> {
        let mut r = reader(reply)?;
        r.u64()?;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let status = r.text()?;
            let id = r.text()?;
            match status.as_str() {
                "full" => {
                    r.item()?;
                    let max = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
                    out.push(Err(queue_full(max)));
                }
                "late" => {
                    r.item()?;
                    out.push(Err(not_before_too_late(r.u64()?).into()));
                }
                "created" | "exists" => {
                    let state = read_state(&mut r)?;
                    let estimated_start = r.u64()?;
                    out.push(Ok(Enqueued {
                        id,
                        state,
                        created: status == "created",
                        estimated_start,
                    }));
                }
                other => return Err(protocol(&format!("an unknown enqueue status `{other}`"))),
            }
        }
        Ok(out)
    }

    async fn lease_now(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&str>,
    ) -> Result<Vec<Leased>, QueueError> {
        let lease_us = check_lease_request(&self.config, worker, max_jobs, lease)?;
        if let Some(request) = request {
            check_request_id(request)?;
        }
        let reply = self
            .call(
                "lease",
                vec![
                    arg(worker),
                    arg(max_jobs),
                    arg(lease_us),
                    arg(request.unwrap_or("")),
                ],
            )
            .await?;
        let mut r = reader(reply)?;
        r.u64()?;
        let mut jobs = Vec::new();
        while !r.is_empty() {
            jobs.push(Leased {
                id: r.text()?,
                group: r.text()?,
                payload: r.bytes()?,
                attempt: r.u32()?,
                lease: r.u64()?,
                token: LeaseToken::default(),
                started: r.u64()?,
                eligible: r.u64()?,
                lease_expires: r.u64()?,
            });
        }
        Ok(jobs)
    }

    /// An answer of `now` then a status: the status.
    fn status(reply: Reply) -> Result<(String, Reader), QueueError> {
        let mut r = reader(reply)?;
        r.u64()?;
        let status = r.text()?;
        Ok((status, r))
    }

    async fn ack_job(&self, id: &str, lease: u64) -> Result<(), QueueError> {
        let reply = self.call("ack", vec![arg(id), arg(lease)]).await?;
        match Self::status(reply)?.0.as_str() {
            "ok" => Ok(()),
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            "gone" => Err(QueueError::UnknownJob { id: id.to_string() }),
            other => Err(protocol(&format!("`ack` with the status `{other}`"))),
        }
    }

    async fn fail_job(
        &self,
        id: &str,
        lease: u64,
        failure: Failure,
    ) -> Result<FailOutcome, QueueError> {
        check_failure(&failure)?;
        let (kind, error, after, pause) = match failure {
            Failure::Fatal { error } => ("fatal", error, None, 0),
            Failure::Retry { error, after } => {
                ("retry", error, after.map(paceline_core::round_to_micros), 0)
            }
            Failure::PauseGroup { error, pause } => ("pause", error, None, micros_up(pause)),
            Failure::Release => ("release", None, None, 0),
        };
        let error = cut(error);
        let reply = self
            .call(
                "fail",
                vec![
                    arg(id),
                    arg(lease),
                    arg(kind),
                    arg(u8::from(error.is_some())),
                    error.unwrap_or_default().into_bytes(),
                    after.map(arg).unwrap_or_default(),
                    arg(pause),
                    arg(format!("{:?}", self.random.next())),
                ],
            )
            .await?;
        let (status, mut r) = Self::status(reply)?;
        let at = r.u64()?;
        match status.as_str() {
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            "dead" => Ok(FailOutcome::Dead),
            "retrying" => Ok(FailOutcome::Retrying { at }),
            "paused" => Ok(FailOutcome::Paused { until: at }),
            "released" => Ok(FailOutcome::Released),
            "repeated" => Ok(FailOutcome::Repeated),
            "gone" => Err(QueueError::UnknownJob { id: id.to_string() }),
            other => Err(protocol(&format!("`fail` with the status `{other}`"))),
        }
    }

    async fn extend_job(&self, id: &str, lease: u64, length: Duration) -> Result<u64, QueueError> {
        check_lease_length(length)?;
        let reply = self
            .call(
                "extend",
                vec![
                    arg(id),
                    arg(lease),
                    arg(paceline_core::round_to_micros(length)),
                ],
            )
            .await?;
        let (status, mut r) = Self::status(reply)?;
        let expires = r.u64()?;
        match status.as_str() {
            "ok" => Ok(expires),
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            other => Err(protocol(&format!("`extend` with the status `{other}`"))),
        }
    }

    async fn cancel_job(&self, id: &str) -> Result<(), QueueError> {
        let reply = self.call("cancel", vec![arg(id)]).await?;
        match Self::status(reply)?.0.as_str() {
            "ok" => Ok(()),
            "unknown" => Err(QueueError::UnknownJob { id: id.to_string() }),
            "active" => Err(active_conflict(id)),
            other => Err(protocol(&format!("`cancel` with the status `{other}`"))),
        }
    }

    async fn job_info(&self, id: &str) -> Result<Option<JobInfo>, QueueError> {
        let reply = self.call("job", vec![arg(id)]).await?;
        let mut r = reader(reply)?;
        if r.is_empty() {
            return Ok(None);
        }
        read_job(&mut r).map(Some)
    }

    async fn read_stats(&self, with_groups: bool) -> Result<Stats, QueueError> {
        let reply = self
            .call(if with_groups { "stats" } else { "counts" }, Vec::new())
            .await?;
        let mut r = reader(reply)?;
        let mut stats = read_counts(&mut r)?;
        while !r.is_empty() {
            stats.groups.push(GroupStats {
                group: r.text()?,
                waiting: r.u64()?,
                active: r.u64()?,
                next_eligible: r.time()?,
            });
        }
        stats.groups.sort_by(|a, b| a.group.cmp(&b.group));
        if with_groups {
            stats.waiting = stats.groups.iter().map(|g| g.waiting).sum();
        }
        Ok(stats)
    }

    async fn dead_jobs(&self, offset: usize, limit: usize) -> Result<Vec<JobInfo>, QueueError> {
        let reply = self.call("dead", vec![arg(offset), arg(limit)]).await?;
        let mut r = reader(reply)?;
        let mut jobs = Vec::new();
        while !r.is_empty() {
            jobs.push(read_job(&mut r)?);
        }
        Ok(jobs)
    }

    async fn retry_dead_jobs(&self, ids: Option<&[String]>) -> Result<usize, QueueError> {
        let mut args = vec![arg(u8::from(ids.is_none()))];
        args.extend(
            ids.unwrap_or_default()
                .iter()
                .map(|id| id.clone().into_bytes()),
        );
        // Every dead job goes back in chunks, one call each, so no call holds Redis long.
        let mut total = 0;
        loop {
            let reply = self.call("retry_dead", args.clone()).await?;
            let mut r = reader(reply)?;
            r.u64()?;
            let n = r.u64()?;
            total += usize::try_from(n).unwrap_or(usize::MAX);
            if ids.is_some() || n < MAINTENANCE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    async fn purge(&self) -> Result<usize, QueueError> {
        // In chunks, as `retry_dead_jobs`.
        let mut total = 0;
        loop {
            let reply = self.call("purge_dead", Vec::new()).await?;
            let mut r = reader(reply)?;
            let n = r.u64()?;
            total += usize::try_from(n).unwrap_or(usize::MAX);
            if n < MAINTENANCE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    async fn next(&self) -> Result<Option<u64>, QueueError> {
        match self.call("next_event", Vec::new()).await?.int() {
            Some(n) => Ok(u64::try_from(n).ok()),
            None => Err(protocol("`next_event` with a non-number")),
        }
    }
}

/// How long the channel may stay silent before its subscription is made anew: a connection
/// that died without closing delivers nothing, and nothing else would tell.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(60);

/// Follows the queue's channel, waking every waiting lease call at each message. After a
/// lost subscription, or a silence of `RESUBSCRIBE_AFTER`, it subscribes anew and wakes
/// them (they ask the queue again, missing nothing published meanwhile).
async fn listen(host: FunctionHost, channel: String, mut messages: Messages, changed: Arc<Notify>) {
    loop {
        while let Ok(Some(())) = tokio::time::timeout(RESUBSCRIBE_AFTER, messages.next()).await {
            changed.notify_waiters();
        }
        loop {
            if let Ok(m) = host.subscribe(&channel).await {
                messages = m;
                changed.notify_waiters();
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl QueueBackend for RedisQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> &QueueConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        &*self.caller.clock
    }

    fn enqueue(&self, jobs: Vec<NewJob>) -> QueueFuture<'_, Vec<Result<Enqueued, QueueError>>> {
        Box::pin(self.enqueue_all(jobs))
    }

    fn lease<'a>(
        &'a self,
        worker: &'a str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&'a str>,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        Box::pin(self.lease_now(worker, max_jobs, lease, request))
    }

    fn token_key(&self) -> &TokenKey {
        &self.key
    }

    fn ack<'a>(&'a self, id: &'a str, lease: u64) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.ack_job(id, lease))
    }

    fn fail<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        failure: Failure,
    ) -> QueueFuture<'a, Result<FailOutcome, QueueError>> {
        Box::pin(self.fail_job(id, lease, failure))
    }

    fn extend<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        length: Duration,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        Box::pin(self.extend_job(id, lease, length))
    }

    fn cancel<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.cancel_job(id))
    }

    fn job<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<Option<JobInfo>, QueueError>> {
        Box::pin(self.job_info(id))
    }

    fn stats(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        Box::pin(self.read_stats(true))
    }

    fn counts(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        Box::pin(self.read_stats(false))
    }

    fn dead(
        &self,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'_, Result<Vec<JobInfo>, QueueError>> {
        Box::pin(self.dead_jobs(offset, limit))
    }

    fn retry_dead<'a>(
        &'a self,
        ids: Option<&'a [String]>,
    ) -> QueueFuture<'a, Result<usize, QueueError>> {
        Box::pin(self.retry_dead_jobs(ids))
    }

    fn purge_dead(&self) -> QueueFuture<'_, Result<usize, QueueError>> {
        Box::pin(self.purge())
    }

    fn next_event(&self) -> QueueFuture<'_, Result<Option<u64>, QueueError>> {
        Box::pin(self.next())
    }

    fn changed(&self) -> QueueFuture<'_, ()> {
        let mut notified = Box::pin(self.changed.notified());
        notified.as_mut().enable();
        notified
    }
}

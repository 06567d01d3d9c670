//! The queue in Redis or Redis Cluster (feature `redis`): shared by every process that
//! opens it, durable as far as the Redis server is (its persistence settings decide).
//!
//! Every operation is one atomic call of a Redis function (`lua/queue.lua`), the Lua twin of
//! [`QueueCore`](crate::QueueCore): the same rules, the same order, the same numbers, which
//! a differential test checks on a virtual clock. The groups' policies run on paceline's
//! algorithm twins inside the same call, so a lease that starts a job has applied the
//! group's policy in the same atomic step. All of a queue's keys share the hash tag
//! `{q:NAME}`: a queue lives on one slot of a cluster, and many queues spread over it. A
//! queue of several [`partitions`](crate::QueueConfig::partitions) is a
//! [`Partitioned`](crate::Partitioned) of `RedisQueue`s, each under a hash tag of its own
//! ([`partition_tag`]), on its own primary.
//!
//! Times are the Redis server's (`TIME`), so jobs started through different processes and
//! machines compare; [`QueueBackend::clock`] follows the server's clock (the local clock
//! plus the offset the last answer showed). Idle workers wait without polling: every call
//! that may let a job start publishes on the queue's channel, which each process follows
//! on one connection of its own.
//!
//! Every process sharing a queue must open it with the same configuration: the last to
//! open it sets it for all (a changed configuration applies as
//! [`QueueCore::set_config`](crate::QueueCore::set_config) does), except its number of
//! partitions, which never changes (see [`partition_tag`] for a queue of several).

mod caller;
mod decode;
mod events;
mod operations;
mod partitions;

pub(crate) use partitions::attach_any;
pub use partitions::partition_tag;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use paceline_core::{Clock, InputError, Policy};
use paceline_store::redis::{Combiner, FunctionHost, Library, Messages, Reply};
use paceline_store::secret::TokenKey;
use tokio::sync::Notify;

use crate::config::QueueConfig;
use crate::core::{Jitter, PolicySource};
use crate::error::QueueError;
use crate::job::{Enqueued, FailOutcome, Failure, JobInfo, JobState, Leased, NewJob, Stats};
use crate::memory::check_queue_name;
use crate::queue::{QueueBackend, QueueFuture};
use crate::schedule::{check_schedule_name, Schedule, ScheduleInfo};
use crate::token::LEASE_KEY;

use caller::{config_args, Caller, COMBINED, MAX_COMBINED, MAX_IN_FLIGHT};
use decode::{protocol, reader};

static LIBRARY: LazyLock<Library> =
    LazyLock::new(|| Library::new("queue", include_str!("../../lua/queue.lua"), "queue_call"));

/// A queue in Redis. See the [module docs](self).
pub struct RedisQueue {
    name: String,
    /// The number of partitions of the queue (this handle being one of them if several).
    partitions: u32,
    config: QueueConfig,
    caller: Arc<Caller>,
    /// The operations that change the queue, combined into calls with the concurrent ones.
    combiner: Combiner<QueueError>,
    changed: Arc<Notify>,
    /// The follower of the queue's events, for its listeners.
    events: Arc<events::Follower>,
    /// The task following the queue's channel (for partition 0 of a queue of several,
    /// every partition's); none for the other partitions, which partition 0's wakes.
    listener: Option<tokio::task::JoinHandle<()>>,
    random: Jitter,
    /// Signs the leases' tokens: the store's, shared by every process opening this Redis.
    key: TokenKey,
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
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

/// How a handle learns that its queue changed.
pub(super) enum Wakeups {
    /// From its own channel, on a connection of its own.
    Own,
    /// From every partition's channel (`channels`), on one connection, waking `changed`,
    /// which every partition of the queue shares.
    Lead {
        channels: Vec<String>,
        changed: Arc<Notify>,
    },
    /// From the partition that leads.
    Shared(Arc<Notify>),
}

/// `PREFIX{q:NAME}:`, the key base of the queue `name` of one partition (and where a queue
/// of several keeps its configuration).
fn queue_base(host: &FunctionHost, name: &str) -> String {
    format!("{}{{q:{name}}}:", host.key_prefix())
}

impl RedisQueue {
    /// Opens the queue `name` in the Redis (or Redis Cluster) behind `store`, setting its
    /// configuration, and follows its channel for wake-ups. `clock`: `None` for the server's
    /// time (what production uses); a virtual clock for tests, whose time then goes with
    /// every call.
    ///
    /// A configuration of several [`partitions`](QueueConfig::partitions) is refused,
    /// naming `partitions`: such a queue is a [`Partitioned`](crate::Partitioned) of Redis
    /// queues, which [`Queue::open`](crate::Queue::open) and
    /// [`Partitioned::open`](crate::Partitioned::open) make. So is a queue that Redis holds
    /// with several partitions.
    pub async fn open(
        store: impl Into<FunctionHost>,
        name: &str,
        config: QueueConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<RedisQueue, QueueError> {
        if config.partitions > 1 {
            return Err(crate::partitioned::one_partition_only("RedisQueue").into());
        }
        let host = store.into();
        check_queue_name(name)?;
        let base = queue_base(&host, name);
        let queue = RedisQueue::follow(host, name, base, config, None, clock, Wakeups::Own).await?;
        queue.set_config().await?;
        Ok(queue)
    }

    /// The handle on the queue (or partition) at `base`, following its channel as
    /// `wakeups` says, without setting its configuration. `part`: for a partition, the
    /// queue's number of partitions and the partition's index, which its `config` call
    /// carries after the configuration (`None` for a queue of one).
    async fn follow(
        host: FunctionHost,
        name: &str,
        base: String,
        config: QueueConfig,
        part: Option<(u32, usize)>,
        clock: Option<Arc<dyn Clock>>,
        wakeups: Wakeups,
    ) -> Result<RedisQueue, QueueError> {
        check_queue_name(name)?;
        config.validate()?;
        let key = host.token_key(LEASE_KEY).await?;
        let (changed, channels) = match wakeups {
            Wakeups::Own => (Arc::new(Notify::new()), vec![format!("{base}changed")]),
            Wakeups::Lead { channels, changed } => (changed, channels),
            Wakeups::Shared(changed) => (changed, Vec::new()),
        };
        let listener = if channels.is_empty() {
            None
        } else {
            let names: Vec<&str> = channels.iter().map(String::as_str).collect();
            let messages = host.subscribe_all(&names).await?;
            Some(tokio::spawn(listen(
                host.clone(),
                channels,
                messages,
                Arc::clone(&changed),
            )))
        };
        let extra = part.map_or_else(Vec::new, |(n, i)| {
            vec![
                caller::arg(n),
                caller::arg(crate::partitioned::id_suffix(i)),
            ]
        });
        let args = config_args(&config, extra);
        let caller = Arc::new(Caller::new(host.clone(), base.clone(), clock, args));
        let events = Arc::new(events::Follower::new(host, Arc::clone(&caller), &base));
        let seed = caller.clock.now_micros();
        let combiner = Combiner::spawn(caller.combined(), MAX_IN_FLIGHT, MAX_COMBINED);
        Ok(RedisQueue {
            name: name.to_string(),
            partitions: part.map_or(1, |(n, _)| n),
            config,
            caller,
            combiner,
            changed,
            events,
            listener,
            random: Jitter::seeded(seed),
            key,
        })
    }

    /// The queue `name` as it is in the Redis behind `store`, with the configuration its
    /// last opener set (for tools that inspect or repair a queue: `paceline queue`). Fails
    /// with an `Input` error on `queue` if the store holds no queue of that name, and on
    /// `partitions` if it holds one of several partitions
    /// ([`Queue::attach`](crate::Queue::attach) follows those).
    pub async fn attach(
        store: impl Into<FunctionHost>,
        name: &str,
    ) -> Result<RedisQueue, QueueError> {
        let host = store.into();
        let config = read_stored(&host, name).await?;
        if config.partitions > 1 {
            return Err(InputError::new(
                "partitions",
                format!(
                    "queue `{name}` has {} partitions, which one RedisQueue does not follow: \
                     attach it with Queue::attach",
                    config.partitions
                ),
            )
            .into());
        }
        let base = queue_base(&host, name);
        RedisQueue::follow(host, name, base, config, None, None, Wakeups::Own).await
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
        configured(reply, &self.name, self.partitions)
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
}

/// How long the channel may stay silent before its subscription is made anew: a connection
/// that died without closing delivers nothing, and nothing else would tell.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(60);

/// The answer of a `config` call: `Ok`, or the refusal of a queue that has another number
/// of partitions than `asked`.
fn configured(reply: Reply, name: &str, asked: u32) -> Result<(), QueueError> {
    let mut r = reader(reply)?;
    r.u64()?;
    if !r.is_empty() && r.int()? < 0 {
        return Err(crate::partitioned::partitions_refused(
            name,
            r.u64()?,
            asked,
        ));
    }
    Ok(())
}

/// The configuration of the queue `name` as the Redis behind `host` holds it, its number
/// of partitions included; an `Input` error on `queue` if it holds no such queue.
async fn read_stored(host: &FunctionHost, name: &str) -> Result<QueueConfig, QueueError> {
    check_queue_name(name)?;
    let base = queue_base(host, name);
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
        let spec = r.text()?;
        // The queue's own policy and cap, and the number of partitions, under names no
        // group has.
        if group == QUEUE_POLICY_ENTRY {
            config = config.queue_policy(spec.parse().map_err(|e| stored("policy", e))?);
            continue;
        }
        if group == QUEUE_CONCURRENCY_ENTRY {
            let n = spec.parse().map_err(|_| {
                let e = InputError::new("queue_concurrency", format!("`{spec}` is not a number"));
                stored_config(name, host.key_prefix(), &e)
            })?;
            config = config.queue_concurrency(n);
            continue;
        }
        if group == KEEP_ENTRY {
            let bad = || {
                let e = InputError::new("keep_completed", format!("`{spec}` is not four numbers"));
                stored_config(name, host.key_prefix(), &e)
            };
            let parts: Vec<&str> = spec.split(',').collect();
            let [kc, kcf, kd, kdf] = parts[..] else {
                return Err(bad());
            };
            let number = |x: &str| -> Result<Option<u64>, QueueError> {
                (!x.is_empty())
                    .then(|| x.parse::<u64>().map_err(|_| bad()))
                    .transpose()
            };
            let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
            config = config
                .keep_completed(
                    number(kc)?.map_or(0, count),
                    number(kcf)?.map(Duration::from_micros),
                )
                .keep_dead(
                    number(kd)?.map(count),
                    number(kdf)?.map(Duration::from_micros),
                );
            continue;
        }
        if group == PARTITIONS_ENTRY {
            let n = spec.parse().map_err(|_| {
                let e = InputError::new("partitions", format!("`{spec}` is not a number"));
                stored_config(name, host.key_prefix(), &e)
            })?;
            config = config.partitions(n);
            continue;
        }
        let policy = spec.parse().map_err(|e| stored("policy", e))?;
        config = config.group(group, policy);
    }
    // Nothing read is used before it is checked: a number of partitions out of range
    // would have every partition's keys looked for.
    config
        .validate()
        .map_err(|e| stored_config(name, host.key_prefix(), &e))?;
    Ok(config)
}

/// The error for a stored configuration of the queue `name` that is not valid, as `e` says.
fn stored_config(name: &str, prefix: &str, e: &InputError) -> QueueError {
    QueueError::Store(paceline_core::StoreError::new(
        paceline_core::StoreErrorKind::Protocol,
        format!(
            "the configuration Redis holds for queue `{name}` is not valid: {e}; delete its \
             keys `{prefix}{{q:{name}}}:config` and `{prefix}{{q:{name}}}:specs`, then open \
             the queue with its configuration (from a service or program that uses it), \
             which stores it anew"
        ),
    ))
}

/// Where `read_config` answers the queue's own policy among the groups' own policies (a
/// control character first: no group's name).
const QUEUE_POLICY_ENTRY: &str = "\u{1}queue_policy";
/// Where `read_config` answers the queue's concurrency cap, likewise.
const QUEUE_CONCURRENCY_ENTRY: &str = "\u{1}queue_concurrency";

/// Where `read_config` answers what the queue keeps of ended jobs, likewise.
const KEEP_ENTRY: &str = "\u{1}keep";

/// Where `read_config` answers the number of partitions among the groups' own policies
/// (a control character first: no group's name).
const PARTITIONS_ENTRY: &str = "\u{1}partitions";

/// Follows the queue's channels, waking every waiting lease call at each message. After a
/// lost subscription, or a silence of `RESUBSCRIBE_AFTER`, it subscribes anew and wakes
/// them (they ask the queue again, missing nothing published meanwhile).
async fn listen(
    host: FunctionHost,
    channels: Vec<String>,
    mut messages: Messages,
    changed: Arc<Notify>,
) {
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    loop {
        while let Ok(Some(())) = tokio::time::timeout(RESUBSCRIBE_AFTER, messages.next()).await {
            changed.notify_waiters();
        }
        loop {
            if let Ok(m) = host.subscribe_all(&names).await {
                messages = m;
                changed.notify_waiters();
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl crate::partitioned::Partition for RedisQueue {
    fn replay<'a>(
        &'a self,
        worker: &'a str,
        request: &'a str,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        Box::pin(self.replay_now(worker, request))
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

    fn ack<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        result: Option<&'a [u8]>,
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.ack_job(id, lease, result))
    }

    fn progress<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        progress: &'a [u8],
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.report_progress(id, lease, progress))
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

    fn pause<'a>(
        &'a self,
        group: Option<&'a str>,
        length: Option<Duration>,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        Box::pin(self.pause_work(group, length))
    }

    fn resume<'a>(&'a self, group: Option<&'a str>) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.resume_work(group))
    }

    fn set_policy<'a>(
        &'a self,
        group: &'a str,
        policy: Option<&'a Policy>,
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.set_group_policy(group, policy))
    }

    fn policy<'a>(
        &'a self,
        group: &'a str,
    ) -> QueueFuture<'a, Result<(Policy, PolicySource), QueueError>> {
        Box::pin(self.group_policy(group))
    }

    fn put_schedule<'a>(
        &'a self,
        name: &'a str,
        schedule: &'a Schedule,
        next: u64,
    ) -> QueueFuture<'a, Result<ScheduleInfo, QueueError>> {
        Box::pin(async move {
            check_schedule_name(name)?;
            schedule.validate(self.config.max_payload, self.caller.clock.now_micros())?;
            self.keep_schedule(name, schedule, next).await
        })
    }

    fn schedules(&self) -> QueueFuture<'_, Result<Vec<ScheduleInfo>, QueueError>> {
        Box::pin(self.kept_schedules())
    }

    fn delete_schedule<'a>(&'a self, name: &'a str) -> QueueFuture<'a, Result<bool, QueueError>> {
        Box::pin(async move {
            check_schedule_name(name)?;
            self.drop_schedule(name).await
        })
    }

    fn fire_schedule<'a>(
        &'a self,
        seen: &'a ScheduleInfo,
        next: u64,
    ) -> QueueFuture<'a, Result<Option<Enqueued>, QueueError>> {
        Box::pin(async move {
            check_schedule_name(&seen.name)?;
            self.fire_tick(&seen.name, seen.next, next).await
        })
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

    fn jobs<'a>(
        &'a self,
        state: JobState,
        group: Option<&'a str>,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'a, Result<Vec<JobInfo>, QueueError>> {
        Box::pin(self.list_jobs(state, group, offset, limit))
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

    fn watch(&self) -> QueueFuture<'_, Result<crate::events::Feeds, QueueError>> {
        Box::pin(async move { Ok(vec![self.events.watch().await?]) })
    }
}

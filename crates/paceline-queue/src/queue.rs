//! [`Queue`]: the handle producers and workers hold, over any [`QueueBackend`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::core::PolicySource;
use paceline_core::StoreErrorKind;
use paceline_core::{Clock, InputError, Policy};
use paceline_store::secret::TokenKey;
use paceline_store::{SharedStore, StoreOptions, SystemClock};

use crate::config::QueueConfig;
use crate::error::QueueError;
use crate::events::{Events, Feeds};
use crate::job::{Enqueued, FailOutcome, Failure, JobInfo, JobState, Leased, NewJob, Stats};
use crate::memory::MemoryQueue;
use crate::partitioned::Partitioned;
use crate::schedule::{Schedule, ScheduleInfo, SCHEDULE_POLL};
use crate::token::{self, LeaseToken};

/// A boxed future of a queue operation.
pub type QueueFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest a lease call may wait for a job: 5 minutes.
pub const MAX_LEASE_WAIT: Duration = Duration::from_secs(300);

/// Where a queue's state lives and how each operation runs on it: one atomic step per
/// operation, on the backend's clock. [`MemoryQueue`] holds it in this process; every
/// backend runs the rules of [`QueueCore`](crate::QueueCore), so they answer alike.
///
/// Front ends hold a [`Queue`], which adds waiting (a lease that waits for a job) on top.
pub trait QueueBackend: Send + Sync + 'static {
    /// The queue's name.
    fn name(&self) -> &str;
    /// The queue's configuration.
    fn config(&self) -> &QueueConfig;
    /// The backend's clock (µs since the Unix epoch), which every time it reports is on.
    fn clock(&self) -> &dyn Clock;
    /// Adds jobs, each on its own: one refused job does not stop the others.
    fn enqueue(&self, jobs: Vec<NewJob>) -> QueueFuture<'_, Vec<Result<Enqueued, QueueError>>>;
    /// Starts up to `max_jobs` jobs now (none if no group may start one). With a
    /// `request` id, a call repeated with the same id answers the jobs the first took
    /// instead of taking more: see [`QueueCore::lease_request`](crate::QueueCore::lease_request).
    /// The jobs' [`token`](Leased::token)s are left empty: [`Queue`] signs them.
    fn lease<'a>(
        &'a self,
        worker: &'a str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&'a str>,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>>;
    /// [`lease`](Self::lease) under a request id no call has taken a job under (one
    /// [`Queue`] drew for this call, whose calls under it so far answered no job): there
    /// is no earlier call whose jobs to answer, so a backend may skip looking for them (a
    /// [`Partitioned`] queue then asks its partitions one call each fewer). The default
    /// calls [`lease`](Self::lease).
    fn lease_new<'a>(
        &'a self,
        worker: &'a str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&'a str>,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        self.lease(worker, max_jobs, lease, request)
    }
    /// The key that signs this queue's lease tokens (see [`crate::token`]): the same in
    /// every process that shares the queue.
    fn token_key(&self) -> &TokenKey;
    /// Acknowledges a job.
    fn ack<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        result: Option<&'a [u8]>,
    ) -> QueueFuture<'a, Result<(), QueueError>>;
    /// Records a running job's progress.
    fn progress<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        progress: &'a [u8],
    ) -> QueueFuture<'a, Result<(), QueueError>>;
    /// Fails a job.
    fn fail<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        failure: Failure,
    ) -> QueueFuture<'a, Result<FailOutcome, QueueError>>;
    /// Extends a lease; answers when it now expires.
    fn extend<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        length: Duration,
    ) -> QueueFuture<'a, Result<u64, QueueError>>;
    /// Removes a job no worker holds.
    fn cancel<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<(), QueueError>>;
    /// Pauses `group` (`None`: the whole queue) for `length` (`None`: until resumed);
    /// answers when the pause ends. See [`QueueCore::pause`](crate::QueueCore::pause).
    fn pause<'a>(
        &'a self,
        group: Option<&'a str>,
        length: Option<Duration>,
    ) -> QueueFuture<'a, Result<u64, QueueError>>;
    /// Ends every pause of `group` (`None`: the queue's own). See
    /// [`QueueCore::resume`](crate::QueueCore::resume).
    fn resume<'a>(&'a self, group: Option<&'a str>) -> QueueFuture<'a, Result<(), QueueError>>;
    /// Sets `group`'s policy (`None`: back to the configuration's). See
    /// [`QueueCore::set_policy`](crate::QueueCore::set_policy).
    fn set_policy<'a>(
        &'a self,
        group: &'a str,
        policy: Option<&'a Policy>,
    ) -> QueueFuture<'a, Result<(), QueueError>>;
    /// `group`'s policy now, and where it comes from.
    fn policy<'a>(
        &'a self,
        group: &'a str,
    ) -> QueueFuture<'a, Result<(Policy, PolicySource), QueueError>>;
    /// Keeps schedule `name`, firing next at `next`; see
    /// [`QueueCore::put_schedule`](crate::QueueCore::put_schedule).
    fn put_schedule<'a>(
        &'a self,
        name: &'a str,
        schedule: &'a Schedule,
        next: u64,
    ) -> QueueFuture<'a, Result<ScheduleInfo, QueueError>>;
    /// Every schedule, by name.
    fn schedules(&self) -> QueueFuture<'_, Result<Vec<ScheduleInfo>, QueueError>>;
    /// Removes schedule `name`; answers whether there was one.
    fn delete_schedule<'a>(&'a self, name: &'a str) -> QueueFuture<'a, Result<bool, QueueError>>;
    /// Fires the schedule `seen` (as [`schedules`](Self::schedules) listed it) for the tick
    /// it was due at, moving it on to `next`; see
    /// [`QueueCore::fire_schedule`](crate::QueueCore::fire_schedule).
    fn fire_schedule<'a>(
        &'a self,
        seen: &'a ScheduleInfo,
        next: u64,
    ) -> QueueFuture<'a, Result<Option<Enqueued>, QueueError>>;
    /// One job.
    fn job<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<Option<JobInfo>, QueueError>>;
    /// The counts, and each group's.
    fn stats(&self) -> QueueFuture<'_, Result<Stats, QueueError>>;
    /// The counts and totals without the groups, at a cost that does not grow with them.
    fn counts(&self) -> QueueFuture<'_, Result<Stats, QueueError>>;
    /// Jobs in `state` (of `group`, for waiting ones), in the order the queue keeps them;
    /// see [`QueueCore::jobs`](crate::QueueCore::jobs). Called with what
    /// [`check_listing`](crate::job::check_listing) accepts.
    fn jobs<'a>(
        &'a self,
        state: JobState,
        group: Option<&'a str>,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'a, Result<Vec<JobInfo>, QueueError>>;
    /// Retries dead jobs (`None`: all); answers how many.
    fn retry_dead<'a>(
        &'a self,
        ids: Option<&'a [String]>,
    ) -> QueueFuture<'a, Result<usize, QueueError>>;
    /// Removes every dead job; answers how many.
    fn purge_dead(&self) -> QueueFuture<'_, Result<usize, QueueError>>;
    /// The earliest time (µs) a job may become leasable without a call; see
    /// [`QueueCore::next_event`](crate::QueueCore::next_event).
    fn next_event(&self) -> QueueFuture<'_, Result<Option<u64>, QueueError>>;
    /// A future that completes once the queue changes in a way that may let a job start
    /// (a job enqueued, released or returned, a slot freed). It watches from the moment
    /// this is called, so a change between this call and the first poll is not missed.
    fn changed(&self) -> QueueFuture<'_, ()>;
    /// Starts following the queue's [`Event`](crate::Event)s: receivers that get every
    /// event decided from the moment this answers (one per feed: a queue of several
    /// partitions has one for each). See [`Queue::events`].
    fn watch(&self) -> QueueFuture<'_, Result<Feeds, QueueError>>;
}

/// The store at `url` (the URLs `paceline_store::open` takes), with the default settings.
async fn open_store(url: &str) -> Result<SharedStore, QueueError> {
    Ok(paceline_store::open(url, &StoreOptions::new()).await?)
}

/// The error for a store across the network that holds no Redis store this build can keep
/// a queue in (built without the `redis` feature, or a wrapper that hides it): never a queue
/// in this process instead, which no other process would see.
fn remote_without_redis(name: &str) -> QueueError {
    paceline_store::unshared_store_error(&format!("queue `{name}`"), "queue,redis").into()
}

/// A job queue: what producers enqueue into and workers lease from. Clones share the queue.
///
/// ```
/// use paceline_queue::{NewJob, Queue, QueueConfig};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_queue::QueueError> {
/// let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?);
/// let queue = Queue::in_memory("discord-roles", config)?;
/// let job = queue.enqueue(NewJob::new("guild:1", b"grant 42 7".to_vec())).await?;
/// let leased = queue.lease("worker-1", 10, None, Duration::from_secs(1)).await?;
/// assert_eq!(leased[0].id, job.id);
/// queue.ack(&leased[0].id, &leased[0].token).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Queue {
    backend: Arc<dyn QueueBackend>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.backend.name())
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// A queue held in this process on the system clock: for tests, simulations and
    /// single-process apps. It is not durable: its jobs go with the process.
    pub fn in_memory(name: &str, config: QueueConfig) -> Result<Queue, InputError> {
        Queue::memory(name, config, Arc::new(SystemClock::new()))
    }

    /// A queue in this process on `clock`: a [`MemoryQueue`], or a [`Partitioned`] of
    /// them for a configuration of several partitions.
    fn memory(name: &str, config: QueueConfig, clock: Arc<dyn Clock>) -> Result<Queue, InputError> {
        if config.partitions > 1 {
            return Ok(Queue::new(Partitioned::in_memory(name, config, clock)?));
        }
        Ok(Queue::new(MemoryQueue::with_clock(name, config, clock)?))
    }

    /// The queue `name` on the store at `url`, the URL `paceline_store::open` takes:
    /// `memory` for a queue held in this process (see [`Queue::in_memory`]); with the
    /// `redis` feature, `redis://`, `rediss://`, `redis-cluster://` or `rediss-cluster://`
    /// for a queue in Redis that every process opening it shares (see
    /// [`RedisQueue`](crate::RedisQueue), which also takes a store built with every
    /// setting). A Redis queue's configuration is the one its last opener gave.
    ///
    /// ```
    /// use paceline_queue::{Queue, QueueConfig};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let config = QueueConfig::new("gcra:rate=10/s".parse()?);
    /// let queue = Queue::open("memory", "emails", config.clone()).await?;
    /// assert_eq!(queue.name(), "emails");
    /// let refused = Queue::open("memcached://127.0.0.1", "emails", config).await.unwrap_err();
    /// assert!(matches!(refused, paceline_queue::QueueError::Input(e) if e.field() == "store"));
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str, name: &str, config: QueueConfig) -> Result<Queue, QueueError> {
        let store = open_store(url).await?;
        Queue::with_store(&store, name, config).await
    }

    /// The queue `name` on a store the application opened already (with
    /// `paceline_store::open` and whichever settings it chose): in that store's Redis when
    /// it has one ([`Store::functions`](paceline_store::Store::functions)), over the same
    /// connection; otherwise held in this process. Either way the queue keeps the store's
    /// time: Redis's own, or the clock the store was given. A service that decides limits
    /// and runs queues opens one store for both. A configuration of several
    /// [`partitions`](QueueConfig::partitions) makes a [`Partitioned`] queue.
    ///
    /// ```
    /// use paceline_queue::{Queue, QueueConfig};
    /// use paceline_store::{open, ManualClock, StoreOptions};
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let clock = ManualClock::new(1_000_000);
    /// let options = StoreOptions::new().clock(Arc::new(clock.clone()));
    /// let store = open("memory", &options).await?;
    /// let queue = Queue::with_store(&store, "emails", QueueConfig::new("gcra:rate=10/s".parse()?)).await?;
    /// assert_eq!(queue.now_micros(), 1_000_000); // the store's clock
    /// # Ok(()) }
    /// ```
    pub async fn with_store(
        store: &SharedStore,
        name: &str,
        config: QueueConfig,
    ) -> Result<Queue, QueueError> {
        #[cfg(feature = "redis")]
        if let Some(host) = store.functions() {
            let clock = store.time_source();
            if config.partitions > 1 {
                return Ok(Queue::new(
                    Partitioned::<crate::RedisQueue>::open(host, name, config, clock).await?,
                ));
            }
            let backend = crate::RedisQueue::open(host, name, config, clock).await?;
            return Ok(Queue::new(backend));
        }
        if store.is_remote() {
            return Err(remote_without_redis(name));
        }
        let clock = store
            .time_source()
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        Ok(Queue::memory(name, config, clock)?)
    }

    /// The queue `name` as a shared store holds it, with the configuration its last opener
    /// set, its partitions included: for tools that inspect or repair a queue without
    /// knowing its configuration (`paceline queue`). `memory` is refused: a memory queue
    /// lives in its own process.
    pub async fn attach(url: &str, name: &str) -> Result<Queue, QueueError> {
        let store = open_store(url).await?;
        #[cfg(feature = "redis")]
        if let Some(host) = store.functions() {
            return Ok(Queue::from_backend(
                crate::redis::attach_any(host, name).await?,
            ));
        }
        if store.is_remote() {
            return Err(remote_without_redis(name));
        }
        Err(InputError::new(
            "store",
            format!(
                "queue `{name}`: a memory queue lives inside the process that holds it; give \
                 the Redis URL of a shared queue"
            ),
        )
        .into())
    }

    /// A queue over `backend`.
    pub fn new(backend: impl QueueBackend) -> Queue {
        Queue {
            backend: Arc::new(backend),
        }
    }

    /// A queue over a shared backend.
    pub fn from_backend(backend: Arc<dyn QueueBackend>) -> Queue {
        Queue { backend }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        self.backend.name()
    }

    /// The queue's configuration.
    pub fn config(&self) -> &QueueConfig {
        self.backend.config()
    }

    /// The queue's clock: every time it reports is on it.
    pub fn now_micros(&self) -> u64 {
        self.backend.clock().now_micros()
    }

    /// Waits `duration` on the queue's clock.
    pub(crate) fn sleep(&self, duration: Duration) -> paceline_core::Sleep {
        self.backend.clock().sleep(duration)
    }

    /// Adds a job: see [`QueueCore::enqueue`](crate::QueueCore::enqueue) for the estimate.
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        let mut answers = self.backend.enqueue(vec![job]).await;
        answers
            .pop()
            .unwrap_or_else(|| Err(QueueError::Input(InputError::new("jobs", "no answer"))))
    }

    /// Adds jobs in one step, each on its own: the answers come in order.
    pub async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Vec<Result<Enqueued, QueueError>> {
        self.backend.enqueue(jobs).await
    }

    /// Starts up to `max_jobs` jobs for `worker`, waiting up to `wait` for the first if no
    /// group may start one now. It does not poll: it sleeps until the next group becomes
    /// eligible, a scheduled job is due or a lease expires, or until the queue changes.
    /// An empty answer means `wait` passed with nothing to start.
    ///
    /// Each job comes with its [`token`](Leased::token), which its ack, fail and extend
    /// need. A call whose store call fails on the connection or times out is made once
    /// more with the same request id, so the jobs the first attempt took are answered by
    /// the second, not left held by no one. If the second fails too, its error is the
    /// answer and those jobs stay held until their leases run out: see
    /// [`lease_request`](Self::lease_request) to repeat such a call later, just as safely.
    /// (A queue of several partitions passes over a partition whose primary refuses the
    /// connection or cannot be reached, and answers the others' jobs: see
    /// [`Partitioned`].)
    pub async fn lease(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<Leased>, QueueError> {
        self.lease_request(worker, max_jobs, lease, wait, None)
            .await
    }

    /// [`lease`](Self::lease) with a request id of the caller's (1 to 128 bytes of
    /// `A-Z a-z 0-9 - _ . :`; `None`: one drawn for this call): a call that failed (its
    /// answer lost to a timeout or a broken connection) and is made again with the same id
    /// while the leases it took last answers the jobs the first took that those leases
    /// still hold, and takes no more. In a queue of several partitions the same holds
    /// across them: a repeat first asks every partition for the jobs the first call took
    /// there, and answers those (never more than `max_jobs`: asked for fewer, it gives the
    /// rest back to their groups at once); only when no partition holds one does it take
    /// new jobs, as a new call, never one held by a lease (see [`Partitioned`]).
    ///
    /// ```
    /// use paceline_queue::{NewJob, Queue, QueueConfig};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let queue = Queue::in_memory("q", QueueConfig::new("gcra:rate=100/s,burst=10".parse()?))?;
    /// queue.enqueue(NewJob::new("g", b"a".to_vec())).await?;
    /// queue.enqueue(NewJob::new("g", b"b".to_vec())).await?;
    /// let first = queue.lease_request("w", 1, None, Duration::ZERO, Some("w-call-1")).await?;
    /// let again = queue.lease_request("w", 1, None, Duration::ZERO, Some("w-call-1")).await?;
    /// assert_eq!(first[0].id, again[0].id);
    /// assert_eq!(first[0].token, again[0].token);
    /// # Ok(()) }
    /// ```
    pub async fn lease_request(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        wait: Duration,
        request: Option<&str>,
    ) -> Result<Vec<Leased>, QueueError> {
        self.lease_until(
            worker,
            max_jobs,
            lease,
            wait,
            request,
            std::future::pending(),
        )
        .await
    }

    /// [`lease_request`](Self::lease_request) that stops waiting, with no job, once `stop`
    /// completes (the caller went away, the service shuts down). It stops only between calls
    /// to the store, never during one, so it never leaves a job it took unanswered: stop
    /// may still answer the jobs of a call that was under way.
    pub async fn lease_until(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        wait: Duration,
        request: Option<&str>,
        stop: impl Future<Output = ()>,
    ) -> Result<Vec<Leased>, QueueError> {
        tokio::pin!(stop);
        if wait > MAX_LEASE_WAIT {
            return Err(InputError::new("wait_ms", "must be at most 300000 (5 minutes)").into());
        }
        let drawn;
        // Whether no call under the request id has taken a job: one drawn for this call,
        // or (below) one whose calls so far answered none.
        let mut new = request.is_none();
        let request = match request {
            Some(request) => request,
            None => {
                drawn = random_request_id()?;
                drawn.as_str()
            }
        };
        let clock = self.backend.clock();
        let deadline = clock
            .now_micros()
            .saturating_add(paceline_core::round_to_micros(wait));
        loop {
            let changed = self.backend.changed();
            let first = if new {
                self.backend
                    .lease_new(worker, max_jobs, lease, Some(request))
            } else {
                self.backend.lease(worker, max_jobs, lease, Some(request))
            };
            // A repeat after a lost answer answers what the first attempt took.
            let mut jobs = match first.await {
                Err(QueueError::Store(e)) if e.answer_may_be_lost() => {
                    self.backend
                        .lease(worker, max_jobs, lease, Some(request))
                        .await?
                }
                answer => answer?,
            };
            new = true;
            let now = clock.now_micros();
            if !jobs.is_empty() || now >= deadline {
                let key = self.backend.token_key();
                for job in &mut jobs {
                    job.token = token::sign(key, self.name(), &job.id, job.lease);
                }
                return Ok(jobs);
            }
            let until = self
                .backend
                .next_event()
                .await?
                .map_or(deadline, |t| t.min(deadline));
            if until <= now {
                // Work is due now, but another caller may have taken it: ask again.
                tokio::task::yield_now().await;
                continue;
            }
            let sleep = clock.sleep(Duration::from_micros(until - now));
            tokio::select! {
                biased;
                () = &mut stop => return Ok(Vec::new()),
                () = changed => {}
                () = sleep => {}
            }
        }
    }

    /// The fence `token` was signed for as job `id`'s lease, or `LeaseLost`: a token this
    /// queue did not sign for this job is answered as a lease that is no longer the job's.
    fn fence(&self, id: &str, token: &LeaseToken) -> Result<u64, QueueError> {
        token::open(self.backend.token_key(), self.name(), id, token)
            .ok_or_else(|| QueueError::LeaseLost { id: id.to_string() })
    }

    /// Acknowledges a job: it is done and leaves the queue.
    ///
    /// Safe to repeat: the job of a genuine token that has left the queue answers `Ok`, so a
    /// call made again after its answer was lost answers as the first did. (A late ack by
    /// a holder whose lease ran out answers `Ok` too once the job is gone, done by another
    /// holder; while another holder has it, `LeaseLost`.)
    pub async fn ack(&self, id: &str, token: &LeaseToken) -> Result<(), QueueError> {
        self.ack_with_result(id, token, None).await
    }

    /// [`ack`](Self::ack), with what the job produced (any bytes, at most the queue's
    /// `max_payload`): kept with the job while it stays readable as `completed`
    /// ([`QueueConfig::keep_completed`](crate::QueueConfig::keep_completed)), and shown by
    /// [`job`](Self::job) as its `result`.
    pub async fn ack_with_result(
        &self,
        id: &str,
        token: &LeaseToken,
        result: Option<&[u8]>,
    ) -> Result<(), QueueError> {
        let fence = self.fence(id, token)?;
        match once_more_if_lost(|| self.backend.ack(id, fence, result)).await {
            Err(QueueError::UnknownJob { .. }) => Ok(()),
            answer => answer,
        }
    }

    /// Reports a running job's progress (any bytes, at most the queue's `max_payload`):
    /// [`job`](Self::job) shows the latest report as its `progress` while the job runs and
    /// after. `LeaseLost` once the lease is no longer this token's.
    ///
    /// ```
    /// use paceline_queue::{NewJob, Queue, QueueConfig};
    /// use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let queue = Queue::in_memory("q", QueueConfig::new("gcra:rate=10/s".parse()?))?;
    /// let job = queue.enqueue(NewJob::new("g", b"import".to_vec())).await?;
    /// let leased = queue.lease("w", 1, None, Duration::ZERO).await?;
    /// queue.progress(&job.id, &leased[0].token, br#"{"rows": 500}"#).await?;
    /// let seen = queue.job(&job.id).await?.unwrap();
    /// assert_eq!(seen.progress.as_deref(), Some(&br#"{"rows": 500}"#[..]));
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// # }).unwrap();
    /// ```
    pub async fn progress(
        &self,
        id: &str,
        token: &LeaseToken,
        progress: &[u8],
    ) -> Result<(), QueueError> {
        let fence = self.fence(id, token)?;
        once_more_if_lost(|| self.backend.progress(id, fence, progress)).await
    }

    /// Fails a job: see [`Failure`].
    ///
    /// Safe to repeat: a report made again with the same token after its answer was lost
    /// answers [`FailOutcome::Repeated`] and changes nothing. A job that has left the
    /// queue since (acknowledged, or dead and purged) answers `LeaseLost`.
    pub async fn fail(
        &self,
        id: &str,
        token: &LeaseToken,
        failure: Failure,
    ) -> Result<FailOutcome, QueueError> {
        let fence = self.fence(id, token)?;
        match once_more_if_lost(|| self.backend.fail(id, fence, failure.clone())).await {
            // Gone: acknowledged, or dead and purged, since. Not this report's doing.
            Err(QueueError::UnknownJob { id }) => Err(QueueError::LeaseLost { id }),
            answer => answer,
        }
    }

    /// Extends a lease by `length` from now; answers when it now expires.
    pub async fn extend(
        &self,
        id: &str,
        token: &LeaseToken,
        length: Duration,
    ) -> Result<u64, QueueError> {
        let fence = self.fence(id, token)?;
        once_more_if_lost(|| self.backend.extend(id, fence, length)).await
    }

    /// Removes a job no worker holds.
    pub async fn cancel(&self, id: &str) -> Result<(), QueueError> {
        self.backend.cancel(id).await
    }

    /// Pauses `group` (`None`: the whole queue) for `length` (`None`: until resumed), and
    /// answers when the pause ends ([`UNTIL_RESUMED`](crate::core::UNTIL_RESUMED) for
    /// none). Paused work is not leased and costs no attempt; leases already given run on.
    /// A pause never shortens one in place. `length`: 1 ms to 365 days.
    ///
    /// ```
    /// use paceline_queue::{NewJob, Queue, QueueConfig};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let queue = Queue::in_memory("roles", QueueConfig::new("gcra:rate=10/s".parse()?))?;
    /// queue.enqueue(NewJob::new("guild:1", b"grant".to_vec())).await?;
    /// queue.pause(Some("guild:1"), None).await?; // until resumed
    /// assert!(queue.lease("w", 10, None, Duration::ZERO).await?.is_empty());
    /// queue.resume(Some("guild:1")).await?;
    /// assert_eq!(queue.lease("w", 10, None, Duration::ZERO).await?.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn pause(
        &self,
        group: Option<&str>,
        length: Option<Duration>,
    ) -> Result<u64, QueueError> {
        self.backend.pause(group, length).await
    }

    /// Sets `group`'s policy while the queue runs (`None`: back to the configuration's, its
    /// own for the group or the default), kept by the queue's store: every process sharing
    /// it sees it at its next call, a restart keeps it, and a configuration change leaves
    /// it in place. The group's state carries over when the algorithm stays and starts
    /// afresh when it changes; a refusal under the old policy no longer holds the group.
    ///
    /// ```
    /// use paceline_queue::{NewJob, Queue, QueueConfig};
    /// use paceline_queue::core::PolicySource;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let queue = Queue::in_memory("roles", QueueConfig::new("fixed_window:limit=1,window=1h".parse()?))?;
    /// queue.set_policy("guild:1", Some(&"gcra:rate=10/s".parse()?)).await?;
    /// let (policy, source) = queue.policy("guild:1").await?;
    /// assert_eq!(policy.to_string(), "gcra:rate=10/s,burst=1"); // as its spec prints
    /// assert_eq!(source, PolicySource::RunTime);
    /// queue.set_policy("guild:1", None).await?;
    /// assert_eq!(queue.policy("guild:1").await?.1, PolicySource::Default);
    /// # Ok(()) }
    /// ```
    pub async fn set_policy(&self, group: &str, policy: Option<&Policy>) -> Result<(), QueueError> {
        self.backend.set_policy(group, policy).await
    }

    /// Keeps schedule `name`: a job of `schedule`'s group and payload enqueued at each tick
    /// of its cron expression, exactly once per tick however many processes share the
    /// queue, by whichever runs [`run_schedules`](Self::run_schedules) (as `paceline serve`
    /// does). The same schedule put again keeps its next tick; a changed one starts from
    /// the first tick after now. See [`crate::schedule`].
    ///
    /// ```
    /// use paceline_queue::schedule::Schedule;
    /// use paceline_queue::{Queue, QueueConfig};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let queue = Queue::in_memory("reports", QueueConfig::new("gcra:rate=10/s".parse()?))?;
    /// let nightly = Schedule::new("0 3 * * *", "daily", b"{}".to_vec()).timezone("Europe/Paris");
    /// let kept = queue.put_schedule("nightly", &nightly).await?;
    /// assert!(kept.next > queue.now_micros());
    /// assert_eq!(queue.schedules().await?.len(), 1);
    /// assert!(queue.delete_schedule("nightly").await?);
    /// # Ok(()) }
    /// ```
    pub async fn put_schedule(
        &self,
        name: &str,
        schedule: &Schedule,
    ) -> Result<ScheduleInfo, QueueError> {
        crate::schedule::check_schedule_name(name)?;
        let now = self.now_micros();
        schedule.validate(self.config().max_payload, now)?;
        let next = schedule.next_after(now)?;
        self.backend.put_schedule(name, schedule, next).await
    }

    /// Every schedule, by name, with its next tick.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, QueueError> {
        self.backend.schedules().await
    }

    /// Removes schedule `name`; answers whether there was one.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, QueueError> {
        self.backend.delete_schedule(name).await
    }

    /// Fires every schedule whose tick has come, once each (a tick another process fired
    /// is not fired again); answers the jobs enqueued, and the earliest next tick of any
    /// schedule (`None`: none). A schedule whose job cannot be enqueued (the queue is full,
    /// its payload is over the queue's largest, the store failed on that call) is tried
    /// again at the next pass, and does not hold the others back; only a failure to list
    /// the schedules is this call's error.
    pub async fn fire_due_schedules(&self) -> Result<(Vec<Enqueued>, Option<u64>), QueueError> {
        let now = self.now_micros();
        let mut fired = Vec::new();
        let mut earliest: Option<u64> = None;
        for kept in self.backend.schedules().await? {
            let mut next_tick = kept.next;
            if kept.next <= now {
                // The first tick after now: missed ticks are fired once, not one by one.
                let Ok(next) = kept.schedule.next_after(now) else {
                    continue;
                };
                next_tick = match self.backend.fire_schedule(&kept, next).await {
                    Ok(Some(job)) => {
                        fired.push(job);
                        next
                    }
                    Ok(None) => next,
                    // Asked again at the next pass.
                    Err(_) => now.saturating_add(1),
                };
            }
            earliest = Some(earliest.map_or(next_tick, |e| e.min(next_tick)));
        }
        Ok((fired, earliest))
    }

    /// Runs the queue's schedules until `stop` completes: fires each tick as it comes, and
    /// looks for schedules made or changed elsewhere at least every [`SCHEDULE_POLL`]. A
    /// store that fails is asked again a poll later. It sleeps on tokio's timer (a virtual
    /// clock that moves only when told is looked at every poll, not jumped ahead).
    pub async fn run_schedules(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let wait = match self.fire_due_schedules().await {
                Ok((_, Some(next))) => {
                    Duration::from_micros(next.saturating_sub(self.now_micros())).min(SCHEDULE_POLL)
                }
                Ok((_, None)) | Err(_) => SCHEDULE_POLL,
            };
            let sleep = tokio::time::sleep(wait.max(Duration::from_millis(1)));
            tokio::select! {
                () = &mut stop => return,
                () = sleep => {}
            }
        }
    }

    /// `group`'s policy now, and where it comes from.
    pub async fn policy(&self, group: &str) -> Result<(Policy, PolicySource), QueueError> {
        self.backend.policy(group).await
    }

    /// Ends every pause of `group` (`None`: the queue's own, not its groups'), a worker's
    /// pause after an upstream's refusal included, and wakes waiting workers.
    pub async fn resume(&self, group: Option<&str>) -> Result<(), QueueError> {
        self.backend.resume(group).await
    }

    /// One job, if the queue has it.
    pub async fn job(&self, id: &str) -> Result<Option<JobInfo>, QueueError> {
        self.backend.job(id).await
    }

    /// The counts by state and by group.
    pub async fn stats(&self) -> Result<Stats, QueueError> {
        self.backend.stats().await
    }

    /// The counts by state and the totals, without the groups (`groups` is empty): cheap
    /// whatever the queue holds.
    pub async fn counts(&self) -> Result<Stats, QueueError> {
        self.backend.counts().await
    }

    /// Up to `limit` dead jobs, oldest death first, after the first `offset`.
    pub async fn dead(&self, offset: usize, limit: usize) -> Result<Vec<JobInfo>, QueueError> {
        self.backend.jobs(JobState::Dead, None, offset, limit).await
    }

    /// Up to `limit` jobs in `state`, after the first `offset`, in the order the queue keeps
    /// them: scheduled ones by when they join their groups, waiting ones by group name then
    /// their place in line (only `group`'s, with `group`: waiting jobs only), active ones by
    /// when their leases run out, dead ones by death.
    ///
    /// ```
    /// use paceline_queue::{JobState, NewJob, Queue, QueueConfig};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let queue = Queue::in_memory("q", QueueConfig::new("gcra:rate=1/s".parse()?))?;
    /// queue.enqueue(NewJob::new("guild:1", b"a".to_vec())).await?;
    /// queue.enqueue(NewJob::new("guild:1", b"b".to_vec()).priority(0)).await?;
    /// let waiting = queue.jobs(JobState::Waiting, Some("guild:1"), 0, 10).await?;
    /// assert_eq!(waiting.len(), 2);
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// # }).unwrap();
    /// ```
    pub async fn jobs(
        &self,
        state: JobState,
        group: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<JobInfo>, QueueError> {
        crate::job::check_listing(state, group)?;
        self.backend.jobs(state, group, offset, limit).await
    }

    /// Follows the queue's events: every job enqueued, started, acked, failed, retried or
    /// dead, every lease that ran out and every pause, from every process sharing the
    /// queue, from the moment this answers. Events are told, not kept: see
    /// [`events`](crate::events) for what a slow or disconnected listener misses.
    ///
    /// ```
    /// use paceline_queue::{EventKind, NewJob, Queue, QueueConfig, Watched};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let queue = Queue::in_memory("roles", QueueConfig::new("gcra:rate=10/s,burst=10".parse()?))?;
    /// let mut events = queue.events().await?;
    /// queue.enqueue(NewJob::new("guild:1", b"grant".to_vec())).await?;
    /// let job = &queue.lease("worker-1", 1, None, Duration::ZERO).await?[0];
    /// queue.ack(&job.id, &job.token).await?;
    /// let mut kinds = Vec::new();
    /// while let Some(Watched::Event(e)) = events.next().await {
    ///     kinds.push(e.kind);
    ///     if e.kind == EventKind::Acked { break; }
    /// }
    /// assert_eq!(kinds, [EventKind::Enqueued, EventKind::Started, EventKind::Acked]);
    /// # Ok(()) }
    /// ```
    pub async fn events(&self) -> Result<Events, QueueError> {
        Ok(Events::new(self.backend.watch().await?))
    }

    /// Puts dead jobs back in line with fresh attempts (`None`: all); answers how many.
    pub async fn retry_dead(&self, ids: Option<&[String]>) -> Result<usize, QueueError> {
        self.backend.retry_dead(ids).await
    }

    /// Removes every dead job; answers how many.
    pub async fn purge_dead(&self) -> Result<usize, QueueError> {
        self.backend.purge_dead().await
    }
}

/// Makes `call` once more if it failed on its way (the connection, or no answer in time):
/// it may have been applied with its answer lost, and every call made through this is one
/// that answers a repeat as the first (a request id, a token).
async fn once_more_if_lost<T, F>(mut call: impl FnMut() -> F) -> Result<T, QueueError>
where
    F: Future<Output = Result<T, QueueError>>,
{
    match call().await {
        Err(QueueError::Store(e)) if e.answer_may_be_lost() => call().await,
        answer => answer,
    }
}

/// A request id drawn for one lease call: 128 random bits, in hex.
fn random_request_id() -> Result<String, QueueError> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        QueueError::Store(paceline_core::StoreError::new(
            StoreErrorKind::Unavailable,
            "the operating system's random source failed",
        ))
    })?;
    Ok(paceline_store::secret::to_hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_store::MemoryStore;
    use paceline_testkit::NotRedis;

    #[tokio::test(flavor = "current_thread")]
    async fn a_shared_store_without_redis_is_refused_never_replaced_by_a_local_queue() {
        let store: SharedStore = Arc::new(NotRedis::new());
        let config = QueueConfig::new("gcra:rate=10/s".parse().expect("a policy"));
        match Queue::with_store(&store, "emails", config).await {
            Err(QueueError::Input(e)) => {
                assert_eq!(e.field(), "store");
                assert!(e.message().contains("`redis` feature"), "{e}");
            }
            other => panic!("a queue no other process would see: {other:?}"),
        }
        // On a store of this process the queue is this process's own.
        let local: SharedStore = Arc::new(MemoryStore::new());
        let config = QueueConfig::new("gcra:rate=10/s".parse().expect("a policy"));
        assert!(Queue::with_store(&local, "emails", config).await.is_ok());
    }
}

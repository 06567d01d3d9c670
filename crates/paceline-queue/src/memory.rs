//! The queue held in this process: a [`QueueCore`] behind a lock, on a clock.
//!
//! Not durable: jobs live as long as the process. For tests (on a virtual clock),
//! simulations and single-process apps.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::core::PolicySource;
use crate::schedule::{Schedule, ScheduleInfo};
use paceline_core::{Clock, InputError, Policy};
use paceline_store::secret::TokenKey;
use paceline_store::SystemClock;
use tokio::sync::Notify;

use crate::config::QueueConfig;
use crate::core::{Jitter, QueueCore};
use crate::error::QueueError;
use crate::events::{Feed, Watched};
use crate::job::{Enqueued, FailOutcome, Failure, JobInfo, JobState, Leased, NewJob, Stats};
use crate::queue::{QueueBackend, QueueFuture};

/// A queue in this process's memory. See [`Queue::in_memory`](crate::Queue::in_memory).
pub struct MemoryQueue {
    name: String,
    config: QueueConfig,
    core: Mutex<QueueCore>,
    changed: Notify,
    /// Where the core's events go, for [`Queue::events`](crate::Queue::events).
    events: Feed,
    clock: Arc<dyn Clock>,
    /// The state of the jitter's random numbers (xorshift).
    random: Jitter,
    /// Signs the leases' tokens: drawn for this queue alone.
    key: TokenKey,
}

impl std::fmt::Debug for MemoryQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryQueue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl MemoryQueue {
    /// An empty queue on the system clock.
    pub fn new(name: &str, config: QueueConfig) -> Result<MemoryQueue, InputError> {
        MemoryQueue::with_clock(name, config, Arc::new(SystemClock::new()))
    }

    /// An empty queue on `clock` (a `ManualClock` or a `TokioClock` in tests).
    ///
    /// A configuration of several [`partitions`](QueueConfig::partitions) is refused,
    /// naming `partitions`: such a queue is a [`Partitioned`](crate::Partitioned) of
    /// memory queues ([`Queue::in_memory`](crate::Queue::in_memory) makes one).
    pub fn with_clock(
        name: &str,
        config: QueueConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<MemoryQueue, InputError> {
        if config.partitions > 1 {
            return Err(crate::partitioned::one_partition_only("MemoryQueue"));
        }
        MemoryQueue::partition(name, config, clock, 0)
    }

    /// Partition `index` of a queue of several (its `config` with its share of
    /// `max_jobs`), or (index 0 of 1) a queue of one.
    pub(crate) fn partition(
        name: &str,
        config: QueueConfig,
        clock: Arc<dyn Clock>,
        index: usize,
    ) -> Result<MemoryQueue, InputError> {
        check_queue_name(name)?;
        let core = QueueCore::new(config.clone())?.in_partition(index);
        let seed = clock.now_micros();
        let key = TokenKey::random().map_err(|e| InputError::new("queue", e.to_string()))?;
        Ok(MemoryQueue {
            name: name.to_string(),
            config,
            core: Mutex::new(core),
            changed: Notify::new(),
            events: Feed::default(),
            clock,
            random: Jitter::seeded(seed),
            key,
        })
    }

    /// Signs lease tokens with `key` instead of one drawn for this queue: for a queue whose
    /// tokens must be another's (a test comparing this queue with a Redis one).
    #[must_use]
    pub fn with_token_key(mut self, key: TokenKey) -> MemoryQueue {
        self.key = key;
        self
    }

    /// How many groups the queue holds state for; see
    /// [`QueueCore::groups_held`](crate::QueueCore::groups_held).
    pub fn groups_held(&self) -> usize {
        self.core().groups_held()
    }

    /// The core, locked, keeping its events while someone listens; they go out to the
    /// listeners when the lock is let go, so in the order the core decided them.
    fn core(&self) -> Locked<'_> {
        // The core's operations never panic midway, so a poisoned lock holds a whole state.
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        core.watch(self.events.listened());
        Locked {
            core,
            events: &self.events,
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_micros()
    }

    /// Wakes every waiting lease call.
    fn wake(&self) {
        self.changed.notify_waiters();
    }
}

/// The core while locked: see [`MemoryQueue::core`].
struct Locked<'a> {
    core: MutexGuard<'a, QueueCore>,
    events: &'a Feed,
}

impl std::ops::Deref for Locked<'_> {
    type Target = QueueCore;
    fn deref(&self) -> &QueueCore {
        &self.core
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut QueueCore {
        &mut self.core
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        for event in self.core.take_events() {
            self.events.send(Watched::Event(event));
        }
    }
}

/// The longest queue name, in bytes.
pub const MAX_QUEUE_NAME: usize = 128;

/// Queue names: 1 to [`MAX_QUEUE_NAME`] bytes of `A-Z a-z 0-9 - _ .` (they appear in URLs,
/// metric labels and keys as they are).
pub fn check_queue_name(name: &str) -> Result<(), InputError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(InputError::new(
            "queue",
            format!("`{name}` is not a valid queue name; use 1 to {MAX_QUEUE_NAME} of A-Z a-z 0-9 - _ ."),
        ))
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> QueueFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

impl crate::partitioned::Partition for MemoryQueue {
    fn replay<'a>(
        &'a self,
        _worker: &'a str,
        request: &'a str,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        let now = self.now();
        ready(self.core().replay_request(now, request))
    }
}

impl QueueBackend for MemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> &QueueConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn enqueue(&self, jobs: Vec<NewJob>) -> QueueFuture<'_, Vec<Result<Enqueued, QueueError>>> {
        let now = self.now();
        let answers: Vec<_> = {
            let mut core = self.core();
            jobs.into_iter().map(|job| core.enqueue(now, job)).collect()
        };
        if answers.iter().any(|a| a.as_ref().is_ok_and(|e| e.created)) {
            self.wake();
        }
        ready(answers)
    }

    fn lease<'a>(
        &'a self,
        worker: &'a str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&'a str>,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        let now = self.now();
        ready(
            self.core()
                .lease_request(now, worker, max_jobs, lease, request),
        )
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
        let now = self.now();
        let answer = self
            .core()
            .ack_with_result(now, id, lease, result.map(<[u8]>::to_vec));
        if answer.is_ok() && self.config.caps_leases() {
            self.wake();
        }
        ready(answer)
    }

    fn progress<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        progress: &'a [u8],
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        let now = self.now();
        ready(self.core().progress(now, id, lease, progress.to_vec()))
    }

    fn fail<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        failure: Failure,
    ) -> QueueFuture<'a, Result<FailOutcome, QueueError>> {
        let now = self.now();
        let jitter = self.random.next();
        let answer = self.core().fail(now, id, lease, failure, jitter);
        if answer.is_ok() {
            self.wake();
        }
        ready(answer)
    }

    fn extend<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        length: Duration,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        let now = self.now();
        let (answer, sooner) = {
            let mut core = self.core();
            let before = core.next_event();
            let answer = core.extend(now, id, lease, length);
            // A lease made shorter may now expire before what waiting calls sleep until.
            let after = core.next_event();
            (answer, after < before && after.is_some())
        };
        if sooner {
            self.wake();
        }
        ready(answer)
    }

    fn cancel<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<(), QueueError>> {
        let now = self.now();
        ready(self.core().cancel(now, id))
    }

    fn pause<'a>(
        &'a self,
        group: Option<&'a str>,
        length: Option<Duration>,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        let now = self.now();
        ready(self.core().pause(now, group, length))
    }

    fn resume<'a>(&'a self, group: Option<&'a str>) -> QueueFuture<'a, Result<(), QueueError>> {
        let now = self.now();
        let answer = self.core().resume(now, group);
        if answer.is_ok() {
            self.wake();
        }
        ready(answer)
    }

    fn set_policy<'a>(
        &'a self,
        group: &'a str,
        policy: Option<&'a Policy>,
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        let now = self.now();
        let answer = self.core().set_policy(now, group, policy.cloned());
        if answer.is_ok() {
            // The group may start sooner under its new policy.
            self.wake();
        }
        ready(answer)
    }

    fn policy<'a>(
        &'a self,
        group: &'a str,
    ) -> QueueFuture<'a, Result<(Policy, PolicySource), QueueError>> {
        ready(self.core().policy(group))
    }

    fn put_schedule<'a>(
        &'a self,
        name: &'a str,
        schedule: &'a Schedule,
        next: u64,
    ) -> QueueFuture<'a, Result<ScheduleInfo, QueueError>> {
        let now = self.now();
        ready(self.core().put_schedule(now, name, schedule.clone(), next))
    }

    fn schedules(&self) -> QueueFuture<'_, Result<Vec<ScheduleInfo>, QueueError>> {
        ready(Ok(self.core().schedules()))
    }

    fn delete_schedule<'a>(&'a self, name: &'a str) -> QueueFuture<'a, Result<bool, QueueError>> {
        let now = self.now();
        ready(self.core().delete_schedule(now, name))
    }

    fn fire_schedule<'a>(
        &'a self,
        seen: &'a ScheduleInfo,
        next: u64,
    ) -> QueueFuture<'a, Result<Option<Enqueued>, QueueError>> {
        let now = self.now();
        let answer = self.core().fire_schedule(now, &seen.name, seen.next, next);
        if answer.as_ref().is_ok_and(Option::is_some) {
            self.wake();
        }
        ready(answer)
    }

    fn job<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<Option<JobInfo>, QueueError>> {
        ready(Ok(self.core().job(id)))
    }

    fn stats(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        let now = self.now();
        ready(self.core().stats(now))
    }

    fn counts(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        let now = self.now();
        ready(self.core().counts(now))
    }

    fn jobs<'a>(
        &'a self,
        state: JobState,
        group: Option<&'a str>,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'a, Result<Vec<JobInfo>, QueueError>> {
        ready(Ok(self.core().jobs(state, group, offset, limit)))
    }

    fn retry_dead<'a>(
        &'a self,
        ids: Option<&'a [String]>,
    ) -> QueueFuture<'a, Result<usize, QueueError>> {
        let now = self.now();
        let answer = self.core().retry_dead(now, ids);
        if answer.as_ref().is_ok_and(|&n| n > 0) {
            self.wake();
        }
        ready(answer)
    }

    fn purge_dead(&self) -> QueueFuture<'_, Result<usize, QueueError>> {
        let now = self.now();
        ready(self.core().purge_dead(now))
    }

    fn next_event(&self) -> QueueFuture<'_, Result<Option<u64>, QueueError>> {
        ready(Ok(self.core().next_event()))
    }

    fn changed(&self) -> QueueFuture<'_, ()> {
        let mut notified = Box::pin(self.changed.notified());
        notified.as_mut().enable();
        notified
    }

    fn watch(&self) -> QueueFuture<'_, Result<crate::events::Feeds, QueueError>> {
        // Under the core's lock: every call that takes it after this answers keeps its events.
        let _core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        ready(Ok(vec![self.events.subscribe()]))
    }
}

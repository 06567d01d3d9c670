//! [`Partitioned`]: one queue spread over several partitions, each a complete queue of its
//! own, for a queue whose work is more than the one Redis Cluster primary holding its slot
//! can serve.
//!
//! # The contract
//!
//! - **Groups are spread by a stable hash**: group `g` lives in partition
//!   [`partition_of`]`(g, n)`, FNV-1a 64 of the group's bytes mod `n`: the same in every
//!   process, version and machine. A group's jobs all live in its partition, so each
//!   group's limit, concurrency cap, line order (FIFO), retries, pauses and fencing are
//!   exactly those of a queue of one partition.
//! - **A lease takes the partitions in turn**: from a starting partition (drawn from the
//!   call's request id, so a repeat of a call starts where it did, and from a turn kept
//!   per handle for a call without one), it takes what the partition may start now, then
//!   asks the next for what `max_jobs` still allows, and so on. A partition with no
//!   eligible group is passed over, as is one whose store fails (unless no partition
//!   answers jobs: then the lease answers the error). There is no order between jobs of
//!   different partitions and no fairness between groups of different partitions beyond
//!   the turns: a group of one partition may start before a group of another that became
//!   eligible earlier.
//! - **A lease call's request id** covers every partition it asks: the partition asked
//!   with `m` jobs still allowed keeps the call's jobs under the request id and `m`. A
//!   repeat of the call asks the partitions in the same order; each that took jobs the
//!   first time, asked with the same `m`, answers those jobs again and takes no more. A
//!   partition that took none the first time may take new jobs in the repeat. Since a
//!   partition asked with `m` never answers more than `m` jobs, a repeat never answers
//!   more than `max_jobs`, nor a job twice; if the jobs allowed when it reaches a
//!   partition differ from the first call's (a partition before it took jobs this time
//!   and not then), that partition's jobs of the first call stay held by no one until
//!   their leases run out, as a lease without a request id whose answer was lost.
//! - **Fences**: a job's fence in partition `i` of `n`, `f`, is answered as `f * n + i`,
//!   which grows with every lease of the job (so it still fences writes downstream) and
//!   names the partition that an ack, a fail or an extend goes to.
//! - **Ids**: ids the queue gives are partition 0's numbers, and `NUMBER.i` in partition
//!   `i > 0` (`17.2`), so no two partitions give the same one. An id of the producer's is
//!   unique within its group's partition: give each id one group (as a retry of an enqueue
//!   does), or two jobs of that id may live in two partitions. Ids shaped as the queue's
//!   (digits, a dot, digits) are refused from producers, as all-digit ones are in any
//!   queue. `job` and `cancel` ask the partition an id's suffix names first (none:
//!   partition 0), then the others.
//! - **One queue seen from outside**: `stats` and `counts` are every partition's summed
//!   (the groups of all, by name); `next_event` is the earliest of them; `dead` lists
//!   partition 0's dead jobs (oldest death first), then partition 1's, and so on, with
//!   `offset` counting across them; `retry_dead` and `purge_dead` act on every partition;
//!   `changed` wakes at a change of any partition, so waiting workers never poll.
//! - **`max_jobs`** is split: partition `i` holds at most `max_jobs / n`, one more for the
//!   first `max_jobs % n` partitions, so that the queue holds at most `max_jobs`. An
//!   enqueue into a full partition is refused while others may have room (the groups
//!   hashed there fill it).
//!
//! ```
//! use paceline_queue::partitioned::partition_of;
//! use paceline_queue::{NewJob, Queue, QueueConfig};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline_queue::QueueError> {
//! let config = QueueConfig::new("fixed_window:limit=1,window=10s".parse()?).partitions(3);
//! let queue = Queue::in_memory("roles", config)?;
//! assert_eq!(partition_of("guild:0", 3), 2);
//! assert_eq!(partition_of("guild:3", 3), 1);
//! for guild in ["guild:0", "guild:3"] {
//!     queue.enqueue(NewJob::new(guild, b"a".to_vec())).await?;
//!     queue.enqueue(NewJob::new(guild, b"b".to_vec())).await?;
//! }
//! // Each guild's own limit, one start per 10 s, whichever partition holds it.
//! let leased = queue.lease("w", 10, None, Duration::ZERO).await?;
//! assert_eq!(leased.len(), 2);
//! // The fence names the partition: `f * 3 + i`.
//! for job in &leased {
//!     assert_eq!(job.lease % 3, partition_of(&job.group, 3) as u64);
//! }
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use paceline_core::{Clock, InputError, StoreError, StoreErrorKind};
use paceline_store::secret::TokenKey;

use crate::config::QueueConfig;
use crate::core::{check_lease_request, queue_full};
use crate::error::QueueError;
use crate::job::{Enqueued, FailOutcome, Failure, JobInfo, Leased, NewJob, Stats, Totals, MAX_ID};
use crate::memory::MemoryQueue;
use crate::queue::{QueueBackend, QueueFuture};

/// The partition of `group` in a queue of `partitions`: FNV-1a 64 of the group's bytes,
/// mod `partitions` (0 for a queue of one, or none). Fixed: never keyed, never changed
/// between versions, so every process puts a group in the same partition.
///
/// ```
/// use paceline_queue::partitioned::partition_of;
/// assert_eq!(partition_of("guild:1", 1), 0);
/// assert_eq!(partition_of("guild:1", 3), 0);
/// assert_eq!(partition_of("guild:3", 3), 1);
/// ```
pub fn partition_of(group: &str, partitions: u32) -> usize {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = group
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    match u64::from(partitions) {
        0 | 1 => 0,
        n => usize::try_from(hash % n).unwrap_or(0),
    }
}

/// What the ids partition `index` gives end with: nothing for partition 0, `.index` for
/// the others.
pub(crate) fn id_suffix(index: usize) -> String {
    if index == 0 {
        String::new()
    } else {
        format!(".{index}")
    }
}

/// The partition an id the queue gives names: `N` is partition 0's, `N.i` partition `i`'s;
/// `None` for an id of another shape (a producer's) or a partition beyond `partitions`.
fn partition_named(id: &str, partitions: usize) -> Option<usize> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('.') {
        None if digits(id) => Some(0),
        Some((number, index)) if digits(number) && digits(index) && !index.starts_with('0') => {
            index.parse().ok().filter(|&i| i > 0 && i < partitions)
        }
        _ => None,
    }
}

/// Whether `id` has the shape of an id a partition gives (digits, a dot, digits).
fn shaped_as_given(id: &str) -> bool {
    id.split_once('.').is_some_and(|(number, index)| {
        [number, index]
            .iter()
            .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The error for a backend of one partition given a configuration of several.
pub(crate) fn one_partition_only(backend: &str) -> InputError {
    InputError::new(
        "partitions",
        format!(
            "a {backend} is one partition; a queue of several is a Partitioned of them: open \
             it with Queue::open, Queue::with_store or Queue::in_memory"
        ),
    )
}

/// The error for a queue of one partition given to a [`Partitioned`].
fn several_partitions_only() -> InputError {
    InputError::new(
        "partitions",
        "a Partitioned queue has 2 or more partitions; a queue of one is a MemoryQueue or a \
         RedisQueue (Queue::open and Queue::in_memory choose)",
    )
}

/// The error for a queue opened with another number of partitions than it has.
#[cfg(feature = "redis")]
pub(crate) fn partitions_refused(name: &str, stored: u64, asked: u32) -> QueueError {
    InputError::new(
        "partitions",
        format!(
            "queue `{name}` has {stored} partition{} and was opened with {asked}: a queue's \
             partitions cannot change, since each group's jobs and limit live in the \
             partition its name hashes to; give it partitions = {stored} again, or drain it \
             and delete its keys (hash tags `{{q:{name}}}` and `{{q:{name}/...}}`) before \
             opening it with {asked}, or open a queue of a new name",
            if stored == 1 { "" } else { "s" }
        ),
    )
    .into()
}

/// Partition `index`'s share of `max_jobs` over `partitions`: `max_jobs / partitions`, one
/// more for the first `max_jobs % partitions`.
fn share_of(max_jobs: usize, partitions: usize, index: usize) -> usize {
    max_jobs / partitions + usize::from(index < max_jobs % partitions)
}

/// Partition `index`'s configuration: the queue's, with its share of `max_jobs`, as a
/// queue of its own (one partition).
pub(crate) fn partition_config(config: &QueueConfig, index: usize) -> QueueConfig {
    let partitions = config.partitions.max(1) as usize;
    let mut own = config.clone();
    own.max_jobs = share_of(config.max_jobs, partitions, index);
    own.partitions = 1;
    own
}

/// The request id partition calls of the lease call `request` carry when `budget` jobs
/// are still allowed: `REQUEST:BUDGET`, or (for a request id too long for that) the
/// SHA-256 of the request id in hex in its place.
fn partition_request(request: &str, budget: usize) -> String {
    let own = format!("{request}:{budget}");
    if own.len() <= MAX_ID {
        return own;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, request.as_bytes());
    format!(
        "{}:{budget}",
        paceline_store::secret::to_hex(digest.as_ref())
    )
}

fn add_totals(a: Totals, b: Totals) -> Totals {
    Totals {
        enqueued: a.enqueued + b.enqueued,
        started: a.started + b.started,
        acked: a.acked + b.acked,
        failed: a.failed + b.failed,
        retried: a.retried + b.retried,
        dead: a.dead + b.dead,
        lease_expiries: a.lease_expiries + b.lease_expiries,
        pauses: a.pauses + b.pauses,
    }
}

/// One queue over several partitions, each a complete queue (a [`MemoryQueue`], or a
/// `RedisQueue` under a hash tag of its own): see the [module docs](self) for what it
/// promises. [`Queue::open`](crate::Queue::open), [`Queue::with_store`](crate::Queue::with_store)
/// and [`Queue::in_memory`](crate::Queue::in_memory) make one for a configuration of
/// several [`partitions`](QueueConfig::partitions).
pub struct Partitioned<B> {
    name: String,
    config: QueueConfig,
    /// Partition `i` at `i`; never empty.
    parts: Vec<B>,
    /// Where the next lease call without a request id starts.
    turn: AtomicUsize,
}

impl<B> std::fmt::Debug for Partitioned<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitioned")
            .field("name", &self.name)
            .field("partitions", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl<B: QueueBackend> Partitioned<B> {
    /// The queue `config` describes over `parts` (partition `i` at `i`, two or more, each
    /// made with [`partition_config`] and its index).
    pub(crate) fn new(config: QueueConfig, parts: Vec<B>) -> Result<Partitioned<B>, InputError> {
        if parts.len() < 2 || parts.len() != config.partitions as usize {
            return Err(several_partitions_only());
        }
        Ok(Partitioned {
            name: parts[0].name().to_string(),
            config,
            parts,
            turn: AtomicUsize::new(0),
        })
    }

    /// The partitions, partition `i` at `i`.
    pub fn partitions(&self) -> &[B] {
        &self.parts
    }

    /// Partition 0, whose clock and token key are the queue's.
    fn first(&self) -> &B {
        &self.parts[0]
    }

    /// The partitions in the order `job` and `cancel` ask them about `id`: the one its
    /// suffix names first (none: partition 0), then the others in order.
    fn order_for(&self, id: &str) -> Vec<usize> {
        let first = partition_named(id, self.parts.len()).unwrap_or(0);
        std::iter::once(first)
            .chain((0..self.parts.len()).filter(|&p| p != first))
            .collect()
    }

    /// Partition `p`'s fence `fence` as the queue answers it.
    fn public_fence(&self, fence: u64, p: usize) -> Result<u64, QueueError> {
        let n = self.parts.len() as u64;
        fence
            .checked_mul(n)
            .and_then(|f| f.checked_add(p as u64))
            .ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Protocol,
                    format!("a fence beyond what a queue of {n} partitions can number"),
                )
                .into()
            })
    }

    /// The partition and its own fence of a fence the queue answered.
    fn own_fence(&self, fence: u64) -> (usize, u64) {
        let n = self.parts.len() as u64;
        (usize::try_from(fence % n).unwrap_or(0), fence / n)
    }

    /// Partition `p`'s answer to an enqueue, with a full partition's refusal naming it.
    fn answer_of(
        &self,
        p: usize,
        answer: Result<Enqueued, QueueError>,
    ) -> Result<Enqueued, QueueError> {
        let share = share_of(self.config.max_jobs, self.parts.len(), p);
        match answer {
            Err(e) if e == queue_full(share) => Err(QueueError::Store(StoreError::new(
                StoreErrorKind::Capacity,
                format!(
                    "partition {p} of the queue holds its share of max_jobs ({share} of {}; \
                     the groups whose names hash to it fill it): let workers catch up, purge \
                     dead jobs or raise max_jobs",
                    self.config.max_jobs
                ),
            ))),
            other => other,
        }
    }

    async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Vec<Result<Enqueued, QueueError>> {
        let n = self.parts.len();
        let mut answers: Vec<Option<Result<Enqueued, QueueError>>> = Vec::new();
        let mut batches: Vec<(Vec<usize>, Vec<NewJob>)> = vec![(Vec::new(), Vec::new()); n];
        for (i, job) in jobs.into_iter().enumerate() {
            let refused = match job.validate(self.config.max_payload) {
                Err(e) => Some(e),
                Ok(()) if job.id.as_deref().is_some_and(shaped_as_given) => Some(InputError::new(
                    "id",
                    "must not be digits, a dot and digits in a queue of several \
                         partitions: those are the ids it gives; add a prefix, e.g. order-42.1",
                )),
                Ok(()) => None,
            };
            answers.push(refused.map(|e| Err(e.into())));
            if answers[i].is_none() {
                let p = partition_of(&job.group, self.config.partitions);
                batches[p].0.push(i);
                batches[p].1.push(job);
            }
        }
        let calls = batches
            .into_iter()
            .enumerate()
            .filter(|(_, (slots, _))| !slots.is_empty())
            .map(|(p, (slots, jobs))| async move { (p, slots, self.parts[p].enqueue(jobs).await) });
        for (p, slots, replies) in join_all(calls).await {
            for (slot, reply) in slots.into_iter().zip(replies) {
                answers[slot] = Some(self.answer_of(p, reply));
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(InputError::new("jobs", "no answer").into())))
            .collect()
    }

    async fn lease_across(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&str>,
    ) -> Result<Vec<Leased>, QueueError> {
        check_lease_request(&self.config, worker, max_jobs, lease, request)?;
        let n = self.parts.len();
        let start = match request {
            Some(request) => partition_of(request, self.config.partitions),
            None => self.turn.fetch_add(1, Ordering::Relaxed) % n,
        };
        let mut out: Vec<Leased> = Vec::new();
        let mut failed = None;
        for step in 0..n {
            let budget = max_jobs.saturating_sub(out.len());
            if budget == 0 {
                break;
            }
            let p = (start + step) % n;
            let own = request.map(|r| partition_request(r, budget));
            let part = &self.parts[p];
            // A lost answer is asked again at once, as `Queue` does for the whole call.
            let answer = match part.lease(worker, budget, lease, own.as_deref()).await {
                Err(QueueError::Store(e)) if e.answer_may_be_lost() => {
                    part.lease(worker, budget, lease, own.as_deref()).await
                }
                answer => answer,
            };
            match answer {
                Ok(jobs) => {
                    for mut job in jobs {
                        job.lease = self.public_fence(job.lease, p)?;
                        out.push(job);
                    }
                }
                // This partition's store failed: the others may still have work.
                Err(e @ QueueError::Store(_)) => {
                    failed.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match failed {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Whether partition `p` reports a dead job at `offset` of its dead set.
    async fn has_dead_at(&self, p: usize, offset: usize) -> Result<bool, QueueError> {
        Ok(!self.parts[p].dead(offset, 1).await?.is_empty())
    }

    async fn dead_across(&self, offset: usize, limit: usize) -> Result<Vec<JobInfo>, QueueError> {
        let mut skip = offset;
        let mut out = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            if out.len() >= limit {
                break;
            }
            let page = part.dead(skip, limit - out.len()).await?;
            if page.is_empty() && skip > 0 {
                // This partition holds at most `skip` dead jobs: count them (a binary
                // search with one-job reads), and skip that many.
                let (mut low, mut high) = (0, skip);
                while low < high {
                    let mid = low + (high - low) / 2;
                    if self.has_dead_at(p, mid).await? {
                        low = mid + 1;
                    } else {
                        high = mid;
                    }
                }
                skip -= low;
                continue;
            }
            skip = 0;
            out.extend(page);
        }
        Ok(out)
    }

    async fn stats_across(&self, with_groups: bool) -> Result<Stats, QueueError> {
        let all = join_all(
            self.parts
                .iter()
                .map(|p| if with_groups { p.stats() } else { p.counts() }),
        )
        .await;
        let mut sum = Stats::default();
        for stats in all {
            let stats = stats?;
            sum.scheduled += stats.scheduled;
            sum.waiting += stats.waiting;
            sum.active += stats.active;
            sum.dead += stats.dead;
            sum.groups.extend(stats.groups);
            sum.totals = add_totals(sum.totals, stats.totals);
        }
        sum.groups.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(sum)
    }

    async fn job_anywhere(&self, id: &str) -> Result<Option<JobInfo>, QueueError> {
        for p in self.order_for(id) {
            if let Some(job) = self.parts[p].job(id).await? {
                return Ok(Some(job));
            }
        }
        Ok(None)
    }

    async fn cancel_anywhere(&self, id: &str) -> Result<(), QueueError> {
        for p in self.order_for(id) {
            match self.parts[p].cancel(id).await {
                Err(QueueError::UnknownJob { .. }) => continue,
                answer => return answer,
            }
        }
        Err(QueueError::UnknownJob { id: id.to_string() })
    }

    async fn sum_over<'a, F>(&'a self, call: impl Fn(&'a B) -> F) -> Result<usize, QueueError>
    where
        F: Future<Output = Result<usize, QueueError>> + 'a,
    {
        let mut sum = 0usize;
        for n in join_all(self.parts.iter().map(call)).await {
            sum = sum.saturating_add(n?);
        }
        Ok(sum)
    }

    /// The earliest next event of any partition, each on the queue's clock (partition 0's):
    /// partitions in Redis Cluster follow their own primary's time, which may differ by
    /// the servers' skew. A partition that fails is left out unless all do.
    async fn next_across(&self) -> Result<Option<u64>, QueueError> {
        let all = join_all(self.parts.iter().map(QueueBackend::next_event)).await;
        let clock = self.clock();
        let now = i128::from(clock.now_micros());
        let mut earliest: Option<u64> = None;
        let (mut answered, mut failed) = (false, None);
        for (part, answer) in self.parts.iter().zip(all) {
            answered |= answer.is_ok();
            match answer {
                Ok(Some(at)) => {
                    let at = if std::ptr::addr_eq(part.clock(), clock) {
                        at
                    } else {
                        let own = i128::from(part.clock().now_micros());
                        let moved = i128::from(at) + now - own;
                        u64::try_from(moved.max(0)).unwrap_or(u64::MAX)
                    };
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
                Ok(None) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if !answered => Err(e),
            _ => Ok(earliest),
        }
    }
}

impl<B: QueueBackend> QueueBackend for Partitioned<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> &QueueConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        self.first().clock()
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
        Box::pin(self.lease_across(worker, max_jobs, lease, request))
    }

    fn token_key(&self) -> &TokenKey {
        self.first().token_key()
    }

    fn ack<'a>(&'a self, id: &'a str, lease: u64) -> QueueFuture<'a, Result<(), QueueError>> {
        let (p, fence) = self.own_fence(lease);
        self.parts[p].ack(id, fence)
    }

    fn fail<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        failure: Failure,
    ) -> QueueFuture<'a, Result<FailOutcome, QueueError>> {
        let (p, fence) = self.own_fence(lease);
        self.parts[p].fail(id, fence, failure)
    }

    fn extend<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        length: Duration,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        let (p, fence) = self.own_fence(lease);
        self.parts[p].extend(id, fence, length)
    }

    fn cancel<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.cancel_anywhere(id))
    }

    fn job<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<Option<JobInfo>, QueueError>> {
        Box::pin(self.job_anywhere(id))
    }

    fn stats(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        Box::pin(self.stats_across(true))
    }

    fn counts(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
        Box::pin(self.stats_across(false))
    }

    fn dead(
        &self,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'_, Result<Vec<JobInfo>, QueueError>> {
        Box::pin(self.dead_across(offset, limit))
    }

    fn retry_dead<'a>(
        &'a self,
        ids: Option<&'a [String]>,
    ) -> QueueFuture<'a, Result<usize, QueueError>> {
        Box::pin(self.sum_over(move |p| p.retry_dead(ids)))
    }

    fn purge_dead(&self) -> QueueFuture<'_, Result<usize, QueueError>> {
        Box::pin(self.sum_over(QueueBackend::purge_dead))
    }

    fn next_event(&self) -> QueueFuture<'_, Result<Option<u64>, QueueError>> {
        Box::pin(self.next_across())
    }

    fn changed(&self) -> QueueFuture<'_, ()> {
        // Each partition watches from now; the first to change ends the wait.
        let mut all: Vec<QueueFuture<'_, ()>> = self.parts.iter().map(|p| p.changed()).collect();
        Box::pin(std::future::poll_fn(move |cx| {
            if all.iter_mut().any(|f| f.as_mut().poll(cx).is_ready()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }))
    }
}

impl Partitioned<MemoryQueue> {
    /// An empty queue of `config.partitions` (two or more) memory queues on `clock`, each
    /// with its share of `max_jobs`. [`Queue::in_memory`](crate::Queue::in_memory) makes
    /// one on the system clock.
    ///
    /// ```
    /// use paceline_queue::{NewJob, Partitioned, Queue, QueueConfig};
    /// use paceline_store::ManualClock;
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let config = QueueConfig::new("gcra:rate=10/s".parse()?).partitions(2);
    /// let queue = Partitioned::in_memory("emails", config, Arc::new(ManualClock::new(0)))?;
    /// assert_eq!(queue.partitions().len(), 2);
    /// let queue = Queue::new(queue);
    /// // Partition 1 gives ids that end in `.1`.
    /// let job = queue.enqueue(NewJob::new("guild:1", b"x".to_vec())).await?;
    /// assert_eq!(job.id, "1.1");
    /// # Ok(()) }
    /// ```
    pub fn in_memory(
        name: &str,
        config: QueueConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Partitioned<MemoryQueue>, InputError> {
        config.validate()?;
        let parts = (0..config.partitions as usize)
            .map(|i| {
                MemoryQueue::partition(name, partition_config(&config, i), Arc::clone(&clock), i)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Partitioned::new(config, parts)
    }

    /// Signs lease tokens with `key` instead of one drawn for this queue (see
    /// [`MemoryQueue::with_token_key`]).
    #[must_use]
    pub fn with_token_key(mut self, key: TokenKey) -> Partitioned<MemoryQueue> {
        self.parts = self
            .parts
            .into_iter()
            .map(|p| p.with_token_key(key.clone()))
            .collect();
        self
    }

    /// How many groups the partitions hold state for, summed; see
    /// [`QueueCore::groups_held`](crate::QueueCore::groups_held).
    pub fn groups_held(&self) -> usize {
        self.parts.iter().map(MemoryQueue::groups_held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv_1a_64_of_the_group_and_fixed() {
        // FNV-1a 64's published test vectors.
        let fnv = |s: &str| {
            s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        assert_eq!(fnv(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv("foobar"), 0x8594_4171_f739_67e8);
        for group in ["", "a", "foobar", "guild:42", "é"] {
            for n in 1..=64 {
                assert_eq!(partition_of(group, n) as u64, fnv(group) % u64::from(n));
            }
        }
        // The values the docs and other processes rely on.
        assert_eq!(["g0", "g1", "g2"].map(|g| partition_of(g, 4)), [2, 1, 0]);
    }

    #[test]
    fn ids_name_their_partition_and_producer_ids_name_none() {
        assert_eq!(id_suffix(0), "");
        assert_eq!(id_suffix(3), ".3");
        for (id, named) in [
            ("17", Some(0)),
            ("17.1", Some(1)),
            ("17.3", Some(3)),
            ("17.4", None),
            ("17.0", None),
            ("17.01", None),
            ("order-42", None),
            ("1.2.3", None),
            (".2", None),
        ] {
            assert_eq!(partition_named(id, 4), named, "{id}");
        }
        assert!(shaped_as_given("17.2") && shaped_as_given("0.0"));
        assert!(!shaped_as_given("17") && !shaped_as_given("a.2") && !shaped_as_given("1.2.3"));
    }

    #[test]
    fn max_jobs_is_split_into_shares_that_sum_to_it() {
        for (max, n) in [(10, 3), (3, 3), (1_000_000, 7), (64, 64), (100, 1)] {
            let shares: Vec<usize> = (0..n).map(|i| share_of(max, n, i)).collect();
            assert_eq!(shares.iter().sum::<usize>(), max);
            assert!(shares.iter().all(|&s| s >= max / n && s <= max / n + 1));
        }
        assert_eq!(
            (0..3).map(|i| share_of(10, 3, i)).collect::<Vec<_>>(),
            [4, 3, 3]
        );
    }

    #[test]
    fn a_partition_request_id_is_valid_and_distinct_per_budget() {
        use crate::job::check_request_id;
        let long = "r".repeat(MAX_ID);
        for request in ["w-call-1", long.as_str()] {
            for budget in [1, 7, 1_000] {
                let own = partition_request(request, budget);
                assert_eq!(check_request_id(&own), Ok(()), "{own}");
                assert!(own.ends_with(&format!(":{budget}")));
            }
            assert_ne!(partition_request(request, 1), partition_request(request, 2));
        }
        assert_eq!(partition_request("w-call-1", 3), "w-call-1:3");
    }
}

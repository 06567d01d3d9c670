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
//!   call's request id, and from a turn kept per handle for a call without one), it takes
//!   what the partition may start now, then asks the next for what `max_jobs` still
//!   allows, and so on. There is no order between jobs of different partitions and no
//!   fairness between groups of different partitions beyond the turns: a group of one
//!   partition may start before a group of another that became eligible earlier.
//! - **A partition that fails**: one whose call never ran (its primary refused the
//!   connection, or could not be reached: see `paceline_store::redis::never_ran`) is
//!   passed over, and then left out of lease calls for [`PARTITION_BACKOFF`] on the
//!   queue's clock (unless every partition is); the call answers the jobs of the others,
//!   or none, so a waiting lease goes on waiting. It answers that error only when no
//!   partition answered. Any other failure is the call's answer: one that may have run
//!   with its answer lost (a time out, a broken connection) leaves the jobs the call took
//!   under its request id, for the caller's repeat to answer; any other (a protocol
//!   error, an invalid request) first gives the jobs the call took back to their groups
//!   at once, at no attempt's cost, as [`Failure::Release`] does.
//! - **A lease call's request id**: each partition keeps what it took under the call's
//!   request id. A call that may repeat an earlier one (any call with a request id of the
//!   caller's, and the repeat [`Queue`](crate::Queue) makes after a lost answer) first
//!   asks every partition at once for the jobs an earlier call under that id took that
//!   their leases still hold, taking nothing. If any partition has such jobs, the call
//!   answers them and takes nothing more, as a queue of one partition does; else it
//!   takes jobs as a new call would, from the partitions that answered. A call under an
//!   id the [`Queue`](crate::Queue) drew for it ([`QueueBackend::lease_new`]) has nothing
//!   to repeat and skips that step. So a repeat answers the first call's jobs that are
//!   still held, with the same fences and tokens, never more than `max_jobs` (when a
//!   repeat asks for fewer than the first call took, the rest go back to their groups at
//!   once) and never a job twice. A partition of the first call that cannot be reached
//!   during the repeat keeps its jobs until their leases run out; one that answers more
//!   jobs than the call still allows (an earlier call under the id that reached it only
//!   after the repeat had asked) gives the rest back at once.
//! - **Fences**: a job's fence in partition `i` of `n`, `f`, is answered as `f * n + i`,
//!   which grows with every lease of the job (so it still fences writes downstream) and
//!   names the partition that an ack, a fail or an extend goes to.
//! - **Ids**: ids the queue gives are partition 0's numbers, and `NUMBER.i` in partition
//!   `i > 0` (`17.2`), so no two partitions give the same one. An id of the producer's is
//!   unique within its group's partition: give each id one group (as a retry of an enqueue
//!   does), or two jobs of that id may live in two partitions. Ids shaped as the queue's
//!   (digits, a dot, digits) are refused from producers, as all-digit ones are in any
//!   queue. `job` and `cancel` ask only the partition an id shaped as the queue's names
//!   (`17`: partition 0; an id naming no partition is no job's); a producer's id, every
//!   partition at once: `job` answers the job of the lowest partition that has it, and
//!   `cancel` cancels that one. Either fails only if no partition that answered has the
//!   job and one failed.
//! - **One queue seen from outside**: `stats` and `counts` are every partition's summed
//!   (the groups of all, by name); `next_event` is the earliest of them; `dead` lists
//!   partition 0's dead jobs (oldest death first), then partition 1's, and so on, with
//!   `offset` counting across them (every partition's dead count is read at once, then
//!   only the partitions the page spans are read); `retry_dead` and `purge_dead` act on
//!   every partition; `changed` wakes at a change of any partition, so waiting workers
//!   never poll.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use paceline_core::{Clock, InputError, Policy, StoreError, StoreErrorKind};
use paceline_store::secret::TokenKey;

use crate::config::QueueConfig;
use crate::core::{check_lease_request, PolicySource, UNTIL_RESUMED};
use crate::error::QueueError;
use crate::job::{
    Enqueued, FailOutcome, Failure, JobInfo, JobState, Leased, NewJob, Stats, Totals,
};
use crate::memory::MemoryQueue;
use crate::queue::{QueueBackend, QueueFuture};
use crate::schedule::{Schedule, ScheduleInfo};

pub(crate) use sealed::Partition;

mod sealed {
    use super::{Leased, QueueBackend, QueueError, QueueFuture};

    /// A queue that can be a partition of a [`Partitioned`](super::Partitioned): a
    /// `MemoryQueue` or a `RedisQueue`.
    pub trait Partition: QueueBackend {
        /// What a repeat of the lease call `request` answers, taking nothing: the jobs a
        /// call with `request` took that its leases still hold (none if no call did).
        fn replay<'a>(
            &'a self,
            worker: &'a str,
            request: &'a str,
        ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>>;
    }
}

/// How long lease calls pass over a partition whose call never ran (its primary refused
/// the connection or could not be reached) before they ask it again: 1 s on the queue's
/// clock.
pub const PARTITION_BACKOFF: Duration = Duration::from_secs(1);

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

fn add_totals(a: Totals, b: Totals) -> Totals {
    Totals {
        enqueued: a.enqueued.saturating_add(b.enqueued),
        started: a.started.saturating_add(b.started),
        acked: a.acked.saturating_add(b.acked),
        failed: a.failed.saturating_add(b.failed),
        retried: a.retried.saturating_add(b.retried),
        dead: a.dead.saturating_add(b.dead),
        lease_expiries: a.lease_expiries.saturating_add(b.lease_expiries),
        pauses: a.pauses.saturating_add(b.pauses),
    }
}

/// Whether a partition's failed call never ran (see `paceline_store::redis::never_ran`),
/// so that a lease call may pass over the partition.
#[cfg(feature = "redis")]
fn never_ran(e: &QueueError) -> bool {
    matches!(e, QueueError::Store(e) if paceline_store::redis::never_ran(e))
}

/// Whether a partition's failed call never ran: partitions in memory never fail so.
#[cfg(not(feature = "redis"))]
fn never_ran(_: &QueueError) -> bool {
    false
}

/// Where a job of an id can be.
#[derive(Debug, PartialEq, Eq)]
enum Home {
    /// An id shaped as the queue's (digits, or digits, a dot and digits): only in the
    /// partition it names, if any.
    Given(Option<usize>),
    /// A producer's: in any partition.
    Producer,
}

/// Where a job of `id` can be in a queue of `partitions`: see [`Home`].
fn home_of(id: &str, partitions: usize) -> Home {
    let digits = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
    if digits || shaped_as_given(id) {
        Home::Given(partition_named(id, partitions))
    } else {
        Home::Producer
    }
}

/// The answer about `id` when no partition has it.
fn no_job(id: &str) -> QueueError {
    QueueError::UnknownJob { id: id.to_string() }
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
    /// Per partition: the time (µs, the queue's clock) before which lease calls pass over
    /// it, after a call of it never ran.
    down_until: Vec<AtomicU64>,
}

impl<B> std::fmt::Debug for Partitioned<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitioned")
            .field("name", &self.name)
            .field("partitions", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl<B: Partition> Partitioned<B> {
    /// The queue `config` describes over `parts` (partition `i` at `i`, two or more, each
    /// made with [`partition_config`] and its index).
    pub(crate) fn new(config: QueueConfig, parts: Vec<B>) -> Result<Partitioned<B>, InputError> {
        if parts.len() < 2 || parts.len() != config.partitions as usize {
            return Err(several_partitions_only());
        }
        Ok(Partitioned {
            name: parts[0].name().to_string(),
            config,
            down_until: parts.iter().map(|_| AtomicU64::new(0)).collect(),
            parts,
            turn: AtomicUsize::new(0),
        })
    }

    /// The partitions, partition `i` at `i`.
    #[cfg(feature = "redis")]
    pub(crate) fn partitions(&self) -> &[B] {
        &self.parts
    }

    /// Partition 0, whose clock and token key are the queue's.
    fn first(&self) -> &B {
        &self.parts[0]
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
            // A full queue is the only refusal of an enqueue of this kind.
            Err(QueueError::Store(e)) if e.kind() == StoreErrorKind::Capacity => {
                Err(QueueError::Store(StoreError::new(
                    StoreErrorKind::Capacity,
                    format!(
                        "partition {p} of the queue holds its share of max_jobs ({share} of {}; \
                         the groups whose names hash to it fill it): let workers catch up, \
                         purge dead jobs or raise max_jobs",
                        self.config.max_jobs
                    ),
                )))
            }
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

    /// Whether lease calls pass over partition `p` at `now` (its call never ran less than
    /// [`PARTITION_BACKOFF`] ago).
    fn in_backoff(&self, p: usize, now: u64) -> bool {
        now < self.down_until[p].load(Ordering::Relaxed)
    }

    /// A call of partition `p` never ran: lease calls pass over it for
    /// [`PARTITION_BACKOFF`].
    fn back_off(&self, p: usize) {
        let until = self
            .clock()
            .now_micros()
            .saturating_add(paceline_core::round_to_micros(PARTITION_BACKOFF));
        self.down_until[p].store(until, Ordering::Relaxed);
    }

    /// The partitions a lease call starting at `start` asks, in its order: every one from
    /// `start` on, but those in backoff (unless all are).
    fn lease_order(&self, start: usize) -> Vec<usize> {
        let n = self.parts.len();
        let now = self.clock().now_micros();
        let all: Vec<usize> = (0..n).map(|step| (start + step) % n).collect();
        let up: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&p| !self.in_backoff(p, now))
            .collect();
        if up.is_empty() {
            all
        } else {
            up
        }
    }

    /// Gives `jobs` (each with its partition, under its partition's own fence) back to
    /// their groups at once, at no attempt's cost: jobs a lease call took and does not
    /// answer. A job whose release fails stays leased until its lease runs out.
    async fn give_back(&self, jobs: Vec<(usize, Leased)>) {
        let releases = jobs
            .iter()
            .map(|(p, job)| self.parts[*p].fail(&job.id, job.lease, Failure::Release));
        join_all(releases).await;
    }

    /// `taken` (each job with its partition, under its partition's own fence) as the queue
    /// answers them, with fences naming their partitions; if one cannot be numbered, all
    /// go back to their groups and the call fails.
    async fn answer_jobs(&self, taken: Vec<(usize, Leased)>) -> Result<Vec<Leased>, QueueError> {
        let fences: Result<Vec<u64>, QueueError> = taken
            .iter()
            .map(|(p, job)| self.public_fence(job.lease, *p))
            .collect();
        match fences {
            Ok(fences) => Ok(taken
                .into_iter()
                .zip(fences)
                .map(|((_, mut job), fence)| {
                    job.lease = fence;
                    job
                })
                .collect()),
            Err(e) => {
                self.give_back(taken).await;
                Err(e)
            }
        }
    }

    /// A lease call: see the [module docs](self). `new`: no call under `request` took a
    /// job before (the [`Queue`](crate::Queue) drew it), so there is nothing to repeat.
    async fn lease_across(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&str>,
        new: bool,
    ) -> Result<Vec<Leased>, QueueError> {
        check_lease_request(&self.config, worker, max_jobs, lease, request)?;
        let start = match request {
            Some(request) => partition_of(request, self.config.partitions),
            None => self.turn.fetch_add(1, Ordering::Relaxed) % self.parts.len(),
        };
        let mut ask = self.lease_order(start);
        let mut never = None;
        if let (Some(request), false) = (request, new) {
            // A repeat answers what the first call took, and takes nothing more.
            let replays = ask
                .iter()
                .map(|&p| async move { (p, self.parts[p].replay(worker, request).await) });
            let mut held: Vec<(usize, Leased)> = Vec::new();
            let mut answered = Vec::new();
            for (p, answer) in join_all(replays).await {
                match answer {
                    Ok(jobs) => {
                        answered.push(p);
                        held.extend(jobs.into_iter().map(|job| (p, job)));
                    }
                    Err(e) if never_ran(&e) => {
                        self.back_off(p);
                        never.get_or_insert(e);
                    }
                    // The partition may hold jobs of the call: it cannot be passed over.
                    Err(e) => return Err(e),
                }
            }
            if !held.is_empty() {
                let beyond = held.split_off(held.len().min(max_jobs));
                self.give_back(beyond).await;
                return self.answer_jobs(held).await;
            }
            if answered.is_empty() {
                if let Some(e) = never.take() {
                    return Err(e);
                }
            }
            ask = answered;
        }
        let mut taken: Vec<(usize, Leased)> = Vec::new();
        let mut answered = false;
        for p in ask {
            let budget = max_jobs.saturating_sub(taken.len());
            if budget == 0 {
                break;
            }
            match self.parts[p].lease(worker, budget, lease, request).await {
                Ok(mut jobs) => {
                    answered = true;
                    // More than asked for: an earlier call's, repeated by the partition.
                    let beyond: Vec<(usize, Leased)> = jobs
                        .split_off(jobs.len().min(budget))
                        .into_iter()
                        .map(|job| (p, job))
                        .collect();
                    self.give_back(beyond).await;
                    taken.extend(jobs.into_iter().map(|job| (p, job)));
                }
                // Nothing taken there: the other partitions may have work.
                Err(e) if never_ran(&e) => {
                    self.back_off(p);
                    never.get_or_insert(e);
                }
                // Possibly taken, its answer lost: the jobs of this call stay under its
                // request id, for the caller's repeat to answer.
                Err(QueueError::Store(e)) if e.answer_may_be_lost() && request.is_some() => {
                    return Err(e.into());
                }
                Err(e) => {
                    self.give_back(taken).await;
                    return Err(e);
                }
            }
        }
        match never {
            Some(e) if !answered => Err(e),
            _ => self.answer_jobs(taken).await,
        }
    }

    /// Jobs in `state` across the partitions, partition 0's first (a group's: its
    /// partition's).
    async fn jobs_across(
        &self,
        state: JobState,
        group: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<JobInfo>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        if let Some(group) = group {
            let p = partition_of(group, self.config.partitions);
            return self.parts[p].jobs(state, Some(group), offset, limit).await;
        }
        let counts = join_all(self.parts.iter().map(QueueBackend::counts)).await;
        let mut skip = offset;
        let mut out = Vec::new();
        for (p, counts) in counts.into_iter().enumerate() {
            if out.len() >= limit {
                break;
            }
            let counts = counts?;
            let held = match state {
                JobState::Scheduled => counts.scheduled,
                JobState::Waiting => counts.waiting,
                JobState::Active => counts.active,
                JobState::Dead => counts.dead,
                JobState::Completed => counts.completed,
                JobState::Finished => 0,
            };
            let held = usize::try_from(held).unwrap_or(usize::MAX);
            if skip >= held {
                skip -= held;
                continue;
            }
            out.extend(
                self.parts[p]
                    .jobs(state, None, skip, limit - out.len())
                    .await?,
            );
            skip = 0;
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
        // The queue is paused while every partition is, until the first pause ends.
        let mut paused = Some(UNTIL_RESUMED);
        for stats in all {
            let stats = stats?;
            paused = paused.zip(stats.paused_until).map(|(a, b)| a.min(b));
            sum.scheduled = sum.scheduled.saturating_add(stats.scheduled);
            sum.waiting = sum.waiting.saturating_add(stats.waiting);
            sum.active = sum.active.saturating_add(stats.active);
            sum.dead = sum.dead.saturating_add(stats.dead);
            sum.groups.extend(stats.groups);
            sum.totals = add_totals(sum.totals, stats.totals);
        }
        sum.groups.sort_by(|a, b| a.group.cmp(&b.group));
        sum.paused_until = paused;
        Ok(sum)
    }

    /// Pauses the group in its partition, or the queue in every partition; answers the
    /// latest end a partition gave.
    async fn pause_where(
        &self,
        group: Option<&str>,
        length: Option<Duration>,
    ) -> Result<u64, QueueError> {
        if let Some(group) = group {
            let p = partition_of(group, self.config.partitions);
            return self.parts[p].pause(Some(group), length).await;
        }
        let mut latest = 0;
        for end in join_all(self.parts.iter().map(|p| p.pause(None, length))).await {
            latest = latest.max(end?);
        }
        Ok(latest)
    }

    async fn resume_where(&self, group: Option<&str>) -> Result<(), QueueError> {
        if let Some(group) = group {
            let p = partition_of(group, self.config.partitions);
            return self.parts[p].resume(Some(group)).await;
        }
        for answer in join_all(self.parts.iter().map(|p| p.resume(None))).await {
            answer?;
        }
        Ok(())
    }

    /// Every partition's answer about `id`, asked at once: the lowest partition's that has
    /// the job, or the first failure if none that answered has it.
    async fn find(&self, id: &str) -> Result<Option<(usize, JobInfo)>, QueueError> {
        let answers = join_all(self.parts.iter().map(|p| p.job(id))).await;
        let mut failed = None;
        for (p, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Some(job)) => return Ok(Some((p, job))),
                Ok(None) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(None), Err)
    }

    async fn job_anywhere(&self, id: &str) -> Result<Option<JobInfo>, QueueError> {
        match home_of(id, self.parts.len()) {
            Home::Given(Some(p)) => self.parts[p].job(id).await,
            Home::Given(None) => Ok(None),
            Home::Producer => Ok(self.find(id).await?.map(|(_, job)| job)),
        }
    }

    async fn cancel_anywhere(&self, id: &str) -> Result<(), QueueError> {
        match home_of(id, self.parts.len()) {
            Home::Given(Some(p)) => self.parts[p].cancel(id).await,
            Home::Given(None) => Err(no_job(id)),
            Home::Producer => match self.find(id).await? {
                Some((p, _)) => self.parts[p].cancel(id).await,
                None => Err(no_job(id)),
            },
        }
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

impl<B: Partition> QueueBackend for Partitioned<B> {
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
        Box::pin(self.lease_across(worker, max_jobs, lease, request, false))
    }

    fn lease_new<'a>(
        &'a self,
        worker: &'a str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&'a str>,
    ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
        Box::pin(self.lease_across(worker, max_jobs, lease, request, true))
    }

    fn token_key(&self) -> &TokenKey {
        self.first().token_key()
    }

    fn ack<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        result: Option<&'a [u8]>,
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        let (p, fence) = self.own_fence(lease);
        self.parts[p].ack(id, fence, result)
    }

    fn progress<'a>(
        &'a self,
        id: &'a str,
        lease: u64,
        progress: &'a [u8],
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        let (p, fence) = self.own_fence(lease);
        self.parts[p].progress(id, fence, progress)
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

    fn pause<'a>(
        &'a self,
        group: Option<&'a str>,
        length: Option<Duration>,
    ) -> QueueFuture<'a, Result<u64, QueueError>> {
        Box::pin(self.pause_where(group, length))
    }

    fn resume<'a>(&'a self, group: Option<&'a str>) -> QueueFuture<'a, Result<(), QueueError>> {
        Box::pin(self.resume_where(group))
    }

    fn set_policy<'a>(
        &'a self,
        group: &'a str,
        policy: Option<&'a Policy>,
    ) -> QueueFuture<'a, Result<(), QueueError>> {
        let p = partition_of(group, self.config.partitions);
        self.parts[p].set_policy(group, policy)
    }

    fn policy<'a>(
        &'a self,
        group: &'a str,
    ) -> QueueFuture<'a, Result<(Policy, PolicySource), QueueError>> {
        let p = partition_of(group, self.config.partitions);
        self.parts[p].policy(group)
    }

    fn put_schedule<'a>(
        &'a self,
        name: &'a str,
        schedule: &'a Schedule,
        next: u64,
    ) -> QueueFuture<'a, Result<ScheduleInfo, QueueError>> {
        // Kept in the partition of its group, where its jobs go; gone from any other (its
        // group changed).
        Box::pin(async move {
            let home = partition_of(&schedule.group, self.config.partitions);
            for (p, part) in self.parts.iter().enumerate() {
                if p != home {
                    part.delete_schedule(name).await?;
                }
            }
            self.parts[home].put_schedule(name, schedule, next).await
        })
    }

    fn schedules(&self) -> QueueFuture<'_, Result<Vec<ScheduleInfo>, QueueError>> {
        Box::pin(async move {
            let mut all = Vec::new();
            for listed in join_all(self.parts.iter().map(|p| p.schedules())).await {
                all.extend(listed?);
            }
            all.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(all)
        })
    }

    fn delete_schedule<'a>(&'a self, name: &'a str) -> QueueFuture<'a, Result<bool, QueueError>> {
        Box::pin(async move {
            let mut found = false;
            for deleted in join_all(self.parts.iter().map(|p| p.delete_schedule(name))).await {
                found |= deleted?;
            }
            Ok(found)
        })
    }

    fn fire_schedule<'a>(
        &'a self,
        seen: &'a ScheduleInfo,
        next: u64,
    ) -> QueueFuture<'a, Result<Option<Enqueued>, QueueError>> {
        // Kept, and fired, in the partition of its group (see `put_schedule`).
        let p = partition_of(&seen.schedule.group, self.config.partitions);
        self.parts[p].fire_schedule(seen, next)
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

    fn jobs<'a>(
        &'a self,
        state: JobState,
        group: Option<&'a str>,
        offset: usize,
        limit: usize,
    ) -> QueueFuture<'a, Result<Vec<JobInfo>, QueueError>> {
        Box::pin(self.jobs_across(state, group, offset, limit))
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

    fn watch(&self) -> QueueFuture<'_, Result<crate::events::Feeds, QueueError>> {
        Box::pin(async move {
            let mut all = Vec::with_capacity(self.parts.len());
            for part in &self.parts {
                all.extend(part.watch().await?);
            }
            Ok(all)
        })
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
    fn totals_saturate_instead_of_overflowing() {
        let big = Totals {
            enqueued: u64::MAX - 1,
            pauses: 3,
            ..Totals::default()
        };
        let sum = add_totals(big, big);
        assert_eq!((sum.enqueued, sum.pauses), (u64::MAX, 6));
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
}

/// Lease calls, lookups and dead pages over partitions that fail as told: a partition in
/// memory wrapped to fail its calls, each kind of failure as a Redis call's would be.
#[cfg(all(test, feature = "redis"))]
mod failing {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use paceline_store::ManualClock;

    use super::*;
    use crate::job::JobState;
    use crate::Queue;

    /// 2023-11-14 in µs since the Unix epoch.
    const START: u64 = 1_700_000_000_000_000;

    /// How a partition fails its calls (but releases, which always run).
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fault {
        None,
        /// Its primary refuses the connection: nothing runs.
        Refused,
        /// The next `n` lease calls run, and their answers are lost (a time out).
        Lost(usize),
        /// A protocol error (a Lua runtime error): nothing runs.
        Broken,
    }

    struct Flaky {
        inner: MemoryQueue,
        fault: Mutex<Fault>,
        calls: Mutex<BTreeMap<&'static str, usize>>,
    }

    impl Flaky {
        fn set(&self, fault: Fault) {
            *self.fault.lock().unwrap() = fault;
        }

        fn calls(&self, op: &'static str) -> usize {
            self.calls.lock().unwrap().get(op).copied().unwrap_or(0)
        }

        /// Runs `op` (counted) as the fault says.
        fn run<T>(
            &self,
            op: &'static str,
            call: impl FnOnce() -> Result<T, QueueError>,
        ) -> Result<T, QueueError> {
            *self.calls.lock().unwrap().entry(op).or_default() += 1;
            let mut fault = self.fault.lock().unwrap();
            match *fault {
                Fault::None => call(),
                Fault::Lost(_) if op != "lease" => call(),
                Fault::Refused => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "Redis failed a function call: Connection refused",
                )
                .with_source(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                .into()),
                Fault::Lost(n) => {
                    *fault = if n > 1 {
                        Fault::Lost(n - 1)
                    } else {
                        Fault::None
                    };
                    drop(fault);
                    let _ = call();
                    Err(StoreError::new(StoreErrorKind::Timeout, "no answer in time").into())
                }
                Fault::Broken => Err(StoreError::new(
                    StoreErrorKind::Protocol,
                    "Redis failed a function call: a Lua error",
                )
                .into()),
            }
        }
    }

    /// Answers `value` as a queue future.
    fn now<'a, T: Send + 'a>(value: T) -> QueueFuture<'a, T> {
        Box::pin(std::future::ready(value))
    }

    /// Waits for a memory partition's answer, which is ready at once.
    fn at_once<T>(future: QueueFuture<'_, T>) -> T {
        futures_util::FutureExt::now_or_never(future).expect("a memory queue answers at once")
    }

    impl Partition for Flaky {
        fn replay<'a>(
            &'a self,
            worker: &'a str,
            request: &'a str,
        ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
            now(self.run("replay", || at_once(self.inner.replay(worker, request))))
        }
    }

    impl QueueBackend for Flaky {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn config(&self) -> &QueueConfig {
            self.inner.config()
        }
        fn clock(&self) -> &dyn Clock {
            self.inner.clock()
        }
        fn enqueue(&self, jobs: Vec<NewJob>) -> QueueFuture<'_, Vec<Result<Enqueued, QueueError>>> {
            self.inner.enqueue(jobs)
        }
        fn lease<'a>(
            &'a self,
            worker: &'a str,
            max_jobs: usize,
            lease: Option<Duration>,
            request: Option<&'a str>,
        ) -> QueueFuture<'a, Result<Vec<Leased>, QueueError>> {
            now(self.run("lease", || {
                at_once(self.inner.lease(worker, max_jobs, lease, request))
            }))
        }
        fn token_key(&self) -> &TokenKey {
            self.inner.token_key()
        }
        fn ack<'a>(
            &'a self,
            id: &'a str,
            lease: u64,
            result: Option<&'a [u8]>,
        ) -> QueueFuture<'a, Result<(), QueueError>> {
            self.inner.ack(id, lease, result)
        }
        fn progress<'a>(
            &'a self,
            id: &'a str,
            lease: u64,
            progress: &'a [u8],
        ) -> QueueFuture<'a, Result<(), QueueError>> {
            self.inner.progress(id, lease, progress)
        }
        fn fail<'a>(
            &'a self,
            id: &'a str,
            lease: u64,
            failure: Failure,
        ) -> QueueFuture<'a, Result<FailOutcome, QueueError>> {
            self.inner.fail(id, lease, failure)
        }
        fn extend<'a>(
            &'a self,
            id: &'a str,
            lease: u64,
            length: Duration,
        ) -> QueueFuture<'a, Result<u64, QueueError>> {
            self.inner.extend(id, lease, length)
        }
        fn cancel<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<(), QueueError>> {
            now(self.run("cancel", || at_once(self.inner.cancel(id))))
        }
        fn pause<'a>(
            &'a self,
            group: Option<&'a str>,
            length: Option<Duration>,
        ) -> QueueFuture<'a, Result<u64, QueueError>> {
            self.inner.pause(group, length)
        }
        fn resume<'a>(&'a self, group: Option<&'a str>) -> QueueFuture<'a, Result<(), QueueError>> {
            self.inner.resume(group)
        }
        fn set_policy<'a>(
            &'a self,
            group: &'a str,
            policy: Option<&'a Policy>,
        ) -> QueueFuture<'a, Result<(), QueueError>> {
            self.inner.set_policy(group, policy)
        }
        fn policy<'a>(
            &'a self,
            group: &'a str,
        ) -> QueueFuture<'a, Result<(Policy, PolicySource), QueueError>> {
            self.inner.policy(group)
        }
        fn put_schedule<'a>(
            &'a self,
            name: &'a str,
            schedule: &'a Schedule,
            next: u64,
        ) -> QueueFuture<'a, Result<ScheduleInfo, QueueError>> {
            self.inner.put_schedule(name, schedule, next)
        }
        fn schedules(&self) -> QueueFuture<'_, Result<Vec<ScheduleInfo>, QueueError>> {
            self.inner.schedules()
        }
        fn delete_schedule<'a>(
            &'a self,
            name: &'a str,
        ) -> QueueFuture<'a, Result<bool, QueueError>> {
            self.inner.delete_schedule(name)
        }
        fn fire_schedule<'a>(
            &'a self,
            seen: &'a ScheduleInfo,
            next: u64,
        ) -> QueueFuture<'a, Result<Option<Enqueued>, QueueError>> {
            self.inner.fire_schedule(seen, next)
        }
        fn job<'a>(&'a self, id: &'a str) -> QueueFuture<'a, Result<Option<JobInfo>, QueueError>> {
            now(self.run("job", || at_once(self.inner.job(id))))
        }
        fn stats(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
            self.inner.stats()
        }
        fn counts(&self) -> QueueFuture<'_, Result<Stats, QueueError>> {
            now(self.run("counts", || at_once(self.inner.counts())))
        }
        fn jobs<'a>(
            &'a self,
            state: JobState,
            group: Option<&'a str>,
            offset: usize,
            limit: usize,
        ) -> QueueFuture<'a, Result<Vec<JobInfo>, QueueError>> {
            now(self.run("jobs", || {
                at_once(self.inner.jobs(state, group, offset, limit))
            }))
        }
        fn retry_dead<'a>(
            &'a self,
            ids: Option<&'a [String]>,
        ) -> QueueFuture<'a, Result<usize, QueueError>> {
            self.inner.retry_dead(ids)
        }
        fn purge_dead(&self) -> QueueFuture<'_, Result<usize, QueueError>> {
            self.inner.purge_dead()
        }
        fn next_event(&self) -> QueueFuture<'_, Result<Option<u64>, QueueError>> {
            self.inner.next_event()
        }
        fn changed(&self) -> QueueFuture<'_, ()> {
            self.inner.changed()
        }
        fn watch(&self) -> QueueFuture<'_, Result<crate::events::Feeds, QueueError>> {
            self.inner.watch()
        }
    }

    /// A queue of `n` flaky partitions on `clock`, holding up to 60 jobs, each tried once.
    fn flaky(n: u32, clock: &ManualClock) -> Arc<Partitioned<Flaky>> {
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap())
            .max_attempts(1)
            .max_jobs(60)
            .partitions(n);
        let parts = (0..n as usize)
            .map(|i| Flaky {
                inner: MemoryQueue::partition(
                    "q",
                    partition_config(&config, i),
                    Arc::new(clock.clone()),
                    i,
                )
                .unwrap(),
                fault: Mutex::new(Fault::None),
                calls: Mutex::new(BTreeMap::new()),
            })
            .collect();
        Arc::new(Partitioned::new(config, parts).unwrap())
    }

    /// The first of `g-0`, `g-1`, ... in partition `p` of `n`.
    fn group_in(p: usize, n: u32) -> String {
        (0..)
            .map(|k| format!("g-{k}"))
            .find(|g| partition_of(g, n) == p)
            .unwrap()
    }

    /// Enqueues `count` jobs into partition `p`'s group, with ids `STEM-k` (none: the
    /// queue's).
    async fn fill(q: &Partitioned<Flaky>, p: usize, count: usize, stem: Option<&str>) {
        let n = q.parts.len() as u32;
        let jobs = (0..count)
            .map(|k| {
                let job = NewJob::new(group_in(p, n), vec![k as u8]);
                match stem {
                    Some(stem) => job.id(format!("{stem}-{k}")),
                    None => job,
                }
            })
            .collect();
        for answer in q.enqueue(jobs).await {
            answer.unwrap();
        }
    }

    /// The jobs active and waiting in every partition, whatever their faults.
    async fn counts(q: &Partitioned<Flaky>) -> (u64, u64) {
        q.parts.iter().fold((0, 0), |(active, waiting), p| {
            let c = at_once(p.inner.counts()).unwrap();
            (active + c.active, waiting + c.waiting)
        })
    }

    fn groups(jobs: &[Leased]) -> Vec<String> {
        let mut groups: Vec<String> = jobs.iter().map(|j| j.group.clone()).collect();
        groups.sort();
        groups
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_partition_whose_call_never_ran_is_passed_over_for_a_second() {
        let clock = ManualClock::new(START);
        let q = flaky(3, &clock);
        for p in 0..3 {
            fill(&q, p, 2, None).await;
        }
        q.parts[1].set(Fault::Refused);
        let leased = q.lease("w", 10, None, Some("call-1")).await.unwrap();
        let (g0, g2) = (group_in(0, 3), group_in(2, 3));
        assert_eq!(groups(&leased), [g0.clone(), g0, g2.clone(), g2]);
        assert_eq!(q.parts[1].calls("replay"), 1);
        assert_eq!(
            q.parts[1].calls("lease"),
            0,
            "not asked after its replay never ran"
        );
        // The others are empty and partition 1 is down: no job, no error, so a waiting
        // lease goes on waiting; within the backoff partition 1 is not asked.
        let queue = Queue::from_backend(q.clone());
        assert_eq!(
            queue.lease("w", 10, None, Duration::ZERO).await,
            Ok(Vec::new())
        );
        assert_eq!(q.lease("w", 10, None, None).await, Ok(Vec::new()));
        assert_eq!(q.parts[1].calls("replay") + q.parts[1].calls("lease"), 1);
        // After the backoff it is asked again, and once up, its jobs are taken.
        clock.advance(PARTITION_BACKOFF);
        assert_eq!(q.lease("w", 10, None, None).await, Ok(Vec::new()));
        assert_eq!(q.parts[1].calls("lease"), 1);
        q.parts[1].set(Fault::None);
        clock.advance(PARTITION_BACKOFF);
        assert_eq!(q.lease("w", 10, None, None).await.unwrap().len(), 2);
        // With every partition down, the call answers the error.
        for part in &q.parts {
            part.set(Fault::Refused);
        }
        match q.lease("w", 10, None, None).await {
            Err(QueueError::Store(e)) => assert!(paceline_store::redis::never_ran(&e), "{e}"),
            other => panic!("every partition down: {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lease_whose_answer_may_be_lost_fails_and_its_repeat_answers_every_job() {
        let clock = ManualClock::new(START);
        let q = flaky(2, &clock);
        let request = "call-1";
        let (first, second) = (partition_of(request, 2), 1 - partition_of(request, 2));
        fill(&q, first, 2, None).await;
        fill(&q, second, 2, None).await;
        // The second partition asked takes its jobs, and the answer is lost, twice.
        q.parts[second].set(Fault::Lost(2));
        match q.lease_new("w", 10, None, Some(request)).await {
            Err(QueueError::Store(e)) => assert!(e.answer_may_be_lost(), "{e}"),
            other => panic!("a lost answer passed over: {other:?}"),
        }
        assert_eq!(
            counts(&q).await,
            (4, 0),
            "every job taken, under the request id"
        );
        q.parts[second].set(Fault::None);
        let again = q.lease("w", 10, None, Some(request)).await.unwrap();
        assert_eq!(again.len(), 4, "the repeat answers them all");
        // Through `Queue`, which makes the repeat itself (the call's first partition may
        // be either).
        fill(&q, 0, 2, None).await;
        fill(&q, 1, 2, None).await;
        for part in &q.parts {
            part.set(Fault::Lost(1));
        }
        // The first partition asked takes its 2 jobs and its answer is lost: the repeat
        // answers them, and takes no more.
        let queue = Queue::from_backend(q.clone());
        let leased = queue.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 2);
        assert_eq!(counts(&q).await, (6, 2), "no job held by no one");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lease_that_meets_a_protocol_error_answers_it_and_gives_back_its_jobs() {
        let clock = ManualClock::new(START);
        let q = flaky(2, &clock);
        fill(&q, 0, 2, Some("a")).await;
        fill(&q, 1, 2, Some("b")).await;
        q.parts[1].set(Fault::Broken);
        // Without a request id the first call starts at partition 0, which takes its jobs.
        match q.lease("w", 10, None, None).await {
            Err(QueueError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Protocol),
            other => panic!("a protocol error passed over: {other:?}"),
        }
        assert_eq!(q.parts[0].calls("lease"), 1);
        assert_eq!(
            counts(&q).await,
            (0, 4),
            "partition 0's jobs back in their group"
        );
        let job = q.job("a-0").await.unwrap().unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Waiting, 0),
            "no attempt counted"
        );
        // The same with a request id of the caller's.
        match q.lease("w", 10, None, Some("call-1")).await {
            Err(QueueError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Protocol),
            other => panic!("a protocol error passed over: {other:?}"),
        }
        assert_eq!(counts(&q).await, (0, 4));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_repeat_never_answers_more_than_max_jobs_nor_more_than_asked_of_a_partition() {
        let clock = ManualClock::new(START);
        let q = flaky(2, &clock);
        fill(&q, 0, 3, None).await;
        fill(&q, 1, 3, None).await;
        let first = q.lease("w", 6, None, Some("call-1")).await.unwrap();
        assert_eq!(first.len(), 6);
        // A repeat asking for fewer: some of the first call's jobs, the rest given back.
        let fewer = q.lease("w", 4, None, Some("call-1")).await.unwrap();
        assert_eq!(fewer.len(), 4);
        assert!(fewer.iter().all(|j| first.contains(j)));
        assert_eq!(counts(&q).await, (4, 2));
        // A partition that answers an earlier call's jobs beyond what the call still
        // allows (that call reached it after this one's look for them): the rest go back.
        let p = partition_of("call-2", 2);
        fill(&q, p, 2, None).await;
        let earlier = q.parts[p]
            .lease("w", 2, None, Some("call-2"))
            .await
            .unwrap();
        assert_eq!(earlier.len(), 2);
        let late = q.lease_new("w", 1, None, Some("call-2")).await.unwrap();
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].id, earlier[0].id);
        assert_eq!(counts(&q).await, (5, 3));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dead_page_reads_only_the_partitions_it_spans() {
        let clock = ManualClock::new(START);
        let q = flaky(3, &clock);
        // Dead jobs: 2 of partition 0, none of partition 1, 3 of partition 2.
        for (p, count) in [(0, 2), (2, 3)] {
            fill(&q, p, count, Some(&format!("dead{p}"))).await;
        }
        for job in q.lease("w", 10, None, None).await.unwrap() {
            let (p, fence) = q.own_fence(job.lease);
            let fatal = Failure::Fatal { error: None };
            q.parts[p].fail(&job.id, fence, fatal).await.unwrap();
        }
        let reads =
            |q: &Partitioned<Flaky>| q.parts.iter().map(|p| p.calls("jobs")).collect::<Vec<_>>();
        // An offset beyond every dead job: the counts, read at once, and no page.
        assert_eq!(
            q.jobs(JobState::Dead, None, usize::MAX, 10).await,
            Ok(Vec::new())
        );
        assert_eq!(reads(&q), [0, 0, 0]);
        assert!(q.parts.iter().all(|p| p.calls("counts") == 1));
        // A page in partition 2 alone reads partition 2 alone.
        let page: Vec<String> = q
            .jobs(JobState::Dead, None, 3, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(page, ["dead2-1", "dead2-2"]);
        assert_eq!(reads(&q), [0, 0, 1]);
        // One across partitions 0 and 2 passes over partition 1.
        let page: Vec<String> = q
            .jobs(JobState::Dead, None, 1, 2)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(page, ["dead0-1", "dead2-0"]);
        assert_eq!(reads(&q), [1, 0, 2]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn ids_of_the_queue_go_to_their_partition_and_producer_ids_to_all_at_once() {
        let clock = ManualClock::new(START);
        let q = flaky(3, &clock);
        fill(&q, 2, 1, None).await;
        let asked =
            |q: &Partitioned<Flaky>, op| q.parts.iter().map(|p| p.calls(op)).collect::<Vec<_>>();
        assert!(q.job("1.2").await.unwrap().is_some());
        assert_eq!(
            asked(&q, "job"),
            [0, 0, 1],
            "only the partition the id names"
        );
        assert_eq!(q.job("1.7").await, Ok(None), "an id naming no partition");
        assert_eq!(q.job("1").await, Ok(None));
        assert_eq!(asked(&q, "job"), [1, 0, 1]);
        // A producer's id: every partition at once; one failing does not hide a find.
        fill(&q, 2, 1, Some("order")).await;
        q.parts[1].set(Fault::Refused);
        let found = q.job("order-0").await.unwrap().unwrap();
        assert_eq!(found.group, group_in(2, 3));
        match q.job("order-9").await {
            Err(QueueError::Store(e)) => assert!(paceline_store::redis::never_ran(&e)),
            other => panic!("a partition that failed, and no find: {other:?}"),
        }
        assert_eq!(
            q.cancel("order-9")
                .await
                .map_err(|e| matches!(e, QueueError::Store(_))),
            Err(true)
        );
        q.parts[1].set(Fault::None);
        assert_eq!(q.cancel("order-9").await, Err(no_job("order-9")));
        // The same producer id in two partitions: the lowest's is found and cancelled.
        fill(&q, 0, 1, Some("order")).await;
        assert_eq!(
            q.job("order-0").await.unwrap().unwrap().group,
            group_in(0, 3)
        );
        assert_eq!(q.cancel("order-0").await, Ok(()));
        assert_eq!(q.parts[0].calls("cancel"), 1);
        assert_eq!(q.parts[2].calls("cancel"), 0);
        assert_eq!(
            q.job("order-0").await.unwrap().unwrap().group,
            group_in(2, 3)
        );
    }
}

//! Jobs: what a producer enqueues, what a worker leases, and what the queue reports.
//!
//! Times are microseconds since the Unix epoch on the queue's clock (the store's clock: on
//! Redis, Redis's `TIME`), so times reported by different processes compare.

use std::time::{Duration, SystemTime};

use paceline_core::InputError;

use crate::config::{check_group, check_lease, MAX_ATTEMPTS};

/// The longest job id, in bytes.
pub const MAX_ID: usize = 128;

/// A job to enqueue: its group, its payload, and optionally its id, a time before which it
/// must not start (a delay after enqueueing, or a time on the queue's clock), and its own
/// number of attempts.
///
/// ```
/// use paceline_queue::NewJob;
/// use std::time::{Duration, SystemTime};
/// let job = NewJob::new("guild:1", b"{\"user\": 42, \"role\": 7}".to_vec())
///     .id("grant-42-7")
///     .delay(Duration::from_secs(5))
///     .max_attempts(3);
/// assert_eq!(job.group, "guild:1");
///
/// // Not before 09:00 UTC on 2030-01-01 (1893488400 s after the Unix epoch).
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_488_400);
/// let report = NewJob::new("reports", b"{}".to_vec()).not_before(at);
/// assert_eq!(report.not_before, Some(1_893_488_400_000_000));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    /// The group whose policy limits the job's start.
    pub group: String,
    /// What the worker needs to run the job.
    pub payload: Vec<u8>,
    /// The producer's id, which makes enqueueing idempotent: the same id again while that
    /// job exists adds nothing and answers the existing job. `None`: the queue numbers it.
    pub id: Option<String>,
    /// Do not start before this long after enqueueing.
    pub delay: Duration,
    /// Do not start before this time: µs since the Unix epoch on the queue's clock (on
    /// Redis, Redis's `TIME`). With a delay too, the later of the two holds.
    pub not_before: Option<u64>,
    /// This job's own number of attempts (else the queue's).
    pub max_attempts: Option<u32>,
    /// A deduplication key: see [`dedup`](NewJob::dedup).
    pub dedup: Option<Dedup>,
    /// How urgent the job is: 0 (the default, first) to [`MAX_PRIORITY`]; see
    /// [`priority`](NewJob::priority).
    pub priority: u8,
    /// What one start of the job counts against its group's and the queue's policies: 1
    /// (the default) to [`MAX_COST`]; see [`cost`](NewJob::cost).
    pub cost: u32,
}

/// The least urgent priority a job may have (0 is the most urgent, and the default).
pub const MAX_PRIORITY: u8 = 9;

/// The largest cost a job may have.
pub const MAX_COST: u32 = 1_000_000;

/// The longest deduplication key, in bytes.
pub const MAX_DEDUP_KEY: usize = 256;

/// A job's deduplication key, how long it holds, and whether a job deduplicated against
/// the first replaces its payload (see [`NewJob::dedup`] and [`NewJob::debounce`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dedup {
    /// The key: 1 to [`MAX_DEDUP_KEY`] bytes, no control characters.
    pub key: String,
    /// How long after the first job's enqueue the key holds: 1 ms to [`MAX_DELAY`].
    pub ttl: Duration,
    /// Whether a later job's payload replaces the first's while that one waits.
    pub replace: bool,
}

impl NewJob {
    /// A job of `group` carrying `payload`, to start as soon as its group's policy allows.
    pub fn new(group: impl Into<String>, payload: impl Into<Vec<u8>>) -> NewJob {
        NewJob {
            group: group.into(),
            payload: payload.into(),
            id: None,
            delay: Duration::ZERO,
            not_before: None,
            max_attempts: None,
            dedup: None,
            priority: 0,
            cost: 1,
        }
    }

    /// Gives the job a priority: 0 (the default) starts first, [`MAX_PRIORITY`] last.
    /// Within a group, jobs start by priority, then in the order they were enqueued; among
    /// the groups that may start a job now, one whose next job is more urgent goes first,
    /// round robin among equals. No priority lets a job start before its group's policy
    /// allows. In a queue of several partitions the order across groups holds within each
    /// partition.
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// let mut queue = QueueCore::new(QueueConfig::new("gcra:rate=10/s,burst=10".parse()?))?;
    /// queue.enqueue(0, NewJob::new("g", b"later".to_vec()).priority(5))?;
    /// queue.enqueue(0, NewJob::new("g", b"urgent".to_vec()))?;
    /// let started = queue.lease(0, "w", 2, None)?;
    /// assert_eq!(started[0].payload, b"urgent".to_vec());
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    #[must_use]
    pub fn priority(mut self, priority: u8) -> NewJob {
        self.priority = priority;
        self
    }

    /// Counts each start of the job as `cost` against its group's policy and the queue's
    /// own (a job that costs 3 uses 3 of a `fixed_window:limit=10`). A cost above what a
    /// policy can ever admit (its limit or burst) is refused when enqueued; a job whose
    /// group's policy is later changed to one that can never admit it goes to the dead set
    /// when it comes to the head of its line, with an error saying so.
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// let mut queue = QueueCore::new(QueueConfig::new("fixed_window:limit=10,window=10s".parse()?))?;
    /// for _ in 0..4 {
    ///     queue.enqueue(0, NewJob::new("g", b"big".to_vec()).cost(3))?;
    /// }
    /// assert_eq!(queue.lease(0, "w", 10, None)?.len(), 3); // 9 of 10: the fourth waits
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    #[must_use]
    pub fn cost(mut self, cost: u32) -> NewJob {
        self.cost = cost;
        self
    }

    /// Gives the job the producer's id (1 to 128 bytes of `A-Z a-z 0-9 - _ . :`, not all
    /// digits: all-digit ids are the ones the queue gives).
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> NewJob {
        self.id = Some(id.into());
        self
    }

    /// Holds the job back for `delay` after it is enqueued.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> NewJob {
        self.delay = delay;
        self
    }

    /// Holds the job back until `at` on the queue's clock (the store's: on Redis, Redis's
    /// `TIME`), at most [`MAX_NOT_BEFORE`] (in the year 2255); a time already past holds
    /// nothing back. With a [`delay`](NewJob::delay) too, the later of the two holds.
    #[must_use]
    pub fn not_before(mut self, at: SystemTime) -> NewJob {
        let micros = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, paceline_core::round_to_micros);
        self.not_before = Some(micros);
        self
    }

    /// Gives the job its own number of attempts.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> NewJob {
        self.max_attempts = Some(n);
        self
    }

    /// Deduplicates the job under `key` for `ttl`: within `ttl` of the first job enqueued
    /// under `key`, enqueueing another adds nothing and answers the first job's id, with
    /// [`Enqueued::deduplicated`] set, even once that job has finished; after `ttl` the key
    /// is free. In a queue of several partitions a key holds within the partition of the
    /// job's group.
    ///
    /// ```
    /// use paceline_queue::{JobState, NewJob, QueueConfig, QueueCore};
    /// use std::time::Duration;
    /// let mut queue = QueueCore::new(QueueConfig::new("gcra:rate=10/s".parse()?))?;
    /// let minute = Duration::from_secs(60);
    /// let first = queue.enqueue(0, NewJob::new("g", b"a".to_vec()).dedup("user-42", minute))?;
    /// let again = queue.enqueue(1, NewJob::new("g", b"b".to_vec()).dedup("user-42", minute))?;
    /// assert_eq!((again.id, again.created, again.deduplicated), (first.id, false, true));
    /// let later = queue.enqueue(60_000_000, NewJob::new("g", b"c".to_vec()).dedup("user-42", minute))?;
    /// assert!(later.created); // the key was free again
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    #[must_use]
    pub fn dedup(mut self, key: impl Into<String>, ttl: Duration) -> NewJob {
        self.dedup = Some(Dedup {
            key: key.into(),
            ttl,
            replace: false,
        });
        self
    }

    /// [`dedup`](NewJob::dedup), where a job deduplicated against the first replaces its
    /// payload while the first still waits (scheduled or in its line; not once started):
    /// the latest payload within `ttl` is the one that runs.
    #[must_use]
    pub fn debounce(mut self, key: impl Into<String>, ttl: Duration) -> NewJob {
        self.dedup = Some(Dedup {
            key: key.into(),
            ttl,
            replace: true,
        });
        self
    }

    /// Checks the job against a queue's largest payload, naming the field at fault.
    pub fn validate(&self, max_payload: usize) -> Result<(), InputError> {
        check_group(&self.group)?;
        if let Some(id) = &self.id {
            check_id(id)?;
        }
        if self.payload.len() > max_payload {
            return Err(InputError::new(
                "payload",
                format!(
                    "is {} bytes; this queue takes at most {max_payload}",
                    self.payload.len()
                ),
            ));
        }
        if self.delay > MAX_DELAY {
            return Err(InputError::new("delay", "must be at most 365 days"));
        }
        if self.not_before.is_some_and(|at| at > MAX_NOT_BEFORE) {
            return Err(InputError::new(
                "not_before",
                format!(
                    "must be at most {MAX_NOT_BEFORE} µs after the Unix epoch (in the year \
                     2255), the queue's last time"
                ),
            ));
        }
        if self.priority > MAX_PRIORITY {
            return Err(InputError::new(
                "priority",
                format!("must be from 0 (the most urgent, the default) to {MAX_PRIORITY}"),
            ));
        }
        if self.cost == 0 || self.cost > MAX_COST {
            return Err(InputError::new(
                "cost",
                format!("must be from 1 (the default) to {MAX_COST}"),
            ));
        }
        if let Some(d) = &self.dedup {
            if d.key.is_empty()
                || d.key.len() > MAX_DEDUP_KEY
                || d.key.chars().any(char::is_control)
            {
                return Err(InputError::new(
                    "dedup.key",
                    format!("must be 1 to {MAX_DEDUP_KEY} bytes with no control characters"),
                ));
            }
            if d.ttl < Duration::from_millis(1) || d.ttl > MAX_DELAY {
                return Err(InputError::new(
                    "dedup.ttl_ms",
                    "must be from 1 ms to 365 days (31536000000 ms)",
                ));
            }
        }
        if let Some(n) = self.max_attempts {
            if n == 0 || n > MAX_ATTEMPTS {
                return Err(InputError::new(
                    "max_attempts",
                    format!("must be from 1 to {MAX_ATTEMPTS}"),
                ));
            }
        }
        Ok(())
    }
}

/// The longest delay a job may be enqueued with.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 86_400);

/// The latest not-before time a job may have, in µs after the Unix epoch: the engine's last
/// time (2^53 µs, in the year 2255, up to which times stay exact in Redis's Lua too) rounded
/// down to a whole millisecond, before [`UNTIL_RESUMED`](crate::core::UNTIL_RESUMED).
pub const MAX_NOT_BEFORE: u64 = paceline_core::policy::MAX_NOW_US / 1_000 * 1_000;

/// Whether `id` is 1 to [`MAX_ID`] bytes of `A-Z a-z 0-9 - _ . :`.
pub(crate) fn id_like(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Producer ids: 1 to [`MAX_ID`] bytes of `A-Z a-z 0-9 - _ . :`, not all digits.
pub fn check_id(id: &str) -> Result<(), InputError> {
    if !id_like(id) {
        return Err(InputError::new(
            "id",
            format!("must be 1 to {MAX_ID} bytes of A-Z a-z 0-9 - _ . :"),
        ));
    }
    if id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(InputError::new(
            "id",
            "must not be all digits: those are the ids the queue gives; add a prefix, e.g. order-42",
        ));
    }
    Ok(())
}

/// Request ids of lease calls ([`QueueCore::lease_request`](crate::QueueCore::lease_request)):
/// 1 to [`MAX_ID`] bytes of `A-Z a-z 0-9 - _ . :`.
///
/// ```
/// use paceline_queue::job::check_request_id;
/// assert!(check_request_id("worker-7:call-42").is_ok());
/// assert_eq!(check_request_id("").unwrap_err().field(), "request_id");
/// assert_eq!(check_request_id("a b").unwrap_err().field(), "request_id");
/// ```
pub fn check_request_id(id: &str) -> Result<(), InputError> {
    if !id_like(id) {
        return Err(InputError::new(
            "request_id",
            format!("must be 1 to {MAX_ID} bytes of A-Z a-z 0-9 - _ . :"),
        ));
    }
    Ok(())
}

/// Checks what a listing of jobs asks for ([`Queue::jobs`](crate::Queue::jobs)): a state
/// jobs are kept in (not `finished`), and a group only for waiting jobs.
///
/// ```
/// use paceline_queue::job::check_listing;
/// use paceline_queue::JobState;
/// assert!(check_listing(JobState::Waiting, Some("guild:1")).is_ok());
/// assert_eq!(check_listing(JobState::Dead, Some("guild:1")).unwrap_err().field(), "group");
/// assert_eq!(check_listing(JobState::Finished, None).unwrap_err().field(), "state");
/// ```
pub fn check_listing(state: JobState, group: Option<&str>) -> Result<(), InputError> {
    if state == JobState::Finished {
        return Err(InputError::new(
            "state",
            "must be scheduled, waiting, active, dead or completed: finished jobs are not kept",
        ));
    }
    if let Some(group) = group {
        if state != JobState::Waiting {
            return Err(InputError::new(
                "group",
                "filters waiting jobs only (a group's line): leave it out to list the queue's \
                 scheduled, active or dead jobs",
            ));
        }
        check_group(group)?;
    }
    Ok(())
}

/// Checks a requested lease length.
pub fn check_lease_length(lease: Duration) -> Result<(), InputError> {
    check_lease("lease_ms", lease)
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for its not-before time (a delay, or a retry's backoff).
    Scheduled,
    /// In its group's line, waiting for the group's policy and a worker.
    Waiting,
    /// Leased by a worker.
    Active,
    /// Out of attempts, or failed fatally: kept in the dead set until retried or purged.
    Dead,
    /// Acknowledged, and kept readable with its result (see
    /// [`QueueConfig::keep_completed`](crate::QueueConfig::keep_completed)).
    Completed,
    /// No longer in the queue (acknowledged, cancelled or purged): only an enqueue
    /// deduplicated against a job that has finished answers it.
    Finished,
}

impl JobState {
    /// `scheduled`, `waiting`, `active`, `dead`, `completed` or `finished`.
    pub const fn name(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Waiting => "waiting",
            JobState::Active => "active",
            JobState::Dead => "dead",
            JobState::Completed => "completed",
            JobState::Finished => "finished",
        }
    }

    /// The state named `name` (as [`name`](Self::name) gives it), if one is.
    ///
    /// ```
    /// use paceline_queue::JobState;
    /// assert_eq!(JobState::from_name("dead"), Some(JobState::Dead));
    /// assert_eq!(JobState::from_name("gone"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<JobState> {
        [
            JobState::Scheduled,
            JobState::Waiting,
            JobState::Active,
            JobState::Dead,
            JobState::Completed,
            JobState::Finished,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// What enqueueing answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (the producer's, or the one the queue gave).
    pub id: String,
    /// The job's state now.
    pub state: JobState,
    /// False when a job of this id already existed, or one under the same deduplication
    /// key: nothing was added, and the other fields describe that job (`estimated_start` as
    /// estimated when it was enqueued).
    pub created: bool,
    /// True when the job was deduplicated against an earlier one (see [`NewJob::dedup`]):
    /// `id` is that job's.
    pub deduplicated: bool,
    /// When the job is expected to start (µs since the epoch): see
    /// [`QueueCore::enqueue`](crate::QueueCore::enqueue) for how exact this is.
    pub estimated_start: u64,
}

/// A job leased to a worker, which must `ack` or `fail` it with `lease` before
/// `lease_expires`, or `extend` the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leased {
    /// The job's id.
    pub id: String,
    /// Its group.
    pub group: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// This start's number: 1 for the first.
    pub attempt: u32,
    /// The lease's fence: a number that counts up across the queue, so that a later lease
    /// of any job has a larger one (in a queue of several
    /// [partitions](crate::QueueConfig::partitions), across the job's partition: a job's
    /// later lease still has a larger one). Use it to fence writes downstream; it
    /// authorises nothing (anyone may guess it).
    pub lease: u64,
    /// What authorises this lease's ack, fail and extend: see [`LeaseToken`](crate::LeaseToken). A
    /// [`Queue`](crate::Queue) fills it in; a [`QueueCore`](crate::QueueCore) or a
    /// [`QueueBackend`](crate::QueueBackend) leaves it empty and takes the fence instead.
    pub token: crate::LeaseToken,
    /// When the job started (µs since the epoch).
    pub started: u64,
    /// Since when its group could have started it (µs since the epoch): `started -
    /// eligible` is the time the job waited for a worker, its start lag.
    pub eligible: u64,
    /// When the lease runs out unless extended (µs since the epoch).
    pub lease_expires: u64,
}

/// How a leased job failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Try again: after `after`, or (`None`) after the queue's backoff for this attempt.
    /// Out of attempts, the job goes to the dead set instead.
    Retry {
        /// What went wrong, kept on the job.
        error: Option<String>,
        /// The delay before the retry; `None`: the queue's backoff.
        after: Option<Duration>,
    },
    /// Do not try again: the job goes to the dead set.
    Fatal {
        /// What went wrong, kept on the job.
        error: Option<String>,
    },
    /// The upstream refused the call for the whole group (an HTTP 429 with a retry-after):
    /// the group starts nothing for `pause`, and the job goes back to the head of its
    /// group. It is the upstream's refusal, not the job's failure, so it costs no attempt.
    PauseGroup {
        /// What the upstream said, kept on the job.
        error: Option<String>,
        /// How long the group starts nothing.
        pause: Duration,
    },
    /// Not run after all (a worker shutting down hands back what it holds): the job goes
    /// back to the head of its group at once and costs no attempt. Its start still counted
    /// against the group's limit.
    Release,
}

impl Failure {
    /// The failure a worker describes with the HTTP API's fields (and `paceline simulate`'s):
    /// `fatal`, or a retry after `retry_after` (none: the backoff), or a group pause of
    /// `pause_group`. Fatal with a retry or a pause, or a retry with a pause, is refused,
    /// naming the field that contradicts the others.
    ///
    /// ```
    /// use paceline_queue::Failure;
    /// use std::time::Duration;
    /// let pause = Failure::from_parts(None, false, None, Some(Duration::from_secs(10)))?;
    /// assert!(matches!(pause, Failure::PauseGroup { .. }));
    /// assert_eq!(
    ///     Failure::from_parts(None, true, Some(Duration::ZERO), None).unwrap_err().field(),
    ///     "fatal"
    /// );
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn from_parts(
        error: Option<String>,
        fatal: bool,
        retry_after: Option<Duration>,
        pause_group: Option<Duration>,
    ) -> Result<Failure, InputError> {
        match (fatal, retry_after, pause_group) {
            (true, None, None) => Ok(Failure::Fatal { error }),
            (false, after, None) => Ok(Failure::Retry { error, after }),
            (false, None, Some(pause)) => Ok(Failure::PauseGroup { error, pause }),
            (true, _, _) => Err(InputError::new(
                "fatal",
                "a fatal failure is not retried: send it without retry_after_ms and pause_group_ms",
            )),
            (false, Some(_), Some(_)) => Err(InputError::new(
                "pause_group_ms",
                "a paused job goes back to the head of its group: send retry_after_ms or pause_group_ms, not both",
            )),
        }
    }
}

/// What became of a failed job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOutcome {
    /// Scheduled to try again at this time (µs since the epoch).
    Retrying {
        /// When the job rejoins its group.
        at: u64,
    },
    /// In the dead set.
    Dead,
    /// Back at the head of its group, which starts nothing until this time.
    Paused {
        /// When the group may start jobs again.
        until: u64,
    },
    /// Back at the head of its group.
    Released,
    /// This lease's failure was reported already, and this report is a retry of it (its
    /// first answer was lost): nothing changed.
    Repeated,
}

/// Everything the queue knows of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// The job's id.
    pub id: String,
    /// Its group.
    pub group: String,
    /// Where it is.
    pub state: JobState,
    /// How many times it has started.
    pub attempts: u32,
    /// How many starts it may have.
    pub max_attempts: u32,
    /// The last error a worker reported.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub enqueued_at: u64,
    /// Scheduled: when it joins its group.
    pub not_before: Option<u64>,
    /// Active: when this attempt started.
    pub started: Option<u64>,
    /// Active: when its lease runs out.
    pub lease_expires: Option<u64>,
    /// Active: the worker holding it.
    pub worker: Option<String>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its priority (0, the most urgent, to [`MAX_PRIORITY`]).
    pub priority: u8,
    /// What each of its starts counts against its policies.
    pub cost: u32,
    /// What its worker last reported of its progress ([`Queue::progress`](crate::Queue::progress)),
    /// while it runs and after.
    pub progress: Option<Vec<u8>>,
    /// Completed: what its worker acknowledged it with, if anything.
    pub result: Option<Vec<u8>>,
    /// Completed or dead: when it was acknowledged, or died.
    pub finished: Option<u64>,
}

/// What a queue has done since it was created, counted once each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Jobs added (not counting an existing id enqueued again).
    pub enqueued: u64,
    /// Leases handed out: every start, redeliveries and retries included.
    pub started: u64,
    /// Jobs acknowledged.
    pub acked: u64,
    /// Failures reported by workers: fatal ones and those asking for a retry (retried, or
    /// dead for want of attempts). A group pause is the upstream's refusal, counted in
    /// `pauses`, and a hand-back is neither.
    pub failed: u64,
    /// Jobs scheduled for a retry after a failure.
    pub retried: u64,
    /// Jobs that went to the dead set.
    pub dead: u64,
    /// Leases that ran out before their worker reported.
    pub lease_expiries: u64,
    /// Group pauses asked by workers (an upstream's refusal).
    pub pauses: u64,
}

/// A queue's counts, and each group's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Jobs waiting for their not-before time.
    pub scheduled: u64,
    /// Jobs in their groups' lines.
    pub waiting: u64,
    /// Jobs leased.
    pub active: u64,
    /// Jobs in the dead set.
    pub dead: u64,
    /// Acknowledged jobs kept readable
    /// ([`QueueConfig::keep_completed`](crate::QueueConfig::keep_completed)).
    pub completed: u64,
    /// The groups with jobs waiting or active or that are paused, by name.
    pub groups: Vec<GroupStats>,
    /// What the queue has done since it was created.
    pub totals: Totals,
    /// While the queue is paused, when its pause ends
    /// ([`UNTIL_RESUMED`](crate::core::UNTIL_RESUMED): when it is resumed).
    pub paused_until: Option<u64>,
}

/// One group's counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStats {
    /// The group.
    pub group: String,
    /// Its jobs waiting.
    pub waiting: u64,
    /// Its jobs leased.
    pub active: u64,
    /// When it may next start a job (µs since the epoch), if it has one waiting and is
    /// below its concurrency cap (`None` at the cap: a job must end first); it may be in
    /// the past when the group is only waiting for a worker.
    pub next_eligible: Option<u64>,
    /// While the group is paused (by a person, or a worker after an upstream's refusal),
    /// when its pause ends ([`UNTIL_RESUMED`](crate::core::UNTIL_RESUMED): when it is
    /// resumed).
    pub paused_until: Option<u64>,
}

//! A queue's configuration: each group's policy, the group concurrency, attempts, leases
//! and the retry backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use paceline_core::{InputError, Policy};

use crate::schedule::Schedule;

/// The longest lease (and the longest `extend`): a day.
pub const MAX_LEASE: Duration = Duration::from_secs(86_400);
/// The most attempts a job may be given.
pub const MAX_ATTEMPTS: u32 = 1_000;
/// The most jobs a queue may be configured to hold.
pub const MAX_JOBS_LIMIT: usize = 100_000_000;
/// The largest payload a queue may be configured to take: 16 MiB.
pub const MAX_PAYLOAD_LIMIT: usize = 16 * 1024 * 1024;
/// The most partitions a queue may be spread over.
pub const MAX_PARTITIONS: u32 = 64;

/// How a queue runs its jobs.
///
/// Every group is limited by [`group_policy`](QueueConfig::group_policy) unless
/// [`groups`](QueueConfig::groups) names a policy of its own. The limit holds the times the
/// group's jobs *start*: a job is leased only when the group's policy admits a start at that
/// moment.
///
/// ```
/// use paceline_queue::QueueConfig;
/// use std::time::Duration;
///
/// // Discord: 10 role updates per 10 s per server, one server allowed 50.
/// let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?)
///     .group("guild:1", "fixed_window:limit=50,window=10s".parse()?)
///     .max_attempts(5)
///     .lease(Duration::from_secs(30));
/// config.validate()?;
/// # Ok::<(), paceline_core::InputError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig {
    /// The policy of every group that has none of its own.
    pub group_policy: Policy,
    /// Groups with a policy of their own.
    pub groups: BTreeMap<String, Policy>,
    /// At most this many jobs of one group leased at once; 0: no cap.
    pub group_concurrency: u32,
    /// A limit on the starts of the whole queue, above the groups' (none: only theirs): a
    /// job starts only when its group's policy and this one both admit it.
    pub queue_policy: Option<Policy>,
    /// At most this many jobs of the whole queue leased at once; 0: no cap.
    pub queue_concurrency: u32,
    /// A job that has started this many times and fails again (or whose lease expires) goes
    /// to the dead set. A job may carry its own.
    pub max_attempts: u32,
    /// How long a lease lasts unless the worker asks for another length.
    pub lease: Duration,
    /// The delay before a job's first retry; each further retry doubles it, up to
    /// [`retry_backoff_max`](QueueConfig::retry_backoff_max), and the delay taken is drawn
    /// between half of that and all of it (jitter), so that failed jobs do not come back in
    /// step.
    pub retry_backoff: Duration,
    /// The longest retry delay the backoff reaches.
    pub retry_backoff_max: Duration,
    /// The largest payload, in bytes.
    pub max_payload: usize,
    /// The most jobs the queue holds (scheduled, waiting, active and dead): an enqueue
    /// beyond is refused with a `Capacity` store error, so that memory stays bounded. A
    /// queue of several [`partitions`](QueueConfig::partitions) splits it between them.
    pub max_jobs: usize,
    /// How many partitions the queue's groups are spread over (1 to [`MAX_PARTITIONS`];
    /// default 1): see [`partitions`](QueueConfig::partitions).
    pub partitions: u32,
    /// Schedules the queue is given when a service opens it (see
    /// [`Queue::put_schedule`](crate::Queue::put_schedule)), by name.
    pub schedules: BTreeMap<String, Schedule>,
    /// How many acknowledged jobs stay readable, with their results, as `completed` (the
    /// latest ones; 0, the default: none, an acknowledged job leaves at once). See
    /// [`keep_completed`](QueueConfig::keep_completed).
    pub keep_completed: usize,
    /// How long a completed job stays readable at most (none: until
    /// [`keep_completed`](QueueConfig::keep_completed) newer ones push it out).
    pub keep_completed_for: Option<Duration>,
    /// The most dead jobs kept (the oldest deaths go first; none, the default: every dead
    /// job until retried or purged).
    pub keep_dead: Option<usize>,
    /// How long a dead job is kept at most (none: until retried or purged).
    pub keep_dead_for: Option<Duration>,
}

impl QueueConfig {
    /// A queue whose groups are each limited by `group_policy`, with the defaults: no
    /// concurrency cap, 5 attempts, 30 s leases, retries after 1 s doubling up to 1 h,
    /// payloads up to 1 MiB, and at most a million jobs held.
    pub fn new(group_policy: Policy) -> QueueConfig {
        QueueConfig {
            group_policy,
            groups: BTreeMap::new(),
            group_concurrency: 0,
            queue_policy: None,
            queue_concurrency: 0,
            max_attempts: 5,
            lease: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(3_600),
            max_payload: 1024 * 1024,
            max_jobs: 1_000_000,
            partitions: 1,
            schedules: BTreeMap::new(),
            keep_completed: 0,
            keep_completed_for: None,
            keep_dead: None,
            keep_dead_for: None,
        }
    }

    /// Keeps up to `n` acknowledged jobs readable (the latest ones), with their results and
    /// times, for at most `age` (none: until newer ones push them out): `GET
    /// .../jobs/{id}` answers them with `"state": "completed"`, and enqueueing one's id
    /// again answers it rather than adding a job.
    ///
    /// ```
    /// use paceline_queue::{JobState, NewJob, QueueConfig, QueueCore};
    /// use std::time::Duration;
    /// let config = QueueConfig::new("gcra:rate=10/s".parse()?)
    ///     .keep_completed(1_000, Some(Duration::from_secs(3_600)));
    /// let mut queue = QueueCore::new(config)?;
    /// let job = queue.enqueue(0, NewJob::new("g", b"x".to_vec()))?;
    /// let leased = queue.lease(0, "w", 1, None)?;
    /// queue.ack_with_result(0, &job.id, leased[0].lease, Some(b"{\"ok\":true}".to_vec()))?;
    /// let done = queue.job(&job.id).unwrap();
    /// assert_eq!((done.state, done.result), (JobState::Completed, Some(b"{\"ok\":true}".to_vec())));
    /// queue.counts(3_600_000_000)?; // any call an hour on drops it
    /// assert!(queue.job(&job.id).is_none());
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    #[must_use]
    pub fn keep_completed(mut self, n: usize, age: Option<Duration>) -> QueueConfig {
        self.keep_completed = n;
        self.keep_completed_for = age;
        self
    }

    /// Bounds the dead set: at most `n` dead jobs (the oldest deaths dropped first), each
    /// for at most `age` (none for either: no bound of that kind).
    #[must_use]
    pub fn keep_dead(mut self, n: Option<usize>, age: Option<Duration>) -> QueueConfig {
        self.keep_dead = n;
        self.keep_dead_for = age;
        self
    }

    /// Gives the queue schedule `name` (see [`schedules`](QueueConfig::schedules)).
    #[must_use]
    pub fn schedule(mut self, name: impl Into<String>, schedule: Schedule) -> QueueConfig {
        self.schedules.insert(name.into(), schedule);
        self
    }

    /// Gives `group` a policy of its own.
    #[must_use]
    pub fn group(mut self, group: impl Into<String>, policy: Policy) -> QueueConfig {
        self.groups.insert(group.into(), policy);
        self
    }

    /// Caps the jobs of one group leased at once (0: no cap).
    #[must_use]
    pub fn group_concurrency(mut self, n: u32) -> QueueConfig {
        self.group_concurrency = n;
        self
    }

    /// Limits the starts of the whole queue by `policy`, above each group's: a job starts
    /// only when both admit it, decided in one step; a refusal by the queue's policy holds
    /// the whole queue (no lease takes a job until it admits one), not the group's place.
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// // Each server 10 per 10 s, and the bot 50 per second across all of them.
    /// let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?)
    ///     .queue_policy("gcra:rate=50/s,burst=2".parse()?);
    /// let mut queue = QueueCore::new(config)?;
    /// for guild in 0..5 {
    ///     queue.enqueue(0, NewJob::new(format!("guild:{guild}"), b"x".to_vec()))?;
    /// }
    /// assert_eq!(queue.lease(0, "w", 10, None)?.len(), 2); // the queue's burst
    /// assert_eq!(queue.next_event(), Some(20_000)); // its next start, 20 ms on
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    #[must_use]
    pub fn queue_policy(mut self, policy: Policy) -> QueueConfig {
        self.queue_policy = Some(policy);
        self
    }

    /// Caps the jobs of the whole queue leased at once (0: no cap).
    #[must_use]
    pub fn queue_concurrency(mut self, n: u32) -> QueueConfig {
        self.queue_concurrency = n;
        self
    }

    /// Sets the default number of attempts.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> QueueConfig {
        self.max_attempts = n;
        self
    }

    /// Sets the default lease.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> QueueConfig {
        self.lease = lease;
        self
    }

    /// Sets the first retry delay and the longest.
    #[must_use]
    pub fn retry_backoff(mut self, first: Duration, max: Duration) -> QueueConfig {
        self.retry_backoff = first;
        self.retry_backoff_max = max;
        self
    }

    /// Sets the largest payload, in bytes.
    #[must_use]
    pub fn max_payload(mut self, bytes: usize) -> QueueConfig {
        self.max_payload = bytes;
        self
    }

    /// Sets the most jobs the queue holds.
    #[must_use]
    pub fn max_jobs(mut self, n: usize) -> QueueConfig {
        self.max_jobs = n;
        self
    }

    /// Spreads the queue's groups over `n` partitions (1 to [`MAX_PARTITIONS`]; 1, the
    /// default, is one queue as ever), each a complete queue of its own: in Redis Cluster
    /// each under its own hash tag, on its own part of the slots, so that one queue's work
    /// spreads over the primaries instead of loading the one that serves its slot.
    ///
    /// A group belongs to partition `fnv1a_64(group) mod n` (see
    /// [`partition_of`](crate::partitioned::partition_of)), so each group's limit,
    /// concurrency cap, line order and fencing are exactly those of a queue of one
    /// partition. What spans partitions is looser: a lease takes the partitions in turn,
    /// with no order between jobs of different partitions; `max_jobs` is split between
    /// them; ids the queue gives end in `.i` for partition `i > 0`. Every process sharing
    /// a queue must give it the same `n`: opening a queue with another number than it was
    /// created with is refused. See [`Partitioned`](crate::Partitioned) and the guide's
    /// "Partitions" section for the whole contract.
    ///
    /// ```
    /// use paceline_queue::{NewJob, Queue, QueueConfig};
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_queue::QueueError> {
    /// let config = QueueConfig::new("gcra:rate=10/s".parse()?).partitions(4);
    /// let queue = Queue::in_memory("emails", config)?;
    /// for customer in ["acme", "globex", "initech"] {
    ///     queue.enqueue(NewJob::new(customer, b"hello".to_vec())).await?;
    /// }
    /// // One queue seen from outside: the counts of every partition, summed.
    /// assert_eq!(queue.stats().await?.waiting, 3);
    /// let leased = queue.lease("worker-1", 10, None, Duration::ZERO).await?;
    /// assert_eq!(leased.len(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn partitions(mut self, n: u32) -> QueueConfig {
        self.partitions = n;
        self
    }

    /// Whether the queue caps the jobs leased at once (per group or in all), so that a job's
    /// end frees a slot a waiting lease may take.
    pub fn caps_leases(&self) -> bool {
        self.group_concurrency > 0 || self.queue_concurrency > 0
    }

    /// The policy that limits `group`.
    pub fn policy_of(&self, group: &str) -> &Policy {
        self.groups.get(group).unwrap_or(&self.group_policy)
    }

    /// Checks every setting, naming the first one at fault.
    pub fn validate(&self) -> Result<(), InputError> {
        check_policy("group_policy", &self.group_policy)?;
        if let Some(policy) = &self.queue_policy {
            check_policy("queue_policy", policy)?;
        }
        for (group, policy) in &self.groups {
            check_group(group).map_err(|e| e.renamed("groups"))?;
            check_policy(&format!("groups.{group}"), policy)?;
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(InputError::new(
                "max_attempts",
                format!("must be from 1 to {MAX_ATTEMPTS}"),
            ));
        }
        check_lease("lease", self.lease)?;
        if self.retry_backoff.is_zero() || self.retry_backoff > MAX_LEASE {
            return Err(InputError::new(
                "retry_backoff",
                "must be from 1µs to 1d, e.g. 1s",
            ));
        }
        if self.retry_backoff_max < self.retry_backoff || self.retry_backoff_max > MAX_LEASE {
            return Err(InputError::new(
                "retry_backoff_max",
                "must be from retry_backoff to 1d, e.g. 1h",
            ));
        }
        if self.max_jobs == 0 || self.max_jobs > MAX_JOBS_LIMIT {
            return Err(InputError::new(
                "max_jobs",
                format!("must be from 1 to {MAX_JOBS_LIMIT}"),
            ));
        }
        if self.max_payload == 0 || self.max_payload > MAX_PAYLOAD_LIMIT {
            return Err(InputError::new(
                "max_payload",
                format!("must be from 1 to {MAX_PAYLOAD_LIMIT} bytes"),
            ));
        }
        if self.partitions > 1 && (self.queue_policy.is_some() || self.queue_concurrency > 0) {
            return Err(InputError::new(
                if self.queue_policy.is_some() {
                    "queue_policy"
                } else {
                    "queue_concurrency"
                },
                "a queue of several partitions decides each partition's starts apart, so it \
                 cannot hold a limit over all of them: use partitions = 1 with a queue-wide \
                 limit, or limit the groups only",
            ));
        }
        for (name, schedule) in &self.schedules {
            let named = |e: InputError| {
                InputError::new(
                    format!("schedules.{name}.{}", e.field()),
                    e.message().to_string(),
                )
            };
            crate::schedule::check_schedule_name(name).map_err(named)?;
            schedule.validate(self.max_payload, 0).map_err(named)?;
        }
        if self.keep_completed > MAX_JOBS_LIMIT {
            return Err(InputError::new(
                "keep_completed",
                format!("must be from 0 (none, the default) to {MAX_JOBS_LIMIT}"),
            ));
        }
        if self.keep_completed_for.is_some() && self.keep_completed == 0 {
            return Err(InputError::new(
                "keep_completed_for",
                "needs keep_completed, the most completed jobs kept (e.g. keep_completed = 1000)",
            ));
        }
        if self.keep_dead.is_some_and(|n| n == 0 || n > MAX_JOBS_LIMIT) {
            return Err(InputError::new(
                "keep_dead",
                format!(
                    "must be from 1 to {MAX_JOBS_LIMIT}; leave it out to keep every dead job \
                     until retried or purged"
                ),
            ));
        }
        for (field, age) in [
            ("keep_completed_for", self.keep_completed_for),
            ("keep_dead_for", self.keep_dead_for),
        ] {
            if age.is_some_and(|d| d < Duration::from_secs(1) || d > crate::job::MAX_DELAY) {
                return Err(InputError::new(field, "must be from 1s to 365d, e.g. 7d"));
            }
        }
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(InputError::new(
                "partitions",
                format!("must be from 1 to {MAX_PARTITIONS}, e.g. 3 for a 3-primary Redis Cluster"),
            ));
        }
        if self.max_jobs < self.partitions as usize {
            return Err(InputError::new(
                "partitions",
                format!(
                    "{} is more than max_jobs ({}), and each partition holds a share of \
                     max_jobs: raise max_jobs to {} or more, or lower partitions",
                    self.partitions, self.max_jobs, self.partitions
                ),
            ));
        }
        Ok(())
    }
}

/// Whether a queue can hold a group's starts to `policy`.
///
/// The queue admits a start with the policy's `limit` at the moment it leases a job, and
/// sets a refused group aside until the decision's retry-after. That needs a policy whose
/// admissions start at once and whose refusals change nothing. Two do not qualify:
/// `exec_evenly` admits with a delay to wait (it spaces calls made by one caller), and
/// `sliding_log` with `count_blocked` counts every refusal, so checking a group would keep
/// it refused. Nor does `concurrency`, whose leases no job gives back (a job's own lease
/// already bounds the jobs in flight).
pub fn check_policy(field: &str, policy: &Policy) -> Result<(), InputError> {
    let refused = match policy {
        Policy::ExecEvenly(_) => Some(
            "exec_evenly admits with a delay to wait, which a job that starts now cannot take; \
             use fixed_window, gcra, sliding_window or another algorithm",
        ),
        Policy::Concurrency(_) => Some(
            "concurrency counts requests in flight, each giving its lease back, which a \
             group's start never does; limit the jobs in flight by the workers' lease calls \
             and give the group a rate policy such as gcra or fixed_window",
        ),
        Policy::SlidingLog(p) if p.count_blocked() => Some(
            "sliding_log with count_blocked=true counts refused starts, so a waiting group \
             would keep itself refused; use sliding_log without count_blocked",
        ),
        _ => None,
    };
    match refused {
        Some(why) => Err(InputError::new(field.to_string(), why)),
        None => Ok(()),
    }
}

/// The longest group name, in bytes.
pub const MAX_GROUP: usize = 256;

/// Group names: 1 to [`MAX_GROUP`] bytes, no control characters.
pub fn check_group(group: &str) -> Result<(), InputError> {
    if group.is_empty() || group.len() > MAX_GROUP || group.chars().any(char::is_control) {
        return Err(InputError::new(
            "group",
            format!("must be 1 to {MAX_GROUP} bytes with no control characters"),
        ));
    }
    Ok(())
}

/// Leases: from 1 ms to [`MAX_LEASE`].
pub(crate) fn check_lease(field: &'static str, lease: Duration) -> Result<(), InputError> {
    if lease < Duration::from_millis(1) || lease > MAX_LEASE {
        return Err(InputError::new(field, "must be from 1ms to 1d, e.g. 30s"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: &str) -> Policy {
        spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    #[test]
    fn policies_that_cannot_hold_starts_are_refused_by_name() {
        for spec in [
            "exec_evenly:points=10,duration=1s",
            "sliding_log:limit=5,window=1s,count_blocked=true",
            "concurrency:limit=5,lease=30s",
        ] {
            let e = QueueConfig::new(policy(spec)).validate().unwrap_err();
            assert_eq!(e.field(), "group_policy", "{spec}");
            assert!(e.message().contains(spec.split(':').next().unwrap_or("")));
        }
        let e = QueueConfig::new(policy("gcra:rate=1/s"))
            .group("g", policy("exec_evenly:points=1,duration=1s"))
            .validate()
            .unwrap_err();
        assert_eq!(e.field(), "groups.g");
        for spec in [
            "pacer:rate=10/s,max_burst=2",
            "gcra:rate=5/10s,burst=3",
            "fixed_window:limit=10,window=10s",
            "sliding_log:limit=5,window=1m",
            "sliding_window:limit=100,window=1h",
            "smooth_bursty:rate=5/s",
            "smooth_warming_up:rate=2/s,warmup=4s",
        ] {
            assert_eq!(QueueConfig::new(policy(spec)).validate(), Ok(()), "{spec}");
        }
    }

    #[test]
    fn settings_out_of_range_name_their_field() {
        let base = || QueueConfig::new(policy("gcra:rate=1/s"));
        for (config, field) in [
            (base().max_attempts(0), "max_attempts"),
            (base().lease(Duration::ZERO), "lease"),
            (base().lease(Duration::from_secs(90_000)), "lease"),
            (
                base().retry_backoff(Duration::from_secs(2), Duration::from_secs(1)),
                "retry_backoff_max",
            ),
            (base().max_payload(0), "max_payload"),
            (base().partitions(0), "partitions"),
            (base().partitions(65), "partitions"),
            (base().partitions(4).max_jobs(3), "partitions"),
            (base().group("", policy("gcra:rate=1/s")), "groups"),
        ] {
            assert_eq!(
                config.validate().map_err(|e| e.field().to_string()),
                Err(field.to_string())
            );
        }
        // What to do about too few jobs for the partitions.
        let few = base().partitions(4).max_jobs(3).validate();
        assert!(
            few.as_ref().is_err_and(|e| e
                .message()
                .contains("raise max_jobs to 4 or more, or lower partitions")),
            "{few:?}"
        );
    }
}

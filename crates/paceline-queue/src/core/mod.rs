//! The queue as a pure state machine over injected time: every operation takes `now`
//! (microseconds since the Unix epoch) and changes nothing else, so tests run it on a
//! virtual clock and every store runs the same rules.
//!
//! # The model
//!
//! - Each **group** keeps its waiting jobs in one FIFO line. Jobs never move between lines
//!   and are never re-checked and re-delayed: it is the *group* that waits.
//! - The groups with a job waiting (and below their concurrency cap) sit in the **ready
//!   set**, ordered by the time they become eligible. A lease takes the first eligible
//!   group and asks its policy, with `limit`, to admit a start *now*. Admitted: the head
//!   job starts, and the group goes behind every other eligible group (round robin).
//!   Refused: the group moves to `now + retry_after`, which is exact, so it is asked again
//!   exactly when it can start.
//! - So **the limit holds the times jobs start**, whatever the backlog: jobs whose time came
//!   while no worker was there do not start together when workers return, because nothing
//!   was reserved for them.
//! - A **lease** carries a fencing token. Ack, fail and extend need the job's current
//!   token; a lease that expires sends the job back to the head of its group, and its token
//!   is refused from then on.
//! - **Scheduled** jobs (a delay, or a retry's backoff) wait in a set ordered by time and
//!   join their group when due; expired leases, due jobs and idle groups are handled at the
//!   start of each call, at most [`MAINTENANCE_BATCH`] of each per call, so no call scans
//!   the queue.
//!
//! ```
//! use paceline_queue::{NewJob, QueueConfig, QueueCore};
//! use std::time::Duration;
//!
//! let config = QueueConfig::new("fixed_window:limit=2,window=10s".parse()?);
//! let mut queue = QueueCore::new(config)?;
//! let s = 1_000_000; // a second, in µs
//! for n in 0..3 {
//!     let job = queue.enqueue(0, NewJob::new("guild:1", vec![n]))?;
//!     // The third job waits for the next 10 s window.
//!     assert_eq!(job.estimated_start, if n < 2 { 0 } else { 10 * s });
//! }
//! let started = queue.lease(0, "worker-1", 10, None)?;
//! assert_eq!(started.len(), 2);
//! assert_eq!(queue.next_event(), Some(10 * s)); // the group's next start
//! let third = queue.lease(10 * s, "worker-1", 10, None)?;
//! assert_eq!(third[0].payload, vec![2]);
//! queue.ack(10 * s, &third[0].id, third[0].lease)?;
//! # Ok::<(), paceline_queue::QueueError>(())
//! ```
//!
//! The queue's state and its constants are here; the records it keeps (jobs, their
//! places, groups and their projections) are in `records`, the groups' lines and the
//! ready set in `lines`, the work each call does first in `maintain`, leases and their
//! outcomes in `leases`, pauses asked by people in `pauses`, what callers other than
//! workers see and do in `admin`, and the rules both twins (this one and the Lua one in
//! Redis) check in `rules`.

mod admin;
mod leases;
mod lines;
mod maintain;
mod pauses;
mod policies;
mod records;
mod retention;
mod rules;
mod schedules;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use paceline_core::policy::check_now;
use paceline_core::{InputError, Policy};

use crate::config::QueueConfig;
use crate::events::{Event, EventLog};
use crate::job::Totals;
#[cfg(feature = "redis")]
pub(crate) use pauses::check_pause;
pub use pauses::UNTIL_RESUMED;
pub use policies::PolicySource;
use records::{Group, Job, Taken};
pub(crate) use rules::{
    active_conflict, check_failure, check_lease_request, check_progress, check_size, cost_beyond,
    cut, max_cost, micros_up, queue_full, Jitter,
};

/// The most expired leases, due jobs and idle groups each call handles before its own work;
/// the rest wait for the next call (which [`QueueCore::next_event`] says is due at once).
pub const MAINTENANCE_BATCH: usize = 1_000;
/// The most jobs one lease call may take.
pub const MAX_LEASE_JOBS: usize = 1_000;
/// The longest worker name, in bytes.
pub const MAX_WORKER: usize = 128;
/// The longest error message kept on a job, in bytes (longer ones are cut).
pub const MAX_ERROR: usize = 4_096;
/// How many priorities there are (0 to [`MAX_PRIORITY`](crate::job::MAX_PRIORITY)).
const LEVELS: usize = crate::job::MAX_PRIORITY as usize + 1;

/// The longest group pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(86_400);

/// A rate-limited job queue's whole state. See the [module docs](self).
#[derive(Debug)]
pub struct QueueCore {
    /// The configuration the queue runs on: the one given, with the policies set at run
    /// time in place of its own.
    config: QueueConfig,
    /// The configuration as given.
    file_config: QueueConfig,
    /// The groups' policies set at run time (see `policies`).
    run_time: BTreeMap<String, Policy>,
    jobs: HashMap<String, Job>,
    groups: HashMap<String, Group>,
    /// Groups with a job waiting, below their cap, one set per priority of their next job
    /// (index 0, the most urgent, first): (eligible at, order, group).
    ready: Vec<BTreeSet<(u64, u64, String)>>,
    /// Jobs waiting for a time: (not before, order, id).
    scheduled: BTreeSet<(u64, u64, String)>,
    /// Leases: (expires, token, id).
    leases: BTreeSet<(u64, u64, String)>,
    /// The dead set in order of death: (order, id).
    dead: BTreeSet<(u64, String)>,
    /// Dead jobs by when they are dropped for their age, with `keep_dead_for`: (until,
    /// order, id).
    dead_expiry: BTreeSet<(u64, u64, String)>,
    /// Completed jobs kept readable, by when they are dropped: (until, order, id).
    completed: BTreeSet<(u64, u64, String)>,
    /// Groups with nothing waiting or active, dropped once their policy state is idle:
    /// (droppable at, group).
    retiring: BTreeSet<(u64, String)>,
    /// The jobs each lease call with a request id took, until their leases end: request
    /// id -> (when the leases end, what the call took).
    requests: HashMap<String, (u64, Vec<Taken>)>,
    /// The same, by expiry: (expires, request id).
    request_expiry: BTreeSet<(u64, String)>,
    /// Deduplication keys: key -> (when it is free again, the first job's id and its
    /// estimated start).
    dedup: HashMap<String, (u64, String, u64)>,
    /// The same, by expiry: (expires, key).
    dedup_expiry: BTreeSet<(u64, String)>,
    /// Schedules: name -> (what it enqueues, its next tick).
    schedules: BTreeMap<String, (crate::schedule::Schedule, u64)>,
    /// The source of every order number and lease token.
    seq: u64,
    /// The last number given as a job id.
    last_id: u64,
    /// What every id the queue gives ends with: empty, or `.i` for partition `i > 0` of a
    /// queue of several partitions (see [`Partitioned`](crate::Partitioned)).
    id_suffix: String,
    /// The latest `now` seen: time never goes back inside the queue.
    now: u64,
    /// The queue's own pause: no lease takes a job before this (0: none).
    paused_until: u64,
    /// The state of the queue's own policy ([`QueueConfig::queue_policy`]).
    queue_state: Option<paceline_core::State>,
    /// The earliest start the queue's own policy allows, as of its last refusal.
    queue_next_at: u64,
    totals: Totals,
    /// The events of the calls since they were last taken, while someone listens.
    events: EventLog,
}

impl QueueCore {
    /// An empty queue. Fails when the configuration is invalid, naming the setting.
    pub fn new(config: QueueConfig) -> Result<QueueCore, InputError> {
        config.validate()?;
        Ok(QueueCore {
            file_config: config.clone(),
            run_time: BTreeMap::new(),
            config,
            jobs: HashMap::new(),
            groups: HashMap::new(),
            ready: vec![BTreeSet::new(); LEVELS],
            scheduled: BTreeSet::new(),
            leases: BTreeSet::new(),
            dead: BTreeSet::new(),
            dead_expiry: BTreeSet::new(),
            completed: BTreeSet::new(),
            retiring: BTreeSet::new(),
            requests: HashMap::new(),
            request_expiry: BTreeSet::new(),
            dedup: HashMap::new(),
            dedup_expiry: BTreeSet::new(),
            schedules: BTreeMap::new(),
            seq: 0,
            last_id: 0,
            id_suffix: String::new(),
            now: 0,
            paused_until: 0,
            queue_state: None,
            queue_next_at: 0,
            totals: Totals::default(),
            events: EventLog::default(),
        })
    }

    /// The queue as partition `index` of a queue of several: the ids it gives end in
    /// `.index` (none for partition 0), as its Redis twin's do.
    pub(crate) fn in_partition(mut self, index: usize) -> QueueCore {
        self.id_suffix = crate::partitioned::id_suffix(index);
        self
    }

    /// The queue's configuration, with the groups' policies set at run time in place of its
    /// own ([`set_policy`](Self::set_policy)).
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Replaces the configuration (each group's policy, caps, defaults); jobs and the
    /// groups' policy states stay. A group whose policy changes algorithm starts afresh.
    /// Policies set at run time stay, in place of the new configuration's.
    pub fn set_config(&mut self, config: QueueConfig) -> Result<(), InputError> {
        config.validate()?;
        self.config = policies::with_run_time(&config, &self.run_time);
        self.file_config = config;
        // A refusal under the old queue policy says nothing of the new one.
        self.queue_next_at = 0;
        for g in self.groups.values_mut() {
            g.projection = None;
            // A refusal under the old policy says nothing of the new one: ask it afresh.
            g.next_at = 0;
        }
        let names: Vec<String> = self.groups.keys().cloned().collect();
        for name in names {
            self.refresh(&name);
        }
        Ok(())
    }

    /// Keeps the [`Event`]s of the calls from now on (`true`: someone listens), or none
    /// (`false`, the default: nobody does, and no event is made).
    pub fn watch(&mut self, on: bool) {
        self.events.watch(on);
    }

    /// The events of the calls since the last time they were taken, oldest first (none
    /// unless [`watch`](Self::watch)ed).
    ///
    /// ```
    /// use paceline_queue::events::EventKind;
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// let mut queue = QueueCore::new(QueueConfig::new("gcra:rate=10/s,burst=10".parse()?))?;
    /// queue.watch(true);
    /// let job = queue.enqueue(0, NewJob::new("guild:1", b"a".to_vec()))?;
    /// let leased = queue.lease(0, "worker-1", 10, None)?;
    /// queue.ack(0, &job.id, leased[0].lease)?;
    /// let kinds: Vec<EventKind> = queue.take_events().iter().map(|e| e.kind).collect();
    /// assert_eq!(kinds, [EventKind::Enqueued, EventKind::Started, EventKind::Acked]);
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.take()
    }

    fn tick(&mut self, now: u64) -> Result<u64, InputError> {
        check_now(now)?;
        self.now = self.now.max(now);
        Ok(self.now)
    }

    /// When the queue may next start a job, as the queue as a whole says: its pause and
    /// its own policy's last refusal (0 or past: now).
    fn queue_gate(&self) -> u64 {
        self.paused_until.max(self.queue_next_at)
    }

    /// The earliest time a group in the ready sets becomes eligible, whatever its
    /// priority.
    fn ready_first_at(&self) -> Option<u64> {
        self.ready
            .iter()
            .filter_map(|set| set.first())
            .map(|r| r.0)
            .min()
    }

    /// Whether the queue's concurrency cap holds every further start.
    fn queue_full_of_leases(&self) -> bool {
        let cap = self.config.queue_concurrency as usize;
        cap > 0 && self.leases.len() >= cap
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

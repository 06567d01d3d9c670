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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use paceline_core::policy::check_now;
use paceline_core::{round_to_micros, InputError, Op, Policy, State, StoreError, StoreErrorKind};

use crate::config::QueueConfig;
use crate::error::QueueError;
use crate::job::{
    check_lease_length, check_request_id, not_before_too_late, Enqueued, FailOutcome, Failure,
    GroupStats, JobInfo, JobState, Leased, NewJob, Stats, Totals, MAX_DELAY,
};
use crate::token::LeaseToken;

/// The most expired leases, due jobs and idle groups each call handles before its own work;
/// the rest wait for the next call (which [`QueueCore::next_event`] says is due at once).
pub const MAINTENANCE_BATCH: usize = 1_000;
/// The most jobs one lease call may take.
pub const MAX_LEASE_JOBS: usize = 1_000;
/// The longest worker name, in bytes.
pub const MAX_WORKER: usize = 128;
/// The longest error message kept on a job, in bytes (longer ones are cut).
pub const MAX_ERROR: usize = 4_096;
/// The longest group pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(86_400);

/// A rate-limited job queue's whole state. See the [module docs](self).
#[derive(Debug)]
pub struct QueueCore {
    config: QueueConfig,
    jobs: HashMap<String, Job>,
    groups: HashMap<String, Group>,
    /// Groups with a job waiting, below their cap: (eligible at, order, group).
    ready: BTreeSet<(u64, u64, String)>,
    /// Jobs waiting for a time: (not before, order, id).
    scheduled: BTreeSet<(u64, u64, String)>,
    /// Leases: (expires, token, id).
    leases: BTreeSet<(u64, u64, String)>,
    /// The dead set in order of death: (order, id).
    dead: BTreeSet<(u64, String)>,
    /// Groups with nothing waiting or active, dropped once their policy state is idle:
    /// (droppable at, group).
    retiring: BTreeSet<(u64, String)>,
    /// The jobs each lease call with a request id took, until their leases end: request
    /// id -> (when the leases end, what the call took).
    requests: HashMap<String, (u64, Vec<Taken>)>,
    /// The same, by expiry: (expires, request id).
    request_expiry: BTreeSet<(u64, String)>,
    /// The source of every order number and lease token.
    seq: u64,
    /// The last number given as a job id.
    last_id: u64,
    /// The latest `now` seen: time never goes back inside the queue.
    now: u64,
    totals: Totals,
}

/// A job a lease call with a request id took: its id, its lease's fence, and since when
/// its group could have started it; kept until the call's leases end, with their end.
type Taken = (String, u64, u64);

#[derive(Debug)]
struct Job {
    group: String,
    /// The job's place in its group's line: lines are kept in rank order, so a job that
    /// comes back (a retry, an expired lease, a pause) goes before every job that joined
    /// after it, and jobs that come back together keep their order.
    rank: u64,
    payload: Vec<u8>,
    attempts: u32,
    max_attempts: u32,
    last_error: Option<String>,
    enqueued_at: u64,
    estimated_start: u64,
    place: Place,
    /// The fence of the last lease that ended in a failure report (a retried report of it
    /// answers [`FailOutcome::Repeated`]).
    ended: Option<u64>,
}

#[derive(Debug)]
enum Place {
    /// In `scheduled` under (at, order); joins its group at the head (a retry) or the tail.
    Scheduled {
        at: u64,
        order: u64,
        head: bool,
    },
    Waiting,
    Active {
        token: u64,
        started: u64,
        expires: u64,
        worker: String,
    },
    Dead {
        order: u64,
    },
}

impl Place {
    fn state(&self) -> JobState {
        match self {
            Place::Scheduled { .. } => JobState::Scheduled,
            Place::Waiting => JobState::Waiting,
            Place::Active { .. } => JobState::Active,
            Place::Dead { .. } => JobState::Dead,
        }
    }
}

#[derive(Debug, Default)]
struct Group {
    /// The line: (rank, job id), in rank order.
    waiting: VecDeque<(u64, String)>,
    active: u32,
    /// The group's policy state.
    state: Option<State>,
    /// When the policy state is idle again (the group may then be dropped).
    idle_at: u64,
    /// The earliest start its policy allows, as of its last refusal.
    next_at: u64,
    /// An upstream's pause: no start before this.
    paused_until: u64,
    /// Its entry in `ready`, if there.
    ready: Option<(u64, u64)>,
    /// Its entry in `retiring`, if there.
    retiring: Option<u64>,
    /// Where the waiting line is expected to have got to (for `estimated_start`).
    projection: Option<Projection>,
}

/// The group's policy state and clock after the first `covers` waiting jobs started as
/// early as the policy allows.
#[derive(Debug, Clone)]
struct Projection {
    state: Option<State>,
    last: u64,
    covers: usize,
}

/// A Duration in whole microseconds, rounded up, at least 1.
pub(crate) fn micros_up(d: Duration) -> u64 {
    let us = round_to_micros(d);
    if Duration::from_micros(us) < d {
        us + 1
    } else {
        us.max(1)
    }
}

/// The error kept on a job: at most [`MAX_ERROR`] bytes, cut at a character boundary.
pub(crate) fn cut(error: Option<String>) -> Option<String> {
    error.map(|mut e| {
        if e.len() > MAX_ERROR {
            let mut end = MAX_ERROR;
            while !e.is_char_boundary(end) {
                end -= 1;
            }
            e.truncate(end);
        }
        e
    })
}

impl QueueCore {
    /// An empty queue. Fails when the configuration is invalid, naming the setting.
    pub fn new(config: QueueConfig) -> Result<QueueCore, InputError> {
        config.validate()?;
        Ok(QueueCore {
            config,
            jobs: HashMap::new(),
            groups: HashMap::new(),
            ready: BTreeSet::new(),
            scheduled: BTreeSet::new(),
            leases: BTreeSet::new(),
            dead: BTreeSet::new(),
            retiring: BTreeSet::new(),
            requests: HashMap::new(),
            request_expiry: BTreeSet::new(),
            seq: 0,
            last_id: 0,
            now: 0,
            totals: Totals::default(),
        })
    }

    /// The queue's configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Replaces the configuration (each group's policy, caps, defaults); jobs and the
    /// groups' policy states stay. A group whose policy changes algorithm starts afresh.
    pub fn set_config(&mut self, config: QueueConfig) -> Result<(), InputError> {
        config.validate()?;
        self.config = config;
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

    fn tick(&mut self, now: u64) -> Result<u64, InputError> {
        check_now(now)?;
        self.now = self.now.max(now);
        Ok(self.now)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Adds a job, or (same `id` while that job exists) answers the existing one.
    ///
    /// `estimated_start` is when the job starts if workers take every job as soon as its
    /// group's policy allows: the policy is run forward over the jobs ahead of it in its
    /// group. For `fixed_window` this is `nextWindowStart + floor(waiting /
    /// limit) * window`. It is exact while that holds; jobs ahead that are retried, returned
    /// by an expired lease or held by a pause, a concurrency cap or a lack of workers make
    /// the real start later. A delayed job's estimate is its not-before time, or later if
    /// the jobs ahead of it now would still be starting then.
    pub fn enqueue(&mut self, now: u64, job: NewJob) -> Result<Enqueued, QueueError> {
        job.validate(self.config.max_payload)?;
        let now = self.tick(now)?;
        self.maintain(now);
        if let Some(id) = &job.id {
            if let Some(existing) = self.jobs.get(id) {
                return Ok(Enqueued {
                    id: id.clone(),
                    state: existing.place.state(),
                    created: false,
                    estimated_start: existing.estimated_start,
                });
            }
        }
        if self.jobs.len() >= self.config.max_jobs {
            return Err(queue_full(self.config.max_jobs));
        }
        let latest = now.saturating_add(round_to_micros(MAX_DELAY));
        if job.not_before.is_some_and(|at| at > latest) {
            return Err(not_before_too_late(now).into());
        }
        let id = match job.id {
            Some(id) => id,
            None => loop {
                self.last_id += 1;
                let id = self.last_id.to_string();
                if !self.jobs.contains_key(&id) {
                    break id;
                }
            },
        };
        let max_attempts = job.max_attempts.unwrap_or(self.config.max_attempts);
        // Held back to the later of the delay's end and the not-before time.
        let at = now
            .saturating_add(round_to_micros(job.delay))
            .max(job.not_before.unwrap_or(0));
        let mut rank = 0;
        let (place, estimated_start) = if at > now {
            let order = self.next_seq();
            self.scheduled.insert((at, order, id.clone()));
            let line = self.peek_tail(&job.group, now);
            (
                Place::Scheduled {
                    at,
                    order,
                    head: false,
                },
                at.max(line),
            )
        } else {
            let (estimate, joined) = self.join_tail(&job.group, &id, now);
            rank = joined;
            (Place::Waiting, estimate)
        };
        let state = place.state();
        self.totals.enqueued += 1;
        self.jobs.insert(
            id.clone(),
            Job {
                group: job.group,
                rank,
                payload: job.payload,
                attempts: 0,
                max_attempts,
                last_error: None,
                enqueued_at: now,
                estimated_start,
                place,
                ended: None,
            },
        );
        Ok(Enqueued {
            id,
            state,
            created: true,
            estimated_start,
        })
    }

    /// The group's projection, brought to cover every waiting job.
    fn projection(config: &QueueConfig, name: &str, g: &Group, now: u64) -> Projection {
        if let Some(p) = &g.projection {
            if p.covers == g.waiting.len() {
                return p.clone();
            }
        }
        let mut p = Projection {
            state: g.state.clone(),
            last: now.max(g.next_at).max(g.paused_until),
            covers: 0,
        };
        let policy = config.policy_of(name);
        for _ in 0..g.waiting.len() {
            project_one(policy, &mut p, now);
        }
        p
    }

    /// When a job joining the tail of `group` now would start, without adding it.
    fn peek_tail(&self, group: &str, now: u64) -> u64 {
        let policy = self.config.policy_of(group);
        let mut p = match self.groups.get(group) {
            Some(g) => Self::projection(&self.config, group, g, now),
            None => Projection {
                state: None,
                last: now,
                covers: 0,
            },
        };
        project_one(policy, &mut p, now)
    }

    /// Puts `id` at the tail of `group`'s line with a new rank; returns its estimated start
    /// and its rank (the caller keeps the rank on the job).
    fn join_tail(&mut self, group: &str, id: &str, now: u64) -> (u64, u64) {
        self.seq += 1;
        let rank = self.seq;
        let g = self.groups.entry(group.to_string()).or_default();
        let mut p = Self::projection(&self.config, group, g, now);
        let estimate = project_one(self.config.policy_of(group), &mut p, now);
        g.projection = Some(p);
        g.waiting.push_back((rank, id.to_string()));
        self.refresh(group);
        (estimate, rank)
    }

    /// Puts `id` back in `group`'s line at its rank (a retry, an expired lease, a pause):
    /// ahead of every job that joined after it.
    fn join_head(&mut self, group: &str, id: &str) {
        let rank = self.jobs.get(id).map_or(0, |j| j.rank);
        let now = self.now;
        let policy = self.config.policy_of(group);
        let g = self.groups.entry(group.to_string()).or_default();
        let at = g.waiting.partition_point(|(r, _)| *r < rank);
        // The line's projection now has one more job to start: one more step keeps the
        // tail's estimate in step without replaying the line.
        match &mut g.projection {
            Some(p) if p.covers == g.waiting.len() => {
                project_one(policy, p, now);
            }
            _ => g.projection = None,
        }
        g.waiting.insert(at, (rank, id.to_string()));
        self.refresh(group);
    }

    /// Puts the group in or out of the ready and retiring sets as its state says.
    fn refresh(&mut self, name: &str) {
        let now = self.now;
        let cap = self.config.group_concurrency;
        let Some(g) = self.groups.get_mut(name) else {
            return;
        };
        let ready = !g.waiting.is_empty() && (cap == 0 || g.active < cap);
        let at = g.next_at.max(g.paused_until);
        if let Some((old_at, order)) = g.ready {
            // A group stays where it is unless it leaves the set or must wait longer (a
            // pause); moving it for anything else would cost it its turn.
            if !ready || old_at < at {
                self.ready.remove(&(old_at, order, name.to_string()));
                g.ready = None;
            }
        }
        if ready && g.ready.is_none() {
            self.seq += 1;
            let key = (at.max(now), self.seq);
            self.ready.insert((key.0, key.1, name.to_string()));
            g.ready = Some(key);
        }
        let empty = g.waiting.is_empty() && g.active == 0;
        match (g.retiring, empty) {
            (Some(t), false) => {
                self.retiring.remove(&(t, name.to_string()));
                g.retiring = None;
            }
            (None, true) => {
                let t = g.idle_at.max(g.paused_until);
                self.retiring.insert((t, name.to_string()));
                g.retiring = Some(t);
            }
            _ => {}
        }
        if g.waiting.is_empty() {
            g.projection = None;
        }
    }

    /// Expired leases back to their groups, due jobs into theirs, idle groups dropped: at
    /// most [`MAINTENANCE_BATCH`] of each.
    fn maintain(&mut self, now: u64) {
        for _ in 0..MAINTENANCE_BATCH {
            let Some(first) = self.request_expiry.first().cloned() else {
                break;
            };
            if first.0 > now {
                break;
            }
            self.request_expiry.remove(&first);
            self.requests.remove(&first.1);
        }
        for _ in 0..MAINTENANCE_BATCH {
            let Some((expires, _, id)) = self.leases.first().cloned() else {
                break;
            };
            if expires > now {
                break;
            }
            self.lease_expired(&id);
        }
        for _ in 0..MAINTENANCE_BATCH {
            let Some(first) = self.scheduled.first().cloned() else {
                break;
            };
            if first.0 > now {
                break;
            }
            self.scheduled.remove(&first);
            let id = first.2;
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            let head = matches!(job.place, Place::Scheduled { head: true, .. });
            job.place = Place::Waiting;
            let group = job.group.clone();
            if head {
                self.join_head(&group, &id);
            } else {
                let (_, rank) = self.join_tail(&group, &id, now);
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.rank = rank;
                }
            }
        }
        for _ in 0..MAINTENANCE_BATCH {
            let Some(first) = self.retiring.first().cloned() else {
                break;
            };
            if first.0 > now {
                break;
            }
            self.retiring.remove(&first);
            let name = first.1;
            let drop = self.groups.get(&name).is_some_and(|g| {
                g.waiting.is_empty() && g.active == 0 && g.retiring == Some(first.0)
            });
            if drop {
                self.groups.remove(&name);
            }
        }
    }

    /// A lease ran out: the job goes back to the head of its group, or dies if it has had
    /// all its attempts.
    fn lease_expired(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let Place::Active { token, expires, .. } = job.place else {
            return;
        };
        self.leases.remove(&(expires, token, id.to_string()));
        self.totals.lease_expiries += 1;
        let group = job.group.clone();
        if let Some(g) = self.groups.get_mut(&group) {
            g.active = g.active.saturating_sub(1);
        }
        if job.attempts >= job.max_attempts {
            self.totals.dead += 1;
            job.last_error = Some(format!(
                "the lease expired on attempt {} of {}",
                job.attempts, job.max_attempts
            ));
            self.seq += 1;
            job.place = Place::Dead { order: self.seq };
            self.dead.insert((self.seq, id.to_string()));
            self.refresh(&group);
        } else {
            job.place = Place::Waiting;
            self.join_head(&group, id);
        }
    }

    /// Starts up to `max_jobs` jobs for `worker`, each admitted by its group's policy now,
    /// taking the groups in the order they became eligible.
    ///
    /// `lease`: how long the worker holds each job before it returns to its group (default:
    /// the queue's). An empty answer means no group may start a job now; see
    /// [`next_event`](Self::next_event) for when one may.
    pub fn lease(
        &mut self,
        now: u64,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
    ) -> Result<Vec<Leased>, QueueError> {
        self.lease_request(now, worker, max_jobs, lease, None)
    }

    /// [`lease`](Self::lease), made safe to retry: the first call with `request` (an id of
    /// the caller's, 1 to 128 bytes of `A-Z a-z 0-9 - _ . :`) takes jobs as `lease` does
    /// and remembers which; a later call with the same id, while those leases last, takes
    /// nothing and answers the jobs it took that are still held by those leases. A caller
    /// whose answer was lost (a timeout, a broken connection) asks again with the same id
    /// and gets its jobs, instead of leaving them held by no one until their leases run
    /// out.
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// let mut queue = QueueCore::new(QueueConfig::new("gcra:rate=10/s,burst=10".parse().unwrap())).unwrap();
    /// queue.enqueue(0, NewJob::new("g", b"a".to_vec())).unwrap();
    /// queue.enqueue(0, NewJob::new("g", b"b".to_vec())).unwrap();
    /// let first = queue.lease_request(0, "w", 1, None, Some("call-1")).unwrap();
    /// let again = queue.lease_request(5, "w", 1, None, Some("call-1")).unwrap();
    /// assert_eq!(first, again); // the same job, not the next one
    /// ```
    pub fn lease_request(
        &mut self,
        now: u64,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&str>,
    ) -> Result<Vec<Leased>, QueueError> {
        let lease_us = check_lease_request(&self.config, worker, max_jobs, lease)?;
        if let Some(request) = request {
            check_request_id(request)?;
        }
        let now = self.tick(now)?;
        self.maintain(now);
        if let Some(request) = request {
            if let Some((_, taken)) = self.requests.get(request) {
                let taken = taken.clone();
                return Ok(self.replay(now, &taken));
            }
        }
        let out = self.take(now, worker, max_jobs, lease_us);
        if let (Some(request), false) = (request, out.is_empty()) {
            let expires = now.saturating_add(lease_us);
            let taken = out.iter().map(|l| (l.id.clone(), l.lease, l.eligible));
            self.requests
                .insert(request.to_string(), (expires, taken.collect()));
            self.request_expiry.insert((expires, request.to_string()));
        }
        Ok(out)
    }

    /// The jobs of an earlier lease call (`taken`: id, fence, eligible) still held by the
    /// leases it gave, as it answered them.
    fn replay(&self, now: u64, taken: &[Taken]) -> Vec<Leased> {
        taken
            .iter()
            .filter_map(|(id, fence, eligible)| {
                let job = self.jobs.get(id)?;
                match &job.place {
                    Place::Active {
                        token,
                        started,
                        expires,
                        ..
                    } if token == fence && *expires > now => Some(Leased {
                        id: id.clone(),
                        group: job.group.clone(),
                        payload: job.payload.clone(),
                        attempt: job.attempts,
                        lease: *fence,
                        token: LeaseToken::default(),
                        started: *started,
                        eligible: *eligible,
                        lease_expires: *expires,
                    }),
                    _ => None,
                }
            })
            .collect()
    }

    /// Takes up to `max_jobs` eligible jobs for `worker`, each leased for `lease_us`.
    fn take(&mut self, now: u64, worker: &str, max_jobs: usize, lease_us: u64) -> Vec<Leased> {
        let mut out = Vec::new();
        while out.len() < max_jobs {
            let Some(first) = self.ready.first().cloned() else {
                break;
            };
            if first.0 > now {
                break;
            }
            self.ready.remove(&first);
            let name = first.2;
            let policy = self.config.policy_of(&name);
            let Some(g) = self.groups.get_mut(&name) else {
                continue;
            };
            g.ready = None;
            let decision = match policy.apply(&mut g.state, now, Op::Limit, 1) {
                Ok(d) => d,
                // Cost 1 and a checked `now` are valid for every policy; were it not so,
                // the group would be asked again a second later rather than spin.
                Err(_) => {
                    g.next_at = now.saturating_add(1_000_000);
                    self.refresh(&name);
                    continue;
                }
            };
            if !decision.allowed {
                g.next_at = now.saturating_add(micros_up(decision.delay));
                self.refresh(&name);
                continue;
            }
            g.idle_at = now.saturating_add(round_to_micros(decision.reset_after));
            let popped = g.waiting.pop_front();
            let known = popped
                .as_ref()
                .is_some_and(|(_, id)| self.jobs.contains_key(id));
            let (Some((_, id)), true) = (popped, known) else {
                // An empty line, or an id of no job (which the indexes never hold): the
                // group is put back where its state says.
                self.refresh(&name);
                continue;
            };
            let Some(g) = self.groups.get_mut(&name) else {
                continue;
            };
            g.active += 1;
            if let Some(p) = &mut g.projection {
                p.covers = p.covers.saturating_sub(1);
            }
            self.seq += 1;
            let token = self.seq;
            let expires = now.saturating_add(lease_us);
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            job.attempts += 1;
            job.place = Place::Active {
                token,
                started: now,
                expires,
                worker: worker.to_string(),
            };
            self.leases.insert((expires, token, id.clone()));
            self.totals.started += 1;
            out.push(Leased {
                id,
                group: name.clone(),
                payload: job.payload.clone(),
                attempt: job.attempts,
                lease: token,
                token: LeaseToken::default(),
                started: now,
                eligible: first.0,
                lease_expires: expires,
            });
            // Behind every other eligible group.
            self.refresh(&name);
        }
        out
    }

    /// The job `id` leased with `token`, if that lease is live at `now`; an expired one is
    /// handled on the spot.
    fn held(&mut self, now: u64, id: &str, token: u64) -> Result<(), QueueError> {
        let lost = || QueueError::LeaseLost { id: id.to_string() };
        let job = self.jobs.get(id).ok_or_else(lost)?;
        match job.place {
            Place::Active {
                token: t, expires, ..
            } if t == token => {
                if expires <= now {
                    self.lease_expired(id);
                    return Err(lost());
                }
                Ok(())
            }
            _ => Err(lost()),
        }
    }

    /// Takes an active job out of its lease and its group's count; returns its group.
    fn release(&mut self, id: &str) -> Option<String> {
        let job = self.jobs.get_mut(id)?;
        let Place::Active { token, expires, .. } = job.place else {
            return None;
        };
        self.leases.remove(&(expires, token, id.to_string()));
        let group = job.group.clone();
        if let Some(g) = self.groups.get_mut(&group) {
            g.active = g.active.saturating_sub(1);
        }
        Some(group)
    }

    /// The job is done: it leaves the queue (its id may be used again).
    pub fn ack(&mut self, now: u64, id: &str, lease: u64) -> Result<(), QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        if !self.jobs.contains_key(id) {
            return Err(QueueError::UnknownJob { id: id.to_string() });
        }
        self.held(now, id, lease)?;
        if let Some(group) = self.release(id) {
            self.jobs.remove(id);
            self.totals.acked += 1;
            self.refresh(&group);
        }
        Ok(())
    }

    /// The job failed: see [`Failure`] for what each kind does. `jitter` (from 0 to 1) picks
    /// the backoff delay between half and all of the attempt's full delay; the caller draws
    /// it, so that the core stays deterministic.
    pub fn fail(
        &mut self,
        now: u64,
        id: &str,
        lease: u64,
        failure: Failure,
        jitter: f64,
    ) -> Result<FailOutcome, QueueError> {
        check_failure(&failure)?;
        let now = self.tick(now)?;
        self.maintain(now);
        let Some(job) = self.jobs.get(id) else {
            return Err(QueueError::UnknownJob { id: id.to_string() });
        };
        if job.ended == Some(lease) && !matches!(job.place, Place::Active { .. }) {
            return Ok(FailOutcome::Repeated);
        }
        self.held(now, id, lease)?;
        let Some(group) = self.release(id) else {
            return Err(QueueError::LeaseLost { id: id.to_string() });
        };
        let backoff = self.backoff_for(id, jitter);
        let Some(job) = self.jobs.get_mut(id) else {
            return Err(QueueError::LeaseLost { id: id.to_string() });
        };
        job.ended = Some(lease);
        let outcome = match failure {
            Failure::Fatal { error } => {
                job.last_error = cut(error);
                FailOutcome::Dead
            }
            Failure::Retry { error, after } => {
                job.last_error = cut(error);
                if job.attempts >= job.max_attempts {
                    FailOutcome::Dead
                } else {
                    let at = now.saturating_add(after.map_or(backoff, round_to_micros));
                    FailOutcome::Retrying { at }
                }
            }
            Failure::PauseGroup { error, pause } => {
                job.last_error = cut(error);
                job.attempts = job.attempts.saturating_sub(1);
                let until = now.saturating_add(micros_up(pause));
                FailOutcome::Paused { until }
            }
            Failure::Release => {
                job.attempts = job.attempts.saturating_sub(1);
                FailOutcome::Released
            }
        };
        match outcome {
            FailOutcome::Released | FailOutcome::Repeated => {}
            FailOutcome::Dead => self.totals.failed += 1,
            FailOutcome::Retrying { .. } => {
                self.totals.failed += 1;
                self.totals.retried += 1;
            }
            // The upstream's refusal, not the job's failure.
            FailOutcome::Paused { .. } => self.totals.pauses += 1,
        }
        match outcome {
            FailOutcome::Dead => {
                self.totals.dead += 1;
                self.seq += 1;
                job.place = Place::Dead { order: self.seq };
                self.dead.insert((self.seq, id.to_string()));
                self.refresh(&group);
            }
            FailOutcome::Retrying { at } => {
                self.seq += 1;
                job.place = Place::Scheduled {
                    at,
                    order: self.seq,
                    head: true,
                };
                self.scheduled.insert((at, self.seq, id.to_string()));
                self.refresh(&group);
                if at <= now {
                    self.maintain(now);
                }
            }
            FailOutcome::Paused { until } => {
                job.place = Place::Waiting;
                let g = self.groups.entry(group.clone()).or_default();
                g.paused_until = g.paused_until.max(until);
                if let Some(p) = &mut g.projection {
                    // The whole line waits for the pause.
                    p.last = p.last.max(g.paused_until);
                }
                self.join_head(&group, id);
            }
            FailOutcome::Released | FailOutcome::Repeated => {
                job.place = Place::Waiting;
                self.join_head(&group, id);
            }
        }
        Ok(outcome)
    }

    /// The backoff before the retry of `id`'s latest attempt, in µs.
    fn backoff_for(&self, id: &str, jitter: f64) -> u64 {
        let attempts = self.jobs.get(id).map_or(1, |j| j.attempts.max(1));
        let first = round_to_micros(self.config.retry_backoff) as f64;
        let max = round_to_micros(self.config.retry_backoff_max) as f64;
        let full = (first * 2f64.powi(attempts.saturating_sub(1).min(60) as i32)).min(max);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        (full * (0.5 + 0.5 * jitter)).round().max(1.0) as u64
    }

    /// Gives the lease another `lease` from now; returns when it now expires.
    pub fn extend(
        &mut self,
        now: u64,
        id: &str,
        token: u64,
        lease: Duration,
    ) -> Result<u64, QueueError> {
        check_lease_length(lease)?;
        let now = self.tick(now)?;
        self.maintain(now);
        self.held(now, id, token)?;
        let Some(job) = self.jobs.get_mut(id) else {
            return Err(QueueError::LeaseLost { id: id.to_string() });
        };
        let Place::Active { expires, .. } = &mut job.place else {
            return Err(QueueError::LeaseLost { id: id.to_string() });
        };
        self.leases.remove(&(*expires, token, id.to_string()));
        *expires = now.saturating_add(round_to_micros(lease));
        self.leases.insert((*expires, token, id.to_string()));
        Ok(*expires)
    }

    /// Removes a job that is not active (scheduled, waiting or dead).
    pub fn cancel(&mut self, now: u64, id: &str) -> Result<(), QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| QueueError::UnknownJob { id: id.to_string() })?;
        match job.place {
            Place::Active { .. } => return Err(active_conflict(id)),
            Place::Scheduled { at, order, .. } => {
                self.scheduled.remove(&(at, order, id.to_string()));
            }
            Place::Dead { order } => {
                self.dead.remove(&(order, id.to_string()));
            }
            Place::Waiting => {
                if let Some(g) = self.groups.get_mut(&job.group) {
                    let at = g.waiting.partition_point(|(r, _)| *r < job.rank);
                    if g.waiting.get(at).is_some_and(|(_, w)| w == id) {
                        let before = g.waiting.len();
                        g.waiting.remove(at);
                        // One job fewer ahead: the tail's estimate keeps its (now slightly
                        // pessimistic) projection rather than replaying the line.
                        if let Some(p) = &mut g.projection {
                            if p.covers == before {
                                p.covers -= 1;
                            }
                        }
                    }
                }
            }
        }
        let group = job.group.clone();
        self.jobs.remove(id);
        self.refresh(&group);
        Ok(())
    }

    /// What the queue knows of job `id`.
    pub fn job(&self, id: &str) -> Option<JobInfo> {
        let job = self.jobs.get(id)?;
        let (not_before, started, lease_expires, worker) = match &job.place {
            Place::Scheduled { at, .. } => (Some(*at), None, None, None),
            Place::Active {
                started,
                expires,
                worker,
                ..
            } => (None, Some(*started), Some(*expires), Some(worker.clone())),
            Place::Waiting | Place::Dead { .. } => (None, None, None, None),
        };
        Some(JobInfo {
            id: id.to_string(),
            group: job.group.clone(),
            state: job.place.state(),
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            last_error: job.last_error.clone(),
            enqueued_at: job.enqueued_at,
            not_before,
            started,
            lease_expires,
            worker,
            payload: job.payload.clone(),
        })
    }

    /// The counts by state, and each group with jobs waiting or active.
    pub fn stats(&mut self, now: u64) -> Result<Stats, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let mut groups: Vec<GroupStats> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.waiting.is_empty() || g.active > 0)
            .map(|(name, g)| GroupStats {
                group: name.clone(),
                waiting: g.waiting.len() as u64,
                active: u64::from(g.active),
                next_eligible: g.ready.map(|(at, _)| at),
            })
            .collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(Stats {
            scheduled: self.scheduled.len() as u64,
            waiting: groups.iter().map(|g| g.waiting).sum(),
            active: self.leases.len() as u64,
            dead: self.dead.len() as u64,
            groups,
            totals: self.totals,
        })
    }

    /// The counts by state and the totals, without the groups: constant work whatever the
    /// queue holds (for metrics, which any scrape may ask for).
    pub fn counts(&mut self, now: u64) -> Result<Stats, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let (scheduled, active, dead) = (self.scheduled.len(), self.leases.len(), self.dead.len());
        Ok(Stats {
            scheduled: scheduled as u64,
            waiting: self.jobs.len().saturating_sub(scheduled + active + dead) as u64,
            active: active as u64,
            dead: dead as u64,
            groups: Vec::new(),
            totals: self.totals,
        })
    }

    /// How many groups the queue holds state for: those with jobs waiting or active, and
    /// those whose policy state is not yet idle or that are paused (dropped by the calls
    /// after that, up to [`MAINTENANCE_BATCH`] a call).
    pub fn groups_held(&self) -> usize {
        self.groups.len()
    }

    /// Up to `limit` dead jobs, oldest death first, skipping the first `offset`.
    pub fn dead(&self, offset: usize, limit: usize) -> Vec<JobInfo> {
        self.dead
            .iter()
            .skip(offset)
            .take(limit)
            .filter_map(|(_, id)| self.job(id))
            .collect()
    }

    /// Puts dead jobs back at the tail of their groups with fresh attempts: those of `ids`
    /// (unknown or not dead ids are skipped), or every one (`None`). Returns how many.
    pub fn retry_dead(&mut self, now: u64, ids: Option<&[String]>) -> Result<usize, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let chosen: Vec<(u64, String)> = match ids {
            None => self.dead.iter().cloned().collect(),
            Some(ids) => ids
                .iter()
                .filter_map(|id| match self.jobs.get(id)?.place {
                    Place::Dead { order } => Some((order, id.clone())),
                    _ => None,
                })
                .collect(),
        };
        let mut n = 0;
        for (order, id) in chosen {
            if !self.dead.remove(&(order, id.clone())) {
                continue;
            }
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            job.attempts = 0;
            job.place = Place::Waiting;
            let group = job.group.clone();
            let (estimate, rank) = self.join_tail(&group, &id, now);
            if let Some(job) = self.jobs.get_mut(&id) {
                job.estimated_start = estimate;
                job.rank = rank;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Does the queue's upkeep (a job whose last lease ran out dies there), then removes
    /// every dead job; returns how many. (The Redis twin purges in calls of
    /// [`MAINTENANCE_BATCH`] dead jobs, each after its own upkeep: the two differ only when
    /// more than that many leases ran out unnoticed.)
    pub fn purge_dead(&mut self, now: u64) -> Result<usize, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let dead = std::mem::take(&mut self.dead);
        for (_, id) in &dead {
            self.jobs.remove(id);
        }
        Ok(dead.len())
    }

    /// The earliest time something happens without a call: a group becomes eligible, a
    /// scheduled job is due, or a lease expires. A time at or before the last `now` means
    /// work is due: a group to ask, or due jobs and expired leases beyond what the last
    /// call handled ([`MAINTENANCE_BATCH`]); the next call makes progress on it. `None`:
    /// no job is waiting, scheduled or leased.
    pub fn next_event(&self) -> Option<u64> {
        [
            self.ready.first().map(|r| r.0),
            self.scheduled.first().map(|s| s.0),
            self.leases.first().map(|l| l.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Checks every internal index against the jobs and groups; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut waiting = 0usize;
        for (name, g) in &self.groups {
            let active = self
                .jobs
                .values()
                .filter(|j| &j.group == name && matches!(j.place, Place::Active { .. }))
                .count();
            if active != g.active as usize {
                return Err(format!("group {name}: active {} != {active}", g.active));
            }
            if !g
                .waiting
                .iter()
                .zip(g.waiting.iter().skip(1))
                .all(|(a, b)| a.0 < b.0)
            {
                return Err(format!("group {name}: its line is out of rank order"));
            }
            for (rank, id) in &g.waiting {
                let job = self
                    .jobs
                    .get(id)
                    .ok_or(format!("{id} waiting but unknown"))?;
                if !matches!(job.place, Place::Waiting) || &job.group != name || job.rank != *rank {
                    return Err(format!("{id} in {name}'s line but {:?}", job.place));
                }
            }
            waiting += g.waiting.len();
            let cap = self.config.group_concurrency;
            let should = !g.waiting.is_empty() && (cap == 0 || g.active < cap);
            let is = g
                .ready
                .is_some_and(|(at, o)| self.ready.contains(&(at, o, name.clone())));
            if should != is {
                return Err(format!("group {name}: ready {is}, should be {should}"));
            }
        }
        let waiting_jobs = self
            .jobs
            .values()
            .filter(|j| matches!(j.place, Place::Waiting))
            .count();
        if waiting != waiting_jobs {
            return Err(format!("{waiting} in lines, {waiting_jobs} jobs waiting"));
        }
        for (id, job) in &self.jobs {
            let indexed = match job.place {
                Place::Scheduled { at, order, .. } => {
                    self.scheduled.contains(&(at, order, id.clone()))
                }
                Place::Active { token, expires, .. } => {
                    self.leases.contains(&(expires, token, id.clone()))
                }
                Place::Dead { order } => self.dead.contains(&(order, id.clone())),
                Place::Waiting => true,
            };
            if !indexed {
                return Err(format!("{id}: {:?} not in its index", job.place));
            }
        }
        let states = |s: JobState| self.jobs.values().filter(|j| j.place.state() == s).count();
        if states(JobState::Scheduled) != self.scheduled.len()
            || states(JobState::Active) != self.leases.len()
            || states(JobState::Dead) != self.dead.len()
            || self.ready.len() != self.groups.values().filter(|g| g.ready.is_some()).count()
        {
            return Err("an index holds entries of no job".into());
        }
        Ok(())
    }
}

/// The most refusals the projection of one start follows before it takes the time reached
/// (every algorithm's retry-after is exact, so one is the norm).
const MAX_PROJECTION_STEPS: usize = 64;

/// Runs the policy forward to the next start after the projection's last; returns it.
fn project_one(policy: &Policy, p: &mut Projection, now: u64) -> u64 {
    let mut t = p.last.max(now);
    for _ in 0..MAX_PROJECTION_STEPS {
        match policy.apply(&mut p.state, t, Op::Limit, 1) {
            Ok(d) if d.allowed => break,
            Ok(d) => t = t.saturating_add(micros_up(d.delay)),
            Err(_) => break,
        }
    }
    p.last = t;
    p.covers += 1;
    t
}

/// The backoff's jitter for a backend: numbers from 0 to 1 (xorshift), seeded from the
/// clock, so that a backend's sequence on a virtual clock repeats.
#[derive(Debug)]
pub(crate) struct Jitter(std::sync::atomic::AtomicU64);

impl Jitter {
    pub(crate) fn seeded(now: u64) -> Jitter {
        let seed = now | 1;
        Jitter(std::sync::atomic::AtomicU64::new(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        ))
    }

    /// The next number from 0 to 1.
    pub(crate) fn next(&self) -> f64 {
        use std::sync::atomic::Ordering;
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The answer to an enqueue into a full queue.
pub(crate) fn queue_full(max_jobs: usize) -> QueueError {
    QueueError::Store(StoreError::new(
        StoreErrorKind::Capacity,
        format!(
            "the queue holds its maximum of {max_jobs} jobs (max_jobs); let workers catch up, purge dead jobs or raise max_jobs"
        ),
    ))
}

/// The answer to cancelling a job a worker holds.
pub(crate) fn active_conflict(id: &str) -> QueueError {
    QueueError::Conflict {
        id: id.to_string(),
        state: "active",
        message: "a worker holds it; it can be cancelled once it is back in the queue",
    }
}

/// Checks a lease call's arguments; answers the lease's length in µs (the queue's when
/// `lease` is `None`).
pub(crate) fn check_lease_request(
    config: &QueueConfig,
    worker: &str,
    max_jobs: usize,
    lease: Option<Duration>,
) -> Result<u64, QueueError> {
    check_worker(worker)?;
    if max_jobs == 0 || max_jobs > MAX_LEASE_JOBS {
        return Err(
            InputError::new("max_jobs", format!("must be from 1 to {MAX_LEASE_JOBS}")).into(),
        );
    }
    let lease = lease.unwrap_or(config.lease);
    check_lease_length(lease)?;
    Ok(round_to_micros(lease))
}

/// Checks a failure's pause and retry delay.
pub(crate) fn check_failure(failure: &Failure) -> Result<(), QueueError> {
    if let Failure::PauseGroup { pause, .. } = failure {
        if pause.is_zero() || *pause > MAX_PAUSE {
            return Err(InputError::new("pause_group_ms", "must be from 1µs to 1d").into());
        }
    }
    if let Failure::Retry { after: Some(d), .. } = failure {
        if *d > crate::job::MAX_DELAY {
            return Err(InputError::new("retry_after_ms", "must be at most 365 days").into());
        }
    }
    Ok(())
}

/// Worker names: 1 to [`MAX_WORKER`] bytes, no control characters.
fn check_worker(worker: &str) -> Result<(), InputError> {
    if worker.is_empty() || worker.len() > MAX_WORKER || worker.chars().any(char::is_control) {
        return Err(InputError::new(
            "worker",
            format!("must be 1 to {MAX_WORKER} bytes with no control characters"),
        ));
    }
    Ok(())
}

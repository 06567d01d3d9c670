//! What the queue keeps: each job (its group, rank, attempts and place), each group (its
//! line, active count, policy state, pause and place in the ready set), and the projection
//! of a group's line that gives new jobs their estimated start.

use std::collections::VecDeque;

use paceline_core::{Op, Policy, State};

use super::micros_up;
#[cfg(doc)]
use crate::job::FailOutcome;
use crate::job::JobState;

/// A job a lease call with a request id took: its id, its lease's fence, and since when
/// its group could have started it; kept until the call's leases end, with their end.
pub(super) type Taken = (String, u64, u64);

#[derive(Debug)]
pub(super) struct Job {
    pub(super) group: String,
    /// The job's place in its group's line: lines are kept in rank order, so a job that
    /// comes back (a retry, an expired lease, a pause) goes before every job that joined
    /// after it, and jobs that come back together keep their order.
    pub(super) rank: u64,
    /// 0 (the most urgent) to `MAX_PRIORITY`: lines are kept by priority, then rank.
    pub(super) priority: u8,
    /// What each start counts against the group's and the queue's policies.
    pub(super) cost: u32,
    pub(super) payload: Vec<u8>,
    pub(super) attempts: u32,
    pub(super) max_attempts: u32,
    pub(super) last_error: Option<String>,
    pub(super) enqueued_at: u64,
    pub(super) estimated_start: u64,
    pub(super) place: Place,
    /// The fence of the last lease that ended in a failure report (a retried report of it
    /// answers [`FailOutcome::Repeated`]).
    pub(super) ended: Option<u64>,
    /// What its worker last reported of its progress.
    pub(super) progress: Option<Vec<u8>>,
    /// Completed: what it was acknowledged with.
    pub(super) result: Option<Vec<u8>>,
}

#[derive(Debug)]
pub(super) enum Place {
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
    /// In the dead set under `order`, since `at`.
    Dead {
        order: u64,
        at: u64,
    },
    /// Acknowledged at `at` and kept readable (under `order`) until `until`.
    Completed {
        order: u64,
        at: u64,
        until: u64,
    },
}

impl Job {
    /// The job's place in its group's line: see [`line_key`].
    pub(super) fn key(&self) -> u64 {
        line_key(self.priority, self.rank)
    }
}

/// How many bits of a line key hold the rank: ranks (taken from the queue's sequence) stay
/// below 2^49, and the priority sits above them.
pub(super) const RANK_BITS: u32 = 49;

/// A job's place in its group's line: by priority, then by rank. The Lua twin scores the
/// front of a line with the same number.
pub(super) fn line_key(priority: u8, rank: u64) -> u64 {
    (u64::from(priority) << RANK_BITS) | rank
}

/// The priority a line key holds.
pub(super) fn key_priority(key: u64) -> u8 {
    u8::try_from(key >> RANK_BITS).unwrap_or(u8::MAX)
}

impl Place {
    pub(super) fn state(&self) -> JobState {
        match self {
            Place::Scheduled { .. } => JobState::Scheduled,
            Place::Waiting => JobState::Waiting,
            Place::Active { .. } => JobState::Active,
            Place::Dead { .. } => JobState::Dead,
            Place::Completed { .. } => JobState::Completed,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Group {
    /// The line: (line key, job id), in key order (priority, then rank: see [`line_key`]).
    pub(super) waiting: VecDeque<(u64, String)>,
    /// How many waiting jobs cost more than 1 (the Lua twin reads the costs of a line's
    /// jobs only when some do).
    pub(super) costly: usize,
    pub(super) active: u32,
    /// The group's policy state.
    pub(super) state: Option<State>,
    /// When the policy state is idle again (the group may then be dropped).
    pub(super) idle_at: u64,
    /// The earliest start its policy allows, as of its last refusal.
    pub(super) next_at: u64,
    /// An upstream's pause: no start before this.
    pub(super) paused_until: u64,
    /// Its entry in `ready`, if there: in the set of priority `level`, (at, order).
    pub(super) ready: Option<(u64, u64)>,
    /// The priority of the ready set its entry is in (that of its next job).
    pub(super) level: u8,
    /// Its entry in `retiring`, if there.
    pub(super) retiring: Option<u64>,
    /// Where the waiting line is expected to have got to (for `estimated_start`).
    pub(super) projection: Option<Projection>,
}

/// The group's policy state and clock after the first `covers` waiting jobs started as
/// early as the policy allows.
#[derive(Debug, Clone)]
pub(super) struct Projection {
    pub(super) state: Option<State>,
    pub(super) last: u64,
    pub(super) covers: usize,
}

/// The most refusals the projection of one start follows before it takes the time reached
/// (every algorithm's retry-after is exact, so one is the norm).
const MAX_PROJECTION_STEPS: usize = 64;

/// Runs the policy forward to the next start, of a job costing `cost`, after the
/// projection's last; returns it.
pub(super) fn project_one(policy: &Policy, p: &mut Projection, now: u64, cost: u32) -> u64 {
    let mut t = p.last.max(now);
    for _ in 0..MAX_PROJECTION_STEPS {
        match policy.apply(&mut p.state, t, Op::Limit, u64::from(cost)) {
            Ok(d) if d.allowed => break,
            Ok(d) => t = t.saturating_add(micros_up(d.delay)),
            Err(_) => break,
        }
    }
    p.last = t;
    p.covers += 1;
    t
}

//! The groups' lines and the ready set: enqueueing a job, its estimated start, a job's
//! place at the tail or back at the head of its group's line, and a group's place among
//! the groups ready to start one.

use paceline_core::round_to_micros;

use super::records::{project_one, Group, Job, Place, Projection};
use super::{queue_full, QueueCore, UNTIL_RESUMED};
use crate::config::QueueConfig;
use crate::error::QueueError;
use crate::job::{not_before_too_late, Enqueued, JobState, NewJob, MAX_DELAY};

impl QueueCore {
    /// Adds a job, or (same `id` while that job exists) answers the existing one.
    ///
    /// `estimated_start` is when the job starts if workers take every job as soon as its
    /// group's policy allows: the policy is run forward over the jobs ahead of it in its
    /// group. For `fixed_window` this is `nextWindowStart + floor(waiting /
    /// limit) * window`. It is exact while that holds; jobs ahead that are retried, returned
    /// by an expired lease or held by a pause, a concurrency cap or a lack of workers make
    /// the real start later. A delayed job's estimate is its not-before time, or later if
    /// the jobs ahead of it now would still be starting then. In a group paused until
    /// resumed it is [`UNTIL_RESUMED`]; the queue's own pause is not counted.
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
                    deduplicated: false,
                    estimated_start: existing.estimated_start,
                });
            }
        }
        if let Some(d) = &job.dedup {
            if let Some((expires, first, estimate)) = self.dedup.get(&d.key) {
                if *expires > now {
                    let (first, mut estimated_start) = (first.clone(), *estimate);
                    let mut state = JobState::Finished;
                    if let Some(existing) = self.jobs.get_mut(&first) {
                        let waits =
                            matches!(existing.place, Place::Waiting | Place::Scheduled { .. });
                        if d.replace && waits {
                            existing.payload = job.payload;
                        }
                        state = existing.place.state();
                        estimated_start = existing.estimated_start;
                    }
                    return Ok(Enqueued {
                        id: first,
                        state,
                        created: false,
                        deduplicated: true,
                        estimated_start,
                    });
                }
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
                let id = format!("{}{}", self.last_id, self.id_suffix);
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
        // A group paused until resumed has no time to give: the pause's end stands for it.
        let estimated_start = estimated_start.min(UNTIL_RESUMED);
        let state = place.state();
        if let Some(d) = &job.dedup {
            let expires = now.saturating_add(round_to_micros(d.ttl));
            let entry = (expires, id.clone(), estimated_start);
            if let Some((stale, ..)) = self.dedup.insert(d.key.clone(), entry) {
                self.dedup_expiry.remove(&(stale, d.key.clone()));
            }
            self.dedup_expiry.insert((expires, d.key.clone()));
        }
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
            deduplicated: false,
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
    pub(super) fn join_tail(&mut self, group: &str, id: &str, now: u64) -> (u64, u64) {
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
    pub(super) fn join_head(&mut self, group: &str, id: &str) {
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
    pub(super) fn refresh(&mut self, name: &str) {
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
}

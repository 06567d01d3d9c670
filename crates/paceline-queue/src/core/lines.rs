//! The groups' lines and the ready set: enqueueing a job, its estimated start, a job's
//! place at the tail or back at the head of its group's line, and a group's place among
//! the groups ready to start one.

use paceline_core::round_to_micros;

use super::records::{
    key_priority, line_key, project_one, Group, Job, Place, Projection, RANK_BITS,
};
use super::{cost_beyond, max_cost, queue_full, QueueCore, UNTIL_RESUMED};
use crate::error::QueueError;
use crate::events::{Event, EventKind};
use crate::job::{Enqueued, JobState, NewJob};

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
        if self.jobs.len() - self.completed.len() >= self.config.max_jobs {
            return Err(queue_full(self.config.max_jobs));
        }
        if let Some(max) = max_cost(&self.config, &job.group) {
            if u64::from(job.cost) > max {
                return Err(cost_beyond(job.cost, max).into());
            }
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
            let line = self.peek_place(&job.group, job.priority, job.cost, now);
            (
                Place::Scheduled {
                    at,
                    order,
                    head: false,
                },
                at.max(line),
            )
        } else {
            let (estimate, joined) = self.join_tail(&job.group, &id, now, job.priority, job.cost);
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
        self.events
            .push(|| Event::new(EventKind::Enqueued, now).job(&id, &job.group));
        self.jobs.insert(
            id.clone(),
            Job {
                group: job.group,
                rank,
                priority: job.priority,
                cost: job.cost,
                payload: job.payload,
                attempts: 0,
                max_attempts,
                last_error: None,
                enqueued_at: now,
                estimated_start,
                place,
                ended: None,
                progress: None,
                result: None,
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

    /// The projection of the first `upto` jobs of the group's line, each at its cost: the
    /// group's own when it covers the whole line, else run afresh from the group's state.
    fn projection(&self, name: &str, g: &Group, now: u64, upto: usize) -> Projection {
        if let Some(p) = &g.projection {
            if upto == g.waiting.len() && p.covers == upto {
                return p.clone();
            }
        }
        let mut p = Projection {
            state: g.state.clone(),
            last: now.max(g.next_at).max(g.paused_until),
            covers: 0,
        };
        let policy = self.config.policy_of(name);
        for (_, id) in g.waiting.iter().take(upto) {
            let cost = match g.costly {
                0 => 1,
                _ => self.jobs.get(id).map_or(1, |j| j.cost),
            };
            project_one(policy, &mut p, now, cost);
        }
        p
    }

    /// When a job of `priority` costing `cost` would start if it joined `group`'s line
    /// now, behind every job of its priority or a more urgent one, without adding it.
    fn peek_place(&self, group: &str, priority: u8, cost: u32, now: u64) -> u64 {
        let policy = self.config.policy_of(group);
        let mut p = match self.groups.get(group) {
            Some(g) => {
                let key = line_key(priority, (1 << RANK_BITS) - 1);
                let ahead = g.waiting.partition_point(|(k, _)| *k < key);
                self.projection(group, g, now, ahead)
            }
            None => Projection {
                state: None,
                last: now,
                covers: 0,
            },
        };
        project_one(policy, &mut p, now, cost)
    }

    /// Puts `id` in `group`'s line with a new rank, behind every job of its priority or a
    /// more urgent one; returns its estimated start (the jobs ahead of it started as early
    /// as the policy allows, then it) and its rank (the caller keeps the rank on the job).
    pub(super) fn join_tail(
        &mut self,
        group: &str,
        id: &str,
        now: u64,
        priority: u8,
        cost: u32,
    ) -> (u64, u64) {
        self.seq += 1;
        let rank = self.seq;
        let key = line_key(priority, rank);
        let g = self.groups.entry(group.to_string()).or_default();
        let at = g.waiting.partition_point(|(k, _)| *k < key);
        let g = &self.groups[group];
        let policy = self.config.policy_of(group);
        let mut p = self.projection(group, g, now, at);
        let estimate = project_one(policy, &mut p, now, cost);
        let tail = at == g.waiting.len();
        let g = self.groups.entry(group.to_string()).or_default();
        if tail {
            g.projection = Some(p);
        } else {
            Self::one_more_ahead(g, policy, now, cost);
        }
        g.waiting.insert(at, (key, id.to_string()));
        g.costly += usize::from(cost > 1);
        self.refresh(group);
        (estimate, rank)
    }

    /// The tail's projection when a job costing `cost` joins the line ahead of the tail:
    /// one more step keeps the tail's estimate in step without replaying the line.
    fn one_more_ahead(g: &mut Group, policy: &paceline_core::Policy, now: u64, cost: u32) {
        match &mut g.projection {
            Some(p) if p.covers == g.waiting.len() => {
                project_one(policy, p, now, cost);
            }
            _ => g.projection = None,
        }
    }

    /// Puts `id` back in `group`'s line at its place (a retry, an expired lease, a pause):
    /// ahead of every job of its priority that joined after it.
    pub(super) fn join_head(&mut self, group: &str, id: &str) {
        let (key, cost) = self.jobs.get(id).map_or((0, 1), |j| (j.key(), j.cost));
        let now = self.now;
        let policy = self.config.policy_of(group);
        let g = self.groups.entry(group.to_string()).or_default();
        let at = g.waiting.partition_point(|(k, _)| *k < key);
        Self::one_more_ahead(g, policy, now, cost);
        g.waiting.insert(at, (key, id.to_string()));
        g.costly += usize::from(cost > 1);
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
        // The priority of the group's next job: the ready set it belongs in.
        let level = g.waiting.front().map_or(0, |(key, _)| key_priority(*key));
        if let Some((old_at, order)) = g.ready {
            // A group stays where it is unless it leaves the set, must wait longer (a
            // pause) or its next job's priority changed; moving it for anything else would
            // cost it its turn.
            if !ready || old_at < at || g.level != level {
                self.ready[usize::from(g.level)].remove(&(old_at, order, name.to_string()));
                g.ready = None;
            }
        }
        if ready && g.ready.is_none() {
            self.seq += 1;
            let key = (at.max(now), self.seq);
            self.ready[usize::from(level)].insert((key.0, key.1, name.to_string()));
            g.ready = Some(key);
            g.level = level;
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
            g.costly = 0;
        }
    }
}

//! What callers other than workers see and do: a job, the stats and counts, the dead set
//! (listed, retried, purged), cancelling a job, the next event, and the invariants tests
//! check.

use std::collections::BTreeSet;

use super::records::{key_priority, Place};
#[cfg(doc)]
use super::MAINTENANCE_BATCH;
use super::{active_conflict, QueueCore};
use crate::error::QueueError;
use crate::events::{Event, EventKind};
use crate::job::{GroupStats, JobInfo, JobState, Stats};

impl QueueCore {
    /// Removes a job that is not active (scheduled, waiting, dead or completed).
    pub fn cancel(&mut self, now: u64, id: &str) -> Result<(), QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| QueueError::UnknownJob { id: id.to_string() })?;
        match job.place {
            Place::Active { .. } => return Err(active_conflict(id)),
            Place::Completed { .. } => {
                self.forget_completed(id);
                return Ok(());
            }
            Place::Scheduled { at, order, .. } => {
                self.scheduled.remove(&(at, order, id.to_string()));
            }
            Place::Dead { order, .. } => {
                let group = job.group.clone();
                self.unbury(order, id);
                self.jobs.remove(id);
                self.refresh(&group);
                return Ok(());
            }
            Place::Waiting => {
                if let Some(g) = self.groups.get_mut(&job.group) {
                    let key = job.key();
                    let at = g.waiting.partition_point(|(r, _)| *r < key);
                    if g.waiting.get(at).is_some_and(|(_, w)| w == id) {
                        let before = g.waiting.len();
                        g.waiting.remove(at);
                        if job.cost > 1 {
                            g.costly -= 1;
                        }
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
            Place::Waiting | Place::Dead { .. } | Place::Completed { .. } => {
                (None, None, None, None)
            }
        };
        let finished = match job.place {
            Place::Dead { at, .. } | Place::Completed { at, .. } => Some(at),
            _ => None,
        };
        Some(JobInfo {
            id: id.to_string(),
            group: job.group.clone(),
            state: job.place.state(),
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            last_error: job.last_error.clone(),
            enqueued_at: job.enqueued_at,
            priority: job.priority,
            cost: job.cost,
            progress: job.progress.clone(),
            result: job.result.clone(),
            finished,
            not_before,
            started,
            lease_expires,
            worker,
            payload: job.payload.clone(),
        })
    }

    /// The counts by state, and each group with jobs waiting or active or that is paused.
    pub fn stats(&mut self, now: u64) -> Result<Stats, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let mut groups: Vec<GroupStats> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.waiting.is_empty() || g.active > 0 || g.paused_until > now)
            .map(|(name, g)| GroupStats {
                group: name.clone(),
                waiting: g.waiting.len() as u64,
                active: u64::from(g.active),
                next_eligible: g.ready.map(|(at, _)| at),
                paused_until: (g.paused_until > now).then_some(g.paused_until),
            })
            .collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(Stats {
            scheduled: self.scheduled.len() as u64,
            waiting: groups.iter().map(|g| g.waiting).sum(),
            active: self.leases.len() as u64,
            dead: self.dead.len() as u64,
            completed: self.completed.len() as u64,
            groups,
            totals: self.totals,
            paused_until: self.paused_until(now),
        })
    }

    /// The counts by state and the totals, without the groups: constant work whatever the
    /// queue holds (for metrics, which any scrape may ask for).
    pub fn counts(&mut self, now: u64) -> Result<Stats, QueueError> {
        let now = self.tick(now)?;
        self.maintain(now);
        let (scheduled, active, dead) = (self.scheduled.len(), self.leases.len(), self.dead.len());
        let completed = self.completed.len();
        let held = scheduled + active + dead + completed;
        Ok(Stats {
            scheduled: scheduled as u64,
            waiting: self.jobs.len().saturating_sub(held) as u64,
            active: active as u64,
            dead: dead as u64,
            completed: completed as u64,
            groups: Vec::new(),
            totals: self.totals,
            paused_until: self.paused_until(now),
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
        self.jobs(JobState::Dead, None, offset, limit)
    }

    /// Up to `limit` jobs in `state`, skipping the first `offset`, in the order the queue
    /// keeps them: scheduled ones by when they join their groups, waiting ones by group
    /// name then their place in line (`group`'s only, with `group`), active ones by when
    /// their leases run out, dead ones by death. See
    /// [`check_listing`](crate::job::check_listing) for what may be asked; anything else
    /// lists nothing.
    pub fn jobs(
        &self,
        state: JobState,
        group: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Vec<JobInfo> {
        fn line(g: &super::records::Group) -> Vec<&String> {
            g.waiting.iter().map(|(_, id)| id).collect()
        }
        let ids: Vec<&String> = match (state, group) {
            (JobState::Scheduled, None) => self.scheduled.iter().map(|(_, _, id)| id).collect(),
            (JobState::Active, None) => self.leases.iter().map(|(_, _, id)| id).collect(),
            (JobState::Dead, None) => self.dead.iter().map(|(_, id)| id).collect(),
            (JobState::Completed, None) => self.completed.iter().map(|(_, _, id)| id).collect(),
            (JobState::Waiting, Some(name)) => self.groups.get(name).map(line).unwrap_or_default(),
            (JobState::Waiting, None) => {
                let mut names: Vec<&String> = self.groups.keys().collect();
                names.sort();
                names
                    .into_iter()
                    .flat_map(|n| line(&self.groups[n]))
                    .collect()
            }
            _ => Vec::new(),
        };
        ids.into_iter()
            .skip(offset)
            .take(limit)
            .filter_map(|id| self.job(id))
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
                    Place::Dead { order, .. } => Some((order, id.clone())),
                    _ => None,
                })
                .collect(),
        };
        let mut n = 0;
        for (order, id) in chosen {
            if !self.unbury(order, &id) {
                continue;
            }
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            job.attempts = 0;
            job.place = Place::Waiting;
            let (group, priority, cost) = (job.group.clone(), job.priority, job.cost);
            let (estimate, rank) = self.join_tail(&group, &id, now, priority, cost);
            if let Some(job) = self.jobs.get_mut(&id) {
                job.estimated_start = estimate;
                job.rank = rank;
            }
            self.events
                .push(|| Event::new(EventKind::Retried, now).job(&id, &group).at(now));
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
        self.dead_expiry.clear();
        for (_, id) in &dead {
            self.jobs.remove(id);
        }
        Ok(dead.len())
    }

    /// The earliest time something happens without a call: a group becomes eligible, a
    /// scheduled job is due, or a lease expires. A time at or before the last `now` means
    /// work is due: a group to ask, or due jobs and expired leases beyond what the last
    /// call handled ([`MAINTENANCE_BATCH`]); the next call makes progress on it. `None`:
    /// no job is waiting, scheduled or leased. While the queue is paused, or its own policy
    /// refuses starts, its groups become eligible when that ends; while its concurrency
    /// cap is reached, when a job ends.
    pub fn next_event(&self) -> Option<u64> {
        let ready = self.ready_first_at().map(|at| at.max(self.queue_gate()));
        [
            ready.filter(|_| !self.queue_full_of_leases()),
            self.scheduled.first().map(|s| s.0),
            self.leases.first().map(|l| l.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// How many deduplication keys the queue holds: those whose time to live has not run
    /// out, and those that ran out since the last calls dropped theirs (up to
    /// [`MAINTENANCE_BATCH`] a call).
    pub fn dedup_keys_held(&self) -> usize {
        self.dedup.len()
    }

    /// Checks every internal index against the jobs and groups; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.dedup.len() != self.dedup_expiry.len()
            || self
                .dedup_expiry
                .iter()
                .any(|(t, key)| self.dedup.get(key).is_none_or(|d| d.0 != *t))
        {
            return Err("the deduplication keys and their expiries differ".into());
        }
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
            let mut costly = 0;
            for (key, id) in &g.waiting {
                let job = self
                    .jobs
                    .get(id)
                    .ok_or(format!("{id} waiting but unknown"))?;
                if !matches!(job.place, Place::Waiting) || &job.group != name || job.key() != *key {
                    return Err(format!("{id} in {name}'s line but {:?}", job.place));
                }
                costly += usize::from(job.cost > 1);
            }
            if costly != g.costly {
                return Err(format!(
                    "group {name}: {} costly, should be {costly}",
                    g.costly
                ));
            }
            waiting += g.waiting.len();
            let cap = self.config.group_concurrency;
            let should = !g.waiting.is_empty() && (cap == 0 || g.active < cap);
            let level = usize::from(g.level);
            let is = g
                .ready
                .is_some_and(|(at, o)| self.ready[level].contains(&(at, o, name.clone())));
            if should != is {
                return Err(format!("group {name}: ready {is}, should be {should}"));
            }
            let head = g.waiting.front().map_or(0, |(key, _)| key_priority(*key));
            if is && head != g.level {
                return Err(format!(
                    "group {name}: ready at {}, its next job's {head}",
                    g.level
                ));
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
                Place::Dead { order, .. } => self.dead.contains(&(order, id.clone())),
                Place::Completed { order, until, .. } => {
                    self.completed.contains(&(until, order, id.clone()))
                }
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
            || states(JobState::Completed) != self.completed.len()
            || self.ready.iter().map(BTreeSet::len).sum::<usize>()
                != self.groups.values().filter(|g| g.ready.is_some()).count()
        {
            return Err("an index holds entries of no job".into());
        }
        Ok(())
    }
}

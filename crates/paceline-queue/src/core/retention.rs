//! What the queue keeps of jobs that ended: acknowledged jobs kept readable with their
//! results (`keep_completed`, `keep_completed_for`), the dead set's bounds (`keep_dead`,
//! `keep_dead_for`), and a running job's progress.

use super::records::Place;
use super::{QueueCore, MAINTENANCE_BATCH};
use crate::error::QueueError;

/// The expiry of a kept job with no age bound: 2^52 µs (142 years) after it ended, later
/// than any clock the queue runs on, and exact as a Redis score.
const KEPT_UNTIL_PUSHED_OUT: u64 = 1 << 52;

impl QueueCore {
    /// When a job that ended at `at` is dropped for its age (`age`: the bound, if any).
    fn kept_until(at: u64, age: Option<std::time::Duration>) -> u64 {
        at.saturating_add(age.map_or(KEPT_UNTIL_PUSHED_OUT, paceline_core::round_to_micros))
    }

    /// Job `id`, out of its place, goes to the dead set at `now`; the oldest deaths beyond
    /// `keep_dead` leave the queue.
    pub(super) fn bury(&mut self, id: &str, now: u64) {
        self.seq += 1;
        let order = self.seq;
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        job.place = Place::Dead { order, at: now };
        self.dead.insert((order, id.to_string()));
        if let Some(age) = self.config.keep_dead_for {
            let until = Self::kept_until(now, Some(age));
            self.dead_expiry.insert((until, order, id.to_string()));
        }
        if let Some(most) = self.config.keep_dead {
            while self.dead.len() > most {
                let Some((order, id)) = self.dead.first().cloned() else {
                    break;
                };
                self.forget_dead(order, &id);
            }
        }
    }

    /// Removes dead job `id` (of death `order`) from the dead set and the queue.
    pub(super) fn forget_dead(&mut self, order: u64, id: &str) {
        self.unbury(order, id);
        self.jobs.remove(id);
    }

    /// Takes dead job `id` out of the dead set (a retry); it stays in the queue.
    pub(super) fn unbury(&mut self, order: u64, id: &str) -> bool {
        if !self.dead.remove(&(order, id.to_string())) {
            return false;
        }
        if let Some(Place::Dead { at, .. }) = self.jobs.get(id).map(|j| &j.place) {
            let until = Self::kept_until(*at, self.config.keep_dead_for);
            self.dead_expiry.remove(&(until, order, id.to_string()));
        }
        true
    }

    /// Acknowledged job `id` (out of its lease) ends at `now`: kept readable with `result`
    /// while `keep_completed` allows (the oldest beyond it leave), else gone at once.
    pub(super) fn complete(&mut self, id: &str, now: u64, result: Option<Vec<u8>>) {
        if self.config.keep_completed == 0 {
            self.jobs.remove(id);
            return;
        }
        self.seq += 1;
        let order = self.seq;
        let until = Self::kept_until(now, self.config.keep_completed_for);
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        job.place = Place::Completed {
            order,
            at: now,
            until,
        };
        job.result = result;
        self.completed.insert((until, order, id.to_string()));
        while self.completed.len() > self.config.keep_completed {
            let Some(first) = self.completed.pop_first() else {
                break;
            };
            self.jobs.remove(&first.2);
        }
    }

    /// Removes completed job `id` (a cancel).
    pub(super) fn forget_completed(&mut self, id: &str) {
        if let Some(Place::Completed { order, until, .. }) = self.jobs.get(id).map(|j| &j.place) {
            self.completed.remove(&(*until, *order, id.to_string()));
        }
        self.jobs.remove(id);
    }

    /// Drops the completed and dead jobs whose time to be kept ran out by `now`: at most
    /// [`MAINTENANCE_BATCH`] of each.
    pub(super) fn drop_expired(&mut self, now: u64) {
        for _ in 0..MAINTENANCE_BATCH {
            match self.completed.first() {
                Some(first) if first.0 <= now => {}
                _ => break,
            }
            if let Some(first) = self.completed.pop_first() {
                self.jobs.remove(&first.2);
            }
        }
        for _ in 0..MAINTENANCE_BATCH {
            let Some((until, order, id)) = self.dead_expiry.first().cloned() else {
                break;
            };
            if until > now {
                break;
            }
            self.dead_expiry.remove(&(until, order, id.clone()));
            self.dead.remove(&(order, id.clone()));
            self.jobs.remove(&id);
        }
    }

    /// Records what the worker holding job `id` by lease `token` reports of its progress
    /// (any bytes, at most the queue's `max_payload`): shown by [`job`](Self::job) while the
    /// job runs and after, until its next report.
    pub fn progress(
        &mut self,
        now: u64,
        id: &str,
        token: u64,
        progress: Vec<u8>,
    ) -> Result<(), QueueError> {
        super::check_progress(&progress, self.config.max_payload)?;
        let now = self.tick(now)?;
        self.maintain(now);
        if !self.jobs.contains_key(id) {
            return Err(QueueError::UnknownJob { id: id.to_string() });
        }
        self.held(now, id, token)?;
        if let Some(job) = self.jobs.get_mut(id) {
            job.progress = Some(progress);
        }
        Ok(())
    }
}

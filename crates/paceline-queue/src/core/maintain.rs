//! The work each call does before its own: expired leases, due jobs, idle groups and the
//! kept answers of lease calls, at most [`MAINTENANCE_BATCH`] of each.

use super::records::Place;
use super::{QueueCore, MAINTENANCE_BATCH};
use crate::events::{Event, EventKind};

impl QueueCore {
    /// Expired leases back to their groups, due jobs into theirs, idle groups and expired
    /// deduplication keys dropped: at most [`MAINTENANCE_BATCH`] of each.
    pub(super) fn maintain(&mut self, now: u64) {
        for _ in 0..MAINTENANCE_BATCH {
            let Some(first) = self.dedup_expiry.first().cloned() else {
                break;
            };
            if first.0 > now {
                break;
            }
            self.dedup_expiry.remove(&first);
            if self.dedup.get(&first.1).is_some_and(|d| d.0 == first.0) {
                self.dedup.remove(&first.1);
            }
        }
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
            let (group, priority, cost) = (job.group.clone(), job.priority, job.cost);
            if head {
                self.join_head(&group, &id);
            } else {
                let (_, rank) = self.join_tail(&group, &id, now, priority, cost);
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
        self.drop_expired(now);
    }

    /// A lease ran out: the job goes back to the head of its group, or dies if it has had
    /// all its attempts.
    pub(super) fn lease_expired(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let Place::Active { token, expires, .. } = job.place else {
            return;
        };
        self.leases.remove(&(expires, token, id.to_string()));
        self.totals.lease_expiries += 1;
        let group = job.group.clone();
        let now = self.now;
        self.events.push(|| {
            Event::new(EventKind::LeaseExpired, now)
                .job(id, &group)
                .attempt(job.attempts)
        });
        if let Some(g) = self.groups.get_mut(&group) {
            g.active = g.active.saturating_sub(1);
        }
        if job.attempts >= job.max_attempts {
            self.totals.dead += 1;
            job.last_error = Some(format!(
                "the lease expired on attempt {} of {}",
                job.attempts, job.max_attempts
            ));
            let error = job.last_error.as_deref();
            self.events.push(|| {
                Event::new(EventKind::Dead, now)
                    .job(id, &group)
                    .error(error)
            });
            self.bury(id, self.now);
            self.refresh(&group);
        } else {
            job.place = Place::Waiting;
            self.join_head(&group, id);
        }
    }
}

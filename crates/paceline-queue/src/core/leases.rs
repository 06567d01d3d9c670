//! Leases and their outcomes: a worker's lease call (and its repeat under a request id),
//! the fencing check, and what ack, fail and extend do to a job and its group.

use std::time::Duration;

use paceline_core::{round_to_micros, Op};

use super::records::{Place, Taken};
use super::{check_failure, check_lease_request, cut, max_cost, micros_up, QueueCore};
use crate::error::QueueError;
use crate::events::{Event, EventKind};
use crate::job::{check_lease_length, FailOutcome, Failure, Leased};
use crate::token::LeaseToken;

impl QueueCore {
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
        let lease_us = check_lease_request(&self.config, worker, max_jobs, lease, request)?;
        let now = self.tick(now)?;
        self.maintain(now);
        if let Some(request) = request {
            if let Some((_, taken)) = self.requests.get(request) {
                let taken = taken.clone();
                return Ok(self.replay(now, &taken));
            }
        }
        if self.queue_gate() > now {
            // The queue is paused, or its own policy refused a start until then: nothing
            // starts, nothing is counted.
            return Ok(Vec::new());
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

    /// What a repeat of the lease call `request` answers, taking nothing whether or not a
    /// call took jobs under it: the jobs an earlier call with that id took that its leases
    /// still hold (none if no call did). A queue of several partitions asks each this
    /// before it takes anything for a call that may be a repeat.
    pub(crate) fn replay_request(
        &mut self,
        now: u64,
        request: &str,
    ) -> Result<Vec<Leased>, QueueError> {
        crate::job::check_request_id(request)?;
        let now = self.tick(now)?;
        self.maintain(now);
        match self.requests.get(request) {
            Some((_, taken)) => {
                let taken = taken.clone();
                Ok(self.replay(now, &taken))
            }
            None => Ok(Vec::new()),
        }
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
        while out.len() < max_jobs && !self.queue_full_of_leases() {
            // The most urgent ready set's first group, if it is eligible now; else the
            // next set's.
            let Some((level, first)) = self.ready.iter().enumerate().find_map(|(level, set)| {
                set.first()
                    .filter(|first| first.0 <= now)
                    .map(|first| (level, first.clone()))
            }) else {
                break;
            };
            self.ready[level].remove(&first);
            let name = first.2;
            let policy = self.config.policy_of(&name);
            let Some(g) = self.groups.get_mut(&name) else {
                continue;
            };
            g.ready = None;
            let cost = g
                .waiting
                .front()
                .and_then(|(_, id)| self.jobs.get(id))
                .map_or(1, |j| j.cost);
            if cost > 1 && max_cost(&self.config, &name).is_some_and(|m| u64::from(cost) > m) {
                self.too_costly(&name, cost);
                continue;
            }
            // Kept to undo the group's start if the queue's own policy refuses it.
            let before = self.config.queue_policy.as_ref().map(|_| g.state.clone());
            let decision = match policy.apply(&mut g.state, now, Op::Limit, u64::from(cost)) {
                Ok(d) => d,
                // A cost within the policy's and a checked `now` are valid for every
                // policy; were it not so, the group would be asked again a second later
                // rather than spin.
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
            if let (Some(queue_policy), Some(before)) = (&self.config.queue_policy, before) {
                match queue_policy.apply(&mut self.queue_state, now, Op::Limit, u64::from(cost)) {
                    Ok(d) if d.allowed => {}
                    refused => {
                        // The queue waits; the group keeps its state and its place.
                        let delay = refused.map_or(1_000_000, |d| micros_up(d.delay));
                        self.queue_next_at = now.saturating_add(delay);
                        g.state = before;
                        g.ready = Some((first.0, first.1));
                        self.ready[level].insert((first.0, first.1, name));
                        break;
                    }
                }
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
            if cost > 1 {
                g.costly -= 1;
            }
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
            let attempt = job.attempts;
            self.events.push(|| {
                Event::new(EventKind::Started, now)
                    .job(&id, &name)
                    .attempt(attempt)
                    .worker(worker)
            });
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

    /// Sends the next job of group `name`, which costs `cost`, to the dead set: its group's
    /// policy or the queue's can never admit that cost (a policy changed since it was
    /// enqueued). It costs no attempt and takes nothing of the group's policy.
    fn too_costly(&mut self, name: &str, cost: u32) {
        let Some(g) = self.groups.get_mut(name) else {
            return;
        };
        let Some((_, id)) = g.waiting.pop_front() else {
            return;
        };
        g.costly -= 1;
        if let Some(p) = &mut g.projection {
            p.covers = p.covers.saturating_sub(1);
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            job.last_error = Some(too_costly_error(cost));
            self.totals.dead += 1;
            let (now, error) = (self.now, job.last_error.as_deref());
            self.events
                .push(|| Event::new(EventKind::Dead, now).job(&id, name).error(error));
            self.bury(&id, self.now);
        }
        self.refresh(name);
    }

    /// The job `id` leased with `token`, if that lease is live at `now`; an expired one is
    /// handled on the spot.
    pub(super) fn held(&mut self, now: u64, id: &str, token: u64) -> Result<(), QueueError> {
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

    /// The job is done: it leaves the queue (its id may be used again), or with
    /// [`QueueConfig::keep_completed`](crate::QueueConfig::keep_completed) stays readable
    /// as `completed` for a while.
    pub fn ack(&mut self, now: u64, id: &str, lease: u64) -> Result<(), QueueError> {
        self.ack_with_result(now, id, lease, None)
    }

    /// [`ack`](Self::ack), with what the job produced (any bytes, at most the queue's
    /// `max_payload`), kept with the job while it stays readable as `completed`.
    pub fn ack_with_result(
        &mut self,
        now: u64,
        id: &str,
        lease: u64,
        result: Option<Vec<u8>>,
    ) -> Result<(), QueueError> {
        if let Some(result) = &result {
            super::rules::check_size("result", result, self.config.max_payload)?;
        }
        let now = self.tick(now)?;
        self.maintain(now);
        // A completed job has left the queue as far as its workers go.
        match self.jobs.get(id).map(|j| &j.place) {
            None | Some(Place::Completed { .. }) => {
                return Err(QueueError::UnknownJob { id: id.to_string() })
            }
            Some(_) => {}
        }
        self.held(now, id, lease)?;
        if let Some(group) = self.release(id) {
            self.complete(id, now, result);
            self.totals.acked += 1;
            self.events
                .push(|| Event::new(EventKind::Acked, now).job(id, &group));
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
        let (attempt, error) = (job.attempts, job.last_error.as_deref());
        let event = |kind| Event::new(kind, now).job(id, &group);
        match outcome {
            FailOutcome::Released | FailOutcome::Repeated => {}
            FailOutcome::Dead | FailOutcome::Retrying { .. } => {
                self.events
                    .push(|| event(EventKind::Failed).attempt(attempt).error(error));
                self.events.push(|| match outcome {
                    FailOutcome::Retrying { at } => event(EventKind::Retried).at(at),
                    _ => event(EventKind::Dead).error(error),
                });
            }
            FailOutcome::Paused { until } => {
                // The group's pause as it ends up: a longer one already set stands.
                let ends = self
                    .groups
                    .get(&group)
                    .map_or(until, |g| g.paused_until.max(until));
                self.events.push(|| event(EventKind::Paused).at(ends));
            }
        }
        match outcome {
            FailOutcome::Dead => {
                self.totals.dead += 1;
                self.bury(id, now);
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
}

/// The error kept on a job whose cost its policies can never admit.
fn too_costly_error(cost: u32) -> String {
    format!(
        "its cost, {cost}, is more than its group's policy or the queue's can ever admit \
         (the policy changed since it was enqueued): set a policy that admits it and retry \
         it from the dead set, or purge it"
    )
}

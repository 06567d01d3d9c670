//! The queue's operations: each one call of the queue's function, its arguments encoded
//! and its reply decoded.

use std::time::Duration;

use paceline_core::{InputError, Policy};
use paceline_store::redis::{Reader, Reply};

use super::caller::{arg, queue_policy_args};
use super::decode::{protocol, read_counts, read_job, read_state, reader};
use super::RedisQueue;
use crate::config::{check_group, check_policy};
use crate::core::{
    active_conflict, check_failure, check_lease_request, check_pause, check_size, cost_beyond, cut,
    micros_up, queue_full, PolicySource, MAINTENANCE_BATCH,
};
use crate::error::QueueError;
use crate::job::{
    check_lease_length, check_request_id, Enqueued, FailOutcome, Failure, GroupStats, JobInfo,
    JobState, Leased, NewJob, Stats,
};
use crate::schedule::{Schedule, ScheduleInfo};
use crate::token::LeaseToken;

impl RedisQueue {
    pub(super) async fn enqueue_all(&self, jobs: Vec<NewJob>) -> Vec<Result<Enqueued, QueueError>> {
        let mut answers: Vec<Option<Result<Enqueued, QueueError>>> = Vec::new();
        let mut args = Vec::new();
        let mut sent = 0usize;
        for job in jobs {
            if let Err(e) = job.validate(self.config.max_payload) {
                answers.push(Some(Err(e.into())));
                continue;
            }
            answers.push(None);
            sent += 1;
            args.push(job.id.unwrap_or_default().into_bytes());
            args.push(job.group.into_bytes());
            args.push(job.payload);
            args.push(arg(paceline_core::round_to_micros(job.delay)));
            args.push(job.max_attempts.map(arg).unwrap_or_default());
            args.push(job.not_before.map(arg).unwrap_or_default());
            match job.dedup {
                Some(d) => {
                    args.push(d.key.into_bytes());
                    args.push(arg(paceline_core::round_to_micros(d.ttl)));
                    args.push(arg(u8::from(d.replace)));
                }
                None => args.extend([Vec::new(), Vec::new(), Vec::new()]),
            }
            args.push(arg(job.priority));
            args.push(arg(job.cost));
        }
        if sent > 0 {
            let mut all = vec![arg(sent)];
            all.extend(args);
            let replies = match self.call("enqueue", all).await {
                Ok(reply) => self.read_enqueued(reply, sent),
                Err(e) => Err(e),
            };
            match replies {
                Ok(mut replies) => {
                    replies.reverse();
                    for slot in answers.iter_mut().filter(|a| a.is_none()) {
                        *slot = replies.pop();
                    }
                }
                Err(e) => {
                    for slot in answers.iter_mut().filter(|a| a.is_none()) {
                        *slot = Some(Err(e.clone()));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(InputError::new("jobs", "no answer").into())))
            .collect()
    }

    fn read_enqueued(
        &self,
        reply: Reply,
        count: usize,
    ) -> Result<Vec<Result<Enqueued, QueueError>>, QueueError> {
        let mut r = reader(reply)?;
        r.u64()?;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let status = r.text()?;
            let id = r.text()?;
            match status.as_str() {
                "full" => {
                    r.item()?;
                    let max = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
                    out.push(Err(queue_full(max)));
                }
                "costly" => {
                    let cost = r.u32()?;
                    out.push(Err(cost_beyond(cost, r.u64()?).into()));
                }
                "created" | "exists" | "dedup" => {
                    let state = read_state(&mut r)?;
                    let estimated_start = r.u64()?;
                    out.push(Ok(Enqueued {
                        id,
                        state,
                        created: status == "created",
                        deduplicated: status == "dedup",
                        estimated_start,
                    }));
                }
                other => return Err(protocol(&format!("an unknown enqueue status `{other}`"))),
            }
        }
        Ok(out)
    }

    pub(super) async fn lease_now(
        &self,
        worker: &str,
        max_jobs: usize,
        lease: Option<Duration>,
        request: Option<&str>,
    ) -> Result<Vec<Leased>, QueueError> {
        let lease_us = check_lease_request(&self.config, worker, max_jobs, lease, request)?;
        let reply = self
            .call(
                "lease",
                vec![
                    arg(worker),
                    arg(max_jobs),
                    arg(lease_us),
                    arg(request.unwrap_or("")),
                ],
            )
            .await?;
        Self::leased(reply)
    }

    /// What a repeat of the lease call `request` answers, taking nothing: the `lease`
    /// operation asked for no job (`MAX_JOBS` 0) answers the jobs a call with `request`
    /// took that its leases still hold, and none if no call did.
    pub(super) async fn replay_now(
        &self,
        worker: &str,
        request: &str,
    ) -> Result<Vec<Leased>, QueueError> {
        check_request_id(request)?;
        let lease_us = paceline_core::round_to_micros(self.config.lease);
        let reply = self
            .call(
                "lease",
                vec![arg(worker), arg(0), arg(lease_us), arg(request)],
            )
            .await?;
        Self::leased(reply)
    }

    /// The jobs a `lease` operation answered.
    fn leased(reply: Reply) -> Result<Vec<Leased>, QueueError> {
        let mut r = reader(reply)?;
        r.u64()?;
        let mut jobs = Vec::new();
        while !r.is_empty() {
            jobs.push(Leased {
                id: r.text()?,
                group: r.text()?,
                payload: r.bytes()?,
                attempt: r.u32()?,
                lease: r.u64()?,
                token: LeaseToken::default(),
                started: r.u64()?,
                eligible: r.u64()?,
                lease_expires: r.u64()?,
            });
        }
        Ok(jobs)
    }

    /// An answer of `now` then a status: the status.
    fn status(reply: Reply) -> Result<(String, Reader), QueueError> {
        let mut r = reader(reply)?;
        r.u64()?;
        let status = r.text()?;
        Ok((status, r))
    }

    pub(super) async fn ack_job(
        &self,
        id: &str,
        lease: u64,
        result: Option<&[u8]>,
    ) -> Result<(), QueueError> {
        let mut args = vec![arg(id), arg(lease)];
        if let Some(result) = result {
            check_size("result", result, self.config.max_payload)?;
            args.push(result.to_vec());
        }
        let reply = self.call("ack", args).await?;
        match Self::status(reply)?.0.as_str() {
            "ok" => Ok(()),
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            "gone" => Err(QueueError::UnknownJob { id: id.to_string() }),
            other => Err(protocol(&format!("`ack` with the status `{other}`"))),
        }
    }

    pub(super) async fn report_progress(
        &self,
        id: &str,
        lease: u64,
        progress: &[u8],
    ) -> Result<(), QueueError> {
        check_size("progress", progress, self.config.max_payload)?;
        let reply = self
            .call("progress", vec![arg(id), arg(lease), progress.to_vec()])
            .await?;
        match Self::status(reply)?.0.as_str() {
            "ok" => Ok(()),
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            "gone" => Err(QueueError::UnknownJob { id: id.to_string() }),
            other => Err(protocol(&format!("`progress` with the status `{other}`"))),
        }
    }

    pub(super) async fn fail_job(
        &self,
        id: &str,
        lease: u64,
        failure: Failure,
    ) -> Result<FailOutcome, QueueError> {
        check_failure(&failure)?;
        let (kind, error, after, pause) = match failure {
            Failure::Fatal { error } => ("fatal", error, None, 0),
            Failure::Retry { error, after } => {
                ("retry", error, after.map(paceline_core::round_to_micros), 0)
            }
            Failure::PauseGroup { error, pause } => ("pause", error, None, micros_up(pause)),
            Failure::Release => ("release", None, None, 0),
        };
        let error = cut(error);
        let reply = self
            .call(
                "fail",
                vec![
                    arg(id),
                    arg(lease),
                    arg(kind),
                    arg(u8::from(error.is_some())),
                    error.unwrap_or_default().into_bytes(),
                    after.map(arg).unwrap_or_default(),
                    arg(pause),
                    arg(format!("{:?}", self.random.next())),
                ],
            )
            .await?;
        let (status, mut r) = Self::status(reply)?;
        let at = r.u64()?;
        match status.as_str() {
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            "dead" => Ok(FailOutcome::Dead),
            "retrying" => Ok(FailOutcome::Retrying { at }),
            "paused" => Ok(FailOutcome::Paused { until: at }),
            "released" => Ok(FailOutcome::Released),
            "repeated" => Ok(FailOutcome::Repeated),
            "gone" => Err(QueueError::UnknownJob { id: id.to_string() }),
            other => Err(protocol(&format!("`fail` with the status `{other}`"))),
        }
    }

    pub(super) async fn extend_job(
        &self,
        id: &str,
        lease: u64,
        length: Duration,
    ) -> Result<u64, QueueError> {
        check_lease_length(length)?;
        let reply = self
            .call(
                "extend",
                vec![
                    arg(id),
                    arg(lease),
                    arg(paceline_core::round_to_micros(length)),
                ],
            )
            .await?;
        let (status, mut r) = Self::status(reply)?;
        let expires = r.u64()?;
        match status.as_str() {
            "ok" => Ok(expires),
            "lost" => Err(QueueError::LeaseLost { id: id.to_string() }),
            other => Err(protocol(&format!("`extend` with the status `{other}`"))),
        }
    }

    pub(super) async fn cancel_job(&self, id: &str) -> Result<(), QueueError> {
        let reply = self.call("cancel", vec![arg(id)]).await?;
        match Self::status(reply)?.0.as_str() {
            "ok" => Ok(()),
            "unknown" => Err(QueueError::UnknownJob { id: id.to_string() }),
            "active" => Err(active_conflict(id)),
            other => Err(protocol(&format!("`cancel` with the status `{other}`"))),
        }
    }

    pub(super) async fn pause_work(
        &self,
        group: Option<&str>,
        length: Option<Duration>,
    ) -> Result<u64, QueueError> {
        check_pause(group, length)?;
        let length = length.map_or(Vec::new(), |d| arg(paceline_core::round_to_micros(d)));
        let reply = self
            .call("pause", vec![arg(group.unwrap_or("")), length])
            .await?;
        let mut r = reader(reply)?;
        r.u64()?;
        Ok(r.u64()?)
    }

    pub(super) async fn set_group_policy(
        &self,
        group: &str,
        policy: Option<&Policy>,
    ) -> Result<(), QueueError> {
        check_group(group)?;
        let mut args = vec![arg(group)];
        match policy {
            Some(policy) => {
                check_policy("policy", policy)?;
                let list = queue_policy_args(policy);
                args.push(arg(policy));
                args.push(arg(list.len()));
                args.extend(list);
            }
            None => args.push(Vec::new()),
        }
        self.call("set_policy", args).await?;
        Ok(())
    }

    pub(super) async fn group_policy(
        &self,
        group: &str,
    ) -> Result<(Policy, PolicySource), QueueError> {
        check_group(group)?;
        let mut r = reader(self.call("policy", vec![arg(group)]).await?)?;
        let spec = r.text()?;
        let policy = spec
            .parse()
            .map_err(|_| protocol(&format!("the policy `{spec}`")))?;
        let source = match r.text()?.as_str() {
            "run_time" => PolicySource::RunTime,
            "config" => PolicySource::Config,
            "default" => PolicySource::Default,
            other => return Err(protocol(&format!("the policy source `{other}`"))),
        };
        Ok((policy, source))
    }

    pub(super) async fn keep_schedule(
        &self,
        name: &str,
        schedule: &Schedule,
        next: u64,
    ) -> Result<ScheduleInfo, QueueError> {
        let args = vec![
            arg(name),
            schedule.cron.clone().into_bytes(),
            schedule.timezone.clone().unwrap_or_default().into_bytes(),
            schedule.group.clone().into_bytes(),
            schedule.payload.clone(),
            arg(next),
        ];
        let mut r = reader(self.call("put_schedule", args).await?)?;
        r.u64()?;
        Ok(ScheduleInfo {
            name: name.to_string(),
            schedule: schedule.clone(),
            next: r.u64()?,
        })
    }

    pub(super) async fn kept_schedules(&self) -> Result<Vec<ScheduleInfo>, QueueError> {
        let mut r = reader(self.call("schedules", Vec::new()).await?)?;
        let mut out = Vec::new();
        while !r.is_empty() {
            let name = r.text()?;
            let cron = r.text()?;
            let zone = r.text()?;
            let group = r.text()?;
            let payload = r.bytes()?;
            let next = r.u64()?;
            let mut schedule = Schedule::new(cron, group, payload);
            if !zone.is_empty() {
                schedule = schedule.timezone(zone);
            }
            out.push(ScheduleInfo {
                name,
                schedule,
                next,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub(super) async fn drop_schedule(&self, name: &str) -> Result<bool, QueueError> {
        let mut r = reader(self.call("delete_schedule", vec![arg(name)]).await?)?;
        r.u64()?;
        Ok(r.u64()? == 1)
    }

    pub(super) async fn fire_tick(
        &self,
        name: &str,
        due: u64,
        next: u64,
    ) -> Result<Option<Enqueued>, QueueError> {
        let reply = self
            .call("fire", vec![arg(name), arg(due), arg(next)])
            .await?;
        let answer = {
            let mut r = reader(reply.clone())?;
            r.u64()?;
            r.text()?
        };
        if answer == "none" {
            return Ok(None);
        }
        if answer == "big" {
            let mut r = reader(reply)?;
            let (_, _, size, most) = (r.u64()?, r.text()?, r.u64()?, r.u64()?);
            return Err(InputError::new(
                "payload",
                format!("is {size} bytes; this queue takes at most {most}"),
            )
            .into());
        }
        match self.read_enqueued(reply, 1)?.pop() {
            Some(enqueued) => enqueued.map(Some),
            None => Err(protocol("`fire` without its job")),
        }
    }

    pub(super) async fn resume_work(&self, group: Option<&str>) -> Result<(), QueueError> {
        check_pause(group, None)?;
        self.call("resume", vec![arg(group.unwrap_or(""))]).await?;
        Ok(())
    }

    pub(super) async fn job_info(&self, id: &str) -> Result<Option<JobInfo>, QueueError> {
        let reply = self.call("job", vec![arg(id)]).await?;
        let mut r = reader(reply)?;
        if r.is_empty() {
            return Ok(None);
        }
        read_job(&mut r).map(Some)
    }

    pub(super) async fn read_stats(&self, with_groups: bool) -> Result<Stats, QueueError> {
        let reply = self
            .call(if with_groups { "stats" } else { "counts" }, Vec::new())
            .await?;
        let mut r = reader(reply)?;
        let mut stats = read_counts(&mut r)?;
        while !r.is_empty() {
            stats.groups.push(GroupStats {
                group: r.text()?,
                waiting: r.u64()?,
                active: r.u64()?,
                next_eligible: r.time()?,
                paused_until: r.time()?,
            });
        }
        stats.groups.sort_by(|a, b| a.group.cmp(&b.group));
        if with_groups {
            stats.waiting = stats.groups.iter().map(|g| g.waiting).sum();
        }
        Ok(stats)
    }

    pub(super) async fn list_jobs(
        &self,
        state: JobState,
        group: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<JobInfo>, QueueError> {
        crate::job::check_listing(state, group)?;
        let args = vec![
            arg(state.name()),
            arg(group.unwrap_or("")),
            arg(offset),
            arg(limit),
        ];
        let reply = self.call("jobs", args).await?;
        let mut r = reader(reply)?;
        let mut jobs = Vec::new();
        while !r.is_empty() {
            jobs.push(read_job(&mut r)?);
        }
        Ok(jobs)
    }

    pub(super) async fn retry_dead_jobs(
        &self,
        ids: Option<&[String]>,
    ) -> Result<usize, QueueError> {
        let mut args = vec![arg(u8::from(ids.is_none()))];
        args.extend(
            ids.unwrap_or_default()
                .iter()
                .map(|id| id.clone().into_bytes()),
        );
        // Every dead job goes back in chunks, one call each, so no call holds Redis long.
        let mut total = 0;
        loop {
            let reply = self.call("retry_dead", args.clone()).await?;
            let mut r = reader(reply)?;
            r.u64()?;
            let n = r.u64()?;
            total += usize::try_from(n).unwrap_or(usize::MAX);
            if ids.is_some() || n < MAINTENANCE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    pub(super) async fn purge(&self) -> Result<usize, QueueError> {
        // In chunks, as `retry_dead_jobs`.
        let mut total = 0;
        loop {
            let reply = self.call("purge_dead", Vec::new()).await?;
            let mut r = reader(reply)?;
            let n = r.u64()?;
            total += usize::try_from(n).unwrap_or(usize::MAX);
            if n < MAINTENANCE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    pub(super) async fn next(&self) -> Result<Option<u64>, QueueError> {
        match self.call("next_event", Vec::new()).await?.int() {
            Some(n) => Ok(u64::try_from(n).ok()),
            None => Err(protocol("`next_event` with a non-number")),
        }
    }
}

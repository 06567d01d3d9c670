//! What clients send to the queues: each endpoint's JSON body (an object of at most
//! [`MAX_QUEUE_BODY`] bytes, whose unknown fields are refused), and the checks of its
//! fields. Times are milliseconds: durations from now, and `not_before_ms` a Unix time.

use std::marker::PhantomData;
use std::time::Duration;

use paceline_core::{InputError, Policy};
use paceline_queue::schedule::Schedule;
use paceline_queue::{Failure, LeaseToken, NewJob};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;

use crate::error::ApiError;
use crate::extract::JsonSchema;
use crate::fields::number_field;
use crate::request;

/// The largest body of a queue request, a batch's included (a job's payload is at most
/// 16 MiB).
pub(super) const MAX_QUEUE_BODY: usize = 17 * 1024 * 1024;
/// The most jobs in one enqueue batch.
pub const MAX_ENQUEUE_BATCH: usize = 1_000;

/// 365 days, in milliseconds.
const MAX_DELAY_MS: f64 = paceline_queue::job::MAX_DELAY.as_secs() as f64 * 1000.0;
/// The latest not-before time the API reads, in Unix milliseconds (the last time the clock
/// supports); the queue holds a job back at most `MAX_DELAY`.
const MAX_NOT_BEFORE_MS: f64 = paceline_core::policy::MAX_NOW_US as f64 / 1000.0;
/// The longest lease, in milliseconds.
const MAX_LEASE_MS: f64 = paceline_queue::config::MAX_LEASE.as_secs() as f64 * 1000.0;
/// The longest group pause, in milliseconds.
const MAX_PAUSE_MS: f64 = paceline_queue::core::MAX_PAUSE.as_secs() as f64 * 1000.0;
/// The longest policy spec a group's policy may be set to, in bytes (its errors quote it).
const MAX_SPEC: usize = 1_024;
/// The longest a lease call may wait, in milliseconds.
const MAX_WAIT_MS: f64 = paceline_queue::queue::MAX_LEASE_WAIT.as_secs() as f64 * 1000.0;

/// A queue endpoint's body: a JSON object read into `T`.
pub(super) struct Object<T>(PhantomData<fn() -> T>);

impl<T: DeserializeOwned> JsonSchema for Object<T> {
    const LIMIT: usize = MAX_QUEUE_BODY;
    type Value<'a> = T;

    fn read(json: &str) -> Result<T, ApiError> {
        Ok(request::object(json, "a JSON object", &[])?)
    }
}

/// `POST /v1/queues/{queue}/jobs/batch`'s body: an array of at most [`MAX_ENQUEUE_BATCH`]
/// jobs, each as written, to be read on its own.
pub(super) enum JobsArray {}

impl JsonSchema for JobsArray {
    const LIMIT: usize = MAX_QUEUE_BODY;
    type Value<'a> = Vec<&'a RawValue>;

    fn read(json: &str) -> Result<Vec<&RawValue>, ApiError> {
        let items = request::array(
            json,
            "a JSON array of jobs: [{\"group\", \"payload\"}, ...]",
        )?;
        if items.len() > MAX_ENQUEUE_BATCH {
            return Err(ApiError::invalid(
                "body",
                format!(
                    "{} jobs; at most {MAX_ENQUEUE_BATCH} per batch",
                    items.len()
                ),
            ));
        }
        Ok(items)
    }
}

/// A job to enqueue, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnqueueBody {
    group: Option<String>,
    payload: Option<Box<RawValue>>,
    id: Option<String>,
    delay_ms: Option<Number>,
    not_before_ms: Option<Number>,
    max_attempts: Option<u64>,
    dedup: Option<DedupBody>,
}

/// A job's deduplication, as sent: `{"key", "ttl_ms", "replace"?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DedupBody {
    key: Option<String>,
    ttl_ms: Option<Number>,
    replace: Option<bool>,
}

impl EnqueueBody {
    /// One job of a batch, read on its own: a bad one is its own error.
    pub(super) fn read(raw: &RawValue) -> Result<NewJob, ApiError> {
        request::object::<EnqueueBody>(raw.get(), "a JSON object", &[])
            .map_err(ApiError::from)
            .and_then(EnqueueBody::into_job)
    }

    /// The job to enqueue, its fields checked.
    pub(super) fn into_job(self) -> Result<NewJob, ApiError> {
        let group = self.group.ok_or_else(|| {
            ApiError::invalid(
                "group",
                "is required: the group whose policy limits the job",
            )
        })?;
        let payload = self
            .payload
            .map_or_else(|| b"null".to_vec(), |p| p.get().as_bytes().to_vec());
        let mut job = NewJob::new(group, payload);
        if let Some(id) = self.id {
            job = job.id(id);
        }
        if let Some(delay) = millis("delay_ms", self.delay_ms.as_ref(), MAX_DELAY_MS)? {
            job = job.delay(delay);
        }
        // Unix milliseconds; how far ahead of the queue's clock is the queue's to check.
        if let Some(at) = millis(
            "not_before_ms",
            self.not_before_ms.as_ref(),
            MAX_NOT_BEFORE_MS,
        )? {
            job = job.not_before(std::time::UNIX_EPOCH + at);
        }
        if let Some(n) = self.max_attempts {
            let n = u32::try_from(n)
                .map_err(|_| ApiError::invalid("max_attempts", "must be from 1 to 1000"))?;
            job = job.max_attempts(n);
        }
        if let Some(d) = self.dedup {
            let key = d.key.ok_or_else(|| {
                ApiError::invalid("dedup.key", "is required: the key jobs are deduplicated by")
            })?;
            let ttl =
                millis("dedup.ttl_ms", d.ttl_ms.as_ref(), MAX_DELAY_MS)?.ok_or_else(|| {
                    ApiError::invalid(
                        "dedup.ttl_ms",
                        "is required: how long the key holds, 1 to 31536000000 ms",
                    )
                })?;
            job = if d.replace.unwrap_or(false) {
                job.debounce(key, ttl)
            } else {
                job.dedup(key, ttl)
            };
        }
        Ok(job)
    }
}

/// A lease call, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LeaseBody {
    worker: Option<String>,
    request_id: Option<String>,
    max_jobs: Option<u64>,
    lease_ms: Option<Number>,
    wait_ms: Option<Number>,
}

/// A lease call, its fields checked.
pub(super) struct LeaseCall {
    /// Who leases the jobs.
    pub(super) worker: String,
    /// The most jobs to lease (1 unless given).
    pub(super) max_jobs: usize,
    /// How long the jobs are leased (the queue's `lease` unless given).
    pub(super) lease: Option<Duration>,
    /// How long to wait for a job when none can start now.
    pub(super) wait: Duration,
    /// The client's id of the call: the same id leases the same jobs again.
    pub(super) request_id: Option<String>,
}

impl LeaseBody {
    /// The call, its fields checked.
    pub(super) fn check(self) -> Result<LeaseCall, ApiError> {
        let worker = self
            .worker
            .ok_or_else(|| ApiError::invalid("worker", "is required: a name for the worker"))?;
        let max_jobs = match self.max_jobs {
            None => 1,
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let lease = millis("lease_ms", self.lease_ms.as_ref(), MAX_LEASE_MS)?;
        let wait = millis("wait_ms", self.wait_ms.as_ref(), MAX_WAIT_MS)?.unwrap_or(Duration::ZERO);
        Ok(LeaseCall {
            worker,
            max_jobs,
            lease,
            wait,
            request_id: self.request_id,
        })
    }
}

/// An acknowledgement, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AckBody {
    lease: Option<String>,
}

impl AckBody {
    /// The lease the job was leased with.
    pub(super) fn lease(&self) -> Result<LeaseToken, ApiError> {
        token(self.lease.as_deref())
    }
}

/// A failure, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FailBody {
    lease: Option<String>,
    error: Option<String>,
    retry_after_ms: Option<Number>,
    pause_group_ms: Option<Number>,
    fatal: Option<bool>,
}

impl FailBody {
    /// The lease the job was leased with, and what failed.
    pub(super) fn check(self) -> Result<(LeaseToken, Failure), ApiError> {
        let lease = token(self.lease.as_deref())?;
        let retry_after = millis("retry_after_ms", self.retry_after_ms.as_ref(), MAX_DELAY_MS)?;
        let pause = millis("pause_group_ms", self.pause_group_ms.as_ref(), MAX_PAUSE_MS)?;
        let failure =
            Failure::from_parts(self.error, self.fatal.unwrap_or(false), retry_after, pause)
                .map_err(|e| ApiError::input(&e))?;
        Ok((lease, failure))
    }
}

/// An extension of a job's lease, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExtendBody {
    lease: Option<String>,
    lease_ms: Option<Number>,
}

impl ExtendBody {
    /// The lease the job was leased with, and its new length (the queue's `lease` unless
    /// given).
    pub(super) fn check(&self) -> Result<(LeaseToken, Option<Duration>), ApiError> {
        let lease = token(self.lease.as_deref())?;
        let length = millis("lease_ms", self.lease_ms.as_ref(), MAX_LEASE_MS)?;
        Ok((lease, length))
    }
}

/// The dead list's query: `?offset=0&limit=100`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeadQuery {
    pub(super) offset: Option<usize>,
    pub(super) limit: Option<usize>,
}

/// Dead jobs to retry, as sent: these ids, or all of them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryBody {
    pub(super) ids: Option<Vec<String>>,
}

/// `PUT .../groups/{group}/policy`'s body: `{"policy": "SPEC"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyBody {
    policy: Option<String>,
}

impl PolicyBody {
    /// The policy the body names; errors name `policy` (or `policy.FIELD` of its spec).
    pub(super) fn policy(&self) -> Result<Policy, ApiError> {
        let spec = self.policy.as_deref().ok_or_else(|| {
            ApiError::invalid(
                "policy",
                "is required: a policy spec, e.g. \"fixed_window:limit=10,window=10s\"",
            )
        })?;
        if spec.len() > MAX_SPEC {
            return Err(ApiError::invalid(
                "policy",
                format!(
                    "is {} bytes; a policy spec is at most {MAX_SPEC}",
                    spec.len()
                ),
            ));
        }
        spec.parse().map_err(|e: InputError| {
            ApiError::invalid(format!("policy.{}", e.field()), e.message().to_string())
        })
    }
}

/// `PUT .../schedules/{name}`'s body: `{"cron", "group", "payload"?, "timezone"?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleBody {
    cron: Option<String>,
    group: Option<String>,
    payload: Option<Box<RawValue>>,
    timezone: Option<String>,
}

impl ScheduleBody {
    /// The schedule the body describes (its cron expression and time zone checked by the
    /// queue).
    pub(super) fn schedule(self) -> Result<Schedule, ApiError> {
        let cron = self.cron.ok_or_else(|| {
            ApiError::invalid(
                "cron",
                "is required: a cron expression, e.g. \"0 3 * * *\" (five fields, or six with seconds first)",
            )
        })?;
        let group = self.group.ok_or_else(|| {
            ApiError::invalid("group", "is required: the group of the jobs it enqueues")
        })?;
        let payload = self
            .payload
            .map_or_else(|| b"null".to_vec(), |p| p.get().as_bytes().to_vec());
        let mut schedule = Schedule::new(cron, group, payload);
        if let Some(zone) = self.timezone {
            schedule = schedule.timezone(zone);
        }
        Ok(schedule)
    }
}

/// `POST .../pause`'s body: `{"ms"?}`, a pause of that many milliseconds, or no body (or
/// no `ms`): until resumed.
pub(super) enum PauseSchema {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    ms: Option<Number>,
}

impl JsonSchema for PauseSchema {
    const LIMIT: usize = 64 * 1024;
    type Value<'a> = Option<Duration>;

    fn read(json: &str) -> Result<Option<Duration>, ApiError> {
        if json.trim().is_empty() {
            return Ok(None);
        }
        let body: PauseBody = request::object(json, "a JSON object: {\"ms\"?}, or no body", &[])?;
        // 0 reads, and is refused by the queue with the range it takes.
        millis("ms", body.ms.as_ref(), MAX_DELAY_MS)
    }
}

/// A number of milliseconds from 0 to `max_ms`, named `field`.
fn millis(field: &str, n: Option<&Number>, max_ms: f64) -> Result<Option<Duration>, ApiError> {
    number_field(
        n,
        field,
        &format!("use milliseconds from 0 to {max_ms}"),
        |n| {
            n.as_f64()
                .filter(|ms| (0.0..=max_ms).contains(ms))
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        },
    )
}

/// A lease token: the string a lease answered. One that parses but that this queue did
/// not sign for the job is answered by the queue as a lost lease (`409`), like any lease
/// that is no longer the job's.
fn token(lease: Option<&str>) -> Result<LeaseToken, ApiError> {
    let lease = lease.ok_or_else(|| {
        ApiError::invalid(
            "lease",
            "is required: the `lease` string the job was leased with",
        )
    })?;
    lease
        .parse()
        .map_err(|e: paceline_queue::token::NotAToken| ApiError::invalid("lease", e.to_string()))
}

//! What clients send to the queues: each endpoint's JSON body (an object of at most
//! [`MAX_QUEUE_BODY`] bytes, whose unknown fields are refused), and the checks of its
//! fields. Times are milliseconds: durations from now, and `not_before_ms` a Unix time.

use std::marker::PhantomData;
use std::time::Duration;

use paceline_core::{InputError, Policy};
use paceline_queue::job::{MAX_COST, MAX_PRIORITY};
use paceline_queue::schedule::Schedule;
use paceline_queue::{Failure, LeaseToken, NewJob};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::extract::JsonSchema;
use crate::fields::{number_field, whole};
use crate::request;

/// The largest body of a queue request, a batch's included (a job's payload is at most
/// 16 MiB).
pub(super) const MAX_QUEUE_BODY: usize = 17 * 1024 * 1024;
/// The most jobs in one enqueue batch.
pub const MAX_ENQUEUE_BATCH: usize = 1_000;

/// 365 days, in milliseconds.
const MAX_DELAY_MS: f64 = paceline_queue::job::MAX_DELAY.as_secs() as f64 * 1000.0;
/// The latest not-before time the API reads, in Unix milliseconds (the queue's last time,
/// in the year 2255).
const MAX_NOT_BEFORE_MS: f64 = (paceline_queue::job::MAX_NOT_BEFORE / 1000) as f64;
/// The longest lease, in milliseconds.
const MAX_LEASE_MS: f64 = paceline_queue::config::MAX_LEASE.as_secs() as f64 * 1000.0;
/// The longest group pause, in milliseconds.
const MAX_PAUSE_MS: f64 = paceline_queue::core::MAX_PAUSE.as_secs() as f64 * 1000.0;
/// The longest policy spec a group's policy may be set to, in bytes (its errors quote it).
const MAX_SPEC: usize = 1_024;
/// The longest a lease call over HTTP may wait for a job, in milliseconds: 5 s, shorter
/// than the timeouts HTTP clients and proxies put on an answer (10 s and more), so that a
/// long poll ends with the service's answer, never a client's timeout; a worker calls
/// again. (The library's own calls, in process, may wait up to `MAX_LEASE_WAIT`.)
pub(crate) const MAX_WAIT_MS: f64 = 5_000.0;

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
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = EnqueueRequest, example = json!({"group": "guild:42", "payload": {"user": 7, "role": 3}}))]
pub(super) struct EnqueueBody {
    /// The group whose policy limits when the job starts: 1 to 256 bytes, no control
    /// characters.
    #[schema(value_type = String, required = true, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    group: Option<String>,
    /// Any JSON; `null` when absent.
    #[schema(value_type = Option<serde_json::Value>)]
    payload: Option<Box<RawValue>>,
    /// The job's id (1 to 128 bytes of `A-Z a-z 0-9 - _ . :`, not all digits: those are
    /// the ids the queue gives); enqueuing the same id again answers the job already
    /// enqueued.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]*[A-Za-z._:-][A-Za-z0-9._:-]*$",
        min_length = 1,
        max_length = 128
    )]
    id: Option<String>,
    /// Start no sooner than this many ms from now (at most a year).
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 31_536_000_000.0)]
    delay_ms: Option<Number>,
    /// Start no sooner than this Unix time, in ms.
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 9_007_199_254_740.0)]
    not_before_ms: Option<Number>,
    /// How many times the job is tried before it is dead.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000)]
    max_attempts: Option<Number>,
    /// Deduplication (or, with `replace`, debounce) by a key for a time.
    #[schema(value_type = Option<DedupBody>)]
    dedup: Option<DedupBody>,
    /// How urgent the job is: 0 (the default) starts first, 9 last; within its group's
    /// limit, never past it.
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 9)]
    priority: Option<Number>,
    /// What each start of the job counts against its group's and the queue's policies
    /// (1 by default); at most what those policies can ever admit.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1_000_000)]
    cost: Option<Number>,
}

/// A job's deduplication, as sent: `{"key", "ttl_ms", "replace"?}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Dedup)]
struct DedupBody {
    /// The key jobs are deduplicated by: 1 to 256 bytes, no control characters.
    #[schema(value_type = String, required = true, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    key: Option<String>,
    /// How long the key holds, in ms (at most a year).
    #[schema(value_type = f64, required = true, minimum = 1, maximum = 31_536_000_000.0)]
    ttl_ms: Option<Number>,
    /// Debounce: a new job under a held key replaces the waiting one.
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
        let attempts = number_field(
            self.max_attempts.as_ref(),
            "max_attempts",
            "must be from 1 to 1000",
            |n| whole(n).and_then(|n| u32::try_from(n).ok()),
        )?;
        if let Some(n) = attempts {
            job = job.max_attempts(n);
        }
        let priority = number_field(
            self.priority.as_ref(),
            "priority",
            &format!("must be from 0 (the most urgent, the default) to {MAX_PRIORITY}"),
            |n| {
                whole(n)
                    .and_then(|p| u8::try_from(p).ok())
                    .filter(|p| *p <= MAX_PRIORITY)
            },
        )?;
        if let Some(p) = priority {
            job = job.priority(p);
        }
        let cost = number_field(
            self.cost.as_ref(),
            "cost",
            &format!("must be from 1 (the default) to {MAX_COST}"),
            |n| {
                whole(n)
                    .and_then(|c| u32::try_from(c).ok())
                    .filter(|c| (1..=MAX_COST).contains(c))
            },
        )?;
        if let Some(c) = cost {
            job = job.cost(c);
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
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = QueueLeaseRequest, example = json!({"worker": "worker-1", "max_jobs": 10, "lease_ms": 30000, "wait_ms": 0}))]
pub(super) struct LeaseBody {
    /// A name for the worker: 1 to 128 bytes, no control characters.
    #[schema(value_type = String, required = true, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,128}$")]
    worker: Option<String>,
    /// Retrying a call with the same id answers the jobs it leased: 1 to 128 bytes of
    /// `A-Z a-z 0-9 - _ . :`.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    request_id: Option<String>,
    /// The most jobs to lease: 1 (the default) to 1000.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000)]
    max_jobs: Option<Number>,
    /// How long the leases last, in ms (1 ms to a day); the queue's `lease` by default.
    #[schema(value_type = Option<f64>, minimum = 1, maximum = 86_400_000)]
    lease_ms: Option<Number>,
    /// How long to wait for a job when none may start now, in ms (at most 5 s: call again
    /// to wait longer); 0 by default.
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 5_000)]
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
        // Out of range, the queue says what it takes.
        let max_jobs = match self.max_jobs.as_ref() {
            None => 1,
            Some(n) => number_field(Some(n), "max_jobs", "must be from 1 to 1000", whole)?
                .map_or(1, |n| usize::try_from(n).unwrap_or(usize::MAX)),
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
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AckRequest)]
pub(super) struct AckBody {
    /// The `lease` the job was leased with.
    #[schema(value_type = String, required = true, pattern = "^[0-9a-fA-F]{48}$")]
    lease: Option<String>,
    /// What the job produced (any JSON): kept with it while the queue keeps completed jobs
    /// (`keep_completed`), shown as its `result`.
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<Box<RawValue>>,
}

impl AckBody {
    /// The lease the job was leased with.
    pub(super) fn lease(&self) -> Result<LeaseToken, ApiError> {
        token(self.lease.as_deref())
    }

    /// The result, as the JSON text sent.
    pub(super) fn result(&self) -> Option<&[u8]> {
        self.result.as_deref().map(|r| r.get().as_bytes())
    }
}

/// A progress report, as sent: `{"lease", "progress"}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ProgressRequest)]
pub(super) struct ProgressBody {
    /// The `lease` the job was leased with.
    #[schema(value_type = String, required = true, pattern = "^[0-9a-fA-F]{48}$")]
    lease: Option<String>,
    /// How far the job has got (any JSON): shown as the job's `progress`.
    #[schema(value_type = serde_json::Value, required = true)]
    progress: Option<Box<RawValue>>,
}

impl ProgressBody {
    /// The lease, and the report as the JSON text sent.
    pub(super) fn read(&self) -> Result<(LeaseToken, &[u8]), ApiError> {
        let lease = token(self.lease.as_deref())?;
        let progress = self.progress.as_deref().ok_or_else(|| {
            ApiError::invalid(
                "progress",
                "is required: any JSON saying how far the job has got",
            )
        })?;
        Ok((lease, progress.get().as_bytes()))
    }
}

/// A failure, as sent.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = FailRequest)]
pub(super) struct FailBody {
    /// The `lease` the job was leased with.
    #[schema(value_type = String, required = true, pattern = "^[0-9a-fA-F]{48}$")]
    lease: Option<String>,
    /// What went wrong, kept as the job's `last_error`.
    error: Option<String>,
    /// Retry no sooner than this many ms from now (in place of the queue's backoff; at
    /// most a year).
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 31_536_000_000.0)]
    retry_after_ms: Option<Number>,
    /// Pause the job's whole group for this many ms (an upstream's 429): the job keeps
    /// its place and costs no attempt (1 µs to a day; not with `retry_after_ms`).
    #[schema(value_type = Option<f64>, minimum = 0.001, maximum = 86_400_000)]
    pause_group_ms: Option<Number>,
    /// The job is dead at once, whatever attempts it has left.
    fatal: Option<bool>,
    /// Hand the job back: it keeps its place at the head of its group and costs no attempt
    /// (a worker shutting down before it started the work); nothing else with it.
    release: Option<bool>,
}

impl FailBody {
    /// The lease the job was leased with, and what failed.
    pub(super) fn check(self) -> Result<(LeaseToken, Failure), ApiError> {
        let lease = token(self.lease.as_deref())?;
        if self.release == Some(true) {
            let others = self.error.is_some()
                || self.retry_after_ms.is_some()
                || self.pause_group_ms.is_some()
                || self.fatal.is_some();
            if others {
                return Err(ApiError::invalid(
                    "release",
                    "hands the job back as it is: send it without error, retry_after_ms, \
                     pause_group_ms or fatal",
                ));
            }
            return Ok((lease, Failure::Release));
        }
        let retry_after = millis("retry_after_ms", self.retry_after_ms.as_ref(), MAX_DELAY_MS)?;
        let pause = millis("pause_group_ms", self.pause_group_ms.as_ref(), MAX_PAUSE_MS)?;
        let failure =
            Failure::from_parts(self.error, self.fatal.unwrap_or(false), retry_after, pause)
                .map_err(|e| ApiError::input(&e))?;
        Ok((lease, failure))
    }
}

/// An extension of a job's lease, as sent.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = JobExtendRequest)]
pub(super) struct ExtendBody {
    /// The `lease` the job was leased with.
    #[schema(value_type = String, required = true, pattern = "^[0-9a-fA-F]{48}$")]
    lease: Option<String>,
    /// The lease lives this many ms from now (1 ms to a day); the queue's `lease` by
    /// default.
    #[schema(value_type = Option<f64>, minimum = 1, maximum = 86_400_000)]
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
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DeadQuery {
    /// How many dead jobs to skip, oldest first.
    #[serde(default, deserialize_with = "saturating")]
    #[param(value_type = Option<u64>, minimum = 0)]
    pub(super) offset: Option<usize>,
    /// How many to list: 1 to 1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    pub(super) limit: Option<usize>,
}

/// A listing's query: `?state=waiting&group=G&offset=0&limit=100`.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct JobsQuery {
    /// `scheduled`, `waiting`, `active`, `dead` or `completed`.
    #[param(value_type = String, required = true, pattern = "^(scheduled|waiting|active|dead|completed)$")]
    pub(super) state: Option<String>,
    /// Waiting jobs only: this group's line (1 to 256 bytes, no control characters).
    #[param(pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    pub(super) group: Option<String>,
    /// How many to skip, in the order the queue keeps them.
    #[serde(default, deserialize_with = "saturating")]
    #[param(value_type = Option<u64>, minimum = 0)]
    pub(super) offset: Option<usize>,
    /// How many to list: 1 to 1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    pub(super) limit: Option<usize>,
}

/// An offset as a query has it: a whole number from 0, any number of digits (one past the
/// last job lists none).
fn saturating<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let text = String::deserialize(d)?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(serde::de::Error::custom(format!(
            "`{text}` is not a whole number from 0"
        )));
    }
    Ok(Some(text.parse().unwrap_or(usize::MAX)))
}

/// Dead jobs to retry, as sent: these ids, or all of them.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RetryDeadRequest)]
pub(super) struct RetryBody {
    /// The dead jobs to retry; every one when absent.
    pub(super) ids: Option<Vec<String>>,
}

/// `PUT .../groups/{group}/policy`'s body: `{"policy": "SPEC"}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = GroupPolicyRequest, example = json!({"policy": "fixed_window:limit=10,window=10s"}))]
pub(super) struct PolicyBody {
    /// A rate policy's spec, at most 1024 bytes (else a `400` naming `policy` or the
    /// spec's field): any algorithm but `concurrency`; the pattern is the part of the
    /// grammar this document vouches for (`gcra`, `fixed_window`, `sliding_window`).
    #[schema(value_type = String, required = true, max_length = 1024, pattern = "^(gcra:rate=[1-9][0-9]{0,3}/(s|m|h),burst=[1-9][0-9]{0,3}|(fixed_window|sliding_window):limit=[1-9][0-9]{0,3},window=[1-9][0-9]{0,2}(ms|s|m|h))$")]
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
            let field = format!("policy.{}", e.field());
            ApiError::input(&e.renamed(field))
        })
    }
}

/// `PUT .../schedules/{name}`'s body: `{"cron", "group", "payload"?, "timezone"?}`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ScheduleRequest, example = json!({"cron": "0 3 * * *", "group": "nightly", "payload": {"report": "daily"}, "timezone": "Europe/Paris"}))]
pub(super) struct ScheduleBody {
    /// A cron expression: five fields (minute hour day month weekday), or six with seconds
    /// first, that fires again after now (else a `400` naming `cron`). Ranges, lists and
    /// days past the 28th are taken too; the pattern is the part of cron that always fires.
    #[schema(value_type = String, required = true, max_length = 256, pattern = "^((\\*(/[1-9])?|[1-5]?[0-9]) )?(\\*(/[1-9])?|[1-5]?[0-9]) (\\*(/[1-9])?|1?[0-9]|2[0-3]) (\\*|[1-9]|1[0-9]|2[0-8]) (\\*|[1-9]|1[0-2]) (\\*|[0-6])$")]
    cron: Option<String>,
    /// The group of the jobs it enqueues.
    #[schema(value_type = String, required = true, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    group: Option<String>,
    /// The jobs' payload, any JSON; `null` when absent.
    #[schema(value_type = Option<serde_json::Value>)]
    payload: Option<Box<RawValue>>,
    /// An IANA time zone's name; UTC by default.
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PauseRequest)]
pub(super) struct PauseBody {
    /// How long the pause lasts, in ms (1 ms to a year); until resumed when absent (or
    /// with no body).
    #[schema(value_type = Option<f64>, minimum = 1, maximum = 31_536_000_000.0)]
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

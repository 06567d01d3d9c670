//! What the queues answer: jobs, leased jobs, counts, and the entries of an enqueue batch.
//!
//! Times (`*_ms`) are Unix milliseconds on the queue's clock. A job's payload goes out as
//! the JSON text it came in as, never parsed again: whatever enqueue accepted (any depth,
//! any number), a lease or a listing hands back.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use paceline_queue::core::UNTIL_RESUMED;
use paceline_queue::schedule::ScheduleInfo;
use paceline_queue::{Enqueued, JobInfo, Leased, QueueError, Stats};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::units::unix_ms;

/// A queue error as the API answers it.
impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> ApiError {
        const LOST: &str = "this lease is not the job's current one (it expired, or the job \
                            was already acknowledged or failed); stop working on it";
        const UNKNOWN: &str = "in this queue (acknowledged, cancelled, purged or never enqueued)";
        match e {
            // The core's not-before bound depends on the queue's clock: its field is the
            // API's in milliseconds.
            QueueError::Input(e) if e.field() == "not_before" => {
                ApiError::input(&e.renamed("not_before_ms"))
            }
            // The core names the fields the API has (the delay is checked as `delay_ms`
            // before).
            QueueError::Input(e) => ApiError::input(&e),
            QueueError::LeaseLost { id } => {
                ApiError::new(ErrorCode::LeaseLost, "lease", format!("job `{id}`: {LOST}"))
            }
            QueueError::UnknownJob { id } => ApiError::new(
                ErrorCode::UnknownJob,
                "id",
                format!("no job `{id}` {UNKNOWN}"),
            ),
            QueueError::Conflict { id, state, message } => ApiError::new(
                ErrorCode::Conflict,
                "id",
                format!("job `{id}` is {state}: {message}"),
            ),
            QueueError::Store(e) => ApiError::from(paceline_store::Error::Store(e)),
            other => ApiError::new(ErrorCode::Internal, "queue", other.to_string()),
        }
    }
}

/// A job enqueued (`201`), or found enqueued already under its id (`200`); its estimated
/// start is `null` in a group paused until resumed.
#[derive(Serialize, ToSchema)]
#[schema(as = Enqueued)]
pub(super) struct EnqueuedBody<'a> {
    id: &'a str,
    /// `waiting`, `scheduled`, `active`, ...: the job's state now.
    #[schema(value_type = String)]
    state: &'static str,
    /// When the job is expected to start, in Unix ms; `null` while its group or queue
    /// is paused until resumed.
    estimated_start_ms: Option<u64>,
    /// Present, and true, only for a job deduplicated against an earlier one (`id`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    deduplicated: bool,
}

/// The status and body of an enqueued job.
pub(super) fn enqueued(e: &Enqueued) -> (StatusCode, EnqueuedBody<'_>) {
    let status = if e.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (
        status,
        EnqueuedBody {
            id: &e.id,
            state: e.state.name(),
            estimated_start_ms: (e.estimated_start != UNTIL_RESUMED)
                .then(|| unix_ms(e.estimated_start)),
            deduplicated: e.deduplicated,
        },
    )
}

/// One job's entry in an enqueue batch's answer, with its own status (fields in the order
/// JSON objects print).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = EnqueueBatchEntry)]
pub(super) enum BatchEntry<'a> {
    Enqueued {
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        #[schema(required = false)]
        deduplicated: bool,
        estimated_start_ms: Option<u64>,
        id: &'a str,
        #[schema(value_type = String)]
        state: &'static str,
        status: u16,
    },
    Refused {
        error: ErrorBody<'a>,
        status: u16,
    },
}

impl<'a> BatchEntry<'a> {
    /// The entry of a job enqueued, or of one refused.
    pub(super) fn new(answer: &'a Result<Enqueued, ApiError>) -> BatchEntry<'a> {
        match answer {
            Ok(e) => {
                let (status, body) = enqueued(e);
                BatchEntry::Enqueued {
                    deduplicated: body.deduplicated,
                    estimated_start_ms: body.estimated_start_ms,
                    id: body.id,
                    state: body.state,
                    status: status.as_u16(),
                }
            }
            Err(e) => BatchEntry::Refused {
                error: e.body(),
                status: e.status().as_u16(),
            },
        }
    }
}

/// A payload as JSON: the JSON it was enqueued as, or (bytes a Rust producer gave that are
/// not JSON) a string of them.
fn payload(bytes: &[u8]) -> Box<RawValue> {
    let as_json = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| RawValue::from_string(text.to_string()).ok());
    as_json.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(bytes);
        // A JSON string always serialises.
        serde_json::value::to_raw_value(&text).unwrap_or_default()
    })
}

/// A leased job as the API answers it.
#[derive(Serialize, ToSchema)]
#[schema(as = LeasedJob)]
pub(super) struct LeasedBody<'a> {
    id: &'a str,
    group: &'a str,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    attempt: u32,
    lease: &'a str,
    fence: u64,
    started_ms: u64,
    lease_expires_ms: u64,
}

/// A leased job as the API answers it.
pub(super) fn leased(job: &Leased) -> LeasedBody<'_> {
    LeasedBody {
        id: &job.id,
        group: &job.group,
        payload: payload(&job.payload),
        attempt: job.attempt,
        lease: job.token.as_str(),
        fence: job.lease,
        started_ms: unix_ms(job.started),
        lease_expires_ms: unix_ms(job.lease_expires),
    }
}

/// `{"jobs": [...]}`: the answer of a lease call and of the dead list.
#[derive(Serialize, ToSchema)]
pub(super) struct JobsBody<T> {
    pub(super) jobs: Vec<T>,
}

/// `{"lease_expires_ms"}`: when an extended lease ends.
#[derive(Serialize, ToSchema)]
#[schema(as = JobLeaseExtended)]
pub(super) struct ExtendedBody {
    pub(super) lease_expires_ms: u64,
}

/// `{"retried"}`: how many dead jobs went back to their groups.
#[derive(Serialize, ToSchema)]
#[schema(as = Retried)]
pub(super) struct RetriedBody {
    pub(super) retried: usize,
}

/// `{"purged"}`: how many dead jobs were dropped.
#[derive(Serialize, ToSchema)]
#[schema(as = Purged)]
pub(super) struct PurgedBody {
    pub(super) purged: usize,
}

/// A job as the HTTP API (and `paceline queue`) shows it: `Display` prints it as one line
/// of JSON. Its payload is the JSON text it was enqueued as, written out unparsed.
#[derive(Serialize, ToSchema)]
#[schema(as = Job)]
pub struct JobBody<'a> {
    id: &'a str,
    group: &'a str,
    #[schema(value_type = String)]
    state: &'static str,
    attempts: u32,
    max_attempts: u32,
    last_error: Option<&'a str>,
    enqueued_ms: u64,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_before_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<&'a str>,
    /// Its priority, when not 0 (the default): 0 starts first, 9 last.
    #[serde(skip_serializing_if = "is_zero")]
    #[schema(minimum = 0, maximum = 9)]
    priority: u8,
    /// What each start counts against its policies, when not 1 (the default).
    #[serde(skip_serializing_if = "is_one")]
    #[schema(minimum = 1)]
    cost: u32,
    /// Its worker's last progress report, as sent (any JSON), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    progress: Option<Box<RawValue>>,
    /// Completed: what it was acknowledged with (any JSON), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<Box<RawValue>>,
    /// Completed or dead: when it was acknowledged or died, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_ms: Option<u64>,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl std::fmt::Display for JobBody<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Strings, whole numbers and JSON text already checked: it always serialises.
        let text = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&text)
    }
}

/// A job as the HTTP API (and `paceline queue`) shows it.
pub fn job_body(job: &JobInfo) -> JobBody<'_> {
    JobBody {
        id: &job.id,
        group: &job.group,
        state: job.state.name(),
        attempts: job.attempts,
        max_attempts: job.max_attempts,
        last_error: job.last_error.as_deref(),
        enqueued_ms: unix_ms(job.enqueued_at),
        payload: payload(&job.payload),
        not_before_ms: job.not_before.map(unix_ms),
        started_ms: job.started.map(unix_ms),
        lease_expires_ms: job.lease_expires.map(unix_ms),
        worker: job.worker.as_deref(),
        priority: job.priority,
        cost: job.cost,
        progress: job.progress.as_deref().map(payload),
        result: job.result.as_deref().map(payload),
        finished_ms: job.finished.map(unix_ms),
    }
}

/// A queue's counts (fields in the order JSON objects print).
#[derive(Serialize, ToSchema)]
#[schema(as = QueueStats)]
pub(super) struct StatsBody<'a> {
    active: u64,
    /// Acknowledged jobs kept readable (`keep_completed`); shown when there are any.
    #[serde(skip_serializing_if = "is_zero_u64")]
    completed: u64,
    dead: u64,
    #[schema(value_type = BTreeMap<String, GroupCounts>)]
    groups: BTreeMap<&'a str, GroupCounts>,
    paused: bool,
    paused_until_ms: Option<u64>,
    queue: &'a str,
    scheduled: u64,
    waiting: u64,
}

/// One group's counts, when its next job may start (`null` when none waits), and its
/// pause.
#[derive(Serialize, ToSchema)]
#[schema(as = GroupStats)]
struct GroupCounts {
    active: u64,
    next_eligible_ms: Option<u64>,
    paused: bool,
    paused_until_ms: Option<u64>,
    waiting: u64,
}

/// Whether something is paused, and until when in Unix ms (`null`: not paused, or until
/// resumed).
fn pause_fields(until: Option<u64>) -> (bool, Option<u64>) {
    (
        until.is_some(),
        until.filter(|&t| t != UNTIL_RESUMED).map(unix_ms),
    )
}

/// A schedule as the queue keeps it.
#[derive(Serialize, ToSchema)]
#[schema(as = Schedule)]
pub(super) struct ScheduleBodyOut<'a> {
    cron: &'a str,
    group: &'a str,
    name: &'a str,
    next_ms: u64,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
    timezone: &'a str,
}

impl<'a> ScheduleBodyOut<'a> {
    /// The schedule `s`; its payload is the JSON text it was put with.
    pub(super) fn new(s: &'a ScheduleInfo) -> ScheduleBodyOut<'a> {
        ScheduleBodyOut {
            cron: &s.schedule.cron,
            group: &s.schedule.group,
            name: &s.name,
            next_ms: unix_ms(s.next),
            payload: payload(&s.schedule.payload),
            timezone: s.schedule.timezone.as_deref().unwrap_or("UTC"),
        }
    }
}

/// The queue's schedules.
#[derive(Serialize, ToSchema)]
#[schema(as = Schedules)]
pub(super) struct SchedulesBody<'a> {
    pub(super) schedules: Vec<ScheduleBodyOut<'a>>,
}

/// A group's policy: its spec, and where it comes from (`run_time`, `config`, `default`).
#[derive(Serialize, ToSchema)]
#[schema(as = GroupPolicy)]
pub(super) struct GroupPolicyBody<'a> {
    pub(super) group: &'a str,
    pub(super) policy: String,
    pub(super) queue: &'a str,
    /// `runtime` (set by PUT), or where the config file sets it.
    #[schema(value_type = String)]
    pub(super) source: &'static str,
}

/// What a pause or a resume answers: what it named, and its pause now.
#[derive(Serialize, ToSchema)]
#[schema(as = Paused)]
pub(super) struct PausedBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    paused: bool,
    paused_until_ms: Option<u64>,
    queue: &'a str,
}

impl<'a> PausedBody<'a> {
    /// Queue `queue` (or its `group`) paused until `until` (`None`: resumed).
    pub(super) fn new(queue: &'a str, group: Option<&'a str>, until: Option<u64>) -> Self {
        let (paused, paused_until_ms) = pause_fields(until);
        PausedBody {
            group,
            paused,
            paused_until_ms,
            queue,
        }
    }
}

impl<'a> StatsBody<'a> {
    /// The counts of queue `name`.
    pub(super) fn new(name: &'a str, s: &'a Stats) -> StatsBody<'a> {
        let groups = s
            .groups
            .iter()
            .map(|g| {
                let (paused, paused_until_ms) = pause_fields(g.paused_until);
                let counts = GroupCounts {
                    active: g.active,
                    next_eligible_ms: g.next_eligible.filter(|&t| t != UNTIL_RESUMED).map(unix_ms),
                    paused,
                    paused_until_ms,
                    waiting: g.waiting,
                };
                (g.group.as_str(), counts)
            })
            .collect();
        let (paused, paused_until_ms) = pause_fields(s.paused_until);
        StatsBody {
            active: s.active,
            completed: s.completed,
            dead: s.dead,
            groups,
            paused,
            paused_until_ms,
            queue: name,
            scheduled: s.scheduled,
            waiting: s.waiting,
        }
    }
}

/// What a pause (`until`: its end) or a resume (`None`) of queue `name` or its `group`
/// answers, as the HTTP API (and `paceline queue pause`) shows it.
pub fn paused_body(name: &str, group: Option<&str>, until: Option<u64>) -> Value {
    // Names and numbers: always serialisable.
    serde_json::to_value(PausedBody::new(name, group, until)).unwrap_or_default()
}

/// A queue's counts as the HTTP API (and `paceline queue stats`) shows them.
pub fn stats_body(name: &str, s: &Stats) -> Value {
    // Counts and names: always serialisable.
    serde_json::to_value(StatsBody::new(name, s)).unwrap_or_default()
}

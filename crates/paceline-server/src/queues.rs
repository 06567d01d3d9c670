//! The job queues over HTTP: `/v1/queues/{queue}/...`, so that producers and workers in any
//! language share the queues of the config file.
//!
//! Times (`*_ms`) are Unix milliseconds on the queue's clock, so `started_ms` of jobs leased
//! through different instances compare. A lease token travels as a string.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use paceline_queue::{
    Enqueued, Failure, JobInfo, LeaseToken, Leased, NewJob, Queue, QueueError, Stats,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Number, Value};

use crate::api::{path_parts, read_body, utf8, Authorized};
use crate::error::{ApiError, ErrorCode};
use crate::fields::number_field;
use crate::request;
use crate::state::AppState;

/// The largest body of a queue request, a batch's included (a job's payload is at most
/// 16 MiB).
const MAX_QUEUE_BODY: usize = 17 * 1024 * 1024;
/// The most jobs in one enqueue batch.
pub const MAX_ENQUEUE_BATCH: usize = 1_000;
/// The most dead jobs one listing answers.
const MAX_DEAD_LIST: usize = 1_000;

/// The queue routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/queues/{queue}", get(stats))
        .route("/v1/queues/{queue}/jobs", post(enqueue))
        .route("/v1/queues/{queue}/jobs/batch", post(enqueue_batch))
        .route("/v1/queues/{queue}/leases", post(lease))
        .route("/v1/queues/{queue}/jobs/{id}", get(job).delete(cancel))
        .route("/v1/queues/{queue}/jobs/{id}/ack", post(ack))
        .route("/v1/queues/{queue}/jobs/{id}/fail", post(fail))
        .route("/v1/queues/{queue}/jobs/{id}/extend", post(extend))
        .route("/v1/queues/{queue}/dead", get(dead).delete(purge_dead))
        .route("/v1/queues/{queue}/dead/retry", post(retry_dead))
}

/// Unix milliseconds from microseconds.
fn ms(us: u64) -> u64 {
    us / 1_000
}

/// A queue error as the API answers it.
fn queue_error(e: QueueError) -> ApiError {
    match e {
        // The core's not-before bound depends on the queue's clock: its field is the API's
        // in milliseconds.
        QueueError::Input(e) if e.field() == "not_before" => {
            ApiError::invalid("not_before_ms", e.message())
        }
        // The core names the fields the API has (the delay is checked as `delay_ms` before).
        QueueError::Input(e) => ApiError::input(&e),
        QueueError::LeaseLost { id } => ApiError::new(
            ErrorCode::LeaseLost,
            "lease",
            format!(
                "job `{id}`: this lease is not the job's current one (it expired, or the job was already acknowledged or failed); stop working on it"
            ),
        ),
        QueueError::UnknownJob { id } => ApiError::new(
            ErrorCode::UnknownJob,
            "id",
            format!("no job `{id}` in this queue (acknowledged, cancelled, purged or never enqueued)"),
        ),
        QueueError::Conflict { id, state, message } => ApiError::new(
            ErrorCode::Conflict,
            "id",
            format!("job `{id}` is {state}: {message}"),
        ),
        QueueError::Store(e) => ApiError::from(paceline_store::Error::Store(e)),
        other => ApiError::new(
            ErrorCode::Internal,
            "queue",
            other.to_string(),
        ),
    }
}

/// The path's parts, or the JSON error for a path that does not decode.
fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path_parts(path, "the queue and job id")
}

/// The queue called `name`.
fn queue(state: &AppState, name: &str) -> Result<Queue, ApiError> {
    state.queues.get(name).cloned().ok_or_else(|| {
        let known: Vec<&str> = state.queues.keys().map(String::as_str).collect();
        ApiError::new(
            ErrorCode::UnknownQueue,
            "queue",
            if known.is_empty() {
                format!("no queue named `{name}`: this service has no queues; add [queues.NAME] tables to its config file")
            } else {
                format!("no queue named `{name}`; the queues are {}", known.join(", "))
            },
        )
    })
}

/// Reads a request's body as a JSON object into `T`.
async fn read<T: DeserializeOwned>(state: &AppState, body: Body) -> Result<T, ApiError> {
    let bytes = read_body(state, body, MAX_QUEUE_BODY).await?;
    Ok(request::object(utf8(&bytes)?, "a JSON object", &[])?)
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

/// A job to enqueue, as sent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    group: Option<String>,
    payload: Option<Box<RawValue>>,
    id: Option<String>,
    delay_ms: Option<Number>,
    not_before_ms: Option<Number>,
    max_attempts: Option<u64>,
}

/// 365 days, in milliseconds.
const MAX_DELAY_MS: f64 = paceline_queue::job::MAX_DELAY.as_secs() as f64 * 1000.0;
/// The latest not-before time the API reads, in Unix milliseconds (the last time the clock
/// supports); the queue holds a job back at most `MAX_DELAY`.
const MAX_NOT_BEFORE_MS: f64 = paceline_core::policy::MAX_NOW_US as f64 / 1000.0;
/// The longest lease, in milliseconds.
const MAX_LEASE_MS: f64 = paceline_queue::config::MAX_LEASE.as_secs() as f64 * 1000.0;
/// The longest group pause, in milliseconds.
const MAX_PAUSE_MS: f64 = paceline_queue::core::MAX_PAUSE.as_secs() as f64 * 1000.0;
/// The longest a lease call may wait, in milliseconds.
const MAX_WAIT_MS: f64 = paceline_queue::queue::MAX_LEASE_WAIT.as_secs() as f64 * 1000.0;

impl EnqueueBody {
    fn into_job(self) -> Result<NewJob, ApiError> {
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
        Ok(job)
    }
}

#[derive(Serialize)]
struct EnqueuedBody<'a> {
    id: &'a str,
    state: &'static str,
    estimated_start_ms: u64,
}

fn enqueued(e: &Enqueued) -> (StatusCode, EnqueuedBody<'_>) {
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
            estimated_start_ms: ms(e.estimated_start),
        },
    )
}

async fn enqueue(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = queue(&state, &path(name)?)?;
    let job = read::<EnqueueBody>(&state, body).await?.into_job()?;
    let e = queue.enqueue(job).await.map_err(queue_error)?;
    let (status, body) = enqueued(&e);
    Ok((status, Json(body)).into_response())
}

async fn enqueue_batch(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = queue(&state, &path(name)?)?;
    let bytes = read_body(&state, body, MAX_QUEUE_BODY).await?;
    let json = utf8(&bytes)?;
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
    // Each job is read on its own: a bad one is its own error, and is not enqueued.
    let read: Vec<Result<NewJob, ApiError>> = items
        .iter()
        .map(|raw| {
            request::object::<EnqueueBody>(raw.get(), "a JSON object", &[])
                .map_err(ApiError::from)
                .and_then(EnqueueBody::into_job)
        })
        .collect();
    let valid: Vec<NewJob> = read
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    let mut answers = queue.enqueue_batch(valid).await.into_iter();
    let out: Vec<Value> = read
        .into_iter()
        .map(|r| {
            let answer = r.and_then(|_| {
                answers
                    .next()
                    .unwrap_or_else(|| Err(QueueError::UnknownJob { id: String::new() }))
                    .map_err(queue_error)
            });
            match answer {
                Ok(e) => {
                    let (status, body) = enqueued(&e);
                    json!({"status": status.as_u16(), "id": body.id, "state": body.state, "estimated_start_ms": body.estimated_start_ms})
                }
                Err(e) => json!({"status": e.status().as_u16(), "error": e.body()}),
            }
        })
        .collect();
    Ok(Json(out).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    worker: Option<String>,
    request_id: Option<String>,
    max_jobs: Option<u64>,
    lease_ms: Option<Number>,
    wait_ms: Option<Number>,
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

/// A leased job as the API answers it. The payload goes out as the JSON text it came in as,
/// never parsed again: whatever enqueue accepted (any depth, any number), a lease hands back.
#[derive(Serialize)]
struct LeasedBody<'a> {
    id: &'a str,
    group: &'a str,
    payload: Box<RawValue>,
    attempt: u32,
    lease: &'a str,
    fence: u64,
    started_ms: u64,
    lease_expires_ms: u64,
}

fn leased(job: &Leased) -> LeasedBody<'_> {
    LeasedBody {
        id: &job.id,
        group: &job.group,
        payload: payload(&job.payload),
        attempt: job.attempt,
        lease: job.token.as_str(),
        fence: job.lease,
        started_ms: ms(job.started),
        lease_expires_ms: ms(job.lease_expires),
    }
}

/// `{"jobs": [...]}`: the answer of a lease call and of the dead list.
#[derive(Serialize)]
struct JobsBody<T> {
    jobs: Vec<T>,
}

async fn lease(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let name = path(name)?;
    let queue = queue(&state, &name)?;
    let body: LeaseBody = read(&state, body).await?;
    let worker = body
        .worker
        .ok_or_else(|| ApiError::invalid("worker", "is required: a name for the worker"))?;
    let max_jobs = match body.max_jobs {
        None => 1,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let lease = millis("lease_ms", body.lease_ms.as_ref(), MAX_LEASE_MS)?;
    let wait = millis("wait_ms", body.wait_ms.as_ref(), MAX_WAIT_MS)?.unwrap_or(Duration::ZERO);
    // A lease waiting for a job ends, with what it has, when the service shuts down.
    let mut stopping = state.stopping.subscribe();
    let _waiting = (!wait.is_zero()).then(|| state.metrics.worker_waiting(&name));
    // The call runs in a task of its own, so that a call to the store under way ends even
    // when this request does not (the client went away): it stops waiting once the client
    // or the service goes, between calls to the store only, and jobs it took that no one
    // can be answered with go back to their groups at once, costing no attempt, instead of
    // waiting out their leases.
    let (mut answer, answered) = tokio::sync::oneshot::channel();
    let request = body.request_id;
    let caller = queue.clone();
    tokio::spawn(async move {
        let gone = async {
            tokio::select! {
                () = answer.closed() => {}
                _ = stopping.wait_for(|&stopping| stopping) => {}
            }
        };
        let jobs = caller
            .lease_until(&worker, max_jobs, lease, wait, request.as_deref(), gone)
            .await;
        if let Err(Ok(jobs)) = answer.send(jobs) {
            for job in jobs {
                let _ = caller.fail(&job.id, &job.token, Failure::Release).await;
            }
        }
    });
    let jobs = answered
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::Internal,
                "request",
                "the lease call failed before it answered; retry it with the same request_id",
            )
        })?
        .map_err(queue_error)?;
    for job in &jobs {
        state.metrics.queue_started(&name, job);
    }
    let jobs: Vec<LeasedBody<'_>> = jobs.iter().map(leased).collect();
    Ok(Json(JobsBody { jobs }).into_response())
}

/// A request about one job: its queue, its id, and its body read into `T`.
async fn about_job<T: DeserializeOwned>(
    state: &AppState,
    ids: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Result<(Queue, String, T), ApiError> {
    let (name, id) = path(ids)?;
    let queue = queue(state, &name)?;
    let body = read(state, body).await?;
    Ok((queue, id, body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    lease: Option<String>,
}

async fn ack(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    ids: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let (queue, id, body): (Queue, String, AckBody) = about_job(&state, ids, body).await?;
    queue
        .ack(&id, &token(body.lease.as_deref())?)
        .await
        .map_err(queue_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailBody {
    lease: Option<String>,
    error: Option<String>,
    retry_after_ms: Option<Number>,
    pause_group_ms: Option<Number>,
    fatal: Option<bool>,
}

async fn fail(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    ids: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let (queue, id, body): (Queue, String, FailBody) = about_job(&state, ids, body).await?;
    let lease = token(body.lease.as_deref())?;
    let retry_after = millis("retry_after_ms", body.retry_after_ms.as_ref(), MAX_DELAY_MS)?;
    let pause = millis("pause_group_ms", body.pause_group_ms.as_ref(), MAX_PAUSE_MS)?;
    let failure = Failure::from_parts(body.error, body.fatal.unwrap_or(false), retry_after, pause)
        .map_err(|e| ApiError::input(&e))?;
    queue
        .fail(&id, &lease, failure)
        .await
        .map_err(queue_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    lease: Option<String>,
    lease_ms: Option<Number>,
}

async fn extend(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    ids: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let (queue, id, body): (Queue, String, ExtendBody) = about_job(&state, ids, body).await?;
    let lease = token(body.lease.as_deref())?;
    let length =
        millis("lease_ms", body.lease_ms.as_ref(), MAX_LEASE_MS)?.unwrap_or(queue.config().lease);
    let expires = queue
        .extend(&id, &lease, length)
        .await
        .map_err(queue_error)?;
    Ok(Json(json!({ "lease_expires_ms": ms(expires) })).into_response())
}

/// A job as the HTTP API (and `paceline queue`) shows it: `Display` prints it as one line
/// of JSON. Its payload is the JSON text it was enqueued as, written out unparsed.
#[derive(Serialize)]
pub struct JobBody<'a> {
    id: &'a str,
    group: &'a str,
    state: &'static str,
    attempts: u32,
    max_attempts: u32,
    last_error: Option<&'a str>,
    enqueued_ms: u64,
    payload: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_before_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<&'a str>,
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
        enqueued_ms: ms(job.enqueued_at),
        payload: payload(&job.payload),
        not_before_ms: job.not_before.map(ms),
        started_ms: job.started.map(ms),
        lease_expires_ms: job.lease_expires.map(ms),
        worker: job.worker.as_deref(),
    }
}

async fn job(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (name, id) = path(ids)?;
    let queue = queue(&state, &name)?;
    match queue.job(&id).await.map_err(queue_error)? {
        Some(job) => Ok(Json(job_body(&job)).into_response()),
        None => Err(queue_error(QueueError::UnknownJob { id })),
    }
}

async fn cancel(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (name, id) = path(ids)?;
    let queue = queue(&state, &name)?;
    queue.cancel(&id).await.map_err(queue_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn stats(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = path(name)?;
    let queue = queue(&state, &name)?;
    let s = queue.stats().await.map_err(queue_error)?;
    Ok(Json(stats_body(&name, &s)).into_response())
}

/// A queue's counts as the HTTP API (and `paceline queue stats`) shows them.
pub fn stats_body(name: &str, s: &Stats) -> Value {
    let groups: BTreeMap<&str, Value> = s
        .groups
        .iter()
        .map(|g| {
            (
                g.group.as_str(),
                json!({
                    "waiting": g.waiting,
                    "active": g.active,
                    "next_eligible_ms": g.next_eligible.map(ms),
                }),
            )
        })
        .collect();
    json!({
        "queue": name,
        "scheduled": s.scheduled,
        "waiting": s.waiting,
        "active": s.active,
        "dead": s.dead,
        "groups": groups,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    offset: Option<usize>,
    limit: Option<usize>,
}

async fn dead(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let queue = queue(&state, &path(name)?)?;
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_DEAD_LIST {
        return Err(ApiError::invalid(
            "limit",
            format!("must be from 1 to {MAX_DEAD_LIST}"),
        ));
    }
    let jobs = queue
        .dead(query.offset.unwrap_or(0), limit)
        .await
        .map_err(queue_error)?;
    let jobs: Vec<JobBody<'_>> = jobs.iter().map(job_body).collect();
    Ok(Json(JobsBody { jobs }).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    ids: Option<Vec<String>>,
}

async fn retry_dead(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = queue(&state, &path(name)?)?;
    let body: RetryBody = read(&state, body).await?;
    let n = queue
        .retry_dead(body.ids.as_deref())
        .await
        .map_err(queue_error)?;
    Ok(Json(json!({ "retried": n })).into_response())
}

async fn purge_dead(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let queue = queue(&state, &path(name)?)?;
    let n = queue.purge_dead().await.map_err(queue_error)?;
    Ok(Json(json!({ "purged": n })).into_response())
}

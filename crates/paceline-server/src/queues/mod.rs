//! The job queues over HTTP: `/v1/queues/{queue}/...`, so that producers and workers in any
//! language share the queues of the config file.
//!
//! | endpoint | answer |
//! |---|---|
//! | `POST /v1/queues/{queue}/jobs` `{"group", "payload", "id"?, "delay_ms"?, "not_before_ms"?, "max_attempts"?}` | `201` enqueued, `200` enqueued already under that id |
//! | `POST /v1/queues/{queue}/jobs/batch` `[job, ...]` | `200`, one entry per job with its own `status` |
//! | `POST /v1/queues/{queue}/leases` `{"worker", "max_jobs"?, "lease_ms"?, "wait_ms"?, "request_id"?}` | `200 {"jobs": [...]}` |
//! | `POST /v1/queues/{queue}/jobs/{id}/ack`, `.../fail`, `.../extend` `{"lease", ...}` | `204`, `204`, `200 {"lease_expires_ms"}`; `409 lease_lost` for a lease no longer the job's |
//! | `GET`, `DELETE /v1/queues/{queue}/jobs/{id}` | the job; cancel it (`204`) |
//! | `GET /v1/queues/{queue}` | the counts, and each group's, with their pauses |
//! | `POST /v1/queues/{queue}/pause` `{"ms"?}`, `.../resume` | `200`: the queue leases nothing until resumed or for `ms` |
//! | `POST /v1/queues/{queue}/groups/{group}/pause` `{"ms"?}`, `.../resume` | `200`: the group starts nothing until resumed or for `ms` |
//! | `GET`, `PUT`, `DELETE /v1/queues/{queue}/groups/{group}/policy` `{"policy"}` | `200 {"group", "policy", "queue", "source"}`: the group's policy, set at run time, or back to the config's |
//! | `GET /v1/queues/{queue}/schedules`; `GET`, `PUT`, `DELETE .../schedules/{name}` `{"cron", "group", "payload"?, "timezone"?}` | the schedules; one, kept (`200`), or removed (`204`) |
//! | `GET /v1/queues/{queue}/jobs?state=S&group=G` | list jobs by state (`scheduled`, `waiting`, `active`, `dead`, `completed`) |
//! | `GET`, `DELETE /v1/queues/{queue}/dead`, `POST .../dead/retry` | list, purge, retry the dead jobs |
//! | `GET /v1/queues/{queue}/events?group=G&event=K,...` (`Accept: text/event-stream`) | the queue's events as Server-Sent Events, as they happen |
//!
//! Times (`*_ms`) are Unix milliseconds on the queue's clock, so `started_ms` of jobs leased
//! through different instances compare. A lease token travels as a string.

mod answers;
mod events;
mod requests;

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use paceline_queue::{Failure, JobState, NewJob, Queue, QueueError};

use crate::error::{ApiError, Envelope, ErrorCode};
use crate::extract::{path_parts, Authorized, JsonBody};
use crate::state::AppState;
use answers::{
    enqueued, leased, BatchEntry, EnqueuedBody, ExtendedBody, GroupPolicyBody, JobsBody,
    LeasedBody, PausedBody, PurgedBody, RetriedBody, ScheduleBodyOut, SchedulesBody, StatsBody,
};
pub use answers::{job_body, paused_body, stats_body, JobBody};
pub use requests::MAX_ENQUEUE_BATCH;
use requests::{
    AckBody, DeadQuery, EnqueueBody, ExtendBody, FailBody, JobsArray, JobsQuery, LeaseBody,
    LeaseCall, Object, PauseBody, PauseSchema, PolicyBody, ProgressBody, RetryBody, ScheduleBody,
};

/// The most dead jobs one listing answers.
const MAX_DEAD_LIST: usize = 1_000;

/// The queue operations, for the service's OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    stats,
    enqueue,
    enqueue_batch,
    lease,
    job,
    cancel,
    ack,
    progress,
    fail,
    extend,
    list_jobs,
    dead,
    purge_dead,
    retry_dead,
    pause_queue,
    resume_queue,
    pause_group,
    resume_group,
    group_policy,
    set_group_policy,
    unset_group_policy,
    list_schedules,
    get_schedule,
    put_schedule,
    delete_schedule,
    events::events,
))]
pub(crate) struct QueuesDoc;

/// The queue routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/queues/{queue}", get(stats))
        .route("/v1/queues/{queue}/jobs", get(list_jobs).post(enqueue))
        .route("/v1/queues/{queue}/jobs/batch", post(enqueue_batch))
        .route("/v1/queues/{queue}/leases", post(lease))
        .route("/v1/queues/{queue}/jobs/{id}", get(job).delete(cancel))
        .route("/v1/queues/{queue}/jobs/{id}/ack", post(ack))
        .route("/v1/queues/{queue}/jobs/{id}/progress", post(progress))
        .route("/v1/queues/{queue}/jobs/{id}/fail", post(fail))
        .route("/v1/queues/{queue}/jobs/{id}/extend", post(extend))
        .route("/v1/queues/{queue}/dead", get(dead).delete(purge_dead))
        .route("/v1/queues/{queue}/dead/retry", post(retry_dead))
        .route("/v1/queues/{queue}/pause", post(pause_queue))
        .route("/v1/queues/{queue}/resume", post(resume_queue))
        .route("/v1/queues/{queue}/groups/{group}/pause", post(pause_group))
        .route(
            "/v1/queues/{queue}/groups/{group}/resume",
            post(resume_group),
        )
        .route(
            "/v1/queues/{queue}/groups/{group}/policy",
            get(group_policy)
                .put(set_group_policy)
                .delete(unset_group_policy),
        )
        .route("/v1/queues/{queue}/events", get(events::events))
        .route("/v1/queues/{queue}/schedules", get(list_schedules))
        .route(
            "/v1/queues/{queue}/schedules/{name}",
            get(get_schedule).put(put_schedule).delete(delete_schedule),
        )
}

/// What a path's parts must be, as an error says it.
const PATH_PARTS: &str = "the queue and job id";
/// What a group's path's parts must be, as an error says it.
const GROUP_PATH_PARTS: &str = "the queue and the group or schedule name";

/// The queue a path names (`{queue}`): `404 unknown_queue` for one not configured.
struct QueueAt {
    name: String,
    queue: Queue,
}

impl FromRequestParts<Arc<AppState>> for QueueAt {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<QueueAt, ApiError> {
        let name: String = path_parts(Path::from_request_parts(parts, state).await, PATH_PARTS)?;
        let queue = queue(state, &name)?;
        Ok(QueueAt { name, queue })
    }
}

/// A job a path names (`{queue}/jobs/{id}`): its queue, and its id.
struct JobAt {
    queue: Queue,
    id: String,
}

impl FromRequestParts<Arc<AppState>> for JobAt {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<JobAt, ApiError> {
        let (name, id): (String, String) =
            path_parts(Path::from_request_parts(parts, state).await, PATH_PARTS)?;
        let queue = queue(state, &name)?;
        Ok(JobAt { queue, id })
    }
}

/// A group a path names (`{queue}/groups/{group}`): its queue's name, the queue, and the
/// group (checked by the queue).
struct GroupAt {
    name: String,
    queue: Queue,
    group: String,
}

impl FromRequestParts<Arc<AppState>> for GroupAt {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<GroupAt, ApiError> {
        let (name, group): (String, String) = path_parts(
            Path::from_request_parts(parts, state).await,
            GROUP_PATH_PARTS,
        )?;
        let queue = queue(state, &name)?;
        Ok(GroupAt { name, queue, group })
    }
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

/// `POST /v1/queues/{queue}/jobs`: `201` enqueued, `200` already enqueued under its id.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs",
    tag = "queues",
    operation_id = "enqueue",
    params(("queue" = String, Path, description = "A configured queue's name")),
    request_body = EnqueueBody,
    responses(
        (status = 201, description = "Enqueued", body = EnqueuedBody),
        (status = 200, description = "Enqueued already under that `id` (or deduplicated)", body = EnqueuedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 409, description = "`conflict`: a `cost` more than the group's policy or the queue's own can ever admit a start; nothing added", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn enqueue(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    body: JsonBody<Object<EnqueueBody>>,
) -> Result<Response, ApiError> {
    let job = body.read()?.into_job()?;
    let e = queue.enqueue(job).await?;
    let (status, body) = enqueued(&e);
    Ok((status, Json(body)).into_response())
}

/// `POST /v1/queues/{queue}/jobs/batch`: each job read and enqueued on its own; a bad one
/// is its own entry's error, and is not enqueued.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs/batch",
    tag = "queues",
    operation_id = "enqueue_batch",
    params(("queue" = String, Path, description = "A configured queue's name")),
    request_body(content = Vec<EnqueueBody>, description = "Up to 1000 jobs"),
    responses(
        (status = 200, description = "One entry per job, in order, each with its own `status` (an error's as one enqueue answers it: `409 conflict` for a cost its policies can never admit)", body = Vec<BatchEntry>),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn enqueue_batch(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    body: JsonBody<JobsArray>,
) -> Result<Response, ApiError> {
    let read: Vec<Result<NewJob, ApiError>> =
        body.read()?.into_iter().map(EnqueueBody::read).collect();
    let valid: Vec<NewJob> = read
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    let mut answers = queue.enqueue_batch(valid).await.into_iter();
    let answers: Vec<Result<_, ApiError>> = read
        .into_iter()
        .map(|r| {
            r.and_then(|_| {
                let answer = answers
                    .next()
                    .unwrap_or_else(|| Err(QueueError::UnknownJob { id: String::new() }));
                Ok(answer?)
            })
        })
        .collect();
    // The entries borrow the answers above, so the body is written out here.
    let entries: Vec<BatchEntry> = answers.iter().map(BatchEntry::new).collect();
    Ok(Json(entries).into_response())
}

/// `POST /v1/queues/{queue}/leases`: the jobs that may start now (waiting up to `wait_ms`
/// for one when none may).
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/leases",
    tag = "queues",
    operation_id = "lease_jobs",
    params(("queue" = String, Path, description = "A configured queue's name")),
    request_body = LeaseBody,
    responses(
        (status = 200, description = "The jobs that may start now (none when none may within `wait_ms`)", body = JobsBody<LeasedBody>),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn lease(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    QueueAt { name, queue }: QueueAt,
    body: JsonBody<Object<LeaseBody>>,
) -> Result<Response, ApiError> {
    let LeaseCall {
        worker,
        max_jobs,
        lease,
        wait,
        request_id,
    } = body.read()?.check()?;
    // A lease waiting for a job ends, with what it has, when the service shuts down.
    let mut stopping = state.stopping.subscribe();
    let _waiting = (!wait.is_zero()).then(|| state.metrics.worker_waiting(&name));
    // The call runs in a task of its own, so that a call to the store under way ends even
    // when this request does not (the client went away): it stops waiting once the client
    // or the service goes, between calls to the store only, and jobs it took that no one
    // can be answered with go back to their groups at once, costing no attempt, instead of
    // waiting out their leases.
    let (mut answer, answered) = tokio::sync::oneshot::channel();
    let caller = queue.clone();
    tokio::spawn(async move {
        let gone = async {
            tokio::select! {
                () = answer.closed() => {}
                _ = stopping.wait_for(|&stopping| stopping) => {}
            }
        };
        let jobs = caller
            .lease_until(&worker, max_jobs, lease, wait, request_id.as_deref(), gone)
            .await;
        if let Err(Ok(jobs)) = answer.send(jobs) {
            for job in jobs {
                let _ = caller.fail(&job.id, &job.token, Failure::Release).await;
            }
        }
    });
    let jobs = answered.await.map_err(|_| {
        ApiError::new(
            ErrorCode::Internal,
            "request",
            "the lease call failed before it answered; retry it with the same request_id",
        )
    })??;
    for job in &jobs {
        state.metrics.queue_started(&name, job);
    }
    let jobs: Vec<LeasedBody<'_>> = jobs.iter().map(leased).collect();
    Ok(Json(JobsBody { jobs }).into_response())
}

/// `POST /v1/queues/{queue}/jobs/{id}/ack`: the job is done (`204`).
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs/{id}/ack",
    tag = "queues",
    operation_id = "ack",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    request_body = AckBody,
    responses(
        (status = 204, description = "The job is done"),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 409, description = "`lease_lost`: the lease is no longer the job's (it expired, or the job was acked or failed): stop working on it; or `conflict`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn ack(
    _: Authorized,
    JobAt { queue, id }: JobAt,
    body: JsonBody<Object<AckBody>>,
) -> Result<StatusCode, ApiError> {
    let body = body.read()?;
    let lease = body.lease()?;
    queue.ack_with_result(&id, &lease, body.result()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{queue}/jobs/{id}/progress` `{"lease", "progress"}`: how far a running
/// job has got (`204`), shown by `GET .../jobs/{id}` while it runs and after.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs/{id}/progress",
    tag = "queues",
    operation_id = "progress",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    request_body = ProgressBody,
    responses(
        (status = 204, description = "The report is kept"),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 409, description = "`lease_lost`: the lease is no longer the job's: stop working on it", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn progress(
    _: Authorized,
    JobAt { queue, id }: JobAt,
    body: JsonBody<Object<ProgressBody>>,
) -> Result<StatusCode, ApiError> {
    let body = body.read()?;
    let (lease, report) = body.read()?;
    queue.progress(&id, &lease, report).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{queue}/jobs/{id}/fail`: the job failed; retried later, or dead
/// (`204`).
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs/{id}/fail",
    tag = "queues",
    operation_id = "fail",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    request_body = FailBody,
    responses(
        (status = 204, description = "The job failed: retried later, dead, or back in its paused group"),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 409, description = "`lease_lost`: the lease is no longer the job's (it expired, or the job was acked or failed): stop working on it; or `conflict`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn fail(
    _: Authorized,
    JobAt { queue, id }: JobAt,
    body: JsonBody<Object<FailBody>>,
) -> Result<StatusCode, ApiError> {
    let (lease, failure) = body.read()?.check()?;
    queue.fail(&id, &lease, failure).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{queue}/jobs/{id}/extend`: the job's lease lives `lease_ms` (the
/// queue's `lease` unless given) from now.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/jobs/{id}/extend",
    tag = "queues",
    operation_id = "extend_job_lease",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    request_body = ExtendBody,
    responses(
        (status = 200, description = "The lease lives `lease_ms` from now", body = ExtendedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 409, description = "`lease_lost`: the lease is no longer the job's (it expired, or the job was acked or failed): stop working on it; or `conflict`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn extend(
    _: Authorized,
    JobAt { queue, id }: JobAt,
    body: JsonBody<Object<ExtendBody>>,
) -> Result<Json<ExtendedBody>, ApiError> {
    let (lease, length) = body.read()?.check()?;
    let length = length.unwrap_or(queue.config().lease);
    let expires = queue.extend(&id, &lease, length).await?;
    Ok(Json(ExtendedBody {
        lease_expires_ms: crate::units::unix_ms(expires),
    }))
}

/// `GET /v1/queues/{queue}/jobs/{id}`: the job.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/jobs/{id}",
    tag = "queues",
    operation_id = "get_job",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    responses(
        (status = 200, description = "The job", body = JobBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn job(_: Authorized, JobAt { queue, id }: JobAt) -> Result<Response, ApiError> {
    match queue.job(&id).await? {
        Some(job) => Ok(Json(job_body(&job)).into_response()),
        None => Err(QueueError::UnknownJob { id }.into()),
    }
}

/// `DELETE /v1/queues/{queue}/jobs/{id}`: the job is cancelled (`204`).
#[utoipa::path(
    delete,
    path = "/v1/queues/{queue}/jobs/{id}",
    tag = "queues",
    operation_id = "cancel_job",
    params(("queue" = String, Path, description = "A configured queue's name"), ("id" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The job's id")),
    responses(
        (status = 204, description = "The job is cancelled"),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`, or `unknown_job`: acknowledged, cancelled, purged or never enqueued", body = Envelope),
        (status = 409, description = "`conflict`: the job is running", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn cancel(_: Authorized, JobAt { queue, id }: JobAt) -> Result<StatusCode, ApiError> {
    queue.cancel(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/queues/{queue}`: the queue's counts, and each group's.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}",
    tag = "queues",
    operation_id = "queue_stats",
    params(("queue" = String, Path, description = "A configured queue's name")),
    responses(
        (status = 200, description = "The queue's counts, and each group's", body = StatsBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn stats(_: Authorized, QueueAt { name, queue }: QueueAt) -> Result<Response, ApiError> {
    let s = queue.stats().await?;
    Ok(Json(StatsBody::new(&name, &s)).into_response())
}

/// `POST /v1/queues/{queue}/pause` `{"ms"?}`: the queue leases nothing for `ms`, or until
/// resumed; leases given run on.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/pause",
    tag = "queues",
    operation_id = "pause_queue",
    params(("queue" = String, Path, description = "A configured queue's name")),
    request_body(content = PauseBody, description = "Optional: no body pauses until resumed"),
    responses(
        (status = 200, description = "The queue leases nothing until resumed or for `ms`", body = PausedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn pause_queue(
    _: Authorized,
    QueueAt { name, queue }: QueueAt,
    body: JsonBody<PauseSchema>,
) -> Result<Response, ApiError> {
    let until = queue.pause(None, body.read()?).await?;
    Ok(Json(PausedBody::new(&name, None, Some(until))).into_response())
}

/// `POST /v1/queues/{queue}/resume`: the queue's own pause ends (its groups' stay).
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/resume",
    tag = "queues",
    operation_id = "resume_queue",
    params(("queue" = String, Path, description = "A configured queue's name")),
    responses(
        (status = 200, description = "The queue's own pause ends", body = PausedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn resume_queue(
    _: Authorized,
    QueueAt { name, queue }: QueueAt,
) -> Result<Response, ApiError> {
    queue.resume(None).await?;
    Ok(Json(PausedBody::new(&name, None, None)).into_response())
}

/// `POST /v1/queues/{queue}/groups/{group}/pause` `{"ms"?}`: the group starts nothing for
/// `ms`, or until resumed.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/groups/{group}/pause",
    tag = "queues",
    operation_id = "pause_group",
    params(("queue" = String, Path, description = "A configured queue's name"), ("group" = String, Path, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$", description = "The group: 1 to 256 bytes, no control characters")),
    request_body(content = PauseBody, description = "Optional: no body pauses until resumed"),
    responses(
        (status = 200, description = "The group starts nothing until resumed or for `ms`", body = PausedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn pause_group(
    _: Authorized,
    GroupAt { name, queue, group }: GroupAt,
    body: JsonBody<PauseSchema>,
) -> Result<Response, ApiError> {
    let until = queue.pause(Some(&group), body.read()?).await?;
    Ok(Json(PausedBody::new(&name, Some(&group), Some(until))).into_response())
}

/// `POST /v1/queues/{queue}/groups/{group}/resume`: every pause of the group ends, a
/// worker's after an upstream's refusal included.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/groups/{group}/resume",
    tag = "queues",
    operation_id = "resume_group",
    params(("queue" = String, Path, description = "A configured queue's name"), ("group" = String, Path, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$", description = "The group: 1 to 256 bytes, no control characters")),
    responses(
        (status = 200, description = "Every pause of the group ends", body = PausedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn resume_group(
    _: Authorized,
    GroupAt { name, queue, group }: GroupAt,
) -> Result<Response, ApiError> {
    queue.resume(Some(&group)).await?;
    Ok(Json(PausedBody::new(&name, Some(&group), None)).into_response())
}

/// `GET /v1/queues/{queue}/groups/{group}/policy`: the group's policy and where it comes
/// from.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/groups/{group}/policy",
    tag = "queues",
    operation_id = "get_group_policy",
    params(("queue" = String, Path, description = "A configured queue's name"), ("group" = String, Path, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$", description = "The group: 1 to 256 bytes, no control characters")),
    responses(
        (status = 200, description = "The group's policy, and where it comes from", body = GroupPolicyBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn group_policy(_: Authorized, at: GroupAt) -> Result<Response, ApiError> {
    policy_answer(&at).await
}

/// `PUT /v1/queues/{queue}/groups/{group}/policy` `{"policy"}`: the group's policy from
/// now on, kept by the queue's store (every instance, restarts and config changes).
#[utoipa::path(
    put,
    path = "/v1/queues/{queue}/groups/{group}/policy",
    tag = "queues",
    operation_id = "set_group_policy",
    params(("queue" = String, Path, description = "A configured queue's name"), ("group" = String, Path, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$", description = "The group: 1 to 256 bytes, no control characters")),
    request_body = PolicyBody,
    responses(
        (status = 200, description = "The group's policy from now on", body = GroupPolicyBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn set_group_policy(
    _: Authorized,
    at: GroupAt,
    body: JsonBody<Object<PolicyBody>>,
) -> Result<Response, ApiError> {
    let policy = body.read()?.policy()?;
    at.queue.set_policy(&at.group, Some(&policy)).await?;
    policy_answer(&at).await
}

/// `DELETE /v1/queues/{queue}/groups/{group}/policy`: the group's policy is the config's
/// again (its own there, or the queue's default).
#[utoipa::path(
    delete,
    path = "/v1/queues/{queue}/groups/{group}/policy",
    tag = "queues",
    operation_id = "unset_group_policy",
    params(("queue" = String, Path, description = "A configured queue's name"), ("group" = String, Path, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$", description = "The group: 1 to 256 bytes, no control characters")),
    responses(
        (status = 200, description = "The group's policy is the config's again", body = GroupPolicyBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn unset_group_policy(_: Authorized, at: GroupAt) -> Result<Response, ApiError> {
    at.queue.set_policy(&at.group, None).await?;
    policy_answer(&at).await
}

/// The group's policy now, as the policy endpoints answer it.
async fn policy_answer(at: &GroupAt) -> Result<Response, ApiError> {
    let (policy, source) = at.queue.policy(&at.group).await?;
    Ok(Json(GroupPolicyBody {
        group: &at.group,
        policy: policy.to_string(),
        queue: &at.name,
        source: source.name(),
    })
    .into_response())
}

/// `GET /v1/queues/{queue}/schedules`: every schedule, by name, with its next tick.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/schedules",
    tag = "queues",
    operation_id = "list_schedules",
    params(("queue" = String, Path, description = "A configured queue's name")),
    responses(
        (status = 200, description = "Every schedule, with its next tick", body = SchedulesBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn list_schedules(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
) -> Result<Response, ApiError> {
    let kept = queue.schedules().await?;
    let schedules = kept.iter().map(ScheduleBodyOut::new).collect();
    Ok(Json(SchedulesBody { schedules }).into_response())
}

/// `GET /v1/queues/{queue}/schedules/{name}`: one schedule.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/schedules/{name}",
    tag = "queues",
    operation_id = "get_schedule",
    params(("queue" = String, Path, description = "A configured queue's name"), ("name" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The schedule's name: 1 to 128 bytes of `A-Z a-z 0-9 - _ . :`")),
    responses(
        (status = 200, description = "The schedule", body = ScheduleBodyOut),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue` or `unknown_schedule`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn get_schedule(_: Authorized, at: GroupAt) -> Result<Response, ApiError> {
    paceline_queue::schedule::check_schedule_name(&at.group).map_err(|e| ApiError::input(&e))?;
    let kept = at.queue.schedules().await?;
    match kept.iter().find(|s| s.name == at.group) {
        Some(s) => Ok(Json(ScheduleBodyOut::new(s)).into_response()),
        None => Err(no_schedule(&at.group)),
    }
}

/// `PUT /v1/queues/{queue}/schedules/{name}` `{"cron", "group", "payload"?, "timezone"?}`:
/// a job enqueued at each tick, once per tick across every instance; the same schedule put
/// again keeps its next tick.
#[utoipa::path(
    put,
    path = "/v1/queues/{queue}/schedules/{name}",
    tag = "queues",
    operation_id = "put_schedule",
    params(("queue" = String, Path, description = "A configured queue's name"), ("name" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The schedule's name: 1 to 128 bytes of `A-Z a-z 0-9 - _ . :`")),
    request_body = ScheduleBody,
    responses(
        (status = 200, description = "The schedule, kept", body = ScheduleBodyOut),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn put_schedule(
    _: Authorized,
    at: GroupAt,
    body: JsonBody<Object<ScheduleBody>>,
) -> Result<Response, ApiError> {
    let schedule = body.read()?.schedule()?;
    let kept = at.queue.put_schedule(&at.group, &schedule).await?;
    Ok(Json(ScheduleBodyOut::new(&kept)).into_response())
}

/// `DELETE /v1/queues/{queue}/schedules/{name}`: the schedule is removed (`204`).
#[utoipa::path(
    delete,
    path = "/v1/queues/{queue}/schedules/{name}",
    tag = "queues",
    operation_id = "delete_schedule",
    params(("queue" = String, Path, description = "A configured queue's name"), ("name" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The schedule's name: 1 to 128 bytes of `A-Z a-z 0-9 - _ . :`")),
    responses(
        (status = 204, description = "The schedule is removed"),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue` or `unknown_schedule`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn delete_schedule(_: Authorized, at: GroupAt) -> Result<StatusCode, ApiError> {
    if at.queue.delete_schedule(&at.group).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_schedule(&at.group))
    }
}

/// The error for a schedule the queue does not keep.
fn no_schedule(name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnknownSchedule,
        "name",
        format!(
            "no schedule `{name}` in this queue; GET /v1/queues/{{queue}}/schedules lists them"
        ),
    )
}

/// `GET /v1/queues/{queue}/jobs?state=waiting&group=G&offset=0&limit=100`: jobs in a state,
/// in the order the queue keeps them.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/jobs",
    tag = "queues",
    operation_id = "list_jobs",
    params(("queue" = String, Path, description = "A configured queue's name"), JobsQuery),
    responses(
        (status = 200, description = "The jobs: scheduled ones by when they join their groups, waiting ones by group then place in line, active ones by lease expiry, dead ones by death, completed ones by their end", body = JobsBody<JobBody>),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn list_jobs(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let allowed = "must be scheduled, waiting, active, dead or completed";
    let state = query
        .state
        .as_deref()
        .ok_or_else(|| ApiError::invalid("state", format!("is required: {allowed}")))?;
    let state = JobState::from_name(state)
        .filter(|s| *s != JobState::Finished)
        .ok_or_else(|| ApiError::invalid("state", allowed))?;
    let (offset, limit) = (query.offset, query.limit);
    listed(&queue, state, query.group.as_deref(), offset, limit).await
}

/// A page of the jobs in `state` (of `group`), as `GET .../jobs` and `GET .../dead` answer
/// it: `limit` 1 to [`MAX_DEAD_LIST`] (100 by default) after `offset` (0).
async fn listed(
    queue: &Queue,
    state: JobState,
    group: Option<&str>,
    offset: Option<usize>,
    limit: Option<usize>,
) -> Result<Response, ApiError> {
    let limit = limit.unwrap_or(100);
    if limit == 0 || limit > MAX_DEAD_LIST {
        return Err(ApiError::invalid(
            "limit",
            format!("must be from 1 to {MAX_DEAD_LIST}"),
        ));
    }
    let jobs = queue.jobs(state, group, offset.unwrap_or(0), limit).await?;
    let jobs: Vec<JobBody<'_>> = jobs.iter().map(job_body).collect();
    Ok(Json(JobsBody { jobs }).into_response())
}

/// `GET /v1/queues/{queue}/dead?offset=0&limit=100`: the dead jobs, oldest first.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/dead",
    tag = "queues",
    operation_id = "list_dead",
    params(("queue" = String, Path, description = "A configured queue's name"), DeadQuery),
    responses(
        (status = 200, description = "The dead jobs, oldest first", body = JobsBody<JobBody>),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn dead(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    listed(&queue, JobState::Dead, None, query.offset, query.limit).await
}

/// `POST /v1/queues/{queue}/dead/retry` `{"ids"?}`: those dead jobs (all without `ids`) go
/// back to their groups.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/dead/retry",
    tag = "queues",
    operation_id = "retry_dead",
    params(("queue" = String, Path, description = "A configured queue's name")),
    request_body = RetryBody,
    responses(
        (status = 200, description = "How many dead jobs went back to their groups", body = RetriedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 408, description = "`request_timeout`", body = Envelope),
        (status = 413, description = "`payload_too_large`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn retry_dead(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    body: JsonBody<Object<RetryBody>>,
) -> Result<Json<RetriedBody>, ApiError> {
    let body = body.read()?;
    let retried = queue.retry_dead(body.ids.as_deref()).await?;
    Ok(Json(RetriedBody { retried }))
}

/// `DELETE /v1/queues/{queue}/dead`: the dead jobs are dropped.
#[utoipa::path(
    delete,
    path = "/v1/queues/{queue}/dead",
    tag = "queues",
    operation_id = "purge_dead",
    params(("queue" = String, Path, description = "A configured queue's name")),
    responses(
        (status = 200, description = "How many dead jobs were dropped", body = PurgedBody),
        (status = 400, description = "`invalid_argument`: a field or the body is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable` or `store_full`", body = Envelope),
    )
)]
async fn purge_dead(
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
) -> Result<Json<PurgedBody>, ApiError> {
    let purged = queue.purge_dead().await?;
    Ok(Json(PurgedBody { purged }))
}

//! One policy at run time: `GET`, `PUT` and `DELETE /v1/policies/{name}`.
//!
//! | call | answer |
//! |---|---|
//! | `GET /v1/policies/{name}` | `200` the policy in force (`source`: `config` or `run_time`), `404` for none |
//! | `PUT /v1/policies/{name}` `{"spec": "gcra:rate=10/s,burst=5", "shadow": false}` | `201` a new policy, `200` one replaced (the file's, or one set before) |
//! | `DELETE /v1/policies/{name}` | `204`: the run-time policy is gone, and the config file's of that name, if any, applies again; `409` for a policy only the file sets; `404` for none |
//!
//! `spec` is a spec string, as a request's inline policy or a config file's `spec = "..."`
//! takes it. A change keeps the keys' state: under the
//! same algorithm the new parameters apply to it (a `concurrency` policy's leases held
//! stay held and count against the new limit; an extended one lives the new `lease`);
//! under another algorithm each key starts afresh (and the leases held of a `concurrency`
//! policy so replaced, or deleted, are `404 unknown_lease`, reclaimed at their expiry).
//! Each change is logged at INFO (the policy, its spec before and after).

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use paceline_store::{InputError, Policy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::PolicyBody;
use crate::error::{ApiError, Envelope, ErrorCode};
use crate::extract::{path_parts, Authorized, JsonBody, JsonSchema};
use crate::request;
use crate::runtime_policies::{check_name, log_change, Entry};
use crate::state::{AppState, Live};

/// The longest spec string, in bytes.
const MAX_SPEC: usize = 1_024;

/// The largest body of `PUT /v1/policies/{name}`.
const MAX_PUT_BODY: usize = 16 * 1024;

/// The routes of one policy.
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/policies/{name}", get(read).put(put).delete(delete))
}

/// A policy in force, with its name.
#[derive(Serialize, ToSchema)]
#[schema(as = NamedPolicy)]
struct Named {
    name: String,
    #[serde(flatten)]
    policy: PolicyBody,
}

/// `PUT /v1/policies/{name}`'s body, as sent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a JSON object with `spec`")]
#[schema(
    as = PolicyChange,
    example = json!({"spec": "gcra:rate=10/s,burst=5", "shadow": false})
)]
struct RawPut {
    /// The policy: a spec string (`gcra:rate=10/s,burst=5`, at most 1,024 bytes). The
    /// pattern: the spec forms this document vouches for (every algorithm's spec is taken).
    #[schema(value_type = String, required = true, max_length = 1024, pattern = "^(gcra:rate=[1-9][0-9]{0,3}/(s|m|h),burst=[1-9][0-9]{0,3}|(fixed_window|sliding_window):limit=[1-9][0-9]{0,3},window=[1-9][0-9]{0,2}(s|m|h)|concurrency:limit=[1-9][0-9]{0,3},lease=[1-9][0-9]{0,2}(s|m))$")]
    spec: Option<Value>,
    /// Shadow mode: decided and counted as usual, a refusal answered as admitted (not on a
    /// `concurrency` policy); `false` by default.
    shadow: Option<bool>,
}

/// What each field of `PUT /v1/policies/{name}` takes, as an error message says it.
const ALLOWED: &[(&str, &str)] = &[
    ("spec", "a spec string, e.g. \"gcra:rate=10/s,burst=5\""),
    ("shadow", "true or false"),
];

/// `PUT /v1/policies/{name}`'s body: [`RawPut`].
enum PutSchema {}

impl JsonSchema for PutSchema {
    const LIMIT: usize = MAX_PUT_BODY;
    type Value<'a> = RawPut;

    fn read(json: &str) -> Result<RawPut, ApiError> {
        Ok(request::object(json, "a JSON object with `spec`", ALLOWED)?)
    }
}

/// The policy of `spec`, as sent; errors name `spec`, with the parser's message.
fn policy_of(spec: Option<Value>) -> Result<Policy, ApiError> {
    let bad = |e: InputError| ApiError::invalid("spec", e.to_string());
    match spec {
        None | Some(Value::Null) => Err(ApiError::invalid(
            "spec",
            "is required: a spec string, e.g. \"gcra:rate=10/s,burst=5\"",
        )),
        Some(Value::String(text)) if text.len() > MAX_SPEC => Err(ApiError::invalid(
            "spec",
            format!("is {} bytes long; a spec is at most {MAX_SPEC}", text.len()),
        )),
        Some(Value::String(text)) => text.parse().map_err(bad),
        Some(other) => Err(ApiError::invalid(
            "spec",
            format!(
                "{} is not a policy; use a spec string, e.g. \"gcra:rate=10/s,burst=5\"",
                kind(&other)
            ),
        )),
    }
}

/// A JSON value's type, as a message names it.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The name in a path, checked (errors name `name`).
fn name_of(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let name = path_parts(path, "the policy's name")?;
    check_name(&name)?;
    Ok(name)
}

/// `GET /v1/policies/{name}`: the policy in force of that name.
#[utoipa::path(
    get,
    path = "/v1/policies/{name}",
    tag = "policies",
    operation_id = "get_policy",
    params(("name" = String, Path, min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*$", description = "A policy's name: 1 to 128 of `A-Z a-z 0-9 - _ .`, not dots alone")),
    responses(
        (status = 200, description = "The policy in force, and where it comes from", body = Named),
        (status = 400, description = "`invalid_argument`: not a policy name (`name`)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_policy`", body = Envelope),
    )
)]
async fn read(
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Named>, ApiError> {
    let name = path_parts(path, "the policy's name")?;
    match live.policies.get(&name) {
        Some(c) => Ok(Json(Named {
            policy: PolicyBody::of(c),
            name,
        })),
        None => {
            check_name(&name)?;
            Err(ApiError::unknown_policy(&name, "name"))
        }
    }
}

/// `PUT /v1/policies/{name}`: sets the policy of that name at run time, on every instance
/// sharing the store; it overrides the config file's of that name until deleted.
#[utoipa::path(
    put,
    path = "/v1/policies/{name}",
    tag = "policies",
    operation_id = "put_policy",
    params(("name" = String, Path, min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*$", description = "The policy's name: 1 to 128 of `A-Z a-z 0-9 - _ .`, not dots alone")),
    request_body = RawPut,
    responses(
        (status = 200, description = "The policy, replacing the one of that name (the file's, or one set before)", body = Named),
        (status = 201, description = "The policy, new", body = Named),
        (status = 400, description = "`invalid_argument`: the name (`name`), the spec (`spec`, with the parser's message) or `shadow` is wrong", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 409, description = "`conflict`: the service holds 1,000 policies set at run time, its most", body = Envelope),
        (status = 413, description = "`payload_too_large`: the body is over 16 KiB", body = Envelope),
        (status = 503, description = "`store_unavailable`: Redis, which keeps the policies set at run time, failed", body = Envelope),
    )
)]
async fn put(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
    body: JsonBody<PutSchema>,
) -> Result<(StatusCode, Json<Named>), ApiError> {
    let name = name_of(path)?;
    let raw = body.read()?;
    let policy = policy_of(raw.spec)?;
    let shadow = raw.shadow.unwrap_or(false);
    if shadow {
        crate::config::check_shadow(&policy).map_err(|m| ApiError::invalid("shadow", m))?;
    }
    let entry = Entry { policy, shadow };
    let previous = state.runtime.put(&name, entry.clone()).await?;
    state.apply_runtime_policies();
    // What was in force before: the previous run-time entry, or the file's.
    let before = previous.clone().or_else(|| file_entry(&live, &name));
    let status = if before.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    log_change(
        &(name.clone(), before, Some(entry.clone())),
        "PUT /v1/policies",
    );
    let overrides = file_entry(&state.live(), &name);
    Ok((status, Json(named(name, &entry, overrides))))
}

/// `DELETE /v1/policies/{name}`: deletes the policy set at run time of that name; the
/// config file's of that name, if any, applies again.
#[utoipa::path(
    delete,
    path = "/v1/policies/{name}",
    tag = "policies",
    operation_id = "delete_policy",
    params(("name" = String, Path, min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*$", description = "The name of a policy set at run time")),
    responses(
        (status = 204, description = "The policy set at run time is deleted; the config file's of that name, if any, applies again"),
        (status = 400, description = "`invalid_argument`: not a policy name (`name`)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_policy`", body = Envelope),
        (status = 409, description = "`conflict`: the policy is the config file's alone; it is removed from the file (and a reload)", body = Envelope),
        (status = 503, description = "`store_unavailable`: Redis, which keeps the policies set at run time, failed", body = Envelope),
    )
)]
async fn delete(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_parts(path, "the policy's name")?;
    let in_file = file_entry(&live, &name);
    if check_name(&name).is_err() && in_file.is_some() {
        return Err(only_in_file(&name));
    }
    check_name(&name)?;
    let Some(previous) = state.runtime.delete(&name).await? else {
        return Err(match in_file {
            Some(_) => only_in_file(&name),
            None => ApiError::unknown_policy(&name, "name"),
        });
    };
    state.apply_runtime_policies();
    log_change(&(name, Some(previous), in_file), "DELETE /v1/policies");
    Ok(StatusCode::NO_CONTENT)
}

/// `409 conflict`: `name` is the config file's alone; nothing set at run time to delete.
fn only_in_file(name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        "name",
        format!(
            "the policy `{name}` comes from the config file, and none of that name was set at \
             run time: remove it from the file and reload (POST /v1/reload), or override it \
             with PUT /v1/policies/{name}"
        ),
    )
}

/// The config file's policy `name` in `live`, as an entry.
fn file_entry(live: &Live, name: &str) -> Option<Entry> {
    let settings = live.settings();
    settings.policies.get(name).map(|policy| Entry {
        policy: policy.clone(),
        shadow: settings.shadow.contains(name),
    })
}

/// The answer of a policy set at run time: `entry`, over the file's `overrides` if any.
fn named(name: String, entry: &Entry, overrides: Option<Entry>) -> Named {
    let policy = PolicyBody {
        algorithm: entry.policy.algorithm(),
        limit: entry.policy.limit(),
        overrides: overrides.map(|e| super::FilePolicy {
            shadow: e.shadow,
            spec: e.policy.to_string(),
        }),
        shadow: entry.shadow,
        source: super::SourceName::RunTime,
        spec: entry.policy.to_string(),
    };
    Named { name, policy }
}

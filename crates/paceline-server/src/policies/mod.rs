//! The policies over HTTP: `GET /v1/policies` lists those in force (the config file's, and
//! those set at run time, each saying where it comes from), `DELETE /v1/keys/{policy}/{key}`
//! resets one key of one (`204`), as if it had never been asked; one policy is read, set and
//! deleted at run time in [`runtime`].
//!
//! ```json
//! {"allow_inline_policies": false,
//!  "policies": {"discord-roles": {"algorithm": "fixed_window", "limit": 10,
//!                                 "source": "config",
//!                                 "spec": "fixed_window:limit=10,window=10s"}}}
//! ```

pub(crate) mod runtime;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, Envelope};
use crate::extract::{path_parts, Authorized};
use crate::fields::check_key;
use crate::state::{store_key, AppState, Configured, Source};

/// The policies' routes.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/policies", get(policies))
        .merge(runtime::routes())
        .route("/v1/keys/{policy}/{key}", delete(reset_key))
}

/// `GET /v1/policies` (fields in the order JSON objects print).
#[derive(Serialize, ToSchema)]
#[schema(as = Policies)]
struct PoliciesBody {
    /// Whether requests may give a spec in place of a configured name.
    allow_inline_policies: bool,
    /// The policies in force, by name: the config file's, and those set at run time.
    policies: BTreeMap<String, PolicyBody>,
}

/// One policy in force.
#[derive(Serialize, ToSchema)]
#[schema(as = ConfiguredPolicy)]
struct PolicyBody {
    /// Its algorithm: `gcra`, `pacer`, `fixed_window`, `concurrency`, ...
    #[schema(value_type = String)]
    algorithm: &'static str,
    limit: u64,
    /// For a policy set at run time over the config file's of the same name: the file's,
    /// which applies again once the run-time one is deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    overrides: Option<FilePolicy>,
    /// Present, `true`, for a policy in shadow mode (`shadow = true`): decided and counted
    /// as usual, its refusals answered as admitted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
    /// Where it comes from: `config` (the config file) or `run_time` (`PUT
    /// /v1/policies/{name}`, kept until deleted, over reloads).
    source: SourceName,
    spec: String,
}

/// Where a policy comes from.
#[derive(Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum SourceName {
    /// The config file.
    Config,
    /// Set at run time.
    RunTime,
}

/// The config file's policy that one set at run time overrides.
#[derive(Serialize, ToSchema)]
struct FilePolicy {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
    spec: String,
}

impl PolicyBody {
    /// The body of `c`.
    fn of(c: &Configured) -> PolicyBody {
        let p = c.policy();
        let (source, overrides) = match c.source() {
            Source::Config => (SourceName::Config, None),
            Source::Runtime { overrides } => (
                SourceName::RunTime,
                overrides.as_ref().map(|(policy, shadow)| FilePolicy {
                    shadow: *shadow,
                    spec: policy.to_string(),
                }),
            ),
        };
        PolicyBody {
            algorithm: p.algorithm(),
            limit: p.limit(),
            overrides,
            shadow: c.shadow(),
            source,
            spec: p.to_string(),
        }
    }
}

/// `GET /v1/policies`: the policies in force, by name.
#[utoipa::path(
    get,
    path = "/v1/policies",
    tag = "policies",
    operation_id = "list_policies",
    responses(
        (status = 200, description = "The policies in force: the config file's, and those set at run time", body = PoliciesBody),
        (status = 401, description = "`unauthenticated`", body = Envelope),
    )
)]
async fn policies(Authorized(live): Authorized) -> Json<PoliciesBody> {
    let policies = live
        .policies
        .iter()
        .map(|(name, c)| (name.clone(), PolicyBody::of(c)))
        .collect();
    Json(PoliciesBody {
        allow_inline_policies: live.allow_inline_policies,
        policies,
    })
}

/// `DELETE /v1/keys/{policy}/{key}`: `204`; `404` for a policy not configured.
#[utoipa::path(
    delete,
    path = "/v1/keys/{policy}/{key}",
    tag = "policies",
    operation_id = "reset_key",
    params(
        ("policy" = String, Path, description = "A configured policy's name"),
        ("key" = String, Path, min_length = 1, max_length = 512, description = "The key whose state is dropped: 1 to 512 bytes"),
    ),
    responses(
        (status = 204, description = "The key's state is dropped: its limit is whole again"),
        (status = 400, description = "`invalid_argument`: the key is empty or over 512 bytes", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_policy`", body = Envelope),
        (status = 503, description = "`store_unavailable`", body = Envelope),
    )
)]
async fn reset_key(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let (policy, key) = path_parts(path, "the policy and key")?;
    if !live.policies.contains_key(&policy) {
        return Err(ApiError::unknown_policy(&policy, "policy"));
    }
    check_key(&key, "key")?;
    state.store.reset(&store_key(&policy, &key)).await?;
    Ok(StatusCode::NO_CONTENT)
}

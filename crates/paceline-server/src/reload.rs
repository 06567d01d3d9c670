//! Live reload: the config file read again (on `POST /v1/reload`, or SIGHUP through
//! [`crate::Reloader`]) and its policies and access rules applied to the requests that
//! follow. The listen address, the store and the queues need a restart; a reload says so
//! when the file changed them. A file that does not load leaves the running configuration
//! as it is, and the answer (`422 invalid_config`) says why; a service started without a
//! config file has nothing to reload (`409 conflict`), unless it serves RLS rules
//! (`--rls-config`): those are read again too, and a file of them that does not load keeps
//! the running rules (logged at WARN, naming the file and the line).

use std::sync::{Arc, PoisonError};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::config;
use crate::error::{ApiError, Envelope, ErrorCode};
use crate::extract::Authorized;
use crate::state::{AppState, Live};

/// The reload route.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/reload", post(reload))
}

/// `POST /v1/reload`'s answer: what was loaded, and what needs a restart.
#[derive(Serialize, ToSchema)]
struct Reloaded {
    message: String,
    reloaded: bool,
}

/// `POST /v1/reload`: re-reads the config file; logged at INFO, or at WARN when the file is
/// refused (see `AppState::reload`).
#[utoipa::path(
    post,
    path = "/v1/reload",
    tag = "service",
    operation_id = "reload",
    responses(
        (status = 200, description = "The config file's policies and access rules apply now", body = Reloaded),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 409, description = "`conflict`: the service was started without a config file; there is nothing to reload", body = Envelope),
        (status = 422, description = "`invalid_config`: the file did not load; the previous configuration stays", body = Envelope),
    )
)]
async fn reload(
    State(state): State<Arc<AppState>>,
    _: Authorized,
) -> Result<Json<Reloaded>, ApiError> {
    if !state.has_config_file() && state.rls.is_none() {
        return Err(ApiError::new(ErrorCode::Conflict, "config", NO_FILE));
    }
    let message = state
        .reload("POST /v1/reload")
        .map_err(|message| ApiError::new(ErrorCode::InvalidConfig, "config", message))?;
    Ok(Json(Reloaded {
        message,
        reloaded: true,
    }))
}

/// Why a service started without a config file reloads nothing.
const NO_FILE: &str = "the service was started without --config; there is nothing to reload";

impl AppState {
    /// Whether the service was started with a config file (one to reload).
    fn has_config_file(&self) -> bool {
        let base = self.base.lock().unwrap_or_else(PoisonError::into_inner);
        base.config_file.is_some()
    }

    /// Re-reads the config file and applies its policies and access rules, for `trigger`
    /// (`SIGHUP`, `POST /v1/reload`), and logs the outcome: `reloaded: ...` at INFO, or
    /// `reload failed: ...; the previous configuration stays` at WARN (an operator who
    /// sent a bad file must see it among the warnings).
    pub(crate) fn reload(&self, trigger: &str) -> Result<String, String> {
        let outcome = self.reload_all();
        match &outcome {
            Ok(message) => tracing::info!(target: "paceline", trigger, "reloaded: {message}"),
            Err(message) => {
                tracing::warn!(target: "paceline", trigger, "reload failed: {message}")
            }
        }
        outcome
    }

    /// Re-reads the config file (if the service has one), then the RLS rules (if it has
    /// them). RLS rules that do not load leave the running ones as they are (their counters
    /// are kept either way: an unchanged rule counts under the same keys).
    fn reload_all(&self) -> Result<String, String> {
        let mut message = if self.has_config_file() {
            Some(self.reload_file()?)
        } else {
            None
        };
        if let Some(rls) = &self.rls {
            let loaded = rls.reload().map_err(|e| {
                let before = match &message {
                    Some(m) => format!("{m}; but "),
                    None => String::new(),
                };
                format!("{before}the RLS rules did not load: {e}; the previous RLS rules stay")
            })?;
            message = Some(match message {
                Some(m) => format!("{m}; {loaded}"),
                None => loaded,
            });
        }
        message.ok_or_else(|| NO_FILE.to_string())
    }

    /// Re-reads the config file and applies its policies and access rules.
    fn reload_file(&self) -> Result<String, String> {
        let base = self.base.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(path) = &base.config_file else {
            return Err(NO_FILE.into());
        };
        let file = config::read_file(path)
            .map_err(|e| format!("{e}; the previous configuration stays"))?;
        let mut notes = Vec::new();
        if file.store.as_ref().is_some_and(|s| *s != base.store) {
            notes.push("`store` changed: restart to apply it");
        }
        if file.listen.is_some_and(|l| l != base.listen) {
            notes.push("`listen` changed: restart to apply it");
        }
        if file.queues != base.queues {
            notes.push("`queues` changed: restart to apply them");
        }
        let mut next = base.clone();
        next.apply_live(file);
        let count = next.policies.len();
        *self.live.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Live::new(&next, &self.metrics));
        let mut message = format!("{count} policies loaded from {}", path.display());
        for note in notes {
            message.push_str("; ");
            message.push_str(note);
        }
        Ok(message)
    }
}

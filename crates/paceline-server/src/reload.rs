//! Live reload: the config file read again (on `POST /v1/reload`, or SIGHUP through
//! [`crate::Reloader`]) and its policies and access rules applied to the requests that
//! follow. The listen address, the store and the queues need a restart; a reload says so
//! when the file changed them. A file that does not load leaves the running configuration
//! as it is, and the answer (`422 invalid_config`) says why; a service started without a
//! config file has nothing to reload (`409 conflict`), unless it serves RLS rules
//! (`--rls-config`): those are read again too, and a file of them that does not load keeps
//! the running rules (logged at WARN, naming the file and the line).
//!
//! The policies set at run time ([`crate::runtime_policies`]) are laid over the file's at
//! every reload, and again at every change of theirs (made here, or by another instance
//! sharing the store, which [`AppState::follow_runtime_policies`] watches for).

use std::future::Future;
use std::sync::{Arc, PoisonError};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::config;
use crate::error::{ApiError, Envelope, ErrorCode};
use crate::extract::Authorized;
use crate::runtime_policies::{log_change, FULL_READ_EVERY, POLL};
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
            Arc::new(Live::new(&next, &self.metrics, &self.runtime.entries()));
        let mut message = format!("{count} policies loaded from {}", path.display());
        for note in notes {
            message.push_str("; ");
            message.push_str(note);
        }
        Ok(message)
    }
}

impl AppState {
    /// Lays the table of policies set at run time over the file's again, after it changed:
    /// the requests that follow decide with it.
    pub(crate) fn apply_runtime_policies(&self) {
        // One rebuild at a time, reloads included (they hold this lock while they build).
        let _one_at_a_time = self.base.lock().unwrap_or_else(PoisonError::into_inner);
        let settings = self.live().settings().clone();
        let live = Live::new(&settings, &self.metrics, &self.runtime.entries());
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(live);
    }

    /// Follows the changes other instances make to the policies set at run time (a store
    /// in Redis): asks every [`POLL`] whether the table changed, reading it whole every
    /// [`FULL_READ_EVERY`] polls anyway, and applies and logs what changed, until `stop`.
    pub(crate) async fn follow_runtime_policies(&self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut polls: u32 = 0;
        let mut failing = false;
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(POLL) => {}
            }
            polls = polls.wrapping_add(1);
            match self
                .runtime
                .refresh(polls.is_multiple_of(FULL_READ_EVERY))
                .await
            {
                Ok(changes) => {
                    if failing {
                        tracing::info!(target: "paceline", "the policies set at run time are read from Redis again");
                        failing = false;
                    }
                    if !changes.is_empty() {
                        self.apply_runtime_policies();
                        for change in &changes {
                            log_change(change, "the store (another instance)");
                        }
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        target: "paceline",
                        "the policies set at run time could not be read from Redis: {}; the last read stay until it answers",
                        e.message()
                    );
                }
                Err(_) => {}
            }
        }
    }
}

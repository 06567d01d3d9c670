//! The HTTP API: routes, request validation, responses.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use paceline::{Decision, Error, MemoryStore, Op, Policy, Store, StoreErrorKind};
use paceline_redis::{RedisStore, Request};
use serde_json::{json, Map, Value};

use crate::config::Settings;
use crate::metrics::{DecisionLabels, Metrics, PolicyLabel};

/// The largest body of `POST /v1/decisions`.
pub const MAX_BODY: usize = 64 * 1024;
/// The largest body of `POST /v1/decisions/batch`.
pub const MAX_BATCH_BODY: usize = 1024 * 1024;
/// The most requests in one batch.
pub const MAX_BATCH: usize = 1_000;
/// The longest key, in bytes.
pub const MAX_KEY: usize = 512;

/// Where keys' state lives.
pub(crate) enum Backend {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Backend {
    async fn decide(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(s) => s.decide(policy, key, op, cost).await,
            Backend::Redis(s) => s.decide(policy, key, op, cost).await,
        }
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        match self {
            Backend::Memory(s) => s.reset(key).await,
            Backend::Redis(s) => s.reset(key).await,
        }
    }
}

/// What a reload can change: the policies and the access rules.
pub(crate) struct Live {
    pub(crate) policies: BTreeMap<String, Policy>,
    pub(crate) auth_token: Option<String>,
    pub(crate) allow_inline_policies: bool,
}

impl Live {
    pub(crate) fn from(settings: &Settings) -> Live {
        Live {
            policies: settings.policies.clone(),
            auth_token: settings.auth_token.clone(),
            allow_inline_policies: settings.allow_inline_policies,
        }
    }
}

/// Shared by every request.
pub(crate) struct AppState {
    pub(crate) live: RwLock<Arc<Live>>,
    pub(crate) backend: Backend,
    pub(crate) metrics: Metrics,
    /// Runs a reload and says what happened (for `POST /v1/reload`).
    pub(crate) reload: Box<dyn Fn() -> Result<String, String> + Send + Sync>,
}

impl AppState {
    fn live(&self) -> Arc<Live> {
        Arc::clone(
            &self
                .live
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The service's routes.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route(
            "/v1/decisions",
            post(decision).layer(DefaultBodyLimit::max(MAX_BODY)),
        )
        .route(
            "/v1/decisions/batch",
            post(batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY)),
        )
        .route("/v1/keys/{policy}/{key}", delete(reset_key))
        .route("/v1/policies", get(policies))
        .route("/v1/reload", post(reload))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            authenticate,
        ));
    Router::new()
        .merge(v1)
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "path",
                "no such endpoint; see GET /v1/policies, POST /v1/decisions",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method",
                "this endpoint does not take that method",
            )
        })
        .with_state(state)
}

/// A JSON error: `{"error": {"code", "field", "message"}}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    field: String,
    message: String,
}

impl ApiError {
    fn new(
        status: StatusCode,
        code: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            field: field.into(),
            message: message.into(),
        }
    }

    fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", field, message)
    }

    fn body(&self) -> Value {
        json!({"error": {"code": self.code, "field": self.field, "message": self.message}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

async fn authenticate(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let live = state.live();
    if let Some(token) = &live.auth_token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "authorization",
                "send the service's token as `Authorization: Bearer TOKEN`",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A validated request.
struct Ask {
    /// The name in responses and metrics: the configured name, or `inline`.
    name: String,
    policy: Policy,
    /// The key in the store: namespaced by policy.
    store_key: String,
    op: Op,
    cost: u64,
}

/// Reads a body as JSON, turning a too-large body into 413.
fn json_body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Value, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "body",
                format!("the body is over {limit} bytes"),
            )
        } else {
            ApiError::invalid("body", rejection.body_text())
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("body", format!("not valid JSON: {e}")))
}

/// Validates one request object against the live policies.
fn validate(live: &Live, value: &Value) -> Result<Ask, ApiError> {
    let Value::Object(fields) = value else {
        return Err(ApiError::invalid(
            "body",
            "must be a JSON object with `policy` and `key`",
        ));
    };
    const FIELDS: &[&str] = &["policy", "key", "op", "cost", "max_wait_ms"];
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            unknown.as_str(),
            format!("unknown field; the fields are {}", FIELDS.join(", ")),
        ));
    }
    let text = |name: &str| -> Result<Option<&str>, ApiError> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(ApiError::invalid(
                name,
                format!("must be a string, not {}", kind(other)),
            )),
        }
    };
    let spec = text("policy")?.ok_or_else(|| {
        ApiError::invalid(
            "policy",
            "is required: a configured policy's name or a spec",
        )
    })?;
    let key = text("key")?.ok_or_else(|| ApiError::invalid("key", "is required"))?;
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ApiError::invalid(
            "key",
            format!("must be 1 to {MAX_KEY} bytes long"),
        ));
    }
    let op_name = text("op")?.unwrap_or("pace");
    let cost = match fields.get("cost") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if c >= 1 => c,
            _ => {
                return Err(ApiError::invalid(
                    "cost",
                    format!("{n} is not allowed; use a whole number of at least 1"),
                ))
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(
                "cost",
                format!("must be a whole number, not {}", kind(other)),
            ))
        }
    };
    let max_wait = match fields.get("max_wait_ms") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(ms) if (0.0..=1e13).contains(&ms) => Some(Duration::from_secs_f64(ms / 1000.0)),
            _ => {
                return Err(ApiError::invalid(
                    "max_wait_ms",
                    format!("{n} is not allowed; use milliseconds from 0 to 1e13"),
                ))
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(
                "max_wait_ms",
                format!("must be a number, not {}", kind(other)),
            ))
        }
    };
    let op = match (op_name, max_wait) {
        ("pace", None) => Op::pace(),
        ("pace", Some(w)) => Op::pace_within(w),
        ("limit" | "peek", Some(_)) => {
            return Err(ApiError::invalid("max_wait_ms", "applies to `pace` only"));
        }
        ("limit", None) => Op::Limit,
        ("peek", None) => Op::Peek,
        (other, _) => {
            return Err(ApiError::invalid(
                "op",
                format!("`{other}` is not an op; use pace, limit or peek"),
            ))
        }
    };
    let (name, policy, namespace) = match live.policies.get(spec) {
        Some(p) => (spec.to_string(), p.clone(), spec.to_string()),
        None if spec.contains(':') => {
            if !live.allow_inline_policies {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "inline_policies_disabled",
                    "policy",
                    "inline policy specs are turned off on this service; use a configured policy's name (GET /v1/policies)",
                ));
            }
            let policy: Policy = spec.parse().map_err(|e: paceline::InputError| {
                ApiError::invalid(format!("policy.{}", e.field()), e.message().to_string())
            })?;
            // The canonical spec keeps equal policies on the same keys.
            let namespace = format!("~{policy}");
            ("inline".to_string(), policy, namespace)
        }
        None => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_policy",
                "policy",
                format!("no policy named `{spec}`; see GET /v1/policies"),
            ));
        }
    };
    policy
        .check_cost(op, cost)
        .map_err(|e| ApiError::invalid(e.field().to_string(), e.message().to_string()))?;
    Ok(Ask {
        store_key: format!("{namespace}:{key}"),
        name,
        policy,
        op,
        cost,
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Milliseconds with microsecond precision.
fn ms(d: Duration) -> f64 {
    let us = d.as_nanos().saturating_add(500) / 1_000;
    (us.min(u128::from(u64::MAX)) as u64) as f64 / 1000.0
}

/// The response for one decision: its status, body and rate-limit headers.
fn answer(
    state: &AppState,
    ask: &Ask,
    outcome: Result<Decision, Error>,
) -> (StatusCode, HeaderMap, Value) {
    let mut headers = HeaderMap::new();
    let decision = match outcome {
        Ok(d) => d,
        Err(e) => {
            let labels = DecisionLabels {
                policy: ask.name.clone(),
                outcome: "error",
            };
            state.metrics.decisions.get_or_create(&labels).inc();
            let error = match e {
                Error::Input(e) => {
                    ApiError::invalid(e.field().to_string(), e.message().to_string())
                }
                Error::Store(e) => {
                    state.metrics.store_errors.inc();
                    let code = if e.kind() == StoreErrorKind::Capacity {
                        "store_full"
                    } else {
                        "store_unavailable"
                    };
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        code,
                        "store",
                        e.message().to_string(),
                    )
                }
                other => ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "store",
                    other.to_string(),
                ),
            };
            return (error.status, headers, error.body());
        }
    };
    let outcome = match (decision.fallback, decision.allowed) {
        (Some(f), _) => f.name(),
        (None, true) => "allowed",
        (None, false) => "rejected",
    };
    if decision.fallback.is_some() {
        state.metrics.store_errors.inc();
    }
    state
        .metrics
        .decisions
        .get_or_create(&DecisionLabels {
            policy: ask.name.clone(),
            outcome,
        })
        .inc();
    if decision.allowed {
        state
            .metrics
            .delay
            .get_or_create(&PolicyLabel {
                policy: ask.name.clone(),
            })
            .observe(decision.delay.as_secs_f64());
    }
    let seconds_up = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let quoted = format!("\"{}\"", ask.name);
    if let Ok(v) = HeaderValue::from_str(&format!("{quoted};q={}", decision.limit)) {
        headers.insert("ratelimit-policy", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{quoted};r={};t={}",
        decision.remaining,
        seconds_up(decision.reset_after)
    )) {
        headers.insert("ratelimit", v);
    }
    let status = if decision.allowed {
        StatusCode::OK
    } else {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(seconds_up(decision.delay).max(1)),
        );
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut body = Map::new();
    body.insert("allowed".into(), decision.allowed.into());
    body.insert("delay_ms".into(), ms(decision.delay).into());
    body.insert("remaining".into(), decision.remaining.into());
    body.insert("reset_after_ms".into(), ms(decision.reset_after).into());
    body.insert("limit".into(), decision.limit.into());
    body.insert("policy".into(), ask.name.clone().into());
    if let Some(f) = decision.fallback {
        body.insert("fallback".into(), f.name().into());
    }
    (status, headers, Value::Object(body))
}

async fn decision(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let live = state.live();
    let ask = match json_body(body, MAX_BODY).and_then(|v| validate(&live, &v)) {
        Ok(ask) => ask,
        Err(e) => return e.into_response(),
    };
    let started = Instant::now();
    let outcome = state
        .backend
        .decide(&ask.policy, &ask.store_key, ask.op, ask.cost)
        .await;
    state.metrics.observe_store(started.elapsed());
    let (status, headers, body) = answer(&state, &ask, outcome);
    (status, headers, Json(body)).into_response()
}

async fn batch(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let items = match json_body(body, MAX_BATCH_BODY) {
        Ok(Value::Array(items)) => items,
        Ok(other) => {
            return ApiError::invalid(
                "body",
                format!("must be a JSON array of requests, not {}", kind(&other)),
            )
            .into_response();
        }
        Err(e) => return e.into_response(),
    };
    if items.len() > MAX_BATCH {
        return ApiError::invalid(
            "body",
            format!("{} requests; at most {MAX_BATCH} per batch", items.len()),
        )
        .into_response();
    }
    let live = state.live();
    let asks: Vec<Result<Ask, ApiError>> = items.iter().map(|item| validate(&live, item)).collect();
    let valid: Vec<&Ask> = asks.iter().filter_map(|a| a.as_ref().ok()).collect();
    let started = Instant::now();
    let mut outcomes = match &state.backend {
        // One round trip per Redis node for the whole batch, in order.
        Backend::Redis(store) => {
            let requests: Vec<Request> = valid
                .iter()
                .map(|a| Request {
                    policy: &a.policy,
                    key: &a.store_key,
                    op: a.op,
                    cost: a.cost,
                })
                .collect();
            store.decide_batch(&requests).await
        }
        Backend::Memory(store) => {
            let mut out = Vec::with_capacity(valid.len());
            for a in &valid {
                out.push(store.decide(&a.policy, &a.store_key, a.op, a.cost).await);
            }
            out
        }
    }
    .into_iter();
    if !valid.is_empty() {
        state.metrics.observe_store(started.elapsed());
    }
    let results: Vec<Value> = asks
        .iter()
        .map(|ask| {
            let (status, body) = match ask {
                Ok(ask) => {
                    let outcome = outcomes.next().unwrap_or_else(|| {
                        Err(paceline::StoreError::new(StoreErrorKind::Protocol, "no answer").into())
                    });
                    let (status, _, body) = answer(&state, ask, outcome);
                    (status, body)
                }
                Err(e) => (e.status, e.body()),
            };
            let mut body = match body {
                Value::Object(m) => m,
                other => Map::from_iter([("body".to_string(), other)]),
            };
            body.insert("status".into(), status.as_u16().into());
            Value::Object(body)
        })
        .collect();
    (StatusCode::OK, Json(Value::Array(results))).into_response()
}

async fn reset_key(
    State(state): State<Arc<AppState>>,
    Path((policy, key)): Path<(String, String)>,
) -> Response {
    let live = state.live();
    if !live.policies.contains_key(&policy) {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_policy",
            "policy",
            format!("no policy named `{policy}`; see GET /v1/policies"),
        )
        .into_response();
    }
    if key.is_empty() || key.len() > MAX_KEY {
        return ApiError::invalid("key", format!("must be 1 to {MAX_KEY} bytes long"))
            .into_response();
    }
    match state.backend.reset(&format!("{policy}:{key}")).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "store",
            e.to_string(),
        )
        .into_response(),
    }
}

async fn policies(State(state): State<Arc<AppState>>) -> Json<Value> {
    let live = state.live();
    let policies: Map<String, Value> = live
        .policies
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                json!({"spec": p.to_string(), "algorithm": p.algorithm(), "limit": p.limit()}),
            )
        })
        .collect();
    Json(json!({"policies": policies, "allow_inline_policies": live.allow_inline_policies}))
}

async fn reload(State(state): State<Arc<AppState>>) -> Response {
    match (state.reload)() {
        Ok(message) => Json(json!({"reloaded": true, "message": message})).into_response(),
        Err(message) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_config",
            "config",
            message,
        )
        .into_response(),
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let ready = match &state.backend {
        Backend::Memory(_) => Ok(()),
        Backend::Redis(store) => store.ping().await.map_err(|e| e.to_string()),
    };
    match ready {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "message": why})),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

//! The HTTP API: routes, request validation, responses.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Extension;
use axum::{Json, Router};
use paceline::{Decision, Error, MemoryStore, Op, Policy, Store, StoreErrorKind};
use paceline_redis::{RedisStore, Request};
use serde::Serialize;
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

    /// Decides `asks` in order: on Redis in one round trip per node, in memory one by one.
    async fn decide_batch(&self, asks: &[&Ask]) -> Vec<Result<Decision, Error>> {
        match self {
            Backend::Redis(store) => {
                let requests: Vec<Request> = asks
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
                let mut out = Vec::with_capacity(asks.len());
                for a in asks {
                    out.push(store.decide(&a.policy, &a.store_key, a.op, a.cost).await);
                }
                out
            }
        }
    }

    /// Whether the store answers (Redis: a `PING`).
    async fn ready(&self) -> Result<(), String> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(store) => store.ping().await.map_err(|e| e.to_string()),
        }
    }
}

/// The most inline specs remembered parsed; beyond, the memory starts over.
const INLINE_CACHE: usize = 1_024;

/// What a reload can change: the policies and the access rules.
pub(crate) struct Live {
    pub(crate) policies: BTreeMap<String, Policy>,
    pub(crate) auth_token: Option<String>,
    pub(crate) allow_inline_policies: bool,
    /// Inline specs already parsed: the policy and its key namespace.
    inline: RwLock<HashMap<String, (Policy, String)>>,
}

impl Live {
    pub(crate) fn from(settings: &Settings) -> Live {
        Live {
            policies: settings.policies.clone(),
            auth_token: settings.auth_token.clone(),
            allow_inline_policies: settings.allow_inline_policies,
            inline: RwLock::new(HashMap::new()),
        }
    }

    /// An inline spec's policy, parsed once, and the store's key for `key` under it.
    fn inline(&self, spec: &str, key: &str) -> Result<(Policy, String), ApiError> {
        if let Some((policy, namespace)) = self
            .inline
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(spec)
        {
            return Ok((policy.clone(), store_key(namespace, key)));
        }
        let policy: Policy = spec.parse().map_err(|e: paceline::InputError| {
            ApiError::invalid(format!("policy.{}", e.field()), e.message().to_string())
        })?;
        // The canonical spec keeps equal policies on the same keys.
        let namespace = format!("~{policy}");
        let store_key = store_key(&namespace, key);
        let mut cache = self.inline.write().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= INLINE_CACHE {
            cache.clear();
        }
        cache.insert(spec.to_string(), (policy.clone(), namespace));
        Ok((policy, store_key))
    }
}

/// Shared by every request.
pub(crate) struct AppState {
    pub(crate) live: RwLock<Arc<Live>>,
    pub(crate) backend: Backend,
    pub(crate) metrics: Metrics,
    /// The settings the service started with (flags and file); a reload lays the file's
    /// policies and access rules over them. The lock also makes reloads one at a time.
    pub(crate) base: Mutex<Settings>,
}

impl AppState {
    fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
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
#[derive(Clone, Debug)]
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

    fn unknown_policy(name: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_policy",
            "policy",
            format!("no policy named `{name}`; see GET /v1/policies"),
        )
    }

    fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            code: self.code,
            field: &self.field,
            message: &self.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.body() }))).into_response()
    }
}

/// `{"code", "field", "message"}` of an error (fields in the order JSON objects print).
#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'static str,
    field: &'a str,
    message: &'a str,
}

/// One decision's JSON body (fields in alphabetical order, as the API has always printed
/// them); `status` only in batch answers.
#[derive(Serialize)]
struct DecisionBody<'a> {
    allowed: bool,
    delay_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
    reset_after_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
}

impl<'a> DecisionBody<'a> {
    fn new(policy: &'a str, d: &Decision, status: Option<u16>) -> DecisionBody<'a> {
        DecisionBody {
            allowed: d.allowed,
            delay_ms: ms(d.delay),
            fallback: d.fallback.map(|f| f.name()),
            limit: d.limit,
            policy,
            remaining: d.remaining,
            reset_after_ms: ms(d.reset_after),
            status,
        }
    }
}

/// One answer of a batch: a decision, or an error, each with its status.
#[derive(Serialize)]
#[serde(untagged)]
enum BatchItem<'a> {
    Decision(DecisionBody<'a>),
    Error { error: ErrorBody<'a>, status: u16 },
}

/// Checks the token, and hands the handler the configuration it was checked against.
async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut request: axum::extract::Request,
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
    request.extensions_mut().insert(live);
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
    check_key(key)?;
    let op_name = text("op")?.unwrap_or("pace");
    let cost = number_field(
        fields,
        "cost",
        "a whole number",
        "use a whole number of at least 1",
        |n| n.as_u64().filter(|&c| c >= 1),
    )?
    .unwrap_or(1);
    let max_wait = number_field(
        fields,
        "max_wait_ms",
        "a number",
        "use milliseconds from 0 to 1e13",
        |n| {
            n.as_f64()
                .filter(|ms| (0.0..=1e13).contains(ms))
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        },
    )?;
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
    let (name, policy, store_key) = match live.policies.get(spec) {
        Some(p) => (spec.to_string(), p.clone(), store_key(spec, key)),
        None if spec.contains(':') => {
            if !live.allow_inline_policies {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "inline_policies_disabled",
                    "policy",
                    "inline policy specs are turned off on this service; use a configured policy's name (GET /v1/policies)",
                ));
            }
            let (policy, store_key) = live.inline(spec, key)?;
            ("inline".to_string(), policy, store_key)
        }
        None => return Err(ApiError::unknown_policy(spec)),
    };
    policy
        .check_cost(op, cost)
        .map_err(|e| ApiError::invalid(e.field().to_string(), e.message().to_string()))?;
    Ok(Ask {
        name,
        policy,
        store_key,
        op,
        cost,
    })
}

/// A number field of a request: `None` if absent or null, else what `convert` makes of it,
/// which refuses a number by returning `None` (the error then says what is `allowed`).
fn number_field<T>(
    fields: &Map<String, Value>,
    name: &str,
    noun: &str,
    allowed: &str,
    convert: impl Fn(&serde_json::Number) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match convert(n) {
            Some(value) => Ok(Some(value)),
            None => Err(ApiError::invalid(
                name,
                format!("{n} is not allowed; {allowed}"),
            )),
        },
        Some(other) => Err(ApiError::invalid(
            name,
            format!("must be {noun}, not {}", kind(other)),
        )),
    }
}

/// Keys are 1 to [`MAX_KEY`] bytes.
fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ApiError::invalid(
            "key",
            format!("must be 1 to {MAX_KEY} bytes long"),
        ));
    }
    Ok(())
}

/// The store's key for `key` under a policy's namespace (its name, or `~SPEC` inline).
fn store_key(namespace: &str, key: &str) -> String {
    format!("{namespace}:{key}")
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
    paceline::round_to_micros(d) as f64 / 1000.0
}

/// The API error for a store call that failed.
fn store_failure(e: Error) -> ApiError {
    match e {
        Error::Input(e) => ApiError::invalid(e.field().to_string(), e.message().to_string()),
        Error::Store(e) => {
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
    }
}

/// Counts a decision in the metrics and turns a failure into its API error.
fn settle(
    state: &AppState,
    ask: &Ask,
    outcome: Result<Decision, Error>,
) -> Result<Decision, ApiError> {
    let decision = match outcome {
        Ok(d) => d,
        Err(e) => {
            let labels = DecisionLabels {
                policy: ask.name.clone(),
                outcome: "error",
            };
            state.metrics.decisions.get_or_create(&labels).inc();
            if matches!(e, Error::Store(_)) {
                state.metrics.store_errors.inc();
            }
            return Err(store_failure(e));
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
    Ok(decision)
}

/// 200 admitted, 429 rejected.
fn status_of(decision: &Decision) -> StatusCode {
    if decision.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Adds `RateLimit-Policy`, `RateLimit` and, for a rejection, `Retry-After`.
fn add_rate_limit_headers(headers: &mut HeaderMap, name: &str, decision: &Decision) {
    let seconds_up = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    // The values are taken as they are built, without a copy.
    let value = |text: String| HeaderValue::from_maybe_shared(Bytes::from(text));
    if let Ok(v) = value(format!("\"{name}\";q={}", decision.limit)) {
        headers.insert(RATELIMIT_POLICY, v);
    }
    if let Ok(v) = value(format!(
        "\"{name}\";r={};t={}",
        decision.remaining,
        seconds_up(decision.reset_after)
    )) {
        headers.insert(RATELIMIT, v);
    }
    if !decision.allowed {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(seconds_up(decision.delay).max(1)),
        );
    }
}

async fn decision(
    State(state): State<Arc<AppState>>,
    Extension(live): Extension<Arc<Live>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
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
    match settle(&state, &ask, outcome) {
        Ok(d) => {
            let mut response =
                (status_of(&d), Json(DecisionBody::new(&ask.name, &d, None))).into_response();
            add_rate_limit_headers(response.headers_mut(), &ask.name, &d);
            response
        }
        Err(e) => e.into_response(),
    }
}

async fn batch(
    State(state): State<Arc<AppState>>,
    Extension(live): Extension<Arc<Live>>,
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
    let asks: Vec<Result<Ask, ApiError>> = items.iter().map(|item| validate(&live, item)).collect();
    let valid: Vec<&Ask> = asks.iter().filter_map(|a| a.as_ref().ok()).collect();
    let started = Instant::now();
    let mut outcomes = state.backend.decide_batch(&valid).await.into_iter();
    if !valid.is_empty() {
        state.metrics.observe_store(started.elapsed());
    }
    // One result per request, in order: its decision, or why it has none.
    let settled: Vec<Result<(&str, Decision), ApiError>> = asks
        .iter()
        .map(|ask| match ask {
            Ok(ask) => {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    Err(paceline::StoreError::new(StoreErrorKind::Protocol, "no answer").into())
                });
                settle(&state, ask, outcome).map(|d| (ask.name.as_str(), d))
            }
            Err(e) => Err(e.clone()),
        })
        .collect();
    // The answers borrow from the results above.
    let items: Vec<BatchItem> = settled
        .iter()
        .map(|result| match result {
            Ok((name, d)) => {
                BatchItem::Decision(DecisionBody::new(name, d, Some(status_of(d).as_u16())))
            }
            Err(e) => BatchItem::Error {
                error: e.body(),
                status: e.status.as_u16(),
            },
        })
        .collect();
    (StatusCode::OK, Json(items)).into_response()
}

async fn reset_key(
    State(state): State<Arc<AppState>>,
    Extension(live): Extension<Arc<Live>>,
    Path((policy, key)): Path<(String, String)>,
) -> Response {
    if !live.policies.contains_key(&policy) {
        return ApiError::unknown_policy(&policy).into_response();
    }
    if let Err(e) = check_key(&key) {
        return e.into_response();
    }
    match state.backend.reset(&store_key(&policy, &key)).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => store_failure(e).into_response(),
    }
}

async fn policies(Extension(live): Extension<Arc<Live>>) -> Json<Value> {
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
    match state.reload() {
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
    match state.backend.ready().await {
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

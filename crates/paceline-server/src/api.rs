//! The HTTP API: routes, request validation, responses.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use paceline_store::redis::cross_slot_error;
use paceline_store::secret::TokenKey;
use paceline_store::{
    Decision, Error, InputError, Op, Policy, Request, SharedStore, StoreErrorKind, MAX_LIMITS,
};
use serde::Serialize;
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq as _;

use crate::config::Settings;
use crate::metrics::{Metrics, PolicyMetrics};
use crate::request::{self, BodyError, RawAsk};

/// The largest body of `POST /v1/decisions`.
pub const MAX_BODY: usize = 64 * 1024;
/// The largest body of `POST /v1/decisions/batch`.
pub const MAX_BATCH_BODY: usize = 1024 * 1024;
/// The most requests in one batch.
pub const MAX_BATCH: usize = 1_000;
/// The longest key, in bytes.
pub const MAX_KEY: usize = 512;

/// The name of inline specs in responses and metrics.
const INLINE: &str = "inline";

/// The most inline specs remembered parsed; beyond, the memory starts over.
const INLINE_CACHE: usize = 1_024;

/// A configured policy and its metrics.
pub(crate) struct Configured {
    policy: Policy,
    metrics: PolicyMetrics,
}

impl Configured {
    /// The policy.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// What a reload can change: the policies and the access rules.
pub(crate) struct Live {
    pub(crate) policies: BTreeMap<String, Configured>,
    pub(crate) auth_token: Option<String>,
    pub(crate) allow_inline_policies: bool,
    /// The metrics of decisions by inline specs, all named `inline`.
    inline_metrics: PolicyMetrics,
    /// Inline specs already parsed: the policy and its key namespace.
    inline: RwLock<HashMap<String, (Policy, String)>>,
}

impl Live {
    pub(crate) fn new(settings: &Settings, metrics: &Metrics) -> Live {
        Live {
            policies: settings
                .policies
                .iter()
                .map(|(name, policy)| {
                    let metrics = metrics.policy(name);
                    (
                        name.clone(),
                        Configured {
                            policy: policy.clone(),
                            metrics,
                        },
                    )
                })
                .collect(),
            auth_token: settings.auth_token.clone(),
            allow_inline_policies: settings.allow_inline_policies,
            inline_metrics: metrics.policy(INLINE),
            inline: RwLock::new(HashMap::new()),
        }
    }

    /// An inline spec's policy, parsed once, and the store's key for `key` under it.
    /// Errors name `field`, the request's field holding the spec.
    fn inline(&self, spec: &str, key: &str, field: &str) -> Result<(Policy, String), ApiError> {
        if let Some((policy, namespace)) = self
            .inline
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(spec)
        {
            return Ok((policy.clone(), store_key(namespace, key)));
        }
        let policy: Policy = spec.parse().map_err(|e: InputError| {
            ApiError::invalid(format!("{field}.{}", e.field()), e.message().to_string())
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
    /// Where keys' state lives: any store, opened from the configured URL.
    pub(crate) store: SharedStore,
    pub(crate) metrics: Metrics,
    /// How long a request's body may take to arrive.
    pub(crate) body_read_timeout: Duration,
    /// The job queues of the config file, by name.
    pub(crate) queues: BTreeMap<String, paceline_queue::Queue>,
    /// Becomes true when the service starts shutting down: lease calls waiting for a job
    /// answer with what they have instead of holding the shutdown.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// The dashboard's listing of each queue's groups.
    pub(crate) groups: crate::dashboard::GroupsCache,
    /// The settings the service started with (flags and file); a reload lays the file's
    /// policies and access rules over them. The lock also makes reloads one at a time.
    pub(crate) base: Mutex<Settings>,
    /// Signs concurrency leases' tokens ([`crate::leases`]): the store's key, shared by
    /// every instance on the same Redis.
    pub(crate) lease_key: TokenKey,
}

impl AppState {
    fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The service's routes.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/decisions", post(decision))
        .route("/v1/decisions/batch", post(batch))
        .route("/v1/keys/{policy}/{key}", delete(reset_key))
        .route("/v1/policies", get(policies))
        .route("/v1/reload", post(reload));
    Router::new()
        .merge(v1)
        .merge(crate::queues::routes())
        .merge(crate::leases::routes())
        .merge(crate::dashboard::routes())
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
        .layer(crate::catch_panic::CatchPanicLayer)
        .with_state(state)
}

/// A JSON error: `{"error": {"code", "field", "message"}}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    code: &'static str,
    field: String,
    message: String,
}

impl ApiError {
    pub(crate) fn new(
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

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", field, message)
    }

    /// Bad input, named by its field.
    pub(crate) fn input(e: &InputError) -> ApiError {
        ApiError::invalid(e.field(), e.message())
    }

    fn unknown_policy(name: &str, field: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_policy",
            field,
            format!("no policy named `{name}`; see GET /v1/policies"),
        )
    }

    /// The status it answers with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn body(&self) -> ErrorBody<'_> {
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
pub(crate) struct ErrorBody<'a> {
    code: &'static str,
    field: &'a str,
    message: &'a str,
}

/// One decision's JSON body (fields in alphabetical order, as the API has always printed
/// them); `status` only in batch answers.
#[derive(Serialize)]
pub(crate) struct DecisionBody<'a> {
    allowed: bool,
    delay_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
    /// The lease a `concurrency` decision took (see [`crate::leases`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
    reset_after_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
}

impl<'a> DecisionBody<'a> {
    pub(crate) fn new(policy: &'a str, d: &Decision, status: Option<u16>) -> DecisionBody<'a> {
        DecisionBody {
            allowed: d.allowed,
            delay_ms: ms(d.delay),
            fallback: d.fallback.map(|f| f.name()),
            lease: None,
            limit: d.limit,
            policy,
            remaining: d.remaining,
            reset_after_ms: ms(d.reset_after),
            status,
        }
    }
}

/// The answer to a set of limits: the combined decision and one entry per limit (fields in
/// alphabetical order, as in a single decision's answer).
#[derive(Serialize)]
struct SetBody<'a> {
    allowed: bool,
    delay_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
    limit: u64,
    limits: Vec<PartBody<'a>>,
    remaining: u64,
    reset_after_ms: f64,
}

/// One limit's entry in a set's answer.
#[derive(Serialize)]
struct PartBody<'a> {
    allowed: bool,
    delay_ms: f64,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
    reset_after_ms: f64,
}

/// A batch request's decision: the policy's name, the decision and its lease's token.
type Settled<'a> = (&'a str, Decision, Option<String>);

/// One answer of a batch: a decision, or an error, each with its status.
#[derive(Serialize)]
#[serde(untagged)]
enum BatchItem<'a> {
    Decision(DecisionBody<'a>),
    Error { error: ErrorBody<'a>, status: u16 },
}

/// The live configuration, for a request whose token it accepts: every `/v1` handler
/// takes one, so that none runs unauthenticated, and all of a request is decided under
/// the one configuration its token was checked against.
pub(crate) struct Authorized(pub(crate) Arc<Live>);

impl FromRequestParts<Arc<AppState>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Authorized, Response> {
        let live = state.live();
        if let Some(token) = &live.auth_token {
            let given = parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer_token(v.as_bytes()));
            let accepted = given.is_some_and(|g| bool::from(g.ct_eq(token.as_bytes())));
            if !accepted {
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
                return Err(response);
            }
        }
        Ok(Authorized(live))
    }
}

/// The token of an `Authorization: Bearer TOKEN` header: the scheme in any case (RFC 9110
/// makes auth schemes case-insensitive), then one or more spaces.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let scheme = value.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let token = rest.trim_ascii_start();
    // At least one space between the scheme and the token.
    (token.len() < rest.len() && !token.is_empty()).then_some(token)
}

/// A validated request, borrowing from the configuration it was checked against.
pub(crate) struct Ask<'a> {
    /// The name in responses and metrics: the configured name, or `inline`.
    name: &'a str,
    metrics: &'a PolicyMetrics,
    policy: Policy,
    /// The key in the store: namespaced by policy (`NAMESPACE:KEY`).
    store_key: String,
    /// The length of the namespace at the start of `store_key`.
    namespace_len: usize,
    op: Op,
    cost: u64,
}

impl Ask<'_> {
    /// The key as the request gave it.
    fn key(&self) -> &str {
        self.store_key
            .get(self.namespace_len + 1..)
            .unwrap_or_default()
    }

    /// The token of lease `id` this request's decision took (see [`crate::leases`]).
    fn lease_token(&self, signer: &TokenKey, id: u64) -> String {
        let namespace = self.store_key.get(..self.namespace_len).unwrap_or_default();
        crate::leases::token(signer, namespace, self.key(), id)
    }
}

/// A request's whole body, at most `limit` bytes (else `413`), read within the service's
/// `body_read_timeout` once the headers are in (else `408`), so that a client that stops
/// mid-body cannot hold its connection.
pub(crate) async fn read_body(
    state: &AppState,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let timeout = state.body_read_timeout;
    let mut collect = std::pin::pin!(axum::body::to_bytes(body, limit));
    // A small body has usually arrived with the request's head: read it without arming a
    // timer (a clock read, and an entry in the timer wheel put in and taken out); the
    // timeout covers only a body still on its way.
    let first = std::future::poll_fn(|cx| Poll::Ready(collect.as_mut().poll(cx))).await;
    let read = match first {
        Poll::Ready(read) => Ok(read),
        Poll::Pending => tokio::time::timeout(timeout, collect).await,
    };
    match read {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            if e.into_inner().is::<http_body_util::LengthLimitError>() {
                Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "body",
                    format!("the body is over {limit} bytes"),
                ))
            } else {
                Err(ApiError::invalid(
                    "body",
                    "the body could not be read to its end",
                ))
            }
        }
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "body",
            format!("the body did not arrive within {timeout:?} (the service's body_read_timeout)"),
        )),
    }
}

/// A body as text: JSON is UTF-8.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(bytes)
        .map_err(|e| ApiError::invalid("body", format!("not valid UTF-8, which JSON is: {e}")))
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> ApiError {
        ApiError::invalid(e.field, e.message)
    }
}

/// Validates one request's fields against the live policies.
fn validate<'a>(live: &'a Live, fields: &RawAsk<'_>) -> Result<Ask<'a>, ApiError> {
    let RawAsk {
        policy,
        key,
        op,
        cost,
        max_wait_ms,
        limits,
    } = fields;
    if limits.is_some() {
        return Err(ApiError::invalid(
            "limits",
            "a set of limits is decided by POST /v1/decisions, one set per request",
        ));
    }
    let spec = policy.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "policy",
            "is required: a configured policy's name or a spec (or give `limits`, a set of limits)",
        )
    })?;
    let key = key
        .as_deref()
        .ok_or_else(|| ApiError::invalid("key", "is required"))?;
    check_key(key, "key")?;
    let cost = cost_field(cost.as_ref(), "cost")?.unwrap_or(1);
    let op = op_field(op.as_deref().unwrap_or("pace"), max_wait_ms.as_ref())?;
    let Resolved {
        name,
        metrics,
        policy,
        store_key,
    } = resolve(live, spec, key, "policy")?;
    // The cost is checked against the policy by the store, once, as it decides.
    Ok(Ask {
        name: name.unwrap_or(INLINE),
        metrics,
        policy,
        namespace_len: store_key.len() - key.len() - 1,
        store_key,
        op,
        cost,
    })
}

/// A policy named by a request, found in the live configuration.
pub(crate) struct Resolved<'a> {
    /// The configured name; `None` for an inline spec.
    pub(crate) name: Option<&'a str>,
    pub(crate) metrics: &'a PolicyMetrics,
    pub(crate) policy: Policy,
    /// The key in the store: namespaced by policy.
    pub(crate) store_key: String,
}

/// Finds `spec` (a configured name, or an inline spec where allowed) for `key`; errors name
/// `field`, the request's field holding the spec.
pub(crate) fn resolve<'a>(
    live: &'a Live,
    spec: &str,
    key: &str,
    field: &str,
) -> Result<Resolved<'a>, ApiError> {
    if let Some((name, c)) = live.policies.get_key_value(spec) {
        return Ok(Resolved {
            name: Some(name.as_str()),
            metrics: &c.metrics,
            policy: c.policy.clone(),
            store_key: store_key(spec, key),
        });
    }
    if !spec.contains(':') {
        return Err(ApiError::unknown_policy(spec, field));
    }
    if !live.allow_inline_policies {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "inline_policies_disabled",
            field,
            "inline policy specs are turned off on this service; use a configured policy's name (GET /v1/policies)",
        ));
    }
    let (policy, store_key) = live.inline(spec, key, field)?;
    Ok(Resolved {
        name: None,
        metrics: &live.inline_metrics,
        policy,
        store_key,
    })
}

/// A request's cost (`field`): a whole number of at least 1, if given.
pub(crate) fn cost_field(
    cost: Option<&serde_json::Number>,
    field: &str,
) -> Result<Option<u64>, ApiError> {
    number_field(cost, field, "use a whole number of at least 1", |n| {
        n.as_u64().filter(|&c| c >= 1)
    })
}

/// A request's op, with its `max_wait_ms` (for `pace` only).
fn op_field(name: &str, max_wait_ms: Option<&serde_json::Number>) -> Result<Op, ApiError> {
    let max_wait = number_field(
        max_wait_ms,
        "max_wait_ms",
        "use milliseconds from 0 to 1e13",
        |n| {
            n.as_f64()
                .filter(|ms| (0.0..=1e13).contains(ms))
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        },
    )?;
    match (name, max_wait) {
        ("pace", None) => Ok(Op::pace()),
        ("pace", Some(w)) => Ok(Op::pace_within(w)),
        ("limit" | "peek", Some(_)) => {
            Err(ApiError::invalid("max_wait_ms", "applies to `pace` only"))
        }
        ("limit", None) => Ok(Op::Limit),
        ("peek", None) => Ok(Op::Peek),
        (other, _) => Err(ApiError::invalid(
            "op",
            format!("`{other}` is not an op; use pace, limit or peek"),
        )),
    }
}

/// A validated set of limits.
struct SetAsk<'a> {
    parts: Vec<Part<'a>>,
}

/// One limit of a set.
struct Part<'a> {
    /// Its name in the answer and the headers, distinct within the set: the configured
    /// policy's name, `inline-N` for an inline spec at position N (from 1), and a name
    /// already taken gets `#N` added.
    name: String,
    /// The key as the request gave it.
    key: String,
    /// The policy's namespace of keys: its configured name, or `~SPEC`.
    namespace: String,
    metrics: &'a PolicyMetrics,
    policy: Policy,
    store_key: String,
    op: Op,
    cost: u64,
}

impl SetAsk<'_> {
    /// The `400` for the store's refusal of the set's input. Keys in different hash slots
    /// of a Redis Cluster are named as the request gave them, with the limits whose keys
    /// they are (the store's keys, `NAMESPACE:KEY`, are the service's own business).
    fn input_error(&self, store: &SharedStore, e: &InputError) -> ApiError {
        let keys: Vec<&str> = self.parts.iter().map(|p| p.store_key.as_str()).collect();
        let across = store.key_apart(&keys);
        match across {
            Some(i) => {
                let named = |at: usize| format!("`{}` (limits[{at}].key)", self.parts[at].key);
                ApiError::input(&cross_slot_error(&named(0), &named(i)))
            }
            None => ApiError::input(e),
        }
    }
}

/// Validates a request with `limits`: 1 to [`MAX_LIMITS`] limits, each with a policy and a
/// key, no `policy` or `key` beside them; the op defaults to `limit` (a `pace` set books
/// the earliest time every limit admits: see `paceline_store::set`).
fn validate_set<'a>(live: &'a Live, fields: &RawAsk<'_>) -> Result<SetAsk<'a>, ApiError> {
    let RawAsk {
        policy,
        key,
        op,
        cost,
        max_wait_ms,
        limits,
    } = fields;
    let limits = limits.as_deref().unwrap_or_default();
    for (given, name) in [(policy.is_some(), "policy"), (key.is_some(), "key")] {
        if given {
            return Err(ApiError::invalid(
                name,
                format!("`{name}` and `limits` do not go together: give `policy` and `key` for one limit, or `limits` for a set"),
            ));
        }
    }
    if limits.is_empty() || limits.len() > MAX_LIMITS {
        return Err(ApiError::invalid(
            "limits",
            format!(
                "holds {} limits; give 1 to {MAX_LIMITS}, each {{\"policy\", \"key\"}}",
                limits.len()
            ),
        ));
    }
    let cost = cost_field(cost.as_ref(), "cost")?.unwrap_or(1);
    let op = op_field(op.as_deref().unwrap_or("limit"), max_wait_ms.as_ref())?;
    let mut parts: Vec<Part> = Vec::with_capacity(limits.len());
    for (i, raw) in limits.iter().enumerate() {
        let field = |name: &str| format!("limits[{i}].{name}");
        let spec = raw.policy.as_deref().ok_or_else(|| {
            ApiError::invalid(
                field("policy"),
                "is required: a configured policy's name or a spec",
            )
        })?;
        let key = raw
            .key
            .as_deref()
            .ok_or_else(|| ApiError::invalid(field("key"), "is required"))?;
        check_key(key, &field("key"))?;
        let cost = cost_field(raw.cost.as_ref(), &field("cost"))?.unwrap_or(cost);
        let resolved = resolve(live, spec, key, &field("policy"))?;
        // A cost this limit can never admit is its own entry's fault.
        resolved
            .policy
            .check_cost(op, cost)
            .map_err(|e| ApiError::invalid(field(e.field()), e.message()))?;
        if let Some(j) = parts.iter().position(|p| p.store_key == resolved.store_key) {
            return Err(ApiError::invalid(
                format!("limits[{i}]"),
                format!(
                    "repeats limits[{j}]: the same policy on the same key counts once; drop one"
                ),
            ));
        }
        let mut name = match resolved.name {
            Some(name) => name.to_string(),
            None => format!("{INLINE}-{}", i + 1),
        };
        if parts.iter().any(|p| p.name == name) {
            name = format!("{name}#{}", i + 1);
        }
        let namespace = resolved
            .store_key
            .get(..resolved.store_key.len() - key.len() - 1)
            .unwrap_or_default()
            .to_string();
        parts.push(Part {
            name,
            key: key.to_string(),
            namespace,
            metrics: resolved.metrics,
            policy: resolved.policy,
            store_key: resolved.store_key,
            op,
            cost,
        });
    }
    Ok(SetAsk { parts })
}

/// A path's parts; a path that does not decode (percent-encoded bytes that are not UTF-8)
/// is answered like any bad input, as JSON, saying what the parts (`what`) must be.
pub(crate) fn path_parts<T>(
    path: Result<Path<T>, PathRejection>,
    what: &str,
) -> Result<T, ApiError> {
    path.map(|Path(parts)| parts).map_err(|e| {
        ApiError::invalid(
            "path",
            format!(
                "{what} must be UTF-8 text, percent-encoded in the URL: {}",
                e.body_text()
            ),
        )
    })
}

/// A number field of a request: `None` if absent or null, else what `convert` makes of it,
/// which refuses a number by returning `None` (the error then says what is `allowed`).
pub(crate) fn number_field<T>(
    field: Option<&serde_json::Number>,
    name: &str,
    allowed: &str,
    convert: impl Fn(&serde_json::Number) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    let Some(n) = field else {
        return Ok(None);
    };
    match convert(n) {
        Some(value) => Ok(Some(value)),
        None => Err(ApiError::invalid(
            name,
            format!("{n} is not allowed; {allowed}"),
        )),
    }
}

/// Keys are 1 to [`MAX_KEY`] bytes; errors name `field`.
pub(crate) fn check_key(key: &str, field: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {MAX_KEY} bytes long"),
        ));
    }
    Ok(())
}

/// The store's key for `key` under a policy's namespace (its name, or `~SPEC` inline).
pub(crate) fn store_key(namespace: &str, key: &str) -> String {
    let mut out = String::with_capacity(namespace.len() + 1 + key.len());
    out.push_str(namespace);
    out.push(':');
    out.push_str(key);
    out
}

/// Milliseconds with microsecond precision.
pub(crate) fn ms(d: Duration) -> f64 {
    paceline_core::round_to_micros(d) as f64 / 1000.0
}

/// The API error for a store call that failed.
pub(crate) fn store_failure(e: Error) -> ApiError {
    match e {
        Error::Input(e) => ApiError::input(&e),
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
pub(crate) fn settle(
    state: &AppState,
    metrics: &PolicyMetrics,
    key: &str,
    outcome: Result<Decision, Error>,
) -> Result<Decision, ApiError> {
    match outcome {
        Ok(decision) => {
            if decision.fallback.is_some() {
                state.metrics.store_errors.inc();
            }
            metrics.decided(&decision, key);
            Ok(decision)
        }
        // Bad input (a cost the policy can never admit) is the request's fault, not a
        // failed decision.
        Err(e @ Error::Input(_)) => Err(store_failure(e)),
        Err(e) => {
            metrics.failed();
            if matches!(e, Error::Store(_)) {
                state.metrics.store_errors.inc();
            }
            Err(store_failure(e))
        }
    }
}

/// 200 admitted, 429 rejected.
pub(crate) fn status_of(decision: &Decision) -> StatusCode {
    if decision.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Adds `RateLimit-Policy`, `RateLimit` and, for a rejection, `Retry-After`.
pub(crate) fn add_rate_limit_headers(headers: &mut HeaderMap, name: &str, decision: &Decision) {
    paceline_tower::headers::insert(headers, &[(name, decision)], decision);
}

async fn decision(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: Body,
) -> Response {
    let bytes = match read_body(&state, body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    let fields = match utf8(&bytes).and_then(|json| Ok(request::ask(json)?)) {
        Ok(fields) => fields,
        Err(e) => return e.into_response(),
    };
    if fields.limits.is_some() {
        return match validate_set(&live, &fields) {
            Ok(set) => decide_set(&state, &set).await,
            Err(e) => e.into_response(),
        };
    }
    let ask = match validate(&live, &fields) {
        Ok(ask) => ask,
        Err(e) => return e.into_response(),
    };
    let started = quanta::Instant::now();
    let outcome = state
        .store
        .decide(&ask.policy, &ask.store_key, ask.op, ask.cost)
        .await;
    state.metrics.observe_store(started.elapsed());
    match settle(&state, ask.metrics, ask.key(), outcome) {
        Ok(d) => {
            // Serialising a struct of numbers and strings into a Vec cannot fail.
            let mut body = DecisionBody::new(ask.name, &d, None);
            body.lease = d.lease.map(|id| ask.lease_token(&state.lease_key, id));
            let body = serde_json::to_vec(&body).unwrap_or_default();
            let content_type = [(header::CONTENT_TYPE, APPLICATION_JSON)];
            let mut response = (status_of(&d), content_type, body).into_response();
            add_rate_limit_headers(response.headers_mut(), ask.name, &d);
            response
        }
        Err(e) => e.into_response(),
    }
}

/// Decides a set of limits as one and answers: `200` admitted or `429` refused, with the
/// combined decision and one entry per limit, and the headers listing every limit.
async fn decide_set(state: &AppState, set: &SetAsk<'_>) -> Response {
    let requests: Vec<Request> = set
        .parts
        .iter()
        .map(|p| Request::new(&p.policy, &p.store_key, p.op, p.cost))
        .collect();
    let started = quanta::Instant::now();
    let outcome = state.store.decide_all(&requests).await;
    state.metrics.observe_store(started.elapsed());
    let decided = match outcome {
        Ok(decided) => decided,
        Err(Error::Input(e)) => return set.input_error(&state.store, &e).into_response(),
        Err(e) => {
            for part in &set.parts {
                part.metrics.failed();
            }
            if matches!(e, Error::Store(_)) {
                state.metrics.store_errors.inc();
            }
            return store_failure(e).into_response();
        }
    };
    if decided.decision.fallback.is_some() {
        state.metrics.store_errors.inc();
    }
    for (part, d) in set.parts.iter().zip(&decided.limits) {
        // A limit that would have admitted a refused set did not admit anything.
        let mut counted = *d;
        counted.allowed &= decided.allowed();
        part.metrics.decided(&counted, &part.key);
    }
    let combined = &decided.decision;
    let body = SetBody {
        allowed: combined.allowed,
        delay_ms: ms(combined.delay),
        fallback: combined.fallback.map(|f| f.name()),
        limit: combined.limit,
        limits: set
            .parts
            .iter()
            .zip(&decided.limits)
            .map(|(part, d)| PartBody {
                allowed: d.allowed,
                delay_ms: ms(d.delay),
                key: &part.key,
                lease: d.lease.map(|id| {
                    crate::leases::token(&state.lease_key, &part.namespace, &part.key, id)
                }),
                limit: d.limit,
                policy: &part.name,
                remaining: d.remaining,
                reset_after_ms: ms(d.reset_after),
            })
            .collect(),
        remaining: combined.remaining,
        reset_after_ms: ms(combined.reset_after),
    };
    // Serialising a struct of numbers and strings into a Vec cannot fail.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let content_type = [(header::CONTENT_TYPE, APPLICATION_JSON)];
    let mut response = (status_of(combined), content_type, bytes).into_response();
    let named: Vec<(&str, &Decision)> = set
        .parts
        .iter()
        .map(|p| p.name.as_str())
        .zip(&decided.limits)
        .collect();
    paceline_tower::headers::insert(response.headers_mut(), &named, combined);
    response
}

async fn batch(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: Body,
) -> Response {
    let bytes = match read_body(&state, body, MAX_BATCH_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    let items = match utf8(&bytes).and_then(|json| Ok(request::batch(json)?)) {
        Ok(items) => items,
        Err(e) => return e.into_response(),
    };
    if items.len() > MAX_BATCH {
        return ApiError::invalid(
            "body",
            format!("{} requests; at most {MAX_BATCH} per batch", items.len()),
        )
        .into_response();
    }
    let asks: Vec<Result<Ask, ApiError>> = items
        .iter()
        .map(|item| match item {
            Ok(fields) => validate(&live, fields),
            Err(e) => Err(ApiError::invalid(e.field.clone(), e.message.clone())),
        })
        .collect();
    let valid: Vec<&Ask> = asks.iter().filter_map(|a| a.as_ref().ok()).collect();
    let started = quanta::Instant::now();
    let requests: Vec<Request> = valid
        .iter()
        .map(|a| Request::new(&a.policy, &a.store_key, a.op, a.cost))
        .collect();
    let mut outcomes = state.store.decide_batch(&requests).await.into_iter();
    if !valid.is_empty() {
        state.metrics.observe_store(started.elapsed());
    }
    // One result per request, in order: its decision, or why it has none.
    let settled: Vec<Result<Settled, ApiError>> = asks
        .into_iter()
        .map(|ask| {
            let ask = ask?;
            let outcome = outcomes.next().unwrap_or_else(|| {
                Err(paceline_store::StoreError::new(StoreErrorKind::Protocol, "no answer").into())
            });
            settle(&state, ask.metrics, ask.key(), outcome).map(|d| {
                let lease = d.lease.map(|id| ask.lease_token(&state.lease_key, id));
                (ask.name, d, lease)
            })
        })
        .collect();
    // The answers borrow from the results above.
    let items: Vec<BatchItem> = settled
        .iter()
        .map(|result| match result {
            Ok((name, d, lease)) => {
                let mut body = DecisionBody::new(name, d, Some(status_of(d).as_u16()));
                body.lease = lease.clone();
                BatchItem::Decision(body)
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
    Authorized(live): Authorized,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (policy, key) = match path_parts(path, "the policy and key") {
        Ok(parts) => parts,
        Err(e) => return e.into_response(),
    };
    if !live.policies.contains_key(&policy) {
        return ApiError::unknown_policy(&policy, "policy").into_response();
    }
    if let Err(e) = check_key(&key, "key") {
        return e.into_response();
    }
    match state.store.reset(&store_key(&policy, &key)).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => store_failure(e).into_response(),
    }
}

async fn policies(Authorized(live): Authorized) -> Json<Value> {
    let policies: Map<String, Value> = live
        .policies
        .iter()
        .map(|(name, Configured { policy: p, .. })| {
            (
                name.clone(),
                json!({"spec": p.to_string(), "algorithm": p.algorithm(), "limit": p.limit()}),
            )
        })
        .collect();
    Json(json!({"policies": policies, "allow_inline_policies": live.allow_inline_policies}))
}

/// `POST /v1/reload`: re-reads the config file; logged at INFO, or at WARN when the file is
/// refused (see `AppState::reload`).
async fn reload(State(state): State<Arc<AppState>>, _: Authorized) -> Response {
    match state.reload("POST /v1/reload") {
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

/// `GET /readyz`: whether this instance can decide now, as its store answers.
///
/// * `200 {"status": "ready", "degraded": false}`: every Redis node (the one server, or each
///   cluster primary) serves its keys; the memory store is always ready.
/// * `200 {"status": "degraded", "degraded": true, "failing": [...], ...}`: some cluster
///   primaries do not serve their keys (down, unreachable, or a cluster that refuses them),
///   or some slots have no primary. Their keys are answered by the failure policy, the
///   others by Redis. Still ready: every instance shares the same Redis, so taking this one
///   out of rotation would not help.
/// * `503 {"status": "unavailable", "message", "failing": [...]}`: no node serves any key;
///   every decision is answered by the failure policy.
///
/// With Redis the body also says how many nodes were asked (`nodes`), each failing node and
/// why (`failing`: `node`, `error`), the slots without a primary (`uncovered_slots`), and
/// the outages this instance's decisions met that go on (`outages`: `node`, `lasted_ms`,
/// `failed_decisions`, `error`).
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    use paceline_store::redis::Readiness;
    let Some(health) = state.store.health().await else {
        return match state.store.ready().await {
            Ok(()) => Json(json!({"status": "ready", "degraded": false})).into_response(),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(
                    json!({"status": "unavailable", "degraded": false, "message": why.to_string()}),
                ),
            )
                .into_response(),
        };
    };
    let failing: Vec<Value> = health
        .failing
        .iter()
        .map(|f| json!({"node": f.node, "error": f.problem}))
        .collect();
    let outages: Vec<Value> = health
        .outages
        .iter()
        .map(|o| {
            json!({
                "node": o.node,
                "lasted_ms": u64::try_from(o.lasted.as_millis()).unwrap_or(u64::MAX),
                "failed_decisions": o.failed,
                "error": o.cause,
            })
        })
        .collect();
    let (status, name) = match health.readiness {
        Readiness::Ready => (StatusCode::OK, "ready"),
        Readiness::Degraded => (StatusCode::OK, "degraded"),
        Readiness::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let mut body = json!({
        "status": name,
        "degraded": health.readiness == Readiness::Degraded,
        "nodes": health.nodes,
        "failing": failing,
        "uncovered_slots": health.uncovered_slots,
        "outages": outages,
    });
    if health.readiness == Readiness::Unavailable {
        let why: Vec<String> = health
            .failing
            .iter()
            .map(|f| format!("{}: {}", f.node, f.problem))
            .collect();
        body["message"] = json!(format!(
            "no Redis node serves keys now ({})",
            why.join("; ")
        ));
    }
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    for (name, queue) in &state.queues {
        if let Ok(stats) = queue.counts().await {
            state.metrics.queue_stats(name, &stats);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_store::Fallback;

    #[test]
    fn a_decision_body_prints_its_fields_in_order_and_finite() {
        // Microseconds: zero, below a microsecond, fractional, large, and saturating.
        let times = [0.0, 0.001, 1.0, 1_500.5, 120_000.0, 3.15e13, f64::MAX];
        let names = ["discord-roles", "inline", "", "quote\"back\\slash\u{1}é"];
        for (i, &delay) in times.iter().enumerate() {
            for (j, name) in names.iter().enumerate() {
                let reset_after = times[(i + j) % times.len()];
                for (allowed, fallback, status) in [
                    (true, None, None),
                    (false, None, Some(429)),
                    (true, Some(Fallback::FailOpen), Some(200)),
                    (true, Some(Fallback::Local), None),
                ] {
                    let mut decision = Decision::from_micros(
                        allowed,
                        delay,
                        (i * 7 + j) as u64,
                        reset_after,
                        u64::MAX - i as u64,
                    );
                    decision.fallback = fallback;
                    let body = DecisionBody::new(name, &decision, status);
                    let text = serde_json::to_string(&body).unwrap_or_default();
                    // The fields in the order the API has always printed them.
                    let order: Vec<usize> = [
                        "\"allowed\"",
                        "\"delay_ms\"",
                        "\"limit\"",
                        "\"policy\"",
                        "\"remaining\"",
                        "\"reset_after_ms\"",
                    ]
                    .iter()
                    .map(|field| text.find(field).unwrap_or(usize::MAX))
                    .collect();
                    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    assert_eq!(v["policy"], *name, "{text}");
                    assert!(
                        v["delay_ms"].is_f64() && v["reset_after_ms"].is_f64(),
                        "{text}"
                    );
                    assert_eq!(v["fallback"].as_str(), fallback.map(|f| f.name()), "{text}");
                    assert_eq!(v["status"].as_u64(), status.map(u64::from), "{text}");
                }
            }
        }
    }
}

#[cfg(test)]
mod auth_tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR   s3cret",
        ] {
            assert_eq!(
                bearer_token(header.as_bytes()),
                Some(&b"s3cret"[..]),
                "{header}"
            );
        }
        for header in [
            "Bearers3cret",
            "Basic s3cret",
            "Bearer",
            "Bearer   ",
            "Token s3cret",
            "",
        ] {
            assert_eq!(bearer_token(header.as_bytes()), None, "{header}");
        }
    }
}

//! `paceline proxy`: a rate-limiting reverse proxy in front of an API whose limits come in
//! response headers, so that clients in any language get paceline's API client limiter.
//!
//! A request to `http://PROXY/PATH?QUERY` goes to `UPSTREAM/PATH?QUERY` with its method,
//! headers (less hop-by-hop ones) and body, once the limiter admits it; the upstream's
//! answer comes back as it is, streamed. Every request stays below the upstream's base
//! path: one whose path would leave it, or is ambiguous about it, is answered `400` and
//! never sent (`proxy/target.rs` holds the rules). Limits are kept per `Authorization`
//! header value (one [`Client`] per token; tokens are never logged or put in metrics). A
//! request that cannot be sent within `max_wait` is answered `429` with `Retry-After` and
//! `x-paceline-proxy: wait-exceeded`, so clients that handle 429 need nothing new; one the
//! invalid-request budget refuses gets `429` with `x-paceline-proxy: invalid-budget`.
//!
//! A refusal the limiter waits out (a 429 with a retry-after) is sent again by the proxy
//! when the request's body is at most [`RETRY_BODY_MAX`] (kept in memory for that); a
//! larger body is streamed once, and its refusal goes back to the client.
//!
//! `/healthz`, `/metrics` and the dashboard (`/dashboard`, and its data `/v1/dashboard`:
//! requests by outcome, the upstream's 429s by scope, the buckets learned) are served on a
//! separate admin address, so they never collide with upstream paths.
//!
//! No credential of the URLs the proxy is given (`user:password@` of the upstream or the
//! store) appears in its logs, metrics, dashboard or answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use paceline_client::headers::{self as dialects, Scope};
use paceline_client::redis::RedisKnowledge;
use paceline_client::{After, Client, ClientConfig, ClientError, Route};
use paceline_core::Policy;
use paceline_store::redis::FunctionHost;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::api::ApiError;
use crate::config::ConnectionLimits;
use crate::ServerError;

mod target;

/// The largest request body the proxy keeps in memory so that it can send the request
/// again after a refusal: 1 MiB.
pub const RETRY_BODY_MAX: usize = 1 << 20;

/// What `paceline proxy` is told. Its `Debug` shows the URLs without their credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct ProxySettings {
    /// Where requests go: `http://` or `https://`, with an optional base path that every
    /// request stays below, and no query or fragment. `user:password@` in it is sent as
    /// basic authentication to a request without an `Authorization` header, and never
    /// shown.
    pub upstream: reqwest::Url,
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Where `/healthz` and `/metrics` are served (`None`: not served).
    pub admin_listen: Option<SocketAddr>,
    /// The header dialect: `discord`, `ietf`, `github`, `retry-after` or `auto`.
    pub dialect: String,
    /// Applied to every request of a token (Discord: `gcra:rate=50/s,burst=1`). Any
    /// algorithm but `concurrency`, whose lease per request the limiter never gives back.
    pub global_limit: Option<Policy>,
    /// The longest a request may wait for its turn (`None`: as long as it takes).
    pub max_wait: Option<Duration>,
    /// The upstream's answer must start within this (else `504`); a long body after that
    /// is not cut off.
    pub upstream_timeout: Duration,
    /// Connection limits of the listening side.
    pub connections: ConnectionLimits,
    /// The most distinct `Authorization` values (identities) whose limits the proxy keeps
    /// at once (10,000). One idle for [`IDLE_IDENTITY`] with nothing waiting is forgotten
    /// when room is needed; beyond the cap, requests of new identities get `503`.
    pub max_identities: usize,
    /// Where what the proxy learns of the limits is kept: `memory` (this proxy alone), or
    /// `redis://HOST:PORT[/DB]`, `rediss://...`, `redis-cluster://HOST:PORT[,...]`:
    /// shared by every proxy (and every [`Client`] opened there) with the same token.
    pub store: String,
}

/// How long an identity with nothing waiting or in flight is kept: 10 minutes.
pub const IDLE_IDENTITY: Duration = Duration::from_secs(600);

impl ProxySettings {
    /// Settings for `upstream` with the defaults: listen on 127.0.0.1:8081, no admin
    /// address, dialect `auto`, no global limit, no deadline, 30 s upstream timeout.
    pub fn new(upstream: reqwest::Url) -> ProxySettings {
        ProxySettings {
            upstream,
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin_listen: None,
            dialect: "auto".into(),
            global_limit: None,
            max_wait: None,
            upstream_timeout: Duration::from_secs(30),
            connections: ConnectionLimits::default(),
            max_identities: 10_000,
            store: "memory".into(),
        }
    }

    /// Checks the settings: the upstream's scheme and that it has no query or fragment, the
    /// store's URL, the dialect's name and the global limit's algorithm.
    pub fn validate(&self) -> Result<(), paceline_core::InputError> {
        use paceline_core::InputError;
        let upstream = shown(&self.upstream);
        if !matches!(self.upstream.scheme(), "http" | "https") {
            return Err(InputError::new(
                "upstream",
                format!("`{upstream}` is not an http:// or https:// URL"),
            ));
        }
        if self.upstream.query().is_some() || self.upstream.fragment().is_some() {
            return Err(InputError::new(
                "upstream",
                format!(
                    "`{upstream}` has a query or a fragment: give the base URL only, \
                     requests bring their own query"
                ),
            ));
        }
        paceline_store::check_store_url(&self.store)?;
        dialects::dialect(&self.dialect)?;
        if let Some(policy @ Policy::Concurrency(_)) = &self.global_limit {
            let allowed: Vec<&str> = paceline_core::ALGORITHMS
                .iter()
                .copied()
                .filter(|a| *a != policy.algorithm())
                .collect();
            return Err(InputError::new(
                "global_limit",
                format!(
                    "`{}` cannot be the global limit: the proxy takes a lease for each \
                     request and never gives it back; use one of {}",
                    policy.algorithm(),
                    allowed.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// The upstream as logs and the dashboard show it: without `user:password@`.
    pub fn upstream_shown(&self) -> String {
        shown(&self.upstream)
    }
}

impl std::fmt::Debug for ProxySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxySettings")
            .field("upstream", &shown(&self.upstream))
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("dialect", &self.dialect)
            .field("global_limit", &self.global_limit)
            .field("max_wait", &self.max_wait)
            .field("upstream_timeout", &self.upstream_timeout)
            .field("connections", &self.connections)
            .field("max_identities", &self.max_identities)
            .field(
                "store",
                &paceline_store::without_credentials(self.store.trim()),
            )
            .finish()
    }
}

/// `url` without `user:password@`. (The URL's own parts, not its text: a `@` in its path
/// stays.)
fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    // Only a URL without a host (never http:// or https://) refuses these.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    /// `forwarded`, `wait_exceeded`, `invalid_budget`, `upstream_error`, `bad_request`,
    /// `too_many_identities`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Refused {
    /// `bucket`, `shared` or `global`.
    scope: &'static str,
}

struct ProxyMetrics {
    registry: Registry,
    requests: Family<Outcome, Counter>,
    upstream_429: Family<Refused, Counter>,
    retries: Counter,
    invalid: Counter,
    wait_micros: Counter,
}

impl ProxyMetrics {
    fn new() -> ProxyMetrics {
        let mut registry = Registry::with_prefix("paceline_proxy");
        let requests = Family::<Outcome, Counter>::default();
        let upstream_429 = Family::<Refused, Counter>::default();
        let retries = Counter::default();
        let invalid = Counter::default();
        let wait_micros = Counter::default();
        registry.register(
            "requests",
            "Requests by outcome: forwarded, wait_exceeded, invalid_budget, upstream_error, bad_request, too_many_identities",
            requests.clone(),
        );
        registry.register(
            "upstream_429",
            "Refusals from the upstream, by scope (bucket, shared, global)",
            upstream_429.clone(),
        );
        registry.register(
            "retries",
            "Requests sent again after a refusal",
            retries.clone(),
        );
        registry.register(
            "invalid_responses",
            "401 and 403 answers and 429s other than shared scope: what the invalid-request budget counts",
            invalid.clone(),
        );
        registry.register(
            "wait_microseconds",
            "Time requests waited for their turn, in µs",
            wait_micros.clone(),
        );
        ProxyMetrics {
            registry,
            requests,
            upstream_429,
            retries,
            invalid,
            wait_micros,
        }
    }

    fn count(&self, outcome: &'static str) {
        self.requests.get_or_create(&Outcome { outcome }).inc();
    }
}

struct ProxyState {
    upstream: reqwest::Url,
    http: reqwest::Client,
    dialect: String,
    config: ClientConfig,
    max_wait: Option<Duration>,
    /// One limiter per `Authorization` value, and when it was last used.
    clients: Mutex<HashMap<Vec<u8>, (Client, Instant)>>,
    max_identities: usize,
    metrics: ProxyMetrics,
    upstream_timeout: Duration,
    /// Where the limits' knowledge lives when proxies share it.
    redis: Option<FunctionHost>,
    /// The store as the dashboard shows it (without credentials).
    store: String,
    started: Instant,
    /// Keys the dashboard's names of identities (a token is never shown, nor a plain hash
    /// of it that could be checked against a guess).
    identity_names: std::hash::RandomState,
}

impl ProxyState {
    /// The identity's limiter, or `None` when the proxy holds as many identities as it may.
    fn client_for(&self, token: &[u8]) -> Result<Option<Client>, paceline_core::InputError> {
        let now = Instant::now();
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((c, used)) = clients.get_mut(token) {
            *used = now;
            return Ok(Some(c.clone()));
        }
        if clients.len() >= self.max_identities {
            clients.retain(|_, (c, used)| {
                now.duration_since(*used) < IDLE_IDENTITY || c.counts() != (0, 0)
            });
            if clients.len() >= self.max_identities {
                return Ok(None);
            }
        }
        let dialect = dialects::dialect(&self.dialect)?;
        let clock = Arc::new(paceline_store::SystemClock::new());
        let c = match &self.redis {
            Some(store) => Client::with_knowledge(
                self.config.clone(),
                dialect,
                clock,
                RedisKnowledge::new(store.clone(), token, &self.config),
            ),
            None => Client::with_clock(self.config.clone(), dialect, clock),
        };
        clients.insert(token.to_vec(), (c.clone(), now));
        Ok(Some(c))
    }

    fn route(&self, method: &str, path: &str) -> Route {
        if self.dialect == "discord" {
            Route::discord(method, path)
        } else {
            Route::generic(method, path)
        }
    }
}

/// A bound proxy: its listeners are open; [`Proxy::run`] serves them.
pub struct Proxy {
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: Arc<ProxyState>,
    connections: ConnectionLimits,
}

impl Proxy {
    /// Validates the settings and binds the listening addresses.
    pub async fn bind(settings: ProxySettings) -> Result<Proxy, ServerError> {
        settings.validate().map_err(ServerError::Settings)?;
        paceline_store::install_tls_provider();
        // `upstream_timeout` bounds the wait for the answer to start (see `forward`), not
        // a long body streaming in either direction.
        let http = reqwest::Client::builder()
            .connect_timeout(settings.upstream_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ServerError::Listen(std::io::Error::other(e)))?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(ServerError::Listen)?;
        let admin = match settings.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(ServerError::Listen)?),
            None => None,
        };
        // Discord's rules (its invalid-request budget, one pioneer per major parameter)
        // for its dialect; the global limit is the settings' in every case.
        let mut config = if settings.dialect == "discord" {
            ClientConfig::discord()
        } else {
            ClientConfig::new()
        };
        config.global = settings.global_limit.clone();
        // The identities' knowledge in the store's Redis when it has one, else in this
        // process.
        let store = paceline_store::open(&settings.store, &paceline_store::StoreOptions::new())
            .await
            .map_err(ServerError::Store)?;
        let redis = store.functions();
        Ok(Proxy {
            listener,
            admin,
            state: Arc::new(ProxyState {
                upstream: settings.upstream,
                http,
                dialect: settings.dialect,
                config,
                max_wait: settings.max_wait,
                clients: Mutex::new(HashMap::new()),
                max_identities: settings.max_identities.max(1),
                metrics: ProxyMetrics::new(),
                upstream_timeout: settings.upstream_timeout,
                redis,
                store: paceline_store::without_credentials(&settings.store),
                started: Instant::now(),
                identity_names: std::hash::RandomState::new(),
            }),
            connections: settings.connections,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The admin address, if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish (within the
    /// connection limits' shutdown timeout).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .fallback(forward)
            .with_state(Arc::clone(&self.state));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let admin = self.admin.map(|listener| {
            let router = Router::new()
                .route("/healthz", get(|| async { "ok\n" }))
                .route("/metrics", get(metrics))
                .route("/dashboard", get(crate::dashboard::page))
                .route("/v1/dashboard", get(dashboard))
                .with_state(Arc::clone(&self.state));
            let mut stopped = stopped.clone();
            tokio::spawn(crate::conn::serve(
                listener,
                router,
                self.connections,
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            ))
        });
        let result = crate::conn::serve(self.listener, app, self.connections, async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        // Tell the shared knowledge what the last answers said, so that other proxies
        // do not lose it (within a second).
        let clients: Vec<Client> = {
            let clients = self
                .state
                .clients
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            clients.values().map(|(c, _)| c.clone()).collect()
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            for c in &clients {
                c.flush().await;
            }
        })
        .await;
        result
    }
}

async fn metrics(State(state): State<Arc<ProxyState>>) -> Response {
    let mut text = String::new();
    if encode(&mut text, &state.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The most buckets `/v1/dashboard` lists.
const DASHBOARD_BUCKETS: usize = 20;

/// `GET /v1/dashboard` of the admin address: the proxy's outcomes, the upstream's 429s and
/// what it knows of the buckets, for the dashboard page ([`crate::dashboard`]).
async fn dashboard(State(state): State<Arc<ProxyState>>) -> Response {
    use std::hash::BuildHasher;
    let m = &state.metrics;
    let requests: serde_json::Map<String, serde_json::Value> = [
        "forwarded",
        "wait_exceeded",
        "invalid_budget",
        "upstream_error",
        "bad_request",
        "too_many_identities",
    ]
    .into_iter()
    .map(|outcome| {
        let count = m.requests.get_or_create(&Outcome { outcome }).get();
        (outcome.to_string(), count.into())
    })
    .collect();
    let refused: serde_json::Map<String, serde_json::Value> = ["bucket", "shared", "global"]
        .into_iter()
        .map(|scope| {
            let count = m.upstream_429.get_or_create(&Refused { scope }).get();
            (scope.to_string(), count.into())
        })
        .collect();
    let clients: Vec<(String, Client)> = {
        let clients = state.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .iter()
            .map(|(token, (c, _))| {
                let name = format!("{:06x}", state.identity_names.hash_one(token) >> 40);
                (name, c.clone())
            })
            .collect()
    };
    let (mut waiting, mut in_flight) = (0, 0);
    let mut buckets = Vec::new();
    let mut shared = false;
    for (identity, client) in &clients {
        let (w, f) = client.counts();
        waiting += w;
        in_flight += f;
        match client.buckets() {
            Some(views) => buckets.extend(views.into_iter().map(|b| (identity.clone(), b))),
            None => shared = true,
        }
    }
    let buckets_total = buckets.len();
    // The tightest first: paused, then the fewest requests left, then unknown ones.
    buckets.sort_by_key(|(identity, b)| {
        (
            std::cmp::Reverse(b.paused_for_us),
            b.remaining.unwrap_or(u64::MAX),
            identity.clone(),
            b.bucket.clone(),
        )
    });
    let us_ms = |us: u64| us as f64 / 1e3;
    let listed: Vec<serde_json::Value> = buckets
        .iter()
        .take(DASHBOARD_BUCKETS)
        .map(|(identity, b)| {
            serde_json::json!({
                "identity": identity,
                "bucket": b.bucket,
                "major": b.major,
                "known": b.known,
                "limit": b.limit,
                "remaining": b.remaining,
                "reset_in_ms": b.reset_in_us.map(us_ms),
                "paused_for_ms": us_ms(b.paused_for_us),
                "in_flight": b.in_flight,
            })
        })
        .collect();
    let body = serde_json::json!({
        "service": {
            "uptime_s": state.started.elapsed().as_secs_f64(),
            "store": state.store,
            "ready": true,
            "store_message": null,
            "store_errors": 0,
            "store_latency_ms": {"count": 0, "p50": null, "p99": null},
        },
        "policies": [],
        "refused_keys": [],
        "queues": [],
        "proxy": {
            "upstream": shown(&state.upstream),
            "identities": clients.len(),
            "waiting": waiting,
            "in_flight": in_flight,
            "requests": requests,
            "upstream_429": refused,
            "retries": m.retries.get(),
            "invalid_responses": m.invalid.get(),
            "waited_ms": m.wait_micros.get() as f64 / 1e3,
            "buckets_total": buckets_total,
            "buckets_in_redis": shared,
            "buckets": listed,
        },
    });
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// Headers that belong to one connection, not to the message (RFC 9110 § 7.6.1), and
/// `host`, which the upstream's URL sets.
fn hop_by_hop(name: &HeaderName, connection: &[String]) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    ) || connection.iter().any(|c| c == name.as_str())
}

fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !hop_by_hop(name, &connection) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The proxy's own answer: `status`, a JSON error body and extra headers.
fn own_answer(
    status: StatusCode,
    error: &str,
    message: &str,
    extra: &[(&'static str, String)],
) -> Response {
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    for (name, value) in extra {
        if let Ok(v) = HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, v);
        }
    }
    response
}

fn refused(state: &ProxyState, e: &ClientError) -> Response {
    let (outcome, kind, retry_after) = match e {
        ClientError::WaitExceeded {
            max_wait,
            would_wait,
        } => (
            "wait_exceeded",
            "wait-exceeded",
            would_wait.unwrap_or(*max_wait),
        ),
        ClientError::InvalidBudget { retry_after } => {
            ("invalid_budget", "invalid-budget", *retry_after)
        }
        _ => ("upstream_error", "closed", Duration::from_secs(1)),
    };
    state.metrics.count(outcome);
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    own_answer(
        StatusCode::TOO_MANY_REQUESTS,
        outcome,
        &e.to_string(),
        &[
            ("retry-after", seconds.max(1).to_string()),
            ("x-paceline-proxy", kind.to_string()),
        ],
    )
}

async fn forward(State(state): State<Arc<ProxyState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // Before anything else: a path that would leave the base creates no identity and
    // waits for no turn.
    let target = match target::upstream_target(&state.upstream, &parts.uri) {
        Ok(t) => t,
        Err(refusal) => {
            state.metrics.count("bad_request");
            return ApiError::invalid("path", refusal).into_response();
        }
    };
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let client = match state.client_for(&token) {
        Ok(Some(c)) => c,
        Ok(None) => {
            state.metrics.count("too_many_identities");
            return own_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "identities",
                "the proxy holds the limits of as many Authorization values as it may; retry later",
                &[("retry-after", "60".to_string())],
            );
        }
        Err(e) => {
            state.metrics.count("bad_request");
            return own_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "dialect",
                e.message(),
                &[],
            );
        }
    };
    let route = state.route(parts.method.as_str(), &target.path);
    let headers = end_to_end(&parts.headers);
    // A body small enough to keep is kept, so that a refused request can be sent again.
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
    let mut kept: Option<bytes::Bytes> = None;
    let mut streamed = None;
    if length.is_some_and(|n| n <= RETRY_BODY_MAX) || (length.is_none() && !chunked) {
        match http_body_util::Limited::new(body, RETRY_BODY_MAX)
            .collect()
            .await
        {
            Ok(b) => kept = Some(b.to_bytes()),
            Err(e) => {
                state.metrics.count("bad_request");
                return own_answer(StatusCode::BAD_REQUEST, "body", &e.to_string(), &[]);
            }
        }
    } else {
        streamed = Some(body);
    }
    let asked = client.now_micros();
    let mut permit = match client.acquire_within(route, state.max_wait).await {
        Ok(p) => p,
        Err(e) => return refused(&state, &e),
    };
    state
        .metrics
        .wait_micros
        .inc_by(client.now_micros().saturating_sub(asked));
    loop {
        let body = match (&kept, streamed.take()) {
            (Some(b), _) => reqwest::Body::from(b.clone()),
            (None, Some(s)) => reqwest::Body::wrap_stream(s.into_data_stream()),
            (None, None) => reqwest::Body::from(bytes::Bytes::new()),
        };
        permit.sent();
        let sending = state
            .http
            .request(parts.method.clone(), target.url.clone())
            .headers(headers.clone())
            .body(body)
            .send();
        let failure = match tokio::time::timeout(state.upstream_timeout, sending).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if e.is_timeout() => Err((StatusCode::GATEWAY_TIMEOUT, upstream_failure(e))),
            Ok(Err(e)) => Err((StatusCode::BAD_GATEWAY, upstream_failure(e))),
            Err(_) => Err((
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the upstream did not start its answer within {:?}",
                    state.upstream_timeout
                ),
            )),
        };
        let upstream = match failure {
            Ok(r) => r,
            Err((status, message)) => {
                permit.failed();
                state.metrics.count("upstream_error");
                return own_answer(status, "upstream", &message, &[]);
            }
        };
        let status = upstream.status().as_u16();
        // A refusal's small body is read, for the dialects that look into it (Discord's
        // `global`, GitHub's secondary limits), and sent on as it was.
        let (upstream, body) = if matches!(status, 403 | 429) {
            read_small_body(upstream).await
        } else {
            (Buffered::Streaming(upstream), None)
        };
        let mut view = dialects::Response::new(status, upstream.headers());
        if let Some(b) = &body {
            view = view.with_body(b);
        }
        let seen = client.dialect().read(&view, client.now_micros());
        if let Some(r) = seen.refusal {
            let scope = match r.scope {
                Scope::Bucket => "bucket",
                Scope::Shared => "shared",
                Scope::Global => "global",
            };
            state
                .metrics
                .upstream_429
                .get_or_create(&Refused { scope })
                .inc();
        }
        let shared = seen.refusal.is_some_and(|r| r.scope == Scope::Shared);
        if status == 401 || status == 403 || (seen.refusal.is_some() && !shared) {
            state.metrics.invalid.inc();
        }
        match permit.complete_with(status, &seen) {
            After::Retry(waiting) if kept.is_some() => {
                drop((upstream, body));
                state.metrics.retries.inc();
                permit = match waiting.admitted().await {
                    Ok(p) => p,
                    Err(e) => return refused(&state, &e),
                };
            }
            // A streamed body cannot be sent again: the refusal is the client's.
            _ => {
                state.metrics.count("forwarded");
                return answer(upstream, body);
            }
        }
    }
}

/// What went wrong sending a request upstream: reqwest's message and its causes, without
/// the URL (which may hold the upstream's credentials) and never the token.
fn upstream_failure(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The largest refusal body the proxy reads to show the dialect: 64 KiB.
const REFUSAL_BODY_MAX: usize = 64 << 10;

/// An upstream answer whose body is still coming, or whose head is kept beside its body.
enum Buffered {
    Streaming(reqwest::Response),
    Read {
        status: reqwest::StatusCode,
        headers: HeaderMap,
    },
}

impl Buffered {
    fn headers(&self) -> &HeaderMap {
        match self {
            Buffered::Streaming(r) => r.headers(),
            Buffered::Read { headers, .. } => headers,
        }
    }
}

/// Reads the body of a refusal if it is announced as at most [`REFUSAL_BODY_MAX`];
/// otherwise leaves it streaming.
async fn read_small_body(upstream: reqwest::Response) -> (Buffered, Option<bytes::Bytes>) {
    let small = upstream
        .content_length()
        .is_some_and(|n| n <= REFUSAL_BODY_MAX as u64);
    if !small {
        return (Buffered::Streaming(upstream), None);
    }
    let status = upstream.status();
    let headers = upstream.headers().clone();
    let body = upstream.bytes().await.unwrap_or_default();
    (Buffered::Read { status, headers }, Some(body))
}

/// The upstream's answer, as it is: its body streamed, or the bytes already read.
fn answer(upstream: Buffered, body: Option<bytes::Bytes>) -> Response {
    let (status, headers, body) = match upstream {
        Buffered::Streaming(r) => (
            r.status(),
            end_to_end(r.headers()),
            Body::from_stream(r.bytes_stream()),
        ),
        Buffered::Read { status, headers } => (
            status,
            end_to_end(&headers),
            Body::from(body.unwrap_or_default()),
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

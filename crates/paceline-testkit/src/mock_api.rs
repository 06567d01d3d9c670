//! A strict mock of a Discord-like API, for the API client limiter's and the proxy's tests:
//! [`MockApi`] decides on a time it is given (virtual time), [`MockServer`] serves it over
//! HTTP on a free loopback port (wall-clock time).
//!
//! It enforces limits the client only learns from headers: routes map to bucket ids
//! (several routes share one), each bucket is limited per major parameter (a window of
//! `window` starting at the first request after the last reset, as Discord's), and a
//! global limit per token (at most `global` requests in any aligned second, or the
//! token's own: [`MockApi::token`]). It answers `GET .../gateway/bot` with the token's
//! `session_start_limit` ([`MockApi::gateway_bot`]), apart from the limits. It counts
//! every request, and every 429 by kind. It can inject failures on purpose.

use std::collections::HashMap;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use paceline_client::http::{HeaderMap, HeaderValue};
use paceline_client::Route;

/// A second in µs.
pub const SECOND: u64 = 1_000_000;

/// A bucket's limit: `limit` requests per `window` µs.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// Requests per window.
    pub limit: u64,
    /// The window, in µs.
    pub window: u64,
}

/// What the mock does with the next request to a route, when told to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inject {
    /// A global 429 without any rate-limit header, only `Retry-After` (seconds).
    HeaderlessGlobal429(u64),
    /// A 502 from a proxy in front: no headers at all.
    BadGateway,
    /// A `shared`-scope 429 with `Retry-After` (seconds).
    Shared429(u64),
    /// GitHub's secondary limit: a 403 with calls left, no `Retry-After`, said only in
    /// the body.
    Secondary403,
}

/// What the mock saw.
#[derive(Default, Debug)]
pub struct Counts {
    /// Every request.
    pub requests: u64,
    /// Answered 200.
    pub ok: u64,
    /// Refused by a bucket's limit.
    pub bucket_429: u64,
    /// Refused by the global limit.
    pub global_429: u64,
    /// Failures injected on purpose.
    pub injected: u64,
    /// `GET .../gateway/bot` answered (not among `requests`).
    pub gateway_bot: u64,
}

/// The mock's limits and counts.
pub struct MockApi {
    /// Route key → (bucket id, limit).
    routes: HashMap<String, (String, Limit)>,
    /// (bucket id, major) → (reset_at, remaining).
    windows: HashMap<(String, String), (u64, u64)>,
    global: u64,
    /// Token → its own global limit and its `max_concurrency`.
    tokens: HashMap<String, (u64, u64)>,
    /// (token, aligned second) → requests in it.
    global_seen: HashMap<(String, u64), u64>,
    inject: HashMap<String, Vec<Inject>>,
    /// The body of the last injected answer that has one of its own.
    injected_body: Option<String>,
    /// What it saw.
    pub counts: Counts,
    /// Every accepted request: (time, bucket, major).
    pub accepted: Vec<(u64, String, String)>,
}

impl MockApi {
    /// A mock with `global` requests per aligned second per token, and no routes.
    pub fn new(global: u64) -> MockApi {
        MockApi {
            routes: HashMap::new(),
            windows: HashMap::new(),
            global,
            tokens: HashMap::new(),
            global_seen: HashMap::new(),
            inject: HashMap::new(),
            injected_body: None,
            counts: Counts::default(),
            accepted: Vec::new(),
        }
    }

    /// The time from the first accepted request's arrival to the last's (zero for fewer
    /// than two): callers limited together to `r` per second, who sent `n` requests, took at
    /// least `(n - 1) / r` between their first and last, and a machine that stalls them
    /// only makes it longer.
    pub fn arrival_span(&self) -> std::time::Duration {
        let times = self.accepted.iter().map(|(t, _, _)| *t);
        match (times.clone().min(), times.max()) {
            (Some(first), Some(last)) => std::time::Duration::from_micros(last - first),
            _ => std::time::Duration::ZERO,
        }
    }

    /// Requests with the `Authorization` value `token` have a global limit of `global` per
    /// aligned second, and `GET /gateway/bot` tells them `max_concurrency`.
    pub fn token(&mut self, token: &str, global: u64, max_concurrency: u64) {
        self.tokens
            .insert(token.to_string(), (global, max_concurrency));
    }

    /// The most requests of `token` counted against its global limit in one aligned
    /// second.
    pub fn busiest_second(&self, token: &str) -> u64 {
        self.global_seen
            .iter()
            .filter(|((t, _), _)| t == token)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// The body of `GET /gateway/bot` for `token` (Discord's shape: `url`, `shards`,
    /// `session_start_limit` with `max_concurrency`, 1 unless [`token`](MockApi::token)
    /// says otherwise).
    pub fn gateway_bot(&mut self, token: &str) -> String {
        self.counts.gateway_bot += 1;
        let concurrency = self.tokens.get(token).map_or(1, |(_, c)| *c);
        serde_json::json!({
            "url": "wss://gateway.example",
            "shards": concurrency.max(1),
            "session_start_limit": {
                "total": 1000,
                "remaining": 1000,
                "reset_after": 0,
                "max_concurrency": concurrency,
            },
        })
        .to_string()
    }

    /// `route` counts against `bucket` (per major parameter) with `limit`.
    pub fn route(&mut self, route: &Route, bucket: &str, limit: Limit) {
        self.routes
            .insert(route.key().to_string(), (bucket.to_string(), limit));
    }

    /// The next request to `route` gets `what`.
    pub fn inject(&mut self, route: &Route, what: Inject) {
        self.inject
            .entry(route.key().to_string())
            .or_default()
            .push(what);
    }

    /// The body of the answer [`handle`](MockApi::handle) just gave, if it has one of its
    /// own (an injected GitHub secondary limit).
    pub fn take_body(&mut self) -> Option<String> {
        self.injected_body.take()
    }

    /// The request arrives at `now`: the status and headers it gets.
    pub fn handle(&mut self, route: &Route, now: u64) -> (u16, HeaderMap) {
        self.handle_as("", route, now)
    }

    /// The request of `token` (its `Authorization` value) arrives at `now`: the status
    /// and headers it gets.
    pub fn handle_as(&mut self, token: &str, route: &Route, now: u64) -> (u16, HeaderMap) {
        self.counts.requests += 1;
        let mut h = HeaderMap::new();
        if let Some(list) = self.inject.get_mut(route.key()) {
            if !list.is_empty() {
                let what = list.remove(0);
                self.counts.injected += 1;
                return match what {
                    Inject::HeaderlessGlobal429(s) => {
                        h.insert("retry-after", HeaderValue::from(s));
                        (429, h)
                    }
                    Inject::BadGateway => (502, h),
                    Inject::Secondary403 => {
                        h.insert("x-ratelimit-remaining", HeaderValue::from(100u64));
                        h.insert("content-type", HeaderValue::from_static("application/json"));
                        self.injected_body = Some(
                            r#"{"message":"You have exceeded a secondary rate limit."}"#.into(),
                        );
                        (403, h)
                    }
                    Inject::Shared429(s) => {
                        let (bucket, _) = &self.routes[route.key()];
                        h.insert("x-ratelimit-bucket", HeaderValue::from_str(bucket).unwrap());
                        h.insert("x-ratelimit-scope", HeaderValue::from_static("shared"));
                        h.insert("retry-after", HeaderValue::from(s));
                        (429, h)
                    }
                };
            }
        }
        let sec = now / SECOND;
        let global = self.tokens.get(token).map_or(self.global, |(g, _)| *g);
        let in_second = self
            .global_seen
            .entry((token.to_string(), sec))
            .or_insert(0);
        if !route.is_global_exempt() && *in_second >= global {
            self.counts.global_429 += 1;
            h.insert("x-ratelimit-global", HeaderValue::from_static("true"));
            h.insert("x-ratelimit-scope", HeaderValue::from_static("global"));
            let left = (sec + 1) * SECOND - now;
            h.insert("retry-after", HeaderValue::from_str(&secs(left)).unwrap());
            return (429, h);
        }
        let Some((bucket, limit)) = self.routes.get(route.key()).cloned() else {
            // No limit on this route: no headers.
            if !route.is_global_exempt() {
                *in_second += 1;
            }
            self.counts.ok += 1;
            return (200, h);
        };
        let key = (bucket.clone(), route.major().to_string());
        let w = self.windows.entry(key).or_insert((0, 0));
        if now >= w.0 {
            *w = (now + limit.window, limit.limit);
        }
        h.insert(
            "x-ratelimit-bucket",
            HeaderValue::from_str(&bucket).unwrap(),
        );
        h.insert("x-ratelimit-limit", HeaderValue::from(limit.limit));
        h.insert(
            "x-ratelimit-reset-after",
            HeaderValue::from_str(&secs(w.0 - now)).unwrap(),
        );
        if w.1 == 0 {
            self.counts.bucket_429 += 1;
            h.insert("x-ratelimit-remaining", HeaderValue::from(0u64));
            h.insert("x-ratelimit-scope", HeaderValue::from_static("user"));
            h.insert(
                "retry-after",
                HeaderValue::from_str(&secs(w.0 - now)).unwrap(),
            );
            return (429, h);
        }
        w.1 -= 1;
        h.insert("x-ratelimit-remaining", HeaderValue::from(w.1));
        if !route.is_global_exempt() {
            *in_second += 1;
        }
        self.counts.ok += 1;
        self.accepted.push((now, bucket, route.major().to_string()));
        (200, h)
    }
}

/// µs as seconds with millisecond precision, rounded up (as Discord sends them).
fn secs(us: u64) -> String {
    let ms = us.div_ceil(1000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Installs the TLS provider `paceline proxy` and the Redis store use, so that reqwest
/// clients can be built in a workspace whose reqwest has TLS without a provider of its own.
pub fn install_tls_provider() {
    paceline_store::install_tls_provider();
}

/// A [`MockApi`] served over HTTP on 127.0.0.1, on the wall clock. A request's route is
/// read the way Discord's are ([`Route::discord`]); every answer's body is a small JSON
/// object with the path and query and the body's length as the mock saw them, and the
/// request's `x-echo` header is sent back.
pub struct MockServer {
    addr: SocketAddr,
    /// The mock, shared with the serving task.
    pub api: Arc<Mutex<MockApi>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    /// Serves `api` on a free port (needs a tokio runtime).
    pub async fn start(api: MockApi) -> MockServer {
        install_tls_provider();
        let api = Arc::new(Mutex::new(api));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::clone(&api);
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let api = Arc::clone(&shared);
            async move {
                let (parts, body) = request.into_parts();
                let length = axum::body::to_bytes(body, usize::MAX)
                    .await
                    .map_or(0, |b| b.len());
                let route = Route::discord(parts.method.as_str(), parts.uri.path());
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64);
                let token = parts
                    .headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let (status, mut headers, own_body) = {
                    let mut api = api.lock().unwrap_or_else(|e| e.into_inner());
                    if parts.method == "GET" && parts.uri.path().ends_with("/gateway/bot") {
                        let mut headers = HeaderMap::new();
                        headers
                            .insert("content-type", HeaderValue::from_static("application/json"));
                        (200, headers, Some(api.gateway_bot(token)))
                    } else {
                        let (status, headers) = api.handle_as(token, &route, now);
                        (status, headers, api.take_body())
                    }
                };
                if let Some(echo) = parts.headers.get("x-echo") {
                    headers.insert("x-echo", echo.clone());
                }
                let seen = serde_json::json!({
                    "path": parts.uri.path_and_query().map(|p| p.as_str()),
                    "body_length": length,
                    "hop_by_hop": parts.headers.contains_key("proxy-authorization"),
                });
                let body = own_body.unwrap_or_else(|| seen.to_string());
                let mut response = axum::response::Response::new(axum::body::Body::from(body));
                *response.status_mut() = axum::http::StatusCode::from_u16(status)
                    .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
                *response.headers_mut() = headers;
                response
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockServer { addr, api, task }
    }

    /// The mock's base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

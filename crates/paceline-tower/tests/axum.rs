//! The layer in an axum app: state shared across connections, headers and problem details,
//! leases given back, pace mode and store failures. Time is a [`ManualClock`] the tests move
//! (or leave still): nothing sleeps for real.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use paceline_store::redis::RedisStore;
use paceline_store::{Clock, FailurePolicy, ManualClock, MemoryStore, Op, Policy, SharedStore};
use paceline_tower::{Key, RateLimitLayer, StoreFailure};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

fn memory(clock: &ManualClock) -> SharedStore {
    Arc::new(MemoryStore::builder().clock(clock.clone()).build())
}

/// A Redis (or Redis Cluster) store at `url` on `clock`, under keys of its own.
async fn redis_on(url: String, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(url, FailurePolicy::FailClosed)
        .prefix(paceline_testkit::unique_name("tower"))
        .clock(Arc::new(clock.clone()))
        // Generous: a loaded machine must not turn a slow answer into a failed test.
        .response_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .expect("the test Redis")
}

fn policy(spec: &str) -> Policy {
    spec.parse().expect("a valid spec")
}

/// How many connections may be open at once here: 1,500, the open-file limit raised for
/// both ends of each where it is lower (and, only if the hard limit forbids that, as many
/// as it allows).
fn connections_allowed() -> usize {
    let soft = paceline_testkit::open_files_at_least(4_096);
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    (soft.saturating_sub(256) / 2).clamp(100, 1_500)
}

/// Serves `app` on a free port with each connection's peer address, as axum apps run.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

/// One request on a connection of its own; its status.
async fn get_status(addr: SocketAddr) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.expect("read");
    let text = String::from_utf8_lossy(&reply);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text}"))
}

/// `n` requests at once, each on its own connection: how many got 200 and how many 429.
async fn burst(addr: SocketAddr, n: usize) -> (usize, usize) {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                get_status(addr).await
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        match task.await.expect("a request task") {
            200 => ok += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, refused)
}

fn hello(layer: RateLimitLayer) -> Router {
    hello_as(layer, Bodies::Limited)
}

/// The hello app behind `layer`, its answers' bodies made as `bodies` says.
fn hello_as(layer: RateLimitLayer, bodies: Bodies) -> Router {
    behind(
        Router::new().route("/", get(|| async { "hello" })),
        layer,
        bodies,
    )
}

/// Whole seconds, rounded up, as the `RateLimit` field's `t` gives them.
fn seconds_up(d: Duration) -> i64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)) as i64
}

/// How a test's layer makes its answers' bodies: wrapped for any service, or axum's own
/// ([`RateLimitLayer::for_axum`]); the layer answers the same either way.
#[derive(Clone, Copy, Debug)]
enum Bodies {
    Limited,
    Axum,
}

const BOTH: [Bodies; 2] = [Bodies::Limited, Bodies::Axum];

/// `router` behind `layer`, its answers' bodies made as `bodies` says.
fn behind(router: Router, layer: RateLimitLayer, bodies: Bodies) -> Router {
    match bodies {
        Bodies::Limited => router.layer(layer),
        Bodies::Axum => router.layer(layer.for_axum()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_share_one_limit_in_memory() {
    // axum clones the service for every connection; tower's own RateLimit, whose state is
    // in each clone, let 1,500 of these through. Here the clock stands still: the policy
    // admits its burst of 5, and nothing more.
    let clock = ManualClock::new(EPOCH_2023);
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit(
            "per-second",
            policy("gcra:rate=5/s,burst=5"),
            Key::peer_ip(),
        )
        .build()
        .expect("a layer");
    assert_eq!(
        layer.refusals_from_cache(),
        None,
        "no cache in front of memory"
    );
    let addr = serve(hello(layer)).await;
    let n = connections_allowed();
    let (ok, refused) = burst(addr, n).await;
    assert_eq!((ok, refused), (5, n - 5), "{n} requests");
    // A second later, five more: the policy's own replay.
    clock.advance(Duration::from_secs(1));
    let (ok, _) = burst(addr, 50).await;
    assert_eq!(ok, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_share_one_limit_on_redis() {
    let clock = ManualClock::new(EPOCH_2023);
    let store = redis_on(paceline_testkit::shared_server().url(), &clock).await;
    let layer = RateLimitLayer::builder(Arc::new(store))
        .limit(
            "per-second",
            policy("gcra:rate=5/s,burst=5"),
            Key::peer_ip(),
        )
        .limit(
            "per-day",
            policy("fixed_window:limit=8,window=1d"),
            Key::peer_ip(),
        )
        .build()
        .expect("a layer");
    let addr = serve(hello(layer.clone())).await;
    let (ok, refused) = burst(addr, 300).await;
    assert_eq!((ok, refused), (5, 295));
    // On Redis the layer remembers refusals: now every retry is answered without Redis.
    let before = layer.refusals_from_cache().expect("a cache on Redis");
    let (ok, refused) = burst(addr, 10).await;
    assert_eq!((ok, refused), (0, 10));
    assert_eq!(layer.refusals_from_cache(), Some(before + 10));
    // The day's limit counted only the five admitted: three more pass a second later, as
    // the remembered refusals expire on the store's clock.
    clock.advance(Duration::from_secs(1));
    let (ok, _) = burst(addr, 50).await;
    assert_eq!(ok, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_share_one_set_of_limits_on_a_redis_cluster() {
    // Every limit of the layer reads the same key, so the set's keys share a hash slot.
    let clock = ManualClock::new(EPOCH_2023);
    let store = redis_on(paceline_testkit::shared_cluster().url(), &clock).await;
    assert!(store.is_cluster());
    let layer = RateLimitLayer::builder(Arc::new(store))
        .limit(
            "per-second",
            policy("gcra:rate=5/s,burst=5"),
            Key::peer_ip(),
        )
        .limit(
            "per-day",
            policy("fixed_window:limit=8,window=1d"),
            Key::peer_ip(),
        )
        .limit(
            "in-flight",
            policy("concurrency:limit=100,lease=30s"),
            Key::peer_ip(),
        )
        .build()
        .expect("a layer");
    let addr = serve(hello(layer)).await;
    let (ok, refused) = burst(addr, 200).await;
    assert_eq!((ok, refused), (5, 195));
    clock.advance(Duration::from_secs(1));
    let (ok, _) = burst(addr, 50).await;
    assert_eq!(ok, 3, "the day's limit counted only what was admitted");
}

/// The items of a `RateLimit` / `RateLimit-Policy` field.
fn items(headers: &http::HeaderMap, field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    paceline_testkit::ratelimit_items(headers, field)
}

async fn call(app: &Router, request: http::Request<Body>) -> http::Response<Body> {
    app.clone().oneshot(request).await.expect("the app answers")
}

fn request(api_key: Option<&str>) -> http::Request<Body> {
    let mut builder = http::Request::get("/");
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    builder.body(Body::empty()).expect("a request")
}

#[tokio::test]
async fn headers_parse_back_into_the_decisions_and_refusals_are_problem_details() {
    for bodies in BOTH {
        headers_and_refusals(bodies).await;
    }
}

async fn headers_and_refusals(bodies: Bodies) {
    let clock = ManualClock::new(EPOCH_2023);
    let second = policy("gcra:rate=2/s,burst=2");
    let day = policy("fixed_window:limit=100,window=1d");
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit("per-second", second.clone(), Key::header("x-api-key"))
        .limit("per-day", day.clone(), Key::header("x-api-key"))
        .build()
        .expect("a layer");
    let app = hello_as(layer, bodies);
    // The same traffic replayed on the policies alone gives what the headers must say.
    let (mut s2, mut sd) = (None, None);
    let now = clock.now_micros();
    for _ in 0..2 {
        let response = call(&app, request(Some("k1"))).await;
        assert_eq!(response.status(), 200, "{bodies:?}");
        let d2 = second.apply(&mut s2, now, Op::Limit, 1).expect("replay");
        let dd = day.apply(&mut sd, now, Op::Limit, 1).expect("replay");
        assert_eq!(
            items(response.headers(), "ratelimit-policy"),
            [
                ("per-second".to_string(), vec![("q".to_string(), 2)]),
                ("per-day".to_string(), vec![("q".to_string(), 100)]),
            ]
        );
        assert_eq!(
            items(response.headers(), "ratelimit"),
            [
                (
                    "per-second".to_string(),
                    vec![
                        ("r".to_string(), d2.remaining as i64),
                        ("t".to_string(), seconds_up(d2.reset_after))
                    ]
                ),
                (
                    "per-day".to_string(),
                    vec![
                        ("r".to_string(), dd.remaining as i64),
                        ("t".to_string(), seconds_up(dd.reset_after))
                    ]
                ),
            ]
        );
    }
    let refused = call(&app, request(Some("k1"))).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(refused.headers()["retry-after"], "1");
    let state = items(refused.headers(), "ratelimit");
    assert_eq!(state[0].1[0], ("r".to_string(), 0));
    assert_eq!(
        state[1].1[0],
        ("r".to_string(), 98),
        "the refusal counted against no limit"
    );
    let body = refused
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    let problem: Value = serde_json::from_slice(&body).expect("JSON");
    // RFC 9457: `type` a URI reference, `title` and `detail` strings, `status` the code.
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["status"], 429);
    assert!(problem["detail"]
        .as_str()
        .is_some_and(|d| d.contains("`per-second`")));
    assert_eq!(problem["violated"], serde_json::json!(["per-second"]));
    assert_eq!(problem["retry_after_ms"], 500.0);
    // Another key is counted apart, and an admitted body arrives whole; a request without
    // the key is the request's fault.
    let other = call(&app, request(Some("k2"))).await;
    assert_eq!(other.status(), 200);
    let hello = other.into_body().collect().await.expect("a body");
    assert_eq!(hello.to_bytes(), "hello", "{bodies:?}");
    let keyless = call(&app, request(None)).await;
    assert_eq!(keyless.status(), 400);
    assert_eq!(
        keyless.headers()["content-type"],
        "application/problem+json"
    );
}

/// An app whose handler tells when it runs and answers only when told to.
fn held_app(
    layer: RateLimitLayer,
    bodies: Bodies,
) -> (
    Router,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    Arc<tokio::sync::Notify>,
) {
    let (entered, started) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let go = Arc::clone(&release);
    let router = Router::new()
        .route(
            "/",
            get(move || {
                let (entered, go) = (entered.clone(), Arc::clone(&go));
                async move {
                    let _ = entered.send(());
                    go.notified().await;
                    "done"
                }
            }),
        )
        .route("/quick", get(|| async { "quick" }));
    (behind(router, layer, bodies), started, release)
}

#[tokio::test]
async fn a_request_in_flight_holds_its_lease_until_its_body_ends_or_it_is_dropped() {
    for bodies in BOTH {
        lease_held_until_the_body_ends(bodies).await;
    }
}

/// A request for `held_app`'s `/quick`, which answers at once.
fn quick() -> http::Request<Body> {
    http::Request::get("/quick")
        .body(Body::empty())
        .expect("a request")
}

async fn lease_held_until_the_body_ends(bodies: Bodies) {
    let clock = ManualClock::new(EPOCH_2023);
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit(
            "in-flight",
            policy("concurrency:limit=1,lease=30s"),
            Key::constant("all"),
        )
        .build()
        .expect("a layer");
    let (app, mut started, release) = held_app(layer, bodies);
    // A request in its handler holds the only place.
    let first = tokio::spawn({
        let app = app.clone();
        async move { call(&app, request(None)).await }
    });
    started.recv().await.expect("the first request runs");
    assert_eq!(call(&app, quick()).await.status(), 429);
    // The client goes away: its request is dropped, and the lease comes back.
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    let response = call(&app, quick()).await;
    assert_eq!(response.status(), 200);
    // That response's body is not read yet: the lease is still held.
    assert_eq!(call(&app, quick()).await.status(), 429);
    let body = response.into_body().collect().await.expect("a body");
    assert_eq!(body.to_bytes(), "quick");
    // The body ended: the place is free again.
    assert_eq!(call(&app, quick()).await.status(), 200);
    release.notify_waiters();
}

/// Peeks at `policy`'s `key` in `store` until a place is free, a bounded number of times
/// (each look a round trip to the store, none a sleep): a lease given back in a task of the
/// runtime (as on Redis) is back before long. Time does not move meanwhile: no lease expires.
async fn until_a_place_is_free(store: &SharedStore, policy: &Policy, key: &str) {
    const LOOKS: usize = 10_000;
    for _ in 0..LOOKS {
        let d = store
            .decide(policy, key, Op::Peek, 1)
            .await
            .expect("a peek");
        if d.allowed {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("no place came back at `{key}` in {LOOKS} looks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_request_in_flight_gives_its_lease_back_when_its_body_ends_or_it_is_dropped() {
    for bodies in BOTH {
        lease_given_back_on_redis(bodies).await;
    }
}

async fn lease_given_back_on_redis(bodies: Bodies) {
    let clock = ManualClock::new(EPOCH_2023);
    let store: SharedStore =
        Arc::new(redis_on(paceline_testkit::shared_server().url(), &clock).await);
    let in_flight = policy("concurrency:limit=1,lease=30s");
    // The layer's key in the store: `{KEY}:NAME`.
    let key = "{all}:in-flight";
    let held = |store: SharedStore| {
        let policy = in_flight.clone();
        async move {
            let d = store
                .decide(&policy, key, Op::Peek, 1)
                .await
                .expect("a peek");
            !d.allowed
        }
    };
    let layer = RateLimitLayer::builder(Arc::clone(&store))
        .limit("in-flight", in_flight.clone(), Key::constant("all"))
        .build()
        .expect("a layer");
    let (app, mut started, release) = held_app(layer, bodies);
    // A response whose body is not read yet holds the only place.
    let response = call(&app, quick()).await;
    assert_eq!(response.status(), 200, "{bodies:?}");
    assert!(held(Arc::clone(&store)).await);
    assert_eq!(call(&app, quick()).await.status(), 429, "{bodies:?}");
    // The body ends: the lease goes back (in a task, after a round trip to Redis).
    let body = response.into_body().collect().await.expect("a body");
    assert_eq!(body.to_bytes(), "quick");
    until_a_place_is_free(&store, &in_flight, key).await;
    // A request in its handler holds it again; the client goes away (the request is
    // dropped), and it comes back.
    let first = tokio::spawn({
        let app = app.clone();
        async move { call(&app, request(None)).await }
    });
    started.recv().await.expect("the first request runs");
    assert!(held(Arc::clone(&store)).await);
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    until_a_place_is_free(&store, &in_flight, key).await;
    let admitted = call(&app, quick()).await;
    assert_eq!(admitted.status(), 200, "{bodies:?}");
    drop(admitted);
    assert_eq!(clock.now_micros(), EPOCH_2023, "no lease expired");
    release.notify_waiters();
}

/// A body that sends `first` and then never ends (a response streaming slowly).
struct FirstChunkThenHold(Option<bytes::Bytes>);

impl http_body::Body for FirstChunkThenHold {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(chunk) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk)))),
            // Never woken: the body ends only when dropped.
            None => std::task::Poll::Pending,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_client_closing_its_connection_mid_response_gives_the_lease_back() {
    let clock = ManualClock::new(EPOCH_2023);
    let store: SharedStore =
        Arc::new(redis_on(paceline_testkit::shared_server().url(), &clock).await);
    let in_flight = policy("concurrency:limit=1,lease=30s");
    let key = "{all}:in-flight";
    let layer = RateLimitLayer::builder(Arc::clone(&store))
        .limit("in-flight", in_flight.clone(), Key::constant("all"))
        .build()
        .expect("a layer");
    let router = Router::new().route("/", get(|| async { "hello" })).route(
        "/stream",
        get(|| async {
            Body::new(FirstChunkThenHold(Some(bytes::Bytes::from_static(
                b"first-chunk",
            ))))
        }),
    );
    let addr = serve(router.layer(layer)).await;
    // A real client reads the start of a streamed response, then closes its connection.
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("send");
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("first-chunk") {
        let mut buf = [0u8; 1024];
        let n = client.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "the server closed first: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    // Mid-response, the place is held: another connection is refused.
    assert_eq!(get_status(addr).await, 429);
    drop(client);
    // The server sees the connection close, drops the response, and gives the lease back.
    until_a_place_is_free(&store, &in_flight, key).await;
    assert_eq!(get_status(addr).await, 200);
    assert_eq!(clock.now_micros(), EPOCH_2023, "no lease expired");
}

#[tokio::test]
async fn pace_mode_waits_its_turn_within_max_wait() {
    let clock = ManualClock::new(EPOCH_2023);
    // Both layers on one store: the impatient one sees what the first did.
    let store = memory(&clock);
    let layer = |max_wait: Duration, limits: usize| {
        let mut builder = RateLimitLayer::builder(Arc::clone(&store));
        builder = builder.limit("a", policy("gcra:rate=1/s"), Key::constant("k"));
        if limits > 1 {
            builder = builder.limit(
                "b",
                policy("fixed_window:limit=5,window=1h"),
                Key::constant("k"),
            );
        }
        hello(builder.pace(max_wait).build().expect("a layer"))
    };
    for limits in [1, 2] {
        let start = clock.now_micros();
        let app = layer(Duration::from_secs(2), limits);
        assert_eq!(call(&app, request(None)).await.status(), 200);
        // The second waits a second of the store's time for its turn, then goes.
        assert_eq!(call(&app, request(None)).await.status(), 200);
        assert_eq!(clock.now_micros() - start, 1_000_000, "{limits} limit(s)");
        // Within half a second it cannot: refused at once.
        let impatient = layer(Duration::from_millis(500), limits);
        assert_eq!(call(&impatient, request(None)).await.status(), 429);
        assert_eq!(clock.now_micros() - start, 1_000_000);
        clock.advance(Duration::from_secs(3600));
    }
}

#[tokio::test]
async fn pace_mode_waits_for_a_place_in_flight_too() {
    let clock = ManualClock::new(EPOCH_2023);
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit(
            "in-flight",
            policy("concurrency:limit=1,lease=1s"),
            Key::constant("all"),
        )
        .pace(Duration::from_secs(2))
        .build()
        .expect("a layer");
    let app = hello(layer);
    // The first response is held (its body unread): its lease with it.
    let held = call(&app, request(None)).await;
    assert_eq!(held.status(), 200);
    let start = clock.now_micros();
    // The second waits for the place: here the lease's expiry, a second of the store's time.
    assert_eq!(call(&app, request(None)).await.status(), 200);
    assert_eq!(clock.now_micros() - start, 1_000_000);
    drop(held);
}

#[tokio::test]
async fn a_failed_store_is_a_503_or_lets_requests_through() {
    for bodies in BOTH {
        failed_store(bodies).await;
    }
}

async fn failed_store(bodies: Bodies) {
    // A memory store that holds no key fails every new key.
    let full: SharedStore = Arc::new(MemoryStore::builder().max_keys(0).build());
    let app = |key: Key, failure: StoreFailure| {
        let layer = RateLimitLayer::builder(Arc::clone(&full))
            .limit("a", policy("gcra:rate=1/s"), key)
            .on_store_failure(failure)
            .build()
            .expect("a layer");
        hello_as(layer, bodies)
    };
    let refused = call(
        &app(Key::constant("k"), StoreFailure::Refuse),
        request(None),
    )
    .await;
    assert_eq!(refused.status(), 503, "{bodies:?}");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let body = refused.into_body().collect().await.expect("a body");
    let problem: Value = serde_json::from_slice(&body.to_bytes()).expect("JSON");
    assert_eq!(problem["status"], 503);
    let open = call(&app(Key::constant("k"), StoreFailure::Allow), request(None)).await;
    assert_eq!(open.status(), 200, "{bodies:?}");
    let body = open.into_body().collect().await.expect("a body");
    assert_eq!(body.to_bytes(), "hello", "{bodies:?}");
    // Without a peer address to read, the service is set up wrong: 500.
    let by_ip = app(Key::peer_ip(), StoreFailure::Refuse);
    assert_eq!(
        call(&by_ip, request(None)).await.status(),
        500,
        "{bodies:?}"
    );
}

#[tokio::test]
async fn one_limit_decided_in_call_sends_its_headers_and_refuses_with_problem_details() {
    for bodies in BOTH {
        let clock = ManualClock::new(EPOCH_2023);
        let second = policy("gcra:rate=2/s,burst=2");
        let layer = RateLimitLayer::builder(memory(&clock))
            .limit("per-second", second.clone(), Key::header("x-api-key"))
            .build()
            .expect("a layer");
        let app = hello_as(layer, bodies);
        let mut state = None;
        let now = clock.now_micros();
        for _ in 0..2 {
            let response = call(&app, request(Some("k1"))).await;
            assert_eq!(response.status(), 200, "{bodies:?}");
            let d = second.apply(&mut state, now, Op::Limit, 1).expect("replay");
            assert_eq!(
                items(response.headers(), "ratelimit-policy"),
                [("per-second".to_string(), vec![("q".to_string(), 2)])]
            );
            assert_eq!(
                items(response.headers(), "ratelimit"),
                [(
                    "per-second".to_string(),
                    vec![
                        ("r".to_string(), d.remaining as i64),
                        ("t".to_string(), seconds_up(d.reset_after))
                    ]
                )]
            );
            let body = response.into_body().collect().await.expect("a body");
            assert_eq!(body.to_bytes(), "hello", "{bodies:?}");
        }
        let refused = call(&app, request(Some("k1"))).await;
        assert_eq!(refused.status(), 429, "{bodies:?}");
        assert_eq!(refused.headers()["retry-after"], "1");
        assert_eq!(
            items(refused.headers(), "ratelimit")[0].1[0],
            ("r".to_string(), 0)
        );
        let body = refused.into_body().collect().await.expect("a body");
        let problem: Value = serde_json::from_slice(&body.to_bytes()).expect("JSON");
        assert_eq!(problem["violated"], serde_json::json!(["per-second"]));
    }
}

#[test]
fn for_axum_answers_in_axums_own_body_type() {
    // Checked by the compiler: the service's answers are `Response<axum::body::Body>`
    // itself, not a wrapper around it.
    fn answers_axum_bodies<S>(_: &S)
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    {
    }
    let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
        .limit("a", policy("gcra:rate=1/s"), Key::constant("k"))
        .build()
        .expect("a layer")
        .for_axum();
    let inner = tower::service_fn(|_: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("hello")))
    });
    answers_axum_bodies(&tower::Layer::layer(&layer, inner));
}

#[test]
fn layers_are_checked_when_built() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let err = |builder: paceline_tower::Builder| {
        builder.build().expect_err("refused").field().to_string()
    };
    assert_eq!(err(RateLimitLayer::builder(Arc::clone(&store))), "limits");
    let named = |name: &str| {
        RateLimitLayer::builder(Arc::clone(&store)).limit(
            name,
            policy("gcra:rate=1/s"),
            Key::constant("k"),
        )
    };
    assert_eq!(err(named("has space")), "name");
    assert_eq!(err(named("")), "name");
    let twice = named("a").limit("a", policy("gcra:rate=2/s"), Key::constant("k"));
    assert_eq!(err(twice), "name");
    let bad_header = RateLimitLayer::builder(Arc::clone(&store)).limit(
        "a",
        policy("gcra:rate=1/s"),
        Key::header("x api key"),
    );
    assert_eq!(err(bad_header), "key");
    assert!(named("per-second.v2_x").build().is_ok());
}

#[tokio::test]
async fn a_request_dropped_before_its_first_poll_gives_its_lease_back() {
    use tower::{Layer, Service};
    let clock = ManualClock::new(EPOCH_2023);
    // `exec_evenly` admits the second request after a delay: its future waits, holding the
    // place in flight it was given in `call`.
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit(
            "evenly",
            policy("exec_evenly:points=10,duration=1s"),
            Key::constant("all"),
        )
        .limit(
            "in-flight",
            policy("concurrency:limit=1,lease=1h"),
            Key::constant("all"),
        )
        .build()
        .expect("a layer");
    // The layer's own service (axum's router would call it only when polled).
    let mut service = layer.layer(tower::service_fn(|_: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    ServiceExt::<http::Request<Body>>::ready(&mut service)
        .await
        .expect("ready");
    let first = service.call(request(None)).await.expect("an answer");
    assert_eq!(first.status(), 200);
    drop(first); // its body, and its place, go back
    ServiceExt::<http::Request<Body>>::ready(&mut service)
        .await
        .expect("ready");
    // Decided in `call` (admitted after a delay), dropped unpolled.
    drop(service.call(request(None)));
    // Had the dropped request kept its place, this one would be refused (one in flight).
    ServiceExt::<http::Request<Body>>::ready(&mut service)
        .await
        .expect("ready");
    let third = service.call(request(None)).await.expect("an answer");
    assert_eq!(third.status(), 200);
}

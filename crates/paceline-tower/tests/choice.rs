//! A limit whose policy each request chooses (`Builder::limit_by`): by an API key's plan
//! or a route, each policy counting apart, its quota in the headers, a lease of a chosen
//! `concurrency` policy given back, a choice of no policy answered `500`, and the limits
//! checked at build. Time is a [`ManualClock`] that stands still.

use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use paceline_store::redis::RedisStore;
use paceline_store::{FailurePolicy, ManualClock, MemoryStore, Op, Policy, SharedStore};
use paceline_tower::{Choice, Key, RateLimitLayer};
use tower::ServiceExt;

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

fn policy(spec: &str) -> Policy {
    spec.parse().expect("a valid spec")
}

fn memory(clock: &ManualClock) -> SharedStore {
    Arc::new(MemoryStore::builder().clock(clock.clone()).build())
}

/// A layer of one limit by plan (`x-plan: pro`, else free), keyed by `x-api-key`.
fn by_plan(store: SharedStore) -> RateLimitLayer {
    RateLimitLayer::builder(store)
        .limit_by(
            "per-hour",
            [
                ("free", policy("fixed_window:limit=2,window=1h")),
                ("pro", policy("fixed_window:limit=5,window=1h")),
            ],
            Key::header("x-api-key"),
            |head| match head.headers.get("x-plan") {
                Some(plan) if plan == "pro" => "pro",
                _ => "free",
            },
        )
        .build()
        .expect("a layer")
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/search", get(|| async { "found" }))
        .layer(layer)
}

fn request(path: &str, api_key: &str, plan: Option<&str>) -> http::Request<Body> {
    let mut builder = http::Request::get(path).header("x-api-key", api_key);
    if let Some(plan) = plan {
        builder = builder.header("x-plan", plan);
    }
    builder.body(Body::empty()).expect("a request")
}

async fn call(app: &Router, request: http::Request<Body>) -> http::Response<Body> {
    app.clone().oneshot(request).await.expect("the app answers")
}

/// The statuses of `n` requests made one after another.
async fn statuses(app: &Router, n: usize, make: impl Fn() -> http::Request<Body>) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(call(app, make()).await.status().as_u16());
    }
    out
}

/// Each plan's policy applies to the requests that choose it, each counted apart, and the
/// headers give the chosen policy's quota under the limit's name.
async fn plans_count_apart(store: SharedStore) {
    let app = app(by_plan(store));
    let free = statuses(&app, 3, || request("/", "k1", None)).await;
    assert_eq!(free, [200, 200, 429]);
    // The same API key on the pro plan: its own count, its own limit.
    let pro = statuses(&app, 6, || request("/", "k1", Some("pro"))).await;
    assert_eq!(pro, [200, 200, 200, 200, 200, 429]);
    let free_again = call(&app, request("/", "k1", Some("free"))).await;
    assert_eq!(free_again.status(), 429);
    let quota = |response: &http::Response<Body>| {
        paceline_testkit::ratelimit_items(response.headers(), "ratelimit-policy")
    };
    assert_eq!(
        quota(&free_again),
        [("per-hour".to_string(), vec![("q".to_string(), 2)])]
    );
    let other = call(&app, request("/", "k2", Some("pro"))).await;
    assert_eq!(other.status(), 200);
    assert_eq!(
        quota(&other),
        [("per-hour".to_string(), vec![("q".to_string(), 5)])]
    );
    let remaining = paceline_testkit::ratelimit_items(other.headers(), "ratelimit");
    assert_eq!(remaining[0].1[0], ("r".to_string(), 4));
}

#[tokio::test]
async fn each_plan_s_policy_counts_apart_in_memory() {
    let clock = ManualClock::new(EPOCH_2023);
    plans_count_apart(memory(&clock)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_plan_s_policy_counts_apart_on_redis() {
    let clock = ManualClock::new(EPOCH_2023);
    let store = RedisStore::builder(
        paceline_testkit::shared_server().url(),
        FailurePolicy::FailClosed,
    )
    .prefix(paceline_testkit::unique_name("choice"))
    .clock(Arc::new(clock.clone()))
    .response_timeout(std::time::Duration::from_secs(5))
    .connect()
    .await
    .expect("the test Redis");
    plans_count_apart(Arc::new(store)).await;
}

/// A route chooses its policy and the key it counts under, beside a limit of one policy:
/// a set decided as one.
#[tokio::test]
async fn a_route_chooses_its_policy_and_key_beside_a_fixed_limit() {
    let clock = ManualClock::new(EPOCH_2023);
    let store = memory(&clock);
    let layer = RateLimitLayer::builder(Arc::clone(&store))
        .limit(
            "per-day",
            policy("fixed_window:limit=100,window=1d"),
            Key::header("x-api-key"),
        )
        .limit_by(
            "per-route",
            [
                ("search", policy("fixed_window:limit=1,window=1h")),
                ("other", policy("fixed_window:limit=3,window=1h")),
            ],
            Key::header("x-api-key"),
            |head| {
                let key = head
                    .headers
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("anonymous")
                    .to_string();
                if head.uri.path() == "/search" {
                    // Every API key of one tenant shares the search budget.
                    Choice::policy("search").key(format!("tenant-of-{}", &key[..1]))
                } else {
                    Choice::policy("other")
                }
            },
        )
        .build()
        .expect("a layer");
    let app = app(layer);
    assert_eq!(
        call(&app, request("/search", "a1", None)).await.status(),
        200
    );
    // Another key of tenant `a`: the tenant's search budget is spent.
    assert_eq!(
        call(&app, request("/search", "a2", None)).await.status(),
        429
    );
    let other = statuses(&app, 4, || request("/", "a2", None)).await;
    assert_eq!(other, [200, 200, 200, 429]);
    // The refusals counted on neither limit: the day's count is the 4 admitted.
    let day = store
        .decide(
            &policy("fixed_window:limit=100,window=1d"),
            "{a2}:per-day",
            Op::Peek,
            1,
        )
        .await
        .expect("a peek");
    assert_eq!(day.remaining, 100 - 3);
    let tenant = store
        .decide(
            &policy("fixed_window:limit=1,window=1h"),
            "{tenant-of-a}:per-route:search",
            Op::Peek,
            1,
        )
        .await
        .expect("a peek");
    assert_eq!(tenant.remaining, 0);
}

/// A place in flight of a chosen `concurrency` policy is given back when the body ends.
#[tokio::test]
async fn a_lease_of_a_chosen_policy_is_given_back() {
    let clock = ManualClock::new(EPOCH_2023);
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit_by(
            "in-flight",
            [
                ("one", policy("concurrency:limit=1,lease=1m")),
                ("two", policy("concurrency:limit=2,lease=1m")),
            ],
            Key::header("x-api-key"),
            |head| {
                if head.headers.contains_key("x-plan") {
                    "two"
                } else {
                    "one"
                }
            },
        )
        .build()
        .expect("a layer");
    let app = app(layer);
    let held = call(&app, request("/", "k", None)).await;
    assert_eq!(held.status(), 200);
    assert_eq!(call(&app, request("/", "k", None)).await.status(), 429);
    // The other policy's places are its own.
    assert_eq!(call(&app, request("/", "k", Some("x"))).await.status(), 200);
    let _ = held.into_body().collect().await;
    assert_eq!(call(&app, request("/", "k", None)).await.status(), 200);
}

/// A choice that names none of the limit's policies is the service's fault: `500`, naming
/// the limit, what it chose, and its policies.
#[tokio::test]
async fn a_choice_of_no_policy_is_a_500_naming_it() {
    let clock = ManualClock::new(EPOCH_2023);
    let layer = RateLimitLayer::builder(memory(&clock))
        .limit_by(
            "per-plan",
            [("free", policy("gcra:rate=1/s"))],
            Key::header("x-api-key"),
            |head| {
                let plan = head.headers.get("x-plan").and_then(|v| v.to_str().ok());
                Choice::policy(plan.unwrap_or("free").to_string())
            },
        )
        .build()
        .expect("a layer");
    let app = app(layer);
    let response = call(&app, request("/", "k", Some("gold"))).await;
    assert_eq!(response.status(), 500);
    let body = response.into_body().collect().await.expect("a body");
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    assert!(
        text.contains("per-plan") && text.contains("gold") && text.contains("free"),
        "{text}"
    );
}

/// The limits are checked at build: a limit of no policies, two of one name, a name out of
/// the alphabet, a policy that can never admit a request.
#[test]
fn bad_choices_are_refused_at_build() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let build = |policies: Vec<(&'static str, Policy)>| {
        RateLimitLayer::builder(Arc::clone(&store))
            .limit_by("plan", policies, Key::constant("k"), |_| "a")
            .build()
            .map(|_| ())
            .map_err(|e| (e.field().to_string(), e.message().to_string()))
    };
    let empty = build(vec![]).expect_err("no policies");
    assert_eq!(empty.0, "policies", "{}", empty.1);
    let twice = build(vec![
        ("a", policy("gcra:rate=1/s")),
        ("a", policy("gcra:rate=2/s")),
    ])
    .expect_err("two of one name");
    assert!(twice.1.contains("two policies named `a`"), "{}", twice.1);
    let odd = build(vec![("a b", policy("gcra:rate=1/s"))]).expect_err("a bad name");
    assert!(odd.1.contains("`a b`"), "{}", odd.1);
    assert!(build(vec![("a", policy("gcra:rate=1/s"))]).is_ok());
}

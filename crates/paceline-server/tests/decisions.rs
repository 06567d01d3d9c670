//! `POST /v1/decisions` with `limits` (a set of limits decided as one) and the concurrency
//! leases of `/v1/leases`, in process, on the memory store and on Redis.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{call, Answer};

use paceline_server::Settings;
use paceline_store::{ManualClock, Policy};
use paceline_testkit::{shared_cluster, shared_server};
use serde_json::{json, Value};

/// A service on a free port with two configured policies, on `store`.
async fn serve(store: &str) -> common::Running {
    serve_on(store, None).await
}

/// [`serve`], the store reading time from `clock` when one is given.
async fn serve_on(store: &str, clock: Option<ManualClock>) -> common::Running {
    let policies: BTreeMap<String, Policy> = [
        ("burst", "gcra:rate=2/h,burst=2"),
        ("per-day", "sliding_log:limit=3,window=1d"),
        ("db", "concurrency:limit=2,lease=30s"),
        // A configured policy may be named like the inline specs' name.
        ("inline", "concurrency:limit=1,lease=30s"),
    ]
    .into_iter()
    .map(|(name, spec)| (name.to_string(), spec.parse().expect("a policy")))
    .collect();
    let settings = Settings {
        store: store.to_string(),
        allow_inline_policies: true,
        policies,
        ..Settings::default()
    };
    let clock = clock.map(|c| Arc::new(c) as Arc<dyn paceline_store::Clock>);
    common::start(settings, clock).await
}

async fn post(url: &str, body: Value) -> Answer {
    call(
        reqwest::Method::POST,
        &format!("{url}/v1/decisions"),
        Some(body),
    )
    .await
}

use paceline_testkit::{param, ratelimit_items as items};

async fn a_set_is_decided_as_one(store: &str, tenant: &str) {
    let (url, task, stop) = serve(store).await;
    let set = json!({
        "limits": [
            {"policy": "burst", "key": format!("{{{tenant}}}")},
            {"policy": "per-day", "key": format!("{{{tenant}}}")},
            {"policy": "sliding_log:limit=100,window=1h", "key": format!("{{{tenant}}}:hour")},
        ]
    });
    // Admitted twice: every limit counts it.
    for day_left in [2, 1] {
        let a = post(&url, set.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["allowed"], true);
        let limits = a.body["limits"].as_array().expect("one entry per limit");
        assert_eq!(limits.len(), 3);
        assert_eq!(limits[1]["policy"], "per-day");
        assert_eq!(limits[1]["key"], format!("{{{tenant}}}"));
        assert_eq!(limits[1]["remaining"], day_left);
        assert_eq!(limits[2]["policy"], "inline-3");
        assert!(a.headers.get("retry-after").is_none());
    }
    // The burst limit refuses: 429, and the daily and hourly limits are left as they
    // were.
    let refused = post(&url, set.clone()).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["allowed"], false);
    let limits = refused.body["limits"].as_array().expect("entries");
    let allowed: Vec<bool> = limits.iter().map(|l| l["allowed"] == true).collect();
    assert_eq!(allowed, [false, true, true]);
    assert_eq!(
        limits[1]["remaining"], 1,
        "the refused set used none of the day"
    );
    assert_eq!(limits[2]["remaining"], 98);
    let delay_ms = refused.body["delay_ms"].as_f64().expect("a retry-after");
    assert!(delay_ms > 0.0 && delay_ms <= 1_800_000.0, "{delay_ms}");
    assert_eq!(refused.body["delay_ms"], limits[0]["delay_ms"]);
    let retry: f64 = refused.headers["retry-after"]
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("Retry-After in seconds");
    assert_eq!(retry, (delay_ms / 1000.0).ceil());
    // Both headers list every limit under the same names, parsed back exactly.
    let policy = items(&refused.headers, "ratelimit-policy");
    let state = items(&refused.headers, "ratelimit");
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["burst", "per-day", "inline-3"]);
    assert_eq!(
        state.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        names
    );
    for (i, ((_, p), (_, s))) in policy.iter().zip(&state).enumerate() {
        assert_eq!(param(p, "q"), limits[i]["limit"].as_i64().expect("limit"));
        assert_eq!(
            param(s, "r"),
            limits[i]["remaining"].as_i64().expect("remaining")
        );
        let reset_ms = limits[i]["reset_after_ms"].as_f64().expect("reset");
        assert_eq!(
            param(s, "t"),
            (reset_ms / 1000.0).ceil() as i64,
            "limit {i}"
        );
    }
    let _ = stop.send(());
    let _ = task.await;
}

/// A limit named twice in a set (the same policy on the same key) is one limit counting
/// both costs: each position answers with it, the headers name it once, and costs that
/// together are more than the policy admits are a 409 naming the second's cost.
async fn a_limit_named_twice_counts_both_costs(store: &str, tenant: &str) {
    let (url, task, stop) = serve(store).await;
    let key = format!("{{{tenant}}}");
    let set = json!({"limits": [
        {"policy": "per-day", "key": key, "cost": 1},
        {"policy": "burst", "key": key},
        {"policy": "per-day", "key": key, "cost": 2},
    ]});
    let a = post(&url, set.clone()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let limits = a.body["limits"]
        .as_array()
        .expect("one entry per limit given");
    assert_eq!(limits.len(), 3, "{}", a.body);
    assert_eq!(
        limits[0], limits[2],
        "both positions answer with the one limit"
    );
    assert_eq!(limits[0]["policy"], "per-day");
    assert_eq!(limits[0]["remaining"], 0, "1 + 2 of 3 counted: {}", a.body);
    assert_eq!(limits[1]["remaining"], 1);
    let names: Vec<String> = items(&a.headers, "ratelimit")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["per-day", "burst"]);
    // The day is spent: refused, and the burst left as it was.
    let refused = post(&url, set).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["limits"][1]["remaining"], 1);
    // 2 + 2 of a limit of 3: never admitted, a conflict naming the second entry's cost.
    let beyond = post(
        &url,
        json!({"limits": [
            {"policy": "per-day", "key": "other", "cost": 2},
            {"policy": "per-day", "key": "other", "cost": 2},
        ]}),
    )
    .await;
    assert_eq!(beyond.status, 409, "{}", beyond.body);
    assert_eq!(beyond.body["error"]["field"], "limits[1].cost");
    let message = beyond.body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("limits[0]") && message.contains("4 together"),
        "{message}"
    );
    let _ = stop.send(());
    let _ = task.await;
}

async fn a_charge_counts_past_the_limit_and_is_never_refused(store: &str, tenant: &str) {
    let (url, task, stop) = serve(store).await;
    let key = format!("{{{tenant}}}");
    // 10 charged on a limit of 3 a day: admitted, nothing left.
    let charge = json!({"policy": "per-day", "key": key, "op": "charge", "cost": 10});
    let a = post(&url, charge.clone()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        (a.body["allowed"].clone(), a.body["remaining"].clone()),
        (json!(true), json!(0))
    );
    assert_eq!(a.body["delay_ms"], 0.0, "{}", a.body);
    // In debt: a limit is refused; another charge is still counted and admitted.
    let refused = post(
        &url,
        json!({"policy": "per-day", "key": key, "op": "limit"}),
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(post(&url, charge).await.status, 200);
    // A set charges every limit, each past its own.
    let set = json!({"op": "charge", "limits": [
        {"policy": "per-day", "key": format!("{key}:set"), "cost": 5},
        {"policy": "burst", "key": format!("{key}:set"), "cost": 4},
    ]});
    let a = post(&url, set).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["limits"][0]["remaining"], 0, "{}", a.body);
    assert_eq!(a.body["limits"][1]["remaining"], 0, "{}", a.body);
    let refused = post(
        &url,
        json!({"policy": "burst", "key": format!("{key}:set"), "op": "limit"}),
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    // What a charge cannot be: on a concurrency policy, with a max_wait, of no cost.
    for (body, field) in [
        (json!({"policy": "db", "key": key, "op": "charge"}), "op"),
        (
            json!({"policy": "per-day", "key": key, "op": "charge", "max_wait_ms": 10}),
            "max_wait_ms",
        ),
        (
            json!({"policy": "per-day", "key": key, "op": "charge", "cost": 0}),
            "cost",
        ),
        (
            json!({"policy": "per-day", "key": key, "op": "charge", "cost": 2_199_023_255_552_u64}),
            "cost",
        ),
    ] {
        let a = post(&url, body.clone()).await;
        assert_eq!(a.status, 400, "{body}: {}", a.body);
        assert_eq!(a.body["error"]["field"], field, "{body}: {}", a.body);
    }
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_counts_past_the_limit_in_memory() {
    a_charge_counts_past_the_limit_and_is_never_refused("memory", "tenant8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_counts_past_the_limit_on_redis() {
    let tenant = paceline_testkit::unique_name("tenant");
    a_charge_counts_past_the_limit_and_is_never_refused(&shared_server().url(), &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_named_twice_counts_both_costs_in_memory() {
    a_limit_named_twice_counts_both_costs("memory", "tenant7").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_named_twice_counts_both_costs_on_redis() {
    let tenant = paceline_testkit::unique_name("tenant");
    a_limit_named_twice_counts_both_costs(&shared_server().url(), &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_decided_as_one_in_memory() {
    a_set_is_decided_as_one("memory", "tenant42").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_decided_as_one_on_redis() {
    let tenant = paceline_testkit::unique_name("tenant");
    a_set_is_decided_as_one(&shared_server().url(), &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_decided_as_one_on_a_redis_cluster() {
    // The set's keys share the hash tag `{tenant}`: one slot, one call.
    let tenant = paceline_testkit::unique_name("tenant");
    a_set_is_decided_as_one(&shared_cluster().url(), &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_across_slots_of_a_cluster_is_a_400_naming_the_client_s_keys() {
    let (url, task, stop) = serve(&shared_cluster().url()).await;
    // Without a hash tag the service's keys of the two limits fall in different slots,
    // even where the client gave the same key twice. (Fixed keys: their slots are too;
    // a refused set writes nothing.)
    for (first, second) in [
        ("tenant42:second", "tenant42:day"),
        ("tenant42", "tenant42"),
    ] {
        let set = json!({"limits": [
            {"policy": "burst", "key": first},
            {"policy": "per-day", "key": second},
        ]});
        let a = post(&url, set.clone()).await;
        assert_eq!(a.status, 400, "{set}: {}", a.body);
        assert_eq!(a.body["error"]["field"], "limits", "{}", a.body);
        let message = a.body["error"]["message"].as_str().expect("a message");
        assert!(
            message.contains(&format!("`{first}` (limits[0].key)")),
            "{message}"
        );
        assert!(
            message.contains(&format!("`{second}` (limits[1].key)")),
            "{message}"
        );
        assert!(message.contains("hash tag"), "{message}");
        // The service's own keys (`POLICY:KEY`) are no business of the client's.
        assert!(!message.contains("burst:"), "{message}");
        assert!(!message.contains("per-day:"), "{message}");
    }
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_paced_to_the_time_every_limit_admits() {
    let (url, task, stop) = serve("memory").await;
    let limits = json!([
        {"policy": "burst", "key": "p"},
        {"policy": "per-day", "key": "p"},
    ]);
    // Two at once (the burst), then the third waits for the burst's next cell: 30 min
    // from the first (the service's clock is the real one: less the time since, at most a
    // minute here).
    for expected_ms in [0.0, 0.0, 1_800_000.0] {
        let a = post(&url, json!({"limits": limits, "op": "pace"})).await;
        assert_eq!(a.status, 200, "{}", a.body);
        let delay = a.body["delay_ms"].as_f64().expect("a delay");
        assert!(
            delay <= expected_ms && delay >= (expected_ms - 60_000.0).max(0.0),
            "{}",
            a.body
        );
        for limit in a.body["limits"].as_array().expect("the limits") {
            assert_eq!(limit["allowed"], true);
            assert_eq!(limit["delay_ms"], a.body["delay_ms"], "{}", a.body);
        }
    }
    // Within a second: refused, nothing booked. The day's three are booked: it refuses
    // until a day after the first; the burst refuses as it would alone (its next cell is an
    // hour away). The set's retry-after is the later of the two. (The day is a sliding log:
    // a fixed window's day ends at midnight UTC, which made this test depend on the hour it
    // ran at.)
    let a = post(
        &url,
        json!({"limits": limits, "op": "pace", "max_wait_ms": 1000}),
    )
    .await;
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(a.body["limits"][0]["allowed"], false, "{}", a.body);
    assert_eq!(a.body["limits"][1]["allowed"], false, "{}", a.body);
    let burst_retry = a.body["limits"][0]["delay_ms"].as_f64().expect("a delay");
    assert!(
        burst_retry < 3_600_000.0 && burst_retry > 3_500_000.0,
        "{}",
        a.body
    );
    assert_eq!(a.body["limits"][1]["remaining"], 0, "{}", a.body);
    let day_retry = a.body["limits"][1]["delay_ms"].as_f64().expect("a delay");
    assert!(
        day_retry > 86_340_000.0 && day_retry <= 86_400_000.0,
        "{}",
        a.body
    );
    assert_eq!(
        a.body["delay_ms"].as_f64(),
        Some(burst_retry.max(day_retry)),
        "{}",
        a.body
    );
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_400s_naming_the_field() {
    let (url, task, stop) = serve("memory").await;
    let limit = |policy: &str, key: &str| json!({"policy": policy, "key": key});
    let many: Vec<Value> = (0..=paceline_store::MAX_LIMITS)
        .map(|i| limit("burst", &format!("k{i}")))
        .collect();
    for (body, status, field) in [
        (
            json!({"policy": "burst", "key": "k", "limits": [limit("per-day", "k")]}),
            400,
            "policy",
        ),
        (
            json!({"key": "k", "limits": [limit("per-day", "k")]}),
            400,
            "key",
        ),
        (json!({"limits": []}), 400, "limits"),
        (json!({"limits": many}), 400, "limits"),
        (
            json!({"limits": [{"policy": "per-day"}]}),
            400,
            "limits[0].key",
        ),
        (
            json!({"limits": [limit("per-day", "a"), {"key": "b"}]}),
            400,
            "limits[1].policy",
        ),
        (
            json!({"limits": [limit("per-day", "a"), limit("nope", "b")]}),
            404,
            "limits[1].policy",
        ),
        (
            json!({"limits": [limit("gcra:rate=0/s", "a")]}),
            400,
            "limits[0].policy.rate",
        ),
        (
            json!({"limits": [limit("per-day", "a"), limit("pacer:rate=1/s", "b")], "op": "pace"}),
            400,
            "op",
        ),
        (
            json!({"limits": [{"policy": "per-day", "key": "a", "cost": 0}]}),
            400,
            "limits[0].cost",
        ),
        (
            json!({"limits": [{"policy": "per-day", "key": "a", "colour": 1}]}),
            400,
            "limits[0].colour",
        ),
        (
            json!({"limits": [limit("per-day", "a")], "cost": 4}),
            409,
            "limits[0].cost",
        ),
        (
            json!({"limits": [limit("per-day", "a"), {"policy": "per-day", "key": "b", "cost": 4}]}),
            409,
            "limits[1].cost",
        ),
        (json!({"limits": "per-day"}), 400, "limits"),
    ] {
        let a = post(&url, body.clone()).await;
        assert_eq!(a.status, status, "{body}: {}", a.body);
        assert_eq!(a.body["error"]["field"], field, "{body}: {}", a.body);
    }
    // The same policy twice, on two keys: two distinct names in the headers.
    let a = post(
        &url,
        json!({"limits": [limit("per-day", "a"), limit("per-day", "b")]}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let names: Vec<String> = items(&a.headers, "ratelimit")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["per-day", "per-day#2"]);
    assert_eq!(a.body["limits"][1]["policy"], "per-day#2");
    let _ = stop.send(());
    let _ = task.await;
}

async fn leases_are_taken_given_back_and_extended(store: &str, tenant: &str) {
    use reqwest::Method;
    let (url, task, stop) = serve(store).await;
    let take = |key: String| {
        let url = url.clone();
        async move {
            call(
                Method::POST,
                &format!("{url}/v1/leases"),
                Some(json!({"policy": "db", "key": key})),
            )
            .await
        }
    };
    let a = take(tenant.to_string()).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["expires_ms"], 30_000.0);
    assert_eq!(a.body["remaining"], 1);
    let lease_a = a.body["lease"].as_str().expect("a lease token").to_string();
    // A decision under a concurrency policy takes a lease too, and says which.
    let b = post(&url, json!({"policy": "db", "key": tenant, "op": "limit"})).await;
    assert_eq!(b.status, 200, "{}", b.body);
    let lease_b = b.body["lease"].as_str().expect("a lease token").to_string();
    assert_ne!(lease_a, lease_b);
    let full = take(tenant.to_string()).await;
    assert_eq!(full.status, 429, "{}", full.body);
    let retry: u64 = full.headers["retry-after"]
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("Retry-After");
    assert!((29..=30).contains(&retry), "{retry}");
    // Given back: room again; a second give-back is a 404.
    let lease = |token: &str| format!("{url}/v1/leases/{token}");
    assert_eq!(
        call(Method::DELETE, &lease(&lease_a), None).await.status,
        204
    );
    let again = call(Method::DELETE, &lease(&lease_a), None).await;
    assert_eq!(again.status, 404, "{}", again.body);
    assert_eq!(again.body["error"]["code"], "unknown_lease");
    let c = take(tenant.to_string()).await;
    assert_eq!(c.status, 201, "{}", c.body);
    // Extended: it lives 30 s from now.
    let renewed = call(Method::POST, &format!("{}/extend", lease(&lease_b)), None).await;
    assert_eq!(renewed.status, 200, "{}", renewed.body);
    assert_eq!(renewed.body["expires_ms"], 30_000.0);
    assert_eq!(renewed.body["lease"], lease_b.as_str());
    let gone = call(Method::POST, &format!("{}/extend", lease(&lease_a)), None).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    // Not a token; not a concurrency policy; a set holding a concurrency limit.
    let bad = call(Method::DELETE, &lease("nonsense"), None).await;
    assert_eq!(
        (bad.status, &bad.body["error"]["field"]),
        (400, &json!("lease"))
    );
    let rate = call(
        Method::POST,
        &format!("{url}/v1/leases"),
        Some(json!({"policy": "per-day", "key": tenant})),
    )
    .await;
    assert_eq!(
        (rate.status, &rate.body["error"]["field"]),
        (400, &json!("policy"))
    );
    let set = post(
        &url,
        json!({"limits": [
            {"policy": "per-day", "key": format!("{{{tenant}}}")},
            {"policy": "db", "key": format!("{{{tenant}}}:db")}
        ]}),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let in_set = set.body["limits"][1]["lease"]
        .as_str()
        .expect("the set's lease");
    assert_eq!(call(Method::DELETE, &lease(in_set), None).await.status, 204);
    // The lease of a configured policy named `inline`, whatever the key's length.
    for key in ["k", "a-key-much-longer-than-any-policy-spec-would-be"] {
        let named = post(
            &url,
            json!({"policy": "inline", "key": format!("{tenant}:{key}"), "op": "limit"}),
        )
        .await;
        let token = named.body["lease"].as_str().expect("a lease token");
        let given_back = call(Method::DELETE, &lease(token), None).await;
        assert_eq!(given_back.status, 204, "{key}: {}", given_back.body);
    }
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_in_memory() {
    leases_are_taken_given_back_and_extended("memory", "tenant7").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_redis() {
    let tenant = paceline_testkit::unique_name("tenant");
    leases_are_taken_given_back_and_extended(&shared_server().url(), &tenant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_a_redis_cluster() {
    let tenant = paceline_testkit::unique_name("tenant");
    leases_are_taken_given_back_and_extended(&shared_cluster().url(), &tenant).await;
}

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// A lease not given back by its expiry is reclaimed: giving it back or extending it then is
/// a 404, while a lease taken later lives on. The store reads a clock the test moves.
async fn a_lease_reclaimed_at_its_expiry_is_unknown(store: &str, tenant: &str) {
    use reqwest::Method;
    let clock = ManualClock::new(EPOCH_2023);
    let (url, task, stop) = serve_on(store, Some(clock.clone())).await;
    let leases = format!("{url}/v1/leases");
    let take = || {
        call(
            Method::POST,
            &leases,
            Some(json!({"policy": "db", "key": tenant})),
        )
    };
    let token = |a: &Answer| a.body["lease"].as_str().expect("a lease token").to_string();
    let lease = |token: &str| format!("{url}/v1/leases/{token}");
    let first = take().await;
    assert_eq!(first.status, 201, "{}", first.body);
    clock.advance(Duration::from_secs(20));
    let second = take().await;
    assert_eq!(second.status, 201, "{}", second.body);
    let (first, second) = (token(&first), token(&second));
    // Both places (`db` has 2) are held: refused until the first lease's expiry.
    let full = take().await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.headers["retry-after"], "10");
    // At its expiry (30 s after it was taken) the first lease is reclaimed.
    clock.advance(Duration::from_secs(10));
    for (method, path) in [
        (Method::DELETE, lease(&first)),
        (Method::POST, format!("{}/extend", lease(&first))),
    ] {
        let gone = call(method.clone(), &path, None).await;
        assert_eq!(gone.status, 404, "{method} {path}: {}", gone.body);
        assert_eq!(gone.body["error"]["code"], "unknown_lease", "{}", gone.body);
    }
    // Its place is free again; the second lease lives on (20 s left), extended and given
    // back.
    let third = take().await;
    assert_eq!(third.status, 201, "{}", third.body);
    let renewed = call(Method::POST, &format!("{}/extend", lease(&second)), None).await;
    assert_eq!(renewed.status, 200, "{}", renewed.body);
    assert_eq!(renewed.body["expires_ms"], 30_000.0);
    let given_back = call(Method::DELETE, &lease(&second), None).await;
    assert_eq!(given_back.status, 204, "{}", given_back.body);
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_lease_is_a_404_in_memory() {
    a_lease_reclaimed_at_its_expiry_is_unknown("memory", "tenant9").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_lease_is_a_404_on_redis() {
    let tenant = paceline_testkit::unique_name("tenant");
    a_lease_reclaimed_at_its_expiry_is_unknown(&shared_server().url(), &tenant).await;
}

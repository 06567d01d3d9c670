//! Shadow mode (`shadow = true` on a configured policy): decided and counted as usual, but
//! a refusal is answered as admitted (`"shadow": true`), in single decisions, batches and
//! sets, on the memory store and on Redis; a reload turns it on and off.

use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{call, Answer};

use paceline_server::{config, Settings};
use paceline_store::{Clock, ManualClock};
use paceline_testkit::{param, ratelimit_items as items, shared_server, unique_name};
use reqwest::Method;
use serde_json::{json, Value};

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// The policies: two in shadow mode (one as `spec`, one as `algorithm` and parameters),
/// one not.
const CONFIG: &str = r#"
[policies.trial]
spec = "fixed_window:limit=2,window=1h"
shadow = true

[policies.real]
spec = "fixed_window:limit=5,window=1h"

[policies.paced]
algorithm = "gcra"
rate = "1/s"
burst = 1
shadow = true
"#;

/// The settings of config text `text` on `store`.
fn settings(store: &str, text: &str) -> Settings {
    let file = config::parse("shadow.toml", text).expect("a good config");
    let mut settings = Settings {
        store: store.to_string(),
        ..Settings::default()
    };
    settings.apply_file(file);
    settings
}

/// A service of [`CONFIG`] on `store`, reading time from `clock`.
async fn serve(store: &str, clock: &ManualClock) -> common::Running {
    let clock = Arc::new(clock.clone()) as Arc<dyn Clock>;
    common::start(settings(store, CONFIG), Some(clock)).await
}

async fn post(url: &str, path: &str, body: Value) -> Answer {
    call(Method::POST, &format!("{url}{path}"), Some(body)).await
}

async fn decide(url: &str, body: Value) -> Answer {
    post(url, "/v1/decisions", body).await
}

/// The value of the series `series` (name and labels as `/metrics` prints them).
async fn metric(url: &str, series: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} in\n{text}"))
}

fn shadowed(policy: &str) -> String {
    format!("paceline_shadow_admitted_total{{policy=\"{policy}\"}}")
}

fn decisions(policy: &str, outcome: &str) -> String {
    format!("paceline_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"}}")
}

/// A shadow policy admits past its limit: `"shadow": true` only on the answers it turned,
/// no wait and no `Retry-After`, the `RateLimit` header as the limit is; each counted as a
/// refusal and in `paceline_shadow_admitted_total`. Pacing is no refusal; a pace beyond
/// `max_wait_ms` is. A batch's entries likewise.
async fn a_shadow_policy_admits_past_its_limit(store: &str, tenant: &str) {
    let clock = ManualClock::new(EPOCH_2023);
    let (url, task, stop) = serve(store, &clock).await;
    let ask = json!({"policy": "trial", "key": tenant, "op": "limit"});
    for left in [1, 0] {
        let a = decide(&url, ask.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["remaining"], left, "{}", a.body);
        assert!(a.body.get("shadow").is_none(), "{}", a.body);
    }
    for n in 1..=2 {
        let a = decide(&url, ask.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["allowed"], true, "{}", a.body);
        assert_eq!(a.body["shadow"], true, "{}", a.body);
        assert_eq!(a.body["delay_ms"], 0.0, "{}", a.body);
        assert_eq!(a.body["remaining"], 0, "{}", a.body);
        assert!(a.headers.get("retry-after").is_none());
        let state = items(&a.headers, "ratelimit");
        assert_eq!(state.len(), 1);
        assert_eq!(param(&state[0].1, "r"), 0);
        assert_eq!(metric(&url, &shadowed("trial")).await, n);
    }
    assert_eq!(metric(&url, &decisions("trial", "allowed")).await, 2);
    assert_eq!(metric(&url, &decisions("trial", "rejected")).await, 2);
    // The refusals counted nothing: the next window admits twice again.
    clock.advance(Duration::from_secs(3600));
    for left in [1, 0] {
        let a = decide(&url, ask.clone()).await;
        assert_eq!(a.body["remaining"], left, "{}", a.body);
        assert!(a.body.get("shadow").is_none(), "{}", a.body);
    }
    // Pacing is no refusal: the wait is asked as without shadow mode.
    let pace = json!({"policy": "paced", "key": tenant});
    let first = decide(&url, pace.clone()).await;
    assert_eq!(first.body["delay_ms"], 0.0, "{}", first.body);
    let second = decide(&url, pace.clone()).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.body["delay_ms"], 1000.0, "{}", second.body);
    assert!(second.body.get("shadow").is_none(), "{}", second.body);
    // A pace beyond its max_wait is a refusal, turned.
    let third = decide(
        &url,
        json!({"policy": "paced", "key": tenant, "max_wait_ms": 500}),
    )
    .await;
    assert_eq!(third.status, 200, "{}", third.body);
    assert_eq!(
        (third.body["shadow"].clone(), third.body["delay_ms"].clone()),
        (json!(true), json!(0.0)),
        "{}",
        third.body
    );
    assert_eq!(metric(&url, &shadowed("paced")).await, 1);
    // A batch: each entry on its own.
    let batch = post(
        &url,
        "/v1/decisions/batch",
        json!([
            {"policy": "trial", "key": tenant, "op": "limit"},
            {"policy": "real", "key": tenant, "op": "limit"},
        ]),
    )
    .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let entries = batch.body.as_array().expect("entries");
    assert_eq!(
        (entries[0]["status"].clone(), entries[0]["allowed"].clone()),
        (json!(200), json!(true)),
        "{}",
        batch.body
    );
    assert_eq!(entries[0]["shadow"], true, "{}", batch.body);
    assert_eq!(entries[1]["status"], 200, "{}", batch.body);
    assert!(entries[1].get("shadow").is_none(), "{}", batch.body);
    assert_eq!(metric(&url, &shadowed("trial")).await, 3);
    assert_eq!(metric(&url, &shadowed("real")).await, 0);
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_admits_past_its_limit_in_memory() {
    a_shadow_policy_admits_past_its_limit("memory", "tenant1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_admits_past_its_limit_on_redis() {
    let tenant = unique_name("tenant");
    a_shadow_policy_admits_past_its_limit(&shared_server().url(), &tenant).await;
}

/// In a set, a shadow limit never refuses: over its limit beside a real limit that
/// admits, the set is admitted and counts on the real limit; a set the real limit refuses
/// counts nowhere.
async fn a_shadow_limit_never_refuses_a_set(store: &str, tenant: &str) {
    let clock = ManualClock::new(EPOCH_2023);
    let (url, task, stop) = serve(store, &clock).await;
    let key = format!("{{{tenant}}}");
    for _ in 0..2 {
        let a = decide(&url, json!({"policy": "trial", "key": key, "op": "limit"})).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let set = json!({"limits": [{"policy": "trial", "key": key}, {"policy": "real", "key": key}]});
    for (n, left) in [(1, 4), (2, 3)] {
        let a = decide(&url, set.clone()).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            (a.body["allowed"].clone(), a.body["shadow"].clone()),
            (json!(true), json!(true)),
            "{}",
            a.body
        );
        let limits = a.body["limits"].as_array().expect("entries");
        assert_eq!(
            (limits[0]["allowed"].clone(), limits[0]["shadow"].clone()),
            (json!(true), json!(true)),
            "{}",
            a.body
        );
        assert_eq!(limits[1]["remaining"], left, "{}", a.body);
        assert!(limits[1].get("shadow").is_none(), "{}", a.body);
        assert!(a.headers.get("retry-after").is_none());
        let names: Vec<String> = items(&a.headers, "ratelimit")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["trial", "real"]);
        assert_eq!(metric(&url, &shadowed("trial")).await, n);
    }
    // The real limit refuses (3 left, 4 asked): a 429, nothing counted, the shadow limit
    // only checked.
    let refused = decide(
        &url,
        json!({"limits": [{"policy": "trial", "key": key}, {"policy": "real", "key": key, "cost": 4}]}),
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert!(refused.body.get("shadow").is_none(), "{}", refused.body);
    assert_eq!(
        refused.body["limits"][0]["allowed"], true,
        "{}",
        refused.body
    );
    assert_eq!(
        refused.body["limits"][1]["remaining"], 3,
        "{}",
        refused.body
    );
    assert!(refused.headers.get("retry-after").is_some());
    assert_eq!(metric(&url, &shadowed("trial")).await, 2);
    // A set of shadow limits alone is admitted.
    let alone = decide(&url, json!({"limits": [{"policy": "trial", "key": key}]})).await;
    assert_eq!(alone.status, 200, "{}", alone.body);
    assert_eq!(alone.body["shadow"], true, "{}", alone.body);
    assert_eq!(metric(&url, &shadowed("trial")).await, 3);
    let a = decide(&url, json!({"policy": "real", "key": key, "op": "peek"})).await;
    assert_eq!(a.body["remaining"], 3, "{}", a.body);
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_never_refuses_a_set_in_memory() {
    a_shadow_limit_never_refuses_a_set("memory", "tenant2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_never_refuses_a_set_on_redis() {
    let tenant = unique_name("tenant");
    a_shadow_limit_never_refuses_a_set(&shared_server().url(), &tenant).await;
}

/// A reload turns shadow mode off (the policy refuses, its count kept) and on again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_turns_shadow_mode_off_and_on() {
    let path = std::env::temp_dir().join(format!("{}.toml", unique_name("shadow")));
    let write = |shadow: bool| {
        let text = format!(
            "[policies.trial]\nspec = \"fixed_window:limit=1,window=1h\"\nshadow = {shadow}\n"
        );
        std::fs::write(&path, &text).expect("the config is written");
        text
    };
    let mut settings = settings("memory", &write(true));
    settings.config_file = Some(path.clone());
    let clock = Arc::new(ManualClock::new(EPOCH_2023)) as Arc<dyn Clock>;
    let (url, task, stop) = common::start(settings, Some(clock)).await;
    let ask = json!({"policy": "trial", "key": "k", "op": "limit"});
    assert_eq!(decide(&url, ask.clone()).await.status, 200);
    let turned = decide(&url, ask.clone()).await;
    assert_eq!(
        (turned.status, turned.body["shadow"].clone()),
        (200, json!(true))
    );
    write(false);
    let reloaded = call(Method::POST, &format!("{url}/v1/reload"), None).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);
    let refused = decide(&url, ask.clone()).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["allowed"], false);
    assert!(refused.body.get("shadow").is_none(), "{}", refused.body);
    // GET /v1/policies says which policies are in shadow mode, as the reload left them.
    let listed = |a: &Answer| a.body["policies"]["trial"].get("shadow").cloned();
    let policies = call(Method::GET, &format!("{url}/v1/policies"), None).await;
    assert_eq!(listed(&policies), None, "{}", policies.body);
    write(true);
    assert_eq!(
        call(Method::POST, &format!("{url}/v1/reload"), None)
            .await
            .status,
        200
    );
    let again = decide(&url, ask).await;
    assert_eq!(
        (again.status, again.body["shadow"].clone()),
        (200, json!(true))
    );
    let policies = call(Method::GET, &format!("{url}/v1/policies"), None).await;
    assert_eq!(listed(&policies), Some(json!(true)), "{}", policies.body);
    assert_eq!(metric(&url, &shadowed("trial")).await, 2);
    let _ = std::fs::remove_file(&path);
    let _ = stop.send(());
    let _ = task.await;
}

/// Config errors name the field: `shadow` not a boolean, or on a `concurrency` policy.
#[test]
fn shadow_errors_name_the_field() {
    for (text, says) in [
        (
            "[policies.api]\nspec = \"gcra:rate=1/s\"\nshadow = \"on\"",
            "true",
        ),
        (
            "[policies.db]\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"30s\"\nshadow = true",
            "concurrency",
        ),
    ] {
        let e = config::parse("p.toml", text).expect_err("refused");
        assert!(e.field.ends_with(".shadow"), "{text}: {e}");
        assert!(e.message.contains(says), "{text}: {e}");
    }
}

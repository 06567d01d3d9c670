//! Policies managed at run time: `GET`, `PUT` and `DELETE /v1/policies/{name}` over the
//! config file's policies, on the memory store and on Redis (where every instance on one
//! Redis takes a change), kept over reloads, behind the service's token, and bad input
//! refused by name.

use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{call, Answer};

use paceline_server::{config, Settings};
use paceline_store::{Clock, ManualClock};
use paceline_testkit::{unique_name, RedisCluster, RedisServer};
use reqwest::Method;
use serde_json::{json, Value};

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// The config file's policies: the defaults run-time changes lay over.
const CONFIG: &str = r#"
[policies.search]
spec = "fixed_window:limit=5,window=1h"

[policies.slots]
spec = "concurrency:limit=2,lease=1m"
"#;

/// The settings of config text `text` on `store`.
fn settings(store: &str, text: &str) -> Settings {
    let file = config::parse("runtime.toml", text).expect("a good config");
    let mut settings = Settings {
        store: store.to_string(),
        ..Settings::default()
    };
    settings.apply_file(file);
    settings
}

/// A service of `settings`, reading time from a clock that stands still.
async fn serve(settings: Settings) -> common::Running {
    let clock = Arc::new(ManualClock::new(EPOCH_2023)) as Arc<dyn Clock>;
    common::start(settings, Some(clock)).await
}

async fn put(url: &str, name: &str, body: Value) -> Answer {
    call(
        Method::PUT,
        &format!("{url}/v1/policies/{name}"),
        Some(body),
    )
    .await
}

async fn get(url: &str, name: &str) -> Answer {
    call(Method::GET, &format!("{url}/v1/policies/{name}"), None).await
}

async fn delete(url: &str, name: &str) -> Answer {
    call(Method::DELETE, &format!("{url}/v1/policies/{name}"), None).await
}

/// How many of `n` `limit` decisions of `policy` on `key` are admitted.
async fn admitted(url: &str, policy: &str, key: &str, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        let d = call(
            Method::POST,
            &format!("{url}/v1/decisions"),
            Some(json!({"policy": policy, "key": key, "op": "limit"})),
        )
        .await;
        assert!(matches!(d.status, 200 | 429), "{}: {}", d.status, d.body);
        if d.status == 200 {
            count += 1;
        }
    }
    count
}

/// What a service says of its policies, on one store: new, replaced, over the file's,
/// deleted (the file's applies again), and the decisions that follow each change.
async fn a_policy_is_set_replaced_and_deleted_at_run_time(store: &str) {
    let (url, task, stop) = serve(settings(store, CONFIG)).await;

    // A new policy: 201, decided with at once.
    let created = put(
        &url,
        "uploads",
        json!({"spec": "fixed_window:limit=2,window=1h"}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(
        created.body,
        json!({"name": "uploads", "algorithm": "fixed_window", "limit": 2,
               "source": "run_time", "spec": "fixed_window:limit=2,window=1h"})
    );
    assert_eq!(admitted(&url, "uploads", "u1", 4).await, 2);

    // Replaced: 200; the same algorithm keeps the key's count (2 used of now 3).
    let replaced = put(
        &url,
        "uploads",
        json!({"spec": "fixed_window:limit=3,window=1h"}),
    )
    .await;
    assert_eq!(replaced.status, 200, "{}", replaced.body);
    assert_eq!(admitted(&url, "uploads", "u1", 3).await, 1);

    // Over the file's `search`: it says what it overrides.
    assert_eq!(admitted(&url, "search", "s1", 1).await, 1);
    let over = put(
        &url,
        "search",
        json!({"spec": "fixed_window:limit=1,window=1h", "shadow": true}),
    )
    .await;
    assert_eq!(over.status, 200, "{}", over.body);
    assert_eq!(
        over.body["overrides"],
        json!({"spec": "fixed_window:limit=5,window=1h"})
    );
    // In shadow mode: past its limit of 1, still admitted.
    assert_eq!(admitted(&url, "search", "s1", 3).await, 3);

    let listed = call(Method::GET, &format!("{url}/v1/policies"), None).await;
    assert_eq!(listed.status, 200);
    let policies = &listed.body["policies"];
    assert_eq!(policies["search"]["source"], "run_time", "{policies}");
    assert_eq!(policies["search"]["shadow"], true, "{policies}");
    assert_eq!(policies["slots"]["source"], "config", "{policies}");
    assert_eq!(
        policies["uploads"]["spec"],
        "fixed_window:limit=3,window=1h"
    );

    // Deleted: the file's `search` applies again (limit 5, 1 of it used: the refusals
    // shadow mode admitted counted nothing).
    assert_eq!(delete(&url, "search").await.status, 204);
    let back = get(&url, "search").await;
    assert_eq!(
        back.body,
        json!({"name": "search", "algorithm": "fixed_window", "limit": 5,
               "source": "config", "spec": "fixed_window:limit=5,window=1h"})
    );
    assert_eq!(admitted(&url, "search", "s1", 5).await, 4);
    // The file's own cannot be deleted; an unknown one is 404.
    let only_file = delete(&url, "search").await;
    assert_eq!(
        (only_file.status, only_file.body["error"]["field"].clone()),
        (409, json!("name")),
        "{}",
        only_file.body
    );
    assert_eq!(delete(&url, "uploads").await.status, 204);
    for answer in [get(&url, "uploads").await, delete(&url, "uploads").await] {
        assert_eq!(answer.status, 404, "{}", answer.body);
        assert_eq!(answer.body["error"]["code"], "unknown_policy");
        assert_eq!(answer.body["error"]["field"], "name");
    }
    let gone = call(
        Method::POST,
        &format!("{url}/v1/decisions"),
        Some(json!({"policy": "uploads", "key": "u1"})),
    )
    .await;
    assert_eq!(gone.status, 404, "{}", gone.body);

    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_is_set_replaced_and_deleted_on_memory() {
    a_policy_is_set_replaced_and_deleted_at_run_time("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_is_set_replaced_and_deleted_on_redis() {
    let redis = RedisServer::start().expect("a private redis-server");
    a_policy_is_set_replaced_and_deleted_at_run_time(&redis.url()).await;
}

/// Polls `what` until it holds (a condition, not a time: the deadline only ends a hung test).
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two instances on one Redis: a change made on one is decided with on the other once it
/// has read it (the event waited for: its `GET` shows it), and a third instance started
/// later finds it in Redis at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_redis_take_each_other_s_changes() {
    let redis = RedisServer::start().expect("a private redis-server");
    let (a, task_a, stop_a) = serve(settings(&redis.url(), CONFIG)).await;
    let (b, task_b, stop_b) = serve(settings(&redis.url(), CONFIG)).await;

    let set = put(
        &a,
        "search",
        json!({"spec": "fixed_window:limit=2,window=1h"}),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    until("B reads the change A made", async || {
        get(&b, "search").await.body["spec"] == "fixed_window:limit=2,window=1h"
    })
    .await;
    // B decides with it: 2 admitted where the file's policy admits 5; the state is shared.
    assert_eq!(admitted(&b, "search", "k", 3).await, 2);
    assert_eq!(admitted(&a, "search", "k", 1).await, 0);

    // A third instance finds the table in Redis as it starts.
    let (c, task_c, stop_c) = serve(settings(&redis.url(), CONFIG)).await;
    assert_eq!(get(&c, "search").await.body["source"], "run_time");

    // A deletion made on B reaches A: the file's policy again.
    assert_eq!(delete(&b, "search").await.status, 204);
    until("A reads the deletion B made", async || {
        get(&a, "search").await.body["source"] == "config"
    })
    .await;
    assert_eq!(admitted(&a, "search", "k", 5).await, 3);

    for (stop, task) in [(stop_a, task_a), (stop_b, task_b), (stop_c, task_c)] {
        let _ = stop.send(());
        let _ = task.await;
    }
}

/// On a Redis Cluster: the table's keys share a slot, and a change reaches the other
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_redis_cluster_take_each_other_s_changes() {
    let cluster = RedisCluster::start().expect("a private Redis Cluster");
    let (a, task_a, stop_a) = serve(settings(&cluster.url(), CONFIG)).await;
    let (b, task_b, stop_b) = serve(settings(&cluster.url(), CONFIG)).await;
    let set = put(
        &a,
        "tier-2",
        json!({"spec": "fixed_window:limit=1,window=1h"}),
    )
    .await;
    assert_eq!(set.status, 201, "{}", set.body);
    until("B reads the policy A set", async || {
        get(&b, "tier-2").await.status == 200
    })
    .await;
    assert_eq!(admitted(&b, "tier-2", "k", 2).await, 1);
    assert_eq!(admitted(&a, "tier-2", "k", 1).await, 0);
    for (stop, task) in [(stop_a, task_a), (stop_b, task_b)] {
        let _ = stop.send(());
        let _ = task.await;
    }
}

/// Redis down: a change is a `503` naming `store` and changes nothing here; what was read
/// stays in force. Redis back, empty (it keeps nothing on disk): the instance reads the
/// empty table, and the file's policy applies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_while_redis_is_down_is_refused_and_an_emptied_redis_is_read_again() {
    let mut redis = RedisServer::start().expect("a private redis-server");
    let (url, task, stop) = serve(settings(&redis.url(), CONFIG)).await;
    let set = put(
        &url,
        "search",
        json!({"spec": "fixed_window:limit=1,window=1h"}),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    redis.kill();
    let refused = put(&url, "search", json!({"spec": "gcra:rate=1/s"})).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.body["error"]["field"], "store");
    let gone = delete(&url, "search").await;
    assert_eq!(gone.status, 503, "{}", gone.body);
    let kept = get(&url, "search").await;
    assert_eq!(kept.body["spec"], "fixed_window:limit=1,window=1h");
    redis.restart().expect("redis-server again");
    until("the instance reads the emptied table", async || {
        get(&url, "search").await.body["source"] == "config"
    })
    .await;
    let _ = stop.send(());
    let _ = task.await;
}

/// A reload re-reads the file and keeps the policies set at run time over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_changes_made_at_run_time() {
    let path = std::env::temp_dir().join(format!("{}.toml", unique_name("runtime")));
    std::fs::write(&path, CONFIG).expect("the config is written");
    let mut settings = settings("memory", CONFIG);
    settings.config_file = Some(path.clone());
    let (url, task, stop) = serve(settings).await;

    let set = put(&url, "search", json!({"spec": "gcra:rate=1/s,burst=1"})).await;
    assert_eq!(set.status, 200, "{}", set.body);
    let added = put(&url, "extra", json!({"spec": "gcra:rate=1/s"})).await;
    assert_eq!(added.status, 201, "{}", added.body);
    std::fs::write(
        &path,
        "[policies.search]\nspec = \"fixed_window:limit=9,window=1h\"\n",
    )
    .expect("the config is written");
    let reloaded = call(Method::POST, &format!("{url}/v1/reload"), None).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);

    let listed = call(Method::GET, &format!("{url}/v1/policies"), None).await;
    let policies = &listed.body["policies"];
    assert_eq!(policies["search"]["spec"], "gcra:rate=1/s,burst=1");
    assert_eq!(
        policies["search"]["overrides"]["spec"], "fixed_window:limit=9,window=1h",
        "{policies}"
    );
    assert_eq!(policies["extra"]["source"], "run_time");
    // `slots` left the file.
    assert!(policies.get("slots").is_none(), "{policies}");
    assert_eq!(admitted(&url, "search", "k", 2).await, 1);
    // Deleted, the file's new `search` applies.
    assert_eq!(delete(&url, "search").await.status, 204);
    assert_eq!(
        get(&url, "search").await.body["spec"],
        "fixed_window:limit=9,window=1h"
    );

    let _ = std::fs::remove_file(&path);
    let _ = stop.send(());
    let _ = task.await;
}

/// Every call asks for the service's token; without it nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_ask_for_the_service_s_token() {
    let mut settings = settings("memory", CONFIG);
    settings.auth_token = Some("s3cret".into());
    let (url, task, stop) = serve(settings).await;
    let client = reqwest::Client::new();
    let policy = format!("{url}/v1/policies/search");
    let body = json!({"spec": "gcra:rate=1/s"});
    for token in [None, Some("wrong"), Some("s3cre"), Some("S3CRET")] {
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let mut request = client.request(method.clone(), &policy).json(&body);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let answer = request.send().await.expect("an answer");
            assert_eq!(answer.status(), 401, "{method} with {token:?}");
            let text = answer.text().await.unwrap_or_default();
            assert!(!text.contains("s3cret"), "{text}");
        }
    }
    let unchanged = client
        .get(&policy)
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("an answer");
    let unchanged: Value = unchanged.json().await.expect("JSON");
    assert_eq!(unchanged["source"], "config");
    let changed = client
        .put(&policy)
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(changed.status(), 200);
    let _ = stop.send(());
    let _ = task.await;
}

/// Bad names and bodies are refused naming the field, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_bodies_are_refused_by_field() {
    let (url, task, stop) = serve(settings("memory", CONFIG)).await;
    let good = json!({"spec": "gcra:rate=1/s"});

    // The spec: the parser's message, naming `spec`.
    let bad_spec = put(&url, "p", json!({"spec": "gcra:rate=fast"})).await;
    assert_eq!(bad_spec.status, 400, "{}", bad_spec.body);
    assert_eq!(bad_spec.body["error"]["field"], "spec");
    let message = bad_spec.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("rate"), "{message}");
    for (body, field) in [
        (json!({"spec": "leaky:rate=1"}), "spec"),
        (json!({"spec": ""}), "spec"),
        (json!({"spec": 7}), "spec"),
        (json!({"spec": null}), "spec"),
        (json!({}), "spec"),
        (json!({"spec": "x".repeat(2000)}), "spec"),
        (json!({"spec": "gcra:rate=1/s", "shadow": "yes"}), "shadow"),
        (
            json!({"spec": "concurrency:limit=2,lease=1m", "shadow": true}),
            "shadow",
        ),
        (json!({"spec": "gcra:rate=1/s", "colour": "red"}), "colour"),
        (json!(["gcra:rate=1/s"]), "body"),
    ] {
        let answer = put(&url, "p", body.clone()).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert_eq!(
            answer.body["error"]["field"], field,
            "{body}: {}",
            answer.body
        );
    }
    // Bodies no JSON tree holds, as text.
    let deep = format!("{{\"spec\":{}{}}}", "[".repeat(5_000), "]".repeat(5_000));
    for body in [
        r#"{"spec": 1e400}"#.to_string(),
        r#"{"spec": "gcra:rate=\ud800"}"#.to_string(),
        r#"{"spec": "gcra:rate=1/s""#.to_string(),
        "not json".to_string(),
        deep,
    ] {
        let answer = raw_put(&url, "p", body.clone()).await;
        assert_eq!(
            answer.0,
            400,
            "{}: {}",
            &body[..body.len().min(40)],
            answer.1
        );
        assert!(answer.1.contains("\"field\""), "{}", answer.1);
    }
    let huge = format!("{{\"spec\": \"{}\"}}", "x".repeat(20_000));
    assert_eq!(raw_put(&url, "p", huge).await.0, 413);

    // Names: not allowed (400 naming `name`), whatever the method.
    let long = "n".repeat(10 * 1024);
    for name in ["a%2Fb", "%C3%A9", "a%20b", "%00", long.as_str()] {
        let answer = put(&url, name, good.clone()).await;
        assert_eq!(answer.status, 400, "{name}: {}", answer.body);
        assert_eq!(answer.body["error"]["field"], "name", "{name}");
        for answer in [get(&url, name).await, delete(&url, name).await] {
            assert_eq!(answer.status, 400, "{name}: {}", answer.body);
        }
    }
    // A percent-encoding that is not UTF-8 names the path.
    assert_eq!(put(&url, "%FF", good.clone()).await.status, 400);
    // Dots as sent, which a client would normalize away: over a connection of its own.
    for path in ["..", "%2e%2e", ".", "%2E", "..."] {
        for method in ["GET", "PUT", "DELETE"] {
            let (status, text) = raw_request(
                &url,
                method,
                &format!("/v1/policies/{path}"),
                "{\"spec\":\"gcra:rate=1/s\"}",
            )
            .await;
            assert_eq!(status, 400, "{method} {path}: {text}");
            assert!(text.contains("\"field\":\"name\""), "{text}");
        }
    }

    // Nothing of that changed anything.
    let listed = call(Method::GET, &format!("{url}/v1/policies"), None).await;
    let names: Vec<&String> = listed.body["policies"]
        .as_object()
        .map(|p| p.keys().collect())
        .unwrap_or_default();
    assert_eq!(names, ["search", "slots"], "{}", listed.body);
    let _ = stop.send(());
    let _ = task.await;
}

/// `PUT` with `body` as sent: its status and text.
async fn raw_put(url: &str, name: &str, body: String) -> (u16, String) {
    let response = reqwest::Client::new()
        .put(format!("{url}/v1/policies/{name}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the service answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// `method` on `path` exactly as written (no client normalizes it), with `body`: the
/// status and the whole answer's text.
async fn raw_request(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// A `concurrency` policy changed at run time: its leases held stay held and count against
/// the new limit; changed to another algorithm, they are unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_follow_what_a_change_means() {
    let (url, task, stop) = serve(settings("memory", CONFIG)).await;
    let take = async || {
        call(
            Method::POST,
            &format!("{url}/v1/leases"),
            Some(json!({"policy": "slots", "key": "k"})),
        )
        .await
    };
    let first = take().await;
    assert_eq!(first.status, 201, "{}", first.body);
    let lease = first.body["lease"].as_str().unwrap_or_default().to_string();
    // The limit down to 1: the lease held fills it.
    let set = put(
        &url,
        "slots",
        json!({"spec": "concurrency:limit=1,lease=1m"}),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(take().await.status, 429);
    let extended = call(
        Method::POST,
        &format!("{url}/v1/leases/{lease}/extend"),
        None,
    )
    .await;
    assert_eq!(extended.status, 200, "{}", extended.body);
    let given = call(Method::DELETE, &format!("{url}/v1/leases/{lease}"), None).await;
    assert_eq!(given.status, 204, "{}", given.body);
    let second = take().await;
    assert_eq!(second.status, 201, "{}", second.body);
    let lease = second.body["lease"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Another algorithm: the lease held is no more.
    let set = put(&url, "slots", json!({"spec": "gcra:rate=1/s"})).await;
    assert_eq!(set.status, 200, "{}", set.body);
    let unknown = call(Method::DELETE, &format!("{url}/v1/leases/{lease}"), None).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(unknown.body["error"]["code"], "unknown_lease");
    let _ = stop.send(());
    let _ = task.await;
}

//! `GET /readyz` on Redis: ready while every node serves its keys, degraded (still `200`,
//! naming the failing node) while some Redis Cluster primaries do not, unavailable (`503`)
//! while none does. Each test starts its own servers, and the test kit stops them, also on
//! failure.

use std::time::Duration;

mod common;
use common::call;

use paceline_server::Settings;
use paceline_store::FailurePolicy;
use paceline_testkit::{RedisCluster, RedisServer};
use serde_json::Value;

/// Far beyond any legitimate wait: reaching it means the probe hung.
const HANG: Duration = Duration::from_secs(60);

async fn serve(store: String) -> common::Running {
    let settings = Settings {
        store,
        failure_policy: FailurePolicy::FailOpen,
        ..Settings::default()
    };
    common::start(settings, None).await
}

/// `GET /readyz`: the status and the body.
async fn readyz(url: &str) -> (u16, Value) {
    let answer = tokio::time::timeout(
        HANG,
        call(reqwest::Method::GET, &format!("{url}/readyz"), None),
    )
    .await
    .expect("/readyz answers");
    (answer.status, answer.body)
}

#[tokio::test]
async fn a_cluster_with_a_dead_primary_is_degraded_and_one_with_none_is_unavailable() {
    // The healthy primaries keep serving their slots while one is down.
    let mut cluster = RedisCluster::start_configured(3, &["--cluster-require-full-coverage", "no"])
        .expect("a 3-primary cluster");
    let (url, task, stop) = serve(cluster.url()).await;
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["status"], &body["degraded"], &body["nodes"]),
        (&Value::from("ready"), &Value::from(false), &Value::from(3)),
        "{body}"
    );
    assert_eq!(body["failing"], serde_json::json!([]));

    let dead = cluster.nodes()[0].addr();
    cluster.kill_node(0);
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 200, "degraded is still ready: {body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["degraded"], true, "{body}");
    let failing = body["failing"].as_array().expect("a list");
    assert_eq!(failing.len(), 1, "{body}");
    assert_eq!(failing[0]["node"], dead.as_str(), "{body}");
    assert!(
        failing[0]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );

    cluster.kill_node(1);
    cluster.kill_node(2);
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        (&body["status"], &body["degraded"]),
        (&Value::from("unavailable"), &Value::from(false)),
        "{body}"
    );
    assert_eq!(body["failing"].as_array().map(Vec::len), Some(3), "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains(&dead)),
        "{body}"
    );
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test]
async fn a_single_server_is_ready_or_unavailable_and_the_memory_store_always_ready() {
    let mut server = RedisServer::start().expect("redis-server");
    let (url, task, stop) = serve(server.url()).await;
    let (status, body) = readyz(&url).await;
    assert_eq!(
        (status, &body["status"]),
        (200, &Value::from("ready")),
        "{body}"
    );
    assert_eq!(body["nodes"], 1, "{body}");
    server.kill();
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["failing"][0]["node"], server.url().as_str(), "{body}");
    server.restart().expect("restart");
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 200, "ready again once Redis answers: {body}");
    let _ = stop.send(());
    let _ = task.await;

    let (url, task, stop) = serve("memory".to_string()).await;
    let (status, body) = readyz(&url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["status"], &body["degraded"]),
        (&Value::from("ready"), &Value::from(false))
    );
    let _ = stop.send(());
    let _ = task.await;
}

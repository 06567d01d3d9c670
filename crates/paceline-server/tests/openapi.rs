//! The OpenAPI document: the one the service serves at `GET /openapi.json` is the one
//! checked in as `docs/openapi.json`, and it is an OpenAPI 3.1 document of every endpoint.
//!
//! After a change to a handler or a body, rewrite the checked-in copy with
//! `PACELINE_WRITE_OPENAPI=1 cargo test -p paceline-server --test openapi`.

mod common;

use std::path::PathBuf;

use paceline_server::Settings;
use serde_json::Value;

/// The command that rewrites `docs/openapi.json`.
const REGENERATE: &str = "PACELINE_WRITE_OPENAPI=1 cargo test -p paceline-server --test openapi";

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

/// The document the service serves, as text.
async fn served() -> String {
    let (url, _task, _stop) = common::start(Settings::default(), None).await;
    let response = reqwest::get(format!("{url}/openapi.json"))
        .await
        .expect("the service answers");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    assert_eq!(content_type.as_deref(), Some("application/json"));
    response.text().await.expect("a body")
}

#[tokio::test]
async fn the_served_document_is_the_checked_in_one() {
    let served = served().await;
    assert_eq!(served, paceline_server::openapi_json());
    let path = checked_in_path();
    if std::env::var_os("PACELINE_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, &served).expect("docs/openapi.json written");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == served,
        "docs/openapi.json differs from the document the service serves at GET /openapi.json; \
         rewrite it with `{REGENERATE}` and commit it"
    );
}

#[test]
fn the_document_is_openapi_3_1_of_every_endpoint() {
    let doc: Value =
        serde_json::from_str(&paceline_server::openapi_json()).expect("the document is JSON");
    let version = doc["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.1."), "{version}");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let paths = doc["paths"].as_object().expect("paths");
    for (path, method) in [
        ("/v1/decisions", "post"),
        ("/v1/decisions/batch", "post"),
        ("/v1/leases", "post"),
        ("/v1/leases/{lease}/extend", "post"),
        ("/v1/leases/{lease}", "delete"),
        ("/v1/policies", "get"),
        ("/v1/keys/{policy}/{key}", "delete"),
        ("/v1/reload", "post"),
        ("/v1/dashboard", "get"),
        ("/dashboard", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/v1/queues/{queue}", "get"),
        ("/v1/queues/{queue}/jobs", "post"),
        ("/v1/queues/{queue}/jobs/batch", "post"),
        ("/v1/queues/{queue}/leases", "post"),
        ("/v1/queues/{queue}/jobs/{id}", "get"),
        ("/v1/queues/{queue}/jobs/{id}", "delete"),
        ("/v1/queues/{queue}/jobs/{id}/ack", "post"),
        ("/v1/queues/{queue}/jobs/{id}/fail", "post"),
        ("/v1/queues/{queue}/jobs/{id}/extend", "post"),
        ("/v1/queues/{queue}/dead", "get"),
        ("/v1/queues/{queue}/dead", "delete"),
        ("/v1/queues/{queue}/dead/retry", "post"),
        ("/v1/queues/{queue}/pause", "post"),
        ("/v1/queues/{queue}/resume", "post"),
        ("/v1/queues/{queue}/groups/{group}/pause", "post"),
        ("/v1/queues/{queue}/groups/{group}/resume", "post"),
        ("/v1/queues/{queue}/groups/{group}/policy", "get"),
        ("/v1/queues/{queue}/groups/{group}/policy", "put"),
        ("/v1/queues/{queue}/groups/{group}/policy", "delete"),
        ("/v1/queues/{queue}/schedules", "get"),
        ("/v1/queues/{queue}/schedules/{name}", "get"),
        ("/v1/queues/{queue}/schedules/{name}", "put"),
        ("/v1/queues/{queue}/schedules/{name}", "delete"),
    ] {
        let operation = &paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not in the document"))[method];
        assert!(
            operation.is_object(),
            "{method} {path} is not in the document"
        );
        let responses = operation["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path} has no success answer"
        );
        // Every `/v1` operation may be refused for want of the service's token.
        if path.starts_with("/v1/") {
            assert!(responses.contains_key("401"), "{method} {path}: no 401");
        }
    }
    // Every error code is listed, with the answer that carries it.
    let codes = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode's values");
    for code in [
        "invalid_argument",
        "lease_lost",
        "unknown_queue",
        "store_unavailable",
    ] {
        assert!(codes.iter().any(|c| c == code), "{code}");
    }
    assert!(doc["components"]["schemas"]["ErrorAnswer"].is_object());
}

/// A service with one queue, `q`.
async fn with_a_queue() -> common::Running {
    let mut queues = std::collections::BTreeMap::new();
    queues.insert(
        "q".to_string(),
        paceline_queue::QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().expect("a policy")),
    );
    let settings = Settings {
        queues,
        ..Settings::default()
    };
    common::start(settings, None).await
}

async fn send(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the service answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_document_s_integers_are_json_s_a_whole_float_is_one() {
    let (url, _task, _stop) = with_a_queue().await;
    let job = serde_json::json!({
        "group": "g", "priority": 3.0, "cost": 1.0, "max_attempts": 2.0
    });
    let (status, body) = send(
        reqwest::Method::POST,
        &format!("{url}/v1/queues/q/jobs"),
        Some(job),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(
        reqwest::Method::POST,
        &format!("{url}/v1/queues/q/leases"),
        Some(serde_json::json!({"worker": "w", "max_jobs": 5.0})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["jobs"].as_array().map(Vec::len), Some(1));
    // A fraction is still no integer, and the error names the field.
    let half = serde_json::json!({"group": "g", "priority": 3.5});
    let (status, body) = send(
        reqwest::Method::POST,
        &format!("{url}/v1/queues/q/jobs"),
        Some(half),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["field"], "priority");
}

#[tokio::test]
async fn an_offset_past_every_job_lists_none_and_a_group_filters_waiting_jobs_only() {
    let (url, _task, _stop) = with_a_queue().await;
    let far = "184467440737095516150000";
    for path in [
        format!("/v1/queues/q/dead?offset={far}"),
        format!("/v1/queues/q/jobs?state=waiting&group=g&offset={far}"),
    ] {
        let (status, body) = send(reqwest::Method::GET, &format!("{url}{path}"), None).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(body["jobs"], serde_json::json!([]), "{path}");
    }
    let (status, body) = send(
        reqwest::Method::GET,
        &format!("{url}/v1/queues/q/dead?offset=-1"),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("query"))
    );
    // As the document's listing says: `group` only with `waiting`.
    let (status, body) = send(
        reqwest::Method::GET,
        &format!("{url}/v1/queues/q/jobs?state=dead&group=g"),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("group"))
    );
}

//! Whatever enqueue accepts, every later read hands back byte for byte: payloads nested far
//! deeper than a JSON parser's recursion limit, numbers no float holds, escapes of lone
//! surrogates, on memory and on Redis, through `GET` job, a lease and the dead list. And
//! the lease tokens those reads answer: a guess acts on nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use paceline_queue::QueueConfig;
use paceline_server::Settings;
use paceline_testkit::RedisServer;
use serde::Deserialize;
use serde_json::value::RawValue;

mod common;

/// A job as the API shows it, its payload kept as the text that came back.
#[derive(Deserialize)]
struct Shown {
    id: String,
    payload: Box<RawValue>,
    #[serde(default)]
    lease: Option<String>,
}

#[derive(Deserialize)]
struct Jobs {
    jobs: Vec<Shown>,
}

/// The payloads: each is valid JSON that a tree-building parser with a depth limit, or one
/// that reads numbers into floats, cannot hand back.
fn payloads() -> Vec<(&'static str, String)> {
    // 4 MB of brackets: far past any recursion limit, within the queue's payload limit.
    let deep = 2_000_000;
    vec![
        (
            "deep-array",
            format!("{}{}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            "deep-object",
            format!("{}1{}", "{\"a\":".repeat(deep / 10), "}".repeat(deep / 10)),
        ),
        ("huge-exponent", "1e400".to_string()),
        ("huge-negative", "-1E+999999".to_string()),
        (
            "long-integer",
            "123456789012345678901234567890123456789".to_string(),
        ),
        (
            "numbers-inside",
            r#"{"tiny":1e-400,"neg_zero":-0,"big":18446744073709551616,"list":[1e400,2.5E-3]}"#
                .to_string(),
        ),
        ("lone-surrogate", r#"{"s":"\ud800 and \udfff"}"#.to_string()),
        ("unicode", "\"zażółć 🦀 \\u0000\"".to_string()),
        ("spaced", "{ \"kept\" :\t[ 1 , 2 ]\n}".to_string()),
    ]
}

async fn serve(store: &str) -> common::Running {
    let mut queues = BTreeMap::new();
    queues.insert(
        "q".to_string(),
        QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().expect("a policy"))
            .lease(Duration::from_secs(60))
            .max_attempts(1)
            .max_payload(16 * 1024 * 1024),
    );
    let settings = Settings {
        store: store.to_string(),
        queues,
        ..Settings::default()
    };
    common::start(settings, None).await
}

async fn send(method: reqwest::Method, url: &str, body: String) -> (u16, String) {
    let response = reqwest::Client::new()
        .request(method, url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the service answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

async fn round_trip(store: &str) {
    let (url, task, stop) = serve(store).await;
    let q = format!("{url}/v1/queues/q");
    let cases = payloads();
    for (id, payload) in &cases {
        let body = format!(r#"{{"group":"g","id":"{id}","payload":{payload}}}"#);
        let (status, text) = send(reqwest::Method::POST, &format!("{q}/jobs"), body).await;
        assert_eq!(status, 201, "{id}: {text}");
        let (status, text) = send(
            reqwest::Method::GET,
            &format!("{q}/jobs/{id}"),
            String::new(),
        )
        .await;
        assert_eq!(status, 200, "{id}");
        let shown: Shown = serde_json::from_str(&text).expect("the job");
        assert_eq!(shown.payload.get(), payload, "{id}: GET");
    }
    // A lease of all of them: each payload as it was sent.
    let lease = format!(r#"{{"worker":"w","max_jobs":{}}}"#, cases.len());
    let (status, text) = send(reqwest::Method::POST, &format!("{q}/leases"), lease).await;
    assert_eq!(status, 200, "{text}");
    let leased: Jobs = serde_json::from_str(&text).expect("the leased jobs");
    assert_eq!(leased.jobs.len(), cases.len());
    let sent: BTreeMap<&str, &str> = cases.iter().map(|(i, p)| (*i, p.as_str())).collect();
    for job in &leased.jobs {
        assert_eq!(Some(&job.payload.get()), sent.get(job.id.as_str()), "lease");
        // Fatal: into the dead set.
        let token = job.lease.as_deref().expect("a token");
        let fail = format!(r#"{{"lease":"{token}","fatal":true,"error":"\ud83e\udd80"}}"#);
        let (status, text) = send(
            reqwest::Method::POST,
            &format!("{q}/jobs/{}/fail", job.id),
            fail,
        )
        .await;
        assert_eq!(status, 204, "{}: {text}", job.id);
    }
    let (status, text) = send(reqwest::Method::GET, &format!("{q}/dead"), String::new()).await;
    assert_eq!(status, 200);
    let dead: Jobs = serde_json::from_str(&text).expect("the dead list");
    assert_eq!(dead.jobs.len(), cases.len());
    for job in &dead.jobs {
        assert_eq!(Some(&job.payload.get()), sent.get(job.id.as_str()), "dead");
    }
    // And the service still serves.
    let (status, _) = send(
        reqwest::Method::GET,
        &format!("{url}/healthz"),
        String::new(),
    )
    .await;
    assert_eq!(status, 200);
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip_on_memory() {
    round_trip("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip_on_redis() {
    let redis = RedisServer::start().expect("redis");
    round_trip(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_tokens_are_unguessable_and_a_request_id_makes_a_lease_safe_to_retry() {
    let (url, task, stop) = serve("memory").await;
    let q = format!("{url}/v1/queues/q");
    for batch in 0..2 {
        let jobs: Vec<String> = (0..1_000)
            .map(|n| {
                format!(
                    r#"{{"group":"g{}","payload":{}}}"#,
                    n % 50,
                    batch * 1_000 + n
                )
            })
            .collect();
        let body = format!("[{}]", jobs.join(","));
        let (status, text) = send(reqwest::Method::POST, &format!("{q}/jobs/batch"), body).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(text.matches(r#""status":201"#).count(), 1_000, "{text}");
    }
    // Two calls with one request id: the second answers what the first took.
    let lease = r#"{"worker":"w","max_jobs":1000,"request_id":"w:call-1"}"#;
    let (_, first) = send(reqwest::Method::POST, &format!("{q}/leases"), lease.into()).await;
    let (_, again) = send(reqwest::Method::POST, &format!("{q}/leases"), lease.into()).await;
    assert_eq!(first, again);
    let leased: Jobs = serde_json::from_str(&first).expect("jobs");
    assert_eq!(leased.jobs.len(), 1_000);
    // A thousand tokens: all distinct, and each opens only its own job. A neighbour's
    // token, or one digit changed, is a lost lease and acks nothing.
    let tokens: Vec<&str> = leased
        .jobs
        .iter()
        .map(|j| j.lease.as_deref().expect("a token"))
        .collect();
    let distinct: std::collections::BTreeSet<&&str> = tokens.iter().collect();
    assert_eq!(distinct.len(), tokens.len());
    for pair in leased.jobs.windows(2).take(50) {
        let neighbour = pair[1].lease.as_deref().expect("a token");
        let body = format!(r#"{{"lease":"{neighbour}"}}"#);
        let (status, text) = send(
            reqwest::Method::POST,
            &format!("{q}/jobs/{}/ack", pair[0].id),
            body,
        )
        .await;
        assert_eq!(status, 409, "{text}");
        let mut changed = pair[0].lease.clone().expect("a token");
        let last = if changed.ends_with('0') { "1" } else { "0" };
        changed.replace_range(changed.len() - 1.., last);
        let body = format!(r#"{{"lease":"{changed}"}}"#);
        let (status, _) = send(
            reqwest::Method::POST,
            &format!("{q}/jobs/{}/ack", pair[0].id),
            body,
        )
        .await;
        assert_eq!(status, 409);
    }
    // The fence as a token, or anything not 48 hex digits, is no token at all.
    for bad in ["1", "46", "", "zz"] {
        let body = format!(r#"{{"lease":"{bad}"}}"#);
        let (status, text) = send(
            reqwest::Method::POST,
            &format!("{q}/jobs/{}/ack", leased.jobs[0].id),
            body,
        )
        .await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("\"field\":\"lease\""), "{text}");
    }
    let (_, stats) = send(reqwest::Method::GET, &q, String::new()).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats");
    assert_eq!(stats["active"], 1_000, "nothing was acked by a guess");
    // The genuine token acks, and acking again answers as the first did.
    let job = &leased.jobs[0];
    let body = format!(
        r#"{{"lease":"{}"}}"#,
        job.lease.as_deref().expect("a token")
    );
    let ack = format!("{q}/jobs/{}/ack", job.id);
    assert_eq!(send(reqwest::Method::POST, &ack, body.clone()).await.0, 204);
    assert_eq!(send(reqwest::Method::POST, &ack, body).await.0, 204);
    // A bad request id is named.
    let lease = r#"{"worker":"w","request_id":"a b"}"#;
    let (status, text) = send(reqwest::Method::POST, &format!("{q}/leases"), lease.into()).await;
    assert_eq!(status, 400);
    assert!(text.contains("\"field\":\"request_id\""), "{text}");
    let _ = stop.send(());
    let _ = task.await;
}

/// The value of the metric line that starts with `name` in the service's `/metrics`.
async fn metric(url: &str, name: &str) -> Option<f64> {
    let (_, text) = send(
        reqwest::Method::GET,
        &format!("{url}/metrics"),
        String::new(),
    )
    .await;
    text.lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `what` until it holds (a condition, not a time: the deadline only ends a hung test).
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lease_whose_client_went_away_takes_no_job() {
    use tokio::io::AsyncWriteExt;
    let (url, task, stop) = serve("memory").await;
    let addr = url.trim_start_matches("http://").to_string();
    let body = r#"{"worker":"gone","wait_ms":5000}"#;
    let mut client = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "POST /v1/queues/q/leases HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("send");
    let waiting = r#"paceline_queue_waiting_leases{queue="q"}"#;
    until("the lease waits", async || {
        metric(&url, waiting).await == Some(1.0)
    })
    .await;
    drop(client);
    until("the lease stops waiting", async || {
        metric(&url, waiting).await == Some(0.0)
    })
    .await;
    // A job now: the call of the client that went away takes none of it.
    let job = r#"{"group":"g","id":"after","payload":1}"#;
    let (status, _) = send(
        reqwest::Method::POST,
        &format!("{url}/v1/queues/q/jobs"),
        job.into(),
    )
    .await;
    assert_eq!(status, 201);
    let lease = r#"{"worker":"here","wait_ms":5000}"#;
    let (_, text) = send(
        reqwest::Method::POST,
        &format!("{url}/v1/queues/q/leases"),
        lease.into(),
    )
    .await;
    let leased: Jobs = serde_json::from_str(&text).expect("jobs");
    assert_eq!(leased.jobs.len(), 1, "{text}");
    let started = r#"paceline_queue_jobs_total{queue="q",event="started"}"#;
    assert_eq!(
        metric(&url, started).await,
        Some(1.0),
        "started once, by `here`"
    );
    let _ = stop.send(());
    let _ = task.await;
}

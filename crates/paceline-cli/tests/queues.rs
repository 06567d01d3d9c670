//! The job queues of `paceline serve` over HTTP, end to end on the real binary.

mod common;

use common::{exits_cleanly, http, post, signal, start, write, Reply, Service};

/// Two tests of `$body` (which takes the service's port): the service on the memory store,
/// and on a Redis of its own.
macro_rules! on_memory_and_redis {
    ($body:ident: $memory:ident, $redis:ident) => {
        #[test]
        fn $memory() {
            let (_dir, s) = service();
            $body(s.port);
        }

        #[test]
        fn $redis() {
            let (_redis, _dir, s) = redis_service();
            $body(s.port);
        }
    };
}

const CONFIG: &str = r#"
[queues.roles]
group_policy = "gcra:rate=1000/s,burst=1000"
max_payload = 1024
max_attempts = 2
retry_backoff = "1h"

[queues.roles.groups."guild:slow"]
policy = "sliding_log:limit=1,window=1h"

[queues.kept]
group_policy = "gcra:rate=1000/s,burst=1000"
max_payload = 1024
keep_completed = 2
keep_completed_for = "1h"
keep_dead = 1
keep_dead_for = "7d"

[queues.roles.schedules.new-year]
cron = "0 0 1 1 *"
group = "reports"
payload = { kind = "yearly" }
timezone = "Europe/Paris"
"#;

fn service() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config]);
    (dir, s)
}

fn get(port: u16, path: &str) -> Reply {
    http(port, "GET", path, &[], b"")
}

fn delete(port: u16, path: &str) -> Reply {
    http(port, "DELETE", path, &[], b"")
}

fn lease(port: u16, body: &str) -> Vec<serde_json::Value> {
    let r = post(port, "/v1/queues/roles/leases", body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["jobs"].as_array().cloned().unwrap_or_default()
}

/// Waits for a job on `port` as a worker does: lease calls of `body` (a `wait_ms` each),
/// again while they answer none, for at most 30 s.
fn lease_waiting(port: u16, body: &str) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let jobs = lease(port, body);
        if !jobs.is_empty() || std::time::Instant::now() > deadline {
            return jobs;
        }
    }
}

fn text(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A Redis server and a service keeping its queues there (the server outlives the service).
fn redis_service() -> (paceline_testkit::RedisServer, tempfile::TempDir, Service) {
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config, "--store", &redis.url()]);
    (redis, dir, s)
}

/// The queue's counts: scheduled, waiting, active, dead (a call that also does the queue's
/// upkeep: expired leases go back to their groups).
fn counts(port: u16) -> [Option<u64>; 4] {
    let stats = get(port, "/v1/queues/roles").json();
    ["scheduled", "waiting", "active", "dead"].map(|state| stats[state].as_u64())
}

/// Asks `done` again (every 10 ms, at most 20 s) until it holds.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The queue's `paceline_queue_jobs_total` for `event`, from `/metrics`.
fn jobs_total(port: u16, event: &str) -> u64 {
    let metrics = get(port, "/metrics").body;
    let series = format!("paceline_queue_jobs_total{{queue=\"roles\",event=\"{event}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}in {metrics}"))
}

/// Enqueues job `id` in `group` (it must be new).
fn enqueue(port: u16, group: &str, id: &str) {
    let body = format!(r#"{{"group": "{group}", "payload": {{"n": 1}}, "id": "{id}"}}"#);
    let r = post(port, "/v1/queues/roles/jobs", &body);
    assert_eq!(r.status, 201, "{id}: {}", r.body);
}

/// Leases the one waiting job, which must be `id`: its lease token and the lease's answer.
fn lease_one(port: u16, id: &str, lease_ms: u64) -> (String, serde_json::Value) {
    let jobs = lease(
        port,
        &format!(r#"{{"worker": "w-{lease_ms}", "max_jobs": 10, "lease_ms": {lease_ms}}}"#),
    );
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(text(&jobs[0]["id"]), id, "{jobs:?}");
    (text(&jobs[0]["lease"]), jobs[0].clone())
}

/// `POST /v1/queues/roles/jobs/{id}/{what}` with `body`.
fn on_job(port: u16, id: &str, what: &str, body: &str) -> Reply {
    post(port, &format!("/v1/queues/roles/jobs/{id}/{what}"), body)
}

/// A job as `GET /v1/queues/roles/jobs/{id}` shows it.
fn job(port: u16, id: &str) -> serde_json::Value {
    let r = get(port, &format!("/v1/queues/roles/jobs/{id}"));
    assert_eq!(r.status, 200, "{id}: {}", r.body);
    r.json()
}

#[test]
fn enqueue_lease_ack_fail_extend_and_the_dead_set() {
    let (_dir, s) = service();
    let p = s.port;
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:1", "payload": {"user": 42, "role": 7}, "id": "grant-42-7"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let created = r.json();
    assert_eq!(
        (text(&created["id"]), text(&created["state"])),
        ("grant-42-7".into(), "waiting".into())
    );
    assert!(created["estimated_start_ms"].as_u64().unwrap_or(0) > 1_600_000_000_000);
    // The same id again: nothing added, the existing job answered.
    let again = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:1", "payload": "other", "id": "grant-42-7"}"#,
    );
    assert_eq!((again.status, again.json()), (200, created));
    let jobs = lease(p, r#"{"worker": "w1", "max_jobs": 10}"#);
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["payload"], serde_json::json!({"user": 42, "role": 7}));
    assert_eq!(
        (job["attempt"].as_u64(), text(&job["group"])),
        (Some(1), "guild:1".into())
    );
    let token = text(&job["lease"]);
    let r = post(
        p,
        "/v1/queues/roles/jobs/grant-42-7/extend",
        &format!(r#"{{"lease": "{token}", "lease_ms": 60000}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["lease_expires_ms"].as_u64() > job["lease_expires_ms"].as_u64());
    let info = get(p, "/v1/queues/roles/jobs/grant-42-7").json();
    assert_eq!(
        (text(&info["state"]), text(&info["worker"])),
        ("active".into(), "w1".into())
    );
    // An active job cannot be cancelled.
    assert_eq!(
        delete(p, "/v1/queues/roles/jobs/grant-42-7").error().0,
        "conflict"
    );
    let ack = format!(r#"{{"lease": "{token}"}}"#);
    assert_eq!(
        post(p, "/v1/queues/roles/jobs/grant-42-7/ack", &ack).status,
        204
    );
    // Acknowledged once: the same lease again (a retry whose first answer was lost)
    // answers as the first did, and acknowledges nothing more.
    let r = post(p, "/v1/queues/roles/jobs/grant-42-7/ack", &ack);
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(jobs_total(p, "acked"), 1);
    assert_eq!(
        get(p, "/v1/queues/roles/jobs/grant-42-7").error().0,
        "unknown_job"
    );

    // A retry waits for its backoff; a fatal failure goes to the dead set.
    for (id, failure) in [
        (
            "retry-me",
            r#""retry_after_ms": 3600000, "error": "upstream 500""#,
        ),
        ("kill-me", r#""fatal": true, "error": "bad role""#),
    ] {
        let body = format!(r#"{{"group": "guild:2", "payload": null, "id": "{id}"}}"#);
        assert_eq!(post(p, "/v1/queues/roles/jobs", &body).status, 201);
        let jobs = lease(p, r#"{"worker": "w1"}"#);
        assert_eq!(text(&jobs[0]["id"]), id);
        let body = format!(r#"{{"lease": "{}", {failure}}}"#, text(&jobs[0]["lease"]));
        let r = post(p, &format!("/v1/queues/roles/jobs/{id}/fail"), &body);
        assert_eq!(r.status, 204, "{}", r.body);
    }
    let retrying = get(p, "/v1/queues/roles/jobs/retry-me").json();
    assert_eq!(
        (text(&retrying["state"]), text(&retrying["last_error"])),
        ("scheduled".into(), "upstream 500".into())
    );
    let dead = get(p, "/v1/queues/roles/dead").json();
    assert_eq!(text(&dead["jobs"][0]["id"]), "kill-me");
    assert_eq!(text(&dead["jobs"][0]["last_error"]), "bad role");
    let stats = get(p, "/v1/queues/roles").json();
    assert_eq!(
        (
            stats["scheduled"].as_u64(),
            stats["dead"].as_u64(),
            stats["waiting"].as_u64()
        ),
        (Some(1), Some(1), Some(0))
    );
    let r = post(p, "/v1/queues/roles/dead/retry", "{}");
    assert_eq!(r.json()["retried"], 1);
    let jobs = lease(p, r#"{"worker": "w2"}"#);
    assert_eq!(
        (text(&jobs[0]["id"]), jobs[0]["attempt"].as_u64()),
        ("kill-me".into(), Some(1))
    );
    let body = format!(
        r#"{{"lease": "{}", "fatal": true}}"#,
        text(&jobs[0]["lease"])
    );
    assert_eq!(
        post(p, "/v1/queues/roles/jobs/kill-me/fail", &body).status,
        204
    );
    assert_eq!(delete(p, "/v1/queues/roles/dead").json()["purged"], 1);
    // A scheduled job can be cancelled.
    assert_eq!(delete(p, "/v1/queues/roles/jobs/retry-me").status, 204);
    let metrics = get(p, "/metrics").body;
    for line in [
        "paceline_queue_jobs_total{queue=\"roles\",event=\"enqueued\"} 3",
        "paceline_queue_jobs_total{queue=\"roles\",event=\"started\"} 4",
        "paceline_queue_jobs_total{queue=\"roles\",event=\"acked\"} 1",
        "paceline_queue_jobs_total{queue=\"roles\",event=\"dead\"} 2",
        "paceline_queue_jobs_current{queue=\"roles\",state=\"waiting\"} 0",
        "paceline_queue_start_lag_seconds_count{queue=\"roles\"} 4",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[test]
fn a_group_s_limit_holds_its_starts_and_a_pause_holds_the_group() {
    let (_dir, s) = service();
    let p = s.port;
    for n in 0..2 {
        let body = format!(r#"{{"group": "guild:slow", "payload": {n}}}"#);
        assert_eq!(post(p, "/v1/queues/roles/jobs", &body).status, 201);
    }
    let body = r#"{"group": "guild:fast", "payload": "x"}"#;
    assert_eq!(post(p, "/v1/queues/roles/jobs", body).status, 201);
    // One an hour for guild:slow: its second job waits; guild:fast runs.
    let jobs = lease(p, r#"{"worker": "w", "max_jobs": 10}"#);
    let groups: Vec<String> = jobs.iter().map(|j| text(&j["group"])).collect();
    assert_eq!(groups, ["guild:slow", "guild:fast"]);
    let stats = get(p, "/v1/queues/roles").json();
    let slow = &stats["groups"]["guild:slow"];
    assert_eq!(
        (slow["waiting"].as_u64(), slow["active"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(slow["next_eligible_ms"].as_u64() > jobs[0]["started_ms"].as_u64());
    // The upstream said 429 for guild:fast: its job goes back first, the group waits.
    let fast = &jobs[1];
    let body = format!(
        r#"{{"lease": "{}", "pause_group_ms": 3600000}}"#,
        text(&fast["lease"])
    );
    let url = format!("/v1/queues/roles/jobs/{}/fail", text(&fast["id"]));
    assert_eq!(post(p, &url, &body).status, 204);
    let info = get(p, &format!("/v1/queues/roles/jobs/{}", text(&fast["id"]))).json();
    assert_eq!(
        (text(&info["state"]), info["attempts"].as_u64()),
        ("waiting".into(), Some(0))
    );
    assert!(lease(p, r#"{"worker": "w", "max_jobs": 10}"#).is_empty());
    // The upstream's refusal is not the job's failure.
    assert_eq!((jobs_total(p, "paused"), jobs_total(p, "failed")), (1, 0));
}

#[test]
fn a_waiting_lease_answers_when_a_job_arrives() {
    let (_dir, s) = service();
    let p = s.port;
    let waiting =
        std::thread::spawn(move || lease_waiting(p, r#"{"worker": "w", "wait_ms": 5000}"#));
    // The lease is in its wait (or about to be): either way it gets the job.
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "g", "payload": 1, "id": "late"}"#,
    );
    assert_eq!(r.status, 201);
    let jobs = waiting.join().expect("the waiting lease");
    assert_eq!(jobs.len(), 1);
    assert_eq!(text(&jobs[0]["id"]), "late");
}

#[test]
fn bad_input_names_its_field_and_enqueues_nothing() {
    let (_dir, s) = service();
    let p = s.port;
    let huge_group = format!(r#"{{"group": "{}", "payload": 1}}"#, "g".repeat(1 << 20));
    let big_payload = format!(r#"{{"group": "g", "payload": "{}"}}"#, "x".repeat(2000));
    for (body, field) in [
        (r#"{"payload": 1}"#, "group"),
        (r#"{"group": "", "payload": 1}"#, "group"),
        (huge_group.as_str(), "group"),
        (big_payload.as_str(), "payload"),
        (r#"{"group": "g", "delay_ms": -5}"#, "delay_ms"),
        (r#"{"group": "g", "colour": "red"}"#, "colour"),
        (r#"{"group": "g", "id": "12"}"#, "id"),
        (r#"{"group": 5}"#, "group"),
        (r#"{"group": "g", "max_attempts": 0}"#, "max_attempts"),
        (r#"["g", 1]"#, "body"),
        (r#"{"group": "g""#, "body"),
    ] {
        let r = post(p, "/v1/queues/roles/jobs", body);
        let short: String = body.chars().take(60).collect();
        assert_eq!(
            (r.status, r.error()),
            (400, ("invalid_argument".into(), field.into())),
            "{short}: {}",
            r.body
        );
    }
    for (body, field) in [
        (r#"{"max_jobs": 1}"#, "worker"),
        (r#"{"worker": "w", "max_jobs": 0}"#, "max_jobs"),
        (r#"{"worker": "w", "max_jobs": 1001}"#, "max_jobs"),
        (r#"{"worker": "w", "wait_ms": 5001}"#, "wait_ms"),
        (r#"{"worker": "w", "lease_ms": 0}"#, "lease_ms"),
    ] {
        let r = post(p, "/v1/queues/roles/leases", body);
        assert_eq!(
            (r.status, r.error().1),
            (400, field.to_string()),
            "{body}: {}",
            r.body
        );
    }
    for (body, field) in [
        (r#"{}"#, "lease"),
        (r#"{"lease": "nope"}"#, "lease"),
        (
            r#"{"lease": "000000000000000000000000000000000000000000000000", "fatal": true, "retry_after_ms": 5}"#,
            "fatal",
        ),
        (
            r#"{"lease": "000000000000000000000000000000000000000000000000", "retry_after_ms": 5, "pause_group_ms": 5}"#,
            "pause_group_ms",
        ),
    ] {
        let r = post(p, "/v1/queues/roles/jobs/x/fail", body);
        assert_eq!(
            (r.status, r.error().1),
            (400, field.to_string()),
            "{body}: {}",
            r.body
        );
    }
    // A batch answers each job in order; the bad ones are not enqueued.
    let r = post(
        p,
        "/v1/queues/roles/jobs/batch",
        r#"[{"group": "g", "payload": 1}, {"group": ""}, {"group": "g", "payload": 2, "id": "b"}]"#,
    );
    let answers = r.json();
    let statuses: Vec<u64> = answers
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["status"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(statuses, [201, 400, 201]);
    assert_eq!(text(&answers[1]["error"]["field"]), "group");
    assert_eq!(get(p, "/v1/queues/roles").json()["waiting"], 2);
    let r = post(p, "/v1/queues/nowhere/jobs", r#"{"group": "g"}"#);
    assert_eq!((r.status, r.error().0.as_str()), (404, "unknown_queue"));
    assert!(r.body.contains("roles"), "{}", r.body);
    let r = http(p, "GET", "/v1/queues/roles/jobs/%FF", &[], b"");
    assert_eq!((r.status, r.error().1.as_str()), (400, "path"));
}

#[test]
fn two_services_share_one_queue_in_redis() {
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let url = redis.url();
    let a = start(&["--config", &config, "--store", &url]);
    let b = start(&["--config", &config, "--store", &url]);
    // A waiting lease on one service wakes when the other enqueues.
    let port_b = b.port;
    let waiting = std::thread::spawn(move || {
        lease_waiting(port_b, r#"{"worker": "b", "max_jobs": 5, "wait_ms": 5000}"#)
    });
    let r = post(
        a.port,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:1", "payload": "hello", "id": "shared-1"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let jobs = waiting.join().expect("the lease call returns");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(text(&jobs[0]["id"]), "shared-1");
    assert_eq!(text(&jobs[0]["payload"]), "hello");
    // The job is leased once: the other service sees it active and cannot lease it.
    assert!(lease(a.port, r#"{"worker": "a"}"#).is_empty());
    let job = get(a.port, "/v1/queues/roles/jobs/shared-1").json();
    assert_eq!(text(&job["state"]), "active");
    // The same id through the other service: the existing job, nothing added.
    let again = post(
        b.port,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:1", "id": "shared-1"}"#,
    );
    assert_eq!(again.status, 200, "{}", again.body);
    let lease_token = jobs[0]["lease"].to_string();
    let ack = post(
        a.port,
        "/v1/queues/roles/jobs/shared-1/ack",
        &format!(r#"{{"lease": {lease_token}}}"#),
    );
    assert_eq!(ack.status, 204, "{}", ack.body);
    // Acked through one; the same ack through the other (a client retrying elsewhere)
    // answers as the first did: the token is good on every instance, and nothing is
    // acknowledged twice.
    let again = post(
        b.port,
        "/v1/queues/roles/jobs/shared-1/ack",
        &format!(r#"{{"lease": {lease_token}}}"#),
    );
    assert_eq!(again.status, 204, "{}", again.body);
    assert_eq!(jobs_total(b.port, "acked"), 1);
    let stats = get(b.port, "/v1/queues/roles").json();
    assert_eq!(stats["waiting"], 0, "{stats}");
    assert_eq!(stats["active"], 0, "{stats}");
    // Bad input is refused the same way on Redis.
    let r = post(b.port, "/v1/queues/roles/jobs", r#"{"payload": 1}"#);
    assert_eq!((r.status, r.error().1.as_str()), (400, "group"));
}

#[test]
fn a_waiting_lease_answers_with_nothing_when_the_service_shuts_down() {
    let (_dir, mut s) = service();
    let p = s.port;
    let waiting = std::thread::spawn(move || {
        post(
            p,
            "/v1/queues/roles/leases",
            r#"{"worker": "w", "wait_ms": 5000}"#,
        )
    });
    // Until the service counts the lease as waiting.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !get(p, "/metrics")
        .body
        .contains("paceline_queue_waiting_leases{queue=\"roles\"} 1")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    signal(&s, "TERM");
    let r = waiting.join().expect("the waiting lease");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["jobs"], serde_json::json!([]));
    exits_cleanly(&mut s);
}

/// Runs `paceline queue ARGS`: its exit code, standard output and standard error.
fn queue_command(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("queue")
        .args(args)
        .output()
        .expect("paceline runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_queue_command_shows_and_repairs_a_redis_queue() {
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let url = redis.url();
    let s = start(&["--config", &config, "--store", &url]);
    for id in ["a", "b"] {
        let body = format!(r#"{{"group": "guild:1", "id": "{id}", "payload": {{"n": 1}}}}"#);
        assert_eq!(post(s.port, "/v1/queues/roles/jobs", &body).status, 201);
    }
    let jobs = lease(s.port, r#"{"worker": "w", "max_jobs": 1}"#);
    let token = jobs[0]["lease"].to_string();
    let fail = post(
        s.port,
        &format!("/v1/queues/roles/jobs/{}/fail", text(&jobs[0]["id"])),
        &format!(r#"{{"lease": {token}, "fatal": true, "error": "bad role"}}"#),
    );
    assert_eq!(fail.status, 204, "{}", fail.body);

    let (code, out, err) = queue_command(&["stats", "--store", &url, "roles"]);
    assert_eq!(code, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (stats["waiting"].as_u64(), stats["dead"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );

    let (code, out, _) = queue_command(&["dead", "--store", &url, "roles"]);
    assert_eq!(code, 0);
    let dead: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    assert_eq!(
        (text(&dead["id"]), text(&dead["last_error"])),
        ("a".into(), "bad role".into())
    );
    assert_eq!(dead["payload"]["n"], 1);

    let (code, out, err) = queue_command(&["jobs", "--store", &url, "roles", "b", "nope"]);
    assert_eq!(code, 1, "an unknown job");
    assert!(out.contains(r#""state":"waiting""#), "{out}");
    assert!(err.contains("nope"), "{err}");

    let (code, out, _) = queue_command(&["retry-dead", "--store", &url, "roles", "--all"]);
    assert_eq!((code, out.trim()), (0, r#"{"retried":1}"#));
    let (code, out, _) = queue_command(&["purge-dead", "--store", &url, "roles"]);
    assert_eq!((code, out.trim()), (0, r#"{"purged":0}"#));
    assert_eq!(get(s.port, "/v1/queues/roles").json()["waiting"], 2);

    // A payload no recursive parser could hand back is shown as it was enqueued.
    let deep = format!("{}1e400{}", "[".repeat(500), "]".repeat(500));
    let body = format!(r#"{{"group": "guild:2", "id": "deep", "payload": {deep}}}"#);
    assert_eq!(post(s.port, "/v1/queues/roles/jobs", &body).status, 201);
    let (code, out, err) = queue_command(&["jobs", "--store", &url, "roles", "deep"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(r#""payload":{deep}"#)),
        "the payload as sent"
    );

    // Pauses from the command line, seen by the service.
    let pause = [
        "pause", "--store", &url, "roles", "--group", "guild:2", "--for", "1h",
    ];
    let (code, out, err) = queue_command(&pause);
    assert_eq!(code, 0, "{err}");
    let paused: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (text(&paused["group"]), &paused["paused"]),
        ("guild:2".into(), &serde_json::json!(true))
    );
    assert!(paused["paused_until_ms"].as_u64().is_some(), "{paused}");
    let group = |s: &serde_json::Value| s["groups"]["guild:2"]["paused"].clone();
    assert_eq!(group(&get(s.port, "/v1/queues/roles").json()), true);
    for bad in ["0s", "366d", "soon"] {
        let (code, _, err) = queue_command(&["pause", "--store", &url, "roles", "--for", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("for"), "{bad}: {err}");
    }
    let resume = ["resume", "--store", &url, "roles", "--group", "guild:2"];
    let (code, out, err) = queue_command(&resume);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(r#""paused":false"#), "{out}");
    assert_eq!(group(&get(s.port, "/v1/queues/roles").json()), false);

    // A group's policy from the command line, seen by the service.
    let set = [
        "policy",
        "--store",
        &url,
        "roles",
        "guild:2",
        "--set",
        "gcra:rate=5/s",
    ];
    let (code, out, err) = queue_command(&set);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        r#"{"group":"guild:2","policy":"gcra:rate=5/s,burst=1","queue":"roles","source":"run_time"}"#
    );
    let shown = get(s.port, "/v1/queues/roles/groups/guild:2/policy").json();
    assert_eq!(text(&shown["source"]), "run_time", "{shown}");
    let bad = [
        "policy",
        "--store",
        &url,
        "roles",
        "guild:2",
        "--set",
        "gcra:rate=soon",
    ];
    let (code, _, err) = queue_command(&bad);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("set.rate"), "{err}");
    let unset = ["policy", "--store", &url, "roles", "guild:2", "--unset"];
    let (code, out, err) = queue_command(&unset);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(r#""source":"default""#), "{out}");

    // A queue the store does not hold, a bad URL: input errors; an unreachable store: 3.
    let (code, _, err) = queue_command(&["stats", "--store", &url, "elsewhere"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no queue `elsewhere`"), "{err}");
    let (code, _, err) = queue_command(&["stats", "--store", "memory", "roles"]);
    assert_eq!(code, 2, "{err}");
    // Port 1: nothing listens there (a port found free could be taken by then).
    let (code, _, err) = queue_command(&["stats", "--store", "redis://127.0.0.1:1", "roles"]);
    assert_eq!(code, 3, "{err}");
}

/// A stale lease token (of a job acknowledged, failed, or leased again since) sent to `fail`
/// or `extend`: `409 lease_lost` naming `lease` each time, and the job stays as it was; a
/// failure report repeated with the token that made it answers `204` and changes nothing.
fn stale_leases_change_nothing(p: u16) {
    let stale_calls = |id: &str, token: &str, repeats: bool| {
        for (what, body) in [
            (
                "fail",
                format!(r#"{{"lease": "{token}", "error": "stale"}}"#),
            ),
            (
                "fail",
                format!(r#"{{"lease": "{token}", "retry_after_ms": 1}}"#),
            ),
            (
                "fail",
                format!(r#"{{"lease": "{token}", "fatal": true, "error": "stale"}}"#),
            ),
            (
                "extend",
                format!(r#"{{"lease": "{token}", "lease_ms": 600000}}"#),
            ),
            ("extend", format!(r#"{{"lease": "{token}"}}"#)),
        ] {
            let r = on_job(p, id, what, &body);
            if repeats && what == "fail" {
                assert_eq!(r.status, 204, "{what} {id} {body}: {}", r.body);
                continue;
            }
            assert_eq!(
                (r.status, r.error()),
                (409, ("lease_lost".into(), "lease".into())),
                "{what} {id} {body}: {}",
                r.body
            );
        }
    };

    // Acknowledged: the job is gone, and stays gone (no dead job, no retry).
    enqueue(p, "guild:a", "acked");
    let (token, _) = lease_one(p, "acked", 60_000);
    let ack = on_job(p, "acked", "ack", &format!(r#"{{"lease": "{token}"}}"#));
    assert_eq!(ack.status, 204, "{}", ack.body);
    assert_eq!(counts(p), [Some(0), Some(0), Some(0), Some(0)]);
    stale_calls("acked", &token, false);
    assert_eq!(counts(p), [Some(0), Some(0), Some(0), Some(0)]);
    assert_eq!(
        get(p, "/v1/queues/roles/jobs/acked").error().0,
        "unknown_job"
    );

    // Failed and waiting for its retry: it keeps its time, its attempts and its error.
    enqueue(p, "guild:b", "failed");
    let (token, _) = lease_one(p, "failed", 60_000);
    let r = on_job(
        p,
        "failed",
        "fail",
        &format!(r#"{{"lease": "{token}", "retry_after_ms": 3600000, "error": "upstream 500"}}"#),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let before = job(p, "failed");
    assert_eq!(
        (text(&before["state"]), text(&before["last_error"])),
        ("scheduled".into(), "upstream 500".into())
    );
    stale_calls("failed", &token, true);
    assert_eq!(job(p, "failed"), before);
    assert_eq!(counts(p), [Some(1), Some(0), Some(0), Some(0)]);

    // Leased again after its first lease expired: the new lease keeps the job.
    enqueue(p, "guild:c", "again");
    let (first, _) = lease_one(p, "again", 1);
    until("the 1 ms lease of `again` expires", || {
        counts(p)[2] == Some(0)
    });
    let (second, leased) = lease_one(p, "again", 600_000);
    assert_ne!(first, second);
    assert_eq!(leased["attempt"].as_u64(), Some(2), "{leased}");
    let before = job(p, "again");
    assert_eq!(
        (
            text(&before["state"]),
            text(&before["worker"]),
            before["lease_expires_ms"].as_u64()
        ),
        (
            "active".into(),
            "w-600000".into(),
            leased["lease_expires_ms"].as_u64()
        )
    );
    stale_calls("again", &first, false);
    assert_eq!(job(p, "again"), before);
    assert_eq!(counts(p), [Some(1), Some(0), Some(1), Some(0)]);
    // The current lease still holds it.
    let r = on_job(
        p,
        "again",
        "extend",
        &format!(r#"{{"lease": "{second}", "lease_ms": 60000}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = on_job(p, "again", "ack", &format!(r#"{{"lease": "{second}"}}"#));
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(counts(p), [Some(1), Some(0), Some(0), Some(0)]);
}

on_memory_and_redis!(
    stale_leases_change_nothing:
    a_stale_lease_can_neither_fail_nor_extend_its_job,
    a_stale_lease_can_neither_fail_nor_extend_its_job_in_redis
);

/// A batch of 1,001 jobs: `400` naming `body`, and not one of them enqueued; 1,000 pass.
fn a_batch_over_the_most_enqueues_nothing(p: u16) {
    enqueue(p, "guild:1", "before");
    let before = counts(p);
    assert_eq!(before, [Some(0), Some(1), Some(0), Some(0)]);
    let batch = |n: usize| {
        let jobs: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"group": "guild:{}", "payload": {i}, "id": "batch-{i}"}}"#,
                    i % 7
                )
            })
            .collect();
        format!("[{}]", jobs.join(","))
    };
    let r = post(p, "/v1/queues/roles/jobs/batch", &batch(1001));
    assert_eq!(
        (r.status, r.error()),
        (400, ("invalid_argument".into(), "body".into())),
        "{}",
        r.body
    );
    let message = text(&r.json()["error"]["message"]);
    assert!(
        message.contains("1001 jobs") && message.contains("at most 1000"),
        "{message}"
    );
    assert_eq!(counts(p), before);
    for id in ["batch-0", "batch-999", "batch-1000"] {
        let r = get(p, &format!("/v1/queues/roles/jobs/{id}"));
        assert_eq!(
            (r.status, r.error().0.as_str()),
            (404, "unknown_job"),
            "{id}"
        );
    }
    assert_eq!(jobs_total(p, "enqueued"), 1);
    // 1,000 is the most, and is taken.
    let r = post(p, "/v1/queues/roles/jobs/batch", &batch(1000));
    assert_eq!(r.status, 200, "{}", r.body);
    let created = r
        .json()
        .as_array()
        .map(|answers| answers.iter().filter(|a| a["status"] == 201).count());
    assert_eq!(created, Some(1000));
    assert_eq!(counts(p), [Some(0), Some(1001), Some(0), Some(0)]);
}

on_memory_and_redis!(
    a_batch_over_the_most_enqueues_nothing:
    a_batch_of_1001_jobs_is_refused_whole,
    a_batch_of_1001_jobs_is_refused_whole_in_redis
);

/// `POST .../dead/retry` with `{"ids": [...]}`: the dead jobs named go back in line with
/// fresh attempts, the other dead jobs stay dead, and ids unknown or of jobs that are not
/// dead are skipped (not counted, nothing created or moved).
fn retrying_dead_jobs_by_id(p: u16) {
    for id in ["d1", "d2", "d3"] {
        enqueue(p, "guild:d", id);
    }
    let jobs = lease(p, r#"{"worker": "w", "max_jobs": 10}"#);
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    for j in &jobs {
        let body = format!(
            r#"{{"lease": "{}", "fatal": true, "error": "bad role"}}"#,
            text(&j["lease"])
        );
        let r = on_job(p, &text(&j["id"]), "fail", &body);
        assert_eq!(r.status, 204, "{}", r.body);
    }
    enqueue(p, "guild:w", "w");
    let waiting = job(p, "w");
    assert_eq!(counts(p), [Some(0), Some(1), Some(0), Some(3)]);
    let retry = |body: &str| {
        let r = post(p, "/v1/queues/roles/dead/retry", body);
        assert_eq!(r.status, 200, "{body}: {}", r.body);
        r.json()["retried"].as_u64()
    };
    // An empty list names no job (`{}` would retry them all).
    assert_eq!(retry(r#"{"ids": []}"#), Some(0));
    assert_eq!(counts(p), [Some(0), Some(1), Some(0), Some(3)]);
    assert_eq!(
        retry(r#"{"ids": ["d1", "nope", "w", "d3", "d1"]}"#),
        Some(2)
    );
    assert_eq!(counts(p), [Some(0), Some(3), Some(0), Some(1)]);
    for id in ["d1", "d3"] {
        let info = job(p, id);
        assert_eq!(
            (text(&info["state"]), info["attempts"].as_u64()),
            ("waiting".into(), Some(0)),
            "{info}"
        );
    }
    let d2 = job(p, "d2");
    assert_eq!(
        (text(&d2["state"]), text(&d2["last_error"])),
        ("dead".into(), "bad role".into())
    );
    let dead = get(p, "/v1/queues/roles/dead").json();
    let dead: Vec<String> = dead["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().map(|j| text(&j["id"])).collect())
        .unwrap_or_default();
    assert_eq!(dead, ["d2"]);
    assert_eq!(job(p, "w"), waiting);
    assert_eq!(
        get(p, "/v1/queues/roles/jobs/nope").error().0,
        "unknown_job"
    );
    // No longer dead, or never known: nothing to retry.
    assert_eq!(retry(r#"{"ids": ["d1", "d3"]}"#), Some(0));
    assert_eq!(retry(r#"{"ids": ["nope"]}"#), Some(0));
    assert_eq!(counts(p), [Some(0), Some(3), Some(0), Some(1)]);
    // The retried jobs start again; the one left dead does not.
    let mut started: Vec<String> = lease(p, r#"{"worker": "w", "max_jobs": 10}"#)
        .iter()
        .map(|j| text(&j["id"]))
        .collect();
    started.sort();
    assert_eq!(started, ["d1", "d3", "w"]);
    assert_eq!(counts(p), [Some(0), Some(0), Some(3), Some(1)]);
}

on_memory_and_redis!(
    retrying_dead_jobs_by_id:
    retrying_dead_jobs_by_id_retries_only_those,
    retrying_dead_jobs_by_id_retries_only_those_in_redis
);

/// `paceline_queue_jobs_total` for `failed`, `retried`, `dead` and `lease_expired` after a
/// failure that is retried, a fatal one, and a lease that expires twice (back in line, then
/// out of attempts: dead).
fn failures_and_expiries_in_the_metrics(p: u16) {
    let totals = || ["failed", "retried", "dead", "lease_expired"].map(|e| jobs_total(p, e));
    assert_eq!(totals(), [0, 0, 0, 0]);

    enqueue(p, "guild:m", "retried");
    let (token, _) = lease_one(p, "retried", 60_000);
    let body = format!(r#"{{"lease": "{token}", "retry_after_ms": 3600000, "error": "503"}}"#);
    let r = on_job(p, "retried", "fail", &body);
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(text(&job(p, "retried")["state"]), "scheduled");
    assert_eq!(totals(), [1, 1, 0, 0]);

    enqueue(p, "guild:m", "fatal");
    let (token, _) = lease_one(p, "fatal", 60_000);
    let body = format!(r#"{{"lease": "{token}", "fatal": true, "error": "bad role"}}"#);
    let r = on_job(p, "fatal", "fail", &body);
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(totals(), [2, 1, 1, 0]);

    // Attempt 1 of 2 expires: back in line, neither a failure nor a death.
    enqueue(p, "guild:m", "stalled");
    lease_one(p, "stalled", 1);
    until("the first lease of `stalled` expires", || {
        jobs_total(p, "lease_expired") == 1
    });
    assert_eq!(totals(), [2, 1, 1, 1]);
    let info = job(p, "stalled");
    assert_eq!(
        (text(&info["state"]), info["attempts"].as_u64()),
        ("waiting".into(), Some(1)),
        "{info}"
    );
    // Attempt 2 of 2 expires: dead.
    let (_, leased) = lease_one(p, "stalled", 1);
    assert_eq!(leased["attempt"].as_u64(), Some(2), "{leased}");
    until("the second lease of `stalled` expires", || {
        jobs_total(p, "lease_expired") == 2
    });
    assert_eq!(totals(), [2, 1, 2, 2]);
    let info = job(p, "stalled");
    assert_eq!(text(&info["state"]), "dead", "{info}");
    assert!(
        text(&info["last_error"]).contains("lease expired"),
        "{info}"
    );
    assert_eq!(jobs_total(p, "started"), 4);
    assert_eq!(counts(p), [Some(1), Some(0), Some(0), Some(2)]);
}

on_memory_and_redis!(
    failures_and_expiries_in_the_metrics:
    the_metrics_count_failures_retries_and_lease_expiries,
    the_metrics_count_failures_retries_and_lease_expiries_in_redis
);

/// `not_before_ms`: a Unix time on the store's clock holds the job until then, years ahead
/// too, up to the queue's last time (in 2255); one past it, or not a time, is a `400`
/// naming it and enqueues nothing.
fn not_before_holds_a_job_until_then(p: u16) {
    // The store's clock, read from an enqueue's answer.
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "now", "payload": 0}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let now_ms = r.json()["estimated_start_ms"].as_u64().expect("a time");
    let at = now_ms + 3_600_000;
    let body = format!(r#"{{"group": "later", "payload": 1, "id": "at", "not_before_ms": {at}}}"#);
    let r = post(p, "/v1/queues/roles/jobs", &body);
    assert_eq!(r.status, 201, "{}", r.body);
    let created = r.json();
    assert_eq!(text(&created["state"]), "scheduled");
    assert_eq!(created["estimated_start_ms"].as_u64(), Some(at));
    // Only the job without a time starts now.
    let jobs = lease(p, r#"{"worker": "w", "max_jobs": 10}"#);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(text(&jobs[0]["group"]), "now");
    assert_eq!(job(p, "at")["not_before_ms"].as_u64(), Some(at));
    // A time already past holds nothing back.
    let body = format!(
        r#"{{"group": "past", "payload": 2, "not_before_ms": {}}}"#,
        now_ms - 1
    );
    let r = post(p, "/v1/queues/roles/jobs", &body);
    assert_eq!(
        (r.status, text(&r.json()["state"])),
        (201, "waiting".into())
    );
    // Years ahead, and the last time, are times like any other.
    let last_ms = paceline_queue::job::MAX_NOT_BEFORE / 1000;
    for (id, at) in [("years", now_ms + 20 * 365 * 86_400_000), ("last", last_ms)] {
        let body =
            format!(r#"{{"group": "{id}", "payload": 1, "id": "{id}", "not_before_ms": {at}}}"#);
        let r = post(p, "/v1/queues/roles/jobs", &body);
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(
            r.json()["estimated_start_ms"].as_u64(),
            Some(at),
            "{}",
            r.body
        );
        assert_eq!(job(p, id)["not_before_ms"].as_u64(), Some(at));
    }
    let before = counts(p);
    for (body, said) in [
        (
            format!(
                r#"{{"group": "g", "payload": 3, "not_before_ms": {}}}"#,
                last_ms + 1
            ),
            "from 0 to 9007199254740",
        ),
        (
            r#"{"group": "g", "payload": 3, "not_before_ms": -1}"#.to_string(),
            "milliseconds",
        ),
        (
            r#"{"group": "g", "payload": 3, "not_before_ms": "soon"}"#.to_string(),
            "a JSON number",
        ),
    ] {
        let r = post(p, "/v1/queues/roles/jobs", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let error = &r.json()["error"];
        assert_eq!(text(&error["field"]), "not_before_ms", "{body}: {}", r.body);
        assert!(text(&error["message"]).contains(said), "{body}: {}", r.body);
    }
    assert_eq!(counts(p), before, "nothing enqueued by a refused job");
}

on_memory_and_redis!(
    not_before_holds_a_job_until_then:
    not_before_holds_a_job_until_its_time,
    not_before_holds_a_job_until_its_time_in_redis
);

/// A queue of 3 partitions (`partitions = 3` in the service's config), served on a Redis
/// and seen by `paceline queue` as one queue: its counts summed over the partitions, its
/// dead jobs listed partition by partition, its jobs found by the ids each partition
/// gives, its dead set retried across them.
#[test]
fn the_queue_command_sees_a_queue_of_partitions_as_one() {
    use paceline_queue::partitioned::partition_of;
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "paceline.toml",
        "[queues.spread]\ngroup_policy = \"gcra:rate=1000/s,burst=1000\"\npartitions = 3\n",
    );
    let url = redis.url();
    let s = start(&["--config", &config, "--store", &url]);
    // One group in each partition, each with a job the queue numbers.
    let groups: Vec<String> = (0..3)
        .map(|p| {
            (0..)
                .map(|k| format!("guild:{k}"))
                .find(|g| partition_of(g, 3) == p)
                .expect("a group in every partition")
        })
        .collect();
    let mut ids = Vec::new();
    for group in &groups {
        let body = format!(r#"{{"group": "{group}", "payload": 1}}"#);
        let r = post(s.port, "/v1/queues/spread/jobs", &body);
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(text(&r.json()["id"]));
    }
    assert_eq!(ids, ["1", "1.1", "1.2"]);
    // Partitions 2 and 0 each lose a job to the dead set, in that order.
    let jobs = http(
        s.port,
        "POST",
        "/v1/queues/spread/leases",
        &[],
        br#"{"worker": "w", "max_jobs": 3}"#,
    )
    .json();
    for id in ["1.2", "1"] {
        let job = jobs["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["id"] == id))
            .expect("the job leased");
        let fail = post(
            s.port,
            &format!("/v1/queues/spread/jobs/{id}/fail"),
            &format!(r#"{{"lease": {}, "fatal": true}}"#, job["lease"]),
        );
        assert_eq!(fail.status, 204, "{}", fail.body);
    }

    let (code, out, err) = queue_command(&["stats", "--store", &url, "spread"]);
    assert_eq!(code, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (stats["active"].as_u64(), stats["dead"].as_u64()),
        (Some(1), Some(2)),
        "{stats}"
    );
    let (code, out, _) = queue_command(&["dead", "--store", &url, "spread"]);
    assert_eq!(code, 0);
    let dead: Vec<String> = out
        .lines()
        .map(|line| {
            let job: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            text(&job["id"])
        })
        .collect();
    assert_eq!(dead, ["1", "1.2"], "partition 0's dead jobs first");
    let (code, out, err) = queue_command(&["jobs", "--store", &url, "spread", "1.1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(r#""state":"active""#), "{out}");
    let (code, out, _) = queue_command(&["retry-dead", "--store", &url, "spread", "--all"]);
    assert_eq!((code, out.trim()), (0, r#"{"retried":2}"#));
    assert_eq!(get(s.port, "/v1/queues/spread").json()["waiting"], 2);
}

/// Pauses asked over HTTP: a group's until resumed (its jobs wait, a new one has no
/// estimate, the others run), the queue's for an hour (nothing leased, a waiting lease
/// woken by the resume), each shown by `GET /v1/queues/roles`; bad pauses are `400`s
/// naming their field, changing nothing.
fn pausing_and_resuming(p: u16) {
    enqueue(p, "guild:a", "a1");
    enqueue(p, "guild:a", "a2");
    enqueue(p, "guild:b", "b1");
    let r = post(p, "/v1/queues/roles/groups/guild:a/pause", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!({"queue": "roles", "group": "guild:a", "paused": true, "paused_until_ms": null})
    );
    let (token, _) = lease_one(p, "b1", 60_000);
    assert_eq!(
        on_job(p, "b1", "ack", &format!(r#"{{"lease": "{token}"}}"#)).status,
        204
    );
    let stats = get(p, "/v1/queues/roles").json();
    let a = &stats["groups"]["guild:a"];
    assert_eq!(
        (&a["waiting"], &a["paused"], &a["paused_until_ms"]),
        (
            &serde_json::json!(2),
            &serde_json::json!(true),
            &serde_json::Value::Null
        ),
        "{stats}"
    );
    assert_eq!(stats["paused"], serde_json::json!(false), "{stats}");
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:a", "payload": 3, "id": "a3"}"#,
    );
    assert_eq!(
        (r.status, &r.json()["estimated_start_ms"]),
        (201, &serde_json::Value::Null)
    );
    // Bad pauses change nothing.
    for (path, body, field) in [
        ("groups/guild:a/pause", r#"{"ms": 0}"#, "ms"),
        ("groups/guild:a/pause", r#"{"ms": -1}"#, "ms"),
        ("groups/guild:a/pause", r#"{"ms": 1e400}"#, "ms"),
        ("groups/guild:a/pause", r#"{"ms": 31536000001}"#, "ms"),
        ("groups/guild:a/pause", r#"{"ms": "1h"}"#, "ms"),
        ("groups/guild:a/pause", r#"{"for": 5}"#, "for"),
        ("groups/guild:a/pause", r#"[5]"#, "body"),
        ("groups/guild:a/pause", r#"{"ms": 5"#, "body"),
        ("groups/%07/pause", "", "group"),
        ("pause", r#"{"ms": 0.5}"#, "ms"),
        ("pause", r#"{"ms": 1e400}"#, "ms"),
    ] {
        let r = post(p, &format!("/v1/queues/roles/{path}"), body);
        assert_eq!(
            (r.status, r.error()),
            (400, ("invalid_argument".into(), field.into())),
            "{path} {body}: {}",
            r.body
        );
    }
    let r = post(p, "/v1/queues/nowhere/pause", "");
    assert_eq!(
        (r.status, r.error().0),
        (404, "unknown_queue".into()),
        "{}",
        r.body
    );
    assert_eq!(
        get(p, "/v1/queues/roles").json()["paused"],
        serde_json::json!(false)
    );
    // Resumed: its jobs start in order, on their first attempt.
    let r = post(p, "/v1/queues/roles/groups/guild:a/resume", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["paused"], serde_json::json!(false));
    let jobs = lease(p, r#"{"worker": "w", "max_jobs": 10, "lease_ms": 60000}"#);
    let ids: Vec<String> = jobs.iter().map(|j| text(&j["id"])).collect();
    assert_eq!(ids, ["a1", "a2", "a3"]);
    assert!(
        jobs.iter().all(|j| j["attempt"] == serde_json::json!(1)),
        "{jobs:?}"
    );
    for j in &jobs {
        let body = format!(r#"{{"lease": "{}"}}"#, text(&j["lease"]));
        assert_eq!(on_job(p, &text(&j["id"]), "ack", &body).status, 204);
    }
    // The queue paused for an hour: nothing leased, and it shows.
    let r = post(p, "/v1/queues/roles/pause", r#"{"ms": 3600000}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let until = r.json()["paused_until_ms"].as_u64().expect("an end");
    enqueue(p, "guild:b", "b2");
    assert!(lease(p, r#"{"worker": "w", "max_jobs": 10}"#).is_empty());
    let stats = get(p, "/v1/queues/roles").json();
    assert_eq!(
        (&stats["paused"], stats["paused_until_ms"].as_u64()),
        (&serde_json::json!(true), Some(until)),
        "{stats}"
    );
    // A lease waiting on the paused queue gets its job once the queue is resumed (in its
    // wait by then, or about to be: either way it gets the job).
    let waiting =
        std::thread::spawn(move || lease_waiting(p, r#"{"worker": "w", "wait_ms": 5000}"#));
    let r = post(p, "/v1/queues/roles/resume", "");
    assert_eq!(
        (r.status, &r.json()["paused"]),
        (200, &serde_json::json!(false))
    );
    let jobs = waiting.join().expect("the waiting lease");
    assert_eq!(
        jobs.iter().map(|j| text(&j["id"])).collect::<Vec<_>>(),
        ["b2"]
    );
}

on_memory_and_redis!(
    pausing_and_resuming: pausing_and_resuming_on_memory,
    pausing_and_resuming_on_redis
);

/// A group's policy set over HTTP while jobs wait: a group refused for the hour starts the
/// rest at once under a higher limit; `GET` says where the policy comes from; `DELETE`
/// gives the config's back; bad policies are `400`s naming their field, changing nothing.
fn changing_a_groups_policy(p: u16) {
    for n in 0..3 {
        enqueue(p, "guild:slow", &format!("s{n}"));
    }
    let url = "/v1/queues/roles/groups/guild:slow/policy";
    let r = get(p, url);
    assert_eq!(r.status, 200, "{}", r.body);
    let before = r.json();
    assert_eq!(
        (
            text(&before["source"]),
            text(&before["group"]),
            text(&before["queue"])
        ),
        ("config".into(), "guild:slow".into(), "roles".into())
    );
    assert!(
        text(&before["policy"]).starts_with("sliding_log:"),
        "{before}"
    );
    assert_eq!(
        lease(p, r#"{"worker": "w", "max_jobs": 10, "lease_ms": 60000}"#).len(),
        1
    );
    assert!(lease(p, r#"{"worker": "w", "max_jobs": 10}"#).is_empty());
    for (body, field) in [
        (r#"{"policy": "concurrency:limit=5,lease=30s"}"#, "policy"),
        (r#"{"policy": "gcra:rate=fast"}"#, "policy.rate"),
        (r#"{"policy": "warp:speed=9"}"#, "policy.algorithm"),
        (r#"{}"#, "policy"),
        (r#"{"policy": 5}"#, "policy"),
        (r#"{"policy": "gcra:rate=1/s", "spec": 1}"#, "spec"),
        (r#"["gcra:rate=1/s"]"#, "body"),
    ] {
        let r = http(p, "PUT", url, &[], body.as_bytes());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let (code, named) = r.error();
        assert_eq!(code, "invalid_argument", "{body}: {}", r.body);
        assert!(named.starts_with(field), "{body}: {named} ({})", r.body);
    }
    let r = http(
        p,
        "PUT",
        "/v1/queues/roles/groups/%07/policy",
        &[],
        br#"{"policy": "gcra:rate=1/s"}"#,
    );
    assert_eq!((r.status, r.error().1), (400, "group".into()), "{}", r.body);
    let r = get(p, "/v1/queues/nowhere/groups/g/policy");
    assert_eq!(
        (r.status, r.error().0),
        (404, "unknown_queue".into()),
        "{}",
        r.body
    );
    assert!(lease(p, r#"{"worker": "w", "max_jobs": 10}"#).is_empty());
    // Raised: the two waiting start at once.
    let r = http(
        p,
        "PUT",
        url,
        &[],
        br#"{"policy": "gcra:rate=100/s,burst=10"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(text(&r.json()["source"]), "run_time");
    assert_eq!(text(&r.json()["policy"]), "gcra:rate=100/s,burst=10");
    assert_eq!(text(&get(p, url).json()["source"]), "run_time");
    let jobs = lease(p, r#"{"worker": "w", "max_jobs": 10}"#);
    assert_eq!(
        jobs.iter().map(|j| text(&j["id"])).collect::<Vec<_>>(),
        ["s1", "s2"]
    );
    // Unset: the config's own again.
    let r = delete(p, url);
    assert_eq!(
        (r.status, text(&r.json()["source"])),
        (200, "config".into()),
        "{}",
        r.body
    );
    let r = get(p, "/v1/queues/roles/groups/guild:other/policy");
    assert_eq!(text(&r.json()["source"]), "default", "{}", r.body);
}

on_memory_and_redis!(
    changing_a_groups_policy: changing_a_groups_policy_on_memory,
    changing_a_groups_policy_on_redis
);

/// Deduplication over HTTP: a second job under a live key answers `200` with the first
/// job's id and `"deduplicated": true`, adding nothing (in a batch too); with `replace`,
/// its payload replaces the first's while that one waits, not once it started; a finished
/// first job still deduplicates; bad keys and TTLs are `400`s naming them.
fn deduplicating_jobs(p: u16) {
    let first = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:d", "payload": {"v": 1}, "dedup": {"key": "user-42", "ttl_ms": 3600000}}"#,
    );
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(first.json().get("deduplicated").is_none(), "{}", first.body);
    let id = text(&first.json()["id"]);
    let again = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:d", "payload": {"v": 2}, "dedup": {"key": "user-42", "ttl_ms": 5}}"#,
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        (text(&again.json()["id"]), &again.json()["deduplicated"]),
        (id.clone(), &serde_json::json!(true))
    );
    assert_eq!(
        job(p, &id)["payload"],
        serde_json::json!({"v": 1}),
        "not replaced"
    );
    // Replacing while it waits.
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:d", "payload": {"v": 3}, "dedup": {"key": "user-42", "ttl_ms": 5, "replace": true}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(job(p, &id)["payload"], serde_json::json!({"v": 3}));
    // In a batch, beside a new key.
    let r = post(
        p,
        "/v1/queues/roles/jobs/batch",
        r#"[{"group": "guild:d", "payload": 4, "dedup": {"key": "user-42", "ttl_ms": 5}},
            {"group": "guild:d", "payload": 5, "dedup": {"key": "user-43", "ttl_ms": 5}}]"#,
    );
    let entries = r.json();
    assert_eq!(
        (
            &entries[0]["status"],
            &entries[0]["deduplicated"],
            text(&entries[0]["id"])
        ),
        (
            &serde_json::json!(200),
            &serde_json::json!(true),
            id.clone()
        ),
        "{entries}"
    );
    assert_eq!(entries[1]["status"], serde_json::json!(201), "{entries}");
    assert_eq!(counts(p), [Some(0), Some(2), Some(0), Some(0)]);
    // Started: no more replacing; finished: still deduplicated, as `finished`.
    let leased = lease(p, r#"{"worker": "w", "max_jobs": 1, "lease_ms": 60000}"#);
    assert_eq!(
        (text(&leased[0]["id"]), &leased[0]["payload"]),
        (id.clone(), &serde_json::json!({"v": 3}))
    );
    let token = text(&leased[0]["lease"]);
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:d", "payload": 6, "dedup": {"key": "user-42", "ttl_ms": 5, "replace": true}}"#,
    );
    assert_eq!(text(&r.json()["state"]), "active", "{}", r.body);
    assert_eq!(job(p, &id)["payload"], serde_json::json!({"v": 3}));
    assert_eq!(
        on_job(p, &id, "ack", &format!(r#"{{"lease": "{token}"}}"#)).status,
        204
    );
    let r = post(
        p,
        "/v1/queues/roles/jobs",
        r#"{"group": "guild:d", "payload": 7, "dedup": {"key": "user-42", "ttl_ms": 5}}"#,
    );
    assert_eq!(
        (r.status, text(&r.json()["id"]), text(&r.json()["state"])),
        (200, id.clone(), "finished".into()),
        "{}",
        r.body
    );
    for (dedup, field) in [
        (r#"{"ttl_ms": 5}"#, "dedup.key"),
        (r#"{"key": "", "ttl_ms": 5}"#, "dedup.key"),
        (r#"{"key": "a\u0007", "ttl_ms": 5}"#, "dedup.key"),
        (r#"{"key": "k"}"#, "dedup.ttl_ms"),
        (r#"{"key": "k", "ttl_ms": 0}"#, "dedup.ttl_ms"),
        (r#"{"key": "k", "ttl_ms": 31536000001}"#, "dedup.ttl_ms"),
        (r#"{"key": "k", "ttl_ms": 1e400}"#, "dedup.ttl_ms"),
        (r#"{"key": "k", "ttl_ms": 5, "replace": "yes"}"#, "dedup"),
        (r#"{"key": "k", "ttl_ms": 5, "colour": 1}"#, "dedup"),
        (r#""k""#, "dedup"),
    ] {
        let body = format!(r#"{{"group": "guild:d", "payload": 1, "dedup": {dedup}}}"#);
        let r = post(p, "/v1/queues/roles/jobs", &body);
        assert_eq!(r.status, 400, "{dedup}: {}", r.body);
        let (code, named) = r.error();
        assert_eq!(code, "invalid_argument", "{dedup}: {}", r.body);
        assert!(named.starts_with(field), "{dedup}: {named}: {}", r.body);
    }
    assert_eq!(counts(p), [Some(0), Some(1), Some(0), Some(0)]);
}

on_memory_and_redis!(
    deduplicating_jobs: deduplicating_jobs_on_memory,
    deduplicating_jobs_on_redis
);

/// Priorities and costs over HTTP: within a group jobs start by priority, then in order;
/// across groups, the one whose next job is more urgent first; a job's cost counts against
/// its group's policy, one its policies can never admit is a `409 conflict` naming `cost`,
/// and a waiting one whose policy changed to one that can never admit it goes to the dead
/// set, saying why; bad priorities and costs are `400`s naming them, adding nothing.
fn prioritising_and_costing_jobs(p: u16) {
    let put = |body: &str| post(p, "/v1/queues/roles/jobs", body);
    for (payload, priority) in [(1, Some(5)), (2, None), (3, Some(9)), (4, Some(0))] {
        let body = match priority {
            Some(n) => format!(r#"{{"group": "guild:p", "payload": {payload}, "priority": {n}}}"#),
            None => format!(r#"{{"group": "guild:p", "payload": {payload}}}"#),
        };
        assert_eq!(put(&body).status, 201);
    }
    let started = lease(p, r#"{"worker": "w", "max_jobs": 4, "lease_ms": 60000}"#);
    let payloads: Vec<_> = started.iter().map(|j| j["payload"].clone()).collect();
    assert_eq!(payloads, [2, 4, 1, 3].map(|n| serde_json::json!(n)));
    // Across groups: b's next job is more urgent than a's, enqueued first.
    let a = put(r#"{"group": "guild:a", "payload": "a", "priority": 3}"#);
    let b = put(r#"{"group": "guild:b", "payload": "b", "priority": 1}"#);
    assert_eq!((a.status, b.status), (201, 201));
    let shown = job(p, &text(&a.json()["id"]));
    assert_eq!(shown["priority"], serde_json::json!(3), "{shown}");
    assert!(
        shown.get("cost").is_none(),
        "the default is not shown: {shown}"
    );
    let first = lease(p, r#"{"worker": "w", "max_jobs": 1, "lease_ms": 60000}"#);
    assert_eq!(first[0]["payload"], serde_json::json!("b"));
    let second = lease(p, r#"{"worker": "w", "max_jobs": 1, "lease_ms": 60000}"#);
    assert_eq!(second[0]["payload"], serde_json::json!("a"));
    // Costs: 3 of a limit of 10 each, so the fourth waits for the next window.
    let url = "/v1/queues/roles/groups/guild:c/policy";
    let r = http(
        p,
        "PUT",
        url,
        &[],
        br#"{"policy": "fixed_window:limit=10,window=1h"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let mut ids = Vec::new();
    for n in 0..4 {
        let r = put(&format!(
            r#"{{"group": "guild:c", "payload": {n}, "cost": 3}}"#
        ));
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(text(&r.json()["id"]));
    }
    assert_eq!(job(p, &ids[0])["cost"], serde_json::json!(3));
    let started = lease(p, r#"{"worker": "w", "max_jobs": 10, "lease_ms": 60000}"#);
    assert_eq!(started.len(), 3, "{started:?}");
    // More than the group's policy can ever admit a start: a conflict, naming `cost`.
    let r = put(r#"{"group": "guild:slow", "payload": 1, "cost": 2}"#);
    assert_eq!(r.status, 409, "{}", r.body);
    let (code, named) = r.error();
    assert_eq!(
        (code.as_str(), named.as_str()),
        ("conflict", "cost"),
        "{}",
        r.body
    );
    assert!(r.body.contains("at most 1"), "{}", r.body);
    // The policy lowered below the waiting job's cost: it dies at the head of its line.
    let r = http(
        p,
        "PUT",
        url,
        &[],
        br#"{"policy": "fixed_window:limit=2,window=1s"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(lease(p, r#"{"worker": "w", "max_jobs": 10}"#).is_empty());
    let dead = job(p, &ids[3]);
    assert_eq!(text(&dead["state"]), "dead", "{dead}");
    assert!(text(&dead["last_error"]).contains("its cost, 3,"), "{dead}");
    assert_eq!(dead["attempts"], serde_json::json!(0), "{dead}");
    let before = counts(p);
    for (field, value) in [
        ("priority", "10"),
        ("priority", "-1"),
        ("priority", "1.5"),
        ("priority", "1e400"),
        ("priority", r#""1""#),
        ("priority", "256"),
        ("cost", "0"),
        ("cost", "1000001"),
        ("cost", "-3"),
        ("cost", "2.5"),
        ("cost", "1e400"),
        ("cost", "18446744073709551616"),
    ] {
        let body = format!(r#"{{"group": "guild:p", "payload": 1, "{field}": {value}}}"#);
        let r = put(&body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let (code, named) = r.error();
        assert_eq!(code, "invalid_argument", "{body}: {}", r.body);
        assert_eq!(named, field, "{body}: {}", r.body);
    }
    assert_eq!(counts(p), before, "nothing added");
}

on_memory_and_redis!(
    prioritising_and_costing_jobs: prioritising_and_costing_jobs_on_memory,
    prioritising_and_costing_jobs_on_redis
);

/// A cost more than its policy can ever admit, on the real service: a `409 conflict` naming
/// the cost (`limits[1].cost` in a set, an entry's own in a batch), saying the most the
/// policy admits, that takes nothing: a decision's key keeps its whole burst, no lease is
/// held, no job is added.
fn a_cost_beyond_the_policy_is_a_conflict_that_takes_nothing(p: u16) {
    let conflict = |r: &Reply, field: &str, most: &str| {
        assert_eq!(r.status, 409, "{}", r.body);
        assert_eq!(
            r.error(),
            ("conflict".to_string(), field.to_string()),
            "{}",
            r.body
        );
        assert!(r.body.contains(most), "{}", r.body);
    };
    let gcra = "gcra:rate=10/s,burst=10";
    // A decision: cost 11 against a burst of 10, with `limit`.
    let decide = |key: &str, cost: u64| {
        let body =
            format!(r#"{{"policy": "{gcra}", "key": "{key}", "op": "limit", "cost": {cost}}}"#);
        post(p, "/v1/decisions", &body)
    };
    conflict(&decide("k", 11), "cost", "at most 10");
    // A set: the second limit's cost is its own field.
    let set = format!(
        r#"{{"limits": [{{"policy": "{gcra}", "key": "s"}},
            {{"policy": "fixed_window:limit=3,window=1h", "key": "t", "cost": 4}}]}}"#
    );
    conflict(
        &post(p, "/v1/decisions", &set),
        "limits[1].cost",
        "at most 3",
    );
    // A paced set whose limits' free slots never meet: a conflict with its policies too.
    let apart = r#"{"op": "pace", "cost": 1718, "limits": [
        {"policy": "fixed_window:limit=7980,window=5h", "key": "m"},
        {"policy": "gcra:rate=5/s,burst=3106", "key": "n", "cost": 1},
        {"policy": "gcra:rate=35/h,burst=8", "key": "o", "cost": 707}]}"#;
    conflict(&post(p, "/v1/decisions", apart), "op", "do not meet");
    let whole =
        r#"{"policy": "gcra:rate=5/s,burst=3106", "key": "n", "op": "limit", "cost": 3106}"#;
    let r = post(p, "/v1/decisions", whole);
    assert_eq!(
        (r.status, &r.json()["remaining"]),
        (200, &serde_json::json!(0)),
        "{}",
        r.body
    );
    // A batch: the entry's own status and error, the other entry decided.
    let batch = format!(
        r#"[{{"policy": "{gcra}", "key": "b", "op": "limit", "cost": 11}},
            {{"policy": "{gcra}", "key": "b2", "op": "limit"}}]"#
    );
    let r = post(p, "/v1/decisions/batch", &batch);
    assert_eq!(r.status, 200, "{}", r.body);
    let entries = r.json();
    assert_eq!(entries[0]["status"], 409, "{entries}");
    assert_eq!(entries[0]["error"]["code"], "conflict", "{entries}");
    assert_eq!(entries[0]["error"]["field"], "cost", "{entries}");
    assert_eq!(entries[1]["status"], 200, "{entries}");
    // Nothing was taken: every key refused above still admits its whole burst at once.
    for key in ["k", "s", "b"] {
        let r = decide(key, 10);
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        assert_eq!(r.json()["remaining"], 0, "{key}: {}", r.body);
    }
    let window =
        r#"{"policy": "fixed_window:limit=3,window=1h", "key": "t", "op": "limit", "cost": 3}"#;
    assert_eq!(post(p, "/v1/decisions", window).status, 200);
    // A concurrency lease of more than the limit: none held, so the limit's worth is.
    let slots = "concurrency:limit=2,lease=30s";
    let take = |cost: u64| {
        let body = format!(r#"{{"policy": "{slots}", "key": "c", "cost": {cost}}}"#);
        post(p, "/v1/leases", &body)
    };
    conflict(&take(3), "cost", "at most 2");
    let r = take(2);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["remaining"], 0, "{}", r.body);
    // An enqueue of more than the group's policy admits a start, alone and in a batch.
    let before = counts(p);
    let job = r#"{"group": "guild:slow", "payload": 1, "cost": 2}"#;
    conflict(&post(p, "/v1/queues/roles/jobs", job), "cost", "at most 1");
    assert_eq!(counts(p), before, "nothing added");
    let jobs = format!(r#"[{job}, {{"group": "guild:slow", "payload": 2}}]"#);
    let r = post(p, "/v1/queues/roles/jobs/batch", &jobs);
    assert_eq!(r.status, 200, "{}", r.body);
    let entries = r.json();
    assert_eq!(entries[0]["status"], 409, "{entries}");
    assert_eq!(entries[0]["error"]["code"], "conflict", "{entries}");
    assert_eq!(entries[0]["error"]["field"], "cost", "{entries}");
    assert_eq!(entries[1]["status"], 201, "{entries}");
    let [scheduled, waiting, active, dead] = counts(p);
    assert_eq!(
        [scheduled, waiting.map(|n| n - 1), active, dead],
        before,
        "only the job within its policy added"
    );
}

on_memory_and_redis!(
    a_cost_beyond_the_policy_is_a_conflict_that_takes_nothing:
        a_cost_beyond_the_policy_is_a_conflict_on_memory,
    a_cost_beyond_the_policy_is_a_conflict_on_redis
);

/// Jobs listed by state over HTTP: waiting ones by group then place in line (one group's
/// line with `group`), active and dead ones; bad listings are `400`s naming the field.
fn listing_jobs(p: u16) {
    for (group, payload, priority) in [("guild:y", 1, 0), ("guild:x", 2, 4), ("guild:x", 3, 0)] {
        let body =
            format!(r#"{{"group": "{group}", "payload": {payload}, "priority": {priority}}}"#);
        assert_eq!(post(p, "/v1/queues/roles/jobs", &body).status, 201);
    }
    let list = |query: &str| {
        let r = get(p, &format!("/v1/queues/roles/jobs?{query}"));
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        r.json()["jobs"]
            .as_array()
            .map(|jobs| {
                jobs.iter()
                    .map(|j| j["payload"].clone())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let n = |v: &[i64]| v.iter().map(|n| serde_json::json!(n)).collect::<Vec<_>>();
    assert_eq!(list("state=waiting"), n(&[3, 2, 1]));
    assert_eq!(list("state=waiting&group=guild:x"), n(&[3, 2]));
    assert_eq!(list("state=waiting&offset=1&limit=1"), n(&[2]));
    assert_eq!(list("state=waiting&offset=18446744073709551615"), n(&[]));
    assert_eq!(list("state=waiting&group=guild:none"), n(&[]));
    let leased = lease(p, r#"{"worker": "w", "max_jobs": 1, "lease_ms": 60000}"#);
    assert_eq!(list("state=active"), [leased[0]["payload"].clone()]);
    let id = text(&leased[0]["id"]);
    let token = text(&leased[0]["lease"]);
    let body = format!(r#"{{"lease": "{token}", "error": "bad", "fatal": true}}"#);
    assert_eq!(on_job(p, &id, "fail", &body).status, 204);
    assert_eq!(list("state=dead"), [leased[0]["payload"].clone()]);
    assert_eq!(list("state=active"), n(&[]));
    assert_eq!(list("state=scheduled"), n(&[]));
    for (query, field) in [
        ("", "state"),
        ("state=finished", "state"),
        ("state=gone", "state"),
        ("state=dead&group=guild:x", "group"),
        ("state=waiting&group=%07", "group"),
        ("state=waiting&limit=0", "limit"),
        ("state=waiting&limit=1001", "limit"),
        ("state=waiting&offset=-1", "query"),
        ("state=waiting&colour=red", "query"),
    ] {
        let r = get(p, &format!("/v1/queues/roles/jobs?{query}"));
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        assert_eq!(r.error().1, field, "{query}: {}", r.body);
    }
}

on_memory_and_redis!(
    listing_jobs: listing_jobs_on_memory,
    listing_jobs_on_redis
);

/// Results, progress and retention over HTTP: a queue that keeps completed jobs answers
/// them with their result, progress and end; the oldest beyond `keep_completed` leave; a
/// repeated ack of a completed job is `204`; the dead set keeps at most `keep_dead`; bad
/// reports are `400`s naming the field.
fn keeping_results(p: u16) {
    let mut ids = Vec::new();
    for n in 0..3 {
        let body = format!(r#"{{"group": "g", "payload": {n}}}"#);
        let r = post(p, "/v1/queues/kept/jobs", &body);
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(text(&r.json()["id"]));
    }
    let leased = {
        let r = post(
            p,
            "/v1/queues/kept/leases",
            r#"{"worker": "w", "max_jobs": 3, "lease_ms": 60000}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["jobs"].as_array().cloned().unwrap_or_default()
    };
    assert_eq!(leased.len(), 3);
    let token = |n: usize| text(&leased[n]["lease"]);
    let at = |id: &str, what: &str, body: &str| {
        post(p, &format!("/v1/queues/kept/jobs/{id}/{what}"), body)
    };
    let body = format!(
        r#"{{"lease": "{}", "progress": {{"rows": 500}}}}"#,
        token(0)
    );
    assert_eq!(at(&ids[0], "progress", &body).status, 204);
    let seen = get(p, &format!("/v1/queues/kept/jobs/{}", ids[0])).json();
    assert_eq!(seen["progress"], serde_json::json!({"rows": 500}), "{seen}");
    for (n, result) in [
        (0, r#""result": {"granted": true}, "#),
        (1, ""),
        (2, r#""result": [2], "#),
    ] {
        let body = format!(r#"{{{result}"lease": "{}"}}"#, token(n));
        let r = at(&ids[n], "ack", &body);
        assert_eq!(r.status, 204, "{}", r.body);
    }
    // The first pushed out by the third (keep_completed = 2); the second and third kept.
    assert_eq!(
        get(p, &format!("/v1/queues/kept/jobs/{}", ids[0])).status,
        404
    );
    let done = get(p, &format!("/v1/queues/kept/jobs/{}", ids[2])).json();
    assert_eq!(
        (text(&done["state"]), &done["result"]),
        ("completed".into(), &serde_json::json!([2])),
        "{done}"
    );
    assert!(done["finished_ms"].as_u64().is_some(), "{done}");
    let second = get(p, &format!("/v1/queues/kept/jobs/{}", ids[1])).json();
    assert!(second.get("result").is_none(), "{second}");
    // A repeated ack of a completed job: as the first answered.
    let body = format!(r#"{{"lease": "{}"}}"#, token(2));
    assert_eq!(at(&ids[2], "ack", &body).status, 204);
    let r = get(p, "/v1/queues/kept/jobs?state=completed");
    let listed: Vec<String> = r.json()["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().map(|j| text(&j["id"])).collect())
        .unwrap_or_default();
    assert_eq!(listed, [ids[1].clone(), ids[2].clone()], "{}", r.body);
    assert_eq!(
        get(p, "/v1/queues/kept").json()["completed"],
        serde_json::json!(2)
    );
    // Enqueueing a kept job's id again answers it.
    let r = post(
        p,
        "/v1/queues/kept/jobs",
        r#"{"group": "g", "payload": 9, "id": "order-1"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let leased = post(
        p,
        "/v1/queues/kept/leases",
        r#"{"worker": "w", "lease_ms": 60000}"#,
    )
    .json();
    let token = text(&leased["jobs"][0]["lease"]);
    assert_eq!(
        at("order-1", "ack", &format!(r#"{{"lease": "{token}"}}"#)).status,
        204
    );
    let r = post(
        p,
        "/v1/queues/kept/jobs",
        r#"{"group": "g", "payload": 9, "id": "order-1"}"#,
    );
    assert_eq!(
        (r.status, text(&r.json()["state"])),
        (200, "completed".into()),
        "{}",
        r.body
    );
    // The dead set keeps 1: the older death leaves.
    for id in ["d1", "d2"] {
        let body = format!(r#"{{"group": "g", "payload": 0, "id": "{id}"}}"#);
        assert_eq!(post(p, "/v1/queues/kept/jobs", &body).status, 201);
        let leased = post(p, "/v1/queues/kept/leases", r#"{"worker": "w"}"#).json();
        let body = format!(
            r#"{{"lease": "{}", "fatal": true}}"#,
            text(&leased["jobs"][0]["lease"])
        );
        assert_eq!(at(id, "fail", &body).status, 204);
    }
    assert_eq!(get(p, "/v1/queues/kept/jobs/d1").status, 404);
    assert_eq!(
        text(&get(p, "/v1/queues/kept/jobs/d2").json()["state"]),
        "dead"
    );
    // Bad reports change nothing.
    let body = r#"{"group": "g", "payload": 0, "id": "busy"}"#;
    assert_eq!(post(p, "/v1/queues/kept/jobs", body).status, 201);
    let leased = post(
        p,
        "/v1/queues/kept/leases",
        r#"{"worker": "w", "lease_ms": 60000}"#,
    )
    .json();
    let token = text(&leased["jobs"][0]["lease"]);
    for (body, status, field) in [
        (format!(r#"{{"lease": "{token}"}}"#), 400, "progress"),
        (r#"{"progress": 1}"#.to_string(), 400, "lease"),
        (
            format!(r#"{{"lease": "{token}", "progress": 1, "colour": 2}}"#),
            400,
            "colour",
        ),
        (
            format!(
                r#"{{"lease": "{token}", "progress": "{}"}}"#,
                "x".repeat(2048)
            ),
            400,
            "progress",
        ),
        (
            format!(r#"{{"lease": "{}", "progress": 1}}"#, "0".repeat(48)),
            409,
            "lease",
        ),
    ] {
        let r = at("busy", "progress", &body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.error().1.starts_with(field), "{body}: {}", r.body);
    }
    // Handed back: waiting again, no attempt spent; release with anything else is refused.
    let body = format!(r#"{{"lease": "{token}", "release": true, "fatal": true}}"#);
    let r = at("busy", "fail", &body);
    assert_eq!(
        (r.status, r.error().1),
        (400, "release".into()),
        "{}",
        r.body
    );
    let r = at(
        "busy",
        "fail",
        &format!(r#"{{"lease": "{token}", "release": true}}"#),
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let back = get(p, "/v1/queues/kept/jobs/busy").json();
    assert_eq!(
        (text(&back["state"]), &back["attempts"]),
        ("waiting".into(), &serde_json::json!(0)),
        "{back}"
    );
    let leased = post(
        p,
        "/v1/queues/kept/leases",
        r#"{"worker": "w", "lease_ms": 60000}"#,
    );
    let token = text(&leased.json()["jobs"][0]["lease"]);
    let big = format!(
        r#"{{"lease": "{token}", "result": "{}"}}"#,
        "x".repeat(2048)
    );
    let r = at("busy", "ack", &big);
    assert_eq!(
        (r.status, r.error().1),
        (400, "result".into()),
        "{}",
        r.body
    );
    let busy = get(p, "/v1/queues/kept/jobs/busy").json();
    assert_eq!(text(&busy["state"]), "active", "{busy}");
    assert!(busy.get("progress").is_none(), "{busy}");
}

on_memory_and_redis!(
    keeping_results: keeping_results_on_memory,
    keeping_results_on_redis
);

/// Schedules over HTTP: the config file's is listed; one put, read, put again unchanged
/// (its next tick kept), removed; bad ones are `400`s naming their field.
fn scheduling_jobs(p: u16) {
    let r = get(p, "/v1/queues/roles/schedules");
    assert_eq!(r.status, 200, "{}", r.body);
    let listed = r.json();
    assert_eq!(
        listed["schedules"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let yearly = &listed["schedules"][0];
    assert_eq!(
        (
            text(&yearly["name"]),
            text(&yearly["timezone"]),
            &yearly["payload"]
        ),
        (
            "new-year".into(),
            "Europe/Paris".into(),
            &serde_json::json!({"kind": "yearly"})
        )
    );
    let url = "/v1/queues/roles/schedules/nightly";
    let body = r#"{"cron": "0 3 * * *", "group": "reports", "payload": {"kind": "nightly"}}"#;
    let r = http(p, "PUT", url, &[], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let kept = r.json();
    let next = kept["next_ms"].as_u64().expect("a next tick");
    assert_eq!(
        (text(&kept["cron"]), text(&kept["timezone"])),
        ("0 3 * * *".into(), "UTC".into())
    );
    // 03:00 UTC: a whole number of days after the epoch, plus three hours.
    assert_eq!(next % 86_400_000, 3 * 3_600_000);
    assert_eq!(get(p, url).json(), kept);
    let again = http(p, "PUT", url, &[], body.as_bytes());
    assert_eq!(again.json()["next_ms"].as_u64(), Some(next));
    for (path, body, field) in [
        ("nightly", r#"{"cron": "at three", "group": "g"}"#, "cron"),
        ("nightly", r#"{"cron": "0 0 30 2 *", "group": "g"}"#, "cron"),
        (
            "nightly",
            r#"{"cron": "0 3 * * *", "group": "g", "timezone": "Mars/Olympus"}"#,
            "timezone",
        ),
        ("nightly", r#"{"cron": "0 3 * * *"}"#, "group"),
        ("nightly", r#"{"group": "g"}"#, "cron"),
        (
            "nightly",
            r#"{"cron": "0 3 * * *", "group": "g", "every": 1}"#,
            "every",
        ),
        ("a%20b", r#"{"cron": "0 3 * * *", "group": "g"}"#, "name"),
    ] {
        let r = http(
            p,
            "PUT",
            &format!("/v1/queues/roles/schedules/{path}"),
            &[],
            body.as_bytes(),
        );
        assert_eq!(
            (r.status, r.error()),
            (400, ("invalid_argument".into(), field.into())),
            "{body}: {}",
            r.body
        );
    }
    let big = format!(
        r#"{{"cron": "0 3 * * *", "group": "g", "payload": "{}"}}"#,
        "x".repeat(2000)
    );
    let r = http(p, "PUT", url, &[], big.as_bytes());
    assert_eq!(
        (r.status, r.error().1),
        (400, "payload".into()),
        "{}",
        r.body
    );
    assert_eq!(
        get(p, url).json()["next_ms"].as_u64(),
        Some(next),
        "unchanged"
    );
    assert_eq!(delete(p, url).status, 204);
    let r = delete(p, url);
    assert_eq!(
        (r.status, r.error().0),
        (404, "unknown_schedule".into()),
        "{}",
        r.body
    );
    assert_eq!(get(p, url).status, 404);
}

on_memory_and_redis!(
    scheduling_jobs: scheduling_jobs_on_memory,
    scheduling_jobs_on_redis
);

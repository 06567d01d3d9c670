//! `GET /v1/queues/{queue}/events` on the real binary: the queue's changes as Server-Sent
//! Events, filtered as asked, from every service sharing a Redis, a short answer saying
//! what to send for a client that does not take a stream, and ended when the service
//! stops.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{exits_cleanly, http, post, signal, start, write, Service};
use serde_json::Value;

const CONFIG: &str = r#"
[queues.roles]
group_policy = "gcra:rate=1000/s,burst=1000"
max_attempts = 1
"#;

fn service() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config]);
    (dir, s)
}

/// An open event stream: its frames as they come (chunked transfer, de-chunked here).
struct Stream {
    reader: BufReader<TcpStream>,
    /// What came and is not a whole frame yet.
    pending: String,
}

impl Stream {
    /// Opens `path` with `Accept: text/event-stream`; checks the answer is a stream.
    fn open(port: u16, path: &str) -> Stream {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        // A guard against a test that would hang: a frame comes well within this.
        tcp.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n");
        tcp.write_all(request.as_bytes()).expect("send");
        let mut reader = BufReader::new(tcp);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("a head line");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("content-type: text/event-stream"), "{head}");
        assert!(lower.contains("transfer-encoding: chunked"), "{head}");
        assert!(lower.contains("cache-control: no-cache"), "{head}");
        let mut stream = Stream {
            reader,
            pending: String::new(),
        };
        // The first frame says the stream is open: events from here on are told.
        let first = stream.frame().expect("the opening comment");
        assert!(first.starts_with(':'), "{first}");
        stream
    }

    /// The next whole frame (without its blank line); `None` once the stream ended.
    fn frame(&mut self) -> Option<String> {
        loop {
            if let Some((frame, rest)) = self.pending.split_once("\n\n") {
                let frame = frame.to_string();
                self.pending = rest.to_string();
                return Some(frame);
            }
            let mut size = String::new();
            if self.reader.read_line(&mut size).ok()? == 0 {
                return None;
            }
            let n = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
            if n == 0 {
                return None;
            }
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).ok()?;
            self.pending
                .push_str(std::str::from_utf8(&chunk[..n]).expect("UTF-8"));
        }
    }

    /// The next event's JSON, skipping comments.
    fn event(&mut self) -> Value {
        loop {
            let frame = self.frame().expect("the stream goes on");
            if frame.starts_with(':') {
                continue;
            }
            let data = frame
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("a data frame: {frame:?}"));
            assert!(!data.contains('\n'), "one data line: {frame:?}");
            return serde_json::from_str(data).expect("JSON");
        }
    }
}

fn enqueue(port: u16, group: &str, id: &str) {
    let body = format!(r#"{{"group": "{group}", "payload": {{"n": 1}}, "id": "{id}"}}"#);
    let r = post(port, "/v1/queues/roles/jobs", &body);
    assert_eq!(r.status, 201, "{id}: {}", r.body);
}

/// Leases up to 10 jobs as `worker`: (id, lease) of each.
fn lease(port: u16, worker: &str) -> Vec<(String, String)> {
    let body = format!(r#"{{"worker": "{worker}", "max_jobs": 10}}"#);
    let r = post(port, "/v1/queues/roles/leases", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (s(&j["id"]), s(&j["lease"]))
        })
        .collect()
}

fn ack(port: u16, id: &str, lease: &str) {
    let r = post(
        port,
        &format!("/v1/queues/roles/jobs/{id}/ack"),
        &format!(r#"{{"lease": "{lease}"}}"#),
    );
    assert_eq!(r.status, 204, "{}", r.body);
}

/// Each change of a job's life, told in order with what it carries.
fn telling_a_jobs_life(port: u16) {
    let mut events = Stream::open(port, "/v1/queues/roles/events");
    enqueue(port, "guild:1", "a");
    let leased = lease(port, "worker-1");
    ack(port, &leased[0].0, &leased[0].1);
    enqueue(port, "guild:1", "b");
    let leased = lease(port, "worker-1");
    let fail = post(
        port,
        "/v1/queues/roles/jobs/b/fail",
        &format!(r#"{{"lease": "{}", "error": "upstream 500"}}"#, leased[0].1),
    );
    assert_eq!(fail.status, 204, "{}", fail.body);
    let pause = post(
        port,
        "/v1/queues/roles/groups/guild:2/pause",
        r#"{"ms": 5000}"#,
    );
    assert_eq!(pause.status, 200, "{}", pause.body);

    let enqueued = events.event();
    assert_eq!(enqueued["event"], "enqueued");
    assert_eq!(enqueued["id"], "a");
    assert_eq!(enqueued["group"], "guild:1");
    assert!(enqueued["time_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let started = events.event();
    assert_eq!(started["event"], "started");
    assert_eq!(started["attempt"], 1);
    assert_eq!(started["worker"], "worker-1");
    assert_eq!(events.event()["event"], "acked");
    let kinds: Vec<Value> = (0..4).map(|_| events.event()["event"].clone()).collect();
    assert_eq!(kinds, ["enqueued", "started", "failed", "dead"]);
    let paused = events.event();
    assert_eq!(paused["event"], "paused");
    assert_eq!(paused["group"], "guild:2");
    assert!(paused["id"].is_null());
    let until = paused["paused_until_ms"].as_u64().unwrap();
    assert_eq!(until, paused["time_ms"].as_u64().unwrap() + 5_000);
}

/// Filters pass only what they name; bad ones and a client that takes no stream are
/// refused, naming the field.
fn filtering_and_refusing(port: u16) {
    let mut acked = Stream::open(port, "/v1/queues/roles/events?event=acked&group=guild:2");
    enqueue(port, "guild:1", "f1");
    enqueue(port, "guild:2", "f2");
    let leased = lease(port, "w");
    assert_eq!(leased.len(), 2);
    for (id, lease) in &leased {
        // guild:1's first: a filter that let it through would show it first.
        if id == "f1" {
            ack(port, id, lease);
        }
    }
    for (id, lease) in &leased {
        if id == "f2" {
            ack(port, id, lease);
        }
    }
    let e = acked.event();
    assert_eq!(
        (e["event"].as_str(), e["id"].as_str()),
        (Some("acked"), Some("f2"))
    );

    let refused = |path: &str, headers: &[(&str, &str)]| {
        let r = http(port, "GET", path, headers, b"");
        (r.status, r.error())
    };
    let stream = [("Accept", "text/event-stream")];
    // A client that reads whole answers is told how to follow, and the answer ends.
    for headers in [
        &[][..],
        &[("Accept", "*/*")][..],
        &[("Accept", "application/json")][..],
    ] {
        let r = http(port, "GET", "/v1/queues/roles/events", headers, b"");
        assert_eq!(r.status, 200, "{headers:?}");
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert!(
            r.body.contains("send Accept: text/event-stream"),
            "{}",
            r.body
        );
        assert!(
            r.body.lines().all(|l| l.is_empty() || l.starts_with(':')),
            "{}",
            r.body
        );
    }
    for (query, named) in [
        ("event=started,bogus", "event"),
        ("event=", "event"),
        ("group=%00", "group"),
        ("since=1", "query"),
    ] {
        let (status, (code, field)) = refused(&format!("/v1/queues/roles/events?{query}"), &stream);
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_argument"),
            "{query}"
        );
        assert_eq!(field, named, "{query}");
    }
    // A HEAD answers the head alone, at once.
    let head = http(port, "HEAD", "/v1/queues/roles/events", &stream, b"");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert!(head.body.is_empty(), "{}", head.body);
    let (status, (code, _)) = refused("/v1/queues/nope/events", &stream);
    assert_eq!((status, code.as_str()), (404, "unknown_queue"));
    let (status, _) = refused("/v1/queues/%2e%2e/events", &stream);
    assert_eq!(status, 404);
}

#[test]
fn a_jobs_life_is_told_on_memory() {
    let (_dir, s) = service();
    telling_a_jobs_life(s.port);
}

#[test]
fn a_jobs_life_is_told_on_redis() {
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config, "--store", &redis.url()]);
    telling_a_jobs_life(s.port);
}

#[test]
fn filters_and_refusals_on_memory() {
    let (_dir, s) = service();
    filtering_and_refusing(s.port);
}

/// A listener on one service hears what workers do through another sharing the Redis.
#[test]
fn two_services_sharing_a_redis_tell_each_others_events() {
    let redis = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let one = start(&["--config", &config, "--store", &redis.url()]);
    let two = start(&["--config", &config, "--store", &redis.url()]);
    let mut heard = Stream::open(one.port, "/v1/queues/roles/events");
    enqueue(two.port, "guild:7", "shared");
    let leased = lease(two.port, "far-worker");
    ack(two.port, &leased[0].0, &leased[0].1);
    let kinds: Vec<(Value, Value)> = (0..3)
        .map(|_| {
            let e = heard.event();
            (e["event"].clone(), e["id"].clone())
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("enqueued".into(), "shared".into()),
            ("started".into(), "shared".into()),
            ("acked".into(), "shared".into())
        ]
    );
}

/// A stream open when the service is told to stop ends, and the service exits.
#[test]
fn an_open_stream_ends_when_the_service_stops() {
    let (_dir, mut s) = service();
    let mut events = Stream::open(s.port, "/v1/queues/roles/events");
    signal(&s, "TERM");
    while let Some(frame) = events.frame() {
        assert!(
            frame.starts_with(':'),
            "only comments before the end: {frame}"
        );
    }
    exits_cleanly(&mut s);
}

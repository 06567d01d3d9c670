//! `paceline serve` end to end: the real binary on a free port, spoken to over HTTP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{exits_cleanly, http, parse, post, signal, start, write};

const CONFIG: &str = r#"
allow_inline_policies = false

[policies.discord-roles]
algorithm = "sliding_log"
limit = 2
window = "10s"
"#;

#[test]
fn decisions_headers_batch_reset_policies_and_health() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config]);
    let ask = r#"{"policy": "discord-roles", "key": "guild:42", "op": "limit"}"#;
    for remaining in [1, 0] {
        let r = post(s.port, "/v1/decisions", ask);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["remaining"], remaining);
        assert_eq!(r.json()["policy"], "discord-roles");
    }
    let limited = post(s.port, "/v1/decisions", ask);
    assert_eq!(limited.status, 429);
    assert_eq!(limited.json()["allowed"], false);
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry));
    assert_eq!(
        limited.header("ratelimit-policy"),
        Some("\"discord-roles\";q=2")
    );
    assert!(limited
        .header("ratelimit")
        .is_some_and(|v| v.starts_with("\"discord-roles\";r=0;t=")));

    // Batch: in order, each with its own status.
    let batch = post(
        s.port,
        "/v1/decisions/batch",
        r#"[{"policy": "discord-roles", "key": "guild:42", "op": "peek"},
            {"policy": "discord-roles", "key": "guild:7"},
            {"policy": "nope", "key": "x"},
            {"policy": "discord-roles", "key": ""}]"#,
    );
    assert_eq!(batch.status, 200);
    let items = batch.json();
    let statuses: Vec<u64> = items
        .as_array()
        .expect("an array")
        .iter()
        .map(|i| i["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [429, 200, 404, 400]);
    assert_eq!(items[2]["error"]["code"], "unknown_policy");

    // Reset a key: it admits again.
    assert_eq!(
        http(
            s.port,
            "DELETE",
            "/v1/keys/discord-roles/guild:42",
            &[],
            b""
        )
        .status,
        204
    );
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 200);
    assert_eq!(
        http(s.port, "DELETE", "/v1/keys/nope/k", &[], b"")
            .error()
            .0,
        "unknown_policy"
    );

    let policies = http(s.port, "GET", "/v1/policies", &[], b"").json();
    assert_eq!(
        policies["policies"]["discord-roles"]["spec"],
        "sliding_log:limit=2,window=10s,min_interval=0s,count_blocked=false"
    );
    assert_eq!(policies["allow_inline_policies"], false);
    assert_eq!(http(s.port, "GET", "/healthz", &[], b"").status, 200);
    assert_eq!(
        http(s.port, "GET", "/readyz", &[], b"").json()["status"],
        "ready"
    );
    let metrics = http(s.port, "GET", "/metrics", &[], b"").body;
    assert!(
        metrics
            .contains("paceline_decisions_total{policy=\"discord-roles\",outcome=\"rejected\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("paceline_store_latency_seconds"));
}

#[test]
fn every_bad_input_is_a_clear_4xx() {
    // (A cost more than the policy can ever admit is well formed: a `409 conflict`.)
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config]);
    let cases: &[(&str, u16, &str, &str)] = &[
        ("{not json", 400, "invalid_argument", "body"),
        ("[]", 400, "invalid_argument", "body"),
        (r#"{"key": "k"}"#, 400, "invalid_argument", "policy"),
        (
            r#"{"policy": "discord-roles"}"#,
            400,
            "invalid_argument",
            "key",
        ),
        (
            r#"{"policy": 5, "key": "k"}"#,
            400,
            "invalid_argument",
            "policy",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "cost": 0}"#,
            400,
            "invalid_argument",
            "cost",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "cost": -3}"#,
            400,
            "invalid_argument",
            "cost",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "cost": 1.5}"#,
            400,
            "invalid_argument",
            "cost",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "cost": 3}"#,
            409,
            "conflict",
            "cost",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "op": "grab"}"#,
            400,
            "invalid_argument",
            "op",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "max_wait_ms": -1}"#,
            400,
            "invalid_argument",
            "max_wait_ms",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "op": "limit", "max_wait_ms": 5}"#,
            400,
            "invalid_argument",
            "max_wait_ms",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "colour": "red"}"#,
            400,
            "invalid_argument",
            "colour",
        ),
        (
            r#"{"policy": "discord-roles", "key": ""}"#,
            400,
            "invalid_argument",
            "key",
        ),
        (
            r#"{"policy": "gcra:rate=10/s", "key": "k"}"#,
            403,
            "inline_policies_disabled",
            "policy",
        ),
        (
            r#"{"policy": "unknown", "key": "k"}"#,
            404,
            "unknown_policy",
            "policy",
        ),
    ];
    for (body, status, code, field) in cases {
        let r = post(s.port, "/v1/decisions", body);
        assert_eq!(
            (r.status, r.error()),
            (*status, (code.to_string(), field.to_string())),
            "{body}"
        );
    }
    let long_key = format!(
        r#"{{"policy": "discord-roles", "key": "{}"}}"#,
        "k".repeat(513)
    );
    assert_eq!(post(s.port, "/v1/decisions", &long_key).error().1, "key");
    let too_big = format!(
        r#"{{"policy": "discord-roles", "key": "k", "x": "{}"}}"#,
        "a".repeat(70_000)
    );
    let r = post(s.port, "/v1/decisions", &too_big);
    assert_eq!((r.status, r.error().0.as_str()), (413, "payload_too_large"));
    let many = format!(
        "[{}]",
        vec![r#"{"policy": "discord-roles", "key": "k"}"#; 1001].join(",")
    );
    let r = post(s.port, "/v1/decisions/batch", &many);
    assert_eq!((r.status, r.error().1.as_str()), (400, "body"));
    assert_eq!(http(s.port, "GET", "/v1/decisions", &[], b"").status, 405);
    assert_eq!(http(s.port, "GET", "/nowhere", &[], b"").status, 404);
    // Every error is the JSON error body, naming the field.
    let r = http(s.port, "DELETE", "/v1/keys/discord-roles/%FF%FE", &[], b"");
    assert_eq!(
        (r.status, r.error().1.as_str()),
        (400, "path"),
        "{}",
        r.body
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    // A value no double holds is its field's error, and so is a field given twice.
    for (body, field, says) in [
        (
            r#"{"policy": "discord-roles", "key": "k", "cost": 1e309}"#,
            "cost",
            "whole number",
        ),
        (
            r#"{"policy": "discord-roles", "key": "k", "max_wait_ms": -1e400}"#,
            "max_wait_ms",
            "milliseconds",
        ),
        (
            r#"{"policy": "discord-roles", "key": "a", "key": "b"}"#,
            "key",
            "`key`",
        ),
        (
            r#"{"policy": "discord-roles", "policy": "discord-roles", "key": "k"}"#,
            "policy",
            "`policy`",
        ),
    ] {
        let r = post(s.port, "/v1/decisions", body);
        assert_eq!(
            (r.status, r.error().1.as_str()),
            (400, field),
            "{body}: {}",
            r.body
        );
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(message.contains(says), "{body}: {message}");
        let r = post(s.port, "/v1/decisions/batch", &format!("[{body}]"));
        assert_eq!(r.status, 200, "{body}: {}", r.body);
        assert_eq!(
            r.json()[0]["error"]["field"].as_str(),
            Some(field),
            "{body}: {}",
            r.body
        );
    }
    // Only an object is a request: not the fields' values in an array.
    let r = post(s.port, "/v1/decisions", r#"["discord-roles", "k"]"#);
    assert_eq!(
        (r.status, r.error().1.as_str()),
        (400, "body"),
        "{}",
        r.body
    );
}

#[test]
fn a_token_guards_the_api_but_not_health() {
    let s = start(&["--auth-token", "s3cret"]);
    let ask = br#"{"policy": "gcra:rate=10/s", "key": "k"}"#;
    let missing = http(s.port, "POST", "/v1/decisions", &[], ask);
    assert_eq!(
        (missing.status, missing.error().0.as_str()),
        (401, "unauthenticated")
    );
    let wrong = http(
        s.port,
        "POST",
        "/v1/decisions",
        &[("Authorization", "Bearer nope")],
        ask,
    );
    assert_eq!(wrong.status, 401);
    let right = http(
        s.port,
        "POST",
        "/v1/decisions",
        &[("Authorization", "Bearer s3cret")],
        ask,
    );
    assert_eq!(right.status, 200, "{}", right.body);
    // The scheme is case-insensitive (RFC 9110).
    for header in ["bearer s3cret", "BEARER s3cret"] {
        let r = http(
            s.port,
            "POST",
            "/v1/decisions",
            &[("Authorization", header)],
            ask,
        );
        assert_eq!(r.status, 200, "{header}: {}", r.body);
    }
    // Every endpoint under /v1 asks for the token, before looking at the request.
    for (method, path, body) in [
        ("POST", "/v1/decisions/batch", &b"[]"[..]),
        ("POST", "/v1/decisions", b"{not json"),
        ("DELETE", "/v1/keys/nope/k", b""),
        ("GET", "/v1/policies", b""),
        ("POST", "/v1/reload", b""),
    ] {
        let r = http(s.port, method, path, &[], body);
        assert_eq!(r.status, 401, "{method} {path}: {}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{path}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(http(s.port, "GET", path, &[], b"").status, 200, "{path}");
    }
}

#[test]
fn reload_without_a_config_file_is_a_conflict_naming_config() {
    let s = start(&[]);
    let r = post(s.port, "/v1/reload", "");
    assert_eq!(r.status, 409, "{}", r.body);
    let body: serde_json::Value = serde_json::from_str(&r.body).expect("a JSON error");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["field"], "config");
}

#[test]
fn reload_applies_a_good_file_and_keeps_the_old_one_on_a_bad_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let s = start(&["--config", &config]);
    let ask = r#"{"policy": "uploads", "key": "u", "op": "limit"}"#;
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 404);

    write(
        dir.path(),
        "paceline.toml",
        &format!("{CONFIG}\n[policies.uploads]\nalgorithm = \"gcra\"\nrate = \"1/h\"\n"),
    );
    let r = post(s.port, "/v1/reload", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 200);
    // Reloading the same file keeps the keys' state (and the metrics' counts, below).
    assert_eq!(post(s.port, "/v1/reload", "").status, 200);

    // A bad file: refused, with the reason, and the running config stays.
    write(
        dir.path(),
        "paceline.toml",
        "[policies.uploads]\nalgorithm = \"gcra\"\nrate = \"0/s\"\n",
    );
    let r = post(s.port, "/v1/reload", "");
    assert_eq!(r.status, 422);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("policies.uploads"),
        "{}",
        r.body
    );
    assert_eq!(
        post(s.port, "/v1/decisions", ask).status,
        429,
        "uploads still configured (and limited)"
    );
    // One policy's counts go on across reloads.
    let metrics = http(s.port, "GET", "/metrics", &[], b"").body;
    for count in [
        "paceline_decisions_total{policy=\"uploads\",outcome=\"allowed\"} 1",
        "paceline_decisions_total{policy=\"uploads\",outcome=\"rejected\"} 1",
    ] {
        assert!(metrics.contains(count), "{count} in {metrics}");
    }

    // SIGHUP reloads too.
    write(dir.path(), "paceline.toml", CONFIG);
    signal(&s, "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while post(s.port, "/v1/decisions", ask).status != 404 {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn flags_win_over_the_file_at_every_reload_and_a_removed_setting_goes_back_to_its_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let with_token = "auth_token = \"from-file\"\nallow_inline_policies = true\n";
    let config = write(dir.path(), "paceline.toml", with_token);
    let ask = r#"{"policy": "gcra:rate=100/s,burst=100", "key": "k", "op": "limit"}"#;
    let send = |port: u16, token: &str| {
        let bearer = format!("Bearer {token}");
        http(
            port,
            "POST",
            "/v1/decisions",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &bearer),
            ],
            ask.as_bytes(),
        )
        .status
    };

    // The flag's token wins over the file's, before and after a reload.
    let s = start(&["--config", &config, "--auth-token", "from-flag"]);
    for round in ["start", "reload"] {
        if round == "reload" {
            assert_eq!(post_with(s.port, "/v1/reload", "from-flag"), 200);
        }
        assert_eq!(send(s.port, "from-flag"), 200, "{round}");
        assert_eq!(send(s.port, "from-file"), 401, "{round}");
    }
    drop(s);

    // Without the flag the file's token holds; once removed from the file, a reload drops it.
    let s = start(&["--config", &config]);
    assert_eq!(send(s.port, "from-file"), 200);
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 401);
    write(
        dir.path(),
        "paceline.toml",
        "allow_inline_policies = true\n",
    );
    assert_eq!(post_with(s.port, "/v1/reload", "from-file"), 200);
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 200);
}

/// A POST with a bearer token and an empty body; the status.
fn post_with(port: u16, path: &str, token: &str) -> u16 {
    let bearer = format!("Bearer {token}");
    http(port, "POST", path, &[("Authorization", &bearer)], b"").status
}

#[test]
fn sigterm_lets_an_in_flight_request_finish() {
    let mut s = start(&[]);
    let body = br#"{"policy": "gcra:rate=10/s", "key": "k"}"#;
    let mut stream = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // `Expect: 100-continue`: the server answers `100 Continue` once the handler reads the
    // body, so the request is surely in flight before the signal.
    let head = format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send");
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).expect("100 Continue");
    assert!(interim.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"));
    stream
        .write_all(&body[..10])
        .expect("send part of the body");
    signal(&s, "TERM");
    std::thread::sleep(Duration::from_millis(200));
    stream.write_all(&body[10..]).expect("the rest of the body");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let reply = parse(&raw);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let status = s.child.wait().expect("the service exits");
    assert!(status.success(), "{status}");
    let log = s.log();
    assert!(log.contains("shutting down"), "{log}");
}

#[test]
fn a_bad_config_or_flag_exits_2_naming_file_policy_and_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "bad.toml",
        "[policies.api]\nalgorithm = \"gcra\"\nrate = \"fast\"\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--config", &config])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("policies.api") && err.contains("rate"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--failure-policy", "maybe"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--failure-policy"));
    // A store that is not a Redis URL is bad input too; an unreachable one is not.
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--store", "mysql://db"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a store URL"));
    // Port 1: nothing listens there (a port found free could be taken by then).
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--store", "redis://127.0.0.1:1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect to Redis"));
}

#[test]
fn two_instances_on_one_redis_share_a_limit_and_fail_closed_is_503() {
    let mut redis = paceline_testkit::RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "paceline.toml",
        &format!(
            "store = \"{}\"\nfailure_policy = \"fail_closed\"\n{CONFIG}",
            redis.url()
        ),
    );
    let a = start(&["--config", &config]);
    let b = start(&["--config", &config]);
    // A limit of 2 per 10 s, asked 10 times across both instances: exactly 2 admitted.
    let ask = r#"{"policy": "discord-roles", "key": "guild:1", "op": "limit"}"#;
    let admitted = (0..10)
        .map(|i| {
            post(
                if i % 2 == 0 { a.port } else { b.port },
                "/v1/decisions",
                ask,
            )
            .status
        })
        .filter(|&status| status == 200)
        .count();
    assert_eq!(admitted, 2);
    assert_eq!(http(a.port, "GET", "/readyz", &[], b"").status, 200);

    // Redis down: a store failure is a 503, never a 429, and readiness says so.
    redis.kill();
    let r = post(a.port, "/v1/decisions", ask);
    assert_eq!(
        (r.status, r.error().0.as_str()),
        (503, "store_unavailable"),
        "{}",
        r.body
    );
    assert_eq!(http(b.port, "GET", "/readyz", &[], b"").status, 503);
}

#[test]
fn arbitrary_bodies_never_get_a_5xx() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let s = start(&[]);
    let json = prop::collection::btree_map(
        prop_oneof![
            Just("policy".to_string()),
            Just("key".to_string()),
            Just("op".to_string()),
            Just("cost".to_string()),
            Just("max_wait_ms".to_string()),
            "[a-z]{1,8}",
        ],
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(|f| serde_json::json!(f)),
            prop_oneof![
                Just("gcra:rate=10/s".to_string()),
                Just("pace".to_string()),
                Just("limit".to_string()),
                Just("fixed_window:limit=0,window=1s".to_string()),
                ".{0,40}",
            ]
            .prop_map(serde_json::Value::from),
        ],
        0..6,
    )
    .prop_map(|m| serde_json::to_vec(&m).unwrap_or_default());
    let bodies = prop_oneof![json, prop::collection::vec(any::<u8>(), 0..200)];
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&bodies, |body| {
        for path in ["/v1/decisions", "/v1/decisions/batch"] {
            let r = http(
                s.port,
                "POST",
                path,
                &[("Content-Type", "application/json")],
                &body,
            );
            prop_assert!(
                r.status < 500,
                "{path} answered {} to {:?}: {}",
                r.status,
                String::from_utf8_lossy(&body),
                r.body
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Still serving.
    assert_eq!(http(s.port, "GET", "/healthz", &[], b"").status, 200);
}

/// Reads from `stream` until the server closes it (or it errs), failing if nothing happens
/// within a generous bound; returns what was read.
fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return raw,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return raw,
            Err(e) => panic!("the service did not close the connection: {e}"),
        }
    }
}

#[test]
fn unfinished_and_idle_connections_are_closed() {
    // A second each: long enough that a loaded machine does not stall this test between
    // its connect and its first write past a timeout.
    let s = start(&[
        "--header-read-timeout",
        "1s",
        "--body-read-timeout",
        "1s",
        "--idle-timeout",
        "1s",
    ]);
    // Half the headers, then nothing: closed by the header read timeout.
    let mut half_head = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    half_head
        .write_all(b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\n")
        .expect("send");
    until_closed(&mut half_head);

    // Headers, then half the body: a 408 in the JSON error body.
    let mut half_body = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    half_body
        .write_all(
            b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"policy\"",
        )
        .expect("send");
    let reply = parse(&until_closed(&mut half_body));
    assert_eq!(reply.status, 408, "{}", reply.body);
    assert_eq!(reply.error(), ("request_timeout".into(), "body".into()));

    // A kept-alive connection that answered a request and then idles: closed.
    let mut idle = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let raw = until_closed(&mut idle);
    assert!(
        raw.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&raw)
    );

    // The service itself keeps answering.
    assert_eq!(http(s.port, "GET", "/healthz", &[], b"").status, 200);
}

#[test]
fn connections_beyond_the_cap_wait_for_a_free_one() {
    let s = start(&[
        "--max-connections",
        "2",
        "--idle-timeout",
        "1h",
        "--header-read-timeout",
        "1h",
    ]);
    // Two connections take both slots (each has sent nothing yet).
    let first = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    let second = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    // A third is queued by the kernel: its request gets no answer while both are open.
    let mut third = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    match third.read(&mut byte) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("a connection beyond the cap was served: {other:?}"),
    }
    // One closes: the third is accepted and answered.
    drop(first);
    let raw = until_closed(&mut third);
    assert!(
        raw.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    drop(second);
}

#[test]
fn sigterm_gives_up_on_an_unfinished_request_after_the_shutdown_timeout() {
    let mut s = start(&[
        "--shutdown-timeout",
        "300ms",
        "--header-read-timeout",
        "1h",
        "--idle-timeout",
        "1h",
    ]);
    // Headers and part of a body, then silence: in flight, never finished.
    let mut stuck = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    stuck
        .write_all(b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .expect("send");
    // A request in flight is surely read: wait until the service answers another one.
    assert_eq!(http(s.port, "GET", "/healthz", &[], b"").status, 200);
    signal(&s, "TERM");
    // The service exits by itself (the test would hang here before the deadline existed).
    exits_cleanly(&mut s);
    until_closed(&mut stuck);
}

#[test]
fn sigterm_closes_kept_alive_connections_cleanly_after_answering_them() {
    let mut s = start(&["--idle-timeout", "1h", "--header-read-timeout", "1h"]);
    let mut kept = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let body = br#"{"policy": "gcra:rate=10/s", "key": "k"}"#;
    let request = format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // One answered request on a kept-alive connection, which then idles.
    kept.write_all(request.as_bytes()).expect("send");
    kept.write_all(body).expect("send");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !String::from_utf8_lossy(&answer).contains("\"reset_after_ms\"") {
        let n = kept.read(&mut chunk).expect("the answer");
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&chunk[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    signal(&s, "TERM");
    // The idle connection is closed cleanly: end of stream, not a reset, nothing more sent.
    match kept.read(&mut chunk) {
        Ok(0) => {}
        other => panic!("the kept-alive connection was not closed cleanly: {other:?}"),
    }
    // ... and the service exits by itself.
    exits_cleanly(&mut s);
}

/// A request and its answer on each of many kept-alive connections; then, the service
/// stopped (`SIGSTOP`), each sends its next request, and `SIGTERM` comes before the service
/// runs again (`SIGCONT`). Every request was sent before the service learned of the signal,
/// so every one gets a whole answer, the last on its connection, which then ends cleanly.
/// (Before the fix, on resuming, most connections were closed with their request unread: the
/// shutdown closed every connection that had not read its next request yet.)
#[cfg(target_os = "linux")]
#[test]
fn requests_sent_just_before_sigterm_on_kept_alive_connections_are_answered() {
    let mut s = start(&["--idle-timeout", "1h", "--header-read-timeout", "1h"]);
    let request = |connection: usize| {
        let body = format!(r#"{{"policy": "gcra:rate=1000/s", "key": "c{connection}"}}"#);
        format!(
            "POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut streams = Vec::new();
    for connection in 0..200 {
        let mut stream = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream
            .write_all(request(connection).as_bytes())
            .expect("send");
        let answer = paceline_testkit::whole_response(&mut stream);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        streams.push(stream);
    }
    signal(&s, "STOP");
    // Every thread of the service stopped, so that none reads what comes next.
    let stat = format!("/proc/{}/stat", s.child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat)
        .expect("the service's stat")
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T'))
    {
        assert!(Instant::now() < deadline, "the service did not stop");
        std::thread::yield_now();
    }
    for (connection, stream) in streams.iter_mut().enumerate() {
        stream
            .write_all(request(connection).as_bytes())
            .expect("send");
    }
    signal(&s, "TERM");
    signal(&s, "CONT");
    for stream in &mut streams {
        let answer = paceline_testkit::whole_response(stream);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest)),
            Err(e) => panic!("the connection was not closed cleanly: {e}"),
        }
    }
    exits_cleanly(&mut s);
}

//! What `paceline serve` logs of the policies changed at run time: each change at INFO,
//! with the policy, its spec before and after and what made it, on the instance that took
//! it and on another sharing its Redis; never the service's token.

mod common;

use std::time::{Duration, Instant};

use common::{exits_cleanly, http, signal, start, Reply};
use paceline_testkit::RedisServer;

const TOKEN: &str = "s3cret-t0ken";

fn call(port: u16, method: &str, path: &str, body: &str) -> Reply {
    let bearer = format!("Bearer {TOKEN}");
    http(
        port,
        method,
        path,
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
}

/// The log's lines that hold every one of `words`.
fn lines_with<'a>(log: &'a str, words: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|line| words.iter().all(|w| line.contains(w)))
        .collect()
}

#[test]
fn each_change_is_logged_on_every_instance_and_the_token_never() {
    let redis = RedisServer::start().expect("redis-server");
    let args = ["--store", &redis.url(), "--auth-token", TOKEN];
    let mut a = start(&args);
    let mut b = start(&args);

    let set = call(
        a.port,
        "PUT",
        "/v1/policies/search",
        r#"{"spec": "gcra:rate=10/s,burst=5"}"#,
    );
    assert_eq!(set.status, 201, "{}", set.body);
    // The other instance reads it (the event waited for; the deadline only ends a hung test).
    let deadline = Instant::now() + Duration::from_secs(20);
    while call(b.port, "GET", "/v1/policies/search", "").status != 200 {
        assert!(Instant::now() < deadline, "B never read the change");
        std::thread::sleep(Duration::from_millis(20));
    }
    let deleted = call(a.port, "DELETE", "/v1/policies/search", "");
    assert_eq!(deleted.status, 204, "{}", deleted.body);

    for service in [&a, &b] {
        signal(service, "TERM");
    }
    exits_cleanly(&mut a);
    exits_cleanly(&mut b);
    let (log_a, log_b) = (a.log(), b.log());

    let change = "policy changed at run time";
    let put = lines_with(
        &log_a,
        &[
            change,
            "INFO",
            "policy=\"search\"",
            "old=\"none\"",
            "new=\"gcra:rate=10/s,burst=5\"",
            "PUT /v1/policies",
        ],
    );
    assert_eq!(put.len(), 1, "{log_a}");
    let delete = lines_with(
        &log_a,
        &[
            change,
            "old=\"gcra:rate=10/s,burst=5\"",
            "new=\"none\"",
            "DELETE /v1/policies",
        ],
    );
    assert_eq!(delete.len(), 1, "{log_a}");
    // B logs what it read from the store (the deletion too, if it read it before it
    // stopped).
    let seen = lines_with(
        &log_b,
        &[
            change,
            "INFO",
            "policy=\"search\"",
            "new=\"gcra:rate=10/s,burst=5\"",
            "the store",
        ],
    );
    assert_eq!(seen.len(), 1, "{log_b}");
    for log in [&log_a, &log_b] {
        assert!(!log.contains(TOKEN), "{log}");
    }
}

//! What `paceline serve` tells its operator in its log: a refused reload is a warning
//! (from `POST /v1/reload` and from SIGHUP alike), and a Redis outage is one warning as it
//! begins and one note as it ends, with its length and the decisions that failed during
//! it, however many calls failed in between.

mod common;

use std::time::{Duration, Instant};

use common::{exits_cleanly, post, signal, start, write};
use paceline_testkit::RedisServer;

const CONFIG: &str = r#"
[policies.uploads]
algorithm = "gcra"
rate = "1/h"
burst = 1000
"#;

/// A refused file, naming the field in its message.
const BAD: &str = "[policies.uploads]\nalgorithm = \"gcra\"\nrate = \"0/s\"\n";

/// The log's lines that hold every one of `words`.
fn lines_with<'a>(log: &'a str, words: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|line| words.iter().all(|w| line.contains(w)))
        .collect()
}

#[test]
fn refused_reloads_are_warnings_and_an_outage_is_logged_once_as_it_begins_and_ends() {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "paceline.toml", CONFIG);
    let mut s = start(&[
        "--config",
        &config,
        "--store",
        &redis.url(),
        "--failure-policy",
        "fail_closed",
    ]);
    let ask = r#"{"policy": "uploads", "key": "u", "op": "limit"}"#;
    assert_eq!(post(s.port, "/v1/decisions", ask).status, 200);

    // A refused reload, by each way in.
    write(dir.path(), "paceline.toml", BAD);
    assert_eq!(post(s.port, "/v1/reload", "").status, 422);
    signal(&s, "HUP");
    // A good file after it, by SIGHUP too, put in place whole (a rename), so that no reload
    // ever reads half a file. The first SIGHUP may be handled before or after the swap: it
    // is refused or applied, and either way it is logged at the level that says so.
    let good = format!("{CONFIG}\n[policies.later]\nalgorithm = \"gcra\"\nrate = \"1/h\"\n");
    write(dir.path(), "paceline.toml.new", &good);
    std::fs::rename(
        dir.path().join("paceline.toml.new"),
        dir.path().join("paceline.toml"),
    )
    .expect("rename");
    signal(&s, "HUP");
    let later = r#"{"policy": "later", "key": "u", "op": "limit"}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while post(s.port, "/v1/decisions", later).status != 200 {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        std::thread::sleep(Duration::from_millis(20));
    }

    // An outage: every decision meanwhile fails, and the first once Redis is back does
    // not (polled: the failure backoff may answer a moment longer without trying Redis).
    redis.kill();
    let mut failed = 0;
    for _ in 0..5 {
        let r = post(s.port, "/v1/decisions", ask);
        assert_eq!(r.status, 503, "{}", r.body);
        failed += 1;
    }
    redis.restart().expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = post(s.port, "/v1/decisions", ask);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.body);
        failed += 1;
        assert!(Instant::now() < deadline, "the service did not resume");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&s, "TERM");
    exits_cleanly(&mut s);
    let log = s.log();

    let refused = lines_with(&log, &[" WARN ", "reload failed:", "policies.uploads"]);
    let reloaded = lines_with(&log, &[" INFO ", "reloaded:"]);
    assert!(
        refused.iter().any(|l| l.contains("POST /v1/reload")),
        "{log}"
    );
    // Three reloads: the refused POST, then two SIGHUPs, the first refused or (handled
    // after the good file was in place) applied.
    assert_eq!(refused.len() + reloaded.len(), 3, "{log}");
    assert!(!reloaded.is_empty(), "{log}");
    assert!(reloaded.iter().all(|l| l.contains("SIGHUP")), "{log}");
    if refused.len() == 2 {
        assert!(refused.iter().any(|l| l.contains("SIGHUP")), "{log}");
    }

    let url = redis.url();
    let began = lines_with(&log, &[" WARN ", "store outage began", &url]);
    assert_eq!(
        began.len(),
        1,
        "one warning however many calls failed: {log}"
    );
    assert!(began[0].contains("failure_policy=fail_closed"), "{log}");
    let ended = lines_with(&log, &[" INFO ", "store outage ended", &url]);
    assert_eq!(ended.len(), 1, "{log}");
    assert!(
        ended[0].contains(&format!("failed_decisions={failed}")),
        "{failed} decisions failed: {log}"
    );
    assert!(ended[0].contains("lasted_ms="), "{log}");
}

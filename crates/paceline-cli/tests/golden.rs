//! Golden traffic scripts: `tests/golden/NAME.jsonl` replayed by the real `paceline simulate`
//! must print exactly `tests/golden/NAME.out.jsonl`.
//!
//! A script's first line is `# args: --policy SPEC` (the command-line arguments). After a
//! deliberate change of behaviour, re-create the expected files with
//! `PACELINE_BLESS=1 cargo test -p paceline-cli --test golden` and review the diff line by line.

mod common;

use std::process::Command;

use common::golden::{args_of, scripts, simulate};

#[test]
fn every_golden_script_reproduces_its_expected_output() {
    let scripts = scripts();
    let algorithms: Vec<&str> = paceline_store::ALGORITHMS.to_vec();
    for algorithm in &algorithms {
        assert!(
            scripts.iter().any(|s| args_of(s)
                .iter()
                .any(|a| a.starts_with(&format!("{algorithm}:")))),
            "no golden script exercises `{algorithm}`"
        );
    }
    let bless = std::env::var_os("PACELINE_BLESS").is_some();
    let mut failures = Vec::new();
    for script in scripts {
        let out = simulate(&args_of(&script), &script);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", script.display());
        let actual = String::from_utf8(out.stdout).expect("UTF-8 output");
        let expected_path = script.with_extension("out.jsonl");
        if bless {
            std::fs::write(&expected_path, &actual).expect("writable golden file");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|_| {
            panic!(
                "missing {}; run with PACELINE_BLESS=1",
                expected_path.display()
            )
        });
        if actual != expected {
            let first_diff = actual
                .lines()
                .zip(expected.lines())
                .find(|(a, e)| a != e)
                .map_or("(different number of lines)".to_string(), |(a, e)| {
                    format!("\n  got:      {a}\n  expected: {e}")
                });
            failures.push(format!("{}: {first_diff}", script.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "golden mismatches:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_golden_script_gives_the_same_output_on_redis_and_redis_cluster() {
    let server = paceline_testkit::RedisServer::start().expect("a private redis-server");
    let cluster = paceline_testkit::RedisCluster::start().expect("a private Redis Cluster");
    for store in [server.url(), cluster.url()] {
        // Queue scripts run on the in-memory queue only (`--store` is refused with them).
        for script in scripts()
            .into_iter()
            .filter(|s| !args_of(s).iter().any(|a| a == "--queue"))
        {
            let mut args = args_of(&script);
            args.extend(["--store".to_string(), store.clone()]);
            let out = simulate(&args, &script);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{} on {store}: {stderr}",
                script.display()
            );
            let expected = std::fs::read_to_string(script.with_extension("out.jsonl"))
                .expect("the expected output exists");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                expected,
                "{} on {store}",
                script.display()
            );
        }
    }
    // The runs deleted their keys.
    assert_eq!(server.dbsize().expect("DBSIZE"), 0);
    assert_eq!(cluster.dbsize().expect("DBSIZE"), 0);
}

#[test]
fn a_queue_script_refuses_a_store_and_a_policy_it_cannot_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("one.jsonl");
    std::fs::write(&script, "{\"op\": \"stats\"}\n").expect("writable");
    for (args, says) in [
        (
            vec!["--queue", "gcra:rate=1/s", "--store", "redis://127.0.0.1:1"],
            "--store",
        ),
        (
            vec!["--queue", "exec_evenly:points=1,duration=1s"],
            "group_policy",
        ),
        (
            vec!["--queue", "gcra:rate=1/s", "--lease", "soon"],
            "--lease",
        ),
    ] {
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        let out = simulate(&args, &script);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let ok = simulate(
        &["--queue".to_string(), "gcra:rate=1/s".to_string()],
        &script,
    );
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("\"event\":\"stats\""));
}

#[test]
fn bad_pause_policy_and_dedup_lines_name_their_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("bad.jsonl");
    for (line, says) in [
        (r#"{"op": "pause", "ms": 0}"#, "`ms`"),
        (r#"{"op": "pause", "group": ""}"#, "`group`"),
        (
            r#"{"op": "policy", "group": "g", "policy": "gcra:rate=soon"}"#,
            "`policy.rate`",
        ),
        (
            r#"{"op": "policy", "group": "g", "policy": "concurrency:limit=1,lease=1s"}"#,
            "`policy`",
        ),
        (
            r#"{"op": "enqueue", "group": "g", "dedup": {"ttl_ms": 5}}"#,
            "`dedup.key`",
        ),
        (
            r#"{"op": "enqueue", "group": "g", "dedup": {"key": "k", "ttl_ms": 5, "replace": 1}}"#,
            "`dedup.replace`",
        ),
        (r#"{"op": "resume", "colour": 1}"#, "`colour`"),
    ] {
        std::fs::write(&script, format!("{line}\n")).expect("writable");
        let out = simulate(
            &["--queue".to_string(), "gcra:rate=1/s".to_string()],
            &script,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{line}: {stderr}");
        assert!(stderr.contains(says), "{line}: {stderr}");
        assert!(out.stdout.is_empty(), "{line}: no partial output");
    }
    let out = simulate(
        &[
            "--queue",
            "gcra:rate=1/s",
            "--queue-policy",
            "gcra:rate=fast",
        ]
        .map(str::to_string),
        &script,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--queue-policy"));
}

#[test]
fn an_unreachable_or_malformed_store_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("one.jsonl");
    std::fs::write(&script, "{\"op\": \"limit\"}\n").expect("writable");
    let policy = ["--policy".to_string(), "gcra:rate=1/s".to_string()];
    let with_store = |store: &str| {
        let mut args = policy.to_vec();
        args.extend(["--store".to_string(), store.to_string()]);
        simulate(&args, &script)
    };
    let malformed = with_store("localhost:6379");
    assert_eq!(malformed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("--store"));
    // A port nothing listens on (a server started and stopped).
    let mut server = paceline_testkit::RedisServer::start().expect("a private redis-server");
    let url = server.url();
    server.kill();
    let unreachable = with_store(&url);
    // A store failure is neither bad input (2) nor a file error (1): exit code 3.
    assert_eq!(unreachable.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(stderr.contains("cannot connect to Redis"), "{stderr}");
    assert!(stderr.contains("the store failed"), "{stderr}");
    assert!(!stderr.contains("invalid"), "{stderr}");
    assert!(unreachable.stdout.is_empty());
    // The same for a cluster whose seed nodes are all down (the case a probe found
    // reported as an invalid `store`).
    let cluster_url = url.replacen("redis://", "redis-cluster://", 1);
    let unreachable = with_store(&cluster_url);
    assert_eq!(unreachable.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(stderr.contains("the store failed"), "{stderr}");
    assert!(!stderr.contains("invalid"), "{stderr}");
    assert!(unreachable.stdout.is_empty());
}

#[test]
fn a_store_failing_during_the_run_is_a_store_failure_not_bad_input() {
    // A server that connects but cannot run paceline's Lua: every decision fails.
    let server = paceline_testkit::RedisServer::start_with(&[
        "--rename-command",
        "EVALSHA",
        "paceline-test-no-evalsha",
        "--rename-command",
        "FUNCTION",
        "paceline-test-no-function",
    ])
    .expect("a private redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("one.jsonl");
    std::fs::write(&script, "{\"op\": \"limit\"}\n").expect("writable");
    let args = [
        "--policy".to_string(),
        "gcra:rate=1/s".to_string(),
        "--store".to_string(),
        server.url(),
    ];
    let out = simulate(&args, &script);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("line 1: the store failed"), "{stderr}");
    assert!(!stderr.contains("invalid `store`"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn an_invalid_line_exits_2_names_line_and_field_and_prints_no_decision() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("bad.jsonl");
    std::fs::write(
        &script,
        "{\"key\": \"a\"}\n# fine so far\n{\"key\": \"a\", \"cost\": -1}\n",
    )
    .expect("write");
    let out = simulate(&["--policy".into(), "gcra:rate=1/s".into()], &script);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no partial output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 3") && stderr.contains("`cost`"),
        "{stderr}"
    );
}

#[test]
fn a_bad_policy_or_store_exits_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("ok.jsonl");
    std::fs::write(&script, "{}\n").expect("write");
    let out = simulate(
        &["--policy".into(), "gcra:rate=10/s,burst=0".into()],
        &script,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`burst`"));
    let out = simulate(
        &[
            "--policy".into(),
            "gcra:rate=1/s".into(),
            "--store".into(),
            "mongodb://x".into(),
        ],
        &script,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--store"));
}

#[test]
fn output_file_and_stdin_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("out.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["simulate", "--policy", "gcra:rate=10/s", "--output"])
        .arg(&out_path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(b"{\"op\": \"limit\"}\n{\"op\": \"limit\"}\n")
            .expect("write");
    }
    assert!(child.wait().expect("wait").success());
    let written = std::fs::read_to_string(&out_path).expect("output written");
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].contains("\"allowed\":true") && lines[1].contains("\"allowed\":false"));
}

#[test]
fn a_line_that_is_not_utf8_exits_2_naming_the_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("binary.jsonl");
    std::fs::write(&script, b"{\"key\": \"a\"}\n\xff\xfe\n").expect("write");
    let out = simulate(&["--policy".into(), "gcra:rate=1/s".into()], &script);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
}

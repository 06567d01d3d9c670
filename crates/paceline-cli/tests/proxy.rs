//! `paceline proxy` from the outside: bad flags exit 2 naming the flag; credentials in its
//! URLs are never printed or served; two proxy processes on one Redis share a token's
//! limits.

use std::process::Command;

mod common;

fn proxy(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("proxy")
        .args(args)
        .output()
        .expect("paceline runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, named) in [
        (vec!["--upstream", "ftp://example.com"], "--upstream"),
        (vec!["--upstream", "not a url"], "--upstream"),
        (
            vec!["--upstream", "http://example.com", "--dialect", "soap"],
            "--dialect",
        ),
        (
            vec!["--upstream", "http://example.com", "--max-wait=-1s"],
            "--max-wait",
        ),
        (
            vec![
                "--upstream",
                "http://example.com",
                "--global-limit",
                "gcra:rate=0/s",
            ],
            "--global-limit",
        ),
        (
            vec![
                "--upstream",
                "http://example.com",
                "--store",
                "mysql://user:pw@127.0.0.1:1",
            ],
            "--store",
        ),
        (
            vec!["--upstream", "ftp://user:pw@example.com"],
            "--upstream",
        ),
        (
            vec!["--upstream", "http://user:pw@example.com:99999"],
            "--upstream",
        ),
        (
            vec!["--upstream", "http://example.com/base?key=1"],
            "--upstream",
        ),
        (
            vec![
                "--upstream",
                "http://example.com",
                "--global-limit",
                "concurrency:limit=2,lease=1s",
            ],
            "--global-limit",
        ),
    ] {
        let (code, stderr) = proxy(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("pw@"),
            "credentials are never printed: {stderr}"
        );
    }
}

#[test]
fn an_unreachable_redis_store_exits_1_naming_the_store_without_credentials() {
    let (code, stderr) = proxy(&[
        "--upstream",
        "http://example.com",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "redis://user:pw@127.0.0.1:1",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("store"), "{stderr}");
    assert!(
        !stderr.contains("pw@"),
        "credentials are never printed: {stderr}"
    );
}

#[test]
fn a_config_file_gives_the_settings_and_flags_win() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("proxy.toml");
    let file = path.to_str().expect("a UTF-8 path");
    // A key the proxy does not know is named.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\nlisten_on = \"x\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("listen_on"), "{stderr}");
    // A bad value in the file is named by the file and its key.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\ndialect = \"soap\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("proxy.toml: `dialect`"), "{stderr}");
    // A flag given wins over the file: the file's dialect is not looked at, the flag's
    // upstream is.
    let (code, stderr) = proxy(&[
        "--config",
        file,
        "--dialect",
        "discord",
        "--upstream",
        "ftp://x",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream"), "{stderr}");
    assert!(!stderr.contains("dialect"), "{stderr}");
    // Without an upstream anywhere.
    std::fs::write(&path, "store = \"memory\"\n").unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream: required"), "{stderr}");
    // A line the file cannot be read at is named by its number, never shown: it may hold
    // a password.
    std::fs::write(
        &path,
        "store = \"memory\"\nupstream = \"http://user:toml-pw@example.com\" oops\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("proxy.toml: line 2:"), "{stderr}");
    assert!(!stderr.contains("toml-pw"), "{stderr}");
    // The global limit's key in the file is named.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\nglobal_limit = \"concurrency:limit=1,lease=1s\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("proxy.toml: `global_limit`"), "{stderr}");
    let (code, stderr) = proxy(&["--config", "/nonexistent/proxy.toml"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--config"), "{stderr}");
}

#[test]
fn a_global_limits_table_names_its_bad_entries_never_showing_a_token() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("proxy.toml");
    let file = path.to_str().expect("a UTF-8 path");
    // A token put where a key goes is refused without being printed.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\n[global_limits]\n\"Bot my-token\" = \"gcra:rate=9/s\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("proxy.toml: `global_limits`"), "{stderr}");
    assert!(!stderr.contains("my-token"), "{stderr}");
    // A bad policy is named by its key, which holds no secret.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\n[global_limits]\n\"discord:42\" = \"gcra:rate=x\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("proxy.toml: `global_limits.\"discord:42\"`"),
        "{stderr}"
    );
    let (code, stderr) = proxy(&[
        "--upstream",
        "http://example.com",
        "--learn-global-limit",
        "maybe",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--learn-global-limit"), "{stderr}");
}

#[test]
fn a_concurrency_global_limit_exits_2_naming_the_flag_and_the_algorithms_allowed() {
    let (code, stderr) = proxy(&[
        "--upstream",
        "http://example.com",
        "--global-limit",
        "concurrency:limit=4,lease=30s",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--global-limit: `concurrency`"), "{stderr}");
    for allowed in ["gcra", "fixed_window", "sliding_window", "pacer"] {
        assert!(stderr.contains(allowed), "{allowed}: {stderr}");
    }
    // The flag's help says so too (its words, however the lines wrap).
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["proxy", "--help"])
        .output()
        .expect("paceline runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = help.split_whitespace().collect();
    assert!(
        words.join(" ").contains("Any algorithm but `concurrency`"),
        "{help}"
    );
}

#[test]
fn credentials_in_the_upstream_and_store_urls_are_never_printed_or_served() {
    // Nothing listens on the upstream's port: every request fails upstream.
    let urls = paceline_testkit::secrets::SecretUrls::start().expect("a redis-server");
    let (store, upstream) = (urls.store.clone(), urls.upstream.as_str());
    let shows_none = |what: &str, text: &str| urls.assert_hidden(what, text);
    let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
    command.args([
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--store",
        &store,
    ]);
    let (mut service, ports) =
        common::launch(&mut command, &["proxying http://", "admin: http://"]);
    let (port, admin) = (ports[0], ports[1]);
    let failed = common::http(port, "GET", "/x", &[], b"");
    assert_eq!(failed.status, 502, "{}", failed.body);
    assert_eq!(failed.error(), ("bad_gateway".into(), "upstream".into()));
    shows_none("an upstream error", &failed.body);
    let refused = common::http(port, "GET", "/%2e%2e/x", &[], b"");
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.error(), ("invalid_argument".into(), "path".into()));
    shows_none("a refused path", &refused.body);
    for page in ["/healthz", "/metrics", "/dashboard", "/v1/dashboard"] {
        let answer = common::http(admin, "GET", page, &[], b"");
        assert_eq!(answer.status, 200, "{page}");
        shows_none(page, &answer.body);
    }
    let data = common::http(admin, "GET", "/v1/dashboard", &[], b"").json();
    assert_eq!(data["proxy"]["upstream"], "http://127.0.0.1:1/base");
    common::signal(&service, "TERM");
    let _ = service.child.wait();
    let log = service.log();
    assert!(
        log.contains("to http://127.0.0.1:1/base, limits kept in redis://127.0.0.1:"),
        "{log}"
    );
    assert!(log.contains("stopped"), "{log}");
    shows_none("the log", &log);
}

/// Starts `paceline proxy` with `args` on a port the system picks, once it listens (see
/// [`common::launch`]); killed when dropped.
async fn start_proxy(args: &[&str]) -> common::Service {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
        command
            .arg("proxy")
            .args(["--listen", "127.0.0.1:0"])
            .args(&args);
        common::launch(&mut command, &["proxying http://"]).0
    })
    .await
    .expect("the proxy starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_redis_share_a_tokens_limits() {
    use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};
    let redis = paceline_testkit::RedisServer::start().expect("a redis-server");
    // 75 per aligned second of the mock's wall clock against the proxies' shared 45 per
    // second: room for arrivals bunched by a stall of the machine. That the two share it is
    // checked by the arrivals' span below.
    let mut api = MockApi::new(75);
    let mut paths = Vec::new();
    for major in [7u64, 8] {
        for r in 0..6 {
            let path = format!("/channels/{major}/r{r}");
            let route = paceline_client::Route::discord("POST", &path);
            api.route(
                &route,
                &format!("bucket-{}", r % 2),
                Limit {
                    limit: 5,
                    window: SECOND / 5,
                },
            );
            paths.push(path);
        }
    }
    let mock = MockServer::start(api).await;
    let args = [
        "--upstream",
        &mock.url(),
        "--dialect",
        "discord",
        "--global-limit",
        "gcra:rate=45/s,burst=1",
        "--store",
        &redis.url(),
    ];
    let a = start_proxy(&args).await;
    let b = start_proxy(&args).await;
    let http = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..16usize {
        let port = if caller % 2 == 0 { a.port } else { b.port };
        let (http, paths) = (http.clone(), paths.clone());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..5 {
                let path = &paths[(caller * 5 + i) % paths.len()];
                let r = http
                    .post(format!("http://127.0.0.1:{port}{path}"))
                    .header("authorization", "Bot one-token")
                    .send()
                    .await
                    .expect("the proxy answers");
                statuses.push(r.status().as_u16());
            }
            statuses
        });
    }
    let mut statuses = Vec::new();
    while let Some(s) = tasks.join_next().await {
        statuses.extend(s.expect("a caller"));
    }
    assert_eq!(statuses.len(), 80, "every request answered");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let api = mock.api.lock().expect("the mock");
    let counts = &api.counts;
    assert_eq!(
        (counts.bucket_429, counts.global_429, counts.requests),
        (0, 0, 80),
        "{counts:?}"
    );
    // Shared, 45 per second hold for both: 79 intervals take at least 79 / 45 s (less a
    // quarter for the first request's own delay); unshared, 90 per second, half that.
    let span = api.arrival_span();
    assert!(
        span >= std::time::Duration::from_secs(79) / 45 * 3 / 4,
        "80 requests in {span:?}: faster than 45 per second"
    );
    drop(api);
    drop((a, b));
}

/// A request the proxy will not send in time is logged as rate limited, with its scope,
/// its route's template and what became of it, never with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_request_is_logged_without_its_token() {
    use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};
    let mut api = MockApi::new(50);
    let route = paceline_client::Route::discord("GET", "/guilds/1/roles");
    api.route(
        &route,
        "slow",
        Limit {
            limit: 1,
            window: 60 * SECOND,
        },
    );
    let mock = MockServer::start(api).await;
    let mut proxy = start_proxy(&[
        "--upstream",
        &mock.url(),
        "--dialect",
        "discord",
        "--max-wait",
        "100ms",
    ])
    .await;
    let http = reqwest::Client::new();
    for expected in [200, 429] {
        let r = http
            .get(format!("http://127.0.0.1:{}/guilds/1/roles", proxy.port))
            .header("authorization", "Bot log-secret-token")
            .send()
            .await
            .expect("the proxy answers");
        assert_eq!(r.status().as_u16(), expected);
    }
    common::signal(&proxy, "TERM");
    let log = tokio::task::spawn_blocking(move || {
        common::exits_cleanly(&mut proxy);
        proxy.log()
    })
    .await
    .expect("the log");
    let line = log
        .lines()
        .find(|l| l.contains("rate limited"))
        .unwrap_or_else(|| panic!("no rate limited line in {log}"));
    for field in [
        "route=\"GET /guilds/:major/roles\"",
        "bucket=\"slow\"",
        "scope=\"bucket\"",
        "origin=\"local\"",
        "then=\"fail\"",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(!log.contains("log-secret-token"), "{log}");
}

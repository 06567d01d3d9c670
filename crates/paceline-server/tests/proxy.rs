//! `paceline proxy` in front of the strict mock API, over real HTTP on loopback. These
//! tests count answers and refusals; they assert no timings.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use paceline_server::proxy::{Proxy, ProxySettings};
use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};

struct Running {
    url: String,
    admin: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

async fn proxy(upstream: &str, dialect: &str, max_wait: Option<Duration>) -> Running {
    proxy_on(upstream, dialect, max_wait, "memory").await
}

async fn proxy_on(
    upstream: &str,
    dialect: &str,
    max_wait: Option<Duration>,
    store: &str,
) -> Running {
    let mut s = ProxySettings::new(upstream.parse().unwrap());
    s.store = store.into();
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    s.dialect = dialect.into();
    s.max_wait = max_wait;
    if dialect == "discord" {
        // Under the mock's global limit (see `MOCK_GLOBAL`).
        s.global_limit = Some("gcra:rate=45/s,burst=1".parse().unwrap());
    }
    start(s).await
}

/// The proxy of settings `s`, running.
async fn start(s: ProxySettings) -> Running {
    let p = Proxy::bind(s).await.unwrap();
    let url = format!("http://{}", p.local_addr());
    let admin = format!("http://{}", p.admin_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(async move {
        let _ = stopped.await;
    }));
    Running {
        url,
        admin,
        stop: Some(stop),
        task,
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// The body of a GET of `url`, as text.
async fn get_text(client: &reqwest::Client, url: String) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_through_one_proxy_get_every_answer_and_no_429() {
    // Routes learn that they share bucket ids as they go.
    let (api, routes) = shared_buckets();
    let mock = MockServer::start(api).await;
    let p = proxy(&mock.url(), "discord", None).await;
    let client = http();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..32usize {
        let (client, base, routes) = (client.clone(), p.url.clone(), routes.clone());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..5 {
                let path = &routes[(caller * 5 + i) % routes.len()];
                let r = client
                    .post(format!("{base}/api/v10{path}?n={i}"))
                    .header("authorization", "Bot secret-token")
                    .header("x-echo", format!("{caller}-{i}"))
                    .header("proxy-authorization", "for the proxy only")
                    .body("hello")
                    .send()
                    .await
                    .unwrap();
                let echo = r
                    .headers()
                    .get("x-echo")
                    .map(|v| v.to_str().unwrap().to_string());
                assert_eq!(echo.as_deref(), Some(format!("{caller}-{i}").as_str()));
                statuses.push(r.status().as_u16());
                let seen: serde_json::Value = r.json().await.unwrap();
                assert_eq!(seen["body_length"], 5);
                assert_eq!(seen["hop_by_hop"], false, "hop-by-hop headers stay");
                assert_eq!(seen["path"], format!("/api/v10{path}?n={i}"));
            }
            statuses
        });
    }
    let mut answered = 0;
    while let Some(statuses) = tasks.join_next().await {
        for s in statuses.unwrap() {
            assert_eq!(s, 200);
            answered += 1;
        }
    }
    assert_eq!(answered, 160);
    {
        let api = mock.api.lock().unwrap();
        assert_eq!(api.counts.bucket_429, 0, "{:?}", api.counts);
        assert_eq!(api.counts.global_429, 0, "{:?}", api.counts);
        assert_eq!(api.counts.requests, 160, "each request sent once");
    }
    let health = client
        .get(format!("{}/healthz", p.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = get_text(&client, format!("{}/metrics", p.admin)).await;
    assert!(
        metrics.contains("paceline_proxy_requests_total{outcome=\"forwarded\"} 160"),
        "{metrics}"
    );
    assert!(!metrics.contains("secret-token"));
    // The admin address is not proxied, and the proxied one has no /metrics of its own.
    let proxied = client
        .get(format!("{}/metrics", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(mock.api.lock().unwrap().counts.requests, 161);
    assert_eq!(proxied.status(), 200);
    p.stop().await;
}

/// The mock's global limit, per aligned second of its wall clock, where the proxies hold
/// 45 per second: arrivals may bunch when the machine stalls the proxies for a moment (the
/// mock counts arrivals, the proxies space admissions), and 75 leaves a third of a second
/// for that. A proxy without its global limit (the buckets allow 100 per second) goes over
/// it; that two proxies share theirs is checked by [`assert_shared_global`].
const MOCK_GLOBAL: u64 = 75;

/// The proxies' requests, `n` of them, arrived no faster than the global limit they share
/// (45 per second) allows: from the first to the last at least `(n - 1) / 45` seconds, less a
/// quarter for the first one's own delay. Two proxies that did not share it would send at
/// 90 per second, in half that time; a stalled machine only makes it longer.
fn assert_shared_global(api: &MockApi, n: u32) {
    let least = Duration::from_secs(1) * (n - 1) / 45 * 3 / 4;
    let span = api.arrival_span();
    assert!(
        span >= least,
        "{n} requests in {span:?}: faster than 45 per second"
    );
}

/// 10 routes on 2 bucket ids per major parameter, on 2 major parameters: 4 limits of 5
/// calls per 200 ms. Answers the mock and the routes' paths.
fn shared_buckets() -> (MockApi, Vec<String>) {
    let mut api = MockApi::new(MOCK_GLOBAL);
    let mut routes = Vec::new();
    for major in [7u64, 8] {
        for r in 0..10 {
            let route = paceline_client::Route::discord("POST", &format!("/channels/{major}/r{r}"));
            api.route(
                &route,
                &format!("bucket-{}", r % 2),
                Limit {
                    limit: 5,
                    window: SECOND / 5,
                },
            );
            routes.push(format!("/channels/{major}/r{r}"));
        }
    }
    (api, routes)
}

/// `callers` callers, each sending `each` requests with one token through the proxies in
/// turn; answers every status.
async fn send_through(
    proxies: &[&Running],
    routes: &[String],
    callers: usize,
    each: usize,
) -> Vec<u16> {
    let client = http();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let base = proxies[caller % proxies.len()].url.clone();
        let (client, routes) = (client.clone(), routes.to_vec());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..each {
                let path = &routes[(caller * each + i) % routes.len()];
                let r = client
                    .post(format!("{base}{path}"))
                    .header("authorization", "Bot shared-token")
                    .send()
                    .await
                    .unwrap();
                statuses.push(r.status().as_u16());
            }
            statuses
        });
    }
    let mut all = Vec::new();
    while let Some(statuses) = tasks.join_next().await {
        all.extend(statuses.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_share_every_limit() {
    let (api, routes) = shared_buckets();
    let mock = MockServer::start(api).await;
    let redis = paceline_testkit::shared_server().url();
    let a = proxy_on(&mock.url(), "discord", None, &redis).await;
    let b = proxy_on(&mock.url(), "discord", None, &redis).await;
    let statuses = send_through(&[&a, &b], &routes, 32, 5).await;
    assert_eq!(statuses.len(), 160, "every request answered");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    {
        let api = mock.api.lock().unwrap();
        // Alone, each proxy would spend every bucket's 5 calls per window and the 45/s
        // global limit on its own: 429s. Together they keep them.
        assert_eq!(api.counts.bucket_429, 0, "{:?}", api.counts);
        assert_eq!(api.counts.global_429, 0, "{:?}", api.counts);
        assert_eq!(api.counts.requests, 160, "each request sent once");
        assert_shared_global(&api, 160);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_a_redis_cluster_share_every_limit() {
    let (api, routes) = shared_buckets();
    let mock = MockServer::start(api).await;
    let cluster = paceline_testkit::shared_cluster().url();
    let a = proxy_on(&mock.url(), "discord", None, &cluster).await;
    let b = proxy_on(&mock.url(), "discord", None, &cluster).await;
    let statuses = send_through(&[&a, &b], &routes, 16, 5).await;
    assert_eq!(statuses.len(), 80);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    {
        let api = mock.api.lock().unwrap();
        assert_eq!(
            api.counts.bucket_429 + api.counts.global_429,
            0,
            "{:?}",
            api.counts
        );
        assert_eq!(api.counts.requests, 80);
        assert_shared_global(&api, 80);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_max_wait_is_a_429_with_retry_after() {
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
    let p = proxy(&mock.url(), "discord", Some(Duration::from_millis(100))).await;
    let client = http();
    let first = client
        .get(format!("{}/guilds/1/roles", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let second = client
        .get(format!("{}/guilds/1/roles", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    assert_eq!(second.headers()["x-paceline-proxy"], "wait-exceeded");
    let retry: u64 = second.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((50..=60).contains(&retry), "retry-after {retry}");
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(body["error"]["field"], "max_wait");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert_eq!(
        mock.api.lock().unwrap().counts.requests,
        1,
        "never sent upstream"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_fails_only_its_request() {
    // A port nothing listens on, and that no test can be given: port 1 is below the range
    // the system hands out for port 0 (a port bound and dropped here could be handed to a
    // mock of a test running beside this one, which then answered 200).
    let dead = "http://127.0.0.1:1".to_string();
    let p = proxy(&dead, "auto", None).await;
    let client = http();
    for _ in 0..3 {
        let r = client.get(format!("{}/x", p.url)).send().await.unwrap();
        assert_eq!(r.status(), 502);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "bad_gateway", "{body}");
        assert_eq!(body["error"]["field"], "upstream", "{body}");
    }
    p.stop().await;
}

#[tokio::test]
async fn bad_settings_name_the_field() {
    let s = ProxySettings::new("ftp://example.com".parse().unwrap());
    assert_eq!(s.validate().unwrap_err().field(), "upstream");
    let mut s = ProxySettings::new("http://example.com".parse().unwrap());
    s.dialect = "soap".into();
    assert_eq!(s.validate().unwrap_err().field(), "dialect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_beyond_the_cap_get_503() {
    let mock = MockServer::start(MockApi::new(50)).await;
    let mut s = ProxySettings::new(mock.url().parse().unwrap());
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.max_identities = 2;
    let p = Proxy::bind(s).await.unwrap();
    let url = format!("http://{}", p.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(async move {
        let _ = stopped.await;
    }));
    let client = http();
    for (token, status) in [("a", 200), ("b", 200), ("a", 200), ("c", 503), ("b", 200)] {
        let r = client
            .get(format!("{url}/gateway"))
            .header("authorization", token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "token {token}");
        if status == 503 {
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "store_full", "{body}");
            assert_eq!(body["error"]["field"], "authorization", "{body}");
        }
    }
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_limit_said_only_in_the_body_pauses_the_token() {
    let mut api = MockApi::new(50);
    let route = paceline_client::Route::discord("GET", "/search/issues");
    api.inject(&route, paceline_testkit::mock_api::Inject::Secondary403);
    let mock = MockServer::start(api).await;
    let p = proxy(&mock.url(), "github", Some(Duration::from_millis(200))).await;
    let client = http();
    // The 403 would be waited out (60 s with no Retry-After): past max_wait, so its answer
    // is the caller's, body included, and the token is paused.
    let first = client
        .get(format!("{}/search/issues", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 403);
    assert!(first.text().await.unwrap().contains("secondary rate limit"));
    let second = client
        .get(format!("{}/rate_limit", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    assert_eq!(second.headers()["x-paceline-proxy"], "wait-exceeded");
    let metrics = get_text(&client, format!("{}/metrics", p.admin)).await;
    assert!(
        metrics.contains("paceline_proxy_upstream_429_total{scope=\"global\"} 1"),
        "{metrics}"
    );
    assert_eq!(mock.api.lock().unwrap().counts.requests, 1);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_dashboard_shows_outcomes_429s_and_the_buckets_learned() {
    let (api, routes) = shared_buckets();
    let mock = MockServer::start(api).await;
    let p = proxy(&mock.url(), "discord", None).await;
    let statuses = send_through(&[&p], &routes, 4, 5).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let client = http();
    let page = client
        .get(format!("{}/dashboard", p.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("id=\"proxy-section\""));
    let text = get_text(&client, format!("{}/v1/dashboard", p.admin)).await;
    assert!(
        !text.contains("shared-token"),
        "a token is never shown: {text}"
    );
    let data: serde_json::Value = serde_json::from_str(&text).unwrap();
    let proxy = &data["proxy"];
    assert_eq!(proxy["requests"]["forwarded"], 20, "{proxy}");
    assert_eq!(proxy["requests"]["wait_exceeded"], 0);
    assert_eq!(proxy["identities"], 1);
    assert_eq!(proxy["upstream_429"]["bucket"], 0);
    let buckets = proxy["buckets"].as_array().unwrap();
    // The 4 bucket ids (2 per channel) were learned from the mock's headers, limit 5 each.
    let learned: Vec<&serde_json::Value> = buckets
        .iter()
        .filter(|b| {
            b["bucket"]
                .as_str()
                .is_some_and(|id| id.starts_with("bucket-"))
        })
        .collect();
    assert_eq!(learned.len(), 4, "{buckets:?}");
    for b in &learned {
        assert_eq!(b["limit"], 5, "{b}");
        assert_eq!(b["known"], true);
        let identity = b["identity"].as_str().unwrap();
        assert!(
            identity.len() == 6 && identity.bytes().all(|c| c.is_ascii_hexdigit()),
            "{identity}"
        );
    }
    assert_eq!(proxy["buckets_in_redis"], false);
    p.stop().await;
}

/// An upstream that records the request target of every request it reads, as the bytes
/// came, and answers `200` with the body `ok`.
struct Recorder {
    url: String,
    /// The targets received, in order.
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let _ = Recorder::answer(stream, &log).await;
                });
            }
        });
        Recorder { url, seen, task }
    }

    /// Reads one request (its head, then a body of its `content-length`), records its
    /// target and answers.
    async fn answer(mut stream: TcpStream, log: &Mutex<Vec<String>>) -> std::io::Result<()> {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if stream.read(&mut byte).await? == 0 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let target = head.split(' ').nth(1).unwrap_or_default().to_string();
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        log.lock().unwrap().push(target);
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await?;
        stream.shutdown().await
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `GET TARGET HTTP/1.1` to the proxy at `url` byte for byte (no client in between
/// to normalise it): the answer's status and body.
async fn raw_get(url: &str, target: &[u8]) -> (u16, String) {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = b"GET ".to_vec();
    request.extend_from_slice(target);
    request.extend_from_slice(b" HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\r\n");
    stream.write_all(&request).await.unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_stays_below_the_upstreams_base_path() {
    let upstream = Recorder::start().await;
    let p = proxy(&format!("{}/base", upstream.url), "auto", None).await;
    // Sent as they are, less their dot segments, below the base.
    let forwarded = [
        ("/x/y", "/base/x/y"),
        ("/base/x/y", "/base/base/x/y"),
        ("/x/./y", "/base/x/y"),
        ("/x/%2e/y", "/base/x/y"),
        ("/x/../y", "/base/y"),
        ("/x/y/", "/base/x/y/"),
        ("/", "/base/"),
        ("/a%20b/c", "/base/a%20b/c"),
        ("/x?q=1&r=%2e%2e", "/base/x?q=1&r=%2e%2e"),
        ("/x?next=/../../secret", "/base/x?next=/../../secret"),
        ("/group%2Fproject/issues", "/base/group%2Fproject/issues"),
        ("/@evil.example/x", "/base/@evil.example/x"),
        ("/v1.2/.well-known/a..b", "/base/v1.2/.well-known/a..b"),
    ];
    for (target, _) in forwarded {
        let (status, body) = raw_get(&p.url, target.as_bytes()).await;
        assert_eq!((status, body.as_str()), (200, "ok"), "{target}");
    }
    let refused = [
        "/../secret",
        "/..",
        "/%2e%2e/secret",
        "/%2E%2E/secret",
        "/%2e%2E/secret",
        "/.%2e/secret",
        "/%2E./secret",
        "/a/../../secret",
        "/./../secret",
        "/a/%2e%2e/%2e%2e/secret",
        "/..?x=/base/",
        "/..%2fsecret",
        "/..%2Fsecret",
        "/a%2f..%2f..%2fsecret",
        "/..%5csecret",
        "/..\\secret",
        "/a\\..\\..\\secret",
        "/%252e%252e/secret",
        "/..;/secret",
        "/.../secret",
        "/%00/secret",
        "/secret%00.json",
        "/a%0d%0ax-injected:%201",
        "/%zz",
        "//evil.example/secret",
        "//127.0.0.1/secret",
        "/a/..//evil.example/secret",
        "http://evil.example/secret",
        &format!("{}/base/x", upstream.url),
        "*",
    ];
    for target in refused {
        let (status, body) = raw_get(&p.url, target.as_bytes()).await;
        assert_eq!(status, 400, "{target}: {body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["error"]["code"], "invalid_argument", "{target}");
        assert_eq!(problem["error"]["field"], "path", "{target}");
        assert!(problem["error"]["message"].is_string(), "{target}");
    }
    // A raw NUL never gets past the HTTP parser.
    let (status, _) = raw_get(&p.url, b"/a\0/../../secret").await;
    assert_eq!(status, 400);
    let seen = upstream.seen();
    let expected: Vec<String> = forwarded.iter().map(|(_, up)| up.to_string()).collect();
    assert_eq!(
        seen, expected,
        "only the forwarded paths, each below the base"
    );
    assert!(
        seen.iter().all(|path| path.starts_with("/base/")),
        "{seen:?}"
    );
    let metrics = get_text(&http(), format!("{}/metrics", p.admin)).await;
    let line = format!(
        "paceline_proxy_requests_total{{outcome=\"bad_request\"}} {}",
        refused.len()
    );
    assert!(metrics.contains(&line), "{metrics}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_proxys_urls_are_never_shown() {
    // Nothing listens on the upstream's port: every request fails upstream.
    let urls = paceline_testkit::secrets::SecretUrls::start().expect("a redis-server");
    let (store, upstream) = (urls.store.clone(), urls.upstream.as_str());
    let shows_none = |what: &str, text: &str| urls.assert_hidden(what, text);
    let mut s = ProxySettings::new(upstream.parse().unwrap());
    s.store = store;
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    shows_none("Debug of the settings", &format!("{s:?}"));
    assert_eq!(s.upstream_shown(), "http://127.0.0.1:1/base");
    let mut bad = s.clone();
    bad.upstream = "ftp://upstream-user:upstream-pw-5ecret@127.0.0.1:1"
        .parse()
        .unwrap();
    shows_none(
        "a bad upstream's error",
        bad.validate().unwrap_err().message(),
    );
    let p = Proxy::bind(s).await.unwrap();
    let (url, admin) = (
        format!("http://{}", p.local_addr()),
        format!("http://{}", p.admin_addr().unwrap()),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(p.run(async move {
        let _ = stopped.await;
    }));
    let client = http();
    let failed = client.get(format!("{url}/x")).send().await.unwrap();
    assert_eq!(failed.status(), 502);
    let body = failed.text().await.unwrap();
    shows_none("an upstream error", &body);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "bad_gateway");
    assert_eq!(body["error"]["field"], "upstream");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("error sending request")),
        "{body}"
    );
    let (status, body) = raw_get(&url, b"/../x").await;
    assert_eq!(status, 400);
    shows_none("a refused path", &body);
    for page in ["/healthz", "/metrics", "/dashboard", "/v1/dashboard"] {
        let answer = client.get(format!("{admin}{page}")).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{page}");
        shows_none(page, &answer.text().await.unwrap());
    }
    let data: serde_json::Value = client
        .get(format!("{admin}/v1/dashboard"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(data["proxy"]["upstream"], "http://127.0.0.1:1/base");
    assert_eq!(
        data["service"]["store"],
        format!("redis://{}", urls.redis.addr())
    );
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test]
async fn a_concurrency_global_limit_is_refused_naming_the_algorithms_allowed() {
    let mut s = ProxySettings::new("http://example.com".parse().unwrap());
    s.global_limit = Some("concurrency:limit=2,lease=1s".parse().unwrap());
    let e = s.validate().unwrap_err();
    assert_eq!(e.field(), "global_limit");
    assert!(e.message().contains("gcra"), "{}", e.message());
    assert!(e.message().contains("sliding_window"), "{}", e.message());
    let mut s = ProxySettings::new("http://example.com".parse().unwrap());
    s.global_limit = Some("sliding_window:limit=5,window=1s".parse().unwrap());
    assert_eq!(s.validate(), Ok(()));
}

#[tokio::test]
async fn an_upstream_with_a_query_or_fragment_is_refused() {
    for upstream in ["http://example.com/base?key=1", "http://example.com/#x"] {
        let s = ProxySettings::new(upstream.parse().unwrap());
        assert_eq!(s.validate().unwrap_err().field(), "upstream", "{upstream}");
    }
}

/// What limits did to requests is counted by scope, origin and outcome, with no token
/// and no route in the labels: an upstream's shared refusal waited out, and a wait past
/// `max_wait` refused by the proxy itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_waits_are_counted_in_rate_limited_metrics() {
    let mut api = MockApi::new(50);
    let slow = paceline_client::Route::discord("GET", "/guilds/1/roles");
    api.route(
        &slow,
        "slow",
        Limit {
            limit: 1,
            window: 60 * SECOND,
        },
    );
    let shared = paceline_client::Route::discord("GET", "/channels/2/pins");
    api.route(
        &shared,
        "pins",
        Limit {
            limit: 5,
            window: 60 * SECOND,
        },
    );
    api.inject(&shared, paceline_testkit::mock_api::Inject::Shared429(1));
    let mock = MockServer::start(api).await;
    let p = proxy(&mock.url(), "discord", Some(Duration::from_secs(5))).await;
    let client = http();
    let get = |path: &str| {
        client
            .get(format!("{}{path}", p.url))
            .header("authorization", "Bot secret-token")
            .send()
    };
    // Refused (shared, 1 s) and sent again by the proxy.
    assert_eq!(get("/channels/2/pins").await.unwrap().status(), 200);
    assert_eq!(get("/guilds/1/roles").await.unwrap().status(), 200);
    // Its bucket is spent for a minute: the proxy answers 429 itself.
    assert_eq!(get("/guilds/1/roles").await.unwrap().status(), 429);
    let metrics = get_text(&client, format!("{}/metrics", p.admin)).await;
    for line in [
        "paceline_proxy_rate_limited_total{scope=\"shared\",origin=\"upstream\",then=\"wait\"} 1",
        "paceline_proxy_rate_limited_total{scope=\"bucket\",origin=\"local\",then=\"fail\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    // Any other series (a wait for the global limit, as the machine's timing has it) has
    // the same few labels.
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("paceline_proxy_rate_limited_total{"))
    {
        let labels = line
            .split(['{', '}'])
            .nth(1)
            .unwrap_or_default()
            .split(',')
            .map(|l| l.split_once('=').unwrap_or_default())
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect::<Vec<_>>();
        let allowed = |k: &str, v: &str| match k {
            "scope" => ["bucket", "shared", "global", "unknown"].contains(&v),
            "origin" => ["local", "upstream"].contains(&v),
            "then" => ["wait", "fail"].contains(&v),
            _ => false,
        };
        assert!(
            labels.len() == 3 && labels.iter().all(|(k, v)| allowed(k, v)),
            "{line}"
        );
    }
    assert!(!metrics.contains("secret-token") && !metrics.contains("roles"));
    assert_eq!(mock.api.lock().unwrap().counts.requests, 3);
    p.stop().await;
}

/// Three bot tokens behind one proxy, each held to its own global limit against a mock
/// that enforces each one's: one of the default (45/s), one that the proxy learns from
/// `GET /gateway/bot` (a large bot: 500/s), one configured by the SHA-256 of its token
/// (20/s, below the default). None is refused by the mock's global limit, and the large
/// bot sends more in one second than the default allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_gets_its_own_global_limit() {
    each_token_gets_its_own_global_limit_on("memory").await;
}

/// The same with the limits' knowledge in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_gets_its_own_global_limit_on_redis() {
    let redis = paceline_testkit::shared_server().url();
    each_token_gets_its_own_global_limit_on(&redis).await;
}

async fn each_token_gets_its_own_global_limit_on(store: &str) {
    // Bot tokens begin with their bot's user id in base64 (here 1000...01 to 03).
    const SMALL: &str = "Bot MTAwMDAwMDAwMDAwMDAwMDAx.x.secret-a";
    const LARGE: &str = "Bot MTAwMDAwMDAwMDAwMDAwMDAy.x.secret-b";
    const CONFIGURED: &str = "Bot MTAwMDAwMDAwMDAwMDAwMDAz.x.secret-c";
    let mut api = MockApi::new(50);
    api.token(SMALL, 50, 1);
    api.token(LARGE, 550, 16);
    api.token(CONFIGURED, 25, 1);
    let route = paceline_client::Route::discord("POST", "/channels/1/messages");
    api.route(
        &route,
        "messages",
        Limit {
            limit: 1_000,
            window: SECOND,
        },
    );
    let mock = MockServer::start(api).await;
    let mut s = ProxySettings::new(mock.url().parse().unwrap());
    s.store = store.into();
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    s.dialect = "discord".into();
    s.global_limit = Some("gcra:rate=45/s,burst=1".parse().unwrap());
    s.global_limits.insert(
        "sha256:fa0544f75dc488809b0230bd0fcf5d77d057e65915050f224a9a2cf0d35fcb1a".into(),
        "gcra:rate=20/s,burst=1".parse().unwrap(),
    );
    let p = start(s).await;
    let client = http();
    let mut tasks = tokio::task::JoinSet::new();
    for (token, callers, each) in [(SMALL, 10, 12), (LARGE, 25, 12), (CONFIGURED, 5, 8)] {
        for caller in 0..callers {
            let (client, base) = (client.clone(), p.url.clone());
            tasks.spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..each {
                    let r = client
                        .post(format!(
                            "{base}/api/v10/channels/{}/messages",
                            caller * 100 + i
                        ))
                        .header("authorization", token)
                        .send()
                        .await
                        .unwrap();
                    statuses.push(r.status().as_u16());
                }
                statuses
            });
        }
    }
    let mut answered = 0;
    while let Some(statuses) = tasks.join_next().await {
        for s in statuses.unwrap() {
            assert_eq!(s, 200);
            answered += 1;
        }
    }
    assert_eq!(answered, 120 + 300 + 40);
    {
        let api = mock.api.lock().unwrap();
        assert_eq!(api.counts.global_429, 0, "{:?}", api.counts);
        assert_eq!(api.counts.requests, 460);
        // Asked for the two bots not configured.
        assert_eq!(api.counts.gateway_bot, 2);
        assert!(
            api.busiest_second(LARGE) > 50,
            "the large bot sent at most {} in a second",
            api.busiest_second(LARGE)
        );
    }
    let metrics = get_text(&client, format!("{}/metrics", p.admin)).await;
    for source in ["configured", "learned", "default"] {
        let line = format!("paceline_proxy_identities_total{{global_limit=\"{source}\"}} 1");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    assert!(!metrics.contains("secret"), "{metrics}");
    p.stop().await;
}

#[tokio::test]
async fn a_global_limits_key_that_is_not_an_identity_key_is_refused_unshown() {
    let mut s = ProxySettings::new("http://127.0.0.1:1".parse().unwrap());
    s.global_limits.insert(
        "Bot my-secret-token".into(),
        "gcra:rate=10/s".parse().unwrap(),
    );
    let e = s.validate().unwrap_err();
    assert_eq!(e.field(), "global_limits");
    assert!(!e.message().contains("my-secret-token"), "{}", e.message());
    let mut s = ProxySettings::new("http://127.0.0.1:1".parse().unwrap());
    s.global_limits.insert(
        "discord:42".into(),
        "concurrency:limit=5,lease=30s".parse().unwrap(),
    );
    assert_eq!(s.validate().unwrap_err().field(), "global_limits");
}

//! The dashboard of `paceline serve`, in a real browser: Debian's `chromium`, headless
//! (`scripts/test` installs it when it is missing; `PACELINE_CHROMIUM` names another
//! binary). The page loads without console errors, its numbers change after traffic is
//! sent, a key that looks like HTML stays text, and a screenshot is kept under the target
//! directory's `tmp/dashboard.png` (`CARGO_TARGET_TMPDIR`).
//!
//! Chromium runs on virtual time (`--virtual-time-budget`): the page's one-second polls go
//! by without the test waiting for them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{http, start, write};

const TOKEN: &str = "dashboard-test-token-7f3a";
const HOSTILE_KEY: &str = "<img src=x onerror=\"document.body.dataset.pwned=1\">";

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("PACELINE_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser"] {
        let found = Command::new(name).arg("--version").output();
        if found.is_ok_and(|o| o.status.success()) {
            return PathBuf::from(name);
        }
    }
    panic!(
        "the dashboard test needs a headless browser: install Debian's chromium \
         (`apt-get install -y chromium`; scripts/test does) or set PACELINE_CHROMIUM"
    );
}

/// What the browser saw: the page's DOM after its polls, and its console.
struct Visit {
    dom: String,
    console: Vec<String>,
}

/// Opens `url` in headless chromium for a few seconds of virtual time; with `screenshot`,
/// saves one there.
fn visit(url: &str, profile: &Path, screenshot: Option<&Path>) -> Visit {
    let mut command = Command::new(chromium());
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=3500",
        "--window-size=1280,1000",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    match screenshot {
        Some(path) => command.arg(format!("--screenshot={}", path.display())),
        None => command.arg("--dump-dom"),
    };
    let out = command.arg(url).output().expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Visit {
        dom: String::from_utf8_lossy(&out.stdout).into_owned(),
        // Chromium writes the page's console messages (and uncaught errors) as CONSOLE lines.
        console: String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_string)
            .collect(),
    }
}

/// The value of `attribute="..."` on the element with `id`, or on `<body>` (id "body").
fn attribute(dom: &str, id: &str, attribute: &str) -> String {
    let start = if id == "body" {
        dom.find("<body").expect("a body")
    } else {
        dom.find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no element #{id} in the page"))
    };
    let tag_end = start + dom[start..].find('>').expect("the tag ends");
    let tag = &dom[start..tag_end];
    let needle = format!("{attribute}=\"");
    let at = tag
        .find(&needle)
        .unwrap_or_else(|| panic!("#{id} has no {attribute}: {tag}"))
        + needle.len();
    let len = tag[at..].find('"').expect("the value ends");
    tag[at..at + len].to_string()
}

/// Decisions sent in the background while the browser looks: several tenants of `api`
/// (most refused) and servers of `roles`, until dropped; `sent` counts them.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(port: u16) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            std::thread::spawn(move || {
                let mut i = 0u64;
                // Bounded: stops when told, or after 200,000 decisions.
                while !stop.load(Ordering::Relaxed) && i < 200_000 {
                    let (policy, key) = match i % 4 {
                        0 | 1 => ("api", format!("tenant-{}", i % 5)),
                        2 => ("roles", format!("server-{}", i % 3)),
                        _ => ("api", format!("tenant-{}", i % 11)),
                    };
                    decide(port, policy, &key);
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        };
        Traffic {
            stop,
            sent,
            thread: Some(thread),
        }
    }
}

impl Traffic {
    /// True once the sending thread has ended (told to stop, done, or failed).
    fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The text of the element with `id` (no child elements).
fn attribute_text(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the page"));
    let open_end = start + dom[start..].find('>').expect("the tag ends") + 1;
    let close = open_end + dom[open_end..].find('<').expect("the element ends");
    dom[open_end..close].to_string()
}

fn decide(port: u16, policy: &str, key: &str) -> u16 {
    let body = serde_json::json!({"policy": policy, "key": key, "op": "limit"}).to_string();
    let auth = format!("Bearer {TOKEN}");
    http(
        port,
        "POST",
        "/v1/decisions",
        &[("authorization", auth.as_str())],
        body.as_bytes(),
    )
    .status
}

#[test]
fn the_dashboard_shows_live_numbers_in_a_real_browser() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = write(
        dir.path(),
        "dashboard.toml",
        &format!(
            "auth_token = \"{TOKEN}\"\n\
             [policies]\n\
             api = \"gcra:rate=1/h,burst=3\"\n\
             roles = \"fixed_window:limit=2,window=1h\"\n\
             [queues.jobs]\n\
             group_policy = \"fixed_window:limit=1,window=1h\"\n"
        ),
    );
    let service = start(&["--config", &config]);
    let port = service.port;
    let page = format!("http://127.0.0.1:{port}/dashboard");
    let with_token = format!("{page}#token={TOKEN}");

    // The data asks for the token like every /v1 endpoint; the page itself holds none.
    assert_eq!(http(port, "GET", "/v1/dashboard", &[], b"").status, 401);
    let page_reply = http(port, "GET", "/dashboard", &[], b"");
    assert_eq!(page_reply.status, 200);
    assert!(page_reply
        .header("content-security-policy")
        .is_some_and(|csp| csp.contains("default-src 'none'")));
    assert!(
        !page_reply.body.contains("http://") && !page_reply.body.contains("https://"),
        "the page loads nothing from elsewhere"
    );

    // Without the token, the page asks for it.
    let visit_without = visit(&page, &dir.path().join("profile-0"), None);
    assert_eq!(
        attribute(&visit_without.dom, "body", "data-state"),
        "unauthorized"
    );
    assert_eq!(attribute(&visit_without.dom, "body", "data-errors"), "0");

    // Before any traffic.
    let before = visit(&with_token, &dir.path().join("profile-1"), None);
    assert!(before.console.is_empty(), "console: {:?}", before.console);
    assert_eq!(attribute(&before.dom, "body", "data-state"), "ok");
    assert_eq!(attribute(&before.dom, "body", "data-errors"), "0");
    let polls: u32 = attribute(&before.dom, "body", "data-updates")
        .parse()
        .expect("a count");
    assert!(polls >= 2, "the page polled {polls} times");
    assert_eq!(attribute(&before.dom, "total-decisions", "data-value"), "0");
    assert!(before.dom.contains("no key has been refused"));

    // Traffic: 3 + 2 admitted, the rest refused; one key looks like HTML.
    let mut sent = 0;
    let mut refused = 0;
    for (policy, key, times) in [
        ("api", "tenant-a", 7),
        ("roles", HOSTILE_KEY, 5),
        ("api", "tenant-b", 1),
    ] {
        for _ in 0..times {
            let status = decide(port, policy, key);
            sent += 1;
            if status == 429 {
                refused += 1;
            } else {
                assert_eq!(status, 200);
            }
        }
    }
    assert_eq!(refused, 7);
    let auth = format!("Bearer {TOKEN}");
    let enqueue = http(
        port,
        "POST",
        "/v1/queues/jobs/jobs",
        &[("authorization", auth.as_str())],
        br#"{"group": "guild:42"}"#,
    );
    assert!(enqueue.status < 300, "{}", enqueue.body);

    let after = visit(&with_token, &dir.path().join("profile-2"), None);
    assert!(after.console.is_empty(), "console: {:?}", after.console);
    assert_eq!(attribute(&after.dom, "body", "data-errors"), "0");
    assert_eq!(
        attribute(&after.dom, "total-decisions", "data-value"),
        sent.to_string(),
        "the total counts every decision sent"
    );
    // The keys refused most, the hostile one as text (escaped in the DOM), never as markup.
    assert!(after.dom.contains("tenant-a"), "tenant-a is refused most");
    assert!(
        after
            .dom
            .contains("&lt;img src=x onerror=\"document.body.dataset.pwned=1\"&gt;"),
        "the key is shown as text"
    );
    assert!(!after.dom.contains("data-pwned"), "the key ran as markup");
    assert!(!after.dom.contains("<img"), "no image was made of a key");
    // The queue and its group.
    assert!(after.dom.contains("guild:42"), "the queue's group is shown");
    assert!(after.dom.contains("jobs: "), "the queue is shown");

    // Live: with traffic flowing while the page is open, its total grows from poll to poll
    // and the rates are numbers.
    let traffic = Traffic::start(port);
    while traffic.sent.load(Ordering::Relaxed) < 50 && !traffic.finished() {
        std::thread::yield_now();
    }
    assert!(
        traffic.sent.load(Ordering::Relaxed) >= 50,
        "the traffic stopped"
    );
    let live = visit(&with_token, &dir.path().join("profile-3"), None);
    assert!(live.console.is_empty(), "console: {:?}", live.console);
    let first: u64 = attribute(&live.dom, "total-decisions", "data-first")
        .parse()
        .expect("a number");
    let last: u64 = attribute(&live.dom, "total-decisions", "data-value")
        .parse()
        .expect("a number");
    assert!(
        last > first,
        "the total did not change while the page was open ({first} then {last})"
    );
    let rate = attribute_text(&live.dom, "rate-allowed");
    assert!(rate.parse::<f64>().is_ok(), "admitted per second: {rate}");

    // A screenshot, kept for a look, with the traffic still flowing.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    visit(&with_token, &dir.path().join("profile-4"), Some(&shot));
    drop(traffic);
    let file = std::fs::File::open(&shot).expect("chromium saved the screenshot");
    let reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .expect("the screenshot is a PNG");
    let info = reader.info();
    assert_eq!((info.width, info.height), (1280, 1000));
}

#[test]
fn the_proxy_dashboard_shows_outcomes_and_buckets_in_a_real_browser() {
    use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut api = MockApi::new(50);
    for r in 0..4 {
        let route = paceline_client::Route::discord("POST", &format!("/channels/7/r{r}"));
        api.route(
            &route,
            &format!("bucket-{}", r % 2),
            Limit {
                limit: 5,
                window: SECOND,
            },
        );
    }
    let mock = runtime.block_on(MockServer::start(api));
    let (port, admin) = (common::free_port(), common::free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["proxy", "--upstream", &mock.url(), "--dialect", "discord"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the paceline binary starts");
    let _proxy = common::Service { child, port };
    common::wait_for_port(admin);
    for i in 0..6 {
        let reply = http(
            port,
            "POST",
            &format!("/channels/7/r{}", i % 4),
            &[("authorization", "Bot browser-test-token")],
            b"",
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let seen = visit(
        &format!("http://127.0.0.1:{admin}/dashboard"),
        &dir.path().join("profile"),
        None,
    );
    assert!(seen.console.is_empty(), "console: {:?}", seen.console);
    assert_eq!(attribute(&seen.dom, "body", "data-state"), "ok");
    assert_eq!(attribute(&seen.dom, "body", "data-errors"), "0");
    assert!(
        seen.dom
            .contains("<td class=\"text\">forwarded</td><td>6</td>"),
        "the forwarded requests are counted"
    );
    assert!(seen.dom.contains("bucket-0") && seen.dom.contains("bucket-1"));
    assert!(
        !seen.dom.contains("browser-test-token"),
        "a token is never shown"
    );
    assert!(
        !seen.dom.contains("id=\"proxy-section\" hidden"),
        "the proxy's section is shown"
    );
}

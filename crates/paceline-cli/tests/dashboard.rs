//! The dashboard of `paceline serve`, in a real browser: Debian's `chromium`, headless
//! (`scripts/test` installs it when it is missing; `PACELINE_CHROMIUM` names another
//! binary). The page loads without console errors, its numbers change after traffic is
//! sent, a key that looks like HTML stays text, and a screenshot is kept under the target
//! directory's `tmp/dashboard.png` (`CARGO_TARGET_TMPDIR`).
//!
//! The visits that only look run Chromium on virtual time (`--virtual-time-budget`), so
//! the page's one-second polls go by without the test waiting for them; the page watched
//! live (traffic sent while it is open) is driven over the DevTools protocol
//! ([`common::cdp`]), and the test waits for what it must see, never for a time.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::cdp::{self, Browser};
use common::{http, start, write};

const TOKEN: &str = "dashboard-test-token-7f3a";
const HOSTILE_KEY: &str = "<img src=x onerror=\"document.body.dataset.pwned=1\">";

/// What the browser saw: the page's DOM after its polls, and its console.
struct Visit {
    dom: String,
    console: Vec<String>,
}

/// Opens `url` in headless chromium for a few seconds of virtual time; with `screenshot`,
/// saves one there.
fn visit(url: &str, profile: &Path, screenshot: Option<&Path>) -> Visit {
    let mut command = Command::new(cdp::chromium());
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
             roles = \"sliding_log:limit=2,window=1h\"\n\
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
    let mut sent = 0u64;
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

    // Live, in one page left open: the numbers move with the traffic sent meanwhile.
    let mut browser = Browser::open(&with_token);
    let updates = "Number(document.body.dataset.updates)";
    browser.wait_for(&format!("{updates} >= 1"), Duration::from_secs(20));
    let total = "Number(document.getElementById('total-decisions').dataset.value)";
    let shown = browser.eval(total).as_u64().expect("a total");
    assert_eq!(shown, sent, "the page starts from the traffic so far");
    let more = 9;
    for i in 0..more {
        decide(port, "api", &format!("tenant-live-{}", i % 2));
    }
    browser.wait_for(
        &format!("{total} === {}", sent + more),
        Duration::from_secs(20),
    );
    // The polls since give rates (numbers, not "–") and draw the chart.
    let seen = browser.eval(updates).as_u64().expect("a count");
    browser.wait_for(
        &format!("{updates} >= {}", seen + 1),
        Duration::from_secs(20),
    );
    let rate = browser.eval("document.getElementById('rate-allowed').textContent");
    assert!(
        rate.as_str().is_some_and(|r| r.parse::<f64>().is_ok()),
        "admitted per second: {rate}"
    );
    // The queue, and its group once listed (groups are listed at most every 5 s).
    browser.wait_for(
        "document.getElementById('queues').textContent.includes('guild:42')",
        Duration::from_secs(20),
    );
    let queues = browser.eval("document.getElementById('queues').textContent");
    assert!(
        queues
            .as_str()
            .is_some_and(|q| q.contains("jobs: 1 waiting")),
        "{queues}"
    );
    assert_eq!(browser.eval("document.body.dataset.errors"), "0");
    assert!(browser.console.is_empty(), "console: {:?}", browser.console);

    // A screenshot, kept for a look.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    browser.screenshot(&shot);
    drop(browser);
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
    // Both on ports the system picks, read from the proxy's log line.
    let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
    command
        .args(["proxy", "--upstream", &mock.url(), "--dialect", "discord"])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    let (_proxy, ports) = common::launch(&mut command, &["proxying http://", "(admin: http://"]);
    let (port, admin) = (ports[0], ports[1]);
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

/// A call to the service with its token.
fn api(port: u16, method: &str, path: &str, body: &str) -> common::Reply {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![("authorization", auth.as_str())];
    if !body.is_empty() {
        headers.push(("content-type", "application/json"));
    }
    http(port, method, path, &headers, body.as_bytes())
}

/// Clicks the element `selector` names in the page (it must be there).
fn click(browser: &mut Browser, selector: &str) {
    let quoted = serde_json::to_string(selector).expect("a selector");
    let clicked = browser.eval(&format!(
        "(() => {{ const e = document.querySelector({quoted}); if (!e) return false; \
         e.click(); return true; }})()"
    ));
    assert_eq!(clicked, true, "no {selector} to click");
}

/// The text of the element `selector` names, or `null`.
fn text(browser: &mut Browser, selector: &str) -> serde_json::Value {
    let quoted = serde_json::to_string(selector).expect("a selector");
    browser.eval(&format!(
        "document.querySelector({quoted})?.textContent ?? null"
    ))
}

/// The ids of the jobs the queue page lists now.
const LISTED: &str = "Array.from(document.querySelectorAll('#queue-jobs tr[data-job]'), \
                      (r) => r.dataset.job).sort().join(',')";

#[test]
fn the_queue_page_lists_jobs_by_state_and_acts_on_them_in_a_real_browser() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = write(
        dir.path(),
        "queue-page.toml",
        &format!(
            "auth_token = \"{TOKEN}\"\n\
             [queues.work]\n\
             group_policy = \"fixed_window:limit=1,window=1h\"\n"
        ),
    );
    let service = start(&["--config", &config]);
    let port = service.port;
    let wait = Duration::from_secs(20);

    // Jobs in every state: each group starts one job an hour.
    let hostile_payload = "\"<img src=x onerror=\\\"document.body.dataset.pwned=1\\\">\"";
    let big_payload = serde_json::json!({"blob": "x".repeat(40_000)}).to_string();
    for (id, group, payload, extra) in [
        ("doomed", "g-dead", "{\"n\": 0}", ", \"max_attempts\": 1"),
        (
            "hostile",
            "g-hostile",
            hostile_payload,
            ", \"max_attempts\": 1",
        ),
        ("big", "g-big", big_payload.as_str(), ""),
        ("w0", "g-wait", "{\"n\": 0}", ""),
        ("w1", "g-wait", "{\"n\": 1}", ""),
        ("w2", "g-wait", "{\"n\": 2}", ", \"priority\": 2"),
        ("later", "g-later", "{\"n\": 3}", ", \"delay_ms\": 3600000"),
    ] {
        let body =
            format!("{{\"id\": \"{id}\", \"group\": \"{group}\", \"payload\": {payload}{extra}}}");
        let reply = api(port, "POST", "/v1/queues/work/jobs", &body);
        assert_eq!(reply.status, 201, "{id}: {}", reply.body);
    }
    // The first job of each group starts; two fail for good, one with an error that
    // would end a script element.
    let leased = api(
        port,
        "POST",
        "/v1/queues/work/leases",
        r#"{"worker": "page-test", "max_jobs": 10}"#,
    );
    assert_eq!(leased.status, 200, "{}", leased.body);
    let leased = leased.json();
    let jobs = leased["jobs"].as_array().expect("jobs");
    let mut started: Vec<&str> = jobs.iter().filter_map(|j| j["id"].as_str()).collect();
    started.sort_unstable();
    assert_eq!(started, ["big", "doomed", "hostile", "w0"]);
    for job in jobs {
        let id = job["id"].as_str().expect("an id");
        let error = match id {
            "hostile" => "</script><b id=\"bold\">boom</b>",
            "doomed" => "upstream said no",
            _ => continue,
        };
        let body = serde_json::json!({"lease": job["lease"], "error": error}).to_string();
        let failed = api(
            port,
            "POST",
            &format!("/v1/queues/work/jobs/{id}/fail"),
            &body,
        );
        assert_eq!(failed.status, 204, "{}", failed.body);
    }
    let other = api(
        port,
        "POST",
        "/v1/queues/work/jobs",
        r#"{"id": "other", "group": "g-other", "payload": null}"#,
    );
    assert_eq!(other.status, 201, "{}", other.body);
    let stats = api(port, "GET", "/v1/queues/work", "").json();
    assert_eq!(
        (
            &stats["waiting"],
            &stats["active"],
            &stats["scheduled"],
            &stats["dead"]
        ),
        (&3.into(), &2.into(), &1.into(), &2.into()),
        "{stats}"
    );

    let mut browser = Browser::open(&format!("http://127.0.0.1:{port}/dashboard#token={TOKEN}"));
    let page = "document.getElementById('queue-page')";
    browser.wait_for(&format!("Number({page}?.dataset.updates) >= 1"), wait);
    assert_eq!(
        browser.eval(&format!("{page}.hidden")),
        false,
        "the queue page is shown"
    );
    assert_eq!(
        browser.eval("location.href.includes('token')"),
        false,
        "the token left the address bar"
    );
    let counts = text(&mut browser, "#queue-counts");
    assert!(
        counts.as_str().is_some_and(
            |c| c.starts_with("3 waiting, 2 active, 1 scheduled, 2 dead")
                && c.contains("the queue is not paused")
        ),
        "{counts}"
    );

    // Waiting jobs (the tab shown first), then one group's only.
    browser.wait_for(&format!("{LISTED} === 'other,w1,w2'"), wait);
    assert_eq!(
        text(
            &mut browser,
            "#queue-jobs tr[data-job='w2'] td:nth-child(4)"
        ),
        "2",
        "the priority is shown"
    );
    click(
        &mut browser,
        "#queue-groups tr[data-group='g-wait'] button[data-action='jobs']",
    );
    browser.wait_for(&format!("{LISTED} === 'w1,w2'"), wait);
    assert_eq!(text(&mut browser, "#jobs-filter"), "group g-wait only");

    // Scheduled and active jobs; a huge payload is cut short.
    click(&mut browser, "#job-tabs button[data-state='scheduled']");
    browser.wait_for(&format!("{LISTED} === 'later'"), wait);
    click(&mut browser, "#job-tabs button[data-state='active']");
    browser.wait_for(&format!("{LISTED} === 'big,w0'"), wait);
    let shown = text(&mut browser, "#queue-jobs tr[data-job='big'] td.payload");
    let shown = shown.as_str().expect("a payload cell");
    assert!(shown.starts_with("{\"blob\":\"xxx"), "{shown}");
    assert!(shown.ends_with(" more characters)"), "{shown}");
    assert!(shown.len() < 1_100, "{} characters shown", shown.len());

    // Dead jobs: the hostile payload and error are text, never markup.
    click(&mut browser, "#job-tabs button[data-state='dead']");
    browser.wait_for(&format!("{LISTED} === 'doomed,hostile'"), wait);
    assert_eq!(
        text(
            &mut browser,
            "#queue-jobs tr[data-job='hostile'] td.payload"
        ),
        hostile_payload
    );
    assert_eq!(
        text(
            &mut browser,
            "#queue-jobs tr[data-job='hostile'] td.last-error"
        ),
        "</script><b id=\"bold\">boom</b>"
    );
    assert_eq!(
        text(
            &mut browser,
            "#queue-jobs tr[data-job='hostile'] td:nth-child(3)"
        ),
        "1 / 1"
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#queue-page img, #bold').length"),
        0,
        "a payload or an error became markup"
    );
    assert_eq!(browser.eval("'pwned' in document.body.dataset"), false);

    // A group paused until resumed, then resumed, from the page.
    let group = |port: u16, name: &str| {
        api(port, "GET", "/v1/queues/work", "").json()["groups"][name].clone()
    };
    let row = "#queue-groups tr[data-group='g-wait']";
    click(&mut browser, &format!("{row} button[data-action='pause']"));
    browser.wait_for(
        &format!("document.querySelector(\"{row}\")?.dataset.paused === 'true'"),
        wait,
    );
    let paused = group(port, "g-wait");
    assert_eq!(paused["paused"], true, "{paused}");
    assert_eq!(
        paused["paused_until_ms"],
        serde_json::Value::Null,
        "{paused}"
    );
    click(&mut browser, &format!("{row} button[data-action='resume']"));
    browser.wait_for(
        &format!("document.querySelector(\"{row}\")?.dataset.paused === 'false'"),
        wait,
    );
    assert_eq!(group(port, "g-wait")["paused"], false);

    // A group by its name for an hour, and the queue itself, then resumed.
    browser.eval(
        "document.getElementById('pause-for').value = '3600000'; \
         document.getElementById('group-name').value = 'g-other'; true",
    );
    click(&mut browser, "#group-pause");
    let row = "#queue-groups tr[data-group='g-other']";
    browser.wait_for(
        &format!("document.querySelector(\"{row}\")?.dataset.paused === 'true'"),
        wait,
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let paused = group(port, "g-other");
    let until = paused["paused_until_ms"]
        .as_u64()
        .expect("a pause for a time");
    assert!(
        u128::from(until) > now_ms + 3_000_000,
        "paused for an hour: {paused}"
    );
    let shown = text(&mut browser, &format!("{row} td:nth-child(5)"));
    assert!(
        shown
            .as_str()
            .is_some_and(|s| s.starts_with("for another ")),
        "{shown}"
    );
    click(&mut browser, "#group-resume");
    browser.wait_for(
        &format!("document.querySelector(\"{row}\")?.dataset.paused === 'false'"),
        wait,
    );
    assert_eq!(group(port, "g-other")["paused"], false);
    browser.eval("document.getElementById('pause-for').value = ''; true");
    click(&mut browser, "#queue-pause");
    browser.wait_for(&format!("{page}.dataset.paused === 'true'"), wait);
    let stats = api(port, "GET", "/v1/queues/work", "").json();
    assert_eq!(
        (&stats["paused"], &stats["paused_until_ms"]),
        (&true.into(), &serde_json::Value::Null)
    );
    click(&mut browser, "#queue-resume");
    browser.wait_for(&format!("{page}.dataset.paused === 'false'"), wait);
    assert_eq!(
        api(port, "GET", "/v1/queues/work", "").json()["paused"],
        false
    );

    // One dead job retried, then the rest purged (a second click confirms).
    click(
        &mut browser,
        "#queue-jobs tr[data-job='doomed'] button[data-action='retry']",
    );
    browser.wait_for(&format!("{LISTED} === 'hostile'"), wait);
    let retried = api(port, "GET", "/v1/queues/work/jobs/doomed", "").json();
    assert_eq!(retried["state"], "waiting", "{retried}");
    assert!(text(&mut browser, "#queue-message")
        .as_str()
        .is_some_and(|m| m == "retried 1 dead job"));
    click(&mut browser, "#dead-purge");
    assert_eq!(
        browser.eval("document.getElementById('dead-purge').dataset.armed"),
        "true"
    );
    assert_eq!(api(port, "GET", "/v1/queues/work", "").json()["dead"], 1);
    click(&mut browser, "#dead-purge");
    browser.wait_for(&format!("{LISTED} === ''"), wait);
    assert_eq!(api(port, "GET", "/v1/queues/work", "").json()["dead"], 0);
    assert_eq!(
        api(port, "GET", "/v1/queues/work/jobs/hostile", "").status,
        404
    );
    assert_eq!(text(&mut browser, "#queue-message"), "purged 1 dead job");

    // The `completed` tab is offered exactly when the service counts and lists completed
    // jobs (a service without them answers 400 to the listing).
    let listed = api(
        port,
        "GET",
        "/v1/queues/work/jobs?state=completed&limit=1",
        "",
    );
    assert!(matches!(listed.status, 200 | 400), "{}", listed.body);
    let counted = api(port, "GET", "/v1/queues/work", "").json()["completed"].is_number();
    let tab = "#job-tabs button[data-state='completed']";
    assert_eq!(
        browser.eval(&format!("document.querySelector(\"{tab}\").hidden")),
        !(counted && listed.status == 200)
    );
    if counted && listed.status == 200 {
        click(&mut browser, tab);
        browser.wait_for(
            &format!("document.querySelector(\"{tab}\").getAttribute('aria-selected') === 'true'"),
            wait,
        );
    }

    assert_eq!(browser.eval("document.body.dataset.errors"), "0");
    assert!(browser.console.is_empty(), "console: {:?}", browser.console);
    // A screenshot of the queue page, kept for a look.
    browser.eval("document.getElementById('queue-page').scrollIntoView(); true");
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-queue.png");
    browser.screenshot(&shot);
    assert!(shot.metadata().is_ok_and(|m| m.len() > 0));
}

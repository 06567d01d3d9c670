//! paceline's API client limiter beside `@discordjs/rest` (npm) against the same strict mock
//! API, in one run: the same workload (REQUESTS POSTs over 200 routes in 20 buckets from 64
//! concurrent callers; each bucket 10 per second per major parameter, learned only from
//! headers), through
//!
//! 1. paceline's client in-process (the reqwest middleware),
//! 2. four paceline clients sharing one Redis (each with a quarter of the callers),
//! 3. `paceline proxy` (one instance, plain reqwest callers),
//! 4. two `paceline proxy` instances sharing one Redis (half of the callers each),
//! 5. `@discordjs/rest` (one Node process), when `PACELINE_DISCORDJS_NODE_PATH` names a
//!    `node_modules` holding it (`scripts/bench-proxy` installs it).
//!
//! The Redis is a `redis-server` of the run's own, on a free port.
//!
//! Each run gets a fresh mock. Reported: the throughput as a fraction of what the mock's
//! limits allow (the least time in which every bucket could serve its share, over the time
//! taken) and the 429s each caused. Then the proxy's overhead at low load: the p50 of 400
//! sequential GETs of an unlimited route through the proxy (on memory, then on Redis),
//! minus the p50 of the same GETs sent directly.
//!
//! Run: `scripts/bench-proxy`, or `cargo bench -p paceline-server --bench proxy`
//! (`PACELINE_BENCH_REQUESTS`, default 10,000; `PACELINE_BENCH_ONLY=overhead` for the
//! overhead alone, with the Redis function calls it made and the server's time in each).
//! Under `cargo test` it runs a short smoke pass instead.

use std::time::{Duration, Instant};

use paceline_client::headers::Discord;
use paceline_client::middleware::Limited;
use paceline_client::{Client, ClientConfig, Route};
use paceline_server::proxy::{Proxy, ProxySettings};
use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};

const CALLERS: usize = 64;
const LIMIT: u64 = 10;
/// The mock's global limit per aligned second: high, so that the buckets bind.
const MOCK_GLOBAL: u64 = 400;
/// The clients' global limit: at most 400 in any second (380/s and bursts of 20), so never
/// over the mock's, whatever the loopback's jitter.
const CLIENT_GLOBAL: &str = "gcra:rate=380/s,burst=20";

fn paths() -> Vec<String> {
    let mut out = Vec::new();
    for major in [7u64, 8] {
        for r in 0..100 {
            out.push(format!("/channels/{major}/r{r}"));
        }
    }
    out
}

fn mock_api() -> MockApi {
    let mut api = MockApi::new(MOCK_GLOBAL);
    for path in paths() {
        let route = Route::discord("POST", &path);
        let r: u64 = path
            .rsplit('r')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        api.route(
            &route,
            &format!("bucket-{}", r % 10),
            Limit {
                limit: LIMIT,
                window: SECOND,
            },
        );
    }
    api
}

/// The least time in which the mock's limits let `requests` spread evenly over the 20
/// buckets through: each serves its share, `LIMIT` per second from its first request.
fn least_seconds(requests: usize) -> f64 {
    let share = requests.div_ceil(20) as f64;
    ((share - 1.0) / LIMIT as f64).floor()
}

struct Outcome {
    seconds: f64,
    failed: usize,
    refused: u64,
}

/// `CALLERS` callers share `requests`; caller `i` sends to `targets[i % n]`: a base URL
/// and the HTTP client to send with.
async fn run_callers(
    targets: &[(String, reqwest_middleware::ClientWithMiddleware)],
    requests: usize,
) -> (f64, usize) {
    let paths = paths();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (base, http) = targets[caller % targets.len()].clone();
        let (paths, next) = (paths.clone(), next.clone());
        tasks.spawn(async move {
            let mut failed = 0;
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= requests {
                    return failed;
                }
                let url = format!("{base}/api/v10{}", paths[k % paths.len()]);
                match http
                    .post(url)
                    .header("authorization", "Bot bench-token")
                    .body("{\"x\":1}")
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => {}
                    _ => failed += 1,
                }
            }
        });
    }
    let mut failed = 0;
    while let Some(f) = tasks.join_next().await {
        failed += f.unwrap_or(1);
    }
    (start.elapsed().as_secs_f64(), failed)
}

async fn paceline_client(requests: usize) -> Outcome {
    let mock = MockServer::start(mock_api()).await;
    let config = ClientConfig::discord().global(CLIENT_GLOBAL.parse().expect("a policy"));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Limited::discord(Client::new(config, Discord)))
        .build();
    let (seconds, failed) = run_callers(&[(mock.url(), http)], requests).await;
    let refused = refusals(&mock);
    Outcome {
        seconds,
        failed,
        refused,
    }
}

/// Four clients, as four processes would be, sharing what they learn through `redis`.
async fn paceline_clients_on_redis(requests: usize, redis: &str) -> Outcome {
    let mock = MockServer::start(mock_api()).await;
    let config = ClientConfig::discord().global(CLIENT_GLOBAL.parse().expect("a policy"));
    let mut targets = Vec::new();
    for _ in 0..4 {
        let client = Client::open(redis, "Bot bench-token", config.clone(), Discord)
            .await
            .expect("the bench's Redis is up");
        let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(Limited::discord(client))
            .build();
        targets.push((mock.url(), http));
    }
    let (seconds, failed) = run_callers(&targets, requests).await;
    let refused = refusals(&mock);
    Outcome {
        seconds,
        failed,
        refused,
    }
}

fn refusals(mock: &MockServer) -> u64 {
    let api = mock.api.lock().unwrap_or_else(|e| e.into_inner());
    api.counts.bucket_429 + api.counts.global_429
}

async fn start_proxy(
    upstream: &str,
    global: bool,
    store: &str,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let mut s = ProxySettings::new(upstream.parse().expect("the mock's URL"));
    s.listen = "127.0.0.1:0".parse().expect("an address");
    s.store = store.into();
    s.dialect = "discord".into();
    if global {
        s.global_limit = Some(CLIENT_GLOBAL.parse().expect("a policy"));
    }
    let p = Proxy::bind(s).await.expect("the proxy binds");
    let url = format!("http://{}", p.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(p.run(async move {
        let _ = stopped.await;
    }));
    (url, stop)
}

/// `count` proxies on `store`, half of the callers (or all, for one) on each.
async fn paceline_proxies(requests: usize, count: usize, store: &str) -> Outcome {
    let mock = MockServer::start(mock_api()).await;
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build();
    let mut targets = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..count {
        let (url, stop) = start_proxy(&mock.url(), true, store).await;
        targets.push((url, http.clone()));
        stops.push(stop);
    }
    let (seconds, failed) = run_callers(&targets, requests).await;
    for stop in stops {
        let _ = stop.send(());
    }
    let refused = refusals(&mock);
    Outcome {
        seconds,
        failed,
        refused,
    }
}

async fn discordjs(requests: usize) -> Result<Outcome, String> {
    let node_path = std::env::var("PACELINE_DISCORDJS_NODE_PATH").map_err(|_| {
        "PACELINE_DISCORDJS_NODE_PATH is not set (scripts/bench-proxy sets it)".to_string()
    })?;
    let mock = MockServer::start(mock_api()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/discordjs.js");
    let routes = serde_json::to_string(&paths()).map_err(|e| e.to_string())?;
    let out = tokio::process::Command::new("node")
        .arg(script)
        .env("NODE_PATH", node_path)
        .env("BASE", mock.url())
        .env("REQUESTS", requests.to_string())
        .env("CALLERS", CALLERS.to_string())
        .env("ROUTES", routes)
        .env("GLOBAL", "380")
        .output()
        .await
        .map_err(|e| format!("node: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(Outcome {
        seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
        failed: v["failed"].as_u64().unwrap_or(0) as usize,
        refused: refusals(&mock),
    })
}

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// The p50 of `n` sequential GETs of an unlimited route, directly and through a proxy on
/// `store` (without a global limit: its spacing would be the configured rate, not the
/// proxy's cost).
async fn overhead(n: usize, store: &str) -> (Duration, Duration) {
    let mock = MockServer::start(mock_api()).await;
    let (url, stop) = start_proxy(&mock.url(), false, store).await;
    let http = reqwest::Client::new();
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..2 * n {
        // Alternate, so that both see the same moments of the machine.
        let (side, base) = if i % 2 == 0 {
            (0, mock.url())
        } else {
            (1, url.clone())
        };
        let t = Instant::now();
        let r = http
            .get(format!("{base}/gateway/bot"))
            .send()
            .await
            .expect("an answer");
        let _ = r.bytes().await;
        times[side].push(t.elapsed());
    }
    let _ = stop.send(());
    let [direct, proxied] = times;
    (p50(direct), p50(proxied))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let requests = if full {
        std::env::var("PACELINE_BENCH_REQUESTS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10_000)
    } else {
        200
    };
    paceline_testkit::mock_api::install_tls_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let redis = match paceline_testkit::RedisServer::start() {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("no redis-server ({e}): the Redis rows are skipped");
            None
        }
    };
    let least = least_seconds(requests);
    println!("{requests} POSTs over 200 routes in 20 buckets ({LIMIT}/s each), {CALLERS} callers; the limits allow them in {least:.1} s at the least");
    println!();
    println!("| contender | seconds | fraction of the allowed throughput | 429s caused | failed |");
    println!("|---|---|---|---|---|");
    // `PACELINE_BENCH_ONLY=overhead` measures the overhead alone.
    let only_overhead = std::env::var("PACELINE_BENCH_ONLY").is_ok_and(|v| v == "overhead");
    let mut rows = Vec::new();
    if !only_overhead {
        rows.push((
            "paceline client (reqwest middleware)",
            Ok(runtime.block_on(paceline_client(requests))),
        ));
        rows.push((
            "paceline proxy (one)",
            Ok(runtime.block_on(paceline_proxies(requests, 1, "memory"))),
        ));
    }
    if let (Some(redis), false) = (&redis, only_overhead) {
        rows.insert(
            1,
            (
                "paceline clients (four on one Redis)",
                Ok(runtime.block_on(paceline_clients_on_redis(requests, &redis.url()))),
            ),
        );
        rows.push((
            "paceline proxy (two on one Redis)",
            Ok(runtime.block_on(paceline_proxies(requests, 2, &redis.url()))),
        ));
    }
    if full && !only_overhead {
        rows.push(("@discordjs/rest", runtime.block_on(discordjs(requests))));
    }
    for (name, outcome) in rows {
        match outcome {
            Ok(o) => {
                println!(
                    "| {name} | {:.2} | {:.3} | {} | {} |",
                    o.seconds,
                    least / o.seconds,
                    o.refused,
                    o.failed
                );
                if name.starts_with("paceline") {
                    assert_eq!(o.failed, 0, "{name}: every request answered 200");
                }
            }
            Err(e) => eprintln!("skipping {name}: {e}"),
        }
    }
    let n = if full { 400 } else { 20 };
    let mut stores = vec![("memory", "memory".to_string())];
    if let Some(redis) = &redis {
        stores.push(("Redis", redis.url()));
    }
    println!();
    for (name, store) in stores {
        if let (Some(redis), true) = (&redis, name == "Redis") {
            let _ = redis.command(&["CONFIG", "RESETSTAT"]);
        }
        let (direct, proxied) = runtime.block_on(overhead(n, &store));
        if let (Some(redis), true) = (&redis, name == "Redis") {
            // Where the time goes: the Redis function calls per proxied request, and the
            // server's time in each.
            let stats = paceline_testkit::redis_cli(redis.port())
                .args(["INFO", "commandstats"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if let Some(line) = stats.lines().find(|l| l.starts_with("cmdstat_fcall:")) {
                println!("Redis during that run, {n} proxied requests: {line}");
            }
        }
        println!(
            "Proxy overhead at low load, limits on {name} (sequential GETs, p50): direct {} µs, through the proxy {} µs: **{} µs** (goal ≤ 200 µs)",
            direct.as_micros(),
            proxied.as_micros(),
            proxied.as_micros() as i128 - direct.as_micros() as i128
        );
    }
}

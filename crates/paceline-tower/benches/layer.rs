//! An axum hello-world under load, side by side in one run: without a layer; with
//! paceline's layer on the memory store (as an axum app takes it, `for_axum()`), with its
//! `RateLimit` headers and without, and as any service takes it; with tower_governor (the
//! same GCRA quota, by peer IP), with its `x-ratelimit` headers and without; and with
//! paceline's layer on Redis. Every request is admitted (the quota is far above the load),
//! so what is measured is what each layer costs an admitted request.
//!
//! The server and the load generator share one thread (a current-thread tokio runtime made
//! afresh for each measurement): 32 kept-alive HTTP/1.1 connections over loopback, each
//! sending one request after another. On one thread the scheduler cannot favour one
//! configuration by where it puts two threads on the machine's two cores (which made a
//! two-thread version of this bench rank configurations by thread placement, not cost);
//! each request costs the client's work plus the server's, and the layer's cost shows in
//! the difference. Each round measures every configuration once, for `SECONDS` each after
//! a warm-up, in an order rotated from round to round; a configuration's ratio to no layer
//! is taken within each round (the machine's speed drifts between rounds, by as much as a
//! fifth on a shared host), and the table gives the medians over `ROUNDS` rounds. paceline
//! beside tower_governor is also taken within each round: the median, mean, quartiles and
//! rounds won of the ratio, with headers on both and off on both, and each with its default.
//!
//! `cargo bench -p paceline-tower --bench layer [-- WORDS]` (`SECONDS=2 ROUNDS=15` by
//! default; with words, only the configurations whose names hold one of them, beside no layer).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use paceline_store::redis::RedisStore;
use paceline_store::{FailurePolicy, MemoryStore, Policy, SharedStore};
use paceline_tower::{Key, RateLimitLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

const CONNECTIONS: usize = 32;

/// The configurations compared beside each other, by name.
const PACELINE: &str = "paceline layer, memory store";
const PACELINE_BARE: &str = "paceline layer, memory store, no RateLimit headers";
const GOVERNOR: &str = "tower_governor (same GCRA quota)";
const GOVERNOR_HEADERS: &str = "tower_governor, with its x-ratelimit headers";

/// Builds a configuration's app afresh for each measurement.
type MakeApp = Box<dyn Fn() -> Router>;

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// The quota every layer applies: GCRA at 10^9 per second, bursts of 10^6.
fn policy() -> Policy {
    "gcra:rate=1000000000/s,burst=1000000"
        .parse()
        .expect("a policy")
}

/// paceline's layer as an axum app takes it ([`RateLimitLayer::for_axum`]).
fn paceline(store: SharedStore, headers: bool) -> Router {
    hello().layer(layer(store, headers).for_axum())
}

fn layer(store: SharedStore, headers: bool) -> RateLimitLayer {
    RateLimitLayer::builder(store)
        .limit("per-ip", policy(), Key::peer_ip())
        .headers(headers)
        .build()
        .expect("a layer")
}

fn governor() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .expect("a governor config");
    hello().layer(GovernorLayer::new(config))
}

/// tower_governor sending its state on every answer (`x-ratelimit-limit`,
/// `x-ratelimit-remaining`), as paceline's layer sends `RateLimit` by default.
fn governor_with_headers() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("a governor config");
    hello().layer(GovernorLayer::new(config))
}

/// Serves `app` on a thread of its own (for the refusal counts); returns its address.
fn serve(app: Router) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("its address");
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
    });
    addr
}

/// Requests per second `app` answers over `seconds` (after a warm-up of a quarter of that, at
/// most half a second),
/// the server and the load on one thread.
fn measure(app: Router, seconds: f64) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        let done = Arc::new(AtomicU64::new(0));
        let counting = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (done, counting, stop) =
                    (Arc::clone(&done), Arc::clone(&counting), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
                    stream.set_nodelay(true).expect("nodelay");
                    let mut buffer = vec![0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        stream
                            .write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
                            .await
                            .expect("send");
                        let status = read_response(&mut stream, &mut buffer).await;
                        assert_eq!(status, 200, "every request is admitted");
                        if counting.load(Ordering::Relaxed) {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64((seconds / 4.0).min(0.5))).await;
        counting.store(true, Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let count = done.load(Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            let _ = task.await;
        }
        count as f64 / elapsed
    })
}

/// Sends `n` requests one after another on one connection; how many were refused (429).
fn refused_of(addr: SocketAddr, n: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut buffer = vec![0u8; 4096];
        let mut refused = 0;
        for _ in 0..n {
            stream
                .write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
                .await
                .expect("send");
            if read_response(&mut stream, &mut buffer).await == 429 {
                refused += 1;
            }
        }
        refused
    })
}

/// The calls of paceline's Lua the Redis server at `port` has run (`FCALL` and `EVALSHA`),
/// from `INFO commandstats`.
fn redis_calls(port: &str) -> u64 {
    let output = std::process::Command::new("redis-cli")
        .args(["-p", port, "INFO", "commandstats"])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Reads one response (headers, then a `content-length` body); its status.
async fn read_response(stream: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> u16 {
    let mut filled = 0;
    loop {
        if filled == buffer.len() {
            buffer.resize(buffer.len() * 2, 0);
        }
        let n = stream.read(&mut buffer[filled..]).await.expect("read");
        assert!(n > 0, "the server closed the connection");
        filled += n;
        let text = &buffer[..filled];
        let Some(end) = text.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&text[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if filled >= end + 4 + length {
            assert_eq!(filled, end + 4 + length, "one response at a time");
            return head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
    }
}

fn main() {
    // `cargo test` runs this binary without `--bench`: a short pass that checks it works.
    let full = std::env::args().any(|a| a == "--bench");
    let seconds: f64 = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if full { 2.0 } else { 0.05 });
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if full { 15 } else { 1 });
    let redis_server =
        paceline_testkit::RedisServer::start().expect("a redis-server for the bench");
    let redis_url = redis_server.url();
    let redis_store: SharedStore = {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let store = runtime.block_on(async {
            RedisStore::builder(redis_url, FailurePolicy::FailClosed)
                .auto_batch(Duration::ZERO)
                .connect()
                .await
                .expect("the bench's Redis")
        });
        // The store's connection tasks live on this runtime, for the whole run.
        std::mem::forget(runtime);
        Arc::new(store)
    };
    let configs: Vec<(&str, MakeApp)> = vec![
        ("axum, no layer", Box::new(hello)),
        (
            PACELINE,
            Box::new(|| paceline(Arc::new(MemoryStore::new()), true)),
        ),
        (
            PACELINE_BARE,
            Box::new(|| paceline(Arc::new(MemoryStore::new()), false)),
        ),
        (GOVERNOR, Box::new(governor)),
        (GOVERNOR_HEADERS, Box::new(governor_with_headers)),
        (
            "paceline layer, Redis store",
            Box::new({
                let store = Arc::clone(&redis_store);
                move || paceline(Arc::clone(&store), true)
            }),
        ),
        (
            "paceline layer, memory store, any service's body (no for_axum)",
            Box::new(|| hello().layer(layer(Arc::new(MemoryStore::new()), true))),
        ),
    ];
    let configs = common::picked(configs);
    let n = configs.len();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); n];
    for round in 0..rounds {
        let mut this_round = vec![0.0; n];
        for k in 0..n {
            let i = (k + round) % n;
            let (name, app) = &configs[i];
            let rate = measure(app(), seconds);
            eprintln!("round {round}: {name}: {rate:.0} requests/s");
            this_round[i] = rate;
        }
        for i in 0..n {
            rates[i].push(this_round[i]);
            ratios[i].push(this_round[i] / this_round[0]);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "\n| configuration | requests/s (median of {rounds} rounds of {seconds} s) | vs no layer (median of the rounds' ratios) |"
    );
    println!("|---|---:|---:|");
    for (i, (name, _)) in configs.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} |",
            median(rates[i].clone()),
            median(ratios[i].clone())
        );
    }
    // paceline beside tower_governor, the ratio taken within each round.
    let index = |name: &str| configs.iter().position(|(n, _)| *n == name);
    println!("\n| paceline memory / tower_governor, within each round | median | mean | quartiles | rounds won |");
    println!("|---|---:|---:|---:|---:|");
    for (what, paceline, governor) in [
        ("both with their headers", PACELINE, GOVERNOR_HEADERS),
        ("both without headers", PACELINE_BARE, GOVERNOR),
        (
            "each as it comes (paceline with, governor without)",
            PACELINE,
            GOVERNOR,
        ),
    ] {
        let (Some(paceline), Some(governor)) = (index(paceline), index(governor)) else {
            continue;
        };
        let mut within: Vec<f64> = rates[paceline]
            .iter()
            .zip(&rates[governor])
            .map(|(paceline, governor)| paceline / governor)
            .collect();
        within.sort_by(f64::total_cmp);
        let count = within.len();
        let mean = within.iter().sum::<f64>() / count as f64;
        let won = within.iter().filter(|r| **r >= 1.0).count();
        println!(
            "| {what} | {:.3} | {mean:.3} | {:.3}–{:.3} | {won} of {count} |",
            median(within.clone()),
            within[count / 4],
            within[3 * count / 4]
        );
    }

    // A key refused again and again: the Redis calls 1,000 retries cost, with the layer's
    // cache of refusals (on by default on Redis) and without.
    let port = redis_server
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_string();
    println!("\n| 1,000 requests of a key refused for an hour, on Redis | refused | Redis calls |");
    println!("|---|---:|---:|");
    for (name, capacity) in [
        ("cache of refusals on (default)", None),
        ("cache off", Some(0)),
    ] {
        let mut builder = RateLimitLayer::builder(Arc::clone(&redis_store)).limit(
            "per-hour",
            "gcra:rate=1/h".parse().expect("a policy"),
            Key::constant(format!("refused-{name}")),
        );
        if let Some(capacity) = capacity {
            builder = builder.refusal_cache(capacity);
        }
        let addr = serve(hello().layer(builder.build().expect("a layer")));
        let before = redis_calls(&port);
        let refused = refused_of(addr, if full { 1_000 } else { 20 });
        let calls = redis_calls(&port) - before;
        println!("| {name} | {refused} | {calls} |");
    }
    drop(redis_server);
}

//! An axum hello-world under load, side by side in one run: without a layer, with
//! paceline's layer on the memory store, with tower_governor (the same GCRA quota, by peer
//! IP), and with paceline's layer on Redis. Every request is admitted (the quota is far
//! above the load), so what is measured is what each layer costs an admitted request.
//!
//! The server runs on one thread and the load generator on another (the machine's two
//! cores), 32 kept-alive HTTP/1.1 connections sending one request after another. Each
//! configuration runs `ROUNDS` times, interleaved, for `SECONDS` each after a warm-up; the
//! table gives each one's median requests per second and its ratio to no layer.
//!
//! `cargo bench -p paceline-tower --bench layer` (`SECONDS=3 ROUNDS=5` by default).

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

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// The quota every layer applies: GCRA at 10^9 per second, bursts of 10^6.
fn policy() -> Policy {
    "gcra:rate=1000000000/s,burst=1000000"
        .parse()
        .expect("a policy")
}

fn paceline(store: SharedStore) -> Router {
    let layer = RateLimitLayer::builder(store)
        .limit("per-ip", policy(), Key::peer_ip())
        .build()
        .expect("a layer");
    hello().layer(layer)
}

fn governor() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .expect("a governor config");
    hello().layer(GovernorLayer::new(config))
}

/// Serves `app` on one thread; returns its address.
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

/// Requests per second against `addr` over `seconds`, after a warm-up of half a second.
fn load(addr: SocketAddr, seconds: f64) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
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
        tokio::time::sleep(Duration::from_millis(500)).await;
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
    let seconds: f64 = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
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
    let configs: Vec<(&str, SocketAddr)> = vec![
        ("axum, no layer", serve(hello())),
        (
            "paceline layer, memory store",
            serve(paceline(Arc::new(MemoryStore::new()))),
        ),
        ("tower_governor (same GCRA quota)", serve(governor())),
        ("paceline layer, Redis store", serve(paceline(redis_store))),
    ];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (i, (name, addr)) in configs.iter().enumerate() {
            let rate = load(*addr, seconds);
            eprintln!("round {round}: {name}: {rate:.0} requests/s");
            results[i].push(rate);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = results.iter_mut().map(median).collect();
    println!("\n| configuration | requests/s (median of {rounds} × {seconds} s) | vs no layer |");
    println!("|---|---:|---:|");
    for ((name, _), rate) in configs.iter().zip(&medians) {
        println!("| {name} | {rate:.0} | {:.2} |", rate / medians[0]);
    }
    println!(
        "\npaceline memory / tower_governor: {:.2}",
        medians[1] / medians[2]
    );
    drop(redis_server);
}

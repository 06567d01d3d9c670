//! What each layer costs a request, without the network: an axum hello-world called as a
//! tower service on one thread, 200,000 requests per measurement, the best of 7 for each
//! configuration (the least disturbed by the machine), in nanoseconds per request. Beside
//! `benches/layer.rs` (over HTTP), this separates the layer's own work from the noise of
//! sockets: the layer's cost is a configuration's time minus no layer's.
//!
//! `cargo bench -p paceline-tower --bench layer_cost [-- WORDS]`: with words, only the
//! configurations whose names hold one of them (and no layer, the baseline); `REQUESTS=n`:
//! one run of `n` requests each (to count instructions under a profiler).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use paceline_store::{MemoryStore, Policy};
use paceline_tower::{Key, RateLimitLayer};
use tower::{Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// Requests per measurement, and measurements per configuration, with `--bench` (`cargo
/// test` runs this binary without it: a short pass that checks it works).
const REQUESTS: u32 = 200_000;
const RUNS: usize = 7;

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// The quota of `benches/layer.rs`: GCRA at 10^9 per second, bursts of 10^6.
fn policy() -> Policy {
    "gcra:rate=1000000000/s,burst=1000000"
        .parse()
        .expect("a policy")
}

/// paceline's layer, as an axum app takes it ([`RateLimitLayer::for_axum`]) or not.
fn paceline(key: Key, headers: bool, for_axum: bool) -> Router {
    let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
        .limit("per-ip", policy(), key)
        .headers(headers)
        .build()
        .expect("a layer");
    if for_axum {
        hello().layer(layer.for_axum())
    } else {
        hello().layer(layer)
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (requests, runs) = if full { (REQUESTS, RUNS) } else { (1_000, 1) };
    // `REQUESTS=n` for one run of n requests per configuration (for a profiler).
    let (requests, runs) = match std::env::var("REQUESTS").ok().and_then(|n| n.parse().ok()) {
        Some(n) => (n, 1),
        None => (requests, runs),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let governor = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .expect("a governor config");
    let governor_with_headers = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("a governor config");
    let configs: Vec<(&str, Router)> = vec![
        ("axum, no layer", hello()),
        (
            "paceline layer, memory store, by peer IP",
            paceline(Key::peer_ip(), true, true),
        ),
        (
            "paceline layer, no RateLimit headers",
            paceline(Key::peer_ip(), false, true),
        ),
        (
            "paceline layer, no headers, one constant key",
            paceline(Key::constant("k"), false, true),
        ),
        (
            "paceline layer, any service's body (no for_axum)",
            paceline(Key::peer_ip(), true, false),
        ),
        (
            "tower_governor (same GCRA quota), by peer IP",
            hello().layer(GovernorLayer::new(governor)),
        ),
        (
            "an identity layer (axum's own cost of any layer)",
            hello().layer(tower::layer::layer_fn(|service| service)),
        ),
        (
            "tower_governor, with its x-ratelimit headers",
            hello().layer(GovernorLayer::new(governor_with_headers)),
        ),
    ];
    let configs = common::picked(configs);
    let peer: SocketAddr = "192.0.2.7:5555".parse().expect("an address");
    let mut best = vec![f64::MAX; configs.len()];
    for _ in 0..runs {
        for (i, (_, app)) in configs.iter().enumerate() {
            let elapsed = runtime.block_on(async {
                let mut service = app.clone();
                let started = Instant::now();
                for _ in 0..requests {
                    let mut request = http::Request::get("/")
                        .body(Body::empty())
                        .expect("a request");
                    request.extensions_mut().insert(ConnectInfo(peer));
                    let response = ServiceExt::<http::Request<Body>>::ready(&mut service)
                        .await
                        .expect("ready")
                        .call(request)
                        .await
                        .expect("an answer");
                    assert_eq!(response.status(), 200);
                    let body = axum::body::to_bytes(response.into_body(), 1024).await;
                    std::hint::black_box(body.expect("a body"));
                }
                started.elapsed()
            });
            let ns = elapsed.as_nanos() as f64 / f64::from(requests);
            best[i] = best[i].min(ns);
        }
    }
    println!("| configuration | ns per request (best of {runs}) | the layer's own |");
    println!("|---|---:|---:|");
    for ((name, _), ns) in configs.iter().zip(&best) {
        println!("| {name} | {ns:.0} | {:.0} |", ns - best[0]);
    }
}

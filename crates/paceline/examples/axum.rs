// crates/paceline/examples/axum.rs
// Serves http://127.0.0.1:3000/ with limits per client IP:
// cargo run -p paceline --example axum -F tower, then: curl -si localhost:3000/
use std::net::SocketAddr;
use std::sync::Arc;

use axum::{routing::get, Router};
use paceline::store::MemoryStore; // or paceline::open("redis://...", ...) for every instance
use paceline::tower::{Key, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Key::peer_ip().trust_proxies(["10.0.0.0/8"])?; // behind a load balancer
    let limits = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
        .limit(
            "per-second",
            "gcra:rate=10/s,burst=20".parse()?,
            client.clone(),
        )
        .limit(
            "per-day",
            "fixed_window:limit=10000,window=1d".parse()?,
            client.clone(),
        )
        .limit(
            "in-flight",
            "concurrency:limit=4,lease=30s".parse()?,
            client,
        )
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

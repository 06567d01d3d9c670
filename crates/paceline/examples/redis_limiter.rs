// crates/paceline/examples/redis_limiter.rs
// Every worker, on every machine, runs this: together they send at most 10 role updates
// per 10 s per guild.
use paceline::store::{FailurePolicy, RedisStore};
use paceline::Limiter;
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), paceline::Error> {
    let url = std::env::var("PACELINE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6380".to_string());
    let store = RedisStore::builder(url, FailurePolicy::FailClosed)
        .prefix("myapp")
        .connect()
        .await?;
    let limiter = Limiter::with_store("fixed_window:limit=10,window=10s".parse()?, Arc::new(store));
    let decision = limiter.acquire("guild:42", 1).await?;
    println!("acting after {:?}", decision.delay);
    assert!(decision.allowed);
    Ok(())
}

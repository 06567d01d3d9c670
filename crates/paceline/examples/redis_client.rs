// crates/paceline/examples/redis_client.rs
// Every process of a bot opens its client on the same Redis with the same token: what one
// learns from Discord's answers, all of them respect.
use paceline::client::headers::Discord;
use paceline::client::http::{HeaderMap, HeaderValue};
use paceline::client::{After, Client, ClientConfig, Route};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("PACELINE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6380".to_string());
    let token = std::env::var("DISCORD_TOKEN").unwrap_or_else(|_| "example-token".to_string());
    let identity = format!("Bot {token}");
    let limits = Client::open(&url, &identity, ClientConfig::discord(), Discord).await?;

    let mut permit = limits
        .acquire(Route::discord("POST", "/channels/1/messages"))
        .await?;
    permit.sent();
    // ... send the request; then hand back what Discord answered (a bucket of 5 calls, 4
    // left), which every process sharing the token now knows:
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-bucket", HeaderValue::from_static("abcd1234"));
    headers.insert("x-ratelimit-limit", HeaderValue::from_static("5"));
    headers.insert("x-ratelimit-remaining", HeaderValue::from_static("4"));
    headers.insert("x-ratelimit-reset-after", HeaderValue::from_static("5"));
    assert!(matches!(permit.complete(200, &headers, None), After::Done));
    // Before the process exits, so that its last answers reach the others:
    limits.flush().await;
    Ok(())
}

// crates/paceline/examples/paced_per_host.rs
// Paces requests to each host at 10 per second, together with every process that paces
// through the same Redis: cargo run -p paceline --example paced_per_host -F reqwest,redis
use paceline::client::middleware::Paced;
use paceline::open;
use paceline::store::StoreOptions;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = std::env::var("PACELINE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6380".to_string());
    let api = std::env::var("API_URL").unwrap_or_else(|_| "http://example.com".to_string());
    let store = open(&redis, &StoreOptions::new()).await?;
    let pacer = Paced::per_host("gcra:rate=10/s".parse()?, store)?.max_wait(Duration::from_secs(5));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(pacer)
        .build();
    // Each request waits for its host's next slot; one more than 5 s away fails with
    // PaceError::WaitExceeded and is never sent. `.key(|t| ...)` paces by another key.
    for page in 1..=3 {
        let response = http.get(format!("{api}/?page={page}")).send().await?;
        println!("page {page}: {}", response.status());
    }
    Ok(())
}

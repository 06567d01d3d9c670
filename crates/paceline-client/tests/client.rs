//! The async client on tokio's paused clock: no test sleeps in real time.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use paceline_client::headers::Discord;
use paceline_client::{After, Client, ClientConfig, ClientError, Route};
use paceline_store::TokioClock;

fn limits(bucket: &str, remaining: u64, reset_after: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-ratelimit-bucket", bucket.parse().unwrap());
    h.insert("x-ratelimit-limit", "2".parse().unwrap());
    h.insert(
        "x-ratelimit-remaining",
        remaining.to_string().parse().unwrap(),
    );
    h.insert("x-ratelimit-reset-after", reset_after.parse().unwrap());
    h
}

fn client(config: ClientConfig) -> Client {
    Client::with_clock(
        config,
        Box::new(Discord),
        Arc::new(TokioClock::starting_at(1_000_000_000)),
    )
}

#[tokio::test(start_paused = true)]
async fn requests_wait_for_the_reset_the_headers_announced() {
    let c = client(ClientConfig::discord());
    let route = Route::discord("POST", "/channels/1/messages");
    let t0 = c.now_micros();
    let mut p = c.acquire(route.clone()).await.unwrap();
    p.sent();
    assert!(matches!(
        p.complete(200, &limits("b", 0, "5"), None),
        After::Done
    ));
    // Nothing left until the reset, 5 s away on the virtual clock.
    let p = c.acquire(route.clone()).await.unwrap();
    assert_eq!(c.now_micros() - t0, 5_000_000);
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_and_a_dropped_pioneer_give_back_what_they_held() {
    let c = client(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    let pioneer = c.acquire(route.clone()).await.unwrap();
    // A second request waits behind the pioneer; its caller gives up.
    let gave_up = tokio::time::timeout(Duration::from_secs(1), c.acquire(route.clone())).await;
    assert!(gave_up.is_err());
    assert_eq!(c.counts(), (0, 1), "the abandoned wait left its queue");
    // The pioneer's permit dropped before it was sent: the slot is free at once.
    drop(pioneer);
    let t = c.now_micros();
    let next = c.acquire(route.clone()).await.unwrap();
    assert_eq!(c.now_micros(), t);
    next.failed();
    assert_eq!(c.counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_comes_back_as_retry_and_is_admitted_after_its_retry_after() {
    let c = client(ClientConfig::new());
    let route = Route::discord("GET", "/guilds/9/roles");
    let p = c.acquire(route.clone()).await.unwrap();
    let mut h = limits("r", 0, "3");
    h.insert("x-ratelimit-scope", "user".parse().unwrap());
    h.insert("retry-after", "3".parse().unwrap());
    let t = c.now_micros();
    let After::Retry(waiting) = p.complete(429, &h, None) else {
        panic!("a 429 with a retry-after is retried");
    };
    let again = waiting.admitted().await.unwrap();
    assert_eq!(c.now_micros() - t, 3_000_000);
    assert!(matches!(
        again.complete(200, &limits("r", 1, "3"), None),
        After::Done
    ));
}

#[tokio::test(start_paused = true)]
async fn max_wait_fails_fast_with_the_wait_it_would_have_been() {
    let c = client(ClientConfig::new().max_wait(Duration::from_millis(500)));
    let route = Route::discord("GET", "/channels/3/messages");
    let p = c.acquire(route.clone()).await.unwrap();
    p.complete(200, &limits("m", 0, "10"), None);
    let t = c.now_micros();
    let err = c.acquire(route.clone()).await.unwrap_err();
    assert_eq!(c.now_micros(), t, "at once, not after waiting");
    assert_eq!(
        err,
        ClientError::WaitExceeded {
            max_wait: Duration::from_millis(500),
            would_wait: Some(Duration::from_secs(10))
        }
    );
    // A longer deadline of its own waits it out.
    let ok = c.acquire_within(route, Some(Duration::from_secs(11))).await;
    assert!(ok.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_the_client_is_gone_is_done_not_a_hang() {
    let route = Route::discord("GET", "/guilds/9/roles");
    let p = client(ClientConfig::new()).acquire(route).await.unwrap();
    // The temporary client is dropped; the permit lives on.
    tokio::task::yield_now().await;
    let mut h = limits("r", 0, "3");
    h.insert("retry-after", "3".parse().unwrap());
    assert!(matches!(p.complete(429, &h, None), After::Done));
}

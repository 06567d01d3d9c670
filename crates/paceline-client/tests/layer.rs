//! The tower layer over a service that answers from the strict mock API, on tokio's paused
//! clock: no real time passes.

use std::sync::{Arc, Mutex};

use paceline_client::headers::Discord;
use paceline_client::layer::{LimitedError, LimitedLayer};
use paceline_client::{Client, ClientConfig, ClientError, Route};
use paceline_store::TokioClock;
use paceline_testkit::mock_api::{Limit, MockApi, SECOND};
use tower::{Layer, Service, ServiceExt};

/// A service answering from `api` at `clock`'s time.
fn mock_upstream(
    api: &Arc<Mutex<MockApi>>,
    clock: &Arc<TokioClock>,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    let (api, clock) = (Arc::clone(api), Arc::clone(clock));
    tower::service_fn(move |request: http::Request<()>| {
        let (api, clock) = (Arc::clone(&api), Arc::clone(&clock));
        async move {
            use paceline_core::Clock;
            let route = Route::discord(request.method().as_str(), request.uri().path());
            let (status, headers) = api.lock().unwrap().handle(&route, clock.now_micros());
            let mut response = http::Response::new(());
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            *response.headers_mut() = headers;
            Ok::<_, std::convert::Infallible>(response)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn requests_through_the_layer_meet_no_429() {
    let clock = Arc::new(TokioClock::starting_at(1_000 * SECOND));
    let mut api = MockApi::new(50);
    for r in 0..3 {
        let route = Route::discord("POST", &format!("/channels/4/r{r}"));
        api.route(
            &route,
            "shared",
            Limit {
                limit: 3,
                window: SECOND,
            },
        );
    }
    let api = Arc::new(Mutex::new(api));
    let upstream = mock_upstream(&api, &clock);
    let limits = Client::with_clock(ClientConfig::discord(), Box::new(Discord), clock.clone());
    let service = LimitedLayer::discord(limits).layer(upstream);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let service = service.clone();
        tasks.spawn(async move {
            let request = http::Request::post(format!("/channels/4/r{}", i % 3))
                .body(())
                .unwrap();
            service.oneshot(request).await.unwrap().status()
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    let counts = &api.lock().unwrap().counts;
    assert_eq!(
        (counts.requests, counts.bucket_429, counts.global_429),
        (30, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_of_the_limiter_is_its_error_and_nothing_is_sent() {
    let sent = Arc::new(Mutex::new(0));
    let upstream = {
        let sent = Arc::clone(&sent);
        tower::service_fn(move |_: http::Request<()>| {
            *sent.lock().unwrap() += 1;
            async {
                let mut h = http::HeaderMap::new();
                h.insert("x-ratelimit-bucket", "b".parse().unwrap());
                h.insert("x-ratelimit-remaining", "0".parse().unwrap());
                h.insert("x-ratelimit-reset-after", "30".parse().unwrap());
                let mut response = http::Response::new(());
                *response.headers_mut() = h;
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let limits = Client::new(ClientConfig::new(), Discord);
    let mut service = LimitedLayer::discord(limits)
        .max_wait(std::time::Duration::from_secs(1))
        .layer(upstream);
    let first = http::Request::get("/guilds/1").body(()).unwrap();
    service.ready().await.unwrap().call(first).await.unwrap();
    let second = http::Request::get("/guilds/1").body(()).unwrap();
    let err = service
        .ready()
        .await
        .unwrap()
        .call(second)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        LimitedError::Limiter(ClientError::WaitExceeded { .. })
    ));
    assert_eq!(*sent.lock().unwrap(), 1);
}

/// The layer's hooks hear the requests its limits hold back; a request whose extensions
/// say to give up fails at once instead of waiting, and is not sent.
#[tokio::test(start_paused = true)]
async fn the_layer_tells_its_hooks_and_a_request_may_give_up() {
    use paceline_client::{RateLimited, RequestOptions, Then};
    let clock = Arc::new(TokioClock::starting_at(1_000 * SECOND));
    let route = Route::discord("POST", "/channels/4/messages");
    let mut api = MockApi::new(50);
    api.route(
        &route,
        "msgs",
        Limit {
            limit: 2,
            window: SECOND,
        },
    );
    let api = Arc::new(Mutex::new(api));
    let upstream = mock_upstream(&api, &clock);
    let heard: Arc<Mutex<Vec<RateLimited>>> = Arc::default();
    let sink = Arc::clone(&heard);
    let limits = Client::with_clock(ClientConfig::new(), Box::new(Discord), clock.clone());
    let service = LimitedLayer::discord(limits)
        .on_rate_limited(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(upstream);
    let post = || {
        http::Request::post("/channels/4/messages")
            .body(())
            .unwrap()
    };
    // Two calls per second: the third waits for the next window, the fourth goes in it.
    for _ in 0..4 {
        let status = service.clone().oneshot(post()).await.unwrap().status();
        assert_eq!(status, 200);
    }
    {
        let heard = heard.lock().unwrap();
        assert_eq!(heard.len(), 1, "{heard:?}");
        assert_eq!(heard[0].then, Then::Wait);
        assert_eq!(heard[0].bucket.as_deref(), Some("msgs"));
    }
    let mut giving_up = post();
    giving_up
        .extensions_mut()
        .insert(RequestOptions::new().give_up());
    let err = service.clone().oneshot(giving_up).await.unwrap_err();
    assert!(matches!(
        err,
        LimitedError::Limiter(ClientError::RateLimited { wait: Some(_), .. })
    ));
    assert_eq!(heard.lock().unwrap()[1].then, Then::Fail);
    let counts = &api.lock().unwrap().counts;
    assert_eq!((counts.requests, counts.bucket_429), (4, 0));
}

//! The reqwest middleware in front of the strict mock API over loopback HTTP. Counts
//! answers and refusals; asserts no timings.

use std::time::Duration;

use paceline_client::headers::Discord;
use paceline_client::middleware::Limited;
use paceline_client::{Client, ClientConfig, ClientError, Route};
use paceline_testkit::mock_api::{Limit, MockApi, MockServer, SECOND};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_middleware_meet_no_429() {
    let mut api = MockApi::new(50);
    for r in 0..4 {
        let route = Route::discord("PUT", &format!("/guilds/5/members/{r}/roles/9"));
        api.route(
            &route,
            "roles",
            Limit {
                limit: 5,
                window: SECOND / 5,
            },
        );
    }
    let mock = MockServer::start(api).await;
    // Below the mock's 50 per aligned second, with room for loopback jitter.
    let config = ClientConfig::discord().global("gcra:rate=45/s,burst=1".parse().unwrap());
    let limits = Client::new(config, Discord);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Limited::discord(limits))
        .build();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8u64 {
        let (http, base) = (http.clone(), mock.url());
        tasks.spawn(async move {
            let mut ok = 0;
            for i in 0..5 {
                let r = http
                    .put(format!("{base}/guilds/5/members/{}/roles/9", (t + i) % 4))
                    .body("x")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                ok += 1;
            }
            ok
        });
    }
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.unwrap();
    }
    assert_eq!(total, 40);
    let counts = &mock.api.lock().unwrap().counts;
    assert_eq!(
        (counts.bucket_429, counts.global_429, counts.requests),
        (0, 0, 40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_max_wait_is_an_error_naming_it() {
    let mut api = MockApi::new(50);
    let route = Route::discord("GET", "/channels/3/pins");
    api.route(
        &route,
        "pins",
        Limit {
            limit: 1,
            window: 60 * SECOND,
        },
    );
    let mock = MockServer::start(api).await;
    let limits = Client::new(ClientConfig::new(), Discord);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Limited::discord(limits).max_wait(Duration::from_millis(100)))
        .build();
    let url = format!("{}/channels/3/pins", mock.url());
    assert_eq!(http.get(&url).send().await.unwrap().status(), 200);
    let err = http.get(&url).send().await.unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("a middleware error");
    };
    let e = e.downcast::<ClientError>().unwrap();
    assert!(
        matches!(e, ClientError::WaitExceeded { would_wait: Some(w), .. } if w > Duration::from_secs(50))
    );
    assert_eq!(mock.api.lock().unwrap().counts.requests, 1);
}

/// The outbound pacer: requests to one host reserve its policy's slots and wait for them in
/// the store's time (a virtual clock here); hosts are paced apart; a request whose slot is
/// further than `max_wait` fails without being sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pacer_spaces_requests_per_host_in_the_store_s_time() {
    use paceline_client::middleware::{PaceError, Paced};
    use paceline_store::{Clock, ManualClock, MemoryStore, SharedStore};
    use std::sync::Arc;

    let mock = MockServer::start(MockApi::new(1_000)).await;
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store: SharedStore = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let policy: paceline_store::Policy = "gcra:rate=10/s".parse().expect("a policy");
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Paced::per_host(policy.clone(), Arc::clone(&store)).expect("a pacer"))
        .build();
    let base = mock.url();
    let start = clock.now_micros();
    for _ in 0..5 {
        http.get(format!("{base}/gateway"))
            .send()
            .await
            .expect("sent");
    }
    // Slots at 0, 100, 200, 300 and 400 ms: the last request went 400 ms in.
    assert_eq!(clock.now_micros() - start, 400_000);
    // Another host (the same server by another name) has slots of its own.
    let port = base.rsplit(':').next().expect("a port");
    http.get(format!("http://localhost:{port}/gateway"))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        clock.now_micros() - start,
        400_000,
        "no wait for a new host"
    );
    // Within 50 ms the next slot of 127.0.0.1 (100 ms away) cannot be had: not sent.
    let strict = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            Paced::per_host(policy, Arc::clone(&store))
                .expect("a pacer")
                .max_wait(Duration::from_millis(50)),
        )
        .build();
    let err = strict
        .get(format!("{base}/gateway"))
        .send()
        .await
        .expect_err("too far away");
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("not the pacer's error: {err:?}");
    };
    match e.downcast_ref::<PaceError>() {
        Some(PaceError::WaitExceeded {
            key, retry_after, ..
        }) => {
            assert_eq!(key, "paced:127.0.0.1");
            assert_eq!(*retry_after, Duration::from_millis(50));
        }
        other => panic!("{other:?}"),
    }
    let sent = mock.api.lock().expect("the mock").counts.requests;
    assert_eq!(sent, 6, "the refused request never reached the server");
    let concurrency: paceline_store::Policy =
        "concurrency:limit=2,lease=30s".parse().expect("a policy");
    let err = Paced::per_host(concurrency, store).expect_err("cannot pace");
    assert_eq!(err.field(), "policy");
}

/// The pacer on Redis: two clients, each with its own connection to one Redis (as two
/// processes would have), pace requests to one host together: every request takes the
/// policy's next slot, whichever client sends it. Time is a virtual clock both stores read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_sharing_one_redis_limit_pace_together() {
    use paceline_client::middleware::Paced;
    use paceline_store::{Clock, ManualClock, SharedStore};
    use std::sync::Arc;

    let mock = MockServer::start(MockApi::new(1_000)).await;
    let clock = ManualClock::new(1_700_000_000_000_000);
    let redis = paceline_testkit::shared_server();
    let prefix = paceline_testkit::unique_name("paced");
    let policy: paceline_store::Policy = "gcra:rate=10/s".parse().expect("a policy");
    let mut keys = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let store = paceline_testkit::redis_store_on(redis.url(), &prefix, &clock, false).await;
        keys.push(store.redis_key("paced:127.0.0.1"));
        let store: SharedStore = Arc::new(store);
        clients.push(
            reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(Paced::per_host(policy.clone(), store).expect("a pacer"))
                .build(),
        );
    }
    assert_eq!(keys[0], keys[1], "one key in Redis");
    let base = mock.url();
    let start = clock.now_micros();
    // Turn about: each request waits for the slot after the other client's last one
    // (slots 100 ms apart), as one client's requests would.
    for (i, slot_ms) in [0, 100, 200, 300, 400, 500].into_iter().enumerate() {
        let response = clients[i % 2]
            .get(format!("{base}/gateway"))
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 200);
        assert_eq!(
            clock.now_micros() - start,
            slot_ms * 1_000,
            "request {i}, by client {}",
            i % 2
        );
    }
    assert_eq!(
        redis.command(&["EXISTS", &keys[0]]).expect("Redis answers"),
        ":1",
        "the pace is kept in Redis"
    );
    let counts = &mock.api.lock().expect("the mock").counts;
    assert_eq!((counts.requests, counts.ok), (6, 6));
}

/// The middleware's hooks hear a request that gives up (its extension says so) and an
/// upstream's refusal that such a request takes as its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_middleware_tells_its_hooks_and_a_request_may_give_up() {
    use paceline_client::headers::Scope;
    use paceline_client::{Origin, RateLimited, RequestOptions, Then};
    use paceline_testkit::mock_api::Inject;
    use std::sync::{Arc, Mutex};

    let mut api = MockApi::new(50);
    let pins = Route::discord("GET", "/channels/3/pins");
    api.route(
        &pins,
        "pins",
        Limit {
            limit: 1,
            window: 60 * SECOND,
        },
    );
    // Another major parameter than the pins' (whose spent bucket would hold its pioneer).
    let roles = Route::discord("GET", "/guilds/4/roles");
    api.route(
        &roles,
        "roles",
        Limit {
            limit: 5,
            window: 60 * SECOND,
        },
    );
    api.inject(&roles, Inject::Shared429(30));
    let mock = MockServer::start(api).await;
    let heard: Arc<Mutex<Vec<RateLimited>>> = Arc::default();
    let sink = Arc::clone(&heard);
    let limits = Client::new(ClientConfig::new(), Discord);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            Limited::discord(limits).on_rate_limited(move |e| sink.lock().unwrap().push(e.clone())),
        )
        .build();
    let url = format!("{}/channels/3/pins", mock.url());
    assert_eq!(http.get(&url).send().await.unwrap().status(), 200);
    let err = http
        .get(&url)
        .with_extension(RequestOptions::new().give_up())
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("a middleware error");
    };
    let e = e.downcast::<ClientError>().unwrap();
    assert!(
        matches!(e, ClientError::RateLimited { wait: Some(w), .. } if w > Duration::from_secs(50))
    );
    // The shared refusal (30 s) is the answer of a request that gives up, not waited out.
    let refused = http
        .get(format!("{}/guilds/4/roles", mock.url()))
        .with_extension(RequestOptions::new().give_up())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    let heard = heard.lock().unwrap();
    let told: Vec<(Origin, Option<Scope>, Then)> =
        heard.iter().map(|e| (e.origin, e.scope, e.then)).collect();
    assert_eq!(
        told,
        vec![
            (Origin::Local, Some(Scope::Bucket), Then::Fail),
            (Origin::Upstream, Some(Scope::Shared), Then::Fail),
        ]
    );
    assert_eq!(mock.api.lock().unwrap().counts.requests, 2);
}

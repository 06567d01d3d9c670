//! The core's `RateLimited` events, on injected time: each point that tells one (a wait
//! at submit or poll, `WaitExceeded`, an upstream refusal per scope, a request that gives
//! up), and what it carries.

use std::time::Duration;

use http::HeaderMap;
use paceline_client::headers::{Dialect, Discord, Response, Scope};
use paceline_client::{
    ClientConfig, ClientCore, ClientError, Completion, Origin, RateLimited, RequestId,
    RequestOptions, Route, Then,
};

const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;

/// A response's headers: bucket `b`, `remaining` calls left, reset in `reset_after` s.
fn limits(bucket: &str, remaining: u64, reset_after: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-ratelimit-bucket", bucket.parse().unwrap());
    h.insert("x-ratelimit-limit", "5".parse().unwrap());
    h.insert(
        "x-ratelimit-remaining",
        remaining.to_string().parse().unwrap(),
    );
    h.insert("x-ratelimit-reset-after", reset_after.parse().unwrap());
    h
}

/// An event's fields, in order.
type Fields = (
    RequestId,
    Route,
    Option<String>,
    Option<Scope>,
    Option<Duration>,
    Then,
    Origin,
);

fn fields(e: &RateLimited) -> Fields {
    (
        e.id,
        e.route.clone(),
        e.bucket.clone(),
        e.scope,
        e.wait,
        e.then,
        e.origin,
    )
}

/// Sends `route`'s first request at `now` and answers it with `headers`: the bucket is
/// known from then on.
fn learn(core: &mut ClientCore, route: &Route, headers: &HeaderMap, now: u64) {
    let id = core.submit(route.clone(), now, None).unwrap();
    assert_eq!(core.poll(now).go, vec![id]);
    let seen = Discord.read(&Response::new(200, headers), now);
    assert_eq!(core.complete(id, 200, &seen, now), Completion::Done);
    assert!(core.take_rate_limited().is_empty(), "nothing held it");
}

#[test]
fn a_request_waiting_for_its_bucket_is_told_once_at_submit() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    learn(&mut core, &route, &limits("pins", 0, "2"), T0);
    let id = core.submit(route.clone(), T0 + 500 * MS, None).unwrap();
    let told: Vec<Fields> = core.take_rate_limited().iter().map(fields).collect();
    assert_eq!(
        told,
        vec![(
            id,
            route.clone(),
            Some("pins".into()),
            Some(Scope::Bucket),
            Some(Duration::from_millis(1_500)),
            Then::Wait,
            Origin::Local,
        )]
    );
    // Polls while it waits tell nothing more; at the reset it goes.
    assert!(core.poll(T0 + SEC).go.is_empty());
    assert!(core.take_rate_limited().is_empty());
    assert_eq!(core.poll(T0 + 2 * SEC).go, vec![id]);
    assert!(core.take_rate_limited().is_empty());
}

const SEC: u64 = 1_000_000;

#[test]
fn a_wait_past_max_wait_fails_and_is_told_as_a_failure() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    learn(&mut core, &route, &limits("pins", 0, "10"), T0);
    let err = core
        .submit(route.clone(), T0, Some(Duration::from_secs(1)))
        .unwrap_err();
    assert_eq!(
        err,
        ClientError::WaitExceeded {
            max_wait: Duration::from_secs(1),
            would_wait: Some(Duration::from_secs(10)),
        }
    );
    let told = core.take_rate_limited();
    assert_eq!(told.len(), 1);
    assert_eq!(
        (told[0].then, told[0].scope, told[0].wait),
        (
            Then::Fail,
            Some(Scope::Bucket),
            Some(Duration::from_secs(10))
        )
    );
    assert_eq!(core.waiting(), 0);
}

#[test]
fn a_request_still_waiting_at_its_deadline_is_told_as_a_failure() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    let pioneer = core.submit(route.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![pioneer]);
    // Behind the pioneer of an unknown bucket: a wait of unknown length.
    let id = core
        .submit(route.clone(), T0, Some(Duration::from_millis(100)))
        .unwrap();
    let told = core.take_rate_limited();
    assert_eq!(
        (
            told[0].id,
            told[0].then,
            told[0].wait,
            told[0].bucket.clone()
        ),
        (id, Then::Wait, None, None)
    );
    let poll = core.poll(T0 + 100 * MS);
    assert!(matches!(poll.failed[..], [(i, ClientError::WaitExceeded { .. })] if i == id));
    let told = core.take_rate_limited();
    assert_eq!((told.len(), told[0].then), (1, Then::Fail));
}

#[test]
fn a_wait_for_the_global_limit_is_told_at_the_poll_with_its_scope() {
    // One request per second for the token, whatever the route.
    let config = ClientConfig::new().global("gcra:rate=1/s,burst=1".parse().unwrap());
    let mut core = ClientCore::new(config);
    let a = Route::discord("GET", "/channels/1/pins");
    let b = Route::discord("GET", "/channels/2/pins");
    learn(&mut core, &a, &limits("pins", 4, "60"), T0);
    learn(&mut core, &b, &limits("pins", 4, "60"), T0 + SEC);
    // Both buckets have calls left: only the global limit holds the second request.
    let first = core.submit(a.clone(), T0 + 2 * SEC, None).unwrap();
    let second = core.submit(b.clone(), T0 + 2 * SEC, None).unwrap();
    assert!(
        core.take_rate_limited().is_empty(),
        "their buckets let them go"
    );
    assert_eq!(core.poll(T0 + 2 * SEC).go, vec![first]);
    let told = core.take_rate_limited();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (told[0].id, told[0].scope, told[0].wait, told[0].then),
        (
            second,
            Some(Scope::Global),
            Some(Duration::from_secs(1)),
            Then::Wait
        )
    );
    assert_eq!(told[0].route, b);
}

#[test]
fn each_upstream_refusal_is_told_with_its_scope() {
    for (scope_header, global, scope) in [
        ("user", false, Scope::Bucket),
        ("shared", false, Scope::Shared),
        ("global", true, Scope::Global),
    ] {
        let mut core = ClientCore::new(ClientConfig::new());
        let route = Route::discord("POST", "/channels/1/messages");
        let id = core.submit(route.clone(), T0, None).unwrap();
        assert_eq!(core.poll(T0).go, vec![id]);
        let mut h = limits("msgs", 0, "3");
        h.insert("x-ratelimit-scope", scope_header.parse().unwrap());
        h.insert("retry-after", "3".parse().unwrap());
        if global {
            h.insert("x-ratelimit-global", "true".parse().unwrap());
        }
        let seen = Discord.read(&Response::new(429, &h), T0);
        assert_eq!(core.complete(id, 429, &seen, T0), Completion::Retry);
        let told: Vec<Fields> = core.take_rate_limited().iter().map(fields).collect();
        assert_eq!(
            told,
            vec![(
                id,
                route.clone(),
                Some("msgs".into()),
                Some(scope),
                Some(Duration::from_secs(3)),
                Then::Wait,
                Origin::Upstream,
            )],
            "{scope_header}"
        );
        // The refusal said it waits: its pause is not told again.
        assert!(core.poll(T0 + SEC).go.is_empty());
        assert!(core.take_rate_limited().is_empty(), "{scope_header}");
        assert_eq!(core.poll(T0 + 3 * SEC).go, vec![id], "{scope_header}");
    }
}

#[test]
fn a_refusal_out_of_retries_is_told_as_a_failure() {
    let mut config = ClientConfig::new();
    config.max_retries = 0;
    let mut core = ClientCore::new(config);
    let route = Route::discord("POST", "/channels/1/messages");
    let id = core.submit(route.clone(), T0, None).unwrap();
    core.poll(T0);
    let mut h = limits("msgs", 0, "3");
    h.insert("retry-after", "3".parse().unwrap());
    let seen = Discord.read(&Response::new(429, &h), T0);
    assert_eq!(core.complete(id, 429, &seen, T0), Completion::Done);
    let told = core.take_rate_limited();
    assert_eq!(
        (told[0].then, told[0].origin),
        (Then::Fail, Origin::Upstream)
    );
}

#[test]
fn a_request_that_gives_up_fails_at_once_naming_the_wait() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    learn(&mut core, &route, &limits("pins", 0, "2"), T0);
    let err = core
        .submit_with(route.clone(), T0, RequestOptions::new().give_up())
        .unwrap_err();
    assert_eq!(
        err,
        ClientError::RateLimited {
            scope: Some(Scope::Bucket),
            wait: Some(Duration::from_secs(2)),
        }
    );
    assert!(err.to_string().contains("2s"), "{err}");
    let told = core.take_rate_limited();
    assert_eq!((told.len(), told[0].then), (1, Then::Fail));
    assert_eq!(core.waiting(), 0, "it never queued");
    // A request that may go at once is not held back by giving up.
    let other = Route::discord("GET", "/channels/2/pins");
    let id = core
        .submit_with(other, T0, RequestOptions::new().give_up())
        .unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
}

#[test]
fn a_request_that_gives_up_fails_at_the_poll_that_finds_it_held() {
    let config = ClientConfig::new().global("gcra:rate=1/s,burst=1".parse().unwrap());
    let mut core = ClientCore::new(config);
    let a = Route::discord("GET", "/channels/1/pins");
    let b = Route::discord("GET", "/channels/2/pins");
    learn(&mut core, &a, &limits("pins", 4, "60"), T0);
    learn(&mut core, &b, &limits("pins", 4, "60"), T0 + SEC);
    let first = core.submit(a, T0 + 2 * SEC, None).unwrap();
    let second = core
        .submit_with(b, T0 + 2 * SEC, RequestOptions::new().give_up())
        .unwrap();
    let poll = core.poll(T0 + 2 * SEC);
    assert_eq!(poll.go, vec![first]);
    assert_eq!(
        poll.failed,
        vec![(
            second,
            ClientError::RateLimited {
                scope: Some(Scope::Global),
                wait: Some(Duration::from_secs(1)),
            }
        )]
    );
    let told = core.take_rate_limited();
    assert_eq!((told.len(), told[0].then), (1, Then::Fail));
    assert_eq!(core.waiting(), 0);
}

#[test]
fn a_refusal_of_a_request_that_gives_up_is_its_answer() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("POST", "/channels/1/messages");
    let id = core
        .submit_with(route, T0, RequestOptions::new().give_up())
        .unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
    let mut h = limits("msgs", 0, "3");
    h.insert("retry-after", "3".parse().unwrap());
    let seen = Discord.read(&Response::new(429, &h), T0);
    assert_eq!(core.complete(id, 429, &seen, T0), Completion::Done);
    let told = core.take_rate_limited();
    assert_eq!(
        (told[0].then, told[0].origin, told[0].wait),
        (Then::Fail, Origin::Upstream, Some(Duration::from_secs(3)))
    );
    assert_eq!(core.in_flight() + core.waiting(), 0);
}

#[test]
fn events_not_taken_are_capped() {
    let mut core = ClientCore::new(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    learn(&mut core, &route, &limits("pins", 0, "60"), T0);
    for _ in 0..paceline_client::MAX_RATE_LIMITED + 10 {
        core.submit(route.clone(), T0, None).unwrap();
    }
    let told = core.take_rate_limited();
    assert_eq!(told.len(), paceline_client::MAX_RATE_LIMITED);
    // The oldest went: the last kept is the last submitted.
    assert_eq!(
        told.last().map(|e| e.id),
        Some(paceline_client::MAX_RATE_LIMITED as u64 + 10)
    );
}

/// The async client, on tokio's paused clock, in front of the strict mock API: its hooks
/// hear a wait, a refusal of the upstream, and a request that gives up.
#[tokio::test(start_paused = true)]
async fn the_client_tells_its_hooks() {
    use paceline_client::{After, Client};
    use paceline_store::TokioClock;
    use paceline_testkit::mock_api::{Inject, Limit, MockApi};
    use std::sync::{Arc, Mutex};

    let clock = Arc::new(TokioClock::starting_at(T0));
    let route = Route::discord("GET", "/guilds/3/roles");
    let mut api = MockApi::new(50);
    api.route(
        &route,
        "roles",
        Limit {
            limit: 1,
            window: 2 * SEC,
        },
    );
    let api = Arc::new(Mutex::new(api));
    let client = Client::with_clock(ClientConfig::new(), Box::new(Discord), clock.clone());
    let heard: Arc<Mutex<Vec<RateLimited>>> = Arc::default();
    let sink = Arc::clone(&heard);
    client.on_rate_limited(move |e| sink.lock().unwrap().push(e.clone()));
    // Sends a request through the client to the mock: its answer's status.
    let send = |permit: paceline_client::Permit| {
        use paceline_core::Clock;
        let (status, headers) = api.lock().unwrap().handle(&route, clock.now_micros());
        (status, permit.complete(status, &headers, None))
    };

    let (status, after) = send(client.acquire(route.clone()).await.unwrap());
    assert!(status == 200 && matches!(after, After::Done));
    assert!(heard.lock().unwrap().is_empty());
    // The bucket is spent for 2 s: one that gives up fails, one that waits is told so.
    let err = client
        .acquire_with(route.clone(), RequestOptions::new().give_up())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ClientError::RateLimited {
            scope: Some(Scope::Bucket),
            ..
        }
    ));
    let (status, _) = send(client.acquire(route.clone()).await.unwrap());
    assert_eq!(status, 200);
    {
        let heard = heard.lock().unwrap();
        let told: Vec<(Then, Option<Scope>, Option<Duration>)> =
            heard.iter().map(|e| (e.then, e.scope, e.wait)).collect();
        assert_eq!(
            told,
            vec![
                (
                    Then::Fail,
                    Some(Scope::Bucket),
                    Some(Duration::from_secs(2))
                ),
                (
                    Then::Wait,
                    Some(Scope::Bucket),
                    Some(Duration::from_secs(2))
                ),
            ]
        );
    }
    // A shared-scope refusal of the upstream, waited out.
    api.lock().unwrap().inject(&route, Inject::Shared429(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, after) = send(client.acquire(route.clone()).await.unwrap());
    assert_eq!(status, 429);
    let After::Retry(waiting) = after else {
        panic!("a shared refusal with a retry-after is waited out");
    };
    let (status, _) = send(waiting.admitted().await.unwrap());
    assert_eq!(status, 200);
    let heard = heard.lock().unwrap();
    let last = heard.last().unwrap();
    assert_eq!(
        (last.origin, last.scope, last.then, last.bucket.as_deref()),
        (
            Origin::Upstream,
            Some(Scope::Shared),
            Then::Wait,
            Some("roles")
        )
    );
    assert_eq!(heard.len(), 3, "{heard:?}");
}

/// A shared core (its knowledge in Redis) learns only when to ask again: a wait is told
/// with no scope, and a request that gives up fails at the answer that holds it.
#[test]
fn a_shared_core_tells_waits_without_a_scope_and_fails_those_giving_up() {
    use paceline_client::knowledge::{Admission, Grant, Wait};
    let mut core = ClientCore::shared(ClientConfig::new());
    let route = Route::discord("GET", "/channels/1/pins");
    let waits = core.submit(route.clone(), T0, None).unwrap();
    let gives_up = core
        .submit_with(route.clone(), T0, RequestOptions::new().give_up())
        .unwrap();
    assert!(core.take_rate_limited().is_empty(), "it cannot tell yet");
    let asks = core.asks(T0);
    let held = Admission {
        spent: None,
        grants: vec![Grant {
            admitted: Vec::new(),
            moved: None,
            wait: Wait::Until(T0 + 5 * SEC),
        }],
    };
    let poll = core.granted(asks, held, T0);
    assert!(poll.go.is_empty());
    assert_eq!(
        poll.failed,
        vec![(
            gives_up,
            ClientError::RateLimited {
                scope: None,
                wait: Some(Duration::from_secs(5)),
            }
        )]
    );
    let told: Vec<(RequestId, Option<Scope>, Option<Duration>, Then)> = core
        .take_rate_limited()
        .iter()
        .map(|e| (e.id, e.scope, e.wait, e.then))
        .collect();
    assert_eq!(
        told,
        vec![
            (waits, None, Some(Duration::from_secs(5)), Then::Wait),
            (gives_up, None, Some(Duration::from_secs(5)), Then::Fail),
        ]
    );
    assert_eq!(core.waiting(), 1);
}

/// A known bucket that keeps its last call back while another route of its major
/// parameter sends its pioneer holds its own request until its window ends: that wait is
/// the bucket's, not the global limit's (which Discord's rules also have).
#[test]
fn a_call_kept_back_for_a_pioneer_is_told_as_the_bucket_s_wait() {
    let mut core = ClientCore::new(ClientConfig::discord());
    let known = Route::discord("GET", "/channels/1/pins");
    learn(&mut core, &known, &limits("pins", 1, "5"), T0);
    let unknown = Route::discord("GET", "/channels/1/messages");
    let pioneer = core.submit(unknown, T0 + SEC, None).unwrap();
    assert_eq!(core.poll(T0 + SEC).go, vec![pioneer]);
    let held = core.submit(known, T0 + SEC, None).unwrap();
    assert!(core.poll(T0 + SEC).go.is_empty());
    let told = core.take_rate_limited();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (told[0].id, told[0].scope, told[0].wait),
        (held, Some(Scope::Bucket), Some(Duration::from_secs(4)))
    );
}

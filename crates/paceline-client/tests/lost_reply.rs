//! A call to Redis whose answer is lost after Redis applied it.
//!
//! The test kit's relay ([`LostReplies`]) sits between one process and a private
//! `redis-server`: when told to, it passes a call of the client limiter's function on to
//! Redis, waits for Redis to answer, drops the answer and closes the process's connection. The process makes the
//! call once more under the same id and gets the first answer: what it admitted counts
//! once, and a second process of the same identity is held back only as long as the
//! request really is in flight, not for the in-flight lease.

mod common;
use common::minute_of_five;

use paceline_client::knowledge::Wait;
use paceline_client::redis::RedisKnowledge;
use paceline_client::{ClientConfig, ClientCore, Poll, Route};
use paceline_core::StoreErrorKind;
use paceline_testkit::lost_reply::LostReplies;
use paceline_testkit::{connect, RedisServer};

const T0: u64 = 1_700_000_000_000_000;

/// What a call of the limiter's function holds, as redis-rs sends it.
const FCALL: &[u8] = b"\r\nFCALL\r\n";

/// Tells `knowledge` what `core` has to tell and asks what may go, at `now`, until nothing
/// more can be asked now (a queue refiled under its route's learned bucket asks again at
/// once); answers the last poll, with every request that went.
async fn poll(knowledge: &RedisKnowledge, core: &mut ClientCore, now: u64) -> Poll {
    let mut go = Vec::new();
    loop {
        let events = core.take_events();
        let asks = core.asks(now);
        let (_, admission) = knowledge
            .round(&events, &asks.asks, now)
            .await
            .expect("Redis answers");
        let mut poll = core.granted(asks, admission, now);
        go.append(&mut poll.go);
        if poll.next.is_none_or(|t| t > now) || go.len() > 100 {
            poll.go = go;
            return poll;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_admission_whose_answer_was_lost_counts_once() {
    let server = RedisServer::start().expect("a private redis-server");
    let proxy = LostReplies::start(server.port()).await.expect("a relay");
    let config = ClientConfig::new();
    let identity = "Bot lost-answers";
    // Process A reaches Redis through the proxy, B directly.
    let a = RedisKnowledge::new(connect(&proxy.url()).await, identity, &config).on_caller_clock();
    let b = RedisKnowledge::new(connect(&server.url()).await, identity, &config).on_caller_clock();
    let mut core_a = ClientCore::shared(config.clone());
    let mut core_b = ClientCore::shared(config);
    let route = Route::discord("GET", "/channels/1/messages");
    // A call that changes nothing loads the function through the proxy.
    a.admit(&[], T0).await.expect("Redis answers");

    // A's pioneer: the answer to its admission is lost once.
    proxy.lose_next(FCALL, 1);
    let pioneer = core_a.submit(route.clone(), T0, None).unwrap();
    let went = poll(&a, &mut core_a, T0).await;
    assert_eq!(proxy.lost(), 1, "the answer was lost");
    assert_eq!(went.go, vec![pioneer], "the pioneer goes all the same");

    // B: the route's pioneer is in flight, so B's request waits for its answer.
    let held = core_b.submit(route.clone(), T0 + 1, None).unwrap();
    let asks = core_b.asks(T0 + 1);
    let admission = b.admit(&asks.asks, T0 + 1).await.expect("Redis answers");
    assert!(admission.grants[0].admitted.is_empty());
    assert_eq!(admission.grants[0].wait, Wait::Event);
    core_b.granted(asks, admission, T0 + 1);

    // The pioneer's answer comes, and is told: B's request goes at once, not after the
    // in-flight lease.
    core_a.complete(pioneer, 200, &minute_of_five(4), T0 + 2);
    poll(&a, &mut core_a, T0 + 2).await;
    let went = poll(&b, &mut core_b, T0 + 3).await;
    assert_eq!(went.go, vec![held], "the route is known to every process");

    // Two more of A's, the answer to their admission lost: they spend two calls of the
    // three left, not four.
    proxy.lose_next(FCALL, 1);
    let two = vec![
        core_a.submit(route.clone(), T0 + 4, None).unwrap(),
        core_a.submit(route.clone(), T0 + 4, None).unwrap(),
    ];
    let went = poll(&a, &mut core_a, T0 + 4).await;
    assert_eq!(proxy.lost(), 2, "the answer was lost");
    assert_eq!(went.go, two);
    let three = [
        core_b.submit(route.clone(), T0 + 5, None).unwrap(),
        core_b.submit(route.clone(), T0 + 5, None).unwrap(),
        core_b.submit(route.clone(), T0 + 5, None).unwrap(),
    ];
    let went = poll(&b, &mut core_b, T0 + 5).await;
    assert_eq!(went.go, vec![three[0]], "one call left");
    assert_eq!(core_b.waiting(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_whose_answer_is_lost_twice_fails() {
    let server = RedisServer::start().expect("a private redis-server");
    let proxy = LostReplies::start(server.port()).await.expect("a relay");
    let config = ClientConfig::new();
    let a = RedisKnowledge::new(connect(&proxy.url()).await, "Bot lost", &config).on_caller_clock();
    a.admit(&[], T0).await.expect("Redis answers");
    let mut core = ClientCore::shared(config);
    core.submit(Route::discord("GET", "/channels/1/messages"), T0, None)
        .unwrap();
    proxy.lose_next(FCALL, 2);
    let asks = core.asks(T0);
    let error = a
        .admit(&asks.asks, T0)
        .await
        .expect_err("both answers were lost");
    assert_eq!(proxy.lost(), 2, "made once more, not again");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    // The next call, under a new id, learns that the pioneer is in flight: it was
    // admitted once, by the first of the two.
    let admission = a.admit(&asks.asks, T0 + 1).await.expect("Redis answers");
    assert!(admission.grants[0].admitted.is_empty());
    assert_eq!(admission.grants[0].wait, Wait::Event);
}

//! A queue's events: every kind told with what it carries, in order, on a virtual clock; a
//! slow listener told how many it missed; in Redis, the events of every handle sharing the
//! queue, nothing published while nobody listens, and a lost subscription told, not hidden.
//! (That Redis tells the same events as memory, in the same order, for random scripts, is
//! checked by the differential test in `redis.rs`.)

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock};
use paceline_queue::core::UNTIL_RESUMED;
use paceline_queue::{
    Event, EventKind, Events, Failure, MemoryQueue, NewJob, Queue, QueueConfig, Watched,
};
use paceline_testkit::{runtime, unique_name, RedisServer};

mod common;
use common::redis::open_at;

const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;

/// Every event `events` holds now (memory: each call's events are sent as it returns).
fn drain(events: &mut Events) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(w) = events.try_next() {
        match w {
            Watched::Event(e) => out.push(e),
            Watched::Missed(n) => panic!("missed {n} events"),
        }
    }
    out
}

/// The next `n` events of `events`, waiting for them (from Redis, they come over the
/// network); fails the test if they do not come within a minute.
async fn next_events(events: &mut Events, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), events.next()).await {
            Ok(Some(Watched::Event(e))) => out.push(e),
            other => panic!("after {out:?}: {other:?} instead of an event"),
        }
    }
    out
}

fn memory_queue(clock: &ManualClock, config: QueueConfig) -> Queue {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    Queue::new(MemoryQueue::with_clock("events", config, shared).unwrap())
}

#[test]
fn each_change_is_told_once_in_order_with_what_it_carries() {
    runtime().block_on(async {
        let clock = ManualClock::new(T0);
        let config = QueueConfig::new("gcra:rate=100/s,burst=100".parse().unwrap())
            .max_attempts(2)
            .lease(Duration::from_secs(1))
            .retry_backoff(Duration::from_millis(100), Duration::from_millis(100));
        let q = memory_queue(&clock, config);
        // Nobody listens yet: nothing is kept for later.
        q.enqueue(NewJob::new("g", b"before".to_vec()).id("before"))
            .await
            .unwrap();
        q.cancel("before").await.unwrap();
        let mut events = q.events().await.unwrap();
        assert!(drain(&mut events).is_empty(), "nothing from before");

        let a = q.enqueue(NewJob::new("g", b"a".to_vec())).await.unwrap();
        let leased = q.lease("w1", 1, None, Duration::ZERO).await.unwrap();
        q.ack(&leased[0].id, &leased[0].token).await.unwrap();
        let got = drain(&mut events);
        assert_eq!(
            got,
            [
                Event::new(EventKind::Enqueued, T0).job(&a.id, "g"),
                Event::new(EventKind::Started, T0)
                    .job(&a.id, "g")
                    .attempt(1)
                    .worker("w1"),
                Event::new(EventKind::Acked, T0).job(&a.id, "g"),
            ]
        );

        // A failure with an attempt left: failed, then retried at the backoff's end.
        let b = q.enqueue(NewJob::new("g", b"b".to_vec())).await.unwrap();
        let leased = q.lease("w1", 1, None, Duration::ZERO).await.unwrap();
        let retry = Failure::Retry {
            error: Some("upstream 502".into()),
            after: Some(Duration::from_millis(250)),
        };
        q.fail(&leased[0].id, &leased[0].token, retry)
            .await
            .unwrap();
        let got = drain(&mut events);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(
            got[2],
            Event::new(EventKind::Failed, T0)
                .job(&b.id, "g")
                .attempt(1)
                .error(Some("upstream 502"))
        );
        assert_eq!(
            got[3],
            Event::new(EventKind::Retried, T0)
                .job(&b.id, "g")
                .at(T0 + 250 * MS)
        );

        // Its second lease runs out: lease_expired, then dead (no attempt left).
        clock.advance(Duration::from_millis(250));
        let leased = q.lease("w2", 1, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased[0].attempt, 2);
        clock.advance(Duration::from_secs(1));
        q.stats().await.unwrap();
        let now = T0 + 1_250 * MS;
        let got = drain(&mut events);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].kind, EventKind::Started);
        assert_eq!(
            got[1],
            Event::new(EventKind::LeaseExpired, now)
                .job(&b.id, "g")
                .attempt(2)
        );
        assert_eq!(got[2].kind, EventKind::Dead);
        assert_eq!(
            got[2].error.as_deref(),
            Some("the lease expired on attempt 2 of 2")
        );

        // Retried by hand: back in line at once.
        assert_eq!(q.retry_dead(None).await.unwrap(), 1);
        assert_eq!(
            drain(&mut events),
            [Event::new(EventKind::Retried, now).job(&b.id, "g").at(now)]
        );

        // Pauses: a group's for a time, the queue's until resumed, a worker's for its
        // upstream's refusal (with the job); a hand-back is no event.
        q.pause(Some("g"), Some(Duration::from_secs(5)))
            .await
            .unwrap();
        q.pause(None, None).await.unwrap();
        q.resume(None).await.unwrap();
        q.resume(Some("g")).await.unwrap();
        let leased = q.lease("w1", 1, None, Duration::ZERO).await.unwrap();
        q.fail(&leased[0].id, &leased[0].token, Failure::Release)
            .await
            .unwrap();
        let leased = q.lease("w1", 1, None, Duration::ZERO).await.unwrap();
        let pause = Failure::PauseGroup {
            error: Some("429".into()),
            pause: Duration::from_secs(2),
        };
        q.fail(&leased[0].id, &leased[0].token, pause)
            .await
            .unwrap();
        let got = drain(&mut events);
        let mut group_pause = Event::new(EventKind::Paused, now).at(now + 5_000 * MS);
        group_pause.group = Some("g".into());
        assert_eq!(got[0], group_pause);
        assert_eq!(got[1], Event::new(EventKind::Paused, now).at(UNTIL_RESUMED));
        let kinds: Vec<EventKind> = got[2..].iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::Started, EventKind::Started, EventKind::Paused]
        );
        assert_eq!(
            got[4],
            Event::new(EventKind::Paused, now)
                .job(&b.id, "g")
                .at(now + 2_000 * MS)
        );

        // A fatal failure: failed, then dead, with its error.
        clock.advance(Duration::from_secs(2));
        let leased = q.lease("w1", 1, None, Duration::ZERO).await.unwrap();
        let fatal = Failure::Fatal {
            error: Some("no such role".into()),
        };
        q.fail(&leased[0].id, &leased[0].token, fatal)
            .await
            .unwrap();
        let got = drain(&mut events);
        let kinds: Vec<EventKind> = got.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::Started, EventKind::Failed, EventKind::Dead]
        );
        assert_eq!(got[2].error.as_deref(), Some("no such role"));
    });
}

#[test]
fn a_listener_that_falls_behind_is_told_how_many_it_missed_and_goes_on() {
    runtime().block_on(async {
        let clock = ManualClock::new(T0);
        let config =
            QueueConfig::new("gcra:rate=100/s,burst=100".parse().unwrap()).max_jobs(100_000);
        let q = memory_queue(&clock, config);
        let mut slow = q.events().await.unwrap();
        let n = paceline_queue::events::EVENT_BUFFER + 10;
        let jobs = (0..n).map(|i| NewJob::new("g", vec![i as u8])).collect();
        for answer in q.enqueue_batch(jobs).await {
            answer.unwrap();
        }
        assert_eq!(slow.next().await, Some(Watched::Missed(10)));
        let rest = drain(&mut slow);
        assert_eq!(rest.len(), paceline_queue::events::EVENT_BUFFER);
        assert!(rest.iter().all(|e| e.kind == EventKind::Enqueued));
        // The queue's handles gone, the feed ends.
        drop(q);
        assert_eq!(slow.next().await, None);
    });
}

#[test]
fn redis_tells_every_handles_events_and_publishes_none_while_nobody_listens() {
    let server = RedisServer::start().unwrap();
    runtime().block_on(async {
        let name = unique_name("events");
        let config = || QueueConfig::new("gcra:rate=100/s,burst=100".parse().unwrap());
        let listener = Queue::new(open_at(&server.url(), &name, config(), None).await);
        let producer = open_at(&server.url(), &name, config(), None).await;
        let count_key = format!("{}evcount", producer.key_base());
        let producer = Queue::new(producer);
        // Nobody listens: the calls make no events and publish nothing.
        producer
            .enqueue(NewJob::new("g", b"unseen".to_vec()))
            .await
            .unwrap();
        assert_eq!(server.command(&["GET", &count_key]).unwrap().trim(), "$-1");
        assert_eq!(
            server
                .command(&["EXISTS", &count_key.replace("evcount", "watch")])
                .unwrap()
                .trim(),
            ":0"
        );

        let mut events = listener.events().await.unwrap();
        let job = producer
            .enqueue(NewJob::new("g", b"seen".to_vec()))
            .await
            .unwrap();
        let leased = producer.lease("w", 2, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 2);
        let got = next_events(&mut events, 3).await;
        // Two calls, two messages: the count says so.
        let count = paceline_testkit::redis_cli(server.port())
            .args(["GET", &count_key])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&count.stdout).trim(), "2");
        assert_eq!(got[0].kind, EventKind::Enqueued);
        assert_eq!(got[0].id.as_deref(), Some(job.id.as_str()));
        assert_eq!(got[1].kind, EventKind::Started);
        assert_eq!(got[2].kind, EventKind::Started);
        assert!(got.iter().all(|e| e.group.as_deref() == Some("g")));

        // The count of messages goes back (as when a server restarts without its data):
        // told as missed, then heard as before.
        server.command(&["SET", &count_key, "0"]).unwrap();
        let again = producer
            .enqueue(NewJob::new("g", b"after a reset".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), events.next())
                .await
                .unwrap(),
            Some(Watched::Missed(0))
        );
        let got = next_events(&mut events, 1).await;
        assert_eq!(got[0].id.as_deref(), Some(again.id.as_str()));

        // Its subscription cut: the listener is told, then hears what comes next.
        server
            .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), events.next())
                .await
                .unwrap(),
            Some(Watched::Missed(0))
        );
        // Followed again once the missed word is out; what the producer does next arrives.
        let mut heard = Vec::new();
        for round in 0..200 {
            producer.ack(&leased[0].id, &leased[0].token).await.ok();
            producer
                .enqueue(NewJob::new("g", vec![round]))
                .await
                .unwrap();
            match tokio::time::timeout(Duration::from_millis(300), events.next()).await {
                Ok(Some(Watched::Event(e))) => {
                    heard.push(e);
                    break;
                }
                Ok(Some(Watched::Missed(_))) | Err(_) => {}
                Ok(None) => panic!("the feed ended"),
            }
        }
        assert!(!heard.is_empty(), "events after the subscription came back");
    });
}

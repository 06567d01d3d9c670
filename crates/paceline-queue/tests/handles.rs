//! Handles on one queue in Redis: another process's enqueue wakes a waiting lease, a job
//! goes to exactly one of them, a queue keeps its store's clock, and a group's backlog gets
//! the estimates it gets in memory.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::ManualClock;
use paceline_queue::{LeaseToken, NewJob, Queue, QueueConfig, QueueError};
use paceline_testkit::{runtime, shared_server, unique_name};

mod common;
use common::redis::open_at;

/// `token` with its last digit changed: the token of no lease.
fn forged(token: &LeaseToken) -> LeaseToken {
    let mut text = token.to_string();
    let last = if text.ends_with('0') { "1" } else { "0" };
    text.replace_range(text.len() - 1.., last);
    text.parse().expect("48 hex digits")
}

/// Discord's role grants (10 per 10 s per server) through Redis on the server's clock: ids and estimates as in memory.
#[test]
fn a_group_backlog_gets_the_seed_estimates_in_redis() {
    runtime().block_on(async {
        let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse().unwrap());
        let q = Queue::new(
            open_at(
                &shared_server().url(),
                &unique_name("discord"),
                config,
                None,
            )
            .await,
        );
        // One call: one time for all 25.
        let jobs = (0..25u8).map(|n| NewJob::new("guild:1", vec![n])).collect();
        let estimates: Vec<u64> = q
            .enqueue_batch(jobs)
            .await
            .into_iter()
            .map(|e| e.unwrap().estimated_start)
            .collect();
        // Windows aligned to the epoch, 10 jobs in each.
        let window = 10_000_000;
        let now = estimates[0];
        let next_window = (now / window + 1) * window;
        for (n, estimate) in estimates.iter().enumerate() {
            let expected = if n < 10 {
                now
            } else {
                next_window + (n as u64 / 10 - 1) * window
            };
            assert_eq!(*estimate, expected, "job {n}");
        }
        let leased = q.lease("w", 100, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 10, "one window's worth starts now");
    });
}

/// Two handles on one queue (two processes): one enqueues, the other's waiting lease wakes
/// at once through the queue's channel, and a job is leased by exactly one of them. The
/// producer opens the queue from the store's URL, the worker on a store it opened already
/// (behind a cache of refusals, which hands the queue the Redis store beneath it).
#[test]
fn handles_share_a_queue_and_wake_each_other() {
    runtime().block_on(async {
        let name = unique_name("shared");
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap());
        let url = shared_server().url();
        let producer = Queue::open(&url, &name, config.clone()).await.unwrap();
        let options = paceline_store::StoreOptions::new().refusal_cache(16);
        let store = paceline_store::open(&url, &options).await.unwrap();
        let worker = Queue::with_store(&store, &name, config).await.unwrap();
        let memory = paceline_store::open("memory", &options).await.unwrap();
        match Queue::attach("memory", &name).await {
            Err(QueueError::Input(e)) => assert_eq!(e.field(), "store"),
            other => panic!("a memory queue cannot be attached to: {other:?}"),
        }
        // On a store without Redis, the queue is this process's own: it holds no job of
        // the shared one.
        let own = Queue::with_store(&memory, &name, producer.config().clone())
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let worker = worker.clone();
            async move { worker.lease("w", 1, None, Duration::from_secs(30)).await }
        });
        // Let the lease call reach its wait.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let job = producer
            .enqueue(NewJob::new("g", b"hello".to_vec()))
            .await
            .unwrap();
        let leased = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the enqueue woke the waiting lease")
            .unwrap()
            .unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(leased[0].id, job.id);
        assert_eq!(leased[0].payload, b"hello");
        assert!(producer
            .lease("w2", 1, None, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            producer.ack(&leased[0].id, &forged(&leased[0].token)).await,
            Err(QueueError::LeaseLost { id: job.id.clone() })
        );
        worker.ack(&leased[0].id, &leased[0].token).await.unwrap();
        let stats = producer.stats().await.unwrap();
        assert_eq!((stats.totals.enqueued, stats.totals.acked), (1, 1));
        let attached = Queue::attach(&url, &name).await.unwrap();
        assert_eq!(attached.stats().await.unwrap().totals.acked, 1);
        assert_eq!(own.stats().await.unwrap().totals.enqueued, 0);
    });
}

/// A queue on a store that was given a clock keeps that clock's time, as the store's own
/// decisions do (here, for the estimate of a job's start).
#[test]
fn a_queue_on_a_store_keeps_the_stores_clock() {
    runtime().block_on(async {
        let at = 1_700_000_000_000_000;
        let clock = ManualClock::new(at);
        let options = paceline_store::StoreOptions::new().clock(Arc::new(clock.clone()));
        let store = paceline_store::open(&shared_server().url(), &options)
            .await
            .unwrap();
        let config = QueueConfig::new("gcra:rate=1/s".parse().unwrap());
        let queue = Queue::with_store(&store, &unique_name("clock"), config)
            .await
            .unwrap();
        assert_eq!(queue.now_micros(), at);
        let first = queue
            .enqueue(NewJob::new("g", b"1".to_vec()))
            .await
            .unwrap();
        let second = queue
            .enqueue(NewJob::new("g", b"2".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            (first.estimated_start, second.estimated_start),
            (at, at + 1_000_000)
        );
    });
}

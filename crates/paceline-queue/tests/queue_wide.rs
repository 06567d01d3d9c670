//! Limits over a whole queue, above its groups': a policy on every start and a cap on the
//! jobs leased at once, on a virtual clock. (Redis answers as memory does under them too:
//! `redis.rs`.)

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, Policy};
use paceline_queue::{MemoryQueue, NewJob, Queue, QueueConfig, QueueCore, QueueError};
use paceline_store::TokioClock;

const MS: u64 = 1_000;

fn policy(spec: &str) -> Policy {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn core(config: QueueConfig) -> QueueCore {
    QueueCore::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn add(q: &mut QueueCore, group: &str) {
    q.enqueue(0, NewJob::new(group, b"x".to_vec()))
        .unwrap_or_else(|e| panic!("{e}"));
}

fn groups(q: &mut QueueCore, now: u64) -> Vec<String> {
    let leased = q
        .lease(now, "w", 100, None)
        .unwrap_or_else(|e| panic!("{e}"));
    leased.into_iter().map(|l| l.group).collect()
}

#[test]
fn the_queue_policy_holds_every_start_and_a_refused_group_keeps_its_turn_and_its_limit() {
    // Each group one start an hour; the queue 50 a second with a burst of 2.
    let config = QueueConfig::new(policy("fixed_window:limit=1,window=1h"))
        .queue_policy(policy("gcra:rate=50/s,burst=2"));
    let mut q = core(config);
    for g in ["a", "b", "c", "d"] {
        add(&mut q, g);
    }
    assert_eq!(groups(&mut q, 0), ["a", "b"]);
    // The queue says when: 20 ms on, one more (c, whose turn it was, and whose own hourly
    // start the queue's refusal did not spend).
    assert_eq!(q.next_event(), Some(20 * MS));
    assert_eq!(groups(&mut q, 19 * MS), Vec::<String>::new());
    assert_eq!(groups(&mut q, 20 * MS), ["c"]);
    assert_eq!(groups(&mut q, 40 * MS), ["d"]);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn the_queue_cap_holds_the_jobs_leased_at_once() {
    let config = QueueConfig::new(policy("gcra:rate=1000/s,burst=100")).queue_concurrency(2);
    let mut q = core(config);
    for g in ["a", "a", "b", "c"] {
        add(&mut q, g);
    }
    let first = q.lease(0, "w", 10, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.len(), 2);
    // Full: the next event is a lease's end (30 s), not the waiting groups.
    assert_eq!(q.next_event(), Some(30_000 * MS));
    assert_eq!(groups(&mut q, MS), Vec::<String>::new());
    q.ack(MS, &first[0].id, first[0].lease)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups(&mut q, MS).len(), 1);
    assert_eq!(groups(&mut q, MS), Vec::<String>::new());
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn queue_wide_limits_are_refused_where_they_cannot_hold() {
    let field = |e: paceline_core::InputError| e.field().to_string();
    let base = || QueueConfig::new(policy("gcra:rate=10/s"));
    for (config, named) in [
        (
            base().queue_policy(policy("concurrency:limit=5,lease=30s")),
            "queue_policy",
        ),
        (
            base().queue_policy(policy("gcra:rate=1/s")).partitions(2),
            "queue_policy",
        ),
        (
            base().queue_concurrency(3).partitions(4),
            "queue_concurrency",
        ),
    ] {
        assert_eq!(config.validate().map_err(field), Err(named.to_string()));
        assert!(matches!(QueueCore::new(config), Err(e) if e.field() == named));
    }
    assert_eq!(base().queue_concurrency(3).validate(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_worker_waiting_on_a_full_queue_wakes_when_a_job_ends() {
    let clock = TokioClock::new();
    let start = clock.now_micros();
    let config = QueueConfig::new(policy("gcra:rate=1000/s,burst=100")).queue_concurrency(1);
    let memory = MemoryQueue::with_clock("q", config, Arc::new(clock.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    let queue = Queue::new(memory);
    for g in ["a", "b"] {
        queue
            .enqueue(NewJob::new(g, b"x".to_vec()))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let held = queue
        .lease("w", 10, None, Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(held.len(), 1);
    let waiting = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.lease("w", 10, None, Duration::from_secs(20)).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    queue
        .ack(&held[0].id, &held[0].token)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let next = waiting
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e: QueueError| panic!("{e}"));
    assert_eq!(next.len(), 1);
    // Woken by the ack, not by its wait (or the lease's 30 s) running out.
    assert!(clock.now_micros() < start + 20_000_000);
}

/// In Redis: a tool attaching to the queue reads its queue-wide limits back, and a lease
/// there keeps to them.
#[cfg(feature = "redis")]
#[test]
fn a_queue_in_redis_keeps_its_queue_wide_limits() {
    paceline_testkit::runtime().block_on(async {
        let url = paceline_testkit::shared_server().url();
        let name = paceline_testkit::unique_name("wide");
        let config = QueueConfig::new(policy("gcra:rate=1000/s,burst=100"))
            .queue_policy(policy("fixed_window:limit=3,window=1h"))
            .queue_concurrency(2);
        let queue = Queue::open(&url, &name, config.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for g in ["a", "b", "c", "d"] {
            queue
                .enqueue(NewJob::new(g, b"x".to_vec()))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let first = queue
            .lease("w", 10, None, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.len(), 2, "the cap");
        for job in &first {
            queue
                .ack(&job.id, &job.token)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let next = queue
            .lease("w", 10, None, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(next.len(), 1, "3 an hour over the queue");
        let attached = Queue::attach(&url, &name)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                &attached.config().queue_policy,
                attached.config().queue_concurrency
            ),
            (&config.queue_policy, 2)
        );
    });
}

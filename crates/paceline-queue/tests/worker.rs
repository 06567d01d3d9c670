//! The async queue and its worker on tokio's paused clock: time moves only while every
//! task sleeps, so a minute of work runs at once and every time is exact.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paceline_core::{Op, Policy};
use paceline_queue::{Failure, JobState, MemoryQueue, NewJob, Queue, QueueConfig, Report, Worker};
use paceline_store::TokioClock;

const T0: u64 = 1_700_000_000_000_000;
const S: u64 = 1_000_000;

fn queue(config: QueueConfig) -> Queue {
    let backend = MemoryQueue::with_clock("q", config, Arc::new(TokioClock::starting_at(T0)))
        .unwrap_or_else(|e| panic!("{e}"));
    Queue::new(backend)
}

fn config(spec: &str) -> QueueConfig {
    QueueConfig::new(spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}")))
}

/// Waits (on the paused clock) until the queue holds no job waiting, scheduled or active.
async fn until_empty(q: &Queue) {
    loop {
        let s = q.stats().await.expect("stats");
        if s.waiting + s.active + s.scheduled == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_lease_wakes_when_a_job_arrives_and_when_a_group_becomes_eligible() {
    let q = queue(config("fixed_window:limit=1,window=10s"));
    let producer = q.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        producer
            .enqueue(NewJob::new("g", b"a".to_vec()))
            .await
            .expect("enqueue");
        producer
            .enqueue(NewJob::new("g", b"b".to_vec()))
            .await
            .expect("enqueue");
    });
    let first = q
        .lease("w", 1, None, Duration::from_secs(60))
        .await
        .expect("lease");
    assert_eq!(first[0].started, T0 + 3 * S / 2, "woken by the enqueue");
    // The second waits for the group's next window, which the lease sleeps until.
    let second = q
        .lease("w", 1, None, Duration::from_secs(60))
        .await
        .expect("lease");
    let window = 10 * S;
    assert_eq!(second[0].started, (T0 / window + 1) * window);
    // Nothing more: the wait runs out with an empty answer.
    let none = q
        .lease("w", 1, None, Duration::from_secs(5))
        .await
        .expect("lease");
    assert!(none.is_empty());
    assert!(q
        .lease("w", 1, None, Duration::from_secs(301))
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn a_worker_runs_every_job_within_each_groups_policy() {
    let spec = "fixed_window:limit=2,window=1s";
    let q = queue(config(spec));
    for i in 0..30u8 {
        q.enqueue(NewJob::new(format!("g{}", i % 3), vec![i]))
            .await
            .expect("enqueue");
    }
    let starts: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
    let seen = starts.clone();
    let clock = TokioClock::starting_at(T0);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(q.clone()).name("w1").concurrency(4);
    let running = tokio::spawn(worker.run(
        move |job| {
            let seen = seen.clone();
            let now = paceline_core::Clock::now_micros(&clock);
            async move {
                seen.lock()
                    .expect("starts")
                    .entry(job.group.clone())
                    .or_default()
                    .push(now);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(())
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    until_empty(&q).await;
    stop.send(()).ok();
    let report = running.await.expect("worker").expect("run");
    assert_eq!(
        report,
        Report {
            acked: 30,
            ..Report::default()
        }
    );
    let policy: Policy = spec.parse().expect("spec");
    for (group, times) in starts.lock().expect("starts").iter() {
        assert_eq!(times.len(), 10, "{group}");
        let mut state = None;
        for &t in times {
            let d = policy.apply(&mut state, t, Op::Limit, 1).expect("replay");
            assert!(d.allowed, "{group} started at {t} over {spec}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_long_job_and_a_shutdown_hands_back_an_unfinished_one() {
    let q = queue(config("gcra:rate=100/s,burst=10").lease(Duration::from_secs(3)));
    let long = q
        .enqueue(NewJob::new("g", b"long".to_vec()))
        .await
        .expect("enqueue");
    let stuck = q
        .enqueue(NewJob::new("g", b"stuck".to_vec()))
        .await
        .expect("enqueue");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(q.clone())
        .concurrency(2)
        .shutdown_grace(Duration::from_secs(1));
    let running = tokio::spawn(worker.run(
        |job| async move {
            if job.payload == b"long" {
                // Ten leases long: heartbeats keep it.
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            } else {
                std::future::pending::<()>().await;
                Ok(())
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(q.job(&long.id).await.expect("job"), None, "acked");
    assert_eq!(
        q.job(&stuck.id).await.expect("job").map(|j| j.attempts),
        Some(1),
        "still on its first lease"
    );
    stop.send(()).ok();
    let report = running.await.expect("worker").expect("run");
    assert_eq!((report.acked, report.handed_back), (1, 1));
    let back = q.job(&stuck.id).await.expect("job").expect("still queued");
    assert_eq!((back.state, back.attempts), (JobState::Waiting, 0));
}

#[tokio::test(start_paused = true)]
async fn a_handler_s_failure_retries_and_a_429_pauses_its_group() {
    let q = queue(config("gcra:rate=100/s,burst=10").max_attempts(2));
    let flaky = q
        .enqueue(NewJob::new("a", b"flaky".to_vec()))
        .await
        .expect("enqueue");
    q.enqueue(NewJob::new("b", b"limited".to_vec()))
        .await
        .expect("enqueue");
    let calls: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let log = calls.clone();
    let clock = TokioClock::starting_at(T0);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Worker::new(q.clone()).run(
        move |job| {
            let now = paceline_core::Clock::now_micros(&clock);
            let name = String::from_utf8_lossy(&job.payload).into_owned();
            let mut log = log.lock().expect("log");
            // A pause costs no attempt, so the handler counts its own calls.
            let earlier = log.iter().filter(|c| c.0 == name).count();
            log.push((name, now));
            async move {
                match (&job.payload[..], earlier) {
                    (b"flaky", _) => Err(Failure::Retry {
                        error: Some("upstream 500".into()),
                        after: Some(Duration::from_secs(2)),
                    }),
                    (b"limited", 0) => Err(Failure::PauseGroup {
                        error: Some("429".into()),
                        pause: Duration::from_secs(7),
                    }),
                    _ => Ok(()),
                }
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.send(()).ok();
    let report = running.await.expect("worker").expect("run");
    assert_eq!((report.acked, report.failed), (1, 3));
    let calls = calls.lock().expect("log").clone();
    let at = |name: &str| -> Vec<u64> {
        calls
            .iter()
            .filter(|c| c.0 == name)
            .map(|c| c.1 - T0)
            .collect()
    };
    assert_eq!(at("flaky"), vec![0, 2 * S]);
    assert_eq!(at("limited"), vec![0, 7 * S]);
    let dead = q.job(&flaky.id).await.expect("job").expect("dead job");
    assert_eq!(
        (dead.state, dead.last_error.as_deref()),
        (JobState::Dead, Some("upstream 500"))
    );
}

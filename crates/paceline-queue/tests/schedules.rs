//! Schedules (repeatable jobs) on a virtual clock: a job per tick, a tick missed while no
//! process ran fired once, and one job per tick however many handles fire it. (Redis
//! answers as memory does in random scripts too: `redis.rs`.)

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock};
use paceline_queue::schedule::Schedule;
use paceline_queue::{MemoryQueue, Queue, QueueConfig, QueueError};

mod common;

const S: u64 = 1_000_000;
/// 2026-11-28 12:00:00 UTC, in µs.
const NOON: u64 = 1_795_867_200_000_000;

fn config() -> QueueConfig {
    QueueConfig::new(
        "gcra:rate=1000/s,burst=1000"
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
    )
}

fn fired(
    answer: Result<(Vec<paceline_queue::Enqueued>, Option<u64>), QueueError>,
) -> (usize, Option<u64>) {
    let (jobs, next) = answer.unwrap_or_else(|e| panic!("{e}"));
    (jobs.len(), next)
}

#[test]
fn each_tick_enqueues_one_job_and_missed_ticks_are_fired_once() {
    paceline_testkit::runtime().block_on(async {
        let clock = ManualClock::new(NOON);
        let queue = Queue::new(
            MemoryQueue::with_clock("q", config(), Arc::new(clock.clone()))
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let every_ten = Schedule::new("*/10 * * * * *", "reports", b"{\"n\": 1}".to_vec());
        let kept = queue
            .put_schedule("ten", &every_ten)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kept.next, NOON + 10 * S);
        assert_eq!(
            fired(queue.fire_due_schedules().await),
            (0, Some(NOON + 10 * S))
        );
        clock.set_micros(NOON + 10 * S);
        assert_eq!(
            fired(queue.fire_due_schedules().await),
            (1, Some(NOON + 20 * S))
        );
        // The same tick again: nothing.
        assert_eq!(
            fired(queue.fire_due_schedules().await),
            (0, Some(NOON + 20 * S))
        );
        // Down for a minute: one job for the missed ticks, then on from now.
        clock.set_micros(NOON + 75 * S);
        assert_eq!(
            fired(queue.fire_due_schedules().await),
            (1, Some(NOON + 80 * S))
        );
        let jobs = queue
            .lease("w", 10, None, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jobs.len(), 2);
        assert!(jobs
            .iter()
            .all(|j| j.group == "reports" && j.payload == b"{\"n\": 1}"));
        // Put again unchanged: its next tick stays; changed: from the first tick after now.
        let again = queue
            .put_schedule("ten", &every_ten)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.next, NOON + 80 * S);
        let minutely = Schedule::new("* * * * *", "reports", Vec::new());
        let changed = queue
            .put_schedule("ten", &minutely)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(changed.next, NOON + 120 * S);
        assert_eq!(queue.delete_schedule("ten").await, Ok(true));
        assert_eq!(queue.delete_schedule("ten").await, Ok(false));
        assert_eq!(fired(queue.fire_due_schedules().await), (0, None));
    });
}

#[test]
fn bad_schedules_name_their_field_and_keep_nothing() {
    paceline_testkit::runtime().block_on(async {
        let queue =
            Queue::in_memory("q", config().max_payload(16)).unwrap_or_else(|e| panic!("{e}"));
        let field = |e: QueueError| match e {
            QueueError::Input(e) => e.field().to_string(),
            other => panic!("not an input error: {other:?}"),
        };
        for (name, schedule, named) in [
            ("ok", Schedule::new("0 0 30 2 *", "g", Vec::new()), "cron"),
            ("ok", Schedule::new("every day", "g", Vec::new()), "cron"),
            (
                "ok",
                Schedule::new("0 3 * * *", "g", Vec::new()).timezone("Europe/Atlantis"),
                "timezone",
            ),
            ("ok", Schedule::new("0 3 * * *", "", Vec::new()), "group"),
            (
                "ok",
                Schedule::new("0 3 * * *", "g", vec![b'x'; 17]),
                "payload",
            ),
            ("a b", Schedule::new("0 3 * * *", "g", Vec::new()), "name"),
        ] {
            let refused = queue.put_schedule(name, &schedule).await.map_err(field);
            assert_eq!(refused.map(drop), Err(named.to_string()), "{schedule:?}");
        }
        assert_eq!(queue.schedules().await.map(|s| s.len()), Ok(0));
    });
}

/// In Redis: two processes' handles see the same tick; exactly one job is enqueued.
#[cfg(feature = "redis")]
#[test]
fn two_handles_firing_the_same_tick_enqueue_one_job() {
    use common::redis::open_at;
    paceline_testkit::runtime().block_on(async {
        let clock = ManualClock::new(NOON);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let url = paceline_testkit::shared_server().url();
        let name = paceline_testkit::unique_name("sched");
        let a = Queue::new(open_at(&url, &name, config(), Some(Arc::clone(&shared))).await);
        let b = Queue::new(open_at(&url, &name, config(), Some(Arc::clone(&shared))).await);
        let every_second = Schedule::new("* * * * * *", "g", b"tick".to_vec());
        a.put_schedule("s", &every_second)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.schedules().await.map(|s| s.len()), Ok(1));
        let mut total = 0;
        for step in 1..=5 {
            clock.set_micros(NOON + step * S);
            let (first, second) =
                futures_util::future::join(a.fire_due_schedules(), b.fire_due_schedules()).await;
            total += fired(first).0 + fired(second).0;
        }
        assert_eq!(total, 5, "one job per tick");
        assert_eq!(a.counts().await.map(|s| s.waiting), Ok(5));
    });
}

/// `run_schedules` on tokio's paused clock: a job for each tick that came while it ran.
#[tokio::test(start_paused = true)]
async fn the_runner_fires_each_tick_as_it_comes() {
    let clock = paceline_store::TokioClock::new();
    let queue = Queue::new(
        MemoryQueue::with_clock("q", config(), Arc::new(clock.clone()))
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let start = clock.now_micros();
    let every_second = Schedule::new("* * * * * *", "g", b"{}".to_vec());
    queue
        .put_schedule("s", &every_second)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let queue = queue.clone();
        tokio::spawn(async move {
            queue
                .run_schedules(async move {
                    let _ = stopped.await;
                })
                .await;
        })
    };
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let _ = stop.send(());
    runner.await.unwrap_or_else(|e| panic!("{e}"));
    // A tick due at the very moment it stopped is fired here, if the runner had not.
    queue
        .fire_due_schedules()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let end = clock.now_micros();
    let ticks = end / S - start / S;
    assert!((5..=6).contains(&ticks));
    assert_eq!(queue.counts().await.map(|s| s.waiting), Ok(ticks));
}

/// A schedule put when the queue took larger payloads than it now does is refused when it
/// fires, as an enqueue of it would be, and does not hold the other schedules back.
#[test]
fn a_schedule_too_large_for_the_queue_now_does_not_hold_the_others_back() {
    paceline_testkit::runtime().block_on(async {
        let clock = ManualClock::new(NOON);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let name = paceline_testkit::unique_name("big");
        let large = config().max_payload(1024);
        let small = config().max_payload(16);
        let every_second = |payload: usize| Schedule::new("* * * * * *", "g", vec![b'x'; payload]);
        // Memory: the core, its configuration changed under it.
        let mut core =
            paceline_queue::QueueCore::new(large.clone()).unwrap_or_else(|e| panic!("{e}"));
        core.put_schedule(NOON, "a-big", every_second(900), NOON + S)
            .unwrap_or_else(|e| panic!("{e}"));
        core.put_schedule(NOON, "b-small", every_second(8), NOON + S)
            .unwrap_or_else(|e| panic!("{e}"));
        core.set_config(small.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let big = core.fire_schedule(NOON + S, "a-big", NOON + S, NOON + 2 * S);
        assert!(matches!(big, Err(QueueError::Input(e)) if e.field() == "payload"));
        let fired = core.fire_schedule(NOON + S, "b-small", NOON + S, NOON + 2 * S);
        assert!(matches!(fired, Ok(Some(_))));
        // In Redis: the same, through handles opened with each configuration.
        #[cfg(feature = "redis")]
        {
            let url = paceline_testkit::shared_server().url();
            let before = Queue::new(
                common::redis::open_at(&url, &name, large, Some(Arc::clone(&shared))).await,
            );
            before
                .put_schedule("a-big", &every_second(900))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            before
                .put_schedule("b-small", &every_second(8))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let after = Queue::new(
                common::redis::open_at(&url, &name, small, Some(Arc::clone(&shared))).await,
            );
            clock.set_micros(NOON + S);
            let (jobs, next) = after
                .fire_due_schedules()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(jobs.len(), 1, "the small one fired");
            assert_eq!(
                next,
                Some(NOON + S + 1),
                "the big one is asked again at the next pass"
            );
        }
        #[cfg(not(feature = "redis"))]
        let _ = (&name, &shared, large, small, &clock);
    });
}

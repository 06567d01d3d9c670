//! Pauses asked by people: a group's and the whole queue's, for a time or until resumed,
//! on a virtual clock. (Redis answers as memory does: `redis.rs` runs pauses and resumes in
//! its random scripts.)

use std::sync::Arc;
use std::time::Duration;

use paceline_core::Clock;
use paceline_queue::core::UNTIL_RESUMED;
use paceline_queue::{Failure, MemoryQueue, NewJob, Queue, QueueConfig, QueueCore, QueueError};
use paceline_store::TokioClock;

const S: u64 = 1_000_000;

fn queue() -> QueueCore {
    let config = QueueConfig::new(
        "gcra:rate=10/s,burst=10"
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    QueueCore::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn add(q: &mut QueueCore, now: u64, group: &str) -> u64 {
    q.enqueue(now, NewJob::new(group, b"x".to_vec()))
        .unwrap_or_else(|e| panic!("{e}"))
        .estimated_start
}

fn groups_leased(q: &mut QueueCore, now: u64) -> Vec<String> {
    let leased = q
        .lease(now, "w", 100, None)
        .unwrap_or_else(|e| panic!("{e}"));
    leased.into_iter().map(|l| l.group).collect()
}

#[test]
fn a_group_paused_until_resumed_starts_nothing_and_costs_no_attempt() {
    let mut q = queue();
    add(&mut q, 0, "a");
    add(&mut q, 0, "b");
    assert_eq!(q.pause(0, Some("a"), None), Ok(UNTIL_RESUMED));
    // Only the other group starts; the paused one, not even much later.
    let b = q.lease(0, "w", 100, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].group, "b");
    q.ack(0, &b[0].id, b[0].lease)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups_leased(&mut q, 3_600 * S), Vec::<String>::new());
    let stats = q.stats(3_600 * S).unwrap_or_else(|e| panic!("{e}"));
    let a = &stats.groups[0];
    assert_eq!(
        (a.group.as_str(), a.waiting, a.paused_until),
        ("a", 1, Some(UNTIL_RESUMED))
    );
    // A job enqueued meanwhile has no time to give.
    assert_eq!(add(&mut q, 3_600 * S, "a"), UNTIL_RESUMED);
    q.resume(3_601 * S, Some("a"))
        .unwrap_or_else(|e| panic!("{e}"));
    let leased = q
        .lease(3_601 * S, "w", 100, None)
        .unwrap_or_else(|e| panic!("{e}"));
    // In order, each on its first attempt.
    assert_eq!(leased.iter().map(|l| l.attempt).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(leased[0].id, "1");
    let stats = q.stats(3_601 * S).unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.groups.iter().all(|g| g.paused_until.is_none()));
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_timed_group_pause_ends_by_itself_and_new_jobs_are_estimated_after_it() {
    let mut q = queue();
    add(&mut q, 0, "a");
    assert_eq!(
        q.pause(0, Some("a"), Some(Duration::from_secs(5))),
        Ok(5 * S)
    );
    assert_eq!(q.next_event(), Some(5 * S));
    // Its burst of 10 lets both start when the pause ends.
    assert_eq!(add(&mut q, S, "a"), 5 * S);
    assert_eq!(groups_leased(&mut q, 5 * S - 1), Vec::<String>::new());
    assert_eq!(groups_leased(&mut q, 5 * S), ["a", "a"]);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_pause_never_shortens_one_in_place_and_a_resume_ends_a_workers_pause_too() {
    let mut q = queue();
    add(&mut q, 0, "a");
    add(&mut q, 0, "a");
    assert_eq!(
        q.pause(0, Some("a"), Some(Duration::from_secs(10))),
        Ok(10 * S)
    );
    assert_eq!(
        q.pause(S, Some("a"), Some(Duration::from_secs(1))),
        Ok(10 * S)
    );
    q.resume(S, Some("a")).unwrap_or_else(|e| panic!("{e}"));
    // A worker pauses the group after an upstream's refusal; a person resumes it.
    let leased = q.lease(S, "w", 1, None).unwrap_or_else(|e| panic!("{e}"));
    let pause = Failure::PauseGroup {
        error: None,
        pause: Duration::from_secs(60),
    };
    q.fail(S, &leased[0].id, leased[0].lease, pause, 0.5)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups_leased(&mut q, 2 * S), Vec::<String>::new());
    q.resume(2 * S, Some("a")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups_leased(&mut q, 2 * S), ["a", "a"]);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_paused_group_with_nothing_waiting_is_kept_and_holds_the_jobs_that_come() {
    let mut q = queue();
    q.pause(0, Some("quiet"), None)
        .unwrap_or_else(|e| panic!("{e}"));
    // Long after any idle group would be dropped.
    q.stats(86_400 * S).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.groups_held(), 1);
    add(&mut q, 86_400 * S, "quiet");
    assert_eq!(groups_leased(&mut q, 86_400 * S), Vec::<String>::new());
    q.resume(86_401 * S, Some("quiet"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups_leased(&mut q, 86_401 * S), ["quiet"]);
    // Resuming a group the queue holds nothing for changes nothing.
    assert_eq!(q.resume(86_401 * S, Some("never-seen")), Ok(()));
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_paused_queue_leases_nothing_and_says_when_it_may() {
    let mut q = queue();
    add(&mut q, 0, "a");
    add(&mut q, 0, "b");
    assert_eq!(q.pause(0, None, Some(Duration::from_secs(30))), Ok(30 * S));
    assert_eq!(q.paused_until(0), Some(30 * S));
    assert_eq!(q.next_event(), Some(30 * S));
    assert_eq!(groups_leased(&mut q, 29 * S), Vec::<String>::new());
    let stats = q.counts(29 * S).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((stats.waiting, stats.paused_until), (2, Some(30 * S)));
    assert_eq!(q.stats(29 * S).map(|s| s.paused_until), Ok(Some(30 * S)));
    // Resumed early: both groups at once, no attempt spent while paused.
    q.resume(29 * S, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.paused_until(29 * S), None);
    let started = q
        .lease(29 * S, "w", 100, None)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut groups: Vec<&str> = started.iter().map(|l| l.group.as_str()).collect();
    groups.sort_unstable();
    assert_eq!(groups, ["a", "b"]);
    for l in &started {
        q.ack(29 * S, &l.id, l.lease)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Until resumed: nothing, however late.
    add(&mut q, 29 * S, "a");
    q.pause(29 * S, None, None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.next_event(), Some(UNTIL_RESUMED));
    assert_eq!(groups_leased(&mut q, 10_000 * S), Vec::<String>::new());
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn bad_pauses_name_their_field_and_change_nothing() {
    let mut q = queue();
    add(&mut q, 0, "a");
    let field = |e: QueueError| match e {
        QueueError::Input(e) => e.field().to_string(),
        other => panic!("not an input error: {other:?}"),
    };
    let year_and_a_day = Duration::from_secs(366 * 86_400);
    for (group, length, named) in [
        (Some("a"), Some(Duration::ZERO), "ms"),
        (None, Some(Duration::from_micros(999)), "ms"),
        (Some("a"), Some(year_and_a_day), "ms"),
        (Some(""), None, "group"),
        (Some("a\u{7}"), None, "group"),
    ] {
        let refused = q.pause(0, group, length).map(drop).map_err(field);
        assert_eq!(refused, Err(named.to_string()), "{group:?} {length:?}");
    }
    assert_eq!(
        q.resume(0, Some("")).map_err(field),
        Err("group".to_string())
    );
    assert_eq!(groups_leased(&mut q, 0), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_worker_wakes_when_its_queue_is_resumed() {
    // Tokio's paused clock: time moves only when every task waits on a timer.
    let clock = TokioClock::new();
    let start = clock.now_micros();
    let config = QueueConfig::new("gcra:rate=10/s".parse().unwrap_or_else(|e| panic!("{e}")));
    let memory = MemoryQueue::with_clock("q", config, Arc::new(clock.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    let queue = Queue::new(memory);
    queue
        .enqueue(NewJob::new("g", b"x".to_vec()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    queue
        .pause(None, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let waiting = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.lease("w", 1, None, Duration::from_secs(60)).await })
    };
    // The waiting call asks, finds the queue paused and goes to sleep.
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    queue.resume(None).await.unwrap_or_else(|e| panic!("{e}"));
    let leased = waiting
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(leased.len(), 1);
    // Woken by the resume, not by its wait running out.
    assert!(clock.now_micros() < start + 60 * S);
}

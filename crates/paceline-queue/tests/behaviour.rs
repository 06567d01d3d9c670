//! The queue's rules one by one, on a virtual clock.

use std::time::{Duration, SystemTime};

use paceline_queue::{FailOutcome, Failure, JobState, NewJob, QueueConfig, QueueCore, QueueError};

const S: u64 = 1_000_000;

fn queue(config: QueueConfig) -> QueueCore {
    QueueCore::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn config(spec: &str) -> QueueConfig {
    QueueConfig::new(spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}")))
}

fn field(e: QueueError) -> String {
    match e {
        QueueError::Input(e) => e.field().to_string(),
        other => panic!("not an input error: {other:?}"),
    }
}

#[test]
fn a_stale_lease_is_refused_and_an_expired_job_goes_back_to_the_head() {
    let mut q = queue(config("gcra:rate=100/s,burst=100").lease(Duration::from_secs(10)));
    let a = q.enqueue(0, NewJob::new("g", b"a".to_vec())).unwrap();
    q.enqueue(0, NewJob::new("g", b"b".to_vec())).unwrap();
    let first = q.lease(0, "w1", 1, None).unwrap();
    assert_eq!((first[0].id.as_str(), first[0].attempt), (a.id.as_str(), 1));
    // The lease runs out: the job is back at the head, and the old token is refused.
    let again = q.lease(10 * S, "w2", 1, None).unwrap();
    assert_eq!((again[0].id.as_str(), again[0].attempt), (a.id.as_str(), 2));
    assert_ne!(again[0].lease, first[0].lease);
    for result in [
        q.ack(10 * S, &a.id, first[0].lease),
        q.extend(10 * S, &a.id, first[0].lease, Duration::from_secs(5))
            .map(drop),
        q.fail(
            10 * S,
            &a.id,
            first[0].lease,
            Failure::Fatal { error: None },
            0.5,
        )
        .map(drop),
    ] {
        assert_eq!(result, Err(QueueError::LeaseLost { id: a.id.clone() }));
    }
    // The live lease works once; a second ack finds the job gone (a `Queue`, which checks
    // the token first, answers a genuine token's repeat as the first).
    assert_eq!(q.ack(10 * S, &a.id, again[0].lease), Ok(()));
    assert!(matches!(
        q.ack(10 * S, &a.id, again[0].lease),
        Err(QueueError::UnknownJob { .. })
    ));
    assert_eq!(q.job(&a.id), None);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_lease_refuses_its_job_at_the_moment_it_expires_even_before_any_sweep() {
    let mut q = queue(config("gcra:rate=100/s,burst=100").lease(Duration::from_secs(1)));
    let a = q.enqueue(0, NewJob::new("g", vec![])).unwrap();
    let l = q.lease(0, "w", 1, None).unwrap();
    assert!(matches!(
        q.ack(S, &a.id, l[0].lease),
        Err(QueueError::LeaseLost { .. })
    ));
    assert_eq!(q.job(&a.id).map(|j| j.state), Some(JobState::Waiting));
    // Extending in time keeps it.
    let l = q.lease(S, "w", 1, None).unwrap();
    let expires = q
        .extend(S + S / 2, &a.id, l[0].lease, Duration::from_secs(5))
        .unwrap();
    assert_eq!(expires, S + S / 2 + 5 * S);
    assert_eq!(q.ack(6 * S, &a.id, l[0].lease), Ok(()));
}

#[test]
fn failures_retry_with_backoff_then_die_and_dead_jobs_can_be_retried_or_purged() {
    let mut q = queue(
        config("gcra:rate=100/s,burst=100")
            .max_attempts(3)
            .retry_backoff(Duration::from_secs(1), Duration::from_secs(3)),
    );
    let a = q.enqueue(0, NewJob::new("g", vec![1])).unwrap();
    let mut now = 0;
    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let l = q.lease(now, "w", 1, None).unwrap();
        assert_eq!(l[0].attempt, attempt);
        let retry = Failure::Retry {
            error: Some(format!("boom {attempt}")),
            after: None,
        };
        match q.fail(now, &a.id, l[0].lease, retry, 1.0).unwrap() {
            FailOutcome::Retrying { at } => {
                delays.push(at - now);
                assert_eq!(q.lease(at - 1, "w", 1, None).unwrap(), vec![]);
                now = at;
            }
            FailOutcome::Dead => assert_eq!(attempt, 3),
            other => panic!("{other:?}"),
        }
    }
    // Jitter 1 takes the whole backoff: 1 s, then 2 s (capped at 3 s).
    assert_eq!(delays, vec![S, 2 * S]);
    let info = q.job(&a.id).unwrap();
    assert_eq!(
        (info.state, info.last_error.as_deref()),
        (JobState::Dead, Some("boom 3"))
    );
    assert_eq!(q.dead(0, 10).len(), 1);
    assert_eq!(q.retry_dead(now, None), Ok(1));
    let l = q.lease(now, "w", 1, None).unwrap();
    assert_eq!(l[0].attempt, 1);
    q.fail(now, &a.id, l[0].lease, Failure::Fatal { error: None }, 0.0)
        .unwrap();
    assert_eq!(q.purge_dead(now), Ok(1));
    assert_eq!(q.job(&a.id), None);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn jitter_draws_the_backoff_between_half_and_all_of_it() {
    for (jitter, expected) in [(0.0, S / 2), (0.5, 3 * S / 4), (1.0, S), (f64::NAN, S / 2)] {
        let mut q = queue(config("gcra:rate=100/s,burst=100"));
        let a = q.enqueue(0, NewJob::new("g", vec![])).unwrap();
        let l = q.lease(0, "w", 1, None).unwrap();
        let retry = Failure::Retry {
            error: None,
            after: None,
        };
        assert_eq!(
            q.fail(0, &a.id, l[0].lease, retry, jitter),
            Ok(FailOutcome::Retrying { at: expected }),
            "{jitter}"
        );
    }
}

#[test]
fn a_pause_holds_the_whole_group_costs_no_attempt_and_keeps_the_job_first() {
    let mut q = queue(config("gcra:rate=100/s,burst=100"));
    let a = q.enqueue(0, NewJob::new("g", b"a".to_vec())).unwrap();
    q.enqueue(0, NewJob::new("g", b"b".to_vec())).unwrap();
    q.enqueue(0, NewJob::new("other", b"c".to_vec())).unwrap();
    let l = q.lease(0, "w", 1, None).unwrap();
    assert_eq!(l[0].id, a.id);
    let pause = Failure::PauseGroup {
        error: Some("429".into()),
        pause: Duration::from_secs(5),
    };
    assert_eq!(
        q.fail(S, &a.id, l[0].lease, pause, 0.0),
        Ok(FailOutcome::Paused { until: 6 * S })
    );
    // Only the other group runs until the pause ends.
    let during = q.lease(S, "w", 10, None).unwrap();
    assert_eq!(
        during.iter().map(|j| j.group.as_str()).collect::<Vec<_>>(),
        ["other"]
    );
    assert_eq!(q.next_event(), Some(6 * S));
    let after = q.lease(6 * S, "w", 10, None).unwrap();
    assert_eq!(after[0].id, a.id);
    assert_eq!(after[0].attempt, 1, "a pause is not an attempt");
    assert_eq!(after.len(), 2);
    let totals = q.counts(6 * S).unwrap().totals;
    assert_eq!(
        (totals.pauses, totals.failed, totals.retried),
        (1, 0, 0),
        "a pause is the upstream's refusal, not the job's failure"
    );
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn purging_the_dead_set_first_kills_a_job_whose_last_lease_ran_out() {
    let mut q = queue(
        config("gcra:rate=100/s,burst=100")
            .lease(Duration::from_secs(10))
            .max_attempts(1),
    );
    let a = q.enqueue(0, NewJob::new("g", b"a".to_vec())).unwrap();
    let l = q.lease(0, "w", 1, None).unwrap();
    assert_eq!(l[0].id, a.id);
    // Its only attempt's lease runs out unnoticed: no call comes until the purge.
    assert_eq!(q.purge_dead(10 * S), Ok(1));
    assert_eq!(q.job(&a.id), None);
    let counts = q.counts(10 * S).unwrap();
    assert_eq!(
        (counts.active, counts.dead, counts.totals.lease_expiries),
        (0, 0, 1)
    );
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn eligible_groups_take_turns() {
    let mut q = queue(config("gcra:rate=1000/s,burst=1000"));
    for i in 0..5u8 {
        q.enqueue(0, NewJob::new("busy", vec![i])).unwrap();
    }
    q.enqueue(S, NewJob::new("quiet", vec![9])).unwrap();
    q.enqueue(S, NewJob::new("late", vec![8])).unwrap();
    let groups: Vec<String> = q
        .lease(2 * S, "w", 5, None)
        .unwrap()
        .into_iter()
        .map(|j| j.group)
        .collect();
    // "busy" was eligible longest and goes first, then behind the others.
    assert_eq!(groups, ["busy", "quiet", "late", "busy", "busy"]);
}

#[test]
fn a_group_concurrency_cap_holds_its_other_jobs() {
    let mut q = queue(config("gcra:rate=1000/s,burst=1000").group_concurrency(1));
    for i in 0..3u8 {
        q.enqueue(0, NewJob::new("g", vec![i])).unwrap();
    }
    let l = q.lease(0, "w", 10, None).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(q.lease(0, "w", 10, None).unwrap(), vec![]);
    q.ack(0, &l[0].id, l[0].lease).unwrap();
    assert_eq!(q.lease(0, "w", 10, None).unwrap().len(), 1);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn the_same_id_again_adds_nothing_while_the_job_exists() {
    let mut q = queue(config("fixed_window:limit=1,window=10s"));
    let first = q
        .enqueue(0, NewJob::new("g", b"x".to_vec()).id("order-1"))
        .unwrap();
    assert!(first.created);
    q.enqueue(0, NewJob::new("g", b"y".to_vec()).id("order-2"))
        .unwrap();
    let again = q
        .enqueue(S, NewJob::new("g", b"z".to_vec()).id("order-1"))
        .unwrap();
    assert_eq!(
        (again.created, again.estimated_start, again.state),
        (false, 0, JobState::Waiting)
    );
    assert_eq!(q.stats(S).unwrap().waiting, 2);
    let l = q.lease(S, "w", 1, None).unwrap();
    assert_eq!(l[0].payload, b"x");
    q.ack(S, "order-1", l[0].lease).unwrap();
    // Acknowledged and gone: the id may be used again.
    assert!(
        q.enqueue(S, NewJob::new("g", vec![]).id("order-1"))
            .unwrap()
            .created
    );
    // Ids the queue gives are numbers, which producers' ids may not be.
    let numbered = q.enqueue(S, NewJob::new("g", vec![])).unwrap();
    assert!(numbered.id.bytes().all(|b| b.is_ascii_digit()));
    assert_eq!(
        field(q.enqueue(S, NewJob::new("g", vec![]).id("42")).unwrap_err()),
        "id"
    );
}

#[test]
fn a_delayed_job_joins_its_group_when_due() {
    let mut q = queue(config("gcra:rate=100/s,burst=100"));
    let a = q
        .enqueue(0, NewJob::new("g", vec![]).delay(Duration::from_secs(3)))
        .unwrap();
    assert_eq!((a.state, a.estimated_start), (JobState::Scheduled, 3 * S));
    assert_eq!(q.lease(3 * S - 1, "w", 1, None).unwrap(), vec![]);
    assert_eq!(q.next_event(), Some(3 * S));
    assert_eq!(q.lease(3 * S, "w", 1, None).unwrap()[0].id, a.id);
}

/// `at` µs after the Unix epoch, as `NewJob::not_before` takes it.
fn at(micros: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(micros)
}

#[test]
fn a_not_before_time_holds_a_job_until_then_and_the_later_of_it_and_a_delay_holds() {
    let mut q = queue(config("gcra:rate=100/s,burst=100"));
    let now = 10 * S;
    let a = q
        .enqueue(now, NewJob::new("g", vec![]).not_before(at(13 * S)))
        .unwrap();
    assert_eq!((a.state, a.estimated_start), (JobState::Scheduled, 13 * S));
    // With a delay too, the later of the two: here the delay's end, then the time.
    let b = q
        .enqueue(
            now,
            NewJob::new("h", vec![])
                .not_before(at(11 * S))
                .delay(Duration::from_secs(4)),
        )
        .unwrap();
    assert_eq!(b.estimated_start, 14 * S);
    let c = q
        .enqueue(
            now,
            NewJob::new("i", vec![])
                .not_before(at(15 * S))
                .delay(Duration::from_secs(1)),
        )
        .unwrap();
    assert_eq!(c.estimated_start, 15 * S);
    // A time already past holds nothing back.
    let d = q
        .enqueue(now, NewJob::new("j", vec![]).not_before(at(S)))
        .unwrap();
    assert_eq!((d.state, d.estimated_start), (JobState::Waiting, now));
    assert_eq!(q.lease(now, "w", 10, None).unwrap()[0].id, d.id);
    assert_eq!(q.lease(13 * S - 1, "w", 10, None).unwrap(), vec![]);
    assert_eq!(q.lease(13 * S, "w", 10, None).unwrap()[0].id, a.id);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_not_before_time_past_the_queue_s_last_time_is_refused_naming_it() {
    let mut q = queue(config("gcra:rate=100/s,burst=100"));
    let now = 10 * S;
    let last = paceline_queue::job::MAX_NOT_BEFORE;
    let e = q
        .enqueue(now, NewJob::new("g", vec![]).not_before(at(last + 1)))
        .unwrap_err();
    assert_eq!(field(e), "not_before");
    assert_eq!(q.counts(now).unwrap().totals.enqueued, 0);
    // Years ahead is a time like any other; the last time exactly is allowed.
    let years = 10 * 365 * 86_400 * S;
    let ok = q
        .enqueue(now, NewJob::new("g", vec![]).not_before(at(now + years)))
        .unwrap();
    assert_eq!(ok.estimated_start, now + years);
    let ok = q
        .enqueue(now, NewJob::new("h", vec![]).not_before(at(last)))
        .unwrap();
    assert_eq!(ok.estimated_start, last);
}

#[test]
fn cancel_takes_out_a_job_that_no_worker_holds() {
    let mut q = queue(config("gcra:rate=100/s,burst=100"));
    let a = q.enqueue(0, NewJob::new("g", vec![])).unwrap();
    let b = q.enqueue(0, NewJob::new("g", vec![])).unwrap();
    let c = q
        .enqueue(0, NewJob::new("g", vec![]).delay(Duration::from_secs(1)))
        .unwrap();
    let l = q.lease(0, "w", 1, None).unwrap();
    assert!(matches!(
        q.cancel(0, &a.id),
        Err(QueueError::Conflict {
            state: "active",
            ..
        })
    ));
    assert_eq!(q.cancel(0, &b.id), Ok(()));
    assert_eq!(q.cancel(0, &c.id), Ok(()));
    assert!(matches!(
        q.cancel(0, &c.id),
        Err(QueueError::UnknownJob { .. })
    ));
    q.ack(0, &l[0].id, l[0].lease).unwrap();
    assert_eq!(q.lease(5 * S, "w", 10, None).unwrap(), vec![]);
    assert_eq!(q.next_event(), None);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn bad_input_names_its_field_and_changes_nothing() {
    let mut q = queue(config("gcra:rate=100/s").max_payload(4));
    for (job, name) in [
        (NewJob::new("", vec![]), "group"),
        (NewJob::new("g".repeat(1 << 20), vec![]), "group"),
        (NewJob::new("g", vec![0; 5]), "payload"),
        (NewJob::new("g", vec![]).id("a b"), "id"),
        (NewJob::new("g", vec![]).max_attempts(0), "max_attempts"),
        (
            NewJob::new("g", vec![]).delay(Duration::from_secs(400 * 86_400)),
            "delay",
        ),
    ] {
        assert_eq!(field(q.enqueue(0, job).unwrap_err()), name);
    }
    assert_eq!(field(q.lease(0, "", 1, None).unwrap_err()), "worker");
    assert_eq!(field(q.lease(0, "w", 0, None).unwrap_err()), "max_jobs");
    assert_eq!(field(q.lease(0, "w", 1001, None).unwrap_err()), "max_jobs");
    assert_eq!(
        field(q.lease(0, "w", 1, Some(Duration::ZERO)).unwrap_err()),
        "lease_ms"
    );
    assert_eq!(q.stats(0).unwrap(), Default::default());
    let e = QueueCore::new(config("exec_evenly:points=10,duration=1s")).unwrap_err();
    assert_eq!(e.field(), "group_policy");
}

#[test]
fn idle_groups_are_dropped_once_their_policy_state_is_idle() {
    let mut q = queue(config("fixed_window:limit=1,window=10s"));
    for g in 0..100 {
        let e = q.enqueue(0, NewJob::new(format!("g{g}"), vec![])).unwrap();
        let l = q.lease(0, "w", 1, None).unwrap();
        q.ack(0, &e.id, l[0].lease).unwrap();
    }
    assert_eq!(q.stats(0).unwrap().groups.len(), 0);
    // Within the window each group still remembers its start...
    assert_eq!(q.groups_held(), 100);
    q.enqueue(5 * S, NewJob::new("g0", vec![])).unwrap();
    assert_eq!(q.lease(5 * S, "w", 1, None).unwrap(), vec![]);
    // ...and the first call after the window lets the idle ones go.
    assert_eq!(q.lease(10 * S, "w", 1, None).unwrap().len(), 1);
    assert_eq!(q.groups_held(), 1);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn jobs_that_come_back_together_keep_their_order_ahead_of_later_ones() {
    let mut q = queue(config("gcra:rate=1000/s,burst=1000").lease(Duration::from_secs(1)));
    let ids: Vec<String> = (0..5u8)
        .map(|i| q.enqueue(0, NewJob::new("g", vec![i])).unwrap().id)
        .collect();
    // Three leased, their worker dies: they come back in their order, ahead of the rest.
    assert_eq!(q.lease(0, "w", 3, None).unwrap().len(), 3);
    let again: Vec<String> = q
        .lease(S, "w", 5, None)
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(again, ids);
    // Retries due together, leases expiring together and a hand-back come back in rank
    // order too: every one ahead of a job enqueued meanwhile.
    let later = q.enqueue(S, NewJob::new("g", vec![9])).unwrap().id;
    let held = q.lease(2 * S, "w", 6, None).unwrap();
    let mut expected = ids.clone();
    expected.push(later.clone());
    assert_eq!(
        held.iter().map(|j| j.id.clone()).collect::<Vec<_>>(),
        expected
    );
    for job in held.iter().take(3) {
        let retry = Failure::Retry {
            error: None,
            after: Some(Duration::from_secs(1)),
        };
        q.fail(2 * S, &job.id, job.lease, retry, 0.0).unwrap();
    }
    q.fail(2 * S, &later, held[5].lease, Failure::Release, 0.0)
        .unwrap();
    let back: Vec<String> = q
        .lease(3 * S, "w", 10, None)
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(back, expected);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_full_queue_refuses_new_jobs_but_answers_existing_ids() {
    let mut q = queue(config("gcra:rate=100/s,burst=100").max_jobs(2));
    q.enqueue(0, NewJob::new("g", vec![]).id("a")).unwrap();
    q.enqueue(0, NewJob::new("g", vec![])).unwrap();
    match q.enqueue(0, NewJob::new("g", vec![])) {
        Err(QueueError::Store(e)) => {
            assert_eq!(e.kind(), paceline_core::StoreErrorKind::Capacity);
            assert!(e.message().contains("max_jobs"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !q.enqueue(0, NewJob::new("g", vec![]).id("a"))
            .unwrap()
            .created
    );
    let l = q.lease(0, "w", 1, None).unwrap();
    q.ack(0, &l[0].id, l[0].lease).unwrap();
    assert!(q.enqueue(0, NewJob::new("g", vec![])).is_ok());
}

/// Within a group jobs start by priority, then in order of enqueue; a job that goes back
/// (here, a retry) keeps its place among its priority; the estimates count the jobs ahead.
#[test]
fn a_group_starts_its_jobs_by_priority_then_in_order() {
    let mut q = queue(
        config("fixed_window:limit=1,window=10s")
            .retry_backoff(Duration::from_secs(1), Duration::from_secs(1)),
    );
    let mut estimates = Vec::new();
    for (name, priority) in [("p5a", 5), ("p0a", 0), ("p9", 9), ("p5b", 5), ("p0b", 0)] {
        let job = NewJob::new("g", name.as_bytes().to_vec())
            .id(name)
            .priority(priority);
        estimates.push(q.enqueue(0, job).unwrap().estimated_start / S);
    }
    // p5a alone (0 s); p0a ahead of it (0 s); p9 behind both (20 s); p5b behind p0a and
    // p5a (20 s: the estimates count the jobs ahead now); p0b behind p0a (10 s).
    assert_eq!(estimates, [0, 0, 20, 20, 10]);
    let mut order = Vec::new();
    for window in 0..5 {
        let now = window * 10 * S;
        let leased = q.lease(now, "w", 10, None).unwrap();
        assert_eq!(
            leased.len(),
            1,
            "one start a window, whatever the priorities"
        );
        order.push(leased[0].id.clone());
        if leased[0].id == "p0a" && leased[0].attempt == 1 {
            // Retried: back before p0b, which joined after it.
            let retry = Failure::Retry {
                error: None,
                after: Some(Duration::ZERO),
            };
            q.fail(now, "p0a", leased[0].lease, retry, 0.5).unwrap();
        } else {
            q.ack(now, &leased[0].id, leased[0].lease).unwrap();
        }
    }
    assert_eq!(order, ["p0a", "p0a", "p0b", "p5a", "p5b"]);
    q.check_invariants().unwrap();
}

/// Across groups that may start a job now, the one whose next job is more urgent goes
/// first, round robin among equals; a more urgent group that may not start yet does not
/// hold the others back.
#[test]
fn the_group_whose_next_job_is_more_urgent_goes_first() {
    let mut q = queue(config("fixed_window:limit=1,window=10s"));
    for (group, priority) in [("a", 3), ("b", 1), ("c", 3), ("d", 0)] {
        q.enqueue(
            0,
            NewJob::new(group, group.as_bytes().to_vec()).priority(priority),
        )
        .unwrap();
    }
    let groups: Vec<String> = q
        .lease(0, "w", 10, None)
        .unwrap()
        .into_iter()
        .map(|j| j.group)
        .collect();
    assert_eq!(groups, ["d", "b", "a", "c"]);
    // d has used its window: its urgent job waits, and b's starts now.
    q.enqueue(S, NewJob::new("d", b"d2".to_vec())).unwrap();
    q.enqueue(S, NewJob::new("e", b"e".to_vec()).priority(9))
        .unwrap();
    let leased = q.lease(S, "w", 10, None).unwrap();
    assert_eq!(
        leased.iter().map(|j| j.group.as_str()).collect::<Vec<_>>(),
        ["e"]
    );
    let leased = q.lease(10 * S, "w", 10, None).unwrap();
    assert_eq!(leased[0].group, "d");
    q.check_invariants().unwrap();
}

/// A job's cost counts against its group's policy and the queue's own; a cost a policy can
/// never admit is refused when enqueued, and a waiting job whose policy changed to one that
/// cannot admit it goes to the dead set, costing no attempt.
#[test]
fn a_job_s_cost_counts_against_its_policies() {
    let mut q = queue(
        config("fixed_window:limit=10,window=10s")
            .queue_policy("fixed_window:limit=12,window=10s".parse().unwrap()),
    );
    for group in ["a", "b"] {
        for _ in 0..2 {
            q.enqueue(0, NewJob::new(group, b"x".to_vec()).cost(4))
                .unwrap();
        }
    }
    // a: 4 + 4; b: 4, then the queue's 12 are spent.
    assert_eq!(q.lease(0, "w", 10, None).unwrap().len(), 3);
    // More than the group's limit: beyond what its policy can ever admit (a conflict with
    // it); a cost of 0 is malformed.
    let e = q
        .enqueue(0, NewJob::new("a", b"y".to_vec()).cost(11))
        .unwrap_err();
    assert!(
        matches!(&e, QueueError::Input(e) if e.is_beyond_policy()),
        "{e:?}"
    );
    assert_eq!(field(e), "cost");
    let e = q
        .enqueue(0, NewJob::new("a", b"y".to_vec()).cost(0))
        .unwrap_err();
    assert!(
        matches!(&e, QueueError::Input(e) if !e.is_beyond_policy()),
        "{e:?}"
    );
    assert_eq!(field(e), "cost");
    let e = q
        .enqueue(0, NewJob::new("a", b"y".to_vec()).priority(10))
        .unwrap_err();
    assert_eq!(field(e), "priority");
    // b's last job waits; its group's limit falls below its cost.
    q.set_policy(
        0,
        "b",
        Some("fixed_window:limit=3,window=10s".parse().unwrap()),
    )
    .unwrap();
    assert!(q.lease(10 * S, "w", 10, None).unwrap().is_empty());
    let dead = q.dead(0, 10);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].group.as_str(), dead[0].attempts, dead[0].cost),
        ("b", 0, 4)
    );
    assert!(dead[0]
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("its cost, 4,"));
    q.check_invariants().unwrap();
}

//! Random sequences of enqueue, lease, ack, fail, pause, worker crash and time advances on
//! a virtual clock: no job is lost, no job has two live leases, a stale token is always
//! refused, and every group's starts pass its policy when replayed through it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use paceline_core::{Op, Policy};
use paceline_queue::{FailOutcome, Failure, JobState, NewJob, QueueConfig, QueueCore, QueueError};
use proptest::prelude::*;

mod common;
use common::POLICIES;

#[derive(Clone, Debug)]
enum Step {
    Enqueue {
        group: u8,
        delay_ms: u16,
        /// A not-before time, in ms from the step's time (negative: already past).
        not_before_ms: Option<i16>,
        id: Option<u8>,
        /// Its priority: whatever it is, the group's policy holds every start.
        priority: u8,
    },
    Lease {
        max_jobs: u8,
    },
    Ack {
        pick: u8,
    },
    Fail {
        pick: u8,
        kind: u8,
        ms: u16,
    },
    Extend {
        pick: u8,
    },
    /// A worker dies holding a job: its lease is forgotten, never acked.
    Crash {
        pick: u8,
    },
    /// A worker uses a token it should no longer hold.
    Stale {
        pick: u8,
    },
    Advance {
        ms: u16,
    },
    Cancel {
        pick: u8,
    },
    RetryDead,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (
            0u8..4,
            prop_oneof![3 => Just(0u16), 1 => 1u16..3_000],
            prop_oneof![3 => Just(None), 1 => (-1_000i16..3_000).prop_map(Some)],
            proptest::option::of(0u8..6),
            prop_oneof![2 => Just(0u8), 1 => 0u8..10],
        )
            .prop_map(|(group, delay_ms, not_before_ms, id, priority)| Step::Enqueue {
                group,
                delay_ms,
                not_before_ms,
                id,
                priority,
            }),
        4 => (1u8..5).prop_map(|max_jobs| Step::Lease { max_jobs }),
        3 => any::<u8>().prop_map(|pick| Step::Ack { pick }),
        2 => (any::<u8>(), 0u8..4, 1u16..3_000).prop_map(|(pick, kind, ms)| Step::Fail { pick, kind, ms }),
        1 => any::<u8>().prop_map(|pick| Step::Extend { pick }),
        1 => any::<u8>().prop_map(|pick| Step::Crash { pick }),
        1 => any::<u8>().prop_map(|pick| Step::Stale { pick }),
        4 => (1u16..2_500).prop_map(|ms| Step::Advance { ms }),
        1 => any::<u8>().prop_map(|pick| Step::Cancel { pick }),
        1 => Just(Step::RetryDead),
    ]
}

/// A lease a test worker holds.
#[derive(Clone, Debug)]
struct Held {
    id: String,
    token: u64,
    expires: u64,
}

fn pick<T: Clone>(items: &[T], pick: u8) -> Option<T> {
    (!items.is_empty()).then(|| items[pick as usize % items.len()].clone())
}

fn run(spec: &str, cap: u32, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let policy: Policy = spec
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    // Group g3 has a policy of its own: the next algorithm's.
    let next =
        POLICIES[(POLICIES.iter().position(|p| *p == spec).unwrap_or(0) + 1) % POLICIES.len()];
    let own: Policy = next
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let config = QueueConfig::new(policy.clone())
        .group("g3", own.clone())
        .group_concurrency(cap)
        .max_attempts(3)
        .lease(Duration::from_millis(1_500))
        .retry_backoff(Duration::from_millis(200), Duration::from_secs(2));
    let mut q = QueueCore::new(config).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let ms = 1_000u64;
    let mut now = 1_000_000 * ms;
    // Every id ever enqueued, and those gone for good (acked or cancelled or purged).
    let mut enqueued: BTreeSet<String> = BTreeSet::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    let mut held: Vec<Held> = Vec::new();
    let mut crashed: Vec<Held> = Vec::new();
    let mut stale: Vec<Held> = Vec::new();
    let mut starts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    // The live lease of each active job, as the test saw it handed out.
    let mut live: BTreeMap<String, Held> = BTreeMap::new();
    for step in steps {
        match step {
            Step::Enqueue {
                group,
                delay_ms,
                not_before_ms,
                id,
                priority,
            } => {
                let mut job = NewJob::new(format!("g{group}"), vec![group])
                    .delay(Duration::from_millis(u64::from(delay_ms)))
                    .priority(priority);
                if let Some(d) = not_before_ms {
                    let at = now.saturating_add_signed(i64::from(d) * 1_000);
                    job = job.not_before(UNIX_EPOCH + Duration::from_micros(at));
                }
                if let Some(id) = id {
                    job = job.id(format!("job-{id}"));
                }
                let e = q
                    .enqueue(now, job)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                if e.created {
                    prop_assert!(e.estimated_start >= now);
                    enqueued.insert(e.id.clone());
                    gone.remove(&e.id);
                }
            }
            Step::Lease { max_jobs } => {
                let leased = q
                    .lease(now, "w", usize::from(max_jobs), None)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                for job in leased {
                    // Never two live leases on one job.
                    if let Some(previous) = live.get(&job.id) {
                        prop_assert!(
                            previous.expires <= now,
                            "{} leased again while its lease {} is live",
                            job.id,
                            previous.token
                        );
                        stale.push(previous.clone());
                    }
                    starts
                        .entry(job.group.clone())
                        .or_default()
                        .push(job.started);
                    let h = Held {
                        id: job.id.clone(),
                        token: job.lease,
                        expires: job.lease_expires,
                    };
                    live.insert(job.id.clone(), h.clone());
                    held.push(h);
                }
            }
            Step::Ack { pick: p } => {
                if let Some(h) = pick(&held, p) {
                    held.retain(|x| x.token != h.token);
                    match q.ack(now, &h.id, h.token) {
                        Ok(()) => {
                            prop_assert!(h.expires > now, "an expired lease acked");
                            gone.insert(h.id.clone());
                            live.remove(&h.id);
                        }
                        Err(QueueError::LeaseLost { .. } | QueueError::UnknownJob { .. }) => {
                            prop_assert!(h.expires <= now, "a live lease refused")
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                    stale.push(h);
                }
            }
            Step::Fail {
                pick: p,
                kind,
                ms: d,
            } => {
                if let Some(h) = pick(&held, p) {
                    held.retain(|x| x.token != h.token);
                    let failure = match kind {
                        0 => Failure::Fatal { error: None },
                        1 => Failure::PauseGroup {
                            error: None,
                            pause: Duration::from_millis(u64::from(d)),
                        },
                        2 => Failure::Retry {
                            error: Some("x".into()),
                            after: Some(Duration::from_millis(u64::from(d))),
                        },
                        _ => Failure::Retry {
                            error: None,
                            after: None,
                        },
                    };
                    match q.fail(now, &h.id, h.token, failure, 0.5) {
                        Ok(_) => {
                            prop_assert!(h.expires > now);
                            live.remove(&h.id);
                        }
                        Err(QueueError::LeaseLost { .. } | QueueError::UnknownJob { .. }) => {
                            prop_assert!(h.expires <= now)
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                    stale.push(h);
                }
            }
            Step::Extend { pick: p } => {
                if let Some(h) = pick(&held, p) {
                    match q.extend(now, &h.id, h.token, Duration::from_millis(1_500)) {
                        Ok(expires) => {
                            prop_assert!(h.expires > now);
                            for x in held.iter_mut().filter(|x| x.token == h.token) {
                                x.expires = expires;
                            }
                            if let Some(l) = live.get_mut(&h.id) {
                                l.expires = expires;
                            }
                        }
                        Err(QueueError::LeaseLost { .. }) => {
                            prop_assert!(h.expires <= now);
                            held.retain(|x| x.token != h.token);
                            stale.push(h);
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
            }
            Step::Crash { pick: p } => {
                if let Some(h) = pick(&held, p) {
                    held.retain(|x| x.token != h.token);
                    crashed.push(h);
                }
            }
            Step::Stale { pick: p } => {
                if let Some(h) = pick(&stale, p) {
                    // A token once used up or outlived changes nothing, whatever the job's
                    // state and whichever call uses it: refused as lost, the job gone, or
                    // (a failure report repeated with the token that made it) answered as a
                    // repeat.
                    let mark =
                        |j: Option<paceline_queue::JobInfo>| j.map(|j| (j.attempts, j.last_error));
                    let before = mark(q.job(&h.id));
                    let answer = match p % 3 {
                        0 => q.ack(now, &h.id, h.token).map(|()| None),
                        1 => q
                            .extend(now, &h.id, h.token, Duration::from_millis(500))
                            .map(|_| None),
                        _ => q
                            .fail(now, &h.id, h.token, Failure::Fatal { error: None }, 0.5)
                            .map(Some),
                    };
                    let refused = match answer {
                        Err(QueueError::LeaseLost { .. } | QueueError::UnknownJob { .. }) => true,
                        Ok(Some(FailOutcome::Repeated)) => mark(q.job(&h.id)) == before,
                        _ => false,
                    };
                    prop_assert!(refused, "stale lease {} of {} accepted", h.token, h.id);
                }
            }
            Step::Advance { ms: d } => now += u64::from(d) * ms,
            Step::Cancel { pick: p } => {
                let ids: Vec<String> = enqueued.difference(&gone).cloned().collect();
                if let Some(id) = pick(&ids, p) {
                    match q.cancel(now, &id) {
                        Ok(()) => {
                            gone.insert(id);
                        }
                        Err(QueueError::Conflict { .. }) => {
                            prop_assert_eq!(q.job(&id).map(|j| j.state), Some(JobState::Active))
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
            }
            Step::RetryDead => {
                q.retry_dead(now, None)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            }
        }
        // Crashed workers' leases run out on their own.
        crashed.retain(|h| h.expires > now);
        if let Err(e) = q.check_invariants() {
            return Err(TestCaseError::fail(e));
        }
        let counts = q
            .counts(now)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let mut stats = q
            .stats(now)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(
            stats.waiting,
            stats.groups.iter().map(|g| g.waiting).sum::<u64>()
        );
        stats.groups.clear();
        prop_assert_eq!(counts, stats);
    }
    // No job lost: every job enqueued and not acked, cancelled or purged is still there.
    for id in enqueued.difference(&gone) {
        prop_assert!(q.job(id).is_some(), "job {} lost", id);
    }
    // And once workers take everything (crashed workers' leases running out), every job
    // ends acknowledged or dead.
    now += 3_600_000 * ms;
    for _ in 0..10_000 {
        let leased = q
            .lease(now, "closer", 1_000, None)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        for job in leased {
            starts
                .entry(job.group.clone())
                .or_default()
                .push(job.started);
            q.ack(now, &job.id, job.lease)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            gone.insert(job.id);
        }
        match q.next_event() {
            Some(next) => now = now.max(next),
            None => break,
        }
    }
    for id in enqueued.difference(&gone) {
        let state = q.job(id).map(|j| j.state);
        prop_assert_eq!(
            state,
            Some(JobState::Dead),
            "job {} neither acked nor dead",
            id
        );
    }
    // Every group's starts pass its policy, replayed in order.
    for (group, times) in &starts {
        let (policy, spec) = if group == "g3" {
            (&own, next)
        } else {
            (&policy, spec)
        };
        let mut state = None;
        for &t in times {
            let d = policy
                .apply(&mut state, t, Op::Limit, 1)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert!(d.allowed, "{} started at {} over {}", group, t, spec);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_workloads_keep_every_rule(
        spec in proptest::sample::select(POLICIES),
        cap in prop_oneof![Just(0u32), 1u32..3],
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        run(spec, cap, steps)?;
    }
}

/// Enqueues at random times into random groups, with workers that start every job the
/// moment its group allows: each job starts exactly at its `estimated_start`, and each
/// group's jobs start in the order they were enqueued.
fn estimates_hold(spec: &str, steps: Vec<(u8, u16)>) -> Result<(), TestCaseError> {
    let policy: Policy = spec
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let mut q = QueueCore::new(QueueConfig::new(policy))
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let mut now = 1_000_000_000u64;
    let mut estimates: BTreeMap<String, u64> = BTreeMap::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut started: BTreeMap<String, u64> = BTreeMap::new();
    let mut lines: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Workers that are always there: everything that may start up to `until` starts.
    let drain = |q: &mut QueueCore,
                 now: &mut u64,
                 until: u64,
                 started: &mut BTreeMap<String, u64>,
                 lines: &mut BTreeMap<String, Vec<String>>|
     -> Result<(), TestCaseError> {
        loop {
            let jobs = q
                .lease(*now, "w", 1_000, None)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            for job in jobs {
                started.insert(job.id.clone(), job.started);
                lines
                    .entry(job.group.clone())
                    .or_default()
                    .push(job.id.clone());
                q.ack(*now, &job.id, job.lease)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            }
            match q.next_event() {
                Some(next) if next <= until => *now = (*now).max(next),
                _ => {
                    *now = until;
                    return Ok(());
                }
            }
        }
    };
    for (group, gap_ms) in steps {
        let until = now + u64::from(gap_ms) * 1_000;
        drain(&mut q, &mut now, until, &mut started, &mut lines)?;
        let group = format!("g{}", group % 3);
        let e = q
            .enqueue(now, NewJob::new(group.clone(), vec![]))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        estimates.insert(e.id.clone(), e.estimated_start);
        order.entry(group).or_default().push(e.id);
    }
    drain(&mut q, &mut now, u64::MAX / 4, &mut started, &mut lines)?;
    for (id, estimate) in &estimates {
        prop_assert_eq!(started.get(id), Some(estimate), "job {} under {}", id, spec);
    }
    prop_assert_eq!(lines, order);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn with_workers_always_there_every_job_starts_at_its_estimate(
        spec in proptest::sample::select(POLICIES),
        steps in proptest::collection::vec((0u8..3, prop_oneof![2 => Just(0u16), 1 => 0u16..3_000]), 1..80),
    ) {
        estimates_hold(spec, steps)?;
    }
}

/// A step of a workload on a queue of several partitions.
#[derive(Clone, Debug)]
enum Move {
    Enqueue { group: u8, id: Option<u8> },
    Lease { max_jobs: u8 },
    Ack { pick: u8 },
    Retry { pick: u8 },
    Advance { ms: u16 },
}

fn moves() -> impl Strategy<Value = Move> {
    prop_oneof![
        4 => (0u8..6, proptest::option::of(0u8..6)).prop_map(|(group, id)| Move::Enqueue { group, id }),
        4 => (1u8..6).prop_map(|max_jobs| Move::Lease { max_jobs }),
        3 => any::<u8>().prop_map(|pick| Move::Ack { pick }),
        1 => any::<u8>().prop_map(|pick| Move::Retry { pick }),
        3 => (1u16..2_500).prop_map(|ms| Move::Advance { ms }),
    ]
}

/// Runs `moves` on a queue of `partitions` in memory, checking after each: a lease answers
/// at most `max_jobs` jobs, never one with a live lease; each fence names its job's
/// partition (`fence mod partitions`) and grows with each lease of the job; each id the
/// queue gives names its group's partition; the counts are every job not acknowledged;
/// and, at the end, every group's starts pass its policy.
fn partitioned_run(spec: &str, partitions: u32, moves: Vec<Move>) -> Result<(), TestCaseError> {
    use paceline_queue::partitioned::partition_of;
    use paceline_queue::{Partitioned, Queue};
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}"));
    let policy: Policy = spec.parse().map_err(|e| fail(&e))?;
    let config = QueueConfig::new(policy.clone())
        .lease(Duration::from_millis(1_500))
        .retry_backoff(Duration::from_millis(200), Duration::from_secs(2))
        .partitions(partitions);
    let clock = paceline_core::ManualClock::new(1_700_000_000_000_000);
    let queue = Partitioned::in_memory("props", config, std::sync::Arc::new(clock.clone()))
        .map_err(|e| fail(&e))?;
    let queue = Queue::new(queue);
    paceline_testkit::runtime().block_on(async {
        let mut held: Vec<paceline_queue::Leased> = Vec::new();
        let mut fences: BTreeMap<String, u64> = BTreeMap::new();
        let mut starts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut alive: BTreeSet<String> = BTreeSet::new();
        for step in moves {
            let now = paceline_core::Clock::now_micros(&clock);
            match step {
                Move::Enqueue { group, id } => {
                    let group = format!("g{group}");
                    let mut job = NewJob::new(group.clone(), vec![]);
                    if let Some(id) = id {
                        job = job.id(format!("job-{id}-{group}"));
                    }
                    let e = queue.enqueue(job).await.map_err(|e| fail(&e))?;
                    if id.is_none() {
                        let named = match e.id.split_once('.') {
                            Some((_, p)) => p.parse::<usize>().map_err(|e| fail(&e))?,
                            None => 0,
                        };
                        prop_assert_eq!(named, partition_of(&group, partitions), "{}", e.id);
                    }
                    alive.insert(e.id);
                }
                Move::Lease { max_jobs } => {
                    let leased = queue
                        .lease("w", usize::from(max_jobs), None, Duration::ZERO)
                        .await
                        .map_err(|e| fail(&e))?;
                    prop_assert!(leased.len() <= usize::from(max_jobs));
                    for job in leased {
                        let live = held.iter().any(|h| h.id == job.id && h.lease_expires > now);
                        prop_assert!(!live, "{} leased twice", job.id);
                        prop_assert_eq!(
                            job.lease % u64::from(partitions),
                            partition_of(&job.group, partitions) as u64
                        );
                        let before = fences.insert(job.id.clone(), job.lease).unwrap_or(0);
                        prop_assert!(
                            job.lease > before,
                            "{}: fence {} after {}",
                            job.id,
                            job.lease,
                            before
                        );
                        starts
                            .entry(job.group.clone())
                            .or_default()
                            .push(job.started);
                        held.retain(|h| h.id != job.id);
                        held.push(job);
                    }
                }
                Move::Ack { pick: p } | Move::Retry { pick: p } if !held.is_empty() => {
                    let job = held.remove(p as usize % held.len());
                    let live = job.lease_expires > now;
                    let answer = if matches!(step, Move::Ack { .. }) {
                        queue.ack(&job.id, &job.token).await.map(|()| true)
                    } else {
                        let retry = Failure::Retry {
                            error: None,
                            after: None,
                        };
                        queue.fail(&job.id, &job.token, retry).await.map(|_| false)
                    };
                    match answer {
                        Ok(acked) => {
                            prop_assert!(live, "{}: an expired lease taken", job.id);
                            if acked {
                                alive.remove(&job.id);
                            }
                        }
                        Err(QueueError::LeaseLost { .. }) => prop_assert!(!live),
                        Err(e) => return Err(fail(&e)),
                    }
                }
                Move::Ack { .. } | Move::Retry { .. } => {}
                Move::Advance { ms } => clock.advance(Duration::from_millis(u64::from(ms))),
            }
            let c = queue.counts().await.map_err(|e| fail(&e))?;
            prop_assert_eq!(
                c.scheduled + c.waiting + c.active + c.dead,
                alive.len() as u64,
                "{:?}",
                c
            );
        }
        for (group, times) in &starts {
            let mut state = None;
            for &t in times {
                let d = policy
                    .apply(&mut state, t, Op::Limit, 1)
                    .map_err(|e| fail(&e))?;
                prop_assert!(d.allowed, "{} started at {} over {}", group, t, spec);
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_queue_of_several_partitions_keeps_every_rule(
        spec in proptest::sample::select(POLICIES),
        partitions in 2u32..5,
        steps in proptest::collection::vec(moves(), 1..80),
    ) {
        partitioned_run(spec, partitions, steps)?;
    }
}

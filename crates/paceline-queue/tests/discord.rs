//! Discord's role grants (10 per 10 s per server) and the backlog case, on a virtual clock:
//! the queue holds each group's *starts* to its policy.

use std::collections::BTreeMap;

use paceline_core::{Op, Policy};
use paceline_queue::{NewJob, QueueConfig, QueueCore};

const S: u64 = 1_000_000;

fn policy(spec: &str) -> Policy {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn queue(spec: &str) -> QueueCore {
    QueueCore::new(QueueConfig::new(policy(spec))).unwrap_or_else(|e| panic!("{e}"))
}

/// Workers that lease everything they may, whenever they may, from `from` on, and ack at
/// once; returns each job's (group, start) by id.
fn drain(q: &mut QueueCore, from: u64) -> BTreeMap<String, (String, u64)> {
    let mut starts = BTreeMap::new();
    let mut now = from;
    for _ in 0..100_000 {
        let leased = q.lease(now, "worker", 1_000, None).expect("lease");
        for job in &leased {
            starts.insert(job.id.clone(), (job.group.clone(), job.started));
            q.ack(now, &job.id, job.lease).expect("ack");
        }
        match q.next_event() {
            Some(next) => now = next.max(now),
            None => return starts,
        }
    }
    panic!("the queue never drained");
}

/// Replays each group's starts through the policy with `limit`: every one must pass.
fn assert_starts_within(spec: &str, starts: &BTreeMap<String, (String, u64)>) {
    let mut by_group: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (group, t) in starts.values() {
        by_group.entry(group).or_default().push(*t);
    }
    let p = policy(spec);
    for (group, mut times) in by_group {
        times.sort_unstable();
        let mut state = None;
        for t in times {
            let d = p.apply(&mut state, t, Op::Limit, 1).expect("replay");
            assert!(d.allowed, "{group}: a start at {t} µs is over {spec}");
        }
    }
}

#[test]
fn three_groups_of_a_hundred_at_ten_per_ten_seconds() {
    let spec = "fixed_window:limit=10,window=10s";
    let mut q = queue(spec);
    let t0 = 3 * S + S / 2; // mid-window: the first window has 6.5 s left
    let mut estimates = BTreeMap::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..100u64 {
        for g in ["guild:a", "guild:b", "guild:c"] {
            let e = q
                .enqueue(t0, NewJob::new(g, i.to_le_bytes().to_vec()))
                .expect("enqueue");
            // Jobs that fit the current window run now; the others at
            // nextWindowStart + floor(waiting / perWindow) * window.
            let seed = if i < 10 {
                t0
            } else {
                10 * S + (i - 10) / 10 * 10 * S
            };
            assert_eq!(e.estimated_start, seed, "{g} job {i}");
            estimates.insert(e.id.clone(), e.estimated_start);
            order.entry(g.to_string()).or_default().push(e.id);
        }
    }
    let starts = drain(&mut q, t0);
    assert_eq!(starts.len(), 300);
    // In no aligned window does a group start more than 10.
    let mut per_window: BTreeMap<(&str, u64), u32> = BTreeMap::new();
    for (group, t) in starts.values() {
        *per_window.entry((group, t / (10 * S))).or_default() += 1;
    }
    assert!(per_window.values().all(|&n| n <= 10), "{per_window:?}");
    // FIFO within each group.
    for ids in order.values() {
        let times: Vec<u64> = ids.iter().map(|id| starts[id].1).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }
    // The least time the limits allow: ten windows, the last starting at 90 s.
    assert_eq!(starts.values().map(|s| s.1).max(), Some(90 * S));
    // With workers always there, every estimate is the start.
    for (id, (_, t)) in &starts {
        assert_eq!(estimates[id], *t, "{id}");
    }
    assert_starts_within(spec, &starts);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_backlog_built_while_workers_were_away_starts_no_faster_than_the_policy() {
    for spec in [
        "fixed_window:limit=10,window=10s",
        "gcra:rate=1/s,burst=5",
        "sliding_window:limit=10,window=10s",
        "sliding_log:limit=10,window=10s",
        "pacer:rate=1/s,max_burst=3",
        "smooth_bursty:rate=1/s,max_burst_seconds=5",
        "smooth_warming_up:rate=2/s,warmup=5s",
    ] {
        let mut q = queue(spec);
        for i in 0..60u8 {
            q.enqueue(0, NewJob::new("g", vec![i])).expect("enqueue");
        }
        // No worker for a minute, then workers that take all they may.
        let starts = drain(&mut q, 60 * S);
        assert_eq!(starts.len(), 60, "{spec}");
        assert!(starts.values().all(|s| s.1 >= 60 * S));
        assert_starts_within(spec, &starts);
        // And the start right after the return is only what the policy lets through at
        // once, not the minute's worth of slots missed.
        let at_return = starts.values().filter(|s| s.1 == 60 * S).count();
        let mut state = None;
        let burst = (0..)
            .take_while(|_| {
                policy(spec)
                    .apply(&mut state, 60 * S, Op::Limit, 1)
                    .is_ok_and(|d| d.allowed)
            })
            .count();
        assert_eq!(at_return, burst, "{spec}");
        assert_eq!(q.check_invariants(), Ok(()), "{spec}");
    }
}

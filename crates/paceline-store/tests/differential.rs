//! Differential tests: the Lua twins on Redis and on a 3-primary Redis Cluster give the same
//! decisions as the Rust engine in memory.
//!
//! For each algorithm, proptest generates a few policies of that algorithm (live parameter
//! changes), sometimes one of another algorithm (a restart of the key), and a sequence of
//! steps over three keys: time advances (zero, a few microseconds, up to twice the policy's
//! natural period, or exactly the last decision's delay, landing on the boundaries the
//! algorithms compute) and requests (`pace`, `pace` with `max_wait`, `limit`, `peek`,
//! `reset`, costs from 1 to a few). The same script runs against the memory store, a Redis
//! server and a Redis Cluster, all reading one injected clock. Decisions must be identical
//! (the contract allows 1 µs on `delay` and `reset_after`; the twins do better); input errors
//! must name the same field.
//!
//! `PROPTEST_CASES` sets the number of cases per algorithm (default 96).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy, Request};
use paceline_store::{Decision, Error, ManualClock, MemoryStore, Op, Policy, Store};
use paceline_testkit::{shared_cluster, shared_server};
use proptest::prelude::*;

/// 2023-11-14 in microseconds since the Unix epoch: realistic float magnitudes.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

#[derive(Clone, Debug)]
enum Step {
    /// Advance the clock by this many µs.
    Sleep(u64),
    /// Advance the clock by the last decision's delay, rounded up to a whole µs.
    SleepDelay,
    Request {
        key: usize,
        op: OpKind,
        cost: u64,
        policy: usize,
    },
}

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Pace,
    PaceWithin(u64),
    Limit,
    Peek,
    Reset,
}

/// A generated case: policies (the first few of the algorithm under test, perhaps a foreign
/// one last), a start time and the steps.
#[derive(Clone, Debug)]
struct Case {
    specs: Vec<String>,
    start: u64,
    steps: Vec<Step>,
}

fn case(algorithm: impl Strategy<Value = String>, period_us: u64) -> impl Strategy<Value = Case> {
    let specs = (
        prop::collection::vec(algorithm, 1..=3),
        prop::option::weighted(0.2, foreign_spec()),
    )
        .prop_map(|(mut specs, foreign)| {
            specs.extend(foreign);
            specs
        });
    // Realistic times (2023, where f64 µs are quantised to 0.25 µs) and times near the
    // epoch, as `simulate` uses (where sub-µs float residue survives).
    let start = prop_oneof![
        (0..1_000_000_000u64).prop_map(|offset| EPOCH_2023 + offset),
        0..1_000_000_000u64,
    ];
    (specs, start).prop_flat_map(move |(specs, start)| {
        let n = specs.len();
        let step = prop_oneof![
            3 => Just(Step::Sleep(0)),
            2 => (1..10u64).prop_map(Step::Sleep),
            4 => (0..=2 * period_us).prop_map(Step::Sleep),
            2 => Just(Step::SleepDelay),
            12 => (0..3usize, op_kind(period_us), 1..=4u64, 0..n).prop_map(
                |(key, op, cost, policy)| Step::Request { key, op, cost, policy }
            ),
        ];
        prop::collection::vec(step, 1..40).prop_map(move |steps| Case {
            specs: specs.clone(),
            start,
            steps,
        })
    })
}

fn op_kind(period_us: u64) -> impl Strategy<Value = OpKind> {
    prop_oneof![
        4 => Just(OpKind::Pace),
        2 => (0..=3 * period_us).prop_map(OpKind::PaceWithin),
        5 => Just(OpKind::Limit),
        2 => Just(OpKind::Peek),
        1 => Just(OpKind::Reset),
    ]
}

/// Another algorithm on the same keys: changing a key's algorithm restarts it.
fn foreign_spec() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..=20u64, 1..=3u64).prop_map(|(rate, burst)| format!("gcra:rate={rate}/s,burst={burst}")),
        (1..=4u64, window()).prop_map(|(l, w)| format!("sliding_log:limit={l},window={w}")),
    ]
}

/// A rate as a spec: a few per second to a few thousand per second, and now and then ten
/// million to a billion per second, whose interval is below the resolution of a time in
/// µs near 2023 in a double (times then stand still: a TAT equals `now`).
fn rate() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (1..=50u64).prop_map(|n| format!("{n}/s")),
        4 => (1..=20u64, 1..=10u64).prop_map(|(n, s)| format!("{n}/{s}s")),
        4 => (1..=3000u64).prop_map(|n| format!("{n}/s")),
        1 => (7..=9u32).prop_map(|e| format!("{}/s", 10u64.pow(e))),
    ]
}

fn window() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..=999u64).prop_map(|n| format!("{n}ms")),
        (1..=10u64).prop_map(|n| format!("{n}s")),
    ]
}

/// The stores under comparison, on one clock: memory, then Redis and Cluster both plain and
/// with auto-batching.
struct Stores {
    clock: ManualClock,
    memory: MemoryStore,
    redis: RedisStore,
    /// The same code run as a script (`EVALSHA`) instead of a function.
    redis_scripts: RedisStore,
    /// Single calls (the lean entry points of `gcra` and `pacer`) and batches of one taking
    /// turns on the same keys: both read what the other wrote.
    redis_mixed: RedisStore,
    cluster: RedisStore,
    redis_batched: RedisStore,
    cluster_batched: RedisStore,
}

/// What the sequential pass did, in order.
enum Recorded {
    /// A reset of key number `.0`.
    Reset(usize),
    Decide(Event),
}

/// A request as made in the sequential pass, with the memory store's answer.
struct Event {
    now: u64,
    key: usize,
    policy: usize,
    op: Op,
    cost: u64,
    expected: Result<Decision, Error>,
}

impl Stores {
    async fn new() -> Stores {
        let clock = ManualClock::new(EPOCH_2023);
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        // Each store on the shared server keeps its own keys (its prefix).
        let connect =
            |url: String, batch: Option<Duration>, scripts: bool, prefix: &'static str| {
                let clock = clock.clone();
                async move {
                    let mut builder = RedisStore::builder(url, FailurePolicy::FailClosed)
                        .prefix(prefix)
                        .clock(Arc::new(clock))
                        .response_timeout(Duration::from_secs(10));
                    if let Some(linger) = batch {
                        builder = builder.auto_batch(linger);
                    }
                    if scripts {
                        builder = builder.scripts_only();
                    }
                    builder.connect().await.expect("connect to the test Redis")
                }
            };
        let redis = connect(shared_server().url(), None, false, "differential").await;
        let redis_scripts =
            connect(shared_server().url(), None, true, "differential-scripts").await;
        let redis_mixed = connect(shared_server().url(), None, false, "differential-mixed").await;
        let cluster = connect(shared_cluster().url(), None, false, "differential").await;
        assert!(cluster.is_cluster());
        assert!(redis.runs_as_functions() && cluster.runs_as_functions());
        assert!(!redis_scripts.runs_as_functions());
        let linger = Some(Duration::from_micros(200));
        Stores {
            redis_batched: connect(shared_server().url(), linger, false, "differential").await,
            cluster_batched: connect(shared_cluster().url(), linger, false, "differential").await,
            redis_scripts,
            redis_mixed,
            clock,
            memory,
            redis,
            cluster,
        }
    }

    /// Runs one case on every store, failing at the first disagreement: first one request
    /// at a time (memory, Redis, Cluster), then the requests made at the same instant as one
    /// batch, through `decide_batch` and through auto-batching.
    async fn run(&self, case: &Case) -> Result<(), TestCaseError> {
        let policies: Vec<Policy> = case
            .specs
            .iter()
            .map(|s| s.parse().expect("generated specs are valid"))
            .collect();
        let events = self.run_sequentially(case, &policies).await?;
        self.run_batched(&events, &policies).await
    }

    async fn run_sequentially(
        &self,
        case: &Case,
        policies: &[Policy],
    ) -> Result<Vec<Recorded>, TestCaseError> {
        let id = next_case_id();
        let mut events = Vec::new();
        self.clock.set_micros(case.start);
        let mut last_delay = Duration::ZERO;
        for (index, step) in case.steps.iter().enumerate() {
            match *step {
                Step::Sleep(us) => self.clock.advance(Duration::from_micros(us)),
                Step::SleepDelay => {
                    let us = last_delay.as_nanos().div_ceil(1000);
                    self.clock
                        .advance(Duration::from_micros(u64::try_from(us).unwrap_or(0)));
                }
                Step::Request {
                    key,
                    op,
                    cost,
                    policy,
                } => {
                    let key_index = key;
                    let policy_index = policy;
                    // Each case has its own keys, spread over the cluster's slots.
                    let key = format!("case{id}:k{key}");
                    let policy = &policies[policy];
                    let op = match op {
                        OpKind::Pace => Op::pace(),
                        OpKind::PaceWithin(us) => Op::pace_within(Duration::from_micros(us)),
                        OpKind::Limit => Op::Limit,
                        OpKind::Peek => Op::Peek,
                        OpKind::Reset => {
                            self.memory.reset(&key).await.expect("memory reset");
                            self.redis.reset(&key).await.expect("redis reset");
                            self.redis_scripts.reset(&key).await.expect("redis reset");
                            self.redis_mixed.reset(&key).await.expect("redis reset");
                            self.cluster.reset(&key).await.expect("cluster reset");
                            events.push(Recorded::Reset(key_index));
                            continue;
                        }
                    };
                    let expected = self.memory.decide(policy, &key, op, cost).await;
                    let mut answers = Vec::with_capacity(4);
                    for (name, store) in [
                        ("redis", &self.redis),
                        ("redis (as a script)", &self.redis_scripts),
                        ("cluster", &self.cluster),
                    ] {
                        answers.push((name, store.decide(policy, &key, op, cost).await));
                    }
                    let mixed = if index % 2 == 0 {
                        self.redis_mixed.decide(policy, &key, op, cost).await
                    } else {
                        let request = Request {
                            policy,
                            key: &key,
                            op,
                            cost,
                        };
                        let mut got = self.redis_mixed.decide_batch(&[request]).await;
                        got.pop().expect("one answer per request")
                    };
                    answers.push(("redis (single calls and batches in turn)", mixed));
                    for (name, got) in answers {
                        if let Err(why) = same(&expected, &got) {
                            return Err(TestCaseError::fail(format!(
                                "step {index} ({policy} {op:?} cost {cost} on {key} at {} µs): \
                                 {name} differs from memory: {why}\n memory: {expected:?}\n {name}: {got:?}",
                                self.clock.now_micros()
                            )));
                        }
                    }
                    if let Ok(d) = &expected {
                        last_delay = d.delay;
                    }
                    events.push(Recorded::Decide(Event {
                        now: self.clock.now_micros(),
                        key: key_index,
                        policy: policy_index,
                        op,
                        cost,
                        expected,
                    }));
                }
            }
        }
        Ok(events)
    }

    /// Replays `events` on fresh keys, each run of requests at one instant (between resets)
    /// as one batch, and compares with the sequential answers.
    async fn run_batched(
        &self,
        events: &[Recorded],
        policies: &[Policy],
    ) -> Result<(), TestCaseError> {
        let explicit = next_case_id();
        let auto = next_case_id();
        let key = |id: u64, k: usize| format!("case{id}:k{k}");
        let mut rest = events;
        while let Some((first, _)) = rest.split_first() {
            let first = match first {
                Recorded::Reset(k) => {
                    self.redis.reset(&key(explicit, *k)).await.expect("reset");
                    self.redis_scripts
                        .reset(&key(explicit, *k))
                        .await
                        .expect("reset");
                    self.cluster.reset(&key(explicit, *k)).await.expect("reset");
                    self.redis_batched
                        .reset(&key(auto, *k))
                        .await
                        .expect("reset");
                    self.cluster_batched
                        .reset(&key(auto, *k))
                        .await
                        .expect("reset");
                    rest = &rest[1..];
                    continue;
                }
                Recorded::Decide(first) => first,
            };
            let run = rest
                .iter()
                .take_while(|e| matches!(e, Recorded::Decide(e) if e.now == first.now))
                .count();
            let segment: Vec<&Event> = rest[..run]
                .iter()
                .filter_map(|e| match e {
                    Recorded::Decide(e) => Some(e),
                    Recorded::Reset(_) => None,
                })
                .collect();
            rest = &rest[run..];
            self.clock.set_micros(first.now);

            let keys: Vec<String> = segment.iter().map(|e| key(explicit, e.key)).collect();
            let requests: Vec<Request> = segment
                .iter()
                .zip(&keys)
                .map(|(e, k)| Request {
                    policy: &policies[e.policy],
                    key: k,
                    op: e.op,
                    cost: e.cost,
                })
                .collect();
            let auto_keys: Vec<String> = segment.iter().map(|e| key(auto, e.key)).collect();
            // `gcra` and `pacer` batches take the lean batch on functions, `decide` as scripts.
            for (name, store) in [
                ("redis", &self.redis),
                ("redis (scripts)", &self.redis_scripts),
                ("cluster", &self.cluster),
            ] {
                let got = store.decide_batch(&requests).await;
                compare(name, "decide_batch", &segment, got)?;
            }
            for (name, store) in [
                ("redis", &self.redis_batched),
                ("cluster", &self.cluster_batched),
            ] {
                // All at once: queued in this order, so batched in this order.
                let calls = segment
                    .iter()
                    .zip(&auto_keys)
                    .map(|(e, k)| store.decide(&policies[e.policy], k, e.op, e.cost));
                // `join_all` polls them in order on this task, so they enqueue in this order.
                let got = futures_util::future::join_all(calls).await;
                compare(name, "auto-batching", &segment, got)?;
            }
        }
        Ok(())
    }
}

fn next_case_id() -> u64 {
    static CASE: AtomicU64 = AtomicU64::new(0);
    CASE.fetch_add(1, Ordering::Relaxed)
}

fn compare(
    name: &str,
    how: &str,
    segment: &[&Event],
    got: Vec<Result<Decision, Error>>,
) -> Result<(), TestCaseError> {
    for (i, (event, got)) in segment.iter().zip(&got).enumerate() {
        if let Err(why) = same(&event.expected, got) {
            return Err(TestCaseError::fail(format!(
                "{name} {how}, request {i} of a batch of {} at {} µs ({:?} cost {} on key {}): \
                 {why}\n memory: {:?}\n {name}: {got:?}",
                segment.len(),
                event.now,
                event.op,
                event.cost,
                event.key,
                event.expected
            )));
        }
    }
    Ok(())
}

use paceline_store::Clock as _;

/// Identical decisions, or errors naming the same field.
fn same(a: &Result<Decision, Error>, b: &Result<Decision, Error>) -> Result<(), String> {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            // The twins repeat the Rust float operations in order: the times are identical,
            // not merely within the 1 µs the contract allows.
            if a == b {
                Ok(())
            } else {
                Err("decisions differ".into())
            }
        }
        (Err(Error::Input(a)), Err(Error::Input(b))) if a.field() == b.field() => Ok(()),
        _ => Err("one failed, the other did not".into()),
    }
}

/// Runs `cases` of `strategy` against the three stores.
fn differential(strategy: impl Strategy<Value = Case>) {
    let runtime = paceline_testkit::runtime();
    let stores = runtime.block_on(Stores::new());
    paceline_testkit::check_cases(96, &strategy, |case| runtime.block_on(stores.run(&case)));
}

#[test]
fn gcra_matches_memory() {
    let spec = (rate(), 1..=5u64).prop_map(|(r, b)| format!("gcra:rate={r},burst={b}"));
    differential(case(spec, 200_000));
}

#[test]
fn pacer_matches_memory() {
    let factor = prop::option::of(prop_oneof![Just(0.25), Just(0.5), Just(1.0), 0.05..=1.0f64]);
    let burst = prop_oneof![Just(0.0), (0..=4u64).prop_map(|b| b as f64), 0.0..5.0f64];
    let spec = (rate(), burst, factor).prop_map(|(r, b, f)| match f {
        Some(f) => format!("pacer:rate={r},max_burst={b},burst_allowance_factor={f}"),
        None => format!("pacer:rate={r},max_burst={b}"),
    });
    differential(case(spec, 200_000));
}

#[test]
fn fixed_window_matches_memory() {
    let spec = (1..=6u64, window()).prop_map(|(l, w)| format!("fixed_window:limit={l},window={w}"));
    differential(case(spec, 1_000_000));
}

#[test]
fn exec_evenly_matches_memory() {
    let spec = (1..=8u64, window(), prop::option::of(0..=300u64)).prop_map(|(p, d, m)| match m {
        Some(m) => format!("exec_evenly:points={p},duration={d},min_delay={m}ms"),
        None => format!("exec_evenly:points={p},duration={d}"),
    });
    differential(case(spec, 1_000_000));
}

#[test]
fn sliding_log_matches_memory() {
    let spec = (
        1..=6u64,
        window(),
        prop::option::of(0..=200u64),
        any::<bool>(),
    )
        .prop_map(|(l, w, m, blocked)| {
            let mut spec = format!("sliding_log:limit={l},window={w}");
            if let Some(m) = m {
                spec.push_str(&format!(",min_interval={m}ms"));
            }
            if blocked {
                spec.push_str(",count_blocked=true");
            }
            spec
        });
    differential(case(spec, 1_000_000));
}

#[test]
fn sliding_window_matches_memory() {
    let spec =
        (1..=6u64, window()).prop_map(|(l, w)| format!("sliding_window:limit={l},window={w}"));
    differential(case(spec, 1_000_000));
}

#[test]
fn smooth_bursty_matches_memory() {
    let burst = prop::option::of(prop_oneof![Just(0.0), Just(1.0), 0.0..=5.0f64]);
    let spec = (rate(), burst).prop_map(|(r, b)| match b {
        Some(b) => format!("smooth_bursty:rate={r},max_burst_seconds={b}"),
        None => format!("smooth_bursty:rate={r}"),
    });
    differential(case(spec, 500_000));
}

#[test]
fn smooth_warming_up_matches_memory() {
    let spec = (rate(), window(), prop::option::of(1.0..=5.0f64)).prop_map(|(r, w, c)| match c {
        Some(c) => format!("smooth_warming_up:rate={r},warmup={w},cold_factor={c}"),
        None => format!("smooth_warming_up:rate={r},warmup={w}"),
    });
    differential(case(spec, 1_000_000));
}

#[test]
fn concurrency_matches_memory() {
    let spec = (1..=5u64, window()).prop_map(|(l, w)| format!("concurrency:limit={l},lease={w}"));
    differential(case(spec, 1_000_000));
}

/// A `pace` backlog on one key crossing the window algorithms' horizon
/// (`MAX_BOOKED_WINDOWS`, 10,000 windows ahead): memory and Redis book the same windows,
/// then refuse the same paces past the horizon (retry when the next window opens), and
/// admit again once it has.
#[test]
fn a_pace_backlog_stops_at_the_horizon_in_memory_and_on_redis() {
    const HORIZON: u64 = paceline_store::policy::fixed_window::MAX_BOOKED_WINDOWS;
    assert_eq!(HORIZON, 10_000, "the Lua twins' `PL.windows.MAX_BOOKED`");
    let runtime = paceline_testkit::runtime();
    let stores = runtime.block_on(Stores::new());
    runtime.block_on(async {
        // limit=1 books every window in `fixed_window`, every other one in `sliding_window`:
        // how many paces each admits, and the last window booked.
        for (spec, admitted, last_window) in [
            ("fixed_window:limit=1,window=1s", HORIZON, HORIZON - 1),
            ("sliding_window:limit=1,window=1s", HORIZON / 2, HORIZON - 2),
        ] {
            let policy: Policy = spec.parse().unwrap();
            let key = format!("case{}:horizon", next_case_id());
            let start = EPOCH_2023 + 300_000; // 300 ms into a window
            stores.clock.set_micros(start);
            let request = Request {
                policy: &policy,
                key: &key,
                op: Op::pace(),
                cost: 1,
            };
            // Batches of 500, then 5 more past the horizon.
            let mut decisions = Vec::new();
            let full = admitted as usize / 500;
            for batch in 0..=full {
                let requests = vec![request; if batch < full { 500 } else { 5 }];
                let expected = stores.memory.decide_batch(&requests).await;
                let got = stores.redis.decide_batch(&requests).await;
                for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
                    if let Err(why) = same(e, g) {
                        panic!(
                            "{spec}, pace {}: {why}\n memory: {e:?}\n redis: {g:?}",
                            batch * 500 + i
                        );
                    }
                }
                decisions.extend(expected.into_iter().map(|d| d.expect("a decision")));
            }
            assert_eq!(decisions.len() as u64, admitted + 5);
            let booked = decisions.iter().take_while(|d| d.allowed).count() as u64;
            assert_eq!(booked, admitted, "{spec}");
            let last = &decisions[booked as usize - 1];
            assert_eq!(
                last.delay,
                Duration::from_micros(last_window * 1_000_000 - 300_000)
            );
            for refused in &decisions[booked as usize..] {
                assert!(!refused.allowed, "{spec}");
                assert_eq!(
                    refused.delay,
                    Duration::from_millis(700),
                    "{spec}: the next window"
                );
            }
            // The next window: one more window is bookable.
            stores.clock.set_micros(start + 700_000);
            let expected = stores.memory.decide(&policy, &key, Op::pace(), 1).await;
            let got = stores.redis.decide(&policy, &key, Op::pace(), 1).await;
            same(&expected, &got).unwrap_or_else(|why| panic!("{spec}: {why}"));
            let d = expected.unwrap();
            assert!(d.allowed, "{spec}");
            assert_eq!(d.delay, Duration::from_secs(HORIZON - 1), "{spec}");
        }
    });
}

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
//! Both passes (one request at a time, then each instant's requests as one batch) run on
//! the test kit's differential harness, which reports the first step where a store parts
//! from memory and the seed that replays the run.
//!
//! `PROPTEST_CASES` sets the number of cases per algorithm (default 96).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy, Request};
use paceline_store::{Decision, Error, ManualClock, MemoryStore, Op, Policy, Store};
use paceline_testkit::differential::{self, At, Cases, Differential, Redis, Tick, Twin};
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
    /// A charge of the step's cost times this (charges go past the limit).
    Charge(u64),
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
        2 => prop_oneof![Just(1u64), Just(10), Just(1_000_000)].prop_map(OpKind::Charge),
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

/// What a store said to a step of a case.
#[derive(Debug)]
enum Said {
    Decided(Result<Decision, Error>),
    Reset(Result<(), Error>),
    /// A batch's decisions, in order.
    Batch(Vec<Result<Decision, Error>>),
}

impl differential::Step<Said> for Step {
    fn tick(&self, answers: &[Said]) -> Option<Tick> {
        match *self {
            Step::Sleep(us) => Some(Tick::By(Duration::from_micros(us))),
            Step::SleepDelay => {
                // The last decision's delay (none yet: zero), rounded up to a whole µs.
                let delay = answers
                    .iter()
                    .rev()
                    .find_map(|said| match said {
                        Said::Decided(Ok(d)) => Some(d.delay),
                        _ => None,
                    })
                    .unwrap_or_default();
                let us = u64::try_from(delay.as_nanos().div_ceil(1000)).unwrap_or(0);
                Some(Tick::By(Duration::from_micros(us)))
            }
            Step::Request { .. } => None,
        }
    }
}

/// A store deciding a case's requests on the case's keys one at a time; with `alternate`,
/// by single calls and batches of one in turn.
struct OneByOne<'s> {
    store: &'s dyn Store,
    policies: &'s [Policy],
    case: u64,
    alternate: bool,
}

impl<'s> OneByOne<'s> {
    fn new(store: &'s dyn Store, policies: &'s [Policy], case: u64, alternate: bool) -> Self {
        OneByOne {
            store,
            policies,
            case,
            alternate,
        }
    }
}

impl Twin<Step> for OneByOne<'_> {
    type Answer = Said;

    async fn apply(&mut self, step: &Step, at: At) -> Said {
        let Step::Request {
            key,
            op: op_kind,
            cost,
            policy,
        } = *step
        else {
            unreachable!("clock steps are the runner's")
        };
        // Each case has its own keys, spread over the cluster's slots.
        let key = format!("case{}:k{key}", self.case);
        let policy = &self.policies[policy];
        let op = match op_kind.op() {
            Some(op) => op,
            None => return Said::Reset(self.store.reset(&key).await),
        };
        let cost = op_kind.cost(cost);
        if self.alternate && at.index % 2 == 1 {
            let request = Request {
                policy,
                key: &key,
                op,
                cost,
            };
            let mut got = self.store.decide_batch(&[request]).await;
            return Said::Decided(got.pop().expect("one answer per request"));
        }
        Said::Decided(self.store.decide(policy, &key, op, cost).await)
    }
}

impl OpKind {
    /// The op, or `None` for a reset.
    fn op(self) -> Option<Op> {
        match self {
            OpKind::Pace => Some(Op::pace()),
            OpKind::PaceWithin(us) => Some(Op::pace_within(Duration::from_micros(us))),
            OpKind::Limit => Some(Op::Limit),
            OpKind::Peek => Some(Op::Peek),
            OpKind::Charge(_) => Some(Op::Charge),
            OpKind::Reset => None,
        }
    }

    /// The cost a step of `cost` asks for (a charge's, multiplied).
    fn cost(self, cost: u64) -> u64 {
        match self {
            OpKind::Charge(times) => cost * times,
            _ => cost,
        }
    }
}

/// A request as made in the sequential pass, with the memory store's answer.
#[derive(Clone, Debug)]
struct Event {
    key: usize,
    policy: usize,
    op: Op,
    cost: u64,
    expected: Result<Decision, Error>,
}

/// A step of the batched pass.
#[derive(Debug)]
enum Replay {
    /// The clock to a run of requests' instant.
    At(u64),
    /// A reset of key number `.0`.
    Reset(usize),
    /// The requests made at one instant (between resets), as one batch.
    Batch(Vec<Event>),
}

impl differential::Step<Said> for Replay {
    fn tick(&self, _: &[Said]) -> Option<Tick> {
        match self {
            Replay::At(now) => Some(Tick::To(*now)),
            _ => None,
        }
    }
}

/// The memory store's answers in the sequential pass, given again.
struct Recorded;

impl Twin<Replay> for Recorded {
    type Answer = Said;

    async fn apply(&mut self, step: &Replay, _: At) -> Said {
        match step {
            Replay::Batch(events) => {
                Said::Batch(events.iter().map(|e| e.expected.clone()).collect())
            }
            _ => Said::Reset(Ok(())),
        }
    }
}

/// A Redis store deciding each run of requests at one instant at once, on the case's keys:
/// through `decide_batch`, or (`auto`) through auto-batching.
struct Batched<'s> {
    store: &'s RedisStore,
    policies: &'s [Policy],
    case: u64,
    auto: bool,
}

impl Twin<Replay> for Batched<'_> {
    type Answer = Said;

    async fn apply(&mut self, step: &Replay, _: At) -> Said {
        let key = |k: usize| format!("case{}:k{k}", self.case);
        let events = match step {
            Replay::Batch(events) => events,
            Replay::Reset(k) => return Said::Reset(self.store.reset(&key(*k)).await),
            Replay::At(_) => unreachable!("clock steps are the runner's"),
        };
        let keys: Vec<String> = events.iter().map(|e| key(e.key)).collect();
        if self.auto {
            // All at once: queued in this order, so batched in this order.
            let calls = events
                .iter()
                .zip(&keys)
                .map(|(e, k)| self.store.decide(&self.policies[e.policy], k, e.op, e.cost));
            // `join_all` polls them in order on this task, so they enqueue in this order.
            return Said::Batch(futures_util::future::join_all(calls).await);
        }
        // `gcra` and `pacer` batches take the lean batch on functions, `decide` as scripts.
        let requests: Vec<Request> = events
            .iter()
            .zip(&keys)
            .map(|(e, k)| Request {
                policy: &self.policies[e.policy],
                key: k,
                op: e.op,
                cost: e.cost,
            })
            .collect();
        Said::Batch(self.store.decide_batch(&requests).await)
    }
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
                        .response_timeout(Duration::from_secs(10))
                        // A loaded test machine's shared server may be running another
                        // test's long script as the connection is made.
                        .connect_timeout(Duration::from_secs(10));
                    if let Some(linger) = batch {
                        builder = builder.auto_batch(linger);
                    }
                    if scripts {
                        builder = builder.scripts_only();
                    }
                    builder.connect().await.expect("connect to the test Redis")
                }
            };
        let (server, cluster) = (Redis::Server.url(), Redis::Cluster.url());
        let redis = connect(server.clone(), None, false, "differential").await;
        let redis_scripts = connect(server.clone(), None, true, "differential-scripts").await;
        let redis_mixed = connect(server.clone(), None, false, "differential-mixed").await;
        let cluster_store = connect(cluster.clone(), None, false, "differential").await;
        assert!(cluster_store.is_cluster());
        assert!(redis.runs_as_functions() && cluster_store.runs_as_functions());
        assert!(!redis_scripts.runs_as_functions());
        let linger = Some(Duration::from_micros(200));
        Stores {
            redis_batched: connect(server, linger, false, "differential").await,
            cluster_batched: connect(cluster, linger, false, "differential").await,
            redis_scripts,
            redis_mixed,
            clock,
            memory,
            redis,
            cluster: cluster_store,
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

    /// The case's steps one request at a time: memory against each Redis store. Answers the
    /// requests made (`None`: a reset), each at its time and with memory's answer.
    async fn run_sequentially(
        &self,
        case: &Case,
        policies: &[Policy],
    ) -> Result<Vec<(u64, usize, Option<Event>)>, TestCaseError> {
        let id = next_case_id();
        self.clock.set_micros(case.start);
        let one = |store, alternate| OneByOne::new(store, policies, id, alternate);
        let mut memory = one(&self.memory, false);
        let mut twins = [
            ("redis", one(&self.redis, false)),
            ("redis (as a script)", one(&self.redis_scripts, false)),
            ("cluster", one(&self.cluster, false)),
            (
                "redis (single calls and batches in turn)",
                one(&self.redis_mixed, true),
            ),
        ];
        let answers = Differential::agreeing(&self.clock, same_said)
            .run(&case.steps, ("memory", &mut memory), &mut twins)
            .await?;
        Ok(answers
            .into_iter()
            .map(|(at, said)| {
                let Step::Request {
                    key,
                    op: op_kind,
                    cost,
                    policy,
                } = case.steps[at.index]
                else {
                    unreachable!("clock steps are not answered")
                };
                let event = match (op_kind.op(), said) {
                    (Some(op), Said::Decided(expected)) => Some(Event {
                        key,
                        policy,
                        op,
                        cost: op_kind.cost(cost),
                        expected,
                    }),
                    _ => None,
                };
                (at.now, key, event)
            })
            .collect())
    }

    /// Replays `events` on fresh keys, each run of requests at one instant (between resets)
    /// as one batch, and compares with the sequential answers.
    async fn run_batched(
        &self,
        events: &[(u64, usize, Option<Event>)],
        policies: &[Policy],
    ) -> Result<(), TestCaseError> {
        let mut script = Vec::new();
        // The instant of the batch the last step holds, if it holds one.
        let mut open = None;
        for (now, key, event) in events {
            match (event, script.last_mut()) {
                (None, _) => {
                    script.push(Replay::Reset(*key));
                    open = None;
                }
                (Some(event), Some(Replay::Batch(batch))) if open == Some(*now) => {
                    batch.push(event.clone())
                }
                (Some(event), _) => {
                    script.push(Replay::At(*now));
                    script.push(Replay::Batch(vec![event.clone()]));
                    open = Some(*now);
                }
            }
        }
        let (explicit, auto) = (next_case_id(), next_case_id());
        let batched = |store, case, auto| Batched {
            store,
            policies,
            case,
            auto,
        };
        let mut twins = [
            ("redis decide_batch", batched(&self.redis, explicit, false)),
            (
                "redis (as a script) decide_batch",
                batched(&self.redis_scripts, explicit, false),
            ),
            (
                "cluster decide_batch",
                batched(&self.cluster, explicit, false),
            ),
            (
                "redis auto-batching",
                batched(&self.redis_batched, auto, true),
            ),
            (
                "cluster auto-batching",
                batched(&self.cluster_batched, auto, true),
            ),
        ];
        Differential::agreeing(&self.clock, same_said)
            .run(&script, ("memory one at a time", &mut Recorded), &mut twins)
            .await
            .map(|_| ())
    }
}

fn next_case_id() -> u64 {
    static CASE: AtomicU64 = AtomicU64::new(0);
    CASE.fetch_add(1, Ordering::Relaxed)
}

/// Identical answers: decisions as [`same`] says, resets that both succeeded, batches
/// alike request by request.
fn same_said(a: &Said, b: &Said) -> Result<(), String> {
    match (a, b) {
        (Said::Decided(a), Said::Decided(b)) => same(a, b),
        (Said::Reset(Ok(())), Said::Reset(Ok(()))) => Ok(()),
        (Said::Reset(_), Said::Reset(_)) => Err("a reset failed".into()),
        (Said::Batch(a), Said::Batch(b)) if a.len() == b.len() => {
            for (i, (a, b)) in a.iter().zip(b).enumerate() {
                same(a, b).map_err(|why| format!("request {i} of the batch: {why}"))?;
            }
            Ok(())
        }
        _ => Err("answers of different kinds".into()),
    }
}

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

/// Runs the cases of `strategy` against the stores.
fn differential(strategy: impl Strategy<Value = Case>) {
    let runtime = paceline_testkit::runtime();
    let stores = runtime.block_on(Stores::new());
    Cases::new(96).run(&strategy, |case| runtime.block_on(stores.run(&case)));
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

#[test]
fn a_schedule_centuries_ahead_is_kept_on_redis_as_in_memory() {
    // The most a request may cost, paced or charged at one a day: a schedule 3 billion
    // years ahead, whose record Redis keeps (at most 285 years) instead of refusing its
    // time to live; every later decision on the key agrees with memory's.
    let runtime = paceline_testkit::runtime();
    let stores = runtime.block_on(Stores::new());
    runtime.block_on(async {
        let specs = [
            "gcra:rate=1/d",
            "pacer:rate=1/d",
            "smooth_bursty:rate=1/d",
            "smooth_warming_up:rate=1/d,warmup=1d",
        ];
        for spec in specs {
            let policy: Policy = spec.parse().unwrap();
            for op in [Op::pace(), Op::Charge] {
                let key = format!("case{}:far", next_case_id());
                stores.clock.set_micros(EPOCH_2023);
                for (op, cost) in [
                    (op, paceline_store::spec::MAX_COUNT),
                    (op, 1),
                    (Op::Limit, 1),
                ] {
                    let expected = stores.memory.decide(&policy, &key, op, cost).await;
                    let got = stores.redis.decide(&policy, &key, op, cost).await;
                    same(&expected, &got).unwrap_or_else(|why| panic!("{spec} {op:?}: {why}"));
                    let d = expected.unwrap_or_else(|e| panic!("{spec} {op:?}: {e}"));
                    assert_eq!(d.allowed, op != Op::Limit, "{spec} {op:?}: {d:?}");
                }
            }
        }
    });
}

//! Key independence in the in-memory store: the decisions for one key do not depend on how
//! many other keys exist or what is done to them, for every algorithm.
//!
//! Each case is a random sequence of requests, each after a random clock advance on a
//! [`ManualClock`]: some on key `"a"`, the others on up to a hundred other keys, made through
//! limiters of the same policy and of the other algorithms, including resets. It runs twice:
//! once making only the requests on `"a"` (the clock still moves the same way), once making
//! them all. The decisions for `"a"` must be identical. Stores with one shard (every key in
//! the same shard, so the crowd triggers the shard's sweeps of idle keys) and with several
//! shards are both exercised.

use std::sync::Arc;
use std::time::Duration;

use paceline::store::{MemoryStore, Op};
use paceline::time::ManualClock;
use paceline::{Decision, Limiter, Policy};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

/// Specs of every algorithm used by the crowd (those that parse; see [`crowd_policies`]).
const CROWD_SPECS: &[&str] = &[
    "pacer:rate=20/s,max_burst=2",
    "gcra:rate=10/s,burst=3",
    "fixed_window:limit=3,window=1s",
    "exec_evenly:points=4,duration=1s",
    "sliding_log:limit=3,window=500ms,count_blocked=true",
    "sliding_window:limit=4,window=1s",
    "smooth_bursty:rate=5/s",
    "smooth_warming_up:rate=5/s,warmup=1s",
];

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Limit,
    Peek,
    Pace,
    /// `try_pace` with this `max_wait` in ms.
    TryPace(u64),
    Reset,
}

/// Who an event is for.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Key `"a"`, through the limiter under test.
    A,
    /// Key `k{key}` through limiter `limiter` (0: the policy under test, otherwise a crowd
    /// policy); only in the crowded run.
    Other { key: u8, limiter: usize },
}

/// One request, after the clock moved by `advance` µs (in both runs, so `"a"` sees the same
/// times whether or not the others' requests are made).
#[derive(Clone, Copy, Debug)]
struct Event {
    advance: u64,
    target: Target,
    op: OpKind,
    cost: u64,
}

/// Picks an index by weight from the low byte of `raw` (0 picks the first option).
fn pick(raw: u128, weights: &[u32]) -> usize {
    let total: u32 = weights.iter().sum();
    let mut x = (raw & 0xff) as u32 * total / 256;
    for (i, &w) in weights.iter().enumerate() {
        if x < w {
            return i;
        }
        x -= w;
    }
    unreachable!()
}

fn bits(raw: u128, from: u32, len: u32) -> u64 {
    ((raw >> from) & ((1u128 << len) - 1)) as u64
}

/// An event from 128 random bits (plain integers keep generation fast in debug builds).
fn decode(raw: u128) -> Event {
    let v = bits(raw, 8, 24);
    let advance = match pick(raw, &[4, 4, 1, 1]) {
        0 => 0,
        1 => v % 50_001,
        2 => v % 1_000_001,
        _ => (v * 4) % 5_000_001,
    };
    let target = match pick(raw >> 32, &[1, 2]) {
        0 => Target::A,
        _ => Target::Other {
            key: (bits(raw, 40, 8) % 100) as u8,
            limiter: bits(raw, 48, 8) as usize % (CROWD_SPECS.len() + 1),
        },
    };
    let op = match pick(raw >> 56, &[4, 2, 2, 2, 1]) {
        0 => OpKind::Limit,
        1 => OpKind::Peek,
        2 => OpKind::Pace,
        3 => OpKind::TryPace(bits(raw, 64, 12) % 1_501),
        _ => OpKind::Reset,
    };
    let c = bits(raw, 84, 8);
    let cost = match pick(raw >> 76, &[6, 3, 1]) {
        0 => 1,
        1 => 1 + c % 3,
        _ => 1 + c % 8,
    };
    Event {
        advance,
        target,
        op,
        cost,
    }
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(any::<u128>(), 1..200)
        .prop_map(|raw| raw.into_iter().map(decode).collect())
}

/// Applies one request; `None` for a reset.
fn apply(limiter: &Limiter, key: &str, op: OpKind, cost: u64) -> Option<Decision> {
    let policy = limiter.policy();
    let as_op = match op {
        OpKind::Limit => Op::Limit,
        OpKind::Peek => Op::Peek,
        OpKind::Pace => Op::pace(),
        OpKind::TryPace(ms) => Op::pace_within(Duration::from_millis(ms)),
        OpKind::Reset => {
            limiter.reset_sync(key).unwrap();
            return None;
        }
    };
    let cost = policy
        .max_cost(as_op)
        .map_or(cost, |max| cost.min(max))
        .max(1);
    let decision = match op {
        OpKind::Limit => limiter.limit_sync(key, cost),
        OpKind::Peek => limiter.peek_sync(key, cost),
        OpKind::Pace => limiter.pace_sync(key, cost),
        OpKind::TryPace(ms) => limiter.try_pace_sync(key, cost, Duration::from_millis(ms)),
        OpKind::Reset => unreachable!(),
    };
    Some(decision.unwrap_or_else(|e| panic!("{op:?} cost {cost} on {key}: {e}")))
}

fn parse(spec: &str) -> Policy {
    spec.parse()
        .unwrap_or_else(|e| panic!("spec `{spec}` does not parse: {e}"))
}

/// The crowd's policies.
fn crowd_policies() -> Vec<Policy> {
    CROWD_SPECS.iter().map(|s| parse(s)).collect()
}

fn store(clock: &ManualClock, shards: Option<usize>) -> Arc<MemoryStore> {
    let builder = MemoryStore::builder().clock(clock.clone());
    Arc::new(match shards {
        Some(n) => builder.shards(n).build(),
        None => builder.build(),
    })
}

/// The decisions for `"a"`, alone (`crowded == false`) or among the others' requests.
fn run(
    spec: &str,
    start: u64,
    events: &[Event],
    shards: Option<usize>,
    crowded: bool,
) -> Vec<Option<Decision>> {
    let clock = ManualClock::new(start);
    let store = store(&clock, shards);
    let main = Limiter::with_store(parse(spec), Arc::clone(&store));
    let crowd: Vec<Limiter> = std::iter::once(parse(spec))
        .chain(crowd_policies())
        .map(|p| Limiter::with_store(p, Arc::clone(&store)))
        .collect();
    let mut now = start;
    let mut out = Vec::new();
    for e in events {
        now += e.advance;
        clock.set_micros(now);
        match e.target {
            Target::A => out.push(apply(&main, "a", e.op, e.cost)),
            Target::Other { key, limiter } if crowded => {
                apply(
                    &crowd[limiter % crowd.len()],
                    &format!("k{key}"),
                    e.op,
                    e.cost,
                );
            }
            Target::Other { .. } => {}
        }
    }
    out
}

fn check_independence(spec: &str, start: u64, events: &[Event], shards: Option<usize>) {
    let alone = run(spec, start, events, shards, false);
    let crowded = run(spec, start, events, shards, true);
    let steps: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.target, Target::A))
        .collect();
    for (i, (a, c)) in alone.iter().zip(&crowded).enumerate() {
        assert_eq!(
            a, c,
            "policy {spec}, shards {shards:?}: request #{i} on key \"a\" ({:?} cost {}) \
             decided differently with other keys around\nalone:   {a:?}\ncrowded: {c:?}",
            steps[i].op, steps[i].cost
        );
    }
}

fn config() -> Config {
    Config {
        // PROPTEST_CASES=100000 for a deeper search.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        failure_persistence: None,
        ..Config::default()
    }
}

fn shards() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![Just(Some(1)), Just(Some(4)), Just(None)]
}

fn start() -> impl Strategy<Value = u64> {
    (0u64..10_000_000_000).prop_map(|offset| EPOCH_2023 + offset)
}

macro_rules! independence_test {
    ($name:ident, [$($spec:expr),+ $(,)?]) => {
        proptest! {
            #![proptest_config(config())]

            /// Decisions for one key are the same alone and among other keys.
            #[test]
            fn $name(
                spec in prop::sample::select(&[$($spec),+][..]),
                start in start(),
                shards in shards(),
                events in events(),
            ) {
                check_independence(spec, start, &events, shards);
            }
        }
    };
}

independence_test!(
    pacer_keys_are_independent,
    [
        "pacer:rate=10/s,max_burst=2",
        "pacer:rate=3/s",
        "pacer:rate=50/s,max_burst=5,burst_allowance_factor=0.5",
    ]
);
independence_test!(
    gcra_keys_are_independent,
    ["gcra:rate=10/s,burst=3", "gcra:rate=3/s"]
);
independence_test!(
    fixed_window_keys_are_independent,
    [
        "fixed_window:limit=5,window=1s",
        "fixed_window:limit=2,window=250ms",
    ]
);
independence_test!(
    exec_evenly_keys_are_independent,
    [
        "exec_evenly:points=5,duration=1s",
        "exec_evenly:points=10,duration=1s,min_delay=50ms",
    ]
);
independence_test!(
    sliding_log_keys_are_independent,
    [
        "sliding_log:limit=4,window=1s,min_interval=10ms",
        "sliding_log:limit=3,window=500ms,count_blocked=true",
    ]
);
independence_test!(
    sliding_window_keys_are_independent,
    [
        "sliding_window:limit=5,window=1s",
        "sliding_window:limit=3,window=250ms",
    ]
);
independence_test!(
    smooth_bursty_keys_are_independent,
    [
        "smooth_bursty:rate=5/s",
        "smooth_bursty:rate=10/s,max_burst_seconds=0.5",
    ]
);
independence_test!(
    smooth_warming_up_keys_are_independent,
    [
        "smooth_warming_up:rate=5/s,warmup=2s",
        "smooth_warming_up:rate=10/s,warmup=1s,cold_factor=2",
    ]
);

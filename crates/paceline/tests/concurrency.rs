//! No lost updates: many threads on one key of a shared [`MemoryStore`] decide exactly as
//! one thread doing the same requests one after the other, for every algorithm.
//!
//! The store's [`ManualClock`] stands still during the concurrent phase, so every request
//! is identical and any serialisation of them gives the same sequence of decisions: the
//! multiset of decisions (and so the number admitted) of a concurrent run must equal that of
//! a sequential one. Before that phase every run makes one request and then moves the clock a
//! minute on, so that the Guava policies have stored permits to hand out (a new
//! `smooth_bursty` key has none). Deterministic: no sleeps, no wall-clock assertions.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use paceline::store::MemoryStore;
use paceline::time::ManualClock;
use paceline::{Decision, Limiter, Policy};

const THREADS: usize = 8;
/// 2023-11-14 in microseconds since the Unix epoch.
const T0: u64 = 1_700_000_000_000_000;
/// The instant of the concurrent phase, a minute after the priming request.
const T1: u64 = T0 + 60_000_000;

/// One spec per algorithm, sized so that `limit` admits some but not all of the requests,
/// and how many requests each thread makes.
const CASES: &[(&str, usize)] = &[
    ("pacer:rate=100/s,max_burst=999", 2_000),
    ("gcra:rate=100/s,burst=777", 2_000),
    ("fixed_window:limit=1234,window=10s", 2_000),
    ("exec_evenly:points=500,duration=10s", 2_000),
    // The log holds one entry per admitted unit (and `pace` reserves into the future):
    // fewer requests keep the debug build fast.
    ("sliding_log:limit=300,window=10s", 500),
    ("sliding_log:limit=300,window=10s,count_blocked=true", 500),
    ("sliding_window:limit=1500,window=10s", 2_000),
    ("smooth_bursty:rate=100/s,max_burst_seconds=5", 2_000),
    ("smooth_warming_up:rate=100/s,warmup=5s", 2_000),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Limit,
    Pace,
}

fn parse(spec: &str) -> Policy {
    spec.parse()
        .unwrap_or_else(|e| panic!("spec `{spec}` does not parse: {e}"))
}

/// A fresh store at `T0`, primed with one request on each of `keys`, then moved to `T1`.
fn primed(spec: &str, keys: &[String]) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let limiter = Limiter::with_store(parse(spec), store);
    for key in keys {
        limiter.limit_sync(key, 1).unwrap();
    }
    clock.set_micros(T1);
    (limiter, clock)
}

fn decide(limiter: &Limiter, key: &str, mode: Mode) -> Decision {
    match mode {
        Mode::Limit => limiter.limit_sync(key, 1),
        Mode::Pace => limiter.pace_sync(key, 1),
    }
    .unwrap_or_else(|e| panic!("{mode:?} on {key}: {e}"))
}

/// A sortable form of a decision, for comparing multisets.
type Key = (bool, Duration, u64, Duration, u64);

fn key_of(d: &Decision) -> Key {
    (d.allowed, d.delay, d.remaining, d.reset_after, d.limit)
}

fn sorted(decisions: &[Decision]) -> Vec<Key> {
    let mut keys: Vec<Key> = decisions.iter().map(key_of).collect();
    keys.sort();
    keys
}

/// `n` requests on one key, one after the other.
fn sequential(spec: &str, n: usize, mode: Mode) -> Vec<Decision> {
    let (limiter, _clock) = primed(spec, &["k".to_string()]);
    (0..n).map(|_| decide(&limiter, "k", mode)).collect()
}

/// `THREADS` × `per_thread` requests on one key, all threads at once.
fn concurrent(spec: &str, per_thread: usize, mode: Mode) -> Vec<Decision> {
    let (limiter, _clock) = primed(spec, &["k".to_string()]);
    let barrier = Barrier::new(THREADS);
    let per_thread_decisions: Vec<Vec<Decision>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limiter, barrier) = (&limiter, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    (0..per_thread)
                        .map(|_| decide(limiter, "k", mode))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    per_thread_decisions.concat()
}

fn check_one_key(spec: &str, per_thread: usize, mode: Mode) {
    let n = THREADS * per_thread;
    let seq = sequential(spec, n, mode);
    let conc = concurrent(spec, per_thread, mode);
    let admitted = |ds: &[Decision]| ds.iter().filter(|d| d.allowed).count();
    let (seq_admitted, conc_admitted) = (admitted(&seq), admitted(&conc));
    assert_eq!(
        conc_admitted, seq_admitted,
        "{spec} {mode:?}: {THREADS} threads × {per_thread} admitted {conc_admitted}, one \
         thread doing the same {n} requests admitted {seq_admitted}"
    );
    if mode == Mode::Limit {
        // Sanity: the specs are sized so that the limit binds (smooth_warming_up starts
        // cold and admits one request at an instant).
        assert!(
            seq_admitted >= 1 && seq_admitted < n,
            "{spec}: {seq_admitted} of {n}"
        );
    }
    assert!(
        sorted(&conc) == sorted(&seq),
        "{spec} {mode:?}: the concurrent decisions differ from the sequential ones \
         (as multisets)"
    );
}

macro_rules! one_key_tests {
    ($($name:ident => $index:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let (spec, per_thread) = CASES[$index];
                check_one_key(spec, per_thread, Mode::Limit);
                check_one_key(spec, per_thread, Mode::Pace);
            }
        )*
    };
}

one_key_tests! {
    pacer_one_key_no_lost_updates => 0,
    gcra_one_key_no_lost_updates => 1,
    fixed_window_one_key_no_lost_updates => 2,
    exec_evenly_one_key_no_lost_updates => 3,
    sliding_log_one_key_no_lost_updates => 4,
    sliding_log_count_blocked_one_key_no_lost_updates => 5,
    sliding_window_one_key_no_lost_updates => 6,
    smooth_bursty_one_key_no_lost_updates => 7,
    smooth_warming_up_one_key_no_lost_updates => 8,
}

/// The key thread `t` uses for its `r`-th request: every third its own key, otherwise one
/// of four keys shared by all threads.
fn key_for(t: usize, r: usize) -> String {
    if r.is_multiple_of(3) {
        format!("own{t}")
    } else {
        format!("shared{}", (r + t) % 4)
    }
}

fn check_many_keys(spec: &str, per_thread: usize, mode: Mode, shards: Option<usize>) {
    // How many requests each key receives, and the sequential answer for that many.
    let mut counts = BTreeMap::<String, usize>::new();
    for t in 0..THREADS {
        for r in 0..per_thread {
            *counts.entry(key_for(t, r)).or_default() += 1;
        }
    }
    let keys: Vec<String> = counts.keys().cloned().collect();

    let clock = ManualClock::new(T0);
    let builder = MemoryStore::builder().clock(clock.clone());
    let store = Arc::new(match shards {
        Some(n) => builder.shards(n).build(),
        None => builder.build(),
    });
    let limiter = Limiter::with_store(parse(spec), store);
    for key in &keys {
        limiter.limit_sync(key, 1).unwrap();
    }
    clock.set_micros(T1);
    let barrier = Barrier::new(THREADS);
    let results: Vec<Vec<(String, Decision)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (limiter, barrier) = (&limiter, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    (0..per_thread)
                        .map(|r| {
                            let key = key_for(t, r);
                            let d = decide(limiter, &key, mode);
                            (key, d)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_key = BTreeMap::<String, Vec<Decision>>::new();
    for (key, d) in results.into_iter().flatten() {
        per_key.entry(key).or_default().push(d);
    }
    for (key, n) in &counts {
        let got = &per_key[key];
        let want = sequential(spec, *n, mode);
        let admitted = |ds: &[Decision]| ds.iter().filter(|d| d.allowed).count();
        assert_eq!(
            admitted(got),
            admitted(&want),
            "{spec} {mode:?} shards {shards:?}: key {key} ({n} requests) admitted {} \
             concurrently, {} sequentially",
            admitted(got),
            admitted(&want)
        );
        assert!(
            sorted(got) == sorted(&want),
            "{spec} {mode:?} shards {shards:?}: key {key} decisions differ from a \
             sequential run (as multisets)"
        );
    }
}

/// Threads on their own keys and on shared ones, through one store (with two shards, so
/// keys share shard locks, and with the default): every key's totals match a sequential
/// run of its own requests.
#[test]
fn many_keys_per_key_totals_match_a_sequential_run() {
    for &(spec, per_thread) in CASES {
        // Each key gets about a quarter of a one-key run's requests.
        let per_thread = per_thread.min(1_200);
        for shards in [Some(2), None] {
            check_many_keys(spec, per_thread, Mode::Limit, shards);
            check_many_keys(spec, per_thread, Mode::Pace, shards);
        }
    }
}

//! In-memory decision cost: paceline's `gcra` beside governor (the in-process anchor) in the
//! same run, and every algorithm's cost per decision.
//!
//! Run: `cargo bench -p paceline --bench in_memory`
//! (`-- --quick` for a faster, noisier pass). BENCHMARKS.md records the results.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::RateLimiter;
use paceline::store::MemoryStore;
use paceline::{Limiter, Policy};

mod common;
use common::{keys, paceline_gcra, quota, KEYS};

fn gcra_vs_governor(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra");

    // One key, one thread.
    let pl = paceline_gcra();
    let key = "user:42".to_string();
    group.bench_function(BenchmarkId::new("paceline", "1 key, 1 thread"), |b| {
        b.iter(|| black_box(pl.limit_sync(black_box(&key), 1)).is_ok())
    });
    let gov = RateLimiter::keyed(quota());
    group.bench_function(BenchmarkId::new("governor keyed", "1 key, 1 thread"), |b| {
        b.iter(|| black_box(gov.check_key(black_box(&key))).is_ok())
    });
    let direct = RateLimiter::direct(quota());
    group.bench_function(
        BenchmarkId::new("governor direct", "1 key, 1 thread"),
        |b| b.iter(|| black_box(direct.check()).is_ok()),
    );

    // 10,000 keys, one thread, round robin.
    let ks = keys();
    let pl = paceline_gcra();
    let mut i = 0;
    group.bench_function(BenchmarkId::new("paceline", "10k keys, 1 thread"), |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(pl.limit_sync(&ks[i], 1)).is_ok()
        })
    });
    let gov = RateLimiter::keyed(quota());
    let mut i = 0;
    group.bench_function(
        BenchmarkId::new("governor keyed", "10k keys, 1 thread"),
        |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(gov.check_key(&ks[i])).is_ok()
            })
        },
    );

    // One key, two threads: an iteration is one decision on each thread, concurrently.
    let pl = paceline_gcra();
    group.bench_function(BenchmarkId::new("paceline", "1 key, 2 threads"), |b| {
        b.iter_custom(|iters| two_threads(iters, || pl.limit_sync("user:42", 1).is_ok()))
    });
    let gov = RateLimiter::keyed(quota());
    let shared = "user:42".to_string();
    group.bench_function(
        BenchmarkId::new("governor keyed", "1 key, 2 threads"),
        |b| b.iter_custom(|iters| two_threads(iters, || gov.check_key(&shared).is_ok())),
    );
    let direct = RateLimiter::direct(quota());
    group.bench_function(
        BenchmarkId::new("governor direct", "1 key, 2 threads"),
        |b| b.iter_custom(|iters| two_threads(iters, || direct.check().is_ok())),
    );
    group.finish();
}

fn two_threads(iters: u64, op: impl Fn() -> bool + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..iters {
                    black_box(op());
                }
            });
        }
    });
    start.elapsed()
}

fn every_algorithm(c: &mut Criterion) {
    let specs = [
        ("pacer", "pacer:rate=1000000/s,max_burst=1000"),
        ("gcra", "gcra:rate=1000000/s,burst=1000"),
        ("fixed_window", "fixed_window:limit=1000000,window=1s"),
        ("exec_evenly", "exec_evenly:points=1000000,duration=1s"),
        ("sliding_log", "sliding_log:limit=1000,window=1ms"),
        ("sliding_window", "sliding_window:limit=1000000,window=1s"),
        ("smooth_bursty", "smooth_bursty:rate=1000000/s"),
        (
            "smooth_warming_up",
            "smooth_warming_up:rate=1000000/s,warmup=1s",
        ),
    ];
    let mut group = c.benchmark_group("limit");
    for (name, spec) in specs {
        let policy: Policy = spec.parse().expect("valid spec");
        let limiter = Limiter::with_store(policy, Arc::new(MemoryStore::new()));
        group.bench_function(name, |b| {
            b.iter(|| black_box(limiter.limit_sync("user:42", 1)).is_ok())
        });
    }
    group.finish();
    let mut group = c.benchmark_group("pace");
    for (name, spec) in [specs[0], specs[1], specs[6]] {
        let policy: Policy = spec.parse().expect("valid spec");
        let limiter = Limiter::with_store(policy, Arc::new(MemoryStore::new()));
        group.bench_function(name, |b| {
            b.iter(|| black_box(limiter.pace_sync("user:42", 1)).is_ok())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = gcra_vs_governor, every_algorithm
}
criterion_main!(benches);

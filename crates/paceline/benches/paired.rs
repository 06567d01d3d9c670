//! paceline's in-memory `gcra` and governor's keyed limiter measured in alternating rounds,
//! so that both see the same machine: on a shared VM, whose speed drifts by 10 % or more
//! over a minute, the ratio of two criterion runs taken a few seconds apart is noisier than
//! the difference being measured. Each round times a few milliseconds of one limiter, then
//! of the other (which goes first alternates); the result is the median over rounds of the
//! per-round ratio, with its quartiles.
//!
//! Run: `cargo bench -p paceline --bench paired` (about 30 seconds;
//! `PACELINE_BENCH_ROUNDS` sets the rounds per case, 300 by default).

use std::hint::black_box;
use std::time::{Duration, Instant};

use governor::RateLimiter;

mod common;
use common::{keys, paceline_gcra, quota};
/// Decisions per limiter per round (per thread in the two-thread case).
const PER_ROUND: u64 = 20_000;

/// Times `PER_ROUND` calls of `op` on each of `threads` threads started together;
/// nanoseconds per call (per pair of concurrent calls with two threads).
fn time(threads: usize, op: &(dyn Fn(u64) -> bool + Sync)) -> f64 {
    let start = Instant::now();
    if threads == 1 {
        for i in 0..PER_ROUND {
            black_box(op(i));
        }
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for i in 0..PER_ROUND {
                        black_box(op(i));
                    }
                });
            }
        });
    }
    start.elapsed().as_nanos() as f64 / PER_ROUND as f64
}

struct Summary {
    paceline: f64,
    governor: f64,
    ratio: [f64; 3],
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn paired(
    rounds: usize,
    threads: usize,
    paceline: &(dyn Fn(u64) -> bool + Sync),
    governor: &(dyn Fn(u64) -> bool + Sync),
) -> Summary {
    // Warm both up (caches, branch predictors, the tables' keys).
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        time(threads, paceline);
        time(threads, governor);
    }
    let (mut p, mut g, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = time(threads, paceline);
            (a, time(threads, governor))
        } else {
            let b = time(threads, governor);
            (time(threads, paceline), b)
        };
        p.push(a);
        g.push(b);
        r.push(b / a);
    }
    r.sort_by(f64::total_cmp);
    Summary {
        paceline: median(&mut p),
        governor: median(&mut g),
        ratio: [r[r.len() / 4], r[r.len() / 2], r[r.len() * 3 / 4]],
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let rounds = std::env::var("PACELINE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 4)
        .unwrap_or(300);
    let keys = keys();

    println!("{rounds} rounds per case; ratio = governor's time / paceline's (above 1: paceline is faster)");
    println!(
        "| case | paceline | governor keyed | ratio (median) | ratio (quartiles) |\n|---|---|---|---|---|"
    );
    let cases: [(&str, usize, bool); 3] = [
        ("1 key, 1 thread", 1, false),
        ("10,000 keys, 1 thread", 1, true),
        ("1 key, 2 threads", 2, false),
    ];
    for (name, threads, many) in cases {
        let pl = paceline_gcra();
        let gov = RateLimiter::keyed(quota());
        // Both look their key up the same way.
        let keys: &[String] = if many { &keys } else { &keys[42..43] };
        let paceline = |i: u64| {
            pl.limit_sync(&keys[i as usize % keys.len()], 1)
                .is_ok_and(|d| d.allowed)
        };
        let governor = |i: u64| gov.check_key(&keys[i as usize % keys.len()]).is_ok();
        let s = paired(rounds, threads, &paceline, &governor);
        println!(
            "| {name} | {:.1} ns | {:.1} ns | {:.2} | {:.2} – {:.2} |",
            s.paceline, s.governor, s.ratio[1], s.ratio[0], s.ratio[2]
        );
    }
}

//! paceline's Redis store beside Limitador's two Redis storages (the `limitador` crate 0.14,
//! the library Limitador's server runs on: `AsyncRedisStorage`, and `CachedRedisStorage`
//! with its defaults, counting locally and writing to Redis in batches every second), on the
//! same private `redis-server`, with the same limits (fixed windows: Limitador has no other
//! kind), in one run:
//!
//! 1. **Decisions per second**: `PACELINE_BENCH_TASKS` (64) tasks, each deciding for a random
//!    key of 10,000 in turn, for `PACELINE_BENCH_SECONDS` (3) per run, `PACELINE_BENCH_ROUNDS`
//!    (3) runs of each contender interleaved; limits of 10⁹ a minute, so every decision
//!    admits and writes its counter. paceline is its Redis store as `paceline serve` opens
//!    it (combining concurrent decisions into one call). The CPU each process spent per
//!    decision is reported beside.
//! 2. **One limit, two processes**: two processes of this program (16 tasks each, asking
//!    without pause) share one key of a limit of 1,000 per 5-second window, for 4 s inside
//!    each of `PACELINE_BENCH_WINDOWS` (3) windows, a fresh key each window; each process
//!    counts what it was admitted. A shared limit admits exactly 1,000 per window; what the
//!    two admitted beyond is the over-admission.
//!
//! Run: `scripts/bench-limitador`, or `cargo bench --manifest-path benches/rls/Cargo.toml
//! --bench limitador`. Without `--bench` (as `cargo test` runs it) a short pass.

#[path = "../../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{median, setting, CpuMark, Latencies};
use limitador::limit::{Context, Expression, Limit, Namespace, Predicate};
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
use limitador::storage::AsyncCounterStorage;
use limitador::AsyncRateLimiter;
use paceline_store::redis::RedisStore;
use paceline_store::{FailurePolicy, Limiter, Policy};
use paceline_testkit::RedisServer;

const KEYS: u64 = 10_000;
/// The shared limit of part 2: this many per window.
const SHARED_LIMIT: u64 = 1_000;
/// Part 2's window, in seconds.
const SHARED_WINDOW: u64 = 5;
/// The environment variable that makes this program one of part 2's two processes.
const CHILD: &str = "PACELINE_LIMITADOR_CHILD";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    Paceline,
    LimitadorAsync,
    LimitadorCached,
}

impl Contender {
    const ALL: [Contender; 3] = [
        Contender::Paceline,
        Contender::LimitadorAsync,
        Contender::LimitadorCached,
    ];

    fn name(self) -> &'static str {
        match self {
            Contender::Paceline => "paceline RedisStore (fixed_window, auto-batch)",
            Contender::LimitadorAsync => "limitador 0.14 AsyncRedisStorage",
            Contender::LimitadorCached => "limitador 0.14 CachedRedisStorage (defaults)",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Contender::Paceline => "paceline",
            Contender::LimitadorAsync => "async",
            Contender::LimitadorCached => "cached",
        }
    }

    fn from_arg(s: &str) -> Option<Contender> {
        Contender::ALL.into_iter().find(|c| c.arg() == s)
    }
}

/// A limit of `max` per `seconds` for each value of `user`, as one contender decides it.
#[derive(Clone)]
enum Decider {
    Paceline(Limiter<RedisStore>),
    Limitador(Arc<AsyncRateLimiter>),
}

impl Decider {
    async fn open(
        contender: Contender,
        url: &str,
        prefix: &str,
        max: u64,
        seconds: u64,
    ) -> Result<Decider, String> {
        let limitador = |storage: Box<dyn AsyncCounterStorage>| {
            let limiter = AsyncRateLimiter::new_with_storage(storage);
            let user = Expression::try_from("user").map_err(|e| format!("{e:?}"))?;
            limiter.add_limit(Limit::new(
                prefix,
                max,
                seconds,
                Vec::<Predicate>::new(),
                [user],
            ));
            Ok::<_, String>(Decider::Limitador(Arc::new(limiter)))
        };
        match contender {
            Contender::Paceline => {
                let store = RedisStore::builder(url, FailurePolicy::FailClosed)
                    .prefix(prefix)
                    .auto_batch(Duration::ZERO)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let policy: Policy = format!("fixed_window:limit={max},window={seconds}s")
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                Ok(Decider::Paceline(Limiter::with_store(
                    policy,
                    Arc::new(store),
                )))
            }
            Contender::LimitadorAsync => limitador(Box::new(
                AsyncRedisStorage::new(url)
                    .await
                    .map_err(|e| e.to_string())?,
            )),
            Contender::LimitadorCached => limitador(Box::new(
                CachedRedisStorageBuilder::new(url)
                    .build()
                    .await
                    .map_err(|e| e.to_string())?,
            )),
        }
    }

    /// One decision for `user` under `namespace` (Limitador's; paceline's prefix stands
    /// for it): admitted or not. Each decision is a fresh poll of its task, as each request
    /// is in a server (see [`Decider::decide_now`]).
    async fn decide(&self, namespace: &Namespace, user: &str) -> Result<bool, String> {
        // limitador 0.14.0's cached storage holds a lock of its batcher across an await
        // (`Batcher::add`, a semaphore's `acquire`), which tokio's cooperative budget
        // turns into a wait once a task has made enough calls without yielding; the
        // storage's other callers and its flusher then block both of the runtime's threads
        // on that lock for good (seen with gdb). A server's task per request never gets
        // there; a benchmark's loop does, unless it yields between calls.
        tokio::task::yield_now().await;
        self.decide_now(namespace, user).await
    }

    async fn decide_now(&self, namespace: &Namespace, user: &str) -> Result<bool, String> {
        match self {
            Decider::Paceline(limiter) => limiter
                .limit(user, 1)
                .await
                .map(|d| d.allowed)
                .map_err(|e| e.to_string()),
            Decider::Limitador(limiter) => {
                let values = HashMap::from([("user".to_string(), user.to_string())]);
                let ctx: Context = values.into();
                limiter
                    .check_rate_limited_and_update(namespace, &ctx, 1)
                    .await
                    .map(|r| !r.limited)
                    .map_err(|e| format!("{e:?}"))
            }
        }
    }
}

/// A run of part 1.
struct Run {
    per_second: f64,
    latencies: Latencies,
    /// µs of CPU per decision: redis-server, this program.
    cpu_us: Vec<f64>,
    refused: u64,
}

/// `tasks` tasks deciding for random keys through `decider` for `duration`.
async fn throughput(
    decider: &Decider,
    namespace: &Namespace,
    tasks: usize,
    duration: Duration,
    pids: &[u32],
) -> Result<Run, String> {
    let mark = CpuMark::now(pids);
    let start = Instant::now();
    let deadline = start + duration;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (decider, namespace) = (decider.clone(), namespace.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut refused = 0u64;
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1);
                while Instant::now() < deadline {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let user = format!("user:{}", seed % KEYS);
                    let t0 = Instant::now();
                    if !decider.decide(&namespace, &user).await? {
                        refused += 1;
                    }
                    latencies.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                Ok::<_, String>((latencies, refused))
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut refused = 0;
    for h in handles {
        let (l, r) = h.await.map_err(|e| e.to_string())??;
        latencies.extend(l);
        refused += r;
    }
    let seconds = start.elapsed().as_secs_f64();
    let n = latencies.len() as f64;
    Ok(Run {
        per_second: n / seconds,
        cpu_us: mark.per(pids, n),
        latencies: Latencies::new(latencies),
        refused,
    })
}

/// Part 2, in one of the two processes: `tasks` tasks asking for `key` without pause
/// inside each window (from 0.5 s after its start to 0.5 s before its end), a fresh key
/// each window. Prints what it was admitted in each window, one number a line.
async fn child(contender: Contender, url: &str, first_window: u64, windows: u64, stem: &str) {
    let namespace: Namespace = stem.into();
    let decider = Decider::open(contender, url, stem, SHARED_LIMIT, SHARED_WINDOW)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", contender.name()));
    let tasks: usize = setting("PACELINE_BENCH_SHARED_TASKS", 16);
    for w in 0..windows {
        let window_start = Duration::from_secs(first_window + w * SHARED_WINDOW);
        let begin = window_start + Duration::from_millis(500);
        let end = window_start + Duration::from_secs(SHARED_WINDOW) - Duration::from_millis(500);
        tokio::time::sleep(until(begin)).await;
        let key = format!("shared:{w}");
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (decider, namespace, key) = (decider.clone(), namespace.clone(), key.clone());
                tokio::spawn(async move {
                    let mut admitted = 0u64;
                    while since_epoch() < end {
                        match decider.decide(&namespace, &key).await {
                            Ok(true) => admitted += 1,
                            Ok(false) => {}
                            Err(e) => panic!("a decision failed: {e}"),
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for h in handles {
            admitted += h.await.unwrap_or_else(|e| panic!("a task failed: {e}"));
        }
        println!("{admitted}");
    }
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// How long until `at` (since the epoch); zero if past.
fn until(at: Duration) -> Duration {
    at.saturating_sub(since_epoch())
}

/// Part 2 for `contender`: two processes of this program sharing one key per window.
/// Returns what the two were admitted in each window.
fn shared(contender: Contender, url: &str, windows: u64, run: &str) -> Result<Vec<u64>, String> {
    // The first whole window starting at least 1.5 s from now (windows are aligned to
    // multiples of their length, as paceline's fixed windows are).
    let now = since_epoch().as_secs_f64() + 1.5;
    let first = (now / SHARED_WINDOW as f64).ceil() as u64 * SHARED_WINDOW;
    let stem = format!("{run}-{}", contender.arg());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .env(
                    CHILD,
                    format!("{},{url},{first},{windows},{stem}", contender.arg()),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut totals = vec![0u64; windows as usize];
    for c in children {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a process of {} failed", contender.name()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let counts: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if counts.len() != totals.len() {
            return Err(format!("expected {windows} counts, read {text:?}"));
        }
        for (t, c) in totals.iter_mut().zip(counts) {
            *t += c;
        }
    }
    Ok(totals)
}

fn main() {
    let runtime = |threads: usize| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    if let Ok(args) = std::env::var(CHILD) {
        let parts: Vec<&str> = args.split(',').collect();
        let [contender, url, first, windows, stem] = parts[..] else {
            panic!("{CHILD}: expected CONTENDER,URL,FIRST,WINDOWS,STEM, not {args:?}");
        };
        let contender = Contender::from_arg(contender).expect("a contender");
        let first: u64 = first.parse().expect("a window's start");
        let windows: u64 = windows.parse().expect("a number of windows");
        runtime(1).block_on(child(contender, url, first, windows, stem));
        return;
    }

    let full = std::env::args().any(|a| a == "--bench");
    let (seconds, rounds, windows) = if full {
        (
            setting("PACELINE_BENCH_SECONDS", 3.0),
            setting("PACELINE_BENCH_ROUNDS", 3usize),
            setting("PACELINE_BENCH_WINDOWS", 3u64),
        )
    } else {
        (0.2, 1, 1)
    };
    let tasks: usize = setting("PACELINE_BENCH_TASKS", 64);
    let server = RedisServer::start().expect("a private redis-server");
    let url = server.url();
    let pids = vec![server.pid().unwrap_or(u32::MAX), std::process::id()];
    let rt = runtime(setting("PACELINE_BENCH_THREADS", 2));
    let run = format!("run{}", std::process::id());

    // 1. Decisions per second, the contenders interleaved run by run.
    let deciders: Vec<(Contender, Decider, Namespace)> = Contender::ALL
        .iter()
        .map(|&c| {
            let ns = format!("{run}-{}", c.arg());
            eprintln!("opening {}", c.name());
            let decider = rt
                .block_on(Decider::open(c, &url, &ns, 1_000_000_000, 60))
                .unwrap_or_else(|e| panic!("{}: {e}", c.name()));
            (c, decider, Namespace::from(ns.as_str()))
        })
        .collect();
    let mut runs: Vec<Vec<Run>> = deciders.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..deciders.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (c, decider, ns) = &deciders[i];
            eprintln!("run {}: {}", round + 1, c.name());
            let r = rt
                .block_on(throughput(
                    decider,
                    ns,
                    tasks,
                    Duration::from_secs_f64(seconds),
                    &pids,
                ))
                .unwrap_or_else(|e| panic!("{}: {e}", c.name()));
            runs[i].push(r);
        }
    }
    println!("Decisions per second: {tasks} tasks, 10,000 keys, a fixed window of 10⁹ a minute, {seconds} s per run, {rounds} runs each (interleaved); medians");
    println!();
    println!("| contender | decisions/s | p50 | p99 | redis-server CPU µs/decision | this process's CPU µs/decision | refused | runs (decisions/s) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut rates = Vec::new();
    for ((c, _, _), runs) in deciders.iter().zip(&runs) {
        let pick = |f: &dyn Fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let rate = pick(&|r| r.per_second);
        rates.push(rate);
        println!(
            "| {} | {:.0} | {:.0} µs | {:.0} µs | {:.1} | {:.1} | {} | {} |",
            c.name(),
            rate,
            pick(&|r| r.latencies.at(0.5)),
            pick(&|r| r.latencies.at(0.99)),
            pick(&|r| r.cpu_us[0]),
            pick(&|r| r.cpu_us[1]),
            runs.iter().map(|r| r.refused).sum::<u64>(),
            runs.iter()
                .map(|r| format!("{:.0}", r.per_second))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    let async_pos = Contender::ALL
        .iter()
        .position(|&c| c == Contender::LimitadorAsync)
        .expect("listed");
    let cached_pos = Contender::ALL
        .iter()
        .position(|&c| c == Contender::LimitadorCached)
        .expect("listed");
    println!();
    println!(
        "paceline / limitador AsyncRedisStorage: **{:.2}×** (goal ≥ 2×); paceline / CachedRedisStorage: {:.2}×; per run: {}",
        rates[0] / rates[async_pos],
        rates[0] / rates[cached_pos],
        (0..rounds)
            .map(|r| format!("{:.2}×", runs[0][r].per_second / runs[async_pos][r].per_second))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // 2. One limit shared by two processes.
    println!();
    println!("One limit of {SHARED_LIMIT} per {SHARED_WINDOW} s window shared by two processes (16 tasks each, 4 s of each window, a fresh key per window)");
    println!();
    println!("| contender | admitted per window (both processes) | over the limit, per window | over the limit, all windows |");
    println!("|---|---|---|---|");
    let mut paceline_exact = true;
    for c in Contender::ALL {
        match shared(c, &url, windows, &run) {
            Ok(totals) => {
                let over: Vec<i64> = totals
                    .iter()
                    .map(|&t| t as i64 - SHARED_LIMIT as i64)
                    .collect();
                let all: i64 = over.iter().sum();
                println!(
                    "| {} | {} | {} | {} ({:.1} %) |",
                    c.name(),
                    totals
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    over.iter()
                        .map(|o| format!("{o:+}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    all,
                    100.0 * all as f64 / (SHARED_LIMIT * windows) as f64
                );
                if c == Contender::Paceline && totals.iter().any(|&t| t != SHARED_LIMIT) {
                    paceline_exact = false;
                }
            }
            Err(e) => {
                eprintln!("{}: {e}", c.name());
                paceline_exact &= c != Contender::Paceline;
            }
        }
    }
    assert!(
        paceline_exact,
        "paceline admits exactly {SHARED_LIMIT} per window"
    );
    assert!(
        rates.iter().all(|&r| r > 0.0),
        "every contender made decisions"
    );
}

//! paceline's job queue on one private Redis beside BullMQ (npm `bullmq`, a Node worker) on
//! the same server, in the same run, with the same payloads:
//!
//! 1. enqueue: one job per call from 64 producers, and batches of 100 from 8;
//! 2. end to end: preloaded jobs drained by a worker with 64 at a time and a no-op
//!    handler (jobs/s from the first lease to the last ack);
//! 3. group limits (paceline only: BullMQ's open-source edition has no per-group limits):
//!    100 groups at 10 starts/s each for `PACELINE_BENCH_GROUP_SECONDS` (default 20): the
//!    aggregate rate over the whole seconds inside the run, the aligned one-second windows
//!    in which a group started more than 10 jobs, and the start lag (a job's start minus
//!    the time its group became eligible, both on the server's clock, for groups that
//!    became eligible while the worker ran). `PACELINE_BENCH_ONLY=groups` runs this cell
//!    alone.
//!
//! Run: `scripts/bench-queue` (installs bullmq with npm into a temporary folder first), or
//! `cargo bench -p paceline-queue --features redis --bench queue` (without BullMQ unless
//! `PACELINE_BULLMQ_NODE_PATH` names a `node_modules` holding it). `PACELINE_BENCH_SECONDS`
//! sets each timed cell's length (default 3), `PACELINE_BENCH_JOBS` the end-to-end cell's
//! jobs (default 20,000), `PACELINE_BENCH_GROUPS` the groups the first three cells spread
//! their jobs over (default 100). The client runs on a tokio runtime of one worker thread, as
//! BullMQ's Node process runs one. Under `cargo test` it runs a short smoke pass instead.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paceline_queue::{NewJob, Queue, QueueConfig, RedisQueue, Worker};
use paceline_store::redis::RedisStore;
use paceline_store::FailurePolicy;
use paceline_testkit::RedisServer;

const PAYLOAD_BYTES: usize = 100;

fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &f64| n > 0.0)
        .unwrap_or(default)
}

fn payload() -> Vec<u8> {
    format!("{{\"data\":\"{}\"}}", "x".repeat(PAYLOAD_BYTES)).into_bytes()
}

async fn open(url: &str, name: &str, spec: &str) -> Queue {
    let store = RedisStore::builder(url, FailurePolicy::FailClosed)
        .response_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("the private Redis");
    let config = QueueConfig::new(spec.parse().expect("a policy"))
        .max_jobs(10_000_000)
        .lease(Duration::from_secs(60));
    Queue::new(
        RedisQueue::open(store, name, config, None)
            .await
            .expect("the queue opens"),
    )
}

/// A policy no group reaches in these cells.
const UNLIMITED: &str = "gcra:rate=1000000/s,burst=1000000";

/// Jobs per second over `tasks` tasks each running `body` (which answers how many jobs it
/// handled) until `length` has passed.
async fn timed<F, Fut>(tasks: usize, length: Duration, body: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    let body = Arc::new(body);
    let start = Instant::now();
    let until = start + length;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let body = Arc::clone(&body);
        set.spawn(async move {
            let mut done = 0;
            let mut n = 0u64;
            while Instant::now() < until {
                done += body(task as u64 * 1_000_000_000 + n).await;
                n += 1;
            }
            done
        });
    }
    let mut total = 0;
    while let Some(done) = set.join_next().await {
        total += done.expect("a producer");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// The groups the first three cells spread their jobs over: `PACELINE_BENCH_GROUPS`,
/// default 100.
fn cell_groups() -> u64 {
    (env_number("PACELINE_BENCH_GROUPS", 100.0) as u64).max(1)
}

async fn enqueue_one(url: &str, length: Duration) -> f64 {
    let groups = cell_groups();
    let q = open(url, "enqueue-one", UNLIMITED).await;
    let payload = payload();
    timed(64, length, move |n| {
        let (q, payload) = (q.clone(), payload.clone());
        async move {
            q.enqueue(NewJob::new(format!("g{}", n % groups), payload))
                .await
                .expect("enqueued");
            1
        }
    })
    .await
}

async fn enqueue_batch(url: &str, length: Duration) -> f64 {
    let groups = cell_groups();
    let q = open(url, "enqueue-batch", UNLIMITED).await;
    let payload = payload();
    timed(8, length, move |n| {
        let (q, payload) = (q.clone(), payload.clone());
        async move {
            let jobs = (0..100)
                .map(|i| NewJob::new(format!("g{}", (n + i) % groups), payload.clone()))
                .collect();
            for e in q.enqueue_batch(jobs).await {
                e.expect("enqueued");
            }
            100
        }
    })
    .await
}

async fn preload(q: &Queue, groups: u64, jobs: u64) {
    let payload = payload();
    let mut n = 0;
    while n < jobs {
        let batch = (n..(n + 1_000).min(jobs))
            .map(|i| NewJob::new(format!("g{}", i % groups), payload.clone()))
            .collect();
        for e in q.enqueue_batch(batch).await {
            e.expect("enqueued");
        }
        n += 1_000;
    }
}

async fn end_to_end(url: &str, jobs: u64) -> f64 {
    let q = open(url, "end-to-end", UNLIMITED).await;
    preload(&q, cell_groups(), jobs).await;
    let handled = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let start = Instant::now();
    let running = tokio::spawn(Worker::new(q.clone()).concurrency(64).run(
        {
            let handled = Arc::clone(&handled);
            move |_| {
                handled.fetch_add(1, Ordering::Relaxed);
                async { Ok(()) }
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    loop {
        let counts = q.counts().await.expect("counts");
        if counts.totals.acked >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = jobs as f64 / start.elapsed().as_secs_f64();
    stop.send(()).ok();
    running
        .await
        .expect("the worker")
        .expect("the worker's report");
    rate
}

/// Each group's policy in the group-limit cell: `PACELINE_BENCH_GROUP_POLICY`, by default
/// `sliding_log:limit=10,window=1s,min_interval=90ms`: at most 10 starts in any second
/// (aligned or not), spread at least 90 ms apart. A start a little late delays only the
/// slot it used, one second later, so lateness costs a group about lag/1 s of its rate;
/// under `gcra:rate=10/s,burst=1` each start's lateness pushes every later start back
/// (lag/100 ms of the rate), and `fixed_window` makes every group eligible at the same
/// instant each second (a thousand starts at once).
fn group_policy() -> String {
    std::env::var("PACELINE_BENCH_GROUP_POLICY")
        .unwrap_or_else(|_| "sliding_log:limit=10,window=1s,min_interval=90ms".to_string())
}

/// The group-limit cell's results.
struct Groups {
    per_second: f64,
    windows: usize,
    over: usize,
    lag_p50_us: u64,
    lag_p99_us: u64,
    lag_max_us: u64,
}

async fn groups(url: &str, length: Duration) -> Groups {
    const GROUPS: u64 = 100;
    const RATE: u64 = 10;
    let q = open(url, "groups", &group_policy()).await;
    preload(&q, GROUPS, GROUPS * RATE * (length.as_secs() + 3)).await;
    // (group, started, eligible) of every start.
    let starts: Arc<Mutex<Vec<(String, u64, u64)>>> = Arc::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let t0 = q.now_micros();
    let running = tokio::spawn(Worker::new(q.clone()).concurrency(64).run(
        {
            let starts = Arc::clone(&starts);
            move |job| {
                if let Ok(mut s) = starts.lock() {
                    s.push((job.group, job.started, job.eligible));
                }
                async { Ok(()) }
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    tokio::time::sleep(length).await;
    let t1 = q.now_micros();
    stop.send(()).ok();
    running
        .await
        .expect("the worker")
        .expect("the worker's report");
    let starts = starts.lock().map(|s| s.clone()).unwrap_or_default();
    let second = 1_000_000;
    // Whole aligned seconds inside the run.
    let (first_window, end_window) = (t0 / second + 1, t1 / second);
    let mut per_window = std::collections::HashMap::new();
    let mut inside = 0u64;
    for (group, started, _) in &starts {
        let w = started / second;
        *per_window.entry((group.clone(), w)).or_insert(0u64) += 1;
        if w >= first_window && w < end_window {
            inside += 1;
        }
    }
    let windows = end_window.saturating_sub(first_window).max(1);
    // The lag of jobs whose group became eligible while the worker ran (the backlog that
    // was eligible before it came is not a worker's lag).
    let mut lags: Vec<u64> = starts
        .iter()
        .filter(|(_, _, e)| *e >= t0)
        .map(|(_, s, e)| s.saturating_sub(*e))
        .collect();
    lags.sort_unstable();
    let at = |q: f64| {
        lags.get(((lags.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    Groups {
        per_second: inside as f64 / windows as f64,
        windows: per_window.len(),
        over: per_window.values().filter(|&&n| n > RATE).count(),
        lag_p50_us: at(0.5),
        lag_p99_us: at(0.99),
        lag_max_us: lags.last().copied().unwrap_or(0),
    }
}

/// BullMQ's cells, by name: jobs per second.
fn bullmq(server: &RedisServer, seconds: f64, jobs: u64) -> Result<Vec<(String, f64)>, String> {
    let node_path = std::env::var("PACELINE_BULLMQ_NODE_PATH").map_err(|_| {
        "PACELINE_BULLMQ_NODE_PATH is not set (scripts/bench-queue sets it)".to_string()
    })?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/bullmq.js");
    let out = Command::new("node")
        .arg(script)
        .env("NODE_PATH", node_path)
        .env("PORT", server.port().to_string())
        .env("SECONDS", seconds.to_string())
        .env("JOBS", jobs.to_string())
        .env("PAYLOAD", PAYLOAD_BYTES.to_string())
        .output()
        .map_err(|e| format!("node: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut cells = Vec::new();
    for line in text.lines() {
        let field = |name: &str| -> Option<&str> {
            line.split(&format!("\"{name}\":"))
                .nth(1)?
                .split([',', '}'])
                .next()
                .map(|s| s.trim().trim_matches('"'))
        };
        let (Some(cell), Some(done), Some(secs)) = (field("cell"), field("jobs"), field("seconds"))
        else {
            continue;
        };
        let (Ok(done), Ok(secs)) = (done.parse::<f64>(), secs.parse::<f64>()) else {
            continue;
        };
        cells.push((cell.to_string(), done / secs));
    }
    Ok(cells)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let seconds = if full {
        env_number("PACELINE_BENCH_SECONDS", 3.0)
    } else {
        0.1
    };
    let jobs = if full {
        env_number("PACELINE_BENCH_JOBS", 20_000.0) as u64
    } else {
        200
    };
    let group_seconds = if full {
        env_number("PACELINE_BENCH_GROUP_SECONDS", 20.0) as u64
    } else {
        1
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = RedisServer::start().expect("a private redis-server");
    let url = server.url();
    let length = Duration::from_secs_f64(seconds);
    // `PACELINE_BENCH_ONLY=groups` runs only the group-limit cell.
    let only_groups = std::env::var("PACELINE_BENCH_ONLY").is_ok_and(|o| o == "groups");
    let ours = if only_groups {
        Vec::new()
    } else {
        vec![
            ("enqueue one", runtime.block_on(enqueue_one(&url, length))),
            (
                "enqueue batch",
                runtime.block_on(enqueue_batch(&url, length)),
            ),
            ("end to end", runtime.block_on(end_to_end(&url, jobs))),
        ]
    };
    let theirs = if full && !only_groups {
        server.command(&["FLUSHALL"]).expect("FLUSHALL");
        bullmq(&server, seconds, jobs).unwrap_or_else(|e| {
            eprintln!("skipping BullMQ: {e}");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    println!("| cell | paceline jobs/s | BullMQ jobs/s | paceline / BullMQ |");
    println!("|---|---|---|---|");
    let labels = [
        ("enqueue one", "enqueue, one job per call, 64 producers"),
        ("enqueue batch", "enqueue, batches of 100, 8 producers"),
        ("end to end", "end to end, no-op handler, 64 at a time"),
    ];
    for ((cell, rate), (_, label)) in ours.iter().zip(labels) {
        assert!(*rate > 0.0, "{cell}: nothing done");
        match theirs.iter().find(|(c, _)| c == cell) {
            Some((_, them)) => println!(
                "| {label} | {rate:.0} | {them:.0} | **{:.2}×** |",
                rate / them
            ),
            None => println!("| {label} | {rate:.0} | – | – |"),
        }
    }
    server.command(&["FLUSHALL"]).expect("FLUSHALL");
    let g = runtime.block_on(groups(&url, Duration::from_secs(group_seconds)));
    println!();
    println!(
        "100 groups at 10/s (`{}`) for {group_seconds} s: {:.1} starts/s over the whole seconds inside the run (goal 1,000 ± 1 %); {} of {} group-windows over the limit; start lag p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        group_policy(),
        g.per_second,
        g.over,
        g.windows,
        g.lag_p50_us as f64 / 1000.0,
        g.lag_p99_us as f64 / 1000.0,
        g.lag_max_us as f64 / 1000.0,
    );
    assert_eq!(g.over, 0, "a group started more than its limit in a window");
}

//! paceline's job queue on one private Redis beside BullMQ (npm `bullmq`, a Node worker) on
//! the same server, in the same run, with the same payloads:
//!
//! 1. enqueue: one job per call from 64 producers, and batches of 100 from 8;
//! 2. end to end: preloaded jobs drained by a worker with 64 at a time and a no-op
//!    handler (jobs/s from the first lease to the last ack), over the cells' groups and,
//!    for paceline, again over 10,000 groups (two jobs each: many guilds, few jobs each),
//!    and with priorities, a deduplication key per job and a queue-wide limit in use;
//! 3. group limits (paceline only: BullMQ's open-source edition has no per-group limits):
//!    100 groups at 10 starts/s each for `PACELINE_BENCH_GROUP_SECONDS` (default 20): the
//!    aggregate rate over the whole seconds inside the run, the aligned one-second windows
//!    in which a group started more than 10 jobs, and the start lag (a job's start minus
//!    the time its group became eligible, both on the server's clock, for groups that
//!    became eligible while the worker ran). `PACELINE_BENCH_ONLY=groups` runs this cell
//!    alone;
//! 4. one queue on a 3-primary Redis Cluster, end to end, with `partitions = 1` and with
//!    `partitions = 3` (paceline only: a BullMQ queue is one slot), with each node's share
//!    of the servers' CPU time.
//!
//! Every paceline cell starts on an empty server, as BullMQ's cells start on an empty
//! queue. Beside each cell's jobs/s, the `redis-server` CPU time per job over the cell (its
//! threads' time on the CPU, from `/proc/PID/task/*/schedstat`, read before and after the
//! cell by the side that runs it): enqueue for the enqueue cells, lease and ack for the end
//! to end ones, and their sum per job (single enqueue plus end to end).
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

use paceline_queue::{NewJob, Queue, QueueConfig, Worker};
use paceline_store::redis::RedisStore;
use paceline_store::FailurePolicy;
use paceline_testkit::{RedisCluster, RedisServer};

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
    open_partitioned(url, name, spec, 1).await
}

/// The queue `name` in `partitions` partitions (a Redis Cluster's URL spreads them).
async fn open_partitioned(url: &str, name: &str, spec: &str, partitions: u32) -> Queue {
    open_with(url, name, spec, partitions, |c| c).await
}

/// The queue `name` as `open_partitioned` opens it, its configuration changed by `more`.
async fn open_with(
    url: &str,
    name: &str,
    spec: &str,
    partitions: u32,
    more: impl FnOnce(QueueConfig) -> QueueConfig,
) -> Queue {
    let store = RedisStore::builder(url, FailurePolicy::FailClosed)
        .response_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("the private Redis");
    let config = more(
        QueueConfig::new(spec.parse().expect("a policy"))
            .max_jobs(10_000_000)
            .lease(Duration::from_secs(60))
            .partitions(partitions),
    );
    let shared: paceline_store::SharedStore = std::sync::Arc::new(store);
    Queue::with_store(&shared, name, config)
        .await
        .expect("the queue opens")
}

/// A policy no group reaches in these cells.
const UNLIMITED: &str = "gcra:rate=1000000/s,burst=1000000";

/// The `redis-server` processes' CPU time so far, in ns: the sum over their threads of
/// their time on the CPU (`/proc/PID/task/*/schedstat`, first field); `None` off Linux or
/// without every process's id.
fn redis_cpu_ns(pids: &[Option<u32>]) -> Option<u64> {
    let mut total = 0;
    for pid in pids {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", (*pid)?)).ok()?;
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            total += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

/// One cell's result: jobs done, over how long, and the server's CPU time meanwhile.
#[derive(Clone, Copy)]
struct Cell {
    jobs: f64,
    seconds: f64,
    cpu_ns: Option<u64>,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.jobs / self.seconds
    }

    /// `redis-server` CPU µs per job.
    fn cpu_per_job(&self) -> Option<f64> {
        self.cpu_ns.map(|ns| ns as f64 / 1000.0 / self.jobs)
    }
}

/// Measures the server's CPU time around `run`, which answers jobs done and seconds taken.
async fn measured<Fut>(pids: &[Option<u32>], run: Fut) -> Cell
where
    Fut: std::future::Future<Output = (f64, f64)>,
{
    let before = redis_cpu_ns(pids);
    let (jobs, seconds) = run.await;
    let after = redis_cpu_ns(pids);
    Cell {
        jobs,
        seconds,
        cpu_ns: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
    }
}

/// Jobs done and seconds taken by `tasks` tasks each running `body` (which answers how
/// many jobs it handled) until `length` has passed.
async fn timed<F, Fut>(tasks: usize, length: Duration, body: F) -> (f64, f64)
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
    (total as f64, start.elapsed().as_secs_f64())
}

/// The groups the first three cells spread their jobs over: `PACELINE_BENCH_GROUPS`,
/// default 100.
fn cell_groups() -> u64 {
    (env_number("PACELINE_BENCH_GROUPS", 100.0) as u64).max(1)
}

async fn enqueue_one(url: &str, pid: Option<u32>, length: Duration) -> Cell {
    let groups = cell_groups();
    let q = open(url, "enqueue-one", UNLIMITED).await;
    let payload = payload();
    measured(
        &[pid],
        timed(64, length, move |n| {
            let (q, payload) = (q.clone(), payload.clone());
            async move {
                q.enqueue(NewJob::new(format!("g{}", n % groups), payload))
                    .await
                    .expect("enqueued");
                1
            }
        }),
    )
    .await
}

async fn enqueue_batch(url: &str, pid: Option<u32>, length: Duration) -> Cell {
    let groups = cell_groups();
    let q = open(url, "enqueue-batch", UNLIMITED).await;
    let payload = payload();
    measured(
        &[pid],
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
        }),
    )
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

/// Preloads `jobs` jobs over `groups` groups, then drains them with a worker of 64 at a
/// time; measured from the worker's start to the last ack.
async fn end_to_end(url: &str, pid: Option<u32>, groups: u64, jobs: u64) -> Cell {
    let q = open(url, &format!("end-to-end-{groups}"), UNLIMITED).await;
    preload(&q, groups, jobs).await;
    measured(&[pid], drain(q, jobs)).await
}

/// [`end_to_end`] on a Redis Cluster (`url`, its nodes' processes `pids`) with the queue in
/// `partitions` partitions.
async fn end_to_end_cluster(
    url: &str,
    pids: &[Option<u32>],
    partitions: u32,
    groups: u64,
    jobs: u64,
) -> (Cell, Vec<u64>) {
    let name = format!("end-to-end-p{partitions}");
    let q = open_partitioned(url, &name, UNLIMITED, partitions).await;
    preload(&q, groups, jobs).await;
    let each = |pids: &[Option<u32>]| -> Vec<u64> {
        pids.iter()
            .map(|pid| redis_cpu_ns(&[*pid]).unwrap_or(0))
            .collect()
    };
    let before = each(pids);
    let cell = measured(pids, drain(q, jobs)).await;
    let after = each(pids);
    let spent = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    (cell, spent)
}

/// [`end_to_end`] with the queue's features in use: each job with a priority (0 to 9 in
/// turn) and a deduplication key of its own, under a queue-wide limit no group reaches.
async fn end_to_end_featured(url: &str, pid: Option<u32>, groups: u64, jobs: u64) -> Cell {
    let wide = |c: QueueConfig| c.queue_policy(UNLIMITED.parse().expect("a policy"));
    let q = open_with(url, "end-to-end-featured", UNLIMITED, 1, wide).await;
    let payload = payload();
    let mut n = 0;
    while n < jobs {
        let batch = (n..(n + 1_000).min(jobs))
            .map(|i| {
                NewJob::new(format!("g{}", i % groups), payload.clone())
                    .priority((i % 10) as u8)
                    .dedup(format!("d{i}"), Duration::from_secs(3_600))
            })
            .collect();
        for e in q.enqueue_batch(batch).await {
            e.expect("enqueued");
        }
        n += 1_000;
    }
    measured(&[pid], drain(q, jobs)).await
}

async fn drain(q: Queue, jobs: u64) -> (f64, f64) {
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
    let seconds = start.elapsed().as_secs_f64();
    stop.send(()).ok();
    running
        .await
        .expect("the worker")
        .expect("the worker's report");
    (jobs as f64, seconds)
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

/// BullMQ's cells, by name.
fn bullmq(server: &RedisServer, seconds: f64, jobs: u64) -> Result<Vec<(String, Cell)>, String> {
    let node_path = std::env::var("PACELINE_BULLMQ_NODE_PATH").map_err(|_| {
        "PACELINE_BULLMQ_NODE_PATH is not set (scripts/bench-queue sets it)".to_string()
    })?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/bullmq.js");
    let out = Command::new("node")
        .arg(script)
        .env("NODE_PATH", node_path)
        .env("PORT", server.port().to_string())
        .env(
            "REDIS_PID",
            server.pid().map(|p| p.to_string()).unwrap_or_default(),
        )
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
        let (Ok(jobs), Ok(seconds)) = (done.parse::<f64>(), secs.parse::<f64>()) else {
            continue;
        };
        let cpu_ns = field("redis_cpu_ns").and_then(|n| n.parse::<u64>().ok());
        cells.push((
            cell.to_string(),
            Cell {
                jobs,
                seconds,
                cpu_ns,
            },
        ));
    }
    Ok(cells)
}

/// One queue on a 3-primary Redis Cluster, end to end, in one partition and in three.
fn cluster_cells(runtime: &tokio::runtime::Runtime, jobs: u64) {
    let cluster = match RedisCluster::start_with(3) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("skipping the cluster cells: {e}");
            return;
        }
    };
    let url = cluster.url();
    let pids: Vec<Option<u32>> = cluster.nodes().iter().map(RedisServer::pid).collect();
    let groups = cell_groups();
    let (one, one_nodes) = runtime.block_on(end_to_end_cluster(&url, &pids, 1, groups, jobs));
    let (three, three_nodes) = runtime.block_on(end_to_end_cluster(&url, &pids, 3, groups, jobs));
    println!();
    println!(
        "| one queue on a 3-primary Redis Cluster, end to end | jobs/s | redis-server µs/job (all nodes) | each node's share of that time | the busiest node's µs/job |"
    );
    println!("|---|---:|---:|---|---:|");
    for (label, cell, nodes) in [
        ("partitions = 1", one, one_nodes),
        ("partitions = 3", three, three_nodes),
    ] {
        let total: u64 = nodes.iter().sum::<u64>().max(1);
        let shares: Vec<String> = nodes
            .iter()
            .map(|n| format!("{:.0} %", *n as f64 * 100.0 / total as f64))
            .collect();
        let busiest = nodes.iter().max().copied().unwrap_or(0);
        println!(
            "| {label} | {:.0} | {} | {} | {:.1} |",
            cell.rate(),
            shown(cell.cpu_per_job()),
            shares.join(" / "),
            busiest as f64 / 1000.0 / cell.jobs,
        );
    }
    println!();
    println!(
        "partitions = 3 against 1 on the same cluster: {} (goal ≥ 1.6×)",
        ratio(Some(three.rate()), Some(one.rate()))
    );
}

/// `x` with one decimal, or `–`.
fn shown(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |x| format!("{x:.1}"))
}

/// `a / b` as a ratio, or `–`.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("**{:.2}×**", a / b),
        _ => "–".to_string(),
    }
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
    let pid = server.pid();
    let length = Duration::from_secs_f64(seconds);
    // `PACELINE_BENCH_ONLY=groups` runs only the group-limit cell.
    let only_groups = std::env::var("PACELINE_BENCH_ONLY").is_ok_and(|o| o == "groups");
    let many = if full { 10_000 } else { 100 };
    let ours = if only_groups {
        Vec::new()
    } else {
        // Each cell on an empty server, as BullMQ's end to end runs after it removes
        // what its enqueue cells left: a server holding the last cells' hundreds of
        // thousands of jobs is a slower server.
        let flush = || server.command(&["FLUSHALL"]).expect("FLUSHALL");
        let one = runtime.block_on(enqueue_one(&url, pid, length));
        flush();
        let batch = runtime.block_on(enqueue_batch(&url, pid, length));
        flush();
        let e2e = runtime.block_on(end_to_end(&url, pid, cell_groups(), jobs));
        flush();
        let e2e_many = runtime.block_on(end_to_end(&url, pid, many, jobs));
        flush();
        let featured = runtime.block_on(end_to_end_featured(&url, pid, cell_groups(), jobs));
        flush();
        vec![
            ("enqueue one", one),
            ("enqueue batch", batch),
            ("end to end", e2e),
            ("end to end, many groups", e2e_many),
            ("end to end, features", featured),
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
    if !ours.is_empty() {
        let many_label = format!("end to end, {many} groups (paceline only)");
        let labels = [
            "enqueue, one job per call, 64 producers",
            "enqueue, batches of 100, 8 producers",
            "end to end, no-op handler, 64 at a time",
            many_label.as_str(),
            "end to end, priorities, dedup keys and a queue-wide limit (paceline only)",
        ];
        println!(
            "| cell | paceline jobs/s | BullMQ jobs/s | paceline / BullMQ | paceline redis-server µs/job | BullMQ redis-server µs/job | paceline / BullMQ |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for ((cell, ours), label) in ours.iter().zip(labels) {
            assert!(ours.rate() > 0.0, "{cell}: nothing done");
            let them = theirs.iter().find(|(c, _)| c == cell).map(|(_, t)| *t);
            println!(
                "| {label} | {:.0} | {} | {} | {} | {} | {} |",
                ours.rate(),
                them.map_or_else(|| "–".to_string(), |t| format!("{:.0}", t.rate())),
                ratio(Some(ours.rate()), them.map(|t| t.rate())),
                shown(ours.cpu_per_job()),
                shown(them.and_then(|t| t.cpu_per_job())),
                ratio(ours.cpu_per_job(), them.and_then(|t| t.cpu_per_job())),
            );
        }
        // Enqueue (one per call) plus lease and ack (end to end), per job.
        let sum = |cells: &[(&str, Cell)]| -> Option<f64> {
            let per = |name: &str| {
                cells
                    .iter()
                    .find(|(c, _)| *c == name)
                    .and_then(|(_, cell)| cell.cpu_per_job())
            };
            Some(per("enqueue one")? + per("end to end")?)
        };
        let theirs_named: Vec<(&str, Cell)> =
            theirs.iter().map(|(c, cell)| (c.as_str(), *cell)).collect();
        let (us, them) = (sum(&ours), sum(&theirs_named));
        println!();
        println!(
            "redis-server CPU per job, enqueue (one per call) + lease + ack (end to end): paceline {} µs, BullMQ {} µs, ratio {} (goal ≤ 0.4×); {many} groups against {} end to end: {} (goal ≥ 0.8×)",
            shown(us),
            shown(them),
            ratio(us, them),
            cell_groups(),
            ratio(Some(ours[3].1.rate()), Some(ours[2].1.rate())),
        );
    }
    if !only_groups {
        cluster_cells(&runtime, jobs);
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

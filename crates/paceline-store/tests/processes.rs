//! Many processes, one limit: 4 OS processes × 32 tasks share keys through one Redis.
//!
//! Every worker reads the same frozen virtual clock, so all 4 × 32 × 5 = 640 `pace` requests
//! on a key arrive "at once" and must be given distinct slots exactly one emission interval
//! (5 ms at 200/s) apart, covering 3.2 s of virtual time with nothing lost and nothing
//! doubled; and of 640 `limit` requests on a key with a burst of 10, exactly 10 are admitted.
//! Any lost update between processes would show as two equal slots or an 11th admission.
//!
//! The parent test re-runs this test binary as the workers (`worker_process`, which does
//! nothing unless `PACELINE_WORKER_URL` is set).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy};
use paceline_store::{Limiter, ManualClock};
use paceline_testkit::RedisServer;

const PROCESSES: usize = 4;
const TASKS: usize = 32;
const REQUESTS_PER_TASK: usize = 5;
const RATE_PER_SECOND: u64 = 200;
const BURST: u64 = 10;
/// 2023-11-14 in microseconds since the Unix epoch.
const T0: u64 = 1_700_000_000_000_000;

#[test]
fn four_processes_of_32_tasks_hold_one_limit_together() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dir = dir.path();
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "worker_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("PACELINE_WORKER_URL", server.url())
                .env("PACELINE_WORKER_OUT", dir.join(format!("worker{i}.txt")))
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("a worker process starts")
        })
        .collect();
    for mut child in children {
        assert!(
            child.wait().expect("the worker ends").success(),
            "a worker failed"
        );
    }
    let mut lines = Vec::new();
    for i in 0..PROCESSES {
        let text = std::fs::read_to_string(dir.join(format!("worker{i}.txt"))).expect("output");
        lines.extend(text.lines().map(str::to_string));
    }
    let total = PROCESSES * TASKS * REQUESTS_PER_TASK;
    let interval_ns = 1_000_000_000 / RATE_PER_SECOND;
    for algorithm in ["gcra", "pacer"] {
        let mut slots: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{algorithm} ")))
            .map(|ns| ns.parse().expect("a delay in ns"))
            .collect();
        assert_eq!(slots.len(), total, "{algorithm}: every pace is admitted");
        slots.sort_unstable();
        for (k, slot) in slots.iter().enumerate() {
            // Slot k is exactly k intervals after the frozen now (within 1 µs of float
            // rounding): no two closer than 1/rate, no gap, nothing lost or doubled.
            let expected = k as u64 * interval_ns;
            assert!(
                slot.abs_diff(expected) <= 1_000,
                "{algorithm}: slot {k} at {slot} ns, expected {expected} ns"
            );
        }
    }
    let admitted = lines.iter().filter(|l| *l == "limit true").count();
    let rejected = lines.iter().filter(|l| *l == "limit false").count();
    assert_eq!(
        admitted as u64, BURST,
        "exactly the burst is admitted at one instant"
    );
    assert_eq!(admitted + rejected, total);
}

/// The worker: 32 tasks, each making 5 requests per key, on a clock frozen at `T0`.
#[test]
fn worker_process() {
    let (Ok(url), Ok(out)) = (
        std::env::var("PACELINE_WORKER_URL"),
        std::env::var("PACELINE_WORKER_OUT"),
    ) else {
        return; // Run as a normal test: nothing to do.
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let lines = runtime.block_on(async move {
        let store = RedisStore::builder(url, FailurePolicy::FailClosed)
            .prefix("processes")
            .clock(Arc::new(ManualClock::new(T0)))
            .response_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let store = Arc::new(store);
        let limiter = |spec: String| {
            Limiter::with_store(spec.parse().expect("valid spec"), Arc::clone(&store))
        };
        let gcra = limiter(format!("gcra:rate={RATE_PER_SECOND}/s"));
        let pacer = limiter(format!("pacer:rate={RATE_PER_SECOND}/s"));
        let limit = limiter(format!("gcra:rate={RATE_PER_SECOND}/s,burst={BURST}"));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (gcra, pacer, limit) = (gcra.clone(), pacer.clone(), limit.clone());
                tokio::spawn(async move {
                    let mut lines = Vec::new();
                    for _ in 0..REQUESTS_PER_TASK {
                        let d = gcra.pace("gcra", 1).await.expect("gcra pace");
                        lines.push(format!("gcra {}", d.delay.as_nanos()));
                        let d = pacer.pace("pacer", 1).await.expect("pacer pace");
                        lines.push(format!("pacer {}", d.delay.as_nanos()));
                        let d = limit.limit("limit", 1).await.expect("limit");
                        lines.push(format!("limit {}", d.allowed));
                    }
                    lines
                })
            })
            .collect();
        let mut lines = Vec::new();
        for task in tasks {
            lines.extend(task.await.expect("a task finishes"));
        }
        lines
    });
    std::fs::write(out, lines.join("\n") + "\n").expect("write the worker's output");
}

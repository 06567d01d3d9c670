//! Killed processes: Redis killed while a worker's calls are in flight loses no answered
//! acknowledgement, and worker processes sharing a queue survive one of them killed mid-job.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{ManualClock, Policy};
use paceline_queue::{NewJob, Queue, QueueConfig, RedisQueue};
use paceline_testkit::{connect, runtime, unique_name};

mod common;
use common::redis::open_at;

/// Redis killed (SIGKILL) and restarted while a worker is busy, so that calls are in flight
/// when it dies, with its append-only file synced at every write: no acknowledgement that
/// was answered `Ok` is lost (such a job is never leased again, nor acknowledged twice), and
/// once the leases the crash left run out (on the store's virtual clock) every job ends
/// acknowledged, each extra start a redelivery after an expired lease.
#[test]
fn a_redis_killed_mid_run_loses_no_answered_acknowledgement() {
    killed_mid_run(1);
}

/// The same with a queue of 3 partitions (all on the one Redis killed): a lease that asks
/// them in turn, each partition's calls in flight when Redis dies.
#[test]
fn a_redis_killed_under_a_queue_of_three_partitions_loses_no_answered_acknowledgement() {
    killed_mid_run(3);
}

/// Kills Redis under a queue of `partitions` while a worker runs: see the tests above.
fn killed_mid_run(partitions: u32) {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    const JOBS: usize = 3_000;
    let mut server = paceline_testkit::RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .expect("redis-server starts");
    // The worker runs on its own threads while this one kills and restarts Redis.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = ManualClock::new(1_700_000_000_000_000);
    let options = paceline_store::StoreOptions::new().clock(Arc::new(clock.clone()));
    let lease = Duration::from_secs(60);
    let q = runtime.block_on(async {
        let store = paceline_store::open(&server.url(), &options).await.unwrap();
        let config = QueueConfig::new("gcra:rate=1000000/s,burst=1000000".parse().unwrap())
            .lease(lease)
            .partitions(partitions);
        let q = Queue::with_store(&store, &unique_name("killed"), config)
            .await
            .unwrap();
        for chunk in 0..JOBS / 500 {
            let jobs = (chunk * 500..(chunk + 1) * 500)
                .map(|n| NewJob::new(format!("g{}", n % 4), vec![]).id(format!("job-{n}")))
                .collect();
            for e in q.enqueue_batch(jobs).await {
                e.unwrap();
            }
        }
        q
    });
    // What the worker saw: the jobs whose ack was answered `Ok`, any such job leased
    // again, and the calls that failed.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let leased_again: Arc<Mutex<Vec<String>>> = Arc::default();
    let failures = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (q, acked, leased_again, failures, stop) = (
            q.clone(),
            Arc::clone(&acked),
            Arc::clone(&leased_again),
            Arc::clone(&failures),
            Arc::clone(&stop),
        );
        runtime.spawn(async move {
            let mut done: HashSet<String> = HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                let jobs = match q.lease("w", 8, None, Duration::ZERO).await {
                    Ok(jobs) => jobs,
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        Vec::new()
                    }
                };
                if jobs.is_empty() {
                    // Nothing to start (or Redis is down): ask again shortly.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                for job in jobs {
                    if done.contains(&job.id) {
                        leased_again.lock().unwrap().push(job.id.clone());
                    }
                    match q.ack(&job.id, &job.token).await {
                        Ok(()) => {
                            done.insert(job.id.clone());
                            acked.lock().unwrap().push(job.id);
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    let acked_count = || acked.lock().unwrap().len();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    until("a hundred jobs acknowledged", &|| acked_count() >= 100);
    server.restart().expect("redis-server restarts");
    let before = acked_count();
    assert!(before < JOBS, "the kill came while jobs were left");
    until("more jobs acknowledged after the restart", &|| {
        acked_count() > before
    });
    // Everything the worker can start is done; what is left are the leases the crash
    // left behind (their answers lost): they run out, and the jobs come back.
    let stats = || runtime.block_on(q.stats());
    until("no job waiting", &|| {
        stats().is_ok_and(|s| s.waiting == 0 && s.scheduled == 0)
    });
    clock.advance(lease + Duration::from_secs(1));
    until("every job acknowledged", &|| {
        stats().is_ok_and(|s| s.totals.acked == JOBS as u64 && s.active == 0)
    });
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(worker).expect("the worker ends");

    let acked = acked.lock().unwrap();
    let distinct: HashSet<&String> = acked.iter().collect();
    assert_eq!(distinct.len(), acked.len(), "a job acknowledged twice");
    assert_eq!(*leased_again.lock().unwrap(), Vec::<String>::new());
    assert!(
        failures.load(Ordering::Relaxed) > 0,
        "the kill failed calls in flight"
    );
    let s = stats().unwrap();
    assert_eq!(
        (s.waiting, s.scheduled, s.active, s.dead, s.totals.acked),
        (0, 0, 0, 0, JOBS as u64),
        "{s:?}"
    );
    // Every start beyond one per job is a redelivery after a lease ran out.
    assert_eq!(
        s.totals.started - JOBS as u64,
        s.totals.lease_expiries,
        "{s:?}"
    );
}

/// One worker process of `workers_share_a_queue_and_survive_a_sigkill`: runs a `Worker`
/// over the queue named by the environment, writing a line per start to its file. Run only
/// by that test (it is ignored otherwise).
#[test]
#[ignore = "a child process of workers_share_a_queue_and_survive_a_sigkill"]
fn worker_process() {
    use std::io::Write;
    let (Ok(url), Ok(name), Ok(path)) = (
        std::env::var("PACELINE_TEST_REDIS"),
        std::env::var("PACELINE_TEST_QUEUE"),
        std::env::var("PACELINE_TEST_STARTS"),
    ) else {
        return;
    };
    let work = Duration::from_millis(
        std::env::var("PACELINE_TEST_WORK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(40),
    );
    runtime().block_on(async {
        let q = Queue::new(
            RedisQueue::attach(connect(&url).await, &name)
                .await
                .expect("the queue exists"),
        );
        let file = std::sync::Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .expect("the starts file"),
        ));
        let concurrency = std::env::var("PACELINE_TEST_CONCURRENCY")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(4);
        let worker = paceline_queue::Worker::new(q).concurrency(concurrency);
        let report = worker
            .run(
                move |job| {
                    let file = std::sync::Arc::clone(&file);
                    async move {
                        let line =
                            format!("{} {} {} {}\n", job.id, job.group, job.started, job.attempt);
                        if let Ok(mut f) = file.lock() {
                            let _ = f.write_all(line.as_bytes());
                        }
                        // The job's work.
                        tokio::time::sleep(work).await;
                        Ok(())
                    }
                },
                std::future::pending::<()>(),
            )
            .await;
        panic!("the worker stopped: {report:?}");
    });
}

/// 4 worker processes on one Redis queue, one killed with SIGKILL mid-job and started
/// again: every job is acknowledged, none is lost, a job starts twice only after its lease
/// expired (and each such start is counted), and each group's starts, on the server's
/// clock, pass its policy.
#[test]
fn workers_share_a_queue_and_survive_a_sigkill() {
    use std::collections::BTreeMap;
    use std::process::{Child, Command, Stdio};
    let server = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let name = unique_name("sigkill");
    let spec = "fixed_window:limit=5,window=500ms";
    let policy: Policy = spec.parse().unwrap();
    let rt = runtime();
    let q = rt.block_on(async {
        let config = QueueConfig::new(policy.clone()).lease(Duration::from_millis(1_000));
        let q = Queue::new(open_at(&server.url(), &name, config, None).await);
        let jobs = (0..60u8)
            .map(|n| NewJob::new(format!("g{}", n % 3), vec![n]))
            .collect();
        for e in q.enqueue_batch(jobs).await {
            e.unwrap();
        }
        q
    });
    let spawn = |n: usize| -> Child {
        Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", "worker_process", "--ignored", "--nocapture"])
            .env("PACELINE_TEST_REDIS", server.url())
            .env("PACELINE_TEST_QUEUE", &name)
            .env(
                "PACELINE_TEST_STARTS",
                dir.path().join(format!("starts-{n}")),
            )
            // Worker 0's job hangs, so it is surely killed mid-job; it runs one job at a
            // time, so no lease call of it is in flight then, and every start it took is
            // in its file (a start whose answer died with the process would be missing
            // from the replay below).
            .env("PACELINE_TEST_WORK_MS", if n == 0 { "60000" } else { "40" })
            .env("PACELINE_TEST_CONCURRENCY", if n == 0 { "1" } else { "4" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("a worker process")
    };
    let mut workers: Vec<Child> = (0..4).map(spawn).collect();
    let starts_of = |n: usize| {
        std::fs::read_to_string(dir.path().join(format!("starts-{n}"))).unwrap_or_default()
    };
    // Kill worker 0 once it has started a job (mid-job: its jobs hang).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while starts_of(0).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "worker 0 never started a job"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    workers[0].kill().expect("SIGKILL");
    let _ = workers[0].wait();
    workers[0] = spawn(4);
    // Wait for every job to be acknowledged.
    let stats = loop {
        let stats = rt.block_on(q.stats()).unwrap();
        if stats.totals.acked == 60 {
            break stats;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every job was acked: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert_eq!(
        (stats.waiting, stats.active, stats.scheduled, stats.dead),
        (0, 0, 0, 0)
    );
    // Every start, by group, from every worker's file (a line cut by the kill is dropped).
    let mut by_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut by_job: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for n in 0..5 {
        for line in starts_of(n).lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [id, group, started, attempt] = parts[..] else {
                continue;
            };
            let (Ok(started), Ok(attempt)) = (started.parse::<u64>(), attempt.parse::<u32>())
            else {
                continue;
            };
            by_group.entry(group.to_string()).or_default().push(started);
            by_job.entry(id.to_string()).or_default().push(attempt);
        }
    }
    assert_eq!(by_job.len(), 60, "every job started");
    // The replay holds every start the server counted, the killed worker's included.
    let logged: usize = by_job.values().map(Vec::len).sum();
    assert_eq!(
        logged as u64, stats.totals.started,
        "every start is in the workers' files: {stats:?}"
    );
    let again: usize = by_job.values().map(|a| a.len() - 1).sum();
    assert!(again >= 1, "the killed worker's job ran again");
    assert_eq!(
        stats.totals.started - 60,
        stats.totals.lease_expiries,
        "a job starts again only after its lease expired: {stats:?}"
    );
    assert!(again as u64 <= stats.totals.lease_expiries);
    assert!(
        by_job.values().flatten().all(|&a| a >= 1),
        "attempts count from 1"
    );
    for (group, mut times) in by_group {
        times.sort_unstable();
        let mut state = None;
        for t in times {
            let d = policy
                .apply(&mut state, t, paceline_core::Op::Limit, 1)
                .unwrap();
            assert!(d.allowed, "{group} started at {t}, over {spec}");
        }
    }
}

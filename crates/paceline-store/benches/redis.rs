//! Decisions per second through one local Redis: paceline's store beside (a) the ceiling of
//! any design that sends one script call per decision (`redis-benchmark -P 16` running a
//! minimal GCRA script by EVALSHA on the same server) and (b) rate-limiter-flexible's
//! `RateLimiterRedis` with ioredis, at the same concurrency, in the same run. Then paceline
//! on a Redis Cluster of 1 and of 3 primaries.
//!
//! Run: `scripts/bench-redis` (installs rate-limiter-flexible and ioredis with npm into a
//! temporary folder first), or `cargo bench -p paceline-store --features redis --bench redis` (without (b)
//! unless `PACELINE_RLF_NODE_PATH` names a `node_modules` holding both). Each cell runs
//! `PACELINE_BENCH_SECONDS` (default 3) on 10,000 keys with limits high enough that nearly
//! every decision admits, at (a)'s emission interval of 1 µs (so every admitted decision
//! writes its key's state, as (a) does); `PACELINE_BENCH_ONLY` picks cells by label (see
//! `main`). The client runs on a tokio runtime of `PACELINE_BENCH_THREADS` workers (default
//! 1: Redis takes one of the VM's two cores, and both anchors' clients run one thread too).
//! Under `cargo test` it runs a short smoke pass instead.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_store::{redis::RedisStore, FailurePolicy};
use paceline_store::{Limiter, Policy};
use paceline_testkit::{RedisCluster, RedisServer};

const KEYS: u64 = 10_000;

/// A minimal GCRA (one key, the server's clock), the least work a script call can do for a
/// rate-limit decision: the yardstick for "one script call per decision".
const MINIMAL_GCRA: &str = "\
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval
if new_tat - burst * interval > now then return 0 end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return 1";

struct Row {
    what: String,
    concurrency: usize,
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let seconds: f64 = if full {
        std::env::var("PACELINE_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3.0)
    } else {
        0.1
    };
    let duration = Duration::from_secs_f64(seconds);
    let concurrencies: &[usize] = if full { &[1, 64, 512] } else { &[1, 64] };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::env::var("PACELINE_BENCH_THREADS")
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or(1),
        )
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = RedisServer::start().expect("a private redis-server");
    let mut rows = Rows(Vec::new());
    // `PACELINE_BENCH_ONLY=text` runs only the cells whose label (as printed, then the
    // number of tasks) contains `text`, e.g. "one call per decision | 512".
    let only = std::env::var("PACELINE_BENCH_ONLY").ok();
    let wanted = |label: &str, tasks: usize| {
        only.as_ref()
            .is_none_or(|text| format!("{label} | {tasks}").contains(text.as_str()))
    };
    println!("| what | tasks | decisions/s | p50 | p99 |");
    println!("|---|---|---|---|---|");

    if full && wanted("(a) redis-benchmark", 800) {
        match redis_benchmark(&server, seconds) {
            Ok(row) => rows.push(row),
            Err(e) => eprintln!("skipping redis-benchmark: {e}"),
        }
    }
    for &concurrency in concurrencies {
        for (algorithm, spec) in [
            ("gcra", "gcra:rate=1000000/s,burst=1000000"),
            ("pacer", "pacer:rate=1000000/s,max_burst=1000000"),
        ] {
            for batched in [false, true] {
                let how = if batched {
                    "auto-batch"
                } else {
                    "one call per decision"
                };
                let label = format!("paceline {algorithm}, {how}");
                if !wanted(&label, concurrency) {
                    continue;
                }
                let row = runtime.block_on(paceline(
                    &server.url(),
                    spec,
                    batched,
                    concurrency,
                    duration,
                ));
                rows.push(Row { what: label, ..row });
            }
        }
        if full && wanted("(b) rate-limiter-flexible", concurrency) {
            match rate_limiter_flexible(&server, concurrency, seconds) {
                Ok(row) => rows.push(row),
                Err(e) => eprintln!("skipping rate-limiter-flexible: {e}"),
            }
        }
    }
    if full {
        for primaries in [1, 3] {
            let label = format!("paceline gcra, auto-batch, cluster of {primaries}");
            if !wanted(&label, 512) {
                continue;
            }
            let cluster = RedisCluster::start_with(primaries).expect("a private Redis Cluster");
            let row = runtime.block_on(paceline(
                &cluster.url(),
                "gcra:rate=1000000/s,burst=1000000",
                true,
                512,
                duration,
            ));
            rows.push(Row { what: label, ..row });
        }
    }

    assert!(
        rows.0.iter().all(|r| r.per_second > 0.0),
        "every cell made decisions"
    );
}

/// The rows so far; each is printed as soon as it is measured.
struct Rows(Vec<Row>);

impl Rows {
    fn push(&mut self, r: Row) {
        println!(
            "| {} | {} | {:.0} | {:.0} µs | {:.0} µs |",
            r.what, r.concurrency, r.per_second, r.p50_us, r.p99_us
        );
        self.0.push(r);
    }
}

/// `concurrency` tasks making decisions on random keys through paceline for `duration`.
async fn paceline(
    url: &str,
    spec: &str,
    batched: bool,
    concurrency: usize,
    duration: Duration,
) -> Row {
    let mut builder = RedisStore::builder(url, FailurePolicy::FailClosed).prefix("bench");
    if batched {
        builder = builder.auto_batch(Duration::ZERO);
    }
    let store = builder.connect().await.expect("connect");
    let policy: Policy = spec.parse().expect("valid spec");
    let pace = policy.algorithm() == "pacer";
    let limiter = Limiter::with_store(policy, Arc::new(store));
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1);
                while Instant::now() < deadline {
                    // xorshift: a cheap uniform key choice.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let key = format!("user:{}", seed % KEYS);
                    let t0 = Instant::now();
                    let decision = if pace {
                        limiter.pace(&key, 1).await
                    } else {
                        limiter.limit(&key, 1).await
                    };
                    decision.expect("a decision");
                    latencies.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a task finishes"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    summarize(concurrency, latencies, elapsed)
}

/// A row without its label (the caller names it).
fn summarize(concurrency: usize, mut latencies: Vec<f64>, seconds: f64) -> Row {
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Row {
        what: String::new(),
        concurrency,
        per_second: latencies.len() as f64 / seconds,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
    }
}

/// `redis-benchmark -P 16` running [`MINIMAL_GCRA`] by EVALSHA on random keys.
fn redis_benchmark(server: &RedisServer, seconds: f64) -> Result<Row, String> {
    let load = paceline_testkit::redis_cli(server.port())
        .args(["SCRIPT", "LOAD", MINIMAL_GCRA])
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let sha = String::from_utf8_lossy(&load.stdout).trim().to_string();
    if sha.len() != 40 {
        return Err(format!("SCRIPT LOAD answered {sha:?}"));
    }
    // About `seconds` worth at the expected ~100k/s.
    let requests = ((seconds * 100_000.0) as u64).max(10_000).to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &server.port().to_string(),
            "-P",
            "16",
            "-c",
            "50",
            "-n",
            &requests,
        ])
        .args(["-r", &KEYS.to_string(), "-q", "EVALSHA", &sha, "1"])
        .args(["gcra:__rand_int__", "1", "1000000"])
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // e.g. "EVALSHA ...: 98231.83 requests per second, p50=7.455 msec"
    let last = text.rsplit('\r').next().unwrap_or(&text);
    let per_second = last
        .split(": ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .ok_or_else(|| format!("cannot read redis-benchmark's output: {text:?}"))?;
    let p50_us = last
        .split("p50=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(f64::NAN, |ms| ms * 1000.0);
    Ok(Row {
        what: "(a) redis-benchmark -P 16, minimal GCRA script (50 connections)".into(),
        concurrency: 50 * 16,
        per_second,
        p50_us,
        p99_us: f64::NAN,
    })
}

/// rate-limiter-flexible's `RateLimiterRedis` + ioredis under node, same keys and load.
fn rate_limiter_flexible(
    server: &RedisServer,
    concurrency: usize,
    seconds: f64,
) -> Result<Row, String> {
    let node_path = std::env::var("PACELINE_RLF_NODE_PATH").map_err(|_| {
        "PACELINE_RLF_NODE_PATH is not set (scripts/bench-redis sets it)".to_string()
    })?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/rate_limiter_flexible.js"
    );
    let out = Command::new("node")
        .arg(script)
        .env("NODE_PATH", node_path)
        .env("PORT", server.port().to_string())
        .env("CONCURRENCY", concurrency.to_string())
        .env("SECONDS", seconds.to_string())
        .env("KEYS", KEYS.to_string())
        .output()
        .map_err(|e| format!("node: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Result<f64, String> {
        text.split(&format!("\"{name}\":"))
            .nth(1)
            .and_then(|s| s.split([',', '}']).next())
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| format!("no `{name}` in {text:?}"))
    };
    Ok(Row {
        what: "(b) rate-limiter-flexible RateLimiterRedis + ioredis".into(),
        concurrency,
        per_second: field("decisions")? / field("seconds")?,
        p50_us: field("p50_us")?,
        p99_us: field("p99_us")?,
    })
}

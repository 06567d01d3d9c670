//! Envoy's rate limit service under load: `ShouldRateLimit` over gRPC (Envoy's protos, the
//! `envoy-types` client) beside `POST /v1/decisions` (JSON over HTTP/1.1, kept alive), on
//! the same `paceline serve` processes in the same run, with one descriptor and with three,
//! on the memory store and on Redis.
//!
//! Run `scripts/bench-rls`: it builds the release binary, starts a `redis-server` and two
//! services (memory, Redis) on free ports with the rules of `benches/rls-load/rules.yaml`, and runs
//! this program, which reads them from `PACELINE_RLS_TARGETS`
//! (`memory=GRPC_ADDR,HTTP_ADDR,PID;Redis=GRPC_ADDR,HTTP_ADDR,PID`) and `PACELINE_REDIS_PID`.
//! Without them it says so and measures nothing.
//!
//! The workload: random users of 10,000 (`user`), and for three descriptors also their
//! tenant (100) and route (10); each a fixed window of 10⁹ a second, so every request is
//! admitted and the store writes every counter. gRPC sends `{domain: bench, descriptors:
//! [{user: N}]}` (or three descriptors); HTTP sends the same limits inline,
//! `{"policy": "fixed_window:limit=1000000000,window=1s", "key": "user:N"}` (or a set of
//! three, `{"limits": [...]}`), so both decide the same counters' worth of work.
//!
//! 1. **Most decisions per second**: `PACELINE_BENCH_TASKS` (64) tasks, each sending its next
//!    request when the last is answered, for `PACELINE_BENCH_SECONDS` (3) per cell. HTTP
//!    gives each task a connection of its own (as `wrk -c64`); gRPC shares
//!    `PACELINE_BENCH_GRPC_CONNECTIONS` (2) HTTP/2 connections between the tasks (as Envoy
//!    keeps a connection per worker thread), hyper's, as the HTTP side's are. Every cell runs `PACELINE_BENCH_ROUNDS` (3)
//!    times, the cells interleaved round by round; the table gives each cell's median and
//!    the CPU each process spent per decision.
//! 2. **Latency at half the most**: an open-loop run of `PACELINE_BENCH_OPEN_SECONDS` (4)
//!    per cell at half its median rate: one thread schedules the sends at even intervals,
//!    the tasks take them in order, and a request's latency runs from the time it was due
//!    to be sent (so a stall counts for every request it delays).
//!
//! Then the ratios against the issue's goals.

#[path = "../../common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{median, setting, CpuMark, Latencies};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

const USERS: usize = 10_000;
/// How long a request may take before it counts as an error.
const TIMEOUT: Duration = Duration::from_secs(5);
const POLICY: &str = "fixed_window:limit=1000000000,window=1s";

/// A `paceline serve` under test: its store's name, its listeners and its process.
#[derive(Clone)]
struct Target {
    store: String,
    grpc: SocketAddr,
    http: SocketAddr,
    pid: u32,
}

/// `PACELINE_RLS_TARGETS`, as `scripts/bench-rls` writes it.
fn targets(text: &str) -> Result<Vec<Target>, String> {
    text.split(';')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (store, rest) = t
                .split_once('=')
                .ok_or_else(|| format!("`{t}`: expected STORE=GRPC,HTTP,PID"))?;
            let parts: Vec<&str> = rest.split(',').collect();
            let [grpc, http, pid] = parts[..] else {
                return Err(format!("`{t}`: expected STORE=GRPC,HTTP,PID"));
            };
            Ok(Target {
                store: store.to_string(),
                grpc: grpc.parse().map_err(|e| format!("`{grpc}`: {e}"))?,
                http: http.parse().map_err(|e| format!("`{http}`: {e}"))?,
                pid: pid.parse().map_err(|e| format!("`{pid}`: {e}"))?,
            })
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "gRPC ShouldRateLimit",
            Protocol::Http => "POST /v1/decisions",
        }
    }
}

/// Every request a cell may send, built once (so that the load generator, which shares the
/// machine's cores with the service, spends as little as it can per request).
struct Requests {
    descriptors: usize,
    grpc: Vec<RateLimitRequest>,
    http: Vec<Bytes>,
}

impl Requests {
    fn new(descriptors: usize) -> Requests {
        let keys = |u: usize| {
            [
                ("user", u.to_string()),
                ("tenant", (u % 100).to_string()),
                ("route", (u % 10).to_string()),
            ]
        };
        let grpc = (0..USERS)
            .map(|u| RateLimitRequest {
                domain: "bench".into(),
                descriptors: keys(u)[..descriptors]
                    .iter()
                    .map(|(k, v)| RateLimitDescriptor {
                        entries: vec![Entry {
                            key: k.to_string(),
                            value: v.clone(),
                        }],
                        ..Default::default()
                    })
                    .collect(),
                hits_addend: 0,
            })
            .collect();
        let http = (0..USERS)
            .map(|u| {
                let body = if descriptors == 1 {
                    format!(r#"{{"policy":"{POLICY}","key":"user:{u}","op":"limit"}}"#)
                } else {
                    let limits: Vec<String> = keys(u)[..descriptors]
                        .iter()
                        .map(|(k, v)| format!(r#"{{"policy":"{POLICY}","key":"{k}:{v}"}}"#))
                        .collect();
                    format!(r#"{{"limits":[{}],"op":"limit"}}"#, limits.join(","))
                };
                Bytes::from(body)
            })
            .collect();
        Requests {
            descriptors,
            grpc,
            http,
        }
    }
}

/// A TCP connection to `addr`, Nagle off (as the service's own side has it).
async fn connect(addr: SocketAddr) -> Result<tokio::net::TcpStream, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Envoy's gRPC client over one HTTP/2 connection of hyper's, the calls sent straight on
/// it: tonic's `Channel` hands every call to a task of its own through a buffer, which
/// costs the load generator (sharing the machine's cores with the service) more CPU per
/// call than the HTTP/1.1 side spends.
#[derive(Clone)]
struct H2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// One task's way to the service.
enum Conn {
    Grpc(RateLimitServiceClient<H2>),
    Http(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
}

/// What an answer was.
enum Answered {
    Admitted,
    Refused,
}

impl Conn {
    /// `tasks` connections to `target` over `protocol`: HTTP one each, gRPC `grpc_conns`
    /// shared in turn.
    async fn open(
        target: &Target,
        protocol: Protocol,
        tasks: usize,
        grpc_conns: usize,
    ) -> Result<Vec<Conn>, String> {
        match protocol {
            Protocol::Grpc => {
                let origin: http::Uri = format!("http://{}", target.grpc)
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                let mut channels = Vec::new();
                for _ in 0..grpc_conns.max(1) {
                    let stream = connect(target.grpc).await?;
                    let (sender, conn) = hyper::client::conn::http2::handshake(
                        hyper_util::rt::TokioExecutor::new(),
                        hyper_util::rt::TokioIo::new(stream),
                    )
                    .await
                    .map_err(|e| format!("gRPC {}: {e}", target.grpc))?;
                    tokio::spawn(conn);
                    channels.push(H2(sender));
                }
                Ok((0..tasks)
                    .map(|i| {
                        Conn::Grpc(RateLimitServiceClient::with_origin(
                            channels[i % channels.len()].clone(),
                            origin.clone(),
                        ))
                    })
                    .collect())
            }
            Protocol::Http => {
                let mut conns = Vec::new();
                for _ in 0..tasks {
                    let stream = connect(target.http).await?;
                    let (sender, conn) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                            .await
                            .map_err(|e| e.to_string())?;
                    tokio::spawn(conn);
                    conns.push(Conn::Http(sender));
                }
                Ok(conns)
            }
        }
    }

    /// Sends request `i` of `requests` and reads the whole answer, or fails after
    /// [`TIMEOUT`].
    async fn call(&mut self, requests: &Requests, i: usize) -> Result<Answered, String> {
        tokio::time::timeout(TIMEOUT, self.send(requests, i))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {TIMEOUT:?}")))
    }

    async fn send(&mut self, requests: &Requests, i: usize) -> Result<Answered, String> {
        match self {
            Conn::Grpc(client) => {
                let answer = client
                    .should_rate_limit(requests.grpc[i].clone())
                    .await
                    .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?
                    .into_inner();
                Ok(if answer.overall_code == Code::Ok as i32 {
                    Answered::Admitted
                } else {
                    Answered::Refused
                })
            }
            Conn::Http(sender) => {
                let request = hyper::Request::post("/v1/decisions")
                    .header(hyper::header::HOST, "127.0.0.1")
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(requests.http[i].clone()))
                    .map_err(|e| e.to_string())?;
                sender.ready().await.map_err(|e| e.to_string())?;
                let answer = sender
                    .send_request(request)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = answer.status();
                answer
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                match status.as_u16() {
                    200 => Ok(Answered::Admitted),
                    429 => Ok(Answered::Refused),
                    other => Err(format!("HTTP {other}")),
                }
            }
        }
    }
}

/// What one task saw.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<f64>,
    refused: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Seen {
    fn answered(&mut self, outcome: Result<Answered, String>, latency: Duration) {
        match outcome {
            Ok(answered) => {
                if matches!(answered, Answered::Refused) {
                    self.refused += 1;
                }
                self.latencies_us.push(latency.as_secs_f64() * 1e6);
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    fn merge(&mut self, other: Seen) {
        self.latencies_us.extend(other.latencies_us);
        self.refused += other.refused;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// A cell measured: its answers per second and what each process spent per decision.
struct Measured {
    requests_per_s: f64,
    latencies: Latencies,
    refused: u64,
    errors: u64,
    /// µs of CPU per decision: the service, redis-server, this load generator.
    cpu_us: Vec<f64>,
}

/// The machine's processes whose CPU each cell reports: the service, redis-server (when
/// known) and this program.
fn pids(target: &Target, redis_pid: Option<u32>) -> Vec<u32> {
    vec![
        target.pid,
        redis_pid.unwrap_or(u32::MAX),
        std::process::id(),
    ]
}

/// A xorshift step: a cheap uniform choice of user.
fn next(seed: &mut u64) -> usize {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % USERS as u64) as usize
}

/// Closed loop: each connection's task sends its next request once the last is answered.
async fn closed_loop(
    conns: Vec<Conn>,
    requests: Arc<Requests>,
    duration: Duration,
    pids: &[u32],
) -> Measured {
    let mark = CpuMark::now(pids);
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(n, mut conn)| {
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (n as u64 + 1);
                while Instant::now() < deadline {
                    let i = next(&mut seed);
                    let t0 = Instant::now();
                    let outcome = conn.call(&requests, i).await;
                    seen.answered(outcome, t0.elapsed());
                }
                seen
            })
        })
        .collect();
    let seen = gather(tasks).await;
    let seconds = start.elapsed().as_secs_f64();
    finish(seen, seconds, requests.descriptors, &mark, pids)
}

/// Every task's [`Seen`] as one (a task that panicked counts as an error).
async fn gather(tasks: Vec<tokio::task::JoinHandle<Seen>>) -> Seen {
    let mut seen = Seen::default();
    for task in tasks {
        match task.await {
            Ok(s) => seen.merge(s),
            Err(e) => seen.answered(Err(format!("a task failed: {e}")), Duration::ZERO),
        }
    }
    seen
}

fn finish(seen: Seen, seconds: f64, descriptors: usize, mark: &CpuMark, pids: &[u32]) -> Measured {
    if let Some(e) = &seen.first_error {
        eprintln!("{} errors, the first: {e}", seen.errors);
    }
    let answered = seen.latencies_us.len() as f64;
    Measured {
        requests_per_s: answered / seconds,
        cpu_us: mark.per(pids, answered * descriptors as f64),
        latencies: Latencies::new(seen.latencies_us),
        refused: seen.refused,
        errors: seen.errors,
    }
}

/// Open loop at `rate` requests a second for `duration`: a thread hands out the times the
/// requests are due, evenly spaced; the connections' tasks take them in turn; a latency
/// runs from the time due.
async fn open_loop(
    conns: Vec<Conn>,
    requests: Arc<Requests>,
    rate: f64,
    duration: Duration,
    pids: &[u32],
) -> Measured {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let count = (rate * duration.as_secs_f64()) as u64;
    let mark = CpuMark::now(pids);
    let start = Instant::now() + Duration::from_millis(10);
    let schedule = std::thread::spawn(move || {
        for i in 0..count {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if tx.send(due).is_err() {
                return;
            }
        }
    });
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(n, mut conn)| {
            let (requests, rx) = (requests.clone(), rx.clone());
            tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut seed = 0x2545_F491_4F6C_DD1Du64 ^ (n as u64 + 1);
                loop {
                    let due = { rx.lock().await.recv().await };
                    let Some(due) = due else { return seen };
                    let i = next(&mut seed);
                    let outcome = conn.call(&requests, i).await;
                    seen.answered(outcome, due.elapsed());
                }
            })
        })
        .collect();
    let seen = gather(tasks).await;
    let _ = schedule.join();
    let seconds = start.elapsed().as_secs_f64();
    finish(seen, seconds, requests.descriptors, &mark, pids)
}

/// A cell of the table: a service, a protocol, a number of descriptors.
#[derive(Clone)]
struct Cell {
    target: Target,
    protocol: Protocol,
    descriptors: usize,
}

impl Cell {
    fn label(&self) -> String {
        format!(
            "{}, {}, {} descriptor{}",
            self.target.store,
            self.protocol.name(),
            self.descriptors,
            if self.descriptors == 1 { "" } else { "s" }
        )
    }
}

fn main() {
    let Ok(text) = std::env::var("PACELINE_RLS_TARGETS") else {
        eprintln!("PACELINE_RLS_TARGETS is not set: run scripts/bench-rls, which starts the services this program loads");
        return;
    };
    let targets = match targets(&text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("PACELINE_RLS_TARGETS: {e}");
            std::process::exit(2);
        }
    };
    let redis_pid: Option<u32> = std::env::var("PACELINE_REDIS_PID")
        .ok()
        .and_then(|p| p.parse().ok());
    let tasks: usize = setting("PACELINE_BENCH_TASKS", 64);
    let grpc_conns: usize = setting("PACELINE_BENCH_GRPC_CONNECTIONS", 2);
    let seconds = Duration::from_secs_f64(setting("PACELINE_BENCH_SECONDS", 3.0));
    let rounds: usize = setting("PACELINE_BENCH_ROUNDS", 3);
    let open_seconds = Duration::from_secs_f64(setting("PACELINE_BENCH_OPEN_SECONDS", 4.0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(setting("PACELINE_BENCH_THREADS", 2))
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let shapes = [Arc::new(Requests::new(1)), Arc::new(Requests::new(3))];
    let mut cells = Vec::new();
    for shape in &shapes {
        for target in &targets {
            for protocol in [Protocol::Grpc, Protocol::Http] {
                cells.push(Cell {
                    target: target.clone(),
                    protocol,
                    descriptors: shape.descriptors,
                });
            }
        }
    }
    let requests_of = |cell: &Cell| {
        shapes
            .iter()
            .find(|s| s.descriptors == cell.descriptors)
            .cloned()
            .expect("a shape per cell")
    };
    let mut failures = 0u64;

    // 1. Closed loop, the cells interleaved round by round (the order turned each round).
    let mut runs: Vec<Vec<Measured>> = cells.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..cells.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for c in order {
            let cell = &cells[c];
            let pids = pids(&cell.target, redis_pid);
            let measured = runtime.block_on(async {
                let conns = Conn::open(&cell.target, cell.protocol, tasks, grpc_conns)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", cell.label()));
                closed_loop(conns, requests_of(cell), seconds, &pids).await
            });
            failures += measured.errors;
            eprintln!(
                "round {}: {}: {:.0} requests/s",
                round + 1,
                cell.label(),
                measured.requests_per_s
            );
            runs[c].push(measured);
        }
    }
    println!(
        "Closed loop: {tasks} tasks (HTTP: a connection each; gRPC: {grpc_conns} connections), {} s per run, {rounds} runs per cell; medians",
        seconds.as_secs_f64()
    );
    println!();
    println!("| store, protocol, descriptors | requests/s | decisions/s | p50 | p99 | service CPU µs/decision | redis-server CPU µs/decision | load generator CPU µs/decision | refused | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut best: Vec<f64> = Vec::new();
    for (cell, runs) in cells.iter().zip(&runs) {
        let pick = |f: &dyn Fn(&Measured) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let rps = pick(&|m| m.requests_per_s);
        best.push(rps);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} µs | {:.0} µs | {:.1} | {} | {:.1} | {} | {} |",
            cell.label(),
            rps,
            rps * cell.descriptors as f64,
            pick(&|m| m.latencies.at(0.5)),
            pick(&|m| m.latencies.at(0.99)),
            pick(&|m| m.cpu_us[0]),
            if cell.target.store.eq_ignore_ascii_case("memory") {
                "–".to_string()
            } else {
                format!("{:.1}", pick(&|m| m.cpu_us[1]))
            },
            pick(&|m| m.cpu_us[2]),
            runs.iter().map(|m| m.refused).sum::<u64>(),
            runs.iter().map(|m| m.errors).sum::<u64>(),
        );
    }
    println!();
    println!(
        "| run | {} |",
        cells
            .iter()
            .map(Cell::label)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(cells.len()));
    for round in 0..rounds {
        let row: Vec<String> = runs
            .iter()
            .zip(&cells)
            .map(|(r, c)| format!("{:.0}", r[round].requests_per_s * c.descriptors as f64))
            .collect();
        println!("| {} | {} |", round + 1, row.join(" | "));
    }

    // 2. Open loop at half of each cell's median rate.
    println!();
    println!(
        "Open loop at half of each cell's median rate, {} s each; latency from the time each request was due",
        open_seconds.as_secs_f64()
    );
    println!();
    println!("| store, protocol, descriptors | requests/s asked | requests/s made | p50 | p99 | p99.9 | max | service CPU µs/decision | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut p99_ms: Vec<f64> = Vec::new();
    for (cell, &rps) in cells.iter().zip(&best) {
        let pids = pids(&cell.target, redis_pid);
        let rate = rps / 2.0;
        let m = runtime.block_on(async {
            let conns = Conn::open(&cell.target, cell.protocol, tasks, grpc_conns)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", cell.label()));
            open_loop(conns, requests_of(cell), rate, open_seconds, &pids).await
        });
        failures += m.errors;
        p99_ms.push(m.latencies.at(0.99) / 1000.0);
        println!(
            "| {} | {:.0} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} | {} |",
            cell.label(),
            rate,
            m.requests_per_s,
            m.latencies.at(0.5) / 1000.0,
            m.latencies.at(0.99) / 1000.0,
            m.latencies.at(0.999) / 1000.0,
            m.latencies.at(1.0) / 1000.0,
            m.cpu_us[0],
            m.errors
        );
        if m.latencies.at(0.5).is_nan() {
            failures += 1;
        }
    }

    // 3. The goals.
    println!();
    println!("| goal | {} |", {
        let mut heads = Vec::new();
        for shape in &shapes {
            for target in &targets {
                heads.push(format!("{}, {}", target.store, shape.descriptors));
            }
        }
        heads.join(" | ")
    });
    println!("|---|{}", "---|".repeat(shapes.len() * targets.len()));
    let find = |store: &str, protocol: Protocol, descriptors: usize| {
        cells
            .iter()
            .position(|c| {
                c.target.store == store && c.protocol == protocol && c.descriptors == descriptors
            })
            .expect("every cell measured")
    };
    let mut grpc_http = Vec::new();
    let mut redis_memory = Vec::new();
    let mut p99 = Vec::new();
    for shape in &shapes {
        for target in &targets {
            let g = find(&target.store, Protocol::Grpc, shape.descriptors);
            let h = find(&target.store, Protocol::Http, shape.descriptors);
            grpc_http.push(format!("{:.2}", best[g] / best[h]));
            redis_memory.push(if target.store.eq_ignore_ascii_case("memory") {
                "–".to_string()
            } else {
                cells
                    .iter()
                    .position(|c| {
                        c.target.store == "memory"
                            && c.protocol == Protocol::Grpc
                            && c.descriptors == shape.descriptors
                    })
                    .map_or("–".to_string(), |m| format!("{:.2}", best[g] / best[m]))
            });
            p99.push(format!("{:.2} ms", p99_ms[g]));
        }
    }
    println!(
        "| gRPC / HTTP JSON, decisions/s (≥ 1.0) | {} |",
        grpc_http.join(" | ")
    );
    println!(
        "| gRPC on Redis / on memory, decisions/s (≥ 0.7) | {} |",
        redis_memory.join(" | ")
    );
    println!(
        "| gRPC p99 at half the most (≤ 2 ms) | {} |",
        p99.join(" | ")
    );
    if failures > 0 {
        eprintln!("{failures} requests failed");
        std::process::exit(1);
    }
}

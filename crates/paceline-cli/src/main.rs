//! `paceline`: the command-line front end.
//!
//! * `paceline serve`: the HTTP service (see the `paceline-server` crate).
//! * `paceline simulate`: replay a traffic script through a policy on a virtual clock.
//! * `paceline queue`: a job queue kept in Redis: its counts, jobs and dead set.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use paceline_store::{open, Clock, FailurePolicy, ManualClock, Policy, StoreOptions, SystemClock};
use std::sync::Arc;

mod allocator;
mod plot;
mod proxy;
mod queue_admin;
mod serve;
mod simulate;
mod simulate_queue;

/// Distributed rate limiting and pacing: may I act now, and if not, when?
#[derive(Parser, Debug)]
#[command(name = "paceline", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve pacing and rate-limit decisions over HTTP (JSON API, Prometheus metrics).
    ///
    /// With no arguments: the in-memory store, inline policy specs allowed, listening on
    /// 127.0.0.1:7373. Every flag can also be set in the --config file (TOML); flags win.
    /// SIGHUP (or POST /v1/reload) re-reads the file; SIGTERM/SIGINT stop after in-flight
    /// requests finish (within --shutdown-timeout).
    Serve(ServeArgs),
    /// A rate-limiting reverse proxy in front of an API whose limits come in response
    /// headers (Discord, IETF RateLimit, GitHub, Retry-After): requests wait for their
    /// bucket and the global limit, one pioneer learns an unknown bucket, 429s are waited
    /// out and the request sent again. Limits are kept per Authorization header value.
    ///
    /// A request that cannot be sent within --max-wait is answered 429 with Retry-After
    /// and `x-paceline-proxy: wait-exceeded`. SIGTERM/SIGINT stop after in-flight
    /// requests finish.
    Proxy(proxy::ProxyArgs),
    /// Replay a traffic script (JSON Lines) through a policy on a virtual clock and print
    /// one decision per request; or, with --queue, a job-queue script through a queue whose
    /// groups that policy limits, printing one line per event.
    ///
    /// With --policy, each input line is one of:
    ///   {"sleep_ms": 200}             advance the virtual clock
    ///   {"at_ms": 1500}               set the virtual clock (never backwards)
    ///   {"key": "k", "op": "pace", "cost": 1, "max_wait_ms": 200, "policy": "SPEC"}
    ///                                 a request; op: pace (default), limit, acquire,
    ///                                 peek, reset; every field optional
    /// With --queue, sleep_ms and at_ms lines, and:
    ///   {"op": "enqueue", "group": "g", "count": 1, "id": "x", "delay_ms": 0,
    ///    "max_attempts": 5, "payload": ...}     add jobs; prints each estimated start
    ///   {"op": "lease", "worker": "w", "max_jobs": 1, "lease_ms": 30000}
    ///                                 start what the groups' policies allow now
    ///   {"op": "ack", "id": "x"}      acknowledge a job the script leased
    ///   {"op": "fail", "id": "x", "retry_after_ms": 1000 | "pause_group_ms": 10000
    ///    | "fatal": true, "error": "..."}        fail it (no option: the backoff)
    ///   {"op": "crash", "id": "x"}    its worker dies: the job returns when the lease ends
    ///   {"op": "run", "until_ms": 60000}        workers that start every job as soon as
    ///                                 its group allows and ack it, until none is left
    ///   {"op": "stats"}               the counts, by state and group
    /// Blank lines and lines starting with # are skipped. The clock starts at 0 ms, the
    /// Unix epoch, so aligned windows start at 0.
    ///
    /// Exit codes: 0 done; 1 a file cannot be read or written; 2 invalid input (a line,
    /// --policy, --queue or --store); 3 the store failed (unreachable, or failing during
    /// the run).
    #[command(verbatim_doc_comment)]
    Simulate {
        /// The policy for requests that name none, e.g. `gcra:rate=10/s,burst=5`.
        #[arg(
            long,
            value_name = "SPEC",
            required_unless_present = "queue",
            conflicts_with = "queue"
        )]
        policy: Option<String>,
        /// Run a job-queue script: each group of the queue is limited by SPEC, e.g.
        /// `fixed_window:limit=10,window=10s`.
        #[arg(long, value_name = "SPEC")]
        queue: Option<String>,
        /// With --queue: at most N jobs of one group leased at once (0: no cap).
        #[arg(long, value_name = "N", requires = "queue")]
        group_concurrency: Option<u32>,
        /// With --queue: the starts a job may have before it goes to the dead set.
        #[arg(long, value_name = "N", requires = "queue")]
        max_attempts: Option<u32>,
        /// With --queue: how long a lease lasts (default 30s).
        #[arg(long, value_name = "DURATION", requires = "queue")]
        lease: Option<String>,
        /// With --queue: a limit over every group's starts, e.g. `gcra:rate=50/s`.
        #[arg(long, value_name = "SPEC", requires = "queue")]
        queue_policy: Option<String>,
        /// With --queue: at most N jobs of the whole queue leased at once (0: no cap).
        #[arg(long, value_name = "N", requires = "queue")]
        queue_concurrency: Option<u32>,
        /// Read the script from FILE instead of standard input.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
        /// Write the decisions to FILE instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Also draw what the policy did to FILE (`.svg` or `.png`): per key, each request
        /// (admitted at once, after a delay from arrival to slot, rejected), the admitted
        /// cost against the policy's allowance, and the delays' distribution.
        #[arg(long, value_name = "FILE", conflicts_with = "queue")]
        plot: Option<PathBuf>,
        /// Run the same traffic through SPEC too (repeat for more, up to 7), and print a
        /// table (admitted, rejected, delay p50/p99/max, longest burst) instead of the
        /// decisions; with --plot, the policies are drawn side by side. Lines that name a
        /// policy of their own keep it.
        #[arg(long, value_name = "SPEC", conflicts_with = "queue")]
        compare: Vec<String>,
        /// Where keys' state lives: `memory`, `redis://HOST:PORT[/DB]` (or `rediss://` for
        /// TLS) or `redis-cluster://HOST:PORT[,HOST:PORT...]`. Every store reads the same
        /// virtual clock and gives the same output; on Redis the run uses keys of its own
        /// and deletes them at the end. Queue scripts run in memory.
        #[arg(long, value_name = "STORE", default_value = "memory")]
        store: String,
    },
    /// See and repair a job queue kept in Redis (shared by `paceline serve` instances and
    /// programs), with the configuration they set: its counts, its jobs, its dead set.
    /// Output is JSON, one object per line, as the HTTP API shows it. `stats`, `retry-dead`
    /// and `purge-dead` do the queue's upkeep first, as every call on it does (expired
    /// leases back to their groups, due jobs into their lines); `jobs` and `dead` only read.
    ///
    /// Exit codes: 0 done; 1 a job named is unknown (`jobs`); 2 invalid input (the URL,
    /// the queue name, a queue the store does not hold); 3 the store failed.
    Queue {
        #[command(subcommand)]
        action: queue_admin::Action,
    },
}

/// `paceline serve`'s flags.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Listen on ADDR:PORT (default 127.0.0.1:7373).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// Read settings and named policies from FILE (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where keys' state lives: memory (default), redis://HOST:PORT[/DB],
    /// rediss://..., or redis-cluster://HOST:PORT[,HOST:PORT...].
    #[arg(long, value_name = "STORE")]
    store: Option<String>,
    /// What a Redis store does when Redis fails: fail_closed (503), fail_open, local.
    #[arg(long, value_name = "POLICY")]
    failure_policy: Option<String>,
    /// Redis: coalesce concurrent decisions into one call per node, each waiting at most
    /// LINGER for others (default 0ms: only those already waiting), or `off`.
    #[arg(long, value_name = "LINGER|off")]
    redis_auto_batch: Option<String>,
    /// A request's headers must arrive within this (default 10s); it also bounds how long
    /// a connection may stay idle.
    #[arg(long, value_name = "DURATION")]
    header_read_timeout: Option<String>,
    /// A request's body must arrive within this once its headers have (default 10s; else
    /// 408).
    #[arg(long, value_name = "DURATION")]
    body_read_timeout: Option<String>,
    /// Close kept-alive connections idle this long (default 5s).
    #[arg(long, value_name = "DURATION")]
    idle_timeout: Option<String>,
    /// Serve at most N connections at once (default 2048); more wait to be accepted.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// On SIGTERM/SIGINT, give requests in flight this long to finish (default 10s).
    #[arg(long, value_name = "DURATION")]
    shutdown_timeout: Option<String>,
    /// Require `Authorization: Bearer TOKEN` on /v1/ endpoints.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "PACELINE_AUTH_TOKEN",
        hide_env_values = true
    )]
    auth_token: Option<String>,
    /// Accept spec strings ("gcra:rate=10/s") as a request's `policy`.
    #[arg(long, overrides_with = "no_allow_inline_policies")]
    allow_inline_policies: bool,
    /// Accept only configured policy names.
    #[arg(long, overrides_with = "allow_inline_policies")]
    no_allow_inline_policies: bool,
    /// Serve Envoy's rate limit service (RLS v3 gRPC) on ADDR:PORT; needs --rls-config.
    #[arg(long, value_name = "ADDR:PORT")]
    rls_listen: Option<std::net::SocketAddr>,
    /// Envoy rate limit rules in envoyproxy/ratelimit's YAML format: a file, or a folder of
    /// .yaml/.yml files. Served over gRPC with --rls-listen, and on POST /json.
    #[arg(long, value_name = "PATH")]
    rls_config: Option<PathBuf>,
    /// Log format: text (default) or json.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            allocator::spawn_trimmer();
            serve::run(args)
        }
        Command::Proxy(args) => {
            allocator::spawn_trimmer();
            proxy::run(args)
        }
        Command::Queue { action } => queue_admin::run(action),
        Command::Simulate {
            policy,
            queue,
            group_concurrency,
            max_attempts,
            lease,
            queue_policy,
            queue_concurrency,
            input,
            output,
            plot,
            compare,
            store,
        } => match (policy, queue) {
            (_, Some(spec)) => {
                let options = QueueOptions {
                    group_concurrency,
                    max_attempts,
                    lease,
                    queue_policy,
                    queue_concurrency,
                };
                run_simulate_queue(&spec, &options, input, output, &store)
            }
            (Some(policy), None) => {
                let files = Files {
                    input,
                    output,
                    plot,
                };
                run_simulate(&policy, &compare, &files, &store)
            }
            (None, None) => {
                eprintln!("error: give --policy SPEC, or --queue SPEC for a queue script");
                ExitCode::from(2)
            }
        },
    }
}

/// The exit code of `paceline simulate` when the store fails (cannot be reached, or fails
/// during the run): neither bad input (2) nor a file that cannot be read or written (1).
const EXIT_STORE_FAILED: u8 = 3;

/// Runs the script on the store named by `--store`; on failure the message is printed and
/// the exit code returned.
async fn simulate_on(
    store: &str,
    policy: Policy,
    script: &str,
) -> Result<Vec<simulate::Outcome>, ExitCode> {
    let clock = ManualClock::new(0);
    // A prefix of this run's own (Redis), so runs never see each other's keys.
    let run_id = format!(
        "paceline-simulate-{}-{}",
        std::process::id(),
        SystemClock::new().now_micros()
    );
    let options = StoreOptions::new()
        .failure_policy(FailurePolicy::FailClosed)
        .prefix(run_id)
        .clock(Arc::new(clock.clone()));
    let store = match open(store, &options).await {
        Ok(store) => store,
        Err(paceline_store::Error::Input(e)) => {
            eprintln!("error: invalid `--store`: {}", e.message());
            return Err(ExitCode::from(2));
        }
        Err(e) => {
            eprintln!("error: --store: the store failed: {e}");
            return Err(ExitCode::from(EXIT_STORE_FAILED));
        }
    };
    simulate::run_on(policy, script, store, &clock)
        .await
        .map_err(|e| {
            eprintln!("error: {e}");
            match e.kind {
                simulate::Failure::Input => ExitCode::from(2),
                simulate::Failure::Store => ExitCode::from(EXIT_STORE_FAILED),
            }
        })
}

/// The most `--compare` policies one run takes (with `--policy`, the rows a plot holds).
const MAX_COMPARE: usize = plot::MAX_ROWS - 1;

/// The files of `paceline simulate`.
struct Files {
    input: Option<PathBuf>,
    output: Option<PathBuf>,
    plot: Option<PathBuf>,
}

fn run_simulate(policy: &str, compare: &[String], files: &Files, store: &str) -> ExitCode {
    // Each policy with its label: the spec as the user wrote it.
    let mut policies: Vec<(String, Policy)> = Vec::with_capacity(1 + compare.len());
    match policy.parse() {
        Ok(p) => policies.push((policy.trim().to_string(), p)),
        Err(e) => {
            eprintln!("error: --policy: {e}");
            return ExitCode::from(2);
        }
    }
    if compare.len() > MAX_COMPARE {
        eprintln!(
            "error: --compare: {} policies given; compare at most {MAX_COMPARE} with --policy",
            compare.len()
        );
        return ExitCode::from(2);
    }
    for spec in compare {
        match spec.parse() {
            Ok(p) => policies.push((spec.trim().to_string(), p)),
            Err(e) => {
                eprintln!("error: --compare `{spec}`: {e}");
                return ExitCode::from(2);
            }
        }
    }
    // A plot the run could not write is refused before the run.
    if let Some(Err(e)) = files.plot.as_deref().map(plot::format_of) {
        eprintln!("error: --plot: {e}");
        return ExitCode::from(1);
    }
    let script = match read_script(files.input.as_ref()) {
        Ok(script) => script,
        Err(code) => return code,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let mut runs = Vec::with_capacity(policies.len());
    for (label, policy) in policies {
        match runtime.block_on(simulate_on(store, policy, &script)) {
            Ok(outcomes) => runs.push((label, outcomes)),
            Err(code) => return code,
        }
    }
    if let Some(path) = &files.plot {
        let drawn: Vec<plot::Run<'_>> = runs
            .iter()
            .map(|(label, outcomes)| plot::Run {
                label: label.clone(),
                outcomes,
            })
            .collect();
        if let Err(e) = plot::draw(path, &drawn) {
            eprintln!("error: --plot: {e}");
            return ExitCode::from(1);
        }
    }
    let text = if compare.is_empty() {
        match simulate::to_json_lines(&runs[0].1) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        let summaries: Vec<(String, plot::Summary)> = runs
            .iter()
            .map(|(label, outcomes)| (label.clone(), plot::summarize(outcomes)))
            .collect();
        plot::table(&summaries)
    };
    write_output(files.output.as_ref(), &text)
}

/// A single-threaded async runtime for a command; on failure the message is printed and
/// the exit code returned.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(1)
        })
}

/// `paceline simulate --queue`'s settings of the queue.
struct QueueOptions {
    group_concurrency: Option<u32>,
    max_attempts: Option<u32>,
    lease: Option<String>,
    queue_policy: Option<String>,
    queue_concurrency: Option<u32>,
}

fn run_simulate_queue(
    spec: &str,
    options: &QueueOptions,
    input: Option<PathBuf>,
    output: Option<PathBuf>,
    store: &str,
) -> ExitCode {
    if store != "memory" {
        eprintln!("error: --store: queue scripts run on the in-memory queue; leave --store out");
        return ExitCode::from(2);
    }
    let policy: Policy = match spec.parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --queue: {e}");
            return ExitCode::from(2);
        }
    };
    let mut config = paceline_queue::QueueConfig::new(policy);
    config.group_concurrency = options.group_concurrency.unwrap_or(0);
    config.queue_concurrency = options.queue_concurrency.unwrap_or(0);
    if let Some(spec) = &options.queue_policy {
        match spec.parse() {
            Ok(p) => config.queue_policy = Some(p),
            Err(e) => {
                eprintln!("error: --queue-policy: {e}");
                return ExitCode::from(2);
            }
        }
    }
    config.max_attempts = options.max_attempts.unwrap_or(config.max_attempts);
    if let Some(lease) = &options.lease {
        match paceline_store::spec::parse_duration("lease", lease) {
            Ok(us) => config.lease = std::time::Duration::from_micros(us),
            Err(e) => {
                eprintln!("error: --lease: {}", e.message());
                return ExitCode::from(2);
            }
        }
    }
    let script = match read_script(input.as_ref()) {
        Ok(script) => script,
        Err(code) => return code,
    };
    match simulate_queue::run(config, &script) {
        Ok(out) => write_output(output.as_ref(), &out),
        Err(e) if e.line == 0 => {
            eprintln!("error: --queue: invalid `{}`: {}", e.field, e.message);
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The script, from FILE or standard input (exit code 1 if unreadable, 2 if not UTF-8).
fn read_script(input: Option<&PathBuf>) -> Result<String, ExitCode> {
    let mut bytes = Vec::new();
    let read = match input {
        Some(path) => File::open(path).and_then(|f| BufReader::new(f).read_to_end(&mut bytes)),
        None => io::stdin().read_to_end(&mut bytes),
    };
    if let Err(e) = read {
        let source = input.map_or("standard input".to_string(), |p| p.display().to_string());
        eprintln!("error: cannot read {source}: {e}");
        return Err(ExitCode::from(1));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
        eprintln!("error: line {line}: invalid `json`: the line is not UTF-8 text");
        ExitCode::from(2)
    })
}

/// Writes the output to FILE or standard output (exit code 1 if it cannot).
fn write_output(output: Option<&PathBuf>, text: &str) -> ExitCode {
    let written = match output {
        Some(path) => std::fs::write(path, text.as_bytes()),
        None => io::stdout().lock().write_all(text.as_bytes()),
    };
    if let Err(e) = written {
        let target = output.map_or("standard output".to_string(), |p| p.display().to_string());
        eprintln!("error: cannot write {target}: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

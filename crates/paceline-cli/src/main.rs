//! `paceline`: the command-line front end.
//!
//! * `paceline serve`: the HTTP service (see the `paceline-server` crate).
//! * `paceline simulate`: replay a traffic script through a policy on a virtual clock.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use paceline_store::{open, Clock, FailurePolicy, ManualClock, Policy, StoreOptions, SystemClock};
use std::sync::Arc;

mod serve;
mod simulate;

/// The service allocates a few small buffers per request on every core; mimalloc's
/// per-thread free lists serve them without the locking and consolidation of glibc's
/// allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Replay a traffic script (JSON Lines) through a policy on a virtual clock and print
    /// one decision per request.
    ///
    /// Each input line is one of:
    ///   {"sleep_ms": 200}             advance the virtual clock
    ///   {"at_ms": 1500}               set the virtual clock (never backwards)
    ///   {"key": "k", "op": "pace", "cost": 1, "max_wait_ms": 200, "policy": "SPEC"}
    ///                                 a request; op: pace (default), limit, acquire,
    ///                                 peek, reset; every field optional
    /// Blank lines and lines starting with # are skipped. The clock starts at 0 ms, the
    /// Unix epoch, so aligned windows start at 0.
    ///
    /// Exit codes: 0 done; 1 a file cannot be read or written; 2 invalid input (a line,
    /// --policy or --store); 3 the store failed (unreachable, or failing during the run).
    #[command(verbatim_doc_comment)]
    Simulate {
        /// The policy for requests that name none, e.g. `gcra:rate=10/s,burst=5`.
        #[arg(long, value_name = "SPEC")]
        policy: String,
        /// Read the script from FILE instead of standard input.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
        /// Write the decisions to FILE instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Where keys' state lives: `memory`, `redis://HOST:PORT[/DB]` (or `rediss://` for
        /// TLS) or `redis-cluster://HOST:PORT[,HOST:PORT...]`. Every store reads the same
        /// virtual clock and gives the same output; on Redis the run uses keys of its own
        /// and deletes them at the end.
        #[arg(long, value_name = "STORE", default_value = "memory")]
        store: String,
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
    /// Log format: text (default) or json.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Simulate {
            policy,
            input,
            output,
            store,
        } => run_simulate(&policy, input, output, &store),
    }
}

/// The exit code of `paceline simulate` when the store fails (cannot be reached, or fails
/// during the run): neither bad input (2) nor a file that cannot be read or written (1).
const EXIT_STORE_FAILED: u8 = 3;

/// Runs the script on the store named by `--store`; on failure the message is printed and
/// the exit code returned.
async fn simulate_on(store: &str, policy: Policy, script: &str) -> Result<String, ExitCode> {
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

fn run_simulate(
    policy: &str,
    input: Option<PathBuf>,
    output: Option<PathBuf>,
    store: &str,
) -> ExitCode {
    let policy: Policy = match policy.parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --policy: {e}");
            return ExitCode::from(2);
        }
    };
    let mut bytes = Vec::new();
    let read = match &input {
        Some(path) => File::open(path).and_then(|f| BufReader::new(f).read_to_end(&mut bytes)),
        None => io::stdin().read_to_end(&mut bytes),
    };
    if let Err(e) = read {
        let source = input
            .as_ref()
            .map_or("standard input".to_string(), |p| p.display().to_string());
        eprintln!("error: cannot read {source}: {e}");
        return ExitCode::from(1);
    }
    let script = match String::from_utf8(bytes) {
        Ok(script) => script,
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
            eprintln!("error: line {line}: invalid `json`: the line is not UTF-8 text");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let decisions = match runtime.block_on(simulate_on(store, policy, &script)) {
        Ok(out) => out,
        Err(code) => return code,
    };
    let written = match &output {
        Some(path) => std::fs::write(path, decisions.as_bytes()),
        None => io::stdout().lock().write_all(decisions.as_bytes()),
    };
    if let Err(e) = written {
        let target = output
            .as_ref()
            .map_or("standard output".to_string(), |p| p.display().to_string());
        eprintln!("error: cannot write {target}: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

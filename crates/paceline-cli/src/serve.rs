//! `paceline serve`: settings from the config file and flags, then the HTTP service (and,
//! with `--rls-listen`, Envoy's rate limit service over gRPC) until SIGTERM or SIGINT.

use std::process::ExitCode;

use paceline_server::{config, ConfigError, Server, ServerError, Settings};

use crate::ServeArgs;

/// Merges the config file and the flags (flags win) into settings.
fn settings(args: &ServeArgs) -> Result<Settings, ConfigError> {
    let flag = |field: &str, message: String| ConfigError {
        source: "command line".into(),
        field: field.into(),
        message,
    };
    let mut s = Settings::default();
    // What a reload can change: the flags are kept, so that they win at every reload.
    if let Some(v) = &args.auth_token {
        if v.is_empty() {
            return Err(flag("--auth-token", "must not be empty".into()));
        }
        s.flags.auth_token = Some(v.clone());
    }
    if args.allow_inline_policies {
        s.flags.allow_inline_policies = Some(true);
    }
    if args.no_allow_inline_policies {
        s.flags.allow_inline_policies = Some(false);
    }
    match &args.config {
        Some(path) => {
            s.apply_file(config::read_file(path)?);
            s.config_file = Some(path.clone());
        }
        None => s.apply_live(config::FileSettings::default()),
    }
    if let Some(v) = args.listen {
        s.listen = v;
    }
    if let Some(v) = &args.store {
        s.store = v.clone();
    }
    if let Some(v) = &args.failure_policy {
        s.failure_policy = v.parse().map_err(|e: paceline_store::InputError| {
            flag("--failure-policy", e.message().to_string())
        })?;
    }
    if let Some(v) = &args.redis_auto_batch {
        s.redis_auto_batch =
            config::parse_auto_batch(v).map_err(|m| flag("--redis-auto-batch", m))?;
    }
    let c = &mut s.connections;
    for (name, value, target) in [
        (
            "--header-read-timeout",
            &args.header_read_timeout,
            &mut c.header_read_timeout,
        ),
        (
            "--body-read-timeout",
            &args.body_read_timeout,
            &mut c.body_read_timeout,
        ),
        ("--idle-timeout", &args.idle_timeout, &mut c.idle_timeout),
        (
            "--shutdown-timeout",
            &args.shutdown_timeout,
            &mut c.shutdown_timeout,
        ),
    ] {
        if let Some(v) = value {
            *target = config::parse_timeout(name, v).map_err(|m| flag(name, m))?;
        }
    }
    if let Some(n) = args.max_connections {
        if !(1..=config::MAX_CONNECTIONS).contains(&n) {
            return Err(flag(
                "--max-connections",
                format!("must be from 1 to {}", config::MAX_CONNECTIONS),
            ));
        }
        c.max_connections = n;
    }
    if let Some(v) = args.rls_listen {
        s.rls.listen = Some(v);
    }
    if let Some(v) = &args.rls_config {
        s.rls.config = Some(v.clone());
    }
    match &s.rls.config {
        // The rules are read here too, so that a bad file is a bad config: exit 2, naming
        // the file, the line and the field.
        Some(path) => {
            paceline_server::rls::load(path)?;
        }
        None if s.rls.listen.is_some() => {
            return Err(flag(
                "--rls-listen",
                "serves RLS rules: give them with --rls-config PATH (or [rls] config)".into(),
            ));
        }
        None => {}
    }
    if !matches!(args.log_format.as_str(), "text" | "json") {
        return Err(flag(
            "--log-format",
            format!("`{}`: use text or json", args.log_format),
        ));
    }
    Ok(s)
}

pub(crate) fn run(args: ServeArgs) -> ExitCode {
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let json_logs = args.log_format == "json";
    init_logs(json_logs);
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        // The handlers are in place before the port is bound: a signal sent as soon as the
        // service answers is never met by the default action (ending the process at once).
        let shutdown = stop_signal();
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let policies = settings.policies.len();
        let rls_config = settings.rls.config.clone();
        let server = match Server::bind(settings).await {
            Ok(server) => server,
            Err(e) => {
                eprintln!("error: {e}");
                // A malformed store URL is bad input, like a bad config; an unreachable
                // store or a taken port is not.
                let bad_input = matches!(e, ServerError::Store(paceline_store::Error::Input(_)));
                return ExitCode::from(if bad_input { 2 } else { 1 });
            }
        };
        log(&format!(
            "listening on http://{} (store: {}, {policies} configured policies)",
            server.local_addr(),
            server.store_description()
        ));
        if let Some(path) = &rls_config {
            match server.rls_addr() {
                Some(addr) => log(&format!(
                    "RLS (Envoy's rate limit service) listening on grpc://{addr} and POST /json, rules from {}",
                    path.display()
                )),
                None => log(&format!(
                    "RLS (Envoy's rate limit service) on POST /json only (no --rls-listen), rules from {}",
                    path.display()
                )),
            }
        }
        let reloader = server.reloader();
        if let Some(mut hangups) = hangups {
            tokio::spawn(async move {
                // The service logs each reload: at INFO, or at WARN when the file is refused.
                while hangups.recv().await.is_some() {
                    let _ = reloader.reload();
                }
            });
        }
        match server.run(shutdown).await {
            Ok(()) => {
                log("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        }
    })
}

/// The multi-threaded runtime a service runs on, or the exit code to leave with.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(1)
        })
}

/// A future that completes on SIGTERM or SIGINT, having logged that the service is
/// stopping. The handlers are installed when this is called, not when the future is first
/// polled, so call it before the service starts answering (must run inside the runtime).
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        let term = async {
            match terminate.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let int = async {
            match interrupt.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = term => {}
            _ = int => {}
        }
        log("shutting down: finishing in-flight requests");
    }
}

/// Logs through `tracing` (set up by [`init_logs`]).
pub(crate) fn log(message: &str) {
    tracing::info!(target: "paceline", "{message}");
}

/// Structured logs on standard error: human-readable text, or one JSON object per line.
pub(crate) fn init_logs(json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(true)
        .with_ansi(false);
    // A second initialisation (never in this binary) would fail harmlessly.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

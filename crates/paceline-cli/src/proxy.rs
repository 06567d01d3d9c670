//! `paceline proxy`: the rate-limiting reverse proxy (see `paceline_server::proxy`) until
//! SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use paceline_core::spec::parse_duration;
use paceline_server::proxy::{Proxy, ProxySettings};

use crate::serve::{init_logs, log, runtime, stop_signal};

/// `paceline proxy`'s flags.
#[derive(clap::Args, Debug)]
pub(crate) struct ProxyArgs {
    /// The API to forward to: http:// or https://, with an optional base path.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// Where clients connect.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Where what the proxy learns of the limits is kept: `memory` (this proxy alone), or
    /// redis://HOST:PORT[/DB], rediss://HOST:PORT (TLS), redis-cluster://HOST:PORT[,...]:
    /// shared by every proxy pointed at it, so that together they keep each token's limits.
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// How responses state their limits: discord, ietf, github, retry-after or auto.
    #[arg(long, value_name = "DIALECT", default_value = "auto")]
    dialect: String,
    /// A policy every request of a token is held to, e.g. `gcra:rate=50/s,burst=1`
    /// (Discord's global limit). Default with --dialect discord: that one; else none.
    #[arg(long, value_name = "SPEC")]
    global_limit: Option<String>,
    /// The longest a request may wait for its turn; beyond, it is answered 429 with
    /// Retry-After and `x-paceline-proxy: wait-exceeded`. Default: no limit.
    #[arg(long, value_name = "DURATION")]
    max_wait: Option<String>,
    /// The upstream's answer must start within this, else 504.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    upstream_timeout: String,
    /// The most distinct Authorization values whose limits are kept at once; beyond, new
    /// ones get 503 (an identity idle for 10 minutes is forgotten first).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    max_identities: usize,
    /// Where /healthz and /metrics are served (never on the proxied address).
    #[arg(long, value_name = "ADDR:PORT")]
    admin_listen: Option<SocketAddr>,
    /// Log format: text (default) or json.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: String,
}

/// The settings the flags say, or the flag at fault and what it allows.
fn settings(args: &ProxyArgs) -> Result<ProxySettings, String> {
    if !matches!(args.log_format.as_str(), "text" | "json") {
        return Err(format!(
            "--log-format: `{}`: use text or json",
            args.log_format
        ));
    }
    let upstream = reqwest::Url::parse(&args.upstream)
        .map_err(|e| format!("--upstream: `{}` is not a URL ({e})", args.upstream))?;
    let mut s = ProxySettings::new(upstream);
    s.store = args.store.clone();
    s.listen = args.listen;
    s.admin_listen = args.admin_listen;
    if args.max_identities == 0 {
        return Err("--max-identities: must be at least 1".into());
    }
    s.max_identities = args.max_identities;
    s.dialect = args.dialect.clone();
    let global = match (&args.global_limit, args.dialect.as_str()) {
        (Some(spec), _) => Some(spec.as_str()),
        (None, "discord") => Some("gcra:rate=50/s,burst=1"),
        (None, _) => None,
    };
    if let Some(spec) = global {
        s.global_limit = Some(
            spec.parse()
                .map_err(|e: paceline_core::InputError| format!("--global-limit: {e}"))?,
        );
    }
    if let Some(text) = &args.max_wait {
        let us =
            parse_duration("max_wait", text).map_err(|e| format!("--max-wait: {}", e.message()))?;
        s.max_wait = Some(Duration::from_micros(us));
    }
    let us = parse_duration("upstream_timeout", &args.upstream_timeout)
        .map_err(|e| format!("--upstream-timeout: {}", e.message()))?;
    s.upstream_timeout = Duration::from_micros(us);
    s.validate()
        .map_err(|e| format!("--{}: {}", e.field(), e.message()))?;
    Ok(s)
}

pub(crate) fn run(args: ProxyArgs) -> ExitCode {
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    init_logs(args.log_format == "json");
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let upstream = settings.upstream.clone();
        let store = paceline_store::without_credentials(settings.store.trim());
        let proxy = match Proxy::bind(settings).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        };
        log(&format!(
            "proxying http://{} to {upstream}, limits kept in {store}{}",
            proxy.local_addr(),
            proxy
                .admin_addr()
                .map(|a| format!(" (admin: http://{a}/healthz, /metrics)"))
                .unwrap_or_default()
        ));
        match proxy.run(stop_signal()).await {
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

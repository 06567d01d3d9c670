//! `paceline proxy`: the rate-limiting reverse proxy (see `paceline_server::proxy`) until
//! SIGTERM or SIGINT.

use std::process::ExitCode;
use std::time::Duration;

use paceline_core::spec::parse_duration;
use paceline_server::proxy::{Proxy, ProxySettings};

use crate::serve::{init_logs, log, runtime, stop_signal};

/// `paceline proxy`'s flags. Each may also come from `--config FILE` (TOML, the same names
/// with `_` for `-`); a flag given wins over the file.
#[derive(clap::Args, Debug)]
pub(crate) struct ProxyArgs {
    /// The API to forward to: http:// or https://, with an optional base path that every
    /// request stays below (a path that would leave it, or is ambiguous about it, gets 400);
    /// no query or fragment. `user:password@` is sent as basic authentication to requests
    /// without an Authorization header, and never printed.
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Where clients connect [default: 127.0.0.1:8081].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// Where what the proxy learns of the limits is kept: `memory` (this proxy alone), or
    /// redis://HOST:PORT[/DB], rediss://HOST:PORT (TLS), redis-cluster://HOST:PORT[,...]:
    /// shared by every proxy pointed at it, so that together they keep each token's limits
    /// [default: memory].
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// How responses state their limits: discord, ietf, github, retry-after or auto
    /// [default: auto].
    #[arg(long, value_name = "DIALECT")]
    dialect: Option<String>,
    /// A policy every request of a token is held to, e.g. `gcra:rate=50/s,burst=1`
    /// (Discord's global limit). Default with --dialect discord: that one; else none. Any
    /// algorithm but `concurrency` (refused: the proxy would take a lease for each request
    /// and never give it back).
    #[arg(long, value_name = "SPEC")]
    global_limit: Option<String>,
    /// With --dialect discord: learn each bot's own global limit from GET /gateway/bot
    /// when its token is first seen (a large bot's is above 50/s) [default: true]. Limits
    /// of given identities go in --config FILE's global_limits table.
    #[arg(long, value_name = "BOOL")]
    learn_global_limit: Option<bool>,
    /// The longest a request may wait for its turn; beyond, it is answered 429 with
    /// Retry-After and `x-paceline-proxy: wait-exceeded`. Default: no limit.
    #[arg(long, value_name = "DURATION")]
    max_wait: Option<String>,
    /// The upstream's answer must start within this, else 504 [default: 30s].
    #[arg(long, value_name = "DURATION")]
    upstream_timeout: Option<String>,
    /// The most distinct Authorization values whose limits are kept at once; beyond, new
    /// ones get 503 (an identity idle for 10 minutes is forgotten first) [default: 10000].
    #[arg(long, value_name = "N")]
    max_identities: Option<u64>,
    /// Where /healthz and /metrics are served (never on the proxied address).
    #[arg(long, value_name = "ADDR:PORT")]
    admin_listen: Option<String>,
    /// Log format: text or json [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// A TOML file with any of these settings, e.g. `upstream = "https://discord.com"`,
    /// `store = "redis://127.0.0.1:6379"`, `max_wait = "30s"`.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
}

/// `--config FILE`: the flags' settings in TOML.
#[derive(serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ProxyFile {
    upstream: Option<String>,
    listen: Option<String>,
    store: Option<String>,
    dialect: Option<String>,
    global_limit: Option<String>,
    learn_global_limit: Option<bool>,
    /// Global limits of given identities: `"discord:ID"` or `"sha256:HEX"` = a policy.
    global_limits: Option<std::collections::BTreeMap<String, String>>,
    max_wait: Option<String>,
    upstream_timeout: Option<String>,
    max_identities: Option<u64>,
    admin_listen: Option<String>,
    log_format: Option<String>,
}

/// A setting's value and where it came from, to name in an error: `--flag`, or the
/// file and the key.
struct Given<T> {
    value: T,
    origin: String,
}

impl<T> Given<T> {
    fn fail(&self, message: impl std::fmt::Display) -> String {
        format!("{}: {message}", self.origin)
    }
}

/// The settings the flags and the file say (flags win), whether logs are JSON; or the
/// flag or key at fault and what it allows.
fn settings(args: &ProxyArgs) -> Result<(ProxySettings, bool), String> {
    let (file, path) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--config: cannot read {}: {e}", path.display()))?;
            // The message and the line, never the line's text: it may hold a password.
            let file: ProxyFile = toml::from_str(&text).map_err(|e| {
                let line = e.span().map_or(String::new(), |span| {
                    let before = text.get(..span.start).unwrap_or_default();
                    format!(" line {}:", before.matches('\n').count() + 1)
                });
                format!(
                    "{}:{line} {}",
                    path.display(),
                    e.message().trim().replace('\n', " ")
                )
            })?;
            (file, path.display().to_string())
        }
        None => (ProxyFile::default(), String::new()),
    };
    fn pick<T: Clone>(
        flag: &Option<T>,
        file: Option<T>,
        name: &str,
        path: &str,
    ) -> Option<Given<T>> {
        match (flag, file) {
            (Some(v), _) => Some(Given {
                value: v.clone(),
                origin: format!("--{}", name.replace('_', "-")),
            }),
            (None, Some(v)) => Some(Given {
                value: v,
                origin: format!("{path}: `{name}`"),
            }),
            (None, None) => None,
        }
    }
    let text = |flag: &Option<String>, file: Option<String>, name: &str, default: &str| {
        pick(flag, file, name, &path).unwrap_or_else(|| Given {
            value: default.to_string(),
            origin: format!("--{}", name.replace('_', "-")),
        })
    };
    let log_format = text(&args.log_format, file.log_format, "log_format", "text");
    if !matches!(log_format.value.as_str(), "text" | "json") {
        return Err(log_format.fail(format!("`{}`: use text or json", log_format.value)));
    }
    let Some(upstream) = pick(&args.upstream, file.upstream, "upstream", &path) else {
        return Err(
            "--upstream: required: the API to forward to (or `upstream` in --config FILE)".into(),
        );
    };
    let url = reqwest::Url::parse(&upstream.value).map_err(|e| {
        upstream.fail(format!(
            "`{}` is not a URL ({e})",
            paceline_store::without_credentials(&upstream.value)
        ))
    })?;
    let mut s = ProxySettings::new(url);
    let store = text(&args.store, file.store, "store", "memory");
    s.store = store.value.clone();
    let listen = text(&args.listen, file.listen, "listen", "127.0.0.1:8081");
    s.listen = listen.value.parse().map_err(|_| {
        listen.fail(format!(
            "`{}` is not an address; use HOST:PORT, e.g. 127.0.0.1:8081",
            listen.value
        ))
    })?;
    if let Some(admin) = pick(&args.admin_listen, file.admin_listen, "admin_listen", &path) {
        s.admin_listen = Some(admin.value.parse().map_err(|_| {
            admin.fail(format!(
                "`{}` is not an address; use HOST:PORT, e.g. 127.0.0.1:8082",
                admin.value
            ))
        })?);
    }
    let max_identities = pick(
        &args.max_identities,
        file.max_identities,
        "max_identities",
        &path,
    )
    .unwrap_or(Given {
        value: 10_000,
        origin: "--max-identities".into(),
    });
    if max_identities.value == 0 {
        return Err(max_identities.fail("must be at least 1"));
    }
    s.max_identities = usize::try_from(max_identities.value).unwrap_or(usize::MAX);
    let dialect = text(&args.dialect, file.dialect, "dialect", "auto");
    s.dialect = dialect.value.clone();
    let global = pick(&args.global_limit, file.global_limit, "global_limit", &path).or_else(|| {
        (dialect.value == "discord").then(|| Given {
            value: "gcra:rate=50/s,burst=1".to_string(),
            origin: "--global-limit".into(),
        })
    });
    let global_origin = match &global {
        Some(spec) => spec.origin.clone(),
        None => "--global-limit".into(),
    };
    if let Some(spec) = global {
        s.global_limit = Some(
            spec.value
                .parse()
                .map_err(|e: paceline_core::InputError| spec.fail(e))?,
        );
    }
    if let Some(learn) = pick(
        &args.learn_global_limit,
        file.learn_global_limit,
        "learn_global_limit",
        &path,
    ) {
        s.learn_global_limit = learn.value;
    }
    for (key, spec) in file.global_limits.unwrap_or_default() {
        // The key is checked before it is named: a token put there by mistake is not
        // printed.
        paceline_server::proxy::check_identity_key(&key)
            .map_err(|e| format!("{path}: `global_limits`: {}", e.message()))?;
        let policy = spec.parse().map_err(|e: paceline_core::InputError| {
            format!("{path}: `global_limits.\"{key}\"`: {}", e.message())
        })?;
        s.global_limits.insert(key, policy);
    }
    if let Some(max_wait) = pick(&args.max_wait, file.max_wait, "max_wait", &path) {
        let us =
            parse_duration("max_wait", &max_wait.value).map_err(|e| max_wait.fail(e.message()))?;
        s.max_wait = Some(Duration::from_micros(us));
    }
    let timeout = text(
        &args.upstream_timeout,
        file.upstream_timeout,
        "upstream_timeout",
        "30s",
    );
    let us = parse_duration("upstream_timeout", &timeout.value)
        .map_err(|e| timeout.fail(e.message()))?;
    s.upstream_timeout = Duration::from_micros(us);
    s.validate().map_err(|e| {
        let origin = match e.field() {
            "store" => &store.origin,
            "dialect" => &dialect.origin,
            "global_limit" => &global_origin,
            "global_limits" => {
                return format!("{path}: `global_limits`: {}", e.message());
            }
            _ => &upstream.origin,
        };
        format!("{origin}: {}", e.message())
    })?;
    Ok((s, log_format.value == "json"))
}

pub(crate) fn run(args: ProxyArgs) -> ExitCode {
    let (settings, json) = match settings(&args) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    init_logs(json);
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        // Before the port is bound: see `stop_signal`.
        let shutdown = stop_signal();
        let upstream = settings.upstream_shown();
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
        match proxy.run(shutdown).await {
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

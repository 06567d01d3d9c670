//! The service's settings: a TOML file, overridden by command-line flags.
//!
//! ```toml
//! listen = "127.0.0.1:7373"
//! store = "redis://127.0.0.1:6379"   # or "memory" (default), or "redis-cluster://..."
//! failure_policy = "fail_closed"     # fail_closed | fail_open | local (Redis stores)
//! redis_auto_batch = "0ms"           # coalesce concurrent decisions (a linger), or "off"
//! header_read_timeout = "10s"        # a request's headers must arrive within this
//! body_read_timeout = "10s"          # and its body within this (408 otherwise)
//! idle_timeout = "5s"                # kept-alive connections idle this long are closed
//! max_connections = 2048             # open connections; more wait to be accepted
//! shutdown_timeout = "10s"           # on SIGTERM, in-flight requests get this long
//! allow_inline_policies = false      # accept spec strings as `policy` in requests
//! auth_token = "..."                 # or PACELINE_AUTH_TOKEN / --auth-token
//!
//! [policies.discord-roles]
//! algorithm = "fixed_window"
//! limit = 10
//! window = "10s"
//!
//! [policies.search]                                   # shadow mode: decided and counted,
//! spec = "gcra:rate=10/s,burst=10"                    # but always answered as admitted
//! shadow = true                                       # (not on `concurrency` policies)
//!
//! [queues.discord-roles]                              # a rate-limited job queue
//! group_policy = "fixed_window:limit=10,window=10s"   # each group's own limit
//! group_concurrency = 0                               # 0: no cap on leased jobs per group
//! # queue_policy = "gcra:rate=50/s"                   # a limit over every group's starts
//! queue_concurrency = 0                               # 0: no cap on leased jobs in the queue
//! max_attempts = 5
//! lease = "30s"
//! retry_backoff = "1s"                                # first retry; doubles, jittered, capped
//! retry_backoff_max = "1h"
//! max_payload = 1048576                               # bytes of a job's payload
//! max_jobs = 1000000                                  # jobs held; more are refused (503)
//! partitions = 1                                      # 1 to 64: groups spread over this many
//!                                                     # partitions (Redis Cluster primaries)
//! keep_completed = 0                                  # acked jobs kept readable: the latest N
//! # keep_completed_for = "1d"                         #   each for at most this long
//! # keep_dead = 10000                                 # dead jobs kept at most (none: all)
//! # keep_dead_for = "7d"                              #   each for at most this long
//!
//! [queues.discord-roles.groups."guild:1"]
//! policy = "fixed_window:limit=50,window=10s"         # one group's own override
//!
//! [queues.discord-roles.schedules.nightly-audit]      # a job at each tick of a cron
//! cron = "0 3 * * *"                                  # expression, once per tick across
//! group = "audit"                                     # every instance
//! payload = { kind = "roles" }
//! timezone = "Europe/Paris"
//!
//! [rls]                                               # Envoy's rate limit service
//! listen = "127.0.0.1:8081"                           # gRPC (RLS v3)
//! config = "rls"                                      # envoyproxy/ratelimit YAML rules
//! response_headers = false                            # RateLimit headers in the answers
//! ```

mod file;
mod values;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use paceline_queue::QueueConfig;
use paceline_store::{FailurePolicy, Policy};

pub(crate) use file::{check_policy_name, check_shadow};
pub use file::{parse, read_file, FileSettings, RlsFile};
pub use values::{parse_auto_batch, parse_timeout, ConfigError, MAX_CONNECTIONS};

/// The port `paceline serve` listens on when none is given.
pub const DEFAULT_PORT: u16 = 7373;

/// Everything the service runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// `memory`, `redis://...` or `redis-cluster://...`.
    pub store: String,
    /// What a Redis store does when Redis fails.
    pub failure_policy: FailurePolicy,
    /// Redis: coalesce concurrent decisions into one call per node, each waiting at most
    /// this long for others to join (`None`: one call per decision). Default: on, with no
    /// linger (batches form from the decisions already waiting, while earlier ones are in
    /// flight), since a service's normal load is many concurrent requests.
    pub redis_auto_batch: Option<Duration>,
    /// Connections: timeouts, the cap, and the shutdown deadline.
    pub connections: ConnectionLimits,
    /// Requests to `/v1/...` must carry `Authorization: Bearer TOKEN` when set.
    pub auth_token: Option<String>,
    /// Accept spec strings (`"gcra:rate=10/s"`) as the `policy` of a request.
    pub allow_inline_policies: bool,
    /// The named policies.
    pub policies: BTreeMap<String, Policy>,
    /// The named policies in shadow mode (`shadow = true`): each decision is made and
    /// counted as usual, but a refusal is answered as admitted (`"shadow": true` in the
    /// answer) and counted in `paceline_shadow_admitted_total`.
    pub shadow: BTreeSet<String>,
    /// The job queues, by name (read at start-up; a reload does not change them).
    pub queues: BTreeMap<String, QueueConfig>,
    /// The file the settings came from, if any (reloaded on SIGHUP).
    pub config_file: Option<PathBuf>,
    /// What the command line set of what a reload can change: it wins over the file, at
    /// start-up and at every reload.
    pub flags: LiveFlags,
    /// Envoy's rate limit service (`[rls]`, `--rls-listen`, `--rls-config`).
    pub rls: RlsSettings,
}

/// Envoy's rate limit service (RLS v3): where its gRPC listens, the envoyproxy/ratelimit
/// YAML rules it serves, and whether its answers carry `RateLimit` headers.
///
/// ```toml
/// [rls]
/// listen = "127.0.0.1:8081"       # gRPC (envoy.service.ratelimit.v3.RateLimitService)
/// config = "/etc/paceline/rls"    # a YAML file, or a folder of .yaml/.yml files
/// response_headers = false        # add RateLimit-Policy and RateLimit to the answers
/// ```
///
/// With `config` and no `listen`, the rules are served on the HTTP listener's `POST /json`
/// only; `listen` without `config` is refused at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsSettings {
    /// Where the gRPC service listens (`None`: no gRPC listener).
    pub listen: Option<SocketAddr>,
    /// The YAML file or folder of the rules (`None`: no RLS at all).
    pub config: Option<PathBuf>,
    /// Add `RateLimit-Policy` and `RateLimit` (IETF draft-11) to each answer's
    /// `response_headers_to_add`.
    pub response_headers: bool,
}

/// What one client may hold of the service: how long it may take to send a request, how
/// long an idle connection stays open, how many connections are served at once, and how
/// long a shutdown waits for requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request's headers must arrive within this, counted from when the connection may
    /// send one (its opening, or the end of the previous response); else it is closed.
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this once its headers have (else `408`).
    pub body_read_timeout: Duration,
    /// A connection with no request in flight and no bytes moving for this long is closed
    /// (at most `header_read_timeout`, which also bounds an idle connection).
    pub idle_timeout: Duration,
    /// At most this many connections are open; beyond, new ones wait in the listen queue
    /// until one closes.
    pub max_connections: usize,
    /// On SIGTERM or SIGINT: requests in flight get this long to finish, then every
    /// connection is closed.
    pub shutdown_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            max_connections: 2048,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// The settings a reload can change that were given on the command line (`None`: not
/// given). A reload takes each from here if given, else from the file, else the default, so
/// a flag keeps winning over the file and a setting removed from the file goes back to its
/// default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveFlags {
    /// `--auth-token`.
    pub auth_token: Option<String>,
    /// `--allow-inline-policies` / `--no-allow-inline-policies`.
    pub allow_inline_policies: Option<bool>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            store: "memory".to_string(),
            failure_policy: FailurePolicy::FailClosed,
            redis_auto_batch: Some(Duration::ZERO),
            connections: ConnectionLimits::default(),
            auth_token: None,
            allow_inline_policies: true,
            policies: BTreeMap::new(),
            shadow: BTreeSet::new(),
            queues: BTreeMap::new(),
            config_file: None,
            flags: LiveFlags::default(),
            rls: RlsSettings::default(),
        }
    }
}

impl Settings {
    /// Lays every setting `file` holds over these settings.
    pub fn apply_file(&mut self, mut file: FileSettings) {
        if let Some(v) = file.listen {
            self.listen = v;
        }
        if let Some(v) = file.store.take() {
            self.store = v;
        }
        if let Some(v) = file.failure_policy {
            self.failure_policy = v;
        }
        if let Some(v) = file.redis_auto_batch {
            self.redis_auto_batch = v;
        }
        let c = &mut self.connections;
        c.header_read_timeout = file.header_read_timeout.unwrap_or(c.header_read_timeout);
        c.body_read_timeout = file.body_read_timeout.unwrap_or(c.body_read_timeout);
        c.idle_timeout = file.idle_timeout.unwrap_or(c.idle_timeout);
        c.max_connections = file.max_connections.unwrap_or(c.max_connections);
        c.shutdown_timeout = file.shutdown_timeout.unwrap_or(c.shutdown_timeout);
        self.queues = std::mem::take(&mut file.queues);
        if let Some(rls) = file.rls.take() {
            if rls.listen.is_some() {
                self.rls.listen = rls.listen;
            }
            if rls.config.is_some() {
                self.rls.config = rls.config;
            }
            if let Some(headers) = rls.response_headers {
                self.rls.response_headers = headers;
            }
        }
        self.apply_live(file);
    }

    /// Sets what a reload can change from `file` under [`Settings::flags`]: the policies,
    /// and the token and the inline rule from the flags if given, else from the file, else
    /// their defaults.
    pub fn apply_live(&mut self, file: FileSettings) {
        let defaults = Settings::default();
        self.policies = file.policies;
        self.shadow = file.shadow;
        self.auth_token = self
            .flags
            .auth_token
            .clone()
            .or(file.auth_token)
            .or(defaults.auth_token);
        self.allow_inline_policies = self
            .flags
            .allow_inline_policies
            .or(file.allow_inline_policies)
            .unwrap_or(defaults.allow_inline_policies);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses() {
        let s = parse(
            "paceline.toml",
            r#"
listen = "127.0.0.1:9000"
store = "memory"
failure_policy = "local"
allow_inline_policies = false
auth_token = "t0ken"

[policies.discord-roles]
algorithm = "fixed_window"
limit = 10
window = "10s"

[policies.api]
algorithm = "gcra"
rate = "100/s"
burst = 20
"#,
        )
        .unwrap();
        assert_eq!(s.listen, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(s.failure_policy, Some(FailurePolicy::Local));
        assert_eq!(s.allow_inline_policies, Some(false));
        assert_eq!(
            s.policies["discord-roles"].to_string(),
            "fixed_window:limit=10,window=10s"
        );
        assert_eq!(s.policies["api"].limit(), 20);
        assert_eq!(s.redis_auto_batch, None);
    }

    #[test]
    fn connection_limits_have_defaults_and_keys() {
        let file = parse(
            "p.toml",
            "header_read_timeout = \"2s\"\nbody_read_timeout = \"3s\"\nidle_timeout = \"500ms\"\nmax_connections = 64\nshutdown_timeout = \"1s\"\n",
        )
        .unwrap();
        let mut settings = Settings::default();
        assert_eq!(settings.connections, ConnectionLimits::default());
        settings.apply_file(file);
        let c = settings.connections;
        assert_eq!(
            (c.header_read_timeout, c.body_read_timeout, c.idle_timeout),
            (
                Duration::from_secs(2),
                Duration::from_secs(3),
                Duration::from_millis(500)
            )
        );
        assert_eq!(
            (c.max_connections, c.shutdown_timeout),
            (64, Duration::from_secs(1))
        );
        for (text, field) in [
            ("max_connections = 0", "max_connections"),
            ("max_connections = \"many\"", "max_connections"),
            ("idle_timeout = \"0s\"", "idle_timeout"),
            ("shutdown_timeout = \"2h\"", "shutdown_timeout"),
            ("header_read_timeout = \"soon\"", "header_read_timeout"),
        ] {
            let e = parse("p.toml", text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {}", e.message);
        }
    }

    #[test]
    fn redis_auto_batch_is_a_linger_or_off() {
        let read = |text: &str| parse("p.toml", &format!("redis_auto_batch = \"{text}\""));
        assert_eq!(read("off").unwrap().redis_auto_batch, Some(None));
        assert_eq!(
            read("0ms").unwrap().redis_auto_batch,
            Some(Some(Duration::ZERO))
        );
        assert_eq!(
            read("250us").unwrap().redis_auto_batch,
            Some(Some(Duration::from_micros(250)))
        );
        for bad in ["1s", "soon", "-1ms"] {
            let e = read(bad).unwrap_err();
            assert_eq!(e.field, "redis_auto_batch", "{bad}");
            assert!(e.message.contains("off"), "{bad}: {}", e.message);
        }
        let mut settings = Settings::default();
        assert_eq!(settings.redis_auto_batch, Some(Duration::ZERO));
        settings.apply_file(read("off").unwrap());
        assert_eq!(settings.redis_auto_batch, None);
    }

    #[test]
    fn queues_are_tables_with_defaults_and_per_group_policies() {
        let file = parse(
            "p.toml",
            r#"
[queues.discord-roles]
group_policy = "fixed_window:limit=10,window=10s"
max_attempts = 3
lease = "20s"
partitions = 3

[queues.discord-roles.groups."guild:1"]
policy = "fixed_window:limit=50,window=10s"

[queues.emails]
group_policy = "gcra:rate=10/s"
queue_policy = "fixed_window:limit=50,window=1s"
queue_concurrency = 8
"#,
        )
        .unwrap();
        let q = &file.queues["discord-roles"];
        assert_eq!(q.partitions, 3);
        assert_eq!(
            file.queues["emails"].partitions, 1,
            "one partition by default"
        );
        assert_eq!(q.max_attempts, 3);
        assert_eq!(q.lease, Duration::from_secs(20));
        assert_eq!(q.retry_backoff, Duration::from_secs(1));
        assert_eq!(q.policy_of("guild:1").limit(), 50);
        assert_eq!(q.policy_of("guild:2").limit(), 10);
        let emails = &file.queues["emails"];
        assert_eq!(
            (
                emails.queue_policy.as_ref().map(|p| p.limit()),
                emails.queue_concurrency
            ),
            (Some(50), 8)
        );
        assert_eq!((q.queue_policy.is_none(), q.queue_concurrency), (true, 0));
        for (text, field) in [
            (
                "[queues.q]\ngroup_policy = \"exec_evenly:points=1,duration=1s\"",
                "queues.q.group_policy",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nlease = \"0s\"",
                "queues.q.lease",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nmax_attempts = 0",
                "queues.q.max_attempts",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\ncolour = 1",
                "queues.q.colour",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\npartitions = 0",
                "queues.q.partitions",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\npartitions = 65",
                "queues.q.partitions",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nqueue_policy = \"concurrency:limit=1,lease=1s\"",
                "queues.q.queue_policy",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nqueue_policy = \"gcra:rate=5/s\"\npartitions = 2",
                "queues.q.queue_policy",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nqueue_concurrency = -1",
                "queues.q.queue_concurrency",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\n[queues.q.schedules.s]\ncron = \"0 0 30 2 *\"\ngroup = \"g\"",
                "queues.q.schedules.s.cron",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\n[queues.q.schedules.s]\ncron = \"0 3 * * *\"\ngroup = \"g\"\ntimezone = \"Nowhere\"",
                "queues.q.schedules.s.timezone",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\n[queues.q.schedules.\"a b\"]\ncron = \"0 3 * * *\"\ngroup = \"g\"",
                "queues.q.schedules.a b.name",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nkeep_completed_for = \"1h\"",
                "queues.q.keep_completed_for",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nkeep_completed = 5\nkeep_completed_for = \"soon\"",
                "queues.q.keep_completed_for",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nkeep_dead = 0",
                "queues.q.keep_dead",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nkeep_dead_for = \"400d\"",
                "queues.q.keep_dead_for",
            ),
            (
                "[queues.q]\ngroup_policy = \"gcra:rate=1/s\"\nkeep_completed = -1",
                "queues.q.keep_completed",
            ),
            ("[queues.q]\nmax_attempts = 3", "queues.q"),
            (
                "[queues.\"a b\"]\ngroup_policy = \"gcra:rate=1/s\"",
                "queues.a b",
            ),
        ] {
            let e = parse("p.toml", text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {}", e.message);
        }
        let mut settings = Settings::default();
        settings.apply_file(file);
        assert_eq!(settings.queues.len(), 2);
    }

    #[test]
    fn shadow_mode_is_a_key_of_either_table_form() {
        let file = parse(
            "p.toml",
            r#"
[policies]
plain = "gcra:rate=1/s"
inline-table = { spec = "gcra:rate=2/s", shadow = true }

[policies.api]
spec = "gcra:rate=10/s,burst=10"
shadow = true

[policies.roles]
algorithm = "fixed_window"
limit = 10
window = "10s"
shadow = true

[policies.off]
spec = "gcra:rate=3/s"
shadow = false
"#,
        )
        .unwrap();
        assert_eq!(
            file.shadow.iter().map(String::as_str).collect::<Vec<_>>(),
            ["api", "inline-table", "roles"]
        );
        assert_eq!(file.policies["api"].to_string(), "gcra:rate=10/s,burst=10");
        assert_eq!(file.policies["roles"].limit(), 10);
        assert_eq!(file.policies.len(), 5);
        let mut settings = Settings::default();
        settings.apply_file(file);
        assert_eq!(settings.shadow.len(), 3);
        // A reload without shadow mode turns it off.
        settings.apply_live(parse("p.toml", "[policies]\napi = \"gcra:rate=1/s\"").unwrap());
        assert!(settings.shadow.is_empty());
        for (text, field, says) in [
            (
                "[policies.api]\nspec = \"gcra:rate=1/s\"\nshadow = \"yes\"",
                "policies.api.shadow",
                "true",
            ),
            (
                "[policies.api]\nalgorithm = \"gcra\"\nrate = \"1/s\"\nshadow = 1",
                "policies.api.shadow",
                "boolean",
            ),
            (
                "[policies.db]\nspec = \"concurrency:limit=2,lease=30s\"\nshadow = true",
                "policies.db.shadow",
                "concurrency",
            ),
            (
                "[policies.api]\nspec = \"gcra:rate=fast\"\nshadow = true",
                "policies.api.spec",
                "rate",
            ),
            ("[policies.api]\nspec = 5", "policies.api.spec", "string"),
            (
                "[policies.api]\nspec = \"gcra:rate=1/s\"\nburst = 2",
                "policies.api",
                "burst",
            ),
            (
                "[policies.api]\nalgorithm = \"gcra\"\nrate = \"1/s\"\nshadows = true",
                "policies.api",
                "shadows",
            ),
        ] {
            let e = parse("p.toml", text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {}", e.message);
            assert!(e.message.contains(says), "{text}: {}", e.message);
        }
        // A concurrency policy without shadow mode is fine.
        assert!(parse(
            "p.toml",
            "[policies.db]\nspec = \"concurrency:limit=2,lease=30s\"\nshadow = false"
        )
        .is_ok());
    }

    #[test]
    fn errors_name_the_file_the_policy_and_the_field() {
        let e = parse(
            "p.toml",
            "[policies.discord-roles]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"-1s\"\n",
        )
        .unwrap_err();
        assert_eq!(
            (e.source.as_str(), e.field.as_str()),
            ("p.toml", "policies.discord-roles")
        );
        assert!(e.message.contains("window"), "{e}");
        let e = parse("p.toml", "lissten = \"x\"").unwrap_err();
        assert_eq!(e.field, "lissten");
        assert!(e.message.contains("listen"));
        let e = parse("p.toml", "listen = \"nowhere\"").unwrap_err();
        assert!(e.message.contains("HOST:PORT"));
        let e = parse(
            "p.toml",
            "[policies.\"a b\"]\nalgorithm = \"gcra\"\nrate = \"1/s\"",
        )
        .unwrap_err();
        assert_eq!(e.field, "policies.a b");
        let e = parse("p.toml", "listen = ").unwrap_err();
        assert_eq!(e.field, "toml");
        let e = parse("p.toml", "failure_policy = \"sometimes\"").unwrap_err();
        assert!(e.message.contains("fail_closed"));
    }
}

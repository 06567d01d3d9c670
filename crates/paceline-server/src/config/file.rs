//! The config file: TOML read into [`FileSettings`], every value checked, each error naming
//! the file and the setting.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use paceline_queue::QueueConfig;
use paceline_store::{FailurePolicy, Policy};
use serde::Deserialize;

use super::values::{parse_auto_batch, parse_timeout, ConfigError, MAX_CONNECTIONS};

/// The settings a file holds; absent keys leave the defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileSettings {
    /// `listen`.
    pub listen: Option<SocketAddr>,
    /// `store`.
    pub store: Option<String>,
    /// `failure_policy`.
    pub failure_policy: Option<FailurePolicy>,
    /// `redis_auto_batch`: `Some(None)` for `"off"`.
    pub redis_auto_batch: Option<Option<Duration>>,
    /// `header_read_timeout`.
    pub header_read_timeout: Option<Duration>,
    /// `body_read_timeout`.
    pub body_read_timeout: Option<Duration>,
    /// `idle_timeout`.
    pub idle_timeout: Option<Duration>,
    /// `max_connections`.
    pub max_connections: Option<usize>,
    /// `shutdown_timeout`.
    pub shutdown_timeout: Option<Duration>,
    /// `auth_token`.
    pub auth_token: Option<String>,
    /// `allow_inline_policies`.
    pub allow_inline_policies: Option<bool>,
    /// `[policies.NAME]` tables.
    pub policies: BTreeMap<String, Policy>,
    /// The policies with `shadow = true`: decided and counted as usual, answered as
    /// admitted all the same.
    pub shadow: BTreeSet<String>,
    /// `[queues.NAME]` tables.
    pub queues: BTreeMap<String, QueueConfig>,
    /// The `[rls]` table.
    pub rls: Option<RlsFile>,
}

/// The `[rls]` table: Envoy's rate limit service (see [`super::RlsSettings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsFile {
    /// `listen`.
    pub listen: Option<SocketAddr>,
    /// `config`: relative to the config file's folder when relative.
    pub config: Option<PathBuf>,
    /// `response_headers`.
    pub response_headers: Option<bool>,
}

/// The longest policy name (it appears in URLs, metrics and keys).
const MAX_POLICY_NAME: usize = 128;

/// Reads and validates a config file.
pub fn read_file(path: &Path) -> Result<FileSettings, ConfigError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        source: source.clone(),
        field: "file".into(),
        message: format!("cannot read it: {e}"),
    })?;
    parse(&source, &text)
}

/// A config file as TOML gives it: each setting's type is checked here, its value in
/// [`parse`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    listen: Option<String>,
    store: Option<String>,
    failure_policy: Option<String>,
    redis_auto_batch: Option<String>,
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    idle_timeout: Option<String>,
    max_connections: Option<i64>,
    shutdown_timeout: Option<String>,
    auth_token: Option<String>,
    allow_inline_policies: Option<bool>,
    /// Each a spec string or a table, read in [`policy_of`] (its `shadow` and `spec`
    /// keys are the service's own).
    #[serde(default)]
    policies: BTreeMap<String, toml::Value>,
    #[serde(default)]
    queues: BTreeMap<String, QueueToml>,
    rls: Option<RlsToml>,
}

/// The `[rls]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RlsToml {
    listen: Option<String>,
    config: Option<String>,
    response_headers: Option<bool>,
}

/// A `[queues.NAME]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueToml {
    group_policy: Policy,
    group_concurrency: Option<u32>,
    queue_policy: Option<Policy>,
    queue_concurrency: Option<u32>,
    max_attempts: Option<u32>,
    lease: Option<String>,
    retry_backoff: Option<String>,
    retry_backoff_max: Option<String>,
    max_payload: Option<usize>,
    max_jobs: Option<usize>,
    partitions: Option<u32>,
    keep_completed: Option<usize>,
    keep_completed_for: Option<String>,
    keep_dead: Option<usize>,
    keep_dead_for: Option<String>,
    #[serde(default)]
    groups: BTreeMap<String, GroupToml>,
    #[serde(default)]
    schedules: BTreeMap<String, ScheduleToml>,
}

/// A `[queues.NAME.schedules.SCHEDULE]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleToml {
    cron: String,
    group: String,
    /// Any TOML value, kept as the JSON it reads as (none: `null`).
    payload: Option<toml::Value>,
    timezone: Option<String>,
}

/// A `[queues.NAME.groups."GROUP"]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupToml {
    policy: Policy,
}

impl QueueToml {
    /// The queue's configuration, or the first setting at fault (named within the queue).
    fn into_config(self) -> Result<QueueConfig, (String, String)> {
        let duration = |field: &str, text: Option<String>, default: Duration| match text {
            None => Ok(default),
            Some(t) => paceline_store::spec::parse_duration(field, &t)
                .map(Duration::from_micros)
                .map_err(|e| (field.to_string(), e.message().to_string())),
        };
        let mut config = QueueConfig::new(self.group_policy);
        config.group_concurrency = self.group_concurrency.unwrap_or(config.group_concurrency);
        config.queue_policy = self.queue_policy;
        config.queue_concurrency = self.queue_concurrency.unwrap_or(config.queue_concurrency);
        config.max_attempts = self.max_attempts.unwrap_or(config.max_attempts);
        config.lease = duration("lease", self.lease, config.lease)?;
        config.retry_backoff = duration("retry_backoff", self.retry_backoff, config.retry_backoff)?;
        config.retry_backoff_max = duration(
            "retry_backoff_max",
            self.retry_backoff_max,
            config.retry_backoff_max.max(config.retry_backoff),
        )?;
        config.max_payload = self.max_payload.unwrap_or(config.max_payload);
        config.max_jobs = self.max_jobs.unwrap_or(config.max_jobs);
        config.partitions = self.partitions.unwrap_or(config.partitions);
        let age = |field: &str, text: Option<String>| match text {
            None => Ok(None),
            Some(t) => paceline_store::spec::parse_duration(field, &t)
                .map(|us| Some(Duration::from_micros(us)))
                .map_err(|e| (field.to_string(), e.message().to_string())),
        };
        config.keep_completed = self.keep_completed.unwrap_or(0);
        config.keep_completed_for = age("keep_completed_for", self.keep_completed_for)?;
        config.keep_dead = self.keep_dead;
        config.keep_dead_for = age("keep_dead_for", self.keep_dead_for)?;
        config.groups = self
            .groups
            .into_iter()
            .map(|(name, g)| (name, g.policy))
            .collect();
        for (name, s) in self.schedules {
            let payload = match s.payload {
                None => b"null".to_vec(),
                Some(value) => serde_json::to_vec(&value).map_err(|e| {
                    (
                        format!("schedules.{name}.payload"),
                        format!("does not read as JSON: {e}"),
                    )
                })?,
            };
            let mut schedule = paceline_queue::schedule::Schedule::new(s.cron, s.group, payload);
            if let Some(zone) = s.timezone {
                schedule = schedule.timezone(zone);
            }
            config.schedules.insert(name, schedule);
        }
        config
            .validate()
            .map_err(|e| (e.field().to_string(), e.message().to_string()))?;
        Ok(config)
    }
}

/// What each setting takes, as an error for a value of the wrong type says it.
const ALLOWED: &[(&str, &str)] = &[
    ("listen", "HOST:PORT as a string, e.g. \"127.0.0.1:7373\""),
    ("store", "a store URL as a string, e.g. \"memory\""),
    (
        "failure_policy",
        "a string: fail_closed, fail_open or local",
    ),
    (
        "redis_auto_batch",
        "a string: a linger such as \"0ms\", or \"off\"",
    ),
    (
        "header_read_timeout",
        "a duration as a string, e.g. \"10s\"",
    ),
    ("body_read_timeout", "a duration as a string, e.g. \"10s\""),
    ("idle_timeout", "a duration as a string, e.g. \"5s\""),
    ("max_connections", "a whole number, e.g. 2048"),
    ("shutdown_timeout", "a duration as a string, e.g. \"10s\""),
    ("auth_token", "a string"),
    ("allow_inline_policies", "true or false"),
    ("policies", "tables: [policies.NAME]"),
    ("queues", "tables: [queues.NAME]"),
    (
        "rls",
        "a table: [rls] with listen, config, response_headers",
    ),
    (
        "rls.listen",
        "HOST:PORT as a string, e.g. \"127.0.0.1:8081\"",
    ),
    ("rls.config", "a path as a string: a YAML file or a folder"),
    ("rls.response_headers", "true or false"),
];

/// Parses and validates config text; `source` names it in errors.
pub fn parse(source: &str, text: &str) -> Result<FileSettings, ConfigError> {
    let err = |field: &str, message: String| ConfigError {
        source: source.to_string(),
        field: field.to_string(),
        message,
    };
    let one_line = |e: &dyn fmt::Display| e.to_string().trim().replace('\n', " ");
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| err("toml", one_line(&e)))?;
    let file: FileToml =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let field = e.path().to_string();
            let message = one_line(e.inner());
            match ALLOWED.iter().find(|(name, _)| *name == field) {
                Some((_, allowed)) => err(&field, format!("{message}; use {allowed}")),
                // An unknown setting (serde's message lists the settings), or a policy.
                None => err(&field, message),
            }
        })?;
    let mut out = FileSettings {
        store: file.store,
        ..FileSettings::default()
    };
    if let Some(s) = file.listen {
        out.listen = Some(s.parse().map_err(|_| {
            err(
                "listen",
                format!("`{s}` is not an address; use HOST:PORT, e.g. 127.0.0.1:7373"),
            )
        })?);
    }
    if let Some(s) = file.failure_policy {
        out.failure_policy = Some(s.parse().map_err(|e: paceline_store::InputError| {
            err("failure_policy", e.message().to_string())
        })?);
    }
    if let Some(s) = file.redis_auto_batch {
        out.redis_auto_batch =
            Some(parse_auto_batch(&s).map_err(|message| err("redis_auto_batch", message))?);
    }
    let timeout = |name: &str, text: Option<String>| {
        text.map(|t| parse_timeout(name, &t).map_err(|m| err(name, m)))
            .transpose()
    };
    out.header_read_timeout = timeout("header_read_timeout", file.header_read_timeout)?;
    out.body_read_timeout = timeout("body_read_timeout", file.body_read_timeout)?;
    out.idle_timeout = timeout("idle_timeout", file.idle_timeout)?;
    out.shutdown_timeout = timeout("shutdown_timeout", file.shutdown_timeout)?;
    if let Some(n) = file.max_connections {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_CONNECTIONS).contains(n));
        out.max_connections = Some(n.ok_or_else(|| {
            err(
                "max_connections",
                format!("must be a whole number from 1 to {MAX_CONNECTIONS}, e.g. 2048"),
            )
        })?);
    }
    if let Some(token) = file.auth_token {
        if token.is_empty() {
            return Err(err(
                "auth_token",
                "must not be empty; remove it to turn auth off".into(),
            ));
        }
        out.auth_token = Some(token);
    }
    out.allow_inline_policies = file.allow_inline_policies;
    for (name, value) in file.policies {
        let field = format!("policies.{name}");
        check_policy_name(&name).map_err(|m| err(&field, m))?;
        let (policy, shadow) = policy_of(value).map_err(|(at, m)| {
            let at = at.map_or_else(|| field.clone(), |at| format!("{field}.{at}"));
            err(&at, one_line(&m))
        })?;
        if shadow {
            out.shadow.insert(name.clone());
        }
        out.policies.insert(name, policy);
    }
    for (name, queue) in file.queues {
        paceline_queue::memory::check_queue_name(&name)
            .map_err(|e| err(&format!("queues.{name}"), e.message().to_string()))?;
        let config = queue
            .into_config()
            .map_err(|(field, message)| err(&format!("queues.{name}.{field}"), message))?;
        out.queues.insert(name, config);
    }
    if let Some(rls) = file.rls {
        let mut table = RlsFile {
            response_headers: rls.response_headers,
            ..RlsFile::default()
        };
        if let Some(s) = rls.listen {
            table.listen = Some(s.parse().map_err(|_| {
                err(
                    "rls.listen",
                    format!("`{s}` is not an address; use HOST:PORT, e.g. 127.0.0.1:8081"),
                )
            })?);
        }
        if let Some(path) = rls.config {
            if path.is_empty() {
                return Err(err(
                    "rls.config",
                    "is empty: give the YAML file or folder of the rules, or remove it".into(),
                ));
            }
            // A relative path is the config file's neighbour, wherever the service starts.
            let path = PathBuf::from(path);
            table.config = Some(match Path::new(source).parent() {
                Some(dir) if path.is_relative() && !dir.as_os_str().is_empty() => dir.join(path),
                _ => path,
            });
        }
        out.rls = Some(table);
    }
    Ok(out)
}

/// A `[policies.NAME]` entry: a spec string, a table with `algorithm` and its parameters,
/// or a table with `spec`; either table may hold `shadow = true` (see
/// [`FileSettings::shadow`]). The policy and whether it is in shadow mode, or the key at
/// fault within the entry (`None`: the policy as a whole) and what is wrong.
fn policy_of(value: toml::Value) -> Result<(Policy, bool), (Option<&'static str>, String)> {
    let toml::Value::Table(mut table) = value else {
        return Policy::deserialize(value)
            .map(|p| (p, false))
            .map_err(|e| (None, e.to_string()));
    };
    let shadow = match table.remove("shadow") {
        None => false,
        Some(toml::Value::Boolean(b)) => b,
        Some(other) => {
            return Err((
                Some("shadow"),
                format!(
                    "`{other}` is not a boolean; use true (decide and count, but always admit) or false"
                ),
            ))
        }
    };
    let policy = match table.remove("spec") {
        Some(toml::Value::String(spec)) => {
            if let Some(other) = table.keys().next() {
                return Err((
                    None,
                    format!(
                        "`{other}` beside `spec`: give the policy as `spec` or as `algorithm` \
                         and its parameters, not both (`shadow` goes with either)"
                    ),
                ));
            }
            spec.parse::<Policy>()
                .map_err(|e| (Some("spec"), e.to_string()))?
        }
        Some(other) => {
            return Err((
                Some("spec"),
                format!("`{other}` is not a string; use a spec, e.g. \"gcra:rate=10/s\""),
            ))
        }
        None => {
            Policy::deserialize(toml::Value::Table(table)).map_err(|e| (None, e.to_string()))?
        }
    };
    if shadow {
        check_shadow(&policy).map_err(|m| (Some("shadow"), m.to_string()))?;
    }
    Ok((policy, shadow))
}

/// Whether `policy` may be in shadow mode: not a `concurrency` one (the message says why).
pub(crate) fn check_shadow(policy: &Policy) -> Result<(), &'static str> {
    if policy.concurrency().is_ok() {
        return Err(
            "is not allowed on a `concurrency` policy: a lease it refuses cannot be handed out \
             without taking a place; remove `shadow`, or use a rate policy",
        );
    }
    Ok(())
}

/// Policy names: 1 to 128 characters from `A-Z a-z 0-9 - _ .`, so they fit URLs, metric
/// labels and keys as they are.
pub(crate) fn check_policy_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a valid policy name; use 1 to {MAX_POLICY_NAME} of A-Z a-z 0-9 - _ ."
        ))
    }
}

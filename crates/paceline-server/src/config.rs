//! The service's settings: a TOML file, overridden by command-line flags.
//!
//! ```toml
//! listen = "127.0.0.1:7373"
//! store = "redis://127.0.0.1:6379"   # or "memory" (default), or "redis-cluster://..."
//! failure_policy = "fail_closed"     # fail_closed | fail_open | local (Redis stores)
//! redis_auto_batch = "0ms"           # coalesce concurrent decisions (a linger), or "off"
//! allow_inline_policies = false      # accept spec strings as `policy` in requests
//! auth_token = "..."                 # or PACELINE_AUTH_TOKEN / --auth-token
//!
//! [policies.discord-roles]
//! algorithm = "fixed_window"
//! limit = 10
//! window = "10s"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::time::Duration;

use paceline_store::{FailurePolicy, Policy};
use serde::Deserialize as _;

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
    /// Requests to `/v1/...` must carry `Authorization: Bearer TOKEN` when set.
    pub auth_token: Option<String>,
    /// Accept spec strings (`"gcra:rate=10/s"`) as the `policy` of a request.
    pub allow_inline_policies: bool,
    /// The named policies.
    pub policies: BTreeMap<String, Policy>,
    /// The file the settings came from, if any (reloaded on SIGHUP).
    pub config_file: Option<PathBuf>,
    /// What the command line set of what a reload can change: it wins over the file, at
    /// start-up and at every reload.
    pub flags: LiveFlags,
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
            auth_token: None,
            allow_inline_policies: true,
            policies: BTreeMap::new(),
            config_file: None,
            flags: LiveFlags::default(),
        }
    }
}

/// An invalid configuration: where, which field, what is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, or `--flag` for a command-line value.
    pub source: String,
    /// The setting, e.g. `policies.discord-roles.window`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.source, self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

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
    /// `auth_token`.
    pub auth_token: Option<String>,
    /// `allow_inline_policies`.
    pub allow_inline_policies: Option<bool>,
    /// `[policies.NAME]` tables.
    pub policies: BTreeMap<String, Policy>,
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
        self.apply_live(file);
    }

    /// Sets what a reload can change from `file` under [`Settings::flags`]: the policies,
    /// and the token and the inline rule from the flags if given, else from the file, else
    /// their defaults.
    pub fn apply_live(&mut self, file: FileSettings) {
        let defaults = Settings::default();
        self.policies = file.policies;
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

const KNOWN: &[&str] = &[
    "listen",
    "store",
    "failure_policy",
    "redis_auto_batch",
    "auth_token",
    "allow_inline_policies",
    "policies",
];

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

/// Parses and validates config text; `source` names it in errors.
pub fn parse(source: &str, text: &str) -> Result<FileSettings, ConfigError> {
    let err = |field: &str, message: String| ConfigError {
        source: source.to_string(),
        field: field.to_string(),
        message,
    };
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| err("toml", e.to_string().trim().replace('\n', " ")))?;
    let mut out = FileSettings::default();
    for (name, value) in &table {
        if !KNOWN.contains(&name.as_str()) {
            return Err(err(
                name,
                format!("unknown setting; the settings are {}", KNOWN.join(", ")),
            ));
        }
        let text_value = |v: &toml::Value| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| err(name, format!("must be a string, not {}", v.type_str())))
        };
        match name.as_str() {
            "listen" => {
                let s = text_value(value)?;
                out.listen = Some(s.parse().map_err(|_| {
                    err(
                        name,
                        format!("`{s}` is not an address; use HOST:PORT, e.g. 127.0.0.1:7373"),
                    )
                })?);
            }
            "store" => out.store = Some(text_value(value)?),
            "failure_policy" => {
                let s = text_value(value)?;
                out.failure_policy =
                    Some(s.parse().map_err(|e: paceline_store::InputError| {
                        err(name, e.message().to_string())
                    })?);
            }
            "redis_auto_batch" => {
                let s = text_value(value)?;
                out.redis_auto_batch =
                    Some(parse_auto_batch(&s).map_err(|message| err(name, message))?);
            }
            "auth_token" => {
                let s = text_value(value)?;
                if s.is_empty() {
                    return Err(err(
                        name,
                        "must not be empty; remove it to turn auth off".into(),
                    ));
                }
                out.auth_token = Some(s);
            }
            "allow_inline_policies" => {
                out.allow_inline_policies = Some(value.as_bool().ok_or_else(|| {
                    err(
                        name,
                        format!("must be true or false, not {}", value.type_str()),
                    )
                })?);
            }
            _ => {
                let toml::Value::Table(policies) = value else {
                    return Err(err(name, "must be tables: [policies.NAME]".into()));
                };
                for (policy_name, spec) in policies {
                    let field = format!("policies.{policy_name}");
                    check_policy_name(policy_name).map_err(|m| err(&field, m))?;
                    let policy = Policy::deserialize(spec.clone())
                        .map_err(|e| err(&field, e.to_string().trim().replace('\n', " ")))?;
                    out.policies.insert(policy_name.clone(), policy);
                }
            }
        }
    }
    Ok(out)
}

/// The longest auto-batching linger (as the Redis store allows).
const MAX_AUTO_BATCH_LINGER: Duration = Duration::from_millis(10);

/// Reads `redis_auto_batch` (and `--redis-auto-batch`): `off`, or the linger as a duration
/// (`0ms`: only the decisions already waiting; at most `10ms`).
pub fn parse_auto_batch(text: &str) -> Result<Option<Duration>, String> {
    if text.trim() == "off" {
        return Ok(None);
    }
    let us = paceline_store::spec::parse_duration_opt_zero("redis_auto_batch", text, true)
        .map_err(|e| format!("{}; or `off`", e.message()))?;
    let linger = Duration::from_micros(us);
    if linger > MAX_AUTO_BATCH_LINGER {
        return Err(format!(
            "`{text}` is too long a linger; use at most 10ms (0ms is the usual), or `off`"
        ));
    }
    Ok(Some(linger))
}

/// Policy names: 1 to 128 characters from `A-Z a-z 0-9 - _ .`, so they fit URLs, metric
/// labels and keys as they are.
fn check_policy_name(name: &str) -> Result<(), String> {
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

//! One setting's value read from text (a file's, or a flag's), and [`ConfigError`]: where a
//! setting is wrong and what is allowed.

use std::fmt;
use std::time::Duration;

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

/// The most connections `max_connections` allows.
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// Reads a connection timeout: a duration from 1 ms to 1 hour.
pub fn parse_timeout(field: &str, text: &str) -> Result<Duration, String> {
    let us =
        paceline_store::spec::parse_duration(field, text).map_err(|e| e.message().to_string())?;
    let d = Duration::from_micros(us);
    if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
        return Err(format!("`{text}` is out of range; use 1ms to 1h, e.g. 10s"));
    }
    Ok(d)
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

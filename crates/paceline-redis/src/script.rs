//! The Lua library the store runs: the twins of all eight algorithms and the decision entry
//! point, loaded as a Redis function library (`FCALL`, Redis 7+) or, where that is not
//! possible, as a script called by its SHA1 (`EVALSHA`, reloaded after `NOSCRIPT`).

use std::sync::LazyLock;

use std::time::Duration;

use paceline::{Decision, StoreError, StoreErrorKind};
use redis::Value;

/// The files, in load order: the shared helpers, the algorithms, the entry point.
const SOURCES: &[&str] = &[
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/pacer.lua"),
    include_str!("../lua/gcra.lua"),
    include_str!("../lua/fixed_window.lua"),
    include_str!("../lua/exec_evenly.lua"),
    include_str!("../lua/sliding_log.lua"),
    include_str!("../lua/sliding_window.lua"),
    include_str!("../lua/guava.lua"),
    include_str!("../lua/smooth_bursty.lua"),
    include_str!("../lua/smooth_warming_up.lua"),
    include_str!("../lua/decide.lua"),
];

/// The decision script (see `lua/decide.lua` for its arguments and reply), for `EVALSHA`.
pub(crate) static DECIDE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&SOURCES.join("\n")));

/// The same code as a Redis function library (Redis 7+), preferred where the server has
/// functions: a library's definitions run once at load, not at every call as a script's
/// do, which makes each decision cheaper for the server. The function may touch keys of
/// several slots (`allow-cross-slot-keys`), so a cluster batch can carry every key one node
/// serves.
pub(crate) struct Library {
    /// The function to `FCALL`, with the same arguments and reply as the script.
    pub(crate) function: String,
    /// The library's source for `FUNCTION LOAD`.
    pub(crate) code: String,
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    // The name carries the code's hash, so different versions of paceline sharing a server
    // each find their own library.
    let hash = &DECIDE.get_hash()[..16];
    let (entry, library) = SOURCES.split_last().unwrap_or((&"", &[]));
    let function = format!("paceline_decide_{hash}");
    let code = format!(
        "#!lua name=paceline_{hash}\n{}\nlocal function decide(KEYS, ARGV)\n{entry}\nend\n\
         redis.register_function{{function_name = '{function}', callback = decide, \
         flags = {{ 'allow-cross-slot-keys' }}}}\n",
        library.join("\n")
    );
    Library { function, code }
});

/// Values the script returns per decision.
const REPLY_WIDTH: usize = 4;

/// Turns the script's flat reply into decisions, one per entry of `limits` (each decision's
/// policy's limit, which the script does not repeat).
pub(crate) fn parse_reply(
    reply: Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Vec<Decision>, StoreError> {
    let Value::Array(values) = reply else {
        return Err(protocol(format!("expected an array, got {reply:?}")));
    };
    let count = limits.len();
    if values.len() != count * REPLY_WIDTH {
        return Err(protocol(format!(
            "expected {} values for {count} decisions, got {}",
            count * REPLY_WIDTH,
            values.len()
        )));
    }
    values
        .chunks_exact(REPLY_WIDTH)
        .zip(limits)
        .map(|(v, limit)| {
            let allowed = match &v[0] {
                Value::Int(1) => true,
                Value::Int(0) => false,
                other => return Err(protocol(format!("`allowed` is {other:?}"))),
            };
            let remaining = match &v[2] {
                Value::Int(n) => u64::try_from(*n).unwrap_or(0),
                other => return Err(protocol(format!("`remaining` is {other:?}"))),
            };
            let mut decision = Decision::from_micros(allowed, 0.0, remaining, 0.0, limit);
            decision.delay = nanos(&v[1], "delay")?;
            decision.reset_after = nanos(&v[3], "reset_after")?;
            Ok(decision)
        })
        .collect()
}

/// A time the script returned in nanoseconds: an integer, or a float in a string when it is
/// too large for one (saturating at [`Duration::MAX`] like `micros_to_duration`).
fn nanos(value: &Value, field: &str) -> Result<Duration, StoreError> {
    let bad = || {
        protocol(format!(
            "`{field}` is {value:?}, not a number of nanoseconds"
        ))
    };
    match value {
        Value::Int(n) => u64::try_from(*n)
            .map(Duration::from_nanos)
            .map_err(|_| bad()),
        Value::BulkString(bytes) => {
            let x: f64 = std::str::from_utf8(bytes)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(bad)?;
            if x >= u64::MAX as f64 {
                Ok(Duration::MAX)
            } else if x >= 0.0 {
                // An integral float: the conversion is exact.
                Ok(Duration::from_nanos(x as u64))
            } else {
                Err(bad())
            }
        }
        _ => Err(bad()),
    }
}

fn protocol(message: String) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("unexpected reply from the paceline script: {message}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline::Policy;

    #[test]
    fn nanoseconds_come_as_integers_or_large_floats() {
        assert_eq!(
            nanos(&Value::Int(1_500), "delay").unwrap(),
            Duration::from_nanos(1_500)
        );
        let big = Value::BulkString(b"9.2233720368547758e+18".to_vec());
        assert_eq!(nanos(&big, "delay").unwrap(), Duration::from_nanos(1 << 63));
        let huge = Value::BulkString(b"1e30".to_vec());
        assert_eq!(nanos(&huge, "delay").unwrap(), Duration::MAX);
        assert_eq!(
            nanos(&Value::Int(-1), "delay").unwrap_err().kind(),
            StoreErrorKind::Protocol
        );
        assert!(nanos(&Value::Nil, "reset_after")
            .unwrap_err()
            .message()
            .contains("reset_after"));
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_a_protocol_error() {
        let policy: Policy = "gcra:rate=1/s".parse().unwrap();
        let short = Value::Array(vec![Value::Int(1)]);
        assert_eq!(
            parse_reply(short, [policy.limit()].into_iter())
                .unwrap_err()
                .kind(),
            StoreErrorKind::Protocol
        );
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1_000_000_000),
        ]);
        let d = parse_reply(ok, [policy.limit()].into_iter()).unwrap();
        assert!(d[0].allowed);
        assert_eq!(d[0].reset_after, Duration::from_secs(1));
        assert_eq!(d[0].limit, 1);
    }
}

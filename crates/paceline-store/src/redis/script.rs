//! The Lua library the store runs: the twins of all eight algorithms and the decision entry
//! point, loaded as a Redis function library (`FCALL`, Redis 7+) or, where that is not
//! possible, as a script called by its SHA1 (`EVALSHA`, reloaded after `NOSCRIPT`). The
//! library also holds lean entry points for `gcra` and `pacer`, one decision or a batch,
//! which answer with the state each decision saw (see `lua/lean.lua`).

use std::sync::LazyLock;

use std::time::Duration;

use paceline_core::policy::{check_now, pacer};
use paceline_core::{Decision, Op, Policy, State, StoreError, StoreErrorKind};
use redis::Value;

use crate::Request;

/// The files, in load order: the shared helpers, the algorithms, the entry point.
const SOURCES: &[&str] = &[
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/pacer.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/exec_evenly.lua"),
    include_str!("../../lua/sliding_log.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/guava.lua"),
    include_str!("../../lua/smooth_bursty.lua"),
    include_str!("../../lua/smooth_warming_up.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/decide.lua"),
];

/// The entry point deciding a set of limits as one (`lua/decide_all.lua`).
const DECIDE_ALL_ENTRY: &str = include_str!("../../lua/decide_all.lua");

/// The entry point releasing or extending a lease (`lua/lease.lua`).
const LEASE_ENTRY: &str = include_str!("../../lua/lease.lua");

/// The lean entry points (`lua/lean.lua`), in the library only.
const LEAN: &str = include_str!("../../lua/lean.lua");

/// The decision script (its arguments: `PL.read_batch` in `lua/prelude.lua`; its reply:
/// `lua/decide.lua`), for `EVALSHA`.
pub(crate) static DECIDE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&SOURCES.join("\n")));

/// The set decision script (`lua/decide_all.lua`), for `EVALSHA`.
pub(crate) static DECIDE_ALL: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{}\n{DECIDE_ALL_ENTRY}", *ALGORITHMS)));

/// The lease script (`lua/lease.lua`), for `EVALSHA`.
pub(crate) static LEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{}\n{LEASE_ENTRY}", *ALGORITHMS)));

/// The same code as a Redis function library (Redis 7+), preferred where the server has
/// functions: a library's definitions run once at load, not at every call as a script's
/// do, which makes each decision cheaper for the server. The function may touch keys of
/// several slots (`allow-cross-slot-keys`), so a cluster batch can carry every key one node
/// serves.
pub(crate) struct Library {
    /// The function to `FCALL`, with the same arguments and reply as the script.
    pub(crate) function: String,
    /// The single-decision entry point of `gcra` (see `lua/lean.lua`).
    pub(crate) single_gcra: String,
    /// The single-decision entry point of `pacer`.
    pub(crate) single_pacer: String,
    /// The lean batch of `gcra` and `pacer` decisions: the arguments of `function`, one
    /// string as the answer (see `lua/lean.lua`).
    pub(crate) lean_batch: String,
    /// The function deciding a set of limits as one (`lua/decide_all.lua`); its keys share
    /// a slot.
    pub(crate) all: String,
    /// The function releasing or extending a lease (`lua/lease.lua`).
    pub(crate) lease: String,
    /// The library's source for `FUNCTION LOAD`.
    pub(crate) code: String,
}

impl Library {
    /// The single-decision entry point for `policy`'s algorithm, if it has lean entry points
    /// (`gcra` and `pacer`; they also take the lean batch).
    pub(crate) fn single(&self, policy: &Policy) -> Option<&str> {
        match policy {
            Policy::Gcra(_) => Some(&self.single_gcra),
            Policy::Pacer(_) => Some(&self.single_pacer),
            _ => None,
        }
    }
}

/// The shared helpers and the algorithm twins, without an entry point: what every library
/// holds before its functions.
pub(crate) static ALGORITHMS: LazyLock<String> = LazyLock::new(|| {
    let (_, library) = SOURCES.split_last().unwrap_or((&"", &[]));
    library.join("\n")
});

/// The first 16 hex digits of the SHA1 of `text`.
pub(crate) fn code_hash(text: &str) -> String {
    redis::Script::new(text).get_hash()[..16].to_string()
}

/// A function library's code: `body`, then each of `functions` (its name's stem, its
/// callback in `body`, its flags) registered as `paceline_{stem}_{hash}`, in a library
/// named `paceline_{library}_{hash}` (`paceline_{hash}` for `""`). The hash is that of the
/// code and of how it is registered, so different versions of paceline sharing a server
/// each find their own. Answers the code and a function giving each stem's name.
pub(crate) fn register(
    library: &str,
    body: &str,
    functions: &[(&str, &str, &str)],
) -> (String, impl Fn(&str) -> String) {
    let hash = code_hash(&format!("{body}{functions:?}"));
    let library = if library.is_empty() {
        format!("paceline_{hash}")
    } else {
        format!("paceline_{library}_{hash}")
    };
    let name = move |stem: &str| format!("paceline_{stem}_{hash}");
    let mut code = format!("#!lua name={library}\n{body}");
    for (stem, callback, flags) in functions {
        code.push_str(&format!(
            "redis.register_function{{function_name = '{}', callback = {callback}, \
             flags = {{ {flags} }}}}\n",
            name(stem)
        ));
    }
    (code, name)
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let entry = SOURCES.last().copied().unwrap_or("");
    let library = ALGORITHMS.as_str();
    let body = format!(
        "{library}\nlocal function decide(KEYS, ARGV)\n{entry}\nend\n\
         local function decide_all(KEYS, ARGV)\n{DECIDE_ALL_ENTRY}\nend\n\
         local function lease(KEYS, ARGV)\n{LEASE_ENTRY}\nend\n{LEAN}\n"
    );
    // Each function: its name's stem, its callback in `body`, its flags.
    let functions = [
        ("decide", "decide", "'allow-cross-slot-keys'"),
        ("gcra", "single_gcra", ""),
        ("pacer", "single_pacer", ""),
        ("lean", "lean_batch", "'allow-cross-slot-keys'"),
        ("all", "decide_all", ""),
        ("lease", "lease", ""),
    ];
    let (code, name) = register("", &body, &functions);
    Library {
        function: name("decide"),
        single_gcra: name("gcra"),
        single_pacer: name("pacer"),
        lean_batch: name("lean"),
        all: name("all"),
        lease: name("lease"),
        code,
    }
});

/// Values the script returns per decision.
const REPLY_WIDTH: usize = 5;

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
            decision.lease = match &v[4] {
                Value::Int(-1) => None,
                Value::Int(id) => {
                    Some(u64::try_from(*id).map_err(|_| protocol(format!("`lease` is {id}")))?)
                }
                other => return Err(protocol(format!("`lease` is {other:?}"))),
            };
            Ok(decision)
        })
        .collect()
}

/// Turns the set script's reply (`lua/decide_all.lua`) into whether the set was admitted
/// and one decision per entry of `limits`; `None` for a `pace` set whose limits' slots did
/// not meet (the script's `{ -1 }`).
pub(crate) fn parse_all_reply(
    reply: Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Option<(bool, Vec<Decision>)>, StoreError> {
    let Value::Array(mut values) = reply else {
        return Err(protocol(format!("expected an array, got {reply:?}")));
    };
    if values.is_empty() {
        return Err(protocol("expected the set's admission flag, got nothing"));
    }
    let admitted = match values.remove(0) {
        Value::Int(1) => true,
        Value::Int(0) => false,
        Value::Int(-1) if values.is_empty() => return Ok(None),
        other => return Err(protocol(format!("the set's admission flag is {other:?}"))),
    };
    let decisions = parse_reply(Value::Array(values), limits)?;
    Ok(Some((admitted, decisions)))
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
            let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
            // Whole digits: exact (a set's times past 2^53 ns come so).
            if let Ok(n) = text.parse::<u64>() {
                return Ok(Duration::from_nanos(n));
            }
            let x: f64 = text.parse().map_err(|_| bad())?;
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

/// The decision a single-decision entry point's reply stands for (see `lua/lean.lua`): a
/// lean batch's reply for one decision.
pub(crate) fn single_decision(
    reply: Value,
    request: &Request<'_>,
    now: Option<u64>,
) -> Result<Decision, StoreError> {
    let mut decisions = lean_decisions(reply, &[request], now)?;
    decisions
        .pop()
        .ok_or_else(|| protocol("no decision in the reply".to_string()))
}

/// The decisions a lean batch's reply stands for, one per request of `batch`, in order (see
/// `lua/lean.lua`): the server's time unless `now` was injected, then per decision its
/// admission flag and the record it saw.
pub(crate) fn lean_decisions(
    reply: Value,
    batch: &[&Request<'_>],
    now: Option<u64>,
) -> Result<Vec<Decision>, StoreError> {
    let Value::BulkString(bytes) = reply else {
        return Err(protocol(format!("expected a string, got {reply:?}")));
    };
    let (now, mut rest) = reply_time(&bytes, now)?;
    let bytes = Shown(&bytes);
    let mut decisions = Vec::with_capacity(batch.len());
    for r in batch {
        let (admitted, after) = match rest.split_first() {
            Some((b'1', after)) => (true, after),
            Some((b'0', after)) => (false, after),
            _ => {
                return Err(protocol(format!(
                    "no admission flag for decision {} of {} in {bytes}",
                    decisions.len() + 1,
                    batch.len()
                )))
            }
        };
        // A record's tag tells its length; any other byte is the next decision's flag.
        let length = match after.first() {
            Some(b'g') => GCRA_RECORD,
            Some(b'p') => PACER_RECORD,
            _ => 0,
        };
        let Some((record, next)) = after.split_at_checked(length) else {
            return Err(protocol(format!("a truncated record in {bytes}")));
        };
        decisions.push(derive(admitted, record, r.policy, r.op, r.cost, now)?);
        rest = next;
    }
    if !rest.is_empty() {
        return Err(protocol(format!(
            "{} bytes after {} decisions in {bytes}",
            rest.len(),
            batch.len()
        )));
    }
    Ok(decisions)
}

/// The time a lean reply's decisions were made at: `now` if injected (the store checked it),
/// else the server's time at the head of `reply`; and the rest of the reply.
fn reply_time(reply: &[u8], now: Option<u64>) -> Result<(u64, &[u8]), StoreError> {
    match now {
        Some(now) => Ok((now, reply)),
        None => {
            let (now, rest) = server_time(reply)?;
            check_now(now).map_err(|e| protocol(format!("the server's time: {e}")))?;
            Ok((now, rest))
        }
    }
}

/// The decision a lean entry point made on a key holding `record` (empty: idle) at `now`:
/// the Rust algorithm applied to that state. The script must have admitted exactly when the
/// Rust algorithm does.
fn derive(
    admitted: bool,
    record: &[u8],
    policy: &Policy,
    op: Op,
    cost: u64,
    now: u64,
) -> Result<Decision, StoreError> {
    let decision = match policy {
        Policy::Gcra(gcra) => gcra.step(gcra_tat(record)?, now, op, cost).0,
        Policy::Pacer(_) => {
            let mut state = pacer_state(record)?.map(State::Pacer);
            policy.apply_validated(&mut state, now, op, cost)
        }
        other => {
            return Err(protocol(format!(
                "`{}` has no lean entry point",
                other.algorithm()
            )))
        }
    };
    if decision.allowed != admitted {
        return Err(protocol(format!(
            "the script {} a {} request that paceline's Rust algorithm {} at {now} µs: the \
             library and the crate are out of step (report it as a bug)",
            if admitted { "admitted" } else { "refused" },
            policy.algorithm(),
            if decision.allowed {
                "admits"
            } else {
                "refuses"
            },
        )));
    }
    Ok(decision)
}

/// The server's `TIME` at the head of a reply, "SECONDS MICROSECONDS ", in µs, and the rest.
fn server_time(reply: &[u8]) -> Result<(u64, &[u8]), StoreError> {
    let bad = || protocol(format!("no server time in {}", Shown(reply)));
    let mut parts = reply.splitn(3, |&b| b == b' ');
    let mut number = || {
        parts
            .next()
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<u64>().ok())
    };
    let (seconds, micros) = (number().ok_or_else(bad)?, number().ok_or_else(bad)?);
    let record = parts.next().ok_or_else(bad)?;
    let now = seconds
        .checked_mul(1_000_000)
        .and_then(|s| s.checked_add(micros))
        .ok_or_else(bad)?;
    Ok((now, record))
}

/// The length of a `gcra` record: its tag and one double.
const GCRA_RECORD: usize = 9;
/// The length of a `pacer` record: its tag and four doubles.
const PACER_RECORD: usize = 33;

/// A record's little-endian doubles after its tag byte, if it has `tag` and `N` of them.
fn doubles<const N: usize>(record: &[u8], tag: u8) -> Option<[f64; N]> {
    let (&first, rest) = record.split_first()?;
    if first != tag || rest.len() != N * 8 {
        return None;
    }
    let mut out = [0.0; N];
    for (x, bytes) in out.iter_mut().zip(rest.chunks_exact(8)) {
        *x = f64::from_le_bytes(bytes.try_into().ok()?);
    }
    Some(out)
}

/// The TAT of a `gcra` record (`'g'` and one double); none for an empty one.
fn gcra_tat(record: &[u8]) -> Result<Option<f64>, StoreError> {
    if record.is_empty() {
        return Ok(None);
    }
    match doubles::<1>(record, b'g') {
        Some([tat]) => Ok(Some(tat)),
        None => Err(protocol(format!("not a gcra record: {record:?}"))),
    }
}

/// The state of a `pacer` record (`'p'`, then expiry, watermark, last_drip and next_shot
/// as doubles); none for an empty one.
fn pacer_state(record: &[u8]) -> Result<Option<pacer::State>, StoreError> {
    if record.is_empty() {
        return Ok(None);
    }
    match doubles::<4>(record, b'p') {
        Some([_expiry, watermark, last_drip, next_shot]) => Ok(Some(pacer::State {
            watermark,
            last_drip,
            next_shot,
        })),
        None => Err(protocol(format!("not a pacer record: {record:?}"))),
    }
}

/// A reply in an error message: its first bytes and its length when it is long (a batch's
/// can be many kilobytes).
struct Shown<'a>(&'a [u8]);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const HEAD: usize = 80;
        match self.0.get(..HEAD) {
            Some(head) if self.0.len() > HEAD => {
                write!(f, "{head:?}... ({} bytes)", self.0.len())
            }
            _ => write!(f, "{:?}", self.0),
        }
    }
}

fn protocol(message: impl Into<String>) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!(
            "unexpected reply from the paceline script: {}",
            message.into()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

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
    fn a_set_reply_says_admitted_refused_or_that_the_slots_did_not_meet() {
        let limits = || [1u64, 1].into_iter();
        let limit = |allowed: i64| {
            [allowed, 0, 0, 0, -1]
                .into_iter()
                .map(Value::Int)
                .collect::<Vec<_>>()
        };
        let refused = Value::Array([vec![Value::Int(0)], limit(1), limit(0)].concat());
        let (admitted, decisions) = parse_all_reply(refused, limits()).unwrap().unwrap();
        assert!(!admitted);
        assert_eq!((decisions[0].allowed, decisions[1].allowed), (true, false));
        // A pace set whose slots did not meet: `{ -1 }`, and nothing more.
        let unmet = Value::Array(vec![Value::Int(-1)]);
        assert_eq!(parse_all_reply(unmet, limits()).unwrap(), None);
        let bad = Value::Array([vec![Value::Int(-1)], limit(1)].concat());
        assert_eq!(
            parse_all_reply(bad, limits()).unwrap_err().kind(),
            StoreErrorKind::Protocol
        );
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
            Value::Int(-1),
        ]);
        let d = parse_reply(ok, [policy.limit()].into_iter()).unwrap();
        assert!(d[0].allowed);
        assert_eq!(d[0].reset_after, Duration::from_secs(1));
        assert_eq!(d[0].limit, 1);
        assert_eq!(d[0].lease, None);
        // A lease id, and one that is no id.
        let leased = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(42),
        ]);
        let d = parse_reply(leased, [policy.limit()].into_iter()).unwrap();
        assert_eq!(d[0].lease, Some(42));
        let bad = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(-7),
        ]);
        assert_eq!(
            parse_reply(bad, [policy.limit()].into_iter())
                .unwrap_err()
                .kind(),
            StoreErrorKind::Protocol
        );
    }

    /// `single_decision` for one request on key "k".
    fn single(
        reply: Value,
        policy: &Policy,
        op: Op,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let request = Request {
            policy,
            key: "k",
            op,
            cost,
        };
        single_decision(reply, &request, now)
    }

    /// A single-decision reply: the server's time if given, the flag, then the record.
    fn reply(flag: &str, time: Option<&str>, record: &[u8]) -> Value {
        let mut bytes = time.unwrap_or("").as_bytes().to_vec();
        bytes.extend_from_slice(flag.as_bytes());
        bytes.extend_from_slice(record);
        Value::BulkString(bytes)
    }

    fn tat_record(tat: f64) -> Vec<u8> {
        let mut r = vec![b'g'];
        r.extend_from_slice(&tat.to_le_bytes());
        r
    }

    fn pacer_record(expiry: f64, watermark: f64, last_drip: f64, next_shot: f64) -> Vec<u8> {
        let mut r = vec![b'p'];
        for x in [expiry, watermark, last_drip, next_shot] {
            r.extend_from_slice(&x.to_le_bytes());
        }
        r
    }

    #[test]
    fn single_replies_are_decided_by_the_rust_algorithm() {
        let gcra: Policy = "gcra:rate=10/s,burst=2".parse().unwrap();
        // An idle key at the server's time 12.000005 s: admitted, one cell left.
        let d = single(reply("1", Some("12 5 "), b""), &gcra, Op::Limit, 1, None).unwrap();
        assert!(d.allowed);
        assert_eq!(
            (d.remaining, d.reset_after),
            (1, Duration::from_millis(100))
        );
        // A TAT 150 ms ahead of an injected `now`: a second cell fits after 50 ms.
        let now = 1_000_000;
        let record = tat_record(1_150_000.0);
        let d = single(reply("0", None, &record), &gcra, Op::Limit, 1, Some(now)).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.delay, Duration::from_millis(50));
        // `pacer`: a record's expiry is skipped, the state read.
        let pacer: Policy = "pacer:rate=4/s".parse().unwrap();
        let record = pacer_record(2e6, 0.0, 1e6, 1.25e6);
        let d = single(reply("1", None, &record), &pacer, Op::pace(), 1, Some(now)).unwrap();
        assert!(d.allowed);
        assert_eq!(d.delay, Duration::from_millis(250));
    }

    #[test]
    fn lean_batch_replies_hold_each_decision_s_flag_and_record() {
        let gcra: Policy = "gcra:rate=10/s,burst=2".parse().unwrap();
        let pacer: Policy = "pacer:rate=4/s".parse().unwrap();
        let request = |policy, key| Request {
            policy,
            key,
            op: Op::Limit,
            cost: 1,
        };
        let batch = [
            request(&gcra, "a"),
            request(&pacer, "b"),
            request(&gcra, "a"),
        ];
        let refs: Vec<&Request> = batch.iter().collect();
        // At the server's time 1 s: `a` idle, `b` idle, then `a` with the TAT the first
        // decision wrote (1.1 s), which leaves one cell.
        let mut bytes = b"1 0 111".to_vec();
        bytes.extend_from_slice(&tat_record(1_100_000.0));
        let d = lean_decisions(Value::BulkString(bytes), &refs, None).unwrap();
        assert_eq!(d.len(), 3);
        assert!(d.iter().all(|d| d.allowed));
        assert_eq!((d[0].remaining, d[2].remaining), (1, 0));
        assert_eq!(d[2].reset_after, Duration::from_millis(200));
        // A `pacer` record first (its next slot 250 ms away: refused), on an injected clock.
        let mut bytes = b"0".to_vec();
        bytes.extend_from_slice(&pacer_record(2e6, 0.0, 1e6, 1.25e6));
        bytes.extend_from_slice(b"01");
        let refs = [&batch[1], &batch[0], &batch[0]];
        let now = Some(1_000_000);
        let batch_reply = |bytes: Vec<u8>| lean_decisions(Value::BulkString(bytes), &refs, now);
        let err = batch_reply(bytes.clone()).unwrap_err();
        // The second `gcra` decision on an idle key must admit: the script is out of step.
        assert!(err.message().contains("out of step"), "{}", err.message());
        bytes[34] = b'1';
        let d = batch_reply(bytes.clone()).unwrap();
        assert_eq!(d.len(), 3);
        assert!(!d[0].allowed && d[1].allowed && d[2].allowed);
        assert_eq!(d[0].delay, Duration::from_millis(250));
        // Truncated, too long, or a record of the wrong kind: protocol errors.
        let bad = |bytes: Vec<u8>| {
            let e = batch_reply(bytes).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Protocol);
            e.message().to_string()
        };
        assert!(bad(bytes[..20].to_vec()).contains("truncated"));
        assert!(bad(bytes[..34].to_vec()).contains("no admission flag"));
        let mut long = bytes.clone();
        long.push(b'1');
        assert!(bad(long).contains("1 bytes after 3 decisions"));
        let mut wrong = b"1".to_vec();
        wrong.extend_from_slice(&tat_record(1.0));
        wrong.extend_from_slice(b"11");
        assert!(bad(wrong).contains("not a pacer record"));
    }

    #[test]
    fn malformed_or_disagreeing_single_replies_are_protocol_errors() {
        let gcra: Policy = "gcra:rate=10/s,burst=2".parse().unwrap();
        let bad = |reply: Value, now: Option<u64>| {
            let e = single(reply, &gcra, Op::Limit, 1, now).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Protocol);
            e.message().to_string()
        };
        assert!(bad(Value::Int(1), Some(0)).contains("expected a string"));
        assert!(bad(reply("x", None, b""), Some(0)).contains("admission flag"));
        assert!(bad(reply("1", Some("12 "), b""), None).contains("server time"));
        assert!(bad(reply("1", Some("a b "), b""), None).contains("server time"));
        assert!(bad(reply("1", None, b"g123"), Some(0)).contains("truncated record"));
        let pacer = [b"p".as_slice(), &[0; 32]].concat();
        assert!(bad(reply("1", None, &pacer), Some(0)).contains("not a gcra record"));
        // The script refused what the Rust algorithm admits: out of step.
        assert!(bad(reply("0", None, b""), Some(0)).contains("out of step"));
        // No single entry point for other algorithms.
        let window: Policy = "fixed_window:limit=1,window=1s".parse().unwrap();
        let e = single(reply("1", None, b""), &window, Op::Limit, 1, Some(0));
        assert_eq!(e.unwrap_err().kind(), StoreErrorKind::Protocol);
    }
}

//! `paceline simulate`: deterministic replay of a traffic script through a policy.
//!
//! The script is JSON Lines; the clock is a [`ManualClock`] starting at the Unix epoch; the
//! store (in memory, or Redis with the same clock injected) reads that clock, so a script
//! gives the same output on every store. Every line is validated strictly: an unknown
//! field, a wrong type or an impossible value stops the run with an error naming the line and
//! the field, and no decision is printed.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use paceline_store::{Clock, Decision, Limiter, ManualClock, Policy, SharedStore, Store};
use serde::Serialize;
use serde_json::{Map, Value};

/// An invalid script line.
#[derive(Debug, PartialEq)]
pub struct ScriptError {
    pub line: usize,
    pub field: String,
    pub message: String,
    /// Whose fault it is: the script's, or the store's.
    pub kind: Failure,
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A line of the script (or the policy) is invalid.
    Input,
    /// The store failed while deciding the line: not the script's fault.
    Store,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Failure::Input => write!(
                f,
                "line {}: invalid `{}`: {}",
                self.line, self.field, self.message
            ),
            Failure::Store => write!(f, "line {}: the store failed: {}", self.line, self.message),
        }
    }
}

impl std::error::Error for ScriptError {}

/// A request's op in a script.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SimOp {
    Pace,
    Limit,
    Acquire,
    Peek,
    Charge,
    Reset,
}

impl SimOp {
    /// The op's name in scripts and output.
    pub fn name(self) -> &'static str {
        match self {
            SimOp::Pace => "pace",
            SimOp::Limit => "limit",
            SimOp::Acquire => "acquire",
            SimOp::Peek => "peek",
            SimOp::Charge => "charge",
            SimOp::Reset => "reset",
        }
    }
}

/// What one request line of a script did: the input of the output line, the plots and
/// `--compare`'s table.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The script's line number (from 1).
    pub line: usize,
    /// The virtual time of the request, in µs since the epoch (0 = the script's start).
    pub t_us: u64,
    pub key: String,
    pub op: SimOp,
    pub cost: u64,
    /// The policy that decided it (the line's own, or the run's default).
    pub policy: Arc<Policy>,
    /// `None` for `reset`.
    pub decision: Option<Decision>,
}

/// One line of output.
#[derive(Serialize)]
struct Record<'a> {
    line: usize,
    t_ms: f64,
    key: &'a str,
    op: &'static str,
    #[serde(flatten)]
    decision: Option<DecisionRecord>,
}

#[derive(Serialize)]
struct DecisionRecord {
    allowed: bool,
    delay_ms: f64,
    remaining: u64,
    reset_after_ms: f64,
    limit: u64,
    /// The lease a `concurrency` decision took (its id).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<u64>,
}

impl From<&Decision> for DecisionRecord {
    fn from(d: &Decision) -> Self {
        DecisionRecord {
            allowed: d.allowed,
            delay_ms: duration_ms(d.delay),
            remaining: d.remaining,
            reset_after_ms: duration_ms(d.reset_after),
            limit: d.limit,
            lease: d.lease,
        }
    }
}

/// The latest virtual time, 2^53 µs after the epoch: times stay exact, and within what the
/// engine accepts.
pub(crate) const MAX_CLOCK_US: u64 = paceline_store::policy::MAX_NOW_US;

/// Moves the virtual clock forward by `us`, refusing to pass [`MAX_CLOCK_US`].
fn advance(clock: &ManualClock, us: u64) -> Result<(), String> {
    let to = clock.now_micros().saturating_add(us);
    if to > MAX_CLOCK_US {
        return Err(format!(
            "would move the clock past its maximum of {} ms",
            micros_ms(MAX_CLOCK_US)
        ));
    }
    clock.set_micros(to);
    Ok(())
}

/// Milliseconds with microsecond precision.
fn duration_ms(d: std::time::Duration) -> f64 {
    paceline_core::round_to_micros(d) as f64 / 1_000.0
}

pub(crate) fn micros_ms(us: u64) -> f64 {
    us as f64 / 1_000.0
}

struct Request {
    key: String,
    op: SimOp,
    cost: u64,
    max_wait_us: Option<u64>,
    policy: Option<String>,
}

/// Runs `script` through `default_policy` on a fresh in-memory store, returning the output
/// (one JSON object per line).
#[cfg(test)]
pub fn run(default_policy: Policy, script: &str) -> Result<String, ScriptError> {
    to_json_lines(&outcomes(default_policy, script)?)
}

/// Runs `script` through `default_policy` on a fresh in-memory store, returning what each
/// request line did.
#[cfg(test)]
pub fn outcomes(default_policy: Policy, script: &str) -> Result<Vec<Outcome>, ScriptError> {
    let clock = ManualClock::new(0);
    let store = Arc::new(
        paceline_store::MemoryStore::builder()
            .clock(clock.clone())
            .build(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| ScriptError {
            line: 0,
            field: "runtime".into(),
            message: e.to_string(),
            kind: Failure::Input,
        })?;
    runtime.block_on(run_on(default_policy, script, store, &clock))
}

/// Runs `script` through `default_policy` on `store`, whose clock must be `clock` (starting
/// at 0), returning what each request line did. The keys the script touched are reset at
/// the end, so a shared store keeps nothing of the run.
pub async fn run_on(
    default_policy: Policy,
    script: &str,
    store: SharedStore,
    clock: &ManualClock,
) -> Result<Vec<Outcome>, ScriptError> {
    let default = (
        Arc::new(default_policy.clone()),
        Limiter::with_store(default_policy, Arc::clone(&store)),
    );
    let mut touched = BTreeSet::new();
    let result = replay(&default, script, &store, clock, &mut touched).await;
    for key in &touched {
        // Best effort: the output is already decided, and an idle key expires by itself.
        let _ = store.reset(key).await;
    }
    result
}

/// The output: one JSON object per outcome, one per line.
pub fn to_json_lines(outcomes: &[Outcome]) -> Result<String, ScriptError> {
    let mut out = String::new();
    for outcome in outcomes {
        let record = Record {
            line: outcome.line,
            t_ms: micros_ms(outcome.t_us),
            key: &outcome.key,
            op: outcome.op.name(),
            decision: outcome.decision.as_ref().map(DecisionRecord::from),
        };
        let json = serde_json::to_string(&record).map_err(|e| ScriptError {
            line: outcome.line,
            field: "output".into(),
            message: format!("cannot encode the decision: {e}"),
            kind: Failure::Input,
        })?;
        out.push_str(&json);
        out.push('\n');
    }
    Ok(out)
}

/// A policy and its limiter on the run's store.
type Limited = (Arc<Policy>, Limiter<dyn Store>);

async fn replay(
    default: &Limited,
    script: &str,
    store: &SharedStore,
    clock: &ManualClock,
    touched: &mut BTreeSet<String>,
) -> Result<Vec<Outcome>, ScriptError> {
    let mut limiters: HashMap<String, Limited> = HashMap::new();
    let mut out = Vec::new();
    for (index, text) in script.lines().enumerate() {
        let number = index + 1;
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fail = |field: &str, message: String| ScriptError {
            line: number,
            field: field.to_string(),
            message,
            kind: Failure::Input,
        };
        let map = read_object(trimmed).map_err(|(field, message)| fail(&field, message))?;
        if let Some(to) = clock_line(&map, clock.now_micros())
            .map_err(|(field, message)| fail(&field, message))?
        {
            clock.set_micros(to);
            continue;
        }
        let req = parse_request(&map).map_err(|(field, message)| fail(&field, message))?;
        let (policy, limiter) = match &req.policy {
            None => default,
            Some(spec) => {
                if !limiters.contains_key(spec) {
                    let policy: Policy = spec
                        .parse()
                        .map_err(|e: paceline_store::InputError| fail("policy", e.to_string()))?;
                    let limiter = Limiter::with_store(policy.clone(), Arc::clone(store));
                    limiters.insert(spec.clone(), (Arc::new(policy), limiter));
                }
                &limiters[spec]
            }
        };
        let t_us = clock.now_micros();
        let key = req.key.as_str();
        if !touched.contains(key) {
            touched.insert(key.to_string());
        }
        let max_wait = req.max_wait_us.map(std::time::Duration::from_micros);
        let result = match (req.op, max_wait) {
            (SimOp::Reset, _) => limiter.reset(key).await.map(|()| None),
            (SimOp::Limit, _) => limiter.limit(key, req.cost).await.map(Some),
            (SimOp::Peek, _) => limiter.peek(key, req.cost).await.map(Some),
            (SimOp::Charge, _) => limiter.charge(key, req.cost).await.map(Some),
            (SimOp::Pace | SimOp::Acquire, None) => limiter.pace(key, req.cost).await.map(Some),
            (SimOp::Pace | SimOp::Acquire, Some(w)) => {
                limiter.try_pace(key, req.cost, w).await.map(Some)
            }
        };
        let decision = result.map_err(|e| match e {
            paceline_store::Error::Input(input) => fail(input.field(), input.message().to_string()),
            other => ScriptError {
                kind: Failure::Store,
                ..fail("store", other.to_string())
            },
        })?;
        if let (SimOp::Acquire, Some(d)) = (req.op, &decision) {
            if d.allowed {
                // The same rounding (to the nearest microsecond) as `delay_ms`.
                advance(clock, paceline_core::round_to_micros(d.delay))
                    .map_err(|message| fail("op", format!("acquire {message}")))?;
            }
        }
        out.push(Outcome {
            line: number,
            t_us,
            key: req.key,
            op: req.op,
            cost: req.cost,
            policy: Arc::clone(policy),
            decision,
        });
    }
    Ok(out)
}

pub(crate) type FieldError = (String, String);

pub(crate) fn field_err(field: &str, message: impl Into<String>) -> FieldError {
    (field.to_string(), message.into())
}

/// A JSON object read field by field, so that a field given twice is an error rather
/// than a silent "last one wins".
pub(crate) struct StrictObject(pub(crate) Map<String, Value>);

impl<'de> serde::Deserialize<'de> for StrictObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = StrictObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<StrictObject, A::Error> {
                let mut map = Map::new();
                while let Some((key, value)) = access.next_entry::<String, Value>()? {
                    if map.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!(
                            "field `{key}` is given twice"
                        )));
                    }
                    map.insert(key, value);
                }
                Ok(StrictObject(map))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A script line as a JSON object (a field given twice refused).
pub(crate) fn read_object(text: &str) -> Result<Map<String, Value>, FieldError> {
    let StrictObject(map) = serde_json::from_str(text).map_err(|e| {
        if e.is_data() {
            field_err("json", format!("each line must be one JSON object: {e}"))
        } else {
            field_err("json", format!("not valid JSON: {e}"))
        }
    })?;
    Ok(map)
}

/// A `sleep_ms` or `at_ms` line (`None`: neither): the time the clock moves to from `now`,
/// in µs, never backwards.
pub(crate) fn clock_line(map: &Map<String, Value>, now: u64) -> Result<Option<u64>, FieldError> {
    for field in ["sleep_ms", "at_ms"] {
        let Some(value) = map.get(field) else {
            continue;
        };
        if let Some(other) = map.keys().find(|k| k.as_str() != field) {
            return Err(field_err(
                other,
                format!("a `{field}` line takes no other field"),
            ));
        }
        let us = millis_to_micros(field, value)?;
        let to = if field == "sleep_ms" {
            now.saturating_add(us)
        } else if us < now {
            return Err(field_err(
                field,
                format!(
                    "{} is before the current time {} ms; the clock cannot go backwards",
                    micros_ms(us),
                    micros_ms(now)
                ),
            ));
        } else {
            us
        };
        if to > MAX_CLOCK_US {
            return Err(field_err(
                field,
                format!(
                    "would move the clock past its maximum of {} ms",
                    micros_ms(MAX_CLOCK_US)
                ),
            ));
        }
        return Ok(Some(to));
    }
    Ok(None)
}

/// A non-negative number of milliseconds, rounded to the microsecond.
pub(crate) fn millis_to_micros(field: &str, value: &Value) -> Result<u64, FieldError> {
    let ms = value.as_f64().ok_or_else(|| {
        field_err(
            field,
            format!("must be a number of milliseconds, not {value}"),
        )
    })?;
    if !ms.is_finite() || ms < 0.0 {
        return Err(field_err(
            field,
            format!("must be a non-negative number, not {value}"),
        ));
    }
    let us = (ms * 1000.0).round();
    if us > MAX_CLOCK_US as f64 {
        return Err(field_err(field, format!("{value} is too large")));
    }
    Ok(us as u64)
}

fn parse_request(map: &Map<String, Value>) -> Result<Request, FieldError> {
    const FIELDS: [&str; 5] = ["key", "op", "cost", "max_wait_ms", "policy"];
    if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(field_err(
            unknown,
            "unknown field; a request takes key, op, cost, max_wait_ms and policy \
             (other lines: sleep_ms or at_ms)",
        ));
    }
    let key = match map.get("key") {
        None => "default".to_string(),
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(field_err("key", "must not be empty")),
        Some(other) => return Err(field_err("key", format!("must be a string, not {other}"))),
    };
    let op = match map.get("op") {
        None => SimOp::Pace,
        Some(Value::String(s)) => match s.as_str() {
            "pace" => SimOp::Pace,
            "limit" => SimOp::Limit,
            "acquire" => SimOp::Acquire,
            "peek" => SimOp::Peek,
            "charge" => SimOp::Charge,
            "reset" => SimOp::Reset,
            other => {
                return Err(field_err(
                    "op",
                    format!(
                        "`{other}` is not an op; use pace, limit, acquire, peek, charge or reset"
                    ),
                ))
            }
        },
        Some(other) => return Err(field_err("op", format!("must be a string, not {other}"))),
    };
    let cost = match map.get("cost") {
        None => 1,
        Some(_) if op == SimOp::Reset => return Err(field_err("cost", "`reset` takes no cost")),
        Some(v) => match v.as_u64() {
            Some(c) if c >= 1 => c,
            _ => {
                return Err(field_err(
                    "cost",
                    format!("must be a whole number >= 1, not {v}"),
                ))
            }
        },
    };
    let max_wait_us = match map.get("max_wait_ms") {
        None => None,
        Some(_) if !matches!(op, SimOp::Pace | SimOp::Acquire) => {
            return Err(field_err(
                "max_wait_ms",
                format!("applies to pace and acquire only, not {}", op.name()),
            ))
        }
        Some(v) => Some(millis_to_micros("max_wait_ms", v)?),
    };
    let policy = match map.get("policy") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(field_err(
                "policy",
                format!("must be a spec string, not {other}"),
            ))
        }
    };
    Ok(Request {
        key,
        op,
        cost,
        max_wait_us,
        policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(policy: &str, script: &str) -> Result<Vec<Value>, ScriptError> {
        let out = run(policy.parse().unwrap(), script)?;
        Ok(out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect())
    }

    #[test]
    fn the_contract_example_shape() {
        let out = sim(
            "gcra:rate=5/s",
            "# a comment\n\n{\"at_ms\": 20}\n{\"key\": \"k\"}\n{\"key\": \"k\", \"op\": \"pace\"}\n",
        )
        .unwrap();
        assert_eq!(
            out[1],
            serde_json::json!({"line": 5, "t_ms": 20.0, "key": "k", "op": "pace", "allowed": true,
                "delay_ms": 200.0, "remaining": 0, "reset_after_ms": 400.0, "limit": 1})
        );
    }

    #[test]
    fn acquire_advances_the_virtual_clock_and_reset_has_no_decision() {
        let out = sim(
            "gcra:rate=10/s",
            "{\"op\": \"acquire\"}\n{\"op\": \"acquire\"}\n{\"op\": \"limit\"}\n{\"op\": \"reset\"}\n{\"op\": \"limit\"}",
        )
        .unwrap();
        assert_eq!(out[1]["delay_ms"], 100.0);
        assert_eq!(out[2]["t_ms"], 100.0);
        assert_eq!(out[2]["allowed"], false);
        assert_eq!(
            out[3],
            serde_json::json!({"line": 4, "t_ms": 100.0, "key": "default", "op": "reset"})
        );
        assert_eq!(out[4]["allowed"], true);
    }

    #[test]
    fn a_charge_counts_past_the_limit_until_the_bucket_drains() {
        // 10 charged on a bucket of 2 at 10/s: the next limit waits 0.9 s for a cell.
        let out = sim(
            "gcra:rate=10/s,burst=2",
            "{\"op\": \"charge\", \"cost\": 10}\n{\"op\": \"limit\"}\n{\"at_ms\": 900}\n{\"op\": \"limit\"}",
        )
        .unwrap();
        assert_eq!(
            (
                out[0]["op"].clone(),
                out[0]["allowed"].clone(),
                out[0]["remaining"].clone()
            ),
            (
                serde_json::json!("charge"),
                serde_json::json!(true),
                serde_json::json!(0)
            )
        );
        assert_eq!(out[1]["allowed"], false);
        assert_eq!(out[1]["delay_ms"], 900.0);
        assert_eq!(out[2]["allowed"], true);
    }

    #[test]
    fn per_line_policy_is_a_live_change_on_the_same_key() {
        let out = sim(
            "gcra:rate=1/s",
            "{\"op\": \"limit\"}\n{\"op\": \"limit\", \"policy\": \"gcra:rate=1/s,burst=2\"}",
        )
        .unwrap();
        assert_eq!(out[1]["allowed"], true);
        assert_eq!(out[1]["limit"], 2);
    }

    #[test]
    fn acquire_advances_by_the_printed_delay() {
        let out = sim(
            "pacer:rate=3/s",
            "{\"op\": \"acquire\"}\n{\"op\": \"acquire\"}\n{}",
        )
        .unwrap();
        assert_eq!(out[1]["delay_ms"], 333.333);
        assert_eq!(out[2]["t_ms"], 333.333);
    }

    #[test]
    fn the_clock_stops_at_its_maximum() {
        let script = "{\"sleep_ms\": 9e12}\n".repeat(3);
        let e = sim("gcra:rate=1/s", &script).unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (2, "sleep_ms"),
            "2 x 9e15 µs > 2^53 µs"
        );
    }

    #[test]
    fn max_wait_and_fractional_times() {
        let out = sim(
            "gcra:rate=10/s",
            "{}\n{\"sleep_ms\": 0.5}\n{\"max_wait_ms\": 50}\n{\"max_wait_ms\": 99.5}",
        )
        .unwrap();
        assert_eq!(out[1]["allowed"], false);
        assert_eq!(out[1]["delay_ms"], 49.5);
        assert_eq!(out[1]["t_ms"], 0.5);
        assert_eq!(out[2]["allowed"], true);
        assert_eq!(out[2]["delay_ms"], 99.5);
    }

    #[test]
    fn invalid_lines_name_the_line_and_the_field() {
        let cases = [
            ("{\"cost\": 0}", 1, "cost"),
            ("{\"cost\": 1.5}", 1, "cost"),
            ("{\"cost\": \"1\"}", 1, "cost"),
            ("{\"op\": \"jump\"}", 1, "op"),
            ("{\"key\": 3}", 1, "key"),
            ("{\"key\": \"\"}", 1, "key"),
            ("{\"colour\": \"red\"}", 1, "colour"),
            ("# c\n{\"sleep_ms\": -1}", 2, "sleep_ms"),
            ("{\"sleep_ms\": 1, \"key\": \"k\"}", 1, "key"),
            ("{\"at_ms\": 10}\n{\"at_ms\": 5}", 2, "at_ms"),
            ("{\"op\": \"limit\", \"max_wait_ms\": 5}", 1, "max_wait_ms"),
            ("{\"op\": \"reset\", \"cost\": 2}", 1, "cost"),
            ("{\"policy\": \"gcra:rate=0\"}", 1, "policy"),
            ("{\"policy\": 5}", 1, "policy"),
            ("[1, 2]", 1, "json"),
            ("{not json", 1, "json"),
            ("{\"cost\": 1, \"cost\": 5}", 1, "json"),
            ("{\"sleep_ms\": 9e15}", 1, "sleep_ms"),
            ("{\"op\": \"limit\", \"cost\": 2}", 1, "cost"),
        ];
        for (script, line, field) in cases {
            let e = sim("gcra:rate=1/s", script).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{script}: {e}");
        }
    }
}

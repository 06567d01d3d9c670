//! `paceline simulate --queue`: a job-queue script replayed on a virtual clock, so that a
//! user sees what a group policy does to a backlog before deploying it.
//!
//! The queue is the in-memory queue's own core ([`QueueCore`]) on a clock that starts at
//! 0 ms and moves only when a line says so, so a script always prints the same events.
//! Every line is checked strictly; an invalid one stops the run with an error naming the
//! line and the field, and nothing is printed.

use std::collections::HashMap;
use std::time::Duration;

use paceline_queue::schedule::Schedule;
use paceline_queue::{FailOutcome, Failure, NewJob, QueueConfig, QueueCore, QueueError};
use serde_json::{json, Map, Value};

use crate::simulate::{
    clock_line, field_err, micros_ms, millis_to_micros, read_object, FieldError, ScriptError,
};

/// The most jobs one `enqueue` line may add.
const MAX_COUNT: u64 = 100_000;
/// The most starts one `run` line may make before it stops.
const MAX_RUN_STARTS: usize = 1_000_000;
/// The most lease rounds one `run` line may take before it stops.
const MAX_RUN_ROUNDS: usize = 10_000_000;

/// Runs `script` on a fresh queue of `config`; returns one JSON object per event.
pub fn run(config: QueueConfig, script: &str) -> Result<String, ScriptError> {
    let mut queue = QueueCore::new(config).map_err(|e| ScriptError {
        line: 0,
        field: format!("queue.{}", e.field()),
        message: e.message().to_string(),
        kind: crate::simulate::Failure::Input,
    })?;
    let mut sim = Sim {
        queue: &mut queue,
        now: 0,
        held: HashMap::new(),
        out: String::new(),
        line: 0,
    };
    for (index, text) in script.lines().enumerate() {
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        sim.line = index + 1;
        sim.step(trimmed).map_err(|(field, message)| ScriptError {
            line: index + 1,
            field,
            message,
            kind: crate::simulate::Failure::Input,
        })?;
    }
    Ok(sim.out)
}

struct Sim<'a> {
    queue: &'a mut QueueCore,
    /// The virtual clock, in µs.
    now: u64,
    /// The leases the script holds, by job id.
    held: HashMap<String, u64>,
    out: String,
    line: usize,
}

/// The fields a line of each op may have.
fn fields_of(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "enqueue" => &[
            "op",
            "group",
            "count",
            "id",
            "delay_ms",
            "not_before_ms",
            "max_attempts",
            "payload",
            "dedup",
            "priority",
            "cost",
        ],
        "lease" => &["op", "worker", "max_jobs", "lease_ms"],
        "pause" => &["op", "group", "ms"],
        "resume" => &["op", "group"],
        "policy" => &["op", "group", "policy"],
        "ack" | "crash" => &["op", "id"],
        "fail" => &[
            "op",
            "id",
            "error",
            "retry_after_ms",
            "pause_group_ms",
            "fatal",
        ],
        "run" => &["op", "until_ms"],
        "stats" => &["op"],
        "schedule" => &["op", "name", "cron", "group", "payload", "timezone"],
        "unschedule" => &["op", "name"],
        _ => return None,
    })
}

fn text<'m>(map: &'m Map<String, Value>, field: &str) -> Result<Option<&'m str>, FieldError> {
    match map.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(field_err(field, format!("must be a string, not {other}"))),
    }
}

fn count(map: &Map<String, Value>, field: &str, max: u64) -> Result<Option<u64>, FieldError> {
    match map.get(field) {
        None => Ok(None),
        Some(v) => match v.as_u64().filter(|n| (1..=max).contains(n)) {
            Some(n) => Ok(Some(n)),
            None => Err(field_err(
                field,
                format!("must be a whole number from 1 to {max}, not {v}"),
            )),
        },
    }
}

fn millis(map: &Map<String, Value>, field: &str) -> Result<Option<Duration>, FieldError> {
    map.get(field)
        .map(|v| millis_to_micros(field, v).map(Duration::from_micros))
        .transpose()
}

/// `job` deduplicated as `dedup` says: `{"key", "ttl_ms", "replace"?}`.
fn with_dedup(job: NewJob, dedup: &Value) -> Result<NewJob, FieldError> {
    let Value::Object(d) = dedup else {
        return Err(field_err(
            "dedup",
            "must be an object: {\"key\", \"ttl_ms\", \"replace\"?}",
        ));
    };
    if let Some(unknown) = d
        .keys()
        .find(|k| !["key", "ttl_ms", "replace"].contains(&k.as_str()))
    {
        return Err(field_err(
            &format!("dedup.{unknown}"),
            "unknown field; it takes key, ttl_ms, replace",
        ));
    }
    let key = text(d, "key")
        .map_err(|(_, m)| field_err("dedup.key", m))?
        .ok_or_else(|| field_err("dedup.key", "is required"))?;
    let ttl = millis(d, "ttl_ms")
        .map_err(|(_, m)| field_err("dedup.ttl_ms", m))?
        .ok_or_else(|| field_err("dedup.ttl_ms", "is required"))?;
    Ok(match d.get("replace") {
        None | Some(Value::Bool(false)) => job.dedup(key, ttl),
        Some(Value::Bool(true)) => job.debounce(key, ttl),
        Some(other) => {
            return Err(field_err(
                "dedup.replace",
                format!("must be true or false, not {other}"),
            ))
        }
    })
}

/// A queue error as a script error, naming the field.
fn queue_err(e: QueueError) -> FieldError {
    match e {
        // The not-before bound depends on the clock: the script's field is in milliseconds.
        QueueError::Input(e) if e.field() == "not_before" => {
            field_err("not_before_ms", e.message())
        }
        // The core names the fields the script has (the delay is checked as `delay_ms` before).
        QueueError::Input(e) => field_err(e.field(), e.message()),
        other => field_err("id", other.to_string()),
    }
}

impl Sim<'_> {
    /// Prints one event: `line`, `t_ms` and `event` first, then its fields.
    fn emit(&mut self, record: Value) {
        #[derive(serde::Serialize)]
        struct Event<'a> {
            line: usize,
            t_ms: f64,
            event: &'a Value,
            #[serde(flatten)]
            fields: &'a Map<String, Value>,
        }
        let Value::Object(mut fields) = record else {
            return;
        };
        let event = fields.remove("event").unwrap_or(Value::Null);
        let line = Event {
            line: self.line,
            t_ms: micros_ms(self.now),
            event: &event,
            fields: &fields,
        };
        // A record of strings and numbers always serialises.
        if let Ok(text) = serde_json::to_string(&line) {
            self.out.push_str(&text);
            self.out.push('\n');
        }
    }

    fn step(&mut self, text: &str) -> Result<(), FieldError> {
        let map = read_object(text)?;
        if let Some(to) = clock_line(&map, self.now)? {
            return self.advance(to);
        }
        let op = text_required(&map, "op")?;
        let allowed = fields_of(op).ok_or_else(|| {
            field_err(
                "op",
                format!("`{op}` is not a queue op; use enqueue, lease, ack, fail, crash, run, stats, pause, resume, policy, schedule or unschedule (or a sleep_ms / at_ms line)"),
            )
        })?;
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(field_err(
                unknown,
                format!(
                    "unknown field; a `{op}` line takes {}",
                    allowed[1..].join(", ")
                ),
            ));
        }
        match op {
            "enqueue" => self.enqueue(&map),
            "lease" => self.lease(&map),
            "ack" => self.ack(&map),
            "fail" => self.fail(&map),
            "crash" => {
                let id = text_required(&map, "id")?;
                self.take_lease(id)?;
                self.emit(json!({"event": "crashed", "id": id}));
                Ok(())
            }
            "run" => self.run_workers(&map),
            "pause" => self.pause(&map),
            "resume" => self.resume(&map),
            "policy" => self.set_policy(&map),
            "schedule" => self.put_schedule(&map),
            "unschedule" => {
                let name = text_required(&map, "name")?;
                let removed = self
                    .queue
                    .delete_schedule(self.now, name)
                    .map_err(queue_err)?;
                self.emit(json!({"event": "unscheduled", "name": name, "removed": removed}));
                Ok(())
            }
            _ => {
                let stats = self.queue.stats(self.now).map_err(queue_err)?;
                let groups: Map<String, Value> = stats
                    .groups
                    .iter()
                    .map(|g| {
                        (
                            g.group.clone(),
                            json!({"waiting": g.waiting, "active": g.active, "next_eligible_ms": g.next_eligible.map(micros_ms)}),
                        )
                    })
                    .collect();
                self.emit(json!({
                    "event": "stats",
                    "scheduled": stats.scheduled,
                    "waiting": stats.waiting,
                    "active": stats.active,
                    "dead": stats.dead,
                    "groups": groups,
                }));
                Ok(())
            }
        }
    }

    fn pause(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let group = text(map, "group")?;
        let until = self
            .queue
            .pause(self.now, group, millis(map, "ms")?)
            .map_err(queue_err)?;
        let until = (until != paceline_queue::core::UNTIL_RESUMED).then(|| micros_ms(until));
        self.emit(json!({"event": "paused", "group": group, "until_ms": until}));
        Ok(())
    }

    fn resume(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let group = text(map, "group")?;
        self.queue.resume(self.now, group).map_err(queue_err)?;
        self.emit(json!({"event": "resumed", "group": group}));
        Ok(())
    }

    /// `{"op": "schedule", "name", "cron", "group", "payload"?, "timezone"?}`: keeps a
    /// schedule, whose ticks then fire at their times as the script's clock moves.
    fn put_schedule(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let name = text_required(map, "name")?;
        let cron = text_required(map, "cron")?;
        let group = text_required(map, "group")?;
        let payload = map
            .get("payload")
            .map_or(b"null".to_vec(), |v| v.to_string().into_bytes());
        let mut schedule = Schedule::new(cron, group, payload);
        if let Some(zone) = text(map, "timezone")? {
            schedule = schedule.timezone(zone);
        }
        let next = schedule
            .next_after(self.now)
            .map_err(|e| field_err(e.field(), e.message()))?;
        let kept = self
            .queue
            .put_schedule(self.now, name, schedule, next)
            .map_err(queue_err)?;
        self.emit(json!({"event": "scheduled", "name": name, "next_ms": micros_ms(kept.next)}));
        Ok(())
    }

    /// The schedule whose tick comes first, if it comes by `to`: (its tick, its name).
    fn next_tick(&self, to: u64) -> Option<(u64, String)> {
        self.queue
            .schedules()
            .into_iter()
            .filter(|s| s.next <= to)
            .map(|s| (s.next, s.name))
            .min()
    }

    /// Moves the script's clock to `to` (never back), firing every schedule's ticks on the
    /// way, each at its time (a service that never stops fires them so).
    fn advance(&mut self, to: u64) -> Result<(), FieldError> {
        let mut fired = 0usize;
        while let Some((due, name)) = self.next_tick(to) {
            fired += 1;
            if fired > MAX_RUN_STARTS {
                return Err(field_err(
                    "sleep_ms",
                    format!("the clock's move fires more than {MAX_RUN_STARTS} schedule ticks; move it in shorter steps"),
                ));
            }
            self.now = self.now.max(due);
            let schedule = self
                .queue
                .schedules()
                .into_iter()
                .find(|s| s.name == name)
                .map(|s| s.schedule);
            let Some(schedule) = schedule else {
                break;
            };
            // A schedule with no tick after this one fires once more at most: it stays due
            // at a time no clock reaches.
            let next = schedule.next_after(due).unwrap_or(u64::MAX >> 11);
            if let Some(e) = self
                .queue
                .fire_schedule(self.now, &name, due, next)
                .map_err(queue_err)?
            {
                self.emit(json!({
                    "event": "enqueued",
                    "id": e.id,
                    "group": schedule.group,
                    "schedule": name,
                    "state": e.state.name(),
                    "estimated_start_ms": micros_ms(e.estimated_start),
                }));
            }
        }
        self.now = self.now.max(to);
        Ok(())
    }

    fn set_policy(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let group = text_required(map, "group")?;
        let policy = match text(map, "policy")? {
            Some(spec) => Some(spec.parse().map_err(|e: paceline_core::InputError| {
                field_err(&format!("policy.{}", e.field()), e.message())
            })?),
            None => None,
        };
        self.queue
            .set_policy(self.now, group, policy)
            .map_err(queue_err)?;
        let (policy, source) = self.queue.policy(group).map_err(queue_err)?;
        self.emit(json!({"event": "policy", "group": group, "policy": policy.to_string(), "source": source.name()}));
        Ok(())
    }

    fn enqueue(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let group = text_required(map, "group")?;
        let n = count(map, "count", MAX_COUNT)?.unwrap_or(1);
        let id = text(map, "id")?;
        if id.is_some() && n > 1 {
            return Err(field_err("id", "names one job: use it without `count`"));
        }
        let payload = map
            .get("payload")
            .map_or(b"null".to_vec(), |v| v.to_string().into_bytes());
        let mut job = NewJob::new(group, payload);
        if let Some(id) = id {
            job = job.id(id);
        }
        if let Some(delay) = millis(map, "delay_ms")? {
            if delay > paceline_queue::job::MAX_DELAY {
                return Err(field_err("delay_ms", "must be at most 365 days"));
            }
            job = job.delay(delay);
        }
        // A time on the script's clock.
        if let Some(at) = millis(map, "not_before_ms")? {
            job = job.not_before(std::time::UNIX_EPOCH + at);
        }
        if let Some(attempts) = count(map, "max_attempts", u64::from(u32::MAX))? {
            job = job.max_attempts(u32::try_from(attempts).unwrap_or(u32::MAX));
        }
        if let Some(dedup) = map.get("dedup") {
            job = with_dedup(job, dedup)?;
        }
        if let Some(v) = map.get("priority") {
            let max = paceline_queue::job::MAX_PRIORITY;
            let p = v
                .as_u64()
                .and_then(|p| u8::try_from(p).ok())
                .filter(|p| *p <= max)
                .ok_or_else(|| {
                    field_err(
                        "priority",
                        format!("must be a whole number from 0 (the default) to {max}, not {v}"),
                    )
                })?;
            job = job.priority(p);
        }
        let max_cost = u64::from(paceline_queue::job::MAX_COST);
        if let Some(cost) = count(map, "cost", max_cost)? {
            job = job.cost(u32::try_from(cost).unwrap_or(u32::MAX));
        }
        // Checked once, so that an invalid line adds no job.
        job.validate(self.queue.config().max_payload)
            .map_err(|e| queue_err(e.into()))?;
        for _ in 0..n {
            let e = self
                .queue
                .enqueue(self.now, job.clone())
                .map_err(queue_err)?;
            self.emit(json!({
                "event": if e.deduplicated { "deduplicated" } else if e.created { "enqueued" } else { "exists" },
                "id": e.id,
                "group": group,
                "state": e.state.name(),
                "estimated_start_ms": micros_ms(e.estimated_start),
            }));
        }
        Ok(())
    }

    fn started(&mut self, job: &paceline_queue::Leased) {
        self.emit(json!({
            "event": "started",
            "id": job.id,
            "group": job.group,
            "attempt": job.attempt,
            "lease_expires_ms": micros_ms(job.lease_expires),
        }));
    }

    fn lease(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let worker = text(map, "worker")?.unwrap_or("simulate");
        let max_jobs = count(map, "max_jobs", 1_000)?.unwrap_or(1);
        let lease = millis(map, "lease_ms")?;
        let jobs = self
            .queue
            .lease(
                self.now,
                worker,
                usize::try_from(max_jobs).unwrap_or(1),
                lease,
            )
            .map_err(queue_err)?;
        if jobs.is_empty() {
            let next = self.queue.next_event().map(micros_ms);
            self.emit(json!({"event": "none", "next_event_ms": next}));
        }
        for job in jobs {
            self.started(&job);
            self.held.insert(job.id.clone(), job.lease);
        }
        Ok(())
    }

    fn take_lease(&mut self, id: &str) -> Result<u64, FieldError> {
        self.held.remove(id).ok_or_else(|| {
            field_err(
                "id",
                format!("the script holds no lease on job `{id}` (lease it first)"),
            )
        })
    }

    fn ack(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let id = text_required(map, "id")?;
        let token = self.take_lease(id)?;
        let event = match self.queue.ack(self.now, id, token) {
            Ok(()) => "acked",
            // A job gone (acknowledged through another lease) is a lease lost to the script.
            Err(QueueError::LeaseLost { .. } | QueueError::UnknownJob { .. }) => "lease_lost",
            Err(e) => return Err(queue_err(e)),
        };
        self.emit(json!({"event": event, "id": id}));
        Ok(())
    }

    fn fail(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let id = text_required(map, "id")?;
        let error = text(map, "error")?.map(str::to_string);
        let after = millis(map, "retry_after_ms")?;
        let pause = millis(map, "pause_group_ms")?;
        let fatal = match map.get("fatal") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(field_err(
                    "fatal",
                    format!("must be true or false, not {other}"),
                ))
            }
        };
        let failure = Failure::from_parts(error, fatal, after, pause)
            .map_err(|e| field_err(e.field(), e.message()))?;
        let token = self.take_lease(id)?;
        // The jitter is fixed (the middle of its range) so that a script's output is the same
        // on every run.
        let record = match self.queue.fail(self.now, id, token, failure, 0.5) {
            Ok(FailOutcome::Retrying { at }) => {
                json!({"event": "failed", "id": id, "outcome": "retrying", "at_ms": micros_ms(at)})
            }
            Ok(FailOutcome::Dead) => json!({"event": "failed", "id": id, "outcome": "dead"}),
            Ok(FailOutcome::Paused { until }) => {
                json!({"event": "failed", "id": id, "outcome": "paused", "until_ms": micros_ms(until)})
            }
            Ok(FailOutcome::Released) => {
                json!({"event": "failed", "id": id, "outcome": "released"})
            }
            Ok(FailOutcome::Repeated) => {
                json!({"event": "failed", "id": id, "outcome": "repeated"})
            }
            Err(QueueError::LeaseLost { .. } | QueueError::UnknownJob { .. }) => {
                json!({"event": "lease_lost", "id": id})
            }
            Err(e) => return Err(queue_err(e)),
        };
        self.emit(record);
        Ok(())
    }

    /// Workers that lease every job as soon as it may start and acknowledge it at once,
    /// until nothing is left to happen (schedules' ticks aside), or until `until_ms` (its
    /// schedules' ticks fired on the way); the clock ends at the last
    /// event the run handled (or at `until_ms`). A job the script holds comes back, and is
    /// run, when its lease runs out.
    fn run_workers(&mut self, map: &Map<String, Value>) -> Result<(), FieldError> {
        let until = map
            .get("until_ms")
            .map(|v| millis_to_micros("until_ms", v))
            .transpose()?;
        if let Some(until) = until {
            if until < self.now {
                return Err(field_err(
                    "until_ms",
                    format!(
                        "{} is before the current time {} ms",
                        micros_ms(until),
                        micros_ms(self.now)
                    ),
                ));
            }
        }
        let (mut starts, mut rounds) = (0, 0usize);
        loop {
            let jobs = self
                .queue
                .lease(self.now, "run", 1_000, None)
                .map_err(queue_err)?;
            for job in &jobs {
                self.started(job);
                self.held.remove(&job.id);
                self.queue
                    .ack(self.now, &job.id, job.lease)
                    .map_err(queue_err)?;
            }
            starts += jobs.len();
            if starts >= MAX_RUN_STARTS {
                return Err(field_err(
                    "op",
                    format!("`run` stopped after {MAX_RUN_STARTS} starts; give it an until_ms"),
                ));
            }
            // The next thing to happen: a group's turn, a due job, a lease running out (its
            // job then comes back). Due now with nothing started means work this call left
            // (more than a call handles): the next call goes on with it.
            // A schedule's tick is one too, fired on the way; without `until_ms`, ticks
            // alone (which never end) do not keep the run going.
            let tick = self.next_tick(until.unwrap_or(u64::MAX)).map(|(t, _)| t);
            let next = match (self.queue.next_event(), tick) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (None, b) if until.is_some() => b,
                (a, _) => a,
            };
            match next {
                Some(next) if until.is_none_or(|u| next <= u) => {
                    self.advance(next)?;
                }
                _ => break,
            }
            rounds += 1;
            if rounds > MAX_RUN_ROUNDS {
                return Err(field_err(
                    "op",
                    format!("`run` stopped after {MAX_RUN_ROUNDS} rounds; give it an until_ms"),
                ));
            }
        }
        if let Some(until) = until {
            self.now = self.now.max(until);
        }
        Ok(())
    }
}

fn text_required<'m>(map: &'m Map<String, Value>, field: &str) -> Result<&'m str, FieldError> {
    text(map, field)?.ok_or_else(|| field_err(field, "is required"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(spec: &str) -> QueueConfig {
        QueueConfig::new(spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}")))
    }

    fn events(out: &str) -> Vec<Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    #[test]
    fn a_backlog_starts_as_the_group_policy_allows() {
        let out = run(
            config("fixed_window:limit=2,window=10s"),
            "{\"op\": \"enqueue\", \"group\": \"g\", \"count\": 5}\n{\"op\": \"run\"}\n",
        )
        .unwrap();
        let events = events(&out);
        let estimates: Vec<f64> = events
            .iter()
            .filter(|e| e["event"] == "enqueued")
            .filter_map(|e| e["estimated_start_ms"].as_f64())
            .collect();
        assert_eq!(estimates, [0.0, 0.0, 10_000.0, 10_000.0, 20_000.0]);
        let starts: Vec<f64> = events
            .iter()
            .filter(|e| e["event"] == "started")
            .filter_map(|e| e["t_ms"].as_f64())
            .collect();
        assert_eq!(starts, estimates);
    }

    #[test]
    fn a_crashed_worker_s_job_returns_when_its_lease_expires() {
        let mut c = config("gcra:rate=100/s,burst=10");
        c.lease = Duration::from_secs(5);
        let script = r#"
{"op": "enqueue", "group": "g", "id": "a"}
{"op": "lease"}
{"op": "crash", "id": "a"}
{"sleep_ms": 4999}
{"op": "lease"}
{"sleep_ms": 1}
{"op": "lease"}
{"op": "ack", "id": "a"}
"#;
        let events = events(&run(c, script).unwrap());
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
        assert_eq!(
            kinds,
            ["enqueued", "started", "crashed", "none", "started", "acked"]
        );
        assert_eq!(events[4]["attempt"], 2);
        assert_eq!(events[3]["next_event_ms"], 5000.0);
    }

    #[test]
    fn a_run_goes_on_past_more_due_jobs_than_one_call_handles() {
        let script = "{\"op\": \"enqueue\", \"group\": \"g\", \"count\": 10}\n\
                      {\"op\": \"enqueue\", \"group\": \"g\", \"count\": 3000, \"delay_ms\": 1000}\n\
                      {\"op\": \"run\"}\n{\"op\": \"stats\"}\n";
        let events = events(&run(config("fixed_window:limit=10,window=10s"), script).unwrap());
        let started = events.iter().filter(|e| e["event"] == "started").count();
        assert_eq!(started, 3010);
        let stats = events.last().cloned().unwrap_or_default();
        assert_eq!(
            (stats["waiting"].as_u64(), stats["scheduled"].as_u64()),
            (Some(0), Some(0))
        );
    }

    #[test]
    fn a_schedule_fires_each_tick_at_its_time_and_alone_does_not_keep_a_run_going() {
        let script = "{\"op\": \"schedule\", \"name\": \"s\", \"cron\": \"*/5 * * * * *\", \"group\": \"g\"}\n\
                      {\"sleep_ms\": 12000}\n{\"op\": \"run\"}\n{\"op\": \"stats\"}\n";
        let events = events(&run(config("gcra:rate=100/s"), script).unwrap());
        let ticks: Vec<f64> = events
            .iter()
            .filter(|e| e["schedule"] == "s")
            .map(|e| e["t_ms"].as_f64().unwrap())
            .collect();
        assert_eq!(ticks, [5_000.0, 10_000.0]);
        // The run starts both jobs (the second 10 ms after the first, at 100/s) and ends
        // there, the next tick (15 s) notwithstanding.
        let last = events.last().unwrap();
        assert_eq!(
            (last["event"].as_str(), last["t_ms"].as_f64()),
            (Some("stats"), Some(12_010.0))
        );
        assert_eq!(last["waiting"], 0);
    }

    #[test]
    fn bad_lines_name_their_field() {
        for (line, field) in [
            (r#"{"op": "enqueue"}"#, "group"),
            (r#"{"op": "enqueue", "group": "g", "colour": 1}"#, "colour"),
            (r#"{"op": "enqueue", "group": "g", "count": 0}"#, "count"),
            (
                r#"{"op": "enqueue", "group": "g", "count": 2, "id": "x"}"#,
                "id",
            ),
            (
                r#"{"op": "enqueue", "group": "g", "delay_ms": -1}"#,
                "delay_ms",
            ),
            (r#"{"op": "enqueue", "group": ""}"#, "group"),
            (r#"{"op": "ack", "id": "nobody"}"#, "id"),
            (r#"{"op": "lease", "max_jobs": 1001}"#, "max_jobs"),
            (r#"{"op": "jump"}"#, "op"),
            (r#"{"sleep_ms": 1, "op": "run"}"#, "op"),
            ("[1]", "json"),
            (
                r#"{"op": "schedule", "name": "s", "cron": "0 0 30 2 *", "group": "g"}"#,
                "cron",
            ),
            (
                r#"{"op": "schedule", "name": "s", "cron": "* * * * *", "group": "g", "timezone": "Mars/Olympus"}"#,
                "timezone",
            ),
            (
                r#"{"op": "schedule", "name": "s", "cron": "* * * * *", "group": "g", "every": 1}"#,
                "every",
            ),
            (
                r#"{"op": "schedule", "cron": "* * * * *", "group": "g"}"#,
                "name",
            ),
            (r#"{"op": "unschedule"}"#, "name"),
        ] {
            let e = run(config("gcra:rate=1/s"), line).unwrap_err();
            assert_eq!(
                (e.line, e.field.as_str()),
                (1, field),
                "{line}: {}",
                e.message
            );
        }
        let e = run(config("exec_evenly:points=1,duration=1s"), "").unwrap_err();
        assert_eq!(e.field, "queue.group_policy");
    }
}

//! Schedules (repeatable jobs): a job enqueued at each tick of a cron expression, exactly
//! once per tick however many processes share the queue.
//!
//! The queue keeps each schedule with its next tick. A process that sees a tick due asks
//! the queue to fire it with the tick it saw and the one after now; the queue enqueues the
//! job and moves the schedule on only if its next tick is still the one seen, in one
//! atomic step, so of several processes that see the same tick exactly one enqueues. A
//! tick missed while no process ran is fired once when one comes back (the next after it is
//! the first after the time it came back, not after the missed one): missed ticks are not
//! made up one by one.

use std::str::FromStr;
use std::time::Duration;

use chrono::TimeZone;
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use paceline_core::InputError;

use crate::config::check_group;

/// The longest schedule name, in bytes (a job id's).
pub const MAX_SCHEDULE_NAME: usize = crate::job::MAX_ID;

/// How often a process running the schedules looks for schedules made or changed elsewhere
/// (another process sharing the queue), at the longest.
pub const SCHEDULE_POLL: Duration = Duration::from_secs(1);

/// A schedule: the job to enqueue at each tick of `cron` in `timezone`.
///
/// ```
/// use paceline_queue::schedule::Schedule;
/// let nightly = Schedule::new("0 3 * * *", "reports", b"{\"kind\": \"daily\"}".to_vec())
///     .timezone("Europe/Paris");
/// // 2026-11-28 12:00 UTC: the next 03:00 in Paris is 02:00 UTC the next day.
/// let noon = 1_795_867_200_000_000;
/// assert_eq!(nightly.next_after(noon)?, 1_795_917_600_000_000);
/// # Ok::<(), paceline_core::InputError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// A cron expression: five fields (minute hour day-of-month month day-of-week), or six
    /// with seconds first; names (`MON`, `JAN`), ranges, steps and lists as cron has them.
    pub cron: String,
    /// The IANA time zone the expression is read in (`Europe/Paris`); `None`: UTC.
    pub timezone: Option<String>,
    /// The group of the jobs it enqueues.
    pub group: String,
    /// Their payload.
    pub payload: Vec<u8>,
}

/// A schedule as the queue keeps it: its name, what it enqueues, and its next tick (µs
/// since the Unix epoch on the queue's clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// What it enqueues, and when.
    pub schedule: Schedule,
    /// Its next tick.
    pub next: u64,
}

impl Schedule {
    /// A schedule of `cron` in UTC enqueueing `payload` into `group`.
    pub fn new(cron: impl Into<String>, group: impl Into<String>, payload: Vec<u8>) -> Schedule {
        Schedule {
            cron: cron.into(),
            timezone: None,
            group: group.into(),
            payload,
        }
    }

    /// Reads the expression in `timezone` (an IANA name) instead of UTC; `UTC` itself is
    /// kept as no time zone, so that a schedule read back and put again is the same one.
    #[must_use]
    pub fn timezone(mut self, timezone: impl Into<String>) -> Schedule {
        let timezone = timezone.into();
        self.timezone = (timezone != "UTC").then_some(timezone);
        self
    }

    /// Checks the schedule against a queue's largest payload, naming the field at fault;
    /// an expression that never fires after `now` is refused too.
    pub fn validate(&self, max_payload: usize, now: u64) -> Result<(), InputError> {
        check_group(&self.group)?;
        if self.payload.len() > max_payload {
            return Err(InputError::new(
                "payload",
                format!(
                    "is {} bytes; this queue takes at most {max_payload}",
                    self.payload.len()
                ),
            ));
        }
        self.next_after(now).map(drop)
    }

    /// The first tick strictly after `now` (µs since the Unix epoch).
    pub fn next_after(&self, now: u64) -> Result<u64, InputError> {
        let cron = self.compiled()?;
        let zone = self.zone()?;
        let never = || {
            InputError::new(
                "cron",
                format!(
                    "`{}` never fires after now; check its days and months",
                    self.cron
                ),
            )
        };
        let micros = i64::try_from(now).map_err(|_| never())?;
        let start = zone.timestamp_micros(micros).single().ok_or_else(never)?;
        let next = cron
            .find_next_occurrence(&start, false)
            .map_err(|_| never())?;
        u64::try_from(next.timestamp_micros()).map_err(|_| never())
    }

    fn compiled(&self) -> Result<Cron, InputError> {
        if self.cron.len() > 256 {
            return Err(InputError::new("cron", "must be at most 256 bytes"));
        }
        CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(&self.cron)
            .map_err(|e| {
                InputError::new(
                    "cron",
                    format!(
                        "`{}` is not a cron expression ({e}); use five fields (minute hour \
                         day month weekday), or six with seconds first, e.g. \"0 3 * * *\"",
                        self.cron
                    ),
                )
            })
    }

    fn zone(&self) -> Result<chrono_tz::Tz, InputError> {
        match &self.timezone {
            None => Ok(chrono_tz::UTC),
            Some(name) => chrono_tz::Tz::from_str(name).map_err(|_| {
                // Echoed only when short: a zone name is at most a few dozen bytes.
                let shown = if name.len() <= 64 {
                    format!("`{name}`")
                } else {
                    "that".into()
                };
                InputError::new(
                    "timezone",
                    format!("{shown} is not an IANA time zone, e.g. \"Europe/Paris\" or \"UTC\""),
                )
            }),
        }
    }
}

/// The names a schedule's `timezone` may be: the IANA time zones (and their links) this
/// build knows, as the API's document lists them.
pub fn time_zones() -> impl Iterator<Item = &'static str> {
    chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())
}

/// Schedule names: 1 to [`MAX_SCHEDULE_NAME`] bytes of `A-Z a-z 0-9 - _ . :`.
pub fn check_schedule_name(name: &str) -> Result<(), InputError> {
    if !crate::job::id_like(name) {
        return Err(InputError::new(
            "name",
            format!("must be 1 to {MAX_SCHEDULE_NAME} bytes of A-Z a-z 0-9 - _ . :"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOON: u64 = 1_795_867_200_000_000; // 2026-11-28 12:00:00 UTC

    #[test]
    fn ticks_come_strictly_after_now_with_or_without_seconds() {
        let every_ten = Schedule::new("*/10 * * * * *", "g", Vec::new());
        assert_eq!(every_ten.next_after(NOON), Ok(NOON + 10_000_000));
        assert_eq!(every_ten.next_after(NOON + 1), Ok(NOON + 10_000_000));
        let hourly = Schedule::new("0 * * * *", "g", Vec::new());
        assert_eq!(hourly.next_after(NOON), Ok(NOON + 3_600_000_000));
    }

    #[test]
    fn bad_schedules_name_their_field() {
        let field = |s: Schedule| s.validate(1024, NOON).map_err(|e| e.field().to_string());
        let ok = || Schedule::new("0 3 * * *", "g", b"{}".to_vec());
        assert_eq!(field(ok()), Ok(()));
        for (bad, named) in [
            (Schedule::new("not cron", "g", Vec::new()), "cron"),
            (Schedule::new("0 0 30 2 *", "g", Vec::new()), "cron"),
            (Schedule::new("61 * * * *", "g", Vec::new()), "cron"),
            (Schedule::new("*".repeat(300), "g", Vec::new()), "cron"),
            (ok().timezone("Mars/Olympus"), "timezone"),
            (Schedule::new("0 3 * * *", "", Vec::new()), "group"),
            (Schedule::new("0 3 * * *", "g", vec![b'x'; 2000]), "payload"),
        ] {
            assert_eq!(field(bad), Err(named.to_string()));
        }
        assert!(check_schedule_name("nightly-report:v2").is_ok());
        for bad in ["", "a b", "x/y", &"n".repeat(129)] {
            assert_eq!(
                check_schedule_name(bad).map_err(|e| e.field().to_string()),
                Err("name".into())
            );
        }
    }
}

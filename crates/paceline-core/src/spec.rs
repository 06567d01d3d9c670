//! The policy spec language: `ALGORITHM:name=value,name=value`.
//!
//! Rates: `10/s`, `5/10s`, `100/m`, `1000/h`, `1/d`, `2/250ms`, or a bare number (per
//! second). Durations: a number and a unit, `us`, `ms`, `s`, `m`, `h` or `d` (`250ms`, `1.5s`,
//! `5m`). Counts are positive integers. Every error names the field and says what is allowed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::InputError;

/// The longest duration or rate period paceline accepts: 10 years, in microseconds.
pub const MAX_DURATION_US: u64 = 10 * 365 * 86_400 * 1_000_000;

/// The largest count (limit, burst, points) or cost paceline accepts: 2^40. Counts stay exact
/// in every store, including Redis's Lua, whose numbers are doubles.
pub const MAX_COUNT: u64 = 1 << 40;

/// The fastest rate paceline accepts: one per nanosecond.
pub const MAX_RATE_PER_SECOND: f64 = 1e9;

/// A rate: `amount` per `period`.
///
/// Built typed (`Rate::per_second(10)`, `Rate::new(5, Duration::from_secs(10))`) or parsed
/// from a spec (`"5/10s"`), with the same validation either way.
///
/// ```
/// use paceline_core::Rate;
/// use std::time::Duration;
/// let r: Rate = "5/10s".parse().unwrap();
/// assert_eq!(r, Rate::new(5, Duration::from_secs(10))?);
/// assert_eq!(r.events_per_second(), 0.5);
/// assert_eq!(r.interval_micros(), 2_000_000.0);
/// assert_eq!(r.to_string(), "5/10s");
/// assert_eq!("10".parse::<Rate>().unwrap().to_string(), "10/s");
/// assert_eq!(Rate::per_minute(100)?.to_string(), "100/m");
/// assert_eq!(Rate::per_second(0).unwrap_err().field(), "rate");
/// # Ok::<(), paceline_core::InputError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    amount: f64,
    period_us: u64,
}

impl Rate {
    /// `amount` per `period`, validated like a parsed rate for the field `rate`: a finite
    /// amount greater than zero, a period of whole microseconds greater than zero, at most
    /// 1e9 per second and at least one per 10 years.
    ///
    /// ```
    /// use paceline_core::Rate;
    /// use std::time::Duration;
    /// // Discord: 10 role updates per 10 seconds.
    /// let discord = Rate::new(10, Duration::from_secs(10))?;
    /// assert_eq!(discord.interval_micros(), 1_000_000.0);
    /// assert!(Rate::new(1, Duration::from_nanos(1500)).is_err()); // not whole µs
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn new(amount: impl Into<f64>, period: Duration) -> Result<Rate, InputError> {
        let amount = amount.into();
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(err(
                "rate",
                format!("the period {period:?} is not a whole number of microseconds"),
            ));
        }
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        Rate::checked("rate", amount, period_us)
    }

    /// `amount` per second.
    pub fn per_second(amount: impl Into<f64>) -> Result<Rate, InputError> {
        Rate::checked("rate", amount.into(), 1_000_000)
    }

    /// `amount` per minute.
    pub fn per_minute(amount: impl Into<f64>) -> Result<Rate, InputError> {
        Rate::checked("rate", amount.into(), 60_000_000)
    }

    /// `amount` per hour.
    pub fn per_hour(amount: impl Into<f64>) -> Result<Rate, InputError> {
        Rate::checked("rate", amount.into(), 3_600_000_000)
    }

    /// `amount` per day.
    pub fn per_day(amount: impl Into<f64>) -> Result<Rate, InputError> {
        Rate::checked("rate", amount.into(), 86_400_000_000)
    }

    fn checked(field: &str, amount: f64, period_us: u64) -> Result<Rate, InputError> {
        if !amount.is_finite() {
            return Err(err(field, "must be a finite number, e.g. `10/s`"));
        }
        if amount <= 0.0 {
            return Err(err(field, "must be greater than zero, e.g. `10/s`"));
        }
        if period_us == 0 {
            return Err(err(
                field,
                "the period must be greater than zero, e.g. `5/10s`",
            ));
        }
        let rate = Rate { amount, period_us };
        if rate.events_per_second() > MAX_RATE_PER_SECOND {
            return Err(err(field, "must be at most 1e9 per second"));
        }
        if rate.interval_micros() > MAX_DURATION_US as f64 {
            return Err(err(
                field,
                "is too slow: one event per more than 10 years; use a faster rate",
            ));
        }
        Ok(rate)
    }

    /// Events per second.
    pub fn events_per_second(&self) -> f64 {
        self.amount * 1e6 / self.period_us as f64
    }

    /// Microseconds between two events at this rate (the emission interval).
    #[inline]
    pub fn interval_micros(&self) -> f64 {
        self.period_us as f64 / self.amount
    }

    /// The amount per period.
    pub fn amount(&self) -> f64 {
        self.amount
    }

    /// The period, in microseconds.
    pub fn period_micros(&self) -> u64 {
        self.period_us
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period_us {
            1_000_000 => write!(f, "{}/s", self.amount),
            60_000_000 => write!(f, "{}/m", self.amount),
            3_600_000_000 => write!(f, "{}/h", self.amount),
            86_400_000_000 => write!(f, "{}/d", self.amount),
            p => write!(f, "{}/{}", self.amount, format_duration(p)),
        }
    }
}

impl std::str::FromStr for Rate {
    type Err = InputError;
    fn from_str(s: &str) -> Result<Rate, InputError> {
        parse_rate("rate", s)
    }
}

fn err(field: &str, message: impl Into<String>) -> InputError {
    InputError::new(field.to_string(), message)
}

/// Parses a rate such as `10/s`, `5/10s` or `20` (per second) for `field`.
pub fn parse_rate(field: &str, text: &str) -> Result<Rate, InputError> {
    let text = text.trim();
    let (amount, period) = match text.split_once('/') {
        Some((a, p)) => (a.trim(), Some(p.trim())),
        None => (text, None),
    };
    let amount = parse_number(amount).ok_or_else(|| {
        err(
            field,
            format!("`{text}` is not a rate; write `N/s`, `N/10s`, `N/m`, `N/h`, `N/d` or a number per second"),
        )
    })?;
    let period_us = match period {
        None => 1_000_000,
        Some(p) => {
            // `s`, `m`, ... mean one unit; `10s` means ten seconds.
            let with_count = if p.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                p.to_string()
            } else {
                format!("1{p}")
            };
            parse_duration(field, &with_count).map_err(|_| {
                err(
                    field,
                    format!("`{text}` has an unknown period `{p}`; use us, ms, s, m, h or d, e.g. `5/10s`"),
                )
            })?
        }
    };
    Rate::checked(field, amount, period_us)
}

fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.is_empty()
        || !t
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E')
    {
        // Rejects `inf`, `NaN` and anything that is not a plain decimal number.
        return None;
    }
    t.parse::<f64>().ok()
}

/// Parses a duration such as `250ms`, `1.5s`, `5m` for `field`, in whole microseconds.
/// Zero is an error unless `allow_zero`.
pub fn parse_duration_opt_zero(
    field: &str,
    text: &str,
    allow_zero: bool,
) -> Result<u64, InputError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let hint = "write a number and a unit: us, ms, s, m, h or d (e.g. `250ms`, `10s`)";
    let value =
        parse_number(num).ok_or_else(|| err(field, format!("`{t}` is not a duration; {hint}")))?;
    let scale = match unit.trim() {
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        "d" => 86_400e6,
        "" if value == 0.0 && allow_zero => 1.0,
        "" => return Err(err(field, format!("`{t}` has no unit; {hint}"))),
        other => {
            return Err(err(
                field,
                format!("`{t}` has an unknown unit `{other}`; {hint}"),
            ))
        }
    };
    if !value.is_finite() {
        return Err(err(field, format!("`{t}` is not a finite duration")));
    }
    if value < 0.0 {
        return Err(err(
            field,
            format!("`{t}` is negative; durations must be positive"),
        ));
    }
    let us = value * scale;
    if us > MAX_DURATION_US as f64 {
        return Err(err(
            field,
            format!("`{t}` is longer than the maximum of 3650d"),
        ));
    }
    if us.fract() != 0.0 {
        return Err(err(
            field,
            format!("`{t}` is not a whole number of microseconds"),
        ));
    }
    if us == 0.0 && !allow_zero {
        return Err(err(
            field,
            format!("`{t}` is zero; durations must be greater than zero"),
        ));
    }
    Ok(us as u64)
}

/// Parses a positive duration (zero is an error) in whole microseconds.
pub fn parse_duration(field: &str, text: &str) -> Result<u64, InputError> {
    parse_duration_opt_zero(field, text, false)
}

/// Formats microseconds with the largest unit that divides them exactly (`10s`, `250ms`).
pub fn format_duration(us: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ];
    if us == 0 {
        return "0s".to_string();
    }
    for (scale, unit) in UNITS {
        if us.is_multiple_of(scale) {
            return format!("{}{unit}", us / scale);
        }
    }
    format!("{us}us")
}

/// Parses a count (a positive integer up to [`MAX_COUNT`]) for `field`; `min` is the smallest
/// allowed value (0 or 1).
pub fn parse_count(field: &str, text: &str, min: u64) -> Result<u64, InputError> {
    let t = text.trim();
    let n: u64 = t.parse().map_err(|_| {
        err(
            field,
            format!("`{t}` is not a whole number; use an integer from {min} to {MAX_COUNT}"),
        )
    })?;
    if n < min || n > MAX_COUNT {
        return Err(err(
            field,
            format!("{n} is out of range; use an integer from {min} to {MAX_COUNT}"),
        ));
    }
    Ok(n)
}

/// Parses a finite number for `field`, checking it against `check` (which returns the rule
/// when violated).
pub fn parse_float(
    field: &str,
    text: &str,
    check: impl Fn(f64) -> Option<&'static str>,
) -> Result<f64, InputError> {
    let t = text.trim();
    let v = parse_number(t)
        .filter(|v| v.is_finite())
        .ok_or_else(|| err(field, format!("`{t}` is not a finite number")))?;
    match check(v) {
        Some(rule) => Err(err(field, format!("{v} is out of range: {rule}"))),
        None => Ok(v),
    }
}

/// Parses `true` or `false` for `field`.
pub fn parse_bool(field: &str, text: &str) -> Result<bool, InputError> {
    match text.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        t => Err(err(
            field,
            format!("`{t}` is not a boolean; use `true` or `false`"),
        )),
    }
}

/// The named parameters of one policy, read one by one; what is left over is an error.
#[derive(Debug)]
pub(crate) struct Params {
    algorithm: &'static str,
    allowed: &'static [&'static str],
    values: BTreeMap<String, String>,
}

impl Params {
    /// Collects `(name, value)` pairs for `algorithm`, renaming aliases and rejecting
    /// duplicates and unknown names.
    pub(crate) fn new<'a>(
        algorithm: &'static str,
        allowed: &'static [&'static str],
        aliases: &[(&str, &'static str)],
        pairs: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Result<Params, InputError> {
        let mut values = BTreeMap::new();
        for (name, value) in pairs {
            let name = name.trim();
            let canonical = aliases
                .iter()
                .find(|(alias, _)| *alias == name)
                .map_or(name, |(_, to)| *to);
            if !allowed.contains(&canonical) {
                return Err(InputError::new(
                    name.to_string(),
                    format!(
                        "unknown parameter for `{algorithm}`; allowed: {}",
                        allowed.join(", ")
                    ),
                ));
            }
            if values.insert(canonical.to_string(), value).is_some() {
                return Err(InputError::new(name.to_string(), "is given more than once"));
            }
        }
        Ok(Params {
            algorithm,
            allowed,
            values,
        })
    }

    pub(crate) fn optional(&mut self, name: &str) -> Option<String> {
        self.values.remove(name)
    }

    pub(crate) fn required(&mut self, name: &'static str) -> Result<String, InputError> {
        self.values.remove(name).ok_or_else(|| {
            InputError::new(
                name,
                format!(
                    "is required by `{}` (parameters: {})",
                    self.algorithm,
                    self.allowed.join(", ")
                ),
            )
        })
    }
}

/// An algorithm name and its `(name, value)` pairs.
pub(crate) type SplitSpec<'a> = (&'a str, Vec<(&'a str, String)>);

/// Splits `ALGORITHM:name=value,...` into the algorithm and its pairs.
pub(crate) fn split_spec(spec: &str) -> Result<SplitSpec<'_>, InputError> {
    let spec = spec.trim();
    let (algorithm, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let algorithm = algorithm.trim();
    if algorithm.is_empty() {
        return Err(InputError::new(
            "spec",
            "is empty; write `ALGORITHM:name=value,...`, e.g. `gcra:rate=10/s,burst=5`",
        ));
    }
    let mut pairs = Vec::new();
    for part in rest.split(',') {
        if part.trim().is_empty() {
            continue;
        }
        let (name, value) = part.split_once('=').ok_or_else(|| {
            InputError::new(
                "spec",
                format!("`{}` is not `name=value` (in `{spec}`)", part.trim()),
            )
        })?;
        pairs.push((name.trim(), value.trim().to_string()));
    }
    Ok((algorithm, pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_every_form() {
        let cases = [
            ("10/s", 10.0),
            ("5/10s", 0.5),
            ("120/m", 2.0),
            ("3600/h", 1.0),
            ("86400/d", 1.0),
            ("2/250ms", 8.0),
            ("20", 20.0),
            ("0.5", 0.5),
        ];
        for (text, per_second) in cases {
            let r = parse_rate("rate", text).unwrap();
            assert!((r.events_per_second() - per_second).abs() < 1e-12, "{text}");
            // Display re-parses to the same rate.
            assert_eq!(parse_rate("rate", &r.to_string()).unwrap(), r, "{text}");
        }
    }

    #[test]
    fn bad_rates_name_the_field() {
        for bad in [
            "0/s",
            "-1/s",
            "NaN",
            "inf/s",
            "1e400/s",
            "x/s",
            "10/fortnight",
            "10/0s",
            "",
            "2e9/s",
            "1/3651d",
        ] {
            let e = parse_rate("qps", bad).unwrap_err();
            assert_eq!(e.field(), "qps", "{bad}");
        }
    }

    #[test]
    fn durations_parse_and_reject_with_reasons() {
        assert_eq!(parse_duration("window", "250ms").unwrap(), 250_000);
        assert_eq!(parse_duration("window", "1.5s").unwrap(), 1_500_000);
        assert_eq!(parse_duration("window", "5m").unwrap(), 300_000_000);
        assert_eq!(parse_duration("window", "1d").unwrap(), 86_400_000_000);
        assert_eq!(parse_duration("window", "7us").unwrap(), 7);
        assert_eq!(
            parse_duration_opt_zero("min_interval", "0", true).unwrap(),
            0
        );
        for (bad, why) in [
            ("10", "no unit"),
            ("0s", "zero"),
            ("-1s", "negative"),
            ("1.5us", "whole number of microseconds"),
            ("3651d", "maximum"),
            ("5 fortnights", "unknown unit"),
            ("ms", "not a duration"),
        ] {
            let e = parse_duration("window", bad).unwrap_err();
            assert_eq!(e.field(), "window");
            assert!(e.message().contains(why), "{bad}: {}", e.message());
        }
    }

    #[test]
    fn durations_format_with_the_largest_exact_unit() {
        assert_eq!(format_duration(10_000_000), "10s");
        assert_eq!(format_duration(250_000), "250ms");
        assert_eq!(format_duration(90_000_000), "90s");
        assert_eq!(format_duration(7), "7us");
        assert_eq!(format_duration(0), "0s");
    }

    #[test]
    fn counts_floats_and_bools() {
        assert_eq!(parse_count("limit", "10", 1).unwrap(), 10);
        assert_eq!(parse_count("limit", "0", 1).unwrap_err().field(), "limit");
        assert!(parse_count("limit", "1.5", 1).is_err());
        assert!(parse_count("limit", "-3", 1).is_err());
        assert!(parse_count("limit", &(MAX_COUNT + 1).to_string(), 1).is_err());
        assert_eq!(parse_float("f", "0.5", |_| None).unwrap(), 0.5);
        assert!(parse_float("f", "NaN", |_| None).is_err());
        assert!(parse_float("f", "2", |v| (v > 1.0).then_some("at most 1")).is_err());
        assert!(parse_bool("count_blocked", "true").unwrap());
        assert!(parse_bool("count_blocked", "yes").is_err());
    }
}

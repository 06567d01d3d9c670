//! A policy's parameters as the Lua twins read them (`p[1]`, `p[2]`, ...).
//!
//! Floats are written in Rust's shortest round-trip form, which Lua's `tonumber` reads back
//! to the identical double; derived values (an emission interval, a permit cap) are sent as
//! Rust computed them, so the twins never recompute them differently.

use std::io::Write as _;

use paceline_core::{Op, Policy};
use redis::{Cmd, RedisWrite, ToRedisArgs};

/// Appends `policy`'s algorithm name, parameter count and parameters to `cmd`, each written
/// straight into the command's buffer.
pub(crate) fn push_policy(policy: &Policy, cmd: &mut Cmd) {
    cmd.arg(policy.algorithm()).arg(param_count(policy));
    push_params(policy, cmd);
}

/// How many parameters [`push_params`] writes for `policy`.
fn param_count(policy: &Policy) -> usize {
    match policy {
        Policy::Gcra(_)
        | Policy::FixedWindow(_)
        | Policy::SlidingWindow(_)
        | Policy::SmoothBursty(_) => 2,
        Policy::Pacer(_) | Policy::ExecEvenly(_) | Policy::SmoothWarmingUp(_) => 3,
        Policy::SlidingLog(_) => 4,
        Policy::Concurrency(_) => 2,
        _ => 0,
    }
}

/// Appends `policy`'s parameters to `cmd`, in the order its Lua twin reads them.
pub(crate) fn push_params(policy: &Policy, cmd: &mut Cmd) {
    match policy {
        Policy::Pacer(p) => {
            cmd.arg(Float(p.rate().interval_micros()))
                .arg(Float(p.max_burst()));
            match p.burst_allowance_factor() {
                Some(factor) => cmd.arg(Float(factor)),
                None => cmd.arg(""),
            }
        }
        Policy::Gcra(g) => cmd.arg(Float(g.rate().interval_micros())).arg(g.burst()),
        // Windows are whole microseconds (the spec parser works in µs).
        Policy::FixedWindow(f) => cmd.arg(f.limit()).arg(f.window().as_micros()),
        Policy::ExecEvenly(e) => cmd
            .arg(e.points())
            .arg(e.duration_micros())
            .arg(e.min_delay_micros()),
        Policy::SlidingLog(l) => cmd
            .arg(l.limit())
            .arg(l.window().as_micros())
            .arg(l.min_interval().as_micros())
            .arg(u8::from(l.count_blocked())),
        Policy::SlidingWindow(w) => cmd.arg(w.limit()).arg(w.window().as_micros()),
        // The Guava twins recompute their configuration from the same inputs as Rust's
        // `guava::Config` (`stable = 1e6 / per_second`, not `interval_micros`).
        Policy::SmoothBursty(b) => cmd
            .arg(Float(b.rate().events_per_second()))
            .arg(Float(b.max_burst_seconds())),
        Policy::SmoothWarmingUp(w) => cmd
            .arg(Float(w.rate().events_per_second()))
            .arg(w.warmup_micros())
            .arg(Float(w.cold_factor())),
        Policy::Concurrency(c) => cmd.arg(c.limit()).arg(c.lease().as_micros()),
        // `Policy` is non-exhaustive; an algorithm without a Lua twin is refused by the
        // script with an error naming it.
        _ => cmd,
    };
}

/// Appends a request's op, cost and `max_wait`: "SECONDS NANOSECONDS" (the nanoseconds
/// beyond the whole seconds, exact: the script derives both the fractional and the whole
/// microseconds the Rust algorithms compare with), or `''` for none.
pub(crate) fn push_request(op: Op, cost: u64, cmd: &mut Cmd) {
    cmd.arg(op.name()).arg(cost);
    match op {
        Op::Pace {
            max_wait: Some(max),
        } => cmd.arg(Pair(max.as_secs(), u64::from(max.subsec_nanos()))),
        _ => cmd.arg(""),
    };
}

/// Appends the clock argument every entry point starts with (`PL.clock` in
/// `lua/prelude.lua`): `''` for the server's time, else the injected time in µs and the
/// milliseconds of TTL slack, as "NOW SLACK".
pub(crate) fn push_clock(now: Option<u64>, slack_ms: u64, cmd: &mut Cmd) {
    match now {
        Some(now) => cmd.arg(Pair(now, slack_ms)),
        None => cmd.arg(""),
    };
}

/// Two numbers as one argument, "A B".
struct Pair(u64, u64);

impl ToRedisArgs for Pair {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!("{} {}", self.0, self.1));
    }
}

/// A float as an argument, in the shortest form that reads back to the same double (Lua's
/// `tonumber` gives the identical value).
struct Float(f64);

impl ToRedisArgs for Float {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!("{:?}", self.0));
    }
}

/// A key under the store's prefix as one argument, without building it as a `String`.
pub(crate) struct Prefixed<'a>(pub(crate) &'a str, pub(crate) &'a str);

impl ToRedisArgs for Prefixed<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // The writer appends to the command's buffer, which cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(self.1.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The arguments `write` puts into a command, as text.
    fn written(write: impl FnOnce(&mut Cmd)) -> Vec<String> {
        let mut cmd = Cmd::new();
        write(&mut cmd);
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_string(),
            })
            .collect()
    }

    #[test]
    fn floats_round_trip_and_params_are_counted() {
        for x in [0.1, 1e-7, 1e16, 123_456.789_012_345_67, 2.0f64.powi(53)] {
            let out = written(|cmd| {
                cmd.arg(Float(x));
            });
            assert_eq!(out[0].parse::<f64>().unwrap(), x);
        }
        let out = written(|cmd| push_policy(&"gcra:rate=10/s,burst=3".parse().unwrap(), cmd));
        assert_eq!(out, ["gcra", "2", "100000.0", "3"]);
        let out = written(|cmd| push_policy(&"pacer:rate=4/s".parse().unwrap(), cmd));
        assert_eq!(out, ["pacer", "3", "250000.0", "0.0", ""]);
        let out = written(|cmd| {
            cmd.arg(Prefixed("paceline:v2:", "user:42"));
        });
        assert_eq!(out, ["paceline:v2:user:42"]);
    }

    #[test]
    fn the_count_matches_the_parameters_written() {
        let mut seen = Vec::new();
        for spec in [
            "pacer:rate=4/s,max_burst=2,burst_allowance_factor=0.5",
            "gcra:rate=10/s",
            "fixed_window:limit=3,window=1s",
            "exec_evenly:points=3,duration=1s",
            "sliding_log:limit=3,window=1s",
            "sliding_window:limit=3,window=1s",
            "smooth_bursty:rate=5/s",
            "smooth_warming_up:rate=5/s,warmup=2s",
            "concurrency:limit=3,lease=30s",
        ] {
            let policy: Policy = spec.parse().unwrap();
            seen.push(policy.algorithm());
            let out = written(|cmd| push_policy(&policy, cmd));
            assert_eq!(out[0], policy.algorithm());
            assert_eq!(out[1].parse::<usize>().unwrap(), out.len() - 2, "{spec}");
        }
        seen.sort_unstable();
        let mut all = paceline_core::ALGORITHMS.to_vec();
        all.sort_unstable();
        assert_eq!(seen, all, "every algorithm is checked");
    }

    #[test]
    fn requests_carry_max_wait_exactly() {
        let out = written(|cmd| push_request(Op::pace_within(Duration::new(2, 5)), 3, cmd));
        assert_eq!(out, ["pace", "3", "2 5"]);
        let out = written(|cmd| push_request(Op::Limit, 1, cmd));
        assert_eq!(out, ["limit", "1", ""]);
        let out = written(|cmd| push_request(Op::pace(), 1, cmd));
        assert_eq!(out, ["pace", "1", ""]);
    }

    #[test]
    fn the_clock_is_the_server_s_or_an_injected_time_with_its_slack() {
        assert_eq!(written(|cmd| push_clock(None, 0, cmd)), [""]);
        let out = written(|cmd| push_clock(Some(1_700_000_000_000_001), 60_000, cmd));
        assert_eq!(out, ["1700000000000001 60000"]);
    }
}

//! `exec_evenly`: a window of `points` whose admitted actions are spread over the rest of it
//! (rate-limiter-flexible's `execEvenly`).
//!
//! Points are consumed at once, but each admitted action after the first of a window is
//! delayed so that the actions of the window run evenly until it ends, "a kind of FIFO queue"
//! that also works across processes.
//!
//! Parameters: `points` (an integer >= 1), `duration` (> 0) and `min_delay` (>= 0, zero
//! allowed; default `duration / points` rounded down to whole microseconds).
//!
//! State: the window's `start` (microseconds since the Unix epoch) and the `consumed` points.
//! A window starts at the first consume when none is active (windows are *not* aligned) and
//! is active while `now < start + duration`. For a request of cost `c` at `now`:
//!
//! ```text
//! no active window:      start = now, consumed = 0
//! end                  = start + duration
//! consumed + c > points: rejected, retry_after = end - now, nothing changes
//! otherwise admitted:    consumed' = consumed + c
//!   consumed == 0 (the window's first request): delay = 0
//!   else: ms_before_end = (end - now) / 1000                      (f64 milliseconds)
//!         delay_ms      = ceil(ms_before_end / (points - consumed' + 2))
//!         delay         = consumed' * min_delay   if delay_ms * 1000 < min_delay (µs)
//!                         delay_ms * 1000 µs      otherwise
//! remaining   = points - consumed'   (rate-limiter-flexible's remainingPoints)
//! reset_after = end - now
//! ```
//!
//! `limit` and `pace` are the same operation for this policy: over `points` is rejected,
//! otherwise admitted with the delay above. Unlike rate-limiter-flexible, a rejected request
//! consumes nothing. Note that `remaining` counts the points left in the window: each of
//! those requests is admitted, but (after the window's first) with a delay of at least 1 ms.
//!
//! `pace` with `max_wait` (whole microseconds, rounded down) rejects, changing nothing, when
//! the delay would exceed it. Its `retry_after` is exact: the delay at a later instant `t` of
//! the same request is `d(t)`, where `d1(t) = ceil(((end - t) / 1000) / k)` ms with
//! `k = points - consumed' + 2` never grows as `t` grows, and `d(t) = d1(t) * 1000` if that is
//! at least `min_delay`, else `consumed' * min_delay`. So `d(t) <= max_wait` holds on one
//! interval of `t` (or two adjacent ones), found by bisection over whole microseconds with the
//! formula itself; `retry_after` is the start of the first such interval after `now`, or
//! `end - now` (a new window, delay 0) when there is none.
//!
//! A cost above `points` can never be admitted (an input error, for every op).
//!
//! Live parameter changes keep `start` and `consumed`: the window of a stored state ends at
//! `start + duration` of the policy applied now, and the new `points` and `min_delay` apply.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! // 10 points per second, so min_delay defaults to 100 ms.
//! let p: Policy = "exec_evenly:points=10,duration=1s".parse().unwrap();
//! let mut s = None;
//! let first = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
//! assert!(first.is_immediate());
//! assert_eq!(first.remaining, 9);
//! // The next nine at 1 ms share the 999 ms left: ceil(999 / (remaining + 2)) ms each.
//! let delays: Vec<u128> = (0..9)
//!     .map(|_| p.apply(&mut s, 1_000, Op::Limit, 1).unwrap().delay.as_millis())
//!     .collect();
//! assert_eq!(delays, [100, 111, 125, 143, 167, 200, 250, 333, 500]);
//! let eleventh = p.apply(&mut s, 1_000, Op::Limit, 1).unwrap();
//! assert!(!eleventh.allowed);
//! assert_eq!(eleventh.delay.as_millis(), 999); // until the window ends
//! ```

use std::time::Duration;

use super::fixed_window::checked_duration;
use super::{Algorithm, MAX_CHARGED};
use crate::spec::{
    format_duration, parse_count, parse_duration, parse_duration_opt_zero, Params, MAX_COUNT,
    MAX_DURATION_US,
};
use crate::{Decision, InputError, Op};

/// The `exec_evenly` policy: `points`, `duration` and `min_delay`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecEvenly {
    points: u64,
    duration_us: u64,
    min_delay_us: u64,
}

/// `exec_evenly` state: the current (or last) window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    /// When the window started, microseconds since the Unix epoch.
    pub start: u64,
    /// Points consumed in the window.
    pub consumed: u64,
}

impl ExecEvenly {
    /// A window of `points` (1 to 2^40) per `duration` (1 µs to 10 years, whole
    /// microseconds), spreading admitted actions at least `min_delay` apart (0 to 10 years;
    /// `None`: `duration / points`, rounded down to the microsecond).
    ///
    /// ```
    /// use paceline_core::policy::ExecEvenly;
    /// use paceline_core::Policy;
    /// use std::time::Duration;
    /// let p: Policy = ExecEvenly::new(10, Duration::from_secs(1), None)?.into();
    /// assert_eq!(p, "exec_evenly:points=10,duration=1s".parse()?);
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn new(
        points: u64,
        duration: Duration,
        min_delay: Option<Duration>,
    ) -> Result<ExecEvenly, InputError> {
        let duration_us = checked_duration("duration", duration, false)?;
        let min_delay_us = min_delay
            .map(|d| checked_duration("min_delay", d, true))
            .transpose()?;
        ExecEvenly::from_micros(points, duration_us, min_delay_us)
    }

    fn from_micros(
        points: u64,
        duration_us: u64,
        min_delay_us: Option<u64>,
    ) -> Result<ExecEvenly, InputError> {
        if points == 0 || points > MAX_COUNT {
            return Err(InputError::new(
                "points",
                format!("{points} is out of range; use an integer from 1 to {MAX_COUNT}"),
            ));
        }
        if duration_us == 0 || duration_us > MAX_DURATION_US {
            return Err(InputError::new(
                "duration",
                format!("{duration_us}us is out of range; use a duration greater than zero and at most 3650d"),
            ));
        }
        let min_delay_us = min_delay_us.unwrap_or(duration_us / points);
        if min_delay_us > MAX_DURATION_US {
            return Err(InputError::new(
                "min_delay",
                format!("{min_delay_us}us is out of range; use a duration from 0 to 3650d"),
            ));
        }
        Ok(ExecEvenly {
            points,
            duration_us,
            min_delay_us,
        })
    }

    /// The points per window.
    pub fn points(&self) -> u64 {
        self.points
    }

    /// The window's length, in microseconds.
    pub fn duration_micros(&self) -> u64 {
        self.duration_us
    }

    /// The minimum delay step, in microseconds.
    pub fn min_delay_micros(&self) -> u64 {
        self.min_delay_us
    }

    /// The end of `s`'s window under the current `duration`.
    fn end(&self, s: &State) -> u64 {
        s.start.saturating_add(self.duration_us)
    }

    /// `d1(t)`: `ceil(((end - t) / 1000) / k)` whole milliseconds, for `t < end`.
    fn spread_ms(end: u64, t: u64, k: f64) -> f64 {
        ((end.saturating_sub(t)) as f64 / 1000.0 / k).ceil()
    }

    /// The delay in µs of a request at `t` in a window ending at `end` that brings the
    /// window from `consumed` to `after` points (`after <= points`).
    fn delay_at(&self, end: u64, t: u64, consumed: u64, after: u64) -> u128 {
        if consumed == 0 {
            return 0;
        }
        let k = (self.points - after + 2) as f64;
        // At most ceil(10 years in ms): exact in both f64 and u128.
        let step = Self::spread_ms(end, t, k) as u128 * 1000;
        if step < u128::from(self.min_delay_us) {
            u128::from(after) * u128::from(self.min_delay_us)
        } else {
            step
        }
    }

    /// The earliest `t` in `[now, end]` at which a request bringing the window to `after`
    /// points (not its first) gets a delay of at most `max_wait_us`; `end` (a new window,
    /// delay 0) if there is none before it. Called when the request at `now` was over it.
    fn earliest_within(&self, end: u64, now: u64, after: u64, max_wait_us: u128) -> u64 {
        let k = (self.points - after + 2) as f64;
        // The earliest t in [now, end) with d1(t) <= limit_ms (d1 never grows with t).
        let first = |limit_ms: u128| -> Option<u64> {
            let fits = |t: u64| Self::spread_ms(end, t, k) <= limit_ms as f64;
            let (mut lo, mut hi) = (now, end.checked_sub(1)?);
            if limit_ms == 0 || lo > hi || !fits(hi) {
                return None;
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            Some(lo)
        };
        let min_delay = u128::from(self.min_delay_us);
        // d1 * 1000 <= max_wait  <=>  d1 <= within_ms.
        let within_ms = max_wait_us / 1000;
        // d1 * 1000 < min_delay  <=>  d1 <= below_min_ms (no d1 >= 1 when min_delay <= 1000).
        let below_min_ms = min_delay.saturating_sub(1) / 1000;
        if u128::from(after) * min_delay <= max_wait_us {
            // Both branches of the delay fit once d1 <= max(within_ms, below_min_ms).
            first(within_ms.max(below_min_ms)).unwrap_or(end)
        } else {
            // Only d1 * 1000 fits: below_min_ms < d1 <= within_ms.
            match (first(within_ms), first(below_min_ms)) {
                (Some(fit), None) => fit,
                (Some(fit), Some(too_low)) if fit < too_low => fit,
                _ => end,
            }
        }
    }
}

impl Algorithm for ExecEvenly {
    type State = State;
    const NAME: &'static str = "exec_evenly";
    const PARAMS: &'static [&'static str] = &["points", "duration", "min_delay"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let points = parse_count("points", &params.required("points")?, 1)?;
        let duration = parse_duration("duration", &params.required("duration")?)?;
        let min_delay = match params.optional("min_delay") {
            Some(v) => Some(parse_duration_opt_zero("min_delay", &v, true)?),
            None => None,
        };
        ExecEvenly::from_micros(points, duration, min_delay)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("points", self.points.to_string()),
            ("duration", format_duration(self.duration_us)),
            ("min_delay", format_duration(self.min_delay_us)),
        ]
    }

    fn max_cost(&self, op: Op) -> Option<u64> {
        (op != Op::Charge).then_some(self.points)
    }

    fn limit(&self) -> u64 {
        self.points
    }

    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        let active = state.filter(|s| now < self.end(s));
        let (start, consumed) = active.map_or((now, 0), |s| (s.start, s.consumed));
        let end = start.saturating_add(self.duration_us);
        let after = consumed.saturating_add(cost).min(MAX_CHARGED);
        let fits = after <= self.points;
        let delay = if fits {
            self.delay_at(end, now, consumed, after)
        } else {
            0
        };
        let until_end = end.saturating_sub(now) as f64;
        // What the key looks like if this request changes nothing.
        let unchanged = |allowed: bool, delay: f64| {
            let (remaining, reset_after) = match active {
                Some(s) => (self.points.saturating_sub(s.consumed), until_end),
                None => (self.points, 0.0),
            };
            Decision::from_micros(allowed, delay, remaining, reset_after, self.points)
        };
        let admit = |state: &mut Option<State>, delay: u128| {
            *state = Some(State {
                start,
                consumed: after,
            });
            Decision::from_micros(
                true,
                delay as f64,
                self.points.saturating_sub(after),
                until_end,
                self.points,
            )
        };
        match op {
            Op::Peek if fits => unchanged(true, delay as f64),
            Op::Peek => unchanged(false, until_end),
            // Consumed in the window, past its points if need be (none left until it ends),
            // owed nothing now.
            Op::Charge => admit(state, 0),
            _ if !fits => unchanged(false, until_end),
            Op::Pace {
                max_wait: Some(max),
            } if delay > max.as_micros() => {
                let at = self.earliest_within(end, now, after, max.as_micros());
                unchanged(false, at.saturating_sub(now) as f64)
            }
            Op::Limit | Op::Pace { .. } => admit(state, delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use std::time::Duration;

    use crate::policy::test_util::{policy, MS};
    /// An arbitrary start, so that nothing depends on aligned windows.
    const T0: u64 = 1_700_000_000_123_456;

    fn delays_ms(p: &Policy, s: &mut Option<crate::State>, now: u64, n: usize) -> Vec<u128> {
        (0..n)
            .map(|_| {
                let d = p.apply(s, now, Op::Limit, 1).unwrap();
                assert!(d.allowed);
                d.delay.as_millis()
            })
            .collect()
    }

    #[test]
    fn seed_example_ten_actions_in_the_first_millisecond() {
        let p = policy("exec_evenly:points=10,duration=1s");
        let mut s = None;
        assert_eq!(delays_ms(&p, &mut s, T0, 1), [0]);
        let delays = delays_ms(&p, &mut s, T0 + MS, 9);
        assert_eq!(delays, [100, 111, 125, 143, 167, 200, 250, 333, 500]);
        // Each is ceil(999 ms / (remaining + 2)).
        let formula: Vec<u128> = (0..9u32)
            .rev()
            .map(|r| (999.0 / f64::from(r + 2)).ceil() as u128)
            .collect();
        assert_eq!(delays, formula);
        // The eleventh is rejected until the window ends, and changes nothing.
        let before = s.clone();
        let eleventh = p.apply(&mut s, T0 + MS, Op::Limit, 1).unwrap();
        assert!(!eleventh.allowed);
        assert_eq!(eleventh.delay, Duration::from_millis(999));
        assert_eq!(eleventh.remaining, 0);
        assert_eq!(eleventh.reset_after, Duration::from_millis(999));
        assert_eq!(s, before);
        for op in [
            Op::pace(),
            Op::pace_within(Duration::from_secs(5)),
            Op::Peek,
        ] {
            let r = p.apply(&mut s, T0 + MS, op, 1).unwrap();
            assert!(!r.allowed, "{op:?}");
            assert_eq!(r.delay, Duration::from_millis(999), "{op:?}");
            assert_eq!(s, before);
        }
        // At the window's end a new window starts: no delay.
        assert_eq!(delays_ms(&p, &mut s, T0 + 1000 * MS, 1), [0]);
    }

    #[test]
    fn seed_example_nine_actions_in_the_last_millisecond() {
        let p = policy("exec_evenly:points=10,duration=1s");
        let mut s = None;
        assert_eq!(delays_ms(&p, &mut s, T0, 1), [0]);
        // 1 ms / (remaining + 2) is under min_delay (100 ms): consumed * 100 ms instead.
        assert_eq!(
            delays_ms(&p, &mut s, T0 + 999 * MS, 9),
            [200, 300, 400, 500, 600, 700, 800, 900, 1000]
        );
        let eleventh = p.apply(&mut s, T0 + 999 * MS, Op::Limit, 1).unwrap();
        assert!(!eleventh.allowed);
        assert_eq!(eleventh.delay, Duration::from_millis(1));
    }

    #[test]
    fn decisions_report_remaining_reset_and_limit() {
        let p = policy("exec_evenly:points=3,duration=10s");
        let mut s = None;
        let d = p.apply(&mut s, T0, Op::Limit, 2).unwrap();
        assert!(
            d.is_immediate(),
            "the first request of a window is never delayed"
        );
        assert_eq!(
            (d.remaining, d.reset_after, d.limit),
            (1, Duration::from_secs(10), 3)
        );
        assert_eq!(
            s,
            Some(crate::State::ExecEvenly(State {
                start: T0,
                consumed: 2
            }))
        );
        let d = p.apply(&mut s, T0 + 4_000 * MS, Op::Limit, 1).unwrap();
        // 6 s left / (0 + 2) = 3 s is under min_delay (10 s / 3 = 3.333333 s), so the delay is
        // 3 consumed * 3.333333 s.
        assert_eq!(d.delay, Duration::from_micros(3 * 3_333_333));
        assert_eq!((d.remaining, d.reset_after), (0, Duration::from_secs(6)));
    }

    #[test]
    fn windows_start_at_the_first_consume_not_aligned() {
        let p = policy("exec_evenly:points=2,duration=1s");
        let mut s = None;
        p.apply(&mut s, T0 + 700 * MS, Op::Limit, 2).unwrap();
        // An aligned window would have ended at the next whole second; this one ends at 1.7 s.
        let r = p.apply(&mut s, T0 + 1_200 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(500));
        let d = p.apply(&mut s, T0 + 1_700 * MS, Op::Limit, 1).unwrap();
        assert!(d.is_immediate());
        assert_eq!(
            s,
            Some(crate::State::ExecEvenly(State {
                start: T0 + 1_700 * MS,
                consumed: 1
            }))
        );
    }

    #[test]
    fn pace_without_max_wait_is_limit() {
        let p = policy("exec_evenly:points=10,duration=1s");
        let (mut a, mut b) = (None, None);
        for (i, t) in [0, 1, 1, 500, 998, 999, 999, 999, 999, 999, 999, 999]
            .into_iter()
            .enumerate()
        {
            let now = T0 + t * MS;
            let limit = p.apply(&mut a, now, Op::Limit, 1).unwrap();
            let pace = p.apply(&mut b, now, Op::pace(), 1).unwrap();
            assert_eq!(limit, pace, "request {i}");
            assert_eq!(a, b);
        }
    }

    #[test]
    fn pace_with_max_wait_rejects_without_side_effects_and_retry_after_is_exact() {
        // rate-limiter-flexible's example (a) up to the fifth request, which would wait ceil(999 / 7) = 143 ms.
        let p = policy("exec_evenly:points=10,duration=1s");
        let mut s = None;
        delays_ms(&p, &mut s, T0, 1);
        delays_ms(&p, &mut s, T0 + MS, 3);
        let before = s.clone();
        let within = Op::pace_within(Duration::from_millis(100));
        let r = p.apply(&mut s, T0 + MS, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(s, before);
        assert_eq!(
            (r.remaining, r.reset_after),
            (6, Duration::from_millis(999))
        );
        // d1(t) = ceil((1000 ms - t) / 7) <= 100 ms from t = 300 ms; d1 * 1000 >= min_delay
        // there, so the delay is exactly 100 ms. (Later, below 99 ms, it would jump to
        // 5 * 100 ms.)
        assert_eq!(r.delay, Duration::from_millis(299));
        let early = p.apply(&mut s, T0 + 300 * MS - 1, within, 1).unwrap();
        assert!(!early.allowed);
        assert_eq!(s, before);
        let ok = p.apply(&mut s, T0 + 300 * MS, within, 1).unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_millis(100));
        // A wide enough max_wait admits at once.
        let ok = p
            .apply(
                &mut s,
                T0 + 300 * MS,
                Op::pace_within(Duration::from_secs(1)),
                1,
            )
            .unwrap();
        assert!(ok.allowed);
    }

    #[test]
    fn max_wait_retry_after_falls_back_to_the_window_end() {
        // 2 points per 10 s, min_delay 5 s: the second request waits ceil(10 s / 2) = 5 s at
        // the start, then (once that is under 5 s) 2 * 5 s = 10 s. 3 s never fits.
        let p = policy("exec_evenly:points=2,duration=10s");
        let mut s = None;
        delays_ms(&p, &mut s, T0, 1);
        let within = Op::pace_within(Duration::from_secs(3));
        let r = p.apply(&mut s, T0, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_secs(10));
        let new_window = p.apply(&mut s, T0 + 10_000 * MS, within, 1).unwrap();
        assert!(new_window.is_immediate());
    }

    #[test]
    fn max_wait_retry_after_when_the_min_delay_branch_fits() {
        // min_delay 1 s: a late second request waits 2 * 1 s = 2 s, which fits a max_wait of
        // 2 s; the early one waits ceil(10 s / 2) = 5 s. It fits once (end - t) / 2 <= 2 s.
        let p = policy("exec_evenly:points=2,duration=10s,min_delay=1s");
        let mut s = None;
        delays_ms(&p, &mut s, T0, 1);
        let within = Op::pace_within(Duration::from_secs(2));
        let r = p.apply(&mut s, T0, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_secs(6));
        let early = p.apply(&mut s, T0 + 6_000 * MS - 1, within, 1).unwrap();
        assert!(!early.allowed);
        let ok = p.apply(&mut s.clone(), T0 + 6_000 * MS, within, 1).unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_secs(2));
        // Later still, d1 * 1000 < 1 s: the delay is 2 * min_delay = 2 s, still fitting.
        let late = p.apply(&mut s, T0 + 9_500 * MS, within, 1).unwrap();
        assert!(late.allowed);
        assert_eq!(late.delay, Duration::from_secs(2));
    }

    #[test]
    fn max_wait_retry_after_is_the_earliest_fitting_instant() {
        // Brute force over a small window: the retry time is the first instant that fits.
        let p = policy("exec_evenly:points=4,duration=20ms,min_delay=3ms");
        let mut rejections = 0;
        for consumed in 1..4u64 {
            for max_wait_us in [0, 999, 1_000, 2_500, 3_000, 5_999, 6_000, 9_000, 12_000] {
                for offset in [0, 1, 777, 4_000, 10_001, 19_999] {
                    let state = Some(crate::State::ExecEvenly(State {
                        start: T0,
                        consumed,
                    }));
                    let now = T0 + offset;
                    let within = Op::pace_within(Duration::from_micros(max_wait_us));
                    let fits_at = |t: u64| {
                        let d = p.apply(&mut state.clone(), t, within, 1).unwrap();
                        assert!(!d.allowed || d.delay <= Duration::from_micros(max_wait_us));
                        d.allowed
                    };
                    let d = p.apply(&mut state.clone(), now, within, 1).unwrap();
                    if d.allowed {
                        continue;
                    }
                    rejections += 1;
                    let at = now + d.delay.as_micros() as u64;
                    assert!(
                        fits_at(at),
                        "consumed {consumed} max_wait {max_wait_us} now +{offset}"
                    );
                    assert!(
                        (now..at).all(|t| !fits_at(t)),
                        "consumed {consumed} max_wait {max_wait_us} now +{offset}"
                    );
                }
            }
        }
        assert!(rejections > 50, "{rejections}");
    }

    #[test]
    fn peek_reports_without_changing() {
        let p = policy("exec_evenly:points=2,duration=1s");
        let mut s = None;
        let idle = p.apply(&mut s, T0, Op::Peek, 2).unwrap();
        assert!(idle.is_immediate());
        assert_eq!(
            (idle.remaining, idle.reset_after, idle.limit),
            (2, Duration::ZERO, 2)
        );
        assert_eq!(s, None);
        p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        let before = s.clone();
        // What limit would answer: ceil(900 ms / 2) = 450 ms is under min_delay (500 ms), so
        // admitted after 2 consumed * 500 ms.
        let d = p.apply(&mut s, T0 + 100 * MS, Op::Peek, 1).unwrap();
        assert!(d.allowed);
        assert_eq!(d.delay, Duration::from_millis(1_000));
        assert_eq!(
            (d.remaining, d.reset_after),
            (1, Duration::from_millis(900))
        );
        let full = p.apply(&mut s, T0 + 100 * MS, Op::Peek, 2).unwrap();
        assert!(!full.allowed);
        assert_eq!(full.delay, Duration::from_millis(900));
        assert_eq!(s, before);
        // After the window: idle again, state untouched.
        let later = p.apply(&mut s, T0 + 1_000 * MS, Op::Peek, 2).unwrap();
        assert!(later.is_immediate());
        assert_eq!((later.remaining, later.reset_after), (2, Duration::ZERO));
        assert_eq!(s, before);
    }

    #[test]
    fn costs_above_points_are_input_errors_for_every_op() {
        let p = policy("exec_evenly:points=3,duration=1s");
        for op in [
            Op::Limit,
            Op::pace(),
            Op::pace_within(Duration::from_secs(5)),
            Op::Peek,
        ] {
            assert_eq!(p.max_cost(op), Some(3));
            assert_eq!(p.apply(&mut None, T0, op, 4).unwrap_err().field(), "cost");
        }
    }

    #[test]
    fn zero_min_delay_keeps_the_spread_formula() {
        let p = policy("exec_evenly:points=10,duration=1s,min_delay=0");
        let mut s = None;
        delays_ms(&p, &mut s, T0, 1);
        // ceil(1 ms / 10) = 1 ms, no longer replaced by consumed * min_delay.
        assert_eq!(delays_ms(&p, &mut s, T0 + 999 * MS, 2), [1, 1]);
        assert_eq!(
            p.to_string(),
            "exec_evenly:points=10,duration=1s,min_delay=0s"
        );
    }

    #[test]
    fn live_parameter_change_keeps_the_window() {
        let short = policy("exec_evenly:points=2,duration=1s");
        let long = policy("exec_evenly:points=4,duration=2s");
        let mut s = None;
        short.apply(&mut s, T0, Op::Limit, 2).unwrap();
        // At 1.5 s the short window has ended: a new one starts.
        assert!(short
            .apply(&mut s, T0 + 1_500 * MS, Op::Limit, 1)
            .unwrap()
            .is_immediate());
        // Under the long policy the same window (started at 0) runs to 2 s, 2 of 4 points left.
        let mut t = None;
        short.apply(&mut t, T0, Op::Limit, 2).unwrap();
        let d = long.apply(&mut t, T0 + 1_500 * MS, Op::Limit, 1).unwrap();
        assert!(d.allowed);
        // 500 ms left / (4 - 3 + 2) -> 167 ms is under the new min_delay (500 ms), so the
        // delay is 3 consumed * 500 ms.
        assert_eq!(d.delay, Duration::from_millis(1_500));
        assert_eq!(
            (d.remaining, d.reset_after, d.limit),
            (1, Duration::from_millis(500), 4)
        );
        assert_eq!(
            t,
            Some(crate::State::ExecEvenly(State {
                start: T0,
                consumed: 3
            }))
        );
        // Fewer points than already consumed: rejected until the window ends.
        let tiny = policy("exec_evenly:points=1,duration=2s");
        let r = tiny.apply(&mut t, T0 + 1_500 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!((r.delay, r.remaining), (Duration::from_millis(500), 0));
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("exec_evenly:duration=1s", "points"),
            ("exec_evenly:points=10", "duration"),
            ("exec_evenly:points=0,duration=1s", "points"),
            ("exec_evenly:points=1.5,duration=1s", "points"),
            ("exec_evenly:points=-1,duration=1s", "points"),
            ("exec_evenly:points=10,duration=0s", "duration"),
            ("exec_evenly:points=10,duration=10", "duration"),
            ("exec_evenly:points=10,duration=-1s", "duration"),
            (
                "exec_evenly:points=10,duration=1s,min_delay=-1ms",
                "min_delay",
            ),
            ("exec_evenly:points=10,duration=1s,min_delay=x", "min_delay"),
            (
                "exec_evenly:points=10,duration=1s,min_delay=3651d",
                "min_delay",
            ),
            ("exec_evenly:points=10,duration=1s,rate=1", "rate"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        assert_eq!(
            ExecEvenly::from_micros(0, 1, None).unwrap_err().field(),
            "points"
        );
        assert_eq!(
            ExecEvenly::from_micros(MAX_COUNT + 1, 1, None)
                .unwrap_err()
                .field(),
            "points"
        );
        assert_eq!(
            ExecEvenly::from_micros(1, 0, None).unwrap_err().field(),
            "duration"
        );
        assert_eq!(
            ExecEvenly::from_micros(1, MAX_DURATION_US + 1, None)
                .unwrap_err()
                .field(),
            "duration"
        );
        assert_eq!(
            ExecEvenly::from_micros(1, 1, Some(MAX_DURATION_US + 1))
                .unwrap_err()
                .field(),
            "min_delay"
        );
        // The default min_delay is duration / points, rounded down to whole microseconds.
        let p = ExecEvenly::new(3, Duration::from_secs(1), None).unwrap();
        assert_eq!(p.min_delay_micros(), 333_333);
        assert_eq!(
            policy("exec_evenly:points=3,duration=1s").to_string(),
            "exec_evenly:points=3,duration=1s,min_delay=333333us"
        );
        for spec in [
            "exec_evenly:points=10,duration=1s,min_delay=50ms",
            "exec_evenly:points=3,duration=1.5s",
            "exec_evenly:points=7,duration=10ms,min_delay=0",
        ] {
            let p = policy(spec);
            assert_eq!(policy(&p.to_string()), p, "{spec}");
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p, "{json}");
        }
    }
}

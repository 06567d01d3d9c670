//! `pacer`: a distributed pacer with a burst allowance (a leaky bucket that books each
//! request's slot).
//!
//! Every `pace(weight)` books the earliest moment at which the request keeps all workers
//! together at `rate`, and returns the delay to sleep until then ("booking a meeting in a
//! calendar"). Bursts: each request pours its weight into a bucket of `max_burst`; while the
//! bucket is not full, requests go at once. The bucket leaks at `rate * factor`, but only
//! while nothing is booked in the future. `limit` works the same way but saves nothing when it
//! would have to wait.
//!
//! Parameters: `rate` (alias `qps`), `max_burst` (>= 0, default 0) and
//! `burst_allowance_factor` (0 < f <= 1; default 0.5 for `pace`, 1 for `limit`).
//!
//! State: `watermark`, `last_drip`, `next_shot`. For a request of weight `w` at `now`:
//!
//! 1. defaults: `watermark = 0`, `last_drip = now`; `next_shot = max(stored next_shot, now)`;
//! 2. only if nothing is booked in the future (`next_shot <= now`):
//!    `watermark = max(0, watermark - (now - max(last_drip, stored next_shot)) * rate * factor)`,
//!    so the bucket leaks only over idle time: booked time pays for the booking and does
//!    not also drain the bucket (leaking from `last_drip` alone would let `limit` admit up
//!    to twice the rate). Then
//!    `last_drip = now`;
//! 3. `watermark += w`; if `watermark <= max_burst` the shot is `now`, otherwise the shot is
//!    `next_shot` and `next_shot = shot + w / rate`;
//! 4. `watermark = min(max_burst, watermark)`;
//! 5. `delay = shot - now`. `pace` always saves; `limit` saves only when `delay == 0`.
//!
//! With `max_burst = N` there are N+1 requests that pass at once from idle
//! (the last one books the next slot), so the decision's `limit` is `floor(max_burst) + 1`.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "pacer:rate=10/s".parse().unwrap();
//! let mut s = None;
//! let delays: Vec<u128> = (0..3)
//!     .map(|_| p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay.as_millis())
//!     .collect();
//! assert_eq!(delays, [0, 100, 200]);
//! ```

use super::util::{floor_count, retry_after_max_wait};
use super::Algorithm;
use crate::decision::duration_to_micros;
use crate::spec::{parse_float, parse_rate, Params};
use crate::{Decision, InputError, Op, Rate};

/// The default `burst_allowance_factor` of `pace`: the allowance is earned back slightly
/// slower than the target rate, so the pacer does not fall back into bursting too often.
pub const DEFAULT_PACE_FACTOR: f64 = 0.5;
/// The default `burst_allowance_factor` of `limit`.
pub const DEFAULT_LIMIT_FACTOR: f64 = 1.0;

const EPSILON: f64 = 1e-9;

/// The `pacer` policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Pacer {
    rate: Rate,
    max_burst: f64,
    factor: Option<f64>,
}

/// `pacer` state; times are microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    /// Weight in the burst bucket, `0..=max_burst`.
    pub watermark: f64,
    /// When the bucket last leaked.
    pub last_drip: f64,
    /// The earliest free slot.
    pub next_shot: f64,
}

impl State {
    /// When the key last became idle: the later of its last request and the end of its last
    /// booked slot. The bucket leaks only from then on.
    fn idle_since(&self) -> f64 {
        self.last_drip.max(self.next_shot)
    }
}

impl Pacer {
    /// A pacer at `rate`, with a burst bucket of `max_burst` (>= 0) that leaks at
    /// `rate * factor` (0 < factor <= 1; `None` = 0.5 for `pace`, 1 for `limit`).
    pub fn new(rate: Rate, max_burst: f64, factor: Option<f64>) -> Result<Pacer, InputError> {
        if let Some(rule) = check_max_burst(max_burst) {
            return Err(InputError::new(
                "max_burst",
                format!("{max_burst} is out of range: {rule}"),
            ));
        }
        if let Some(f) = factor {
            if let Some(rule) = check_factor(f) {
                return Err(InputError::new(
                    "burst_allowance_factor",
                    format!("{f} is out of range: {rule}"),
                ));
            }
        }
        Ok(Pacer {
            rate,
            max_burst,
            factor,
        })
    }

    /// The target rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst bucket's size.
    pub fn max_burst(&self) -> f64 {
        self.max_burst
    }

    /// The configured `burst_allowance_factor`; `None` = the per-op default (0.5 for
    /// `pace`, 1 for `limit` and `peek`).
    pub fn burst_allowance_factor(&self) -> Option<f64> {
        self.factor
    }

    fn factor(&self, op: Op) -> f64 {
        self.factor.unwrap_or(match op {
            Op::Pace { .. } => DEFAULT_PACE_FACTOR,
            Op::Limit | Op::Peek | Op::Charge => DEFAULT_LIMIT_FACTOR,
        })
    }

    /// Zero-delay cost-1 requests left for a state at `now`.
    fn remaining(&self, watermark: f64, next_shot: f64, now: f64) -> u64 {
        if next_shot > now {
            0
        } else {
            floor_count(self.max_burst - watermark + EPSILON) + 1
        }
    }

    /// Time until the state is idle: nothing booked and the bucket empty, assuming the
    /// slowest leak any op may use.
    fn reset_after(&self, s: &State, now: f64) -> f64 {
        let slowest = self.factor.unwrap_or(DEFAULT_PACE_FACTOR);
        let empty_at = s.idle_since() + s.watermark * self.rate.interval_micros() / slowest;
        (s.next_shot.max(empty_at) - now).max(0.0)
    }
}

fn check_max_burst(v: f64) -> Option<&'static str> {
    (!(0.0..=crate::spec::MAX_COUNT as f64).contains(&v)).then_some("use a number from 0 to 2^40")
}

fn check_factor(v: f64) -> Option<&'static str> {
    (!(v > 0.0 && v <= 1.0)).then_some("use a number greater than 0 and at most 1")
}

impl Algorithm for Pacer {
    type State = State;
    const NAME: &'static str = "pacer";
    const PARAMS: &'static [&'static str] = &["rate", "max_burst", "burst_allowance_factor"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let rate = parse_rate("rate", &params.required("rate")?)?;
        let max_burst = match params.optional("max_burst") {
            Some(v) => parse_float("max_burst", &v, check_max_burst)?,
            None => 0.0,
        };
        let factor = match params.optional("burst_allowance_factor") {
            Some(v) => Some(parse_float("burst_allowance_factor", &v, check_factor)?),
            None => None,
        };
        Pacer::new(rate, max_burst, factor)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("rate", self.rate.to_string()),
            ("max_burst", self.max_burst.to_string()),
        ];
        if let Some(f) = self.factor {
            out.push(("burst_allowance_factor", f.to_string()));
        }
        out
    }

    fn max_cost(&self, _op: Op) -> Option<u64> {
        None
    }

    fn limit(&self) -> u64 {
        floor_count(self.max_burst + EPSILON) + 1
    }

    fn apply(&self, state: &mut Option<State>, now_us: u64, op: Op, cost: u64) -> Decision {
        let now = now_us as f64;
        let interval = self.rate.interval_micros();
        let factor = self.factor(op);
        // Steps 1 and 2: the state as it stands at `now`, before this request.
        let mut current = state.unwrap_or(State {
            watermark: 0.0,
            last_drip: now,
            next_shot: now,
        });
        current.next_shot = current.next_shot.max(now);
        if current.next_shot <= now {
            // Leak only over idle time: since the later of the last request and the end of
            // the last booked slot (the stored `next_shot`).
            let idle_since = state.map_or(now, |s| s.idle_since());
            // A caller's clock may lag the last writer's: never leak negative time.
            let leaked = (now - idle_since).max(0.0) / interval * factor;
            current.watermark -= leaked;
            if current.watermark * interval / factor < 1.0 {
                // Less than a microsecond of leak left: float residue of an empty bucket
                // (times since the epoch are only exact to a fraction of a microsecond).
                current.watermark = 0.0;
            }
        }
        current.last_drip = now;
        // Steps 3 and 4.
        let mut next = current;
        next.watermark += cost as f64;
        let shot = if next.watermark <= self.max_burst + EPSILON {
            now
        } else {
            let shot = next.next_shot;
            next.next_shot = shot + cost as f64 * interval;
            shot
        };
        next.watermark = next.watermark.min(self.max_burst);
        let delay = shot - now;
        let limit = self.limit();
        // Without a write, the key empties on the schedule of its *stored* state (leaking at
        // the slowest factor), not of the view drained at this op's factor.
        let stored_reset_after = state.map_or(0.0, |s| self.reset_after(&s, now));
        let unchanged = |allowed: bool, delay: f64| {
            Decision::from_micros(
                allowed,
                delay,
                self.remaining(current.watermark, current.next_shot, now),
                stored_reset_after,
                limit,
            )
        };
        let save = |state: &mut Option<State>, delay: f64| {
            let reset_after = self.reset_after(&next, now);
            *state = Some(next);
            Decision::from_micros(
                true,
                delay,
                self.remaining(next.watermark, next.next_shot, now),
                reset_after,
                limit,
            )
        };
        match op {
            Op::Peek => unchanged(delay == 0.0, delay),
            Op::Limit if delay == 0.0 => save(state, delay),
            Op::Limit => unchanged(false, delay),
            Op::Pace {
                max_wait: Some(max),
            } if delay > duration_to_micros(max) => {
                unchanged(false, retry_after_max_wait(delay, duration_to_micros(max)))
            }
            Op::Pace { .. } => save(state, delay),
            // Booked as a `pace` is (the next slot moves on: the debt), owed nothing now.
            Op::Charge => save(state, 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use std::time::Duration;

    use crate::policy::test_util::{policy, MS};

    fn delays_ms(p: &Policy, s: &mut Option<crate::State>, now: u64, n: usize, op: Op) -> Vec<f64> {
        (0..n)
            .map(|_| p.apply(s, now, op, 1).unwrap().delay.as_secs_f64() * 1e3)
            .collect()
    }

    #[test]
    fn seed_pacing_spreads_requests_one_interval_apart() {
        // "the request will happen in at least 1/QPS seconds after the previous request",
        // and "if there were no requests in the past within 1/QPS seconds ... delayMs is 0".
        let p = policy("pacer:qps=10");
        let mut s = None;
        assert_eq!(
            delays_ms(&p, &mut s, 0, 4, Op::pace()),
            [0.0, 100.0, 200.0, 300.0]
        );
        // Requests keep being sent further into the future.
        assert_eq!(delays_ms(&p, &mut s, 50 * MS, 1, Op::pace()), [350.0]);
        // After the booked slots have passed and 1/QPS more, the next request goes at once.
        assert_eq!(delays_ms(&p, &mut s, 500 * MS, 1, Op::pace()), [0.0]);
    }

    #[test]
    fn seed_burst_allows_max_burst_plus_one_at_once() {
        let p = policy("pacer:rate=10/s,max_burst=3");
        let mut s = None;
        assert_eq!(
            delays_ms(&p, &mut s, 0, 6, Op::pace()),
            [0.0, 0.0, 0.0, 0.0, 100.0, 200.0]
        );
        assert_eq!(p.limit(), 4);
    }

    #[test]
    fn bucket_leaks_only_when_nothing_is_booked() {
        // max_burst 2, pace factor 0.5: the bucket leaks one unit per 200 ms once idle.
        let p = policy("pacer:rate=10/s,max_burst=2");
        let mut s = None;
        assert_eq!(
            delays_ms(&p, &mut s, 0, 4, Op::pace()),
            [0.0, 0.0, 0.0, 100.0]
        );
        // Booked until 200 ms: no leak yet at 200 ms, so the next request overflows the
        // bucket; it goes at once (the slot is free) and books 300 ms for the one after.
        assert_eq!(delays_ms(&p, &mut s, 200 * MS, 2, Op::pace()), [0.0, 100.0]);
        // Idle from 400 ms (the end of the last booking) to 600 ms: the bucket leaks
        // 200 ms * 10/s * 0.5 = 1 unit, so one request fits, one more overflows at once,
        // and the third waits.
        assert_eq!(
            delays_ms(&p, &mut s, 600 * MS, 3, Op::pace()),
            [0.0, 0.0, 100.0]
        );
    }

    #[test]
    fn limit_rejects_without_saving_and_retry_after_is_exact() {
        let p = policy("pacer:rate=10/s,max_burst=1");
        let mut s = None;
        assert!(p.apply(&mut s, 0, Op::Limit, 1).unwrap().allowed);
        let second = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
        assert!(second.allowed && second.delay.is_zero());
        assert_eq!(second.remaining, 0);
        let before = s.clone();
        let third = p.apply(&mut s, 30 * MS, Op::Limit, 1).unwrap();
        assert!(!third.allowed);
        assert_eq!(third.delay, Duration::from_millis(70));
        assert_eq!(s, before, "limit saves nothing on rejection");
        assert!(p
            .apply(&mut s, 100 * MS, Op::Limit, 1)
            .unwrap()
            .is_immediate());
    }

    #[test]
    fn limit_leaks_at_full_rate_by_default() {
        let p = policy("pacer:rate=10/s,max_burst=2");
        let mut s = None;
        for _ in 0..3 {
            assert!(p.apply(&mut s, 0, Op::Limit, 1).unwrap().is_immediate());
        }
        // Next slot at 100 ms; at 300 ms the bucket leaked (300 ms * 10/s * 1) = 3 >= 2 units.
        let d = p.apply(&mut s, 300 * MS, Op::Peek, 1).unwrap();
        assert_eq!(d.remaining, 3);
        let with_half: Policy = "pacer:rate=10/s,max_burst=2,burst_allowance_factor=0.5"
            .parse()
            .unwrap();
        let mut h = None;
        for _ in 0..3 {
            with_half.apply(&mut h, 0, Op::Limit, 1).unwrap();
        }
        // Half the leak: 1.5 units out of 2, so floor(2 - 0.5) + 1 = 2 at once.
        assert_eq!(
            with_half
                .apply(&mut h, 300 * MS, Op::Peek, 1)
                .unwrap()
                .remaining,
            2
        );
    }

    #[test]
    fn pace_with_max_wait_is_all_or_nothing() {
        let p = policy("pacer:rate=10/s");
        let mut s = None;
        delays_ms(&p, &mut s, 0, 3, Op::pace()); // next free slot at 300 ms
        let before = s.clone();
        let r = p
            .apply(&mut s, 0, Op::pace_within(Duration::from_millis(250)), 1)
            .unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(50));
        assert_eq!(s, before);
    }

    #[test]
    fn reset_after_counts_the_booked_slots_and_the_leak() {
        let p = policy("pacer:rate=10/s,max_burst=2");
        let mut s = None;
        let d = p.apply(&mut s, 0, Op::pace(), 1).unwrap();
        // watermark 1 leaks at 10/s * 0.5: empty after 200 ms.
        assert_eq!(d.reset_after, Duration::from_millis(200));
        let q = policy("pacer:rate=10/s");
        let mut t = None;
        let d = q.apply(&mut t, 0, Op::pace(), 1).unwrap();
        assert_eq!(d.reset_after, Duration::from_millis(100));
        // Once idle, the state behaves exactly like no state.
        let later = 100 * MS;
        let a = q.apply(&mut t, later, Op::pace(), 1).unwrap();
        let b = q.apply(&mut None, later, Op::pace(), 1).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn weights_book_proportional_time() {
        let p = policy("pacer:rate=10/s");
        let mut s = None;
        assert_eq!(
            p.apply(&mut s, 0, Op::pace(), 5).unwrap().delay,
            Duration::ZERO
        );
        assert_eq!(
            p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn live_parameter_change_keeps_the_booking() {
        let slow = policy("pacer:rate=1/s");
        let fast = policy("pacer:rate=100/s");
        let mut s = None;
        slow.apply(&mut s, 0, Op::pace(), 1).unwrap(); // next slot at 1 s
        assert_eq!(
            fast.apply(&mut s, 0, Op::pace(), 1).unwrap().delay,
            Duration::from_secs(1)
        );
        assert_eq!(
            fast.apply(&mut s, 0, Op::pace(), 1).unwrap().delay,
            Duration::from_millis(1010)
        );
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("pacer:max_burst=1", "rate"),
            ("pacer:rate=0", "rate"),
            ("pacer:rate=10,max_burst=-1", "max_burst"),
            ("pacer:rate=10,max_burst=NaN", "max_burst"),
            (
                "pacer:rate=10,burst_allowance_factor=0",
                "burst_allowance_factor",
            ),
            (
                "pacer:rate=10,burst_allowance_factor=1.5",
                "burst_allowance_factor",
            ),
            ("pacer:rate=10,burst=3", "burst"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
    }
}

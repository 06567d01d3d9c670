//! `smooth_warming_up`: Guava's `RateLimiter.create(rate, warmup, coldFactor)`
//! (`SmoothWarmingUp`), exactly.
//!
//! A limiter that has been idle is *cold*: it issues permits slowly at first, one per
//! `cold_factor / rate`, and speeds up linearly to the stable `1 / rate` as it is used, over
//! the `warmup` period. Idle time cools it down again at `max_permits / warmup`. A new key
//! starts cold.
//!
//! Parameters: `rate` (alias `qps`), `warmup` (a duration > 0) and `cold_factor` (a number
//! from 1 to 1e6, default 3, as Guava's `create(rate, warmup, unit)`).
//!
//! State: Guava's `storedPermits` and `nextFreeTicketMicros` (microseconds since the Unix
//! epoch), plus `max_permits` and the cool-down interval of the configuration last set, to
//! see parameter changes. With `stable = 1e6 / permits_per_second` microseconds and `trunc`
//! Java's `(long)` cast:
//!
//! ```text
//! cold        = stable * cold_factor
//! threshold   = 0.5 * warmup / stable
//! max_permits = threshold + 2 * warmup / (stable + cold)
//! slope       = (cold - stable) / (max_permits - threshold)
//! cool_down   = warmup / max_permits
//! time(p)     = stable + p * slope
//!
//! resync:  if now > next_free:
//!            stored = min(max_permits, stored + (now - next_free) / cool_down)
//!            next_free = now
//! reserve (cost n): moment = next_free; spend = min(n, stored); fresh = n - spend
//!          above = stored - threshold; wait = 0; take = spend
//!          if above > 0: t = min(above, take)
//!                        wait = trunc(t * (time(above) + time(above - t)) / 2); take -= t
//!          wait += trunc(stable * take) + trunc(fresh * stable)
//!          next_free += wait (saturating); stored -= spend
//!          delay = max(moment - now, 0)
//! ```
//!
//! The ops are Guava's: `pace` reserves always (`acquire(n)` without the sleep); `limit` is
//! `tryAcquire(n, 0)`, admitted iff `next_free <= now` (checked before resyncing), else
//! rejected with `retry_after = next_free - now` and nothing changed; `pace` with `max_wait`
//! is `tryAcquire(n, max_wait)` (`max_wait` in whole microseconds, rounded down), rejected
//! with `retry_after = next_free - max_wait - now`; `peek` answers what `limit` would,
//! changing nothing. Any cost is admitted eventually (no input error for large costs).
//!
//! The decision: `limit = 1` and `remaining` is 1 when `next_free <= now`, else 0, because
//! every permit, stored or fresh, costs time that the next request pays. `reset_after` is
//! the time until the limiter is fully cold (`stored = max_permits`, `next_free <= t`, to the
//! first whole microsecond at which the resync arithmetic gives `max_permits`), which is
//! exactly the state of a new key: the store may then drop it without any difference.
//!
//! A key's limiter is created at its first request, cold (`stored = max_permits`,
//! `next_free = now`), as Guava's `create` followed at once by the request.
//!
//! **Live parameter changes** follow Guava's `setRate` at the request's `now`: resync with the
//! old configuration, then `stored = stored * max_permits / old_max_permits` with the new
//! `max_permits`, keeping `next_free` (so the wait already reserved under the old parameters
//! still applies). Guava fixes `warmup` and `cold_factor` for a limiter's life; here a change
//! of them is applied by the same rule. Rejections and peeks store nothing.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! // Guava's testWarmUp: create(2.0, 4000 ms, 3.0).
//! let p: Policy = "smooth_warming_up:rate=2/s,warmup=4s".parse().unwrap();
//! let mut s = None;
//! let mut now = 1_700_000_000_000_000; // microseconds since the Unix epoch
//! let mut waits = Vec::new();
//! for _ in 0..8 {
//!     let d = p.apply(&mut s, now, Op::pace(), 1).unwrap();
//!     waits.push(d.delay.as_micros());
//!     now += d.delay.as_micros() as u64; // acquire: sleep the delay
//! }
//! // Cold: 1.5 s per permit at first, falling to the stable 0.5 s over the warm-up.
//! assert_eq!(waits, [0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000, 500_000, 500_000]);
//! ```

use super::guava::Config;
use super::Algorithm;
use crate::spec::{
    format_duration, parse_duration, parse_float, parse_rate, Params, MAX_DURATION_US,
};
use crate::{Decision, InputError, Op, Rate};
use std::time::Duration;

pub use super::guava::State;

/// The largest `cold_factor`.
const MAX_COLD_FACTOR: f64 = 1e6;

/// The `smooth_warming_up` policy: `rate`, `warmup` and `cold_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct SmoothWarmingUp {
    rate: Rate,
    warmup_us: u64,
    cold_factor: f64,
}

impl SmoothWarmingUp {
    /// Guava's `SmoothWarmingUp` at `rate`, warming up over `warmup` (1 µs to 10 years, whole
    /// microseconds) from a throttling interval `cold_factor` (1 to 1e6) times the stable
    /// one.
    ///
    /// ```
    /// use paceline_core::policy::SmoothWarmingUp;
    /// use paceline_core::{Policy, Rate};
    /// use std::time::Duration;
    /// let p: Policy = SmoothWarmingUp::new(Rate::per_second(2)?, Duration::from_secs(4), 3.0)?.into();
    /// assert_eq!(p, "smooth_warming_up:rate=2/s,warmup=4s".parse()?);
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn new(
        rate: Rate,
        warmup: Duration,
        cold_factor: f64,
    ) -> Result<SmoothWarmingUp, InputError> {
        let warmup_us = super::fixed_window::checked_duration("warmup", warmup, false)?;
        SmoothWarmingUp::from_micros(rate, warmup_us, cold_factor)
    }

    fn from_micros(
        rate: Rate,
        warmup_us: u64,
        cold_factor: f64,
    ) -> Result<SmoothWarmingUp, InputError> {
        if warmup_us == 0 || warmup_us > MAX_DURATION_US {
            return Err(InputError::new(
                "warmup",
                format!("{warmup_us}us is out of range; use a duration greater than zero and at most 3650d"),
            ));
        }
        if let Some(rule) = check_cold_factor(cold_factor) {
            return Err(InputError::new(
                "cold_factor",
                format!("{cold_factor} is out of range: {rule}"),
            ));
        }
        Ok(SmoothWarmingUp {
            rate,
            warmup_us,
            cold_factor,
        })
    }

    /// The stable rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The warm-up period, in microseconds.
    pub fn warmup_micros(&self) -> u64 {
        self.warmup_us
    }

    /// The cold interval over the stable interval.
    pub fn cold_factor(&self) -> f64 {
        self.cold_factor
    }

    /// Guava's `maxPermits`: the stored permits of a fully cold limiter.
    pub fn max_permits(&self) -> f64 {
        self.config().max_permits()
    }

    fn config(&self) -> Config {
        Config::warming_up(
            self.rate.events_per_second(),
            self.warmup_us,
            self.cold_factor,
        )
    }
}

fn check_cold_factor(v: f64) -> Option<&'static str> {
    (!(1.0..=MAX_COLD_FACTOR).contains(&v)).then_some("use a number from 1 to 1e6")
}

impl Algorithm for SmoothWarmingUp {
    type State = State;
    const NAME: &'static str = "smooth_warming_up";
    // Its state is a schedule: booking at a later slot is a `pace` as of that slot.
    const BOOKS_AS_OF: bool = true;
    const PARAMS: &'static [&'static str] = &["rate", "warmup", "cold_factor"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let rate = parse_rate("rate", &params.required("rate")?)?;
        let warmup = parse_duration("warmup", &params.required("warmup")?)?;
        let cold_factor = match params.optional("cold_factor") {
            Some(v) => parse_float("cold_factor", &v, check_cold_factor)?,
            None => 3.0,
        };
        SmoothWarmingUp::from_micros(rate, warmup, cold_factor)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("rate", self.rate.to_string()),
            ("warmup", format_duration(self.warmup_us)),
            ("cold_factor", self.cold_factor.to_string()),
        ]
    }

    fn max_cost(&self, _op: Op) -> Option<u64> {
        None
    }

    fn limit(&self) -> u64 {
        self.config().limit()
    }

    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        self.config().apply(state, now, op, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::guava::test_harness::{Guava, T0};
    use crate::policy::test_util::{policy, MS};
    use crate::Policy;
    use std::time::Duration;

    #[test]
    fn guava_test_warm_up() {
        let mut g = Guava::create("smooth_warming_up:rate=2,warmup=4000ms,cold_factor=3");
        g.acquire_n(8); // #1
        g.sleep_millis(500); // #2: to repay for the last acquire
        g.sleep_millis(4000); // #3: becomes cold again
        g.acquire_n(8); // #4
        g.sleep_millis(500); // #5: to repay for the last acquire
        g.sleep_millis(2000); // #6: didn't get cold! It would take another 2 seconds to go cold
        g.acquire_n(8); // #7
        assert_eq!(
            g.events(),
            [
                "R0.00, R1.38, R1.13, R0.88, R0.63, R0.50, R0.50, R0.50", // #1
                "U0.50",                                                  // #2
                "U4.00",                                                  // #3
                "R0.00, R1.38, R1.13, R0.88, R0.63, R0.50, R0.50, R0.50", // #4
                "U0.50",                                                  // #5
                "U2.00",                                                  // #6
                "R0.00, R0.50, R0.50, R0.50, R0.50, R0.50, R0.50, R0.50", // #7
            ]
            .join(", ")
        );
    }

    #[test]
    fn guava_test_warm_up_with_cold_factor() {
        let mut g = Guava::create("smooth_warming_up:rate=5,warmup=4000ms,cold_factor=10");
        g.acquire_n(8); // #1
        g.sleep_millis(200); // #2: to repay for the last acquire
        g.sleep_millis(4000); // #3: becomes cold again
        g.acquire_n(8); // #4
        g.sleep_millis(200); // #5: to repay for the last acquire
        g.sleep_millis(1000); // #6: still warm! It would take another 3 seconds to go cold
        g.acquire_n(8); // #7
        assert_eq!(
            g.events(),
            [
                "R0.00, R1.75, R1.26, R0.76, R0.30, R0.20, R0.20, R0.20", // #1
                "U0.20",                                                  // #2
                "U4.00",                                                  // #3
                "R0.00, R1.75, R1.26, R0.76, R0.30, R0.20, R0.20, R0.20", // #4
                "U0.20",                                                  // #5
                "U1.00",                                                  // #6
                "R0.00, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20", // #7
            ]
            .join(", ")
        );
    }

    #[test]
    fn guava_test_warm_up_with_cold_factor_1() {
        let mut g = Guava::create("smooth_warming_up:rate=5,warmup=4000ms,cold_factor=1");
        g.acquire_n(8); // #1
        g.sleep_millis(340); // #2
        g.acquire_n(8); // #3
        assert_eq!(
            g.events(),
            [
                "R0.00, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20", // #1
                "U0.34",                                                  // #2
                "R0.00, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20, R0.20", // #3
            ]
            .join(", ")
        );
    }

    #[test]
    fn guava_test_warm_up_and_update() {
        let mut g = Guava::create("smooth_warming_up:rate=2,warmup=4000ms,cold_factor=3");
        g.acquire_n(8); // #1
        g.sleep_millis(4500); // #2: back to cold state (warmup period + repay last acquire)
        g.acquire_n(3); // #3: only three steps, we're somewhere in the warmup period
        g.set_policy("smooth_warming_up:rate=4,warmup=4000ms,cold_factor=3"); // double the rate!
        g.acquire(1); // #4: we repay the debt of the last acquire (imposed by the old rate)
        g.acquire_n(4); // #5
        g.sleep_millis(4250); // #6: back to cold state (warmup period + repay last acquire)
        g.acquire_n(11); // #7: showing off the warmup starting from totally cold
        assert_eq!(
            // The areas (times) stay the same while the permits differ.
            g.events(),
            [
                "R0.00, R1.38, R1.13, R0.88, R0.63, R0.50, R0.50, R0.50", // #1
                "U4.50",                                                  // #2
                "R0.00, R1.38, R1.13",                                    // #3
                "R0.88",                                                  // #4
                "R0.34, R0.28, R0.25, R0.25",                             // #5
                "U4.25",                                                  // #6
                "R0.00, R0.72, R0.66, R0.59, R0.53, R0.47, R0.41",        // #7
                "R0.34, R0.28, R0.25, R0.25",                             // #7 (cont.), as #5
            ]
            .join(", ")
        );
    }

    #[test]
    fn guava_test_warm_up_and_update_with_cold_factor() {
        let mut g = Guava::create("smooth_warming_up:rate=5,warmup=4000ms,cold_factor=10");
        g.acquire_n(8); // #1
        g.sleep_millis(4200); // #2: back to cold state (warmup period + repay last acquire)
        g.acquire_n(3); // #3: only three steps, we're somewhere in the warmup period
        g.set_policy("smooth_warming_up:rate=10,warmup=4000ms,cold_factor=10"); // double the rate!
        g.acquire(1); // #4: we repay the debt of the last acquire (imposed by the old rate)
        g.acquire_n(4); // #5
        g.sleep_millis(4100); // #6: back to cold state (warmup period + repay last acquire)
        g.acquire_n(11); // #7: showing off the warmup starting from totally cold
        assert_eq!(
            g.events(),
            [
                "R0.00, R1.75, R1.26, R0.76, R0.30, R0.20, R0.20, R0.20", // #1
                "U4.20",                                                  // #2
                "R0.00, R1.75, R1.26",                                    // #3
                "R0.76",                                                  // #4
                "R0.20, R0.10, R0.10, R0.10",                             // #5
                "U4.10",                                                  // #6
                "R0.00, R0.94, R0.81, R0.69, R0.57, R0.44, R0.32",        // #7
                "R0.20, R0.10, R0.10, R0.10",                             // #7 (cont.), as #5
            ]
            .join(", ")
        );
    }

    #[test]
    fn guava_test_time_to_warm_up_is_honoured_even_with_weights() {
        // If warmup_permits = max_permits - threshold, then
        // warmup = (1 + cold_factor) * warmup_permits * stable / 2; spending them in random
        // weights (then one more to repay the debt) takes exactly the warm-up.
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut random = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let warmup_permits = 10u64;
        for _trial in 0..20 {
            for cold_factor in [2.0, 3.0, 10.0] {
                for qps in [4.0, 2.0, 1.0, 0.5, 0.1] {
                    let warmup_ms =
                        ((1.0 + cold_factor) * warmup_permits as f64 / (2.0 * qps) * 1000.0) as u64;
                    let mut g = Guava::create(&format!(
                        "smooth_warming_up:rate={qps},warmup={warmup_ms}ms,cold_factor={cold_factor}"
                    ));
                    let mut permits = warmup_permits;
                    while permits > 0 {
                        let next = random(permits).max(1);
                        permits -= next;
                        g.acquire(next);
                    }
                    g.acquire(1); // to repay for any pending debt
                    assert_eq!((g.now - T0) / MS, warmup_ms, "{}", g.policy);
                }
            }
        }
    }

    #[test]
    fn limit_and_max_wait_are_try_acquire() {
        let p = policy("smooth_warming_up:rate=2,warmup=4s");
        let mut s = None;
        let first = p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        assert!(first.is_immediate());
        assert_eq!((first.remaining, first.limit), (0, 1));
        // The first (cold) permit cost 1.375 s.
        let before = s.clone();
        let r = p.apply(&mut s, T0 + 375 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_secs(1));
        assert_eq!(s, before);
        let within = Op::pace_within(Duration::from_millis(400));
        let r = p.apply(&mut s, T0 + 375 * MS, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(600));
        assert_eq!(s, before);
        let ok = p.apply(&mut s, T0 + 975 * MS, within, 1).unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_millis(400));
        assert_eq!(ok.remaining, 0);
        // Reserved at 1.375 s for 1.125 s: free at 2.5 s.
        assert!(
            !p.apply(&mut s, T0 + 2_500 * MS - 1, Op::Limit, 1)
                .unwrap()
                .allowed
        );
        let d = p.apply(&mut s, T0 + 2_500 * MS, Op::Limit, 1).unwrap();
        assert!(d.is_immediate());
    }

    #[test]
    fn any_cost_is_admitted_and_paid_by_the_next_request() {
        let p = policy("smooth_warming_up:rate=2,warmup=4s");
        for op in [Op::Limit, Op::pace(), Op::Peek] {
            assert_eq!(p.max_cost(op), None);
        }
        let mut s = None;
        // 10 permits from cold: all 8 stored (4 above the threshold: the trapezoid of 4 s,
        // 4 below: 2 s) and 2 fresh (1 s).
        assert!(p.apply(&mut s, T0, Op::Limit, 10).unwrap().is_immediate());
        let next = p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        assert_eq!(next.delay, Duration::from_secs(7));
    }

    #[test]
    fn peek_reports_without_changing() {
        let p = policy("smooth_warming_up:rate=2,warmup=4s");
        let mut s = None;
        let idle = p.apply(&mut s, T0, Op::Peek, 5).unwrap();
        assert!(idle.is_immediate());
        assert_eq!(
            (idle.remaining, idle.reset_after, idle.limit),
            (1, Duration::ZERO, 1)
        );
        assert_eq!(s, None);
        p.apply(&mut s, T0, Op::pace(), 1).unwrap();
        let before = s.clone();
        let busy = p.apply(&mut s, T0 + 375 * MS, Op::Peek, 1).unwrap();
        assert!(!busy.allowed);
        assert_eq!(busy.delay, Duration::from_secs(1));
        // One permit (of 8) to cool down again at 0.5 s each, from 1.375 s.
        assert_eq!(
            (busy.remaining, busy.reset_after),
            (0, Duration::from_millis(1_500))
        );
        let free = p.apply(&mut s, T0 + 1_375 * MS, Op::Peek, 1).unwrap();
        assert!(free.is_immediate());
        assert_eq!(
            (free.remaining, free.reset_after),
            (1, Duration::from_millis(500))
        );
        assert_eq!(s, before);
    }

    #[test]
    fn reset_after_leads_to_exactly_a_new_keys_state() {
        let p = policy("smooth_warming_up:rate=3/s,warmup=1s,cold_factor=7");
        let mut s = None;
        let mut now = T0;
        let mut reset = 0;
        for cost in [1, 2, 1, 1, 3] {
            let d = p.apply(&mut s, now, Op::pace(), cost).unwrap();
            reset = now + d.reset_after.as_micros() as u64;
            now += d.delay.as_micros() as u64;
        }
        let Some(crate::State::SmoothWarmingUp(kept)) = s.clone() else {
            panic!("{s:?}")
        };
        // At the reset time the kept state resyncs to exactly a new key's cold state ...
        let mut at = kept;
        at.resync(reset as i64);
        assert_eq!(
            (at.stored_permits, at.next_free_ticket),
            (kept.max_permits, reset as i64)
        );
        // ... and not a microsecond earlier.
        let mut early = kept;
        early.resync(reset as i64 - 1);
        assert!(early.stored_permits < kept.max_permits);
        let d = p.apply(&mut s.clone(), reset - 1, Op::Peek, 1).unwrap();
        assert_eq!(d.reset_after, Duration::from_micros(1));
        // Decisions from then on are a new key's, whether or not the store dropped it.
        for op in [
            Op::pace(),
            Op::Limit,
            Op::Peek,
            Op::pace_within(Duration::ZERO),
        ] {
            for later in [0, 1, 10_000 * MS] {
                let kept_state = p.apply(&mut s.clone(), reset + later, op, 2).unwrap();
                let no_state = p.apply(&mut None, reset + later, op, 2).unwrap();
                assert_eq!(kept_state, no_state, "{op:?} +{later}");
            }
        }
    }

    #[test]
    fn live_change_of_warmup_and_cold_factor_scales_the_stored_permits() {
        let mut g = Guava::create("smooth_warming_up:rate=2,warmup=4s,cold_factor=3");
        // Stored 8 -> 5; the third request went at 2.5 s and reserved 0.875 s.
        g.acquire_n(3);
        // Same rate, warm-up halved: max_permits 8 -> 4, so stored 5 -> 2.5 (resynced first:
        // the next ticket is in the future, so nothing is added).
        g.set_policy("smooth_warming_up:rate=2,warmup=2s,cold_factor=3");
        let d = g.acquire(1);
        assert_eq!(
            d,
            Duration::from_millis(875),
            "the third request's cost, as reserved"
        );
        match &g.state {
            Some(crate::State::SmoothWarmingUp(s)) => {
                assert_eq!((s.max_permits, s.stored_permits), (4.0, 1.5));
                assert_eq!(s.cool_down_interval, 500_000.0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("smooth_warming_up:warmup=4s", "rate"),
            ("smooth_warming_up:rate=2", "warmup"),
            ("smooth_warming_up:rate=0,warmup=4s", "rate"),
            ("smooth_warming_up:rate=NaN,warmup=4s", "rate"),
            ("smooth_warming_up:rate=2,warmup=0s", "warmup"),
            ("smooth_warming_up:rate=2,warmup=4", "warmup"),
            ("smooth_warming_up:rate=2,warmup=-4s", "warmup"),
            ("smooth_warming_up:rate=2,warmup=3651d", "warmup"),
            (
                "smooth_warming_up:rate=2,warmup=4s,cold_factor=0.5",
                "cold_factor",
            ),
            (
                "smooth_warming_up:rate=2,warmup=4s,cold_factor=-3",
                "cold_factor",
            ),
            (
                "smooth_warming_up:rate=2,warmup=4s,cold_factor=NaN",
                "cold_factor",
            ),
            (
                "smooth_warming_up:rate=2,warmup=4s,cold_factor=2e6",
                "cold_factor",
            ),
            (
                "smooth_warming_up:rate=2,warmup=4s,cold_factor=x",
                "cold_factor",
            ),
            ("smooth_warming_up:rate=2,warmup=4s,burst=3", "burst"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        let rate = Rate::per_second(2.0).unwrap();
        assert_eq!(
            SmoothWarmingUp::from_micros(rate, 0, 3.0)
                .unwrap_err()
                .field(),
            "warmup"
        );
        assert_eq!(
            SmoothWarmingUp::from_micros(rate, MAX_DURATION_US + 1, 3.0)
                .unwrap_err()
                .field(),
            "warmup"
        );
        assert_eq!(
            SmoothWarmingUp::from_micros(rate, 1, 0.99)
                .unwrap_err()
                .field(),
            "cold_factor"
        );
        assert_eq!(
            SmoothWarmingUp::new(rate, Duration::from_secs(4), 3.0)
                .unwrap()
                .max_permits(),
            8.0
        );
        assert_eq!(
            policy("smooth_warming_up:qps=2,warmup=4000ms").to_string(),
            "smooth_warming_up:rate=2/s,warmup=4s,cold_factor=3"
        );
        for spec in [
            "smooth_warming_up:rate=2/s,warmup=4s,cold_factor=3",
            "smooth_warming_up:rate=5/m,warmup=1500ms,cold_factor=10.5",
            "smooth_warming_up:qps=100,warmup=7us",
        ] {
            let p = policy(spec);
            assert_eq!(policy(&p.to_string()), p, "{spec}");
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p, "{json}");
        }
    }
}

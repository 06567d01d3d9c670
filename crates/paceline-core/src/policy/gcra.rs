//! `gcra`: the generic cell rate algorithm (a token bucket, or a leaky bucket as a meter).
//!
//! Parameters: `rate` (alias `qps`) and `burst` (an integer >= 1, default 1). The emission
//! interval is `T = 1/rate`; the bucket holds `burst` cells, i.e. `burst * T` of time. The
//! only state is the theoretical arrival time `TAT`. For a request of cost `n` at `now`:
//!
//! ```text
//! tat     = max(TAT, now)
//! new_tat = tat + n*T
//! delay   = max(0, new_tat - burst*T - now)
//! ```
//!
//! `limit` admits iff `delay == 0` and then stores `new_tat`; `pace` always stores `new_tat`
//! and returns `delay`. `remaining = floor((burst*T - (new_tat - now)) / T)` and
//! `reset_after = new_tat - now`, with the same results as redis-cell's
//! `CL.THROTTLE key (burst-1) count period n`. A cost above `burst` can never pass `limit`
//! (an input error); `pace` delays it.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "gcra:rate=10/s,burst=3".parse().unwrap();
//! let mut s = None;
//! for remaining in [2, 1, 0] {
//!     assert_eq!(p.apply(&mut s, 0, Op::Limit, 1).unwrap().remaining, remaining);
//! }
//! let rejected = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
//! assert!(!rejected.allowed);
//! assert_eq!(rejected.delay.as_millis(), 100); // one emission interval
//! ```

use super::util::{floor_count, retry_after_max_wait};
use super::Algorithm;
use crate::decision::duration_to_micros;
use crate::spec::{parse_count, parse_rate, Params};
use crate::{Decision, InputError, Op, Rate};

/// Tolerance for float rounding when counting whole cells, far below one cell.
const CELL_EPSILON: f64 = 1e-9;

/// A delay below a nanosecond (the resolution of a [`Decision`]) is float residue of adding
/// intervals, not a wait: it counts as none. Without this, a key whose TAT sits a fraction
/// of a nanosecond past `now` would reject with a retry-after of zero.
const DELAY_EPSILON: f64 = 1e-3;

/// The `gcra` policy: `rate` and `burst`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    /// `T`, microseconds per cell (derived from `rate`).
    interval: f64,
    /// `1 / T` (derived), so counting cells needs no division.
    cells_per_micro: f64,
}

/// `gcra` state: the theoretical arrival time, microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    /// When the bucket will be empty again if nothing else arrives.
    pub tat: f64,
}

impl Gcra {
    /// A GCRA of `rate` with room for `burst` cells (`burst >= 1`).
    pub fn new(rate: Rate, burst: u64) -> Result<Gcra, InputError> {
        if burst == 0 || burst > crate::spec::MAX_COUNT {
            return Err(InputError::new(
                "burst",
                format!(
                    "{burst} is out of range; use an integer from 1 to {}",
                    crate::spec::MAX_COUNT
                ),
            ));
        }
        let interval = rate.interval_micros();
        Ok(Gcra {
            rate,
            burst,
            interval,
            cells_per_micro: 1.0 / interval,
        })
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst, in cells.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whole cells left when the bucket is `ttl` microseconds full:
    /// `floor((burst*T - ttl) / T)`, computed as `(burst*T - ttl) * (1/T)` (plus a tolerance
    /// far below one cell for float rounding).
    #[inline]
    fn remaining(&self, ttl: f64) -> u64 {
        floor_count((self.burst as f64 * self.interval - ttl) * self.cells_per_micro + CELL_EPSILON)
    }
}

impl Algorithm for Gcra {
    type State = State;
    const NAME: &'static str = "gcra";
    // Its state is a schedule: booking at a later slot is a `pace` as of that slot.
    const BOOKS_AS_OF: bool = true;
    const PARAMS: &'static [&'static str] = &["rate", "burst"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let rate = parse_rate("rate", &params.required("rate")?)?;
        let burst = match params.optional("burst") {
            Some(b) => parse_count("burst", &b, 1)?,
            None => 1,
        };
        Gcra::new(rate, burst)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("rate", self.rate.to_string()),
            ("burst", self.burst.to_string()),
        ]
    }

    fn max_cost(&self, op: Op) -> Option<u64> {
        match op {
            Op::Limit | Op::Peek => Some(self.burst),
            // Even on an idle key a cost of n waits (n - burst) * T: beyond `max_wait` it
            // could never be admitted.
            Op::Pace {
                max_wait: Some(max),
            } => {
                let extra = floor_count(duration_to_micros(max) / self.interval + CELL_EPSILON);
                Some(self.burst.saturating_add(extra))
            }
            Op::Pace { max_wait: None } | Op::Charge => None,
        }
    }

    fn limit(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        let (decision, new_tat) = self.step(state.map(|s| s.tat), now, op, cost);
        if let Some(tat) = new_tat {
            *state = Some(State { tat });
        }
        decision
    }
}

impl Gcra {
    /// The whole algorithm over a bare TAT (`None` = idle key): the decision and, if the
    /// request writes, the new TAT. A stored TAT at or before `now` is idle too, so a store
    /// needs no separate expiry for `gcra`: the key is idle once `TAT <= now`.
    ///
    /// `cost` must have passed [`Policy::check_cost`](crate::Policy::check_cost).
    #[inline]
    pub fn step(
        &self,
        stored_tat: Option<f64>,
        now: u64,
        op: Op,
        cost: u64,
    ) -> (Decision, Option<f64>) {
        let plan = self.plan(stored_tat, now, op, cost);
        (self.decision(&plan), plan.write)
    }

    /// The arithmetic of [`step`](Gcra::step) without building the [`Decision`]: the new TAT
    /// to write, if any, in a few float operations.
    ///
    /// Stores that keep the TAT in one atomic word plan inside their compare-and-swap loop
    /// and call [`decision`](Gcra::decision) once the swap has succeeded, which keeps the
    /// window between load and swap short under contention.
    ///
    /// ```
    /// use paceline_core::policy::Gcra;
    /// use paceline_core::{Op, Rate};
    /// let gcra = Gcra::new(Rate::per_second(10).unwrap(), 1).unwrap();
    /// let plan = gcra.plan(None, 0, Op::Limit, 1);
    /// assert_eq!(plan.write, Some(100_000.0)); // TAT = now + one interval
    /// assert!(gcra.decision(&plan).allowed);
    /// ```
    // The memory store's compare-and-swap loop (paceline-store) runs the arithmetic
    // alone; not part of the public API.
    #[doc(hidden)]
    #[inline]
    pub fn plan(&self, stored_tat: Option<f64>, now: u64, op: Op, cost: u64) -> Plan {
        let now = now as f64;
        let interval = self.interval;
        let tat = stored_tat.map_or(now, |t| t.max(now));
        let new_tat = tat + cost as f64 * interval;
        let mut delay = (new_tat - self.burst as f64 * interval - now).max(0.0);
        if delay < DELAY_EPSILON {
            delay = 0.0;
        }
        let (allowed, delay, write) = match op {
            Op::Peek => (delay == 0.0, delay, None),
            Op::Limit if delay == 0.0 => (true, delay, Some(new_tat)),
            Op::Limit => (false, delay, None),
            Op::Pace {
                max_wait: Some(max),
            } if delay > duration_to_micros(max) => (
                false,
                retry_after_max_wait(delay, duration_to_micros(max)),
                None,
            ),
            Op::Pace { .. } => (true, delay, Some(new_tat)),
            // Counted as a `pace` is (the TAT moves on, past the burst if need be: the debt),
            // but owed nothing: admitted now.
            Op::Charge => (true, 0.0, Some(new_tat)),
        };
        Plan {
            now,
            tat,
            allowed,
            delay,
            write,
        }
    }

    /// The decision a [`Plan`] stands for.
    #[doc(hidden)]
    #[inline]
    pub fn decision(&self, plan: &Plan) -> Decision {
        // The key after the request: the new TAT if it writes, the current one if not.
        let ttl = plan.write.unwrap_or(plan.tat) - plan.now;
        Decision::from_micros(
            plan.allowed,
            plan.delay,
            self.remaining(ttl),
            ttl,
            self.burst,
        )
    }
}

/// One `gcra` request worked out by [`Gcra::plan`], before its [`Decision`] is built.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// The TAT to store if the request is admitted (`None`: nothing changes).
    pub write: Option<f64>,
    now: f64,
    /// The TAT seen, raised to `now` if it was in the past.
    tat: f64,
    allowed: bool,
    delay: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use std::time::Duration;

    use crate::policy::test_util::{policy, MS};

    #[test]
    fn limit_admits_a_burst_then_one_per_interval() {
        let p = policy("gcra:rate=10/s,burst=3");
        let mut s = None;
        for _ in 0..3 {
            assert!(p.apply(&mut s, 0, Op::Limit, 1).unwrap().allowed);
        }
        let before = s.clone();
        let r = p.apply(&mut s, 50 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(50));
        assert_eq!(r.remaining, 0);
        assert_eq!(r.reset_after, Duration::from_millis(250));
        assert_eq!(s, before, "a rejection changes nothing");
        let ok = p.apply(&mut s, 100 * MS, Op::Limit, 1).unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.remaining, 0);
        assert_eq!(ok.reset_after, Duration::from_millis(300));
    }

    #[test]
    fn sub_nanosecond_float_residue_is_no_wait() {
        // 12 intervals of 1/3 s add up to a hair over 4 s in f64.
        let p = policy("gcra:rate=3/s");
        let mut s = None;
        for _ in 0..12 {
            p.apply(&mut s, 0, Op::pace(), 1).unwrap();
        }
        let d = p.apply(&mut s, 4_000_000, Op::Limit, 1).unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.delay, Duration::ZERO);
    }

    #[test]
    fn matches_redis_cell_throttle_example() {
        // CL.THROTTLE user123 15 30 60 1: max_burst 15 => burst 16, 30 per 60 s.
        let p = policy("gcra:rate=30/60s,burst=16");
        let mut s = None;
        let d = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
        assert!(d.allowed);
        assert_eq!(d.limit, 16);
        assert_eq!(d.remaining, 15);
        assert_eq!(d.reset_after, Duration::from_secs(2));
    }

    #[test]
    fn pace_reserves_future_slots_one_interval_apart() {
        let p = policy("gcra:rate=5/s");
        let mut s = None;
        let delays: Vec<u128> = (0..4)
            .map(|_| p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay.as_millis())
            .collect();
        assert_eq!(delays, [0, 200, 400, 600]);
    }

    #[test]
    fn pace_with_max_wait_rejects_without_side_effects() {
        let p = policy("gcra:rate=5/s");
        let mut s = None;
        p.apply(&mut s, 0, Op::pace(), 1).unwrap();
        p.apply(&mut s, 0, Op::pace(), 1).unwrap(); // reserved at 200 ms
        let before = s.clone();
        let r = p
            .apply(&mut s, 0, Op::pace_within(Duration::from_millis(300)), 1)
            .unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_millis(100),
            "400 ms delay - 300 ms max wait"
        );
        assert_eq!(s, before);
        let ok = p
            .apply(
                &mut s,
                100 * MS,
                Op::pace_within(Duration::from_millis(300)),
                1,
            )
            .unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_millis(300));
    }

    #[test]
    fn big_costs_pace_but_never_limit() {
        let p = policy("gcra:rate=10/s,burst=2");
        let mut s = None;
        assert_eq!(
            p.apply(&mut s, 0, Op::Limit, 3).unwrap_err().field(),
            "cost"
        );
        let d = p.apply(&mut s, 0, Op::pace(), 5).unwrap();
        assert!(d.allowed);
        assert_eq!(d.delay, Duration::from_millis(300));
    }

    #[test]
    fn pace_within_a_wait_no_idle_key_could_meet_is_an_input_error() {
        let p = policy("gcra:rate=10/s,burst=1");
        let mut s = None;
        // Cost 3 always waits at least 200 ms.
        let e = p
            .apply(&mut s, 0, Op::pace_within(Duration::from_millis(150)), 3)
            .unwrap_err();
        assert_eq!(e.field(), "cost");
        let ok = p
            .apply(&mut s, 0, Op::pace_within(Duration::from_millis(200)), 3)
            .unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_millis(200));
    }

    #[test]
    fn peek_reports_without_changing() {
        let p = policy("gcra:rate=10/s,burst=2");
        let mut s = None;
        let idle = p.apply(&mut s, 0, Op::Peek, 1).unwrap();
        assert!(idle.allowed);
        assert_eq!((idle.remaining, idle.reset_after), (2, Duration::ZERO));
        assert_eq!(s, None);
        p.apply(&mut s, 0, Op::Limit, 2).unwrap();
        let before = s.clone();
        let full = p.apply(&mut s, 0, Op::Peek, 1).unwrap();
        assert!(!full.allowed);
        assert_eq!(full.delay, Duration::from_millis(100));
        assert_eq!(full.remaining, 0);
        assert_eq!(s, before);
    }

    #[test]
    fn live_parameter_change_keeps_the_arrival_time() {
        let slow = policy("gcra:rate=1/s,burst=1");
        let fast = policy("gcra:rate=10/s,burst=1");
        let mut s = None;
        slow.apply(&mut s, 0, Op::Limit, 1).unwrap(); // TAT = 1 s
        let r = fast.apply(&mut s, 0, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_millis(1000),
            "TAT 1 s + 0.1 s - burst 0.1 s"
        );
    }

    #[test]
    fn fractional_intervals_count_whole_cells() {
        let p = policy("gcra:rate=3/s,burst=3");
        let mut s = None;
        let remaining: Vec<u64> = (0..3)
            .map(|_| p.apply(&mut s, 0, Op::Limit, 1).unwrap().remaining)
            .collect();
        assert_eq!(remaining, [2, 1, 0]);
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("gcra:burst=2", "rate"),
            ("gcra:rate=0,burst=2", "rate"),
            ("gcra:rate=-1/s", "rate"),
            ("gcra:rate=NaN", "rate"),
            ("gcra:rate=10/s,burst=0", "burst"),
            ("gcra:rate=10/s,burst=1.5", "burst"),
            ("gcra:rate=10/s,burst=x", "burst"),
            ("gcra:rate=10/s,window=1s", "window"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        assert_eq!(policy("gcra:qps=10").to_string(), "gcra:rate=10/s,burst=1");
    }
}

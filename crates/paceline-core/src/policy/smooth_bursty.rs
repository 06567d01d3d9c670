//! `smooth_bursty`: Guava's `RateLimiter.create(rate)` (`SmoothBursty`), exactly.
//!
//! Permits are issued at a stable `rate`. A request is admitted at the moment its *previous*
//! request's cost has been paid for: the cost of a request is paid by the *next* one, so a
//! request of any cost goes at once when nothing is owed, and an idle limiter stores unused
//! permits (up to `rate * max_burst_seconds`) that later requests spend for free.
//!
//! Parameters: `rate` (alias `qps`; Guava's `permitsPerSecond` is `rate` per second) and
//! `max_burst_seconds` (a number from 0 to 315360000, i.e. 10 years, default 1, as Guava's
//! `create`; `rate * max_burst_seconds` at most 2^40 permits).
//!
//! State: Guava's `storedPermits` and `nextFreeTicketMicros` (microseconds since the Unix
//! epoch), plus `max_permits` and the cool-down interval of the configuration last set, to
//! see parameter changes. With `stable = 1e6 / permits_per_second` microseconds and
//! `max_permits = max_burst_seconds * permits_per_second`, a request of cost `n` at `now`:
//!
//! ```text
//! resync:   if now > next_free:
//!             stored = min(max_permits, stored + (now - next_free) / stable); next_free = now
//! reserve:  moment = next_free; spend = min(n, stored)
//!           next_free += trunc((n - spend) * stable); stored -= spend
//!           delay = max(moment - now, 0)
//! ```
//!
//! * `pace` reserves always (Guava's `acquire(n)`, without the sleep).
//! * `limit` is Guava's `tryAcquire(n, 0)`: admitted iff `next_free <= now` (checked before
//!   resyncing), else rejected with `retry_after = next_free - now` and nothing changed.
//! * `pace` with `max_wait` is `tryAcquire(n, max_wait)`: admitted iff
//!   `next_free - max_wait <= now` (`max_wait` in whole microseconds, rounded down), else
//!   rejected with `retry_after = next_free - max_wait - now`.
//! * `peek` answers what `limit` would, changing nothing.
//!
//! Any cost is admitted by every op eventually (its cost is paid by the next request), so
//! there is no input error for large costs.
//!
//! The decision: `limit = floor(max_permits) + 1` (the stored permits plus the one paid by
//! the next request); `remaining` is 0 while `next_free > now`, else
//! `min(floor(stored) + 1, limit)` with `stored` resynced at `now`; `reset_after` is the time
//! until `stored` reaches `max_permits` with `next_free <= t` (rounded up to the first whole
//! microsecond at which the resync arithmetic gives `max_permits`).
//!
//! **New and long-idle keys.** A key's limiter is created at its first request, with no stored
//! permits and `next_free = now`, as Guava's `create` followed at once by the request. Once a
//! key is fully replenished (`reset_after` has passed) its state is dropped, and the next
//! request creates a new limiter, again with no stored permits. That is the one way a
//! long-idle key differs from one Guava object kept forever, which would hold a full burst of
//! `max_permits`: here a burst builds up after a request, is full at `reset_after`, and is
//! gone from then on. (A state found at or past its reset time is treated as absent, so the
//! result does not depend on when the store deletes it.)
//!
//! **Live parameter changes** follow Guava's `setRate` at the request's `now`: resync with the
//! old configuration, then `stored = stored * max_permits / old_max_permits` (0 if the old
//! `max_permits` was 0), keeping `next_free`. So the cost already owed (reserved under the old
//! rate) is still paid at the old rate, and the next one at the new rate. A change of
//! `max_burst_seconds` alone is applied the same way. Rejections and peeks store nothing.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! // Guava's RateLimiter.create(5.0): each request pays 200 ms for the next one.
//! let p: Policy = "smooth_bursty:rate=5/s".parse().unwrap();
//! let mut s = None;
//! let mut now = 1_700_000_000_000_000; // microseconds since the Unix epoch
//! let mut waits = Vec::new();
//! for _ in 0..3 {
//!     let d = p.apply(&mut s, now, Op::pace(), 1).unwrap();
//!     waits.push(d.delay.as_millis());
//!     now += d.delay.as_micros() as u64; // acquire: sleep the delay
//! }
//! assert_eq!(waits, [0, 200, 200]);
//! // `limit` is tryAcquire(1, 0): the next free ticket is 200 ms away.
//! let d = p.apply(&mut s, now, Op::Limit, 1).unwrap();
//! assert!(!d.allowed);
//! assert_eq!(d.delay.as_millis(), 200);
//! // One second later, 4 permits are stored: 5 requests go at once.
//! now += 1_000_000;
//! assert_eq!(p.apply(&mut s, now, Op::Peek, 1).unwrap().remaining, 5);
//! ```

use super::guava::Config;
use super::Algorithm;
use crate::spec::{parse_float, parse_rate, Params, MAX_COUNT};
use crate::{Decision, InputError, Op, Rate};

pub use super::guava::State;

/// The largest `max_burst_seconds`: 10 years.
const MAX_BURST_SECONDS: f64 = 315_360_000.0;

/// The `smooth_bursty` policy: `rate` and `max_burst_seconds`.
#[derive(Clone, Debug, PartialEq)]
pub struct SmoothBursty {
    rate: Rate,
    max_burst_seconds: f64,
}

impl SmoothBursty {
    /// Guava's `SmoothBursty` at `rate`, storing at most `max_burst_seconds` (0 to 10 years;
    /// at most 2^40 permits) worth of unused permits.
    pub fn new(rate: Rate, max_burst_seconds: f64) -> Result<SmoothBursty, InputError> {
        if let Some(rule) = check_max_burst_seconds(max_burst_seconds) {
            return Err(InputError::new(
                "max_burst_seconds",
                format!("{max_burst_seconds} is out of range: {rule}"),
            ));
        }
        if max_burst_seconds * rate.events_per_second() > MAX_COUNT as f64 {
            return Err(InputError::new(
                "max_burst_seconds",
                format!(
                    "{max_burst_seconds} stores too many permits at {rate}: \
                     rate * max_burst_seconds must be at most {MAX_COUNT}"
                ),
            ));
        }
        Ok(SmoothBursty {
            rate,
            max_burst_seconds,
        })
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The most seconds' worth of unused permits stored.
    pub fn max_burst_seconds(&self) -> f64 {
        self.max_burst_seconds
    }

    /// Guava's `maxPermits`: `max_burst_seconds * permits_per_second`.
    pub fn max_permits(&self) -> f64 {
        self.config().max_permits()
    }

    fn config(&self) -> Config {
        Config::bursty(self.rate.events_per_second(), self.max_burst_seconds)
    }
}

fn check_max_burst_seconds(v: f64) -> Option<&'static str> {
    (!(0.0..=MAX_BURST_SECONDS).contains(&v))
        .then_some("use a number from 0 to 315360000 (10 years)")
}

impl Algorithm for SmoothBursty {
    type State = State;
    const NAME: &'static str = "smooth_bursty";
    // Its state is a schedule: booking at a later slot is a `pace` as of that slot.
    const BOOKS_AS_OF: bool = true;
    const PARAMS: &'static [&'static str] = &["rate", "max_burst_seconds"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let rate = parse_rate("rate", &params.required("rate")?)?;
        let max_burst_seconds = match params.optional("max_burst_seconds") {
            Some(v) => parse_float("max_burst_seconds", &v, check_max_burst_seconds)?,
            None => 1.0,
        };
        SmoothBursty::new(rate, max_burst_seconds)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("rate", self.rate.to_string()),
            ("max_burst_seconds", self.max_burst_seconds.to_string()),
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
    fn guava_test_simple() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        for _ in 0..3 {
            g.acquire(1);
        }
        assert_eq!(g.events(), "R0.00, R0.20, R0.20");
    }

    #[test]
    fn guava_test_simple_with_wait() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        g.acquire(1);
        g.sleep_millis(200);
        g.acquire(1);
        g.acquire(1);
        assert_eq!(g.events(), "R0.00, U0.20, R0.00, R0.20");
    }

    #[test]
    fn guava_test_simple_acquire_earliest_available_is_in_past() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        assert_eq!(g.acquire(1), Duration::ZERO);
        g.sleep_millis(400);
        assert_eq!(g.acquire(1), Duration::ZERO);
        assert_eq!(g.acquire(1), Duration::ZERO);
        assert_eq!(g.acquire(1), Duration::from_millis(200));
    }

    #[test]
    fn guava_test_simple_weights() {
        let mut g = Guava::create("smooth_bursty:rate=1");
        for permits in [1, 1, 2, 4, 8, 1] {
            g.acquire(permits);
        }
        assert_eq!(g.events(), "R0.00, R1.00, R1.00, R2.00, R4.00, R8.00");
        // The same with a large weight: it is paid by the request after it.
        let mut g = Guava::create("smooth_bursty:rate=1");
        for permits in [1, 1, 2, 4, 100, 1] {
            g.acquire(permits);
        }
        assert_eq!(g.events(), "R0.00, R1.00, R1.00, R2.00, R4.00, R100.00");
    }

    #[test]
    fn guava_test_one_second_burst() {
        // Guava: create(5.0), sleep 1 s ("max capacity reached"), sleep 1 s ("no
        // difference"), then acquire 1, 1, 3, 1 -> R0.00 each, acquire -> R0.20. Here the
        // limiter is created by a first request at T0 (R0.00, paying 200 ms for the next),
        // and the burst is full 1.2 s later, at the key's reset time.
        let mut g = Guava::create("smooth_bursty:rate=5");
        let first = g.policy.apply(&mut g.state, g.now, Op::pace(), 1).unwrap();
        assert!(first.is_immediate());
        assert_eq!(first.reset_after, Duration::from_millis(1_200));
        let created = g.state.clone();
        // One microsecond before it, 4.999995 permits are stored: the same burst as Guava's
        // at its 10 ms resolution.
        g.now += 1_200 * MS - 1;
        assert_eq!(
            g.policy
                .apply(&mut g.state, g.now, Op::Peek, 1)
                .unwrap()
                .remaining,
            5
        );
        for permits in [1, 1, 3, 1] {
            g.acquire(permits);
        }
        g.acquire(1);
        assert_eq!(g.events(), "R0.00, R0.00, R0.00, R0.00, R0.20");
        // At (and after) the reset time the key is idle again: its state is dropped and the
        // next request creates a new limiter with no stored permits, where Guava's object
        // kept forever would still hold 5. This is the documented difference.
        for idle in [1_200 * MS, 2_000 * MS] {
            let mut g = Guava::create("smooth_bursty:rate=5");
            g.state = created.clone();
            g.now += idle;
            g.acquire(1);
            g.acquire(1);
            assert_eq!(g.events(), "R0.00, R0.20");
        }
    }

    #[test]
    fn guava_test_bursty_and_update() {
        let mut g = Guava::create("smooth_bursty:rate=1");
        g.acquire(1); // no wait
        g.acquire(1); // R1.00, to repay previous
        g.set_policy("smooth_bursty:rate=2"); // update the rate!
        g.acquire(1); // R1.00, to repay previous (the previous was under the old rate!)
        g.acquire(2); // R0.50, to repay previous (now the rate takes effect)
        g.acquire(4); // R1.00, to repay previous
        g.acquire(1); // R2.00, to repay previous
        assert_eq!(g.events(), "R0.00, R1.00, R1.00, R0.50, R1.00, R2.00");
    }

    #[test]
    fn guava_test_simple_rate_update_keeps_the_state() {
        // create(5.0), then setRate(10.0): the reservation made at the old rate stands, the
        // stored permits are scaled from 5 to 10 maximum.
        let mut g = Guava::create("smooth_bursty:rate=5");
        g.acquire(1);
        g.sleep_millis(600); // 2 permits stored (of 5)
        g.set_policy("smooth_bursty:rate=10");
        let d = g.policy.apply(&mut g.state, g.now, Op::Peek, 1).unwrap();
        assert_eq!((d.remaining, d.limit), (5, 11), "4 stored (2 * 10 / 5) + 1");
        // Peeking stored nothing: still the old configuration.
        match &g.state {
            Some(crate::State::SmoothBursty(s)) => assert_eq!(s.max_permits, 5.0),
            other => panic!("{other:?}"),
        }
        for _ in 0..5 {
            assert_eq!(g.acquire(1), Duration::ZERO);
        }
        assert_eq!(g.acquire(1), Duration::from_millis(100));
        match &g.state {
            Some(crate::State::SmoothBursty(s)) => {
                assert_eq!((s.max_permits, s.cool_down_interval), (10.0, 100_000.0))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn guava_test_try_acquire_no_wait_allowed() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        assert!(g.try_acquire(1, Duration::ZERO));
        assert!(!g.try_acquire(1, Duration::ZERO));
        assert!(!g.try_acquire(1, Duration::ZERO));
        g.sleep_millis(100);
        assert!(!g.try_acquire(1, Duration::ZERO));
    }

    #[test]
    fn guava_test_try_acquire_some_wait_allowed() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        assert!(g.try_acquire(1, Duration::ZERO));
        assert!(g.try_acquire(1, Duration::from_millis(200)));
        assert!(!g.try_acquire(1, Duration::from_millis(100)));
        g.sleep_millis(100);
        assert!(g.try_acquire(1, Duration::from_millis(100)));
    }

    #[test]
    fn guava_test_try_acquire_overflow() {
        let mut g = Guava::create("smooth_bursty:rate=5");
        assert!(g.try_acquire(1, Duration::ZERO));
        g.sleep_millis(100);
        assert!(g.try_acquire(1, Duration::from_micros(i64::MAX as u64)));
        assert!(g.try_acquire(1, Duration::MAX));
    }

    #[test]
    fn guava_test_try_acquire_after_a_big_weight() {
        // Guava's testTryAcquire_negative with the timeouts it can express here (>= 0).
        let mut g = Guava::create("smooth_bursty:rate=5");
        assert!(g.try_acquire(5, Duration::ZERO));
        g.sleep_millis(900);
        assert!(!g.try_acquire(1, Duration::ZERO));
        g.sleep_millis(100);
        assert!(g.try_acquire(1, Duration::ZERO));
    }

    #[test]
    fn guava_test_immediate_try_acquire() {
        let mut g = Guava::create("smooth_bursty:rate=1");
        assert!(
            g.try_acquire(1, Duration::ZERO),
            "unable to acquire initial permit"
        );
        assert!(
            !g.try_acquire(1, Duration::ZERO),
            "capable of acquiring secondary permit"
        );
    }

    #[test]
    fn guava_test_very_small_rates() {
        // Guava uses Double.MIN_VALUE; the slowest rate here is one per 10 years.
        let mut g = Guava::create("smooth_bursty:rate=1/3650d");
        assert!(
            g.try_acquire(1, Duration::ZERO),
            "should acquire initial permit"
        );
        assert!(!g.try_acquire(1, Duration::ZERO));
        g.sleep_millis(5000);
        assert!(!g.try_acquire(1, Duration::ZERO), "not even after sleeping");
    }

    #[test]
    fn guava_test_we_never_get_a_burst_more_than_one_sec() {
        let mut seed: u64 = 0x5851_f42d_4c95_7f2d;
        let mut random = move |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        // Spends `permits` in random weights, then one more to repay the debt.
        let mut measure_total_time_millis = |g: &mut Guava, permits: u64| {
            let start = g.now;
            let mut permits = permits;
            while permits > 0 {
                let next = random(permits).max(1);
                permits -= next;
                g.acquire(next);
            }
            g.acquire(1);
            (g.now - start) / MS
        };
        let mut g = Guava::create("smooth_bursty:rate=1");
        for rate in [1_000, 1, 10, 1_000_000, 10, 1] {
            let one_sec_worth_of_work = rate;
            g.sleep_millis(rate * 1000);
            g.set_policy(&format!("smooth_bursty:rate={rate}"));
            let burst = measure_total_time_millis(&mut g, one_sec_worth_of_work);
            assert!(burst <= 1000, "rate {rate}: burst took {burst} ms");
            let after_burst = measure_total_time_millis(&mut g, one_sec_worth_of_work);
            assert!(
                after_burst >= 1000,
                "rate {rate}: after the burst {after_burst} ms"
            );
        }
    }

    #[test]
    fn limit_and_max_wait_reject_with_exact_retry_after() {
        let p = policy("smooth_bursty:rate=5");
        let mut s = None;
        let first = p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        assert!(first.is_immediate());
        assert_eq!((first.remaining, first.limit), (0, 6));
        let before = s.clone();
        let r = p.apply(&mut s, T0 + 50 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(150));
        assert_eq!(r.remaining, 0);
        assert_eq!(r.reset_after, Duration::from_millis(1_150));
        assert_eq!(s, before);
        let r = p
            .apply(
                &mut s,
                T0 + 50 * MS,
                Op::pace_within(Duration::from_micros(100_500)),
                1,
            )
            .unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_micros(49_500));
        assert_eq!(s, before);
        // Retrying then is admitted, with the wait up to max_wait.
        let ok = p
            .apply(
                &mut s,
                T0 + 99_500,
                Op::pace_within(Duration::from_micros(100_500)),
                1,
            )
            .unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_micros(100_500));
        // It went 100.5 ms after 99.5 ms, at 200 ms: the next free ticket is at 400 ms.
        assert!(p
            .apply(&mut s, T0 + 400 * MS - 1, Op::Limit, 1)
            .unwrap()
            .retry_after()
            .is_some());
        assert!(p
            .apply(&mut s, T0 + 400 * MS, Op::Limit, 1)
            .unwrap()
            .is_immediate());
    }

    #[test]
    fn any_cost_is_admitted_and_paid_by_the_next_request() {
        let p = policy("smooth_bursty:rate=10/s");
        for op in [Op::Limit, Op::pace(), Op::Peek] {
            assert_eq!(p.max_cost(op), None);
        }
        let mut s = None;
        let big = p.apply(&mut s, T0, Op::Limit, 1_000).unwrap();
        assert!(big.is_immediate());
        let next = p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        assert!(!next.allowed);
        assert_eq!(next.delay, Duration::from_secs(100));
    }

    #[test]
    fn peek_reports_without_changing() {
        let p = policy("smooth_bursty:rate=10/s,max_burst_seconds=0.5");
        let mut s = None;
        let idle = p.apply(&mut s, T0, Op::Peek, 3).unwrap();
        assert!(idle.is_immediate());
        // A new limiter has no stored permits: one request at once.
        assert_eq!(
            (idle.remaining, idle.reset_after, idle.limit),
            (1, Duration::ZERO, 6)
        );
        assert_eq!(s, None);
        p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        let before = s.clone();
        let busy = p.apply(&mut s, T0 + 40 * MS, Op::Peek, 1).unwrap();
        assert!(!busy.allowed);
        assert_eq!(busy.delay, Duration::from_millis(60));
        assert_eq!(
            (busy.remaining, busy.reset_after),
            (0, Duration::from_millis(560))
        );
        // 350 ms later: 2.5 permits stored, so 3 requests at once.
        let later = p.apply(&mut s, T0 + 350 * MS, Op::Peek, 1).unwrap();
        assert!(later.is_immediate());
        assert_eq!(
            (later.remaining, later.reset_after),
            (3, Duration::from_millis(250))
        );
        assert_eq!(s, before);
        for expected in [2, 1, 0] {
            let d = p.apply(&mut s, T0 + 350 * MS, Op::Limit, 1).unwrap();
            assert!(d.is_immediate());
            assert_eq!(d.remaining, expected);
        }
        assert!(
            !p.apply(&mut s, T0 + 350 * MS, Op::Limit, 1)
                .unwrap()
                .allowed
        );
    }

    #[test]
    fn reset_after_is_when_the_burst_is_full() {
        let p = policy("smooth_bursty:rate=3/s,max_burst_seconds=2");
        let mut s = None;
        let d = p.apply(&mut s, T0, Op::pace(), 2).unwrap();
        // next_free = T0 + 666_666 µs; 6 permits take 2 s more to store.
        assert_eq!(d.reset_after, Duration::from_micros(2_666_666));
        let reset = T0 + d.reset_after.as_micros() as u64;
        // Just before: not quite full. At the reset time: treated as a new limiter, whatever
        // the store still holds.
        let before = p.apply(&mut s, reset - 1, Op::Peek, 1).unwrap();
        assert_eq!(
            (before.remaining, before.reset_after),
            (6, Duration::from_micros(1))
        );
        let at = p.apply(&mut s.clone(), reset, Op::pace(), 1).unwrap();
        assert_eq!(at, p.apply(&mut None, reset, Op::pace(), 1).unwrap());
    }

    #[test]
    fn zero_max_burst_seconds_stores_nothing() {
        let p = policy("smooth_bursty:rate=10/s,max_burst_seconds=0");
        assert_eq!(p.limit(), 1);
        let mut s = None;
        let d = p.apply(&mut s, T0, Op::Limit, 1).unwrap();
        assert_eq!(
            (d.remaining, d.reset_after),
            (0, Duration::from_millis(100))
        );
        let later = p.apply(&mut s, T0 + 10_000 * MS, Op::Peek, 1).unwrap();
        assert_eq!(later.remaining, 1);
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("smooth_bursty:max_burst_seconds=1", "rate"),
            ("smooth_bursty:rate=0", "rate"),
            ("smooth_bursty:rate=-5/s", "rate"),
            ("smooth_bursty:rate=NaN", "rate"),
            (
                "smooth_bursty:rate=5,max_burst_seconds=-1",
                "max_burst_seconds",
            ),
            (
                "smooth_bursty:rate=5,max_burst_seconds=NaN",
                "max_burst_seconds",
            ),
            (
                "smooth_bursty:rate=5,max_burst_seconds=inf",
                "max_burst_seconds",
            ),
            (
                "smooth_bursty:rate=5,max_burst_seconds=x",
                "max_burst_seconds",
            ),
            (
                "smooth_bursty:rate=5,max_burst_seconds=315360001",
                "max_burst_seconds",
            ),
            (
                "smooth_bursty:rate=1e9,max_burst_seconds=1e4",
                "max_burst_seconds",
            ),
            ("smooth_bursty:rate=5,burst=3", "burst"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        let rate = Rate::per_second(5.0).unwrap();
        assert_eq!(
            SmoothBursty::new(rate, -0.5).unwrap_err().field(),
            "max_burst_seconds"
        );
        assert_eq!(
            SmoothBursty::new(rate, f64::NAN).unwrap_err().field(),
            "max_burst_seconds"
        );
        assert_eq!(SmoothBursty::new(rate, 2.0).unwrap().max_permits(), 10.0);
        assert_eq!(
            policy("smooth_bursty:qps=5").to_string(),
            "smooth_bursty:rate=5/s,max_burst_seconds=1"
        );
        for spec in [
            "smooth_bursty:rate=5/s,max_burst_seconds=2",
            "smooth_bursty:qps=0.5",
            "smooth_bursty:rate=3/10s,max_burst_seconds=0.25",
        ] {
            let p = policy(spec);
            assert_eq!(policy(&p.to_string()), p, "{spec}");
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p, "{json}");
        }
    }
}

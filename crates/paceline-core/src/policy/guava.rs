//! Guava's `SmoothRateLimiter`: the core shared by [`smooth_bursty`](super::smooth_bursty)
//! and [`smooth_warming_up`](super::smooth_warming_up).
//!
//! One key's state is one Guava limiter object, [`State`]: `stored_permits` (f64),
//! `next_free_ticket` (written `next_free` below; Guava's `nextFreeTicketMicros`, whole
//! microseconds since the Unix epoch) and the `max_permits` and cool-down interval
//! (`cool_down_interval`, written `cool_down` below) of the configuration it was last set
//! with (so that a parameter change is seen and applied the way Guava's `setRate` does). Both
//! policies' modules re-export [`State`] as their own. The transitions,
//! with Java's `(long)` casts (truncation toward zero, saturating) written `trunc`:
//!
//! ```text
//! resync(now):    if now > next_free:
//!                   stored = min(max_permits, stored + (now - next_free) / cool_down)
//!                   next_free = now
//! reserve(n, now): resync(now); moment = next_free
//!                  spend = min(n, stored); fresh = n - spend
//!                  wait = stored_permits_to_wait_time(stored, spend) + trunc(fresh * stable)
//!                  next_free = next_free + wait (saturating); stored -= spend
//!                  delay = max(moment - now, 0)
//! try_acquire(n, timeout, now): if next_free - timeout <= now (no resync first, as Guava's
//!                  queryEarliestAvailable): reserve(n, now); else reject,
//!                  retry_after = next_free - timeout - now
//! set_rate(now):   resync(now) with the old configuration; then
//!                  stored = initial            if old max_permits == 0 (a new limiter)
//!                           stored * max_permits / old max_permits   otherwise
//! ```
//!
//! with `stable = 1e6 / permits_per_second` and, per shape:
//!
//! ```text
//! bursty:     max_permits = max_burst_seconds * permits_per_second; cool_down = stable
//!             stored_permits_to_wait_time = 0; initial stored = 0
//! warming up: cold = stable * cold_factor
//!             threshold = 0.5 * warmup / stable
//!             max_permits = threshold + 2 * warmup / (stable + cold)
//!             slope = (cold - stable) / (max_permits - threshold)
//!             cool_down = warmup / max_permits; initial stored = max_permits
//!             stored_permits_to_wait_time(stored, take):
//!               above = stored - threshold; micros = 0
//!               if above > 0: t = min(above, take)
//!                             micros = trunc(t * (time(above) + time(above - t)) / 2)
//!                             take -= t
//!               micros + trunc(stable * take),    where time(p) = stable + p * slope
//! ```
//!
//! The ops: `limit` is `try_acquire(cost, 0)`, `pace` with `max_wait` is
//! `try_acquire(cost, max_wait)` (`max_wait` rounded down to whole microseconds, as Guava's
//! `unit.toMicros`), `pace` reserves always, `peek` answers what `limit` would without
//! changing anything.
//!
//! A key with no state gets a new limiter at its first request: Guava's constructor, then
//! `set_rate` at `now` (`next_free = now`, the initial stored permits). A parameter change is
//! seen by comparing the stored `max_permits` and cool-down with the new configuration's
//! (parameters that change neither would only make `set_rate` multiply the stored permits by
//! one); it applies `set_rate` at the request's `now`, before the request, as a
//! `setRate` call just before it would. Rejections and peeks store nothing, not even the
//! change.
//!
//! The state's reset time is when it is fully replenished and nothing is reserved:
//! `next_free + fill`, where `fill` is the least whole number of microseconds with
//! `stored + fill / cool_down >= max_permits` in the resync arithmetic:
//! `fill = ceil((max_permits - stored) * cool_down)`, then one less if that already gives
//! `max_permits`, or one more if it does not yet (one step suffices: the float error is far
//! below a microsecond because the fill time from empty is at most 10 years). A state at or
//! past its reset time is treated as no state, so the result does not depend on when a store
//! actually deletes it.

use super::util::floor_count;
use crate::{Decision, Op};

/// Tolerance when counting whole stored permits: a permit short by float rounding only is
/// still a permit (its fresh remainder costs under a microsecond, truncated to nothing).
const PERMIT_EPSILON: f64 = 1e-9;

/// `smooth_bursty` and `smooth_warming_up` state: one Guava `SmoothBursty` or
/// `SmoothWarmingUp` object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    /// Guava's `storedPermits`: unused permits, `0..=max_permits`. For `smooth_warming_up`,
    /// `max_permits` is fully cold, `threshold` and below is warm.
    pub stored_permits: f64,
    /// Guava's `nextFreeTicketMicros`: when the next request may go (the previous requests'
    /// cost paid), microseconds since the Unix epoch.
    pub next_free_ticket: i64,
    /// Guava's `maxPermits` when the state was last written (`rate * max_burst_seconds` for
    /// `smooth_bursty`).
    pub max_permits: f64,
    /// The cool-down interval (Guava's `coolDownIntervalMicros()`, microseconds per permit)
    /// when the state was last written: the stable interval for `smooth_bursty`,
    /// `warmup / max_permits` for `smooth_warming_up`.
    pub cool_down_interval: f64,
}

impl State {
    /// Guava's `resync`, with the limiter's own (last set) configuration.
    pub(super) fn resync(&mut self, now: i64) {
        if now > self.next_free_ticket {
            let new_permits =
                now.saturating_sub(self.next_free_ticket) as f64 / self.cool_down_interval;
            self.stored_permits = self.max_permits.min(self.stored_permits + new_permits);
            self.next_free_ticket = now;
        }
    }

    /// When the limiter is fully replenished with nothing reserved (see the module docs).
    fn reset_at(&self) -> i64 {
        let short = self.max_permits - self.stored_permits;
        if short.is_nan() || short <= 0.0 {
            return self.next_free_ticket;
        }
        // The resync arithmetic after `fill` microseconds, uncapped.
        let full_after =
            |fill: f64| self.stored_permits + fill / self.cool_down_interval >= self.max_permits;
        let mut fill = (short * self.cool_down_interval).ceil();
        if fill >= 1.0 && full_after(fill - 1.0) {
            fill -= 1.0;
        } else if !full_after(fill) {
            fill += 1.0;
        }
        self.next_free_ticket.saturating_add(fill as i64)
    }
}

/// How stored permits are paid for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Shape {
    /// `SmoothBursty`: stored permits are free.
    Bursty,
    /// `SmoothWarmingUp`: stored permits above `threshold` cost more, up to the cold interval.
    WarmingUp {
        /// `thresholdPermits`.
        threshold: f64,
        /// `slope`, microseconds per permit per permit.
        slope: f64,
    },
}

/// One configuration, as Guava's `doSetRate` computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Config {
    /// `stableIntervalMicros`.
    stable: f64,
    /// `maxPermits`.
    max_permits: f64,
    /// `coolDownIntervalMicros()`.
    cool_down: f64,
    shape: Shape,
}

impl Config {
    /// `SmoothBursty` at `per_second` with `max_burst_seconds`.
    pub(super) fn bursty(per_second: f64, max_burst_seconds: f64) -> Config {
        let stable = 1e6 / per_second;
        Config {
            stable,
            max_permits: max_burst_seconds * per_second,
            cool_down: stable,
            shape: Shape::Bursty,
        }
    }

    /// `SmoothWarmingUp` at `per_second` with `warmup_us` and `cold_factor`.
    pub(super) fn warming_up(per_second: f64, warmup_us: u64, cold_factor: f64) -> Config {
        let warmup = warmup_us as f64;
        let stable = 1e6 / per_second;
        let cold = stable * cold_factor;
        let threshold = 0.5 * warmup / stable;
        let max_permits = threshold + 2.0 * warmup / (stable + cold);
        let slope = (cold - stable) / (max_permits - threshold);
        Config {
            stable,
            max_permits,
            cool_down: warmup / max_permits,
            shape: Shape::WarmingUp { threshold, slope },
        }
    }

    /// `maxPermits`.
    pub(super) fn max_permits(&self) -> f64 {
        self.max_permits
    }

    /// The decision's `limit`: stored permits plus the one paid by the next request
    /// (bursty); 1 when every permit costs time (warming up).
    pub(super) fn limit(&self) -> u64 {
        match self.shape {
            Shape::Bursty => floor_count(self.max_permits + PERMIT_EPSILON).saturating_add(1),
            Shape::WarmingUp { .. } => 1,
        }
    }

    /// Guava's `storedPermitsToWaitTime`.
    fn stored_permits_to_wait_time(&self, stored: f64, take: f64) -> i64 {
        match self.shape {
            Shape::Bursty => 0,
            Shape::WarmingUp { threshold, slope } => {
                let permits_to_time = |permits: f64| self.stable + permits * slope;
                let above = stored - threshold;
                let mut take = take;
                let mut micros: i64 = 0;
                if above > 0.0 {
                    let from_above = above.min(take);
                    let length = permits_to_time(above) + permits_to_time(above - from_above);
                    micros = (from_above * length / 2.0) as i64;
                    take -= from_above;
                }
                micros.saturating_add((self.stable * take) as i64)
            }
        }
    }

    /// Guava's `setRate` at `now` on `old`: resync with the old configuration, then this one.
    fn set_rate(&self, old: State, now: i64) -> State {
        let mut l = old;
        l.resync(now);
        let stored_permits = if l.max_permits == 0.0 {
            match self.shape {
                Shape::Bursty => 0.0,
                Shape::WarmingUp { .. } => self.max_permits,
            }
        } else {
            l.stored_permits * self.max_permits / l.max_permits
        };
        State {
            stored_permits,
            next_free_ticket: l.next_free_ticket,
            max_permits: self.max_permits,
            cool_down_interval: self.cool_down,
        }
    }

    /// Guava's `reserveEarliestAvailable`: returns the moment the permits are available.
    fn reserve(&self, l: &mut State, permits: f64, now: i64) -> i64 {
        l.resync(now);
        let moment = l.next_free_ticket;
        let spend = permits.min(l.stored_permits);
        let fresh = permits - spend;
        let wait = self
            .stored_permits_to_wait_time(l.stored_permits, spend)
            .saturating_add((fresh * self.stable) as i64);
        l.next_free_ticket = l.next_free_ticket.saturating_add(wait);
        l.stored_permits -= spend;
        moment
    }

    /// Cost-1 requests `limit` would admit right now from `l` (resynced at `now`).
    fn remaining(&self, l: &State, now: i64) -> u64 {
        if l.next_free_ticket > now {
            return 0;
        }
        match self.shape {
            Shape::Bursty => floor_count(l.stored_permits + PERMIT_EPSILON)
                .saturating_add(1)
                .min(self.limit()),
            Shape::WarmingUp { .. } => 1,
        }
    }

    /// Applies one request to one key's limiter (`None`: no limiter yet).
    pub(super) fn apply(
        &self,
        state: &mut Option<State>,
        now_us: u64,
        op: Op,
        cost: u64,
    ) -> Decision {
        let now = i64::try_from(now_us).unwrap_or(i64::MAX);
        // A state at or past its reset time is gone: the key gets a new limiter.
        let live = state.filter(|s| now < s.reset_at());
        // The limiter as Guava holds it at `now`, before the request (created or `setRate`
        // if needed; not resynced otherwise, as Guava's tryAcquire checks before resyncing).
        let view = match live {
            None => self.set_rate(
                State {
                    stored_permits: 0.0,
                    next_free_ticket: now,
                    max_permits: 0.0,
                    cool_down_interval: self.cool_down,
                },
                now,
            ),
            Some(s)
                if s.max_permits == self.max_permits && s.cool_down_interval == self.cool_down =>
            {
                s
            }
            Some(s) => self.set_rate(s, now),
        };
        let limit = self.limit();
        // What the key looks like if this request changes nothing: its stored state expires
        // when that state (with its own configuration) is replenished.
        let unchanged = |allowed: bool, delay: f64| {
            let mut synced = view;
            synced.resync(now);
            let reset_after = live.map_or(0, |s| s.reset_at().saturating_sub(now));
            Decision::from_micros(
                allowed,
                delay,
                self.remaining(&synced, now),
                reset_after as f64,
                limit,
            )
        };
        // Reserves the cost; `owed` is false for a charge, admitted now whatever it books.
        let reserve = |state: &mut Option<State>, owed: bool| {
            let mut next = view;
            let moment = self.reserve(&mut next, cost as f64, now);
            *state = Some(next);
            let delay = if owed {
                moment.saturating_sub(now).max(0)
            } else {
                0
            };
            Decision::from_micros(
                true,
                delay as f64,
                self.remaining(&next, now),
                next.reset_at().saturating_sub(now) as f64,
                limit,
            )
        };
        // Guava's `canAcquire`, and the retry-after of a rejection by it.
        let earliest = |timeout: i64| view.next_free_ticket.saturating_sub(timeout);
        let try_acquire = |state: &mut Option<State>, timeout: i64| {
            if earliest(timeout) <= now {
                reserve(state, true)
            } else {
                unchanged(false, earliest(timeout).saturating_sub(now) as f64)
            }
        };
        match op {
            Op::Peek if earliest(0) <= now => unchanged(true, 0.0),
            Op::Peek => unchanged(false, earliest(0).saturating_sub(now) as f64),
            Op::Limit => try_acquire(state, 0),
            Op::Pace {
                max_wait: Some(max),
            } => try_acquire(state, i64::try_from(max.as_micros()).unwrap_or(i64::MAX)),
            Op::Pace { max_wait: None } => reserve(state, true),
            // Reserved as an acquire is (the next free ticket moves on: the debt, paid by
            // the next request, as Guava's every request pays for the one before).
            Op::Charge => reserve(state, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_time_is_the_first_microsecond_of_a_full_resync() {
        // Awkward configurations, including ones where ceil alone falls short.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let per_second = 10f64.powf((next() % 1_800) as f64 / 100.0 - 9.0).min(1e9);
            let config = if next() % 2 == 0 {
                Config::bursty(per_second, (next() % 1_000) as f64 / 7.0)
            } else {
                Config::warming_up(
                    per_second,
                    1 + next() % 10_000_000_000,
                    1.0 + (next() % 100) as f64 / 3.0,
                )
            };
            let max = config.max_permits;
            let l = State {
                stored_permits: max * (next() % 1_000) as f64 / 1_000.0,
                next_free_ticket: 1_700_000_000_000_000 + (next() % 1_000) as i64,
                max_permits: max,
                cool_down_interval: config.cool_down,
            };
            let at = l.reset_at();
            let mut full = l;
            full.resync(at);
            assert_eq!(full.stored_permits, max, "{l:?}");
            if at > l.next_free_ticket {
                let mut short = l;
                short.resync(at - 1);
                assert!(short.stored_permits < max, "{l:?}: reset at {at} is late");
            }
        }
    }
}

/// Guava's `RateLimiterTest` harness, shared by the tests of
/// [`smooth_bursty`](super::smooth_bursty) and [`smooth_warming_up`](super::smooth_warming_up).
#[cfg(test)]
pub(super) mod test_harness {
    use std::time::Duration;

    use super::super::test_util::{policy, MS};
    use crate::{Op, Policy};

    /// Where the simulated clock starts: Guava's stopwatch zero.
    pub(crate) const T0: u64 = 1_700_000_000_000_000;

    /// Guava's `R%3.2f` of a wait in microseconds (rounded half up to 10 ms).
    fn r(us: u128) -> String {
        let cs = (us + 5_000) / 10_000;
        format!("R{}.{:02}", cs / 100, cs % 100)
    }

    /// One key driven like Guava's `RateLimiterTest`, with a fake stopwatch: `acquire` and
    /// an admitted `try_acquire` sleep their wait (the clock advances by the delay).
    pub(crate) struct Guava {
        pub(crate) policy: Policy,
        pub(crate) state: Option<crate::State>,
        pub(crate) now: u64,
        events: Vec<String>,
    }

    impl Guava {
        /// `RateLimiter.create(...)` at `T0`: the key's limiter is created by its first
        /// request.
        pub(crate) fn create(spec: &str) -> Guava {
            Guava {
                policy: policy(spec),
                state: None,
                now: T0,
                events: Vec::new(),
            }
        }

        pub(crate) fn acquire(&mut self, permits: u64) -> Duration {
            let d = self
                .policy
                .apply(&mut self.state, self.now, Op::pace(), permits)
                .unwrap();
            assert!(d.allowed);
            self.now += d.delay.as_micros() as u64;
            self.events.push(r(d.delay.as_micros()));
            d.delay
        }

        /// `acquire(1)`, `times` times.
        pub(crate) fn acquire_n(&mut self, times: usize) {
            for _ in 0..times {
                self.acquire(1);
            }
        }

        pub(crate) fn try_acquire(&mut self, permits: u64, timeout: Duration) -> bool {
            let before = self.state.clone();
            let d = self
                .policy
                .apply(&mut self.state, self.now, Op::pace_within(timeout), permits)
                .unwrap();
            if d.allowed {
                self.now += d.delay.as_micros() as u64;
                self.events.push(r(d.delay.as_micros()));
            } else {
                assert_eq!(self.state, before, "a rejected tryAcquire changes nothing");
            }
            d.allowed
        }

        pub(crate) fn sleep_millis(&mut self, ms: u64) {
            self.now += ms * MS;
            self.events
                .push(format!("U{}.{:02}", ms / 1000, ms % 1000 / 10));
        }

        /// `setRate(...)`: the next request applies the new parameters to the same state.
        pub(crate) fn set_policy(&mut self, spec: &str) {
            self.policy = policy(spec);
        }

        pub(crate) fn events(&self) -> String {
            self.events.join(", ")
        }
    }
}

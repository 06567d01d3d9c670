//! `sliding_log`: an exact sliding window over a log of requests (in Redis, a sorted
//! set of their times).
//!
//! Every admitted request is logged with its time and cost. A request of cost `n` at time
//! `t` is blocked if the log already holds more than `limit - n` cost units inside the window
//! ending at `t`, or if it comes sooner than `min_interval` after the newest logged request.
//! `pace` books the earliest time at which the request would not be blocked and logs it at
//! that (future) time. With `count_blocked`, a blocked `limit` request is logged too, so a
//! client that keeps hammering stays blocked until it pauses.
//!
//! Parameters: `limit` (an integer >= 1), `window` (a duration > 0), `min_interval` (a
//! duration >= 0, default 0) and `count_blocked` (`true` or `false`, default `false`).
//!
//! State: the log, as `(time, cost)` entries sorted by time with equal times merged, and
//! `newest`, the latest time ever logged (kept after its entry leaves the window, for
//! `min_interval`). An entry is alive at `t` while `time > t - window`; entries that are not
//! alive at `now` are dropped on every write. All in integer microseconds, for a request of
//! cost `n` at time `t`:
//!
//! ```text
//! count(t)   = sum of the costs of all logged entries with time > t - window
//!              (future-dated entries, i.e. reservations, included)
//! blocked(t) = count(t) + n > limit  or  t < newest + min_interval
//! ```
//!
//! so a reservation blocks every request before it, even with `min_interval = 0`. The earliest
//! time `t >= now` at which the request is not blocked is exact:
//!
//! ```text
//! j       = the smallest index such that sum(cost of entries[j..]) + n <= limit
//! t_count = now if j == 0, else entries[j-1].time + window
//! t       = max(now, newest + min_interval, t_count)
//! ```
//!
//! `limit` admits iff `t == now` and logs `(now, n)`. Rejected, it logs nothing (or, with
//! `count_blocked`, logs `(now, n)` anyway) and its `retry_after` is `t - now`, computed on the
//! log after that logging. `pace` logs `(t, n)` and returns `delay = t - now`; with
//! `max_wait`, a delay above `max_wait` is rejected without side effects and
//! `retry_after = delay - max_wait`. `peek` answers whether `limit` would admit the request
//! and, if not, `t - now` on the log as it is: a peek logs nothing, so even with
//! `count_blocked` its `retry_after` is the exact time a `limit` could get in if nothing else
//! happens (a blocked `limit` reports a later one, having logged itself).
//! After the decision, at `now`:
//!
//! ```text
//! remaining   = 0                              if now < newest + min_interval
//!             = max(0, limit - count(now))     if min_interval == 0
//!             = min(1, max(0, limit - count(now)))  otherwise (the next one must wait)
//! reset_after = newest + max(window, min_interval) - now   (0 without a log)
//! ```
//!
//! Once `reset_after` has passed, every entry has left the window and `min_interval` is over:
//! the state is the same as none. A cost above `limit` can never be admitted (an input error,
//! for every op).
//!
//! Live parameter changes: the log holds timestamps, which mean the same under any
//! parameters, so it is kept as it is: a new `window` or `min_interval` applies to the logged
//! times, a new `limit` to their costs.
//!
//! Memory: one entry per distinct request time, and **at most `limit` entries**, whatever the
//! traffic: when a write leaves the log holding at least `limit` cost units in its newest
//! entries, the older entries are dropped. That changes no decision: while any of them is
//! inside the window, so are the newer ones (the log is sorted), whose costs alone block every
//! request, and the earliest unblocked time depends only on the newest `limit` units. So
//! neither a hammering client under `count_blocked` nor a deep queue of `pace` reservations
//! grows the log past `limit` entries. (A later raise of the key's `limit` sees only the
//! entries kept.) `limit` is at most [`MAX_LIMIT`]: each decision reads the key's whole log
//! (and on Redis decodes and encodes it), so its cost grows with the limit; for larger
//! limits, `sliding_window` (two counters) or `gcra` decide in constant time and space.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "sliding_log:limit=2,window=1s".parse().unwrap();
//! let mut s = None;
//! let delays: Vec<u64> = (0..5)
//!     .map(|_| p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay.as_secs())
//!     .collect();
//! assert_eq!(delays, [0, 0, 1, 1, 2]); // two in any second
//! let rejected = p.apply(&mut s, 500_000, Op::Limit, 1).unwrap();
//! assert!(!rejected.allowed);
//! assert_eq!(rejected.delay.as_millis(), 1_500); // at 2 s, the bookings at 1 s have expired
//! ```

use std::time::Duration;

use super::fixed_window::{checked_duration, checked_limit};
use super::util::retry_after_max_wait;
use super::{Algorithm, MAX_CHARGED};
use crate::decision::duration_to_micros;
use crate::spec::{
    format_duration, parse_bool, parse_count, parse_duration, parse_duration_opt_zero, Params,
};
use crate::{Decision, InputError, Op};

/// The `sliding_log` policy: `limit` cost units in any `window`, at least `min_interval`
/// apart, optionally counting blocked requests.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingLog {
    limit: u64,
    window_us: u64,
    min_interval_us: u64,
    count_blocked: bool,
}

/// `sliding_log` state; times are microseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// `(time, cost)` of the logged requests, sorted by time, one entry per distinct time,
    /// costs non-zero. Times after `now` are reservations made by `pace`.
    pub entries: Vec<(u64, u64)>,
    /// The latest time ever logged, kept after its entry has left the window.
    pub newest: u64,
}

/// The largest `limit` a `sliding_log` takes: its log holds at most `limit` entries, each
/// read by every decision on the key.
pub const MAX_LIMIT: u64 = 10_000;

impl SlidingLog {
    /// At most `limit` (1 to [`MAX_LIMIT`]) cost units in any `window` (greater than zero), requests
    /// at least `min_interval` (zero allowed) apart; with `count_blocked`, blocked `limit`
    /// requests are logged too. Durations are whole microseconds, at most 3650 days.
    pub fn new(
        limit: u64,
        window: Duration,
        min_interval: Duration,
        count_blocked: bool,
    ) -> Result<SlidingLog, InputError> {
        let limit = checked_limit(limit)?;
        if limit > MAX_LIMIT {
            return Err(InputError::new(
                "limit",
                format!(
                    "{limit} is too large for sliding_log, which keeps one entry per request: \
                     use at most {MAX_LIMIT}, or sliding_window (two counters) or gcra for \
                     larger limits"
                ),
            ));
        }
        Ok(SlidingLog {
            limit,
            window_us: checked_duration("window", window, false)?,
            min_interval_us: checked_duration("min_interval", min_interval, true)?,
            count_blocked,
        })
    }

    /// The most cost units any window admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// The shortest time between two logged requests.
    pub fn min_interval(&self) -> Duration {
        Duration::from_micros(self.min_interval_us)
    }

    /// Whether blocked `limit` requests are logged too.
    pub fn count_blocked(&self) -> bool {
        self.count_blocked
    }

    /// The earliest time `t >= now` at which a request of `cost` is not blocked by `log`
    /// (whose entries are all alive at `now`).
    fn earliest(&self, log: &Log, now: u64, cost: u64) -> u64 {
        let mut t_count = now;
        let mut rest: u64 = log
            .entries
            .iter()
            .fold(0, |sum, &(_, c)| sum.saturating_add(c));
        for &(time, c) in &log.entries {
            if rest.saturating_add(cost) <= self.limit {
                break;
            }
            rest = rest.saturating_sub(c);
            t_count = time.saturating_add(self.window_us);
        }
        let t_interval = log
            .newest
            .map_or(now, |n| n.saturating_add(self.min_interval_us));
        now.max(t_interval).max(t_count)
    }

    /// The decision for `log` (alive at `now`).
    fn decision(&self, log: &Log, now: u64, allowed: bool, delay: f64) -> Decision {
        let free = match log.newest {
            Some(n) if now < n.saturating_add(self.min_interval_us) => 0,
            _ => {
                let count = log
                    .entries
                    .iter()
                    .fold(0u64, |sum, &(_, c)| sum.saturating_add(c));
                self.limit.saturating_sub(count)
            }
        };
        let remaining = if self.min_interval_us > 0 {
            free.min(1)
        } else {
            free
        };
        let idle_at = log.newest.map_or(0, |n| {
            n.saturating_add(self.window_us.max(self.min_interval_us))
        });
        Decision::from_micros(
            allowed,
            delay,
            remaining,
            idle_at.saturating_sub(now) as f64,
            self.limit,
        )
    }
}

/// A working copy of the state.
struct Log {
    entries: Vec<(u64, u64)>,
    newest: Option<u64>,
}

impl Log {
    /// The stored state as it stands at `now` under `window_us`: entries that are not alive
    /// dropped, sorted, equal times merged, `newest` at least the latest entry.
    fn at(state: Option<&State>, now: u64, window_us: u64) -> Log {
        let Some(s) = state else {
            return Log {
                entries: Vec::new(),
                newest: None,
            };
        };
        let mut entries: Vec<(u64, u64)> = s
            .entries
            .iter()
            .copied()
            .filter(|&(time, cost)| cost > 0 && time.saturating_add(window_us) > now)
            .collect();
        entries.sort_unstable_by_key(|&(time, _)| time);
        entries.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.saturating_add(later.1);
            }
            same
        });
        let newest = entries.last().map_or(s.newest, |&(t, _)| t.max(s.newest));
        Log {
            entries,
            newest: Some(newest),
        }
    }

    /// Logs `cost` at `time`.
    fn record(&mut self, time: u64, cost: u64) {
        match self.entries.binary_search_by_key(&time, |&(t, _)| t) {
            Ok(at) => {
                if let Some((_, c)) = self.entries.get_mut(at) {
                    *c = c.saturating_add(cost).min(MAX_CHARGED);
                }
            }
            Err(at) => self.entries.insert(at, (time, cost.min(MAX_CHARGED))),
        }
        self.newest = Some(self.newest.map_or(time, |n| n.max(time)));
    }

    /// The state to store: the newest entries holding at least `limit` cost units, and
    /// none older (see the module's notes on memory: dropping them changes no decision).
    fn into_state(mut self, limit: u64) -> Option<State> {
        let mut newest_units: u64 = 0;
        if let Some(first) = (0..self.entries.len()).rev().find(|&k| {
            newest_units = newest_units.saturating_add(self.entries[k].1);
            newest_units >= limit
        }) {
            self.entries.drain(..first);
        }
        self.newest.map(|newest| State {
            entries: self.entries,
            newest,
        })
    }
}

impl Algorithm for SlidingLog {
    type State = State;
    const NAME: &'static str = "sliding_log";
    const PARAMS: &'static [&'static str] = &["limit", "window", "min_interval", "count_blocked"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let limit = parse_count("limit", &params.required("limit")?, 1)?;
        let window_us = parse_duration("window", &params.required("window")?)?;
        let min_interval_us = match params.optional("min_interval") {
            Some(v) => parse_duration_opt_zero("min_interval", &v, true)?,
            None => 0,
        };
        let count_blocked = match params.optional("count_blocked") {
            Some(v) => parse_bool("count_blocked", &v)?,
            None => false,
        };
        SlidingLog::new(
            limit,
            Duration::from_micros(window_us),
            Duration::from_micros(min_interval_us),
            count_blocked,
        )
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("limit", self.limit.to_string()),
            ("window", format_duration(self.window_us)),
            ("min_interval", format_duration(self.min_interval_us)),
            ("count_blocked", self.count_blocked.to_string()),
        ]
    }

    fn max_cost(&self, op: Op) -> Option<u64> {
        (op != Op::Charge).then_some(self.limit)
    }

    fn limit(&self) -> u64 {
        self.limit
    }

    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        self.decide(state, now, op, cost, now)
    }

    /// Blocked at `t` only if blocked at every earlier time (the count only falls as `t`
    /// grows): the earliest unblocked time from `from` is `max(from, earliest)`, logged
    /// there (never before the newest entry).
    fn pace_from(
        &self,
        state: &mut Option<State>,
        now: u64,
        cost: u64,
        from: u64,
    ) -> Option<Decision> {
        Some(self.decide(state, now, Op::pace(), cost, from))
    }
}

impl SlidingLog {
    /// [`Algorithm::apply`], with the slot no earlier than `from` (`>= now`).
    fn decide(
        &self,
        state: &mut Option<State>,
        now: u64,
        op: Op,
        cost: u64,
        from: u64,
    ) -> Decision {
        let log = Log::at(state.as_ref(), now, self.window_us);
        // A charge is logged now, wherever a `pace` would go (and may exceed any slot).
        let t = if op == Op::Charge {
            now
        } else {
            self.earliest(&log, now, cost).max(from)
        };
        let delay = t - now;
        let save = |state: &mut Option<State>, log: Log, allowed: bool, delay: f64| {
            let decision = self.decision(&log, now, allowed, delay);
            *state = log.into_state(self.limit);
            decision
        };
        match op {
            Op::Peek => self.decision(&log, now, delay == 0, delay as f64),
            Op::Limit if delay == 0 => {
                let mut log = log;
                log.record(now, cost);
                save(state, log, true, 0.0)
            }
            Op::Limit if self.count_blocked => {
                // Logged although blocked; the retry-after is for the log with it.
                let mut log = log;
                log.record(now, cost);
                let retry = self.earliest(&log, now, cost) - now;
                save(state, log, false, retry as f64)
            }
            Op::Limit => self.decision(&log, now, false, delay as f64),
            Op::Pace {
                max_wait: Some(max),
            } if delay as f64 > duration_to_micros(max) => self.decision(
                &log,
                now,
                false,
                retry_after_max_wait(delay as f64, duration_to_micros(max)),
            ),
            Op::Pace { .. } => {
                let mut log = log;
                log.record(t, cost);
                save(state, log, true, delay as f64)
            }
            Op::Charge => {
                // Logged now, past the limit if need be: the log blocks until the charge
                // leaves the window.
                let mut log = log;
                log.record(now, cost);
                save(state, log, true, 0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{policy, traffic, MS, SEC};
    use crate::Policy;
    use proptest::prelude::*;

    fn own(s: &Option<crate::State>) -> &State {
        match s {
            Some(crate::State::SlidingLog(own)) => own,
            other => panic!("not a sliding_log state: {other:?}"),
        }
    }

    #[test]
    fn seed_drops_old_entries_and_blocks_over_the_maximum() {
        let p = policy("sliding_log:limit=3,window=10s");
        let mut s = None;
        for (i, t) in [0, SEC, 2 * SEC].into_iter().enumerate() {
            let d = p.apply(&mut s, t, Op::Limit, 1).unwrap();
            assert!(d.is_immediate());
            assert_eq!(d.remaining, 2 - i as u64);
            assert_eq!(d.reset_after, Duration::from_micros(t + 10 * SEC - t));
        }
        let before = s.clone();
        let r = p.apply(&mut s, 5 * SEC, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_secs(5),
            "the entry at 0 s leaves at 10 s"
        );
        assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(7)));
        assert_eq!(s, before, "a rejection changes nothing");
        assert!(!p.apply(&mut s, 10 * SEC - 1, Op::Limit, 1).unwrap().allowed);
        // A cost of 2 needs two entries gone: the one at 1 s leaves at 11 s.
        let two = p.apply(&mut s, 10 * SEC, Op::Limit, 2).unwrap();
        assert_eq!((two.allowed, two.delay), (false, Duration::from_secs(1)));
        let d = p.apply(&mut s, 10 * SEC, Op::Limit, 1).unwrap();
        assert!(d.is_immediate());
        assert_eq!(d.remaining, 0);
        assert_eq!(
            own(&s),
            &State {
                entries: vec![(SEC, 1), (2 * SEC, 1), (10 * SEC, 1)],
                newest: 10 * SEC,
            },
            "the entry at 0 s is dropped"
        );
    }

    #[test]
    fn seed_min_interval_blocks_requests_too_close_to_the_newest() {
        let p = policy("sliding_log:limit=10,window=1m,min_interval=1s");
        let mut s = None;
        let first = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
        assert!(first.is_immediate());
        assert_eq!(
            (first.remaining, first.reset_after),
            (0, Duration::from_secs(60))
        );
        let r = p.apply(&mut s, 400 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(600));
        assert!(p.apply(&mut s, SEC, Op::Limit, 1).unwrap().is_immediate());
        // Past the interval one request may go at once; the one after it must wait.
        let peek = p.apply(&mut s, 2 * SEC, Op::Peek, 1).unwrap();
        assert_eq!((peek.allowed, peek.remaining), (true, 1));
    }

    #[test]
    fn count_blocked_keeps_a_hammering_client_blocked() {
        let plain = policy("sliding_log:limit=2,window=10s");
        let counting = policy("sliding_log:limit=2,window=10s,count_blocked=true");
        let (mut a, mut b) = (None, None);
        for t in [0, SEC] {
            assert!(plain.apply(&mut a, t, Op::Limit, 1).unwrap().allowed);
            assert!(counting.apply(&mut b, t, Op::Limit, 1).unwrap().allowed);
        }
        // Without count_blocked, the retry-after is exact: the client gets in at 10 s.
        let r = plain.apply(&mut a, 2 * SEC, Op::Limit, 1).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_secs(8)));
        for t in 3..10 {
            assert!(!plain.apply(&mut a, t * SEC, Op::Limit, 1).unwrap().allowed);
        }
        assert!(plain
            .apply(&mut a, 10 * SEC, Op::Limit, 1)
            .unwrap()
            .is_immediate());
        // With it, every blocked attempt is logged and pushes the retry-after further.
        let mut last = None;
        for t in 2..=15 {
            let before = b.clone();
            let peek = counting.apply(&mut b, t * SEC, Op::Peek, 1).unwrap();
            assert_eq!(b, before, "peek logs nothing");
            let r = counting.apply(&mut b, t * SEC, Op::Limit, 1).unwrap();
            assert!(!r.allowed && !peek.allowed, "blocked at {t} s");
            assert_ne!(b, before, "the blocked attempt is logged");
            // The peek's retry-after is for the log without the attempt: one second sooner.
            assert_eq!(peek.delay + Duration::from_secs(1), r.delay);
            let mut unlogged = before.clone();
            let retry = t * SEC + peek.delay.as_micros() as u64;
            assert!(
                counting
                    .apply(&mut unlogged, retry, Op::Limit, 1)
                    .unwrap()
                    .allowed
            );
            assert_eq!(r.reset_after, Duration::from_secs(10));
            last = Some(r);
        }
        // At 15 s the log holds 6 s ... 15 s: once the one at 14 s leaves, one more fits.
        let last = last.unwrap();
        assert_eq!(last.delay, Duration::from_secs(9));
        // The log keeps only its newest entries holding `limit` units: 14 s and 15 s (the
        // older ones could not change a decision).
        assert_eq!(own(&b).entries, [(14 * SEC, 1), (15 * SEC, 1)]);
        assert!(
            !counting
                .apply(&mut b.clone(), 24 * SEC - 1, Op::Peek, 1)
                .unwrap()
                .allowed
        );
        assert!(counting
            .apply(&mut b, 24 * SEC, Op::Limit, 1)
            .unwrap()
            .is_immediate());
    }

    #[test]
    fn the_log_never_holds_more_than_limit_entries() {
        // A client hammering at a distinct microsecond each time, and a deep queue of
        // reservations: neither grows the log past `limit` entries.
        let counting = policy("sliding_log:limit=5,window=1h,count_blocked=true");
        let mut s = None;
        for t in 0..20_000 {
            counting.apply(&mut s, t, Op::Limit, 1).unwrap();
            assert!(own(&s).entries.len() <= 5, "at {t} µs");
        }
        let pacer = policy("sliding_log:limit=5,window=1s");
        let mut q = None;
        for _ in 0..20_000 {
            pacer.apply(&mut q, 0, Op::pace(), 1).unwrap();
            assert!(own(&q).entries.len() <= 5);
        }
        // The 20,001st reservation still goes where the whole queue puts it.
        let d = pacer.apply(&mut q, 0, Op::pace(), 1).unwrap();
        assert_eq!(d.delay, Duration::from_secs(4_000));
    }

    #[test]
    fn the_limit_is_bounded() {
        let ok = "sliding_log:limit=10000,window=1h".parse::<Policy>();
        assert!(ok.is_ok());
        let e = "sliding_log:limit=10001,window=1h"
            .parse::<Policy>()
            .unwrap_err();
        assert_eq!(e.field(), "limit");
        assert!(e.message().contains("10000") && e.message().contains("sliding_window"));
        let e = SlidingLog::new(
            1_000_000_000,
            Duration::from_secs(3600),
            Duration::ZERO,
            false,
        )
        .unwrap_err();
        assert_eq!(e.field(), "limit");
    }

    #[test]
    fn pace_reserves_the_earliest_unblocked_time() {
        let p = policy("sliding_log:limit=2,window=1s");
        let mut s = None;
        let delays: Vec<Duration> = (0..5)
            .map(|_| p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay)
            .collect();
        let secs = Duration::from_secs;
        assert_eq!(delays, [secs(0), secs(0), secs(1), secs(1), secs(2)]);
        // Booked: 2 at 0 s, 2 at 1 s, 1 at 2 s; kept: the newest entries holding `limit`.
        assert_eq!(own(&s).entries, [(SEC, 2), (2 * SEC, 1)]);
        // A reservation blocks everything before it: nothing is admitted now ...
        let d = p.apply(&mut s, 0, Op::Peek, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (false, 0));
        assert_eq!(
            d.delay,
            Duration::from_secs(2),
            "when the two at 1 s leave the window"
        );
        assert_eq!(d.reset_after, Duration::from_secs(3));
        // ... and min_interval spaces the reservations.
        let spaced = policy("sliding_log:limit=10,window=1s,min_interval=100ms");
        let mut t = None;
        let delays: Vec<u128> = (0..3)
            .map(|_| {
                spaced
                    .apply(&mut t, 0, Op::pace(), 1)
                    .unwrap()
                    .delay
                    .as_millis()
            })
            .collect();
        assert_eq!(delays, [0, 100, 200]);
        let big = spaced.apply(&mut t, 0, Op::pace(), 8).unwrap();
        assert_eq!(
            big.delay,
            Duration::from_millis(1_000),
            "3 + 8 > 10 until 0 s leaves"
        );
    }

    #[test]
    fn pace_with_max_wait_rejects_without_side_effects() {
        let p = policy("sliding_log:limit=1,window=1s");
        let mut s = None;
        p.apply(&mut s, 0, Op::pace(), 1).unwrap();
        p.apply(&mut s, 0, Op::pace(), 1).unwrap(); // at 1 s
        let before = s.clone();
        let within = Op::pace_within(Duration::from_millis(1_500));
        let r = p.apply(&mut s, 200 * MS, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(300), "1.8 s - 1.5 s");
        assert_eq!(
            (r.remaining, r.reset_after),
            (0, Duration::from_millis(1_800))
        );
        assert_eq!(s, before);
        let ok = p.apply(&mut s, 500 * MS, within, 1).unwrap();
        assert_eq!((ok.allowed, ok.delay), (true, Duration::from_millis(1_500)));
    }

    #[test]
    fn peek_answers_like_limit_without_changing_anything() {
        let p = policy("sliding_log:limit=3,window=1s");
        let mut s = None;
        let idle = p.apply(&mut s, 0, Op::Peek, 3).unwrap();
        assert!(idle.is_immediate());
        assert_eq!((idle.remaining, idle.reset_after), (3, Duration::ZERO));
        assert_eq!(s, None);
        p.apply(&mut s, 100 * MS, Op::Limit, 2).unwrap();
        let before = s.clone();
        for cost in 1..=3 {
            let peek = p.apply(&mut s, 300 * MS, Op::Peek, cost).unwrap();
            let limit = p.apply(&mut s.clone(), 300 * MS, Op::Limit, cost).unwrap();
            assert_eq!(
                (peek.allowed, peek.delay),
                (limit.allowed, limit.delay),
                "{cost}"
            );
            assert_eq!(
                peek.remaining, 1,
                "remaining describes the state, not the hypothesis"
            );
            assert_eq!(peek.reset_after, Duration::from_millis(800));
        }
        assert_eq!(s, before);
    }

    #[test]
    fn reset_after_is_when_the_state_behaves_as_none() {
        for spec in [
            "sliding_log:limit=3,window=1s",
            "sliding_log:limit=3,window=1s,min_interval=300ms",
            "sliding_log:limit=3,window=1s,min_interval=2s,count_blocked=true",
        ] {
            let p = policy(spec);
            let mut s = None;
            p.apply(&mut s, 0, Op::Limit, 2).unwrap();
            p.apply(&mut s, 100 * MS, Op::Limit, 1).unwrap();
            let d = p.apply(&mut s, 200 * MS, Op::pace(), 3).unwrap();
            let at = 200 * MS + d.reset_after.as_micros() as u64;
            for op in [Op::Limit, Op::Peek, Op::pace()] {
                for cost in [1, 3] {
                    assert_eq!(
                        p.apply(&mut s.clone(), at, op, cost).unwrap(),
                        p.apply(&mut None, at, op, cost).unwrap(),
                        "{spec} {op:?} {cost}"
                    );
                }
            }
            let sooner = p.apply(&mut s.clone(), at - 1, Op::Peek, 3).unwrap();
            assert!(!sooner.allowed, "{spec}: not idle a microsecond sooner");
        }
    }

    #[test]
    fn live_parameter_change_keeps_the_log() {
        let p = policy("sliding_log:limit=5,window=10s");
        let mut s = None;
        p.apply(&mut s, 0, Op::Limit, 3).unwrap();
        p.apply(&mut s, 4 * SEC, Op::Limit, 2).unwrap();
        assert!(
            !p.apply(&mut s.clone(), 5 * SEC, Op::Peek, 1)
                .unwrap()
                .allowed
        );
        // A shorter window lets the entry at 0 s go: 2 of 5 are used.
        let short = policy("sliding_log:limit=5,window=2s");
        let d = short.apply(&mut s.clone(), 5 * SEC, Op::Peek, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 3));
        assert_eq!(d.reset_after, Duration::from_secs(1));
        // A lower limit counts the same costs.
        let low = policy("sliding_log:limit=2,window=2s");
        assert!(
            !low.apply(&mut s.clone(), 5 * SEC, Op::Peek, 1)
                .unwrap()
                .allowed
        );
        // A min_interval applies to the newest logged time.
        let spaced = policy("sliding_log:limit=5,window=2s,min_interval=3s");
        let d = spaced.apply(&mut s, 5 * SEC, Op::Limit, 1).unwrap();
        assert_eq!((d.allowed, d.delay), (false, Duration::from_secs(2)));
    }

    #[test]
    fn every_cost_up_to_the_limit_and_no_further() {
        let p = policy("sliding_log:limit=3,window=1s");
        for op in [Op::Limit, Op::Peek, Op::pace()] {
            assert!(p.apply(&mut None, 0, op, 3).is_ok());
            assert_eq!(p.apply(&mut None, 0, op, 4).unwrap_err().field(), "cost");
        }
        assert_eq!(p.max_cost(Op::Limit), Some(3));
        assert_eq!(p.limit(), 3);
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("sliding_log:window=10s", "limit"),
            ("sliding_log:limit=10", "window"),
            ("sliding_log:limit=0,window=10s", "limit"),
            ("sliding_log:limit=-2,window=10s", "limit"),
            ("sliding_log:limit=NaN,window=10s", "limit"),
            ("sliding_log:limit=10,window=0s", "window"),
            ("sliding_log:limit=10,window=-1s", "window"),
            ("sliding_log:limit=10,window=NaN", "window"),
            ("sliding_log:limit=10,window=10", "window"),
            (
                "sliding_log:limit=10,window=1s,min_interval=-1s",
                "min_interval",
            ),
            (
                "sliding_log:limit=10,window=1s,min_interval=NaN",
                "min_interval",
            ),
            (
                "sliding_log:limit=10,window=1s,min_interval=5",
                "min_interval",
            ),
            (
                "sliding_log:limit=10,window=1s,count_blocked=yes",
                "count_blocked",
            ),
            ("sliding_log:limit=10,window=1s,burst=2", "burst"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        let defaults = policy("sliding_log:limit=10,window=1s,min_interval=0");
        assert_eq!(
            defaults.to_string(),
            "sliding_log:limit=10,window=1s,min_interval=0s,count_blocked=false"
        );
        assert_eq!(defaults.to_string().parse::<Policy>().unwrap(), defaults);
        let secs = Duration::from_secs;
        assert_eq!(
            SlidingLog::new(0, secs(1), secs(0), false)
                .unwrap_err()
                .field(),
            "limit"
        );
        assert_eq!(
            SlidingLog::new(1, secs(0), secs(0), false)
                .unwrap_err()
                .field(),
            "window"
        );
        let odd = Duration::from_nanos(10);
        assert_eq!(
            SlidingLog::new(1, secs(1), odd, false).unwrap_err().field(),
            "min_interval"
        );
        let built = SlidingLog::new(5, secs(60), Duration::from_millis(100), true).unwrap();
        assert_eq!(
            (
                built.limit(),
                built.window(),
                built.min_interval(),
                built.count_blocked()
            ),
            (5, secs(60), Duration::from_millis(100), true)
        );
        assert_eq!(
            Policy::SlidingLog(built),
            policy("sliding_log:limit=5,window=1m,min_interval=100ms,count_blocked=true")
        );
    }

    proptest! {
        #[test]
        fn random_traffic_keeps_the_contract(
            t in traffic(),
            min_interval_us in prop_oneof![Just(0u64), 0u64..=2_000_000],
            count_blocked in any::<bool>(),
        ) {
            let min_interval = Duration::from_micros(min_interval_us);
            let p = Policy::SlidingLog(
                SlidingLog::new(t.limit, t.window(), min_interval, count_blocked).unwrap(),
            );
            let (limit, window_us) = (t.limit, t.window_us);
            let within_limit = |admitted: &[(u64, u64)], at: u64| {
                // Admitted times never go back, so the window ending at `at` holds
                // the admitted requests after `at - window`.
                let in_window: u64 = admitted
                    .iter()
                    .filter(|&&(time, _)| time + window_us > at)
                    .map(|&(_, c)| c)
                    .sum();
                prop_assert!(in_window <= limit, "window ending at {} over the limit", at);
                if let [.., (previous, _), _] = admitted[..] {
                    prop_assert!(at >= previous + min_interval_us);
                }
                Ok(())
            };
            t.keeps_the_contract(&p, within_limit, |op| count_blocked && op == Op::Limit)?;
        }
    }
}

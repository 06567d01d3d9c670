//! `sliding_window`: an approximate sliding window from two counters.
//!
//! Time is cut into aligned windows of length `W`, as in [`fixed_window`](super::fixed_window),
//! each with a count. The load of the sliding window ending at `t` is estimated from the
//! count of `t`'s window and the previous one, assuming the previous window's requests were
//! spread evenly over it: the part of it still inside the sliding window counts in proportion.
//! This smooths the bursts at window edges that a fixed window allows (up to `2 * limit` around
//! a boundary) with two counters instead of a log.
//!
//! Parameters: `limit` (an integer >= 1) and `window` (a duration > 0).
//!
//! State: the window length the counts were written with, and the counts of the previous
//! window and every later one that holds cost (sorted by index, counts non-zero; `pace` may
//! book future windows; older windows are dropped on every write). With `count(i)` the count
//! of window `i` (0 if absent), for a time `t` (integer microseconds):
//!
//! ```text
//! j           = floor(t / W),   elapsed = t - j*W            (integers)
//! share(t)    = count(j-1) * (W - elapsed) / W               (floating point, in this order)
//! estimate(t) = share(t) + count(j)
//! admits(t)   = count(j) + n <= limit  and  share(t) <= limit - n - count(j)
//! ```
//!
//! `admits(t)` is `estimate(t) + n <= limit` for a request of cost `n`, evaluated so that the
//! only rounding is in `share`: the counts stay integers and `share` is compared with the
//! integer room left (adding `share` to counts of 2^40 in floating point would round).
//!
//! `limit` admits iff `admits(now)` and then adds `n` to `count(floor(now / W))`. Rejected,
//! and for `pace`, the slot is the smallest integer `t >= now` with `admits(t)`, found by
//! scanning the windows `j = floor(now / W), j+1, ...`:
//!
//! * if `count(j) + n > limit`, window `j` has no slot;
//! * else if `count(j-1) == 0`, the slot is `max(now, j*W)`;
//! * else the slot is `j*W + e` for the smallest integer `e` in `[max(now, j*W) - j*W, W-1]`
//!   with `admits(j*W + e)`, if `admits(j*W + W-1)` (the share only falls within a window)
//!   and none otherwise. Solving gives `e = ceil(W - (limit - n - count(j)) * W / count(j-1))`;
//!   that guess is checked with the `admits` formula itself and corrected by bisection, so the
//!   slot is the exact first microsecond at which `admits` holds. (`share` is monotone in `e`
//!   even in floating point, as rounding is, so any exact search finds the same `e`.)
//!
//! The scan ends at the latest two windows after the last one holding cost, where both counts
//! are 0. A rejected `limit` has `retry_after = slot - now`; `pace` adds `n` to the count of
//! the slot's window and returns `delay = slot - now`; with `max_wait`, a delay above
//! `max_wait` is rejected without side effects and `retry_after = delay - max_wait`. A `pace`
//! books at most [`MAX_BOOKED_WINDOWS`] windows ahead, as `fixed_window`'s does: with
//! `H = MAX_BOOKED_WINDOWS` (10,000) and `s = floor(slot / W)`, a `pace` with
//! `s - floor(now / W) >= H` is rejected without side effects, like a delay above
//! `max_wait`, with
//!
//! ```text
//! retry_after = (s - H + 1)*W - now     (when window s - H + 1 opens and s is within the horizon)
//! ```
//!
//! (the larger of the two retries if both reject). `peek` answers what `limit` would. After
//! the decision:
//!
//! ```text
//! remaining   = max(0, limit - count(j) - ceil(share(now)))   (= floor(limit - estimate(now)))
//! reset_after = (last + 2) * W - now, last being the highest window index stored (0 if none is)
//! ```
//!
//! From `(last + 2) * W` on, the last window holding cost is neither the current nor the
//! previous one: the state is the same as none. A cost above `limit` can never be admitted
//! (an input error, for every op).
//!
//! Live parameter changes: a new `limit` keeps the counts. A new `window` re-buckets as
//! `fixed_window` does: each stored window's count moves into the new window containing that
//! old window's start time (counts landing in the same new window add up; those landing before
//! the new previous window are dropped).
//!
//! Memory: at most two `(index, count)` pairs for a key used only with `limit`, and about
//! `backlog / limit` more for a `pace` backlog, at most [`MAX_BOOKED_WINDOWS`] + 1 in all
//! while `window` stays the same (`limit` writes only the current window, `peek` nothing). A
//! live change of `window` never adds pairs (re-bucketing merges or drops them), but after a
//! shortening the pairs it moved may lie past the new horizon, and new bookings add to them.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "sliding_window:limit=100,window=1m".parse().unwrap();
//! let mut s = None;
//! assert!(p.apply(&mut s, 30_000_000, Op::Limit, 84).unwrap().allowed); // 84 in [0, 60 s)
//! // At 75 s, 15 s into the next window, 45/60 of the previous window still counts:
//! // 84 * 0.75 = 63, so 37 more fit.
//! let d = p.apply(&mut s, 75_000_000, Op::Limit, 36).unwrap();
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 1); // 100 - (63 + 36)
//! assert!(p.apply(&mut s, 75_000_000, Op::Limit, 1).unwrap().allowed);
//! assert!(!p.apply(&mut s, 75_000_000, Op::Limit, 1).unwrap().allowed);
//! ```

use std::time::Duration;

pub use super::fixed_window::MAX_BOOKED_WINDOWS;
use super::fixed_window::{checked_duration, checked_limit, count_at, rebucket, settle};
use super::Algorithm;
use crate::spec::{format_duration, parse_count, parse_duration, Params};
use crate::{Decision, InputError, Op};

/// The `sliding_window` policy: about `limit` cost units in any `window`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    limit: u64,
    window_us: u64,
}

/// `sliding_window` state.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// The window length, in microseconds, the counts were written with.
    pub window_us: u64,
    /// `(index, count)` of the previous window and later ones that hold cost, sorted by index
    /// with non-zero counts. Window `i` spans `[i * window_us, (i + 1) * window_us)`.
    pub windows: Vec<(u64, u64)>,
}

/// `prev * left / w`, in this order: the share of the previous window's count with `left`
/// microseconds of it still inside the sliding window.
fn share(prev: u64, left: u64, w: u64) -> f64 {
    prev as f64 * left as f64 / w as f64
}

/// Whether `share <= limit - cost - cur`, with the room computed in integers.
fn fits(share: f64, cur: u64, cost: u64, limit: u64) -> bool {
    match limit.checked_sub(cur).and_then(|r| r.checked_sub(cost)) {
        Some(room) => share <= room as f64,
        None => false,
    }
}

/// The smallest `e` in `[lo, hi]` with `ok(e)`, for `ok` false then true on `[lo, hi]` and
/// `ok(hi)` true. `guess` (usually exact or off by one) is probed first, with its neighbour.
fn first_true(mut lo: u64, mut hi: u64, guess: f64, ok: impl Fn(u64) -> bool) -> u64 {
    let g = if guess.is_nan() || guess <= lo as f64 {
        lo
    } else if guess >= hi as f64 {
        hi
    } else {
        guess as u64
    };
    if ok(g) {
        hi = g;
        if g > lo {
            if !ok(g - 1) {
                return g;
            }
            hi = g - 1;
        }
    } else {
        // `ok(hi)` holds, so `g < hi`.
        lo = g + 1;
        if ok(lo) {
            return lo;
        }
        lo += 1;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

impl SlidingWindow {
    /// About `limit` (1 to 2^40) cost units in any `window` (greater than zero, whole
    /// microseconds, at most 3650 days).
    pub fn new(limit: u64, window: Duration) -> Result<SlidingWindow, InputError> {
        Ok(SlidingWindow {
            limit: checked_limit(limit)?,
            window_us: checked_duration("window", window, false)?,
        })
    }

    /// The most cost units the estimate admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// `(count(j-1), count(j), W - elapsed)` for `t` over `windows`.
    fn parts(&self, windows: &[(u64, u64)], t: u64) -> (u64, u64, u64) {
        let w = self.window_us;
        let j = t / w;
        let elapsed = t - j * w;
        let prev = j.checked_sub(1).map_or(0, |p| count_at(windows, p));
        (prev, count_at(windows, j), w - elapsed)
    }

    /// `admits(t)` for a request of `cost`.
    fn admits(&self, windows: &[(u64, u64)], t: u64, cost: u64) -> bool {
        let (prev, cur, left) = self.parts(windows, t);
        fits(share(prev, left, self.window_us), cur, cost, self.limit)
    }

    /// The smallest `t >= now` with `admits(t)`.
    fn slot(&self, windows: &[(u64, u64)], now: u64, cost: u64) -> u64 {
        let w = self.window_us;
        let limit = self.limit;
        // Validated by the caller; the guard keeps the scan finite whatever the input.
        let cost = cost.min(limit);
        let mut j = now / w;
        loop {
            let start = j.saturating_mul(w);
            let first = now.max(start) - start;
            let cur = count_at(windows, j);
            let prev = j.checked_sub(1).map_or(0, |p| count_at(windows, p));
            if cur.saturating_add(cost) <= limit {
                if prev == 0 {
                    return start + first;
                }
                let ok = |e: u64| fits(share(prev, w - e, w), cur, cost, limit);
                if ok(w - 1) {
                    let room = (limit - cost - cur) as f64;
                    let guess = (w as f64 - room * w as f64 / prev as f64).ceil();
                    return start + first_true(first, w - 1, guess, ok);
                }
            }
            if j == u64::MAX {
                return u64::MAX;
            }
            j += 1;
        }
    }

    /// The decision for `windows` at `now`.
    fn decision(&self, windows: &[(u64, u64)], now: u64, allowed: bool, delay: f64) -> Decision {
        let w = self.window_us;
        let (prev, cur, left) = self.parts(windows, now);
        // `share.ceil()` is an exact integer (`as` saturates).
        let remaining = self
            .limit
            .saturating_sub(cur)
            .saturating_sub(share(prev, left, w).ceil() as u64);
        let reset_after = windows.last().map_or(0, |&(last, _)| {
            last.saturating_add(2).saturating_mul(w).saturating_sub(now)
        });
        Decision::from_micros(allowed, delay, remaining, reset_after as f64, self.limit)
    }
}

impl Algorithm for SlidingWindow {
    type State = State;
    const NAME: &'static str = "sliding_window";
    const PARAMS: &'static [&'static str] = &["limit", "window"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let limit = parse_count("limit", &params.required("limit")?, 1)?;
        let window_us = parse_duration("window", &params.required("window")?)?;
        SlidingWindow::new(limit, Duration::from_micros(window_us))
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("limit", self.limit.to_string()),
            ("window", format_duration(self.window_us)),
        ]
    }

    fn max_cost(&self, op: Op) -> Option<u64> {
        (op != Op::Charge).then_some(self.limit)
    }

    fn limit(&self) -> u64 {
        self.limit
    }

    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        let w = self.window_us;
        // The stored counts under this policy's window, from the previous window onwards.
        let windows = state.as_ref().map_or_else(Vec::new, |s| {
            rebucket(s.window_us, &s.windows, w, (now / w).saturating_sub(1))
        });
        let now_fits = self.admits(&windows, now, cost);
        // A charge counts now, wherever a `pace` would go (and may exceed any slot).
        let slot = if now_fits || op == Op::Charge {
            now
        } else {
            self.slot(&windows, now, cost)
        };
        let delay = (slot - now) as f64;
        let (decision, admitted) = settle(
            windows,
            op,
            cost,
            now_fits,
            delay,
            slot / w,
            now,
            w,
            |windows, allowed, delay| self.decision(windows, now, allowed, delay),
        );
        if let Some(windows) = admitted {
            *state = Some(State {
                window_us: w,
                windows,
            });
        }
        decision
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
            Some(crate::State::SlidingWindow(own)) => own,
            other => panic!("not a sliding_window state: {other:?}"),
        }
    }

    fn with(window_us: u64, windows: &[(u64, u64)]) -> Option<crate::State> {
        Some(crate::State::SlidingWindow(State {
            window_us,
            windows: windows.to_vec(),
        }))
    }

    #[test]
    fn classic_example_84_previous_36_current() {
        // 100 per minute; 84 in the previous window, 36 in the current one, 15 s into it:
        // 84 * 45/60 + 36 = 99.
        let p = policy("sliding_window:limit=100,window=1m");
        let mut s = with(60 * SEC, &[(0, 84), (1, 36)]);
        let now = 75 * SEC;
        let peek = p.apply(&mut s, now, Op::Peek, 1).unwrap();
        assert!(peek.is_immediate());
        assert_eq!(peek.remaining, 1);
        assert_eq!(peek.reset_after, Duration::from_secs(105), "until 3 min");
        assert!(!p.apply(&mut s, now, Op::Peek, 2).unwrap().allowed);
        let d = p.apply(&mut s, now, Op::Limit, 1).unwrap();
        assert!(d.is_immediate());
        assert_eq!(d.remaining, 0);
        let before = s.clone();
        let r = p.apply(&mut s, now, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(s, before, "a rejection changes nothing");
        // 84 * (60 s - e) / 60 s + 37 + 1 <= 100  <=>  e >= 15.7142857... s
        assert_eq!(r.delay, Duration::from_micros(15_714_286 - 15_000_000));
        assert_eq!(r.remaining, 0);
        assert!(
            !p.apply(&mut s.clone(), 75_714_285, Op::Limit, 1)
                .unwrap()
                .allowed
        );
        assert!(p
            .apply(&mut s, 75_714_286, Op::Limit, 1)
            .unwrap()
            .is_immediate());
    }

    #[test]
    fn the_previous_window_fades_out_linearly() {
        let p = policy("sliding_window:limit=10,window=10s");
        let mut s = None;
        assert_eq!(
            p.apply(&mut s, 5 * SEC, Op::Limit, 10).unwrap().remaining,
            0
        );
        for (t, remaining) in [(10, 0), (11, 1), (15, 5), (19, 9), (20, 10)] {
            let d = p.apply(&mut s, t * SEC, Op::Peek, 1).unwrap();
            assert_eq!(d.remaining, remaining, "at {t} s");
        }
        let r = p.apply(&mut s, 10 * SEC, Op::Limit, 4).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_secs(4)));
        assert!(p
            .apply(&mut s, 14 * SEC, Op::Limit, 4)
            .unwrap()
            .is_immediate());
        assert_eq!(own(&s).windows, [(0, 10), (1, 4)]);
    }

    #[test]
    fn pace_reserves_the_earliest_admitted_microsecond() {
        let p = policy("sliding_window:limit=10,window=10s");
        let mut s = None;
        let delays: Vec<u64> = (0..21)
            .map(|_| p.apply(&mut s, 0, Op::pace(), 1).unwrap().delay.as_micros() as u64)
            .collect();
        // Ten at once; then one per second as window 0 fades (a tenth would need all of
        // window 1); then window 2, where the 9 of window 1 fade: 9 * (10 s - e) / 10 s + 1 + 1
        // <= 10 from e = 1.1111112 s on (at 1.1111111 s the estimate is 8.0000001 + 1).
        let mut expected = vec![0; 10];
        expected.extend((11..=20).map(|t| t * SEC));
        expected.push(21_111_112);
        assert_eq!(delays, expected);
        assert_eq!(own(&s).windows, [(0, 10), (1, 9), (2, 2)]);
        let d = p.apply(&mut s, 0, Op::Peek, 1).unwrap();
        assert_eq!((d.remaining, d.reset_after), (0, Duration::from_secs(40)));
    }

    #[test]
    fn pace_with_max_wait_rejects_without_side_effects() {
        let p = policy("sliding_window:limit=2,window=1s");
        let mut s = None;
        p.apply(&mut s, 0, Op::pace(), 2).unwrap();
        let before = s.clone();
        // 2 * (1 s - e) / 1 s + 1 <= 2  <=>  e >= 500 ms, in the next window: 1.5 s.
        let within = Op::pace_within(Duration::from_secs(1));
        let r = p.apply(&mut s, 0, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(500));
        assert_eq!((r.remaining, r.reset_after), (0, Duration::from_secs(2)));
        assert_eq!(s, before);
        let ok = p.apply(&mut s, 500 * MS, within, 1).unwrap();
        assert_eq!((ok.allowed, ok.delay), (true, Duration::from_secs(1)));
        assert_eq!(own(&s).windows, [(0, 2), (1, 1)]);
    }

    #[test]
    fn pace_books_at_most_max_booked_windows_ahead() {
        let h = MAX_BOOKED_WINDOWS;
        // One per window, every other window (the previous one full shuts the next one):
        // from window 1, the windows 1, 3, ..., h - 1, the last bookable one.
        let p = policy("sliding_window:limit=1,window=1s");
        let mut s = None;
        let now = 1_300 * MS;
        for k in 0..h / 2 {
            let d = p.apply(&mut s, now, Op::pace(), 1).unwrap();
            assert!(d.allowed, "pace {k}");
            let slot = if k == 0 { now } else { (2 * k + 1) * SEC };
            assert_eq!(d.delay, Duration::from_micros(slot - now));
        }
        assert_eq!(own(&s).windows.len() as u64, h / 2);
        assert_eq!(own(&s).windows.last(), Some(&(h - 1, 1)));
        // Window h + 1 is refused, with no state change: retry when window 2 opens.
        let before = s.clone();
        let r = p.apply(&mut s, now, Op::pace(), 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_millis(700),
            "(h + 1 - h + 1) * 1 s - 1.3 s"
        );
        assert_eq!(r.reset_after, Duration::from_micros((h + 1) * SEC - now));
        assert_eq!(s, before);
        let within = Op::pace_within(Duration::from_secs(10));
        let r = p.apply(&mut s, now, within, 1).unwrap();
        assert_eq!(
            r.delay,
            Duration::from_micros((h + 1) * SEC - now - 10 * SEC)
        );
        let r = p.apply(&mut s, 2 * SEC - 1, Op::pace(), 1).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_micros(1)));
        assert_eq!(s, before);
        // `limit` still answers with the slot, storing nothing.
        let l = p.apply(&mut s, now, Op::Limit, 1).unwrap();
        assert_eq!(
            (l.allowed, l.delay),
            (false, Duration::from_micros((h + 1) * SEC - now))
        );
        assert_eq!(s, before);
        // When window 2 opens, window h + 1 is within the horizon.
        let d = p.apply(&mut s, 2 * SEC, Op::pace(), 1).unwrap();
        assert_eq!((d.allowed, d.delay), (true, Duration::from_secs(h - 1)));
        assert_eq!(
            own(&s).windows.first(),
            Some(&(1, 1)),
            "the previous window"
        );
        assert_eq!(own(&s).windows.last(), Some(&(h + 1, 1)));
    }

    #[test]
    fn peek_answers_like_limit_without_changing_anything() {
        let p = policy("sliding_window:limit=3,window=1s");
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
            assert_eq!((peek.allowed, peek.delay), (limit.allowed, limit.delay));
            assert_eq!(
                peek.remaining, 1,
                "remaining describes the state, not the hypothesis"
            );
            assert_eq!(peek.reset_after, Duration::from_millis(1_700));
        }
        assert_eq!(s, before);
    }

    #[test]
    fn remaining_matches_what_limit_admits_in_long_windows() {
        // One day; 1 in the previous window, 10 us before the current one ends: the estimate
        // is 1e-10 above 0, so 2 of 3 fit, not 3.
        let p = policy("sliding_window:limit=3,window=1d");
        let day = 86_400 * SEC;
        let mut s = None;
        p.apply(&mut s, 0, Op::Limit, 1).unwrap();
        let now = 2 * day - 10;
        assert_eq!(p.apply(&mut s, now, Op::Peek, 1).unwrap().remaining, 2);
        assert!(p.apply(&mut s, now, Op::Limit, 1).unwrap().allowed);
        assert!(p.apply(&mut s, now, Op::Limit, 1).unwrap().allowed);
        let r = p.apply(&mut s, now, Op::Limit, 1).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_micros(10)));
    }

    #[test]
    fn reset_after_is_when_the_state_behaves_as_none() {
        let p = policy("sliding_window:limit=4,window=1s");
        let mut s = None;
        p.apply(&mut s, 250 * MS, Op::Limit, 4).unwrap();
        let d = p.apply(&mut s, 250 * MS, Op::pace(), 3).unwrap();
        assert_eq!(
            d.delay,
            Duration::from_millis(1_500),
            "4 * (1 s - e) / 1 s + 3 <= 4 from 1.75 s"
        );
        assert_eq!(d.reset_after, Duration::from_millis(2_750));
        let at = 3 * SEC;
        for op in [Op::Limit, Op::Peek, Op::pace()] {
            for cost in [1, 4] {
                assert_eq!(
                    p.apply(&mut s.clone(), at, op, cost).unwrap(),
                    p.apply(&mut None, at, op, cost).unwrap(),
                    "{op:?} {cost}"
                );
            }
        }
        let sooner = p.apply(&mut s.clone(), at - 1, Op::Peek, 4).unwrap();
        assert!(
            !sooner.allowed,
            "window 1 still counts a microsecond sooner"
        );
    }

    #[test]
    fn live_parameter_changes() {
        let p = policy("sliding_window:limit=10,window=10s");
        let mut s = None;
        p.apply(&mut s, 5 * SEC, Op::Limit, 6).unwrap(); // window 0
        p.apply(&mut s, 12 * SEC, Op::Limit, 4).unwrap(); // 6 * 0.8 + 4 = 8.8
                                                          // A lower limit keeps the counts.
        let low = policy("sliding_window:limit=8,window=10s");
        let d = low.apply(&mut s.clone(), 12 * SEC, Op::Peek, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (false, 0));
        // A 20 s window puts both counts in [0, 20 s): 10 used, nothing left.
        let long = policy("sliding_window:limit=10,window=20s");
        let d = long.apply(&mut s.clone(), 12 * SEC, Op::Peek, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (false, 0));
        assert_eq!(
            d.delay,
            Duration::from_secs(10),
            "window [20 s, 40 s): 10 * 1 + 1 > 10"
        );
        let mut longer = s.clone();
        long.apply(&mut longer, 12 * SEC, Op::pace(), 1).unwrap();
        assert_eq!(own(&longer).window_us, 20 * SEC);
        assert_eq!(own(&longer).windows, [(0, 10), (1, 1)]);
        // A 5 s window: [0, 10 s) lands in [0, 5 s), dropped at 12 s (previous is [5, 10 s));
        // [10 s, 20 s) lands in [10 s, 15 s), the current window.
        let short = policy("sliding_window:limit=10,window=5s");
        let d = short.apply(&mut s, 12 * SEC, Op::Limit, 6).unwrap();
        assert!(d.is_immediate());
        assert_eq!(own(&s).windows, [(2, 10)]);
        assert_eq!(d.reset_after, Duration::from_secs(8));
    }

    #[test]
    fn every_cost_up_to_the_limit_and_no_further() {
        let p = policy("sliding_window:limit=3,window=1s");
        for op in [Op::Limit, Op::Peek, Op::pace()] {
            assert!(p.apply(&mut None, 0, op, 3).is_ok());
            assert_eq!(p.apply(&mut None, 0, op, 4).unwrap_err().field(), "cost");
        }
        assert_eq!(p.max_cost(Op::pace()), Some(3));
        assert_eq!(p.limit(), 3);
    }

    #[test]
    fn the_guess_is_corrected_when_it_is_off() {
        let ok = |e: u64| e >= 1_000;
        for guess in [
            0.0,
            500.0,
            999.0,
            1_000.0,
            1_001.0,
            5_000.0,
            f64::NAN,
            -3.0,
            1e30,
        ] {
            assert_eq!(first_true(0, 9_999, guess, ok), 1_000, "{guess}");
            assert_eq!(first_true(1_200, 9_999, guess, ok), 1_200, "{guess}");
        }
        assert_eq!(first_true(7, 7, 3.0, |_| true), 7);
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("sliding_window:window=10s", "limit"),
            ("sliding_window:limit=10", "window"),
            ("sliding_window:limit=0,window=10s", "limit"),
            ("sliding_window:limit=-1,window=10s", "limit"),
            ("sliding_window:limit=NaN,window=10s", "limit"),
            ("sliding_window:limit=10,window=0s", "window"),
            ("sliding_window:limit=10,window=-5s", "window"),
            ("sliding_window:limit=10,window=NaN", "window"),
            ("sliding_window:limit=10,window=60", "window"),
            (
                "sliding_window:limit=10,window=1m,min_interval=1s",
                "min_interval",
            ),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        let secs = Duration::from_secs;
        assert_eq!(SlidingWindow::new(0, secs(1)).unwrap_err().field(), "limit");
        assert_eq!(
            SlidingWindow::new(1, secs(0)).unwrap_err().field(),
            "window"
        );
        let built = SlidingWindow::new(100, secs(3_600)).unwrap();
        assert_eq!((built.limit(), built.window()), (100, secs(3_600)));
        let p = Policy::SlidingWindow(built);
        assert_eq!(p.to_string(), "sliding_window:limit=100,window=1h");
        assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
    }

    proptest! {
        #[test]
        fn random_traffic_keeps_the_contract(t in traffic()) {
            let p = Policy::SlidingWindow(SlidingWindow::new(t.limit, t.window()).unwrap());
            t.keeps_the_contract_in_fixed_windows(&p)?;
        }
    }

    proptest! {
        #[test]
        fn retry_after_is_exact_for_large_limits_and_windows(
            limit in 1u64..=1 << 40,
            window_us in 1u64..=crate::spec::MAX_DURATION_US,
            start in 0u64..=1 << 52,
            steps in proptest::collection::vec((0u64..1_000, any::<u64>(), 0u8..4), 1..40),
        ) {
            let p = Policy::SlidingWindow(
                SlidingWindow::new(limit, Duration::from_micros(window_us)).unwrap(),
            );
            let ops = [
                Op::Limit,
                Op::pace(),
                Op::Peek,
                Op::pace_within(Duration::from_micros(window_us / 3)),
            ];
            let mut s = None;
            let mut now = start;
            for (dt, cost, which) in steps {
                now += dt * (window_us / 500);
                if now > crate::policy::MAX_NOW_US {
                    // The engine's last supported time.
                    break;
                }
                let cost = 1 + cost % limit;
                let op = ops[usize::from(which)];
                let d = p.apply(&mut s, now, op, cost).unwrap();
                if !d.allowed {
                    // Durations hold nanoseconds rounded through f64: round back to whole
                    // microseconds (delays beyond 2^53 ns, about 104 days, are not exact).
                    let retry = now + crate::round_to_micros(d.delay);
                    if retry > crate::policy::MAX_NOW_US {
                        continue;
                    }
                    prop_assert!(p.apply(&mut s.clone(), retry, op, cost).unwrap().allowed);
                    prop_assert!(!p.apply(&mut s.clone(), retry - 1, op, cost).unwrap().allowed);
                }
                if d.remaining > 0 {
                    let all = p.apply(&mut s.clone(), now, Op::Limit, d.remaining).unwrap();
                    prop_assert!(all.is_immediate());
                }
                if d.remaining < limit {
                    let over = p.apply(&mut s.clone(), now, Op::Limit, d.remaining + 1).unwrap();
                    prop_assert!(!over.allowed);
                }
            }
        }
    }
}

//! `fixed_window`: aligned windows with a count each, the per-group windows of the job queue.
//!
//! Time is cut into aligned windows of length `W`: window `i` spans `[i*W, (i+1)*W)`
//! microseconds since the Unix epoch, and `now` falls in window `floor(now / W)`. Each window
//! admits at most `limit` cost units; a `pace` that finds the current window full reserves
//! room in the earliest later window that has it, so a backlog is spread over the windows to
//! come ("10 member role updates per 10 seconds" of the Discord example).
//!
//! Parameters: `limit` (an integer >= 1) and `window` (a duration > 0).
//!
//! State: the window length the counts were written with, and the count of every window from
//! the current one onwards that holds admitted cost or reservations (sorted by index, counts
//! non-zero; older windows are dropped on every write). For a request of cost `n` at `now`,
//! with `count(i)` the count of window `i` (0 if absent), all in integers:
//!
//! ```text
//! current = floor(now / W)
//! slot    = the smallest i >= current with count(i) + n <= limit
//! delay   = max(0, slot*W - now)           (0 when slot == current)
//! past    = slot - current >= H            (H = MAX_BOOKED_WINDOWS, 10,000)
//! horizon_retry = (slot - H + 1)*W - now   (when slot - H + 1, the horizon's new end, opens)
//! ```
//!
//! `limit` admits iff `slot == current` and then adds `n` to `count(current)`; rejected, its
//! `retry_after` is `delay`, the start of the earliest later window with room. `pace` adds `n`
//! to `count(slot)` and returns `delay`; with `max_wait`, a delay above `max_wait` is
//! rejected without side effects and `retry_after = delay - max_wait`. A `pace` books at most
//! [`MAX_BOOKED_WINDOWS`] windows ahead (the current one and the `H - 1` after it): `past`, it
//! is rejected without side effects, like a delay above `max_wait`, with
//! `retry_after = horizon_retry` (the larger of the two retries if both reject). `peek`
//! answers what `limit` would. After the decision:
//!
//! ```text
//! remaining   = max(0, limit - count(current))
//! reset_after = (last + 1) * W - now, last being the highest window index stored (0 if none is)
//! ```
//!
//! For unit costs, the `k`-th request (from 0) paced while the current window is full gets
//! exactly `readyTimestamp = nextWindowStart + floor(k / limit) * W`. A cost above
//! `limit` can never be admitted (an input error, for every op).
//!
//! Live parameter changes: a new `limit` keeps the counts (a lower limit may leave windows
//! over it: they admit nothing more). A new `window` re-buckets: each stored window's count
//! moves into the new window containing that old window's start time (counts that land in the
//! same new window add up; counts that land before the current window are dropped). So
//! lengthening the window keeps everything counted; shortening it keeps a count only in the
//! new window where the old one started.
//!
//! Memory: one `(index, count)` pair per window holding cost: one for a key used only with
//! `limit`, and about `backlog / limit` for a `pace` backlog, at most [`MAX_BOOKED_WINDOWS`]
//! while `window` stays the same (`limit` writes only the current window, `peek` nothing). A
//! live change of `window` never adds pairs (re-bucketing merges or drops them), but after a
//! shortening the pairs it moved may lie past the new horizon, and new bookings add to them.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "fixed_window:limit=2,window=10s".parse().unwrap();
//! let mut s = None;
//! let t = 3_000_000; // 3 s: the window [0 s, 10 s)
//! let delays: Vec<u64> = (0..5)
//!     .map(|_| p.apply(&mut s, t, Op::pace(), 1).unwrap().delay.as_secs())
//!     .collect();
//! assert_eq!(delays, [0, 0, 7, 7, 17]); // two per window, from the window starts
//! let rejected = p.apply(&mut s, t, Op::Limit, 1).unwrap();
//! assert!(!rejected.allowed);
//! assert_eq!(rejected.delay.as_secs(), 17); // windows 1 and 2 are booked already
//! ```

use std::time::Duration;

use super::util::retry_after_max_wait;
use super::{Algorithm, MAX_CHARGED};
use crate::decision::duration_to_micros;
use crate::spec::{
    format_duration, parse_count, parse_duration, Params, MAX_COUNT, MAX_DURATION_US,
};
use crate::{Decision, InputError, Op};

/// How far ahead a `pace` books, in windows: a `pace` whose window lies this many windows
/// after the current one or further is rejected with no state change (as a `pace` whose
/// delay exceeds its `max_wait` is). The state holds one `(index, count)` pair per booked
/// window, each read by every decision on the key, so without a horizon a `pace` backlog
/// (`limit=1,window=1s` paced a million times) would grow one key's state without bound.
/// `sliding_window` books within the same horizon.
pub const MAX_BOOKED_WINDOWS: u64 = 10_000;

/// The `fixed_window` policy: `limit` cost units per aligned `window`.
#[derive(Clone, Debug, PartialEq)]
pub struct FixedWindow {
    limit: u64,
    window_us: u64,
}

/// `fixed_window` state.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// The window length, in microseconds, the counts were written with.
    pub window_us: u64,
    /// `(index, count)` of the windows from the current one onwards that hold cost, sorted by
    /// index with non-zero counts. Window `i` spans `[i * window_us, (i + 1) * window_us)`.
    pub windows: Vec<(u64, u64)>,
}

impl FixedWindow {
    /// At most `limit` (1 to 2^40) cost units per aligned `window` (greater than zero, whole
    /// microseconds, at most 3650 days).
    pub fn new(limit: u64, window: Duration) -> Result<FixedWindow, InputError> {
        Ok(FixedWindow {
            limit: checked_limit(limit)?,
            window_us: checked_duration("window", window, false)?,
        })
    }

    /// The most cost units one window admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// The decision for the windows `windows` (current onwards) at `now`.
    fn decision(&self, windows: &[(u64, u64)], now: u64, allowed: bool, delay: f64) -> Decision {
        let w = self.window_us;
        let remaining = self.limit.saturating_sub(count_at(windows, now / w));
        let reset_after = windows.last().map_or(0, |&(last, _)| {
            last.saturating_mul(w).saturating_add(w).saturating_sub(now)
        });
        Decision::from_micros(allowed, delay, remaining, reset_after as f64, self.limit)
    }
}

/// Checks a `limit` given to a constructor, as [`parse_count`] does for the spec.
pub(super) fn checked_limit(limit: u64) -> Result<u64, InputError> {
    if limit == 0 || limit > MAX_COUNT {
        return Err(InputError::new(
            "limit",
            format!("{limit} is out of range; use an integer from 1 to {MAX_COUNT}"),
        ));
    }
    Ok(limit)
}

/// Checks a duration given to a constructor for `field`, as the spec parser does: whole
/// microseconds, at most 3650 days, and greater than zero unless `allow_zero`.
pub(super) fn checked_duration(
    field: &'static str,
    d: Duration,
    allow_zero: bool,
) -> Result<u64, InputError> {
    if !d.subsec_nanos().is_multiple_of(1_000) {
        return Err(InputError::new(
            field,
            format!("{d:?} is not a whole number of microseconds"),
        ));
    }
    let us = d.as_micros();
    if us > u128::from(MAX_DURATION_US) {
        return Err(InputError::new(
            field,
            format!("{d:?} is longer than the maximum of 3650d"),
        ));
    }
    if us == 0 && !allow_zero {
        return Err(InputError::new(
            field,
            "is zero; durations must be greater than zero",
        ));
    }
    Ok(u64::try_from(us).unwrap_or(MAX_DURATION_US))
}

/// Normalizes stored window counts for windows of `new_w` microseconds: each `(index, count)`
/// of a window of `old_w` moves to the new window holding that window's start
/// (`index * old_w / new_w`); windows below `first` and zero counts are dropped; the result
/// is sorted by index with equal indices added up.
pub(super) fn rebucket(
    old_w: u64,
    windows: &[(u64, u64)],
    new_w: u64,
    first: u64,
) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = windows
        .iter()
        .filter(|&&(_, count)| count > 0)
        .map(|&(index, count)| {
            if old_w == new_w {
                (index, count)
            } else {
                (index.saturating_mul(old_w) / new_w.max(1), count)
            }
        })
        .filter(|&(index, _)| index >= first)
        .collect();
    out.sort_unstable_by_key(|&(index, _)| index);
    out.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(later.1).min(MAX_CHARGED);
        }
        same
    });
    out
}

/// The count of window `index` in sorted `windows` (0 if absent).
pub(super) fn count_at(windows: &[(u64, u64)], index: u64) -> u64 {
    windows
        .binary_search_by_key(&index, |&(i, _)| i)
        .ok()
        .and_then(|at| windows.get(at))
        .map_or(0, |&(_, count)| count)
}

/// Adds `cost` to window `index` in sorted `windows`.
pub(super) fn add_at(windows: &mut Vec<(u64, u64)>, index: u64, cost: u64) {
    match windows.binary_search_by_key(&index, |&(i, _)| i) {
        Ok(at) => {
            if let Some((_, count)) = windows.get_mut(at) {
                *count = count.saturating_add(cost).min(MAX_CHARGED);
            }
        }
        Err(at) => windows.insert(at, (index, cost.min(MAX_CHARGED))),
    }
}

/// The `retry_after` of a `pace` at `now` whose slot lies in window `slot` (windows of `w`
/// µs), if that window is [`MAX_BOOKED_WINDOWS`] or more after the current one
/// (`floor(now / w)`): the time until it comes within the horizon,
/// `(slot - MAX_BOOKED_WINDOWS + 1) * w - now`. `None` within the horizon.
pub(super) fn past_horizon(slot: u64, now: u64, w: u64) -> Option<f64> {
    (slot.saturating_sub(now / w) >= MAX_BOOKED_WINDOWS).then(|| {
        (slot - MAX_BOOKED_WINDOWS + 1)
            .saturating_mul(w)
            .saturating_sub(now) as f64
    })
}

/// How a request to either window algorithm ends at `now`, once it is known whether it fits
/// now (`fits_now`), how long until it would (`delay`, µs) and which window of `w` µs it
/// would count in (`window`; for a `pace`, refused past the horizon, see [`past_horizon`]):
/// the decision, built by `decision(windows, allowed, delay)`, and the windows to store if
/// the request is admitted. A peek or a rejection stores nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn settle(
    windows: Vec<(u64, u64)>,
    op: Op,
    cost: u64,
    fits_now: bool,
    delay: f64,
    window: u64,
    now: u64,
    w: u64,
    decision: impl Fn(&[(u64, u64)], bool, f64) -> Decision,
) -> (Decision, Option<Vec<(u64, u64)>>) {
    let admit = match op {
        Op::Charge => {
            // Counted in the current window, past the limit if need be: the window admits
            // nothing more until it ends.
            let mut windows = windows;
            add_at(&mut windows, now / w, cost);
            return (decision(&windows, true, 0.0), Some(windows));
        }
        Op::Peek => false,
        Op::Limit => fits_now,
        Op::Pace { max_wait } => {
            // Over `max_wait`, or past the horizon: rejected, retry-after the later of the two.
            let waited = max_wait
                .map(duration_to_micros)
                .filter(|&max| delay > max)
                .map(|max| retry_after_max_wait(delay, max));
            let past = past_horizon(window, now, w);
            if waited.is_some() || past.is_some() {
                let retry = waited.unwrap_or(0.0).max(past.unwrap_or(0.0));
                return (decision(&windows, false, retry), None);
            }
            true
        }
    };
    if !admit {
        return (decision(&windows, fits_now, delay), None);
    }
    let mut windows = windows;
    add_at(&mut windows, window, cost);
    (decision(&windows, true, delay), Some(windows))
}

/// The smallest window index `>= from` whose count leaves room for `cost` under `limit`.
fn earliest_with_room(windows: &[(u64, u64)], from: u64, cost: u64, limit: u64) -> u64 {
    let mut candidate = from;
    for &(index, count) in windows {
        if index < candidate {
            continue;
        }
        if index > candidate || count.saturating_add(cost) <= limit {
            // `candidate` is empty, or has room.
            break;
        }
        candidate = candidate.saturating_add(1);
    }
    candidate
}

impl Algorithm for FixedWindow {
    type State = State;
    const NAME: &'static str = "fixed_window";
    const PARAMS: &'static [&'static str] = &["limit", "window"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let limit = parse_count("limit", &params.required("limit")?, 1)?;
        let window_us = parse_duration("window", &params.required("window")?)?;
        FixedWindow::new(limit, Duration::from_micros(window_us))
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
        self.decide(state, now, op, cost, now)
    }

    /// The earliest window from the one holding `from` with room, from `from` on.
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

impl FixedWindow {
    /// [`Algorithm::apply`], with the slot no earlier than `from` (`>= now`).
    fn decide(
        &self,
        state: &mut Option<State>,
        now: u64,
        op: Op,
        cost: u64,
        from: u64,
    ) -> Decision {
        let w = self.window_us;
        let current = now / w;
        // The stored counts under this policy's window, from the current window onwards.
        let windows = state
            .as_ref()
            .map_or_else(Vec::new, |s| rebucket(s.window_us, &s.windows, w, current));
        // A charge counts now, wherever a `pace` would go.
        let slot = if op == Op::Charge {
            current
        } else {
            earliest_with_room(&windows, (from / w).max(current), cost, self.limit)
        };
        let delay = slot.saturating_mul(w).max(from).saturating_sub(now) as f64;
        let (decision, admitted) = settle(
            windows,
            op,
            cost,
            slot == current,
            delay,
            slot,
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
            Some(crate::State::FixedWindow(own)) => own,
            other => panic!("not a fixed_window state: {other:?}"),
        }
    }

    #[test]
    fn discord_ten_per_ten_seconds() {
        let p = policy("fixed_window:limit=10,window=10s");
        let mut s = None;
        let t = 1_700_000_003 * SEC; // 3 s into a window
        for left in (0..10).rev() {
            let d = p.apply(&mut s, t, Op::Limit, 1).unwrap();
            assert!(d.is_immediate());
            assert_eq!(d.remaining, left);
            assert_eq!(d.reset_after, Duration::from_secs(7));
            assert_eq!(d.limit, 10);
        }
        let before = s.clone();
        let r = p.apply(&mut s, t + 500 * MS, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.delay, Duration::from_millis(6_500));
        assert_eq!(
            (r.remaining, r.reset_after),
            (0, Duration::from_millis(6_500))
        );
        assert_eq!(s, before, "a rejection changes nothing");
        // The next window starts afresh.
        let d = p.apply(&mut s, t + 7 * SEC, Op::Limit, 1).unwrap();
        assert!(d.is_immediate());
        assert_eq!(d.remaining, 9);
        assert_eq!(
            own(&s).windows,
            [(170_000_001, 1)],
            "the old window is pruned"
        );
    }

    #[test]
    fn pace_reproduces_the_seed_ready_timestamp() {
        let (limit, window) = (10u64, 10 * SEC);
        let p = policy("fixed_window:limit=10,window=10s");
        let mut s = None;
        for _ in 0..limit {
            assert!(p.apply(&mut s, SEC, Op::Limit, 1).unwrap().is_immediate());
        }
        let now = 3 * SEC;
        let next_window_start = (now / window + 1) * window;
        for waiting in 0..35u64 {
            // readyTimestamp = nextWindowStart + floor(waiting / limit) * window
            let ready = next_window_start + (waiting / limit) * window;
            let d = p.apply(&mut s, now, Op::pace(), 1).unwrap();
            assert!(d.allowed);
            assert_eq!(
                d.delay,
                Duration::from_micros(ready - now),
                "request {waiting}"
            );
            assert_eq!(d.remaining, 0);
            assert_eq!(d.reset_after, Duration::from_micros(ready + window - now));
        }
        assert_eq!(
            own(&s).windows,
            [(0, 10), (1, 10), (2, 10), (3, 10), (4, 5)]
        );
    }

    #[test]
    fn retry_after_is_exact_and_skips_booked_windows() {
        let p = policy("fixed_window:limit=3,window=1s");
        let mut s = None;
        p.apply(&mut s, 200 * MS, Op::Limit, 3).unwrap();
        p.apply(&mut s, 200 * MS, Op::pace(), 3).unwrap(); // books window 1
        p.apply(&mut s, 200 * MS, Op::pace(), 2).unwrap(); // books 2 in window 2
        let r = p.apply(&mut s, 400 * MS, Op::Limit, 2).unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_millis(2_600),
            "window 3 is the first with room for 2"
        );
        let one = p.apply(&mut s, 400 * MS, Op::Limit, 1).unwrap();
        assert_eq!(
            one.delay,
            Duration::from_millis(1_600),
            "window 2 has room for 1"
        );
        let before = s.clone();
        let mut early = s.clone();
        assert!(
            !p.apply(&mut early, 3 * SEC - 1, Op::Limit, 2)
                .unwrap()
                .allowed
        );
        assert_eq!(early, before);
        assert!(p
            .apply(&mut s, 3 * SEC, Op::Limit, 2)
            .unwrap()
            .is_immediate());
    }

    #[test]
    fn mixed_costs_reserve_the_earliest_window_with_room() {
        let p = policy("fixed_window:limit=10,window=10s");
        let mut s = None;
        let delays: Vec<u64> = [6, 6, 5, 4, 3, 1]
            .iter()
            .map(|&c| p.apply(&mut s, 0, Op::pace(), c).unwrap().delay.as_secs())
            .collect();
        // 6 -> w0 (6); 6 -> w1 (6); 5 -> w2; 4 -> w0 (10); 3 -> w1 (9); 1 -> w1 (10).
        assert_eq!(delays, [0, 10, 20, 0, 10, 10]);
        assert_eq!(own(&s).windows, [(0, 10), (1, 10), (2, 5)]);
    }

    #[test]
    fn pace_with_max_wait_rejects_without_side_effects() {
        let p = policy("fixed_window:limit=1,window=1s");
        let mut s = None;
        p.apply(&mut s, 300 * MS, Op::pace(), 1).unwrap();
        p.apply(&mut s, 300 * MS, Op::pace(), 1).unwrap(); // window 1, delay 700 ms
        let before = s.clone();
        let within = Op::pace_within(Duration::from_millis(1_500));
        let r = p.apply(&mut s, 300 * MS, within, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!(
            r.delay,
            Duration::from_millis(200),
            "1.7 s delay - 1.5 s max wait"
        );
        assert_eq!(
            (r.remaining, r.reset_after),
            (0, Duration::from_millis(1_700))
        );
        assert_eq!(s, before);
        let ok = p.apply(&mut s, 500 * MS, within, 1).unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.delay, Duration::from_millis(1_500));
        // A max wait the delay fits in exactly is accepted.
        let exact = p.apply(
            &mut s,
            500 * MS,
            Op::pace_within(Duration::from_millis(2_500)),
            1,
        );
        assert_eq!(exact.unwrap().delay, Duration::from_millis(2_500));
    }

    #[test]
    fn pace_books_at_most_max_booked_windows_ahead() {
        let h = MAX_BOOKED_WINDOWS;
        let p = policy("fixed_window:limit=1,window=1s");
        let mut s = None;
        let now = 300 * MS; // window 0
        for k in 0..h {
            let d = p.apply(&mut s, now, Op::pace(), 1).unwrap();
            assert!(d.allowed, "window {k} is within the horizon");
            assert_eq!(
                d.delay,
                Duration::from_micros((k * SEC).saturating_sub(now))
            );
        }
        assert_eq!(own(&s).windows.len() as u64, h);
        assert_eq!(
            own(&s).windows.last(),
            Some(&(h - 1, 1)),
            "the last bookable window"
        );
        // Window `h` is refused, with no state change: retry when window 1 opens.
        let before = s.clone();
        for op in [Op::pace(), Op::pace_within(Duration::from_secs(2 * h))] {
            let r = p.apply(&mut s, now, op, 1).unwrap();
            assert!(!r.allowed);
            assert_eq!(
                r.delay,
                Duration::from_millis(700),
                "(h - h + 1) * 1 s - 300 ms"
            );
            assert_eq!(
                (r.remaining, r.reset_after),
                (0, Duration::from_micros(h * SEC - now))
            );
            assert_eq!(s, before);
        }
        // Over max_wait too: the later of the two retries.
        let within = Op::pace_within(Duration::from_secs(10));
        let r = p.apply(&mut s, now, within, 1).unwrap();
        assert_eq!(r.delay, Duration::from_micros(h * SEC - now - 10 * SEC));
        let r = p.apply(&mut s, SEC - 1, Op::pace(), 1).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_micros(1)));
        assert_eq!(s, before);
        // `limit` and `peek` still answer when window `h` opens, storing nothing past it.
        let l = p.apply(&mut s, now, Op::Limit, 1).unwrap();
        assert_eq!(
            (l.allowed, l.delay),
            (false, Duration::from_micros(h * SEC - now))
        );
        assert_eq!(s, before);
        // A window later, window `h` is within the horizon.
        let d = p.apply(&mut s, SEC, Op::pace(), 1).unwrap();
        assert_eq!((d.allowed, d.delay), (true, Duration::from_secs(h - 1)));
        assert_eq!(own(&s).windows.len() as u64, h, "window 0 is dropped");
        assert_eq!(own(&s).windows.first(), Some(&(1, 1)));
    }

    #[test]
    fn pace_from_books_within_the_horizon_only() {
        let h = MAX_BOOKED_WINDOWS;
        let p = policy("fixed_window:limit=1,window=1ms");
        let mut s = None;
        let last = p.pace_from(&mut s.clone(), 0, 1, (h - 1) * MS).unwrap();
        assert_eq!(
            (last.allowed, last.delay),
            (true, Duration::from_millis(h - 1))
        );
        let r = p.pace_from(&mut s, 0, 1, h * MS).unwrap();
        assert_eq!((r.allowed, r.delay), (false, Duration::from_millis(1)));
        assert_eq!(s, None);
    }

    #[test]
    fn peek_answers_like_limit_without_changing_anything() {
        let p = policy("fixed_window:limit=2,window=1s");
        let mut s = None;
        let idle = p.apply(&mut s, 0, Op::Peek, 2).unwrap();
        assert!(idle.is_immediate());
        assert_eq!((idle.remaining, idle.reset_after), (2, Duration::ZERO));
        assert_eq!(s, None);
        p.apply(&mut s, 100 * MS, Op::Limit, 1).unwrap();
        let before = s.clone();
        let one = p.apply(&mut s, 100 * MS, Op::Peek, 1).unwrap();
        assert!(one.is_immediate());
        assert_eq!(
            (one.remaining, one.reset_after),
            (1, Duration::from_millis(900))
        );
        let two = p.apply(&mut s, 100 * MS, Op::Peek, 2).unwrap();
        let limit_two = p.apply(&mut s.clone(), 100 * MS, Op::Limit, 2).unwrap();
        assert_eq!(two, limit_two);
        assert_eq!(two.delay, Duration::from_millis(900));
        assert_eq!(
            two.remaining, 1,
            "remaining describes the state, not the hypothesis"
        );
        assert_eq!(s, before);
    }

    #[test]
    fn reset_after_is_when_the_state_behaves_as_none() {
        let p = policy("fixed_window:limit=4,window=1s");
        let mut s = None;
        p.apply(&mut s, 250 * MS, Op::Limit, 3).unwrap();
        p.apply(&mut s, 250 * MS, Op::pace(), 4).unwrap();
        let d = p.apply(&mut s, 250 * MS, Op::pace(), 2).unwrap();
        assert_eq!(d.delay, Duration::from_millis(1_750));
        assert_eq!(d.reset_after, Duration::from_millis(2_750));
        let at = 250 * MS + 2_750 * MS;
        for op in [Op::Limit, Op::Peek, Op::pace()] {
            for cost in [1, 3, 4] {
                let from_state = p.apply(&mut s.clone(), at, op, cost).unwrap();
                let from_none = p.apply(&mut None, at, op, cost).unwrap();
                assert_eq!(from_state, from_none, "{op:?} {cost}");
            }
        }
        // One microsecond earlier the last booked window still counts.
        let before = p.apply(&mut s.clone(), at - 1, Op::Peek, 1).unwrap();
        assert_eq!(before.remaining, 2);
        assert_eq!(before.reset_after, Duration::from_micros(1));
    }

    #[test]
    fn live_change_of_limit_keeps_the_counts() {
        let five = policy("fixed_window:limit=5,window=1s");
        let two = policy("fixed_window:limit=2,window=1s");
        let mut s = None;
        five.apply(&mut s, 0, Op::Limit, 3).unwrap();
        let r = two.apply(&mut s, 0, Op::Limit, 1).unwrap();
        assert!(!r.allowed);
        assert_eq!((r.delay, r.remaining), (Duration::from_secs(1), 0));
        assert_eq!(five.apply(&mut s, 0, Op::Limit, 2).unwrap().remaining, 0);
    }

    #[test]
    fn live_change_of_window_rebuckets_by_start_time() {
        let ten = policy("fixed_window:limit=10,window=10s");
        let minute = policy("fixed_window:limit=10,window=1m");
        let mut s = None;
        ten.apply(&mut s, 15 * SEC, Op::Limit, 6).unwrap(); // window [10 s, 20 s)
        ten.apply(&mut s, 15 * SEC, Op::pace(), 4).unwrap(); // fits in [10 s, 20 s): 10
        ten.apply(&mut s, 15 * SEC, Op::pace(), 3).unwrap(); // [20 s, 30 s)
                                                             // Lengthened: both 10 s windows start inside [0, 60 s), so their counts add up.
        let d = minute.apply(&mut s.clone(), 16 * SEC, Op::Peek, 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.delay, Duration::from_secs(44));
        assert_eq!((d.remaining, d.reset_after), (0, Duration::from_secs(44)));
        let mut longer = s.clone();
        minute.apply(&mut longer, 16 * SEC, Op::pace(), 1).unwrap();
        assert_eq!(
            own(&longer),
            &State {
                window_us: 60 * SEC,
                windows: vec![(0, 13), (1, 1)],
            }
        );
        // Shortened to 5 s: [10 s, 20 s) lands in [10 s, 15 s), which is over at 16 s; the
        // reservation at [20 s, 30 s) lands in [20 s, 25 s).
        let five = policy("fixed_window:limit=10,window=5s");
        let d = five.apply(&mut s, 16 * SEC, Op::Limit, 8).unwrap();
        assert!(d.is_immediate());
        assert_eq!(own(&s).windows, [(3, 8), (4, 3)]);
        assert_eq!(d.reset_after, Duration::from_secs(9));
    }

    #[test]
    fn every_cost_up_to_the_limit_and_no_further() {
        let p = policy("fixed_window:limit=3,window=1s");
        for op in [Op::Limit, Op::Peek, Op::pace()] {
            assert!(p.apply(&mut None, 0, op, 3).is_ok());
            assert_eq!(p.apply(&mut None, 0, op, 4).unwrap_err().field(), "cost");
        }
        assert_eq!(p.max_cost(Op::pace()), Some(3));
        assert_eq!(p.limit(), 3);
    }

    #[test]
    fn parameters_are_validated() {
        for (spec, field) in [
            ("fixed_window:window=10s", "limit"),
            ("fixed_window:limit=10", "window"),
            ("fixed_window:limit=0,window=10s", "limit"),
            ("fixed_window:limit=-1,window=10s", "limit"),
            ("fixed_window:limit=NaN,window=10s", "limit"),
            ("fixed_window:limit=1.5,window=10s", "limit"),
            ("fixed_window:limit=10,window=0s", "window"),
            ("fixed_window:limit=10,window=-1s", "window"),
            ("fixed_window:limit=10,window=NaN", "window"),
            ("fixed_window:limit=10,window=10", "window"),
            ("fixed_window:limit=10,window=10s,rate=1", "rate"),
        ] {
            assert_eq!(spec.parse::<Policy>().unwrap_err().field(), field, "{spec}");
        }
        assert_eq!(
            FixedWindow::new(0, Duration::from_secs(1))
                .unwrap_err()
                .field(),
            "limit"
        );
        assert_eq!(
            FixedWindow::new(1, Duration::ZERO).unwrap_err().field(),
            "window"
        );
        assert_eq!(
            FixedWindow::new(1, Duration::from_nanos(1_500))
                .unwrap_err()
                .field(),
            "window"
        );
        assert_eq!(
            FixedWindow::new(1, Duration::from_secs(3651 * 86_400))
                .unwrap_err()
                .field(),
            "window"
        );
        let built = FixedWindow::new(10, Duration::from_millis(1_500)).unwrap();
        assert_eq!(
            (built.limit(), built.window()),
            (10, Duration::from_millis(1_500))
        );
        let p = Policy::FixedWindow(built);
        assert_eq!(p.to_string(), "fixed_window:limit=10,window=1500ms");
        assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
    }

    proptest! {
        #[test]
        fn random_traffic_keeps_the_contract(t in traffic()) {
            let p = Policy::FixedWindow(FixedWindow::new(t.limit, t.window()).unwrap());
            t.keeps_the_contract_in_fixed_windows(&p)?;
        }
    }
}

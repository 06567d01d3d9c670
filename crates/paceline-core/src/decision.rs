//! The question ([`Op`]) and the answer ([`Decision`]).

use std::time::Duration;

/// What a caller asks of a policy for one key.
///
/// * [`Op::Pace`]: admit into the future. The policy reserves the earliest slot it allows and
///   the decision's `delay` says how long to sleep before acting. With `max_wait`, the slot is
///   reserved only if `delay <= max_wait`; otherwise the request is rejected and nothing
///   changes (Guava's `tryAcquire(permits, timeout)`).
/// * [`Op::Limit`]: admit only if the policy admits it right now; otherwise reject with a
///   `retry_after` and (unless the policy says otherwise) no change of state.
/// * [`Op::Peek`]: report what `Limit` would answer, changing nothing.
/// * [`Op::Charge`]: count a cost already spent, even past the limit, and never refuse: for
///   costs known only after the work (the tokens of an LLM's answer). The key stays
///   exhausted until the charge drains (gcra's TAT moves past the burst, a window's count
///   past its limit). The decision is always admitted with no delay; `remaining` says what
///   is left after it, 0 while the key is in debt. `concurrency` holds leases and refuses
///   it (an input error naming `op`).
///
/// ```
/// use paceline_core::Op;
/// use std::time::Duration;
/// assert_eq!(Op::pace(), Op::Pace { max_wait: None });
/// assert_eq!(Op::pace_within(Duration::from_millis(200)).name(), "pace");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Reserve the earliest slot; reject only if it is further away than `max_wait`.
    Pace {
        /// The longest delay the caller accepts; `None` accepts any delay.
        max_wait: Option<Duration>,
    },
    /// Admit now or reject.
    Limit,
    /// Report without changing anything.
    Peek,
    /// Count a cost already spent, past the limit if need be; never refused.
    Charge,
}

impl Op {
    /// `pace` with no limit on the delay.
    pub const fn pace() -> Op {
        Op::Pace { max_wait: None }
    }

    /// `pace` that rejects (without side effects) when the delay would exceed `max_wait`.
    pub const fn pace_within(max_wait: Duration) -> Op {
        Op::Pace {
            max_wait: Some(max_wait),
        }
    }

    /// The op's name as used by specs, the CLI and the server: `pace`, `limit`, `peek` or
    /// `charge`.
    pub const fn name(&self) -> &'static str {
        match self {
            Op::Pace { .. } => "pace",
            Op::Limit => "limit",
            Op::Peek => "peek",
            Op::Charge => "charge",
        }
    }
}

/// The answer to "may I act now, and if not, when?".
///
/// * `allowed`: admitted (possibly after `delay`).
/// * `delay`: admitted: how long to wait before acting (zero = go now). Rejected: the
///   `retry_after`, the earliest time a retry of the same cost could be admitted if nothing
///   else happens.
/// * `remaining`: how many cost-1 requests would be admitted with zero delay right now, after
///   this decision.
/// * `reset_after`: time until the key is idle again (fully replenished; its state may then be
///   dropped).
/// * `limit`: the policy's burst capacity in cost units.
/// * `fallback`: `None` for a decision the store made. When a shared store failed and the
///   limiter's failure policy answered instead, says how ([`Fallback`]).
///
/// ```
/// use paceline_core::{Decision, Policy, Op};
/// let policy: Policy = "gcra:rate=10/s,burst=2".parse().unwrap();
/// let mut state = None;
/// let d = policy.apply(&mut state, 0, Op::Limit, 1).unwrap();
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 1);
/// assert_eq!(d.limit, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Decision {
    /// True if the request was admitted (possibly with a delay).
    pub allowed: bool,
    /// Admitted: the wait before acting. Rejected: the retry-after.
    pub delay: Duration,
    /// Cost-1 requests that would be admitted with zero delay right now.
    pub remaining: u64,
    /// Time until the key is idle again.
    pub reset_after: Duration,
    /// The policy's burst capacity in cost units.
    pub limit: u64,
    /// Set when the store could not be reached and the failure policy decided instead.
    pub fallback: Option<Fallback>,
    /// The lease an admitted [`concurrency`](crate::policy::concurrency) request holds: give
    /// it back with [`Policy::release`](crate::Policy::release) (or the store's `release`)
    /// when the request ends. `None` for every other policy.
    pub lease: Option<u64>,
    /// True for a refusal a local cache of refusals answered without asking the store
    /// (`CachedRefusals` in `paceline-store`).
    pub cached: bool,
}

/// How a decision was made when the store failed (see a shared store's failure policy).
///
/// A store failure is never reported as a rejection: with `fail_closed` it is an error,
/// otherwise the decision carries one of these flags so callers can log or count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fallback {
    /// Admitted without asking the store (`fail_open`): `delay` is zero and `remaining` /
    /// `reset_after` describe an idle key, since nothing is known about the real one.
    FailOpen,
    /// Decided by an in-process limiter of the same policy (`local`), which knows only this
    /// process's traffic since the store failed.
    Local,
}

impl Fallback {
    /// The name used by configs, logs and the CLI: `fail_open` or `local`.
    pub const fn name(&self) -> &'static str {
        match self {
            Fallback::FailOpen => "fail_open",
            Fallback::Local => "local",
        }
    }
}

impl Decision {
    /// Builds a decision from times in (possibly fractional) microseconds, the unit the
    /// policy engine and the store scripts compute in. Negative or NaN times count as zero;
    /// times too large for a [`Duration`] saturate.
    #[inline]
    pub fn from_micros(
        allowed: bool,
        delay_us: f64,
        remaining: u64,
        reset_after_us: f64,
        limit: u64,
    ) -> Decision {
        Decision {
            allowed,
            delay: micros_to_duration(delay_us),
            remaining,
            reset_after: micros_to_duration(reset_after_us),
            limit,
            fallback: None,
            lease: None,
            cached: false,
        }
    }

    /// The same decision, flagged as made by a failure policy.
    #[must_use]
    pub fn with_fallback(mut self, fallback: Fallback) -> Decision {
        self.fallback = Some(fallback);
        self
    }

    /// Admitted with zero delay: act now.
    pub fn is_immediate(&self) -> bool {
        self.allowed && self.delay.is_zero()
    }

    /// The retry-after of a rejection; `None` if the request was admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then_some(self.delay)
    }
}

/// Converts fractional microseconds to a [`Duration`], rounding to the nearest nanosecond,
/// treating negative and NaN values as zero and saturating at [`Duration::MAX`].
// Engine internals the stores (paceline-store, a sibling crate) need; not part of the
// public API, so hidden from its documentation.
#[doc(hidden)]
#[inline]
pub fn micros_to_duration(us: f64) -> Duration {
    if us.is_nan() || us <= 0.0 {
        return Duration::ZERO;
    }
    // Round half up; `as` truncates, and a float-to-int cast is one instruction where
    // `f64::round` may be a library call.
    let nanos = us * 1000.0 + 0.5;
    if nanos >= i64::MAX as f64 {
        // Beyond 292 years: the slow conversion, saturating at what u64 nanoseconds hold.
        if nanos >= u64::MAX as f64 {
            return Duration::MAX;
        }
        return Duration::from_nanos(nanos as u64);
    }
    // Below 2^63 a signed conversion is exact and a single instruction.
    Duration::from_nanos(nanos as i64 as u64)
}

/// A [`Duration`] in whole microseconds, rounded to the nearest (half up), saturating: how
/// the CLI and the service print times (milliseconds with microsecond precision).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(paceline_core::round_to_micros(Duration::from_nanos(1_499)), 1);
/// assert_eq!(paceline_core::round_to_micros(Duration::from_nanos(1_500)), 2);
/// assert_eq!(paceline_core::round_to_micros(Duration::MAX), u64::MAX);
/// ```
// Engine internals the stores (paceline-store, a sibling crate) need; not part of the
// public API, so hidden from its documentation.
#[doc(hidden)]
pub fn round_to_micros(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().saturating_add(500) / 1_000).unwrap_or(u64::MAX)
}

/// Converts a [`Duration`] to fractional microseconds.
// Engine internals the stores (paceline-store, a sibling crate) need; not part of the
// public API, so hidden from its documentation.
#[doc(hidden)]
#[inline]
pub fn duration_to_micros(d: Duration) -> f64 {
    d.as_secs() as f64 * 1e6 + f64::from(d.subsec_nanos()) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_conversion_rounds_saturates_and_clamps() {
        assert_eq!(micros_to_duration(1.5), Duration::from_nanos(1500));
        assert_eq!(micros_to_duration(-3.0), Duration::ZERO);
        assert_eq!(micros_to_duration(f64::NAN), Duration::ZERO);
        assert_eq!(micros_to_duration(f64::INFINITY), Duration::MAX);
        assert_eq!(micros_to_duration(1e30), Duration::MAX);
        // Each side of 2^63 ns, where the conversion changes method; and whole seconds.
        assert_eq!(
            micros_to_duration(9.0e15),
            Duration::from_nanos(9_000_000_000_000_000_000)
        );
        assert_eq!(
            micros_to_duration(1.5e16),
            Duration::from_nanos(15_000_000_000_000_000_000)
        );
        assert_eq!(micros_to_duration(2e6), Duration::from_secs(2));
        assert_eq!(
            micros_to_duration(1_999_999.999_6),
            Duration::from_secs(2),
            "999,999,999.6 ns rounds up into the next second"
        );
        assert_eq!(duration_to_micros(Duration::from_millis(250)), 250_000.0);
    }

    #[test]
    fn micros_conversion_matches_the_plain_formula() {
        // The fast path against `Duration::from_nanos` of the rounded value, over values
        // spread from nanoseconds to centuries.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let us = (x >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi((x % 16) as i32);
            let plain = Duration::from_nanos((us * 1000.0 + 0.5) as u64);
            assert_eq!(micros_to_duration(us), plain, "{us} µs");
        }
    }

    #[test]
    fn retry_after_only_for_rejections() {
        let ok = Decision::from_micros(true, 5.0, 0, 10.0, 1);
        let no = Decision::from_micros(false, 5.0, 0, 10.0, 1);
        assert_eq!(ok.retry_after(), None);
        assert_eq!(no.retry_after(), Some(Duration::from_micros(5)));
        assert!(!ok.is_immediate());
        assert!(Decision::from_micros(true, 0.0, 0, 0.0, 1).is_immediate());
    }
}

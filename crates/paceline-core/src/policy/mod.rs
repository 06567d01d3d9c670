//! The eight algorithms and `concurrency`, as pure transitions over one key's state.
//!
//! Each algorithm is a small struct of validated parameters and a `State` value; applying a
//! request is `(params, state, now, op, cost) -> (decision, new state)`, written as a function
//! that updates `&mut Option<State>` in place and leaves it untouched whenever the decision
//! has no side effects (a rejection, a peek). `None` means "no stored state": the key is idle.
//! Time is microseconds since the Unix epoch and is always passed in; nothing here reads a
//! clock. Each module's documentation is its exact contract, the same for every store (the
//! Redis store runs Lua twins of these functions, held equal by differential tests).
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let policy: Policy = "fixed_window:limit=2,window=10s".parse().unwrap();
//! let mut state = None;
//! let t = 3_000_000; // 3 s after the epoch, inside the window [0 s, 10 s)
//! assert!(policy.apply(&mut state, t, Op::Limit, 1).unwrap().allowed);
//! assert!(policy.apply(&mut state, t, Op::Limit, 1).unwrap().allowed);
//! let third = policy.apply(&mut state, t, Op::Limit, 1).unwrap();
//! assert!(!third.allowed);
//! assert_eq!(third.delay.as_secs(), 7); // retry when the next window opens
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::spec::{self, Params, MAX_COUNT};
use crate::{Decision, InputError, Op};

pub mod concurrency;
pub mod exec_evenly;
pub mod fixed_window;
pub mod gcra;
mod guava;
pub mod pacer;
pub mod sliding_log;
pub mod sliding_window;
pub mod smooth_bursty;
pub mod smooth_warming_up;
#[cfg(test)]
mod test_util;

pub use concurrency::Concurrency;
pub use exec_evenly::ExecEvenly;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use pacer::Pacer;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use smooth_bursty::SmoothBursty;
pub use smooth_warming_up::SmoothWarmingUp;

/// What every algorithm module provides. Internal: users see [`Policy`].
pub(crate) trait Algorithm: Sized {
    /// One key's stored state.
    type State: Clone;
    /// The name used in specs (`gcra`, `fixed_window`, ...).
    const NAME: &'static str;
    /// Parameter names, canonical first; aliases are handled by [`Params`].
    const PARAMS: &'static [&'static str];
    /// Reads and validates the parameters.
    fn from_params(params: &mut Params) -> Result<Self, InputError>;
    /// The canonical `(name, value)` pairs, in spec order.
    fn to_params(&self) -> Vec<(&'static str, String)>;
    /// The largest cost `op` can ever admit (`None`: any cost, possibly after a delay).
    fn max_cost(&self, op: Op) -> Option<u64>;
    /// The burst capacity in cost units (the decision's `limit`).
    fn limit(&self) -> u64;
    /// Applies one validated request. Must leave `state` unchanged when the decision has no
    /// side effects. `now` is microseconds since the Unix epoch.
    fn apply(&self, state: &mut Option<Self::State>, now: u64, op: Op, cost: u64) -> Decision;

    /// True for an algorithm whose state is a schedule (`gcra`'s TAT, Guava's next free
    /// ticket): it books a later slot by deciding as of that slot ([`pace_as_of`]).
    const BOOKS_AS_OF: bool = false;

    /// A `pace` (without `max_wait`) at `now` that books the earliest slot at or after
    /// `from` (`>= now`): the decision as [`Policy::pace_from`] documents it, or `None` if
    /// the algorithm cannot book a slot later than its own earliest. By default, booked as
    /// of `from` if [`BOOKS_AS_OF`](Algorithm::BOOKS_AS_OF), else `None`.
    fn pace_from(
        &self,
        state: &mut Option<Self::State>,
        now: u64,
        cost: u64,
        from: u64,
    ) -> Option<Decision> {
        Self::BOOKS_AS_OF.then(|| pace_as_of(self, state, now, cost, from))
    }
}

/// [`Algorithm::pace_from`] for an algorithm whose state means the same whenever it is
/// read: a `pace` at `from` itself (as if the request arrived then), its delay and
/// `reset_after` counted from `now`. Sound for the algorithms whose state is a schedule
/// (`gcra`'s TAT, Guava's next free ticket): booking at `from` leaves every request before
/// `from` waiting behind it, and forgets nothing a request before `from` needs.
///
/// `remaining` is the key's at `now` after the booking (a `peek` of cost 1 then), as every
/// other decision's is.
pub(crate) fn pace_as_of<A: Algorithm>(
    policy: &A,
    state: &mut Option<A::State>,
    now: u64,
    cost: u64,
    from: u64,
) -> Decision {
    let later = Duration::from_micros(from.saturating_sub(now));
    let mut decision = policy.apply(state, from.max(now), Op::pace(), cost);
    decision.delay = decision.delay.saturating_add(later);
    decision.reset_after = decision.reset_after.saturating_add(later);
    decision.remaining = policy.apply(&mut state.clone(), now, Op::Peek, 1).remaining;
    decision
}

macro_rules! policies {
    ($( $variant:ident => $module:ident ),* $(,)?) => {
        /// A validated rate-limiting or pacing policy: one of the eight algorithms with its
        /// parameters.
        ///
        /// Build one from a spec string (`"gcra:rate=10/s,burst=5"`), from a serde table
        /// (`{ algorithm = "gcra", rate = "10/s", burst = 5 }`) or from an algorithm's own
        /// constructor. `Display` writes the canonical spec, which parses back to an equal
        /// policy.
        ///
        /// ```
        /// use paceline_core::Policy;
        /// let p: Policy = "pacer:qps=10,max_burst=2".parse().unwrap();
        /// assert_eq!(p.algorithm(), "pacer");
        /// assert_eq!(p.to_string(), "pacer:rate=10/s,max_burst=2");
        /// ```
        ///
        /// Typed, each algorithm's constructor validates exactly as the spec parser does,
        /// and converts into a `Policy`:
        ///
        /// ```
        /// use paceline_core::policy::{FixedWindow, Gcra};
        /// use paceline_core::{Policy, Rate};
        /// use std::time::Duration;
        /// let bucket: Policy = Gcra::new(Rate::per_second(10)?, 5)?.into();
        /// assert_eq!(bucket, "gcra:rate=10/s,burst=5".parse()?);
        /// let discord: Policy = FixedWindow::new(10, Duration::from_secs(10))?.into();
        /// assert_eq!(discord.to_string(), "fixed_window:limit=10,window=10s");
        /// assert_eq!(Gcra::new(Rate::per_second(10)?, 0).unwrap_err().field(), "burst");
        /// # Ok::<(), paceline_core::InputError>(())
        /// ```
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum Policy {
            $(
                #[doc = concat!("See [`", stringify!($module), "`].")]
                $variant($variant),
            )*
        }

        /// One key's stored state, for whichever algorithm last wrote it.
        ///
        /// A state written by another algorithm than the policy applied now is ignored (the
        /// key starts afresh): changing a key's *algorithm* restarts it, changing its
        /// *parameters* keeps its state.
        #[derive(Clone, Debug, PartialEq)]
        #[non_exhaustive]
        pub enum State {
            $(
                #[doc = concat!("State of [`", stringify!($variant), "`].")]
                $variant($module::State),
            )*
        }

        $(
            impl From<$variant> for Policy {
                fn from(policy: $variant) -> Policy {
                    Policy::$variant(policy)
                }
            }
        )*

        impl Policy {
            /// The algorithm's name as written in specs.
            pub fn algorithm(&self) -> &'static str {
                match self { $( Policy::$variant(_) => $variant::NAME, )* }
            }

            /// True if `state` was written by this policy's algorithm (so this policy reads
            /// it; a state of another algorithm is ignored).
            #[inline]
            pub fn owns(&self, state: &State) -> bool {
                match (self, state) {
                    $( (Policy::$variant(_), State::$variant(_)) => true, )*
                    #[allow(unreachable_patterns)]
                    _ => false,
                }
            }

            /// The policy's burst capacity in cost units.
            pub fn limit(&self) -> u64 {
                match self { $( Policy::$variant(p) => p.limit(), )* }
            }

            /// The largest cost `op` can ever admit; `None` when any cost is admitted
            /// eventually (possibly after a delay).
            #[inline]
            pub fn max_cost(&self, op: Op) -> Option<u64> {
                match self { $( Policy::$variant(p) => p.max_cost(op), )* }
            }

            fn params(&self) -> Vec<(&'static str, String)> {
                match self { $( Policy::$variant(p) => p.to_params(), )* }
            }

            fn build(algorithm: &str, pairs: Vec<(&str, String)>) -> Result<Policy, InputError> {
                match algorithm {
                    $(
                        $variant::NAME => {
                            let mut params = Params::new(
                                $variant::NAME,
                                $variant::PARAMS,
                                ALIASES,
                                pairs,
                            )?;
                            Ok(Policy::$variant($variant::from_params(&mut params)?))
                        }
                    )*
                    other => Err(InputError::new(
                        "algorithm",
                        format!("`{other}` is not an algorithm; use one of: {}", ALGORITHMS.join(", ")),
                    )),
                }
            }

            /// [`Policy::apply`] for a request whose `cost` has passed
            /// [`Policy::check_cost`] for `op` and whose `now` has passed [`check_now`]:
            /// for stores that check a request once, before deciding how to apply it.
            /// Unchecked input gives unspecified (but memory-safe) decisions.
            // For stores (paceline-store) that check a request once before applying it;
            // not part of the public API.
            #[doc(hidden)]
            #[inline]
            pub fn apply_validated(
                &self,
                state: &mut Option<State>,
                now: u64,
                op: Op,
                cost: u64,
            ) -> Decision {
                match self {
                    $(
                        Policy::$variant(p) => apply_typed(p, state, now, op, cost, State::$variant, |s| match s {
                            State::$variant(own) => Ok(own),
                            #[allow(unreachable_patterns)]
                            other => Err(other),
                        }),
                    )*
                }
            }
        }

        impl Policy {
            /// Books a `pace` of `cost` at `now` into the earliest slot **at or after
            /// `from`** (a time in µs, `>= now`; an earlier one counts as `now`), as a set of
            /// limits paced together needs: the time each limit would admit, then the latest
            /// of them, until every limit admits at the same time. The decision is admitted,
            /// its `delay` counted from `now` (the slot is `now + delay`), as is
            /// `reset_after`; `remaining` is the key's at `now`, after the booking. Only a
            /// slot past a window algorithm's horizon
            /// ([`MAX_BOOKED_WINDOWS`](fixed_window::MAX_BOOKED_WINDOWS) windows ahead) is
            /// refused instead, nothing booked, with the `retry_after` a `pace` has there.
            ///
            /// Algorithms that can book a slot later than their own earliest: `gcra`,
            /// `fixed_window`, `sliding_log`, `smooth_bursty`, `smooth_warming_up`. The
            /// others are an input error naming `op`: `pacer` and `exec_evenly` compute
            /// their delays from the moment of the request, `sliding_window` weighs only the
            /// previous window into the current one (so requests admitted before a booking
            /// in a later window could overrun it), and `concurrency` holds leases, which
            /// cannot be taken ahead.
            ///
            /// ```
            /// use paceline_core::Policy;
            /// let p: Policy = "fixed_window:limit=2,window=10s".parse()?;
            /// let mut s = None;
            /// // At 3 s, with a slot needed no earlier than 12 s: window [10 s, 20 s) opens at 10 s,
            /// // so the slot is 12 s itself, 9 s from now.
            /// let d = p.pace_from(&mut s, 3_000_000, 1, 12_000_000)?;
            /// assert_eq!((d.allowed, d.delay.as_secs()), (true, 9));
            /// # Ok::<(), paceline_core::InputError>(())
            /// ```
            pub fn pace_from(
                &self,
                state: &mut Option<State>,
                now: u64,
                cost: u64,
                from: u64,
            ) -> Result<Decision, InputError> {
                self.check_cost(Op::pace(), cost)?;
                check_now(now)?;
                check_now(from)?;
                let from = from.max(now);
                let decided = match self {
                    $(
                        Policy::$variant(p) => typed(state, State::$variant, |s| match s {
                            State::$variant(own) => Ok(own),
                            #[allow(unreachable_patterns)]
                            other => Err(other),
                        }, |own| p.pace_from(own, now, cost, from)),
                    )*
                };
                decided.ok_or_else(|| {
                    InputError::new(
                        "op",
                        format!(
                            "`{}` cannot book a slot ahead of its own earliest, so a set of \
                             several limits holding it cannot be paced; decide the set with \
                             `limit`, or pace that limit alone",
                            self.algorithm()
                        ),
                    )
                })
            }
        }

        /// The names of the eight algorithms, as written in specs.
        pub const ALGORITHMS: &[&str] = &[$( $variant::NAME, )*];
    };
}

policies! {
    Pacer => pacer,
    Gcra => gcra,
    FixedWindow => fixed_window,
    ExecEvenly => exec_evenly,
    SlidingLog => sliding_log,
    SlidingWindow => sliding_window,
    SmoothBursty => smooth_bursty,
    SmoothWarmingUp => smooth_warming_up,
    Concurrency => concurrency,
}

/// The latest time the engine accepts, 2^53 µs after the epoch (in 2255): times stay exact
/// in an `f64` (and in Redis's Lua), and adding any window or delay cannot overflow.
pub const MAX_NOW_US: u64 = 1 << 53;

/// The most cost one of a key's counts holds (2^50): a charge beyond it leaves the count
/// there. Charges ([`Op::Charge`]) count past the limit, so without a cap repeated ones could
/// grow a count without bound; 2^50 keeps counts exact in an `f64` (and in Redis's Lua) with
/// room for any cost on top, and is a debt no limit drains in less than a thousand windows.
pub const MAX_CHARGED: u64 = 1 << 50;

/// Parameter aliases accepted by every algorithm.
const ALIASES: &[(&str, &str)] = &[("qps", "rate")];

/// Runs `f` on the key's state as algorithm `A`'s own (see [`typed`]).
#[allow(clippy::too_many_arguments)]
#[inline]
fn apply_typed<A: Algorithm>(
    policy: &A,
    slot: &mut Option<State>,
    now: u64,
    op: Op,
    cost: u64,
    wrap: fn(A::State) -> State,
    unwrap: fn(State) -> Result<A::State, State>,
) -> Decision {
    typed(slot, wrap, unwrap, |own| policy.apply(own, now, op, cost))
}

/// Runs `f` on the key's state as an algorithm's own: `None` if the key is idle or holds
/// another algorithm's state. A foreign state stays in place unless `f` writes a state of
/// its own; `None` after `f` means it dropped the state.
#[inline]
fn typed<S, R>(
    slot: &mut Option<State>,
    wrap: fn(S) -> State,
    unwrap: fn(State) -> Result<S, State>,
    f: impl FnOnce(&mut Option<S>) -> R,
) -> R {
    // Take the key's state out if it belongs to this algorithm; a foreign state stays in
    // place unless this request writes a state of its own.
    let mut typed = match slot.take() {
        Some(s) => match unwrap(s) {
            Ok(own) => Some(own),
            Err(foreign) => {
                *slot = Some(foreign);
                None
            }
        },
        None => None,
    };
    let result = f(&mut typed);
    // `None` after an own state means the algorithm dropped it: the slot is already empty.
    if let Some(s) = typed {
        *slot = Some(wrap(s));
    }
    result
}

/// Checks that `now` (microseconds since the Unix epoch) is within the supported range: at
/// most [`MAX_NOW_US`], so that times stay exact in f64 arithmetic, here and in stores that
/// compute elsewhere (Lua).
// Stores (paceline-store) and the job queue (paceline-queue) check injected and server
// times with it; not part of the public API.
#[doc(hidden)]
#[inline]
pub fn check_now(now: u64) -> Result<(), InputError> {
    if now > MAX_NOW_US {
        return Err(now_out_of_range(now));
    }
    Ok(())
}

/// [`check_now`]'s error, out of the decision's way.
#[cold]
#[inline(never)]
fn now_out_of_range(now: u64) -> InputError {
    InputError::new(
        "now",
        format!("{now} µs is past the last supported time ({MAX_NOW_US} µs after the epoch, in the year 2255)"),
    )
}

impl Policy {
    /// Applies one request for one key at `now` (microseconds since the Unix epoch) to the
    /// key's `state` (`None` = idle), returning the decision.
    ///
    /// The state is changed only when the decision has side effects: a rejection without
    /// side effects and a peek leave it exactly as it was. After the call, the state may be
    /// dropped once `decision.reset_after` has passed: it is then equivalent to `None`.
    ///
    /// Errors: `cost` 0 or above 2^40, or a cost this policy can never admit
    /// (`cost > limit` for the window policies, `cost > burst` for `gcra`'s `limit`).
    #[inline]
    pub fn apply(
        &self,
        state: &mut Option<State>,
        now: u64,
        op: Op,
        cost: u64,
    ) -> Result<Decision, InputError> {
        self.check_cost(op, cost)?;
        check_now(now)?;
        Ok(self.apply_validated(state, now, op, cost))
    }

    /// Checks that `cost` is valid for `op` under this policy without applying anything.
    #[inline]
    pub fn check_cost(&self, op: Op, cost: u64) -> Result<(), InputError> {
        if cost == 0 || cost > MAX_COUNT || self.max_cost(op).is_some_and(|max| cost > max) {
            return Err(self.cost_error(op, cost));
        }
        if op == Op::Charge && matches!(self, Policy::Concurrency(_)) {
            return Err(InputError::new(
                "op",
                "`concurrency` counts held leases, which a charge cannot take or give back; \
                 charge a rate policy (gcra, fixed_window, ...) instead",
            ));
        }
        Ok(())
    }

    /// Why [`check_cost`](Policy::check_cost) refused `cost`: kept out of the hot path.
    #[cold]
    #[inline(never)]
    fn cost_error(&self, op: Op, cost: u64) -> InputError {
        if cost == 0 {
            return InputError::new("cost", "must be at least 1");
        }
        if cost > MAX_COUNT {
            return InputError::new(
                "cost",
                format!("{cost} is too large; the maximum is {MAX_COUNT}"),
            );
        }
        let max = self.max_cost(op).unwrap_or(MAX_COUNT);
        if let Op::Pace {
            max_wait: Some(wait),
        } = op
        {
            return InputError::beyond_policy(
                "cost",
                format!(
                    "{cost} can never be admitted by `{}` within a max_wait of {wait:?} (at most {max}); raise max_wait or lower the cost",
                    self.algorithm()
                ),
            );
        }
        InputError::beyond_policy(
            "cost",
            format!(
                "{cost} can never be admitted by `{}` with `{}` (at most {max} at once); \
                 split the request or raise the policy's limit",
                self.algorithm(),
                op.name()
            ),
        )
    }

    /// Builds a policy from an algorithm name and `(name, value)` pairs, with the same
    /// validation as the spec parser.
    pub fn from_parts<'a>(
        algorithm: &str,
        params: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Result<Policy, InputError> {
        Policy::build(algorithm.trim(), params.into_iter().collect())
    }
}

impl Policy {
    /// Gives back lease `id` of a [`concurrency`] key at `now` (µs since the Unix epoch):
    /// true if it was live, false if it is unknown, released or reclaimed already (no
    /// error: a late release changes nothing).
    ///
    /// Errors: a policy other than `concurrency` (it holds no leases).
    pub fn release(
        &self,
        state: &mut Option<State>,
        now: u64,
        id: u64,
    ) -> Result<bool, InputError> {
        let policy = self.concurrency()?;
        check_now(now)?;
        Ok(match state {
            Some(State::Concurrency(s)) => policy.release(s, now, id),
            _ => false,
        })
    }

    /// Renews lease `id` of a [`concurrency`] key at `now`, to live the policy's `lease`
    /// from now: its new expiry (µs since the Unix epoch), or `None` if the lease is not
    /// live (unknown, released or reclaimed already).
    ///
    /// Errors: a policy other than `concurrency`.
    pub fn extend(
        &self,
        state: &mut Option<State>,
        now: u64,
        id: u64,
    ) -> Result<Option<u64>, InputError> {
        let policy = self.concurrency()?;
        check_now(now)?;
        Ok(match state {
            Some(State::Concurrency(s)) => policy.extend(s, now, id),
            _ => None,
        })
    }

    /// The `concurrency` policy this is, or the error of one that holds no leases.
    pub fn concurrency(&self) -> Result<&Concurrency, InputError> {
        match self {
            Policy::Concurrency(c) => Ok(c),
            other => Err(InputError::new(
                "policy",
                format!(
                    "`{}` holds no leases; leases are taken under a `concurrency` policy, \
                     e.g. `concurrency:limit=10,lease=30s`",
                    other.algorithm()
                ),
            )),
        }
    }
}

impl FromStr for Policy {
    type Err = InputError;

    /// Parses `ALGORITHM:name=value,name=value`.
    fn from_str(spec: &str) -> Result<Policy, InputError> {
        let (algorithm, pairs) = spec::split_spec(spec)?;
        Policy::build(algorithm, pairs)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.algorithm())?;
        for (i, (name, value)) in self.params().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

/// A parameter value in a serde table: TOML and JSON give numbers, strings and booleans;
/// anything else is kept only to be refused by name.
#[derive(Deserialize)]
#[serde(untagged)]
enum ParamValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Other(serde::de::IgnoredAny),
}

impl ParamValue {
    fn into_text(self, name: &str) -> Result<String, InputError> {
        Ok(match self {
            ParamValue::Bool(b) => b.to_string(),
            ParamValue::Int(i) => i.to_string(),
            ParamValue::Float(f) => f.to_string(),
            ParamValue::Str(s) => s,
            ParamValue::Other(_) => {
                return Err(InputError::new(
                    name.to_string(),
                    "must be a number, a string or a boolean",
                ))
            }
        })
    }
}

impl Serialize for Policy {
    /// A table: `algorithm` and each parameter in canonical text form.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let params = self.params();
        let mut map = serializer.serialize_map(Some(params.len() + 1))?;
        map.serialize_entry("algorithm", self.algorithm())?;
        for (name, value) in &params {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Policy {
    /// A table with `algorithm` and the parameters (numbers, strings or booleans), or a
    /// spec string.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Policy, D::Error> {
        #[derive(Deserialize)]
        #[serde(
            untagged,
            expecting = "a policy: a spec string, or a table with `algorithm` and its parameters"
        )]
        enum Form {
            Spec(String),
            Table(BTreeMap<String, ParamValue>),
        }
        let built = match Form::deserialize(deserializer)? {
            Form::Spec(spec) => spec.parse(),
            Form::Table(mut table) => match table.remove("algorithm") {
                None => Err(InputError::new(
                    "algorithm",
                    format!("is missing; use one of: {}", ALGORITHMS.join(", ")),
                )),
                Some(algorithm) => algorithm.into_text("algorithm").and_then(|algorithm| {
                    let pairs = table
                        .into_iter()
                        .map(|(k, v)| v.into_text(&k).map(|v| (k, v)))
                        .collect::<Result<Vec<(String, String)>, InputError>>()?;
                    Policy::build(
                        algorithm.trim(),
                        pairs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect(),
                    )
                }),
            },
        };
        built.map_err(serde::de::Error::custom)
    }
}

/// Helpers shared by the algorithm modules.
pub(crate) mod util {
    /// `(delay - max_wait)` as the retry-after of a `pace` rejected for waiting too long: the
    /// delay of a reservation made later shrinks one-for-one with the time waited.
    pub(crate) fn retry_after_max_wait(delay_us: f64, max_wait_us: f64) -> f64 {
        (delay_us - max_wait_us).max(0.0)
    }

    /// Floors a non-negative float count to `u64`, clamping negatives and NaN to 0.
    pub(crate) fn floor_count(x: f64) -> u64 {
        if x.is_nan() || x <= 0.0 {
            0
        } else {
            // Truncation is the floor for positive numbers (and saturates on overflow).
            x as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One policy of each rate algorithm, a limit of 4 or about (pacer: max_burst 3).
    const RATE_SPECS: &[&str] = &[
        "pacer:rate=4/s,max_burst=3",
        "gcra:rate=4/s,burst=4",
        "fixed_window:limit=4,window=1s",
        "exec_evenly:points=4,duration=1s",
        "sliding_log:limit=4,window=1s",
        "sliding_window:limit=4,window=1s",
        "smooth_bursty:rate=4/s",
        "smooth_warming_up:rate=4/s,warmup=1s",
    ];

    #[test]
    fn a_charge_counts_past_the_limit_and_is_never_refused() {
        let t0 = 1_700_000_000_000_000;
        for spec in RATE_SPECS {
            let p: Policy = spec.parse().unwrap();
            let mut s = None;
            // Ten times the limit in one charge, then more on top: admitted now, every time.
            for cost in [40, 1, 7] {
                let d = p.apply(&mut s, t0, Op::Charge, cost).unwrap();
                assert!(d.allowed && d.delay.is_zero(), "{spec}: {d:?}");
                assert_eq!(d.remaining, 0, "{spec}: in debt, nothing remains");
            }
            // The debt refuses what the limit would have admitted on an idle key...
            let refused = p.apply(&mut s, t0, Op::Limit, 1).unwrap();
            assert!(!refused.allowed, "{spec}: {refused:?}");
            let peek = p.apply(&mut s.clone(), t0, Op::Peek, 1).unwrap();
            assert!(!peek.allowed, "{spec}");
            // ...and drains: once the key is idle again, it admits.
            let after = t0 + refused.reset_after.as_micros() as u64;
            let later = p.apply(&mut s, after.max(t0 + 1), Op::Limit, 1).unwrap();
            assert!(later.allowed, "{spec} at reset_after: {later:?}");
        }
    }

    #[test]
    fn a_charge_of_one_counts_as_an_admitted_request_does() {
        // Charging what a `limit` would admit leaves the key as that `limit` would (a
        // window's count, a TAT), so the next decision is the same.
        let t0 = 1_700_000_000_000_000;
        for spec in RATE_SPECS {
            let p: Policy = spec.parse().unwrap();
            let (mut charged, mut limited) = (None, None);
            let mut admitted = 0;
            for k in 0..3 {
                let l = p.apply(&mut limited, t0 + k, Op::Limit, 1).unwrap();
                if !l.allowed {
                    break;
                }
                admitted += 1;
                let c = p.apply(&mut charged, t0 + k, Op::Charge, 1).unwrap();
                assert_eq!(charged, limited, "{spec}");
                assert_eq!((c.remaining, c.reset_after), (l.remaining, l.reset_after));
            }
            assert!(admitted >= 1, "{spec}");
        }
    }

    #[test]
    fn a_charge_keeps_counts_within_max_charged() {
        let p: Policy = "fixed_window:limit=4,window=1h".parse().unwrap();
        let mut s = None;
        for _ in 0..2_000 {
            p.apply(&mut s, 0, Op::Charge, MAX_COUNT).unwrap();
        }
        match &s {
            Some(State::FixedWindow(own)) => assert_eq!(own.windows, vec![(0, MAX_CHARGED)]),
            other => panic!("not a fixed_window state: {other:?}"),
        }
        assert!(!p.apply(&mut s, 0, Op::Peek, 1).unwrap().allowed);
    }

    #[test]
    fn concurrency_refuses_a_charge_naming_op() {
        let p: Policy = "concurrency:limit=2,lease=1m".parse().unwrap();
        let e = p.apply(&mut None, 0, Op::Charge, 1).unwrap_err();
        assert_eq!(e.field(), "op");
        assert!(e.message().contains("concurrency"), "{}", e.message());
        assert_eq!(p.check_cost(Op::Charge, 1).unwrap_err().field(), "op");
    }

    #[test]
    fn a_charge_costs_at_most_max_count() {
        let p: Policy = "gcra:rate=1/s".parse().unwrap();
        assert!(p.check_cost(Op::Charge, MAX_COUNT).is_ok());
        assert_eq!(
            p.check_cost(Op::Charge, MAX_COUNT + 1).unwrap_err().field(),
            "cost"
        );
        assert_eq!(p.check_cost(Op::Charge, 0).unwrap_err().field(), "cost");
    }

    #[test]
    fn unknown_algorithm_lists_the_known_ones() {
        let e = "leaky:rate=1".parse::<Policy>().unwrap_err();
        assert_eq!(e.field(), "algorithm");
        for name in ALGORITHMS {
            assert!(e.message().contains(name));
        }
    }

    #[test]
    fn malformed_specs_are_errors() {
        assert_eq!("".parse::<Policy>().unwrap_err().field(), "spec");
        assert_eq!("gcra:rate".parse::<Policy>().unwrap_err().field(), "spec");
        assert_eq!(
            "gcra:rate=1,rate=2".parse::<Policy>().unwrap_err().field(),
            "rate"
        );
        assert_eq!(
            "gcra:rate=1,qps=2".parse::<Policy>().unwrap_err().field(),
            "qps"
        );
        assert_eq!(
            "gcra:rate=1,colour=red"
                .parse::<Policy>()
                .unwrap_err()
                .field(),
            "colour"
        );
        assert_eq!(
            "gcra:burst=2".parse::<Policy>().unwrap_err().field(),
            "rate"
        );
    }

    #[test]
    fn every_algorithm_round_trips_through_display_and_serde() {
        let specs = [
            "pacer:rate=10/s,max_burst=2,burst_allowance_factor=0.5",
            "gcra:rate=5/10s,burst=3",
            "fixed_window:limit=10,window=10s",
            "exec_evenly:points=10,duration=1s,min_delay=50ms",
            "sliding_log:limit=5,window=1m,min_interval=100ms,count_blocked=true",
            "sliding_window:limit=100,window=1h",
            "smooth_bursty:rate=5/s,max_burst_seconds=2",
            "smooth_warming_up:rate=2/s,warmup=4s,cold_factor=3",
            "concurrency:limit=10,lease=30s",
        ];
        for spec in specs {
            let p: Policy = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
            let again: Policy = p.to_string().parse().unwrap();
            assert_eq!(again, p, "{spec}");
            let json = serde_json::to_string(&p).unwrap();
            let back: Policy = serde_json::from_str(&json).unwrap();
            assert_eq!(back, p, "{json}");
            let from_spec_string: Policy = serde_json::from_str(&format!("\"{spec}\"")).unwrap();
            assert_eq!(from_spec_string, p);
        }
    }

    #[test]
    fn a_table_without_an_algorithm_or_with_a_nested_value_says_so() {
        let e = toml::from_str::<Policy>("rate = \"1/s\"").unwrap_err();
        assert!(
            e.message().contains("`algorithm`") && e.message().contains("gcra"),
            "{e}"
        );
        let e = toml::from_str::<Policy>("algorithm = \"gcra\"\nrate = [1]").unwrap_err();
        assert!(e.message().contains("`rate`: must be a number"), "{e}");
        let e = serde_json::from_str::<Policy>("5").unwrap_err();
        assert!(e.to_string().contains("a spec string, or a table"), "{e}");
    }

    #[test]
    fn toml_tables_use_the_same_validation() {
        #[derive(Deserialize)]
        struct Config {
            policies: BTreeMap<String, Policy>,
        }
        let cfg: Config = toml::from_str(
            r#"
            [policies.discord-roles]
            algorithm = "fixed_window"
            limit = 10
            window = "10s"

            [policies.api]
            algorithm = "gcra"
            rate = 20
            burst = 5
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.policies["discord-roles"].to_string(),
            "fixed_window:limit=10,window=10s"
        );
        assert_eq!(cfg.policies["api"].to_string(), "gcra:rate=20/s,burst=5");

        let bad = toml::from_str::<Config>(
            r#"
            [policies.x]
            algorithm = "fixed_window"
            limit = 0
            window = "10s"
            "#,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(bad.contains("`limit`"), "{bad}");
    }

    #[test]
    fn cost_is_validated_before_anything_changes() {
        let p: Policy = "fixed_window:limit=3,window=1s".parse().unwrap();
        let mut state = None;
        assert_eq!(
            p.apply(&mut state, 0, Op::Limit, 0).unwrap_err().field(),
            "cost"
        );
        assert!(!p
            .apply(&mut state, 0, Op::Limit, 0)
            .unwrap_err()
            .is_beyond_policy());
        let e = p.apply(&mut state, 0, Op::pace(), 4).unwrap_err();
        assert!(e.message().contains("never be admitted"), "{e}");
        assert!(e.is_beyond_policy(), "{e}");
        let waited = p.apply(&mut state, 0, Op::pace_within(Duration::from_secs(1)), 4);
        assert!(waited.is_err_and(|e| e.is_beyond_policy()));
        let huge = p
            .apply(&mut state, 0, Op::Limit, MAX_COUNT + 1)
            .unwrap_err();
        assert_eq!(huge.field(), "cost");
        assert!(!huge.is_beyond_policy(), "{huge}");
        assert_eq!(state, None);
    }

    #[test]
    fn a_foreign_state_is_ignored_and_kept_on_peek() {
        let window: Policy = "fixed_window:limit=1,window=1s".parse().unwrap();
        let gcra: Policy = "gcra:rate=1/s".parse().unwrap();
        let mut state = None;
        window.apply(&mut state, 0, Op::Limit, 1).unwrap();
        let before = state.clone();
        let peek = gcra.apply(&mut state, 0, Op::Peek, 1).unwrap();
        assert!(peek.allowed);
        assert_eq!(state, before);
        assert!(gcra.apply(&mut state, 0, Op::Limit, 1).unwrap().allowed);
        assert!(matches!(state, Some(State::Gcra(_))));
    }

    /// The policies whose slots can be booked ahead, with small limits so that traffic
    /// fills them.
    const BOOKABLE: &[&str] = &[
        "gcra:rate=5/s,burst=3",
        "fixed_window:limit=3,window=1s",
        "sliding_log:limit=3,window=1s,min_interval=50ms",
        "smooth_bursty:rate=5/s,max_burst_seconds=1",
        "smooth_warming_up:rate=5/s,warmup=2s",
    ];

    proptest::proptest! {
        /// From any state: booking from `now` is exactly a `pace`; booking from later
        /// books a slot at or after it where the policy (as the key was) admits, and
        /// none earlier from `from` on.
        #[test]
        fn pace_from_books_the_earliest_admitting_slot_from_its_time(
            which in 0..BOOKABLE.len(),
            steps in proptest::collection::vec((0u64..400_000, 1u64..=3, proptest::bool::ANY), 0..40),
            ahead in 0u64..5_000_000,
            cost in 1u64..=3,
        ) {
            let p: Policy = BOOKABLE[which].parse().unwrap();
            let mut state = None;
            let mut now = 1_000_000_000;
            for (step, c, pace) in steps {
                now += step;
                let op = if pace { Op::pace() } else { Op::Limit };
                p.apply(&mut state, now, op, c).unwrap();
            }
            let mut paced = state.clone();
            let mut booked = state.clone();
            proptest::prop_assert_eq!(
                p.pace_from(&mut booked, now, cost, now).unwrap(),
                p.apply(&mut paced, now, Op::pace(), cost).unwrap()
            );
            proptest::prop_assert_eq!(&booked, &paced);
            let from = now + ahead;
            let mut booked = state.clone();
            let d = p.pace_from(&mut booked, now, cost, from).unwrap();
            proptest::prop_assert!(d.allowed);
            let slot = now + crate::round_to_micros(d.delay);
            proptest::prop_assert!(slot >= from, "slot {} before {}", slot, from);
            let admits = |t: u64| p.apply(&mut state.clone(), t, Op::Peek, cost).unwrap().allowed;
            proptest::prop_assert!(admits(slot), "{} does not admit at its slot", BOOKABLE[which]);
            if slot > from {
                proptest::prop_assert!(!admits(slot - 1), "{} admits before its slot", BOOKABLE[which]);
            }
        }
    }

    #[test]
    fn pace_from_is_an_input_error_for_what_cannot_book_ahead() {
        for spec in [
            "pacer:rate=5/s",
            "exec_evenly:points=5,duration=1s",
            "sliding_window:limit=5,window=1s",
            "concurrency:limit=2,lease=1s",
        ] {
            let p: Policy = spec.parse().unwrap();
            let mut state = None;
            let e = p.pace_from(&mut state, 0, 1, 1_000).unwrap_err();
            assert_eq!(e.field(), "op", "{spec}");
            assert!(e.message().contains(p.algorithm()), "{e}");
            assert_eq!(state, None);
        }
    }
}

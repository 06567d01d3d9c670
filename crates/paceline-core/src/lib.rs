//! # paceline-core: the policy engine
//!
//! Eight rate-limiting and pacing algorithms, and a cap on requests in flight, as pure transitions over one key's state, with
//! time passed in (microseconds since the Unix epoch) and never read from a clock. Stores
//! persist the state: the memory store calls [`Policy::apply`], the Redis store runs Lua twins
//! of the same transitions. Users normally reach this crate through the `paceline` crate's
//! `Limiter`.
//!
//! | algorithm | what it is |
//! |---|---|
//! | [`pacer`](policy::pacer) | the distributed pacer: spread work at an exact rate, with a burst allowance |
//! | [`gcra`](policy::gcra) | generic cell rate algorithm (token bucket) |
//! | [`fixed_window`](policy::fixed_window) | aligned windows with a count each |
//! | [`exec_evenly`](policy::exec_evenly) | a window whose admitted actions are spread over the rest of it |
//! | [`sliding_log`](policy::sliding_log) | an exact sliding window over a log of requests |
//! | [`sliding_window`](policy::sliding_window) | an approximate sliding window from two counters |
//! | [`smooth_bursty`](policy::smooth_bursty) | Guava's `RateLimiter.create(rate)` |
//! | [`smooth_warming_up`](policy::smooth_warming_up) | Guava's `RateLimiter.create(rate, warmup, coldFactor)` |
//! | [`concurrency`](policy::concurrency) | at most `limit` in flight, each holding a lease it gives back |
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let policy: Policy = "gcra:rate=10/s,burst=5".parse()?;
//! let mut state = None; // the key is idle
//! let now = 1_700_000_000_000_000; // microseconds since the Unix epoch
//! let decision = policy.apply(&mut state, now, Op::Limit, 1)?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 4);
//! # Ok::<(), paceline_core::InputError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod decision;
mod error;
pub mod policy;
pub mod spec;

pub use clock::{Clock, ManualClock, Sleep};
pub use decision::{Decision, Fallback, Op};
// Time conversions the stores and front ends share (hidden: not part of the public API).
#[doc(hidden)]
pub use decision::{duration_to_micros, micros_to_duration, round_to_micros};
pub use error::{Error, InputError, StoreError, StoreErrorKind};
pub use policy::{Policy, State, ALGORITHMS};
pub use spec::Rate;

//! # paceline: may I act now, and if not, when?
//!
//! Distributed rate limiting and pacing. A [`Limiter`] applies one of eight algorithms
//! ([`Policy`]) to any number of keys whose state lives in a [`Store`]: in this process
//! ([`MemoryStore`], the default), or in Redis / Redis Cluster, shared by many processes
//! (`paceline_redis::RedisStore`, in the `paceline-redis` crate), behind the same [`Store`]
//! trait and with the same decisions.
//!
//! * **pace**: never drop work; reserve a slot and get the delay to sleep, so that workers
//!   together hold a target rate exactly;
//! * **limit**: admit or reject now, with a retry-after, without side effects on rejection.
//!
//! ```
//! use paceline::Limiter;
//! use std::time::Duration;
//!
//! // A token bucket: 10 per second, bursts of up to 5.
//! let limiter = Limiter::from_spec("gcra:rate=10/s,burst=5")?;
//! for _ in 0..5 {
//!     assert!(limiter.limit_sync("user:42", 1)?.allowed);
//! }
//! let sixth = limiter.limit_sync("user:42", 1)?;
//! assert!(!sixth.allowed);
//! assert!(sixth.retry_after().unwrap() <= Duration::from_millis(100));
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! Policies are written as specs (`ALGORITHM:name=value,...`) or serde tables; see
//! [`policy`] for the algorithms, their parameters and the exact contract every store
//! meets.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod limiter;
pub mod store;

pub use clock::SystemClock;
pub use limiter::Limiter;
pub use paceline_core::{
    duration_to_micros, micros_to_duration, policy, round_to_micros, spec, Clock, Decision, Error,
    Fallback, InputError, ManualClock, Op, Policy, Rate, Sleep, State, StoreError, StoreErrorKind,
    ALGORITHMS,
};
pub use store::{MemoryStore, MemoryStoreBuilder, Store, SyncStore};

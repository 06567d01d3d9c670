//! # paceline: may I act now, and if not, when?
//!
//! Distributed rate limiting and pacing. A [`Limiter`] applies one of eight algorithms, or a
//! cap on requests in flight ([`Policy`]), to any number of keys whose state lives in a
//! [`Store`]: in this process ([`MemoryStore`], the default), or in Redis / Redis Cluster,
//! shared by many processes
//! ([`redis::RedisStore`], feature `redis`), behind the same trait and with the same
//! decisions.
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
//! ## Installation
//!
//! | you want | add |
//! |---|---|
//! | limits in one process | `cargo add paceline` |
//! | limits shared through Redis / Redis Cluster | `cargo add paceline -F redis` |
//! | a rate-limited job queue (groups, leases, retries) | `cargo add paceline -F queue` |
//! | a client of an API whose limits come in response headers (Discord, GitHub, IETF `RateLimit`) | `cargo add paceline -F client` (`-F client,redis` to share them between processes) |
//! | limits on the requests a server (axum, or any tower service of `http` requests) takes | `cargo add paceline -F tower` |
//!
//! ## Any store, from a URL
//!
//! [`open`] gives a [`SharedStore`] (`Arc<dyn Store>`) for `memory`, `redis://...`,
//! `rediss://...` or `redis-cluster://...`, so the choice of store can be configuration:
//!
//! ```
//! use paceline::{open, Limiter, StoreOptions};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! let url = std::env::var("LIMITS_STORE").unwrap_or_else(|_| "memory".into());
//! let store = open(&url, &StoreOptions::new()).await?;
//! let limiter = Limiter::with_store("fixed_window:limit=10,window=10s".parse()?, store);
//! assert!(limiter.limit("guild:42", 1).await?.allowed);
//! # Ok(()) }
//! ```
//!
//! ## Several limits at once
//!
//! Real limits come in layers, e.g. per second *and* per day for a tenant. [`Limits`]
//! decides such a set as one: admitted only if every limit admits; refused, no limit
//! changes, and the decision names the limits that refused and the longest retry-after.
//!
//! ```
//! use paceline::{Limits, MemoryStore};
//! let store = MemoryStore::new();
//! let tenant = Limits::new()
//!     .with("gcra:rate=10/s,burst=10".parse()?, "{tenant42}:second")
//!     .with("fixed_window:limit=10000,window=1d".parse()?, "{tenant42}:day");
//! let decision = tenant.limit_sync(&store, 1)?;
//! assert!(decision.allowed());
//! assert_eq!(decision.limits[1].remaining, 9_999);
//! // Paced, a set books the earliest time at which every limit admits, on every limit.
//! let paced = tenant.pace_sync(&store, 1, None)?;
//! assert!(paced.allowed() && paced.limits.iter().all(|l| l.delay == paced.decision.delay));
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! Policies are written as specs (`ALGORITHM:name=value,...`), serde tables, or typed, with
//! the same validation; see [`policy`] for the algorithms, their parameters and the exact
//! contract every store meets.
//!
//! ```
//! use paceline::policy::{FixedWindow, Gcra};
//! use paceline::{Limiter, Rate};
//! use std::time::Duration;
//!
//! let api = Limiter::new(Gcra::new(Rate::per_second(10)?, 5)?.into());
//! let discord = Limiter::new(FixedWindow::new(10, Duration::from_secs(10))?.into());
//! assert!(api.limit_sync("user:42", 1)?.allowed);
//! assert_eq!(discord.policy().to_string(), "fixed_window:limit=10,window=10s");
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! ## A rate-limited job queue (feature `queue`)
//!
//! Jobs belong to groups; each group's policy limits the times its jobs *start*, whatever
//! the backlog. Producers learn when a job is expected to start; workers lease jobs with
//! fencing tokens. See [`queue`].
//!
//! ## The crates behind it
//!
//! `paceline` re-exports what users need from `paceline-core` (the policy engine: pure
//! transitions with time passed in) and `paceline-store` (the [`Store`] seam, the memory and
//! Redis stores, [`open`], the [`Limiter`]). Depend on those directly only to build a front
//! end of your own on the seam.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use paceline_core::{policy, spec};
pub use paceline_store::{
    check_store_url, open, without_credentials, CachedRefusals, Clock, Decision, Error,
    FailurePolicy, Fallback, InputError, Limiter, Limits, ManualClock, MemoryStore,
    MemoryStoreBuilder, Op, Policy, Rate, Request, SetDecision, SharedStore, Sleep, State, Store,
    StoreError, StoreErrorKind, StoreFuture, StoreOptions, SyncStore, SystemClock, TokioClock,
    ALGORITHMS, DEFAULT_REFUSALS, MAX_LIMITS,
};

/// The rate-limited job queue (feature `queue`): see [`paceline_queue`]'s docs, re-exported
/// here whole. With the `redis` feature too, `Queue::open` takes Redis URLs: every process
/// that opens the same queue shares it (`RedisQueue`).
///
/// ```
/// use paceline::queue::{NewJob, Queue, QueueConfig};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::queue::QueueError> {
/// // Discord: 10 role updates per 10 s per server.
/// let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?);
/// let queue = Queue::in_memory("discord-roles", config)?;
/// let job = queue.enqueue(NewJob::new("guild:1", b"grant 42 7".to_vec())).await?;
/// println!("expected to start at {} µs", job.estimated_start);
/// let leased = queue.lease("worker-1", 10, None, Duration::from_secs(1)).await?;
/// queue.ack(&leased[0].id, &leased[0].token).await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "queue")]
pub mod queue {
    pub use paceline_queue::*;
}

/// The API client limiter (feature `client`): see [`paceline_client`]'s docs, re-exported
/// here whole. Requests wait in per-bucket queues learned from response headers, one
/// pioneer learns an unknown bucket, a global limit paces everything a token sends, and
/// refusals pause what they name and requeue the request.
///
/// ```
/// use paceline::client::headers::Discord;
/// use paceline::client::{After, Client, ClientConfig, Route};
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), paceline::client::ClientError> {
/// let discord = Client::new(ClientConfig::discord(), Discord);
/// let mut permit = discord.acquire(Route::discord("PATCH", "/guilds/1/members/2")).await?;
/// permit.sent();
/// // ... send the request; then hand its status and headers back:
/// let headers = paceline::client::http::HeaderMap::new();
/// assert!(matches!(permit.complete(204, &headers, None), After::Done));
/// # Ok(()) }
/// ```
#[cfg(feature = "client")]
pub mod client {
    pub use paceline_client::*;
}

/// Protecting a service (feature `tower`): see [`paceline_tower`]'s docs, re-exported here
/// whole. A tower layer decides every request against a set of limits on any store, with
/// the IETF `RateLimit` headers and RFC 9457 problem details.
///
/// ```
/// use paceline::tower::{Key, RateLimitLayer};
/// use paceline::MemoryStore;
/// use std::sync::Arc;
/// let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
///     .limit("per-second", "gcra:rate=10/s,burst=20".parse()?, Key::header("x-api-key"))
///     .limit("in-flight", "concurrency:limit=4,lease=30s".parse()?, Key::header("x-api-key"))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), paceline::InputError>(())
/// ```
#[cfg(feature = "tower")]
pub mod tower {
    pub use paceline_tower::*;
}

/// The Redis and Redis Cluster store (feature `redis`).
///
/// ```no_run
/// use paceline::redis::RedisStore;
/// use paceline::{FailurePolicy, Limiter};
/// use std::sync::Arc;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::Error> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
///     .prefix("myapp")
///     .auto_batch(std::time::Duration::ZERO)
///     .connect()
///     .await?;
/// let limiter = Limiter::with_store("gcra:rate=10/s,burst=5".parse()?, Arc::new(store));
/// println!("{:?}", limiter.limit("user:42", 1).await?);
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
pub mod redis {
    pub use paceline_store::redis::{RedisStore, RedisStoreBuilder, MAX_DECISIONS_PER_CALL};
}

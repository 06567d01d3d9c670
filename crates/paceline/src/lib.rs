//! # paceline: may I act now, and if not, when?
//!
//! Distributed rate limiting and pacing. A [`Limiter`] applies a [`Policy`] (one of eight
//! algorithms, or a cap on requests in flight) to any number of keys, whose state lives in a
//! [`Store`]: in this process, or in Redis / Redis Cluster shared by many processes, behind
//! the same trait and with the same decisions. Every call answers with a [`Decision`]:
//!
//! * **pace**: never drop work. Reserve the earliest slot the limit allows and get the delay
//!   to sleep, so that workers together hold a target rate exactly;
//! * **limit**: admit or refuse now, with a retry-after, and no side effect on a refusal.
//!
//! ```
//! use paceline::Limiter;
//! use std::time::Duration;
//!
//! // A token bucket: 10 per second, bursts of up to 5, per key.
//! let limiter = Limiter::from_spec("gcra:rate=10/s,burst=5")?;
//! for _ in 0..5 {
//!     assert!(limiter.limit_sync("user:42", 1)?.allowed);
//! }
//! let sixth = limiter.limit_sync("user:42", 1)?;
//! assert!(!sixth.allowed);
//! assert!(sixth.delay <= Duration::from_millis(100)); // the retry-after
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! ## Adding it to a project
//!
//! Until paceline is published, depend on a clone of its repository by path (or on the
//! repository by `git`): `cargo add --path ../paceline/crates/paceline` for a clone beside
//! your project. Once it is published: `cargo add paceline`. The async API runs on tokio
//! (`cargo add tokio -F macros,rt-multi-thread` for `#[tokio::main]`).
//!
//! | feature | adds |
//! |---|---|
//! | (none) | limits in one process: [`Limiter`], [`Limits`], [`store::MemoryStore`] |
//! | `redis` | limits shared through Redis / Redis Cluster: [`store::RedisStore`], and `redis://`, `rediss://`, `redis-cluster://` URLs in [`open`] (with `queue` and `client`, their state in Redis too) |
//! | `queue` | the rate-limited job queue: [`queue`](mod@queue) |
//! | `client` | a client of an API whose limits come in response headers (Discord, GitHub, IETF `RateLimit`): [`client`](mod@client) |
//! | `reqwest` | the client limiter as `reqwest-middleware` middleware: `client::middleware` |
//! | `tower` | limits on the requests a server takes, as a tower layer: [`tower`](mod@tower) (with `client`, also `client::layer`) |
//!
//! ## Where things are
//!
//! The root holds what a first program needs; everything else has one path, in a module:
//!
//! | path | what |
//! |---|---|
//! | [`Limiter`], [`Limits`] | one policy over many keys; several limits decided as one |
//! | [`Policy`], [`Decision`] | what to apply (parsed from a spec such as `gcra:rate=10/s,burst=5`), and its answer |
//! | [`Store`], [`open`] | where keys' state lives; any store from a URL (`memory`, `redis://...`) |
//! | [`Error`], [`InputError`], [`StoreError`] | what can go wrong: bad input (naming the field), or a store that failed |
//! | [`policy`] | the algorithms as typed values ([`policy::Gcra`], [`policy::FixedWindow`], ...) and [`policy::Rate`] |
//! | [`store`] | the stores ([`store::MemoryStore`], [`store::RedisStore`]), their options, failure policies, sets' decisions, the cache of refusals |
//! | [`time`] | clocks: the system's, tokio's, and [`time::ManualClock`] for tests and simulations |
//! | [`queue`](mod@queue) | the rate-limited job queue (feature `queue`) |
//! | [`client`](mod@client) | the API client limiter (feature `client`) |
//! | [`tower`](mod@tower) | a tower layer that protects a server (feature `tower`) |
//!
//! The repository's guides (`docs/library.md`, `docs/policies.md`, `docs/queue.md`,
//! `docs/client.md`, `docs/tower.md`, `docs/service.md`, `docs/simulate.md`) walk through
//! each part; every Rust snippet in them is compiled and run by this crate's tests.
//!
//! ## Any store, from a URL
//!
//! [`open`] gives a [`store::SharedStore`] (`Arc<dyn Store>`) for `memory`, `redis://...`,
//! `rediss://...` or `redis-cluster://...`, so the choice of store can be configuration:
//!
//! ```
//! use paceline::store::StoreOptions;
//! use paceline::{open, Limiter};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), paceline::Error> {
//!     let url = std::env::var("LIMITS_STORE").unwrap_or_else(|_| "memory".into());
//!     let store = open(&url, &StoreOptions::new()).await?;
//!     let limiter = Limiter::with_store("fixed_window:limit=10,window=10s".parse()?, store);
//!     assert!(limiter.limit("guild:42", 1).await?.allowed);
//!     Ok(())
//! }
//! ```
//!
//! ## Several limits at once
//!
//! Real limits come in layers, e.g. per second *and* per day for a tenant. [`Limits`]
//! decides such a set as one: admitted only if every limit admits; refused, no limit
//! changes, and the answer names the limits that refused and the longest retry-after.
//!
//! ```
//! use paceline::store::MemoryStore;
//! use paceline::Limits;
//!
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
//! ## The crates behind it
//!
//! `paceline` re-exports what users need from `paceline-core` (the policy engine: pure
//! transitions with time passed in), `paceline-store` (the [`Store`] seam, the memory and
//! Redis stores, [`open`], the [`Limiter`]), `paceline-queue`, `paceline-client` and
//! `paceline-tower`. Depend on those directly only to build a front end of your own on
//! them (their pure state machines, spec parsers and validation limits live there).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The map above links every module; those of features left out of a build have no page.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "queue",
        feature = "client",
        feature = "tower"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

pub use paceline_core::{Decision, Error, InputError, Policy, StoreError};
pub use paceline_store::{open, Limiter, Limits, Store};

pub mod policy {
    //! The algorithms, as typed values, and the rates they take.
    //!
    //! A [`Policy`](crate::Policy) is usually parsed from a spec (`ALGORITHM:name=value,...`) or a serde table
    //! (`{ algorithm = "gcra", rate = "10/s", burst = 5 }`); the types here build the same
    //! policies in code, with the same validation, and convert into a [`Policy`](crate::Policy) with `into()`.
    //!
    //! | algorithm | type | what it does |
    //! |---|---|---|
    //! | `pacer` | [`Pacer`] | pacing at a rate, with a burst allowance |
    //! | `gcra` | [`Gcra`] | a token bucket (the generic cell rate algorithm) |
    //! | `fixed_window` | [`FixedWindow`] | `limit` per window, windows aligned to the clock |
    //! | `exec_evenly` | [`ExecEvenly`] | `points` per `duration`, spread evenly |
    //! | `sliding_log` | [`SlidingLog`] | `limit` per window sliding with each request, exact |
    //! | `sliding_window` | [`SlidingWindow`] | `limit` per window, the previous window weighted |
    //! | `smooth_bursty` | [`SmoothBursty`] | Guava's `SmoothBursty` |
    //! | `smooth_warming_up` | [`SmoothWarmingUp`] | Guava's `SmoothWarmingUp`: slower after idle |
    //! | `concurrency` | [`Concurrency`] | at most `limit` in flight, each holding a lease |
    //!
    //! Each algorithm's exact contract (the state it keeps, the formulas, what every store must
    //! answer) is the documentation of its module in `paceline-core` (`paceline_core::policy`);
    //! the repository's `docs/policies.md` has every parameter with its default.
    //!
    //! ```
    //! use paceline::policy::{FixedWindow, Gcra, Rate};
    //! use paceline::{Limiter, Policy};
    //! use std::time::Duration;
    //!
    //! let api: Policy = Gcra::new(Rate::per_second(10)?, 5)?.into();
    //! assert_eq!(api, "gcra:rate=10/s,burst=5".parse()?);
    //! let discord = Limiter::new(FixedWindow::new(10, Duration::from_secs(10))?.into());
    //! assert_eq!(discord.policy().to_string(), "fixed_window:limit=10,window=10s");
    //! assert!(discord.limit_sync("guild:42", 1)?.allowed);
    //! # Ok::<(), paceline::Error>(())
    //! ```

    #[doc(inline)]
    pub use paceline_core::policy::fixed_window::MAX_BOOKED_WINDOWS;
    pub use paceline_core::policy::{
        Concurrency, ExecEvenly, FixedWindow, Gcra, Pacer, SlidingLog, SlidingWindow, SmoothBursty,
        SmoothWarmingUp, State, ALGORITHMS,
    };
    pub use paceline_core::Rate;
}

pub mod store {
    //! Where keys' state lives: the stores, how to open and tune them, and what they answer.
    //!
    //! Every store implements [`Store`](crate::Store) and gives the same decisions for the same
    //! requests at the same times:
    //!
    //! * [`MemoryStore`]: this process's memory (sharded; idle keys are swept), also a
    //!   [`SyncStore`] that answers synchronous calls (`limit_sync`, `pace_sync`, ...);
    //! * [`RedisStore`] (feature `redis`): Redis or Redis Cluster, shared by every process
    //!   that opens it, one atomic call per decision, with an explicit [`FailurePolicy`] for
    //!   when Redis fails;
    //! * [`CachedRefusals`]: any store behind a cache that remembers its refusals until their
    //!   retry-after, so that a client that keeps retrying costs the store nothing.
    //!
    //! [`open`](crate::open) builds any of them from a URL and [`StoreOptions`]; a front end
    //! holds the result as a [`SharedStore`].
    //!
    //! ```
    //! use paceline::store::{MemoryStore, Op, Request};
    //! use paceline::{Policy, Store};
    //!
    //! #[tokio::main]
    //! async fn main() -> Result<(), paceline::Error> {
    //!     let store = MemoryStore::new();
    //!     let policy: Policy = "gcra:rate=10/s,burst=2".parse()?;
    //!     // Many decisions in one call (Redis: one round trip per node).
    //!     let batch = [
    //!         Request::new(&policy, "alice", Op::Limit, 1),
    //!         Request::new(&policy, "alice", Op::Limit, 1),
    //!         Request::new(&policy, "alice", Op::Limit, 1),
    //!     ];
    //!     let allowed: Vec<bool> = store
    //!         .decide_batch(&batch)
    //!         .await
    //!         .into_iter()
    //!         .map(|d| d.map(|d| d.allowed))
    //!         .collect::<Result<_, _>>()?;
    //!     assert_eq!(allowed, [true, true, false]); // a refusal is a decision, not an error
    //!     Ok(())
    //! }
    //! ```

    pub use paceline_core::{Fallback, Op, StoreErrorKind};
    #[cfg(feature = "redis")]
    pub use paceline_store::redis::{Outage, RedisStore, RedisStoreBuilder};
    pub use paceline_store::secret::TokenKey;
    pub use paceline_store::set::SetDecision;
    pub use paceline_store::{
        check_store_url, without_credentials, CachedRefusals, FailurePolicy, MemoryStore,
        MemoryStoreBuilder, Request, SharedStore, StoreFuture, StoreOptions, SyncStore,
        DEFAULT_REFUSALS, MAX_LIMITS,
    };
}

pub mod time {
    //! Clocks: where a store reads "now", and how it waits.
    //!
    //! Stores read time through a [`Clock`]: [`SystemClock`] by default, [`TokioClock`] to
    //! follow tokio's time (paused in tests), or a [`ManualClock`] that moves only when told
    //! to, so that tests and simulations run instantly and give the same answers every time.
    //! (A Redis store reads the Redis server's clock unless it is given one.)
    //!
    //! ```
    //! use paceline::store::MemoryStore;
    //! use paceline::time::{Clock, ManualClock};
    //! use paceline::Limiter;
    //! use std::sync::Arc;
    //! use std::time::Duration;
    //!
    //! let clock = ManualClock::new(0);
    //! let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    //! let limiter = Limiter::with_store("fixed_window:limit=1,window=1s".parse()?, store);
    //! assert!(limiter.limit_sync("k", 1)?.allowed);
    //! assert!(!limiter.limit_sync("k", 1)?.allowed);
    //! clock.advance(Duration::from_secs(1)); // the next window, without sleeping
    //! assert!(limiter.limit_sync("k", 1)?.allowed);
    //! assert_eq!(clock.now_micros(), 1_000_000);
    //! # Ok::<(), paceline::Error>(())
    //! ```

    pub use paceline_core::{Clock, ManualClock, Sleep};
    pub use paceline_store::{SystemClock, TokioClock};
}

#[cfg(feature = "queue")]
pub mod queue {
    //! The rate-limited job queue (feature `queue`).
    //!
    //! Jobs belong to groups (a Discord server, a customer, an upstream account); each group's
    //! policy limits the times its jobs *start*, whatever the backlog. Producers learn when a
    //! job is expected to start ([`Enqueued::estimated_start`]); workers lease jobs with
    //! fencing tokens ([`LeaseToken`]) and acknowledge them, fail them (retry later, or pause
    //! the whole group for an upstream's retry-after), or let a [`Worker`] do it for them.
    //! [`Queue::in_memory`] keeps a queue in this process; with the `redis` feature,
    //! [`Queue::open`] on a Redis URL shares it between every process that opens it, and
    //! [`QueueConfig::partitions`] spreads one busy queue over a Redis Cluster's primaries
    //! ([`Partitioned`], its groups placed by [`partition_of`]).
    //!
    //! ```
    //! use paceline::queue::{NewJob, Queue, QueueConfig};
    //! use std::time::Duration;
    //!
    //! #[tokio::main]
    //! async fn main() -> Result<(), paceline::queue::QueueError> {
    //!     // Discord: 10 role updates per 10 s per server.
    //!     let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?);
    //!     let queue = Queue::in_memory("discord-roles", config)?;
    //!     let job = queue.enqueue(NewJob::new("guild:1", b"grant 42 7".to_vec())).await?;
    //!     println!("expected to start at {} µs", job.estimated_start);
    //!     let leased = queue.lease("worker-1", 10, None, Duration::from_secs(1)).await?;
    //!     queue.ack(&leased[0].id, &leased[0].token).await?;
    //!     assert_eq!(queue.stats().await?.totals.acked, 1);
    //!     Ok(())
    //! }
    //! ```

    pub use paceline_queue::core::{PolicySource, UNTIL_RESUMED};
    pub use paceline_queue::partitioned::partition_of;
    pub use paceline_queue::schedule::{Schedule, ScheduleInfo};
    pub use paceline_queue::token::NotAToken;
    #[cfg(feature = "redis")]
    pub use paceline_queue::RedisQueue;
    pub use paceline_queue::{
        Enqueued, Event, EventKind, Events, FailOutcome, Failure, GroupStats, JobInfo, JobState,
        LeaseToken, Leased, MemoryQueue, NewJob, Partitioned, Queue, QueueBackend, QueueConfig,
        QueueCore, QueueError, QueueFuture, Report, Stats, Totals, Watched, Worker,
    };
}

#[cfg(feature = "client")]
pub mod client {
    //! The API client limiter (feature `client`): limits learned from response headers.
    //!
    //! For a client of an API that tells its limits in its answers (Discord, GitHub, any API
    //! with the IETF `RateLimit` fields, or only `Retry-After`): requests wait in per-bucket
    //! queues learned from those headers, one *pioneer* learns an unknown bucket, a global
    //! limit paces everything a token sends, and a refusal pauses what it names and sends the
    //! request again. [`Client::acquire`] gives a [`Permit`]; hand the answer's status and
    //! headers back with [`Permit::complete`]. The adapters do this for you:
    //! `middleware` (feature `reqwest`) for `reqwest-middleware`, `layer` (features `client`
    //! and `tower`) for any tower `http` client.
    //!
    //! ```
    //! use paceline::client::headers::Discord;
    //! use paceline::client::http::HeaderMap;
    //! use paceline::client::{After, Client, ClientConfig, Route};
    //!
    //! #[tokio::main]
    //! async fn main() -> Result<(), paceline::client::ClientError> {
    //!     let discord = Client::new(ClientConfig::discord(), Discord);
    //!     let mut permit = discord.acquire(Route::discord("PATCH", "/guilds/1/members/2")).await?;
    //!     permit.sent();
    //!     // ... send the request; then hand its status and headers back:
    //!     let headers = HeaderMap::new();
    //!     assert!(matches!(permit.complete(204, &headers, None), After::Done));
    //!     Ok(())
    //! }
    //! ```

    pub use paceline_client::knowledge::BucketView;
    #[cfg(feature = "tower")]
    pub use paceline_client::layer;
    #[cfg(feature = "reqwest")]
    pub use paceline_client::middleware;
    #[cfg(feature = "redis")]
    pub use paceline_client::redis::RedisKnowledge;
    pub use paceline_client::{
        headers, hooks, http, After, Client, ClientConfig, ClientError, Origin, Permit,
        RateLimited, RequestOptions, Route, Then, Waiting,
    };
}

#[cfg(feature = "tower")]
pub mod tower {
    //! Protecting a service (feature `tower`): a tower layer that decides every request.
    //!
    //! A [`RateLimitLayer`] decides each request against a set of limits (per second *and* per
    //! day *and* in flight, say), keyed by what [`Key`] reads from the request (peer IP behind
    //! trusted proxies, a header, an extension), on any store: in this process, or in Redis for
    //! every instance. A refusal is a `429` with `Retry-After`, the IETF `RateLimit` /
    //! `RateLimit-Policy` headers and an RFC 9457 problem details body.
    //!
    //! ```
    //! use paceline::store::MemoryStore;
    //! use paceline::tower::{Key, RateLimitLayer};
    //! use std::sync::Arc;
    //!
    //! let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
    //!     .limit("per-second", "gcra:rate=10/s,burst=20".parse()?, Key::header("x-api-key"))
    //!     .limit("in-flight", "concurrency:limit=4,lease=30s".parse()?, Key::header("x-api-key"))
    //!     .build()?;
    //! // app.layer(layer): axum, hyper, tonic, any tower service of `http` requests.
    //! # let _ = layer;
    //! # Ok::<(), paceline::InputError>(())
    //! ```

    pub use paceline_tower::{
        headers, AxumBody, Bodies, Builder, Choice, Forwarded, Head, Key, Limited, LimitedBody,
        MissingKey, RateLimit, RateLimitLayer, ResponseFuture, StoreFailure,
    };
}

// Every Rust snippet of the README and the guides, compiled and run as a doc test (those
// that need a Redis or the network are compiled only here, and run by tests/examples.rs).
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "queue",
    feature = "client",
    feature = "reqwest",
    feature = "tower"
))]
mod guides {
    #[doc = include_str!("../../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../../docs/library.md")]
    pub struct Library;
    #[doc = include_str!("../../../docs/policies.md")]
    pub struct Policies;
    #[doc = include_str!("../../../docs/service.md")]
    pub struct Service;
    #[doc = include_str!("../../../docs/queue.md")]
    pub struct Queue;
    #[doc = include_str!("../../../docs/client.md")]
    pub struct Client;
    #[doc = include_str!("../../../docs/tower.md")]
    pub struct Tower;
    #[doc = include_str!("../../../docs/simulate.md")]
    pub struct Simulate;
}

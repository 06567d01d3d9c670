//! # paceline-redis: one limit, shared by every process
//!
//! A [`RedisStore`] keeps paceline's per-key state in Redis or Redis Cluster, so any number
//! of workers on any number of machines hold one limit together, with exactly the decisions
//! the in-memory store makes. Each decision is one atomic call of a Lua script: the twin of
//! the Rust algorithm (`lua/<algorithm>.lua`), run on the key's Redis node with the server's
//! clock.
//!
//! ```no_run
//! use paceline::Limiter;
//! use paceline_redis::{FailurePolicy, RedisStore};
//! use std::sync::Arc;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! // 10 role updates per 10 seconds per Discord guild, across every worker.
//! let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
//!     .connect()
//!     .await?;
//! let limiter = Limiter::with_store("fixed_window:limit=10,window=10s".parse()?, Arc::new(store));
//! let d = limiter.acquire("guild:42", 1).await?; // waits for this worker's slot
//! assert!(d.allowed);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod args;
mod batch;
mod connection;
mod failure;
mod script;
mod store;

pub use connection::without_credentials;
pub use failure::FailurePolicy;
pub use store::{RedisStore, RedisStoreBuilder, Request, MAX_DECISIONS_PER_CALL};

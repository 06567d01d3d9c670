//! The Redis and Redis Cluster store (feature `redis`): one limit, shared by every process.
//!
//! A [`RedisStore`] keeps paceline's per-key state in Redis or Redis Cluster, so any number
//! of workers on any number of machines hold one limit together, with exactly the decisions
//! the in-memory store makes. Each decision is one atomic call of a Lua script: the twin of
//! the Rust algorithm (`lua/<algorithm>.lua`), run on the key's Redis node with the server's
//! clock. Most code opens it through [`open`](crate::open) with a `redis://` URL; the
//! builder here has every setting.
//!
//! ```no_run
//! use paceline_store::redis::RedisStore;
//! use paceline_store::{FailurePolicy, Limiter};
//! use std::sync::Arc;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline_store::Error> {
//! // 10 role updates per 10 seconds per Discord guild, across every worker.
//! let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
//!     .connect()
//!     .await?;
//! let limiter = Limiter::with_store("fixed_window:limit=10,window=10s".parse()?, Arc::new(store));
//! let d = limiter.acquire("guild:42", 1).await?; // waits for this worker's slot
//! assert!(d.allowed);
//! # Ok(()) }
//! ```

mod args;
mod batch;
mod combine;
mod functions;
mod health;
mod outage;
mod reply;
mod resilience;
mod routing;
mod script;
mod secret;
mod server_clock;
mod store;
mod transport;

pub use batch::MAX_IN_FLIGHT as MAX_BATCHES_IN_FLIGHT;
pub use combine::{CallFuture, Combiner};
pub use functions::{
    error_code, fingerprint, never_ran, policy_args, FunctionHost, Library, Messages, Payloads,
};
pub use health::{Health, NodeProblem, Readiness};
pub use outage::Outage;
pub use reply::{Reader, Reply};
pub use routing::{key_slot, MAX_DECISIONS_PER_CALL};
pub use server_clock::ServerClock;
pub use store::{cross_slot_error, RedisStore, RedisStoreBuilder};

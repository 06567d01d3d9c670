//! Where keys' state lives: the [`Store`] seam.
//!
//! A store persists each key's state and applies a policy to it atomically; it holds no
//! algorithm logic of its own. [`MemoryStore`] keeps state in this process;
//! `paceline_redis::RedisStore` keeps it in Redis or Redis Cluster and implements the same
//! trait, so a [`Limiter`](crate::Limiter) gives the same decisions on either.

use std::future::Future;
use std::time::Duration;

use paceline_core::{Decision, Error, Op, Policy, Sleep};

mod memory;

pub use memory::{MemoryStore, MemoryStoreBuilder};

/// Persists keys' state and applies policies to it atomically.
///
/// Implementations must apply one request per key at a time (no lost updates), read "now"
/// from their clock, and treat a key whose `reset_after` has passed as idle (its state may
/// then be dropped).
pub trait Store: Send + Sync + 'static {
    /// Applies `op` with `cost` to `key` under `policy`.
    fn decide(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Forgets `key`: its next request finds it idle.
    fn reset(&self, key: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Waits `duration` in the store's time: a real sleep, or an advance of a virtual clock.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// A store that answers without waiting on I/O (the in-memory store), so decisions can be
/// made from synchronous code.
pub trait SyncStore: Store {
    /// Applies `op` with `cost` to `key` under `policy`, synchronously.
    fn decide_sync(&self, policy: &Policy, key: &str, op: Op, cost: u64)
        -> Result<Decision, Error>;

    /// Forgets `key`, synchronously.
    fn reset_sync(&self, key: &str) -> Result<(), Error>;
}

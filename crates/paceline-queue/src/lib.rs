//! paceline's rate-limited job queue.
//!
//! Jobs belong to **groups** (a Discord server, a customer, an upstream account), and each
//! group's policy limits the times its jobs *start*: a worker leases a job only when the
//! group's policy admits a start at that moment. Nothing is reserved ahead, so a backlog
//! that builds while workers are away still starts no faster than the limit allows, and no
//! job is ever delayed, re-checked and delayed again: jobs wait in their group's line, and
//! the *group* waits for its next allowed start.
//!
//! - [`QueueConfig`]: each group's policy, caps, attempts, leases, backoff.
//! - [`QueueCore`]: the queue as a pure state machine over injected time, which every store
//!   runs (its docs hold the model and an example).
//! - [`NewJob`], [`Leased`], [`Failure`]: what producers send, workers get and report.
//! - [`Queue`]: the handle producers and workers hold, over a [`QueueBackend`]
//!   ([`MemoryQueue`] in this process; `RedisQueue` in Redis or Redis Cluster, feature
//!   `redis`); its `lease` waits for work without polling.
//! - [`Partitioned`]: one queue over several partitions (its groups spread by a stable
//!   hash of their names), for a queue too busy for the one Redis Cluster primary that
//!   would hold it ([`QueueConfig::partitions`]).
//! - [`Worker`]: runs a handler over the jobs, `concurrency` at a time, with heartbeats
//!   and a graceful shutdown.
//!
//! Leases carry fencing tokens: a worker whose lease expired is refused
//! ([`QueueError::LeaseLost`]) when it acknowledges, fails or extends the job, so a job is
//! never acknowledged twice.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod core;
pub mod error;
pub mod events;
pub mod job;
pub mod memory;
pub mod partitioned;
pub mod queue;
#[cfg(feature = "redis")]
pub mod redis;
pub mod schedule;
pub mod token;
pub mod worker;

pub use crate::config::QueueConfig;
pub use crate::core::QueueCore;
pub use crate::error::QueueError;
pub use crate::events::{Event, EventKind, Events, Watched};
pub use crate::job::{
    Enqueued, FailOutcome, Failure, GroupStats, JobInfo, JobState, Leased, NewJob, Stats, Totals,
};
pub use crate::memory::MemoryQueue;
pub use crate::partitioned::Partitioned;
pub use crate::queue::{Queue, QueueBackend, QueueFuture};
#[cfg(feature = "redis")]
pub use crate::redis::RedisQueue;
pub use crate::token::LeaseToken;
pub use crate::worker::{Report, Worker};

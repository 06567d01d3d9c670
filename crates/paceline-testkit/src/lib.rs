//! Throwaway Redis servers for paceline's tests.
//!
//! [`RedisServer::start`] runs a private `redis-server` on a free port (never the machine's
//! own Redis), in a temporary directory, without persistence; [`RedisCluster::start`] runs
//! three of them as a Redis Cluster (3 primaries, created with `redis-cli --cluster
//! create`). Servers stop when dropped, also when a test panics, and are killed by the
//! kernel if the thread that started them dies first.
//!
//! Tests can [`kill`](RedisServer::kill), [`restart`](RedisServer::restart),
//! [`pause`](RedisServer::pause) and [`resume`](RedisServer::resume) a server to exercise
//! failure handling.
//!
//! [`mock_api`] is a strict mock of a Discord-like API for the API client limiter and the
//! proxy.
//!
//! [`differential`] runs twins (the Rust engine and its Lua twin in Redis, say) through one
//! random script on one clock and reports the first step where they part.

mod clock;
mod cluster;
pub mod differential;
pub mod docs;
mod http;
pub mod lost_reply;
pub mod mock_api;
mod run;
pub mod secrets;
mod server;
mod shared;
mod stores;

pub use clock::GatedClock;
pub use cluster::{RedisCluster, SlotMap};
pub use http::{param, ratelimit_items, whole_response};
pub use run::{check_cases, open_files_at_least, runtime};
pub use server::{redis_cli, Frozen, RedisServer};
pub use shared::{shared_cluster, shared_server, unique_name};
pub use stores::{connect, redis_store_on, NotRedis};

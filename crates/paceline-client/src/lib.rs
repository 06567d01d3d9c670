//! # paceline's API client limiter
//!
//! For clients of an API whose limits the client learns from response headers (Discord,
//! GitHub, any API speaking the IETF `RateLimit` fields or plain `Retry-After`): requests
//! wait in per-bucket queues, one *pioneer* learns an unknown bucket, a global limit
//! (a paceline policy) paces everything a token sends, and refusals pause what they name
//! and requeue the refused request instead of failing it.
//!
//! - [`headers`]: the header dialects, one trait ([`headers::Dialect`]);
//! - [`Route`]: which limit a request counts against before the server says;
//! - [`ClientCore`]: a process's requests (queues, deadlines), as a pure state machine on
//!   injected time (sans-IO);
//! - [`knowledge`]: what a token has learned of the limits, the half processes share, as a
//!   pure state machine too;
//! - `redis::RedisKnowledge` (feature `redis`): that knowledge in Redis or Redis Cluster,
//!   one atomic call per round, so that every process of a token keeps its limits together;
//! - [`hooks`]: what a caller hears when a limit holds a request back ([`RateLimited`]),
//!   and the per-request choice to give up rather than wait ([`RequestOptions`]);
//! - [`Client`]: the async limiter over the core: [`Client::acquire`] → [`Permit`]; on a
//!   Redis URL with [`Client::open`];
//! - `middleware::Limited` (feature `reqwest`): the limiter as a `reqwest-middleware`
//!   middleware;
//! - `layer::LimitedLayer` (feature `tower`): the limiter as a tower `Layer` for `http`
//!   clients.
//!
//! ```
//! use paceline_client::headers::Discord;
//! use paceline_client::{After, Client, ClientConfig, Route};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), paceline_client::ClientError> {
//! // Discord: 50 requests/s per token, 10,000 invalid requests per 10 minutes.
//! let client = Client::new(ClientConfig::discord().max_wait(Duration::from_secs(30)), Discord);
//! let permit = client.acquire(Route::discord("PATCH", "/guilds/1/members/2")).await?;
//! // send the request, then:
//! let after = permit.complete(200, &http::HeaderMap::new(), None);
//! assert!(matches!(after, After::Done));
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod config;
mod core;
mod error;
pub mod headers;
pub mod hooks;
pub mod knowledge;
#[cfg(feature = "tower")]
pub mod layer;
#[cfg(feature = "reqwest")]
pub mod middleware;
#[cfg(feature = "redis")]
pub mod redis;
mod route;

pub use crate::client::{After, Client, Permit, Waiting};
pub use crate::config::ClientConfig;
pub use crate::core::{
    Asks, ClientCore, Completion, Poll, RequestId, MAX_RATE_LIMITED, SHARED_REPOLL_US,
};
pub use crate::error::ClientError;
pub use crate::hooks::{Origin, RateLimited, RequestOptions, Then};
pub use crate::knowledge::messages::Event;
pub use crate::knowledge::{BucketView, MAX_ROUTES};
pub use crate::route::Route;
/// The `http` crate whose `HeaderMap` the client reads, re-exported so callers use the same
/// version.
pub use http;

//! # paceline-tower: protecting a service
//!
//! A tower [`RateLimitLayer`] for servers (axum, or any tower service of `http` requests,
//! such as hyper's): every request is decided against a set of limits, such as per second
//! *and* per day *and* in flight per API key, whose state lives in any paceline store, in
//! this process or in Redis shared by every instance. Refusals are `429` with `Retry-After`, the IETF `RateLimit` / `RateLimit-Policy`
//! headers and an RFC 9457 problem details body.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{routing::get, Router};
//! use paceline_store::MemoryStore;
//! use paceline_tower::{Key, RateLimitLayer};
//!
//! # fn main() -> Result<(), paceline_core::InputError> {
//! let limits = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
//!     .limit("per-second", "gcra:rate=10/s,burst=20".parse()?, Key::peer_ip())
//!     .limit("per-day", "fixed_window:limit=10000,window=1d".parse()?, Key::peer_ip())
//!     .limit("in-flight", "concurrency:limit=4,lease=30s".parse()?, Key::peer_ip())
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(limits);
//! // Serve with the peer address, which `Key::peer_ip` reads:
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # let _ = (app, std::marker::PhantomData::<SocketAddr>);
//! # Ok(()) }
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`RateLimitLayer`], [`Builder`] | the layer and its options: limits, pace mode, store failures, headers; `for_axum()` for answers in axum's own body type |
//! | [`Choice`] | a limit's policy chosen per request ([`Builder::limit_by`]): by an API key's plan, a route |
//! | [`Key`] | whose request it is: peer IP (behind trusted proxies), a header, an extension, a closure |
//! | [`headers`] | the `RateLimit` fields and problem details, as `paceline serve` writes them too |

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod headers;
mod key;
mod layer;

pub use key::{Forwarded, Head, Key, MissingKey};
#[cfg(feature = "axum")]
pub use layer::AxumBody;
pub use layer::{
    Bodies, Builder, Choice, Limited, LimitedBody, RateLimit, RateLimitLayer, ResponseFuture,
    StoreFailure,
};
pub use paceline_core::InputError;

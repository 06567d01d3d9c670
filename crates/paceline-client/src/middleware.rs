//! The client limiter as a `reqwest-middleware` middleware (feature `reqwest`).
//!
//! Every request through the middleware waits for its turn ([`Client::acquire_within`]),
//! is sent, and its response teaches the limiter; a refusal the limiter waits out is sent
//! again (when reqwest can clone the request: a streamed body is sent once and its refusal
//! is the caller's). A request that would wait longer than `max_wait`, or that the
//! invalid-request budget refuses, fails with the [`ClientError`] as a middleware error.
//!
//! The response's body is the caller's and is not read: a refusal said only in its body
//! (GitHub's secondary limits without `Retry-After`) is seen as a plain 403. Where that
//! matters, read the body and call [`Permit::complete`](crate::Permit::complete) with it,
//! or go through `paceline proxy`, which reads a refusal's small body.
//!
//! ```no_run
//! use paceline_client::headers::Discord;
//! use paceline_client::middleware::Limited;
//! use paceline_client::{Client, ClientConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Client::new(ClientConfig::discord(), Discord);
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(Limited::discord(limits))
//!     .build();
//! let response = http
//!     .patch("https://discord.com/api/v10/guilds/1/members/2")
//!     .header("authorization", "Bot TOKEN")
//!     .send()
//!     .await?;
//! println!("{}", response.status());
//! # Ok(()) }
//! ```

use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use crate::client::{After, Client};
use crate::core::ClientError;
use crate::route::Route;

/// How a request maps to its route.
type Router = fn(&str, &str) -> Route;

/// The middleware: one [`Client`] (one identity) and how requests map to routes.
#[derive(Clone, Debug)]
pub struct Limited {
    client: Client,
    router: Router,
    max_wait: Option<Duration>,
}

impl Limited {
    /// For Discord's API: routes by [`Route::discord`].
    pub fn discord(client: Client) -> Limited {
        Limited {
            client,
            router: Route::discord,
            max_wait: None,
        }
    }

    /// For any API: routes by [`Route::generic`].
    pub fn generic(client: Client) -> Limited {
        Limited {
            client,
            router: Route::generic,
            max_wait: None,
        }
    }

    /// The same middleware failing requests that would wait longer than `max_wait`.
    pub fn max_wait(mut self, max_wait: Duration) -> Limited {
        self.max_wait = Some(max_wait);
        self
    }
}

fn refused(e: ClientError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(e)
}

#[async_trait::async_trait]
impl Middleware for Limited {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let route = (self.router)(request.method().as_str(), request.url().path());
        let mut permit = self
            .client
            .acquire_within(route, self.max_wait)
            .await
            .map_err(refused)?;
        let mut request = Some(request);
        loop {
            let Some(current) = request.take() else {
                // Unreachable: each round either keeps a copy or returns.
                return Err(refused(ClientError::Closed));
            };
            let copy = current.try_clone();
            permit.sent();
            let response = match next.clone().run(current, extensions).await {
                Ok(r) => r,
                Err(e) => {
                    permit.failed();
                    return Err(e);
                }
            };
            match permit.complete(response.status().as_u16(), response.headers(), None) {
                After::Retry(waiting) if copy.is_some() => {
                    request = copy;
                    permit = waiting.admitted().await.map_err(refused)?;
                }
                _ => return Ok(response),
            }
        }
    }
}

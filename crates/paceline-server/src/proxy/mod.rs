//! `paceline proxy`: a rate-limiting reverse proxy in front of an API whose limits come in
//! response headers, so that clients in any language get paceline's API client limiter.
//!
//! A request to `http://PROXY/PATH?QUERY` goes to `UPSTREAM/PATH?QUERY` with its method,
//! headers (less hop-by-hop ones) and body, once the limiter admits it; the upstream's
//! answer comes back as it is, streamed. Every request stays below the upstream's base
//! path: one whose path would leave it, or is ambiguous about it, is answered `400` and
//! never sent (`proxy/target.rs` holds the rules; `proxy/forward.rs` the sending). Limits are kept per `Authorization`
//! header value (one [`Client`] per token; tokens are never logged or put in metrics), each
//! held to its own global limit: configured for it, learned from the API, or the default
//! (`proxy/identity.rs`); what limits do to its requests is counted and logged through
//! its limiter's hooks (`paceline_proxy_rate_limited_total`). A
//! request that cannot be sent within `max_wait` is answered `429` with `Retry-After` and
//! `x-paceline-proxy: wait-exceeded`, so clients that handle 429 need nothing new; one the
//! invalid-request budget refuses gets `429` with `x-paceline-proxy: invalid-budget`.
//!
//! A refusal the limiter waits out (a 429 with a retry-after) is sent again by the proxy
//! when the request's body is at most [`RETRY_BODY_MAX`] (kept in memory for that); a
//! larger body is streamed once, and its refusal goes back to the client.
//!
//! `/healthz`, `/metrics` and the dashboard (`/dashboard`, and its data `/v1/dashboard`:
//! requests by outcome, the upstream's 429s by scope, the buckets learned) are served on a
//! separate admin address (`proxy/admin.rs`), so they never collide with upstream paths.
//!
//! No credential of the URLs the proxy is given (`user:password@` of the upstream or the
//! store) appears in its logs, metrics, dashboard or answers.

mod admin;
mod forward;
mod identity;
mod settings;
mod state;
mod target;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use paceline_client::{Client, ClientConfig};
use tokio::net::TcpListener;

use crate::config::ConnectionLimits;
use crate::server_error::ServerError;
pub use forward::RETRY_BODY_MAX;
pub use identity::check_key as check_identity_key;
pub use settings::ProxySettings;
pub use state::IDLE_IDENTITY;
use state::{redis_of, ProxyMetrics, ProxyState};

/// A bound proxy: its listeners are open; [`Proxy::run`] serves them.
pub struct Proxy {
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: Arc<ProxyState>,
    connections: ConnectionLimits,
}

impl Proxy {
    /// Validates the settings and binds the listening addresses.
    pub async fn bind(settings: ProxySettings) -> Result<Proxy, ServerError> {
        settings.validate().map_err(ServerError::Settings)?;
        paceline_store::install_tls_provider();
        // `upstream_timeout` bounds the wait for the answer to start (see `forward`), not
        // a long body streaming in either direction.
        let http = reqwest::Client::builder()
            .connect_timeout(settings.upstream_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ServerError::Listen(std::io::Error::other(e)))?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(ServerError::Listen)?;
        let admin = match settings.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(ServerError::Listen)?),
            None => None,
        };
        // Discord's rules (its invalid-request budget, one pioneer per major parameter)
        // for its dialect; the default global limit is the settings' in every case.
        let mut config = if settings.dialect == "discord" {
            ClientConfig::discord()
        } else {
            ClientConfig::new()
        };
        config.global = settings.global_limit.clone();
        // The identities' knowledge in the store's Redis when it has one, else in this
        // process.
        let store = paceline_store::open(&settings.store, &paceline_store::StoreOptions::new())
            .await
            .map_err(ServerError::Store)?;
        let redis = redis_of(&store);
        Ok(Proxy {
            listener,
            admin,
            state: Arc::new(ProxyState {
                upstream: settings.upstream,
                http,
                dialect: settings.dialect,
                config,
                global_limits: settings.global_limits.into_iter().collect(),
                learn_global_limit: settings.learn_global_limit,
                learning: Mutex::new(HashMap::new()),
                max_wait: settings.max_wait,
                clients: Mutex::new(HashMap::new()),
                max_identities: settings.max_identities.max(1),
                metrics: ProxyMetrics::new(),
                upstream_timeout: settings.upstream_timeout,
                redis,
                store: paceline_store::without_credentials(&settings.store),
                started: Instant::now(),
                identity_names: std::hash::RandomState::new(),
            }),
            connections: settings.connections,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The admin address, if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish (within the
    /// connection limits' shutdown timeout).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .fallback(forward::forward)
            .with_state(Arc::clone(&self.state));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let admin = self.admin.map(|listener| {
            let router = admin::routes().with_state(Arc::clone(&self.state));
            let mut stopped = stopped.clone();
            tokio::spawn(crate::conn::serve(
                listener,
                router,
                self.connections,
                None,
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            ))
        });
        let result = crate::conn::serve(self.listener, app, self.connections, None, async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        // Tell the shared knowledge what the last answers said, so that other proxies
        // do not lose it (within a second).
        let clients: Vec<Client> = {
            let clients = self
                .state
                .clients
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            clients.values().map(|(c, _)| c.clone()).collect()
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            for c in &clients {
                c.flush().await;
            }
        })
        .await;
        result
    }
}

//! # paceline-server: shared pacing and rate limits over HTTP
//!
//! The service behind `paceline serve`: named policies from a TOML file (or inline specs),
//! decisions over a JSON API, state in memory or in Redis / Redis Cluster so that any number
//! of instances share the same limits, Prometheus metrics, live reload.
//!
//! | endpoint | what |
//! |---|---|
//! | `POST /v1/decisions` | one decision: `{"policy", "key", "op", "cost", "max_wait_ms"}` |
//! | `POST /v1/decisions` with `limits` | a set of limits decided as one (`limit`, `peek`, or `pace` at the time every limit admits): `{"limits": [{"policy", "key"}, ...], "op", "cost", "max_wait_ms"}` |
//! | `POST /v1/decisions/batch` | up to 1,000 single decisions, answered in order |
//! | `POST /v1/leases` | take a lease of a `concurrency` policy: `{"policy", "key", "cost"}` → `201 {"lease", "expires_ms"}` or `429` |
//! | `POST /v1/leases/{lease}/extend`, `DELETE /v1/leases/{lease}` | renew (`200`) or give back (`204`) a lease; `404` for one unknown or reclaimed |
//! | `DELETE /v1/keys/{policy}/{key}` | reset a key |
//! | `GET /v1/policies`, `GET /v1/policies/{name}` | the policies in force: the config file's, and those set at run time |
//! | `PUT /v1/policies/{name}`, `DELETE /v1/policies/{name}` | set a policy at run time `{"spec", "shadow"}`, or delete it (the file's policy of that name applies again); shared by every instance on one Redis |
//! | `POST /v1/reload` | re-read the config file (also on SIGHUP) |
//! | `/v1/queues/{queue}/...` | the job queues of the config file: enqueue, lease, ack, fail, extend, stats, dead jobs |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | liveness; readiness (`200` ready, `200` with `"degraded": true` while some Redis Cluster primaries fail, `503` while no Redis node serves); Prometheus |
//! | `GET /dashboard`, `GET /v1/dashboard` | a live dashboard in the browser, and the JSON it polls |
//! | `POST /json` | Envoy's rate limit service over HTTP (`--rls-config`): a `RateLimitRequest` in protobuf's JSON mapping, answered as gRPC `ShouldRateLimit` on `--rls-listen` answers ([`rls`]) |
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = paceline_server::Settings::default(); // 127.0.0.1:7373, memory store
//! let server = paceline_server::Server::bind(settings).await?;
//! println!("listening on http://{}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The name of the store's key that signs concurrency leases' tokens.
const LEASE_KEY: &str = "concurrency-lease";

mod body_timeout;
mod catch_panic;
pub mod config;
mod conn;
mod dashboard;
mod dashboard_page;
mod decisions;
mod error;
mod extract;
mod fields;
mod groups_cache;
mod health;
mod histogram;
mod lease_token;
mod leases;
mod metrics;
mod openapi;
mod outcome;
mod policies;
pub mod proxy;
pub mod queues;
mod reload;
mod request;
pub mod rls;
mod rls_rules;
mod router;
mod runtime_policies;
mod server_error;
mod state;
mod top_keys;
mod units;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use paceline_store::{open, StoreOptions};
use tokio::net::TcpListener;

pub use config::{ConfigError, Settings, DEFAULT_PORT};
pub use decisions::{MAX_BATCH, MAX_BATCH_BODY};
pub use extract::MAX_BODY;
pub use fields::MAX_KEY;
pub use openapi::openapi_json;
pub use server_error::ServerError;

use state::{AppState, Live};

/// How often the service sweeps a memory store for idle keys, calls or no calls
/// ([`StoreOptions::sweep_every`]): the keys of a burst that then goes quiet give their memory
/// back about a second after they go idle, even if no request follows. (Redis expires idle
/// keys itself.)
const MEMORY_SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// A bound, not yet running service.
pub struct Server {
    listener: TcpListener,
    /// The RLS gRPC listener (`--rls-listen`).
    rls_listener: Option<TcpListener>,
    state: Arc<AppState>,
    store: String,
}

/// Re-reads the config file and applies its policies and access rules, and reads the RLS
/// rules again (`--rls-config`); the listen addresses, the store and its failure policy
/// need a restart.
#[derive(Clone)]
pub struct Reloader {
    state: Arc<AppState>,
}

impl Reloader {
    /// Reloads, on SIGHUP; on an invalid file the running configuration stays and the error
    /// says why. Logged as `POST /v1/reload` is: a reload at INFO, a failed one at WARN
    /// (target `paceline`, field `trigger = "SIGHUP"`).
    pub fn reload(&self) -> Result<String, String> {
        self.state.reload("SIGHUP")
    }
}

impl Server {
    /// Connects the store and binds the listening socket.
    pub async fn bind(settings: Settings) -> Result<Server, ServerError> {
        Server::bind_on(settings, None).await
    }

    /// [`bind`](Self::bind), the store reading time from `clock` instead of the real one
    /// (or Redis's `TIME`): for tests that move time (leases reclaimed at their expiry).
    #[doc(hidden)]
    pub async fn bind_with_clock(
        settings: Settings,
        clock: Arc<dyn paceline_store::Clock>,
    ) -> Result<Server, ServerError> {
        Server::bind_on(settings, Some(clock)).await
    }

    async fn bind_on(
        settings: Settings,
        clock: Option<Arc<dyn paceline_store::Clock>>,
    ) -> Result<Server, ServerError> {
        let mut options = StoreOptions::new()
            .failure_policy(settings.failure_policy)
            .auto_batch(settings.redis_auto_batch)
            .sweep_every(Some(MEMORY_SWEEP_PERIOD));
        if let Some(clock) = clock {
            options = options.clock(clock);
        }
        let store = open(&settings.store, &options)
            .await
            .map_err(ServerError::Store)?;
        let mut queues = std::collections::BTreeMap::new();
        for (name, config) in &settings.queues {
            let queue = paceline_queue::Queue::with_store(&store, name, config.clone())
                .await
                .map_err(|e| ServerError::Queues(format!("queue `{name}`: {e}")))?;
            // The config file's schedules: the same schedule again keeps its next tick.
            for (schedule_name, schedule) in &config.schedules {
                queue
                    .put_schedule(schedule_name, schedule)
                    .await
                    .map_err(|e| {
                        ServerError::Queues(format!(
                            "queue `{name}`, schedule `{schedule_name}`: {e}"
                        ))
                    })?;
            }
            queues.insert(name.clone(), queue);
        }
        let lease_key = store
            .token_key(LEASE_KEY)
            .await
            .map_err(ServerError::Store)?;
        let rls = match &settings.rls.config {
            Some(path) => Some(Arc::new(
                rls_rules::RlsState::load(path, settings.rls.response_headers).map_err(|e| {
                    ServerError::Settings(paceline_core::InputError::new(
                        e.field.clone(),
                        format!("{}: {}", e.location(), e.message),
                    ))
                })?,
            )),
            None if settings.rls.listen.is_some() => {
                return Err(ServerError::Settings(paceline_core::InputError::new(
                    "rls.config",
                    "the RLS listener has no rules: give --rls-config (or [rls] config) with \
                     the YAML file or folder",
                )))
            }
            None => None,
        };
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(ServerError::Listen)?;
        let rls_listener = match settings.rls.listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(ServerError::Listen)?),
            None => None,
        };
        let store_description = paceline_store::without_credentials(&settings.store);
        let metrics = metrics::Metrics::new();
        let runtime = runtime_policies::RuntimePolicies::open(&store).await;
        let live = Live::new(&settings, &metrics, &runtime.entries());
        let state = Arc::new(AppState {
            live: RwLock::new(Arc::new(live)),
            store,
            metrics,
            queues,
            stopping: tokio::sync::watch::Sender::new(false),
            groups: groups_cache::GroupsCache::default(),
            base: Mutex::new(settings),
            lease_key,
            rls,
            runtime,
        });
        Ok(Server {
            listener,
            rls_listener,
            state,
            store: store_description,
        })
    }

    /// The address the service listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The address Envoy's rate limit service (gRPC) listens on, if it does.
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        self.rls_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The store, as shown at start-up (without credentials).
    pub fn store_description(&self) -> &str {
        &self.store
    }

    /// A handle that reloads the config file (for SIGHUP).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            state: Arc::clone(&self.state),
        }
    }

    /// Serves until `shutdown` completes, then lets the requests in flight finish (for at
    /// most the settings' `shutdown_timeout`) and closes every connection.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let limits = self
            .state
            .base
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .connections;
        let app = router::router(Arc::clone(&self.state));
        // Every queue's schedules, fired by each instance; the store lets one job a tick in.
        for queue in self.state.queues.values() {
            let queue = queue.clone();
            let mut stopping = self.state.stopping.subscribe();
            tokio::spawn(async move {
                let stop = async move {
                    let _ = stopping.wait_for(|&stopping| stopping).await;
                };
                queue.run_schedules(stop).await;
            });
        }
        // The policies set at run time on other instances sharing the store, followed.
        if self.state.runtime.is_shared() {
            let state = Arc::clone(&self.state);
            let mut stopping = self.state.stopping.subscribe();
            tokio::spawn(async move {
                let stop = async move {
                    let _ = stopping.wait_for(|&stopping| stopping).await;
                };
                state.follow_runtime_policies(stop).await;
            });
        }
        let state = Arc::clone(&self.state);
        let shutdown = async move {
            shutdown.await;
            state.stopping.send_replace(true);
        };
        // Envoy's rate limit service over gRPC, stopped by the same shutdown.
        let grpc = match (self.rls_listener, &self.state.rls) {
            (Some(listener), Some(rls)) => {
                let service = rls::service::server(rls::service::Service {
                    state: Arc::clone(&self.state),
                    rls: Arc::clone(rls),
                });
                let mut stopping = self.state.stopping.subscribe();
                let stop = async move {
                    let _ = stopping.wait_for(|&stopping| stopping).await;
                };
                // The HTTP listener's limits: a cap on connections, and a deadline for a new
                // one's first bytes.
                let incoming = rls::incoming::incoming(
                    listener,
                    limits.max_connections,
                    limits.header_read_timeout,
                );
                Some(tokio::spawn(async move {
                    // A peer that stops answering pings is dropped: Envoy holds its
                    // connections open for good, and a dead one must not stay.
                    let served = tonic::transport::Server::builder()
                        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
                        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
                        .max_concurrent_streams(1024)
                        .serve_with_incoming_shutdown(service, incoming, stop)
                        .await;
                    if let Err(e) = served {
                        tracing::error!(target: "paceline", "the RLS gRPC listener stopped: {e}");
                    }
                }))
            }
            _ => None,
        };
        let body_timeout = Some(limits.body_read_timeout);
        let served = conn::serve(self.listener, app, limits, body_timeout, shutdown).await;
        if let Some(grpc) = grpc {
            // Calls in flight get the same deadline as the HTTP ones.
            let _ = tokio::time::timeout(limits.shutdown_timeout, grpc).await;
        }
        served
    }
}

//! What the proxy's requests share: one limiter per identity (`Authorization` value), the
//! HTTP client that sends requests upstream, and the proxy's metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use paceline_client::headers as dialects;
use paceline_client::redis::RedisKnowledge;
use paceline_client::{Client, ClientConfig, Route};
use paceline_store::redis::FunctionHost;
use paceline_store::SharedStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// How long an identity with nothing waiting or in flight is kept: 10 minutes.
pub const IDLE_IDENTITY: Duration = Duration::from_secs(600);

/// The label of a request's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Outcome {
    /// `forwarded`, `wait_exceeded`, `invalid_budget`, `upstream_error`, `bad_request`,
    /// `too_many_identities`.
    pub(super) outcome: &'static str,
}

/// The label of an upstream refusal's scope.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Refused {
    /// `bucket`, `shared` or `global`.
    pub(super) scope: &'static str,
}

/// The proxy's metrics (`/metrics` of the admin address, prefixed `paceline_proxy_`).
pub(super) struct ProxyMetrics {
    pub(super) registry: Registry,
    pub(super) requests: Family<Outcome, Counter>,
    pub(super) upstream_429: Family<Refused, Counter>,
    pub(super) retries: Counter,
    pub(super) invalid: Counter,
    pub(super) wait_micros: Counter,
}

impl ProxyMetrics {
    pub(super) fn new() -> ProxyMetrics {
        let mut registry = Registry::with_prefix("paceline_proxy");
        let requests = Family::<Outcome, Counter>::default();
        let upstream_429 = Family::<Refused, Counter>::default();
        let retries = Counter::default();
        let invalid = Counter::default();
        let wait_micros = Counter::default();
        registry.register(
            "requests",
            "Requests by outcome: forwarded, wait_exceeded, invalid_budget, upstream_error, bad_request, too_many_identities",
            requests.clone(),
        );
        registry.register(
            "upstream_429",
            "Refusals from the upstream, by scope (bucket, shared, global)",
            upstream_429.clone(),
        );
        registry.register(
            "retries",
            "Requests sent again after a refusal",
            retries.clone(),
        );
        registry.register(
            "invalid_responses",
            "401 and 403 answers and 429s other than shared scope: what the invalid-request budget counts",
            invalid.clone(),
        );
        registry.register(
            "wait_microseconds",
            "Time requests waited for their turn, in µs",
            wait_micros.clone(),
        );
        ProxyMetrics {
            registry,
            requests,
            upstream_429,
            retries,
            invalid,
            wait_micros,
        }
    }

    /// Counts a request's outcome.
    pub(super) fn count(&self, outcome: &'static str) {
        self.requests.get_or_create(&Outcome { outcome }).inc();
    }
}

/// What every request of the proxy shares.
pub(super) struct ProxyState {
    pub(super) upstream: reqwest::Url,
    pub(super) http: reqwest::Client,
    pub(super) dialect: String,
    pub(super) config: ClientConfig,
    pub(super) max_wait: Option<Duration>,
    /// One limiter per `Authorization` value, and when it was last used.
    pub(super) clients: Mutex<HashMap<Vec<u8>, (Client, Instant)>>,
    pub(super) max_identities: usize,
    pub(super) metrics: ProxyMetrics,
    pub(super) upstream_timeout: Duration,
    /// Where the limits' knowledge lives when proxies share it.
    pub(super) redis: Option<FunctionHost>,
    /// The store as the dashboard shows it (without credentials).
    pub(super) store: String,
    pub(super) started: Instant,
    /// Keys the dashboard's names of identities (a token is never shown, nor a plain hash
    /// of it that could be checked against a guess).
    pub(super) identity_names: std::hash::RandomState,
}

impl ProxyState {
    /// The identity's limiter, or `None` when the proxy holds as many identities as it may.
    pub(super) fn client_for(
        &self,
        token: &[u8],
    ) -> Result<Option<Client>, paceline_core::InputError> {
        let now = Instant::now();
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((c, used)) = clients.get_mut(token) {
            *used = now;
            return Ok(Some(c.clone()));
        }
        if clients.len() >= self.max_identities {
            clients.retain(|_, (c, used)| {
                now.duration_since(*used) < IDLE_IDENTITY || c.counts() != (0, 0)
            });
            if clients.len() >= self.max_identities {
                return Ok(None);
            }
        }
        let dialect = dialects::dialect(&self.dialect)?;
        let clock = Arc::new(paceline_store::SystemClock::new());
        let c = match &self.redis {
            Some(store) => Client::with_knowledge(
                self.config.clone(),
                dialect,
                clock,
                RedisKnowledge::new(store.clone(), token, &self.config),
            ),
            None => Client::with_clock(self.config.clone(), dialect, clock),
        };
        clients.insert(token.to_vec(), (c.clone(), now));
        Ok(Some(c))
    }

    /// The limiter's route of a request: Discord's (its major parameters) for its dialect.
    pub(super) fn route(&self, method: &str, path: &str) -> Route {
        if self.dialect == "discord" {
            Route::discord(method, path)
        } else {
            Route::generic(method, path)
        }
    }
}

/// The store's Redis, when it keeps its state there: the identities' knowledge is kept
/// there too, shared by every proxy on it.
pub(super) fn redis_of(store: &SharedStore) -> Option<FunctionHost> {
    store.functions()
}

//! What the proxy's requests share: one limiter per identity (`Authorization` value), the
//! HTTP client that sends requests upstream, and the proxy's metrics.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use paceline_client::headers as dialects;
use paceline_client::hooks::scope_name;
use paceline_client::redis::RedisKnowledge;
use paceline_client::{Client, ClientConfig, Origin, RateLimited, Route, Then};
use paceline_core::Policy;
use paceline_store::redis::FunctionHost;
use paceline_store::SharedStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::OnceCell;

use super::identity::{self, Source};

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

/// The labels of a [`RateLimited`] event: each a handful of values, never a route or a
/// token.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Limited {
    /// `bucket`, `shared`, `global` or `unknown`.
    pub(super) scope: &'static str,
    /// `local` (the proxy held the request) or `upstream` (the upstream refused it).
    pub(super) origin: &'static str,
    /// `wait` or `fail`.
    pub(super) then: &'static str,
}

/// The label of an identity's global limit's source.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GlobalSource {
    /// `configured`, `learned` or `default`.
    pub(super) global_limit: &'static str,
}

/// The proxy's metrics (`/metrics` of the admin address, prefixed `paceline_proxy_`).
pub(super) struct ProxyMetrics {
    pub(super) registry: Registry,
    pub(super) requests: Family<Outcome, Counter>,
    pub(super) upstream_429: Family<Refused, Counter>,
    pub(super) rate_limited: Family<Limited, Counter>,
    pub(super) identities: Family<GlobalSource, Counter>,
    pub(super) retries: Counter,
    pub(super) invalid: Counter,
    pub(super) wait_micros: Counter,
}

impl ProxyMetrics {
    pub(super) fn new() -> ProxyMetrics {
        let mut registry = Registry::with_prefix("paceline_proxy");
        let requests = Family::<Outcome, Counter>::default();
        let upstream_429 = Family::<Refused, Counter>::default();
        let rate_limited = Family::<Limited, Counter>::default();
        let identities = Family::<GlobalSource, Counter>::default();
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
            "rate_limited",
            "Requests a limit held back or refused, by scope (bucket, shared, global, unknown), origin (local, upstream) and what became of them (wait, fail)",
            rate_limited.clone(),
        );
        registry.register(
            "identities",
            "Identities whose limiter the proxy opened, by where their global limit came from (configured, learned, default)",
            identities.clone(),
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
            rate_limited,
            identities,
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

/// The hook each identity's limiter tells its [`RateLimited`] events: counted in
/// `paceline_proxy_rate_limited_total` and logged (a wait the proxy imposes at debug
/// level, a failure or an upstream's refusal at info), with the identity's dashboard name,
/// the route's template and the bucket id; never the token, nor the route's major
/// parameter (a webhook's token may be in it).
fn rate_limited_hook(
    counters: Family<Limited, Counter>,
    identity: String,
) -> impl Fn(&RateLimited) + Send + Sync + 'static {
    move |event| {
        let scope = scope_name(event.scope);
        let (origin, then) = (event.origin.as_str(), event.then.as_str());
        counters
            .get_or_create(&Limited {
                scope,
                origin,
                then,
            })
            .inc();
        let wait_ms = event.wait.map(|w| w.as_secs_f64() * 1e3);
        let (route, bucket) = (event.route.key(), event.bucket.as_deref());
        if event.origin == Origin::Local && event.then == Then::Wait {
            tracing::debug!(
                identity,
                route,
                bucket,
                scope,
                origin,
                then,
                wait_ms,
                "rate limited"
            );
        } else {
            tracing::info!(
                identity,
                route,
                bucket,
                scope,
                origin,
                then,
                wait_ms,
                "rate limited"
            );
        }
    }
}

/// An identity's global limit once learned (`None`: the API did not tell one).
pub(super) type Learned = OnceCell<Option<Policy>>;

/// What every request of the proxy shares.
pub(super) struct ProxyState {
    pub(super) upstream: reqwest::Url,
    pub(super) http: reqwest::Client,
    pub(super) dialect: String,
    /// The limiters' configuration; its global limit is the default one.
    pub(super) config: ClientConfig,
    /// Global limits by identity key (see `identity`).
    pub(super) global_limits: HashMap<String, Policy>,
    /// Whether a Discord bot's global limit is learned from `GET /gateway/bot`.
    pub(super) learn_global_limit: bool,
    /// Identities whose global limit is being learned: the first request asks, the others
    /// wait for its answer.
    pub(super) learning: Mutex<HashMap<Vec<u8>, Arc<Learned>>>,
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
    /// The limiter of the identity `token`, opened (with its global limit: see
    /// `identity`) if new; `None` when the proxy holds as many identities as it may.
    /// `path` is the request's, under whose `/api/vN` a Discord bot's limit is asked.
    pub(super) async fn client_for(
        &self,
        token: &[u8],
        path: &str,
    ) -> Result<Option<Client>, paceline_core::InputError> {
        if let Some(c) = self.existing(token) {
            return Ok(Some(c));
        }
        // Looked for again under the lock of what is being learned, which `open` does
        // not hold: either the identity is open by now, or its entry is still there.
        let cell = {
            let mut learning = self.learning.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = self.existing(token) {
                return Ok(Some(c));
            }
            Arc::clone(learning.entry(token.to_vec()).or_default())
        };
        let (global, source) = self.global_of(token, path, &cell).await;
        let opened = self.open(token, global, source);
        self.learning
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token);
        opened
    }

    /// The identity's limiter if it has one, marked as used now.
    fn existing(&self, token: &[u8]) -> Option<Client> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let (c, used) = clients.get_mut(token)?;
        *used = Instant::now();
        Some(c.clone())
    }

    /// The identity's global limit and where it came from: its configured one, the one
    /// learned from the API, or the default.
    async fn global_of(
        &self,
        token: &[u8],
        path: &str,
        learned: &Learned,
    ) -> (Option<Policy>, Source) {
        for key in identity::keys(token) {
            if let Some(policy) = self.global_limits.get(&key) {
                return (Some(policy.clone()), Source::Configured);
            }
        }
        let learns = self.learn_global_limit
            && self.dialect == "discord"
            && identity::discord_bot_id(token).is_some();
        if learns {
            if let Some(policy) = learned.get_or_init(|| self.learn(token, path)).await {
                return (Some(policy.clone()), Source::Learned);
            }
        }
        (self.config.global.clone(), Source::Default)
    }

    /// A Discord bot's global limit from `GET /gateway/bot` (`None`: the default, also
    /// when the API cannot tell; a warning says why, without the token).
    async fn learn(&self, token: &[u8], path: &str) -> Option<Policy> {
        let uri: axum::http::Uri = identity::gateway_bot_path(path).parse().ok()?;
        let target = super::target::upstream_target(&self.upstream, &uri).ok()?;
        let timeout = self.upstream_timeout.min(Duration::from_secs(10));
        match identity::max_concurrency(&self.http, target.url, token, timeout).await {
            Ok(concurrency) => identity::learned_limit(concurrency),
            Err(why) => {
                tracing::warn!(
                    identity = self.identity_name(token),
                    "could not learn a bot's global limit from GET /gateway/bot: {why}; the default applies"
                );
                None
            }
        }
    }

    /// Opens the identity's limiter with `global` as its global limit (or answers the one
    /// opened meanwhile), or `None` when the proxy holds as many identities as it may.
    fn open(
        &self,
        token: &[u8],
        global: Option<Policy>,
        source: Source,
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
        let mut config = self.config.clone();
        config.global = global;
        let c = match &self.redis {
            Some(store) => Client::with_knowledge(
                config.clone(),
                dialect,
                clock,
                RedisKnowledge::new(store.clone(), token, &config),
            ),
            None => Client::with_clock(config.clone(), dialect, clock),
        };
        let name = self.identity_name(token);
        if source != Source::Default {
            tracing::info!(
                identity = name,
                global_limit = config.global.as_ref().map(ToString::to_string),
                source = source.as_str(),
                "an identity's own global limit"
            );
        }
        self.metrics
            .identities
            .get_or_create(&GlobalSource {
                global_limit: source.as_str(),
            })
            .inc();
        c.on_rate_limited(rate_limited_hook(self.metrics.rate_limited.clone(), name));
        clients.insert(token.to_vec(), (c.clone(), now));
        Ok(Some(c))
    }

    /// An identity's name in the dashboard and the logs: six hex digits of a keyed hash
    /// of its token (the key drawn at start), so that neither the token nor a hash that
    /// could be checked against a guess is shown.
    pub(super) fn identity_name(&self, token: &[u8]) -> String {
        format!("{:06x}", self.identity_names.hash_one(token) >> 40)
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

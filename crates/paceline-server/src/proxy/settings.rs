//! What `paceline proxy` is told ([`ProxySettings`]), and how its URLs are shown: never
//! with their credentials.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use paceline_client::headers as dialects;
use paceline_core::{InputError, Policy};

use crate::config::ConnectionLimits;

/// What `paceline proxy` is told. Its `Debug` shows the URLs without their credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct ProxySettings {
    /// Where requests go: `http://` or `https://`, with an optional base path that every
    /// request stays below, and no query or fragment. `user:password@` in it is sent as
    /// basic authentication to a request without an `Authorization` header, and never
    /// shown.
    pub upstream: reqwest::Url,
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Where `/healthz` and `/metrics` are served (`None`: not served).
    pub admin_listen: Option<SocketAddr>,
    /// The header dialect: `discord`, `ietf`, `github`, `retry-after` or `auto`.
    pub dialect: String,
    /// Applied to every request of a token (Discord: `gcra:rate=50/s,burst=1`), unless
    /// `global_limits` or what the proxy learns says otherwise for it. Any algorithm but
    /// `concurrency`, whose lease per request the limiter never gives back.
    pub global_limit: Option<Policy>,
    /// Global limits of given identities, by a key that names one without holding its
    /// token: `discord:ID` (a bot's user id) or `sha256:HEX` (the SHA-256 of the whole
    /// `Authorization` value). They win over what is learned and over `global_limit`.
    pub global_limits: BTreeMap<String, Policy>,
    /// With dialect `discord`: learn a bot's global limit from `GET /gateway/bot` when its
    /// token is first seen (a large bot's is above 50/s). On by default.
    pub learn_global_limit: bool,
    /// The longest a request may wait for its turn (`None`: as long as it takes).
    pub max_wait: Option<Duration>,
    /// The upstream's answer must start within this (else `504`); a long body after that
    /// is not cut off.
    pub upstream_timeout: Duration,
    /// Connection limits of the listening side.
    pub connections: ConnectionLimits,
    /// The most distinct `Authorization` values (identities) whose limits the proxy keeps
    /// at once (10,000). One idle for [`IDLE_IDENTITY`](super::IDLE_IDENTITY) with nothing waiting is forgotten
    /// when room is needed; beyond the cap, requests of new identities get `503`.
    pub max_identities: usize,
    /// Where what the proxy learns of the limits is kept: `memory` (this proxy alone), or
    /// `redis://HOST:PORT[/DB]`, `rediss://...`, `redis-cluster://HOST:PORT[,...]`:
    /// shared by every proxy (and every [`Client`](paceline_client::Client) opened there) with the same token.
    pub store: String,
}

impl ProxySettings {
    /// Settings for `upstream` with the defaults: listen on 127.0.0.1:8081, no admin
    /// address, dialect `auto`, no global limit, no deadline, 30 s upstream timeout.
    pub fn new(upstream: reqwest::Url) -> ProxySettings {
        ProxySettings {
            upstream,
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            admin_listen: None,
            dialect: "auto".into(),
            global_limit: None,
            global_limits: BTreeMap::new(),
            learn_global_limit: true,
            max_wait: None,
            upstream_timeout: Duration::from_secs(30),
            connections: ConnectionLimits::default(),
            max_identities: 10_000,
            store: "memory".into(),
        }
    }

    /// Checks the settings: the upstream's scheme and that it has no query or fragment, the
    /// store's URL, the dialect's name, the global limits' algorithms and the keys of
    /// `global_limits`.
    pub fn validate(&self) -> Result<(), InputError> {
        let upstream = shown(&self.upstream);
        if !matches!(self.upstream.scheme(), "http" | "https") {
            return Err(InputError::new(
                "upstream",
                format!("`{upstream}` is not an http:// or https:// URL"),
            ));
        }
        if self.upstream.query().is_some() || self.upstream.fragment().is_some() {
            return Err(InputError::new(
                "upstream",
                format!(
                    "`{upstream}` has a query or a fragment: give the base URL only, \
                     requests bring their own query"
                ),
            ));
        }
        paceline_store::check_store_url(&self.store)?;
        dialects::dialect(&self.dialect)?;
        check_global("global_limit", self.global_limit.as_ref())?;
        for (key, policy) in &self.global_limits {
            super::identity::check_key(key)?;
            check_global("global_limits", Some(policy))?;
        }
        Ok(())
    }

    /// The upstream as logs and the dashboard show it: without `user:password@`.
    pub fn upstream_shown(&self) -> String {
        shown(&self.upstream)
    }
}

impl std::fmt::Debug for ProxySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxySettings")
            .field("upstream", &shown(&self.upstream))
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("dialect", &self.dialect)
            .field("global_limit", &self.global_limit)
            .field("global_limits", &self.global_limits)
            .field("learn_global_limit", &self.learn_global_limit)
            .field("max_wait", &self.max_wait)
            .field("upstream_timeout", &self.upstream_timeout)
            .field("connections", &self.connections)
            .field("max_identities", &self.max_identities)
            .field(
                "store",
                &paceline_store::without_credentials(self.store.trim()),
            )
            .finish()
    }
}

/// Refuses a `concurrency` policy as a global limit (in `field`), naming the algorithms
/// allowed.
fn check_global(field: &'static str, policy: Option<&Policy>) -> Result<(), InputError> {
    let Some(policy @ Policy::Concurrency(_)) = policy else {
        return Ok(());
    };
    let allowed: Vec<&str> = paceline_core::ALGORITHMS
        .iter()
        .copied()
        .filter(|a| *a != policy.algorithm())
        .collect();
    Err(InputError::new(
        field,
        format!(
            "`{}` cannot be the global limit: the proxy takes a lease for each request and \
             never gives it back; use one of {}",
            policy.algorithm(),
            allowed.join(", ")
        ),
    ))
}

/// `url` without `user:password@`. (The URL's own parts, not its text: a `@` in its path
/// stays.)
pub(super) fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    // Only a URL without a host (never http:// or https://) refuses these.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

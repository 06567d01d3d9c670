//! What every request shares: the store, the metrics, the queues, and the live
//! configuration (the policies and access rules a reload replaces, with the policies set at
//! run time laid over the file's), in which a request's policy is found.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use paceline_store::secret::TokenKey;
use paceline_store::{InputError, Policy, SharedStore};

use crate::config::Settings;
use crate::error::{ApiError, ErrorCode};
use crate::groups_cache::GroupsCache;
use crate::metrics::{Metrics, PolicyMetrics};
use crate::runtime_policies::{Entries, RuntimePolicies};

/// The name of inline specs in responses and metrics.
pub(crate) const INLINE: &str = "inline";

/// The most inline specs remembered parsed; beyond, the memory starts over.
const INLINE_CACHE: usize = 1_024;

/// Shared by every request.
pub(crate) struct AppState {
    pub(crate) live: RwLock<Arc<Live>>,
    /// Where keys' state lives: any store, opened from the configured URL.
    pub(crate) store: SharedStore,
    pub(crate) metrics: Metrics,
    /// The job queues of the config file, by name.
    pub(crate) queues: BTreeMap<String, paceline_queue::Queue>,
    /// Becomes true when the service starts shutting down: lease calls waiting for a job
    /// answer with what they have instead of holding the shutdown.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// The dashboard's listing of each queue's groups.
    pub(crate) groups: GroupsCache,
    /// The settings the service started with (flags and file); a reload lays the file's
    /// policies and access rules over them. The lock also makes reloads one at a time.
    pub(crate) base: Mutex<Settings>,
    /// Signs concurrency leases' tokens ([`crate::lease_token`]): the store's key, shared
    /// by every instance on the same Redis.
    pub(crate) lease_key: TokenKey,
    /// Envoy's rate limit service, when the service has its rules (`--rls-config`).
    pub(crate) rls: Option<Arc<crate::rls_rules::RlsState>>,
    /// The policies set at run time (`PUT /v1/policies/{name}`), laid over the file's.
    pub(crate) runtime: RuntimePolicies,
}

impl AppState {
    /// The live configuration now: a request decides all of itself under this one.
    pub(crate) fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A configured policy, its metrics, whether it is in shadow mode, and where it comes
/// from.
pub(crate) struct Configured {
    policy: Policy,
    metrics: PolicyMetrics,
    /// Shadow mode (`shadow = true`): decided and counted as usual, a refusal answered
    /// as admitted.
    shadow: bool,
    source: Source,
}

/// Where a policy in force comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// The config file.
    Config,
    /// Set at run time (`PUT /v1/policies/{name}`); `overrides` holds the file's policy of
    /// the same name and its shadow mode, which applies again once it is deleted.
    Runtime { overrides: Option<(Policy, bool)> },
}

impl Configured {
    /// The policy.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether it is in shadow mode (its refusals answered as admitted).
    pub(crate) fn shadow(&self) -> bool {
        self.shadow
    }

    /// Where it comes from: the file, or a change at run time.
    pub(crate) fn source(&self) -> &Source {
        &self.source
    }
}

/// What a reload can change: the policies and the access rules; and the policies as the
/// table of those set at run time changes them.
pub(crate) struct Live {
    /// The settings of the file (and flags) these were built from: a change at run time
    /// lays the table over them again.
    settings: Arc<Settings>,
    pub(crate) policies: BTreeMap<String, Configured>,
    pub(crate) auth_token: Option<String>,
    pub(crate) allow_inline_policies: bool,
    /// The metrics of decisions by inline specs, all named `inline`.
    inline_metrics: PolicyMetrics,
    /// Inline specs already parsed: the policy and its key namespace.
    inline: RwLock<HashMap<String, (Policy, String)>>,
}

/// A policy named by a request, found in the live configuration.
pub(crate) struct Resolved<'a> {
    /// The configured name; `None` for an inline spec.
    pub(crate) name: Option<&'a str>,
    pub(crate) metrics: &'a PolicyMetrics,
    pub(crate) policy: Policy,
    /// The key in the store: namespaced by policy (`NAMESPACE:KEY`).
    pub(crate) store_key: String,
    /// The policy is in shadow mode: its refusals are answered as admitted (never for an
    /// inline spec).
    pub(crate) shadow: bool,
}

impl Resolved<'_> {
    /// The policy's namespace of keys at the start of the store's key for `key`: its
    /// configured name, or `~SPEC` for an inline spec.
    pub(crate) fn namespace(&self, key: &str) -> &str {
        self.store_key
            .len()
            .checked_sub(key.len() + 1)
            .and_then(|end| self.store_key.get(..end))
            .unwrap_or_default()
    }
}

impl Live {
    /// The configuration of `settings` (the file's policies, its access rules), each
    /// policy of `runtime` (those set at run time) replacing the file's of its name or
    /// added beside them.
    pub(crate) fn new(settings: &Settings, metrics: &Metrics, runtime: &Entries) -> Live {
        let mut policies: BTreeMap<String, Configured> = settings
            .policies
            .iter()
            .map(|(name, policy)| {
                let configured = Configured {
                    policy: policy.clone(),
                    metrics: metrics.policy(name),
                    shadow: settings.shadow.contains(name),
                    source: Source::Config,
                };
                (name.clone(), configured)
            })
            .collect();
        for (name, entry) in runtime {
            let overrides = policies.remove(name).map(|c| (c.policy, c.shadow));
            let configured = Configured {
                policy: entry.policy.clone(),
                metrics: metrics.policy(name),
                shadow: entry.shadow,
                source: Source::Runtime { overrides },
            };
            policies.insert(name.clone(), configured);
        }
        Live {
            settings: Arc::new(settings.clone()),
            policies,
            auth_token: settings.auth_token.clone(),
            allow_inline_policies: settings.allow_inline_policies,
            inline_metrics: metrics.policy(INLINE),
            inline: RwLock::new(HashMap::new()),
        }
    }

    /// The settings of the file (and flags) this configuration was built from.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Finds `spec` (a configured name, or an inline spec where allowed) for `key`; errors
    /// name `field`, the request's field holding the spec.
    pub(crate) fn resolve(
        &self,
        spec: &str,
        key: &str,
        field: &str,
    ) -> Result<Resolved<'_>, ApiError> {
        if let Some((name, c)) = self.policies.get_key_value(spec) {
            return Ok(Resolved {
                name: Some(name.as_str()),
                metrics: &c.metrics,
                policy: c.policy.clone(),
                store_key: store_key(spec, key),
                shadow: c.shadow,
            });
        }
        if !spec.contains(':') {
            return Err(ApiError::unknown_policy(spec, field));
        }
        if !self.allow_inline_policies {
            return Err(ApiError::new(
                ErrorCode::InlinePoliciesDisabled,
                field,
                "inline policy specs are turned off on this service; use a configured policy's name (GET /v1/policies)",
            ));
        }
        let (policy, store_key) = self.inline(spec, key, field)?;
        Ok(Resolved {
            name: None,
            metrics: &self.inline_metrics,
            policy,
            store_key,
            shadow: false,
        })
    }

    /// An inline spec's policy, parsed once, and the store's key for `key` under it.
    /// Errors name `field`, the request's field holding the spec.
    fn inline(&self, spec: &str, key: &str, field: &str) -> Result<(Policy, String), ApiError> {
        if let Some((policy, namespace)) = self
            .inline
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(spec)
        {
            return Ok((policy.clone(), store_key(namespace, key)));
        }
        let policy: Policy = spec.parse().map_err(|e: InputError| {
            let at = format!("{field}.{}", e.field());
            ApiError::input(&e.renamed(at))
        })?;
        // The canonical spec keeps equal policies on the same keys.
        let namespace = format!("~{policy}");
        let store_key = store_key(&namespace, key);
        let mut cache = self.inline.write().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= INLINE_CACHE {
            cache.clear();
        }
        cache.insert(spec.to_string(), (policy.clone(), namespace));
        Ok((policy, store_key))
    }
}

/// The store's key for `key` under a policy's namespace (its name, or `~SPEC` inline).
pub(crate) fn store_key(namespace: &str, key: &str) -> String {
    let mut out = String::with_capacity(namespace.len() + 1 + key.len());
    out.push_str(namespace);
    out.push(':');
    out.push_str(key);
    out
}

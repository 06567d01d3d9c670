//! Configuring a [`RateLimitLayer`]: its limits and options, checked once by
//! [`Builder::build`].

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use paceline_core::{InputError, Op, Policy};
use paceline_store::{CachedRefusals, SharedStore, DEFAULT_REFUSALS, MAX_LIMITS};

use super::choice::{Choice, Chooser};
use super::{Limit, RateLimitLayer, Shared, StoreFailure};
use crate::headers;
use crate::key::{Head, Key};

/// Configures a [`RateLimitLayer`].
#[must_use]
pub struct Builder {
    store: SharedStore,
    refusal_cache: Option<usize>,
    limits: Vec<Limit>,
    pace: Option<Duration>,
    on_failure: StoreFailure,
    headers: bool,
    /// A limit refused as it was added (one choosing among no policies), for `build`.
    refused: Option<InputError>,
}

impl RateLimitLayer {
    /// Starts a layer whose limits live in `store` (any store: `Arc::new(MemoryStore::new())`,
    /// or what [`paceline_store::open`] opens from a URL).
    pub fn builder(store: SharedStore) -> Builder {
        Builder {
            store,
            refusal_cache: None,
            limits: Vec::new(),
            pace: None,
            on_failure: StoreFailure::Refuse,
            headers: true,
            refused: None,
        }
    }
}

impl Builder {
    /// Adds a limit: `policy` applied to each request's `key`. `name` (1 to 64 of
    /// `A-Z a-z 0-9 - _ .`) names it in the headers and problem details, and in the store.
    pub fn limit(mut self, name: impl Into<String>, policy: Policy, key: Key) -> Builder {
        let name = name.into();
        self.limits.push(Limit {
            quoted: headers::sf_string(&name),
            name,
            policy,
            key,
            chooser: None,
        });
        self
    }

    /// Adds a limit whose policy each request chooses: `choose` reads the request's head
    /// and names one of `policies` (an API key's plan, a route), and may give the key to
    /// count it under in place of `key` ([`Choice::key`]). `name` names the limit as in
    /// [`limit`](Self::limit); each policy (named as a limit is) counts its keys apart, in
    /// the store as `{KEY}:NAME:POLICY`, and the headers give the chosen policy's quota
    /// under the limit's name. A request whose choice names none of `policies` is answered
    /// `500` (the service is set up wrong).
    ///
    /// ```
    /// use paceline_store::MemoryStore;
    /// use paceline_tower::{Choice, Key, RateLimitLayer};
    /// use std::sync::Arc;
    /// // Each API key's plan, from a header an authentication layer set.
    /// let layer = RateLimitLayer::builder(Arc::new(MemoryStore::new()))
    ///     .limit_by(
    ///         "per-second",
    ///         [
    ///             ("free", "gcra:rate=5/s,burst=10".parse()?),
    ///             ("pro", "gcra:rate=100/s,burst=200".parse()?),
    ///         ],
    ///         Key::header("x-api-key"),
    ///         |head| match head.headers.get("x-plan") {
    ///             Some(plan) if plan == "pro" => "pro",
    ///             _ => "free",
    ///         },
    ///     )
    ///     // Searches count apart, under a stricter policy; the rest share one.
    ///     .limit_by(
    ///         "per-route",
    ///         [
    ///             ("search", "fixed_window:limit=10,window=1m".parse()?),
    ///             ("other", "fixed_window:limit=600,window=1m".parse()?),
    ///         ],
    ///         Key::header("x-api-key"),
    ///         |head| {
    ///             if head.uri.path().starts_with("/search") {
    ///                 Choice::policy("search")
    ///             } else {
    ///                 Choice::policy("other")
    ///             }
    ///         },
    ///     )
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn limit_by<I, N, C, F>(
        mut self,
        name: impl Into<String>,
        policies: I,
        key: Key,
        choose: F,
    ) -> Builder
    where
        I: IntoIterator<Item = (N, Policy)>,
        N: Into<String>,
        C: Into<Choice>,
        F: Fn(&Head<'_>) -> C + Send + Sync + 'static,
    {
        let name = name.into();
        let policies: Vec<(String, Policy)> =
            policies.into_iter().map(|(n, p)| (n.into(), p)).collect();
        let Some((_, first)) = policies.first() else {
            self.refused.get_or_insert_with(|| {
                InputError::new(
                    "policies",
                    format!("the `{name}` limit has no policies to choose from; give 1 to 64"),
                )
            });
            return self;
        };
        // Never applied: each request chooses.
        let policy = first.clone();
        self.limits.push(Limit {
            quoted: headers::sf_string(&name),
            name,
            policy,
            key,
            chooser: Some(Chooser {
                policies,
                choose: Box::new(move |head| choose(head).into()),
            }),
        });
        self
    }

    /// Pace mode: a request the limits would refuse waits up to `max_wait` for its turn
    /// (the task sleeps, in the store's time), and is refused only if its turn is further
    /// away.
    pub fn pace(mut self, max_wait: Duration) -> Builder {
        self.pace = Some(max_wait);
        self
    }

    /// What to do when the store cannot decide (default: [`StoreFailure::Refuse`], `503`).
    pub fn on_store_failure(mut self, failure: StoreFailure) -> Builder {
        self.on_failure = failure;
        self
    }

    /// How many refusals to remember in this process ([`CachedRefusals`]): a key refused
    /// with a retry-after is refused again, until then, without asking the store. On by
    /// default (10,000) for a store across the network (Redis), off for the memory store
    /// (which answers as fast as the cache would); `0` turns it off.
    pub fn refusal_cache(mut self, capacity: usize) -> Builder {
        self.refusal_cache = Some(capacity);
        self
    }

    /// Whether answers carry `RateLimit-Policy` and `RateLimit` (default: true; a refusal's
    /// `Retry-After` is always sent).
    pub fn headers(mut self, on: bool) -> Builder {
        self.headers = on;
        self
    }

    /// Checks the limits: 1 to [`MAX_LIMITS`], named distinctly; a limit choosing per
    /// request holds 1 to 64 policies, named distinctly as limits are.
    pub fn build(self) -> Result<RateLimitLayer, InputError> {
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        if self.limits.is_empty() || self.limits.len() > MAX_LIMITS {
            return Err(InputError::new(
                "limits",
                format!(
                    "a layer holds 1 to {MAX_LIMITS} limits, not {}; add them with .limit(name, policy, key)",
                    self.limits.len()
                ),
            ));
        }
        for (i, limit) in self.limits.iter().enumerate() {
            let name = &limit.name;
            if !valid_name(name) {
                return Err(InputError::new(
                    "name",
                    format!("`{name}` is not a limit name; use 1 to 64 of A-Z a-z 0-9 - _ ."),
                ));
            }
            if let Some(chooser) = &limit.chooser {
                check_choices(name, &chooser.policies)?;
            }
            if self.limits[..i].iter().any(|l| &l.name == name) {
                return Err(InputError::new(
                    "name",
                    format!("two limits are named `{name}`; give each its own name"),
                ));
            }
            limit.policy.check_cost(Op::Limit, 1)?;
            if let Some(why) = limit.key.invalid() {
                return Err(InputError::new(
                    "key",
                    format!("the `{name}` limit's key can never be read: {why}"),
                ));
            }
        }
        let capacity = self.refusal_cache.unwrap_or(if self.store.is_remote() {
            DEFAULT_REFUSALS
        } else {
            0
        });
        let cache = (capacity > 0)
            .then(|| Arc::new(CachedRefusals::new(Arc::clone(&self.store), capacity)));
        let store: SharedStore = match &cache {
            Some(cache) => Arc::clone(cache) as SharedStore,
            None => self.store,
        };
        // A concurrency limit's places come back when leases do: never booked ahead. A
        // limit choosing per request books ahead if every policy it may choose does.
        let candidates = |l: &Limit| -> Vec<Policy> {
            match &l.chooser {
                Some(c) => c.policies.iter().map(|(_, p)| p.clone()).collect(),
                None => vec![l.policy.clone()],
            }
        };
        let reserves = match self.limits.as_slice() {
            [one] => candidates(one)
                .iter()
                .all(|p| !matches!(p, Policy::Concurrency(_))),
            several => several.iter().all(|l| {
                candidates(l)
                    .iter()
                    .all(|p| p.pace_from(&mut None, 0, 1, 0).is_ok())
            }),
        };
        let chooses = self.limits.iter().any(|l| l.chooser.is_some());
        let quotas: Vec<(&str, u64)> = self
            .limits
            .iter()
            .map(|l| (l.name.as_str(), l.policy.limit()))
            .collect();
        let policy_header = (!chooses).then(|| headers::policy_field(&quotas)).flatten();
        Ok(RateLimitLayer {
            bodies: PhantomData,
            shared: Arc::new(Shared {
                store,
                cache,
                policy_header,
                chooses,
                limits: self.limits,
                pace: self.pace,
                reserves,
                on_failure: self.on_failure,
                headers: self.headers,
            }),
        })
    }
}

/// Whether `name` names a limit (or a policy of one): 1 to 64 of `A-Z a-z 0-9 - _ .`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The policies of limit `limit` choosing per request: 1 to 64, each named as a limit is
/// and once, each able to admit a request of cost 1.
fn check_choices(limit: &str, policies: &[(String, Policy)]) -> Result<(), InputError> {
    if policies.is_empty() || policies.len() > 64 {
        return Err(InputError::new(
            "policies",
            format!(
                "the `{limit}` limit chooses among 1 to 64 policies, not {}",
                policies.len()
            ),
        ));
    }
    for (i, (name, policy)) in policies.iter().enumerate() {
        if !valid_name(name) {
            return Err(InputError::new(
                "policies",
                format!(
                    "`{name}` (a policy of the `{limit}` limit) is not a policy name; use 1 to \
                     64 of A-Z a-z 0-9 - _ ."
                ),
            ));
        }
        if policies[..i].iter().any(|(n, _)| n == name) {
            return Err(InputError::new(
                "policies",
                format!("the `{limit}` limit has two policies named `{name}`; name each once"),
            ));
        }
        policy.check_cost(Op::Limit, 1)?;
    }
    Ok(())
}

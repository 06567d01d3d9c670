//! Configuring a [`RateLimitLayer`]: its limits and options, checked once by
//! [`Builder::build`].

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use paceline_core::{InputError, Op, Policy};
use paceline_store::{CachedRefusals, SharedStore, DEFAULT_REFUSALS, MAX_LIMITS};

use super::{Limit, RateLimitLayer, Shared, StoreFailure};
use crate::headers;
use crate::key::Key;

/// Configures a [`RateLimitLayer`].
#[must_use]
pub struct Builder {
    store: SharedStore,
    refusal_cache: Option<usize>,
    limits: Vec<Limit>,
    pace: Option<Duration>,
    on_failure: StoreFailure,
    headers: bool,
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

    /// Checks the limits: 1 to [`MAX_LIMITS`], named distinctly.
    pub fn build(self) -> Result<RateLimitLayer, InputError> {
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
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid {
                return Err(InputError::new(
                    "name",
                    format!("`{name}` is not a limit name; use 1 to 64 of A-Z a-z 0-9 - _ ."),
                ));
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
        // A concurrency limit's places come back when leases do: never booked ahead.
        let reserves = match self.limits.as_slice() {
            [one] => !matches!(one.policy, Policy::Concurrency(_)),
            several => several
                .iter()
                .all(|l| l.policy.pace_from(&mut None, 0, 1, 0).is_ok()),
        };
        let quotas: Vec<(&str, u64)> = self
            .limits
            .iter()
            .map(|l| (l.name.as_str(), l.policy.limit()))
            .collect();
        let policy_header = headers::policy_field(&quotas);
        Ok(RateLimitLayer {
            bodies: PhantomData,
            shared: Arc::new(Shared {
                store,
                cache,
                policy_header,
                limits: self.limits,
                pace: self.pace,
                reserves,
                on_failure: self.on_failure,
                headers: self.headers,
            }),
        })
    }
}

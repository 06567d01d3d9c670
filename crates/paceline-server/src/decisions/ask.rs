//! One decision request checked against the live configuration: its policy found, its key
//! namespaced, its op and cost read.

use paceline_store::secret::TokenKey;
use paceline_store::{Decision, Op, Policy, Request};

use super::shadow;
use crate::error::ApiError;
use crate::fields::{check_key, cost_field, op_field};
use crate::lease_token;
use crate::metrics::PolicyMetrics;
use crate::request::RawAsk;
use crate::state::{Live, Resolved, INLINE};

/// A validated request, borrowing from the configuration it was checked against.
pub(super) struct Ask<'a> {
    /// The name in responses and metrics: the configured name, or `inline`.
    pub(super) name: &'a str,
    pub(super) metrics: &'a PolicyMetrics,
    policy: Policy,
    /// The key in the store: namespaced by policy (`NAMESPACE:KEY`).
    store_key: String,
    /// The length of the namespace at the start of `store_key`.
    namespace_len: usize,
    op: Op,
    cost: u64,
    /// The policy is in shadow mode: a refusal is answered as admitted.
    shadow: bool,
}

impl<'a> Ask<'a> {
    /// Validates one request's fields against the live policies.
    pub(super) fn validate(live: &'a Live, fields: &RawAsk<'_>) -> Result<Ask<'a>, ApiError> {
        let RawAsk {
            policy,
            key,
            op,
            cost,
            max_wait_ms,
            limits,
        } = fields;
        if limits.is_some() {
            return Err(ApiError::invalid(
                "limits",
                "a set of limits is decided by POST /v1/decisions, one set per request",
            ));
        }
        let spec = policy.as_deref().ok_or_else(|| {
            ApiError::invalid(
                "policy",
                "is required: a configured policy's name or a spec (or give `limits`, a set of limits)",
            )
        })?;
        let key = key
            .as_deref()
            .ok_or_else(|| ApiError::invalid("key", "is required"))?;
        check_key(key, "key")?;
        let cost = cost_field(cost.as_ref(), "cost")?.unwrap_or(1);
        let op = op_field(op.as_deref().unwrap_or("pace"), max_wait_ms.as_ref())?;
        let Resolved {
            name,
            metrics,
            policy,
            store_key,
            shadow,
        } = live.resolve(spec, key, "policy")?;
        // The cost is checked against the policy by the store, once, as it decides.
        Ok(Ask {
            name: name.unwrap_or(INLINE),
            metrics,
            policy,
            namespace_len: store_key.len() - key.len() - 1,
            store_key,
            op,
            cost,
            shadow,
        })
    }

    /// What the store is asked.
    pub(super) fn request(&self) -> Request<'_> {
        Request::new(&self.policy, &self.store_key, self.op, self.cost)
    }

    /// The answer to decision `d` (counted already): `d` itself, or, for a refusal by a
    /// shadow-mode policy, an admit with no wait (counted in the policy's
    /// `paceline_shadow_admitted_total`). The flag says shadow mode turned a refusal.
    pub(super) fn answer(&self, d: &Decision) -> (Decision, bool) {
        if !self.shadow {
            return (*d, false);
        }
        let (answer, shadowed) = shadow::answered(d);
        if shadowed {
            self.metrics.shadow_admitted();
        }
        (answer, shadowed)
    }

    /// The key as the request gave it.
    pub(super) fn key(&self) -> &str {
        self.store_key
            .get(self.namespace_len + 1..)
            .unwrap_or_default()
    }

    /// The token of lease `id` this request's decision took (see [`crate::lease_token`]).
    pub(super) fn lease_token(&self, signer: &TokenKey, id: u64) -> String {
        let namespace = self.store_key.get(..self.namespace_len).unwrap_or_default();
        lease_token::token(signer, namespace, self.key(), id)
    }
}

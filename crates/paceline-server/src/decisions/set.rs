//! A set of limits decided as one (`POST /v1/decisions` with `limits`): every limit admits
//! and each counts it, or none changes. The answer is the combined decision with one entry
//! per limit, and the headers list every limit.
//!
//! A limit by a policy in shadow mode never refuses the set: the other limits are decided
//! as one set, then each shadow-mode limit on its own ([`shadow::decide_each`]), counting
//! the request when the set is admitted.

use axum::response::Response;
use paceline_store::redis::cross_slot_error;
use paceline_store::{
    Decision, Error, Fallback, InputError, Op, Policy, Request, SharedStore, StoreError,
    StoreErrorKind, MAX_LIMITS,
};
use serde::Serialize;
use utoipa::ToSchema;

use super::shadow;
use crate::error::ApiError;
use crate::fields::{check_key, cost_field, op_field};
use crate::lease_token;
use crate::metrics::PolicyMetrics;
use crate::outcome::{rate_limited, status_of};
use crate::request::RawAsk;
use crate::state::{AppState, Live, INLINE};
use crate::units::ms;

/// A validated set of limits.
pub(super) struct SetAsk<'a> {
    /// The distinct limits, in the order the request first names them.
    parts: Vec<Part<'a>>,
    /// For each limit as the request gave it, the part that decides it: a limit named
    /// again (the same policy on the same key) adds its cost to the first's.
    positions: Vec<usize>,
}

/// One limit of a set.
struct Part<'a> {
    /// The request's first position naming this limit.
    first: usize,
    /// Its name in the answer and the headers, distinct within the set: the configured
    /// policy's name, `inline-N` for an inline spec at position N (from 1), and a name
    /// already taken gets `#N` added.
    name: String,
    /// The key as the request gave it.
    key: String,
    /// The policy's namespace of keys: its configured name, or `~SPEC`.
    namespace: String,
    metrics: &'a PolicyMetrics,
    policy: Policy,
    store_key: String,
    op: Op,
    cost: u64,
    /// The policy is in shadow mode: decided after the set, on its own, and never refusing.
    shadow: bool,
}

impl Part<'_> {
    /// What the store is asked of this limit.
    fn request(&self) -> Request<'_> {
        Request::new(&self.policy, &self.store_key, self.op, self.cost)
    }
}

/// The answer to a set of limits: the combined decision and one entry per limit (fields in
/// alphabetical order, as in a single decision's answer).
#[derive(Serialize, ToSchema)]
#[schema(as = SetDecision)]
pub(super) struct SetBody<'a> {
    /// Every limit admitted, and each counted it; refused, none changed.
    allowed: bool,
    /// How long to wait: the longest of the limits' delays.
    delay_ms: f64,
    /// Set when the store failed and the failure policy answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    fallback: Option<&'static str>,
    limit: u64,
    limits: Vec<PartBody<'a>>,
    remaining: u64,
    reset_after_ms: f64,
    /// Set (to `true`) only when the set is admitted although a limit in shadow mode
    /// refused it (that limit's entry says `shadow` too).
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
}

/// One limit's entry in a set's answer.
#[derive(Serialize, ToSchema)]
#[schema(as = SetLimitDecision)]
struct PartBody<'a> {
    allowed: bool,
    delay_ms: f64,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
    reset_after_ms: f64,
    /// Set (to `true`) only when this limit is in shadow mode and refused: its entry
    /// admits all the same, with no wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
}

impl<'a> SetAsk<'a> {
    /// Validates a request with `limits`: 1 to [`MAX_LIMITS`] limits, each with a policy
    /// and a key, no `policy` or `key` beside them; the op defaults to `limit` (a `pace`
    /// set books the earliest time every limit admits: see `paceline_store::set`).
    pub(super) fn validate(live: &'a Live, fields: &RawAsk<'_>) -> Result<SetAsk<'a>, ApiError> {
        let RawAsk {
            policy,
            key,
            op,
            cost,
            max_wait_ms,
            limits,
        } = fields;
        let limits = limits.as_deref().unwrap_or_default();
        for (given, name) in [(policy.is_some(), "policy"), (key.is_some(), "key")] {
            if given {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` and `limits` do not go together: give `policy` and `key` for one limit, or `limits` for a set"),
                ));
            }
        }
        if limits.is_empty() || limits.len() > MAX_LIMITS {
            return Err(ApiError::invalid(
                "limits",
                format!(
                    "holds {} limits; give 1 to {MAX_LIMITS}, each {{\"policy\", \"key\"}}",
                    limits.len()
                ),
            ));
        }
        let cost = cost_field(cost.as_ref(), "cost")?.unwrap_or(1);
        let op = op_field(op.as_deref().unwrap_or("limit"), max_wait_ms.as_ref())?;
        let mut parts: Vec<Part> = Vec::with_capacity(limits.len());
        let mut positions = Vec::with_capacity(limits.len());
        for (i, raw) in limits.iter().enumerate() {
            let field = |name: &str| format!("limits[{i}].{name}");
            let spec = raw.policy.as_deref().ok_or_else(|| {
                ApiError::invalid(
                    field("policy"),
                    "is required: a configured policy's name or a spec",
                )
            })?;
            let key = raw
                .key
                .as_deref()
                .ok_or_else(|| ApiError::invalid(field("key"), "is required"))?;
            check_key(key, &field("key"))?;
            let cost = cost_field(raw.cost.as_ref(), &field("cost"))?.unwrap_or(cost);
            let resolved = live.resolve(spec, key, &field("policy"))?;
            // A cost this limit can never admit is its own entry's fault.
            resolved.policy.check_cost(op, cost).map_err(|e| {
                let at = field(e.field());
                ApiError::input(&e.renamed(at))
            })?;
            if let Some(j) = parts.iter().position(|p| p.store_key == resolved.store_key) {
                // The same policy on the same key again: one limit, counting both costs.
                let part = &mut parts[j];
                let together = part.cost.saturating_add(cost);
                part.policy.check_cost(op, together).map_err(|e| {
                    let message = format!(
                        "{} (limits[{}] names the same policy on the same key: a limit named \
                         twice counts both costs, {together} together)",
                        e.message(),
                        part.first
                    );
                    let at = field(e.field());
                    ApiError::input(&if e.is_beyond_policy() {
                        InputError::beyond_policy(at, message)
                    } else {
                        InputError::new(at, message)
                    })
                })?;
                part.cost = together;
                positions.push(j);
                continue;
            }
            let mut name = match resolved.name {
                Some(name) => name.to_string(),
                None => format!("{INLINE}-{}", i + 1),
            };
            if parts.iter().any(|p| p.name == name) {
                name = format!("{name}#{}", i + 1);
            }
            let namespace = resolved.namespace(key).to_string();
            positions.push(parts.len());
            parts.push(Part {
                first: i,
                name,
                key: key.to_string(),
                namespace,
                metrics: resolved.metrics,
                policy: resolved.policy,
                store_key: resolved.store_key,
                op,
                cost,
                shadow: resolved.shadow,
            });
        }
        Ok(SetAsk { parts, positions })
    }

    /// Decides the set as one and answers: `200` admitted or `429` refused, with the
    /// combined decision and one entry per limit, and the headers listing every limit.
    /// The limits in shadow mode are decided after the others, each on its own.
    pub(super) async fn decide(&self, state: &AppState) -> Result<Response, ApiError> {
        let (shadows, real): (Vec<&Part>, Vec<&Part>) = self.parts.iter().partition(|p| p.shadow);
        let requests: Vec<Request> = real.iter().map(|p| p.request()).collect();
        let decided = if requests.is_empty() {
            None
        } else {
            let started = quanta::Instant::now();
            let outcome = state.store.decide_all(&requests).await;
            state.metrics.observe_store(started.elapsed());
            match outcome {
                Ok(decided) => Some(decided),
                Err(Error::Input(e)) => return Err(self.input_error(&state.store, &e)),
                Err(e) => {
                    // The shadow-mode limits were not asked.
                    for part in &real {
                        part.metrics.failed();
                    }
                    if matches!(e, Error::Store(_)) {
                        state.metrics.store_errors.inc();
                    }
                    return Err(ApiError::from(e));
                }
            }
        };
        let admitted = decided.as_ref().is_none_or(|d| d.allowed());
        if decided
            .as_ref()
            .is_some_and(|d| d.decision.fallback.is_some())
        {
            state.metrics.store_errors.inc();
        }
        let shadow_requests: Vec<Request> = shadows.iter().map(|p| p.request()).collect();
        let started = quanta::Instant::now();
        let shadowed = shadow::decide_each(&state.store, &shadow_requests, admitted).await;
        if !shadow_requests.is_empty() {
            state.metrics.observe_store(started.elapsed());
        }
        // Each limit's decision as made, and as answered, by its place in `parts`.
        let mut made: Vec<Decision> = Vec::with_capacity(self.parts.len());
        let mut answers: Vec<(Decision, bool)> = Vec::with_capacity(self.parts.len());
        let mut real_decisions = decided.iter().flat_map(|d| d.limits.iter().copied());
        let mut shadow_outcomes = shadowed.into_iter();
        let mut any_shadowed = false;
        for part in &self.parts {
            let d = if part.shadow {
                match shadow_outcomes.next() {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => {
                        // A shadow-mode limit never fails the set: it answers as if
                        // failing open, and counts as an error.
                        part.metrics.failed();
                        if matches!(e, Error::Store(_)) {
                            state.metrics.store_errors.inc();
                        }
                        tracing::debug!(policy = %part.name, "a shadow-mode limit was not decided: {e}");
                        let mut d = Decision::from_micros(true, 0.0, 0, 0.0, part.policy.limit());
                        d.fallback = Some(Fallback::FailOpen);
                        made.push(d);
                        answers.push((d, false));
                        continue;
                    }
                    None => {
                        return Err(ApiError::from(Error::from(StoreError::new(
                            StoreErrorKind::Protocol,
                            "no answer",
                        ))))
                    }
                }
            } else {
                match real_decisions.next() {
                    Some(d) => d,
                    None => {
                        return Err(ApiError::from(Error::from(StoreError::new(
                            StoreErrorKind::Protocol,
                            "no answer",
                        ))))
                    }
                }
            };
            if part.shadow && d.fallback.is_some() {
                state.metrics.store_errors.inc();
            }
            // A limit that would have admitted a refused set did not admit anything.
            let mut counted = d;
            counted.allowed &= admitted;
            part.metrics.decided(&counted, &part.key);
            let answer = if part.shadow {
                let (answer, shadowed) = shadow::answered(&d);
                if shadowed && admitted {
                    part.metrics.shadow_admitted();
                    any_shadowed = true;
                }
                (answer, shadowed)
            } else {
                (d, false)
            };
            made.push(d);
            answers.push(answer);
        }
        let combined = match &decided {
            Some(decided) => decided.decision,
            // Only limits in shadow mode: admitted, waiting for the longest of their waits,
            // and saying the limit with the least left.
            None => {
                let mut combined = answers
                    .iter()
                    .map(|(a, _)| *a)
                    .min_by_key(|a| a.remaining)
                    .unwrap_or_else(|| Decision::from_micros(true, 0.0, 0, 0.0, 0));
                combined.delay = answers
                    .iter()
                    .map(|(a, _)| a.delay)
                    .max()
                    .unwrap_or_default();
                combined.fallback = None;
                combined
            }
        };
        let body = SetBody {
            allowed: combined.allowed,
            delay_ms: ms(combined.delay),
            fallback: combined.fallback.map(|f| f.name()),
            limit: combined.limit,
            limits: self
                .positions
                .iter()
                .filter_map(|&at| Some((self.parts.get(at)?, answers.get(at)?)))
                .map(|(part, (d, shadowed))| PartBody {
                    allowed: d.allowed,
                    delay_ms: ms(d.delay),
                    key: &part.key,
                    lease: d.lease.map(|id| {
                        lease_token::token(&state.lease_key, &part.namespace, &part.key, id)
                    }),
                    limit: d.limit,
                    policy: &part.name,
                    remaining: d.remaining,
                    reset_after_ms: ms(d.reset_after),
                    shadow: shadowed.then_some(true),
                })
                .collect(),
            remaining: combined.remaining,
            reset_after_ms: ms(combined.reset_after),
            shadow: any_shadowed.then_some(true),
        };
        let named: Vec<(&str, &Decision)> = self
            .parts
            .iter()
            .map(|p| p.name.as_str())
            .zip(&made)
            .collect();
        Ok(rate_limited(status_of(&combined), body, &named, &combined))
    }

    /// The error for the store's refusal of the set's input. Keys in different hash slots
    /// of a Redis Cluster are named as the request gave them, with the limits whose keys
    /// they are (the store's keys, `NAMESPACE:KEY`, are the service's own business).
    fn input_error(&self, store: &SharedStore, e: &InputError) -> ApiError {
        let keys: Vec<&str> = self.parts.iter().map(|p| p.store_key.as_str()).collect();
        let named = |at: usize| {
            self.parts
                .get(at)
                .map(|p| format!("`{}` (limits[{}].key)", p.key, p.first))
        };
        match store
            .key_apart(&keys)
            .and_then(|i| Some((named(0)?, named(i)?)))
        {
            Some((first, other)) => ApiError::input(&cross_slot_error(&first, &other)),
            None => ApiError::input(e),
        }
    }
}

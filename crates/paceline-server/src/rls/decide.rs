//! One `ShouldRateLimit` request decided: the request checked, matched against the rules
//! ([`match_request`]), every counted limit decided as one set in the store (all or
//! nothing), and the answer built. gRPC and `POST /json` both answer with this.
//!
//! The order of the store's calls, so that a request counts on every limit or on none:
//!
//! 1. the limits checked without counting (`hits_addend` 0: `peek`), as one set;
//! 2. the counted limits as one set (`limit`), or, if something refused already (a rule of
//!    0 requests, a cost no limit can admit, a checked limit with nothing left), as one
//!    `peek` set that only reports;
//! 3. the charged limits (rules with `drain: true`) as one set (`charge`: counted past the
//!    limit, never refused) once the request is admitted, as one `peek` set otherwise, so a
//!    refused request counts on none of its limits here either;
//! 4. the shadow-mode limits, each on its own (`limit` once the request is admitted, `peek`
//!    otherwise: [`crate::decisions::shadow::decide_each`], as the HTTP API's sets decide
//!    their shadow-mode policies); their answer is always OK and a failure of theirs is
//!    only logged.
//!
//! Once every outcome is known, each descriptor's hits are added to its rule's metrics
//! (`paceline_rls_*_total{rule}`): a request answered with an error counts nowhere.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ResponseUnit, Code, DescriptorStatus, RateLimit as RlsLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use paceline_store::{Decision, Error, Op, Policy, Request, SharedStore, MAX_LIMITS};

use super::config::{RlsConfig, Unit, UnitLimit};
use super::matching::{match_request, Applies, Matched, RequestDescriptor};
use crate::metrics::RuleHits;
use crate::state::AppState;

/// Why a request has no answer: it is wrong (`INVALID_ARGUMENT`, or `400` on `/json`), or
/// the store failed and the failure policy refuses (`UNAVAILABLE`, or `503`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RlsError {
    /// A field of the request is wrong: the field (`descriptors[0].entries[1].key`) and
    /// what to do.
    Invalid {
        /// The request's field at fault.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// The store failed and the service's failure policy is `fail_closed`.
    Unavailable(String),
}

impl RlsError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> RlsError {
        RlsError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<RlsError> for tonic::Status {
    fn from(e: RlsError) -> tonic::Status {
        match e {
            RlsError::Invalid { field, message } => {
                tonic::Status::invalid_argument(format!("`{field}`: {message}"))
            }
            RlsError::Unavailable(message) => tonic::Status::unavailable(message),
        }
    }
}

/// The longest domain taken, in bytes.
pub(crate) const MAX_DOMAIN: usize = 256;

/// The longest key a descriptor's entries may make to count under, in bytes (the domain,
/// and each key and value with its length).
pub(crate) const MAX_COUNTING_KEY: usize = 4096;

/// The namespace of every counter the RLS service keeps, ahead of the domain's hash tag.
/// (`~` keeps it apart from configured policies' names, and `~rls:` is no inline spec.)
const NAMESPACE: &str = "~rls:";

/// The store's key of one counter: `~rls:{DOMAIN}:SPEC:COUNTING_KEY`. The domain in braces
/// is a Redis Cluster hash tag, so every counter of a domain (and so every limit of one
/// request) is in one hash slot; the canonical policy spec keeps different limits on the
/// same descriptor apart, and leaves an unchanged rule's counters where they were across a
/// reload.
pub(crate) fn store_key(domain: &str, policy: &Policy, counting_key: &str) -> String {
    format!("{NAMESPACE}{{{domain}}}:{policy}:{counting_key}")
}

/// The request's descriptors as [`match_request`] takes them, each checked.
fn descriptors(request: &RateLimitRequest) -> Result<Vec<RequestDescriptor<'_>>, RlsError> {
    if request.domain.is_empty() {
        return Err(RlsError::invalid(
            "domain",
            "is empty: name the domain of the rate limit configuration",
        ));
    }
    if request.domain.len() > MAX_DOMAIN {
        return Err(RlsError::invalid(
            "domain",
            format!(
                "is {} bytes long; at most {MAX_DOMAIN} (every counter's key holds it)",
                request.domain.len()
            ),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(RlsError::invalid(
            "descriptors",
            "is empty: give at least one descriptor with at least one entry",
        ));
    }
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| descriptor(i, d))
        .collect()
}

fn descriptor(i: usize, d: &RateLimitDescriptor) -> Result<RequestDescriptor<'_>, RlsError> {
    let field = |name: &str| format!("descriptors[{i}].{name}");
    if d.entries.is_empty() {
        return Err(RlsError::invalid(
            field("entries"),
            "is empty: a descriptor holds at least one entry (a key and a value)",
        ));
    }
    if d.is_negative_hits {
        return Err(RlsError::invalid(
            field("is_negative_hits"),
            "is not supported: paceline gives nothing back to a limit; leave it false",
        ));
    }
    let mut entries = Vec::with_capacity(d.entries.len());
    for (j, entry) in d.entries.iter().enumerate() {
        if entry.key.is_empty() {
            return Err(RlsError::invalid(
                field(&format!("entries[{j}].key")),
                "is empty: every entry needs a key",
            ));
        }
        entries.push((entry.key.as_str(), entry.value.as_str()));
    }
    let limit = match &d.limit {
        None => None,
        Some(o) => {
            let unit = match RateLimitUnit::try_from(o.unit) {
                Ok(RateLimitUnit::Second) => Unit::Second,
                Ok(RateLimitUnit::Minute) => Unit::Minute,
                Ok(RateLimitUnit::Hour) => Unit::Hour,
                Ok(RateLimitUnit::Day) => Unit::Day,
                Ok(other) => {
                    return Err(RlsError::invalid(
                        field("limit.unit"),
                        format!(
                        "`{}` is not a unit paceline limits by; use SECOND, MINUTE, HOUR or DAY",
                        other.as_str_name()
                    ),
                    ))
                }
                Err(_) => {
                    return Err(RlsError::invalid(
                        field("limit.unit"),
                        format!("{} is no unit; use SECOND, MINUTE, HOUR or DAY", o.unit),
                    ))
                }
            };
            Some(UnitLimit {
                requests_per_unit: o.requests_per_unit,
                unit,
            })
        }
    };
    Ok(RequestDescriptor {
        entries,
        limit,
        hits_addend: d.hits_addend.as_ref().map(|h| h.value),
    })
}

/// A limit of the request decided in the store.
struct Part {
    /// The descriptors (their positions) this limit answers for.
    descriptors: Vec<usize>,
    policy: Policy,
    store_key: String,
    cost: u64,
}

/// What each descriptor's status comes from.
#[derive(Clone, Copy)]
enum Source {
    /// OK, no limit.
    Ok,
    /// `unlimited`.
    Unlimited,
    /// Refused without asking the store (0 requests, or a cost beyond the limit).
    Refused,
    /// OK in any case, without asking the store (a shadow rule of 0 requests, or a cost
    /// beyond it).
    ShadowRefused,
    /// The decision of the part at this position of the checked set.
    Peeked(usize),
    /// The decision of the part at this position of the counted set.
    Counted(usize),
    /// The decision of the part at this position of the charged set (`drain: true`).
    Charged(usize),
    /// The decision of the shadow limit at this position.
    Shadow(usize),
}

/// The answer to a request, and its limits' decisions (for the headers).
pub(crate) struct Answer {
    /// The protocol's answer.
    pub(crate) response: RateLimitResponse,
    /// Whether the request is over a limit.
    pub(crate) refused: bool,
}

/// Decides `request` under `config`, on `state`'s store: all or nothing (see the module).
/// `headers` adds `RateLimit-Policy` and `RateLimit` to the answer's
/// `response_headers_to_add`.
pub(crate) async fn decide(
    state: &AppState,
    config: &RlsConfig,
    request: &RateLimitRequest,
    headers: bool,
) -> Result<Answer, RlsError> {
    let descriptors = descriptors(request)?;
    let hits = u64::from(request.hits_addend);
    let applies = match_request(config, &request.domain, hits, &descriptors);
    let limits = applies
        .iter()
        .filter(|a| matches!(a, Applies::Limit { .. }))
        .count();
    if limits > MAX_LIMITS {
        return Err(RlsError::invalid(
            "descriptors",
            format!(
                "{limits} limits apply to this request; one request is decided with at most \
                 {MAX_LIMITS}: split the descriptors over several requests"
            ),
        ));
    }
    let mut refused = false;
    let mut sources = Vec::with_capacity(applies.len());
    let mut peeked: Vec<Part> = Vec::new();
    let mut counted: Vec<Part> = Vec::new();
    let mut charged: Vec<Part> = Vec::new();
    let mut shadows: Vec<(Part, Op)> = Vec::new();
    for (i, applied) in applies.iter().enumerate() {
        let source = match applied {
            Applies::None => Source::Ok,
            Applies::Unlimited(_) => Source::Unlimited,
            Applies::RefuseAll(m) if m.shadow_mode => Source::ShadowRefused,
            Applies::RefuseAll(_) => {
                refused = true;
                Source::Refused
            }
            Applies::Limit { matched, policy } => {
                let op = if matched.hits == 0 {
                    Op::Peek
                } else if matched.drain {
                    Op::Charge
                } else {
                    Op::Limit
                };
                let cost = matched.hits.max(1);
                if let Err(e) = policy.check_cost(op, cost) {
                    if !e.is_beyond_policy() {
                        return Err(RlsError::invalid(
                            format!("descriptors[{i}].hits_addend"),
                            e.message().to_string(),
                        ));
                    }
                    // More than the limit ever admits: over the limit, nothing to ask.
                    if matched.shadow_mode {
                        sources.push(Source::ShadowRefused);
                    } else {
                        refused = true;
                        sources.push(Source::Refused);
                    }
                    continue;
                }
                if matched.counting_key.len() > MAX_COUNTING_KEY {
                    return Err(RlsError::invalid(
                        format!("descriptors[{i}].entries"),
                        format!(
                            "make a key of {} bytes to count under; at most {MAX_COUNTING_KEY}: \
                             send shorter values",
                            matched.counting_key.len()
                        ),
                    ));
                }
                let key = store_key(&request.domain, policy, &matched.counting_key);
                if matched.shadow_mode {
                    shadows.push((
                        Part {
                            descriptors: vec![i],
                            policy: policy.clone(),
                            store_key: key,
                            cost,
                        },
                        op,
                    ));
                    Source::Shadow(shadows.len() - 1)
                } else {
                    let (set, wrap): (&mut Vec<Part>, fn(usize) -> Source) = match op {
                        Op::Peek => (&mut peeked, Source::Peeked),
                        Op::Charge => (&mut charged, Source::Charged),
                        _ => (&mut counted, Source::Counted),
                    };
                    match set.iter().position(|p| p.store_key == key) {
                        Some(at) => {
                            // The same counter twice: counted once, with both costs
                            // (a check stays a check of one).
                            let part = &mut set[at];
                            part.descriptors.push(i);
                            if op != Op::Peek {
                                part.cost = part.cost.saturating_add(cost);
                                if let Err(e) = part.policy.check_cost(op, part.cost) {
                                    if !e.is_beyond_policy() {
                                        return Err(RlsError::invalid(
                                            format!("descriptors[{i}].hits_addend"),
                                            e.message().to_string(),
                                        ));
                                    }
                                    refused = true;
                                }
                            }
                            wrap(at)
                        }
                        None => {
                            set.push(Part {
                                descriptors: vec![i],
                                policy: policy.clone(),
                                store_key: key,
                                cost,
                            });
                            wrap(set.len() - 1)
                        }
                    }
                }
            }
        };
        sources.push(source);
    }

    let store = &state.store;
    let peeks = decide_set(state, &peeked, Op::Peek).await?;
    if peeks.iter().any(|d| !d.allowed) {
        refused = true;
    }
    let counts = if refused {
        decide_set(state, &counted, Op::Peek).await?
    } else {
        let decided = decide_set(state, &counted, Op::Limit).await?;
        if decided.iter().any(|d| !d.allowed) {
            refused = true;
        }
        decided
    };
    let charges = decide_set(state, &charged, if refused { Op::Peek } else { Op::Charge }).await?;
    let shadow_requests: Vec<Request> = shadows
        .iter()
        .map(|(part, op)| Request::new(&part.policy, &part.store_key, *op, part.cost))
        .collect();
    let outcomes = crate::decisions::shadow::decide_each(store, &shadow_requests, !refused).await;
    let mut shadowed = Vec::with_capacity(shadows.len());
    for ((part, _), outcome) in shadows.iter().zip(outcomes) {
        match outcome {
            Ok(d) => {
                if !d.allowed {
                    tracing::info!(
                        target: "paceline::rls",
                        domain = %request.domain,
                        key = %part.store_key,
                        "a shadow-mode limit would have refused"
                    );
                }
                shadowed.push(Some(d));
            }
            Err(e) => {
                tracing::warn!(target: "paceline::rls", "a shadow-mode limit was not decided: {e}");
                shadowed.push(None);
            }
        }
    }

    let mut statuses = Vec::with_capacity(applies.len());
    let mut named: Vec<(String, Decision)> = Vec::new();
    for (applied, source) in applies.iter().zip(&sources) {
        let matched = applied.matched();
        let current_limit = matched.and_then(current_limit);
        let status = match *source {
            Source::Ok => status(Code::Ok, None, 0, None),
            Source::Unlimited => status(Code::Ok, current_limit, u32::MAX, None),
            Source::Refused => status(Code::OverLimit, current_limit, 0, None),
            Source::ShadowRefused => status(Code::Ok, current_limit, 0, None),
            Source::Peeked(at) | Source::Counted(at) | Source::Charged(at) | Source::Shadow(at) => {
                let decision = match *source {
                    Source::Peeked(_) => peeks.get(at).copied(),
                    Source::Counted(_) => counts.get(at).copied(),
                    Source::Charged(_) => charges.get(at).copied(),
                    _ => shadowed.get(at).copied().flatten(),
                };
                match decision {
                    Some(d) => {
                        let shadow = matches!(source, Source::Shadow(_));
                        let code = if d.allowed || shadow {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        };
                        if headers && !shadow {
                            if let Some(m) = matched {
                                named.push((header_name(m), d));
                            }
                        }
                        status(
                            code,
                            current_limit,
                            u32::try_from(d.remaining).unwrap_or(u32::MAX),
                            Some(d.reset_after),
                        )
                    }
                    None => status(Code::Ok, current_limit, 0, None),
                }
            }
        };
        statuses.push(status);
    }
    count_rules(
        state,
        &applies,
        &sources,
        Decided {
            peeks: &peeks,
            counted: &counted,
            counts: &counts,
            charged_parts: &charged,
            charges: &charges,
            shadows: &shadows,
            shadowed: &shadowed,
            charged: !refused,
        },
    );
    let overall = if refused { Code::OverLimit } else { Code::Ok };
    let mut response = RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        ..Default::default()
    };
    if headers && !named.is_empty() {
        let named: Vec<(&str, &Decision)> = named.iter().map(|(n, d)| (n.as_str(), d)).collect();
        // Admitted as combined: the answer says the limits, not a `Retry-After`.
        let mut combined = *named[0].1;
        combined.allowed = true;
        let mut map = axum::http::HeaderMap::new();
        paceline_tower::headers::insert(&mut map, &named, &combined);
        for name in ["ratelimit-policy", "ratelimit"] {
            if let Some(value) = map.get(name).and_then(|v| v.to_str().ok()) {
                response.response_headers_to_add.push(HeaderValue {
                    key: header_key(name).to_string(),
                    value: value.to_string(),
                    ..Default::default()
                });
            }
        }
    }
    Ok(Answer { response, refused })
}

/// What the store decided of a request's limits, for its metrics.
struct Decided<'a> {
    /// The checked set's decisions.
    peeks: &'a [Decision],
    /// The counted set's limits...
    counted: &'a [Part],
    /// ...and their decisions.
    counts: &'a [Decision],
    /// The charged set's limits (`drain: true`)...
    charged_parts: &'a [Part],
    /// ...and their decisions.
    charges: &'a [Decision],
    /// The shadow-mode limits...
    shadows: &'a [(Part, Op)],
    /// ...and their decisions (none where the store failed).
    shadowed: &'a [Option<Decision>],
    /// Whether the request was admitted, and so its counted limits charged.
    charged: bool,
}

/// Adds each matched descriptor's hits to its rule's series (see [`RuleHits`]).
fn count_rules(state: &AppState, applies: &[Applies], sources: &[Source], decided: Decided<'_>) {
    for (i, (applied, source)) in applies.iter().zip(sources).enumerate() {
        let Some(m) = applied.matched() else {
            continue;
        };
        let hits = m.hits;
        let only = RuleHits {
            hits,
            ..RuleHits::default()
        };
        let within = |near_limit: u64| RuleHits {
            hits,
            within_limit: hits,
            near_limit,
            ..RuleHits::default()
        };
        let over = RuleHits {
            hits,
            over_limit: hits,
            ..RuleHits::default()
        };
        let shadow = RuleHits {
            shadow_mode: hits,
            ..over
        };
        let outcome = match *source {
            Source::Ok => continue,
            Source::Unlimited => within(0),
            Source::Refused => over,
            Source::ShadowRefused => shadow,
            Source::Peeked(at) => match decided.peeks.get(at) {
                Some(d) if d.allowed => within(0),
                Some(_) => over,
                None => only,
            },
            // A charge is never refused: its hits are over the limit when they left the key
            // with nothing (at or past its limit), else within it, as a count's are.
            Source::Counted(at) | Source::Charged(at) => {
                let (decisions, parts) = match *source {
                    Source::Counted(_) => (decided.counts, decided.counted),
                    _ => (decided.charges, decided.charged_parts),
                };
                let in_debt = matches!(source, Source::Charged(_)) && decided.charged;
                match (decisions.get(at), parts.get(at)) {
                    (Some(d), _) if in_debt && d.remaining == 0 => over,
                    (Some(d), Some(part)) if d.allowed => within(if decided.charged {
                        near_in_part(d, part, i, applies)
                    } else {
                        0
                    }),
                    (Some(_), _) => over,
                    _ => only,
                }
            }
            Source::Shadow(at) => match (
                decided.shadowed.get(at).copied().flatten(),
                decided.shadows.get(at),
            ) {
                (Some(d), Some((part, _))) if d.allowed => within(if decided.charged {
                    let used = d.limit.saturating_sub(d.remaining);
                    near_limit(d.limit, used.saturating_sub(part.cost), hits)
                } else {
                    0
                }),
                (Some(_), _) => shadow,
                _ => only,
            },
        };
        state
            .metrics
            .rls
            .count(&m.rule_id, m.rule_id_from_request, outcome);
    }
}

/// The near-limit hits of descriptor `at` in `part`, a limit the request was charged on
/// with decision `d`: the part's descriptors took their hits one after the other, in order,
/// ending at the decision's use (`limit − remaining`).
fn near_in_part(d: &Decision, part: &Part, at: usize, applies: &[Applies]) -> u64 {
    let hits = |j: usize| {
        applies
            .get(j)
            .and_then(Applies::matched)
            .map_or(0, |m| m.hits)
    };
    let mut used = d
        .limit
        .saturating_sub(d.remaining)
        .saturating_sub(part.cost);
    for &j in &part.descriptors {
        if j == at {
            return near_limit(d.limit, used, hits(j));
        }
        used = used.saturating_add(hits(j));
    }
    0
}

/// The hits past which a limit's hits count as near it: 80 % of `limit`, rounded down.
pub(crate) fn near_limit_threshold(limit: u64) -> u64 {
    limit / 5 * 4 + limit % 5 * 4 / 5
}

/// How many of `hits` charged on a limit of `limit` already used `used` times are near it:
/// those whose place, counted one by one from `used + 1`, is above
/// [`near_limit_threshold`] and at most `limit`.
pub(crate) fn near_limit(limit: u64, used: u64, hits: u64) -> u64 {
    let end = used.saturating_add(hits).min(limit);
    end.saturating_sub(used.max(near_limit_threshold(limit)))
}

/// A header's name as the answer spells it.
fn header_key(name: &str) -> &'static str {
    if name == "ratelimit" {
        "RateLimit"
    } else {
        "RateLimit-Policy"
    }
}

/// The name of a limit in the `RateLimit` headers: the rule's `name`, else its id.
fn header_name(m: &Matched) -> String {
    m.name.clone().unwrap_or_else(|| m.rule_id.clone())
}

/// Decides `parts` as one set with `op` (each its own cost; `peek` checks one).
async fn decide_set(state: &AppState, parts: &[Part], op: Op) -> Result<Vec<Decision>, RlsError> {
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let requests: Vec<Request> = parts
        .iter()
        .map(|p| {
            let cost = if op == Op::Peek { 1 } else { p.cost };
            Request::new(&p.policy, &p.store_key, op, cost)
        })
        .collect();
    let started = quanta::Instant::now();
    let outcome = state.store.decide_all(&requests).await;
    state.metrics.observe_store(started.elapsed());
    match outcome {
        Ok(decided) => {
            if decided.decision.fallback.is_some() {
                state.metrics.store_errors.inc();
            }
            Ok(decided.limits)
        }
        Err(Error::Input(e)) => Err(input_error(&state.store, &e)),
        Err(e) => {
            if matches!(e, Error::Store(_)) {
                state.metrics.store_errors.inc();
            }
            Err(RlsError::Unavailable(format!(
                "the store failed and the service fails closed: {e}"
            )))
        }
    }
}

/// The store's refusal of a set's input (none is expected: the costs are checked, the keys
/// distinct and in one hash slot).
fn input_error(_store: &SharedStore, e: &paceline_store::InputError) -> RlsError {
    RlsError::invalid("descriptors", e.message().to_string())
}

/// The answer's `current_limit` for what matched: `requests_per_unit` per `unit` as
/// configured (or as the request set it); none for a `policy` rule, which may not be a
/// count per unit.
fn current_limit(m: &Matched) -> Option<RlsLimit> {
    let limit = m.current_limit?;
    let unit = match limit.unit {
        Unit::Second => ResponseUnit::Second,
        Unit::Minute => ResponseUnit::Minute,
        Unit::Hour => ResponseUnit::Hour,
        Unit::Day => ResponseUnit::Day,
    };
    Some(RlsLimit {
        name: m.name.clone().unwrap_or_default(),
        requests_per_unit: limit.requests_per_unit,
        unit: unit as i32,
    })
}

fn status(
    code: Code,
    current_limit: Option<RlsLimit>,
    remaining: u32,
    reset_after: Option<Duration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining: remaining,
        duration_until_reset: reset_after.map(proto_duration),
        ..Default::default()
    }
}

/// A duration as protobuf's `Duration`.
fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_near_limit_threshold_is_80_percent_rounded_down() {
        for (limit, threshold) in [(0, 0), (1, 0), (4, 3), (5, 4), (10, 8), (11, 8), (99, 79)] {
            assert_eq!(near_limit_threshold(limit), threshold, "{limit}");
        }
        assert_eq!(near_limit_threshold(u64::MAX), u64::MAX / 5 * 4);
    }

    #[test]
    fn near_limit_counts_the_hits_past_the_threshold_up_to_the_limit() {
        // A limit of 10: the 9th and 10th hits are near it.
        let one_by_one: Vec<u64> = (0..10).map(|used| near_limit(10, used, 1)).collect();
        assert_eq!(one_by_one, [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
        // Several hits at once: only those past the threshold.
        assert_eq!(near_limit(10, 6, 3), 1);
        assert_eq!(near_limit(10, 7, 3), 2);
        assert_eq!(near_limit(10, 8, 2), 2);
        // Never more than up to the limit, and none for a check of no hits.
        assert_eq!(near_limit(10, 9, 5), 1);
        assert_eq!(near_limit(10, 9, 0), 0);
        // A limit of 1: its one hit is near it.
        assert_eq!(near_limit(1, 0, 1), 1);
        assert_eq!(near_limit(u64::MAX, u64::MAX - 1, u64::MAX), 1);
    }
}
